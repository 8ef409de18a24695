//! Interop with tokio-util's [`CancellationToken`] (feature `tokio-util`):
//! a group can stop when a token is cancelled, and a job's [`StopToken`]
//! can be watched from async code as a token, so a tree of async
//! cancellation reaches blocking jobs and back.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;

use tokio_util::sync::CancellationToken;

use crate::group::JobGroup;
use crate::job::Task;
use crate::pool::Inner;
use crate::stop::StopToken;

impl JobGroup {
    /// Stops this group (as [`stop`](JobGroup::stop): queued jobs cancelled,
    /// running ones asked to stop, descendants included) when `token` is
    /// cancelled — at once if it already is. The watch ends when the token
    /// is cancelled or the group's last handle is dropped; it does not keep
    /// the group alive.
    ///
    /// The watch runs as a task on one thread the process shares for all
    /// such watches (started by the first), not on the caller's runtime: it
    /// goes on after that runtime is dropped, and works outside one. The
    /// stop it fires runs on a thread of that runtime's blocking pool, so a
    /// stop callback that blocks holds no other watch.
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
        spawn_watch(watch_until(token, self.gone(), move || group.stop()));
    }
}

/// What an offload that follows a token carries until it is accepted.
pub(crate) struct Follow {
    token: CancellationToken,
    gone: CancellationToken,
}

/// Cancels its token when dropped: the job's function is gone.
pub(crate) struct Gone(CancellationToken);

impl Drop for Gone {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

impl Follow {
    /// A follow of `token`, and the guard the function carries.
    pub(crate) fn new(token: CancellationToken) -> (Follow, Gone) {
        let gone = CancellationToken::new();
        (
            Follow {
                token,
                gone: gone.clone(),
            },
            Gone(gone),
        )
    }

    /// Whether the followed token is cancelled already.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    /// The token followed.
    pub(crate) fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// Starts watching for the accepted job `task` of pool `inner`.
    pub(crate) fn watch(self, task: &Arc<dyn Task>, inner: &Arc<Inner>) {
        let (task, inner) = (Arc::downgrade(task), inner.clone());
        let stop = move || {
            if let Some(task) = task.upgrade() {
                if !inner.cancel(&*task) {
                    inner.stop(&*task);
                }
            }
        };
        if self.token.is_cancelled() {
            stop();
            return;
        }
        spawn_watch(watch_until(self.token, self.gone, stop));
    }
}

/// `room` (a wait for queue room), ended early when `follows`, the token
/// the waiting job follows, is cancelled.
pub(crate) async fn or_cancelled(
    room: impl Future<Output = ()>,
    follows: Option<&CancellationToken>,
) {
    let Some(token) = follows else {
        return room.await;
    };
    let mut room = pin!(room);
    let mut cancelled = pin!(token.cancelled());
    poll_fn(|cx| {
        if cancelled.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        room.as_mut().poll(cx)
    })
    .await;
}

/// Runs `act` when `token` is cancelled, unless `gone` is cancelled first:
/// on a thread of the watch runtime's blocking pool, not its one thread,
/// since the stop callbacks `act` fires are the user's and may block (one
/// that does holds that thread, not every watch of the process).
async fn watch_until(
    token: CancellationToken,
    gone: CancellationToken,
    act: impl FnOnce() + Send + 'static,
) {
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
        drop(tokio::task::spawn_blocking(act));
    }
}

/// Runs a watch as a task on the process's watch runtime
/// ([`watch_runtime`]), not the caller's: a job outlives the runtime that
/// offloaded it, and its watch must too.
fn spawn_watch(watch: impl Future<Output = ()> + Send + 'static) {
    match watch_runtime() {
        Ok(runtime) => drop(runtime.spawn(watch)),
        Err(e) => {
            tracing::warn!(error = %e, "could not start the thread that watches cancellation tokens; the jobs will not follow them");
        }
    }
}

/// The runtime that runs every watch: one thread for the whole process,
/// however many jobs wait, started by the first watch (tried again by the
/// next one if it could not be).
fn watch_runtime() -> std::io::Result<tokio::runtime::Handle> {
    static WATCHES: std::sync::Mutex<Option<tokio::runtime::Handle>> = std::sync::Mutex::new(None);
    let mut slot = WATCHES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(runtime) = slot.as_ref() {
        return Ok(runtime.clone());
    }
    // Timers too: the stop callbacks a watch fires may use them.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let handle = runtime.handle().clone();
    std::thread::Builder::new()
        .name("offloader-stop-on".into())
        .spawn(move || runtime.block_on(std::future::pending::<()>()))?;
    *slot = Some(handle.clone());
    Ok(handle)
}

impl StopToken {
    /// A [`CancellationToken`] that is cancelled when stop is requested on
    /// this token (at once if it already was), for async code that watches
    /// a job's stop request, or that hands it to a tokio-util API. Each
    /// call gives a new token (a child of one the stop cancels, so that
    /// however many are asked for, one stop callback is registered, and a
    /// dropped token leaves nothing behind); it holds nothing of the job's
    /// alive. That one callback takes the place of the first call among
    /// the token's callbacks, which run newest first: every token asked
    /// for later is cancelled in that place too.
    ///
    /// ```
    /// let stop = offloader::StopToken::new();
    /// let token = stop.cancellation_token();
    /// assert!(!token.is_cancelled());
    /// stop.request_stop();
    /// assert!(token.is_cancelled());
    /// ```
    pub fn cancellation_token(&self) -> CancellationToken {
        let watch = || {
            let token = CancellationToken::new();
            let cancel = token.clone();
            // Stays registered until stop fires or the job is gone.
            self.on_stop(move || cancel.cancel()).detach();
            token
        };
        // One callback per stop source, however many tokens are asked for:
        // each is a child of the one it cancels, and leaves the tree when
        // dropped.
        match self.ext() {
            Some(ext) => ext.token.get_or_init(watch).child_token(),
            // No stop state kept (a finished job's): a token of its own.
            None => watch(),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Tasks alive on the watch runtime.
    fn watches() -> usize {
        watch_runtime()
            .expect("the watch runtime")
            .metrics()
            .num_alive_tasks()
    }

    /// Waits (yielding) until `cond` holds, failing after ten seconds.
    fn eventually(what: &str, cond: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !cond() {
            assert!(std::time::Instant::now() < deadline, "never: {what}");
            std::thread::yield_now();
        }
    }

    /// Found by a hostile review: each `cancellation_token` registered a
    /// stop callback that stayed until stop, so a long-lived token asked
    /// for one in a loop grew without bound (and every later registration
    /// searched a longer list). One callback serves them all now, and each
    /// token asked for, before or after, is cancelled with the stop.
    #[test]
    fn cancellation_tokens_share_one_stop_callback() {
        let stop = StopToken::new();
        let kept = stop.cancellation_token();
        for _ in 0..1000 {
            drop(stop.cancellation_token());
        }
        assert_eq!(stop.pending_callbacks(), 1);
        assert!(!kept.is_cancelled());
        stop.request_stop();
        assert!(kept.is_cancelled());
        assert!(
            stop.cancellation_token().is_cancelled(),
            "asked for after the stop"
        );
    }

    /// A group's watch ends when the group's last handle goes (it does not
    /// keep the group alive, and no task is left waiting on the token); a
    /// job's, when its function has run. The only tests of this binary
    /// that make watches: the count is theirs.
    #[test]
    fn watches_end_with_their_group_or_job() {
        let pool = crate::Offloader::builder().build().expect("pool");
        let token = CancellationToken::new();
        let before = watches();
        let group = pool.group();
        group.stop_on(token.clone());
        assert_eq!(watches(), before + 1, "the group's watch");
        drop(group);
        eventually("the group's watch ended", || watches() == before);

        // A server-wide token followed by many jobs: no watch is left.
        for i in 0..100 {
            let job = pool
                .offload(move |_stop| i)
                .stop_on(token.clone())
                .spawn()
                .expect("accepted");
            assert_eq!(job.blocking_wait().ok(), Some(i));
        }
        eventually("every job's watch ended", || watches() == before);
        assert!(!token.is_cancelled());
    }
}
