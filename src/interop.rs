//! Interop with tokio-util's [`CancellationToken`] (feature `tokio-util`):
//! a group can stop when a token is cancelled, and a job's [`StopToken`]
//! can be watched from async code as a token, so a tree of async
//! cancellation reaches blocking jobs and back.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use tokio_util::sync::CancellationToken;

use crate::group::JobGroup;
use crate::stop::StopToken;

impl JobGroup {
    /// Stops this group (as [`stop`](JobGroup::stop): queued jobs cancelled,
    /// running ones asked to stop, descendants included) when `token` is
    /// cancelled — at once if it already is. The watch ends when the token
    /// is cancelled or the group's last handle is dropped; it does not keep
    /// the group alive.
    ///
    /// The watch runs as a task on the current tokio runtime, or, called
    /// outside one, on a small thread of its own.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tokio_util::sync::CancellationToken;
    /// let pool = offloader::Offloader::builder().build()?;
    /// let request = CancellationToken::new();
    /// let reads = pool.group();
    /// reads.stop_on(request.child_token());
    /// request.cancel(); // e.g. the client went away
    /// reads.idle().await;
    /// while !reads.is_stopped() {
    ///     tokio::task::yield_now().await;
    /// }
    /// assert!(reads.offload(|_stop| ()).spawn().is_err());
    /// # Ok(()) }
    /// ```
    pub fn stop_on(&self, token: CancellationToken) {
        if token.is_cancelled() {
            self.stop();
            return;
        }
        let group = self.downgrade();
        let gone = self.gone();
        let watch = async move {
            let mut cancelled = pin!(token.cancelled());
            let mut dropped = pin!(gone.cancelled());
            let fired = poll_fn(|cx| {
                if cancelled.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(true);
                }
                dropped.as_mut().poll(cx).map(|()| false)
            })
            .await;
            if fired {
                group.stop();
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(watch);
            }
            Err(_) => {
                let spawned = std::thread::Builder::new()
                    .name("offloader-stop-on".into())
                    .spawn(move || block_on(watch));
                if let Err(e) = spawned {
                    tracing::warn!(error = %e, "could not spawn the thread that watches a cancellation token; the group will not follow it");
                }
            }
        }
    }
}

impl StopToken {
    /// A [`CancellationToken`] that is cancelled when stop is requested on
    /// this token (at once if it already was), for async code that watches
    /// a job's stop request, or that hands it to a tokio-util API. Each
    /// call gives a new token; it holds nothing of the job's alive.
    ///
    /// ```
    /// let stop = offloader::StopToken::new();
    /// let token = stop.cancellation_token();
    /// assert!(!token.is_cancelled());
    /// stop.request_stop();
    /// assert!(token.is_cancelled());
    /// ```
    pub fn cancellation_token(&self) -> CancellationToken {
        let token = CancellationToken::new();
        let cancel = token.clone();
        // Stays registered until stop fires or the job is gone.
        self.on_stop(move || cancel.cancel()).detach();
        token
    }
}

/// Wakes a thread parked in [`block_on`].
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `fut` to completion on this thread.
fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}
