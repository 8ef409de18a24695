//! Leaf module: what a caller's departure means for its job.

/// What happens to a job when the caller awaiting it stops waiting (its
/// [`with_timeout`](crate::Offload::with_timeout) passes or its future is dropped)
/// before the job finished.
///
/// Waiting is not owning: whatever the policy, the permit stays held until
/// the function really returns. Set on the
/// [`Builder`](crate::Builder::abandon_policy), overridable per call with
/// [`Offload::on_abandon`](crate::Offload::on_abandon). Applies to a directly awaited offload; an owner
/// [`JobHandle`](crate::JobHandle) that is dropped always detaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum AbandonPolicy {
    /// The job goes on: a queued job still runs, a running one runs to
    /// completion; its outcome is recorded in the metrics.
    #[default]
    Keep,
    /// A queued job is cancelled and never runs; a running one goes on.
    CancelIfQueued,
    /// A queued job is cancelled; a running one gets its stop token set
    /// (and keeps its permit until the function returns).
    CancelAndStop,
}

/// Why a caller stopped waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Departure {
    /// Its timeout passed.
    TimedOut,
    /// Its future was dropped.
    Dropped,
}

/// What dropping the last handle to a [`JobGroup`](crate::JobGroup) does to
/// its jobs (and its descendants' jobs). Set with
/// [`JobGroup::on_drop`](crate::JobGroup::on_drop).
///
/// Whatever the policy, a running function keeps its permit until it
/// really returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum GroupDropPolicy {
    /// The jobs go on: queued ones still run, running ones run to
    /// completion; owner handles still deliver their outcomes.
    #[default]
    LetRun,
    /// As [`JobGroup::stop`](crate::JobGroup::stop): queued jobs are
    /// cancelled, running ones get their stop token set.
    Stop,
}
