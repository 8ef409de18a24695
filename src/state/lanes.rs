//! Keyed lanes: the queue is one FIFO list per lane, and the pool serves
//! the lanes that have a startable job in turn (invariants L1–L3 of the
//! module docs).
//!
//! Jobs without a key share the default lane, which has no limit of its
//! own: a pool whose jobs have no keys has one lane and starts its jobs in
//! submission order, as before keys existed. A keyed job joins its key's
//! lane, made on first use and dropped once it holds no job, so memory
//! follows the keys in use, not every key ever seen.

use std::collections::HashMap;

use super::{After, State};
use crate::id::QUEUED;
use crate::job_core::JobCore;
use crate::lane::{KeyStats, LaneKey};
use crate::slab::{Key, List};

/// The default lane's key in the lane slab: inserted first, never removed.
pub(super) const DEFAULT_LANE: Key = 0;

/// One lane: its queued jobs (and tombstones) in submission order, and its
/// counts.
pub(super) struct Lane {
    /// `None` for the default lane.
    key: Option<LaneKey>,
    /// The lane's `Queued` jobs and tombstones, in submission order, as a
    /// list of the pool's job slab (S2).
    pub(super) jobs: List,
    /// Its `Queued` jobs.
    pub(super) queued: usize,
    /// Its cancelled jobs still linked in `jobs`.
    pub(super) tombstones: usize,
    /// Its `Running` jobs.
    running: usize,
    /// How many of its jobs may run at once.
    limit: usize,
    /// Linked into the ring of startable lanes.
    in_ring: bool,
}

impl Lane {
    pub(super) fn new(key: Option<LaneKey>, limit: usize) -> Self {
        Lane {
            key,
            jobs: List::default(),
            queued: 0,
            tombstones: 0,
            running: 0,
            limit,
            in_ring: false,
        }
    }

    /// L1: a lane is in the ring exactly when this holds.
    fn startable(&self) -> bool {
        self.queued > 0 && self.running < self.limit
    }

    fn is_unused(&self) -> bool {
        self.queued == 0 && self.running == 0 && self.jobs.is_empty()
    }
}

/// The per-key limits, from the configuration.
#[derive(Debug, Clone, Default)]
pub(crate) struct KeyLimits {
    /// The limit of a key without its own.
    pub(crate) per_key: Option<usize>,
    /// Keys with their own limit.
    pub(crate) keys: std::sync::Arc<HashMap<LaneKey, usize>>,
}

impl KeyLimits {
    fn of(&self, key: &LaneKey) -> usize {
        self.keys
            .get(key)
            .copied()
            .or(self.per_key)
            .unwrap_or(usize::MAX)
    }
}

impl State {
    /// The lane `core` is in (or joins).
    pub(super) fn lane_of(core: &JobCore) -> Key {
        core.lane().map_or(DEFAULT_LANE, |l| l.slot())
    }

    /// Puts the job `job` (of `core`, just accepted) at the back of its
    /// lane, making the lane on the key's first use.
    pub(super) fn lane_push(&mut self, core: &JobCore, job: Key) {
        let lane = match core.lane() {
            None => DEFAULT_LANE,
            Some(l) => {
                let slot = match self.lane_index.get(&l.key) {
                    Some(&slot) => slot,
                    None => {
                        let limit = self.key_limits.of(&l.key);
                        let slot = self.lanes.insert(Lane::new(Some(l.key.clone()), limit));
                        self.lane_index.insert(l.key.clone(), slot);
                        slot
                    }
                };
                l.set_slot(slot);
                slot
            }
        };
        if let Some(l) = self.lanes.get_mut(lane) {
            self.jobs.push_back(&mut l.jobs, job);
            l.queued += 1;
        }
        self.lane_update(lane);
    }

    /// Whether a job of `core`'s key could start as soon as a permit is
    /// free: its lane, if it has one yet, holds fewer jobs than its limit.
    /// (A submitter need not find a worker for a job that must wait for its
    /// lane: the lane's running jobs' workers come back to the queue.)
    pub(crate) fn lane_has_room(&self, core: &JobCore) -> bool {
        let Some(l) = core.lane() else {
            return true;
        };
        match self.lane_index.get(&l.key).and_then(|&k| self.lanes.get(k)) {
            Some(lane) => lane.running.saturating_add(lane.queued) < lane.limit,
            None => true,
        }
    }

    /// Takes the next job to start: the front job of the lane whose turn it
    /// is, which then goes to the back of the ring if it still has a
    /// startable job (L2). Tombstones met on the way are unlinked. The
    /// caller moves the job to `Running`; `None` if no lane is startable.
    pub(super) fn lane_pop(&mut self, after: &mut After) -> Option<Key> {
        loop {
            let lane_key = self.ring.front()?;
            let lane = self.lanes.get_mut(lane_key)?;
            let Some(key) = self.jobs.pop_front(&mut lane.jobs) else {
                debug_assert!(false, "L1: a lane in the ring has a queued job");
                return None;
            };
            let queued = self
                .jobs
                .get(key)
                .is_some_and(|t| t.core().state_word() == QUEUED);
            if !queued {
                self.bury(lane_key, key, after);
                continue;
            }
            lane.queued -= 1;
            lane.running += 1;
            // L2: the lane's turn is over; it rejoins at the back.
            if lane.in_ring {
                lane.in_ring = false;
                self.lanes.unlink(&mut self.ring, lane_key);
            }
            self.lane_update(lane_key);
            return Some(key);
        }
    }

    /// A running job of `core`'s lane finished.
    pub(super) fn lane_finished(&mut self, core: &JobCore) {
        let lane = Self::lane_of(core);
        if let Some(l) = self.lanes.get_mut(lane) {
            l.running -= 1;
        }
        self.lane_update(lane);
    }

    /// A queued job of `core`'s lane was cancelled: it stays linked as a
    /// tombstone, and the lane's tombstones are unlinked once they
    /// outnumber its queued jobs (S2).
    pub(super) fn lane_cancelled(&mut self, core: &JobCore, after: &mut After) {
        let lane = Self::lane_of(core);
        let Some(l) = self.lanes.get_mut(lane) else {
            return;
        };
        l.queued -= 1;
        l.tombstones += 1;
        if l.tombstones > l.queued {
            self.unlink_tombstones(lane, after);
        }
        self.lane_update(lane);
    }

    /// Restores L1 for `lane` after its counts changed, and drops a keyed
    /// lane that holds no job (L3).
    pub(super) fn lane_update(&mut self, lane_key: Key) {
        let Some(lane) = self.lanes.get_mut(lane_key) else {
            return;
        };
        let startable = lane.startable() && !self.draining;
        let unused = lane.is_unused();
        if startable != lane.in_ring {
            lane.in_ring = startable;
            if startable {
                self.lanes.push_back(&mut self.ring, lane_key);
            } else {
                self.lanes.unlink(&mut self.ring, lane_key);
            }
        }
        if lane_key != DEFAULT_LANE && unused {
            if let Some(gone) = self.lanes.remove(lane_key) {
                if let Some(key) = gone.key {
                    self.lane_index.remove(&key);
                }
            }
        }
    }

    /// Whether some lane has a startable job.
    pub(super) fn any_startable(&self) -> bool {
        !self.ring.is_empty()
    }

    /// The `n` keyed lanes with the most jobs (queued and running), busiest
    /// first (O(keys)).
    pub(crate) fn key_stats(&self, n: usize) -> Vec<KeyStats> {
        let mut all: Vec<KeyStats> = self
            .lanes
            .values()
            .filter_map(|l| {
                Some(KeyStats {
                    key: l.key.clone()?,
                    queued: l.queued as u64,
                    running: l.running as u64,
                    limit: l.limit,
                })
            })
            .collect();
        all.sort_by(|a, b| {
            (b.queued + b.running)
                .cmp(&(a.queued + a.running))
                .then(b.running.cmp(&a.running))
        });
        all.truncate(n);
        all
    }
}
