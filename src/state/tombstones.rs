//! Tombstones: cancelled jobs left linked in the queue (S2 of the state
//! module), so that a cancel touches only its own job. They are unlinked
//! when a start or a drain reaches them, or all at once when they outnumber
//! the queued jobs.

use super::{After, State};
use crate::id::QUEUED;
use crate::slab::Key;

impl State {
    /// Unlinks every tombstone, keeping the queued jobs in order (S2).
    /// Called when tombstones outnumber queued jobs, so the walk costs at
    /// most twice the tombstones it removes, plus one.
    pub(super) fn unlink_tombstones(&mut self, after: &mut After) {
        for _ in 0..self.queue.len() {
            let Some(key) = self.jobs.pop_front(&mut self.queue) else {
                break;
            };
            let queued = self
                .jobs
                .get(key)
                .is_some_and(|t| t.core().state_word() == QUEUED);
            if queued {
                self.jobs.push_back(&mut self.queue, key);
            } else {
                self.bury(key, after);
            }
        }
        debug_assert_eq!(self.tombstones, 0, "S2: every tombstone was linked");
        debug_assert_eq!(self.queue.len(), self.queued, "S2");
    }

    /// Lets go of the tombstone `key`, just unlinked (dropped after
    /// unlocking: S4).
    pub(super) fn bury(&mut self, key: Key, after: &mut After) {
        self.tombstones -= 1;
        if let Some(task) = self.jobs.remove(key) {
            after.dead.push(task);
        }
    }
}
