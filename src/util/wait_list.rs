//! Leaf module: a list of async waiters woken together, each inside
//! `catch_unwind`; and one task's waker kept the same way ([`WakerCell`]),
//! with a [`Relay`] that stands in for it where a lock we do not control
//! would clone or wake it.
//!
//! `tokio::sync::Notify::notify_waiters` stops waking the rest of its batch
//! when one waker panics, so one hostile waker could leave every other
//! `idle()`/`terminated()` waiter asleep. Here every waker is woken on its
//! own, outside the list's lock, and a panic in one is caught
//! (ARCHITECTURE.md invariants 5 and 9). Clones and drops of wakers (foreign
//! code too) also happen outside the lock.

use std::collections::HashMap;
use std::task::Waker;

use crate::util::quiet::{drop_quietly, wake_quietly};

// std's `Mutex`, in loom builds too: its lock guards only the waker map (no
// proof rests on its interleavings), and in loom 0.7 a thread that blocks on
// a modelled mutex loses an `unpark` sent to it just before, which deadlocked
// the termination model (a worker parking right after a contended wake-up
// never woke for the shutdown that claimed it).
use std::sync::Mutex;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Waiters to wake together.
#[derive(Default)]
pub(crate) struct WaitList {
    inner: Mutex<Waiters>,
}

#[derive(Default)]
struct Waiters {
    next: u64,
    wakers: HashMap<u64, Waker>,
}

/// One waiter's place in a [`WaitList`]; dropping it unregisters.
pub(crate) struct Registration<'a> {
    list: &'a WaitList,
    key: Option<u64>,
}

impl WaitList {
    /// A place for one waiter, registered at its first [`Registration::set`].
    pub(crate) fn registration(&self) -> Registration<'_> {
        Registration {
            list: self,
            key: None,
        }
    }

    /// Wakes every registered waiter once (each must register again to be
    /// woken again).
    pub(crate) fn wake_all(&self) {
        let wakers = std::mem::take(&mut lock(&self.inner).wakers);
        for (_, waker) in wakers {
            wake_quietly(waker);
        }
    }
}

impl Registration<'_> {
    /// Registers `waker` (replacing this waiter's earlier one). Call it
    /// *before* testing the condition waited for, so that a wake-up after
    /// the test is not lost.
    pub(crate) fn set(&mut self, waker: &Waker) {
        if let Some(key) = self.key {
            let guard = lock(&self.list.inner);
            if guard.wakers.get(&key).is_some_and(|w| w.will_wake(waker)) {
                return;
            }
        }
        let new = waker.clone();
        let mut guard = lock(&self.list.inner);
        let key = match self.key {
            Some(key) => key,
            None => {
                guard.next += 1;
                guard.next
            }
        };
        self.key = Some(key);
        let old = guard.wakers.insert(key, new);
        drop(guard);
        drop_quietly(old);
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            let old = lock(&self.list.inner).wakers.remove(&key);
            drop_quietly(old);
        }
    }
}

/// One task's waker, where wake-ups from other threads reach it. Nothing
/// foreign runs under its lock: the waker is cloned before locking, the one
/// it replaces is dropped after unlocking, and a wake-up takes it out and
/// wakes it after unlocking, a panic caught (ARCHITECTURE.md invariants 5
/// and 9). A wake-up takes the waker: the task registers again at its next
/// poll, *before* it looks for what it waits for.
#[derive(Default)]
pub(crate) struct WakerCell {
    waker: Mutex<Option<Waker>>,
}

impl WakerCell {
    /// Registers `waker`, replacing the one before.
    pub(crate) fn set(&self, waker: &Waker) {
        if lock(&self.waker)
            .as_ref()
            .is_some_and(|w| w.will_wake(waker))
        {
            return;
        }
        let new = waker.clone();
        let old = lock(&self.waker).replace(new);
        drop_quietly(old);
    }

    /// Wakes the registered waker, if any.
    pub(crate) fn wake(&self) {
        let taken = lock(&self.waker).take();
        if let Some(waker) = taken {
            wake_quietly(waker);
        }
    }
}

/// A waker of ours that forwards to the task's ([`WakerCell`]): handed to
/// a future that clones or wakes its waker under a lock of its own (tokio's
/// `Notify` clones it under the lock that `notify_one` takes, and stops
/// waking the rest of a `notify_waiters` batch when one waker panics), so
/// that no foreign waker runs there. Cloning it is a reference count;
/// waking it never panics.
#[derive(Default)]
pub(crate) struct Relay {
    to: WakerCell,
}

impl std::task::Wake for Relay {
    fn wake(self: std::sync::Arc<Self>) {
        self.to.wake();
    }

    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.to.wake();
    }
}

/// Polls `fut` with a [`Relay`]'s waker, registering the caller's waker in
/// the relay first.
pub(crate) struct Relayed<'a, F> {
    fut: std::pin::Pin<&'a mut F>,
    relay: std::sync::Arc<Relay>,
    waker: Waker,
}

impl<'a, F: std::future::Future> Relayed<'a, F> {
    pub(crate) fn new(fut: std::pin::Pin<&'a mut F>, relay: &std::sync::Arc<Relay>) -> Self {
        Relayed {
            fut,
            relay: relay.clone(),
            waker: Waker::from(relay.clone()),
        }
    }
}

impl<F: std::future::Future> std::future::Future for Relayed<'_, F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        self.relay.to.set(cx.waker());
        let this = &mut *self;
        this.fut
            .as_mut()
            .poll(&mut std::task::Context::from_waker(&this.waker))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count::default());
        (count.clone(), Waker::from(count))
    }

    /// Every registered waiter is woken, each in its own place; a dropped
    /// registration is not (and its waker is let go of).
    #[test]
    fn wakes_every_registered_waiter_and_no_dropped_one() {
        let list = WaitList::default();
        let (a, wa) = counting();
        let (b, wb) = counting();
        let (c, wc) = counting();
        let mut ra = list.registration();
        let mut rb = list.registration();
        let mut rc = list.registration();
        ra.set(&wa);
        rb.set(&wb);
        rc.set(&wc);
        drop(rc);
        assert_eq!(
            Arc::strong_count(&c),
            2,
            "the dropped waiter's waker let go"
        );
        list.wake_all();
        let woken = |n: &Arc<Count>| n.0.load(Ordering::SeqCst);
        assert_eq!((woken(&a), woken(&b), woken(&c)), (1, 1, 0));
        drop((ra, rb, wc));
    }

    /// A cell wakes the waker registered last, once: the wake-up takes it,
    /// and the task registers again at its next poll. A relay's waker
    /// forwards to the cell.
    #[test]
    fn a_cell_wakes_its_last_waker_once() {
        let cell = WakerCell::default();
        cell.wake();
        let (a, wa) = counting();
        let (b, wb) = counting();
        cell.set(&wa);
        cell.set(&wb);
        assert_eq!(Arc::strong_count(&a), 2, "the replaced waker let go");
        cell.wake();
        cell.wake();
        let woken = |n: &Arc<Count>| n.0.load(Ordering::SeqCst);
        assert_eq!((woken(&a), woken(&b)), (0, 1));
        let relay = Arc::new(Relay::default());
        relay.to.set(&wa);
        Waker::from(relay.clone()).wake_by_ref();
        assert_eq!(woken(&a), 1);
        relay.to.set(&wa);
        Waker::from(relay).wake();
        assert_eq!(woken(&a), 2);
        drop((wa, wb));
    }
}
