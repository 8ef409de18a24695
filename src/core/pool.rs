//! The pool's facade and its job operations: [`Offloader`], the shared
//! [`Inner`], and what callers and handles do to jobs (submit, cancel, stop,
//! leave), each one lock acquisition on [`State`] followed by the
//! [`After`] work outside the lock.
//!
//! `impl Offloader` is split by concern, for a reader to find it: jobs and
//! metrics here, the shutdown sequence in `shutdown.rs` (its waits in
//! `settle.rs`). The worker threads
//! and their wake-up protocol live in `worker.rs`. ARCHITECTURE.md
//! (`docs/ARCHITECTURE.md`) states the invariants this module keeps.

use std::fmt;
use std::time::Duration;

use crate::core::config::{Builder, Config};
use crate::core::metrics::Metrics;
use crate::core::state::{After, Room, State, Worker};
use crate::job::cell::{Job, Task};
use crate::job::error::{BuildError, Error};
use crate::job::stop::StopToken;
use crate::util::quiet::call_quietly;
use crate::util::sync::{lock, Arc, Condvar, Mutex, MutexGuard, Padded};
use crate::util::wait_list::WaitList;

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

impl Builder {
    /// Checks the configuration and builds the offloader.
    ///
    /// No thread is started until the first job.
    ///
    /// ```
    /// use offloader::Offloader;
    ///
    /// let err = Offloader::builder().thread_name("bad\0name").build().unwrap_err();
    /// assert!(err.to_string().starts_with("thread_name must not contain a NUL byte"));
    /// ```
    pub fn build(self) -> Result<Offloader, BuildError> {
        Ok(Offloader::from_config(self.into_config()?))
    }
}

impl Offloader {
    /// Starts configuring an offloader.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// A pool for a validated configuration.
    pub(crate) fn from_config(config: Config) -> Offloader {
        let count = std::sync::Arc::new(crate::core::fast::intake::QueueCount::new());
        let observed = config.observer.is_some();
        let doorbell = observed.then(|| crossbeam_channel::bounded(1));
        // No observer, no stuck-job monitor: both are the locked path's.
        let fast_layer = config.fast;
        let fast = config.fast && !observed && config.stuck_after.is_none();
        let intake = fast.then(|| {
            std::sync::Arc::new(crate::core::fast::intake::Intake::new(
                config.queue_capacity,
            ))
        });
        let inner = Arc::new_cyclic(|me: &std::sync::Weak<Inner>| {
            let watcher: std::sync::Weak<dyn crate::job::limiter::Watcher> = me.clone();
            let state = State::new(
                config.max_in_flight,
                config.queue_capacity,
                config.observer.as_ref().map(|_| config.observer_lag),
                config.key_limits.clone(),
                count.clone(),
                watcher,
                intake.clone(),
            );
            Inner {
                me: me.clone(),
                config,
                state: Padded(Mutex::new(state)),
                queue_count: count,
                intake,
                changed: Condvar::new(),
                progress: WaitList::default(),
                room_freed: tokio::sync::Notify::new(),
                caller_spin: crate::core::fast::caller_spin::CallerSpin::new(fast_layer),
                worker_spin: crate::core::fast::worker_spin::WorkerSpin::new(fast_layer),
                doorbell,
                clock_holds: std::sync::Arc::new(crate::util::clock::ClockHolds::new({
                    let me = me.clone();
                    move || me.upgrade().is_some_and(|inner| inner.lock().stalled())
                })),
            }
        });
        Offloader {
            handle: Arc::new(PoolHandle { inner }),
        }
    }

    /// A consistent snapshot of this pool's counters.
    pub fn metrics(&self) -> Metrics {
        self.inner().lock().snapshot()
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.handle.inner
    }

    /// A handle that does not keep the pool open, for an observer, a callback
    /// or a job that needs to reach its own pool.
    ///
    /// The pool still shuts down when the user drops the last [`Offloader`]; a
    /// strong clone there would be a reference cycle, keeping the pool alive
    /// forever.
    ///
    /// ```
    /// let pool = offloader::Offloader::builder().build().unwrap();
    /// let weak = pool.downgrade();
    /// assert!(weak.upgrade().is_some());
    /// drop(pool);
    /// assert!(weak.upgrade().is_none()); // the pool is shutting down
    /// ```
    pub fn downgrade(&self) -> WeakOffloader {
        WeakOffloader {
            handle: Arc::downgrade(&self.handle),
        }
    }

    /// Test hook (feature `test-hooks`, for this crate's own tests; not
    /// part of the API): the next `n` worker-thread spawns fail as if the
    /// OS had refused them (`EAGAIN`).
    #[doc(hidden)]
    #[cfg(feature = "test-hooks")]
    pub fn __fail_next_thread_spawns(&self, n: usize) {
        self.inner().lock().workers.inject_spawn_failures(n);
    }

    /// Test hook (feature `test-hooks`, as above): the pool judges no
    /// job's deadline (state/overload.rs), for tests that predict every
    /// refusal whatever the machine's speed.
    #[doc(hidden)]
    #[cfg(feature = "test-hooks")]
    pub fn __judge_no_deadlines(&self) {
        self.inner().lock().judge_no_deadlines();
    }

    /// Test hook (feature `test-hooks`, as above): the next `n` spawns of
    /// the observer's delivery thread fail as if the OS had refused them
    /// (`EAGAIN`).
    #[doc(hidden)]
    #[cfg(feature = "test-hooks")]
    pub fn __fail_next_delivery_spawns(&self, n: usize) {
        self.inner()
            .lock()
            .workers
            .inject_delivery_spawn_failures(n);
    }
}

/// A weak handle to an [`Offloader`], from [`Offloader::downgrade`]: it
/// does not keep the pool accepting work.
#[derive(Clone)]
pub struct WeakOffloader {
    handle: std::sync::Weak<PoolHandle>,
}

impl WeakOffloader {
    /// The pool, if some [`Offloader`] clone still keeps it open; `None`
    /// once the last one was dropped (the pool then shuts down gracefully).
    pub fn upgrade(&self) -> Option<Offloader> {
        self.handle.upgrade().map(|handle| Offloader { handle })
    }
}

impl fmt::Debug for WeakOffloader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeakOffloader")
            .field("open", &(self.handle.strong_count() > 0))
            .finish()
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

/// What every clone of a pool and every job handle share.
pub(crate) struct Inner {
    pub(crate) config: Config,
    /// The pool lock (docs/ARCHITECTURE.md "Locks").
    /// It and the two hints below are on lines of their own, away from the
    /// fields submitters read.
    state: Padded<Mutex<State>>,
    /// The count of jobs queued, in the intake or with a place reserved
    /// (fast/intake.rs inv. 1): the queue bound's reservations; spinning workers
    /// read its lock holders' half as a hint (`QueueCount::in_queue`;
    /// decisions are re-checked under the lock).
    pub(crate) queue_count: std::sync::Arc<crate::core::fast::intake::QueueCount>,
    /// The front door of plain jobs (fast/intake.rs), if this pool has one.
    pub(crate) intake: Option<std::sync::Arc<crate::core::fast::intake::Intake>>,
    /// Signalled (after unlocking) when the pool may have become idle or
    /// terminated: blocking waiters and the stuck-job monitor.
    pub(crate) changed: Condvar,
    /// The same signal for async waiters (each woken on its own, a panic in
    /// one caught: wait_list.rs).
    pub(crate) progress: WaitList,
    /// Signalled (after unlocking) when a job may fit (one waiter) and at
    /// shutdown (every waiter), for callers waiting for room.
    pub(crate) room_freed: tokio::sync::Notify,
    /// This pool, for work done from a `&self` path that may spawn a
    /// worker (a limiter's wake-up).
    me: std::sync::Weak<Inner>,
    /// May an awaiting caller spin, and how long (fast/caller_spin.rs)?
    pub(crate) caller_spin: crate::core::fast::caller_spin::CallerSpin,
    /// Which worker spins for work (fast/worker_spin.rs).
    pub(crate) worker_spin: crate::core::fast::worker_spin::WorkerSpin,
    /// Holds tokio's paused test clock while callers wait on this pool's
    /// work (clock.rs).
    pub(crate) clock_holds: std::sync::Arc<crate::util::clock::ClockHolds>,
    /// The observer delivery thread's doorbell (observer.rs inv. 3): a
    /// bounded channel of one message, rung after events were queued or the
    /// pool may have settled. `None` without an observer.
    pub(crate) doorbell: Option<(
        crossbeam_channel::Sender<()>,
        crossbeam_channel::Receiver<()>,
    )>,
}

impl Inner {
    /// Takes the pool lock, and moves the jobs waiting in the intake into
    /// the queue first (fast/intake.rs): under the lock, the queue is every job
    /// accepted so far.
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        let mut s = lock(&self.state);
        s.bound.debug_check_reservations();
        if self.intake.as_ref().is_some_and(|i| !i.is_empty()) {
            s.drain_intake();
        }
        s
    }

    /// Carries out the work a transition left for after the lock (S4):
    /// unparks, wake-ups, the dropped job reference, observer delivery.
    /// Every waker and observer call is foreign code and runs here, never
    /// under the lock; a panic in one is caught.
    pub(crate) fn after(&self, after: After) {
        if after.is_empty() {
            // The common case of a job's path: nothing to do.
            return;
        }
        // A paused test clock let go while the work stalled is held again
        // (clock.rs): every transition that can end a stall does something
        // after unlocking (wakes a worker, or tells a pool of a grant).
        self.clock_holds.wake_if_dormant();
        let After {
            unpark,
            room,
            settled,
            events,
            release,
            dead,
            shed,
            idle_groups,
            limiter_wakes,
            find_worker,
        } = after;
        if !limiter_wakes.is_empty() {
            for (limiter, granted) in limiter_wakes {
                limiter.wake(&granted);
            }
        }
        if find_worker {
            self.find_worker_for_lanes();
        }
        unpark.unpark();
        match room {
            Room::None => {}
            Room::One => {
                call_quietly("a room waiter's waker", || self.room_freed.notify_one());
            }
            Room::All => {
                call_quietly("a room waiter's waker", || self.room_freed.notify_waiters());
            }
        }
        if settled {
            self.changed.notify_all();
            self.progress.wake_all();
        }
        if !idle_groups.is_empty() {
            for list in idle_groups {
                list.wake_all();
            }
        }
        if let Some(task) = release {
            crate::util::quiet::drop_quietly(task);
        }
        // Tombstones: their functions were discarded at their cancel, so
        // no user code runs here; quietly all the same.
        crate::util::quiet::drop_quietly(dead);
        if events || settled {
            self.ring();
        }
        // Jobs shed at their turn: their functions dropped, their callers
        // told (state/overload.rs).
        self.discard_cancelled(shed);
    }

    /// Wakes the observer's delivery thread; a ring already pending is
    /// enough (never blocks).
    pub(crate) fn ring(&self) {
        if let Some((bell, _)) = &self.doorbell {
            let _ = bell.try_send(());
        }
    }

    pub(crate) fn me(&self) -> Option<Arc<Inner>> {
        self.me.upgrade()
    }

    /// Enqueues `job` if the pool accepts it, making sure a worker will run
    /// it. On refusal the function is handed back; a full queue is not
    /// counted here (a waiting caller retries).
    pub(crate) fn submit<F, T, const N: usize>(
        self: &Arc<Self>,
        job: &Arc<Job<F, T, N>>,
        cancelled: bool,
    ) -> Result<(), (Error, F)>
    where
        F: FnOnce(&StopToken) -> T + Send + 'static,
        T: Send + 'static,
    {
        match self.enqueue(job.clone(), cancelled) {
            Ok(()) => Ok(()),
            Err(reason) => match job.take_refused() {
                Some(f) => Err((reason, f)),
                // The function is taken only by whoever wins the swap out of
                // `Queued`, and this job never reached the queue.
                None => unreachable!("a refused job still holds its function"),
            },
        }
    }

    /// Transition *accept* through the intake, without the pool lock, for
    /// a plain job while the intake is open and the queue has room
    /// ([`Intake::pass`](crate::core::fast::intake::Intake::pass)); the job is
    /// handed back otherwise. A job appended wakes a worker if none
    /// searches and one can be woken (inv. 2 of [`crate::core::fast::intake`]).
    fn pass_intake(
        self: &Arc<Self>,
        task: Arc<dyn Task>,
        cancelled: bool,
    ) -> Result<(), Arc<dyn Task>> {
        let Some(intake) = &self.intake else {
            return Err(task);
        };
        let passed = intake.pass(
            &self.queue_count,
            self.config.queue_capacity,
            task,
            cancelled,
        )?;
        let mut spawn_error = None;
        if passed.needs_worker {
            let mut after = After::default();
            spawn_error = {
                let mut s = self.lock();
                if s.has_startable() {
                    let worker = s.workers.find();
                    self.provide_worker(&mut s, worker, &mut after).err()
                } else {
                    None
                }
            };
            self.after(after);
        }
        // A paused test clock let go while the work stalled is held again
        // (clock.rs), as after any transition that can end a stall.
        self.clock_holds.wake_if_dormant();
        if let Some(accepted) = passed.accepted {
            tracing::trace!(parent: &accepted.core().span(), "accepted");
        }
        if let Some(e) = spawn_error {
            tracing::warn!(error = %e, "could not spawn another worker thread; the job waits for a busy one");
        }
        Ok(())
    }

    /// Transition *accept*, with the wake protocol: a searching worker, a
    /// claimed parked one or a new one. A worker that cannot be spawned
    /// refuses the job only when no worker exists to run it.
    ///
    /// With `cancelled`, the job is cancelled in the same critical section
    /// (it follows a token cancelled already): accepted, it never starts.
    fn enqueue(self: &Arc<Self>, task: Arc<dyn Task>, cancelled: bool) -> Result<(), Error> {
        self.uncount_waking_worker();
        let task = match self.pass_intake(task, cancelled) {
            Ok(()) => return Ok(()),
            Err(task) => task,
        };
        let mut after = After::default();
        let mut s = self.lock();
        // Before admission: events waiting for a delivery thread that
        // failed to spawn would otherwise hold admission back for good.
        let delivery_error = self.ensure_delivery(&mut s);
        if let Err(refused) = s.admit(task.core(), cancelled) {
            drop(s);
            warn_delivery(delivery_error);
            return Err(refused);
        }
        // A job that must wait for its lane needs no worker: its lane's
        // running jobs' workers come back to the queue (lanes.rs); nor does
        // one cancelled as it is accepted.
        let worker = if !cancelled && s.lane_has_room(task.core()) {
            s.workers.find()
        } else {
            crate::core::state::Worker::Busy
        };
        let spawn_error = match self.provide_worker(&mut s, worker, &mut after) {
            Ok(()) => None,
            Err(e) if s.workers.live() == 0 => {
                s.count_spawn_refusal();
                s.bound.unreserve();
                drop(s);
                tracing::warn!(error = %e, "could not spawn a worker thread and none is running; job refused");
                return Err(Error::ThreadSpawn(e));
            }
            Err(e) => Some(e),
        };
        let monitor_error = self.ensure_monitor(&mut s);
        s.accept_admitted(task.clone(), &mut after);
        let cancelled = cancelled && s.cancel_queued(task.core(), &mut after);
        drop(s);
        // The accepted job's work first, then the log lines: a tracing
        // subscriber that panics must not leave a claimed worker unparked
        // or a cancelled job unsettled.
        self.after(after);
        if cancelled {
            task.discard();
            self.published_one(task.core());
        }
        if let Some(e) = monitor_error {
            tracing::warn!(error = %e, "could not spawn the stuck-job monitor; stuck jobs go unreported");
        }
        warn_delivery(delivery_error);
        tracing::trace!(parent: &task.core().span(), "accepted");
        if let Some(e) = spawn_error {
            tracing::warn!(error = %e, "could not spawn another worker thread; the job waits for a busy one");
        }
        Ok(())
    }

    /// The error of a caller whose timeout passed after `waited` while it
    /// waited for admission (for room, or for a lagging observer), counted:
    /// its job was never accepted.
    pub(crate) fn gave_up_waiting(&self, waited: Duration) -> Error {
        self.lock().count_timed_out_waiting();
        Error::TimedOut {
            id: None,
            waited,
            state: None,
            fate: crate::job::error::Fate::Cancelled,
        }
    }

    /// Counts a refusal that the caller reports: a full queue or a lagging
    /// observer, for good. (The other refusals are counted where they are
    /// decided; a timeout while waiting for room by `gave_up_waiting`.)
    pub(crate) fn count_refusal(&self, reason: &Error) {
        match reason {
            Error::Full { .. } => self.lock().count_full(),
            Error::ObserverBehind { .. } => self.lock().count_observer_behind(),
            _ => {}
        }
    }

    /// Makes sure a worker will look at the queue: nothing to do if one is
    /// searching; else claim a parked one (unparked after unlocking) or
    /// spawn one under the lock.
    pub(crate) fn provide_worker(
        self: &Arc<Self>,
        s: &mut State,
        worker: Worker,
        after: &mut After,
    ) -> std::io::Result<()> {
        match worker {
            Worker::Searching | Worker::Busy => Ok(()),
            Worker::Claimed(thread) => {
                after.unpark.push(thread);
                Ok(())
            }
            Worker::Spawn(id) => self.spawn_worker(s, id),
        }
    }
}

/// Logs a failed spawn of the observer's delivery thread (outside the lock).
pub(crate) fn warn_delivery(error: Option<std::io::Error>) {
    if let Some(e) = error {
        tracing::warn!(error = %e, "could not spawn the observer's delivery thread; events wait for the next job or the shutdown");
    }
}
