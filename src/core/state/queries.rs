//! What is read from [`State`] under the lock for reports: the running
//! jobs (of the pool or of a group), newly stuck jobs, whether a job is in
//! a group, and the metrics snapshot (S3).

use std::time::Duration;

use super::State;
use crate::core::metrics::Metrics;
use crate::core::report::RunningJob;
use crate::job::cell::Task;
use crate::job::id::RUNNING;
use crate::util::slab::Key;
use crate::util::sync::Arc;

impl State {
    /// The running jobs of group `key` and its descendants.
    pub(crate) fn group_running_jobs(&self, key: Key) -> Vec<RunningJob> {
        self.groups
            .members(key)
            .into_iter()
            .filter_map(|job| self.jobs.get(job))
            .filter(|task| task.core().state_word() == RUNNING)
            .map(|task| RunningJob::of(task.core()))
            .collect()
    }

    /// Whether the job of slab key `job` (queued or running) belongs to
    /// group `key` or one of its descendants.
    pub(crate) fn job_in_group(&self, job: Key, key: Key) -> bool {
        self.jobs
            .get(job)
            .and_then(|t| t.core().membership().map(|m| m.group))
            .is_some_and(|member| self.groups.within(member, key))
    }

    /// The running jobs, for the report and the monitor.
    pub(crate) fn running_jobs(&self) -> Vec<RunningJob> {
        self.jobs
            .iter(&self.running)
            .map(|task| RunningJob::of(task.core()))
            .collect()
    }

    /// The running jobs that have run longer than `threshold` and were not
    /// reported yet, now marked reported (the monitor's scan: O(running)).
    /// The caller logs them, and drops the references, after unlocking.
    pub(crate) fn newly_stuck(&self, threshold: Duration) -> Vec<Arc<dyn Task>> {
        self.jobs
            .iter(&self.running)
            .filter(|task| task.core().clock() > threshold && task.core().mark_stuck_reported())
            .cloned()
            .collect()
    }

    /// The metrics, copied under the lock (S3).
    pub(crate) fn snapshot(&self) -> Metrics {
        let c = &self.counts;
        Metrics {
            accepted: c.accepted,
            rejected_full: c.rejected_full,
            rejected_timed_out: c.rejected_timed_out,
            rejected_overload: c.rejected_overload,
            rejected_shutdown: c.rejected_shutdown,
            rejected_spawn: c.rejected_spawn,
            rejected_observer: c.rejected_observer,
            events_delivered: self.events.delivered(),
            events_pending: self.events.lag() as u64,
            spawn_failures: c.spawn_failures,
            queued: self.queued as u64,
            running: self.running.len() as u64,
            completed: c.completed,
            panicked: c.panicked,
            cancelled: c.cancelled,
            unstarted: c.unstarted,
            shed: c.shed,
            callers_timed_out: c.callers_timed_out,
            callers_dropped: c.callers_dropped,
            running_after_caller_left: c.running_after_caller_left,
            stop_requests: c.stop_requests,
            max_running: c.max_running,
            workers: self.workers.live() as u64,
            queue_wait_total: c.queue_wait_total,
            run_time_total: c.run_time_total,
        }
    }
}
