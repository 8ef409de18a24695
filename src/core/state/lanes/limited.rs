//! Lanes and shared limiters: a lane blocked on a full limiter, the
//! limiter's grants reaching this pool (L4; limiter/mod.rs M2, M3), and the
//! lane and limiter part of a function's wait for a queued job of its own
//! pool. Split from `lanes.rs`, whose lanes these are.

use crate::core::state::{After, State};
use crate::job::limiter::Limiter;
use crate::job::record::JobCore;
use crate::util::slab::{Key, List};

/// What a function's wait for a queued job of its own pool counted beyond
/// the pool's count: its lane's, and its limiters' (undone when it ends).
pub(crate) struct OwnWaitMark {
    lane: Option<Key>,
    limiters: Vec<Limiter>,
}

/// A limiter this pool's lanes wait for, and the lanes blocked on it.
pub(crate) struct Blocked {
    limiter: Limiter,
    lanes: List,
}

impl State {
    /// L4: `lane`'s front job found `full` without a free permit: the lane
    /// leaves the ring for the list of lanes blocked on it (the try
    /// registered this pool as its watcher, M2).
    pub(in crate::core::state) fn lane_block(
        &mut self,
        lane_key: Key,
        full: Limiter,
        after: &mut After,
    ) {
        let id = full.id();
        let entry = self.lanes.limited.entry(id).or_insert_with(|| Blocked {
            limiter: full,
            lanes: List::default(),
        });
        let Some(lane) = self.lanes.slab.get_mut(lane_key) else {
            return;
        };
        let in_ring = std::mem::take(&mut lane.in_ring);
        lane.blocked_on = Some(id);
        self.lanes.startable_queued -= std::mem::take(&mut lane.contrib);
        let woken = lane.woken_by.take();
        if in_ring {
            self.lanes.slab.unlink(&mut self.lanes.ring, lane_key);
        }
        self.lanes.slab.push_back(&mut entry.lanes, lane_key);
        self.room_for_jobs_starting_at_once(after);
        if let Some(woken) = woken {
            self.readied_gave_up(after);
            if woken.id() != id {
                self.limiter_freed(&woken, after);
            }
        }
    }

    /// Whether no limiter a lane of this pool is blocked on is held by a
    /// running function (clock.rs: such lanes wait for something outside
    /// the pools).
    pub(in crate::core::state) fn blocked_limiters_idle(&self) -> bool {
        self.lanes.limited.values().all(|b| !b.limiter.is_held())
    }

    /// Takes `lane` out of the list of lanes blocked on limiter `id`; once
    /// none is left, leaves the limiter's queue (M2) and lets go of it.
    pub(in crate::core::state) fn unblock(&mut self, lane: Key, id: u64, after: &mut After) {
        let Some(b) = self.lanes.limited.get_mut(&id) else {
            return;
        };
        self.lanes.slab.unlink(&mut b.lanes, lane);
        if b.lanes.is_empty() {
            self.stop_waiting(id, 0, after);
        }
    }

    /// This pool has no lane blocked on limiter `id` any more: it leaves
    /// the limiter's queue (M2), giving back up to `give_back` grants (M3).
    pub(in crate::core::state) fn stop_waiting(
        &mut self,
        id: u64,
        give_back: usize,
        after: &mut After,
    ) {
        if let Some(b) = self.lanes.limited.remove(&id) {
            b.limiter
                .leave(&self.lanes.watcher, give_back, &mut after.limiter_wakes);
        }
    }

    /// This pool was granted a permit of `limiter` (M3), or a lane readied
    /// by such a grant does not use it: readies the first lane blocked on
    /// it (L4) if the pool has a pool permit for it; else gives the grant
    /// back (declining grants until a permit frees, if lanes still wait for
    /// the limiter). A pool granted several permits at once is told once
    /// per grant: each try that fails leaves the next one failing too (no
    /// permit, or no lane left), so each gives back its own grant.
    pub(crate) fn limiter_freed(&mut self, limiter: &Limiter, after: &mut After) {
        if !self.use_grant(limiter, after) {
            self.give_grants_back(limiter, 1, after);
        }
    }

    /// Grants this pool gave itself, in the critical section that freed
    /// the permits (a finishing job's limiters, a pool permit that stopped
    /// its declining): served here and now, not after unlocking, or the
    /// finishing worker's next start would take the freed pool permit for
    /// a job of the ring and leave the grant without one (M3).
    pub(in crate::core::state) fn take_own_grants(&mut self, after: &mut After) {
        if after.limiter_wakes.is_empty() {
            // A finishing job's path without limiters: nothing granted.
            return;
        }
        let mut own = Vec::new();
        let me = &self.lanes.watcher;
        after.limiter_wakes.retain_mut(|(limiter, granted)| {
            granted.retain(|p| {
                let mine = p.is(me);
                if mine {
                    own.push(limiter.clone());
                }
                !mine
            });
            !granted.is_empty()
        });
        for limiter in own {
            self.limiter_freed(&limiter, after);
        }
    }

    /// Readies a lane blocked on `limiter` to spend a grant of it, if this
    /// pool has a permit for it (M3).
    pub(in crate::core::state) fn use_grant(
        &mut self,
        limiter: &Limiter,
        after: &mut After,
    ) -> bool {
        self.grant_slots() > 0 && self.pass_wake(limiter, after)
    }

    /// Gives back `n` grants of `limiter` that no lane of this pool can
    /// use now: with lanes still blocked on it, for want of a pool permit,
    /// so the pool stays in line and declines grants until a permit frees;
    /// else it leaves the line (M2, M3).
    pub(in crate::core::state) fn give_grants_back(
        &mut self,
        limiter: &Limiter,
        n: usize,
        after: &mut After,
    ) {
        let blocked = self
            .lanes
            .limited
            .get(&limiter.id())
            .is_some_and(|b| !b.lanes.is_empty());
        if blocked {
            self.lanes.declines = true;
            self.lanes.watcher.set_declines(true);
            limiter.decline(&self.lanes.watcher, n, &mut after.limiter_wakes);
        } else {
            limiter.leave(&self.lanes.watcher, n, &mut after.limiter_wakes);
        }
    }

    /// Pool permits neither held by a running job nor promised to a lane
    /// readied by a grant (M3).
    pub(in crate::core::state) fn grant_slots(&self) -> usize {
        if self.draining {
            return 0;
        }
        self.max_in_flight
            .saturating_sub(self.running.len().saturating_add(self.lanes.readied))
    }

    /// A lane readied by a grant gave up its turn without starting: the
    /// pool permit promised to it is free again.
    pub(in crate::core::state) fn readied_gave_up(&mut self, after: &mut After) {
        self.lanes.readied -= 1;
        self.stop_declining(after);
    }

    /// A pool permit freed: a pool that declined grants takes them again,
    /// and the limiters it waits for grant their free permits anew (M3).
    pub(in crate::core::state) fn stop_declining(&mut self, after: &mut After) {
        if !self.lanes.declines {
            return;
        }
        self.lanes.declines = false;
        self.lanes.watcher.set_declines(false);
        for b in self.lanes.limited.values() {
            b.limiter.redispense(&mut after.limiter_wakes);
        }
    }

    /// Readies the first lane blocked on `limiter`, marked as woken by it
    /// (L4); `false` if none is blocked on it. The pool leaves the
    /// limiter's queue once it has no lane blocked on it (M2).
    pub(in crate::core::state) fn pass_wake(
        &mut self,
        limiter: &Limiter,
        after: &mut After,
    ) -> bool {
        let id = limiter.id();
        let Some(b) = self.lanes.limited.get_mut(&id) else {
            return false;
        };
        let Some(lane_key) = self.lanes.slab.pop_front(&mut b.lanes) else {
            self.stop_waiting(id, 0, after);
            return false;
        };
        if b.lanes.is_empty() {
            self.stop_waiting(id, 0, after);
        }
        if let Some(lane) = self.lanes.slab.get_mut(lane_key) {
            lane.blocked_on = None;
            lane.woken_by = Some(limiter.clone());
            self.lanes.readied += 1;
        }
        self.lane_update(lane_key, after);
        // The readied lane starts next: its grant's pool permit is waiting.
        if self.lanes.slab.get(lane_key).is_some_and(|l| l.in_ring) {
            self.lanes.slab.unlink(&mut self.lanes.ring, lane_key);
            self.lanes.slab.push_front(&mut self.lanes.ring, lane_key);
        }
        after.find_worker = true;
        true
    }

    /// The lane and limiter part of [`State::own_wait_begins`]: the running
    /// job `waiter` (a slab key) waits for the queued job `waited`. Refused
    /// if, counting this wait, every running slot of their shared lane, or
    /// every permit of a limiter both need, would be held by such waits:
    /// `waited` could never start.
    pub(in crate::core::state) fn lane_own_wait(
        &mut self,
        waiter: Option<Key>,
        waited: &JobCore,
    ) -> Result<OwnWaitMark, ()> {
        let mut mark = OwnWaitMark {
            lane: None,
            limiters: Vec::new(),
        };
        let Some(w) = waiter.and_then(|k| self.jobs.get(k)) else {
            return Ok(mark);
        };
        let lane = Self::lane_of(w.core());
        let same_lane = lane == Self::lane_of(waited);
        let shared: Vec<Limiter> = waited
            .limiters()
            .iter()
            .filter(|l| w.core().limiters().contains(l))
            .cloned()
            .collect();
        if same_lane
            && self
                .lanes
                .slab
                .get(lane)
                .is_some_and(|l| l.own_waiters.saturating_add(1) >= l.limit)
        {
            return Err(());
        }
        for limiter in shared {
            if !limiter.own_wait_begins() {
                self.lane_own_wait_ended(mark);
                return Err(());
            }
            mark.limiters.push(limiter);
        }
        if let Some(l) = self.lanes.slab.get_mut(lane).filter(|_| same_lane) {
            l.own_waiters += 1;
            mark.lane = Some(lane);
        }
        Ok(mark)
    }

    /// Undoes what [`lane_own_wait`](Self::lane_own_wait) counted. The
    /// waiter still runs in its lane, so the lane is still there.
    pub(in crate::core::state) fn lane_own_wait_ended(&mut self, mark: OwnWaitMark) {
        if let Some(l) = mark.lane.and_then(|k| self.lanes.slab.get_mut(k)) {
            l.own_waiters -= 1;
        }
        for limiter in mark.limiters {
            limiter.own_wait_ended();
        }
    }
}

impl Drop for State {
    /// M3: a pool that goes away gives back the grants it holds and leaves
    /// its limiters' queues, so that pools waiting on the same limiters are
    /// not left waiting for permits nobody will spend.
    fn drop(&mut self) {
        let mut wakes = Vec::new();
        for (_, b) in self.lanes.limited.drain() {
            b.limiter.leave(&self.lanes.watcher, usize::MAX, &mut wakes);
        }
        let woken: Vec<Limiter> = self
            .lanes
            .slab
            .values()
            .filter_map(|l| l.woken_by.clone())
            .collect();
        for limiter in woken {
            limiter.leave(&self.lanes.watcher, usize::MAX, &mut wakes);
        }
        for (limiter, granted) in wakes {
            limiter.wake(&granted);
        }
    }
}
