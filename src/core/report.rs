//! What shutdown and inspection report: data, not only log lines.

use std::fmt;
use std::time::Duration;

use crate::job::error::Pretty;
use crate::job::id::JobId;
use crate::job::record::JobCore;

/// A job that an immediate shutdown removed from the queue; its function never
/// ran.
///
/// Its owner handle resolves to
/// [`Error::ShuttingDown`](crate::Error::ShuttingDown) with its id.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnstartedJob {
    /// The job's id.
    pub id: JobId,
    /// The job's name, if it had one.
    pub name: Option<std::sync::Arc<str>>,
    /// The job's key ([`Offload::key`](crate::Offload::key)), if it had one.
    pub key: Option<crate::job::lane::LaneKey>,
    /// How long it had waited in the queue.
    pub queued_for: Duration,
}

/// A job whose function is running now.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunningJob {
    /// The job's id.
    pub id: JobId,
    /// The job's name, if it had one.
    pub name: Option<std::sync::Arc<str>>,
    /// The job's key ([`Offload::key`](crate::Offload::key)), if it has one.
    pub key: Option<crate::job::lane::LaneKey>,
    /// How long the function has been running.
    pub running_for: Duration,
    /// Whether stop has been requested through its token.
    pub stop_requested: bool,
    /// Whether a caller's future or an owner handle for it still exists
    /// (somebody may still collect the outcome).
    pub caller_waiting: bool,
    /// Whether an awaiting caller stopped waiting (timed out or dropped its
    /// future) while the job was unfinished: the job outlives its caller.
    pub caller_left: bool,
}

/// What a staged [`Offloader::close`](crate::Offloader::close) did and left
/// behind.
///
/// Data, not only a log line.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CloseReport {
    /// Jobs whose function returned during the close.
    pub completed: u64,
    /// Jobs whose function panicked during the close.
    pub panicked: u64,
    /// Jobs handed back unstarted by the immediate stage (empty if the
    /// graceful stage sufficed).
    pub unstarted: Vec<UnstartedJob>,
    /// Jobs still running when the close gave up: their functions ignored
    /// the stop request for the whole second budget, and still hold their
    /// permits.
    pub still_running: Vec<RunningJob>,
    /// Whether the immediate stage was needed.
    pub escalated: bool,
    /// Whether the pool terminated within the budgets.
    ///
    /// `false` with nothing in `still_running` means its threads were still
    /// exiting (thread-local destructors) when the budgets ran out: a wait for
    /// [`terminated`](crate::Offloader::terminated) then ends soon.
    pub terminated: bool,
    /// How long the close took.
    pub took: Duration,
}

impl fmt::Display for CloseReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "close {} after {}: {} completed, {} panicked, {} returned unstarted, {} still running",
            if self.terminated {
                "terminated"
            } else {
                "gave up"
            },
            Pretty(self.took),
            self.completed,
            self.panicked,
            self.unstarted.len(),
            self.still_running.len()
        )?;
        for job in &self.still_running {
            write!(f, "\n  still running: job {}", job.id)?;
            if let Some(name) = &job.name {
                write!(f, " {name:?}")?;
            }
            write!(
                f,
                " for {}, stop requested: {}",
                Pretty(job.running_for),
                job.stop_requested
            )?;
        }
        Ok(())
    }
}

impl RunningJob {
    /// What a running job's core says about it now.
    pub(crate) fn of(core: &JobCore) -> RunningJob {
        RunningJob {
            id: core.id,
            name: core.name().cloned(),
            key: core.lane_key().cloned(),
            running_for: core.clock(),
            stop_requested: core.is_stop_requested(),
            caller_waiting: core.caller_waiting(),
            caller_left: core.caller_left(),
        }
    }
}

impl UnstartedJob {
    /// What an unstarted job's core says about it, as of `now` (one clock
    /// read for a whole drained queue).
    pub(crate) fn of(core: &JobCore, now: u64) -> UnstartedJob {
        UnstartedJob {
            id: core.id,
            name: core.name().cloned(),
            key: core.lane_key().cloned(),
            queued_for: core.clock_at(now),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A still-running job is shown with its name if it has one, and
    /// without an empty `""` if not (a hostile review found the latter).
    #[test]
    fn a_close_report_names_only_named_jobs() {
        let job = |id, name: Option<&str>| RunningJob {
            id: JobId(id),
            name: name.map(Into::into),
            key: None,
            running_for: Duration::from_secs(2),
            stop_requested: true,
            caller_waiting: false,
            caller_left: false,
        };
        let report = CloseReport {
            completed: 1,
            panicked: 0,
            unstarted: Vec::new(),
            still_running: vec![job(7, None), job(8, Some("fetch"))],
            escalated: true,
            terminated: false,
            took: Duration::from_secs(3),
        };
        let text = report.to_string();
        assert!(text.contains("still running: job #7 for "), "{text}");
        assert!(
            text.contains("still running: job #8 \"fetch\" for "),
            "{text}"
        );
        assert!(!text.contains("\"\""), "{text}");
    }
}
