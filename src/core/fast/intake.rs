//! The intake: the pool's front door for plain jobs, which a submitter
//! passes without taking the pool lock. Its protocol, with the proof
//! sketches of fence pairs F1–F3, is in `src/core/fast/README.md`.
//!
//! A *plain* job is one of no group (its name, key, limiters, timeout or
//! deadline do not matter, unless the pool judges its deadline:
//! state/overload.rs), not following a token cancelled
//! already, in a pool without an observer or a stuck-job monitor: nothing
//! about its admission but the queue bound and the shutdown needs the
//! pool's state. While the intake is *open*, such a job is appended to
//! a lock-free FIFO instead of the pool's queue, and whoever takes the pool
//! lock next moves every job waiting there into the queue, in order, before
//! doing anything else (`Inner::lock`): so the queue under the lock is
//! always the queue of every job accepted so far, and the lock is taken
//! once per job by the workers only.
//!
//! # Invariants
//!
//! 1. **Count and gate.** [`QueueCount`] counts the jobs queued, waiting
//!    in the intake, or with a place reserved: places reserved (by both
//!    doors) less jobs that left the queue. A submitter appends a job only
//!    after reserving its place while the gate is open and the count is
//!    below `queue_capacity` ([`QueueCount::reserve_at_intake`]: an atomic
//!    add, then a look at the gate, given back if it is closed or the queue
//!    full); admission under the lock reserves by compare-exchange on the
//!    same word, knowing the exact count ([`QueueCount::reserve_exact`]),
//!    so the bound holds for both doors. The gate is opened and closed only
//!    under the pool lock; a closer shuts it, then waits, still under the
//!    lock, until every place reserved at the intake is filled and moved
//!    into the queue or given back (`State::close_intake`). So after a
//!    close no job is accepted at the intake until the next open: a
//!    shutdown closes it, and nothing passes after.
//! 2. **Workers.** The count of searching workers and of workers that
//!    could be woken (parked, or not yet spawned) is published in one word
//!    ([`Intake::set_workers`]) under the pool lock. A submitter that
//!    appended a job reads it after a `SeqCst` fence and takes the pool
//!    lock to wake a worker if none searches and one could be woken; a
//!    worker that stops searching publishes it and looks at the intake
//!    again (`SeqCst`) before it parks or leaves jobs to others. One of the
//!    two always sees the other (the classic store-then-load pairing), so
//!    an appended job always has a worker coming: rule 1 of "Waking
//!    workers" holds for both doors.
//! 3. **A ring.** The intake holds at most [`SLOTS`] jobs (fewer if the
//!    queue bound is lower), in a ring allocated once, by the first job
//!    that passes the intake (fast/ring.rs, whose invariants say what a job's
//!    trip through it costs; a pool that never takes a job keeps none):
//!    passing it allocates and frees nothing but the job, so a worker
//!    emptying it never frees memory under the pool lock, in the
//!    allocator's arena the submitter allocates from. A submitter that
//!    finds the ring full, or its tail place being filled by another
//!    submitter (fast/ring.rs inv. 2), gives its place back and goes through the
//!    lock, whose holder empties the intake before it accepts that job: the
//!    order of acceptance holds.

use super::ring::{Refused, Ring};
use crate::job::cell::Task;
use crate::util::sync::{fence, AtomicBool, AtomicUsize, Ordering, Padded};
use std::sync::Arc;

/// The count of jobs queued, waiting in the intake, or with a place
/// reserved (inv. 1), and the gate, in words that each side writes alone:
/// submitters add to `submitted` (both doors); the holder of the pool lock
/// stores `left` (jobs that left the queue: started, cancelled, drained),
/// so a worker's start pays no read-modify-write of a line submitters
/// write. Both only grow, wrapping; their difference is the count.
pub(crate) struct QueueCount {
    /// Places reserved, ever; with the gate and a submitter's last look at
    /// `left`, on the submitters' cache line.
    submitted: Padded<Submitted>,
    /// Jobs that left the queue, ever, and jobs that entered the queue
    /// under the lock, ever: stored under the pool lock only.
    held: Padded<Held>,
}

struct Held {
    left: AtomicUsize,
    entered: AtomicUsize,
}

struct Submitted {
    reserved: AtomicUsize,
    closed: AtomicBool,
    /// A value `left` had (it only grows): a submitter that finds room
    /// against it need not read `left`, whose line the workers write.
    left_seen: AtomicUsize,
}

impl QueueCount {
    /// A count of zero, the intake closed.
    pub(crate) fn new() -> Self {
        QueueCount {
            submitted: Padded(Submitted {
                reserved: AtomicUsize::new(0),
                closed: AtomicBool::new(true),
                left_seen: AtomicUsize::new(0),
            }),
            held: Padded(Held {
                left: AtomicUsize::new(0),
                entered: AtomicUsize::new(0),
            }),
        }
    }

    /// The count now (a hint without the pool lock).
    pub(crate) fn now(&self) -> usize {
        let left = self.held.left.load(Ordering::Acquire);
        self.submitted
            .reserved
            .load(Ordering::Acquire)
            .wrapping_sub(left)
    }

    /// Under the pool lock: the count, given the exact number of jobs
    /// that left the queue (`left`, the lock holder's own copy), and the
    /// `reserved` word it was computed from, for [`reserve_exact`](Self::reserve_exact).
    pub(crate) fn exact(&self, left: usize) -> (usize, usize) {
        // ORDERING: the SeqCst pair F3 of src/core/fast/README.md (a closer's
        // load, after it shut the gate).
        let reserved = self.submitted.reserved.load(Ordering::SeqCst);
        (reserved.wrapping_sub(left), reserved)
    }

    /// Under the pool lock: reserves one place if the word is still
    /// `seen` (from [`exact`](Self::exact)); `false` if it moved.
    pub(crate) fn reserve_exact(&self, seen: usize) -> bool {
        self.submitted
            .reserved
            .compare_exchange(
                seen,
                seen.wrapping_add(1),
                Ordering::SeqCst,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Gives a reserved place back: its job was refused after all.
    pub(crate) fn unreserve(&self) {
        self.submitted.reserved.fetch_sub(1, Ordering::SeqCst);
    }

    /// Under the pool lock: `left` jobs have left the queue, ever.
    pub(crate) fn set_left(&self, left: usize) {
        self.held.left.store(left, Ordering::Release);
    }

    /// Under the pool lock: `entered` jobs have entered the queue under
    /// the lock (from the intake or through admission), ever.
    pub(crate) fn set_entered(&self, entered: usize) {
        // ORDERING: a hint for spinners (`in_queue`).
        self.held.entered.store(entered, Ordering::Release);
    }

    /// Whether a job is in the queue under the lock (a hint without it):
    /// what a spinning worker reads besides the intake, from the lock
    /// holders' line only, so that its looks never pull the line that
    /// submitters write at every job.
    pub(crate) fn in_queue(&self) -> bool {
        let entered = self.held.entered.load(Ordering::Acquire);
        entered != self.held.left.load(Ordering::Acquire)
    }

    /// Reserves a place at the intake (inv. 1): `false` if it is closed or
    /// the count has reached `capacity` (the submitter then goes through
    /// the pool lock, which applies the exact bound). The add comes before
    /// the look at the gate, and a closer shuts the gate before it counts
    /// (`SeqCst` both): a closer that missed this place waits for it.
    pub(crate) fn reserve_at_intake(&self, capacity: usize) -> bool {
        let s = &self.submitted;
        // ORDERING: the SeqCst pair F3 of src/core/fast/README.md.
        let before = s.reserved.fetch_add(1, Ordering::SeqCst);
        if s.closed.load(Ordering::SeqCst) {
            self.unreserve();
            return false;
        }
        // `left` only grows: room against a value it had is room. The
        // difference never wraps past `capacity` before `left_seen` is
        // looked at again (the configuration bounds `capacity`).
        if before.wrapping_sub(s.left_seen.load(Ordering::Relaxed)) < capacity {
            return true;
        }
        let left = self.held.left.load(Ordering::Acquire);
        s.left_seen.store(left, Ordering::Relaxed);
        if before.wrapping_sub(left) < capacity {
            return true;
        }
        self.unreserve();
        false
    }

    /// Under the pool lock: opens or closes the gate. A closer then waits
    /// for the places reserved before (`State::close_intake`).
    pub(crate) fn set_closed(&self, closed: bool) {
        // ORDERING: the SeqCst pair F3 of src/core/fast/README.md.
        self.submitted.closed.store(closed, Ordering::SeqCst);
    }

    /// Whether the gate is closed.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn is_closed(&self) -> bool {
        self.submitted.closed.load(Ordering::SeqCst)
    }
}

/// The workers' word holds two counts of this many bits each.
const HALF: u32 = usize::BITS / 2;
/// The most either count of the workers' word says (more saturate).
const HALF_MAX: usize = (1 << HALF) - 1;

/// The pool's intake: the jobs appended, and the workers' word.
pub(crate) struct Intake {
    jobs: LazyRing,
    /// Searching workers (high half) and workers that could be woken (low
    /// half), each saturated to its half; on a cache line of its own (the
    /// workers write it, the submitters read it).
    workers: Padded<AtomicUsize>,
}

/// The most jobs the intake holds (fewer if the queue bound is smaller):
/// a ring allocated once, so that passing the intake allocates and frees
/// nothing but the job (inv. 3). 128 KiB of places (64 bytes each), made
/// by the first push: with a neighbour taking one of two cores, a pool's
/// workers and its submitter share the other for long stretches, and a
/// submitter that fills the ring while no worker runs sends its next job
/// through the pool lock, whose holder (the submitter) moves the ring into
/// the queue; at 256 places that was once per 100 µs of submitting, and
/// the limit-2 batch took 11-34 % more CPU per job, 1-24 % less
/// throughput (`docs/perf/history/2026-12-06-ring-size-ab.txt`).
#[cfg(not(loom))]
const SLOTS: usize = 2048;
/// Under loom: small enough that the models reach a full intake.
#[cfg(loom)]
const SLOTS: usize = 2;

/// The intake's ring, allocated by the first push (inv. 3).
#[cfg(not(loom))]
struct LazyRing {
    ring: std::sync::OnceLock<Ring<Arc<dyn Task>>>,
    size: usize,
}

#[cfg(not(loom))]
impl LazyRing {
    fn new(size: usize) -> Self {
        LazyRing {
            ring: std::sync::OnceLock::new(),
            size,
        }
    }

    /// The ring, made now if no push made it yet (a push racing this one
    /// waits for the one making it: once per pool).
    fn made(&self) -> &Ring<Arc<dyn Task>> {
        self.ring.get_or_init(|| Ring::new(self.size))
    }

    fn get(&self) -> Option<&Ring<Arc<dyn Task>>> {
        self.ring.get()
    }
}

/// Under loom, made at once: the models are of the ring itself.
#[cfg(loom)]
struct LazyRing(Ring<Arc<dyn Task>>);

#[cfg(loom)]
impl LazyRing {
    fn new(size: usize) -> Self {
        LazyRing(Ring::new(size))
    }

    fn made(&self) -> &Ring<Arc<dyn Task>> {
        &self.0
    }

    fn get(&self) -> Option<&Ring<Arc<dyn Task>>> {
        Some(&self.0)
    }
}

impl Intake {
    /// An intake for a queue bound of `queue_capacity` jobs.
    pub(crate) fn new(queue_capacity: usize) -> Self {
        Intake {
            jobs: LazyRing::new(queue_capacity.clamp(1, SLOTS)),
            workers: Padded(AtomicUsize::new(0)),
        }
    }

    /// Whether the ring was made (a job passed the intake).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn has_ring(&self) -> bool {
        self.jobs.get().is_some()
    }

    /// Appends `task`, whose place was reserved, then fences (inv. 2); the
    /// caller then looks at [`needs_worker`](Self::needs_worker). Hands
    /// `task` back if the intake is full, or another submitter is putting
    /// its job in at the tail (inv. 3).
    pub(crate) fn push(&self, task: Arc<dyn Task>) -> Result<(), Arc<dyn Task>> {
        self.jobs.made().push(task).map_err(Refused::into_inner)?;
        // ORDERING: fence pairs F1 and F2 of src/core/fast/README.md.
        fence(Ordering::SeqCst);
        Ok(())
    }

    /// Whether no job waits in the intake (after a `SeqCst` fence: inv. 2;
    /// under the pool lock, exact for every push that has returned:
    /// fast/ring.rs inv. 3).
    pub(crate) fn is_empty(&self) -> bool {
        self.jobs.get().is_none_or(Ring::is_empty)
    }

    /// Takes the oldest job appended (under the pool lock).
    pub(crate) fn pop(&self) -> Option<Arc<dyn Task>> {
        self.jobs.get()?.pop()
    }

    /// Under the pool lock: publishes the workers' counts (inv. 2).
    pub(crate) fn set_workers(&self, searching: usize, wakeable: usize) {
        let word = (searching.min(HALF_MAX) << HALF) | wakeable.min(HALF_MAX);
        // ORDERING: fence pairs F1 and F2 of src/core/fast/README.md (the
        // fence after this store is the worker's: `State::look_at_intake`,
        // `State::intake_has_jobs`).
        self.workers.store(word, Ordering::Release);
    }

    /// After appending: whether no worker searches and one could be woken,
    /// so the submitter must wake one (inv. 2).
    pub(crate) fn needs_worker(&self) -> bool {
        let word = self.workers.load(Ordering::Acquire);
        word >> HALF == 0 && word & HALF_MAX > 0
    }
}
