//! Leaf module: a set of futures polled only when they are woken, for the
//! batch calls (`batch.rs`, `map.rs`). Each future gets its own waker, which
//! queues its index and wakes the set's task; a poll of the set polls the
//! queued futures only, so a batch of n jobs costs O(n) polls in all, not
//! O(n) per wake-up. A queued waker names its future's slot *and* that
//! slot's occupant, so a late wake-up of a finished future never polls the
//! future that took its slot (which would leave a stale entry per job: a
//! queue growing with the input). One poll of the set polls at most
//! [`BUDGET`] futures, then yields: a batch of 10^5 jobs does not hold the
//! runtime thread while it submits them all.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Wake, Waker};

use crate::util::wait_list::WakerCell;

/// Futures polled by one poll of a [`ReadySet`] before it yields.
pub(crate) const BUDGET: usize = 64;

/// What the wakers of one set share.
#[derive(Default)]
struct Shared {
    /// Woken futures' wakers, each at most once.
    queue: Mutex<VecDeque<Arc<Slot>>>,
    /// The task polling the set (its waker is cloned, dropped and woken
    /// outside every lock: `WakerCell`).
    task: WakerCell,
}

/// One future's waker: queues its index, then wakes the set's task (after
/// letting go of the queue's lock: the task's waker is foreign code). It
/// reaches the set weakly: the queue holds slots, so a strong reference
/// back would be a cycle, and a set dropped with wake-ups queued (a race's
/// losers, woken as they were stopped) would never be freed, nor the waker
/// of the task that polled it.
struct Slot {
    index: usize,
    queued: AtomicBool,
    shared: Weak<Shared>,
}

impl Wake for Slot {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // ORDERING: AcqRel pairs with the poller's clearing store, so a wake
        // after the poller took the index queues it again.
        if self.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        // A wake-up after the set was dropped reaches nobody.
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        lock(&shared.queue).push_back(self.clone());
        shared.task.wake();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A future in the set, with its caller's tag and its waker.
struct Entry<F> {
    fut: Pin<Box<F>>,
    tag: usize,
    slot: Arc<Slot>,
}

/// Futures, each with a tag, polled when woken. Slots of finished futures
/// are reused, so memory follows the futures in the set, not all ever
/// pushed.
pub(crate) struct ReadySet<F> {
    entries: Vec<Option<Entry<F>>>,
    free: Vec<usize>,
    shared: Arc<Shared>,
    live: usize,
}

impl<F> ReadySet<F> {
    pub(crate) fn new() -> Self {
        ReadySet {
            entries: Vec::new(),
            free: Vec::new(),
            shared: Arc::default(),
            live: 0,
        }
    }

    /// Adds `fut`, tagged `tag` (polled at the next poll).
    pub(crate) fn push(&mut self, fut: F, tag: usize) {
        let index = self.free.pop().unwrap_or(self.entries.len());
        let slot = Arc::new(Slot {
            index,
            queued: AtomicBool::new(true),
            shared: Arc::downgrade(&self.shared),
        });
        lock(&self.shared.queue).push_back(slot.clone());
        let entry = Some(Entry {
            fut: Box::pin(fut),
            tag,
            slot,
        });
        match self.entries.get_mut(index) {
            Some(e) => *e = entry,
            None => self.entries.push(entry),
        }
        self.live += 1;
    }

    /// Futures pushed and not yet finished.
    pub(crate) fn live(&self) -> usize {
        self.live
    }

    /// Calls `f` on every unfinished future, with its tag, in the order of
    /// their places (the order they were pushed in, for a set that has not
    /// reused one).
    pub(crate) fn for_each_live(&mut self, mut f: impl FnMut(usize, Pin<&mut F>)) {
        for e in self.entries.iter_mut().flatten() {
            f(e.tag, e.fut.as_mut());
        }
    }

    /// Drops every unfinished future, and the wake-ups queued for them.
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.free.clear();
        self.live = 0;
        let queued = std::mem::take(&mut *lock(&self.shared.queue));
        drop(queued);
    }
}

impl<F: Future> ReadySet<F> {
    /// The next future to finish, with its tag; `Ready(None)` when none is
    /// left.
    pub(crate) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<(usize, F::Output)>> {
        if self.live == 0 {
            return Poll::Ready(None);
        }
        // Before the queue is looked at: a wake-up from now on finds it.
        self.shared.task.set(cx.waker());
        for _ in 0..BUDGET {
            let Some(woken) = lock(&self.shared.queue).pop_front() else {
                return Poll::Pending;
            };
            let index = woken.index;
            let Some(e) = self.entries.get_mut(index).and_then(Option::as_mut) else {
                continue;
            };
            if !Arc::ptr_eq(&e.slot, &woken) {
                // A late wake-up of the slot's earlier future.
                continue;
            }
            // ORDERING: see `Slot::wake_by_ref`.
            e.slot.queued.store(false, Ordering::Release);
            let waker = Waker::from(e.slot.clone());
            if let Poll::Ready(out) = e.fut.as_mut().poll(&mut Context::from_waker(&waker)) {
                let tag = e.tag;
                self.entries[index] = None;
                self.free.push(index);
                self.live -= 1;
                return Poll::Ready(Some((tag, out)));
            }
        }
        // Budget spent with futures still queued: yield, and come back.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Finishes in the poll that wakes it (a job that finished while its
    /// caller polled), or counts its polls and stays pending.
    enum Probe {
        WakeAndFinish,
        Pending(Arc<AtomicUsize>),
    }

    impl Future for Probe {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            match &*self {
                Probe::WakeAndFinish => {
                    cx.waker().wake_by_ref();
                    Poll::Ready(())
                }
                Probe::Pending(polls) => {
                    polls.fetch_add(1, Ordering::SeqCst);
                    Poll::Pending
                }
            }
        }
    }

    /// Stays pending and hands out the waker of its last poll.
    struct Parked(Arc<Mutex<Option<Waker>>>);

    impl Future for Parked {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            *lock(&self.0) = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    /// Counts its wake-ups.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn poll_set(set: &mut ReadySet<Probe>) -> Poll<Option<(usize, ())>> {
        set.poll_next(&mut Context::from_waker(Waker::noop()))
    }

    /// A late wake-up of a finished future does not poll the future that
    /// took its slot (which left one stale entry per job behind).
    #[test]
    fn a_late_wake_up_does_not_reach_the_next_occupant() {
        let mut set = ReadySet::new();
        set.push(Probe::WakeAndFinish, 7);
        assert_eq!(poll_set(&mut set), Poll::Ready(Some((7, ()))));
        let polls = Arc::new(AtomicUsize::new(0));
        set.push(Probe::Pending(polls.clone()), 8);
        assert_eq!(poll_set(&mut set), Poll::Pending);
        assert_eq!(polls.load(Ordering::SeqCst), 1, "polled once, when pushed");
        assert!(lock(&set.shared.queue).is_empty(), "no stale entry left");
    }

    /// A future's wake-up wakes the task that polled the set last (the
    /// set's waker follows the task: not the one of an earlier poll).
    #[test]
    fn a_wake_up_reaches_the_task_that_polled_last() {
        let mut set = ReadySet::new();
        let parked = Arc::new(Mutex::new(None));
        set.push(Parked(parked.clone()), 0);
        let (first, second) = (Arc::new(Count::default()), Arc::new(Count::default()));
        let polled_by = |set: &mut ReadySet<Parked>, task: &Arc<Count>| {
            let waker = Waker::from(task.clone());
            set.poll_next(&mut Context::from_waker(&waker))
        };
        assert!(polled_by(&mut set, &first).is_pending());
        let woken = lock(&parked).take().expect("the future was polled");
        woken.wake_by_ref();
        assert_eq!(first.0.load(Ordering::SeqCst), 1, "the polling task woken");
        assert!(polled_by(&mut set, &second).is_pending());
        lock(&parked).take().expect("polled again").wake();
        assert_eq!(second.0.load(Ordering::SeqCst), 1, "the last poller woken");
        assert_eq!(first.0.load(Ordering::SeqCst), 1, "not the earlier one");
    }

    /// A set dropped with wake-ups queued is freed, and so is the waker of
    /// the task that polled it (the queue's slots held the set strongly: a
    /// cycle that kept both, found by a hostile review of `invoke_any`).
    #[test]
    fn a_set_dropped_with_wake_ups_queued_is_freed() {
        let mut set = ReadySet::new();
        let parked: Vec<_> = (0..3).map(|_| Arc::new(Mutex::new(None))).collect();
        for (i, p) in parked.iter().enumerate() {
            set.push(Parked(p.clone()), i);
        }
        let task = Arc::new(Count::default());
        let waker = Waker::from(task.clone());
        assert!(set.poll_next(&mut Context::from_waker(&waker)).is_pending());
        drop(waker);
        for p in &parked {
            lock(p).take().expect("polled").wake();
        }
        let shared = Arc::downgrade(&set.shared);
        drop(set);
        assert!(shared.upgrade().is_none(), "the set's shared part is freed");
        assert_eq!(Arc::strong_count(&task), 1, "the task's waker is released");
    }

    /// One poll of the set polls at most `BUDGET` futures, then yields.
    #[test]
    fn a_poll_spends_at_most_the_budget() {
        let mut set = ReadySet::new();
        let polls = Arc::new(AtomicUsize::new(0));
        for i in 0..3 * BUDGET {
            set.push(Probe::Pending(polls.clone()), i);
        }
        assert_eq!(poll_set(&mut set), Poll::Pending);
        assert_eq!(polls.load(Ordering::SeqCst), BUDGET);
        assert_eq!(poll_set(&mut set), Poll::Pending);
        assert_eq!(polls.load(Ordering::SeqCst), 2 * BUDGET);
    }
}
