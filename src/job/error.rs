//! Errors. Every message says what happened to the *job*, not only to the
//! wait, because those are different facts (invariant 2).

use std::any::Any;
use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::job::id::{JobId, JobState};

/// What went wrong for one offloaded job: its refusal or its outcome, from
/// its caller's or owner's side.
///
/// A caller asks four questions, and each variant answers exactly one of
/// them (or, for a program error, none):
///
/// | predicate | variants | the job | status a service would answer |
/// |---|---|---|---|
/// | [`is_busy`](Self::is_busy) | [`Full`](Self::Full), [`Overloaded`](Self::Overloaded), [`ObserverBehind`](Self::ObserverBehind), [`ThreadSpawn`](Self::ThreadSpawn) | refused, or shed at its turn; never ran | 503 Service Unavailable, with `Retry-After` |
/// | [`is_timeout`](Self::is_timeout) | [`TimedOut`](Self::TimedOut) | the caller stopped waiting; the job went on as its `fate` says | 504 Gateway Timeout (or 503) |
/// | [`is_shutdown`](Self::is_shutdown) | [`ShuttingDown`](Self::ShuttingDown) | refused, or returned unstarted by [`shutdown_now`](crate::Offloader::shutdown_now) | 503 Service Unavailable |
/// | [`is_cancelled`](Self::is_cancelled) | [`Cancelled`](Self::Cancelled) | cancelled before it started (or refused by a stopped group) | 499 Client Closed Request (or 503) |
/// | [`is_panic`](Self::is_panic) | [`Panicked`](Self::Panicked) | the function panicked | 500 Internal Server Error |
/// | none | [`WouldDeadlock`](Self::WouldDeadlock), [`OutcomeTaken`](Self::OutcomeTaken) | a program error, not a condition to handle | 500 Internal Server Error |
///
/// A function that returns its own error is not an `Error` of this crate:
/// it is the value `Ok(Err(_))`. Each message says what happened to the job
/// itself, once, so a log line like "timed out" never hides that the
/// function is still running.
///
/// A handler that maps every error to a status:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use offloader::Error;
///
/// fn status(e: &Error) -> u16 {
///     if e.is_busy() || e.is_shutdown() {
///         503 // with Retry-After for busy
///     } else if e.is_timeout() {
///         504
///     } else if e.is_cancelled() {
///         499
///     } else {
///         500 // a panic, or a program error
///     }
/// }
///
/// let pool = offloader::Offloader::builder().max_in_flight(1).build().unwrap();
/// let err = pool.offload(|_stop| -> () { panic!("boom") }).await.unwrap_err();
/// assert!(err.is_panic());
/// assert!(err.to_string().contains("boom"));
/// assert_eq!(status(&err), 500);
///
/// pool.shutdown();
/// let err = pool.offload(|_stop| 1).await.unwrap_err();
/// assert_eq!(status(&err), 503);
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller's timeout passed: it stopped waiting. Accepted, the job
    /// went on as `fate` says; still waiting for room in a full queue, it
    /// was never accepted (`id` and `state` are `None`, `fate` is
    /// [`Fate::Cancelled`]: its function never runs). Answers
    /// [`is_timeout`](Self::is_timeout).
    #[error("{}", TimedOutMessage::new(*.id, *.waited, *.state, *.fate))]
    TimedOut {
        /// The job whose wait ended; `None` if it was never accepted.
        id: Option<JobId>,
        /// How long the caller waited: its timeout, and the scheduling
        /// delay of its wake-up after it passed.
        waited: Duration,
        /// The job's state when the wait ended (queued or running); `None`
        /// if it was never accepted.
        state: Option<JobState>,
        /// What happened to the job because the wait ended.
        fate: Fate,
    },
    /// Refused at once: the queue was full. Answers
    /// [`is_busy`](Self::is_busy). ([`Offload::submit`](crate::Offload::submit)
    /// and an awaited offload wait for room instead.)
    #[error("job refused, the function never ran: the queue is full ({capacity} waiting)")]
    Full {
        /// The queue's capacity.
        capacity: usize,
    },
    /// Refused at once: the lifecycle observer has fallen `lag` events
    /// behind, more than [`Builder::observer_lag`](crate::Builder::observer_lag)
    /// allows, and the pool holds admission back rather than buffer without
    /// bound. [`Offload::submit`](crate::Offload::submit) and an awaited
    /// offload wait for it instead. Answers [`is_busy`](Self::is_busy).
    #[error("job refused, the function never ran: the lifecycle observer is {lag} events behind")]
    ObserverBehind {
        /// Events not yet delivered.
        lag: usize,
    },
    /// Refused at once: a worker thread was needed and could not be spawned
    /// (the OS error is the [`source`](std::error::Error::source)). Answers
    /// [`is_busy`](Self::is_busy).
    #[error("job refused, the function never ran: no worker thread could be spawned to run it")]
    ThreadSpawn(#[source] std::io::Error),
    /// The job could not finish before its deadline at the pool's recent
    /// run times, so it never ran: refused at once (`id: None`), because
    /// the jobs ahead of it would take too long, or shed at its turn
    /// (`id: Some`, [`JobState::Shed`]), with too little time left to run.
    /// Only a job with a deadline whose abandon policy cancels it is
    /// judged so (see [`Offload::with_timeout`](crate::Offload::with_timeout)).
    /// Answers [`is_busy`](Self::is_busy).
    #[error("{}", ByJob {
        id: *.id,
        accepted: "was not started: at its turn too little time was left before its deadline for a run as long as the pool's recent ones; the function never ran",
        other: "job refused, the function never ran: at the pool's recent run times it could not finish before its deadline behind the jobs ahead of it",
    })]
    Overloaded {
        /// The job shed at its turn; `None` if it was refused.
        id: Option<JobId>,
    },
    /// The pool shuts down: the job was refused (`id: None`), or an
    /// immediate [`shutdown_now`](crate::Offloader::shutdown_now) returned
    /// it unstarted (`id: Some`). The function never ran. Answers
    /// [`is_shutdown`](Self::is_shutdown).
    #[error("{}", ByJob {
        id: *.id,
        accepted: "never started: the offloader shut down immediately and returned it unstarted",
        other: "job refused, the function never ran: the offloader is shutting down and accepts no new jobs",
    })]
    ShuttingDown {
        /// The job returned unstarted; `None` if it was refused.
        id: Option<JobId>,
    },
    /// The job was cancelled before it started ([`JobHandle::cancel`](crate::JobHandle::cancel),
    /// its group's [`stop`](crate::JobGroup::stop), its abandon policy, a
    /// followed token), or refused (`id: None`) because its
    /// [`JobGroup`](crate::JobGroup), or an ancestor, was stopped or is
    /// closing (counted in [`GroupMetrics::rejected`](crate::GroupMetrics::rejected)).
    /// The function never ran. Answers [`is_cancelled`](Self::is_cancelled).
    #[error("{}", ByJob {
        id: *.id,
        accepted: "was cancelled before it started; the function never ran",
        other: "job refused, the function never ran: its job group was stopped or is closing",
    })]
    Cancelled {
        /// The cancelled job; `None` if it was refused.
        id: Option<JobId>,
    },
    /// The function panicked. The worker thread survived and the permit was
    /// released once the unwinding finished. Answers
    /// [`is_panic`](Self::is_panic); [`into_panic`](Self::into_panic) returns
    /// the payload.
    #[error("job {id} panicked: {message}; the worker survived and the permit was released")]
    Panicked {
        /// The job that panicked.
        id: JobId,
        /// The panic message, if the payload was a string.
        message: String,
        /// The panic's payload, for [`into_panic`](Self::into_panic). The
        /// first wait that gets the error gets the payload; a later wait on
        /// the same job gets the message in its place.
        payload: PanicPayload,
    },
    /// A function of this pool blocked waiting for a job of the same pool
    /// that is still queued, while every other permit the job needs is held
    /// by functions doing the same — the pool's permits, its key's
    /// ([`Offload::key`](crate::Offload::key)) when the waiting function has
    /// the same key, or a [`Limiter`](crate::Limiter)'s that both need: the
    /// job could never start, so the wait fails instead of hanging. The job
    /// itself stays queued.
    ///
    /// Answers no predicate: it is a program error to fix (a 500), not a
    /// condition to handle.
    #[error("waiting for job {id} from inside its own pool would never return: it stays queued, and every permit it needs (of the pool, of its key, or of a limiter the waiting function holds too) is held by a function waiting for a queued job of the same pool (raise the limit, use another pool for the inner jobs, or return and await them from async code)")]
    WouldDeadlock {
        /// The job that was waited for.
        id: JobId,
    },
    /// The outcome was already taken: by an earlier wait on the job's
    /// handle, or, for an [`OffloadFuture`](crate::OffloadFuture) polled
    /// again after it completed (`id: None`), by that completion.
    ///
    /// Answers no predicate: it is a program error to fix (a 500), not a
    /// condition to handle.
    #[error("{}", ByJob {
        id: *.id,
        accepted: "was waited for before: its outcome was already taken by an earlier wait",
        other: "the offload future was polled after it had returned its outcome",
    })]
    OutcomeTaken {
        /// The job; `None` for a future polled after it completed.
        id: Option<JobId>,
    },
}

/// [`Error::TimedOut`]'s message.
struct TimedOutMessage {
    id: Option<JobId>,
    waited: Duration,
    state: Option<JobState>,
    fate: Fate,
}

impl TimedOutMessage {
    fn new(id: Option<JobId>, waited: Duration, state: Option<JobState>, fate: Fate) -> Self {
        TimedOutMessage {
            id,
            waited,
            state,
            fate,
        }
    }
}

impl fmt::Display for TimedOutMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let waited = Pretty(self.waited);
        match (self.id, self.state) {
            (Some(id), Some(state)) => write!(
                f,
                "stopped waiting for job {id} after {waited}: it was still {state}; {}",
                self.fate
            ),
            (Some(id), None) => write!(f, "stopped waiting for job {id} after {waited}; {}", self.fate),
            (None, _) => write!(
                f,
                "stopped waiting for room in the full queue after {waited}: the job was never accepted and the function never runs"
            ),
        }
    }
}

/// The message of a variant whose `id` is `Some` for a job that was
/// accepted (`job {id} {accepted}`) and `None` otherwise (`other`).
struct ByJob {
    id: Option<JobId>,
    accepted: &'static str,
    other: &'static str,
}

impl fmt::Display for ByJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.id {
            Some(id) => write!(f, "job {id} {}", self.accepted),
            None => f.write_str(self.other),
        }
    }
}

/// A panic's payload inside [`Error::Panicked`], taken by
/// [`Error::into_panic`]. Its `Debug` shows whether it is still there, not
/// the lock that keeps the error `Sync`.
pub struct PanicPayload(Mutex<Option<Box<dyn Any + Send>>>);

impl fmt::Debug for PanicPayload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = self.0.try_lock().map(|p| p.is_some()).unwrap_or(true);
        f.write_str(if held { "<payload>" } else { "<taken>" })
    }
}

impl Error {
    /// `true` if the pool was too busy to run the job: it never ran.
    ///
    /// Refused at once ([`Error::Full`], [`Error::Overloaded`],
    /// [`Error::ObserverBehind`], [`Error::ThreadSpawn`]) or shed at its turn
    /// ([`Error::Overloaded`]).
    ///
    /// Try again later (a service answers 503 with `Retry-After`).
    pub fn is_busy(&self) -> bool {
        matches!(
            self,
            Error::Full { .. }
                | Error::Overloaded { .. }
                | Error::ObserverBehind { .. }
                | Error::ThreadSpawn(_)
        )
    }

    /// `true` for [`Error::TimedOut`]: the caller's wait ended, the job did
    /// not necessarily (its `fate` says).
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::TimedOut { .. })
    }

    /// `true` for [`Error::ShuttingDown`]: the pool shuts down, and the
    /// function never ran.
    pub fn is_shutdown(&self) -> bool {
        matches!(self, Error::ShuttingDown { .. })
    }

    /// `true` for [`Error::Cancelled`]: the job was cancelled before it
    /// started, or refused by a stopped group; the function never ran.
    pub fn is_cancelled(&self) -> bool {
        matches!(self, Error::Cancelled { .. })
    }

    /// `true` for [`Error::Panicked`]: the function panicked.
    pub fn is_panic(&self) -> bool {
        matches!(self, Error::Panicked { .. })
    }

    /// The payload of the function's panic, to resume it with
    /// [`std::panic::resume_unwind`].
    ///
    /// A later wait on the same job (the first one took the payload) gets the
    /// panic's message as a `String`.
    ///
    /// # Panics
    ///
    /// If the error is not [`Error::Panicked`] (check
    /// [`is_panic`](Self::is_panic) first), as tokio's
    /// `JoinError::into_panic` does.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let pool = offloader::Offloader::builder().build().unwrap();
    /// let err = pool.offload(|_stop| std::panic::panic_any(7u32)).await.unwrap_err();
    /// assert!(err.is_panic());
    /// assert_eq!(err.into_panic().downcast_ref::<u32>(), Some(&7));
    /// # }
    /// ```
    #[track_caller]
    pub fn into_panic(self) -> Box<dyn Any + Send> {
        match self {
            Error::Panicked {
                message, payload, ..
            } => payload
                .0
                .into_inner()
                .unwrap_or_else(PoisonError::into_inner)
                .unwrap_or_else(|| Box::new(message)),
            other => panic!("`into_panic` called on an error that is not a panic: {other}"),
        }
    }

    /// The same error again, for the next wait on a job whose outcome is an
    /// error: errors are repeatable, only a value is taken once. A panic's
    /// payload moves to the copy (the first wait takes it).
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
            Error::Full { capacity } => Error::Full {
                capacity: *capacity,
            },
            Error::ObserverBehind { lag } => Error::ObserverBehind { lag: *lag },
            // The OS's error number survives, where there is one.
            Error::ThreadSpawn(e) => Error::ThreadSpawn(match e.raw_os_error() {
                Some(code) => std::io::Error::from_raw_os_error(code),
                None => std::io::Error::new(e.kind(), e.to_string()),
            }),
            Error::ShuttingDown { id } => Error::ShuttingDown { id: *id },
            Error::Cancelled { id } => Error::Cancelled { id: *id },
            Error::Overloaded { id } => Error::Overloaded { id: *id },
            Error::Panicked {
                id,
                message,
                payload,
            } => Error::Panicked {
                id: *id,
                message: message.clone(),
                // Moved, not dropped: no foreign code runs here.
                payload: PanicPayload(Mutex::new(
                    payload
                        .0
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .take(),
                )),
            },
            Error::OutcomeTaken { id } => Error::OutcomeTaken { id: *id },
            Error::WouldDeadlock { id } => Error::WouldDeadlock { id: *id },
        }
    }

    /// The error of a function that panicked with `payload`.
    pub(crate) fn panicked(id: JobId, payload: Box<dyn Any + Send>) -> Error {
        Error::Panicked {
            id,
            message: crate::util::quiet::panic_message(payload.as_ref()),
            payload: PanicPayload(Mutex::new(Some(payload))),
        }
    }

    /// The error of job `id`, which ended in `state` without running, if
    /// that state is one of those (cancelled, handed back unstarted, shed).
    pub(crate) fn never_ran(id: JobId, state: JobState) -> Option<Error> {
        let id = Some(id);
        match state {
            JobState::Cancelled => Some(Error::Cancelled { id }),
            JobState::Unstarted => Some(Error::ShuttingDown { id }),
            JobState::Shed => Some(Error::Overloaded { id }),
            JobState::Queued | JobState::Running | JobState::Completed | JobState::Panicked => None,
        }
    }

    /// The job this error is about, if it was ever accepted.
    pub fn job_id(&self) -> Option<JobId> {
        match self {
            Error::TimedOut { id, .. }
            | Error::ShuttingDown { id }
            | Error::Cancelled { id }
            | Error::Overloaded { id }
            | Error::OutcomeTaken { id } => *id,
            Error::Panicked { id, .. } | Error::WouldDeadlock { id } => Some(*id),
            Error::Full { .. } | Error::ObserverBehind { .. } | Error::ThreadSpawn(_) => None,
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

/// What happened to a job when its caller stopped waiting for it
/// ([`Error::TimedOut`]'s `fate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fate {
    /// The job goes on, queued or running, under its owner; its outcome
    /// will be recorded.
    Kept,
    /// The job was still queued and was cancelled (or, waiting for room,
    /// was never accepted): the function never runs.
    Cancelled,
    /// The job was running and its stop token was set; it keeps its permit
    /// until the function returns.
    StopRequested,
    /// The job had already finished by the time the policy was applied.
    Finished,
}

impl fmt::Display for Fate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fate::Kept => "the job goes on under its owner and its outcome will be recorded",
            Fate::Cancelled => "it was cancelled before it started and will never run",
            Fate::StopRequested => {
                "stop was requested; it holds its permit until the function returns"
            }
            Fate::Finished => "it had already finished",
        })
    }
}

/// A job that was refused, with its function handed back unrun, as
/// crossbeam's `SendError<T>` hands back its value.
///
/// Returned by [`Offload::spawn`](crate::Offload::spawn) and
/// [`Offload::submit`](crate::Offload::submit). It is an
/// [`std::error::Error`] + `Send + Sync + 'static` whatever the function
/// captures (the function is `Send`; it is kept behind a lock, so that the
/// error is `Sync` even when the function is not), so `spawn()?` works in a
/// function returning `anyhow::Result` or `Box<dyn Error + Send + Sync>`.
/// Its message is its [`reason`](Self::reason)'s, and its
/// [`source`](std::error::Error::source) is the reason's source, not the
/// reason: printed with its chain (anyhow's `{:#}`), the reason shows once.
///
/// Boxed as it is, it downcasts to `SubmitError<F>`, whose `F` a handler
/// cannot name. To keep the refusal downcastable to [`Error`] (to answer
/// 503 for [`is_busy`](Error::is_busy)), convert it first: `?` in a function
/// returning `Result<_, offloader::Error>` does, or
/// `.spawn().map_err(offloader::Error::from)?` in one returning
/// `anyhow::Result`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// let pool = offloader::Offloader::builder().build().unwrap();
/// pool.shutdown();
///
/// fn handler(pool: &offloader::Offloader) -> Result<(), BoxError> {
///     let (_tx, rx) = std::sync::mpsc::channel::<u8>(); // not Sync
///     let job = pool
///         .offload(move |_stop| rx.try_recv().ok())
///         .spawn()
///         .map_err(offloader::Error::from)?;
///     drop(job);
///     Ok(())
/// }
/// let err = handler(&pool).unwrap_err();
/// let err = err.downcast_ref::<offloader::Error>().unwrap();
/// assert!(err.is_shutdown());
/// # }
/// ```
pub struct SubmitError<F> {
    reason: Error,
    func: Mutex<F>,
}

impl<F> SubmitError<F> {
    pub(crate) fn new(reason: Error, func: F) -> Self {
        SubmitError {
            reason,
            func: Mutex::new(func),
        }
    }

    /// Why the job was refused: busy ([`Error::is_busy`]), shutting down
    /// ([`Error::is_shutdown`]), its group stopped
    /// ([`Error::is_cancelled`]), or its caller's timeout passed while it
    /// waited for room ([`Error::is_timeout`]).
    pub fn reason(&self) -> &Error {
        &self.reason
    }

    /// Takes back the function that was never run.
    pub fn into_inner(self) -> F {
        // Nothing panics while holding it: the lock is never taken.
        self.func
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
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
        fmt::Display::fmt(&self.reason, f)
    }
}

/// The source is the reason's own (an OS error for
/// [`Error::ThreadSpawn`]), not the reason: its message is this error's
/// already, and must not print twice in a chain.
impl<F> std::error::Error for SubmitError<F> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.reason)
    }
}

impl<F> From<SubmitError<F>> for Error {
    /// The reason; the function is dropped.
    fn from(e: SubmitError<F>) -> Self {
        e.reason
    }
}

/// The error returned when building an [`Offloader`](crate::Offloader) with an
/// invalid setting: a programming error, to print.
///
/// Its message names the setting and the value refused.
///
/// ```
/// let err = offloader::Offloader::builder().max_in_flight(0).build().unwrap_err();
/// assert_eq!(err.to_string(), "max_in_flight must be at least 1, got 0");
/// ```
#[derive(Debug, thiserror::Error)]
#[error("{kind}")]
pub struct BuildError {
    kind: BuildErrorKind,
}

/// What [`BuildError`] refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BuildErrorKind {
    #[error("max_in_flight must be at least 1, got 0")]
    ZeroInFlight,
    #[error("max_in_flight must be at most {max} (one thread per permit), got {got}")]
    TooManyInFlight { got: usize, max: usize },
    #[error("observer_lag must be at least 1, got 0")]
    ZeroObserverLag,
    #[error("thread_name must not contain a NUL byte, got {name:?}")]
    ThreadName { name: String },
    #[error("max_per_key must be at least 1, got 0")]
    ZeroPerKey,
    #[error("key_limit must be at least 1, got 0 for key {key:?}")]
    ZeroKeyLimit { key: crate::job::lane::LaneKey },
    #[error("queue_capacity must be between 1 and {max}, got {got}")]
    QueueCapacity { got: usize, max: usize },
}

impl From<BuildErrorKind> for BuildError {
    fn from(kind: BuildErrorKind) -> Self {
        BuildError { kind }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Every variant answers exactly one predicate, or none for the program
    /// errors (the table in `Error`'s docs).
    #[test]
    fn each_error_answers_exactly_its_one_predicate() {
        let id = JobId(7);
        let timed_out = |id, state| Error::TimedOut {
            id,
            waited: Duration::from_millis(5),
            state,
            fate: Fate::Kept,
        };
        #[derive(Debug, PartialEq)]
        enum Answer {
            Busy,
            Timeout,
            Shutdown,
            Cancelled,
            Panic,
            None,
        }
        // Listed by a match, so that a new variant fails to compile here
        // until it is given its answer.
        let want = |e: &Error| match e {
            Error::TimedOut { .. } => Answer::Timeout,
            Error::Full { .. }
            | Error::Overloaded { .. }
            | Error::ObserverBehind { .. }
            | Error::ThreadSpawn(_) => Answer::Busy,
            Error::ShuttingDown { .. } => Answer::Shutdown,
            Error::Cancelled { .. } => Answer::Cancelled,
            Error::Panicked { .. } => Answer::Panic,
            Error::WouldDeadlock { .. } | Error::OutcomeTaken { .. } => Answer::None,
        };
        let cases = [
            timed_out(Some(id), Some(JobState::Running)),
            timed_out(None, None),
            Error::Full { capacity: 3 },
            Error::ObserverBehind { lag: 9 },
            Error::ThreadSpawn(std::io::Error::other("no threads")),
            Error::ShuttingDown { id: None },
            Error::ShuttingDown { id: Some(id) },
            Error::Cancelled { id: None },
            Error::Cancelled { id: Some(id) },
            Error::Overloaded { id: None },
            Error::Overloaded { id: Some(id) },
            Error::panicked(id, Box::new("boom")),
            Error::WouldDeadlock { id },
            Error::OutcomeTaken { id: None },
            Error::OutcomeTaken { id: Some(id) },
        ];
        for e in cases {
            let answers = [
                (e.is_busy(), Answer::Busy),
                (e.is_timeout(), Answer::Timeout),
                (e.is_shutdown(), Answer::Shutdown),
                (e.is_cancelled(), Answer::Cancelled),
                (e.is_panic(), Answer::Panic),
            ];
            let yes: Vec<_> = answers.into_iter().filter(|(y, _)| *y).collect();
            match want(&e) {
                Answer::None => assert!(yes.is_empty(), "{e:?} answers {yes:?}"),
                one => assert!(
                    yes.len() == 1 && yes[0].1 == one,
                    "{e:?} answers {yes:?}, not only {one:?}"
                ),
            }
            // The same error again answers the same, with the same message.
            let again = e.again();
            assert_eq!(again.to_string(), e.to_string());
            assert_eq!(again.job_id(), e.job_id());
        }
    }

    /// A thread-spawn error read again keeps the OS's error number (an
    /// `EAGAIN` tells a caller to retry) and its message.
    #[test]
    fn a_spawn_error_again_keeps_its_os_error_number() {
        let os = Error::ThreadSpawn(std::io::Error::from_raw_os_error(11));
        let again = os.again();
        assert!(matches!(&again, Error::ThreadSpawn(e) if e.raw_os_error() == Some(11)));
        assert_eq!(again.to_string(), os.to_string());
        let plain = Error::ThreadSpawn(std::io::Error::other("no threads"));
        let again = plain.again();
        assert!(matches!(&again, Error::ThreadSpawn(e) if e.raw_os_error().is_none()));
        assert_eq!(again.to_string(), plain.to_string());
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

    /// A refused submission prints its reason once (not its function), has
    /// not the reason as its source (to print it again), and gives its
    /// function back.
    #[test]
    fn a_submit_error_prints_its_reason_once_and_gives_the_function_back() {
        let e = SubmitError::new(Error::Full { capacity: 3 }, |x: u8| x + 1);
        let debug = format!("{e:?}");
        assert!(debug.starts_with("SubmitError"), "{debug}");
        assert!(debug.contains("Full") && debug.contains('3'), "{debug}");
        assert_eq!(e.to_string(), Error::Full { capacity: 3 }.to_string());
        assert!(std::error::Error::source(&e).is_none());
        assert_eq!(e.into_inner()(1), 2);
        // The reason's own source comes next in the chain, not the reason.
        let e = SubmitError::new(Error::ThreadSpawn(std::io::Error::other("no threads")), ());
        let source = std::error::Error::source(&e).map(ToString::to_string);
        assert_eq!(source.as_deref(), Some("no threads"));
    }

    /// A panicked job's error prints its id and message in `{:?}` (what
    /// `unwrap` shows), and whether its payload is still there: not the
    /// lock that keeps the error `Sync`.
    #[test]
    fn a_panic_s_debug_shows_the_message_and_the_payload_s_presence() {
        let stored = Error::panicked(JobId(3), Box::new("boom"));
        let shown = format!("{stored:?}");
        assert!(
            shown.contains("boom") && shown.contains("<payload>"),
            "{shown}"
        );
        assert!(!shown.contains("Mutex"), "{shown}");
        let first = stored.again();
        assert!(format!("{stored:?}").contains("<taken>"));
        assert!(format!("{first:?}").contains("<payload>"));
    }

    /// A panic's payload goes to the first wait; a later one gets its
    /// message.
    #[test]
    fn a_panics_payload_moves_to_the_first_copy() {
        let stored = Error::panicked(JobId(1), Box::new(7u32));
        let first = stored.again();
        let later = stored.again();
        assert_eq!(first.into_panic().downcast_ref::<u32>(), Some(&7));
        let message = later.into_panic();
        assert_eq!(
            message.downcast_ref::<String>().map(String::as_str),
            Some("<non-string panic payload>")
        );
    }
}
