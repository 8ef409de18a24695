//! The intake's half of [`State`] (fast/intake.rs): moving what passed it into
//! the queue, its gate, and the workers' counts its submitters read.

use super::{After, Room, State, Wait};

impl State {
    /// Moves every job waiting in the intake into the queue, in order
    /// (transition *accept* for each; their places were reserved). Called
    /// first in every critical section (`Inner::lock`).
    ///
    /// Accepting a plain job leaves no work for after the lock but a room
    /// signal (a lane that grew: lanes.rs), which a job joining the queue
    /// does not need: it frees no room, and a waiter woken for room
    /// wakes the next one when it is admitted itself.
    pub(crate) fn drain_intake(&mut self) {
        let mut after = After::default();
        while let Some(task) = self.intake.as_ref().and_then(|i| i.pop()) {
            self.accept(task, &mut after);
        }
        after.room = Room::None;
        debug_assert!(after.is_empty(), "a plain job's accept leaves no work");
    }

    /// Opens or closes the intake after a change that may decide it: open
    /// while plain jobs may pass it (the pool has one), the pool is not shut down, no
    /// caller waits for room (they come first), and a worker lives (the
    /// last one closes it before it goes: `may_retire`).
    pub(crate) fn refresh_intake(&mut self) {
        if self.intake.is_none() {
            return;
        }
        let open = !self.shutdown && !self.waiters.for_room() && self.workers.live() > 0;
        if open {
            self.bound.set_closed(false);
        } else {
            self.close_intake();
        }
    }

    /// Closes the intake and waits until every place reserved at it is
    /// filled and its job moved into the queue, or given back (fast/intake.rs
    /// inv. 1). A submitter fills its place a few instructions after
    /// reserving it (no lock, no foreign code between), so the wait is
    /// short unless its thread was preempted.
    pub(super) fn close_intake(&mut self) {
        // Shut, then count (`SeqCst` both; a submitter adds, then looks).
        // ORDERING: the SeqCst pair F3 of src/core/fast/README.md.
        self.bound.set_closed(true);
        let mut round = 0u32;
        loop {
            self.drain_intake();
            if self.intake_ahead(self.bound.exact().0) == 0 {
                return;
            }
            round += 1;
            if round < 64 {
                crate::util::sync::spin_hint();
            } else {
                crate::util::sync::thread::yield_now();
            }
        }
    }

    /// Of `counted` (the count's exact value), the jobs not yet in the
    /// queue: in the intake, or with a place reserved at it (filled soon,
    /// or given back). The count is the queued jobs, the intake's, the
    /// places reserved at it, and those reserved under this lock.
    pub(super) fn intake_ahead(&self, counted: usize) -> usize {
        counted.saturating_sub(self.queued + self.bound.reserved())
    }

    /// A worker stopped searching: jobs that passed the intake since this
    /// critical section began join the queue now, so the worker sees them
    /// (fast/intake.rs inv. 2: it published the change, then looks).
    pub(crate) fn look_at_intake(&mut self) {
        if self.intake.is_some() {
            // ORDERING: fence pair F1 of src/core/fast/README.md.
            crate::util::sync::fence(crate::util::sync::Ordering::SeqCst);
            self.drain_intake();
        }
    }

    /// Whether a job waits in the intake (after publishing a change of the
    /// workers' counts: fast/intake.rs inv. 2).
    pub(crate) fn intake_has_jobs(&self) -> bool {
        let Some(intake) = &self.intake else {
            return false;
        };
        // ORDERING: fence pair F2 of src/core/fast/README.md.
        crate::util::sync::fence(crate::util::sync::Ordering::SeqCst);
        !intake.is_empty()
    }

    /// Whether a parked worker whose keep-alive expired may retire: not the
    /// last one while jobs are queued ([`must_keep_worker`](Self::must_keep_worker)).
    /// The last one first closes the intake, so that no job passes it
    /// after the worker looked (fast/intake.rs inv. 1); the intake stays closed
    /// if it goes (no worker lives then), and opens again if it stays.
    pub(crate) fn may_retire(&mut self) -> bool {
        if self.workers.live() == 1 && self.intake.is_some() {
            self.close_intake();
        }
        if self.must_keep_worker() {
            self.refresh_intake();
            return false;
        }
        true
    }

    #[cfg(all(test, not(loom)))]
    pub(crate) fn waiters(&self, which: Wait) -> usize {
        self.waiters.of(which)
    }

    /// A waiter of `which` kind starts (`true`) or stops waiting. Callers
    /// waiting for room close the intake: they come before new jobs.
    pub(crate) fn count_waiter(&mut self, which: Wait, starts: bool) {
        self.waiters.count(which, starts);
        self.refresh_intake();
    }
}
