//! The job transitions of the locked state: *start*, *finish*,
//! *cancel-queued*, *drain-unstarted*, *caller-left*, *stop-requested*, a
//! group's *stop* and *close*, and the settling of outcomes published
//! outside the lock (invariants S1–S5 of the module docs, G2 of
//! `groups.rs`). *Accept* is in `admission.rs`.
//!
//! Then the workers' transitions that reach beyond [`Workers`](super::Workers): a spawn's
//! outcome, retiring, joining, and the monitor's and delivery thread's
//! comings and goings, which may open or close the intake or settle the
//! pool.

use std::time::Duration;

use super::{After, Room, State, Worker};
use crate::core::observer::EventKind;
use crate::job::cell::Task;
use crate::job::id::{JobState, CANCELLED, COMPLETED, PANICKED, QUEUED, RUNNING, SHED, UNSTARTED};
use crate::job::policy::Departure;
use crate::job::record::JobCore;
use crate::util::slab::Key;
use crate::util::sync::{thread, Arc};

/// What a group stop leaves to do after unlocking.
#[derive(Default)]
pub(crate) struct StoppedJobs {
    /// Jobs it cancelled: their functions are discarded after unlocking.
    pub(crate) cancelled: Vec<Arc<dyn Task>>,
    /// Jobs running now whose stop flag it set: their stop callbacks run
    /// after unlocking.
    pub(crate) running: Vec<Arc<dyn Task>>,
}

impl State {
    /// Transition *stop* of group `key`: marks it and its descendants
    /// stopped (and closed), cancels their queued jobs (*cancel-queued*)
    /// and sets the stop flag of their running ones, all in this one
    /// critical section: none of the queued ones starts after the stop, and
    /// every running one is stopped at once. Returns both, for the work
    /// after unlocking (discarding functions, running stop callbacks) (G2).
    /// `None` if the group was already stopped.
    pub(crate) fn group_stop(&mut self, key: Key, after: &mut After) -> Option<StoppedJobs> {
        let members = self.groups.stop(key)?;
        self.group_refuses_from_now(after);
        let jobs: Vec<Arc<dyn Task>> = members
            .into_iter()
            .filter_map(|job| self.jobs.get(job).cloned())
            .collect();
        let mut stopped = StoppedJobs::default();
        for task in jobs {
            if self.cancel_queued(task.core(), after) {
                stopped.cancelled.push(task);
            } else if crate::job::stop::mark_stopped(&*task) {
                // Every running job's flag in this one critical section: no
                // job freed by an earlier one's stop meets a later one still
                // unstopped. The callbacks run after unlocking.
                self.stop_requested();
                stopped.running.push(task);
            }
        }
        Some(stopped)
    }

    /// Transition *close* of group `key`: it and its descendants refuse new
    /// jobs from now.
    pub(crate) fn group_close(&mut self, key: Key, after: &mut After) {
        self.groups.close(key);
        self.group_refuses_from_now(after);
    }

    /// A group stopped or closed: callers waiting for room with a job of it
    /// learn that it is refused now, not when room frees (which may be
    /// never), as at a shutdown. The others look again and wait on.
    fn group_refuses_from_now(&self, after: &mut After) {
        if self.waiters.for_room() {
            after.room = Room::All;
        }
    }

    /// Transition *start*: pops the next queued job and moves it to
    /// `Running`, taking its permit (S1, S2). `now` (from `now_ns`) is when
    /// it starts: a worker that just finished a job reads the clock once
    /// for both. Starts nothing if it shed jobs at their turn (overload.rs):
    /// the caller carries out `after` (which discards them), then looks
    /// again.
    pub(crate) fn start(&mut self, now: u64, after: &mut After) -> Option<Arc<dyn Task>> {
        if self.draining {
            return None;
        }
        // L2: the front job of the lane whose turn it is; S2: it is
        // `Queued` (tombstones were passed over).
        let (key, passed) = self.lane_pop(after)?;
        let task = self.jobs.get(key)?.clone();
        let moved = task.core().transition(QUEUED, RUNNING);
        debug_assert!(moved, "S2");
        let core = task.core();
        self.queued -= 1;
        self.bound.left_queue(1);
        self.groups.moved(core, QUEUED, RUNNING);
        // No room frees: the job moves from waiting to running, and the
        // bound is on jobs beyond the free permits.
        debug_assert!(self.running.len() < self.max_in_flight, "S1");
        self.jobs.push_back(&mut self.running, key);
        self.counts.max_running = self.counts.max_running.max(self.running.len() as u64);
        self.counts.queue_wait_total += core.mark_started(now);
        // Only now: the start holds its pool permit (lanes.rs `lane_pop`).
        if let Some(limiter) = passed {
            self.limiter_freed(&limiter, after);
        }
        self.event(core, EventKind::Started, after);
        Some(task)
    }

    /// Transition *finish*: the function of the running `core` returned
    /// (or unwound): releases its permit and records its end (S1).
    pub(crate) fn finish(
        &mut self,
        core: &JobCore,
        panicked: bool,
        ran: Duration,
        after: &mut After,
    ) {
        let key = core.key();
        self.jobs.unlink(&mut self.running, key);
        after.release = self.jobs.remove(key);
        // A run that panicked says nothing of how long runs take.
        self.lane_finished(core, (!panicked).then_some(ran), after);
        self.counts.run_time_total += ran;
        self.unpublished += 1;
        let (state, word) = if panicked {
            self.counts.panicked += 1;
            (JobState::Panicked, PANICKED)
        } else {
            self.counts.completed += 1;
            (JobState::Completed, COMPLETED)
        };
        core.transition(RUNNING, word);
        self.groups.moved(core, RUNNING, word);
        self.event(core, EventKind::Finished(state), after);
        // A free permit may let a room waiter in.
        self.room_freed(after);
        self.settle_check(after);
    }

    /// Transition *cancel-queued*: if `core` is still queued, moves it to
    /// `Cancelled`, leaving it in the queue as a tombstone (S2); `true` if
    /// it did. The caller then discards the function after unlocking.
    pub(crate) fn cancel_queued(&mut self, core: &JobCore, after: &mut After) -> bool {
        self.leave_queue_unrun(core, CANCELLED, after)
    }

    /// Transition *shed* (overload.rs): as *cancel-queued*, to `Shed`; the
    /// job is handed out in `after` to be discarded after unlocking.
    pub(super) fn shed(&mut self, core: &JobCore, after: &mut After) -> bool {
        // Taken first: as a tombstone it may be unlinked at once (S2).
        let task = self.jobs.get(core.key()).cloned();
        if !self.leave_queue_unrun(core, SHED, after) {
            return false;
        }
        after.shed.extend(task);
        true
    }

    /// Moves the queued job of `core` to the terminal `word` (`Cancelled`
    /// or `Shed`), leaving it in the queue as a tombstone (S2).
    fn leave_queue_unrun(&mut self, core: &JobCore, word: u8, after: &mut After) -> bool {
        if !core.transition(QUEUED, word) {
            return false;
        }
        self.queued -= 1;
        self.tombstones += 1;
        self.lane_cancelled(core, after);
        self.bound.left_queue(1);
        if word == SHED {
            self.counts.shed += 1;
        } else {
            self.counts.cancelled += 1;
        }
        self.unpublished += 1;
        self.groups.moved(core, QUEUED, word);
        self.event(core, EventKind::Finished(JobState::from_u8(word)), after);
        self.room_freed(after);
        self.release_kept_worker(after);
        true
    }

    /// Transition *drain-unstarted* (immediate shutdown), up to `max` jobs
    /// at a time: moves queued jobs to `Unstarted`, unlinks them and
    /// appends them to `into` (to be discarded after unlocking). From the
    /// first call on, [`start`](Self::start) takes nothing, so every job
    /// queued then is drained, even across several critical sections. Once
    /// the queue is empty, returns the running jobs (to be asked to stop).
    pub(crate) fn drain_unstarted(
        &mut self,
        into: &mut Vec<Arc<dyn Task>>,
        max: usize,
        after: &mut After,
    ) -> Option<Vec<Arc<dyn Task>>> {
        debug_assert!(self.shutdown, "inv. 3: nothing joins the queue now");
        if !self.draining {
            self.draining = true;
            self.release_kept_worker(after);
            // Lane by lane, the default lane first; no lane is made now.
            self.drain_lanes = self.lanes_to_drain(after);
        }
        let mut left = max;
        let before = self.queued;
        while left > 0 {
            let Some(&lane) = self.drain_lanes.last() else {
                break;
            };
            let Some(key) = self.lane_pop_front(lane) else {
                self.drain_lanes.pop();
                self.lane_update(lane, after);
                continue;
            };
            let Some(task) = self.jobs.get(key) else {
                continue;
            };
            // S2: a linked job is `Queued` or a tombstone.
            if !task.core().transition(QUEUED, UNSTARTED) {
                self.bury(lane, key, after);
                continue;
            }
            let Some(task) = self.jobs.remove(key) else {
                continue;
            };
            self.lane_drained_one(lane);
            left -= 1;
            self.queued -= 1;
            self.counts.unstarted += 1;
            self.unpublished += 1;
            self.groups.moved(task.core(), QUEUED, UNSTARTED);
            self.lane_left_queue(task.core());
            self.event(task.core(), EventKind::NeverStarted, after);
            into.push(task);
        }
        self.bound.left_queue(before - self.queued);
        if !self.drain_lanes.is_empty() {
            return None;
        }
        debug_assert_eq!((self.queued, self.tombstones), (0, 0), "S2");
        self.settle_check(after);
        Some(self.jobs.iter(&self.running).cloned().collect())
    }

    /// Transition *caller-left*: a caller stopped waiting for `core`.
    /// Returns `false`, and records nothing, if the job is already terminal:
    /// the caller left a finished job (and an event now could come after the
    /// delivery thread saw the pool settle for good).
    pub(crate) fn caller_left(
        &mut self,
        core: &JobCore,
        why: Departure,
        after: &mut After,
    ) -> bool {
        if core.state().is_terminal() {
            return false;
        }
        core.mark_caller_left();
        match why {
            Departure::TimedOut => self.counts.callers_timed_out += 1,
            Departure::Dropped => self.counts.callers_dropped += 1,
        }
        let state = core.state();
        if state == JobState::Running {
            self.counts.running_after_caller_left += 1;
        }
        self.event(core, EventKind::Abandoned { state }, after);
        true
    }

    /// Transition *stop-requested*: a stop request took effect.
    pub(crate) fn stop_requested(&mut self) {
        self.counts.stop_requests += 1;
    }

    /// Settles `n` outcomes published outside the lock.
    pub(crate) fn published(&mut self, n: usize, after: &mut After) {
        self.unpublished -= n;
        self.settle_check(after);
    }

    /// Settles one outcome published outside the lock, of a job of group
    /// `group` if it has one.
    pub(crate) fn published_one(&mut self, group: Option<Key>, after: &mut After) {
        self.published_many(1, group, after);
    }

    /// Settles `n` outcomes published outside the lock; `groups` names the
    /// group of each of them that has one.
    pub(crate) fn published_many(
        &mut self,
        n: usize,
        groups: impl IntoIterator<Item = Key>,
        after: &mut After,
    ) {
        for g in groups {
            self.groups.published(g, after);
        }
        self.published(n, after);
    }

    // ----- workers -------------------------------------------------------

    /// Called by a worker that just took a job: if jobs are still queued,
    /// makes sure a worker will look at them (nothing to do if another is
    /// searching: [`Workers::find`](super::Workers::find)).
    pub(crate) fn wake_another(&mut self) -> Worker {
        if !self.has_startable() {
            return Worker::Searching;
        }
        self.workers.find()
    }

    /// Whether the calling worker, about to retire, is the last one while
    /// jobs are queued: it must stay (parked), or a job waiting for a
    /// limiter's permit would have no worker when the permit comes back,
    /// and after the last handle is dropped nothing would keep the pool
    /// alive for it.
    pub(crate) fn must_keep_worker(&self) -> bool {
        self.workers.live() == 1 && self.queued > 0 && !self.draining
    }

    /// After a shutdown the last worker stays parked while it must
    /// ([`must_keep_worker`](Self::must_keep_worker)); once it need not (the
    /// queue emptied by a cancel, or drained), it is claimed, so it looks
    /// again and retires: termination does not wait for its keep-alive.
    pub(super) fn release_kept_worker(&mut self, after: &mut After) {
        if self.shutdown && !self.must_keep_worker() {
            self.workers.claim_all_parked(after);
        }
    }

    /// A worker counted by [`Worker::Spawn`] could not be spawned.
    pub(crate) fn spawn_failed(&mut self) {
        self.workers.spawn_failed();
        self.counts.spawn_failures += 1;
        self.refresh_intake();
    }

    /// A worker counted by [`Worker::Spawn`] was spawned.
    pub(crate) fn spawn_succeeded(&mut self) {
        self.workers.spawn_succeeded();
        self.refresh_intake();
    }

    /// Transition *retire*: a worker leaves the pool's count as its last
    /// act under the lock. Returns the handles of threads that retired
    /// before it, for it to join after unlocking (so that at most one
    /// retired thread is ever left unjoined, however long the pool lives).
    pub(crate) fn retire(&mut self, slot: Key, after: &mut After) -> Vec<thread::JoinHandle<()>> {
        let earlier = self.workers.retire(slot);
        self.refresh_intake();
        self.settle_check(after);
        earlier
    }

    /// `n` handles taken by [`Workers::take_exited`](super::Workers::take_exited) were settled: joined,
    /// or (`back`, the joiner's own) returned to the exited list.
    pub(crate) fn joined(
        &mut self,
        n: usize,
        back: Option<thread::JoinHandle<()>>,
        after: &mut After,
    ) {
        self.workers.joined(n, back);
        self.settle_check(after);
    }

    /// The monitor could not start.
    pub(crate) fn monitor_gone(&mut self, after: &mut After) {
        self.workers.monitor_gone();
        self.settle_check(after);
    }

    /// The monitor in `slot` exits; returns earlier retirees to join.
    pub(crate) fn monitor_exit(
        &mut self,
        slot: Key,
        after: &mut After,
    ) -> Vec<thread::JoinHandle<()>> {
        let earlier = self.workers.monitor_exit(slot);
        self.settle_check(after);
        earlier
    }

    /// Marks the delivery thread started; `false` if it already runs, or
    /// if it has nothing to do: the pool is shut down and every event is
    /// delivered (a refused job or a second shutdown starts no thread, and a
    /// terminated pool stays terminated).
    pub(crate) fn delivery_starting(&mut self) -> bool {
        if !self.events.observed()
            || self.workers.delivery()
            || (self.shutdown && self.events.is_drained())
        {
            return false;
        }
        self.workers.delivery_starting();
        true
    }

    /// The delivery thread in `slot` exits; returns earlier retirees to
    /// join. `None` (and it stays) while events may still come: until the
    /// pool is shut down, idle and without workers.
    pub(crate) fn delivery_exit(
        &mut self,
        slot: Key,
        after: &mut After,
    ) -> Option<Vec<thread::JoinHandle<()>>> {
        if !self.workers_done() {
            return None;
        }
        let earlier = self.workers.delivery_exit(slot);
        self.settle_check(after);
        Some(earlier)
    }
}
