//! Keyed lanes: the queue is one FIFO list per lane, and the pool serves
//! the lanes that have a startable job in turn (invariants L1–L5 of the
//! module docs).
//!
//! Jobs without a key share the default lane, which has no limit of its
//! own: a pool whose jobs have no keys has one lane and starts its jobs in
//! submission order, as before keys existed. A keyed job joins its key's
//! lane, made on first use and dropped once it holds no job, so memory
//! follows the keys in use, not every key ever seen. Jobs without a key
//! that need limiters share a lane per set of limiters.
//!
//! A lane whose front job cannot have a permit of one of its limiters is
//! *blocked* on that limiter: out of the ring, in the pool's list of lanes
//! blocked on it (L4), so that it holds back no other lane. A permit given
//! back readies the first lane blocked on it (`limiter_freed`); a readied
//! lane that then does not use that permit (its front job was cancelled,
//! or needs another full limiter, or needs none) passes the wake-up to the
//! next lane blocked on it, so no free permit is left while a lane waits
//! for it.

use std::collections::HashMap;
use std::time::Duration;

use super::overload::{Pace, SHED_CHUNK};
use super::{After, State};
use crate::job::id::QUEUED;
use crate::job::lane::{KeyStats, LaneId, LaneKey};
use crate::job::limiter::{try_acquire_all, Limiter, PoolRef};
use crate::job::record::{JobCore, LaneRef};

mod limited;
#[cfg(all(test, not(loom)))]
mod tests;
mod tombstones;
use crate::util::slab::{Key, List, Slab};
pub(crate) use limited::{Blocked, OwnWaitMark};

/// The default lane's key in the lane slab: inserted first, never removed.
pub(super) const DEFAULT_LANE: Key = 0;

/// How many emptied keyed lanes a pool keeps for their keys' next jobs
/// (L3): a key whose jobs come one at a time finds its lane instead of
/// making it again (a hash-map insert and remove per job).
const KEEP_IDLE_LANES: usize = 16;

/// A lane slab of more slots than this gives its memory back once only
/// the default lane holds a job (L3).
const KEEP_LANE_SLOTS: usize = 4 * KEEP_IDLE_LANES;

/// The pool's lanes and the order they take turns in (L1–L3, L5). The
/// lanes' lists link the pool's job slab, so the transitions that move jobs
/// through lanes are `State`'s (this file, `limited.rs`, `tombstones.rs`).
pub(crate) struct Lanes {
    /// Every lane: each holds its `Queued` jobs in submission order, and
    /// tombstones (S2). The default lane is always there.
    slab: Slab<Lane>,
    /// The lanes with a startable job, in the order they take turns (L1).
    ring: List,
    /// Keyed lanes that hold no job, most recently emptied last (L3).
    idle: List,
    /// Keyed lanes by key.
    index: HashMap<LaneId, Key>,
    key_limits: KeyLimits,
    /// The queued jobs a free permit would start now: the sum of the
    /// startable lanes' shares (L5).
    startable_queued: usize,
    /// The limiters this pool's lanes wait for, by id, each with its lanes
    /// blocked on it in the order they blocked (L4).
    limited: HashMap<u64, Blocked>,
    /// This pool, as a limiter's watcher (limiter/mod.rs M2).
    watcher: PoolRef,
    /// This pool declines limiters' grants: it gave one back for want of a
    /// permit (limiter/mod.rs M3), until a permit of it frees.
    declines: bool,
    /// Lanes readied by a limiter's grant whose start is still to come:
    /// pool permits promised to grants (limiter/mod.rs M3).
    readied: usize,
}

impl Lanes {
    pub(super) fn new(key_limits: KeyLimits, watcher: PoolRef) -> Self {
        let mut slab = Slab::default();
        let default = slab.insert(Lane::new(None, usize::MAX));
        debug_assert_eq!(default, DEFAULT_LANE);
        Lanes {
            slab,
            ring: List::default(),
            idle: List::default(),
            index: HashMap::new(),
            key_limits,
            startable_queued: 0,
            limited: HashMap::new(),
            watcher,
            declines: false,
            readied: 0,
        }
    }

    /// The queued jobs a free permit would start now (L5).
    pub(super) fn startable_queued(&self) -> usize {
        self.startable_queued
    }
}

/// One lane: its queued jobs (and tombstones) in submission order, and its
/// counts.
pub(super) struct Lane {
    /// `None` for the default lane.
    id: Option<LaneId>,
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
    /// Holds no job and is linked into `Lanes::idle` (L3).
    idle: bool,
    /// The limiter (by id) whose list of blocked lanes this lane is in.
    blocked_on: Option<u64>,
    /// A grant of this limiter readied the lane: if the lane does not use
    /// it, the grant passes on (L4).
    woken_by: Option<Limiter>,
    /// Its share of `Lanes::startable_queued`: the jobs a free permit
    /// would start now (L5).
    contrib: usize,
    /// Its running functions blocked waiting for one of its queued jobs
    /// ([`Inner::enter_own_wait`](crate::core::pool::Inner::enter_own_wait)).
    own_waiters: usize,
    /// How long its runs take (overload.rs).
    pace: Pace,
}

impl Lane {
    pub(super) fn new(id: Option<LaneId>, limit: usize) -> Self {
        Lane {
            id,
            jobs: List::default(),
            queued: 0,
            tombstones: 0,
            running: 0,
            limit,
            in_ring: false,
            idle: false,
            blocked_on: None,
            woken_by: None,
            contrib: 0,
            own_waiters: 0,
            pace: Pace::default(),
        }
    }

    /// L1: a lane is in the ring exactly when this holds.
    fn startable(&self) -> bool {
        self.queued > 0 && self.running < self.limit && self.blocked_on.is_none()
    }

    fn key(&self) -> Option<&LaneKey> {
        match &self.id {
            Some(LaneId::Key(k)) => Some(k),
            _ => None,
        }
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
    /// lane, making the lane on its first use.
    pub(super) fn lane_push(&mut self, core: &JobCore, job: Key, after: &mut After) {
        let lane = match core.lane() {
            None => DEFAULT_LANE,
            Some(l) => {
                let slot = match self.find_lane(l) {
                    Some(slot) => slot,
                    None => {
                        let limit = match &l.id {
                            LaneId::Key(k) => self.lanes.key_limits.of(k),
                            LaneId::Limiter(_) | LaneId::Limiters(_) => usize::MAX,
                        };
                        let slot = self.lanes.slab.insert(Lane::new(Some(l.id.clone()), limit));
                        self.lanes.index.insert(l.id.clone(), slot);
                        slot
                    }
                };
                l.set_slot(slot);
                slot
            }
        };
        if let Some(l) = self.lanes.slab.get_mut(lane) {
            self.jobs.push_back(&mut l.jobs, job);
            l.queued += 1;
            if std::mem::take(&mut l.idle) {
                self.lanes.slab.unlink(&mut self.lanes.idle, lane);
            }
        }
        self.lane_update(lane, after);
    }

    /// Whether a job of `core`'s key could start as soon as a permit is
    /// free: its lane, if it has one yet, holds fewer jobs than its limit.
    /// (A submitter need not find a worker for a job that must wait for its
    /// lane: the lane's running jobs' workers come back to the queue.)
    pub(crate) fn lane_has_room(&self, core: &JobCore) -> bool {
        let Some(l) = core.lane() else {
            return true;
        };
        match self.find_lane(l).and_then(|k| self.lanes.slab.get(k)) {
            Some(lane) => lane.running.saturating_add(lane.queued) < lane.limit,
            None => true,
        }
    }

    /// The lane of `l`'s id, if it exists. The job remembers the slot it
    /// found, so the admission check and the accept of one critical
    /// section hash the key once (a slot reused by another lane since is
    /// told apart by its id).
    fn find_lane(&self, l: &LaneRef) -> Option<Key> {
        let cached = l.slot();
        if self
            .lanes
            .slab
            .get(cached)
            .is_some_and(|lane| lane.id.as_ref() == Some(&l.id))
        {
            return Some(cached);
        }
        let found = self.lanes.index.get(&l.id).copied();
        if let Some(slot) = found {
            l.set_slot(slot);
        }
        found
    }

    /// For overload.rs: the estimate, the queued jobs and the permits of
    /// the lane a new job of `core` would join, if it exists yet.
    pub(super) fn lane_load(&self, core: &JobCore) -> Option<(&Pace, usize, usize)> {
        let lane = self.lane_to_join(core)?;
        Some((&lane.pace, lane.queued, lane.limit.min(self.max_in_flight)))
    }

    /// The lane a new job of `core` would join, if it exists yet.
    fn lane_to_join(&self, core: &JobCore) -> Option<&Lane> {
        match core.lane() {
            None => self.lanes.slab.get(DEFAULT_LANE),
            Some(l) => self.find_lane(l).and_then(|k| self.lanes.slab.get(k)),
        }
    }

    /// For overload.rs: the estimate of the lane of the queued or running
    /// job of `core`.
    pub(super) fn lane_pace(&self, core: &JobCore) -> Option<&Pace> {
        Some(&self.lanes.slab.get(Self::lane_of(core))?.pace)
    }

    /// Whether a new job of `core` would start as soon as it is queued: it
    /// needs no limiter, its lane (if it has one yet) has room and is not
    /// blocked, and more permits are free than the queued jobs that a free
    /// permit would start first (L5). Such a job is not *waiting* for a
    /// permit (invariant 8): a full queue does not refuse it.
    pub(super) fn would_start_at_once(&self, core: &JobCore, free: usize) -> bool {
        if !core.limiters().is_empty() || free <= self.lanes.startable_queued {
            return false;
        }
        self.lane_to_join(core)
            .is_none_or(|l| l.blocked_on.is_none() && l.running.saturating_add(l.queued) < l.limit)
    }

    /// Takes the next job to start: the front job of the lane whose turn it
    /// is, which then goes to the back of the ring if it still has a
    /// startable job (L2). Tombstones met on the way are unlinked. A front
    /// job that cannot have its limiters' permits blocks its lane (L4) and
    /// the next lane's turn comes. The caller moves the job to `Running`,
    /// then passes on the grant the lane was readied by if the job does not
    /// need it (the second value: passed only once the start holds its pool
    /// permit, so the pool does not count that permit free for the grant);
    /// `None` if no lane is startable, or if a job was shed (overload.rs:
    /// the caller looks again once `after` is carried out).
    pub(super) fn lane_pop(&mut self, after: &mut After) -> Option<(Key, Option<Limiter>)> {
        // Read once, at the first job that may be shed.
        let mut now = None;
        let mut shed = 0;
        loop {
            let lane_key = self.lanes.ring.front()?;
            let lane = self.lanes.slab.get_mut(lane_key)?;
            let Some(key) = lane.jobs.front() else {
                debug_assert!(false, "L1: a lane in the ring has a queued job");
                return None;
            };
            let task = self.jobs.get(key)?;
            if task.core().state_word() != QUEUED {
                self.jobs.unlink(&mut lane.jobs, key);
                self.bury(lane_key, key, after);
                continue;
            }
            // A job too near its deadline to finish is shed at its turn
            // (overload.rs); then nothing starts in this critical section,
            // so that no job is marked started while the shed functions'
            // drops run after unlocking. The worker looks again after them.
            if task.core().shed_deadline().is_some() {
                let task = task.clone();
                if self.shed_at_turn(task.core(), &mut now, after) {
                    shed += 1;
                    // A chunk at a time, as `shutdown_now` drains: other
                    // callers of the pool wait for one chunk at most.
                    if shed == SHED_CHUNK {
                        return None;
                    }
                    continue;
                }
            }
            if shed > 0 {
                return None;
            }
            let lane = self.lanes.slab.get_mut(lane_key)?;
            let task = self.jobs.get(key)?;
            let limiters = task.core().limiters();
            if !limiters.is_empty() {
                if let Err(full) = try_acquire_all(limiters, &self.lanes.watcher) {
                    self.lane_block(lane_key, full, after);
                    continue;
                }
            }
            let woken = lane.woken_by.take();
            if woken.is_some() {
                // The pool permit promised to the grant is this start's.
                self.lanes.readied -= 1;
            }
            let passed = woken.filter(|w| !limiters.contains(w));
            self.jobs.unlink(&mut lane.jobs, key);
            lane.queued -= 1;
            lane.running += 1;
            // L2: the lane's turn is over; it rejoins at the back.
            if lane.in_ring {
                lane.in_ring = false;
                self.lanes.slab.unlink(&mut self.lanes.ring, lane_key);
            }
            self.lane_update(lane_key, after);
            return Some((key, passed));
        }
    }

    /// A running job of `core`'s lane finished: its lane's count and its
    /// limiters' permits go back together with its pool permit, and a run
    /// that counts (`ran`: it did not panic) goes into the lane's estimate
    /// (overload.rs; a stopped run only if it raises it).
    pub(super) fn lane_finished(
        &mut self,
        core: &JobCore,
        ran: Option<Duration>,
        after: &mut After,
    ) {
        // A pool permit freed with the job (M3).
        self.stop_declining(after);
        crate::job::limiter::release_all(core.limiters(), &mut after.limiter_wakes);
        self.take_own_grants(after);
        let lane = Self::lane_of(core);
        if let Some(l) = self.lanes.slab.get_mut(lane) {
            l.running -= 1;
            if let Some(ran) = ran {
                l.pace.record(ran, core.is_stop_requested());
            }
        }
        self.lane_update(lane, after);
    }

    /// A queued job of `core`'s lane was cancelled: it stays linked as a
    /// tombstone, and the lane's tombstones are unlinked once they
    /// outnumber its queued jobs (S2).
    pub(super) fn lane_cancelled(&mut self, core: &JobCore, after: &mut After) {
        self.lane_left_queue(core);
        let lane = Self::lane_of(core);
        let Some(l) = self.lanes.slab.get_mut(lane) else {
            return;
        };
        l.queued -= 1;
        l.tombstones += 1;
        // If the lane's front job was the one cancelled, a blocked lane
        // tries again with its new front (which needs a worker to look);
        // a job further back leaves the lane its place among the blocked.
        if l.jobs.front() == Some(core.key()) {
            if let Some(id) = l.blocked_on.take() {
                self.unblock(lane, id, after);
                after.find_worker = true;
            }
        }
        self.lane_update(lane, after);
    }

    /// A queued job of `core` left the queue without starting (cancelled
    /// or drained): its limiters stop counting it as waiting.
    pub(super) fn lane_left_queue(&mut self, core: &JobCore) {
        for limiter in core.limiters() {
            limiter.count_left();
        }
    }

    /// Restores L1 for `lane` after its counts changed, takes a lane left
    /// without queued jobs out of its blocked list (passing on a wake-up it
    /// had: L4), and drops a keyed lane that holds no job (L3).
    pub(super) fn lane_update(&mut self, lane_key: Key, after: &mut After) {
        let Some(mut lane) = self.lanes.slab.get_mut(lane_key) else {
            return;
        };
        // S2: tombstones never outnumber the lane's queued jobs for long
        // (a start may leave them behind its job; a cancel adds one).
        if lane.tombstones > lane.queued {
            self.unlink_tombstones(lane_key, after);
            let Some(again) = self.lanes.slab.get_mut(lane_key) else {
                return;
            };
            lane = again;
        }
        if lane.queued == 0 || self.draining {
            if let Some(id) = lane.blocked_on.take() {
                self.unblock(lane_key, id, after);
                let Some(again) = self.lanes.slab.get_mut(lane_key) else {
                    return;
                };
                lane = again;
            }
        }
        let startable = lane.startable() && !self.draining;
        // L3: a keyed lane left without a job becomes idle.
        let newly_idle = lane_key != DEFAULT_LANE
            && lane.is_unused()
            && !std::mem::replace(&mut lane.idle, true);
        // L5: the jobs of this lane a free permit would start now.
        let contrib = if startable {
            lane.queued.min(lane.limit - lane.running)
        } else {
            0
        };
        self.lanes.startable_queued = self.lanes.startable_queued - lane.contrib + contrib;
        let grew = contrib > lane.contrib;
        lane.contrib = contrib;
        let passed = if lane.queued == 0 {
            lane.woken_by.take()
        } else {
            None
        };
        if passed.is_some() {
            self.lanes.readied -= 1;
        }
        if startable != lane.in_ring {
            lane.in_ring = startable;
            if startable {
                self.lanes.slab.push_back(&mut self.lanes.ring, lane_key);
            } else {
                self.lanes.slab.unlink(&mut self.lanes.ring, lane_key);
            }
        }
        if newly_idle {
            self.lane_emptied(lane_key);
        }
        if grew {
            // Fewer queued jobs wait for a permit (L5): a caller waiting
            // for room may fit now.
            self.room_freed(after);
        }
        if let Some(limiter) = passed {
            self.stop_declining(after);
            self.limiter_freed(&limiter, after);
        }
    }

    /// L3: the keyed lane `lane_key` (marked idle) holds no job any more:
    /// it joins the idle lanes, the oldest of which goes if they are too
    /// many; once only the default lane holds jobs in a slab that outgrew
    /// `KEEP_LANE_SLOTS`, every idle lane goes and the slab gives its
    /// memory back.
    fn lane_emptied(&mut self, lane_key: Key) {
        self.lanes.slab.push_back(&mut self.lanes.idle, lane_key);
        if self.lanes.idle.len() > KEEP_IDLE_LANES {
            self.drop_idle_lane();
        }
        if self.lanes.slab.len() == 1 + self.lanes.idle.len()
            && self.lanes.slab.slots() > KEEP_LANE_SLOTS
        {
            while self.drop_idle_lane() {}
            self.compact_lanes();
        }
    }

    /// L3: drops the idle lane emptied first; `false` if there is none.
    fn drop_idle_lane(&mut self) -> bool {
        let Some(oldest) = self.lanes.slab.pop_front(&mut self.lanes.idle) else {
            return false;
        };
        if let Some(id) = self.lanes.slab.remove(oldest).and_then(|gone| gone.id) {
            self.lanes.index.remove(&id);
        }
        true
    }

    /// L3: once only the default lane is left, gives back the memory the
    /// keyed lanes took at their peak (the slab frees its entries when it
    /// empties: the default lane leaves it for a moment and comes back as
    /// key 0). Amortised O(1): paid for by the lanes that grew it.
    fn compact_lanes(&mut self) {
        let in_ring = self.lanes.slab.get(DEFAULT_LANE).is_some_and(|l| l.in_ring);
        if in_ring {
            self.lanes.slab.unlink(&mut self.lanes.ring, DEFAULT_LANE);
        }
        let Some(default) = self.lanes.slab.remove(DEFAULT_LANE) else {
            return;
        };
        let key = self.lanes.slab.insert(default);
        debug_assert_eq!(key, DEFAULT_LANE, "an empty slab hands out key 0");
        if in_ring {
            self.lanes
                .slab
                .push_back(&mut self.lanes.ring, DEFAULT_LANE);
        }
        if self.lanes.index.capacity() > 64 {
            self.lanes.index = HashMap::new();
        }
    }

    /// Transition *drain-unstarted*'s first step: the lanes to drain, last
    /// first (the default lane is drained first), with every lane out of
    /// the ring (nothing starts while the pool drains).
    pub(super) fn lanes_to_drain(&mut self, after: &mut After) -> Vec<Key> {
        let mut order: Vec<Key> = self.lanes.slab.keys().collect();
        order.reverse();
        while let Some(lane) = self.lanes.ring.front() {
            self.lane_update(lane, after);
        }
        order
    }

    /// Unlinks the front job (queued or tombstone) of `lane`, for a drain.
    pub(super) fn lane_pop_front(&mut self, lane: Key) -> Option<Key> {
        let l = self.lanes.slab.get_mut(lane)?;
        self.jobs.pop_front(&mut l.jobs)
    }

    /// A job unlinked from `lane` by a drain left the queue.
    pub(super) fn lane_drained_one(&mut self, lane: Key) {
        if let Some(l) = self.lanes.slab.get_mut(lane) {
            l.queued -= 1;
        }
    }

    /// Whether some lane has a startable job.
    pub(crate) fn has_startable(&self) -> bool {
        !self.lanes.ring.is_empty()
    }

    /// The `n` keyed lanes with the most jobs (queued and running), busiest
    /// first (O(keys)).
    pub(crate) fn key_stats(&self, n: usize) -> Vec<KeyStats> {
        let mut all: Vec<KeyStats> = self
            .lanes
            .slab
            .values()
            .filter(|l| !l.idle)
            .filter_map(|l| {
                Some(KeyStats {
                    key: l.key()?.clone(),
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
