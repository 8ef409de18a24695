//! [`Workers`]: the pool's threads as the locked state sees them. The wake
//! protocol's bookkeeping (searching and parked workers, `README.md`
//! beside this file, "Waking workers"), the threads' handles for termination, the monitor's
//! and the delivery thread's flags, and the spawn-failure test hooks.
//!
//! Every change of the searching, parked or live counts is published to the
//! intake's submitters in the same call (fast/intake.rs inv. 2), so no
//! caller can forget it. Every method is O(1) in the queue length and in
//! `max_in_flight`, apart from [`Workers::take_exited`], which hands over
//! what accumulated (at most one retired thread, or all of them at
//! shutdown).
//!
//! What also needs the queue, the lanes or the settle waiters (retiring,
//! a failed spawn, the last worker kept for a limiter's permit) is a
//! transition of [`State`](super::State), in transitions.rs.

use super::{After, Worker};
use crate::core::fast::intake::Intake;
use crate::util::slab::{Key, List, Slab};
use crate::util::sync::thread;

/// A parked worker: its id and its thread.
struct Parked {
    id: u64,
    thread: thread::Thread,
}

/// The pool's worker threads, and its other threads' flags and handles.
pub(crate) struct Workers {
    /// At most this many workers live (the pool's `max_in_flight`).
    max: usize,
    /// Parked workers not yet claimed, most recently parked last.
    parked: Slab<Parked>,
    parked_list: List,
    /// Live worker threads (spawned, or counted to be, and not retired).
    live: usize,
    /// Awake workers without a job that will look at the queue before
    /// they park.
    searching: usize,
    next_id: u64,
    /// The last worker spawn failed (and none succeeded since).
    spawn_blocked: bool,
    inject_spawn_failures: usize,
    inject_delivery_spawn_failures: usize,
    /// Handles of live pool threads (workers and the monitor), by slot.
    threads: Slab<Option<thread::JoinHandle<()>>>,
    /// Handles of retired threads nobody has joined yet.
    exited: Vec<thread::JoinHandle<()>>,
    /// Handles taken out of `exited` and being joined now.
    joining: usize,
    /// The stuck-job monitor thread is alive.
    monitor: bool,
    /// The observer's delivery thread is alive.
    delivery: bool,
    /// Where the counts are published, if the pool has an intake.
    intake: Option<std::sync::Arc<Intake>>,
}

impl Workers {
    pub(super) fn new(max: usize, intake: Option<std::sync::Arc<Intake>>) -> Self {
        Workers {
            max,
            parked: Slab::default(),
            parked_list: List::default(),
            live: 0,
            searching: 0,
            next_id: 0,
            spawn_blocked: false,
            inject_spawn_failures: 0,
            inject_delivery_spawn_failures: 0,
            threads: Slab::default(),
            exited: Vec::new(),
            joining: 0,
            monitor: false,
            delivery: false,
            intake,
        }
    }

    /// Publishes the counts to submitters at the intake (fast/intake.rs
    /// inv. 2): searching, and parked or not yet spawned.
    fn publish(&self) {
        if let Some(intake) = &self.intake {
            let wakeable = self.parked_list.len() + self.max.saturating_sub(self.live);
            intake.set_workers(self.searching, wakeable);
        }
    }

    /// Makes sure some worker will look at the queue: a searching one, a
    /// claimed parked one, or a new one (state/README.md "Waking workers").
    pub(crate) fn find(&mut self) -> Worker {
        let worker = self.find_counted();
        self.publish();
        worker
    }

    fn find_counted(&mut self) -> Worker {
        if self.searching > 0 {
            return Worker::Searching;
        }
        if let Some(key) = self.parked.pop_back(&mut self.parked_list) {
            if let Some(p) = self.parked.remove(key) {
                // A claimed worker counts as searching.
                self.searching += 1;
                return Worker::Claimed(p.thread);
            }
        }
        if self.live < self.max {
            self.live += 1;
            self.searching += 1;
            self.next_id += 1;
            return Worker::Spawn(self.next_id);
        }
        Worker::Busy
    }

    /// Claims every parked worker: each is unparked after unlocking,
    /// counted as searching, and looks at the queue again.
    pub(super) fn claim_all_parked(&mut self, after: &mut After) {
        while let Some(key) = self.parked.pop_back(&mut self.parked_list) {
            if let Some(p) = self.parked.remove(key) {
                self.searching += 1;
                after.unpark.push(p.thread);
            }
        }
        self.publish();
    }

    /// A worker counted by [`Worker::Spawn`] could not be spawned.
    pub(super) fn spawn_failed(&mut self) {
        self.live -= 1;
        self.searching -= 1;
        self.spawn_blocked = true;
        self.publish();
    }

    /// A worker counted by [`Worker::Spawn`] was spawned.
    pub(super) fn spawn_succeeded(&mut self) {
        self.spawn_blocked = false;
    }

    /// Whether the last worker spawn failed (and none succeeded since).
    pub(super) fn spawn_blocked(&self) -> bool {
        self.spawn_blocked
    }

    /// Test hook: whether this spawn should fail as if the OS refused it.
    pub(crate) fn injected_spawn_failure(&mut self) -> bool {
        if self.inject_spawn_failures == 0 {
            return false;
        }
        self.inject_spawn_failures -= 1;
        true
    }

    #[cfg(feature = "test-hooks")]
    pub(crate) fn inject_spawn_failures(&mut self, n: usize) {
        self.inject_spawn_failures = n;
    }

    /// Test hook: whether this delivery-thread spawn should fail as if the
    /// OS refused it.
    pub(crate) fn injected_delivery_spawn_failure(&mut self) -> bool {
        if self.inject_delivery_spawn_failures == 0 {
            return false;
        }
        self.inject_delivery_spawn_failures -= 1;
        true
    }

    #[cfg(feature = "test-hooks")]
    pub(crate) fn inject_delivery_spawn_failures(&mut self, n: usize) {
        self.inject_delivery_spawn_failures = n;
    }

    /// The worker will look at the queue again before it parks.
    pub(crate) fn begin_search(&mut self) {
        self.searching += 1;
        self.publish();
    }

    /// The worker stops searching (it took a job, parks or retires).
    pub(crate) fn end_search(&mut self) {
        self.searching -= 1;
        self.publish();
    }

    /// How many workers are searching.
    pub(crate) fn searching(&self) -> usize {
        self.searching
    }

    /// The worker `id` parks; returns the key it finds itself under.
    pub(crate) fn park(&mut self, id: u64, thread: thread::Thread) -> Key {
        let key = self.parked.insert(Parked { id, thread });
        self.parked.push_back(&mut self.parked_list, key);
        self.publish();
        key
    }

    /// Whether the worker `id` parked under `key` was claimed (a claimer
    /// removed its entry and counted it as searching).
    pub(crate) fn was_claimed(&self, key: Key, id: u64) -> bool {
        self.parked.get(key).is_none_or(|p| p.id != id)
    }

    /// The unclaimed worker parked under `key` stops waiting (keep-alive).
    pub(crate) fn unpark_self(&mut self, key: Key) {
        self.parked.unlink(&mut self.parked_list, key);
        self.parked.remove(key);
        self.publish();
    }

    /// How many worker threads live.
    pub(crate) fn live(&self) -> usize {
        self.live
    }

    /// A worker leaves the count as its last act under the lock. Returns
    /// the handles of threads that retired before it, for it to join after
    /// unlocking.
    pub(super) fn retire(&mut self, slot: Key) -> Vec<thread::JoinHandle<()>> {
        self.live -= 1;
        self.publish();
        self.thread_exit(slot)
    }

    /// Reserves the slot a new pool thread's handle will be kept in.
    pub(crate) fn thread_slot(&mut self) -> Key {
        self.threads.insert(None)
    }

    /// The thread for `slot` was spawned.
    pub(crate) fn thread_started(&mut self, slot: Key, handle: thread::JoinHandle<()>) {
        if let Some(h) = self.threads.get_mut(slot) {
            *h = Some(handle);
        }
    }

    /// The thread for `slot` could not be spawned.
    pub(crate) fn thread_failed(&mut self, slot: Key) {
        self.threads.remove(slot);
    }

    /// The thread in `slot` is exiting: its handle waits in `exited` for a
    /// join; the handles that waited there before are returned, counted as
    /// being joined (so that at most one retired thread is ever left
    /// unjoined, however long the pool lives).
    fn thread_exit(&mut self, slot: Key) -> Vec<thread::JoinHandle<()>> {
        let earlier = self.take_exited();
        if let Some(Some(handle)) = self.threads.remove(slot) {
            self.exited.push(handle);
        }
        earlier
    }

    /// Takes the handles of retired threads for the caller to join; call
    /// [`State::joined`](super::State::joined) after joining them.
    pub(crate) fn take_exited(&mut self) -> Vec<thread::JoinHandle<()>> {
        let handles = std::mem::take(&mut self.exited);
        self.joining += handles.len();
        handles
    }

    /// `n` handles taken by [`Workers::take_exited`] were settled: joined,
    /// or (`back`, the joiner's own) returned to the exited list.
    pub(super) fn joined(&mut self, n: usize, back: Option<thread::JoinHandle<()>>) {
        self.joining -= n;
        self.exited.extend(back);
    }

    /// No worker lives, the monitor and the delivery thread are gone, and
    /// every pool thread's slot is free (some may still be exiting).
    pub(super) fn all_retired(&self) -> bool {
        self.live == 0 && !self.monitor && !self.delivery && self.threads.is_empty()
    }

    /// Every retired thread's handle was joined.
    pub(super) fn all_joined(&self) -> bool {
        self.exited.is_empty() && self.joining == 0
    }

    /// Marks the monitor thread started; `false` if it already runs.
    pub(crate) fn monitor_starting(&mut self) -> bool {
        !std::mem::replace(&mut self.monitor, true)
    }

    /// The monitor could not start.
    pub(super) fn monitor_gone(&mut self) {
        self.monitor = false;
    }

    /// The monitor in `slot` exits; returns earlier retirees to join.
    pub(super) fn monitor_exit(&mut self, slot: Key) -> Vec<thread::JoinHandle<()>> {
        self.monitor = false;
        self.thread_exit(slot)
    }

    /// Whether the delivery thread runs.
    pub(super) fn delivery(&self) -> bool {
        self.delivery
    }

    /// Marks the delivery thread started.
    pub(super) fn delivery_starting(&mut self) {
        self.delivery = true;
    }

    /// The delivery thread could not start.
    pub(crate) fn delivery_gone(&mut self) {
        self.delivery = false;
    }

    /// The delivery thread in `slot` exits; returns earlier retirees to
    /// join.
    pub(super) fn delivery_exit(&mut self, slot: Key) -> Vec<thread::JoinHandle<()>> {
        self.delivery = false;
        self.thread_exit(slot)
    }
}
