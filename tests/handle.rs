//! The owner handle, `JobHandle<T>`: waiting without being consumed, waiting
//! from synchronous code, detaching, state and `is_finished`, and a spawned
//! job's own wait limit.

mod support;

use std::future::{Future, IntoFuture};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use offloader::{Error, Fate, JobState, DEFAULT_QUEUE_CAPACITY};
use support::*;

fn assert_timed_out(err: &Error, want_state: JobState) {
    match err {
        Error::TimedOut { state, fate, .. } => {
            assert_eq!(*state, Some(want_state), "{err}");
            assert_eq!(*fate, Fate::Kept, "{err}");
        }
        other => panic!("expected Error::TimedOut, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_timeout_around_the_handle_leaves_it_usable() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let (started_tx, mut started) = signal::<()>();
    let (g, hold) = gate();
    let mut h = pool
        .offload(move |_stop| {
            started_tx.send(()).expect("test alive");
            hold.wait();
            "value"
        })
        .name("held")
        .spawn()
        .expect("accepted");
    recv("started", &mut started).await;

    tokio::time::timeout(SHORT, &mut h)
        .await
        .expect_err("held on a gate");
    assert_eq!(h.state(), JobState::Running);
    // Twice: still usable, still running.
    tokio::time::timeout(SHORT, &mut h)
        .await
        .expect_err("still held");
    assert!(!h.is_finished());
    assert_eq!(h.state(), JobState::Running);
    assert_eq!(h.name(), Some("held"));
    let m = pool.metrics();
    assert_eq!(
        (m.running, (m.callers_timed_out + m.callers_dropped)),
        (1, 0),
        "{m:?}"
    );

    g.open();
    assert_eq!(within("handle after timeouts", h).await.unwrap(), "value");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_wait_with_a_limit_on_a_queued_job_reports_queued() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let blocker = occupy(&pool, 1).await;
    let mut h = pool.offload(|_stop| 5).spawn().expect("accepted");
    let err = h
        .blocking_wait(Some(SHORT))
        .expect_err("queued behind a held job");
    assert_timed_out(&err, JobState::Queued);
    assert_eq!(err.job_id(), Some(h.id()));
    blocker.release().await;
    assert_eq!(within("queued job", &mut h).await.unwrap(), 5);
    // The outcome was taken; a second wait says so instead of hanging.
    let again = within("second await", &mut h).await.unwrap_err();
    assert!(
        matches!(again, Error::OutcomeTaken { id: Some(id) } if id == h.id()),
        "{again:?}"
    );
}

/// A blocking wait with a limit that the outcome beats returns the
/// outcome: the waiter, seen asleep in its wait before the job is let go,
/// is woken by the publish, not by its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_wait_with_a_limit_returns_the_outcome_that_beats_it() {
    const WAITER: &str = "limited-waiter";
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let (g, hold) = gate();
    let mut h = pool
        .offload(move |_stop| {
            hold.wait();
            7u8
        })
        .spawn()
        .expect("accepted");
    let (done_tx, done) = mpsc::channel();
    let waiter = std::thread::Builder::new()
        .name(WAITER.into())
        .spawn(move || {
            let out = h.blocking_wait(Some(HANG));
            done_tx.send(()).expect("test alive");
            out
        })
        .expect("spawned");
    // Asleep in its wait, or (wrongly) back from it already.
    eventually("the limited waiter asleep", || {
        sleeping_threads_named(WAITER) == 1 || done.try_recv().is_ok()
    })
    .await;
    g.open();
    let out = within(
        "the limited waiter",
        tokio::task::spawn_blocking(move || waiter.join()),
    )
    .await
    .expect("joined")
    .expect("the waiter did not panic");
    assert_eq!(out.expect("the outcome, before the limit"), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_wait_from_a_plain_std_thread() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let (started_tx, mut started) = signal::<()>();
    let (g, hold) = gate();
    let mut h = pool
        .offload(move |_stop| {
            started_tx.send(()).expect("test alive");
            hold.wait();
            String::from("from a worker")
        })
        .spawn()
        .expect("accepted");
    let (waiting_tx, waiting_rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        waiting_tx.send(()).expect("test alive");
        h.blocking_wait(None)
    });
    recv("started", &mut started).await;
    waiting_rx.recv_timeout(HANG).expect("waiter thread runs");
    g.open();
    let out = tokio::task::spawn_blocking(move || waiter.join())
        .await
        .expect("join task")
        .expect("waiter thread did not panic");
    assert_eq!(out.unwrap(), "from a worker");
}

/// No async runtime at all: spawn, wait with and without a limit.
#[test]
fn blocking_waits_work_without_any_runtime() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let (started_tx, started_rx) = mpsc::channel();
    let (g, hold) = gate();
    let mut h = pool
        .offload(move |_stop| {
            started_tx.send(()).expect("test alive");
            hold.wait();
            41 + 1
        })
        .spawn()
        .expect("spawn needs no runtime");
    started_rx.recv_timeout(HANG).expect("started");

    let err = h.blocking_wait(Some(SHORT)).expect_err("held on a gate");
    assert_timed_out(&err, JobState::Running);
    assert!(!h.is_finished());

    g.open();
    assert_eq!(h.blocking_wait(Some(HANG)).unwrap(), 42);
    assert!(h.is_finished());
    assert!(matches!(
        h.blocking_wait(Some(HANG)),
        Err(Error::OutcomeTaken { .. })
    ));

    let mut h = pool.offload(|_stop| "plain").spawn().expect("accepted");
    assert_eq!(h.blocking_wait(None).unwrap(), "plain");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detach_keeps_the_job_running() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let (started_tx, mut started) = signal::<()>();
    let (ran_tx, mut ran) = signal::<&'static str>();
    let (g, hold) = gate();
    let h = pool
        .offload(move |_stop| {
            started_tx.send(()).expect("test alive");
            hold.wait();
            ran_tx.send("detached ran").expect("test alive");
        })
        .spawn()
        .expect("accepted");
    recv("started", &mut started).await;
    h.detach();
    assert_eq!(pool.metrics().running, 1);
    g.open();
    assert_eq!(
        recv("detached job finishes", &mut ran).await,
        "detached ran"
    );
    drain_single(&pool).await;
    let m = pool.metrics();
    assert_eq!((m.completed, m.running, m.cancelled), (2, 0, 0), "{m:?}");
    assert_ledger(&m);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_handle_detaches_queued_and_running_jobs() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let (started_tx, mut started) = signal::<()>();
    let (ran_tx, mut ran) = signal::<&'static str>();
    let (g, hold) = gate();
    let tx = ran_tx.clone();
    let running = pool
        .offload(move |_stop| {
            started_tx.send(()).expect("test alive");
            hold.wait();
            tx.send("running one").expect("test alive");
        })
        .spawn()
        .expect("accepted");
    recv("started", &mut started).await;
    let tx = ran_tx.clone();
    let queued = pool
        .offload(move |stop| {
            // Dropping a handle must not stop the job.
            let msg = if stop.is_stopped() {
                "queued one, stopped"
            } else {
                "queued one"
            };
            tx.send(msg).expect("test alive");
        })
        .spawn()
        .expect("accepted");
    assert_eq!(queued.state(), JobState::Queued);
    drop(running);
    drop(queued);
    let m = pool.metrics();
    assert_eq!((m.running, m.queued, m.cancelled), (1, 1, 0), "{m:?}");
    g.open();
    assert_eq!(recv("running one", &mut ran).await, "running one");
    assert_eq!(recv("queued one", &mut ran).await, "queued one");
    drain_single(&pool).await;
    let m = pool.metrics();
    assert_eq!((m.completed, m.panicked, m.cancelled), (3, 0, 0), "{m:?}");
    // A dropped handle is not a caller that left: there was nobody waiting.
    assert_eq!(m.stop_requests, 0, "{m:?}");
    assert_ledger(&m);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn is_finished_turns_true_once_the_outcome_is_ready() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let (started_tx, mut started) = signal::<()>();
    let (g, hold) = gate();
    let a = pool
        .offload(move |_stop| {
            started_tx.send(()).expect("test alive");
            hold.wait();
            "a"
        })
        .spawn()
        .expect("accepted");
    recv("a started", &mut started).await;
    assert!(!a.is_finished());
    let b = pool.offload(|_stop| "b").spawn().expect("accepted");
    assert!(!b.is_finished());
    g.open();
    // One worker, in order: once b's outcome is here, a's was published.
    assert_eq!(within("b", b).await.unwrap(), "b");
    assert!(a.is_finished(), "a finished before b started");
    assert_eq!(a.state(), JobState::Completed);
    assert_eq!(within("a", a).await.unwrap(), "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_goes_queued_running_completed() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let blocker = occupy(&pool, 1).await;
    let (started_tx, mut started) = signal::<()>();
    let (g, hold) = gate();
    let mut h = pool
        .offload(move |_stop| {
            started_tx.send(()).expect("test alive");
            hold.wait();
            9
        })
        .spawn()
        .expect("accepted");
    assert_eq!(h.state(), JobState::Queued);
    assert!(!h.state().is_terminal());

    blocker.release().await;
    recv("started", &mut started).await;
    assert_eq!(h.state(), JobState::Running);
    assert!(!h.is_finished());

    g.open();
    assert_eq!(within("job", &mut h).await.unwrap(), 9);
    assert_eq!(h.state(), JobState::Completed);
    assert!(h.state().is_terminal());
    assert!(h.is_finished());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awaiting_mut_handle_after_its_spawned_timeout() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let (started_tx, mut started) = signal::<bool>();
    let (g, hold) = gate();
    let mut h = pool
        .offload(move |stop| {
            started_tx
                .send(stop.deadline().is_some())
                .expect("test alive");
            hold.wait();
            "late but kept"
        })
        .with_timeout(SHORT)
        .spawn()
        .expect("accepted");
    assert!(
        recv("started", &mut started).await,
        "a spawned job's timeout is its deadline"
    );

    // The first await is bounded by the spawn's with_timeout.
    let err = within("first await", &mut h).await.unwrap_err();
    assert_timed_out(&err, JobState::Running);
    assert_eq!(err.job_id(), Some(h.id()));
    // Under the default policy (`Keep`) the handle's timeout keeps the job.
    assert!(!h.is_stopped());
    assert_eq!(h.state(), JobState::Running);
    assert_eq!(pool.metrics().cancelled, 0);
    // It is counted as a caller who timed out (Metrics docs).
    assert_eq!(pool.metrics().callers_timed_out, 1);

    // Later awaits wait without the limit.
    g.open();
    assert_eq!(
        within("second await", &mut h).await.unwrap(),
        "late but kept"
    );
    assert_eq!(h.state(), JobState::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_on_a_queued_job_starts_it_with_the_token_stopped() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let blocker = occupy(&pool, 1).await;
    let h = pool
        .offload(|stop| stop.is_stopped())
        .spawn()
        .expect("accepted");
    assert!(h.stop());
    assert!(h.is_stopped());
    assert_eq!(h.state(), JobState::Queued);
    blocker.release().await;
    assert!(
        within("stopped job", h).await.unwrap(),
        "the function must see its token already stopped"
    );
    assert_eq!(pool.metrics().stop_requests, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_are_unique_and_increasing_and_names_are_kept() {
    let pool = pool(2, DEFAULT_QUEUE_CAPACITY);
    let a = pool.offload(|_stop| ()).name("first").spawn().unwrap();
    let b = pool.offload(|_stop| ()).spawn().unwrap();
    assert!(a.id() < b.id());
    assert_ne!(a.id().as_u64(), b.id().as_u64());
    assert_eq!(a.name(), Some("first"));
    assert_eq!(b.name(), None);
    let dbg = format!("{a:?}");
    assert!(dbg.contains("first"), "{dbg}");
    // Unique in the process, not per pool: a second pool's job neither
    // repeats an id nor goes back in order.
    let other = support::pool(1, DEFAULT_QUEUE_CAPACITY);
    let c = other.offload(|_stop| ()).spawn().unwrap();
    assert!(b.id() < c.id(), "{:?} then {:?}", b.id(), c.id());
    assert_ne!(a.id().as_u64(), 0);
    within("a", a).await.unwrap();
    within("b", b).await.unwrap();
    within("c", c).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_job_may_outlive_every_offloader_clone() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let (started_tx, mut started) = signal::<()>();
    let (g, hold) = gate();
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let h = pool
        .offload(move |_stop| {
            started_tx.send(()).expect("test alive");
            hold.wait();
            d.store(true, Ordering::SeqCst);
            "survived"
        })
        .spawn()
        .expect("accepted");
    recv("started", &mut started).await;
    drop(pool); // graceful shutdown: running work still runs
    g.open();
    assert_eq!(
        within("handle outlives the pool", h).await.unwrap(),
        "survived"
    );
    assert!(done.load(Ordering::SeqCst));
}

/// A handle first polled under one waker and then awaited under another
/// must wake the second (kills the `will_wake` survivor: keeping a stale
/// waker loses the wake-up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_polled_with_one_waker_wakes_the_next_one() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let (open, hold) = support::gate();
    let (started_tx, mut started) = support::signal::<()>();
    let mut job = pool
        .offload(move |_stop| {
            let _ = started_tx.send(());
            hold.wait();
            7
        })
        .spawn()
        .expect("room");
    support::recv("started", &mut started).await;
    // First poll under a waker nobody listens to.
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(std::future::Future::poll(std::pin::Pin::new(&mut job), &mut cx).is_pending());
    // Then await it in a task: only this task's waker can finish it. The
    // task says when its first poll has registered its waker, and only then
    // is the function released.
    let (polled_tx, polled) = tokio::sync::oneshot::channel::<()>();
    let waiter = tokio::spawn(async move {
        let mut polled_tx = Some(polled_tx);
        std::future::poll_fn(|cx| {
            let poll = std::future::Future::poll(std::pin::Pin::new(&mut job), cx);
            if poll.is_pending() {
                if let Some(tx) = polled_tx.take() {
                    let _ = tx.send(());
                }
            }
            poll
        })
        .await
    });
    support::within("the task's first poll", polled)
        .await
        .expect("task alive");
    open.open();
    assert_eq!(
        support::within("the second waker", waiter)
            .await
            .expect("task")
            .expect("ran"),
        7
    );
}

/// A cancelled job answers every wait after it with `Cancelled`, async and
/// blocking, again and again; its handle reads finished, and a second
/// cancel fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_job_answers_every_wait() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let blocker = occupy(&pool, 1).await;
    let mut h = pool.offload(|_stop| 7u64).spawn().expect("accepted");
    assert!(!h.is_finished());
    assert!(h.cancel(), "queued, so the cancel wins");
    assert!(!h.cancel(), "a second cancel finds it cancelled");
    assert!(h.is_finished());
    assert_eq!(h.state(), JobState::Cancelled);
    for _ in 0..2 {
        let err = within("cancelled", &mut h).await.expect_err("cancelled");
        assert!(matches!(err, Error::Cancelled { id: Some(_) }), "{err:?}");
        let err = h.blocking_wait(Some(HANG)).expect_err("cancelled");
        assert!(matches!(err, Error::Cancelled { id: Some(_) }), "{err:?}");
    }
    let err = within("the handle", h).await.expect_err("cancelled");
    assert!(matches!(err, Error::Cancelled { id: Some(_) }), "{err:?}");
    blocker.release().await;
    let m = pool.metrics();
    assert_ledger(&m);
    assert_eq!((m.cancelled, m.completed), (1, 1), "{m:?}");
}

/// Waiters already parked on queued jobs, async and blocking, are woken
/// when `shutdown_now` discards the jobs unrun (nothing polls them again
/// otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_parked_on_queued_jobs_are_woken_by_their_discard() {
    const WAITER: &str = "discard-waiter";
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let blocker = occupy(&pool, 1).await;
    // An awaited caller on a task of its own, which says when its first
    // poll returned `Pending` (its waker registered).
    let (pending_tx, mut pending) = signal::<()>();
    let call = pool.offload(|_stop| 1u64).into_future();
    let awaited = tokio::spawn(async move {
        let mut call = std::pin::pin!(call);
        let mut first = true;
        std::future::poll_fn(|cx| {
            let poll = call.as_mut().poll(cx);
            if std::mem::take(&mut first) && poll.is_pending() {
                pending_tx.send(()).expect("test alive");
            }
            poll
        })
        .await
    });
    recv("the awaited caller pending", &mut pending).await;
    // A blocking waiter on a thread of its own, seen asleep in its wait.
    let mut h = pool.offload(|_stop| 2u64).spawn().expect("accepted");
    let blocking = std::thread::Builder::new()
        .name(WAITER.into())
        .spawn(move || h.blocking_wait(None))
        .expect("spawned");
    eventually("the blocking waiter asleep", || {
        sleeping_threads_named(WAITER) == 1
    })
    .await;

    let unstarted = pool.shutdown_now();
    assert_eq!(unstarted.len(), 2, "both queued jobs handed back");
    let err = within("the awaited caller", awaited)
        .await
        .expect("the task did not panic")
        .expect_err("unstarted");
    assert!(
        matches!(err, Error::ShuttingDown { id: Some(_) }),
        "{err:?}"
    );
    let err = within(
        "the blocking waiter",
        tokio::task::spawn_blocking(move || blocking.join()),
    )
    .await
    .expect("joined")
    .expect("the waiter did not panic")
    .expect_err("unstarted");
    assert!(
        matches!(err, Error::ShuttingDown { id: Some(_) }),
        "{err:?}"
    );
    blocker.release().await;
}

/// A value whose drop panics (user code).
struct PanicsOnDrop;

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        panic!("on purpose: a drop that panics");
    }
}

/// Dropping a handle whose published outcome nobody took drops that
/// outcome, and a panic of its drop (a result's, or a panic payload's) is
/// caught there as the worker catches it: it does not unwind out of the
/// handle's drop (found by a hostile review: it did, and during an unwind
/// it aborted the process).
#[test]
fn dropping_a_handle_catches_a_panic_of_its_outcome_s_drop() {
    quiet_deliberate_panics();
    let pool = pool(1, 4);
    let value = pool
        .offload(|_stop| PanicsOnDrop)
        .spawn()
        .expect("accepted");
    let payload = pool
        .offload(|_stop| -> () { std::panic::panic_any(PanicsOnDrop) })
        .spawn()
        .expect("accepted");
    fn drop_finished<T>(handle: offloader::JobHandle<T>) {
        eventually_blocking("the outcome published", || handle.is_finished());
        let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(handle)));
        assert!(dropped.is_ok(), "the drop's panic escaped the handle");
    }
    drop_finished(value);
    drop_finished(payload);
    eventually_blocking("the pool idle", || pool.is_idle());
    assert_ledger(&pool.metrics());
}
