//! Worker threads: the loop that runs jobs, the wake-up protocol that finds
//! a worker for every queued job, spinning, and thread spawning.
//!
//! state/README.md ("Waking workers") describes the protocol; in short,
//! after Go's scheduler: `searching` counts workers that are awake without
//! a job and will look at the queue under the lock before they park. A
//! submitter wakes a parked worker (or spawns one, below `max_in_flight`)
//! only when nobody is searching; a searcher that takes a job and leaves
//! others queued finds the next worker itself when it was the last
//! searcher. So whenever the queue is not empty, some worker is searching
//! or every worker is busy and will come back to the queue. This holds
//! after a graceful shutdown too: queued jobs drain at the full
//! `max_in_flight` width.

use std::time::{Duration, Instant};

use crate::core::fast::chain;
use crate::core::pool::Inner;
use crate::core::state::{After, State};
use crate::job::cell::Task;
use crate::job::record::JobCore;
use crate::job::stop::StopToken;
use crate::util::quiet::{drop_quietly, quietly};
use crate::util::slab::Key;
use crate::util::sync::{park_timeout, thread, Arc};

/// How long a worker kept for a job waiting on a limiter (the pool's last
/// worker, `State::must_keep_worker`) parks at least before it looks again:
/// whatever lets it go, or gives its job a permit, claims it sooner.
const KEPT_PARK: Duration = Duration::from_secs(1);

impl Inner {
    /// This pool's address: what its threads' marks name it by.
    pub(crate) fn addr(&self) -> usize {
        self as *const Inner as usize
    }

    /// Whether the current thread is one of this pool's workers.
    pub(crate) fn is_own_worker(&self) -> bool {
        crate::util::sync::is_pool_thread(self.addr(), crate::util::sync::Role::Worker)
    }

    /// A job offloaded from a waker that runs on a worker counted as
    /// searching (its mark, set in `work_loop` and `wait_for_work`): that
    /// worker will not look at the queue before the waker returns, which
    /// may be after this job's end, so it stops counting, and the job finds
    /// a worker of its own.
    pub(crate) fn uncount_waking_worker(&self) {
        if crate::util::sync::take_searching_mark(self.addr(), false) {
            self.lock().workers.end_search();
        }
    }

    /// The worker thread's body: run jobs while there are any, with one lock
    /// acquisition per job (finish one, take the next), then spin or park.
    ///
    /// A published outcome stays counted as unpublished until this worker's
    /// next lock acquisition, which saves a lock per job.
    fn work_loop(self: Arc<Self>, me: u64, slot: Key) {
        crate::util::sync::mark_pool_thread(self.addr(), crate::util::sync::Role::Worker);
        // `owed`: this worker published an outcome still counted as
        // unpublished.
        let mut owed = false;
        let mut next = self.wait_for_work(me, slot, true, &mut owed);
        while let Some(task) = next {
            let core = task.core();
            // The job's span and log lines call the tracing subscriber:
            // foreign code, which must not unwind through this loop.
            let span = quietly(|| core.span()).unwrap_or_else(tracing::Span::none);
            let entered = quietly(|| span.enter());
            quietly(|| tracing::debug!("started"));
            let stop = StopToken::from_source(task.clone());
            let mut following = None;
            let mut ran = Duration::ZERO;
            let mut panicked = false;
            let mut after = After::default();
            // For a wait from inside the function ([`Inner::enter_own_wait`]):
            // the key stays this job's while it runs.
            crate::util::sync::set_current_job(Some(core.key()));
            let result_drops = task.result_needs_drop();
            let mut searching = false;
            // Whether the job's last log lines are written, decided with
            // the rest when its function returns (a level raised later
            // loses them: the subscriber is called only if the worker
            // counted on it).
            let mut log_lines = false;
            task.run(&stop, &mut |did_panic| {
                // The function returned: release the permit and take the
                // next job under one lock (S1), before the outcome is
                // published (job/cell.rs inv. 4).
                panicked = did_panic;
                let now = crate::job::id::now_ns();
                ran = core.clock_at(now);
                self.caller_spin.note_run_time(ran);
                let mut s = self.lock();
                if std::mem::take(&mut owed) {
                    s.published(1, &mut after);
                }
                s.finish(core, did_panic, ran, &mut after);
                // Foreign code left for this thread before a next job's
                // function could run: a tracing subscriber's, for the job's
                // span (enabled or not since it was made) or last log lines
                // (tracing's level statics, read here: no subscriber call);
                // the drop of a value of the job's (a panic's payload, a
                // result with drop glue).
                let level = if did_panic {
                    tracing::Level::WARN
                } else {
                    tracing::Level::DEBUG
                };
                log_lines = crate::util::quiet::may_log(level);
                let traced = log_lines || !span.is_disabled();
                let user_code = traced || did_panic || result_drops;
                // With the fast layer on, the next job starts in this same
                // critical section if `chain::may_chain_after` allows it: only if
                // nothing foreign runs on this thread before its function.
                if self.config.fast
                    && chain::may_chain_after(core, user_code, after.runs_foreign_code())
                {
                    following = s.start(now, &mut after);
                }
                if following.is_none() && !user_code {
                    // From here until it parks this worker will look at the
                    // queue again, so a submitter need not wake one. Not
                    // while a drop or a subscriber may run on it first: that
                    // code may offload a job and wait for it, which would
                    // wake nobody. Wakers may run: a job they offload
                    // un-counts this worker first (its mark, below).
                    s.workers.begin_search();
                    searching = true;
                    // Before the outcome is published and its waker woken.
                    crate::util::sync::set_searching_mark(self.addr());
                }
            });
            crate::util::sync::set_current_job(None);
            drop(stop);
            if log_lines {
                quietly(|| log_finished(core, panicked, ran));
            }
            quietly(move || drop(entered));
            quietly(move || drop(span));
            self.after(after);
            let group = core.membership().map(|m| m.group);
            // Drops a detached job's result: user code, caught if it panics.
            drop_quietly(task);
            if group.is_some() {
                // Settled now, not at this worker's next lock: that may be
                // after the next job, of another group, has run (a group's
                // idleness must not wait for it).
                let mut after = After::default();
                self.lock().published_one(group, &mut after);
                self.after(after);
            } else {
                owed = true;
            }
            next = following;
            // Still counted as searching unless a job offloaded from a
            // waker on this thread took the mark (`Inner::enqueue`).
            let searching = crate::util::sync::take_searching_mark(self.addr(), searching);
            if next.is_none() {
                next = self.wait_for_work(me, slot, searching, &mut owed);
            }
        }
        quietly(|| tracing::trace!("worker thread exiting"));
    }

    /// Returns the next job, spinning then parking while there is none;
    /// `None` when this worker should exit (shutdown or keep-alive expiry),
    /// in which case it has already retired. `searching` says whether this
    /// worker is already counted as searching.
    fn wait_for_work(
        self: &Arc<Self>,
        me: u64,
        slot: Key,
        mut searching: bool,
        owed: &mut bool,
    ) -> Option<Arc<dyn Task>> {
        let mut after = After::default();
        let mut s = self.lock();
        if std::mem::take(owed) {
            s.published(1, &mut after);
        }
        let mut spun = false;
        loop {
            if let Some(task) = s.start(crate::job::id::now_ns(), &mut after) {
                if searching {
                    s.workers.end_search();
                    // Jobs that passed the intake meanwhile are seen by
                    // this worker or find it not searching (fast/intake.rs
                    // inv. 2), so the baton passes for them too.
                    s.look_at_intake();
                }
                let worker = s.wake_another();
                let spawned = self.provide_worker(&mut s, worker, &mut after);
                drop(s);
                if let Err(e) = spawned {
                    quietly(
                        || tracing::debug!(error = %e, "could not spawn another worker; queued jobs wait for busy ones"),
                    );
                }
                self.after(after);
                return Some(task);
            }
            // The last worker stays while jobs are queued that a limiter's
            // permit may yet start (lanes.rs L4): it holds the pool alive
            // for them, after a shutdown too.
            // (A start that shed jobs leaves them to discard: this worker
            // looks again after that, below.)
            if s.is_shutdown() && after.shed.is_empty() && !s.must_keep_worker() {
                if searching {
                    s.workers.end_search();
                }
                self.retire(s, slot, after);
                return None;
            }
            let spin =
                !spun && (searching || s.workers.searching() == 0) && self.worker_spin.may_spin();
            // The work left for after the lock (wakers among it) runs
            // before this worker parks, never while it is counted as
            // parked: a waker that offloads a job and waits for it would
            // claim this worker, which would run the job only after the
            // waker returned.
            if spin || !after.is_empty() {
                if !searching {
                    s.workers.begin_search();
                    searching = true;
                }
                drop(s);
                // Wakers may run: a job they offload un-counts this worker.
                crate::util::sync::set_searching_mark(self.addr());
                self.after(std::mem::take(&mut after));
                searching = crate::util::sync::take_searching_mark(self.addr(), searching);
                // Claimed after the foreign code `after` may run, so that
                // the flag is never held across it.
                if spin {
                    self.worker_spin.spin(|| self.job_waits());
                }
                spun |= spin;
                s = self.lock();
                continue;
            }
            if searching {
                // Parked workers are not searching; a claimer re-counts it.
                s.workers.end_search();
            }
            let mut parked_at = Instant::now();
            let mut period = self.config.keep_alive;
            let key = s.workers.park(me, thread::current());
            // fast/intake.rs inv. 2: a job that passed the intake meanwhile
            // either is seen here or finds this worker parked and claims it.
            if s.intake_has_jobs() {
                s.workers.unpark_self(key);
                s.workers.begin_search();
                searching = true;
                s.look_at_intake();
                continue;
            }
            drop(s);
            debug_assert!(after.is_empty(), "run before parking");
            loop {
                park_timeout(period.saturating_sub(parked_at.elapsed()));
                s = self.lock();
                if s.workers.was_claimed(key, me) {
                    // The claimer counted this worker as searching.
                    searching = true;
                    spun = false;
                    break;
                }
                if parked_at.elapsed() >= period {
                    if s.may_retire() {
                        s.workers.unpark_self(key);
                        self.retire(s, slot, after);
                        return None;
                    }
                    // Still parked, for another period: one of at least
                    // `KEPT_PARK` (a short keep-alive would make it poll
                    // the lock; whatever lets it go claims it anyway).
                    parked_at = Instant::now();
                    period = self.config.keep_alive.max(KEPT_PARK);
                    drop(s);
                    continue;
                }
                // Spurious wake-up: still parked, park again.
                drop(s);
            }
        }
    }

    /// Takes this worker out of the pool as its last act, and joins the
    /// threads that retired before it (src/core/README.md "Termination").
    fn retire(&self, mut s: crate::util::sync::MutexGuard<'_, State>, slot: Key, mut after: After) {
        let earlier = s.retire(slot, &mut after);
        drop(s);
        self.after(after);
        self.join(earlier);
    }

    /// Joins retired threads and settles them. The calling thread's own
    /// handle (a retiring pool thread whose thread-local destructor or
    /// waker asks for termination) is not joined, which would deadlock: it
    /// goes back to the exited list for the next waiter.
    pub(crate) fn join(&self, handles: Vec<thread::JoinHandle<()>>) {
        if handles.is_empty() {
            return;
        }
        let n = handles.len();
        let me = thread::current().id();
        let mut own = None;
        for h in handles {
            if h.thread().id() == me {
                own = Some(h);
                continue;
            }
            // A thread that panicked after retiring has nothing to report.
            let _ = h.join();
        }
        let mut after = After::default();
        self.lock().joined(n, own, &mut after);
        self.after(after);
    }

    /// Whether a job waits for a worker, as far as a spinner can tell
    /// without the lock: in the intake, or in the queue. It reads lines
    /// only the lock holder writes and the intake's front place, never the
    /// queue count submitters add to at every job (whose line its looks
    /// would pull away from them): a place reserved but not yet filled
    /// shows once its job is in.
    fn job_waits(&self) -> bool {
        // ORDERING: a hint; the worker looks again under the lock.
        self.queue_count.in_queue() || self.intake.as_ref().is_some_and(|i| !i.is_empty())
    }

    /// Spawns the worker `id` counted by `Worker::Spawn`, under the lock;
    /// on failure the count is given back.
    pub(crate) fn spawn_worker(self: &Arc<Self>, s: &mut State, id: u64) -> std::io::Result<()> {
        let spawned = if s.workers.injected_spawn_failure() {
            Err(std::io::Error::from_raw_os_error(11)) // EAGAIN
        } else {
            self.spawn_thread(s, "worker", move |inner, slot| inner.work_loop(id, slot))
        };
        match spawned {
            Ok(()) => s.spawn_succeeded(),
            Err(_) => s.spawn_failed(),
        }
        spawned
    }

    /// Starts the stuck-job monitor if one is configured and not running;
    /// returns the error if it could not be spawned (best effort: stuck
    /// jobs then go unreported but nothing else changes).
    pub(crate) fn ensure_monitor(self: &Arc<Self>, s: &mut State) -> Option<std::io::Error> {
        if self.config.stuck_after.is_none() || !s.workers.monitor_starting() {
            return None;
        }
        match self.spawn_thread(s, "monitor", |inner, slot| inner.monitor_loop(slot)) {
            Ok(()) => None,
            Err(e) => {
                let mut after = After::default();
                s.monitor_gone(&mut after);
                // Nobody can be waiting on a monitor that never ran.
                drop(after);
                Some(e)
            }
        }
    }

    /// Spawns a pool thread whose handle the state keeps, so that
    /// termination can join it.
    pub(crate) fn spawn_thread(
        self: &Arc<Self>,
        s: &mut State,
        role: &str,
        body: impl FnOnce(Arc<Inner>, Key) + Send + 'static,
    ) -> std::io::Result<()> {
        let name = match role {
            "worker" => self.config.thread_name.clone(),
            other => format!("{}-{other}", self.config.thread_name),
        };
        let mut b = thread::Builder::new().name(name);
        if let Some(size) = self.config.stack_size {
            b = b.stack_size(size);
        }
        let slot = s.workers.thread_slot();
        let me = self.clone();
        match b.spawn(move || body(me, slot)) {
            Ok(handle) => {
                s.workers.thread_started(slot, handle);
                Ok(())
            }
            Err(e) => {
                s.workers.thread_failed(slot);
                Err(e)
            }
        }
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
