//! How the offloader's queue operations scale with the queue's length:
//! shared by `benches/scale.rs` (criterion, for local profiling) and the
//! scale section of `examples/compare.rs`.
//!
//! Every operation starts from the same setup: an offloader with
//! `max_in_flight(1)` whose one permit is held by a function blocked on a
//! [`Gate`], and a queue with room for `n` jobs. [`measure`] times only the
//! operation itself:
//!
//! - `submit`: `n` no-op jobs queued with `spawn()` (handles kept in a vector
//!   sized up front), then one snapshot, whose lock moves the jobs that
//!   passed the intake into the queue: their accept is paid here, not by the
//!   next operation (the other operations start after that snapshot).
//! - `cancel_newest_first`: `n` queued jobs, each handle cancelled, newest
//!   first.
//! - `cancel_random`: the same in a random order (a seeded shuffle, done
//!   before the clock starts).
//! - `timeout_storm`: `n` awaited callers
//!   (`offload(f).with_timeout(d).on_abandon(CancelIfQueued)`, one tokio task
//!   each) whose timeouts all fall on the same instant while their jobs are
//!   queued: the time from the first caller's return to the last one's, idle
//!   gaps longer than [`STORM_GAP`] (timer ticks) left out.
//! - `shutdown_now`: one `shutdown_now()` with `n` jobs queued.
//! - `floor_random_touch`, a reference without the offloader: the least a
//!   cancel in random order must do. `n` job-sized objects (128 bytes,
//!   allocated in order, as a queue's jobs are), visited in a random order;
//!   per visit a mutex is taken to read and write the object's state word,
//!   and taken again (a cancel locks the pool twice). Its cost at 1 M over
//!   its cost at 1 k is what the machine's caches and TLB charge for a
//!   random touch of a large set, whatever the code around it, when the
//!   processor may start the next visit's load before this one's has
//!   arrived (the next address is in `order`, ahead of time).
//! - `floor_serial_touch`, a second reference: the same objects and visits,
//!   but the address of each visit is read from the object visited before
//!   (a pointer chase), so no visit's load starts before the previous one's
//!   line has arrived. That is a cancel's case when its own path between two
//!   jobs is too long for the processor to look ahead to the next job: its
//!   cost at 1 M minus its cost at 1 k is one cold line paid in full.
//! - `floor_fresh_report`, a third reference: `n` values the size of an
//!   `UnstartedJob` (64 bytes on 64-bit targets) pushed into a vector
//!   allocated for `n` up front, as `shutdown_now` builds its report. At
//!   1 M that is 64 MB of memory the process never touched (page faults,
//!   pages zeroed by the kernel); at 1 k, heap memory used before.
//!   `shutdown_now` at 1 M less this reference at 1 M is the cost of its
//!   own work.
//!
//! Included with `#[path]`; not every target uses every item.
#![allow(dead_code)]

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use offloader::{AbandonPolicy, JobHandle, Offloader, UnstartedJob};

use crate::common::{work, Gate};

/// One scale operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScaleOp {
    Submit,
    CancelNewestFirst,
    CancelRandom,
    TimeoutStorm,
    ShutdownNow,
    FloorRandomTouch,
    FloorSerialTouch,
    FloorFreshReport,
}

/// Every operation, in the order of the report.
pub(crate) const SCALE_OPS: [ScaleOp; 8] = [
    ScaleOp::Submit,
    ScaleOp::CancelNewestFirst,
    ScaleOp::CancelRandom,
    ScaleOp::TimeoutStorm,
    ScaleOp::ShutdownNow,
    ScaleOp::FloorRandomTouch,
    ScaleOp::FloorSerialTouch,
    ScaleOp::FloorFreshReport,
];

impl ScaleOp {
    /// The name used in reports and JSON keys.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ScaleOp::Submit => "submit",
            ScaleOp::CancelNewestFirst => "cancel_newest_first",
            ScaleOp::CancelRandom => "cancel_random",
            ScaleOp::TimeoutStorm => "timeout_storm",
            ScaleOp::ShutdownNow => "shutdown_now",
            ScaleOp::FloorRandomTouch => "floor_random_touch",
            ScaleOp::FloorSerialTouch => "floor_serial_touch",
            ScaleOp::FloorFreshReport => "floor_fresh_report",
        }
    }

    /// A reference measured without the offloader, not an operation of it
    /// (no target).
    pub(crate) fn is_reference(self) -> bool {
        matches!(
            self,
            ScaleOp::FloorRandomTouch | ScaleOp::FloorSerialTouch | ScaleOp::FloorFreshReport
        )
    }

    pub(crate) fn from_name(name: &str) -> Option<ScaleOp> {
        SCALE_OPS.into_iter().find(|o| o.name() == name)
    }
}

/// A queue length as it appears in keys: `1k` (1 000), `4k` (4 096), `64k`
/// (65 536), `1m` (1 000 000); other values as digits.
pub(crate) fn size_label(n: usize) -> String {
    if n >= 1_000_000 && n % 1_000_000 == 0 {
        format!("{}m", n / 1_000_000)
    } else if n >= 1024 && n % 1024 == 0 {
        format!("{}k", n / 1024)
    } else if n >= 1000 && n % 1000 == 0 {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

/// Idle gaps between two callers' returns longer than this are left out of a
/// timeout storm's time: the timer fires in 1 ms ticks, and callers whose
/// deadlines straddle a tick boundary would otherwise add a tick of idle
/// waiting to the storm.
pub(crate) const STORM_GAP: Duration = Duration::from_micros(500);

/// Progress of the operation being measured, for a guard that gives up on
/// an operation that takes too long (see [`Meter::watch`]).
pub(crate) struct Meter {
    done: AtomicUsize,
    phase: Mutex<Phase>,
    cv: Condvar,
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    Idle,
    Since(Instant),
    Closed,
}

impl Meter {
    pub(crate) fn new() -> Arc<Meter> {
        Arc::new(Meter {
            done: AtomicUsize::new(0),
            phase: Mutex::new(Phase::Idle),
            cv: Condvar::new(),
        })
    }

    fn set(&self, phase: Phase) {
        *self.phase.lock().unwrap_or_else(|e| e.into_inner()) = phase;
        self.cv.notify_all();
    }

    /// The measured operation starts now.
    pub(crate) fn begin(&self) {
        self.begin_at(Instant::now());
    }

    /// The measured operation starts at `at` (possibly in the future).
    pub(crate) fn begin_at(&self, at: Instant) {
        self.done.store(0, Ordering::Relaxed);
        self.set(Phase::Since(at));
    }

    /// `done` of the operation's steps are done.
    #[inline]
    pub(crate) fn tick(&self, done: usize) {
        self.done.store(done, Ordering::Relaxed);
    }

    /// One more step is done (from any thread).
    #[inline]
    pub(crate) fn add_one(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
    }

    /// The measured operation is over.
    pub(crate) fn end(&self) {
        self.set(Phase::Idle);
    }

    /// Stops a [`watch`](Self::watch)ing thread.
    pub(crate) fn close(&self) {
        self.set(Phase::Closed);
    }

    /// Starts a thread that calls `on_expiry(steps done, time taken)` if one
    /// measured operation lasts longer than `limit`. It is called with the
    /// meter locked, so that [`end`](Self::end) waits for it: it is meant
    /// to report and end the process.
    pub(crate) fn watch(
        self: &Arc<Self>,
        limit: Duration,
        on_expiry: impl FnOnce(usize, Duration) + Send + 'static,
    ) {
        let meter = self.clone();
        std::thread::Builder::new()
            .name("scale-guard".into())
            .spawn(move || {
                let mut on_expiry = Some(on_expiry);
                let mut phase = meter.phase.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    phase = match *phase {
                        Phase::Closed => return,
                        Phase::Idle => meter.cv.wait(phase).unwrap_or_else(|e| e.into_inner()),
                        Phase::Since(at) => {
                            let now = Instant::now();
                            let elapsed = now.saturating_duration_since(at);
                            if elapsed >= limit {
                                if let Some(f) = on_expiry.take() {
                                    f(meter.done.load(Ordering::Relaxed), elapsed);
                                }
                                return;
                            }
                            let wait = at.saturating_duration_since(now) + (limit - elapsed);
                            meter
                                .cv
                                .wait_timeout(phase, wait)
                                .unwrap_or_else(|e| e.into_inner())
                                .0
                        }
                    };
                }
            })
            .expect("scale guard thread");
    }
}

/// An offloader whose single permit is held by a function blocked on a gate,
/// with room for `n` queued jobs.
struct Blocked {
    pool: Offloader,
    gate: Arc<Gate>,
    blocker: JobHandle<()>,
}

impl Blocked {
    fn new(n: usize) -> Blocked {
        let pool = Offloader::builder()
            .max_in_flight(1)
            .queue_capacity(n + 16)
            .build()
            .expect("scale offloader");
        let gate = Arc::new(Gate::default());
        let (started, running) = std::sync::mpsc::channel();
        let g = gate.clone();
        let blocker = pool
            .offload(move |_stop| {
                let _ = started.send(());
                g.wait();
            })
            .spawn()
            .unwrap_or_else(|e| panic!("blocker refused: {}", e.reason()));
        running.recv().expect("the blocker started");
        Blocked {
            pool,
            gate,
            blocker,
        }
    }

    /// `n` no-op jobs queued, their handles in order of submission. Ends
    /// with a snapshot: its lock moves the jobs that passed the intake into
    /// the queue, so that their accept is paid here (by `submit`) and not
    /// by the first operation that takes the lock after.
    fn queue(&self, n: usize, meter: &Meter) -> Vec<JobHandle<u64>> {
        let mut handles = Vec::with_capacity(n);
        for i in 0..n {
            let job = self
                .pool
                .offload(|_stop| work(0))
                .spawn()
                .unwrap_or_else(|e| panic!("queued job refused: {}", e.reason()));
            handles.push(job);
            meter.tick(i + 1);
        }
        let queued = self.pool.metrics().queued;
        assert_eq!(queued, n as u64, "every job queued");
        handles
    }

    /// Throws away whatever is queued (in one linear drain), lets the
    /// blocker return and waits until the pool has terminated.
    async fn release(self) {
        drop(self.pool.shutdown_now());
        self.gate.open();
        self.pool.terminated().await;
        drop(self.blocker);
    }
}

/// A seeded shuffle (Fisher–Yates over splitmix64).
pub(crate) fn shuffle<T>(v: &mut [T], seed: u64) {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    for i in (1..v.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
}

/// An object the size of a queued job, with its state word first.
struct JobSized {
    state: AtomicU64,
    /// The index of the next object to visit (`floor_serial_touch`).
    next: usize,
    _rest: [u64; 14],
}

impl JobSized {
    fn new() -> JobSized {
        JobSized {
            state: AtomicU64::new(1),
            next: usize::MAX,
            _rest: [0; 14],
        }
    }

    /// One visit: what a cancel does to the pool lock and the job's state
    /// word (the lock taken twice); 1 if the second lock saw an odd count.
    fn visit(&self, lock: &Mutex<u64>) -> u64 {
        {
            let mut count = lock.lock().unwrap_or_else(|e| e.into_inner());
            if self.state.load(Ordering::Relaxed) == 1 {
                self.state.store(2, Ordering::Release);
                *count += 1;
            }
        }
        *lock.lock().unwrap_or_else(|e| e.into_inner()) & 1
    }
}

/// The `floor_random_touch` reference (see the module docs).
fn floor_random_touch(n: usize, seed: u64, meter: &Meter) -> Duration {
    let jobs: Vec<Arc<JobSized>> = (0..n).map(|_| Arc::new(JobSized::new())).collect();
    let mut order: Vec<&JobSized> = jobs.iter().map(|j| &**j).collect();
    shuffle(&mut order, seed);
    let lock = Mutex::new(0u64);
    let mut touched = 0;
    meter.begin();
    let t = Instant::now();
    for (i, job) in order.iter().enumerate() {
        touched += job.visit(&lock);
        meter.tick(i + 1);
    }
    let took = t.elapsed();
    meter.end();
    assert!(touched <= n as u64);
    took
}

/// The `floor_serial_touch` reference (see the module docs): the objects
/// in one allocation (jobs allocated in order lie about as close), each
/// naming the next to visit.
fn floor_serial_touch(n: usize, seed: u64, meter: &Meter) -> Duration {
    let mut order: Vec<usize> = (0..n).collect();
    shuffle(&mut order, seed);
    let mut jobs: Vec<JobSized> = (0..n).map(|_| JobSized::new()).collect();
    for pair in order.windows(2) {
        jobs[pair[0]].next = pair[1];
    }
    let lock = Mutex::new(0u64);
    let mut touched = 0;
    let mut at = order.first().copied().unwrap_or(usize::MAX);
    drop(order);
    meter.begin();
    let t = Instant::now();
    let mut i = 0;
    while let Some(job) = jobs.get(at) {
        touched += job.visit(&lock);
        at = job.next;
        i += 1;
        meter.tick(i);
    }
    let took = t.elapsed();
    meter.end();
    assert_eq!(i, n, "the chase visits every object once");
    assert!(touched <= n as u64);
    took
}

/// The `floor_fresh_report` reference (see the module docs).
fn floor_fresh_report(n: usize, meter: &Meter) -> Duration {
    /// A value the size of an `UnstartedJob` on any target.
    #[derive(Clone, Copy)]
    struct ReportSized([u8; std::mem::size_of::<UnstartedJob>()]);
    meter.begin();
    let t = Instant::now();
    let mut report = Vec::with_capacity(n);
    for i in 0..n {
        report.push(ReportSized([i as u8; std::mem::size_of::<UnstartedJob>()]));
        meter.tick(i + 1);
    }
    let took = t.elapsed();
    meter.end();
    assert_eq!(std::hint::black_box(&report).len(), n);
    took
}

/// Cancels every handle in the given order; the time it took.
fn cancel_all<'a>(handles: impl Iterator<Item = &'a JobHandle<u64>>, meter: &Meter) -> Duration {
    let mut refused = 0usize;
    meter.begin();
    let t = Instant::now();
    for (i, h) in handles.enumerate() {
        if !h.cancel() {
            refused += 1;
        }
        meter.tick(i + 1);
    }
    let took = t.elapsed();
    meter.end();
    assert_eq!(refused, 0, "a queued job could not be cancelled");
    took
}

/// Times `op` on a queue of `n` (see the module docs). `seed` picks the
/// random cancel order. Must run on a multi-thread tokio runtime with the
/// time driver.
pub(crate) async fn measure(op: ScaleOp, n: usize, seed: u64, meter: &Arc<Meter>) -> Duration {
    let blocked = Blocked::new(n);
    let took = match op {
        ScaleOp::Submit => {
            meter.begin();
            let t = Instant::now();
            let handles = blocked.queue(n, meter);
            let took = t.elapsed();
            meter.end();
            drop(handles);
            took
        }
        ScaleOp::CancelNewestFirst => {
            let handles = blocked.queue(n, meter);
            cancel_all(handles.iter().rev(), meter)
        }
        ScaleOp::CancelRandom => {
            let mut handles = blocked.queue(n, meter);
            shuffle(&mut handles, seed ^ n as u64);
            cancel_all(handles.iter(), meter)
        }
        ScaleOp::TimeoutStorm => storm(&blocked.pool, n, meter).await,
        ScaleOp::FloorRandomTouch => floor_random_touch(n, seed ^ n as u64, meter),
        ScaleOp::FloorSerialTouch => floor_serial_touch(n, seed ^ n as u64, meter),
        ScaleOp::FloorFreshReport => floor_fresh_report(n, meter),
        ScaleOp::ShutdownNow => {
            let handles = blocked.queue(n, meter);
            meter.begin();
            let t = Instant::now();
            let unstarted = blocked.pool.shutdown_now();
            let took = t.elapsed();
            meter.end();
            assert_eq!(unstarted.len(), n, "shutdown_now returned every queued job");
            drop(unstarted);
            drop(handles);
            took
        }
    };
    blocked.release().await;
    took
}

/// What the callers of one timeout storm share.
struct Storm {
    n: usize,
    base: Instant,
    expiry: Instant,
    /// Callers polled once (their job queued, their timer armed).
    queued: AtomicUsize,
    all_queued: tokio::sync::Notify,
    /// Callers created at or after `expiry`: the attempt does not count.
    late: AtomicUsize,
    /// Callers whose wait ended other than by their timeout.
    wrong: AtomicUsize,
    finished: AtomicUsize,
    all_finished: tokio::sync::Notify,
    /// When each caller returned, in ns since `base`.
    returned: Vec<AtomicU64>,
    meter: Arc<Meter>,
}

/// `n` awaited callers timing out together while queued. Tries again with
/// a longer lead time if some caller could not be queued before the common
/// deadline.
async fn storm(pool: &Offloader, n: usize, meter: &Arc<Meter>) -> Duration {
    // Time to create and queue every caller before the deadline: generous,
    // since the wait is not measured.
    let mut lead = Duration::from_millis(20) + Duration::from_nanos(3_000 * n as u64);
    for _ in 0..4 {
        if let Some(took) = storm_once(pool, n, lead, meter).await {
            return took;
        }
        lead *= 4;
    }
    panic!("timeout storm: could not queue {n} callers before their deadline");
}

async fn storm_once(
    pool: &Offloader,
    n: usize,
    lead: Duration,
    meter: &Arc<Meter>,
) -> Option<Duration> {
    let base = Instant::now();
    let s = Arc::new(Storm {
        n,
        base,
        expiry: base + lead,
        queued: AtomicUsize::new(0),
        all_queued: tokio::sync::Notify::new(),
        late: AtomicUsize::new(0),
        wrong: AtomicUsize::new(0),
        finished: AtomicUsize::new(0),
        all_finished: tokio::sync::Notify::new(),
        returned: (0..n).map(|_| AtomicU64::new(0)).collect(),
        meter: meter.clone(),
    });
    for i in 0..n {
        let (s, pool) = (s.clone(), pool.clone());
        drop(tokio::spawn(async move {
            let call = async {
                // Every caller's deadline falls on `expiry`.
                let limit = s.expiry.saturating_duration_since(Instant::now());
                if limit.is_zero() {
                    s.late.fetch_add(1, Ordering::Relaxed);
                }
                pool.offload(|_stop| work(0))
                    .with_timeout(limit)
                    .on_abandon(AbandonPolicy::CancelIfQueued)
                    .await
            };
            let mut call = std::pin::pin!(call);
            let mut first = true;
            let out = std::future::poll_fn(|cx| {
                let r = call.as_mut().poll(cx);
                if std::mem::take(&mut first) && s.queued.fetch_add(1, Ordering::AcqRel) + 1 == s.n
                {
                    s.all_queued.notify_one();
                }
                r
            })
            .await;
            let at = s.base.elapsed().as_nanos() as u64;
            s.returned[i].store(at, Ordering::Relaxed);
            if !matches!(&out, Err(e) if e.is_timeout()) {
                s.wrong.fetch_add(1, Ordering::Relaxed);
            }
            s.meter.add_one();
            if s.finished.fetch_add(1, Ordering::AcqRel) + 1 == s.n {
                s.all_finished.notify_one();
            }
        }));
    }
    s.all_queued.notified().await;
    let in_time = Instant::now() < s.expiry && s.late.load(Ordering::Relaxed) == 0;
    if in_time {
        meter.begin_at(s.expiry);
    }
    s.all_finished.notified().await;
    if in_time {
        meter.end();
    }
    assert_eq!(
        s.wrong.load(Ordering::Relaxed),
        0,
        "every storm caller ends with its timeout"
    );
    if !in_time {
        return None;
    }
    let mut at: Vec<u64> = s
        .returned
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .collect();
    at.sort_unstable();
    let gap = STORM_GAP.as_nanos() as u64;
    let busy: u64 = at
        .windows(2)
        .map(|w| w[1] - w[0])
        .filter(|&d| d < gap)
        .sum();
    Some(Duration::from_nanos(busy))
}
