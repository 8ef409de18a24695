//! A bounded FIFO with many producers and one consumer, in safe code: the
//! intake's ring (fast/intake.rs inv. 3).
//!
//! After Dmitry Vyukov's bounded queue, with the consumer's side simplified
//! (only the holder of the pool lock takes from it, so `head` needs no
//! compare-exchange and nobody but a producer reads `tail`) and a producer
//! that fills its place *before* it moves `tail` on. Positions count in
//! half-steps: `tail` is `2p` while position `p` is free to claim, `2p + 1`
//! while its claimer fills it. Each place carries a *stamp*: `2p` while it
//! is free for the value of position `p`, `2p + 2` once that value is in,
//! `2(p + size)` once it has been taken (free for the next lap).
//! Emptiness is read from the stamp at `head` alone.
//!
//! What a value's trip costs in cache lines is the point: a producer
//! touches `tail` (producers' own line) and its place; the consumer its
//! place and `head` (the lock holder's own line). crossbeam's array
//! channel, used before, also had every look at emptiness read both ends,
//! so each job moved the tail's line between the submitter's core and a
//! worker's.
//!
//! # Invariants
//!
//! 1. **Places.** The place of position `p` is `slots[p & mask]`; `size`
//!    is a power of two of at least 2, so positions and stamps wrap with
//!    `usize`, and stamps of different laps of one place never collide.
//! 2. **Producers, one at a time, in order.** A producer claims position
//!    `p` by moving `tail` from `2p` to `2p + 1` (compare-exchange: one
//!    claimer), after seeing its place free (the place cannot change
//!    before the claim: only the claimer of `p` fills it, and the consumer
//!    takes only filled places). It puts its value in, stores the stamp
//!    `2p + 2` (Release), and only then stores `tail = 2(p + 1)`
//!    (Release). So a position is claimed only after every position before
//!    it was filled: a push that has returned leaves no unfilled place
//!    before its own. A producer that finds `tail` odd does not wait for
//!    the claimer (it may have been preempted): it is told
//!    [`Busy`](Refused::Busy), and the intake's caller takes the pool lock.
//! 3. **The consumer** takes position `head` only if its stamp reads
//!    `2 head + 2` (Acquire: the value is in), then stores
//!    `2(head + size)` (Release, after taking it) and moves `head`. By 2,
//!    "empty at the head" means no push has returned that the consumer
//!    has not taken: a job whose `spawn` returned is in the queue at the
//!    next lock.
//!
//! Each place's value sits in a `Mutex` that the stamps already make
//! exclusive (it is never contended): the safe spelling of a cell.

use crate::util::sync::{lock, AtomicUsize, Mutex, Ordering, Padded};

/// One place of the ring, on a cache line of its own (a producer filling
/// it does not slow down the consumer taking its neighbour).
#[repr(align(64))]
struct Slot<T> {
    stamp: AtomicUsize,
    value: Mutex<Option<T>>,
}

/// Why a value was handed back.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused<T> {
    /// Every place holds a value.
    Full(T),
    /// Another producer is filling the place at the tail (inv. 2).
    Busy(T),
}

impl<T> Refused<T> {
    /// The value handed back.
    pub(crate) fn into_inner(self) -> T {
        match self {
            Refused::Full(v) | Refused::Busy(v) => v,
        }
    }
}

/// The ring (module docs).
pub(crate) struct Ring<T> {
    /// The next position a producer claims, in half-steps (inv. 2);
    /// producers only.
    tail: Padded<AtomicUsize>,
    /// The next position the consumer takes; written by it only.
    head: Padded<AtomicUsize>,
    slots: Box<[Slot<T>]>,
    mask: usize,
}

/// Position `pos` in half-steps, plus `half`: a stamp (0 free, 2 in) or
/// `tail` (0 free to claim, 1 claimed).
fn stamp(pos: usize, half: usize) -> usize {
    pos.wrapping_mul(2).wrapping_add(half)
}

impl<T> Ring<T> {
    /// A ring of at least `capacity` places (a power of two, at least 2).
    pub(crate) fn new(capacity: usize) -> Self {
        let size = capacity.max(2).next_power_of_two();
        Ring {
            tail: Padded(AtomicUsize::new(0)),
            head: Padded(AtomicUsize::new(0)),
            slots: (0..size)
                .map(|i| Slot {
                    stamp: AtomicUsize::new(stamp(i, 0)),
                    value: Mutex::new(None),
                })
                .collect(),
            mask: size - 1,
        }
    }

    /// How many places the ring has.
    pub(crate) fn size(&self) -> usize {
        self.mask + 1
    }

    /// Appends `value`, or hands it back (inv. 2).
    pub(crate) fn push(&self, value: T) -> Result<(), Refused<T>> {
        // ORDERING: Acquire on `tail` pairs with the Release of the
        // producer before (every place before this one is filled); on the
        // stamp, with the consumer's take of the last lap's value.
        let mut tail = self.tail.load(Ordering::Acquire);
        loop {
            // Odd: claimed, being filled.
            if tail & 1 == 1 {
                return Err(Refused::Busy(value));
            }
            // Halving keeps positions modulo 2^63, a multiple of `size`,
            // and their stamps doubled again modulo 2^64: both consistent
            // with `head`'s.
            let pos = tail / 2;
            let slot = &self.slots[pos & self.mask];
            // Half-steps from "free for `pos`": 0 free; negative, a value
            // of the last lap still there: full; positive, `pos` was
            // claimed and filled since `tail` was read, so `tail` has moved
            // on and the compare-exchange below fails and reads it again.
            let ahead = slot
                .stamp
                .load(Ordering::Acquire)
                .wrapping_sub(stamp(pos, 0)) as isize;
            if ahead < 0 {
                return Err(Refused::Full(value));
            }
            match self.tail.compare_exchange_weak(
                tail,
                tail | 1,
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    *lock(&slot.value) = Some(value);
                    slot.stamp.store(stamp(pos, 2), Ordering::Release);
                    // Only the claimer moves `tail` on from odd.
                    self.tail
                        .store(stamp(pos.wrapping_add(1), 0), Ordering::Release);
                    return Ok(());
                }
                Err(now) => tail = now,
            }
        }
    }

    /// Takes the oldest value, if it is in (inv. 3). Only one thread at a
    /// time may call this (the intake's: the holder of the pool lock).
    pub(crate) fn pop(&self) -> Option<T> {
        // ORDERING: only this (serialised) caller writes `head`.
        let pos = self.head.load(Ordering::Relaxed);
        let slot = &self.slots[pos & self.mask];
        if slot.stamp.load(Ordering::Acquire) != stamp(pos, 2) {
            return None;
        }
        let value = lock(&slot.value).take();
        slot.stamp
            .store(stamp(pos.wrapping_add(self.size()), 0), Ordering::Release);
        self.head.store(pos.wrapping_add(1), Ordering::Release);
        debug_assert!(value.is_some(), "a place stamped in holds its value");
        value
    }

    /// Whether no value is in at the front (a hint from any thread; for
    /// the consumer, exact as of its load of the stamp: inv. 3).
    pub(crate) fn is_empty(&self) -> bool {
        let pos = self.head.load(Ordering::Acquire);
        self.slots[pos & self.mask].stamp.load(Ordering::Acquire) != stamp(pos, 2)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{stamp, Refused, Ring};

    #[test]
    fn values_leave_in_order_and_a_full_ring_hands_them_back() {
        let r = Ring::new(3);
        assert_eq!(r.size(), 4);
        assert!(r.is_empty());
        for lap in 0..3 {
            for i in 0..4 {
                assert_eq!(r.push(lap * 10 + i), Ok(()));
            }
            assert_eq!(r.push(99), Err(Refused::Full(99)), "full");
            assert!(!r.is_empty());
            for i in 0..4 {
                assert_eq!(r.pop(), Some(lap * 10 + i));
            }
            assert_eq!(r.pop(), None);
            assert!(r.is_empty());
        }
    }

    #[test]
    fn a_ring_of_one_place_has_two() {
        let r = Ring::new(1);
        assert_eq!(r.size(), 2);
        assert_eq!(r.push(1), Ok(()));
        assert_eq!(r.push(2), Ok(()));
        assert_eq!(r.push(3), Err(Refused::Full(3)));
        assert_eq!(r.pop(), Some(1));
        assert_eq!(r.push(3), Ok(()));
        assert_eq!(r.pop(), Some(2));
        assert_eq!(r.pop(), Some(3));
        assert_eq!(r.pop(), None);
    }

    #[test]
    fn a_producer_finding_the_tail_claimed_is_told_busy_and_nothing_moves() {
        let r = Ring::new(4);
        assert_eq!(r.push(1), Ok(()));
        // Another producer claimed position 1 and has not filled it.
        r.tail
            .store(stamp(1, 1), std::sync::atomic::Ordering::Relaxed);
        assert_eq!(r.push(2), Err(Refused::Busy(2)));
        assert_eq!(r.pop(), Some(1));
        assert_eq!(r.pop(), None, "the claimed place is not in");
        assert!(r.is_empty());
        // The claimer is done.
        r.tail
            .store(stamp(1, 0), std::sync::atomic::Ordering::Relaxed);
        assert_eq!(r.push(2), Ok(()));
        assert_eq!(r.pop(), Some(2));
    }

    #[test]
    fn positions_wrap_around_usize() {
        let r = Ring::new(2);
        let start = usize::MAX - 2;
        // Start near the wrap: positions and stamps as if that many values
        // had passed.
        r.tail
            .store(stamp(start, 0), std::sync::atomic::Ordering::Relaxed);
        r.head.store(start, std::sync::atomic::Ordering::Relaxed);
        for (i, slot) in r.slots.iter().enumerate() {
            // The first position at or after `start` that maps here.
            let pos = start.wrapping_add(i.wrapping_sub(start) & r.mask);
            slot.stamp
                .store(stamp(pos, 0), std::sync::atomic::Ordering::Relaxed);
        }
        for v in 0..10 {
            assert_eq!(r.push(v), Ok(()));
            assert_eq!(r.push(v + 100), Ok(()));
            assert_eq!(r.push(7), Err(Refused::Full(7)));
            assert_eq!(r.pop(), Some(v));
            assert_eq!(r.pop(), Some(v + 100));
            assert_eq!(r.pop(), None);
        }
    }

    #[test]
    fn many_producers_one_consumer_lose_nothing_and_keep_each_producer_s_order() {
        const PRODUCERS: usize = 4;
        const EACH: usize = 50_000;
        let r = std::sync::Arc::new(Ring::new(8));
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        let mut v = (p, i);
                        while let Err(back) = r.push(v) {
                            v = back.into_inner();
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let mut next = [0usize; PRODUCERS];
        let mut got = 0;
        while got < PRODUCERS * EACH {
            match r.pop() {
                Some((p, i)) => {
                    assert_eq!(i, next[p], "producer {p}'s values in order");
                    next[p] += 1;
                    got += 1;
                }
                None => std::thread::yield_now(),
            }
        }
        for p in producers {
            p.join().expect("producer");
        }
        assert_eq!(r.pop(), None);
        assert_eq!(next, [EACH; PRODUCERS]);
    }
}
