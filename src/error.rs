//! Errors. Every message says what happened to the *job*, not only to the
//! wait, because those are different facts (invariant 2).

use std::fmt;
use std::time::Duration;

use crate::id::{JobId, JobState};

/// What went wrong for one offloaded job, from its caller's or owner's side.
///
/// Each variant's message says what happened to the job itself, so a log
/// line like "timed out" never hides that the function is still running.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let pool = offloader::Offloader::builder().max_in_flight(1).build().unwrap();
/// let err = pool.offload(|_stop| -> () { panic!("boom") }).await.unwrap_err();
/// assert!(err.is_panic());
/// assert!(err.to_string().contains("boom"));
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller stopped waiting. The job itself went on as `fate` says.
    #[error("stopped waiting for job {id} after {}: it was still {state}; {fate}", Pretty(*.waited))]
    TimedOut {
        /// The job whose wait ended.
        id: JobId,
        /// How long the caller waited.
        waited: Duration,
        /// The job's state when the wait ended (queued or running).
        state: JobState,
        /// What happened to the job because the wait ended.
        fate: Fate,
    },
    /// The job was cancelled while queued; the function never ran.
    #[error("job {id} was cancelled before it started; the function never ran")]
    Cancelled {
        /// The cancelled job.
        id: JobId,
    },
    /// An immediate shutdown removed the job from the queue; the function
    /// never ran.
    #[error(
        "job {id} never started: the offloader shut down immediately and returned it unstarted"
    )]
    Unstarted {
        /// The job that was handed back.
        id: JobId,
    },
    /// The function panicked. The worker thread survived and the permit was
    /// released once the unwinding finished.
    #[error("job {id} panicked: {message}; the worker survived and the permit was released")]
    Panicked {
        /// The job that panicked.
        id: JobId,
        /// The panic message, if the payload was a string.
        message: String,
    },
    /// The job was never accepted, so the function never ran.
    #[error("job not accepted, the function never ran: {0}")]
    Rejected(#[from] Rejected),
    /// An [`OffloadFuture`](crate::OffloadFuture) was polled again after it
    /// had returned its result.
    #[error("the offload future was polled after it had completed")]
    PolledAfterCompletion,
    /// A function of this pool blocked waiting for a job of the same pool
    /// that is still queued, while every other permit the job needs is held
    /// by functions doing the same — the pool's permits, its key's
    /// ([`Offload::key`](crate::Offload::key)) when the waiting function has
    /// the same key, or a [`Limiter`](crate::Limiter)'s that both need: the
    /// job could never start, so the wait fails instead of hanging. The job
    /// itself stays queued.
    #[error("waiting for job {id} from inside its own pool would never return: it is queued and every permit it needs (of the pool, of its key, or of a limiter the waiting function holds too) is held by a function waiting for a queued job of the same pool (raise the limit, use another pool for the inner jobs, or return and await them from async code)")]
    WouldDeadlock {
        /// The job that was waited for.
        id: JobId,
    },
    /// The outcome was already taken from this handle by an earlier wait.
    #[error("the outcome of job {id} was already taken by an earlier wait")]
    OutcomeTaken {
        /// The job.
        id: JobId,
    },
}

impl Error {
    /// `true` for [`Error::TimedOut`]: the wait ended, the job did not
    /// necessarily.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::TimedOut { .. })
    }

    /// `true` for [`Error::Cancelled`] and [`Error::Unstarted`]: the function
    /// never ran.
    pub fn is_cancelled(&self) -> bool {
        matches!(self, Error::Cancelled { .. } | Error::Unstarted { .. })
    }

    /// `true` for [`Error::Panicked`].
    pub fn is_panic(&self) -> bool {
        matches!(self, Error::Panicked { .. })
    }

    /// `true` for [`Error::Rejected`]: the job was never accepted.
    pub fn is_rejected(&self) -> bool {
        matches!(self, Error::Rejected(_))
    }

    /// The same error again, for the next wait on a job whose outcome is an
    /// error: errors are repeatable, only a value is taken once.
    pub(crate) fn again(&self) -> Error {
        match self {
            Error::TimedOut {
                id,
                waited,
                state,
                fate,
            } => Error::TimedOut {
                id: *id,
                waited: *waited,
                state: *state,
                fate: *fate,
            },
            Error::Cancelled { id } => Error::Cancelled { id: *id },
            Error::Unstarted { id } => Error::Unstarted { id: *id },
            Error::Panicked { id, message } => Error::Panicked {
                id: *id,
                message: message.clone(),
            },
            Error::Rejected(r) => Error::Rejected(r.again()),
            Error::PolledAfterCompletion => Error::PolledAfterCompletion,
            Error::OutcomeTaken { id } => Error::OutcomeTaken { id: *id },
            Error::WouldDeadlock { id } => Error::WouldDeadlock { id: *id },
        }
    }

    /// The job this error is about, if it was ever accepted.
    pub fn job_id(&self) -> Option<JobId> {
        match self {
            Error::TimedOut { id, .. }
            | Error::Cancelled { id }
            | Error::Unstarted { id }
            | Error::Panicked { id, .. }
            | Error::OutcomeTaken { id }
            | Error::WouldDeadlock { id } => Some(*id),
            Error::Rejected(_) | Error::PolledAfterCompletion => None,
        }
    }
}

/// A duration for people: milliseconds with one decimal below ten seconds,
/// seconds with two above ("203.8ms", "12.35s"), instead of `Debug`'s
/// nanosecond precision.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pretty(pub(crate) Duration);

impl fmt::Display for Pretty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0.as_secs_f64();
        if secs < 10.0 {
            write!(f, "{:.1}ms", secs * 1e3)
        } else {
            write!(f, "{secs:.2}s")
        }
    }
}

/// What happened to a job when its caller stopped waiting for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fate {
    /// The job goes on (queued or running) under its owner; its outcome will
    /// be recorded.
    KeptRunning,
    /// The job was still queued and was cancelled: the function never runs.
    CancelledBeforeStart,
    /// The job was running and its stop token was set; it keeps its permit
    /// until the function returns.
    StopRequested,
    /// The job had already finished by the time the policy was applied.
    AlreadyFinished,
}

impl fmt::Display for Fate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fate::KeptRunning => "the job goes on under its owner and its outcome will be recorded",
            Fate::CancelledBeforeStart => "it was cancelled before it started and will never run",
            Fate::StopRequested => {
                "stop was requested; it holds its permit until the function returns"
            }
            Fate::AlreadyFinished => "it had already finished",
        })
    }
}

/// Why a job was not accepted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Rejected {
    /// The queue was full (the `try` form does not wait).
    #[error("the queue is full ({capacity} jobs waiting)")]
    Full {
        /// The queue's capacity.
        capacity: usize,
    },
    /// The caller's timeout passed while waiting for room in a full queue.
    #[error("the queue stayed full ({capacity} jobs waiting) until the caller's timeout passed, after waiting {}", Pretty(*.waited))]
    FullUntilTimeout {
        /// The queue's capacity.
        capacity: usize,
        /// How long the caller waited for room: its timeout, and the
        /// scheduling delay of its wake-up after it passed.
        waited: Duration,
    },
    /// The offloader is shutting down and accepts no new work.
    #[error("the offloader is shutting down and accepts no new jobs")]
    ShuttingDown,
    /// The lifecycle observer has fallen `lag` events behind, more than
    /// [`Builder::observer_lag`](crate::Builder::observer_lag) allows: the
    /// pool holds admission back rather than buffer without bound. `submit`
    /// and awaited offloads wait for it instead.
    #[error("the lifecycle observer is {lag} events behind; new jobs wait until it catches up")]
    ObserverBehind {
        /// Events not yet delivered.
        lag: usize,
    },
    /// A worker thread was needed and could not be spawned.
    #[error("no worker thread could be spawned to run it: {0}")]
    ThreadSpawn(#[source] std::io::Error),
    /// The job was offloaded through a [`JobGroup`](crate::JobGroup) that
    /// has been stopped (or closed), or whose ancestor has. Counted in the
    /// group's [`GroupMetrics::rejected`](crate::GroupMetrics::rejected).
    #[error("the job group was stopped or is closing, and accepts no new jobs")]
    GroupStopped,
}

impl Rejected {
    /// The same refusal again (an I/O error is copied by kind and message).
    pub(crate) fn again(&self) -> Rejected {
        match self {
            Rejected::Full { capacity } => Rejected::Full {
                capacity: *capacity,
            },
            Rejected::FullUntilTimeout { capacity, waited } => Rejected::FullUntilTimeout {
                capacity: *capacity,
                waited: *waited,
            },
            Rejected::ShuttingDown => Rejected::ShuttingDown,
            Rejected::GroupStopped => Rejected::GroupStopped,
            Rejected::ObserverBehind { lag } => Rejected::ObserverBehind { lag: *lag },
            Rejected::ThreadSpawn(e) => {
                Rejected::ThreadSpawn(std::io::Error::new(e.kind(), e.to_string()))
            }
        }
    }
}

/// A job that was not accepted, with its function handed back unrun.
///
/// Returned by [`Offload::spawn`](crate::Offload::spawn); converts into
/// [`Error`] (dropping the function) for `?`.
pub struct SubmitError<F> {
    reason: Rejected,
    func: F,
}

impl<F> SubmitError<F> {
    pub(crate) fn new(reason: Rejected, func: F) -> Self {
        SubmitError { reason, func }
    }

    /// Why the job was refused.
    pub fn reason(&self) -> &Rejected {
        &self.reason
    }

    /// Takes back the function that was never run.
    pub fn into_inner(self) -> F {
        self.func
    }

    /// Splits into the reason and the function.
    pub fn into_parts(self) -> (Rejected, F) {
        (self.reason, self.func)
    }
}

impl<F> fmt::Debug for SubmitError<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubmitError")
            .field("reason", &self.reason)
            .finish_non_exhaustive()
    }
}

impl<F> fmt::Display for SubmitError<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "job not accepted, the function was handed back unrun: {}",
            self.reason
        )
    }
}

impl<F> std::error::Error for SubmitError<F> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.reason)
    }
}

impl<F> From<SubmitError<F>> for Error {
    fn from(e: SubmitError<F>) -> Self {
        Error::Rejected(e.reason)
    }
}

/// The error returned when building an [`Offloader`](crate::Offloader) with
/// an invalid configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// `max_in_flight` was zero.
    #[error("max_in_flight must be at least 1")]
    ZeroInFlight,
    /// `max_in_flight` was larger than the supported maximum (one thread
    /// per permit).
    #[error("max_in_flight must be at most {max}, got {got}")]
    TooManyInFlight {
        /// The requested limit.
        got: usize,
        /// The largest supported limit.
        max: usize,
    },
    /// `observer_lag` was zero: no event could ever be pending.
    #[error("observer_lag must be at least 1")]
    ZeroObserverLag,
    /// The thread name contains a NUL byte, which no OS thread name can
    /// hold.
    #[error("thread_name must not contain a NUL byte, got {name:?}")]
    ThreadName {
        /// The refused name.
        name: String,
    },
    /// `max_per_key` (`key: None`) or a `key_limit` was zero: no job of
    /// the key could ever start.
    #[error("a per-key limit must be at least 1 (key {key:?})")]
    ZeroKeyLimit {
        /// The key whose limit was zero; `None` for `max_per_key`.
        key: Option<crate::LaneKey>,
    },
    /// `queue_capacity` was zero or larger than the supported maximum.
    #[error("queue_capacity must be between 1 and {max}, got {got}")]
    QueueCapacity {
        /// The requested capacity.
        got: usize,
        /// The largest supported capacity.
        max: usize,
    },
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Every kind of error answers exactly the predicates that name it.
    #[test]
    fn each_error_answers_only_its_own_predicates() {
        let id = JobId(7);
        // (error, is_timeout, is_cancelled, is_panic, is_rejected)
        let cases = [
            (
                Error::TimedOut {
                    id,
                    waited: Duration::from_millis(5),
                    state: JobState::Running,
                    fate: Fate::KeptRunning,
                },
                (true, false, false, false),
            ),
            (Error::Cancelled { id }, (false, true, false, false)),
            (Error::Unstarted { id }, (false, true, false, false)),
            (
                Error::Panicked {
                    id,
                    message: "boom".into(),
                },
                (false, false, true, false),
            ),
            (
                Error::Rejected(Rejected::ShuttingDown),
                (false, false, false, true),
            ),
            (Error::PolledAfterCompletion, (false, false, false, false)),
            (Error::WouldDeadlock { id }, (false, false, false, false)),
            (Error::OutcomeTaken { id }, (false, false, false, false)),
        ];
        for (e, want) in cases {
            let got = (
                e.is_timeout(),
                e.is_cancelled(),
                e.is_panic(),
                e.is_rejected(),
            );
            assert_eq!(got, want, "{e:?}");
        }
    }

    /// Durations read in milliseconds below ten seconds, in seconds from
    /// ten on.
    #[test]
    fn a_pretty_duration_switches_to_seconds_at_ten() {
        let show = |d: Duration| Pretty(d).to_string();
        assert_eq!(show(Duration::from_micros(203_840)), "203.8ms");
        assert_eq!(show(Duration::from_millis(9_999)), "9999.0ms");
        assert_eq!(show(Duration::from_secs(10)), "10.00s");
        assert_eq!(show(Duration::from_millis(12_345)), "12.35s");
    }

    /// A refused submission prints its reason (not its function) and names
    /// the reason as its source.
    #[test]
    fn a_submit_error_prints_and_chains_its_reason() {
        let e = SubmitError::new(Rejected::Full { capacity: 3 }, |_: u8| ());
        let debug = format!("{e:?}");
        assert!(debug.starts_with("SubmitError"), "{debug}");
        assert!(debug.contains("Full") && debug.contains('3'), "{debug}");
        let source = std::error::Error::source(&e).map(ToString::to_string);
        assert_eq!(
            source.as_deref(),
            Some("the queue is full (3 jobs waiting)")
        );
    }
}
