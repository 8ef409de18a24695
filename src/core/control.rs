//! Job control on the pool: cancelling a queued job, requesting stop, a
//! caller leaving, and settling outcomes published outside the lock. Each
//! is a state transition (`state/transitions.rs`) plus the work after
//! unlocking (discarding a function, stop callbacks, tracing).

use crate::core::pool::Inner;
use crate::core::state::After;
use crate::job::cell::Task;
use crate::job::id::JobState;
use crate::job::policy::Departure;
use crate::job::record::JobCore;
use crate::util::sync::Arc;

impl Inner {
    /// Cancels job `task` if it is still queued; `true` if this call did it.
    pub(crate) fn cancel(&self, task: &dyn Task) -> bool {
        let core = task.core();
        // A job never returns to `Queued`: if it has left, the cancel fails
        // without the lock. Otherwise this read also takes the job's cache
        // miss before the lock, not while holding it.
        if core.state() != JobState::Queued {
            return false;
        }
        let mut after = After::default();
        if !self.lock().cancel_queued(core, &mut after) {
            return false;
        }
        self.after(after);
        tracing::debug!(parent: &core.span(), "cancelled before start");
        task.discard();
        self.published_one(core);
        true
    }

    /// Requests stop on job `task`; `true` if this call made the request
    /// while the job was unfinished.
    pub(crate) fn stop(&self, task: &dyn Task) -> bool {
        if task.core().state().is_terminal() || !crate::job::stop::request_stop(task) {
            return false;
        }
        self.lock().stop_requested();
        tracing::debug!(parent: &task.core().span(), "stop requested");
        true
    }

    /// Transition *caller-left*: a caller stopped waiting for `core`.
    /// `false` if the job had already finished: nothing is recorded.
    pub(crate) fn caller_left(&self, core: &JobCore, why: Departure) -> bool {
        let mut after = After::default();
        let left = self.lock().caller_left(core, why, &mut after);
        self.after(after);
        left
    }

    /// Discards the functions of jobs cancelled under the lock and settles
    /// their outcomes.
    pub(crate) fn discard_cancelled(&self, tasks: Vec<Arc<dyn Task>>) {
        if tasks.is_empty() {
            return;
        }
        for task in &tasks {
            task.discard();
        }
        let groups = tasks
            .iter()
            .filter_map(|t| t.core().membership().map(|m| m.group));
        let mut after = After::default();
        self.lock().published_many(tasks.len(), groups, &mut after);
        self.after(after);
        crate::util::quiet::drop_quietly(tasks);
    }

    /// Settles the outcome of the job `core`, published outside the lock.
    pub(crate) fn published_one(&self, core: &JobCore) {
        let mut after = After::default();
        self.lock()
            .published_one(core.membership().map(|m| m.group), &mut after);
        self.after(after);
    }
}
