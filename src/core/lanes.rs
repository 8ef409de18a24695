//! The pool's side of keyed lanes and shared limiters: the busiest keys,
//! a limiter's wake-up reaching this pool, and finding a worker for a lane
//! that became startable outside a worker's or a submitter's path. The
//! lanes themselves live in the locked state (`state/lanes.rs`, L1–L5).

use crate::core::pool::{Inner, Offloader};
use crate::core::state::After;

impl Offloader {
    /// The `n` keys ([`Offload::key`](crate::Offload::key)) with the most jobs
    /// queued and running now, busiest first.
    ///
    /// Keys without a job are not kept. Costs O(keys in use) under the pool's
    /// lock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = offloader::Offloader::builder().max_per_key(1).build()?;
    /// let (started, is_started) = std::sync::mpsc::channel();
    /// let (release, rx) = std::sync::mpsc::channel::<()>();
    /// let held = pool
    ///     .offload(move |_stop| {
    ///         started.send(()).ok();
    ///         rx.recv()
    ///     })
    ///     .key("tenant-a")
    ///     .spawn()?;
    /// is_started.recv()?;
    /// let queued = pool.offload(|_stop| ()).key("tenant-a").spawn()?;
    /// let busiest = &pool.key_stats(10)[0];
    /// assert_eq!(busiest.key.to_string(), "tenant-a");
    /// assert_eq!((busiest.running, busiest.queued), (1, 1));
    /// release.send(())?;
    /// held.await?.ok();
    /// queued.await?;
    /// # Ok(()) }
    /// ```
    pub fn key_stats(&self, n: usize) -> Vec<crate::job::lane::KeyStats> {
        self.inner().lock().key_stats(n)
    }
}

impl Inner {
    /// Makes sure a worker will look at the queue if a lane became
    /// startable outside a worker's or a submitter's path (a limiter's
    /// permit came back, a wake-up passed on: lanes.rs L4).
    pub(crate) fn find_worker_for_lanes(&self) {
        let Some(me) = self.me() else {
            return;
        };
        let mut after = After::default();
        let mut s = self.lock();
        if s.has_startable() {
            let worker = s.workers.find();
            if let Err(e) = me.provide_worker(&mut s, worker, &mut after) {
                tracing::debug!(error = %e, "could not spawn a worker for a lane a limiter freed; queued jobs wait for busy ones");
            }
        }
        drop(s);
        self.after(after);
    }
}

impl crate::job::limiter::Watcher for Inner {
    fn limiter_freed(&self, limiter: &crate::job::limiter::Limiter) {
        let mut after = After::default();
        self.lock().limiter_freed(limiter, &mut after);
        self.after(after);
    }

    fn hold_clock_again(&self) {
        self.clock_holds.wake_if_dormant();
    }
}
