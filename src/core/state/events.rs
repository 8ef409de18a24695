//! The observer's part of [`State`]: events appended in the critical
//! section of the transition they report (observer.rs invariant 1), and
//! the delivery thread's batches.

use super::{After, Room, State};
use crate::core::observer::{EventKind, JobEvent};
use crate::job::record::JobCore;

impl State {
    pub(super) fn event(&mut self, core: &JobCore, kind: EventKind, after: &mut After) {
        if self.observe {
            self.events.push(core, kind);
            after.events = true;
        }
    }

    /// Takes every pending event for the delivery thread.
    pub(crate) fn events_take(&mut self) -> Option<std::collections::VecDeque<JobEvent>> {
        self.events.take()
    }

    /// The delivery thread delivered the batch it took: admission held back
    /// by the lag may go on, idleness may follow.
    pub(crate) fn events_done(&mut self, after: &mut After) {
        self.events.done();
        if self.waiters.for_room() {
            after.room = Room::All;
        }
        self.settle_check(after);
    }
}
