//! What every job has, whatever its function and result types: its id,
//! state word, clock, flags and rare parts. Split from `job/cell.rs`, which adds
//! the function and the outcome cell.

use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::{Duration, Instant};

use crate::job::id::{now_ns, JobId, JobState, QUEUED};
use crate::job::lane::{LaneId, LaneKey};
use crate::job::limiter::{Limiter, Limiters};
use crate::job::policy::AbandonPolicy;
use crate::util::slab::Key;
use crate::util::sync::{AtomicBool, AtomicU8, Ordering};

/// Rarely used parts of a job: in its allocation only when one is set
/// ([`JobCore`]).
pub(crate) struct Extras {
    pub(crate) name: Option<std::sync::Arc<str>>,
    pub(crate) deadline: Option<Instant>,
    pub(crate) group: Option<Membership>,
    pub(crate) lane: Option<LaneRef>,
    /// The limiters the job needs, sorted by id, no repeats.
    pub(crate) limiters: Limiters,
    /// For a job that follows tokens: fired when its function is gone (run
    /// or dropped unrun), which ends the watch (interop.rs).
    #[cfg_attr(not(feature = "tokio-util"), allow(dead_code))]
    pub(crate) gone: Option<Gone>,
}

/// Cancels its token when fired or dropped: the job's function is gone
/// (`Offload::stop_on`'s watch ends on it). Kept beside the function, not
/// in it, so that a refused job hands back the caller's own function.
#[cfg(feature = "tokio-util")]
pub(crate) struct Gone(pub(crate) tokio_util::sync::CancellationToken);

#[cfg(feature = "tokio-util")]
impl Gone {
    fn fire(&self) {
        self.0.cancel();
    }
}

#[cfg(feature = "tokio-util")]
impl Drop for Gone {
    fn drop(&mut self) {
        self.fire();
    }
}

/// Without the `tokio-util` feature no job follows a token.
#[cfg(not(feature = "tokio-util"))]
pub(crate) type Gone = std::convert::Infallible;

/// A keyed job's lane (state/lanes.rs).
pub(crate) struct LaneRef {
    pub(crate) id: LaneId,
    /// The lane's key in the pool's lane slab while the job is queued or
    /// running. Read and written only under the pool lock.
    slot: AtomicU32,
}

impl LaneRef {
    pub(crate) fn slot(&self) -> Key {
        // ORDERING: written and read under the pool lock only.
        self.slot.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn set_slot(&self, key: Key) {
        // ORDERING: written and read under the pool lock only.
        self.slot.store(key, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A job's place in a job group (state/groups.rs).
pub(crate) struct Membership {
    /// The group's key in the pool's group slab; fixed for the job's life
    /// (the group's record outlives its unpublished jobs).
    pub(crate) group: Key,
    /// The job's key in the group's member slab while it is queued or
    /// running. Read and written only under the pool lock.
    member: AtomicU32,
}

impl Membership {
    pub(crate) fn member(&self) -> Key {
        // ORDERING: written and read under the pool lock only.
        self.member.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn set_member(&self, key: Key) {
        // ORDERING: written and read under the pool lock only.
        self.member.store(key, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Flag bits in [`JobCore::flags`].
const CALLER_LEFT: u8 = 1;
const CALLER_WAITING: u8 = 2;
const STUCK_REPORTED: u8 = 4;
const WAKER_SET: u8 = 8;
/// The job's abandon policy, when it is not `Keep` (read when its caller
/// or owner leaves, and by state/overload.rs).
const LEAVE_CANCELS: u8 = 16;
const LEAVE_STOPS: u8 = 32;

/// What every job has, whatever its function and result types.
///
/// Its rare parts are its last field, in the job's one allocation: `[Extras;
/// 0]` for a plain job (no bytes), `[Extras; 1]` for one with a name, a
/// deadline, a group, a key or limiters. Code that handles jobs of either
/// kind sees `JobCore` (`X = [Extras]`, through the job's `&dyn Task`), whose
/// rare parts are a slice of length 0 or 1: no second allocation to reach
/// them, and none to free.
pub(crate) struct JobCore<X: ?Sized = [Extras]> {
    pub(crate) id: JobId,
    /// When the job was accepted, until it starts; from then on, when it
    /// started (see [`now_ns`]).
    time: AtomicU64,
    /// The job's key in the pool's slab while it is queued or running
    /// (S5 in [`crate::core::state`]). Read and written only under the pool lock.
    key: AtomicU32,
    pub(crate) state: AtomicU8,
    flags: AtomicU8,
    pub(crate) stopped: AtomicBool,
    /// Last: the field a `JobCore<[Extras; N]>` is seen through as a
    /// `JobCore` by.
    rare: X,
}

/// A new job's core, in the layout its rare parts need.
pub(crate) enum NewCore {
    /// No rare parts: the job's allocation holds none.
    Plain(JobCore<[Extras; 0]>),
    /// The job's allocation holds its rare parts.
    WithExtras(JobCore<[Extras; 1]>),
}

/// The core of a new job, queued, its clock started.
pub(crate) fn new_core(
    id: JobId,
    name: Option<std::sync::Arc<str>>,
    deadline: Option<Instant>,
    group: Option<Key>,
    key: Option<LaneKey>,
    mut limiters: Limiters,
    gone: Option<Gone>,
) -> NewCore {
    limiters.normalise();
    let lane = match key {
        Some(k) => Some(LaneId::Key(k)),
        None => match limiters.as_slice() {
            [] => None,
            [one] => Some(LaneId::Limiter(one.id())),
            many => Some(LaneId::Limiters(many.iter().map(Limiter::id).collect())),
        },
    };
    let group = group.map(|group| Membership {
        group,
        member: AtomicU32::new(0),
    });
    let lane = lane.map(|id| LaneRef {
        id,
        // No slot yet (never a lane's: the lane slab holds far fewer).
        slot: AtomicU32::new(u32::MAX),
    });
    if name.is_none() && deadline.is_none() && group.is_none() && lane.is_none() && gone.is_none() {
        return NewCore::Plain(JobCore::with_rare(id, []));
    }
    NewCore::WithExtras(JobCore::with_rare(
        id,
        [Extras {
            name,
            deadline,
            group,
            lane,
            limiters,
            gone,
        }],
    ))
}

impl<const N: usize> JobCore<[Extras; N]> {
    fn with_rare(id: JobId, rare: [Extras; N]) -> Self {
        JobCore {
            id,
            time: AtomicU64::new(now_ns()),
            key: AtomicU32::new(0),
            state: AtomicU8::new(QUEUED),
            // Every job accepted gets its owner handle (`JobHandle::new`):
            // set here, on a line the submitter owns still, rather than by
            // a read-modify-write after the job is shared.
            flags: AtomicU8::new(CALLER_WAITING),
            stopped: AtomicBool::new(false),
            rare,
        }
    }
}

impl<X: AsRef<[Extras]> + ?Sized> JobCore<X> {
    /// The job's rare parts, if it has any.
    pub(crate) fn extras(&self) -> Option<&Extras> {
        self.rare.as_ref().first()
    }

    /// The job's function is gone: run (or unwound), or dropped unrun.
    pub(crate) fn function_gone(&self) {
        #[cfg(feature = "tokio-util")]
        if let Some(gone) = self.extras().and_then(|e| e.gone.as_ref()) {
            gone.fire();
        }
    }

    /// Records the job's slab key (under the pool lock).
    pub(crate) fn set_key(&self, key: Key) {
        // ORDERING: written and read under the pool lock only.
        self.key.store(key, std::sync::atomic::Ordering::Relaxed);
    }

    /// The job's slab key (under the pool lock).
    pub(crate) fn key(&self) -> Key {
        self.key.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The raw state word.
    pub(crate) fn state_word(&self) -> u8 {
        self.state.load(Ordering::Acquire)
    }

    pub(crate) fn state(&self) -> JobState {
        // ORDERING: Acquire pairs with the Release of `transition`.
        JobState::from_u8(self.state.load(Ordering::Acquire))
    }

    /// Moves the job from `from` to `to`; `true` if this call made the move.
    ///
    /// Called only under the pool lock: every transition is a method of the
    /// locked state (state/mod.rs), so no other writer can come between the
    /// read and the write, and a plain store does what a compare-and-swap
    /// would without its full barrier (which, on a long queue, serialised a
    /// cache miss per job in a drain).
    pub(crate) fn transition(&self, from: u8, to: u8) -> bool {
        // ORDERING: writers are ordered by the pool lock. Release so that
        // lock-free readers (`state`, Acquire) see everything the winner
        // wrote before; the winner of the move out of `Queued` owns the
        // function cell (inv. 2).
        if self.state.load(Ordering::Relaxed) != from {
            return false;
        }
        self.state.store(to, Ordering::Release);
        true
    }

    /// Restarts the clock at `now` (from [`now_ns`]) when the function
    /// starts; returns how long the job was queued. Called under the pool
    /// lock by the worker that won `Queued → Running`.
    pub(crate) fn mark_started(&self, now: u64) -> Duration {
        // ORDERING: the clock is read and written under the pool lock.
        let accepted = self.time.swap(now, std::sync::atomic::Ordering::Relaxed);
        Duration::from_nanos(now.saturating_sub(accepted))
    }

    /// Time since the job was accepted (while queued) or since it started
    /// (once running or finished).
    pub(crate) fn clock(&self) -> Duration {
        self.clock_at(now_ns())
    }

    /// [`clock`](Self::clock) as of `now` (from [`now_ns`]), for a caller
    /// that reads the time once for many jobs.
    pub(crate) fn clock_at(&self, now: u64) -> Duration {
        let since = self.time.load(std::sync::atomic::Ordering::Relaxed);
        Duration::from_nanos(now.saturating_sub(since))
    }

    /// The job's place in a job group, if it was offloaded through one.
    pub(crate) fn membership(&self) -> Option<&Membership> {
        self.extras()?.group.as_ref()
    }

    pub(crate) fn lane(&self) -> Option<&LaneRef> {
        self.extras()?.lane.as_ref()
    }

    /// The job's key ([`Offload::key`](crate::Offload::key)), if it has one.
    pub(crate) fn lane_key(&self) -> Option<&LaneKey> {
        match &self.lane()?.id {
            LaneId::Key(k) => Some(k),
            LaneId::Limiter(_) | LaneId::Limiters(_) => None,
        }
    }

    /// The limiters the job needs (sorted by id).
    pub(crate) fn limiters(&self) -> &[Limiter] {
        self.extras().map_or(&[], |e| e.limiters.as_slice())
    }

    /// The deadline by which the pool sheds the job, if it may
    /// (state/overload.rs): its abandon policy cancels, so nobody wants it
    /// late.
    pub(crate) fn shed_deadline(&self) -> Option<Instant> {
        if self.leave_policy() == AbandonPolicy::Keep {
            return None;
        }
        self.extras()?.deadline
    }

    /// Records the job's abandon policy (before the job is shared: the
    /// submitter owns the line still).
    pub(crate) fn set_leave_policy(&self, policy: AbandonPolicy) {
        match policy {
            AbandonPolicy::Keep => {}
            AbandonPolicy::CancelIfQueued => self.set_flag(LEAVE_CANCELS, true),
            AbandonPolicy::CancelAndStop => self.set_flag(LEAVE_CANCELS | LEAVE_STOPS, true),
        }
    }

    /// The job's abandon policy.
    pub(crate) fn leave_policy(&self) -> AbandonPolicy {
        let flags = self.flags.load(Ordering::Acquire);
        if flags & LEAVE_STOPS != 0 {
            AbandonPolicy::CancelAndStop
        } else if flags & LEAVE_CANCELS != 0 {
            AbandonPolicy::CancelIfQueued
        } else {
            AbandonPolicy::Keep
        }
    }

    pub(crate) fn name(&self) -> Option<&std::sync::Arc<str>> {
        self.extras()?.name.as_ref()
    }

    pub(crate) fn is_stop_requested(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// A span for this job's events (id, name); costs nothing when no
    /// subscriber listens.
    pub(crate) fn span(&self) -> tracing::Span {
        match self.name() {
            Some(n) => tracing::trace_span!("offload", id = self.id.0, name = %n),
            None => tracing::trace_span!("offload", id = self.id.0),
        }
    }

    fn set_flag(&self, bit: u8, on: bool) {
        if on {
            self.flags.fetch_or(bit, Ordering::AcqRel);
        } else {
            self.flags.fetch_and(!bit, Ordering::AcqRel);
        }
    }

    pub(crate) fn mark_caller_left(&self) {
        self.set_flag(CALLER_LEFT, true);
    }

    pub(crate) fn caller_left(&self) -> bool {
        self.flags.load(Ordering::Acquire) & CALLER_LEFT != 0
    }

    pub(crate) fn set_caller_waiting(&self, waiting: bool) {
        self.set_flag(CALLER_WAITING, waiting);
    }

    pub(crate) fn caller_waiting(&self) -> bool {
        self.flags.load(Ordering::Acquire) & CALLER_WAITING != 0
    }

    /// Keeps the hint that a waiter's waker is registered (set and cleared
    /// under the cell lock, read under the pool lock: a hint, see
    /// worker.rs).
    pub(crate) fn set_waker_hint(&self, set: bool) {
        self.set_flag(WAKER_SET, set);
    }

    /// Whether a waiter's waker is registered (a hint).
    pub(crate) fn waker_hint(&self) -> bool {
        self.flags.load(Ordering::Acquire) & WAKER_SET != 0
    }

    /// Marks the job reported as stuck; `true` the first time.
    pub(crate) fn mark_stuck_reported(&self) -> bool {
        self.flags.fetch_or(STUCK_REPORTED, Ordering::AcqRel) & STUCK_REPORTED == 0
    }
}
