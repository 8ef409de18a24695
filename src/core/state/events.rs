//! The observer's part of [`State`]: events appended in the critical
//! section of the transition they report (observer.rs invariant 1), the
//! delivery thread's batches, and the lag that holds admission back.

use std::collections::VecDeque;
use std::time::{Instant, SystemTime};

use super::{After, Room, State};
use crate::core::observer::{EventKind, JobEvent};
use crate::job::record::JobCore;

/// Events waiting for delivery, if the pool has an observer.
#[derive(Default)]
pub(crate) struct Events {
    /// Undelivered events beyond which admission is held back; `None`
    /// without an observer (nothing is recorded).
    lag_limit: Option<usize>,
    events: VecDeque<JobEvent>,
    /// Events taken by the delivery thread and not yet delivered.
    in_flight: usize,
    delivered: u64,
}

impl Events {
    /// Events for an observer that may lag `lag_limit` events behind, or
    /// none (`None`: no observer).
    pub(crate) fn new(lag_limit: Option<usize>) -> Self {
        Events {
            lag_limit,
            ..Events::default()
        }
    }

    /// Whether the pool has an observer.
    pub(crate) fn observed(&self) -> bool {
        self.lag_limit.is_some()
    }

    /// Appends an event if the pool has an observer (called under the pool
    /// lock, inv. 1); `true` if it did.
    fn push(&mut self, core: &JobCore, kind: EventKind) -> bool {
        if !self.observed() {
            return false;
        }
        self.events.push_back(JobEvent {
            id: core.id,
            name: core.name().cloned(),
            key: core.lane_key().cloned(),
            kind,
            at: Instant::now(),
            at_wall: SystemTime::now(),
            stop_requested: core.is_stop_requested(),
        });
        true
    }

    /// `true` when every appended event has been delivered.
    pub(crate) fn is_drained(&self) -> bool {
        self.events.is_empty() && self.in_flight == 0
    }

    /// Events appended and not yet delivered: how far the observer lags.
    pub(crate) fn lag(&self) -> usize {
        self.events.len() + self.in_flight
    }

    /// Whether the observer lags so far behind that admission waits.
    pub(crate) fn holds_admission(&self) -> bool {
        self.lag_limit.is_some_and(|limit| self.lag() >= limit)
    }

    /// Events delivered so far.
    pub(crate) fn delivered(&self) -> u64 {
        self.delivered
    }

    /// Takes every pending event for the delivery thread (the only taker,
    /// inv. 2); `None` if there is none.
    pub(crate) fn take(&mut self) -> Option<VecDeque<JobEvent>> {
        if self.events.is_empty() {
            return None;
        }
        let batch = std::mem::take(&mut self.events);
        self.in_flight = batch.len();
        Some(batch)
    }

    /// The batch taken last was delivered.
    fn done(&mut self) {
        self.delivered += self.in_flight as u64;
        self.in_flight = 0;
    }
}

impl State {
    pub(super) fn event(&mut self, core: &JobCore, kind: EventKind, after: &mut After) {
        if self.events.push(core, kind) {
            after.events = true;
        }
    }

    /// Takes every pending event for the delivery thread.
    pub(crate) fn events_take(&mut self) -> Option<VecDeque<JobEvent>> {
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
