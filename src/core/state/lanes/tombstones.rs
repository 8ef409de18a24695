//! Tombstones: cancelled jobs left linked in their lane's queue (S2 of the
//! state module), so that a cancel touches only its own job. They are
//! unlinked when a start or a drain reaches them, or all of a lane's at
//! once when they outnumber its queued jobs.

use crate::core::state::{After, State};
use crate::job::id::QUEUED;
use crate::util::slab::Key;

impl State {
    /// Unlinks every tombstone of `lane`, keeping its queued jobs in order
    /// (S2). Called when its tombstones outnumber its queued jobs, so the
    /// walk costs at most twice the tombstones it removes, plus one.
    pub(in crate::core::state) fn unlink_tombstones(&mut self, lane: Key, after: &mut After) {
        let Some(l) = self.lanes.slab.get_mut(lane) else {
            return;
        };
        let mut jobs = std::mem::take(&mut l.jobs);
        for _ in 0..jobs.len() {
            let Some(key) = self.jobs.pop_front(&mut jobs) else {
                break;
            };
            let queued = self
                .jobs
                .get(key)
                .is_some_and(|t| t.core().state_word() == QUEUED);
            if queued {
                self.jobs.push_back(&mut jobs, key);
            } else {
                self.bury(lane, key, after);
            }
        }
        if let Some(l) = self.lanes.slab.get_mut(lane) {
            l.jobs = jobs;
            debug_assert_eq!(l.tombstones, 0, "S2: every tombstone was linked");
            debug_assert_eq!(l.jobs.len(), l.queued, "S2");
        }
    }

    /// Lets go of the tombstone `key` of `lane`, just unlinked (dropped
    /// after unlocking: S4).
    pub(in crate::core::state) fn bury(&mut self, lane: Key, key: Key, after: &mut After) {
        if let Some(l) = self.lanes.slab.get_mut(lane) {
            l.tombstones -= 1;
        }
        self.tombstones -= 1;
        if let Some(task) = self.jobs.remove(key) {
            after.dead.push(task);
        }
    }
}
