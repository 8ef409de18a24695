//! The submitter's side of the intake (intake.rs): a plain job accepted
//! without the pool lock.

use crate::job::Task;
use crate::pool::Inner;
use crate::state::After;
use crate::sync::Arc;

impl Inner {
    /// Transition *accept* through the intake, without the pool lock, for
    /// a plain job while the intake is open and the queue has room
    /// (intake.rs inv. 1); the job is handed back otherwise. A job appended
    /// wakes a worker if none searches and one can be woken (inv. 2).
    pub(crate) fn pass_intake(
        self: &Arc<Self>,
        task: Arc<dyn Task>,
        cancelled: bool,
    ) -> Result<(), Arc<dyn Task>> {
        let Some(intake) = &self.intake else {
            return Err(task);
        };
        // A group's admission (stopped? closed?) is decided with the job's
        // accept, under the lock; so is a job cancelled as it is accepted.
        let core = task.core();
        if cancelled || core.membership().is_some() {
            return Err(task);
        }
        if !self
            .queue_count
            .reserve_at_intake(self.config.queue_capacity)
        {
            return Err(task);
        }
        // Nothing foreign between the reservation and the push (a tracing
        // subscriber may call into the pool, or panic): a closer waits for
        // the push under the pool lock (intake.rs inv. 1). And the log
        // lines come last, after the job has its worker.
        // Kept for the "accepted" line only if it can be shown: a clone
        // is a read-modify-write per job.
        let accepted = crate::quiet::may_log(tracing::Level::TRACE).then(|| task.clone());
        crate::limiter::count_joined(core.limiters());
        if let Err(task) = intake.push(task) {
            // The intake is full (inv. 3): the place goes back, and the job
            // through the lock, whose holder empties the intake first.
            crate::limiter::count_unjoined(task.core().limiters());
            self.queue_count.unreserve();
            return Err(task);
        }
        let mut spawn_error = None;
        if intake.needs_worker() {
            let mut after = After::default();
            spawn_error = {
                let mut s = self.lock();
                if s.has_startable() {
                    let worker = s.find_worker();
                    self.provide_worker(&mut s, worker, &mut after).err()
                } else {
                    None
                }
            };
            self.after(after);
        }
        // A paused test clock let go while the work stalled is held again
        // (clock.rs), as after any transition that can end a stall.
        self.clock_holds.wake_if_dormant();
        if let Some(accepted) = accepted {
            tracing::trace!(parent: &accepted.core().span(), "accepted");
        }
        if let Some(e) = spawn_error {
            tracing::warn!(error = %e, "could not spawn another worker thread; the job waits for a busy one");
        }
        Ok(())
    }
}
