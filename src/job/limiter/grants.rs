//! A limiter's locked state: its count of permits, and the grants that
//! hand permits given back to waiting pools in turn (invariants M1–M3 of
//! the module docs of `limiter`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering as StdOrdering};
use std::sync::Weak;

use super::Limiter;

pub(super) struct LimState {
    pub(super) permits: usize,
    pub(super) in_use: usize,
    pub(super) high_water: usize,
    /// Queued jobs that needed this limiter and left the queue (started,
    /// cancelled or drained); `Shared::joined` counts those that joined
    /// it, so the difference is the limiter's waiting jobs (a metric).
    pub(super) left: usize,
    /// Pools with a lane blocked on this limiter, in the order they are
    /// served (M2).
    pub(super) waiting: VecDeque<PoolRef>,
    /// Grants held by pools (M3): permits handed to a waiting pool and not
    /// yet spent or given back.
    grants: Vec<(PoolRef, usize)>,
    /// Their sum.
    pub(super) granted: usize,
    /// Running functions holding a permit that wait, from inside their
    /// pool, for a queued job of it that needs this limiter too.
    pub(super) own_waiters: usize,
}

/// A pool as a limiter sees it: a weak reference (a limiter never keeps a
/// pool alive) and whether it declines grants now (M3), readable without
/// reaching the pool.
#[derive(Clone)]
pub(crate) struct PoolRef {
    pub(crate) weak: Weak<dyn Watcher>,
    pub(crate) declines: std::sync::Arc<AtomicBool>,
    /// The most grants the pool is given at once: its `max_in_flight`, the
    /// most limited jobs it can start before it runs one to its end (M3).
    cap: usize,
}

impl PoolRef {
    /// A pool that can use at most `cap` grants at once.
    pub(crate) fn new(weak: Weak<dyn Watcher>, cap: usize) -> PoolRef {
        PoolRef {
            weak,
            declines: std::sync::Arc::new(AtomicBool::new(false)),
            cap: cap.max(1),
        }
    }

    pub(crate) fn is(&self, other: &PoolRef) -> bool {
        Weak::ptr_eq(&self.weak, &other.weak)
    }

    pub(super) fn is_gone(&self) -> bool {
        self.weak.strong_count() == 0
    }

    /// May be granted a permit now: alive and not declining.
    fn takes_grants(&self) -> bool {
        // ORDERING: a hint, set and cleared under the pool's lock; a stale
        // read grants to a pool that then gives the grant back, or skips
        // one that the next dispense (when it stops declining) serves.
        !self.is_gone() && !self.declines.load(StdOrdering::Relaxed)
    }

    /// Starts or stops declining grants (under the pool's lock).
    pub(crate) fn set_declines(&self, on: bool) {
        // ORDERING: see `takes_grants`.
        self.declines.store(on, StdOrdering::Relaxed);
    }
}

/// A pool that waits for a limiter's permits.
pub(crate) trait Watcher: Send + Sync {
    /// The pool was granted a permit of `limiter` (called after every lock
    /// is released, once per grant).
    fn limiter_freed(&self, limiter: &Limiter);

    /// A permit of a limiter the pool waits for was granted (to it or to
    /// another pool): a paused test clock the pool let go when its work
    /// stalled is held again (clock.rs).
    fn hold_clock_again(&self);
}

/// Pools to tell, after unlocking, that they were granted a permit of a
/// limiter (one entry per grant).
pub(crate) type Wake = (Limiter, Vec<PoolRef>);

impl LimState {
    pub(super) fn new(permits: usize) -> LimState {
        LimState {
            permits,
            in_use: 0,
            high_water: 0,
            left: 0,
            waiting: VecDeque::new(),
            grants: Vec::new(),
            granted: 0,
            own_waiters: 0,
        }
    }

    /// Permits neither held nor granted.
    fn free(&self) -> usize {
        self.permits
            .saturating_sub(self.in_use.saturating_add(self.granted))
    }

    /// How many grants `pool` holds.
    fn grants_of(&self, pool: &PoolRef) -> usize {
        self.grants
            .iter()
            .find(|(w, _)| w.is(pool))
            .map_or(0, |&(_, n)| n)
    }

    /// M1: whether `pool` may take a permit now: it holds a grant (and the
    /// count allows it: M3 keeps it so), or a permit is neither held nor
    /// granted once the grants of pools that are gone are reclaimed.
    pub(super) fn may_take(&mut self, pool: &PoolRef) -> bool {
        if self.grants_of(pool) > 0 && self.in_use < self.permits {
            return true;
        }
        self.reclaim_gone();
        self.free() > 0
    }

    /// M1: one permit taken by `pool` for a queued job that starts (and so
    /// leaves the queue), spending a grant if it holds one.
    pub(super) fn take_one(&mut self, pool: &PoolRef) {
        self.give_back(pool, 1);
        self.left = self.left.wrapping_add(1);
        self.in_use += 1;
        self.high_water = self.high_water.max(self.in_use);
    }

    /// M3: `pool` gives back up to `n` of its grants; `true` if it held
    /// any.
    pub(super) fn give_back(&mut self, pool: &PoolRef, n: usize) -> bool {
        let Some(i) = self.grants.iter().position(|(w, _)| w.is(pool)) else {
            return false;
        };
        let entry = &mut self.grants[i].1;
        let back = n.min(*entry);
        *entry -= back;
        self.granted -= back;
        if *entry == 0 {
            self.grants.swap_remove(i);
        }
        back > 0
    }

    /// M3: the grants of pools that are gone come back.
    fn reclaim_gone(&mut self) {
        let mut back = 0;
        self.grants.retain(|(w, n)| {
            let gone = w.is_gone();
            if gone {
                back += n;
            }
            !gone
        });
        self.granted -= back;
    }

    /// M3: no more grants than free permits (after a decrease).
    fn revoke_excess(&mut self) {
        let allowed = self.permits.saturating_sub(self.in_use);
        while self.granted > allowed {
            let Some(last) = self.grants.last_mut() else {
                break;
            };
            last.1 -= 1;
            self.granted -= 1;
            if last.1 == 0 {
                self.grants.pop();
            }
        }
    }

    /// M3: grants free permits to waiting pools that take grants, first
    /// waiting first; each pool served goes to the back of the queue. A
    /// pool holds at most its cap of grants: however many permits free up
    /// at once (`set_permits(usize::MAX)`), the work is bounded by what the
    /// waiting pools can use. Adds one entry per grant to `granted`.
    pub(super) fn dispense(&mut self, granted: &mut Vec<PoolRef>) {
        if self.waiting.is_empty() {
            return;
        }
        self.reclaim_gone();
        // Pools that are gone leave the queue.
        self.waiting.retain(|w| !w.is_gone());
        while self.free() > 0 {
            let Some(i) = self
                .waiting
                .iter()
                .position(|w| w.takes_grants() && self.grants_of(w) < w.cap)
            else {
                break;
            };
            let Some(pool) = self.waiting.remove(i) else {
                break;
            };
            match self.grants.iter_mut().find(|(w, _)| w.is(&pool)) {
                Some((_, n)) => *n += 1,
                None => self.grants.push((pool.clone(), 1)),
            }
            self.granted += 1;
            granted.push(pool.clone());
            self.waiting.push_back(pool);
        }
    }

    /// M2: `pool` found no permit; it waits from now on, once.
    pub(super) fn watch(&mut self, pool: &PoolRef) {
        if !self.waiting.iter().any(|w| w.is(pool)) {
            // Pools gone since they joined leave here.
            self.waiting.retain(|w| !w.is_gone());
            self.waiting.push_back(pool.clone());
        }
    }

    /// A new count of permits: a decrease revokes grants beyond it, an
    /// increase is granted to waiting pools (M3).
    pub(super) fn set_permits(&mut self, permits: usize, granted: &mut Vec<PoolRef>) {
        self.permits = permits;
        self.revoke_excess();
        self.dispense(granted);
    }
}

/// A pool for unit tests of limiters and lanes: told nothing, it only
/// stays alive (a limiter skips pools that are gone).
#[cfg(all(test, not(loom)))]
pub(crate) struct TestPool;

#[cfg(all(test, not(loom)))]
impl Watcher for TestPool {
    fn limiter_freed(&self, _: &Limiter) {}
    fn hold_clock_again(&self) {}
}

#[cfg(all(test, not(loom)))]
impl TestPool {
    /// How a limiter sees `pool`.
    pub(crate) fn weak(pool: &std::sync::Arc<TestPool>) -> Weak<dyn Watcher> {
        std::sync::Arc::downgrade(pool) as Weak<dyn Watcher>
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn pool_ref(pool: &Arc<TestPool>) -> PoolRef {
        PoolRef::new(TestPool::weak(pool), 64)
    }

    /// M3 after a decrease: grants beyond the free permits are revoked,
    /// the last granted first, exactly as many as the new count needs, and
    /// nothing is granted anew. Kills the mutants of `revoke_excess` that
    /// compare with `==` (nothing revoked) or `>=` (one too many revoked,
    /// then granted again to another pool), or that count the revoked
    /// grant up (`+=`) or not at all (`/=`) in the pool's entry.
    #[test]
    fn a_decrease_revokes_the_last_grants_and_no_more() {
        let (a, b) = (Arc::new(TestPool), Arc::new(TestPool));
        let (pa, pb) = (pool_ref(&a), pool_ref(&b));
        let mut s = LimState::new(0);
        s.watch(&pa);
        s.watch(&pb);
        let mut granted = Vec::new();
        s.set_permits(2, &mut granted);
        assert_eq!(granted.len(), 2);
        assert_eq!((s.grants_of(&pa), s.grants_of(&pb), s.granted), (1, 1, 2));

        let mut granted = Vec::new();
        s.set_permits(1, &mut granted);
        assert!(granted.is_empty(), "a decrease grants nothing");
        assert_eq!((s.grants_of(&pa), s.grants_of(&pb), s.granted), (1, 0, 1));

        s.set_permits(0, &mut granted);
        assert!(granted.is_empty());
        assert_eq!((s.grants_of(&pa), s.grants_of(&pb), s.granted), (0, 0, 0));
        assert!(s.grants.is_empty(), "no entry of zero grants is kept");

        // The permits come back: both pools are granted again.
        s.set_permits(2, &mut granted);
        assert_eq!(granted.len(), 2);
        assert_eq!((s.grants_of(&pa), s.grants_of(&pb), s.granted), (1, 1, 2));
    }

    /// A decrease below the permits in use revokes every grant, and one
    /// that leaves room for the grants revokes none.
    #[test]
    fn a_decrease_counts_the_permits_in_use() {
        let a = Arc::new(TestPool);
        let pa = pool_ref(&a);
        let mut s = LimState::new(0);
        s.watch(&pa);
        let mut granted = Vec::new();
        s.set_permits(3, &mut granted);
        assert_eq!(s.grants_of(&pa), 3);
        s.take_one(&pa);
        assert_eq!((s.in_use, s.granted), (1, 2));
        s.set_permits(3, &mut granted);
        assert_eq!(s.granted, 2, "no decrease, nothing revoked");
        s.set_permits(2, &mut granted);
        assert_eq!((s.grants_of(&pa), s.granted), (1, 1));
        s.set_permits(0, &mut granted);
        assert_eq!((s.grants_of(&pa), s.granted), (0, 0));
        assert_eq!(s.in_use, 1, "a permit in use is not revoked");
    }
}
