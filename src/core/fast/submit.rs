//! The submitter's side of the intake ([`super::intake`]): a plain job
//! accepted without the pool lock. What comes after, waking a worker if
//! none searches, takes the lock and is the pool's (`Inner::pass_intake`).

use super::intake::{Intake, QueueCount};
use crate::job::cell::Task;
use crate::util::sync::Arc;

/// A job that passed the intake.
pub(crate) struct Passed {
    /// No worker searches and one could be woken: the submitter must wake
    /// one, under the pool lock (inv. 2 of [`super::intake`]).
    pub(crate) needs_worker: bool,
    /// The job, kept for its "accepted" log line if that can be shown: a
    /// clone is a read-modify-write per job.
    pub(crate) accepted: Option<Arc<dyn Task>>,
}

impl Intake {
    /// Transition *accept* through the intake, without the pool lock, for
    /// a plain job while the intake is open and the queue (counted by
    /// `count`) has room below `capacity` (inv. 1 of [`super::intake`]);
    /// the job is handed back otherwise, to go through the lock.
    pub(crate) fn pass(
        &self,
        count: &QueueCount,
        capacity: usize,
        task: Arc<dyn Task>,
        cancelled: bool,
    ) -> Result<Passed, Arc<dyn Task>> {
        // A group's admission (stopped? closed?) is decided with the job's
        // accept, under the lock; so is a job cancelled as it is accepted,
        // and one judged for its deadline (state/overload.rs).
        let core = task.core();
        if cancelled || core.membership().is_some() || core.shed_deadline().is_some() {
            return Err(task);
        }
        if !count.reserve_at_intake(capacity) {
            return Err(task);
        }
        // Nothing foreign between the reservation and the push (a tracing
        // subscriber may call into the pool, or panic): a closer waits for
        // the push under the pool lock (inv. 1). And the log lines come
        // last, after the job has its worker.
        let accepted = crate::util::quiet::may_log(tracing::Level::TRACE).then(|| task.clone());
        crate::job::limiter::count_joined(core.limiters());
        if let Err(task) = self.push(task) {
            // The intake is full (inv. 3): the place goes back, and the job
            // through the lock, whose holder empties the intake first.
            crate::job::limiter::count_unjoined(task.core().limiters());
            count.unreserve();
            return Err(task);
        }
        Ok(Passed {
            needs_worker: self.needs_worker(),
            accepted,
        })
    }
}
