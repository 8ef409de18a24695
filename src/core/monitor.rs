//! The stuck-job monitor: a pool thread (spawned by the first job when
//! `Builder::stuck_after` is set) that reports each job running longer than
//! the threshold once, at `warn`, outside the pool lock, and retires with
//! the pool's last worker after a shutdown.

use std::time::Duration;

use crate::core::pool::Inner;
use crate::core::state::{After, Wait};
use crate::core::waits::Waiting;
use crate::util::quiet::drop_quietly;
use crate::util::slab::Key;
use crate::util::sync::Arc;

impl Inner {
    /// The stuck-job monitor: reports each job running longer than
    /// `stuck_after` once at `warn`; exits when the pool has shut down, is
    /// idle and has no worker left.
    pub(crate) fn monitor_loop(self: Arc<Self>, slot: Key) {
        let threshold = self.config.stuck_after.unwrap_or(Duration::MAX);
        let tick = monitor_tick(threshold);
        // Counted as a waiter so that the last worker's exit wakes it.
        let registered = Waiting::new(&self, Wait::Settle);
        let mut s = self.lock();
        while !s.workers_done() {
            let stuck = s.newly_stuck(threshold);
            drop(s);
            for task in stuck {
                let core = task.core();
                // A tracing subscriber is foreign code: its panic must not
                // end this thread (termination waits for it).
                crate::util::quiet::quietly(|| {
                    tracing::warn!(
                        parent: &core.span(),
                        running_for = ?core.clock(),
                        stop_requested = core.is_stop_requested(),
                        "job is stuck: it has run longer than the stuck_after threshold"
                    );
                });
                drop_quietly(task);
            }
            s = self.lock();
            if s.workers_done() {
                break;
            }
            s = match self.changed.wait_timeout(s, tick) {
                Ok((g, _)) => g,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        drop(s);
        drop(registered);
        let mut after = After::default();
        let earlier = self.lock().monitor_exit(slot, &mut after);
        self.after(after);
        self.join(earlier);
    }
}

/// How often the monitor looks: a quarter of the threshold, between 10 ms
/// and 1 s.
fn monitor_tick(threshold: Duration) -> Duration {
    (threshold / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}
