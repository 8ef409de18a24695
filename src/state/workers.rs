//! The worker half of [`State`]: the wake protocol's bookkeeping
//! (searching and parked workers), the threads' handles for termination,
//! and the stuck-job monitor's flag. Every method is O(1) in the queue
//! length and in `max_in_flight`, apart from [`State::take_exited`],
//! which hands over what accumulated (at most one retired thread, or all
//! of them at shutdown).

use super::{After, Parked, State, Worker};
use crate::slab::Key;
use crate::sync::thread;

impl State {
    /// Makes sure some worker will look at the queue: a searching one, a
    /// claimed parked one, or a new one (ARCHITECTURE.md "Waking workers").
    pub(crate) fn find_worker(&mut self) -> Worker {
        let worker = self.find_worker_counted();
        self.publish_workers();
        worker
    }

    fn find_worker_counted(&mut self) -> Worker {
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
        if self.workers < self.max_in_flight {
            self.workers += 1;
            self.searching += 1;
            self.next_worker += 1;
            return Worker::Spawn(self.next_worker);
        }
        Worker::Busy
    }

    /// Called by a worker that just took a job: if jobs are still queued,
    /// makes sure a worker will look at them (nothing to do if another is
    /// searching: [`State::find_worker`]).
    pub(crate) fn wake_another(&mut self) -> Worker {
        if !self.has_startable() {
            return Worker::Searching;
        }
        self.find_worker()
    }

    /// Whether the calling worker, about to retire, is the last one while
    /// jobs are queued: it must stay (parked), or a job waiting for a
    /// limiter's permit would have no worker when the permit comes back,
    /// and after the last handle is dropped nothing would keep the pool
    /// alive for it.
    pub(crate) fn must_keep_worker(&self) -> bool {
        self.workers == 1 && self.queued > 0 && !self.draining
    }

    /// After a shutdown the last worker stays parked while it must
    /// ([`must_keep_worker`](Self::must_keep_worker)); once it need not (the
    /// queue emptied by a cancel, or drained), it is claimed, so it looks
    /// again and retires: termination does not wait for its keep-alive.
    pub(crate) fn release_kept_worker(&mut self, after: &mut After) {
        if self.shutdown && !self.must_keep_worker() {
            self.claim_all_parked(after);
        }
    }

    /// Claims every parked worker: each is unparked after unlocking,
    /// counted as searching, and looks at the queue again.
    pub(crate) fn claim_all_parked(&mut self, after: &mut After) {
        while let Some(key) = self.parked.pop_back(&mut self.parked_list) {
            if let Some(p) = self.parked.remove(key) {
                self.searching += 1;
                after.unpark.push(p.thread);
            }
        }
        self.publish_workers();
    }

    /// A worker counted by [`Worker::Spawn`] could not be spawned.
    pub(crate) fn spawn_failed(&mut self) {
        self.workers -= 1;
        self.searching -= 1;
        self.counts.spawn_failures += 1;
        self.spawn_blocked = true;
        self.publish_workers();
        self.refresh_intake();
    }

    /// A worker counted by [`Worker::Spawn`] was spawned.
    pub(crate) fn spawn_succeeded(&mut self) {
        self.spawn_blocked = false;
        self.refresh_intake();
    }

    /// Counts a job refused because no worker could be spawned for it.
    pub(crate) fn count_spawn_refusal(&mut self) {
        self.counts.rejected_spawn += 1;
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
        self.publish_workers();
    }

    /// The worker stops searching (it took a job, parks or retires).
    pub(crate) fn end_search(&mut self) {
        self.searching -= 1;
        self.publish_workers();
    }

    pub(crate) fn searching(&self) -> usize {
        self.searching
    }

    /// The worker `id` parks; returns the key it finds itself under.
    pub(crate) fn park(&mut self, id: u64, thread: thread::Thread) -> Key {
        let key = self.parked.insert(Parked { id, thread });
        self.parked.push_back(&mut self.parked_list, key);
        self.publish_workers();
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
        self.publish_workers();
    }

    /// Whether any worker thread is alive.
    pub(crate) fn has_workers(&self) -> bool {
        self.workers > 0
    }

    /// Transition *retire*: a worker leaves the pool's count as its last
    /// act under the lock. Returns the handles of threads that retired
    /// before it, for it to join after unlocking (so that at most one
    /// retired thread is ever left unjoined, however long the pool lives).
    pub(crate) fn retire(&mut self, slot: Key, after: &mut After) -> Vec<thread::JoinHandle<()>> {
        self.workers -= 1;
        self.publish_workers();
        self.refresh_intake();
        let earlier = self.thread_exit(slot);
        self.settle_check(after);
        earlier
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
    /// being joined.
    fn thread_exit(&mut self, slot: Key) -> Vec<thread::JoinHandle<()>> {
        let earlier = self.take_exited();
        if let Some(Some(handle)) = self.threads.remove(slot) {
            self.exited.push(handle);
        }
        earlier
    }

    /// Takes the handles of retired threads for the caller to join; call
    /// [`State::joined`] after joining them.
    pub(crate) fn take_exited(&mut self) -> Vec<thread::JoinHandle<()>> {
        let handles = std::mem::take(&mut self.exited);
        self.joining += handles.len();
        handles
    }

    /// `n` handles taken by [`State::take_exited`] were settled: joined,
    /// or (`back`, the joiner's own) returned to the exited list.
    pub(crate) fn joined(
        &mut self,
        n: usize,
        back: Option<thread::JoinHandle<()>>,
        after: &mut After,
    ) {
        self.joining -= n;
        self.exited.extend(back);
        self.settle_check(after);
    }

    /// Marks the monitor thread started; `false` if it already runs.
    pub(crate) fn monitor_starting(&mut self) -> bool {
        !std::mem::replace(&mut self.monitor, true)
    }

    /// Marks the delivery thread started; `false` if it already runs, or
    /// if it has nothing to do: the pool is shut down and every event is
    /// delivered (a refused job or a second shutdown starts no thread, and a
    /// terminated pool stays terminated).
    pub(crate) fn delivery_starting(&mut self) -> bool {
        if !self.observe || self.delivery || (self.shutdown && self.events.is_drained()) {
            return false;
        }
        self.delivery = true;
        true
    }

    /// The delivery thread in `slot` exits; returns earlier retirees to
    /// join. `None` (and it stays) while events may still come: until the
    /// pool is shut down, idle and without workers.
    pub(crate) fn delivery_exit(
        &mut self,
        slot: Key,
        after: &mut After,
    ) -> Option<Vec<thread::JoinHandle<()>>> {
        if !self.workers_done() {
            return None;
        }
        self.delivery = false;
        let earlier = self.thread_exit(slot);
        self.settle_check(after);
        Some(earlier)
    }

    /// The delivery thread could not start.
    pub(crate) fn delivery_gone(&mut self) {
        self.delivery = false;
    }

    /// The monitor could not start.
    pub(crate) fn monitor_gone(&mut self, after: &mut After) {
        self.monitor = false;
        self.settle_check(after);
    }

    /// The monitor in `slot` exits; returns earlier retirees to join.
    pub(crate) fn monitor_exit(
        &mut self,
        slot: Key,
        after: &mut After,
    ) -> Vec<thread::JoinHandle<()>> {
        self.monitor = false;
        let earlier = self.thread_exit(slot);
        self.settle_check(after);
        earlier
    }
}
