//! The pool: configuration, the bounded queue, permits and worker threads.
//!
//! # Invariants
//!
//! 1. A job moves `Queued → Running` only in [`Inner::next_job`], under the
//!    shared lock, which also increments `running` (takes the permit);
//!    `running` is decremented (the permit released) only in
//!    [`Inner::finish`], after the function returned or finished unwinding.
//!    Every worker runs one function at a time and there are never more
//!    than `max_in_flight` workers, so `running <= max_in_flight` at every
//!    instant (DESIGN inv. 1).
//! 2. A job leaves `Queued` for `Cancelled`/`Unstarted` only under the same
//!    lock, and is removed from the queue in the same critical section, so
//!    the queue holds exactly the jobs whose state is `Queued`.
//! 3. Every counter in [`Counts`] changes in the critical section of the
//!    transition it counts; a [`Metrics`] snapshot is copied under the lock.
//!    So `accepted = queued + running + terminal` in every snapshot.
//! 4. Worker wake-ups (after Go's scheduler: wake one searcher at a
//!    time): `searching` counts workers that are awake without a job and
//!    will look at the queue under the lock before they park (spinning,
//!    just unparked, or just spawned). A submitter wakes a parked worker (or
//!    spawns one, below `max_in_flight`) only when nobody is searching; a
//!    searcher that takes a job and leaves others queued wakes the next one
//!    when it was the last searcher. So whenever the queue is not empty,
//!    some worker is searching or every worker is busy and will come back
//!    to the queue. A parked worker that finds itself still in `idle` was
//!    not claimed (spurious wake-up or keep-alive expiry).
//! 6. A job's outcome is published outside the lock, after its terminal
//!    transition; `unpublished` counts outcomes between the two (a worker
//!    settles its count at its next lock acquisition). "Idle" includes
//!    `unpublished == 0`, so after `idle()` every owner can take its outcome.
//! 7. No user code (functions, their drops, results, wakers) runs while the
//!    shared lock is held.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering as StdOrdering};
use std::time::{Duration, Instant};

use crate::error::{BuildError, Error, Rejected};
use crate::job::{
    drop_quietly, Job, JobCore, JobId, JobState, Task, CANCELLED, COMPLETED, PANICKED, QUEUED,
    RUNNING,
};
use crate::metrics::Metrics;
use crate::observer::{deliver, EventKind, EventQueue, Observer, ObserverSlot};
use crate::offload::{AbandonPolicy, Offload};
use crate::stop::StopToken;
use crate::sync::{lock, park_timeout, thread, Arc, Condvar, Mutex, MutexGuard};

/// Largest queue capacity: tokio's semaphore limit, well beyond any sane
/// configuration.
const MAX_QUEUE_CAPACITY: usize = usize::MAX >> 4;

/// Default for [`Builder::max_in_flight`].
pub const DEFAULT_MAX_IN_FLIGHT: usize = 64;
/// Default for [`Builder::queue_capacity`].
pub const DEFAULT_QUEUE_CAPACITY: usize = 4096;
/// Default for [`Builder::keep_alive`].
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(10);

/// A pool that runs blocking functions on its own worker threads, holding a
/// permit for exactly as long as each function really runs.
///
/// Cheap to clone: clones share one pool. When the last clone is dropped the
/// pool shuts down gracefully without blocking the dropping thread: no new
/// jobs are accepted, queued jobs still run, running ones run to completion,
/// then the worker threads exit. Owner handles keep working throughout.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use offloader::Offloader;
///
/// let pool = Offloader::builder().max_in_flight(4).build()?;
/// let n = pool.offload(|_stop| 6 * 7).await?;
/// assert_eq!(n, 42);
///
/// // Bound the caller's wait; the job itself follows the abandon policy.
/// let r = pool
///     .offload(|stop| stop.sleep(Duration::from_secs(30)))
///     .with_timeout(Duration::from_millis(10))
///     .await;
/// assert!(r.unwrap_err().is_timeout());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Offloader {
    handle: Arc<PoolHandle>,
}

/// Dropped when the last [`Offloader`] clone goes: starts a graceful
/// shutdown. Job handles hold [`Inner`] directly and do not keep the pool
/// accepting work.
struct PoolHandle {
    inner: Arc<Inner>,
}

impl Drop for PoolHandle {
    fn drop(&mut self) {
        self.inner.shutdown();
    }
}

/// Configures and builds an [`Offloader`].
///
/// ```
/// use std::time::Duration;
/// use offloader::{AbandonPolicy, Offloader};
///
/// let pool = Offloader::builder()
///     .max_in_flight(8)
///     .queue_capacity(1_000)
///     .keep_alive(Duration::from_secs(30))
///     .thread_name("sdk-io")
///     .abandon_policy(AbandonPolicy::CancelIfQueued)
///     .build()
///     .expect("valid configuration");
/// # drop(pool);
/// ```
#[derive(Debug, Clone)]
pub struct Builder {
    config: Config,
}

#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) max_in_flight: usize,
    pub(crate) queue_capacity: usize,
    pub(crate) keep_alive: Duration,
    pub(crate) thread_name: String,
    pub(crate) stack_size: Option<usize>,
    pub(crate) abandon: AbandonPolicy,
    pub(crate) stuck_after: Option<Duration>,
    pub(crate) observer: Option<ObserverSlot>,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            config: Config {
                max_in_flight: DEFAULT_MAX_IN_FLIGHT,
                queue_capacity: DEFAULT_QUEUE_CAPACITY,
                keep_alive: DEFAULT_KEEP_ALIVE,
                thread_name: "offloader-worker".to_owned(),
                stack_size: None,
                abandon: AbandonPolicy::Keep,
                stuck_after: None,
                observer: None,
            },
        }
    }
}

impl Builder {
    /// How many functions may run at once (default
    /// [`DEFAULT_MAX_IN_FLIGHT`]). Also the most worker threads the pool
    /// ever has.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.config.max_in_flight = n;
        self
    }

    /// How many accepted jobs may wait for a permit (default
    /// [`DEFAULT_QUEUE_CAPACITY`]). Beyond it, awaiting an offload waits for
    /// room and [`Offload::spawn`] fails with [`Rejected::Full`].
    pub fn queue_capacity(mut self, n: usize) -> Self {
        self.config.queue_capacity = n;
        self
    }

    /// How long an idle worker thread waits for work before it exits
    /// (default [`DEFAULT_KEEP_ALIVE`]).
    pub fn keep_alive(mut self, d: Duration) -> Self {
        self.config.keep_alive = d;
        self
    }

    /// The name given to worker threads (default `offloader-worker`).
    pub fn thread_name(mut self, name: impl Into<String>) -> Self {
        self.config.thread_name = name.into();
        self
    }

    /// The stack size of worker threads (default: the platform's).
    pub fn stack_size(mut self, bytes: usize) -> Self {
        self.config.stack_size = Some(bytes);
        self
    }

    /// What happens to a job whose awaiting caller stops waiting (time-out
    /// or drop) before it finished (default [`AbandonPolicy::Keep`]).
    /// Overridable per call with [`Offload::on_abandon`].
    pub fn abandon_policy(mut self, policy: AbandonPolicy) -> Self {
        self.config.abandon = policy;
        self
    }

    /// Reports a job at `warn`, once, when its function has run longer than
    /// `threshold` (default: never). Checked by one monitor thread, started
    /// with the first job when a threshold is set; running jobs are also
    /// listed by [`Offloader::running_jobs`].
    pub fn stuck_after(mut self, threshold: Duration) -> Self {
        self.config.stuck_after = Some(threshold);
        self
    }

    /// Calls `observer` with every job's lifecycle transitions, in order, so
    /// they can be kept in a durable ledger outside the process.
    pub fn observer(mut self, observer: std::sync::Arc<dyn Observer>) -> Self {
        self.config.observer = Some(ObserverSlot(observer));
        self
    }

    /// Builds the offloader. No thread is started until the first job.
    pub fn build(self) -> Result<Offloader, BuildError> {
        let c = self.config;
        if c.max_in_flight == 0 {
            return Err(BuildError::ZeroInFlight);
        }
        if c.queue_capacity == 0 || c.queue_capacity > MAX_QUEUE_CAPACITY {
            return Err(BuildError::QueueCapacity {
                got: c.queue_capacity,
                max: MAX_QUEUE_CAPACITY,
            });
        }
        let inner = Arc::new(Inner {
            room_freed: tokio::sync::Notify::new(),
            config: c,
            shared: Mutex::new(Shared::default()),
            queue_hint: AtomicUsize::new(0),
            changed: Condvar::new(),
            progress: tokio::sync::Notify::new(),
            next_id: AtomicU64::new(0),
            recent_run_ns: AtomicU64::new(1_000_000),
        });
        Ok(Offloader {
            handle: Arc::new(PoolHandle { inner }),
        })
    }
}

impl Offloader {
    /// Starts configuring an offloader.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Prepares `f` to run on this pool. Await the result to run it and wait
    /// for its outcome, or call [`Offload::spawn`] to get an owner handle.
    ///
    /// `f` receives the job's [`StopToken`].
    pub fn offload<F, T>(&self, f: F) -> Offload<F, T>
    where
        F: FnOnce(&StopToken) -> T + Send + 'static,
        T: Send + 'static,
    {
        Offload::new(self.clone(), f)
    }

    /// A consistent snapshot of this pool's counters.
    pub fn metrics(&self) -> Metrics {
        self.inner().metrics()
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.handle.inner
    }

    /// Test hook: the next `n` worker-thread spawns fail as if the OS had
    /// refused them (`EAGAIN`).
    #[doc(hidden)]
    pub fn __fail_next_thread_spawns(&self, n: usize) {
        lock(&self.inner().shared).inject_spawn_failures = n;
    }
}

impl fmt::Debug for Offloader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Offloader")
            .field("max_in_flight", &self.inner().config.max_in_flight)
            .field("queue_capacity", &self.inner().config.queue_capacity)
            .field("metrics", &self.metrics())
            .finish()
    }
}

pub(crate) struct Inner {
    pub(crate) config: Config,
    pub(crate) shared: Mutex<Shared>,
    /// Number of queued jobs, written under the lock, read without it by
    /// spinning workers. A hint only: decisions are re-checked under the
    /// lock. Plain std atomic, outside the loom models (which do not spin).
    queue_hint: AtomicUsize,
    /// Signalled when the pool may have become idle or terminated (blocking
    /// waiters, the stuck-job monitor).
    pub(crate) changed: Condvar,
    /// The same signal for async waiters.
    pub(crate) progress: tokio::sync::Notify,
    /// Signalled when a queue slot frees (one waiter per slot) and at
    /// shutdown (every waiter), for callers waiting for room.
    pub(crate) room_freed: tokio::sync::Notify,
    /// Plain std atomic: ids only need to be unique, not modelled by loom.
    next_id: AtomicU64,
    /// Moving average of recent run times (ns), for callers deciding
    /// whether a short spin will see the outcome before parking is worth it.
    recent_run_ns: AtomicU64,
}

#[derive(Default)]
pub(crate) struct Shared {
    /// Exactly the jobs in state `Queued`, in submission order (inv. 2).
    pub(crate) queue: VecDeque<Arc<dyn Task>>,
    /// Exactly the jobs in state `Running`; its length is the number of
    /// permits held (inv. 1).
    pub(crate) running: Vec<Arc<dyn Task>>,
    pub(crate) workers: usize,
    /// Outcomes of terminal jobs not yet published (or, for a worker's
    /// last job, published but not yet settled at its next lock): "idle"
    /// waits for them, so that after `idle()` every outcome is available.
    pub(crate) unpublished: usize,
    /// Parked workers not yet claimed, most recently parked last.
    idle: Vec<(u64, thread::Thread)>,
    /// Awake workers without a job that will check the queue (inv. 4).
    searching: usize,
    next_worker: u64,
    /// Callers waiting for room in a full queue.
    pub(crate) room_waiters: usize,
    /// Threads waiting in `idle()`, `terminated()` and their blocking forms.
    pub(crate) settle_waiters: usize,
    pub(crate) shutdown: bool,
    /// The stuck-job monitor thread is alive.
    pub(crate) monitor: bool,
    inject_spawn_failures: usize,
    pub(crate) events: EventQueue,
    pub(crate) counts: Counts,
}

impl Shared {
    /// Every accepted job is terminal and every event delivered.
    pub(crate) fn is_idle(&self) -> bool {
        self.queue.is_empty()
            && self.running.is_empty()
            && self.unpublished == 0
            && self.events.is_drained()
    }

    /// Shut down, idle, and every pool thread has exited.
    pub(crate) fn is_terminated(&self) -> bool {
        self.shutdown && self.is_idle() && self.workers == 0 && !self.monitor
    }
}

/// The counters behind [`Metrics`]; changed only under the shared lock.
#[derive(Default)]
pub(crate) struct Counts {
    pub(crate) accepted: u64,
    pub(crate) rejected_full: u64,
    pub(crate) rejected_shutdown: u64,
    pub(crate) rejected_spawn: u64,
    pub(crate) completed: u64,
    pub(crate) panicked: u64,
    pub(crate) cancelled: u64,
    pub(crate) unstarted: u64,
    pub(crate) callers_timed_out: u64,
    pub(crate) callers_dropped: u64,
    pub(crate) running_after_caller_left: u64,
    pub(crate) stop_requests: u64,
    pub(crate) max_running: u64,
    pub(crate) queue_wait_total: Duration,
    pub(crate) run_time_total: Duration,
}

/// Why a caller stopped waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Departure {
    TimedOut,
    Dropped,
}

impl Inner {
    /// Allocates the next job id.
    pub(crate) fn next_id(&self) -> JobId {
        // ORDERING: only uniqueness matters; ids are not part of any proof.
        JobId(
            self.next_id
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                + 1,
        )
    }

    /// Enqueues `job` if the queue has room, starting or claiming a worker
    /// for it. On refusal the function is handed back; refusals for a full
    /// queue are not counted here (a waiting caller retries).
    pub(crate) fn submit<F, T>(self: &Arc<Self>, job: Arc<Job<F, T>>) -> Result<(), (Rejected, F)>
    where
        F: FnOnce(&StopToken) -> T + Send + 'static,
        T: Send + 'static,
    {
        let refused = match self.enqueue(job.clone()) {
            Ok(()) => {
                self.flush_events();
                return Ok(());
            }
            Err(reason) => reason,
        };
        match job.take_func() {
            Some(f) => Err((refused, f)),
            // The function is taken only by whoever wins the swap out of
            // `Queued`, and this job never reached the queue.
            None => unreachable!("a refused job still holds its function"),
        }
    }

    fn enqueue(self: &Arc<Self>, task: Arc<dyn Task>) -> Result<(), Rejected> {
        let mut s = lock(&self.shared);
        if s.shutdown {
            s.counts.rejected_shutdown += 1;
            return Err(Rejected::ShuttingDown);
        }
        if s.queue.len() >= self.config.queue_capacity {
            return Err(Rejected::Full {
                capacity: self.config.queue_capacity,
            });
        }
        // Inv. 4: make sure some worker will look at the queue.
        let mut wake = None;
        if s.searching > 0 {
            // A searcher will find it.
        } else if let Some((_, parked)) = s.idle.pop() {
            s.searching += 1;
            wake = Some(parked);
        } else if s.workers < self.config.max_in_flight {
            if let Err(e) = self.spawn_worker(&mut s) {
                s.counts.rejected_spawn += 1;
                tracing::warn!(
                    parent: &task.core().span(),
                    error = %e,
                    "could not spawn a worker thread; job refused"
                );
                return Err(Rejected::ThreadSpawn(e));
            }
        }
        if self.config.stuck_after.is_some() && !s.monitor {
            // Best effort: without the monitor, stuck jobs go unreported but
            // nothing else changes.
            match self.spawn_thread("monitor", |inner| inner.monitor_loop()) {
                Ok(()) => s.monitor = true,
                Err(e) => tracing::warn!(error = %e, "could not spawn the stuck-job monitor"),
            }
        }
        s.counts.accepted += 1;
        tracing::trace!(parent: &task.core().span(), "accepted");
        if self.config.observer.is_some() {
            s.events.push(task.core(), EventKind::Accepted);
        }
        s.queue.push_back(task);
        self.queue_hint.store(s.queue.len(), StdOrdering::Release);
        drop(s);
        if let Some(parked) = wake {
            parked.unpark();
        }
        Ok(())
    }

    fn spawn_worker(self: &Arc<Self>, s: &mut Shared) -> std::io::Result<()> {
        if s.inject_spawn_failures > 0 {
            s.inject_spawn_failures -= 1;
            return Err(std::io::Error::from_raw_os_error(11)); // EAGAIN
        }
        s.next_worker += 1;
        let me = s.next_worker;
        self.spawn_thread("worker", move |inner| inner.work_loop(me))?;
        s.workers += 1;
        // A new worker starts out searching.
        s.searching += 1;
        Ok(())
    }

    fn spawn_thread(
        self: &Arc<Self>,
        role: &str,
        body: impl FnOnce(Arc<Inner>) + Send + 'static,
    ) -> std::io::Result<()> {
        let name = match role {
            "worker" => self.config.thread_name.clone(),
            other => format!("{}-{other}", self.config.thread_name),
        };
        let mut b = thread::Builder::new().name(name);
        if let Some(size) = self.config.stack_size {
            b = b.stack_size(size);
        }
        let me = self.clone();
        b.spawn(move || body(me))?;
        Ok(())
    }

    /// Cancels job `core` if it is still queued; `true` if this call did it.
    pub(crate) fn cancel(&self, core: &JobCore) -> bool {
        let mut s = lock(&self.shared);
        if !core.transition(QUEUED, CANCELLED) {
            return false;
        }
        let task = remove_queued(&mut s.queue, core.id);
        self.queue_hint.store(s.queue.len(), StdOrdering::Release);
        s.counts.cancelled += 1;
        s.unpublished += 1;
        if self.config.observer.is_some() {
            s.events
                .push(core, EventKind::Finished(JobState::Cancelled));
        }
        self.free_room(&s);
        drop(s);
        tracing::debug!(parent: &core.span(), "cancelled before start");
        if let Some(task) = task {
            task.discard(Error::Cancelled { id: core.id });
        }
        self.published(1);
        self.flush_events();
        true
    }

    /// Requests stop on job `core`; `true` if this call made the request.
    pub(crate) fn stop(&self, task: &dyn Task) -> bool {
        if !crate::stop::request_stop(task) {
            return false;
        }
        lock(&self.shared).counts.stop_requests += 1;
        tracing::debug!(parent: &task.core().span(), "stop requested");
        true
    }

    /// Records that a caller stopped waiting for `core` before its outcome.
    pub(crate) fn caller_left(&self, core: &JobCore, why: Departure) {
        core.mark_caller_left();
        let mut s = lock(&self.shared);
        match why {
            Departure::TimedOut => s.counts.callers_timed_out += 1,
            Departure::Dropped => s.counts.callers_dropped += 1,
        }
        let state = core.state();
        if state == JobState::Running {
            s.counts.running_after_caller_left += 1;
        }
        if self.config.observer.is_some() {
            s.events.push(core, EventKind::Abandoned { state });
        }
        drop(s);
        self.flush_events();
    }

    /// Starts a graceful shutdown; `true` if this call started it.
    pub(crate) fn shutdown(&self) -> bool {
        let mut s = lock(&self.shared);
        if s.shutdown {
            return false;
        }
        s.shutdown = true;
        // Claim every parked worker: each re-checks the queue, drains it and
        // exits (inv. 4).
        let parked = std::mem::take(&mut s.idle);
        // Claimed workers count as searching (inv. 4).
        s.searching += parked.len();
        self.signal_if_settled(&s);
        drop(s);
        for (_, worker) in parked {
            worker.unpark();
        }
        // Wakes callers waiting for room; they see `ShuttingDown`.
        self.room_freed.notify_waiters();
        tracing::debug!("offloader shutting down: new jobs are refused, queued jobs still run");
        true
    }

    pub(crate) fn metrics(&self) -> Metrics {
        lock(&self.shared).snapshot()
    }
}

impl Shared {
    /// The metrics, read under the lock the caller holds (inv. 3).
    pub(crate) fn snapshot(&self) -> Metrics {
        let s = self;
        let c = &s.counts;
        Metrics {
            accepted: c.accepted,
            rejected_full: c.rejected_full,
            rejected_shutdown: c.rejected_shutdown,
            rejected_spawn: c.rejected_spawn,
            queued: s.queue.len() as u64,
            running: s.running.len() as u64,
            completed: c.completed,
            panicked: c.panicked,
            cancelled: c.cancelled,
            unstarted: c.unstarted,
            callers_timed_out: c.callers_timed_out,
            callers_dropped: c.callers_dropped,
            running_after_caller_left: c.running_after_caller_left,
            stop_requests: c.stop_requests,
            max_running: c.max_running,
            workers: s.workers as u64,
            queue_wait_total: c.queue_wait_total,
            run_time_total: c.run_time_total,
        }
    }
}

impl Inner {
    /// How long an awaiting caller may spin for the outcome of a job it
    /// just submitted before it parks: a wake-up of a parked async thread
    /// costs more than a short job, so when recent jobs were short the
    /// caller looks for the outcome for a few microseconds first. Zero when
    /// recent jobs were not short, and under loom.
    pub(crate) fn caller_spin(&self) -> Duration {
        if !SPIN {
            return Duration::ZERO;
        }
        let recent = self.recent_run_ns.load(StdOrdering::Relaxed);
        if recent > CALLER_SPIN_MAX_RUN_NS {
            return Duration::ZERO;
        }
        Duration::from_nanos(4 * recent + 2_000).min(CALLER_SPIN_BUDGET)
    }

    /// A queue slot was freed (called under the lock): wakes one caller
    /// waiting for room, if any.
    fn free_room(&self, s: &Shared) {
        if s.room_waiters > 0 {
            self.room_freed.notify_one();
        }
    }

    /// Counts a refusal that the caller reports (a full queue, for good).
    ///
    /// `enqueue` counts the other refusals itself, under the lock in which it
    /// decides them; a full queue is only a refusal once the caller stops
    /// retrying.
    pub(crate) fn count_refusal(&self, reason: &Rejected) {
        if let Rejected::Full { .. } | Rejected::FullUntilTimeout { .. } = reason {
            lock(&self.shared).counts.rejected_full += 1;
        }
    }

    /// Wakes idle/termination waiters if the pool just became idle or
    /// terminated. Called with the lock held, after the change.
    pub(crate) fn signal_if_settled(&self, s: &Shared) {
        if s.settle_waiters > 0 && (s.is_idle() || s.is_terminated()) {
            self.changed.notify_all();
            self.progress.notify_waiters();
        }
    }

    /// Settles `n` outcomes published outside the lock (inv. 6).
    pub(crate) fn published(&self, n: usize) {
        let mut s = lock(&self.shared);
        s.unpublished -= n;
        self.signal_if_settled(&s);
    }

    /// Delivers pending observer events (observer.rs inv. 3).
    pub(crate) fn flush_events(&self) {
        let Some(observer) = &self.config.observer else {
            return;
        };
        let mut s = lock(&self.shared);
        let mut batch = s.events.begin();
        while let Some(events) = batch {
            drop(s);
            deliver(&*observer.0, &events);
            drop(events);
            s = lock(&self.shared);
            batch = s.events.next();
        }
        self.signal_if_settled(&s);
    }

    /// The worker thread's body: run jobs while there are any, with one lock
    /// acquisition per job (finish one, take the next), then spin or park.
    ///
    /// A published outcome stays counted in `unpublished` until this
    /// worker's next lock acquisition (inv. 6), which saves a lock per job.
    fn work_loop(self: Arc<Self>, me: u64) {
        // `owed`: this worker published an outcome still counted in
        // `unpublished`.
        let mut owed = false;
        let mut next = self.wait_for_work(me, true, &mut owed);
        while let Some(task) = next {
            self.flush_events();
            let core = task.core();
            let span = core.span();
            let entered = span.enter();
            tracing::debug!("started");
            let stop = StopToken::from_source(task.clone());
            let mut following = None;
            let mut ran = Duration::ZERO;
            let mut panicked = false;
            task.run(&stop, &mut |did_panic| {
                // The function returned: release the permit and take the
                // next job under one lock (inv. 1), before the outcome is
                // published (job.rs inv. 4).
                panicked = did_panic;
                ran = core.clock();
                let mut s = lock(&self.shared);
                if std::mem::take(&mut owed) {
                    s.unpublished -= 1;
                }
                self.finish(&mut s, core, did_panic, ran);
                following = self.next_job(&mut s);
                if following.is_none() {
                    // Inv. 4: from here until it parks this worker will look
                    // at the queue again, so a submitter need not wake or
                    // spawn one.
                    s.searching += 1;
                }
            });
            drop(stop);
            log_finished(core, panicked, ran);
            drop(entered);
            // Drops a detached job's result: user code, caught if it panics.
            drop_quietly(task);
            self.flush_events();
            owed = true;
            next = following;
            if next.is_none() {
                next = self.wait_for_work(me, true, &mut owed);
            }
        }
        tracing::trace!("worker thread exiting");
    }

    /// Returns the next job, spinning then parking while there is none;
    /// `None` when this worker should exit (shutdown or keep-alive expiry),
    /// in which case it has already left `workers`. `searching` says
    /// whether this worker is already counted in `searching` (inv. 4).
    fn wait_for_work(
        self: &Arc<Self>,
        me: u64,
        mut searching: bool,
        owed: &mut bool,
    ) -> Option<Arc<dyn Task>> {
        let mut s = lock(&self.shared);
        if std::mem::take(owed) {
            s.unpublished -= 1;
            self.signal_if_settled(&s);
        }
        let mut spun = false;
        loop {
            if let Some(task) = self.next_job(&mut s) {
                if searching {
                    s.searching -= 1;
                }
                let wake = self.wake_another(&mut s);
                drop(s);
                if let Some(parked) = wake {
                    parked.unpark();
                }
                return Some(task);
            }
            if s.shutdown {
                if searching {
                    s.searching -= 1;
                }
                return self.retire(s);
            }
            if SPIN && !spun && (searching || s.searching == 0) {
                if !searching {
                    s.searching += 1;
                    searching = true;
                }
                drop(s);
                self.spin();
                spun = true;
                s = lock(&self.shared);
                continue;
            }
            if searching {
                // Parked workers are not searching; a claimer re-counts it.
                s.searching -= 1;
            }
            let parked_at = Instant::now();
            s.idle.push((me, thread::current()));
            loop {
                drop(s);
                park_timeout(self.config.keep_alive.saturating_sub(parked_at.elapsed()));
                s = lock(&self.shared);
                if !s.idle.iter().any(|(id, _)| *id == me) {
                    // Claimed: the claimer counted this worker as searching.
                    searching = true;
                    spun = false;
                    break;
                }
                if parked_at.elapsed() >= self.config.keep_alive {
                    s.idle.retain(|(id, _)| *id != me);
                    return self.retire(s);
                }
                // Spurious wake-up: still in `idle`, park again.
            }
        }
    }

    /// Called by a searcher that just took a job: if jobs are still queued
    /// and nobody else is searching, claims a parked worker (returned, to be
    /// unparked after the lock is released) or spawns one (inv. 4).
    fn wake_another(self: &Arc<Self>, s: &mut Shared) -> Option<thread::Thread> {
        if s.queue.is_empty() || s.searching > 0 {
            return None;
        }
        if let Some((_, parked)) = s.idle.pop() {
            s.searching += 1;
            return Some(parked);
        }
        if s.workers < self.config.max_in_flight && !s.shutdown {
            if let Err(e) = self.spawn_worker(s) {
                // The job stays queued; this worker comes back for it.
                tracing::debug!(error = %e, "could not spawn another worker; queued jobs wait for busy ones");
            }
        }
        None
    }

    /// Takes this worker out of the pool's count as its last act.
    fn retire(&self, mut s: MutexGuard<'_, Shared>) -> Option<Arc<dyn Task>> {
        s.workers -= 1;
        self.signal_if_settled(&s);
        None
    }

    /// Spins until a job is queued or the spin budget is spent.
    fn spin(&self) {
        let began = Instant::now();
        let mut round = 0u32;
        while self.queue_hint.load(StdOrdering::Acquire) == 0 {
            round += 1;
            if round < 64 {
                std::hint::spin_loop();
            } else if began.elapsed() >= SPIN_BUDGET {
                return;
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Pops the next job and moves it to `Running`, taking its permit
    /// (inv. 1). Called with the shared lock held.
    fn next_job(&self, s: &mut Shared) -> Option<Arc<dyn Task>> {
        let task = s.queue.pop_front()?;
        self.queue_hint.store(s.queue.len(), StdOrdering::Release);
        self.free_room(s);
        let core = task.core();
        if !core.transition(QUEUED, RUNNING) {
            // Unreachable by inv. 2: a job leaving `Queued` any other way is
            // removed from the queue in the same critical section.
            return None;
        }
        s.running.push(task.clone());
        debug_assert!(s.running.len() <= self.config.max_in_flight);
        s.counts.max_running = s.counts.max_running.max(s.running.len() as u64);
        s.counts.queue_wait_total += core.mark_started();
        if self.config.observer.is_some() {
            s.events.push(core, EventKind::Started);
        }
        Some(task)
    }

    /// Releases the permit of a job whose function returned (inv. 1).
    /// Called with the shared lock held.
    fn finish(&self, s: &mut Shared, core: &JobCore, panicked: bool, ran: Duration) {
        if let Some(at) = s.running.iter().position(|t| t.core().id == core.id) {
            s.running.swap_remove(at);
        }
        s.counts.run_time_total += ran;
        s.unpublished += 1;
        // ORDERING: a hint for callers deciding whether to spin; no proof
        // rests on it.
        let old = self.recent_run_ns.load(StdOrdering::Relaxed);
        let new = u64::try_from(ran.as_nanos()).unwrap_or(u64::MAX);
        self.recent_run_ns
            .store(old - old / 8 + new / 8, StdOrdering::Relaxed);
        let state = if panicked {
            core.transition(RUNNING, PANICKED);
            s.counts.panicked += 1;
            JobState::Panicked
        } else {
            core.transition(RUNNING, COMPLETED);
            s.counts.completed += 1;
            JobState::Completed
        };
        if self.config.observer.is_some() {
            s.events.push(core, EventKind::Finished(state));
        }
        self.signal_if_settled(s);
    }
}

/// Logs a finished job, outside the lock; called inside the job's span,
/// which the worker has entered.
fn log_finished(core: &JobCore, panicked: bool, ran: Duration) {
    if panicked {
        tracing::warn!(ran = ?ran, "panicked; the panic was caught and the permit released");
    } else {
        tracing::debug!(ran = ?ran, "completed");
    }
    if core.caller_left() {
        tracing::debug!(ran = ?ran, "finished after its caller stopped waiting");
    }
}

/// Spinning before parking saves a futex wake-up when jobs arrive back to
/// back. Off under loom, whose scheduler cannot preempt a spin loop.
const SPIN: bool = cfg!(not(loom));
/// Callers spin for an outcome only while recent jobs ran shorter than this.
const CALLER_SPIN_MAX_RUN_NS: u64 = 5_000;
/// The longest a caller spins before it parks: well under the tens of
/// microseconds an async task may run between awaits.
const CALLER_SPIN_BUDGET: Duration = Duration::from_micros(20);
/// How long a worker spins (then yields) before it parks.
const SPIN_BUDGET: Duration = Duration::from_micros(50);

/// Counts one waiter in a `Shared` counter for as long as it exists, so
/// that the transitions it waits for signal it; a dropped wait (a future
/// cancelled mid-await) unregisters.
pub(crate) struct Waiting<'a> {
    inner: &'a Inner,
    count: fn(&mut Shared) -> &mut usize,
}

impl<'a> Waiting<'a> {
    pub(crate) fn new(inner: &'a Inner, count: fn(&mut Shared) -> &mut usize) -> Self {
        *count(&mut lock(&inner.shared)) += 1;
        Waiting { inner, count }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        *(self.count)(&mut lock(&self.inner.shared)) -= 1;
    }
}

/// Removes the queued job `id`, if present.
fn remove_queued(queue: &mut VecDeque<Arc<dyn Task>>, id: JobId) -> Option<Arc<dyn Task>> {
    let at = queue.iter().position(|t| t.core().id == id)?;
    queue.remove(at)
}
