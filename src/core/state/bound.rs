//! [`Bound`]: the queue bound's count, shared with the intake's submitters
//! (fast/intake.rs inv. 1), and the places reserved in it under the lock.
//!
//! The count holds the jobs queued, in the intake, or with a place
//! reserved; the lock holders' half of it is `left`, the jobs that left the
//! queue, ever (wrapping). A place reserved under the lock ([`Bound::reserve`])
//! is taken by its job's accept, or given back, within the same critical
//! section ([`Bound::debug_check_reservations`]).

use crate::core::fast::intake::QueueCount;

/// The queue bound and its reservations.
pub(crate) struct Bound {
    /// At most this many jobs wait for a permit (invariant 8).
    capacity: usize,
    /// The jobs queued, in the intake, or with a place reserved in the
    /// queue bound (fast/intake.rs inv. 1); its lock holders' half is read
    /// by spinning workers.
    count: std::sync::Arc<QueueCount>,
    /// Jobs that left the queue, ever (wrapping): `count`'s other half.
    left: usize,
    /// Places reserved in `admit` whose jobs are not yet accepted (within
    /// one critical section).
    reserved: usize,
}

impl Bound {
    pub(super) fn new(capacity: usize, count: std::sync::Arc<QueueCount>) -> Self {
        Bound {
            capacity,
            count,
            left: 0,
            reserved: 0,
        }
    }

    /// The queue bound.
    pub(super) fn capacity(&self) -> usize {
        self.capacity
    }

    /// The count's exact value, and the word seen (for [`Bound::reserve`]).
    pub(super) fn exact(&self) -> (usize, usize) {
        self.count.exact(self.left)
    }

    /// Reserves a place if the count still reads `seen`.
    pub(super) fn reserve(&mut self, seen: usize) -> bool {
        let reserved = self.count.reserve_exact(seen);
        if reserved {
            self.reserved += 1;
        }
        reserved
    }

    /// Places reserved under the lock and not yet taken.
    pub(super) fn reserved(&self) -> usize {
        self.reserved
    }

    /// A reservation is taken by its job's accept.
    pub(super) fn take_reservation(&mut self) {
        self.reserved -= 1;
    }

    /// A reservation made in `admit` is given back: the job was refused
    /// after it.
    pub(crate) fn unreserve(&mut self) {
        self.reserved -= 1;
        self.count.unreserve();
    }

    /// A place reserved under the lock is taken by its job's accept, or
    /// given back, within the same critical section (checked as the lock
    /// is taken, in debug builds).
    pub(crate) fn debug_check_reservations(&self) {
        debug_assert_eq!(
            self.reserved, 0,
            "a reservation outlived its critical section"
        );
    }

    /// `n` jobs left the queue (started, cancelled, drained).
    pub(super) fn left_queue(&mut self, n: usize) {
        self.left = self.left.wrapping_add(n);
        self.count.set_left(self.left);
    }

    /// A job entered the queue; `accepted` jobs did, ever (transition
    /// *accept*, which counts it).
    pub(super) fn entered_queue(&self, accepted: u64) {
        // Truncated on 32-bit targets: wrapping, like `left`.
        self.count.set_entered(accepted as usize);
    }

    /// Shuts (`true`) or opens the intake's gate, on the count's word.
    pub(super) fn set_closed(&self, closed: bool) {
        self.count.set_closed(closed);
    }
}
