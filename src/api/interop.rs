//! Interop with tokio-util's [`CancellationToken`] (feature `tokio-util`):
//! a group or a job follows tokens (`stop_on`), and a job's [`StopToken`]
//! can be watched from async code as a token, so a tree of async
//! cancellation reaches blocking jobs and back.
//!
//! A token has no synchronous callback: following one takes a task that
//! awaits `cancelled()`, a *watch*. Its promises:
//!
//! 1. **Registered before `stop_on` returns.** A token cancelled already
//!    acts on the caller's thread (a job is cancelled in the critical
//!    section that accepts it); otherwise the watch is spawned, owning what
//!    it needs to act, before `stop_on` (or `spawn`) returns.
//! 2. **Owns its target.** A group's watch holds the group's record in the
//!    pool (G3 of `state/groups.rs`), not a handle: the group's jobs follow
//!    the token after its last handle is dropped, and no drop policy is
//!    bypassed. A job's watch holds the pool and a weak reference to the job,
//!    which the queue or the worker keeps alive while its function lives.
//! 3. **Ends with its target.** A job's watch ends when its function has
//!    run or been dropped (`Gone`, kept beside the function in the job's
//!    rare parts, fired by the job as it runs or discards it); a group's
//!    when the group has ended: no handle, no child group, no unpublished
//!    job of its own (the record wakes it). A watch never keeps a group or
//!    a job alive past that.
//! 4. **Bounded threads.** Every watch of the process is a task on one
//!    watch thread ([`watch_runtime`]); the stops that fired watches run on
//!    at most [`STOP_THREADS`] threads of that runtime's blocking pool,
//!    started in the order they fired, however many fire at once. A stop runs user
//!    code (stop callbacks, the drops of cancelled functions): one that
//!    blocks holds one of those threads, and only [`STOP_THREADS`] that
//!    block at once delay the other stops, until one returns. The watches
//!    themselves never wait for a stop.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::Poll;

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::api::group::JobGroup;
use crate::core::pool::Inner;
use crate::core::state::After;
use crate::job::cell::Task;
use crate::job::record::Gone;
use crate::job::stop::StopToken;
use crate::util::slab::Key;

/// How many threads run the stops of fired watches, for the whole process
/// (promise 4 of the module doc).
const STOP_THREADS: usize = 4;

impl JobGroup {
    /// Stops this group when `token` is cancelled, and returns the group:
    /// chains with [`on_drop`](JobGroup::on_drop), as
    /// [`Offload::stop_on`](crate::Offload::stop_on) does with the other
    /// options of an offload.
    ///
    /// A stop is [`stop`](JobGroup::stop)'s: new offloads through the group are
    /// refused, queued jobs cancelled, running ones asked to stop, descendants
    /// included.
    ///
    /// Call it once per token: the group follows every token it is given,
    /// and the first one cancelled stops it.
    ///
    /// - **Cancelled already:** the group is stopped before this returns.
    /// - **Cancelled later:** the group is stopped shortly after, even if
    ///   every handle to it has been dropped by then (its jobs go on under
    ///   the default [`GroupDropPolicy`](crate::GroupDropPolicy), and still
    ///   follow the token); a job of the group that starts in between has
    ///   its stop token set as it starts or just after.
    /// - **Never cancelled:** the watch ends once the group has ended (its
    ///   last handle dropped, its jobs finished, no child group left); it
    ///   keeps nothing alive past that.
    ///
    /// Where it runs (for [`Offload::stop_on`](crate::Offload::stop_on)
    /// too): every watch of the process is a task on one thread the process
    /// shares, not on the caller's runtime, so it works outside one and
    /// goes on after that runtime is dropped. The stops of fired watches run
    /// on at most four threads the process shares, started in the order
    /// they fired, however many fire at once. A stop runs user code (stop
    /// callbacks, the drops of cancelled functions): one that blocks holds
    /// one of those threads, and four that block at once hold back every
    /// other stop until one returns. Keep stop callbacks short, as
    /// [`StopToken::on_stop`] asks.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use offloader::GroupDropPolicy;
    /// use tokio_util::sync::CancellationToken;
    ///
    /// let pool = offloader::Offloader::builder().build()?;
    /// let request = CancellationToken::new();
    /// let reads = pool
    ///     .group()
    ///     .on_drop(GroupDropPolicy::Stop)
    ///     .stop_on(request.child_token());
    /// let read = reads
    ///     .offload(|stop| stop.sleep(Duration::from_secs(60)))
    ///     .spawn()?;
    /// request.cancel(); // e.g. the client went away
    /// match read.await {
    ///     Ok(slept) => assert!(slept.is_err()), // its sleep saw the stop
    ///     Err(e) => assert!(e.is_cancelled()),  // stopped before it started
    /// }
    /// assert!(reads.metrics().stopped);
    ///
    /// // A token cancelled already stops the group at once.
    /// let done = pool.group().stop_on(request.child_token());
    /// assert!(done.metrics().stopped);
    /// # Ok(()) }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio-util")))]
    pub fn stop_on(self, token: CancellationToken) -> JobGroup {
        if token.is_cancelled() {
            self.stop();
            return self;
        }
        let inner = self.pool.inner().clone();
        let key = self.key();
        let Some(list) = inner.lock().groups.watch(key) else {
            return self;
        };
        // Lets go of the record when dropped, fired or not (promise 3).
        let hold = GroupHold {
            inner: inner.clone(),
            key,
        };
        spawn_watch(async move {
            let mut waiter = list.registration();
            let ended = poll_fn(|cx| {
                // Registered before the test: a wake-up after it is not
                // lost (the record wakes the list when the group ends).
                waiter.set(cx.waker());
                if inner.lock().groups.ended(key) {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            });
            watch(token.cancelled(), ended, move || {
                crate::api::group::stop_group(&hold.inner, hold.key);
            })
            .await;
        });
        self
    }
}

/// A watch's hold on a group's record (G3 of `state/groups.rs`): the
/// group can be stopped through it after its last handle is gone; dropped,
/// it lets go.
struct GroupHold {
    inner: Arc<Inner>,
    key: Key,
}

impl Drop for GroupHold {
    fn drop(&mut self) {
        let mut after = After::default();
        self.inner.lock().groups.unwatch(self.key, &mut after);
        self.inner.after(after);
    }
}

/// What an offload that follows tokens carries until it is accepted.
pub(crate) struct Follow {
    tokens: Vec<CancellationToken>,
    /// Cancelled when the function of the job last made is gone (its
    /// [`Gone`], in the job's rare parts, fires).
    gone: CancellationToken,
}

impl Follow {
    /// Adds `token` to those `follow` follows.
    pub(crate) fn add(follow: &mut Option<Follow>, token: CancellationToken) {
        match follow {
            Some(follow) => follow.tokens.push(token),
            None => {
                *follow = Some(Follow {
                    tokens: vec![token],
                    gone: CancellationToken::new(),
                });
            }
        }
    }

    /// The guard of a new attempt to accept the job: a fresh one each
    /// time, since a refused attempt's guard fires as its job is dropped.
    pub(crate) fn attempt(&mut self) -> Gone {
        self.gone = CancellationToken::new();
        Gone(self.gone.clone())
    }

    /// Whether a followed token is cancelled already.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.tokens.iter().any(CancellationToken::is_cancelled)
    }

    /// The tokens `follow` follows (none without one).
    pub(crate) fn tokens(follow: Option<&Follow>) -> Vec<CancellationToken> {
        follow.map_or_else(Vec::new, |f| f.tokens.clone())
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
        if self.is_cancelled() {
            stop();
            return;
        }
        let Follow { tokens, gone } = self;
        spawn_watch(async move {
            watch(any_cancelled(tokens), gone.cancelled(), stop).await;
        });
    }
}

/// `room` (a wait for queue room), ended early when one of `follows`, the
/// tokens the waiting job follows, is cancelled.
pub(crate) async fn or_cancelled(room: impl Future<Output = ()>, follows: &[CancellationToken]) {
    if follows.is_empty() {
        return room.await;
    }
    let mut room = pin!(room);
    let mut cancelled = pin!(any_cancelled(follows.to_vec()));
    poll_fn(|cx| {
        if cancelled.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        room.as_mut().poll(cx)
    })
    .await;
}

/// Completes when one of `tokens` is cancelled (never, for none).
async fn any_cancelled(tokens: Vec<CancellationToken>) {
    let mut waits: Vec<Pin<Box<WaitForCancellationFutureOwned>>> = tokens
        .into_iter()
        .map(|t| Box::pin(t.cancelled_owned()))
        .collect();
    poll_fn(|cx| {
        // Every one still pending has been polled with this task's waker.
        if waits.iter_mut().any(|w| w.as_mut().poll(cx).is_ready()) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
}

/// Runs `act` when `fired` completes, unless `ended` does first: not on
/// the watch thread but on one of the [`STOP_THREADS`] of its blocking
/// pool, since `act` runs user code that may block (promise 4).
async fn watch(
    fired: impl Future<Output = ()>,
    ended: impl Future<Output = ()>,
    act: impl FnOnce() + Send + 'static,
) {
    let mut fired = pin!(fired);
    let mut ended = pin!(ended);
    let fired = poll_fn(|cx| {
        if fired.as_mut().poll(cx).is_ready() {
            return Poll::Ready(true);
        }
        ended.as_mut().poll(cx).map(|()| false)
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
/// next one if it could not be), and at most [`STOP_THREADS`] more that
/// run the stops of fired watches, started as needed and ended when idle.
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
        .max_blocking_threads(STOP_THREADS)
        .thread_name("offloader-stopper")
        .build()?;
    let handle = runtime.handle().clone();
    std::thread::Builder::new()
        .name("offloader-stop-on".into())
        .spawn(move || runtime.block_on(std::future::pending::<()>()))?;
    *slot = Some(handle.clone());
    Ok(handle)
}

impl StopToken {
    /// A [`CancellationToken`] that is cancelled when stop is requested on this
    /// token (at once if it already was), for async code that watches a job's
    /// stop request, or that hands it to a tokio-util API.
    ///
    /// Each call gives a new token (a child of one the stop cancels, so that
    /// however many are asked for, one stop callback is registered, and a
    /// dropped token leaves nothing behind); it holds nothing of the job's
    /// alive. That one callback takes the place of the first call among the
    /// token's callbacks, which run newest first: every token asked for later
    /// is cancelled in that place too.
    ///
    /// ```
    /// let stop = offloader::StopToken::new();
    /// let token = stop.cancellation_token();
    /// assert!(!token.is_cancelled());
    /// stop.request_stop();
    /// assert!(token.is_cancelled());
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio-util")))]
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

    /// Held by each test that counts watches: the count is theirs (the
    /// only tests of this binary that make watches).
    static COUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn counting() -> std::sync::MutexGuard<'static, ()> {
        COUNTING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

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

    /// A group's watch ends when the group has ended (here: its last handle
    /// gone, with no job; no task is left waiting on the token); a job's,
    /// when its function has run.
    #[test]
    fn watches_end_with_their_group_or_job() {
        let _counting = counting();
        let pool = crate::core::pool::Offloader::builder()
            .build()
            .expect("pool");
        let token = CancellationToken::new();
        let before = watches();
        let group = pool.group().stop_on(token.clone());
        assert_eq!(watches(), before + 1, "the group's watch");
        drop(group);
        eventually("the group's watch ended", || watches() == before);

        // A server-wide token followed by many jobs: no watch is left.
        for i in 0..100 {
            let mut job = pool
                .offload(move |_stop| i)
                .stop_on(token.clone())
                .spawn()
                .expect("accepted");
            assert_eq!(job.blocking_wait(None).ok(), Some(i));
        }
        eventually("every job's watch ended", || watches() == before);
        assert!(!token.is_cancelled());

        // A job following three tokens has one watch.
        let mut job = pool
            .offload(|_stop| 3)
            .stop_on(token.clone())
            .stop_on(token.child_token())
            .stop_on(CancellationToken::new())
            .spawn()
            .expect("accepted");
        assert_eq!(job.blocking_wait(None).ok(), Some(3));
        eventually("the job's one watch ended", || watches() == before);
    }

    /// A group's watch holds its record past its last handle while a job
    /// of the group runs, or a child group lives (a token cancelled then
    /// still stops them), and ends once the group has ended: the record is
    /// not kept for good.
    #[test]
    fn a_groups_watch_ends_when_the_group_has_ended() {
        let _counting = counting();
        let pool = crate::core::pool::Offloader::builder()
            .build()
            .expect("pool");
        let token = CancellationToken::new();
        let before = watches();
        let groups = || pool.inner().lock().groups.len();
        let records = groups();

        let group = pool.group().stop_on(token.clone());
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (started_tx, started) = std::sync::mpsc::channel();
        let mut job = group
            .offload(move |_stop| {
                started_tx.send(()).ok();
                held.recv().ok();
            })
            .spawn()
            .expect("accepted");
        started.recv().expect("started");
        drop(group);
        assert_eq!(
            watches(),
            before + 1,
            "the watch holds on while the job runs"
        );
        assert_eq!(groups(), records + 1, "and so does the record");
        release.send(()).expect("the job waits");
        job.blocking_wait(None).expect("ran");
        eventually("the group's watch ended", || watches() == before);
        eventually("the record freed", || groups() == records);

        let parent = pool.group().stop_on(token.clone());
        let child = parent.child();
        drop(parent);
        assert_eq!(watches(), before + 1, "the child may still get jobs");
        drop(child);
        eventually("the parent's watch ended", || watches() == before);
        eventually("both records freed", || groups() == records);
        assert!(!token.is_cancelled());
    }
}
