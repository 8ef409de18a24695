//! Leaf module: what a caller's departure means for its job.

/// What happens to a job when the caller awaiting it stops waiting (its
/// [`with_timeout`](crate::Offload::with_timeout) passes or its future is dropped)
/// before the job finished.
///
/// Waiting is not owning: whatever the policy, the permit stays held until
/// the function really returns. Set on the
/// [`Builder`](crate::Builder::abandon_policy), overridable per call with
/// [`Offload::on_abandon`](crate::Offload::on_abandon). Applies to a directly
/// awaited offload and to an owner [`JobHandle`](crate::JobHandle) alike: its
/// holder leaves when its timeout passes or it is dropped
/// ([`JobHandle::detach`](crate::JobHandle::detach) keeps the job).
///
/// A policy that cancels also says the job is unwanted late: with a
/// deadline, the pool refuses or sheds it when it cannot finish in time
/// (the guide's "Sizing and overload").
///
/// # Why the default is `Keep`
///
/// A caller's timeout or drop ends its *wait*; it changes what the *job*
/// does only when somebody asked for that (the crate's second promise).
/// A future dropped by a `select!` that took another branch, or a timeout
/// chosen for how long a user will wait, says nothing about whether the
/// work itself should happen: a write, a file moved, a payment recorded.
/// Cancelling it by default would lose work silently that nobody chose
/// to lose, depending on timing. `Keep` is also what tokio's
/// `spawn_blocking` does with a dropped `JoinHandle`. So the default keeps
/// the job, and the error says so ([`Fate::Kept`](crate::Fate::Kept)).
///
/// # In a service, choose explicitly
///
/// A request handler whose caller gave up wants no work done for it: with
/// `Keep`, a timed-out request's job stays queued, runs later, holds a
/// permit for an answer nobody reads, and under overload delays the
/// requests still waiting behind it. Set
/// [`CancelIfQueued`](AbandonPolicy::CancelIfQueued) on the builder (a
/// job that never started is dropped with its caller), or
/// [`CancelAndStop`](AbandonPolicy::CancelAndStop) when the functions
/// check their [`StopToken`](crate::StopToken) (a running one is told to
/// stop too):
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use offloader::{AbandonPolicy, Error, Fate, Offloader};
///
/// let pool = Offloader::builder()
///     .max_in_flight(1)
///     .abandon_policy(AbandonPolicy::CancelAndStop)
///     .build()?;
///
/// // The one permit is taken until `release` is sent.
/// let (release, held) = std::sync::mpsc::channel::<()>();
/// let busy = pool.offload(move |_stop| held.recv()).spawn()?;
///
/// // A request that gives up while its job waits for the permit: its job
/// // is cancelled and never runs.
/// let answer = pool
///     .offload(|_stop| "answer")
///     .with_timeout(Duration::from_millis(10))
///     .await;
/// assert!(matches!(answer, Err(Error::TimedOut { fate: Fate::Cancelled, .. })));
///
/// release.send(())?;
/// busy.await??;
/// pool.idle().await;
/// let m = pool.metrics();
/// assert_eq!((m.completed, m.cancelled), (1, 1)); // "answer" never ran
/// # Ok(()) }
/// ```
///
/// Per call, [`Offload::on_abandon`](crate::Offload::on_abandon) overrides
/// the pool's policy, for example `Keep` for the one write that must
/// happen whether or not its caller waits.
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

/// What dropping the last handle to a [`JobGroup`](crate::JobGroup) does to its
/// jobs (and its descendants' jobs).
///
/// Set with [`JobGroup::on_drop`](crate::JobGroup::on_drop).
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
