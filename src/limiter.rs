//! Shared limiters: a count of permits that any jobs of any pools take
//! together with their pool permit (`Offload::limiter`), and give back
//! together with it when their functions return.
//!
//! A limiter is its own small lock around a count. A pool takes permits
//! under its pool lock, locking its job's limiters in the order of their
//! ids (so two pools taking overlapping sets cannot deadlock), all or none:
//! no job holds one limiter's permit while it waits for another's. A pool
//! whose job could not have a permit registers itself, in the same critical
//! section of the limiter, as a *watcher*; a permit given back wakes every
//! watcher after every lock is released (`After::limiter_wakes`), so no
//! wake-up is lost between a failed try and the release that follows it.
//! Each wake-up readies one lane blocked on the limiter in that pool; a
//! readied lane that does not use the permit passes the wake-up on to the
//! next (state/lanes.rs, L4).
//!
//! # Invariants
//!
//! - **M1.** `in_use` changes only under the limiter's lock: `+1` for each
//!   job that starts holding it (with its pool permit, in `State::start`),
//!   `-1` when that job's function returned (in `State::finish`). A job
//!   takes a permit only while `in_use < permits`.
//! - **M2.** A pool that found the limiter full is among its watchers from
//!   that same critical section for as long as it has a lane blocked on it
//!   (it leaves when a wake-up finds none).

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering as StdOrdering};
use std::sync::Weak;

use crate::sync::{Arc, Mutex, MutexGuard};

/// A count of permits shared by any offloads of any pools: a resource's
/// own limit ("4 calls to this SDK client at once", "one writer of this
/// SQLite file") held for the functions' real run, like the pool's permits,
/// never given back with a caller's timeout or drop.
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
    state: Mutex<LimState>,
    /// Queued jobs that need this limiter (a metric: not part of a proof).
    waiting: AtomicUsize,
}

struct LimState {
    permits: usize,
    in_use: usize,
    high_water: usize,
    /// Pools with a lane blocked on this limiter (M2).
    watchers: Vec<Weak<dyn Watcher>>,
    /// Running functions holding a permit that wait, from inside their
    /// pool, for a queued job of it that needs this limiter too.
    own_waiters: usize,
}

/// A pool that waits for a limiter's permits.
pub(crate) trait Watcher: Send + Sync {
    /// `n` permits of `limiter` were given back (called after every lock
    /// is released).
    fn limiter_freed(&self, limiter: &Limiter, n: usize);
}

/// A snapshot of a [`Limiter`]'s counts, from [`Limiter::stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimiterStats {
    /// Its permits (after the last [`Limiter::set_permits`]).
    pub permits: usize,
    /// Permits held by running functions now. Above `permits` for a while
    /// after a decrease: running functions keep theirs.
    pub in_use: usize,
    /// Queued jobs, in any pool, that need a permit of this limiter.
    pub waiting: usize,
    /// The most permits ever held at once.
    pub high_water: usize,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Limiter {
    /// A limiter of `permits` permits. Zero is allowed: its jobs wait until
    /// [`set_permits`](Self::set_permits) gives some.
    pub fn new(permits: usize) -> Limiter {
        Limiter {
            shared: Arc::new(Shared {
                // ORDERING: only uniqueness matters.
                id: NEXT_ID.fetch_add(1, StdOrdering::Relaxed),
                state: Mutex::new(LimState {
                    permits,
                    in_use: 0,
                    high_water: 0,
                    watchers: Vec::new(),
                    own_waiters: 0,
                }),
                waiting: AtomicUsize::new(0),
            }),
        }
    }

    /// Changes the number of permits. An increase lets waiting jobs start
    /// at once; a decrease takes effect as running functions give their
    /// permits back (none is taken from a running function).
    ///
    /// ```
    /// let db = offloader::Limiter::new(1);
    /// db.set_permits(3);
    /// assert_eq!(db.permits(), 3);
    /// ```
    pub fn set_permits(&self, permits: usize) {
        let (watchers, free) = {
            let mut s = self.lock();
            let before = s.permits.saturating_sub(s.in_use);
            s.permits = permits;
            let free = s.permits.saturating_sub(s.in_use);
            (s.watchers.clone(), free.saturating_sub(before))
        };
        if free > 0 {
            self.wake(&watchers, free);
        }
    }

    /// Its number of permits.
    pub fn permits(&self) -> usize {
        self.lock().permits
    }

    /// Its counts now.
    pub fn stats(&self) -> LimiterStats {
        let s = self.lock();
        LimiterStats {
            permits: s.permits,
            in_use: s.in_use,
            // ORDERING: a metric.
            waiting: self.shared.waiting.load(StdOrdering::Relaxed),
            high_water: s.high_water,
        }
    }

    pub(crate) fn id(&self) -> u64 {
        self.shared.id
    }

    fn lock(&self) -> MutexGuard<'_, LimState> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A job that needs this limiter was queued (`+1`) or left the queue.
    pub(crate) fn count_waiting(&self, joined: bool) {
        // ORDERING: a metric.
        if joined {
            self.shared.waiting.fetch_add(1, StdOrdering::Relaxed);
        } else {
            self.shared.waiting.fetch_sub(1, StdOrdering::Relaxed);
        }
    }

    /// Tells the watchers that `n` permits were given back (after every
    /// lock is released).
    pub(crate) fn wake(&self, watchers: &[Weak<dyn Watcher>], n: usize) {
        for w in watchers {
            if let Some(pool) = w.upgrade() {
                pool.limiter_freed(self, n);
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

    /// Stops watching for `pool` (it has no lane blocked on this limiter).
    pub(crate) fn unwatch(&self, pool: &Weak<dyn Watcher>) {
        self.lock()
            .watchers
            .retain(|w| w.strong_count() > 0 && !Weak::ptr_eq(w, pool));
    }
}

/// Takes one permit of each of `limiters` (sorted by id, no repeats),
/// locking them in that order, all or none (M1). On failure, registers
/// `pool` as a watcher of the first full one (M2) and returns it.
pub(crate) fn try_acquire_all(
    limiters: &[Limiter],
    pool: &Weak<dyn Watcher>,
) -> Result<(), Limiter> {
    // One limiter, the common case: no guard list to allocate.
    if let [l] = limiters {
        let mut s = l.lock();
        if s.in_use >= s.permits {
            s.watch(pool);
            return Err(l.clone());
        }
        s.take_one();
        drop(s);
        l.count_waiting(false);
        return Ok(());
    }
    let mut held: Vec<MutexGuard<'_, LimState>> = Vec::with_capacity(limiters.len());
    for l in limiters {
        let mut s = l.lock();
        if s.in_use >= s.permits {
            s.watch(pool);
            return Err(l.clone());
        }
        held.push(s);
    }
    for (s, l) in held.iter_mut().zip(limiters) {
        s.take_one();
        l.count_waiting(false);
    }
    Ok(())
}

impl LimState {
    /// M1: one permit taken.
    fn take_one(&mut self) {
        self.in_use += 1;
        self.high_water = self.high_water.max(self.in_use);
    }

    /// M2: `pool` found no permit; it watches from now on.
    fn watch(&mut self, pool: &Weak<dyn Watcher>) {
        if !self.watchers.iter().any(|w| Weak::ptr_eq(w, pool)) {
            // Pools gone since they registered leave here.
            self.watchers.retain(|w| w.strong_count() > 0);
            self.watchers.push(pool.clone());
        }
    }
}

/// Watchers to tell, after unlocking, that a permit of a limiter is free.
pub(crate) type Wake = (Limiter, Vec<Weak<dyn Watcher>>);

/// Gives back one permit of each of `limiters` (M1); adds the watchers to
/// tell after unlocking.
pub(crate) fn release_all(limiters: &[Limiter], wakes: &mut Vec<Wake>) {
    for l in limiters {
        let mut s = l.lock();
        s.in_use = s.in_use.saturating_sub(1);
        if s.in_use < s.permits && !s.watchers.is_empty() {
            let watchers = s.watchers.clone();
            drop(s);
            wakes.push((l.clone(), watchers));
        }
    }
}

/// Sorts `limiters` by id and drops repeats (a job listing one limiter
/// twice takes one permit of it).
pub(crate) fn normalise(limiters: &mut Vec<Limiter>) {
    limiters.sort_by_key(Limiter::id);
    limiters.dedup_by_key(|l| l.id());
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.stats();
        f.debug_struct("Limiter")
            .field("permits", &s.permits)
            .field("in_use", &s.in_use)
            .field("waiting", &s.waiting)
            .field("high_water", &s.high_water)
            .finish()
    }
}

impl PartialEq for Limiter {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

impl Eq for Limiter {}
