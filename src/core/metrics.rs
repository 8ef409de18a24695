//! One consistent snapshot of what the offloader has done.
//!
//! Every counter lives in the pool's shared state and changes under the same
//! lock as the job transition it counts, and a snapshot is copied under that
//! lock. So `accepted = queued + running + terminal` holds exactly in every
//! snapshot, not approximately.

use std::time::Duration;

/// A consistent snapshot of an [`Offloader`](crate::Offloader)'s counters,
/// from [`Offloader::metrics`](crate::Offloader::metrics).
///
/// ```
/// let pool = offloader::Offloader::builder().build().unwrap();
/// let m = pool.metrics();
/// assert_eq!(m.accepted, m.queued + m.running + m.terminal());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Metrics {
    /// Jobs accepted since the offloader was built.
    pub accepted: u64,
    /// Jobs refused at once because the queue was full
    /// ([`Error::Full`](crate::Error::Full)).
    pub rejected_full: u64,
    /// Callers whose timeout passed while they waited for room in a full
    /// queue (or for a lagging observer): their jobs were never accepted
    /// ([`Error::TimedOut`](crate::Error::TimedOut) with `id: None`).
    pub rejected_timed_out: u64,
    /// Jobs refused because they could not finish before their deadline
    /// behind the jobs ahead of them, at the pool's recent run times
    /// ([`Error::Overloaded`](crate::Error::Overloaded) with `id: None`).
    pub rejected_overload: u64,
    /// Jobs refused because the offloader was shutting down.
    pub rejected_shutdown: u64,
    /// Jobs refused because no worker thread could be spawned.
    pub rejected_spawn: u64,
    /// Jobs refused because the lifecycle observer had fallen more than
    /// `observer_lag` events behind (`spawn` only; awaiting forms wait).
    pub rejected_observer: u64,
    /// Lifecycle events delivered to the observer so far.
    pub events_delivered: u64,
    /// Lifecycle events not yet delivered: how far the observer lags.
    pub events_pending: u64,
    /// Worker threads the OS refused to spawn while a job was accepted
    /// anyway, because a worker already existed to run it later (the job
    /// waited for a busy worker instead of being refused).
    pub spawn_failures: u64,
    /// Accepted jobs waiting in the queue now.
    pub queued: u64,
    /// Functions running now (permits held).
    pub running: u64,
    /// Terminal: the function returned.
    pub completed: u64,
    /// Terminal: the function panicked.
    pub panicked: u64,
    /// Terminal: cancelled while queued; never ran.
    pub cancelled: u64,
    /// Terminal: handed back unstarted by an immediate shutdown.
    pub unstarted: u64,
    /// Terminal: shed at its turn, too near its deadline to finish
    /// ([`JobState::Shed`](crate::JobState::Shed)); never ran.
    pub shed: u64,
    /// Callers whose timeout passed before the outcome of their accepted
    /// job: an awaited offload's, or an owner handle's
    /// [`with_timeout`](crate::Offload::with_timeout) (not a timeout
    /// around `&mut handle`, which keeps the handle waiting).
    pub callers_timed_out: u64,
    /// Awaiting callers that dropped their future before the outcome, and
    /// owner handles dropped before it under a policy that cancels (a
    /// handle dropped under [`Keep`](crate::AbandonPolicy::Keep), or
    /// detached, is not counted).
    pub callers_dropped: u64,
    /// Of those, jobs that were running when their caller left.
    pub running_after_caller_left: u64,
    /// Stop requests that took effect (first request per job) made through the
    /// pool: a handle's `stop` or `cancel`, a group's stop, an abandon policy,
    /// `stop_on`, `shutdown_now`.
    ///
    /// A function that calls
    /// [`StopToken::request_stop`](crate::StopToken::request_stop) on its own
    /// token (or a clone of it) sets its flag without the pool, and is not
    /// counted here.
    pub stop_requests: u64,
    /// The most functions ever running at the same instant.
    pub max_running: u64,
    /// Worker threads alive now.
    pub workers: u64,
    /// Total time accepted jobs spent queued before they started.
    pub queue_wait_total: Duration,
    /// Total time functions spent running, over finished jobs.
    pub run_time_total: Duration,
}

impl Metrics {
    /// Jobs in a terminal state: completed, panicked, cancelled, unstarted
    /// or shed.
    pub fn terminal(&self) -> u64 {
        self.completed + self.panicked + self.cancelled + self.unstarted + self.shed
    }

    /// Jobs refused for any reason.
    pub fn rejected(&self) -> u64 {
        self.rejected_full
            + self.rejected_timed_out
            + self.rejected_overload
            + self.rejected_shutdown
            + self.rejected_spawn
            + self.rejected_observer
    }

    /// `true` if `accepted = queued + running + terminal` holds. It always
    /// does; the crate's own tests assert it.
    #[cfg(any(test, loom))]
    pub(crate) fn ledger_balances(&self) -> bool {
        self.accepted == self.queued + self.running + self.terminal()
    }
}

/// A consistent snapshot of a [`JobGroup`](crate::JobGroup)'s counters, from
/// [`JobGroup::metrics`](crate::JobGroup::metrics).
///
/// They cover the jobs offloaded through the group *and through its
/// descendants*, and change under the pool lock with the job transitions they
/// count, so `accepted = queued + running + terminal` holds in every snapshot,
/// as for the pool's [`Metrics`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = offloader::Offloader::builder().build()?;
/// let group = pool.group();
/// group.offload(|_stop| 1).await?;
/// let m = group.metrics();
/// assert_eq!((m.accepted, m.completed), (1, 1));
/// assert_eq!(m.accepted, m.queued + m.running + m.terminal());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupMetrics {
    /// Jobs accepted through the group or a descendant.
    pub accepted: u64,
    /// Jobs refused because the group they were offered to (or an ancestor) was
    /// stopped or closing.
    ///
    /// Counted there and in every ancestor, as `accepted` is; other refusals (a
    /// full queue, a pool shutting down) are counted in the pool's [`Metrics`]
    /// only.
    pub rejected: u64,
    /// Of the accepted jobs, those waiting in the queue now.
    pub queued: u64,
    /// Of the accepted jobs, those whose function runs now (permits held).
    pub running: u64,
    /// Terminal: the function returned.
    pub completed: u64,
    /// Terminal: the function panicked.
    pub panicked: u64,
    /// Terminal: cancelled while queued (by a handle or a group stop).
    pub cancelled: u64,
    /// Terminal: handed back unstarted by an immediate shutdown of the pool.
    pub unstarted: u64,
    /// Terminal: shed at its turn, too near its deadline to finish.
    pub shed: u64,
    /// Whether the group has been stopped.
    pub stopped: bool,
    /// Whether the group refuses new jobs (stopped, or a close began).
    pub closed: bool,
}

impl GroupMetrics {
    /// Jobs in a terminal state: completed, panicked, cancelled, unstarted
    /// or shed.
    pub fn terminal(&self) -> u64 {
        self.completed + self.panicked + self.cancelled + self.unstarted + self.shed
    }

    /// `true` if `accepted = queued + running + terminal` holds. It always
    /// does; the crate's own tests assert it.
    #[cfg(any(test, loom))]
    pub(crate) fn ledger_balances(&self) -> bool {
        self.accepted == self.queued + self.running + self.terminal()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The sums add up the fields they name, each once (distinct powers of
    /// two, so that a field left out, counted twice or subtracted shows).
    #[test]
    fn the_sums_add_up_their_fields() {
        let mut m = Metrics {
            rejected_full: 1,
            rejected_shutdown: 2,
            rejected_spawn: 4,
            rejected_observer: 8,
            rejected_timed_out: 1 << 13,
            rejected_overload: 1 << 14,
            callers_timed_out: 16,
            callers_dropped: 32,
            completed: 64,
            panicked: 128,
            cancelled: 256,
            unstarted: 512,
            shed: 4096,
            queued: 1024,
            running: 2048,
            ..Metrics::default()
        };
        assert_eq!(m.rejected(), 15 + (1 << 13) + (1 << 14));
        assert_eq!(m.terminal(), 960 + 4096);
        m.accepted = 1024 + 2048 + 960 + 4096;
        assert!(m.ledger_balances());
        m.accepted += 1;
        assert!(!m.ledger_balances());

        let mut g = GroupMetrics {
            completed: 1,
            panicked: 2,
            cancelled: 4,
            unstarted: 8,
            shed: 64,
            queued: 16,
            running: 32,
            ..GroupMetrics::default()
        };
        assert_eq!(g.terminal(), 15 + 64);
        g.accepted = 63 + 64;
        assert!(g.ledger_balances());
        g.accepted = 62 + 64;
        assert!(!g.ledger_balances());
    }
}
