//! Admission: whether a new job may join the queue, the *accept*
//! transition that appends it (invariant 8 of `docs/ARCHITECTURE.md`: the
//! queue bound counts only jobs waiting for a permit), and the signal to
//! callers waiting for room.

use super::{After, Room, State};
use crate::core::observer::EventKind;
use crate::job::cell::Task;
use crate::job::error::Error;
use crate::job::record::JobCore;
use crate::util::sync::Arc;

impl State {
    /// Whether the new job of `core` may be accepted: not shut down (a
    /// refusal then is counted here), its group (if any) not stopped, and
    /// fewer than `queue_capacity` jobs *waiting for a permit*: queued jobs
    /// that a free permit will start at once are not waiting. The refusals
    /// for good come first: a caller told "full" waits for room, and must
    /// not wait for it through a stopped group, nor when it would miss its
    /// deadline behind the callers already waiting (overload.rs). A job
    /// that would miss its deadline behind the jobs ahead of it is refused
    /// too.
    pub(crate) fn admit(&mut self, core: &JobCore, cancelled: bool) -> Result<(), Error> {
        if self.shutdown {
            self.counts.rejected_shutdown += 1;
            return Err(Error::ShuttingDown { id: None });
        }
        self.groups.admits(core)?;
        if let Err(full) = self.reserve(core, cancelled) {
            if self.would_miss_at_admission(core, Some(self.ahead_of_a_room_waiter())) {
                self.counts.rejected_overload += 1;
                return Err(Error::Overloaded { id: None });
            }
            return Err(full);
        }
        if self.events.holds_admission() {
            self.bound.unreserve();
            return Err(Error::ObserverBehind {
                lag: self.events.lag(),
            });
        }
        if !cancelled && self.would_miss_at_admission(core, None) {
            self.bound.unreserve();
            self.counts.rejected_overload += 1;
            return Err(Error::Overloaded { id: None });
        }
        Ok(())
    }

    /// Reserves the job's place in the queue bound, on the same word as a
    /// submitter at the intake (fast/intake.rs inv. 1): refused if as many jobs
    /// as the bound already wait for a permit, unless the job would start
    /// at once. Jobs at the intake are counted as waiting; if that alone
    /// would refuse the job, the intake is closed (which moves them into
    /// the queue, where those a free permit would start are not waiting),
    /// the job judged on the exact queue, and the intake opened again.
    ///
    /// A job `cancelled` as it is accepted (it follows a token cancelled
    /// already) leaves the queue in the same critical section: it takes no
    /// place for longer than that, and is never refused for want of one.
    fn reserve(&mut self, core: &JobCore, cancelled: bool) -> Result<(), Error> {
        let mut settled = false;
        let reserved = loop {
            let (counted, seen) = self.bound.exact();
            let ahead = self.intake_ahead(counted);
            // Queued jobs that a free permit would start now are not
            // waiting; jobs ahead of this one take free permits first.
            let free = self.free_permits();
            let starting = free.min(self.lanes.startable_queued());
            if !cancelled
                && counted.saturating_sub(starting) >= self.bound.capacity()
                && !self.would_start_at_once(core, free.saturating_sub(ahead))
            {
                if ahead > 0 && !settled {
                    settled = true;
                    self.close_intake();
                    continue;
                }
                break Err(Error::Full {
                    capacity: self.bound.capacity(),
                });
            }
            if self.bound.reserve(seen) {
                break Ok(());
            }
        };
        if settled {
            self.refresh_intake();
        }
        reserved
    }

    /// Permits free now that have a worker to run them: while the OS
    /// refuses new threads, only the workers that exist count.
    pub(super) fn free_permits(&self) -> usize {
        if self.workers.spawn_blocked() {
            self.workers.live().saturating_sub(self.running.len())
        } else {
            self.max_in_flight.saturating_sub(self.running.len())
        }
    }

    /// Queued jobs that a free permit would not start now: beyond the free
    /// permits, or held back by their lane's limit or a limiter (L5).
    pub(super) fn waiting_for_permit(&self) -> usize {
        self.queued
            .saturating_sub(self.free_permits().min(self.lanes.startable_queued()))
    }

    /// Transition *accept* of a job admitted in this critical section. Its
    /// limiters count it as waiting from here (a job at the intake is
    /// counted by its submitter, before the push).
    pub(crate) fn accept_admitted(&mut self, task: Arc<dyn Task>, after: &mut After) {
        self.bound.take_reservation();
        crate::job::limiter::count_joined(task.core().limiters());
        self.accept(task, after);
    }

    /// Transition *accept*: appends `task` to the queue and counts it. Its
    /// place in the queue bound was reserved (`admit`, or at the intake).
    pub(crate) fn accept(&mut self, task: Arc<dyn Task>, after: &mut After) {
        self.counts.accepted += 1;
        self.event(task.core(), EventKind::Accepted, after);
        let key = self.jobs.insert(task.clone());
        task.core().set_key(key);
        self.groups.join(task.core(), key);
        self.lane_push(task.core(), key, after);
        self.queued += 1;
        self.bound.entered_queue(self.counts.accepted);
        // Several slots may have freed in one critical section (a limiter's
        // new permits readying several lanes, L5) with one waiter woken for
        // them: while room is left, each admission wakes the next waiter.
        // An admission that fills the bound while a free permit would start
        // a job at once (this job joined a blocked lane) leaves that permit
        // to the callers whose jobs may take it.
        if self.waiting_for_permit() < self.bound.capacity() {
            self.room_freed(after);
        } else {
            self.room_for_jobs_starting_at_once(after);
        }
    }

    /// Room may have freed: the caller that waited longest is signalled;
    /// every caller, if the bound is still full while a free permit would
    /// start a job at once. Only some callers' jobs may take that permit
    /// (a job needing a limiter does not start at once: invariant 8), and
    /// the one signalled, refused again, would keep it from a caller behind
    /// it; each is signalled once, so two refused callers cannot keep
    /// waking each other.
    pub(super) fn room_freed(&self, after: &mut After) {
        if !self.waiters.for_room() {
            return;
        }
        if self.room_for_jobs_starting_at_once(after) {
            return;
        }
        // A signal to every waiter (a shutdown's) is never narrowed.
        if after.room == Room::None {
            after.room = Room::One;
        }
    }

    /// Signals every caller waiting for room (and returns `true`) if the
    /// bound is full while a free permit would start a job at once and a
    /// caller's job needs no limiter and has no key (such a job takes it;
    /// a limited one does not start at once, nor one of a key at its
    /// limit): called where room frees, where an admission fills the
    /// bound, and where a lane blocks on a limiter (its jobs no longer take
    /// the free permits first). With only callers of limited or keyed jobs
    /// waiting, nobody is woken for a permit none of them can take.
    pub(super) fn room_for_jobs_starting_at_once(&self, after: &mut After) -> bool {
        let only_some = self.waiters.for_room_plain()
            && self.waiting_for_permit() >= self.bound.capacity()
            && self.free_permits() > self.lanes.startable_queued();
        if only_some {
            after.room = Room::All;
        }
        only_some
    }

    /// Counts a refusal the caller reports: a full queue, for good.
    pub(crate) fn count_full(&mut self) {
        self.counts.rejected_full += 1;
    }

    /// Counts a caller whose timeout passed while it waited for room.
    pub(crate) fn count_timed_out_waiting(&mut self) {
        self.counts.rejected_timed_out += 1;
    }

    /// Counts a refusal for an observer that fell behind.
    pub(crate) fn count_observer_behind(&mut self) {
        self.counts.rejected_observer += 1;
    }

    /// Counts a job refused because no worker could be spawned for it.
    pub(crate) fn count_spawn_refusal(&mut self) {
        self.counts.rejected_spawn += 1;
    }
}
