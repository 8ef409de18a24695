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
//! 4. Worker bookkeeping (after tokio's blocking pool): `idle` counts waiting
//!    workers not yet claimed, `notified` counts claims not yet picked up. A
//!    submitter that finds `idle > 0` moves one from `idle` to `notified` and
//!    signals; a waking worker first consumes a claim if there is one. A
//!    worker that leaves the wait without a claim (time-out, shutdown)
//!    takes itself out of `idle`.
//! 5. No user code (functions, their drops, results, wakers) runs while the
//!    shared lock is held.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{BuildError, Error, Rejected, SubmitError};
use crate::job::{
    Job, JobCore, JobId, Task, CANCELLED, COMPLETED, PANICKED, QUEUED, RUNNING,
};
use crate::metrics::Metrics;
use crate::offload::{AbandonPolicy, Offload};
use crate::stop::StopToken;
use crate::sync::{lock, thread, Arc, Condvar, Mutex};

/// Largest queue capacity: tokio's semaphore limit, well beyond any sane
/// configuration.
const MAX_QUEUE_CAPACITY: usize = Semaphore::MAX_PERMITS;

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
            room: std::sync::Arc::new(Semaphore::new(c.queue_capacity)),
            config: c,
            shared: Mutex::new(Shared::default()),
            work: Condvar::new(),
            next_id: AtomicU64::new(0),
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

    /// Starts a graceful shutdown and returns at once: from now on every new
    /// job is rejected with [`Rejected::ShuttingDown`]; jobs already queued
    /// still run; worker threads exit when the queue is empty. Idempotent.
    pub fn shutdown(&self) {
        self.inner().shutdown();
    }

    /// `true` once a shutdown has begun (no new jobs are accepted). Not the
    /// same as finished: see [`Offloader::is_terminated`].
    pub fn is_shutdown(&self) -> bool {
        lock(&self.inner().shared).shutdown
    }

    /// `true` once shutdown has begun, every accepted job is terminal and
    /// every worker thread has exited.
    pub fn is_terminated(&self) -> bool {
        let s = lock(&self.inner().shared);
        s.shutdown && s.queue.is_empty() && s.running == 0 && s.workers == 0
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
    shared: Mutex<Shared>,
    /// Idle workers wait here for a claim or a shutdown.
    work: Condvar,
    /// One permit per free queue slot; closed at shutdown so that callers
    /// waiting for room wake with an error.
    pub(crate) room: std::sync::Arc<Semaphore>,
    /// Plain std atomic: ids only need to be unique, not modelled by loom.
    next_id: AtomicU64,
}

#[derive(Default)]
struct Shared {
    queue: VecDeque<Arc<dyn Task>>,
    workers: usize,
    idle: usize,
    notified: usize,
    running: usize,
    shutdown: bool,
    inject_spawn_failures: usize,
    counts: Counts,
}

/// The counters behind [`Metrics`]; changed only under the shared lock.
#[derive(Default)]
struct Counts {
    accepted: u64,
    rejected_full: u64,
    rejected_shutdown: u64,
    rejected_spawn: u64,
    completed: u64,
    panicked: u64,
    cancelled: u64,
    unstarted: u64,
    callers_left: u64,
    running_after_caller_left: u64,
    stop_requests: u64,
    max_running: u64,
    queue_wait_total: Duration,
    run_time_total: Duration,
}

impl Inner {
    /// Allocates the next job id.
    pub(crate) fn next_id(&self) -> JobId {
        // ORDERING: only uniqueness matters; ids are not part of any proof.
        JobId(self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1)
    }

    /// Enqueues `job`, which holds one unit of queue room, starting or
    /// claiming a worker for it. On refusal the function is handed back.
    pub(crate) fn submit<F, T>(
        self: &Arc<Self>,
        room: OwnedSemaphorePermit,
        job: Arc<Job<F, T>>,
    ) -> Result<(), SubmitError<F>>
    where
        F: FnOnce(&StopToken) -> T + Send + 'static,
        T: Send + 'static,
    {
        let refused = match self.enqueue(job.clone()) {
            Ok(()) => {
                // The slot now belongs to the queued job; a worker (or a
                // cancel) returns it when the job leaves the queue.
                room.forget();
                return Ok(());
            }
            Err(reason) => reason,
        };
        drop(room);
        match job.take_func() {
            Some(f) => Err(SubmitError::new(refused, f)),
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
        if s.idle > 0 {
            s.idle -= 1;
            s.notified += 1;
            self.work.notify_one();
        } else if s.workers < self.config.max_in_flight {
            if let Err(e) = self.spawn_worker(&mut s) {
                s.counts.rejected_spawn += 1;
                tracing::warn!(
                    parent: &task.core().span,
                    error = %e,
                    "could not spawn a worker thread; job refused"
                );
                return Err(Rejected::ThreadSpawn(e));
            }
        }
        s.counts.accepted += 1;
        tracing::trace!(parent: &task.core().span, "accepted");
        s.queue.push_back(task);
        Ok(())
    }

    fn spawn_worker(self: &Arc<Self>, s: &mut Shared) -> std::io::Result<()> {
        if s.inject_spawn_failures > 0 {
            s.inject_spawn_failures -= 1;
            return Err(std::io::Error::from_raw_os_error(11)); // EAGAIN
        }
        let mut b = thread::Builder::new().name(self.config.thread_name.clone());
        if let Some(size) = self.config.stack_size {
            b = b.stack_size(size);
        }
        let me = self.clone();
        b.spawn(move || me.work_loop())?;
        s.workers += 1;
        Ok(())
    }

    /// Cancels job `core` if it is still queued; `true` if this call did it.
    pub(crate) fn cancel(&self, core: &JobCore) -> bool {
        let mut s = lock(&self.shared);
        if !core.transition(QUEUED, CANCELLED) {
            return false;
        }
        let task = remove_queued(&mut s.queue, core.id);
        s.counts.cancelled += 1;
        drop(s);
        self.room.add_permits(1);
        tracing::debug!(parent: &core.span, "cancelled before start");
        if let Some(task) = task {
            task.discard(Error::Cancelled { id: core.id });
        }
        true
    }

    /// Requests stop on job `core`; `true` if this call made the request.
    pub(crate) fn stop(&self, core: &JobCore) -> bool {
        if !core.stop.request_stop() {
            return false;
        }
        lock(&self.shared).counts.stop_requests += 1;
        tracing::debug!(parent: &core.span, "stop requested");
        true
    }

    /// Records that a caller stopped waiting for `core` before its outcome.
    pub(crate) fn caller_left(&self, core: &JobCore) {
        core.mark_caller_left();
        let mut s = lock(&self.shared);
        s.counts.callers_left += 1;
        if core.state() == crate::JobState::Running {
            s.counts.running_after_caller_left += 1;
        }
    }

    pub(crate) fn shutdown(&self) {
        let mut s = lock(&self.shared);
        if s.shutdown {
            return;
        }
        s.shutdown = true;
        self.work.notify_all();
        drop(s);
        // Wakes callers waiting for room; they see `ShuttingDown`.
        self.room.close();
        tracing::debug!("offloader shutting down: new jobs are refused, queued jobs still run");
    }

    pub(crate) fn metrics(&self) -> Metrics {
        let s = lock(&self.shared);
        let c = &s.counts;
        Metrics {
            accepted: c.accepted,
            rejected_full: c.rejected_full,
            rejected_shutdown: c.rejected_shutdown,
            rejected_spawn: c.rejected_spawn,
            queued: s.queue.len() as u64,
            running: s.running as u64,
            completed: c.completed,
            panicked: c.panicked,
            cancelled: c.cancelled,
            unstarted: c.unstarted,
            callers_left: c.callers_left,
            running_after_caller_left: c.running_after_caller_left,
            stop_requests: c.stop_requests,
            max_running: c.max_running,
            workers: s.workers as u64,
            queue_wait_total: c.queue_wait_total,
            run_time_total: c.run_time_total,
        }
    }

    pub(crate) fn count_rejected_full(&self) {
        lock(&self.shared).counts.rejected_full += 1;
    }

    /// The worker thread's body.
    fn work_loop(self: Arc<Self>) {
        let mut s = lock(&self.shared);
        'work: loop {
            while let Some(task) = self.next_job(&mut s) {
                drop(s);
                self.run(&*task);
                drop(task);
                s = lock(&self.shared);
            }
            if s.shutdown {
                break;
            }
            // Inv. 4: wait for a claim.
            s.idle += 1;
            loop {
                let (guard, timeout) = match self.work.wait_timeout(s, self.config.keep_alive) {
                    Ok(r) => r,
                    Err(poisoned) => poisoned.into_inner(),
                };
                s = guard;
                if s.notified > 0 {
                    s.notified -= 1;
                    continue 'work;
                }
                if s.shutdown {
                    s.idle -= 1;
                    continue 'work;
                }
                if timeout.timed_out() {
                    s.idle -= 1;
                    break 'work;
                }
                // Spurious wake-up: still counted in `idle`, wait again.
            }
        }
        s.workers -= 1;
        drop(s);
        tracing::trace!("worker thread exiting");
    }

    /// Pops the next job and moves it to `Running`, taking its permit
    /// (inv. 1). Called with the shared lock held.
    fn next_job(&self, s: &mut Shared) -> Option<Arc<dyn Task>> {
        while let Some(task) = s.queue.pop_front() {
            self.room.add_permits(1);
            let core = task.core();
            if !core.transition(QUEUED, RUNNING) {
                // Unreachable by inv. 2: a job leaving `Queued` any other way
                // is removed from the queue in the same critical section.
                continue;
            }
            s.running += 1;
            debug_assert!(s.running <= self.config.max_in_flight);
            s.counts.max_running = s.counts.max_running.max(s.running as u64);
            s.counts.queue_wait_total += core.accepted_at.elapsed();
            return Some(task);
        }
        None
    }

    fn run(&self, task: &dyn Task) {
        let core = task.core();
        let _entered = core.span.enter();
        tracing::debug!("started");
        task.run(&mut |panicked| self.finish(core, panicked));
    }

    /// Releases the permit of a job whose function returned (inv. 1).
    fn finish(&self, core: &JobCore, panicked: bool) {
        let ran = core.started_at().map(|t| t.elapsed()).unwrap_or_default();
        let mut s = lock(&self.shared);
        s.running -= 1;
        s.counts.run_time_total += ran;
        if panicked {
            core.transition(RUNNING, PANICKED);
            s.counts.panicked += 1;
        } else {
            core.transition(RUNNING, COMPLETED);
            s.counts.completed += 1;
        }
        drop(s);
        if panicked {
            tracing::warn!(ran = ?ran, "panicked; the panic was caught and the permit released");
        } else {
            tracing::debug!(ran = ?ran, "completed");
        }
        if core.caller_left() {
            tracing::debug!(ran = ?ran, "finished after its caller stopped waiting");
        }
    }
}

/// Removes the queued job `id`, if present.
fn remove_queued(queue: &mut VecDeque<Arc<dyn Task>>, id: JobId) -> Option<Arc<dyn Task>> {
    let at = queue.iter().position(|t| t.core().id == id)?;
    queue.remove(at)
}
