//! The owner handle: a future of the job's outcome that also controls it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::core::pool::Inner;
use crate::job::cell::Outcome;
use crate::job::error::{Error, Fate};
use crate::job::id::{JobId, JobState};
use crate::job::policy::{AbandonPolicy, Departure};
use crate::util::clock::{Began, ClockHold};
use crate::util::sync::Arc;

/// The owner handle of an accepted job: a future of its outcome that can also
/// report its state, [`cancel`](Self::cancel) it and [`stop`](Self::stop) it.
///
/// Returned by [`Offload::spawn`](crate::Offload::spawn). Awaiting it yields
/// the function's value, or an [`Error`] that says what happened to the job.
/// To wait with a timeout without giving the handle up, await `&mut handle`
/// inside `tokio::time::timeout`: when that times out, the job goes on and
/// the handle can be awaited again.
///
/// Dropping the handle before the outcome is leaving, as dropping an
/// awaited offload is: the job follows its [`AbandonPolicy`] (the pool's,
/// or the one given with [`Offload::on_abandon`](crate::Offload::on_abandon)).
/// Under the default, [`Keep`](AbandonPolicy::Keep), that detaches it, as
/// with tokio's `JoinHandle`: the offloader still owns it, it runs to
/// completion, its outcome is recorded in the metrics and then dropped — by
/// the worker that ran it, if the handle went before the outcome was
/// published. That drop runs on the worker between jobs: a value whose
/// `Drop` blocks holds that worker (and with it the next job it would
/// start) for as long. Under `CancelIfQueued` or `CancelAndStop`, a
/// dropped handle cancels its queued job (its function is dropped then, on
/// the dropping thread) or, under `CancelAndStop`, stops a running one;
/// [`detach`](Self::detach) keeps the job whatever the policy.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use offloader::{JobState, Offloader};
///
/// let pool = Offloader::builder().max_in_flight(1).build()?;
/// let (tx, rx) = std::sync::mpsc::channel::<()>();
/// let mut job = pool
///     .offload(move |_stop| { rx.recv().ok(); "done" })
///     .name("download")
///     .spawn()?;
///
/// // Stop waiting for a while without giving the job up.
/// let waited = tokio::time::timeout(Duration::from_millis(5), &mut job).await;
/// assert!(waited.is_err());
/// assert!(!job.is_finished());
///
/// tx.send(())?;
/// assert_eq!(job.await?, "done");
/// # Ok(()) }
/// ```
#[must_use = "dropping a JobHandle applies the job's abandon policy (by default the job goes on)"]
pub struct JobHandle<T> {
    job: Arc<dyn Outcome<T>>,
    pool: Arc<Inner>,
    /// Boxed: most handles have no wait limit, and a handle stays 32 bytes.
    timer: Option<Box<Timer>>,
}

/// The wait limit a handle got from [`Offload::with_timeout`](crate::Offload::with_timeout).
struct Timer {
    began: Began,
    /// `None`: no limit; the box only holds a paused test clock.
    limit: Option<Duration>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Holds a paused test clock while the job runs.
    hold: Option<ClockHold>,
}

impl<T> JobHandle<T> {
    /// The owner handle of `job`, whose core says a caller waits from the
    /// start (`JobCore::new`), and holds the policy its holder's leaving
    /// applies (`JobCore::leave_policy`).
    pub(crate) fn new(job: Arc<dyn Outcome<T>>, pool: Arc<Inner>) -> Self {
        JobHandle {
            job,
            pool,
            timer: None,
        }
    }

    /// The handle with the caller's wait `limit` (from
    /// [`with_timeout`](crate::Offload::with_timeout)) counted from
    /// `began`, if there is one. A directly awaited offload keeps its own
    /// timer and never asks: no box for it.
    pub(crate) fn with_wait_limit(mut self, began: Began, limit: Option<Duration>) -> Self {
        if let Some(limit) = limit {
            self.timer = Some(Box::new(Timer {
                began,
                limit: Some(limit),
                sleep: None,
                hold: None,
            }));
        }
        self
    }

    /// The job's id.
    pub fn id(&self) -> JobId {
        self.job.core().id
    }

    /// The job's name, if it was given one.
    pub fn name(&self) -> Option<&str> {
        self.job.core().name().map(|n| &**n)
    }

    /// Where the job is in its life right now.
    pub fn state(&self) -> JobState {
        self.job.core().state()
    }

    /// `true` once the outcome is ready: awaiting the handle will not wait.
    pub fn is_finished(&self) -> bool {
        self.job.is_published()
    }

    /// Under a paused test clock, holds it while this job's work goes on
    /// (as a `spawn_blocking` task does): not after its outcome is
    /// published, even if nobody polls this handle again.
    pub(crate) fn clock_hold(&self) -> Option<crate::util::clock::ClockHold> {
        let job: Arc<dyn crate::job::cell::Task> = self.job.clone();
        self.pool
            .clock_holds
            .hold_while(move || !job.is_published())
    }

    /// Cancels the job.
    ///
    /// Returns `true` if this call prevented the start: the function will never
    /// run and the handle resolves to [`Error::Cancelled`].
    ///
    /// If the function already runs, cancel sets its stop token (as
    /// [`stop`](Self::stop) does) and nothing else: the function keeps its
    /// permit until it returns, and `false` is returned. If the job has
    /// finished, nothing happens.
    pub fn cancel(&self) -> bool {
        if self.pool.cancel(&*self.job) {
            return true;
        }
        if self.state() == JobState::Running {
            self.stop();
        }
        false
    }

    /// Requests stop through the job's [`StopToken`](crate::StopToken):
    /// [`is_stopped`](crate::StopToken::is_stopped) turns true and
    /// [`on_stop`](crate::StopToken::on_stop) callbacks run.
    ///
    /// Returns `true` if this call made the request.
    ///
    /// A queued job that is stopped still starts, with its token already
    /// stopped; a running one keeps its permit until the function returns.
    pub fn stop(&self) -> bool {
        self.pool.stop(&*self.job)
    }

    /// `true` once stop has been requested for this job (its
    /// [`StopToken::is_stopped`](crate::StopToken::is_stopped) is `true`).
    pub fn is_stopped(&self) -> bool {
        self.job.core().is_stop_requested()
    }

    /// Gives up the handle and keeps the job, whatever its abandon policy: the
    /// offloader runs it and records its outcome.
    ///
    /// (Dropping the handle applies the policy, which keeps the job only under
    /// [`AbandonPolicy::Keep`].)
    pub fn detach(self) {
        // The holder has left: its drop applies nothing.
        self.job.core().mark_caller_left();
    }

    /// Blocks the current thread until the outcome is ready, or at most `limit`
    /// (`None`: no limit), for synchronous callers: plain threads,
    /// `spawn_blocking`, other pools' jobs.
    ///
    /// When the limit passes it returns [`Error::TimedOut`] and the handle
    /// stays usable: the job goes on and can be waited for again.
    ///
    /// On a tokio multi-thread runtime's worker it blocks through
    /// `tokio::task::block_in_place`, so the worker's other tasks move
    /// elsewhere meanwhile.
    ///
    /// Called by a function running on the same pool while the job is still
    /// queued, it fails at once with [`Error::WouldDeadlock`] if every other
    /// permit is held by functions doing the same: the job could never start.
    /// From inside a job, prefer returning and letting the caller await both
    /// jobs, or give the inner work its own pool.
    ///
    /// # Panics
    ///
    /// On a current-thread runtime's thread (as tokio's `blocking_recv`
    /// does): it would stall every task of that runtime. Await the handle
    /// there instead.
    ///
    /// ```
    /// use std::time::Duration;
    /// let pool = offloader::Offloader::builder().build()?;
    /// let mut job = pool.offload(|_stop| 6 * 7).spawn()?;
    /// assert_eq!(job.blocking_wait(Some(Duration::from_secs(10)))?, 42);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn blocking_wait(&mut self, limit: Option<Duration>) -> Result<T, Error> {
        let _waiting = self.pool.enter_own_wait(self.job.core())?;
        let began = Instant::now();
        let until = limit.map(|limit| crate::util::clock::deadline_after(began, limit));
        match off_the_runtime(|| self.job.wait_outcome(until)) {
            Some(outcome) => outcome,
            // Only a limit ends the wait without an outcome.
            None => self.timed_out(began.elapsed(), false),
        }
    }

    /// Spins for the outcome as long as the pool's callers may now
    /// (fast/caller_spin.rs), and tells it whether the spin paid; `true` if the
    /// outcome is ready.
    pub(crate) fn spin_briefly(&self) -> bool {
        let spin = &self.pool.caller_spin;
        let budget = spin.budget();
        if budget.is_zero() {
            return false;
        }
        let began = Instant::now();
        let found = loop {
            for _ in 0..32 {
                std::hint::spin_loop();
            }
            if self.is_finished() {
                break true;
            }
            if began.elapsed() >= budget {
                break false;
            }
        };
        spin.note(found);
        found
    }

    /// The outcome if it is ready now, without waiting.
    pub(crate) fn poll_outcome(&self, cx: &mut Context<'_>) -> Poll<Result<T, Error>> {
        self.job.poll_outcome(cx)
    }

    /// The outcome once a wait has run out, if it was published meanwhile;
    /// otherwise the time-out error.
    ///
    /// With `leave`, the holder leaves: the job's policy is applied to it
    /// if it is still queued or running; without, the job goes on under
    /// this handle. The error reports the state the job was in when the
    /// wait ended, before the policy acted.
    pub(crate) fn timed_out(&self, waited: Duration, leave: bool) -> Result<T, Error> {
        let state = self.state();
        if !state.is_terminal() {
            let fate = if leave {
                self.leave(Departure::TimedOut)
            } else {
                Fate::Kept
            };
            if fate != Fate::Finished {
                return Err(Error::TimedOut {
                    id: Some(self.id()),
                    waited,
                    state: Some(state),
                    fate,
                });
            }
        }
        // It finished on its own while the wait ran out: the outcome wins.
        match self.job.wait_outcome(Some(Instant::now())) {
            Some(outcome) => outcome,
            // Ended but not yet published: a job that never ran has its
            // error already (shed and cancelled jobs are published after
            // unlocking, a batch at a time); one that ran is between its
            // worker releasing the permit and publishing.
            None => {
                let state = self.state();
                Err(
                    Error::never_ran(self.id(), state).unwrap_or(Error::TimedOut {
                        id: Some(self.id()),
                        waited,
                        state: Some(state),
                        fate: Fate::Finished,
                    }),
                )
            }
        }
    }

    /// The holder stops waiting: applies the job's policy, once (a holder
    /// that left already, or detached, keeps the job).
    pub(crate) fn leave(&self, why: Departure) -> Fate {
        let core = self.job.core();
        if core.caller_left() {
            return Fate::Kept;
        }
        self.abandon(core.leave_policy(), why)
    }

    /// Applies `policy` because the awaiting caller stopped waiting.
    pub(crate) fn abandon(&self, policy: AbandonPolicy, why: Departure) -> Fate {
        let core = self.job.core();
        if self.is_finished() {
            return Fate::Finished;
        }
        if !self.pool.caller_left(core, why) {
            return Fate::Finished;
        }
        let fate = match policy {
            AbandonPolicy::Keep => Fate::Kept,
            AbandonPolicy::CancelIfQueued if self.pool.cancel(&*self.job) => Fate::Cancelled,
            AbandonPolicy::CancelIfQueued => Fate::Kept,
            AbandonPolicy::CancelAndStop if self.pool.cancel(&*self.job) => Fate::Cancelled,
            AbandonPolicy::CancelAndStop => {
                // A job that finished meanwhile had nothing left to stop.
                if !self.stop() && self.state().is_terminal() {
                    Fate::Finished
                } else {
                    Fate::StopRequested
                }
            }
        };
        let state = self.state();
        if fate == Fate::Kept && state == JobState::Running {
            tracing::warn!(
                parent: &core.span(),
                "caller stopped waiting; the job keeps running and holds its permit until it returns"
            );
        } else {
            tracing::debug!(parent: &core.span(), %state, %fate, "caller stopped waiting");
        }
        fate
    }
}

impl<T> Future for JobHandle<T> {
    type Output = Result<T, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(outcome) = self.job.poll_outcome(cx) {
            self.timer = None;
            return Poll::Ready(outcome);
        }
        // Under a paused test clock, an await of pool work holds the clock
        // (as awaiting a `spawn_blocking` task does), limit or not.
        if self.timer.as_ref().is_none_or(|t| t.hold.is_none()) {
            if let Some(hold) = self.clock_hold() {
                let timer = self.timer.get_or_insert_with(|| {
                    Box::new(Timer {
                        began: Began::now(),
                        limit: None,
                        sleep: None,
                        hold: None,
                    })
                });
                timer.hold = Some(hold);
            }
        }
        let Some(timer) = &mut self.timer else {
            return Poll::Pending;
        };
        let Some(limit) = timer.limit else {
            return Poll::Pending;
        };
        let deadline = timer.began.timer_deadline(limit);
        let sleep = timer
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        // The limit is spent; later awaits wait without one. The holder
        // left: the job follows its policy.
        let waited = timer.began.waited();
        self.timer = None;
        Poll::Ready(self.timed_out(waited, true))
    }
}

impl<T> Drop for JobHandle<T> {
    fn drop(&mut self) {
        // The holder leaves: the job follows its policy, quietly under
        // `Keep` (a detach: not counted as a caller that left). Then nobody
        // is left to collect its outcome; a finished job's worker has read
        // the flag already (worker.rs).
        let core = self.job.core();
        if !core.state().is_terminal() {
            if core.leave_policy() != AbandonPolicy::Keep {
                self.leave(Departure::Dropped);
            }
            core.set_caller_waiting(false);
        }
        // An outcome published and never taken is dropped here, its drop
        // caught as the worker catches it: a value's or a panic payload's
        // `Drop` that panics must not unwind out of this one. One look
        // under the cell lock, whatever the cell holds.
        self.job.drop_published();
    }
}

impl<T> fmt::Debug for JobHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobHandle")
            .field("id", &self.id())
            .field("name", &self.name())
            .field("state", &self.state())
            .finish()
    }
}

/// Runs a blocking wait so that it does not stall an async runtime: through
/// `block_in_place` (which hands a multi-thread runtime's worker over to
/// another thread, and runs `wait` directly on any thread that is not a
/// runtime worker), and with a clear panic on a current-thread runtime's
/// thread, where blocking would stall every task of the runtime.
fn off_the_runtime<R>(wait: impl FnOnce() -> R) -> R {
    #[cfg(not(loom))]
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        if rt.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread {
            // `block_in_place` runs `wait` directly on a blocking-pool
            // thread of this runtime, and panics on its async thread.
            let mut wait = Some(wait);
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                tokio::task::block_in_place(|| wait.take().map(|w| w()))
            }));
            return match caught {
                Ok(Some(r)) => r,
                Ok(None) => unreachable!("the wait ran once"),
                Err(_) => panic!(
                    "offloader: JobHandle::blocking_wait called on a \
                     current-thread tokio runtime's thread; \
                     blocking it would stall every task of that runtime. Await the handle instead \
                     (or wait from spawn_blocking or a plain thread)."
                ),
            };
        }
        return tokio::task::block_in_place(wait);
    }
    wait()
}
