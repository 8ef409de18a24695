//! Waiting for idleness and termination (shutdown.rs inv. 1 and 2), async
//! and blocking, with the retired threads joined off the waiting thread,
//! and the waits refused that could never end on the pool's own threads.

use std::future::poll_fn;
use std::task::Poll;
use std::time::{Duration, Instant};

use crate::core::pool::Inner;
use crate::core::state::{State, Wait};
use crate::core::waits::Waiting;
use crate::util::sync::Arc;

/// Waits until `settled` holds (inv. 2, async side). Retired threads that
/// nobody joined yet are joined on the way, off the async thread.
pub(crate) async fn wait(inner: &Arc<Inner>, awaited: Awaited) {
    refuse_self_wait(inner, awaited);
    wait_settled(inner, awaited).await;
}

/// [`wait`] without the refusal of waits that could never end on the
/// pool's own threads: for a wait that has a limit of its own (`close`).
///
/// Retired threads are handed to a short-lived joiner ([`join_elsewhere`])
/// and the wait goes on watching the state, not the joiner: their join
/// settles in the state ([`State::joined`]), which signals this waiter. A
/// waiter that waited on the joiner instead could miss the moment under a
/// paused test clock: the clock is let go once the state says terminated
/// (`State::stalled`), and the joiner's own signal comes after that.
pub(crate) async fn wait_settled(inner: &Arc<Inner>, awaited: Awaited) {
    let settled = awaited.settled();
    // Counted so that transitions signal it ([`State::settle_check`]).
    let _registered = Waiting::new(inner, Wait::Settle);
    let mut waker = inner.progress.registration();
    // Under a paused test clock, waiting for pool work holds the clock.
    let mut hold = None;
    poll_fn(|cx| {
        // Registered before the test: a signal after it is not lost.
        waker.set(cx.waker());
        let mut s = inner.lock();
        if settled(&s) {
            return Poll::Ready(());
        }
        let exited = if s.threads_retired() {
            s.workers.take_exited()
        } else {
            Vec::new()
        };
        drop(s);
        // A thread still exiting is pool work too.
        if hold.is_none() {
            hold = inner.clock_holds.hold();
        }
        if !exited.is_empty() {
            join_elsewhere(JoinOnDrop {
                inner: inner.clone(),
                handles: exited,
            });
        }
        Poll::Pending
    })
    .await;
}

/// Joins `pending` on a short-lived helper thread (never on an async
/// thread, nor on tokio's blocking pool: under a paused test clock this
/// pool's clock hold may take its only thread, `max_blocking_threads(1)`,
/// for as long as a wait lasts); if none can be spawned, here.
pub(crate) fn join_elsewhere(pending: JoinOnDrop) {
    #[cfg(not(loom))]
    {
        let name = format!("{}-reaper", pending.inner.config.thread_name);
        // On failure the closure, and with it `pending`, is dropped here:
        // the join happens inline.
        let _ = std::thread::Builder::new()
            .name(name)
            .spawn(move || drop(pending));
    }
    #[cfg(loom)]
    drop(pending);
}

/// Retired threads' handles that are joined (and settled in the pool's
/// state) when this is dropped, wherever that happens.
pub(crate) struct JoinOnDrop {
    pub(crate) inner: Arc<Inner>,
    pub(crate) handles: Vec<crate::util::sync::thread::JoinHandle<()>>,
}

impl Drop for JoinOnDrop {
    fn drop(&mut self) {
        self.inner.join(std::mem::take(&mut self.handles));
    }
}

/// What a caller waits for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Awaited {
    Idle,
    Termination,
}

impl Awaited {
    fn settled(self) -> fn(&State) -> bool {
        match self {
            Awaited::Idle => State::is_idle,
            Awaited::Termination => State::is_terminated,
        }
    }
}

/// Some waits without a limit could never end on the pool's own threads: a
/// clear panic (caught and logged by the delivery thread; the job's outcome
/// on a worker) instead of a silent deadlock. Idleness and termination
/// include delivering every event, the one the observer is handling too;
/// termination, every worker thread's exit, this one's too; idleness, the
/// end of every job, the one running on this worker too, or, between jobs
/// (a waker, a result's drop), the publication of the one it just ran.
fn refuse_self_wait(inner: &Inner, awaited: Awaited) {
    if inner.is_delivery_thread() {
        panic!(
            "offloader: idle() or termination awaited from the pool's own observer; it waits \
             for the delivery of the event being delivered and would never return (a timeout \
             around it would only ever time out). Use blocking_await_termination(Some(limit)), \
             which answers false at once here, or wait from another task."
        );
    }
    if !inner.is_worker_thread() {
        return;
    }
    match awaited {
        Awaited::Termination => panic!(
            "offloader: termination awaited on one of the pool's own worker threads; it waits \
             for this thread to exit and would never return (a timeout around it would only \
             ever time out). Use blocking_await_termination(Some(limit)), which answers false \
             at once here, or wait from outside the pool."
        ),
        // Between jobs too: the job this worker just ran stays counted as
        // unpublished until its next lock, after the wakers and drops it
        // runs now.
        Awaited::Idle => panic!(
            "offloader: idle() awaited on one of the pool's own worker threads (from a job, or \
             a waker or drop the worker runs); it waits for this thread's work to end and would \
             never return. Wait from outside the pool."
        ),
    }
}

/// Blocks until `awaited` holds or `until` passes (inv. 2, blocking side).
pub(crate) fn blocking_wait(inner: &Inner, awaited: Awaited, until: Option<Instant>) -> bool {
    if until.is_none() {
        refuse_self_wait(inner, awaited);
    }
    let settled = awaited.settled();
    let _registered = Waiting::new(inner, Wait::Settle);
    let mut s = inner.lock();
    loop {
        if settled(&s) {
            return true;
        }
        if s.threads_retired() {
            let exited = s.workers.take_exited();
            if !exited.is_empty() {
                drop(s);
                inner.join(exited);
                s = inner.lock();
                continue;
            }
        }
        let wait = match until {
            None => Duration::from_secs(3600),
            Some(until) => {
                let now = Instant::now();
                if now >= until {
                    return false;
                }
                until - now
            }
        };
        s = match inner.changed.wait_timeout(s, wait) {
            Ok((g, _)) => g,
            Err(poisoned) => poisoned.into_inner().0,
        };
    }
}
