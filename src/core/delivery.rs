//! The observer's delivery thread (observer.rs invariants 2–4): the one
//! place lifecycle events reach the user's [`Observer`](crate::Observer).
//!
//! Started with the first accepted job when an observer is configured. It
//! waits on its doorbell (a bounded `crossbeam-channel`), takes every
//! pending event under the pool lock, delivers them outside it, and reports
//! the batch delivered, which lets admission held back by the lag go on.
//! It exits once the pool is shut down, idle and without workers, and is
//! joined at termination like every pool thread.

use crate::core::observer::deliver;
use crate::core::pool::Inner;
use crate::core::state::{After, State, Wait};
use crate::core::waits::Waiting;
use crate::util::slab::Key;
use crate::util::sync::Arc;

impl Inner {
    /// Whether the current thread is this pool's delivery thread: the
    /// observer runs here, and whatever it waits for on its own pool must
    /// not wait for the delivery it is part of.
    pub(crate) fn is_delivery_thread(&self) -> bool {
        crate::util::sync::is_pool_thread(self.addr(), crate::util::sync::Role::Delivery)
    }

    /// Whether the current thread is one of this pool's workers.
    pub(crate) fn is_worker_thread(&self) -> bool {
        crate::util::sync::is_pool_thread(self.addr(), crate::util::sync::Role::Worker)
    }

    /// Whether the current thread is one of this pool's own (a worker or
    /// the delivery thread).
    pub(crate) fn is_own_thread(&self) -> bool {
        self.is_delivery_thread() || self.is_worker_thread()
    }

    /// Starts the delivery thread if an observer is configured and it does
    /// not run; returns the error if it could not be spawned (events then
    /// wait, and the next accepted job tries again).
    pub(crate) fn ensure_delivery(self: &Arc<Self>, s: &mut State) -> Option<std::io::Error> {
        if !s.delivery_starting() {
            return None;
        }
        let spawned = if s.workers.injected_delivery_spawn_failure() {
            Err(std::io::Error::from_raw_os_error(11)) // EAGAIN
        } else {
            self.spawn_thread(s, "observer", |inner, slot| inner.delivery_loop(slot))
        };
        match spawned {
            Ok(()) => None,
            Err(e) => {
                s.workers.delivery_gone();
                Some(e)
            }
        }
    }

    fn delivery_loop(self: Arc<Self>, slot: Key) {
        let (Some(observer), Some((_, doorbell))) = (&self.config.observer, &self.doorbell) else {
            return;
        };
        crate::util::sync::mark_pool_thread(self.addr(), crate::util::sync::Role::Delivery);
        // Counted as a settle waiter, so that the pool settling (the last
        // worker retiring) rings the doorbell.
        let _registered = Waiting::new(&self, Wait::Settle);
        loop {
            let mut after = After::default();
            let batch = {
                let mut s = self.lock();
                match s.events_take() {
                    Some(batch) => batch,
                    None => {
                        // Exits in the critical section that saw nothing
                        // left to deliver and no worker left to cause more.
                        if let Some(earlier) = s.delivery_exit(slot, &mut after) {
                            drop(s);
                            self.after(after);
                            self.join(earlier);
                            return;
                        }
                        drop(s);
                        // Rung after every event queued once we unlocked:
                        // no ring is lost (observer.rs inv. 3).
                        if doorbell.recv().is_err() {
                            return;
                        }
                        continue;
                    }
                }
            };
            deliver(&*observer.0, &batch);
            crate::util::quiet::drop_quietly(batch);
            self.lock().events_done(&mut after);
            self.after(after);
        }
    }
}
