//! Shared limiters: a count of permits that any jobs of any pools take
//! together with their pool permit (`Offload::limiter`), and give back
//! together with it when their functions return.
//!
//! A limiter is its own small lock around a count. A pool takes permits
//! under its pool lock, locking its job's limiters in the order of their
//! ids (so two pools taking overlapping sets cannot deadlock), all or none:
//! no job holds one limiter's permit while it waits for another's. A pool
//! whose job could not have a permit joins, in the same critical section of
//! the limiter, the limiter's queue of *waiting pools*. A permit given back
//! while pools wait is not left free for whoever asks first — the releasing
//! worker would ask first, in the same critical section, for its own pool's
//! next job, and starve every other pool. It is *granted* to the first
//! waiting pool that can use it, which goes to the back of the queue, and
//! only that pool is told (after every lock is released,
//! `After::limiter_wakes`). A pool can use a grant only if it has a pool
//! permit for it: one whose permits are all busy (or promised to grants it
//! already has) gives the grant back at once and *declines* further grants
//! until one of its permits frees, so a permit is never held for a pool
//! that cannot start a job with it (which would idle it, and deadlock a
//! function of that pool waiting for another pool's job needing it). With
//! no pool able to use it, a permit stays free for whoever asks. A granted
//! pool readies one lane blocked on the limiter, at the front of its ring,
//! so its next start spends the grant; a readied lane that does not use it
//! passes it on to the next lane blocked on it there, and a pool with no
//! such lane gives it back (state/lanes.rs, L4).
//!
//! # Invariants
//!
//! - **M1.** `in_use` changes only under the limiter's lock: `+1` for each
//!   job that starts holding it (with its pool permit, in `State::start`),
//!   `-1` when that job's function returned (in `State::finish`). A job
//!   takes a permit only if its pool holds a grant of the limiter and
//!   `in_use < permits` (it spends the grant), or `in_use + granted <
//!   permits`.
//! - **M2.** A pool that found the limiter full is in its queue of waiting
//!   pools from that same critical section for as long as it has a lane
//!   blocked on it, at most once.
//! - **M3.** `granted` is the sum of the grants pools hold, and never more
//!   than `permits - in_use` (a decrease of `permits` revokes the excess).
//!   Whenever a permit comes back, the count grows, a grant is given back
//!   or a pool stops declining, free permits are granted to waiting pools
//!   that do not decline, in queue order, until none is free or every
//!   waiting pool holds its cap (its `max_in_flight`: what it can start at
//!   once; so the work is bounded whatever the count of permits). Each
//!   grant is spent by a start, or given back (by a pool with no
//!   lane or no permit to use it, by its `Drop`, or reclaimed once the pool
//!   is gone).

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering as StdOrdering};

use crate::util::sync::{Arc, Mutex, MutexGuard, Padded};

mod grants;
#[cfg(all(test, loom))]
mod loom;
use grants::LimState;
#[cfg(all(test, not(loom)))]
pub(crate) use grants::TestPool;
pub(crate) use grants::{PoolRef, Wake, Watcher};

/// A count of permits shared by any offloads of any pools: a resource's own
/// limit, held for the functions' real run.
///
/// For example "4 calls to this SDK client at once" or "one writer of this
/// SQLite file". Like the pool's permits, a limiter's permit is never given
/// back with a caller's timeout or drop.
///
/// Give it to offloads with [`Offload::limiter`](crate::Offload::limiter)
/// (several per job allowed). A job starts only when it holds its pool
/// permit and a permit of each of its limiters, taken together; all are
/// released together after its function returns or unwinds. A job waiting
/// for a limiter is queued (and cancellable) and holds back no job of
/// another lane. Cheap to clone: clones share the count.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use offloader::{Limiter, Offloader};
/// let sdk = Limiter::new(4); // the SDK client allows 4 calls at once
/// let a = Offloader::builder().build()?;
/// let b = Offloader::builder().build()?;
/// let x = a.offload(|_stop| 1).limiter(&sdk).await?;
/// let y = b.offload(|_stop| 2).limiter(&sdk).await?;
/// assert_eq!(x + y, 3);
/// assert_eq!(sdk.stats().high_water, 1);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Limiter {
    shared: Arc<Shared>,
}

pub(crate) struct Shared {
    /// Orders lock acquisition across limiters (lowest first).
    id: u64,
    /// Jobs that needed this limiter and joined a queue (a metric, counted
    /// by submitters: `LimState::left` counts those that left it).
    joined: AtomicUsize,
    /// On a cache line of its own: the workers that take and give back
    /// permits do not contend with the submitters that count `joined` and
    /// clone the limiter.
    state: Padded<Mutex<LimState>>,
}

/// A snapshot of a [`Limiter`]'s counts, from [`Limiter::stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimiterStats {
    /// Its permits (after the last [`Limiter::set_permits`]).
    pub permits: usize,
    /// Permits held by running functions now.
    ///
    /// Above `permits` for a while after a decrease: running functions keep
    /// theirs.
    pub in_use: usize,
    /// Queued jobs, in any pool, that need a permit of this limiter.
    pub waiting: usize,
    /// The most permits ever held at once.
    pub high_water: usize,
    /// Pools with a queued job that found no permit and waits for one.
    ///
    /// Pools are served in turn: a permit given back while pools wait goes to
    /// the one that waited longest.
    pub pools_waiting: usize,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Limiter {
    /// A limiter of `permits` permits.
    ///
    /// Zero is allowed: its jobs wait until [`set_permits`](Self::set_permits)
    /// gives some.
    pub fn new(permits: usize) -> Limiter {
        Limiter {
            shared: Arc::new(Shared {
                // ORDERING: only uniqueness matters.
                id: NEXT_ID.fetch_add(1, StdOrdering::Relaxed),
                joined: AtomicUsize::new(0),
                state: Padded(Mutex::new(LimState::new(permits))),
            }),
        }
    }

    /// Changes the number of permits.
    ///
    /// An increase lets waiting jobs start at once; a decrease takes effect as
    /// running functions give their permits back (none is taken from a running
    /// function).
    ///
    /// ```
    /// let db = offloader::Limiter::new(1);
    /// db.set_permits(3);
    /// assert_eq!(db.stats().permits, 3);
    /// ```
    pub fn set_permits(&self, permits: usize) {
        let mut granted = Vec::new();
        self.lock().set_permits(permits, &mut granted);
        self.wake(&granted);
    }

    /// Its counts now.
    pub fn stats(&self) -> LimiterStats {
        let s = self.lock();
        // ORDERING: a metric. `left` holds still while the lock is held,
        // and each job it counts joined (under its pool's lock) before it
        // left (under the same pool lock, then this lock): the count read
        // after locking is never below it.
        let joined = self.shared.joined.load(StdOrdering::Relaxed);
        LimiterStats {
            permits: s.permits,
            in_use: s.in_use,
            // Both counts only grow, and wrap (a 32-bit target's `usize`
            // after 2^32 jobs): their difference, taken wrapping, is right.
            waiting: joined.wrapping_sub(s.left),
            high_water: s.high_water,
            pools_waiting: s.waiting.iter().filter(|w| !w.is_gone()).count(),
        }
    }

    /// Whether a running function holds a permit (which it will give
    /// back), or a permit is granted to a pool (on its way to a job): a
    /// job waiting for this limiter then waits for work going on.
    pub(crate) fn is_held(&self) -> bool {
        let s = self.lock();
        s.in_use > 0 || s.granted > 0
    }

    pub(crate) fn id(&self) -> u64 {
        self.shared.id
    }

    fn lock(&self) -> MutexGuard<'_, LimState> {
        self.shared
            .state
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A queued job that needs this limiter left the queue without
    /// starting (a start counts itself when it takes its permit).
    pub(crate) fn count_left(&self) {
        let mut s = self.lock();
        s.left = s.left.wrapping_add(1);
    }

    /// Tells each pool of `granted` of its grant (after every lock is
    /// released). A grant to a pool gone since it was granted goes back at
    /// once, to the next pool in line (M3): nothing else would return it
    /// (the pool may have left the line before it went, keeping the grant
    /// for this wake-up to settle), and the pools in line wait for a wake.
    pub(crate) fn wake(&self, granted: &[PoolRef]) {
        let mut orphaned = Vec::new();
        for w in granted {
            match w.weak.upgrade() {
                Some(pool) => pool.limiter_freed(self),
                None => self.leave(w, 1, &mut orphaned),
            }
        }
        for (limiter, granted) in orphaned {
            limiter.wake(&granted);
        }
        // A pool in line whose work stalled waits no more for something
        // outside the pools: a function will hold this permit.
        if !granted.is_empty() && crate::util::clock::any_dormant() {
            let in_line: Vec<PoolRef> = self.lock().waiting.iter().cloned().collect();
            for w in in_line {
                if let Some(pool) = w.weak.upgrade() {
                    pool.hold_clock_again();
                }
            }
        }
    }

    /// A function holding a permit starts waiting for a queued job that
    /// needs this limiter; `false` (nothing counted) if then every permit
    /// would be held by such a wait (the job could never start).
    pub(crate) fn own_wait_begins(&self) -> bool {
        let mut s = self.lock();
        if s.own_waiters.saturating_add(1) >= s.permits {
            return false;
        }
        s.own_waiters += 1;
        true
    }

    /// A wait counted by [`own_wait_begins`](Self::own_wait_begins) ended.
    pub(crate) fn own_wait_ended(&self) {
        let mut s = self.lock();
        s.own_waiters = s.own_waiters.saturating_sub(1);
    }

    /// `pool` has no lane blocked on this limiter any more: it leaves the
    /// queue of waiting pools (M2) and gives back up to `give_back` of its
    /// grants, which go to the next waiting pools (M3); adds them to
    /// `wakes`.
    pub(crate) fn leave(&self, pool: &PoolRef, give_back: usize, wakes: &mut Vec<Wake>) {
        self.update(wakes, |s| {
            s.waiting.retain(|w| !w.is(pool));
            s.give_back(pool, give_back)
        });
    }

    /// `pool`, which declines grants now, gives back `n` of its grants and
    /// stays in line (M3); adds the pools they go to to `wakes`.
    pub(crate) fn decline(&self, pool: &PoolRef, n: usize, wakes: &mut Vec<Wake>) {
        self.update(wakes, |s| s.give_back(pool, n));
    }

    /// A pool stopped declining: free permits go to waiting pools again
    /// (M3); adds them to `wakes`.
    pub(crate) fn redispense(&self, wakes: &mut Vec<Wake>) {
        self.update(wakes, |_| true);
    }

    /// Runs `change` under the lock and, if it says so, grants free permits
    /// to waiting pools; adds them to `wakes`.
    fn update(&self, wakes: &mut Vec<Wake>, change: impl FnOnce(&mut LimState) -> bool) {
        let mut granted = Vec::new();
        {
            let mut s = self.lock();
            if change(&mut s) {
                s.dispense(&mut granted);
            }
        }
        if !granted.is_empty() {
            wakes.push((self.clone(), granted));
        }
    }
}

/// Takes one permit of each of `limiters` (sorted by id, no repeats),
/// locking them in that order, all or none (M1), spending `pool`'s grants
/// where it holds one. On failure, puts `pool` in the queue of the first
/// full one (M2) and returns it.
pub(crate) fn try_acquire_all(limiters: &[Limiter], pool: &PoolRef) -> Result<(), Limiter> {
    // One limiter, the common case: no guard list to allocate.
    if let [l] = limiters {
        let mut s = l.lock();
        if !s.may_take(pool) {
            s.watch(pool);
            return Err(l.clone());
        }
        s.take_one(pool);
        return Ok(());
    }
    let mut held: Vec<MutexGuard<'_, LimState>> = Vec::with_capacity(limiters.len());
    for l in limiters {
        let mut s = l.lock();
        if !s.may_take(pool) {
            s.watch(pool);
            return Err(l.clone());
        }
        held.push(s);
    }
    for s in &mut held {
        s.take_one(pool);
    }
    Ok(())
}

/// A job that needs `limiters` was accepted: each counts it as waiting
/// until it starts or leaves the queue (`count_left`).
pub(crate) fn count_joined(limiters: &[Limiter]) {
    for l in limiters {
        // ORDERING: a metric (see `stats`).
        l.shared.joined.fetch_add(1, StdOrdering::Relaxed);
    }
}

/// Takes back [`count_joined`] for a job that did not join after all (a
/// full intake sent it through the lock, whose accept counts it).
pub(crate) fn count_unjoined(limiters: &[Limiter]) {
    for l in limiters {
        // ORDERING: a metric (see `stats`).
        l.shared.joined.fetch_sub(1, StdOrdering::Relaxed);
    }
}

/// Gives back one permit of each of `limiters` (M1) and grants it to the
/// first waiting pool, if any (M3); adds the pools to tell after
/// unlocking.
pub(crate) fn release_all(limiters: &[Limiter], wakes: &mut Vec<Wake>) {
    for l in limiters {
        let mut granted = Vec::new();
        {
            let mut s = l.lock();
            s.in_use = s.in_use.saturating_sub(1);
            s.dispense(&mut granted);
        }
        if !granted.is_empty() {
            wakes.push((l.clone(), granted));
        }
    }
}

/// A job's limiters: one kept inline (a job needing one limiter allocates
/// nothing for it), more in a vector.
#[derive(Clone, Default)]
pub(crate) enum Limiters {
    #[default]
    None,
    One(Limiter),
    Many(Vec<Limiter>),
}

impl Limiters {
    /// Adds `limiter` (a repeat too: [`normalise`](Self::normalise) drops
    /// it).
    pub(crate) fn push(&mut self, limiter: Limiter) {
        *self = match std::mem::take(self) {
            Limiters::None => Limiters::One(limiter),
            Limiters::One(first) => Limiters::Many(vec![first, limiter]),
            Limiters::Many(mut all) => {
                all.push(limiter);
                Limiters::Many(all)
            }
        };
    }

    /// The limiters, in the order kept.
    pub(crate) fn as_slice(&self) -> &[Limiter] {
        match self {
            Limiters::None => &[],
            Limiters::One(one) => std::slice::from_ref(one),
            Limiters::Many(all) => all,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    /// Sorts them by id and drops repeats: the order in which a pool
    /// locks them, each once (a job listing one limiter twice takes one
    /// permit of it).
    pub(crate) fn normalise(&mut self) {
        if let Limiters::Many(all) = self {
            all.sort_by_key(Limiter::id);
            all.dedup_by_key(|l| l.id());
        }
    }
}

impl From<&[Limiter]> for Limiters {
    fn from(limiters: &[Limiter]) -> Self {
        match limiters {
            [] => Limiters::None,
            [one] => Limiters::One(one.clone()),
            all => Limiters::Many(all.to_vec()),
        }
    }
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.stats();
        f.debug_struct("Limiter")
            .field("permits", &s.permits)
            .field("in_use", &s.in_use)
            .field("waiting", &s.waiting)
            .field("high_water", &s.high_water)
            .field("pools_waiting", &s.pools_waiting)
            .finish()
    }
}

impl PartialEq for Limiter {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

impl Eq for Limiter {}

#[cfg(all(test, not(loom)))]
mod limiters_tests {
    use super::{Limiter, Limiters};

    fn ids(l: &Limiters) -> Vec<u64> {
        l.as_slice().iter().map(Limiter::id).collect()
    }

    #[test]
    fn one_limiter_is_kept_inline_and_more_are_sorted_without_repeats() {
        let (a, b) = (Limiter::new(1), Limiter::new(1));
        let mut l = Limiters::default();
        assert!(l.is_empty());
        l.push(b.clone());
        assert!(matches!(l, Limiters::One(_)));
        l.normalise();
        assert_eq!(ids(&l), [b.id()]);
        l.push(a.clone());
        l.push(b.clone());
        assert_eq!(ids(&l), [b.id(), a.id(), b.id()], "kept as pushed");
        l.normalise();
        assert_eq!(ids(&l), [a.id(), b.id()], "by id, each once");
        assert!(!l.is_empty());
        let back = Limiters::from(l.as_slice());
        assert_eq!(ids(&back), [a.id(), b.id()]);
        assert!(matches!(Limiters::from(&[a.clone()][..]), Limiters::One(_)));
        assert!(Limiters::from(&[][..]).is_empty());
    }
}
