//! Helpers shared by every integration test (`mod support;`): gates that
//! hold a function until the test opens them, "started" signals, bounded
//! waits, a concurrency probe, pool builders, and a quiet panic hook.
//!
//! Nothing here orders events with sleeps: "the function runs now" is a
//! message it sends, "the function may return now" is a gate the test opens,
//! and every wait is bounded by [`HANG`] so that a hang fails the test.

#![allow(dead_code)]

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, Once, PoisonError};
use std::task::Poll;
use std::time::{Duration, Instant};

use offloader::{
    Builder, EventKind, JobEvent, JobHandle, JobId, Metrics, Observer, Offloader, StopToken,
};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

pub(crate) mod model;
pub(crate) mod next_job;
pub(crate) mod worker_subscriber;

/// Bound on any wait that must complete; reached only if the library hangs.
pub(crate) const HANG: Duration = Duration::from_secs(20);

/// A short bound, used only while what it waits for is held on a gate.
pub(crate) const SHORT: Duration = Duration::from_millis(30);

/// Marks a deliberate panic's message, for [`quiet_deliberate_panics`].
pub(crate) const ON_PURPOSE: &str = "on purpose";

/// The most a held function waits for its gate: past every test-side bound, yet finite.
const HOLD_LIMIT: Duration = Duration::from_secs(3 * HANG.as_secs());

// ---------------------------------------------------------------------------
// Bounded waits

/// Awaits `fut`, failing the test if it takes longer than [`HANG`].
pub(crate) async fn within<F: IntoFuture>(what: &str, fut: F) -> F::Output {
    try_within(what, fut)
        .await
        .unwrap_or_else(|hung| panic!("{hung}"))
}

/// [`within`] returning the failure message, for a caller that fails with more context.
pub(crate) async fn try_within<F: IntoFuture>(what: &str, fut: F) -> Result<F::Output, String> {
    tokio::time::timeout(HANG, fut)
        .await
        .map_err(|_| format!("hung for {HANG:?} waiting for: {what}"))
}

/// Runs `f` on a helper thread, failing the test if it takes longer than [`HANG`].
pub(crate) fn within_blocking<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(HANG) {
        Ok(v) => v,
        Err(_) => panic!("hung for {HANG:?} waiting for: {what}"),
    }
}

/// `true` if `fut` is still pending after [`SHORT`] (only while what it awaits is held).
pub(crate) async fn still_pending<F: IntoFuture>(fut: F) -> bool {
    tokio::time::timeout(SHORT, fut).await.is_err()
}

/// Waits until `cond` holds (a condition, not an ordering by sleep), failing after [`HANG`].
pub(crate) async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + HANG;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition never held within {HANG:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// [`eventually`] for a plain thread: waits (yielding) until `cond` holds,
/// failing after [`HANG`].
pub(crate) fn eventually_blocking(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + HANG;
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "condition never held within {HANG:?}: {what}"
        );
        std::thread::yield_now();
    }
}

/// Polls `fut` exactly once and returns what that poll gave.
pub(crate) async fn poll_once<F: Future + ?Sized>(mut fut: Pin<&mut F>) -> Poll<F::Output> {
    std::future::poll_fn(move |cx| Poll::Ready(fut.as_mut().poll(cx))).await
}

// ---------------------------------------------------------------------------
// Gates and signals

#[derive(Debug, Default)]
struct GateState {
    open: Mutex<bool>,
    changed: Condvar,
}

impl GateState {
    fn lock(&self) -> MutexGuard<'_, bool> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A closed gate: the test keeps the [`Gate`], functions wait on (clones of) the [`Hold`].
pub(crate) fn gate() -> (Gate, Hold) {
    let state = Arc::new(GateState::default());
    (Gate(state.clone()), Hold(state))
}

/// The test's end of a gate; dropping it opens it, so a failing test holds no worker.
#[derive(Debug)]
pub(crate) struct Gate(Arc<GateState>);

impl Gate {
    /// Lets every function held on this gate go on (now and later).
    pub(crate) fn open(&self) {
        *self.0.lock() = true;
        self.0.changed.notify_all();
    }

    /// Whether the gate has been opened.
    pub(crate) fn is_open(&self) -> bool {
        *self.0.lock()
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.open();
    }
}

/// The functions' end of a gate; clone it to hold several functions on one gate.
#[derive(Clone, Debug)]
pub(crate) struct Hold(Arc<GateState>);

impl Hold {
    /// Blocks the calling (worker) thread until the gate opens; ignores any stop token.
    pub(crate) fn wait(&self) {
        self.wait_until(|| false);
    }

    /// Blocks until the gate opens or stop is requested; returns `stop.is_stopped()`.
    pub(crate) fn wait_or_stop(&self, stop: &StopToken) -> bool {
        let state = self.0.clone();
        let _wake = stop.on_stop(move || {
            // Taken so that the notification cannot fall between the
            // waiter's check and its wait.
            let _open = state.lock();
            state.changed.notify_all();
        });
        self.wait_until(|| stop.is_stopped());
        stop.is_stopped()
    }

    fn wait_until(&self, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + HOLD_LIMIT;
        let mut open = self.0.lock();
        while !*open && !done() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            open = self
                .0
                .changed
                .wait_timeout(open, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// A "started" signal: functions send on the sender, the test receives with [`recv`].
pub(crate) fn signal<T>() -> (UnboundedSender<T>, UnboundedReceiver<T>) {
    tokio::sync::mpsc::unbounded_channel()
}

/// Receives the next signal, failing the test if none comes within [`HANG`].
pub(crate) async fn recv<T>(what: &str, rx: &mut UnboundedReceiver<T>) -> T {
    within(what, rx.recv())
        .await
        .unwrap_or_else(|| panic!("signal channel closed while waiting for: {what}"))
}

/// [`recv`] for code outside any async runtime (a plain thread or a `#[test]`).
pub(crate) fn recv_blocking<T>(what: &str, rx: &mut UnboundedReceiver<T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime for one bounded wait")
        .block_on(recv(what, rx))
}

/// The function of a job held at its start: it sends `label` on `started`
/// when it runs (ignored once the test no longer listens), waits until
/// `hold`'s gate opens, ignoring its stop token, then returns `then(stop)`.
pub(crate) fn gated<L: Send + 'static, T>(
    hold: &Hold,
    started: &UnboundedSender<L>,
    label: L,
    then: impl FnOnce(&StopToken) -> T + Send + 'static,
) -> impl FnOnce(&StopToken) -> T + Send + 'static {
    let (hold, started) = (hold.clone(), started.clone());
    move |stop| {
        let _ = started.send(label);
        hold.wait();
        then(stop)
    }
}

/// [`gated`], for a job that also ends when stop is requested: it returns
/// whether it was stopped ([`Hold::wait_or_stop`]).
pub(crate) fn gated_or_stop<L: Send + 'static>(
    hold: &Hold,
    started: &UnboundedSender<L>,
    label: L,
) -> impl FnOnce(&StopToken) -> bool + Send + 'static {
    let (hold, started) = (hold.clone(), started.clone());
    move |stop| {
        let _ = started.send(label);
        hold.wait_or_stop(stop)
    }
}

/// A flag, false until a function sets it (clone it into the function).
pub(crate) fn flag() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(false))
}

// ---------------------------------------------------------------------------
// Concurrency probe

/// Counts functions inside their body right now, and the most ever at once.
#[derive(Clone, Debug, Default)]
pub(crate) struct Concurrency {
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
}

impl Concurrency {
    /// Call first thing in the function; keep the guard until it returns.
    pub(crate) fn enter(&self) -> InFlight {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        InFlight {
            now: self.now.clone(),
        }
    }

    /// Functions inside their body right now.
    pub(crate) fn now(&self) -> usize {
        self.now.load(Ordering::SeqCst)
    }

    /// The most functions ever inside their body at once.
    pub(crate) fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }
}

/// Leaves the [`Concurrency`] count when dropped (also while unwinding).
#[derive(Debug)]
pub(crate) struct InFlight {
    now: Arc<AtomicUsize>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------------------
// Pools

/// [`pool`]'s builder, for a test that also sets a thread name, an observer, ...
pub(crate) fn builder(max_in_flight: usize, queue_capacity: usize) -> Builder {
    Offloader::builder()
        .max_in_flight(max_in_flight)
        .queue_capacity(queue_capacity)
}

/// A pool with `max_in_flight` permits and room for `queue_capacity` queued jobs.
pub(crate) fn pool(max_in_flight: usize, queue_capacity: usize) -> Offloader {
    builder(max_in_flight, queue_capacity)
        .build()
        .expect("valid configuration")
}

/// Permits taken by [`occupy`]: running functions held on one gate.
#[derive(Debug)]
pub(crate) struct Occupied {
    /// Holds every blocker; dropping it lets them return.
    pub(crate) gate: Gate,
    /// The blockers' handles, in submission order.
    pub(crate) handles: Vec<JobHandle<()>>,
}

impl Occupied {
    /// Opens the gate and waits (bounded) until every blocker completed.
    pub(crate) async fn release(self) {
        self.gate.open();
        for h in self.handles {
            within("a blocker after its gate opened", h)
                .await
                .expect("a blocker completes");
        }
    }
}

/// Fills `permits` permits with "blocker" functions held on one gate; returns once all run.
pub(crate) async fn occupy(pool: &Offloader, permits: usize) -> Occupied {
    let (gate, hold) = gate();
    let (tx, mut rx) = signal();
    let handles = (0..permits)
        .map(|_| {
            pool.offload(gated(&hold, &tx, (), |_| ()))
                .name("blocker")
                .spawn()
                .expect("blocker accepted")
        })
        .collect();
    for _ in 0..permits {
        recv("a blocker started", &mut rx).await;
    }
    Occupied { gate, handles }
}

/// A tracing subscriber that calls its function at every event (spans get
/// one id and are otherwise ignored): a test's hook into the pool's log
/// lines.
pub(crate) struct OnEvents<F>(pub(crate) F);

impl<F: Fn(&tracing::Event<'_>) + Send + Sync + 'static> tracing::Subscriber for OnEvents<F> {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        (self.0)(event);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Runs one no-op job to completion, so that a worker lives: the pool's
/// intake (src/core/fast/intake.rs) is open from then on.
pub(crate) fn warm(pool: &Offloader) {
    let mut first = pool.offload(|_stop| ()).spawn().expect("a first job");
    assert!(first.blocking_wait(None).is_ok(), "the first job runs");
}

/// On a one-permit pool, waits until every job accepted before is terminal *and* counted.
pub(crate) async fn drain_single(pool: &Offloader) {
    // The one worker takes jobs in order and counts each before publishing
    // it: once this no-op job's outcome is here, everything ahead is done.
    within(
        "a barrier job on a single-worker pool",
        pool.offload(|_stop| ()),
    )
    .await
    .expect("barrier job runs");
}

/// Asserts the ledger identity of one snapshot, with the numbers in the message.
#[track_caller]
pub(crate) fn assert_ledger(m: &Metrics) {
    assert!(
        m.accepted == m.queued + m.running + m.terminal(),
        "ledger does not balance: accepted {} != queued {} + running {} + terminal {} ({m:?})",
        m.accepted,
        m.queued,
        m.running,
        m.terminal()
    );
}

/// The `stat` lines of this process's threads named `name` (Linux keeps
/// the first 15 bytes of a name: a longer one is compared by those); none
/// without `/proc`.
fn stats_of_threads_named(name: &str) -> Vec<String> {
    let name = name.get(..15).unwrap_or(name);
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
        })
        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
        .collect()
}

/// The fields of a `stat` line after the command's closing parenthesis:
/// the state first, then the parent's pid, and so on.
fn stat_fields(stat: &str) -> Vec<&str> {
    stat.rsplit_once(')')
        .map_or("", |(_, r)| r)
        .split_whitespace()
        .collect()
}

/// CPU time (user + system, in clock ticks) of this process's threads
/// named `name`.
pub(crate) fn cpu_ticks_of_threads_named(name: &str) -> u64 {
    stats_of_threads_named(name)
        .iter()
        .map(|stat| {
            // utime is the 12th field after the command, stime the 13th.
            let f = stat_fields(stat);
            let tick = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
            tick(11) + tick(12)
        })
        .sum()
}

/// Threads of this process named `name`; 0 without `/proc`.
pub(crate) fn threads_named(name: &str) -> usize {
    stats_of_threads_named(name).len()
}

/// Threads of this process named `name` that are asleep (state `S`: parked,
/// or blocked on a lock); 0 without `/proc`.
pub(crate) fn sleeping_threads_named(name: &str) -> usize {
    stats_of_threads_named(name)
        .iter()
        .filter(|stat| stat_fields(stat).first() == Some(&"S"))
        .count()
}

// ---------------------------------------------------------------------------
// Counting allocations

/// Makes this test binary's global allocator one that counts (each binary
/// has its own, hence a macro), in a module `counted`:
/// `counted::allocations_of(f)` runs `f` and gives the allocations
/// (`alloc` and `realloc` calls) it made on its thread, and
/// `counted::live_bytes()` the bytes allocated and not yet freed in the
/// whole process.
#[allow(unused_macros)]
macro_rules! counting_allocator {
    () => {
        mod counted {
            use std::alloc::{GlobalAlloc, Layout, System};
            use std::cell::Cell;
            use std::sync::atomic::{AtomicIsize, Ordering};

            struct Counting;

            thread_local! {
                /// Allocations made on this thread while `COUNTING` is set.
                static MADE: Cell<u64> = const { Cell::new(0) };
                static COUNTING: Cell<bool> = const { Cell::new(false) };
            }

            /// Bytes allocated and not yet freed, in the whole process.
            static LIVE: AtomicIsize = AtomicIsize::new(0);

            fn count_call() {
                let _ = COUNTING.try_with(|on| {
                    if on.get() {
                        MADE.with(|m| m.set(m.get() + 1));
                    }
                });
            }

            // SAFETY: defers to the system allocator; only counts, in an
            // atomic and in thread-locals that need no allocation
            // (const-initialised `Cell`s).
            unsafe impl GlobalAlloc for Counting {
                unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                    count_call();
                    LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
                    // SAFETY: the caller's contract is System's.
                    unsafe { System.alloc(layout) }
                }

                unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
                    LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
                    // SAFETY: the caller's contract is System's.
                    unsafe { System.dealloc(ptr, layout) }
                }

                unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
                    count_call();
                    // SAFETY: the caller's contract is System's.
                    let moved = unsafe { System.realloc(ptr, layout, new_size) };
                    if !moved.is_null() {
                        let grew = new_size as isize - layout.size() as isize;
                        LIVE.fetch_add(grew, Ordering::Relaxed);
                    }
                    moved
                }
            }

            #[global_allocator]
            static ALLOCATOR: Counting = Counting;

            /// Runs `f`; gives what it returned and the allocations it made
            /// on this thread.
            #[allow(dead_code)]
            pub(crate) fn allocations_of<R>(f: impl FnOnce() -> R) -> (R, u64) {
                let before = MADE.with(Cell::get);
                COUNTING.with(|on| on.set(true));
                let r = f();
                COUNTING.with(|on| on.set(false));
                (r, MADE.with(Cell::get) - before)
            }

            /// Bytes allocated and not yet freed, in the whole process.
            #[allow(dead_code)]
            pub(crate) fn live_bytes() -> isize {
                LIVE.load(Ordering::SeqCst)
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use counting_allocator;

// ---------------------------------------------------------------------------
// Randomized tests

/// xorshift64*: a tiny seeded generator, so that a failure can be replayed;
/// good enough to pick among a handful of cases.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        // Never zero (xorshift's fixed point).
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform-ish in `0..n`.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// `true` with a chance of `percent` in 100.
    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

// ---------------------------------------------------------------------------
// Output

/// Hides deliberate panics: a message containing [`ON_PURPOSE`], or a non-string payload.
pub(crate) fn quiet_deliberate_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str));
            // Only a test panics with a payload that is not a string.
            let deliberate = message.is_none_or(|m| m.contains(ON_PURPOSE));
            if !deliberate {
                default(info);
            }
        }));
    });
}

/// An observer that records every event it is given.
#[derive(Default)]
pub(crate) struct Log(pub(crate) Mutex<Vec<JobEvent>>);

impl Observer for Log {
    fn on_event(&self, event: &JobEvent) {
        self.0.lock().unwrap().push(event.clone());
    }
}

impl Log {
    pub(crate) fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    pub(crate) fn kinds(&self, id: JobId) -> Vec<EventKind> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.id == id)
            .map(|e| e.kind)
            .collect()
    }

    pub(crate) fn names(&self, id: JobId) -> Vec<Option<String>> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.id == id)
            .map(|e| e.name.as_deref().map(str::to_owned))
            .collect()
    }

    pub(crate) fn by_job(&self) -> std::collections::BTreeMap<JobId, Vec<EventKind>> {
        let mut map: std::collections::BTreeMap<JobId, Vec<EventKind>> =
            std::collections::BTreeMap::new();
        for e in self.0.lock().unwrap().iter() {
            map.entry(e.id).or_default().push(e.kind);
        }
        map
    }
}

/// A field of /proc/self/status, in KiB.
pub(crate) fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// The ledger identity, `accepted = queued + running + terminal`, of a
/// pool's or a group's snapshot.
pub(crate) trait Ledger {
    fn ledger_balances(&self) -> bool;
}

impl Ledger for Metrics {
    fn ledger_balances(&self) -> bool {
        self.accepted == self.queued + self.running + self.terminal()
    }
}

impl Ledger for offloader::GroupMetrics {
    fn ledger_balances(&self) -> bool {
        self.accepted == self.queued + self.running + self.terminal()
    }
}

/// A bounded wait for a pool's termination, written the way a user writes
/// it: `tokio::time::timeout` around `terminated()`.
pub(crate) trait AwaitTermination {
    /// Whether the pool terminates within `limit`.
    async fn await_termination(&self, limit: Duration) -> bool;
}

impl AwaitTermination for Offloader {
    async fn await_termination(&self, limit: Duration) -> bool {
        tokio::time::timeout(limit, self.terminated()).await.is_ok()
    }
}

/// A look at a pool's or group's idleness: whether `idle()` is ready at
/// once.
pub(crate) trait IsIdle {
    fn is_idle(&self) -> bool;
}

impl IsIdle for Offloader {
    fn is_idle(&self) -> bool {
        ready_at_once(self.idle())
    }
}

impl IsIdle for offloader::JobGroup {
    fn is_idle(&self) -> bool {
        ready_at_once(self.idle())
    }
}

/// Whether `fut` is ready on its first poll (a no-op waker).
pub(crate) fn ready_at_once(fut: impl Future) -> bool {
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    fut.as_mut().poll(&mut cx).is_ready()
}
