//! The future of a directly awaited [`Offload`]: waits for room, then for
//! the outcome, within the caller's timeout, and applies the abandon policy
//! when its caller stops waiting.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::api::handle::JobHandle;
use crate::api::offload::Offload;
use crate::core::pool::Offloader;
use crate::job::error::{Error, SubmitError};
use crate::job::policy::Departure;
use crate::job::stop::StopToken;
use crate::util::clock::{Began, ClockHold};

impl<F, T> IntoFuture for Offload<F, T>
where
    F: FnOnce(&StopToken) -> T + Send + 'static,
    T: Send + 'static,
{
    type Output = Result<T, Error>;
    type IntoFuture = OffloadFuture<F, T>;

    fn into_future(self) -> OffloadFuture<F, T> {
        let began = Began::if_limited(self.opts.timeout);
        OffloadFuture {
            began,
            limit: self.opts.timeout,
            pool: self.pool.clone(),
            spun: self.opts.no_spin,
            stage: Stage::Admit {
                offload: Some(self),
                waiting: None,
            },
            timer: None,
            hold: None,
        }
    }
}

/// A caller's wait for queue room, owning the function meanwhile.
type WaitForRoom<F, T> = Pin<Box<dyn Future<Output = Result<JobHandle<T>, SubmitError<F>>> + Send>>;

enum Stage<F, T> {
    /// Not yet accepted: the first attempt, then waiting for room.
    Admit {
        offload: Option<Offload<F, T>>,
        waiting: Option<WaitForRoom<F, T>>,
    },
    /// Accepted; waiting for the outcome.
    Wait(JobHandle<T>),
    /// The outcome (or an error) was returned, or the caller left.
    Done,
}

pin_project_lite::pin_project! {
    /// The future of a directly awaited [`Offload`]: waits for room, then for
    /// the outcome, within the caller's timeout.
    ///
    /// If the wait ends early (time-out, or this future is dropped) the job
    /// follows its [`AbandonPolicy`]; the permit stays held until the
    /// function really returns.
    #[must_use = "futures do nothing unless polled"]
    pub struct OffloadFuture<F, T> {
        pool: Offloader,
        began: Began,
        // Whether this caller already spent its one short spin
        // (fast/caller_spin.rs).
        spun: bool,
        limit: Option<Duration>,
        // Its handle, once accepted, carries the job's abandon policy.
        stage: Stage<F, T>,
        #[pin]
        timer: Option<tokio::time::Sleep>,
        // Holds a paused test clock while the awaited job runs.
        hold: Option<Option<ClockHold>>,
    }

    impl<F, T> PinnedDrop for OffloadFuture<F, T> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Stage::Wait(handle) = this.stage {
                handle.leave(Departure::Dropped);
            }
        }
    }
}

impl<F, T> OffloadFuture<F, T>
where
    F: FnOnce(&StopToken) -> T + Send + 'static,
    T: Send + 'static,
{
    /// For a batch whose caller left (its timeout passed after `waited`, or
    /// it was dropped): applies this job's abandon policy now, as the
    /// future's own timeout or drop would, and leaves the future done (its
    /// drop does nothing more). Returns the outcome a timeout gives (`None`
    /// for a drop). With `queued_only`, does nothing (`None`) unless the job
    /// is still queued: a batch lets go of its queued jobs before its
    /// running ones, so that no permit a stopped job gives back starts a
    /// job of the batch about to be cancelled.
    pub(crate) fn leave(
        self: Pin<&mut Self>,
        why: Departure,
        waited: Duration,
        queued_only: bool,
    ) -> Option<Result<T, Error>> {
        let this = self.project();
        // A job the batch had not offered yet when its time ran out (it
        // offers a few at each poll) gets the one try its first poll would
        // have made: not refused for a full queue it never met. A dropped
        // batch offers nothing more.
        if let (
            Departure::TimedOut,
            Stage::Admit {
                offload,
                waiting: None,
            },
        ) = (why, &mut *this.stage)
        {
            if let Some(o) = offload.take() {
                match o.try_accept(*this.began) {
                    Ok(handle) => *this.stage = Stage::Wait(handle),
                    // The queue is full: it would have waited for room.
                    Err((Error::Full { .. } | Error::ObserverBehind { .. }, _)) => {}
                    Err((reason, _)) => {
                        this.pool.inner().count_refusal(&reason);
                        *this.stage = Stage::Done;
                        return Some(Err(reason));
                    }
                }
            }
        }
        let out = match this.stage {
            Stage::Wait(handle) => {
                if queued_only && handle.state() != crate::job::id::JobState::Queued {
                    return None;
                }
                *this.hold = None;
                match why {
                    Departure::TimedOut => Some(handle.timed_out(waited, true)),
                    Departure::Dropped => {
                        handle.leave(Departure::Dropped);
                        None
                    }
                }
            }
            // Not accepted yet: giving up the wait for room gives up the
            // function.
            Stage::Admit { .. } if !queued_only => match why {
                Departure::TimedOut => {
                    let inner = this.pool.inner();
                    let reason = inner.gave_up_waiting(waited);
                    Some(Err(reason))
                }
                Departure::Dropped => None,
            },
            Stage::Admit { .. } | Stage::Done => return None,
        };
        *this.stage = Stage::Done;
        out
    }
}

impl<F, T> OffloadFuture<F, T> {
    /// The id of the job, once it has been accepted.
    pub fn job_id(&self) -> Option<crate::job::id::JobId> {
        match &self.stage {
            Stage::Wait(h) => Some(h.id()),
            _ => None,
        }
    }
}

impl<F, T> Future for OffloadFuture<F, T>
where
    F: FnOnce(&StopToken) -> T + Send + 'static,
    T: Send + 'static,
{
    type Output = Result<T, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.stage {
                Stage::Admit { offload, waiting } => {
                    let admitted = match waiting {
                        // First poll: one attempt without waiting.
                        None => {
                            let Some(o) = offload.take() else {
                                *this.stage = Stage::Done;
                                continue;
                            };
                            match o.try_accept(*this.began) {
                                Ok(handle) => Ok(handle),
                                Err((Error::Full { .. } | Error::ObserverBehind { .. }, back)) => {
                                    *waiting = Some(Box::pin(back.submit_from(*this.began)));
                                    continue;
                                }
                                Err((reason, back)) => {
                                    back.pool.inner().count_refusal(&reason);
                                    Err(reason)
                                }
                            }
                        }
                        Some(fut) => match fut.as_mut().poll(cx) {
                            Poll::Ready(r) => r.map_err(Error::from),
                            Poll::Pending => {
                                if !poll_timer(this.timer.as_mut(), *this.began, *this.limit, cx) {
                                    return Poll::Pending;
                                }
                                // Dropping the wait gives up the function.
                                *waiting = None;
                                let reason = this.pool.inner().gave_up_waiting(this.began.waited());
                                Err(reason)
                            }
                        },
                    };
                    match admitted {
                        Ok(handle) => {
                            *this.stage = Stage::Wait(handle);
                        }
                        Err(e) => {
                            *this.stage = Stage::Done;
                            return Poll::Ready(Err(e));
                        }
                    }
                }
                Stage::Wait(handle) => {
                    if let Poll::Ready(outcome) = handle.poll_outcome(cx) {
                        *this.stage = Stage::Done;
                        *this.hold = None;
                        return Poll::Ready(outcome);
                    }
                    if !std::mem::replace(this.spun, true) && handle.spin_briefly() {
                        continue;
                    }
                    // Under a paused test clock, an await of pool work holds
                    // the clock, as awaiting `spawn_blocking` does.
                    if this.hold.as_ref().is_none_or(Option::is_none) {
                        *this.hold = Some(handle.clock_hold());
                    }
                    if !poll_timer(this.timer.as_mut(), *this.began, *this.limit, cx) {
                        return Poll::Pending;
                    }
                    *this.hold = None;
                    let out = handle.timed_out(this.began.waited(), true);
                    *this.stage = Stage::Done;
                    return Poll::Ready(out);
                }
                // Polling a finished future is a caller bug, reported as an
                // error rather than a panic.
                Stage::Done => return Poll::Ready(Err(Error::OutcomeTaken { id: None })),
            }
        }
    }
}

/// Polls the caller's timer, creating it on first use; `true` once the
/// limit has passed. Without a limit, never fires.
fn poll_timer(
    mut timer: Pin<&mut Option<tokio::time::Sleep>>,
    began: Began,
    limit: Option<Duration>,
    cx: &mut Context<'_>,
) -> bool {
    let Some(limit) = limit else {
        return false;
    };
    if timer.is_none() {
        timer.set(Some(tokio::time::sleep_until(began.timer_deadline(limit))));
    }
    match timer.as_pin_mut() {
        Some(sleep) => sleep.poll(cx).is_ready(),
        None => false,
    }
}
