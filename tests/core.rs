//! Core contract of the offloader: permits held for the real lifetime,
//! caller timeouts and drops under every abandon policy, cancel, panics,
//! thread-spawn failures, the queue bound, the free function and shutdown
//! refusals.
//!
//! Every "the function is running" is a message the function sends; every
//! "the function may return" is a gate the test opens. The short caller
//! timeouts only bound waits on functions that are held on a gate.

mod support;

use std::future::IntoFuture;
use std::pin::Pin;
use std::sync::atomic::Ordering;

use offloader::{
    AbandonPolicy, Error, Fate, JobId, JobState, Metrics, OffloadFuture, Offloader, StopToken,
    DEFAULT_QUEUE_CAPACITY,
};
use support::*;
use tokio::sync::mpsc::error::TryRecvError;

fn timed_out_parts(err: &Error) -> (JobId, JobState, Fate) {
    match err {
        Error::TimedOut {
            id: Some(id),
            state: Some(state),
            fate,
            ..
        } => (*id, *state, *fate),
        other => panic!("expected Error::TimedOut, got {other:?}"),
    }
}

/// Pins an awaited offload and polls it once so that it is accepted and its
/// job id known; it must still be pending.
async fn accepted<F, T>(fut: OffloadFuture<F, T>) -> (Pin<Box<OffloadFuture<F, T>>>, JobId)
where
    F: FnOnce(&StopToken) -> T + Send + 'static,
    T: Send + 'static,
{
    let mut fut = Box::pin(fut);
    assert!(
        poll_once(fut.as_mut()).await.is_pending(),
        "the offload finished on its first poll, but its function is held on a gate"
    );
    let id = fut
        .job_id()
        .expect("an awaited offload is accepted on its first poll when the queue has room");
    (fut, id)
}

// ---------------------------------------------------------------------------
// 1. Permit = real lifetime
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_is_held_for_the_functions_real_lifetime() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let conc = Concurrency::default();
    let (started_tx, mut started) = signal::<&'static str>();

    // First job: held on a gate; its caller gives up waiting.
    let (gate_a, hold_a) = gate();
    let (c, tx) = (conc.clone(), started_tx.clone());
    let (first, first_id) = accepted(
        pool.offload(move |_stop| {
            let _in = c.enter();
            tx.send("a").expect("test alive");
            hold_a.wait();
            "a done"
        })
        .with_timeout(SHORT)
        .into_future(),
    )
    .await;
    assert_eq!(recv("first started", &mut started).await, "a");

    let err = within("first caller's timeout", first)
        .await
        .expect_err("the function is held, so the caller must time out");
    let (id, state, fate) = timed_out_parts(&err);
    assert_eq!(id, first_id);
    assert_eq!(state, JobState::Running);
    assert_eq!(fate, Fate::Kept);
    assert!(err.is_timeout());
    assert_eq!(err.job_id(), Some(first_id));

    // The caller left; the function still runs and still holds the permit.
    let m = pool.metrics();
    assert_eq!(m.running, 1, "{m:?}");
    assert_eq!((m.callers_timed_out, m.callers_dropped), (1, 0), "{m:?}");
    assert_eq!(m.running_after_caller_left, 1, "{m:?}");

    // Second job: must not start while the first function is held.
    let (c, tx) = (conc.clone(), started_tx.clone());
    let mut second = pool
        .offload(move |_stop| {
            let _in = c.enter();
            tx.send("b").expect("test alive");
            "b done"
        })
        .spawn()
        .expect("accepted");
    let m = pool.metrics();
    assert_eq!((m.running, m.queued), (1, 1), "{m:?}");
    assert_ledger(&m);
    assert_eq!(started.try_recv(), Err(TryRecvError::Empty));
    assert_eq!(second.state(), JobState::Queued);

    // Give a broken pool every chance to start it anyway.
    let err = second
        .blocking_wait(Some(SHORT))
        .expect_err("the second job cannot run while the first holds the only permit");
    assert_eq!(timed_out_parts(&err).1, JobState::Queued);
    assert_eq!(started.try_recv(), Err(TryRecvError::Empty));
    let m = pool.metrics();
    assert_eq!((m.running, m.queued), (1, 1), "{m:?}");
    assert_eq!(conc.now(), 1);

    // Release the first function: only now may the second start.
    gate_a.open();
    assert_eq!(recv("second started", &mut started).await, "b");
    assert_eq!(within("second outcome", second).await.unwrap(), "b done");

    assert_eq!(
        conc.max(),
        1,
        "two functions ran at once under a limit of 1"
    );
    let m = pool.metrics();
    assert_eq!(m.max_running, 1, "{m:?}");
    assert_eq!(m.completed, 2, "{m:?}");
    assert_eq!((m.running, m.queued), (0, 0), "{m:?}");
    assert_ledger(&m);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_holds_under_timeouts_drops_and_cancels_with_several_permits() {
    const LIMIT: usize = 2;
    let pool = pool(LIMIT, DEFAULT_QUEUE_CAPACITY);
    let conc = Concurrency::default();
    let (started_tx, mut started) = signal::<usize>();
    let mut gates = Vec::new();
    let mut handles = Vec::new();

    // Six jobs, each held on its own gate; callers of the awaited ones
    // time out or are dropped, the spawned ones are left alone.
    for i in 0..6 {
        let (g, hold) = gate();
        gates.push(g);
        let (c, tx) = (conc.clone(), started_tx.clone());
        let f = move |_stop: &StopToken| {
            let _in = c.enter();
            tx.send(i).expect("test alive");
            hold.wait();
            i
        };
        match i % 3 {
            0 => handles.push(pool.offload(f).spawn().expect("accepted")),
            1 => {
                let (fut, _) = accepted(pool.offload(f).into_future()).await;
                drop(fut); // caller leaves at once (Keep)
            }
            _ => {
                let err = pool
                    .offload(f)
                    .with_timeout(std::time::Duration::from_millis(1))
                    .await
                    .expect_err("held");
                assert!(err.is_timeout());
            }
        }
    }
    // At any moment at most LIMIT + (released so far) functions may have
    // started. Release them one at a time in the order they started.
    let mut order: Vec<usize> = Vec::new();
    let mut released = 0;
    while released < 6 {
        let expect = (LIMIT + released).min(6);
        while order.len() < expect {
            order.push(recv("a job starts", &mut started).await);
        }
        assert_eq!(
            started.try_recv(),
            Err(TryRecvError::Empty),
            "more functions started than permits were freed"
        );
        assert!(conc.now() <= LIMIT);
        let m = pool.metrics();
        assert!(m.running <= LIMIT as u64, "{m:?}");
        assert_ledger(&m);
        gates[order[released]].open();
        released += 1;
    }
    for h in handles {
        within("spawned job", h).await.expect("completes");
    }
    assert!(conc.max() <= LIMIT, "max concurrent {}", conc.max());
    let m = pool.metrics();
    assert!(m.max_running <= LIMIT as u64, "{m:?}");
    assert_ledger(&m);
}

// ---------------------------------------------------------------------------
// 2. Timeout while queued and while running, under each policy
// ---------------------------------------------------------------------------

struct QueuedTimeout {
    err: Error,
    id: JobId,
    ran: bool,
    after_timeout: Metrics,
    end: Metrics,
}

async fn timeout_while_queued(policy: AbandonPolicy) -> QueuedTimeout {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let blocker = occupy(&pool, 1).await;
    let ran = flag();
    let r = ran.clone();
    let (fut, id) = accepted(
        pool.offload(move |_stop| r.store(true, Ordering::SeqCst))
            .with_timeout(SHORT)
            .on_abandon(policy)
            .into_future(),
    )
    .await;
    let err = within("queued caller's timeout", fut)
        .await
        .expect_err("the only worker is held, so the job cannot finish");
    let after_timeout = pool.metrics();
    blocker.release().await;
    drain_single(&pool).await;
    QueuedTimeout {
        err,
        id,
        ran: ran.load(Ordering::SeqCst),
        after_timeout,
        end: pool.metrics(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_while_queued_keep_runs_the_job_later() {
    let t = timeout_while_queued(AbandonPolicy::Keep).await;
    assert_eq!(
        timed_out_parts(&t.err),
        (t.id, JobState::Queued, Fate::Kept)
    );
    assert_eq!(t.after_timeout.queued, 1, "{:?}", t.after_timeout);
    assert_eq!(
        t.after_timeout.callers_timed_out, 1,
        "{:?}",
        t.after_timeout
    );
    assert!(t.ran, "Keep: the abandoned job still runs");
    // blocker + abandoned job + barrier
    assert_eq!(t.end.completed, 3, "{:?}", t.end);
    assert_eq!(t.end.cancelled, 0, "{:?}", t.end);
    assert_ledger(&t.after_timeout);
    assert_ledger(&t.end);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_while_queued_cancel_if_queued_never_runs() {
    let t = timeout_while_queued(AbandonPolicy::CancelIfQueued).await;
    assert!(!t.ran, "CancelIfQueued: a queued job never runs");
    assert_eq!(t.after_timeout.cancelled, 1, "{:?}", t.after_timeout);
    assert_eq!(t.after_timeout.queued, 0, "{:?}", t.after_timeout);
    assert_eq!(t.end.cancelled, 1, "{:?}", t.end);
    assert_eq!(t.end.completed, 2, "{:?}", t.end); // blocker + barrier
    assert_ledger(&t.after_timeout);
    assert_ledger(&t.end);
    // The caller asked for a bounded wait: it gets TimedOut saying the job
    // was queued and what happened to it (Offload::with_timeout: "the wait
    // ends with Error::TimedOut and the job follows the abandon policy").
    assert_eq!(
        timed_out_parts(&t.err),
        (t.id, JobState::Queued, Fate::Cancelled)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_while_queued_cancel_and_stop_never_runs() {
    let t = timeout_while_queued(AbandonPolicy::CancelAndStop).await;
    assert!(!t.ran, "CancelAndStop: a queued job never runs");
    assert_eq!(t.after_timeout.cancelled, 1, "{:?}", t.after_timeout);
    assert_eq!(t.end.cancelled, 1, "{:?}", t.end);
    assert_eq!(t.end.stop_requests, 0, "{:?}", t.end);
    assert_ledger(&t.end);
    assert_eq!(
        timed_out_parts(&t.err),
        (t.id, JobState::Queued, Fate::Cancelled)
    );
}

struct RunningAbandon {
    /// The caller's error, for a timeout (None for a drop).
    err: Option<Error>,
    id: JobId,
    /// What the function saw: `true` if it was woken by a stop request
    /// before the test opened its first gate.
    saw_stop_before_release: bool,
    after_leave: Metrics,
    end: Metrics,
}

/// The function signals "started", waits for its first gate *or* a stop
/// request, reports which, then waits on a second gate before returning.
/// The caller leaves (time-out if `timeout`, else drop) while it is held.
async fn leave_while_running(policy: AbandonPolicy, timeout: bool) -> RunningAbandon {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let conc = Concurrency::default();
    let (started_tx, mut started) = signal::<&'static str>();
    let (report_tx, mut report) = signal::<bool>();
    let (gate1, hold1) = gate();
    let (gate2, hold2) = gate();
    let (c, tx) = (conc.clone(), started_tx.clone());
    let mut offload = pool
        .offload(move |stop| {
            let _in = c.enter();
            tx.send("first").expect("test alive");
            let stopped = hold1.wait_or_stop(stop);
            report_tx.send(stopped).expect("test alive");
            hold2.wait();
            1u32
        })
        .on_abandon(policy);
    if timeout {
        offload = offload.with_timeout(SHORT);
    }
    let (fut, id) = accepted(offload.into_future()).await;
    assert_eq!(recv("function started", &mut started).await, "first");

    let err = if timeout {
        Some(
            within("running caller's timeout", fut)
                .await
                .expect_err("the function is held"),
        )
    } else {
        drop(fut);
        None
    };
    let after_leave = pool.metrics();

    let saw_stop_before_release = if policy == AbandonPolicy::CancelAndStop {
        // Stop must reach the function without the gate being opened.
        recv("function sees the stop request", &mut report).await
    } else {
        // Nothing may wake the function but its gate.
        gate1.open();
        let stopped = recv("function released", &mut report).await;
        assert!(!stopped, "{policy:?}: the running job's stop token was set");
        false
    };

    // The function has not returned yet (second gate): it keeps its permit
    // and a second job must wait.
    let (c, tx) = (conc.clone(), started_tx.clone());
    let second = pool
        .offload(move |_stop| {
            let _in = c.enter();
            tx.send("second").expect("test alive");
        })
        .spawn()
        .expect("accepted");
    let m = pool.metrics();
    assert_eq!((m.running, m.queued), (1, 1), "{m:?}");
    assert_eq!(started.try_recv(), Err(TryRecvError::Empty));
    gate2.open();
    assert_eq!(recv("second starts", &mut started).await, "second");
    within("second", second).await.expect("completes");
    drain_single(&pool).await;
    assert_eq!(conc.max(), 1);
    RunningAbandon {
        err,
        id,
        saw_stop_before_release,
        after_leave,
        end: pool.metrics(),
    }
}

/// A timeout counts as a caller that timed out, a drop as one that dropped.
fn assert_departure_counted(r: &RunningAbandon) {
    let m = &r.after_leave;
    let want = if r.err.is_some() { (1, 0) } else { (0, 1) };
    assert_eq!((m.callers_timed_out, m.callers_dropped), want, "{m:?}");
    assert_eq!((m.callers_timed_out + m.callers_dropped), 1, "{m:?}");
}

fn assert_kept(r: &RunningAbandon) {
    assert!(!r.saw_stop_before_release);
    assert_eq!(r.after_leave.running, 1, "{:?}", r.after_leave);
    assert_departure_counted(r);
    assert_eq!(
        r.after_leave.running_after_caller_left, 1,
        "{:?}",
        r.after_leave
    );
    assert_eq!(r.end.stop_requests, 0, "{:?}", r.end);
    assert_eq!(r.end.completed, 3, "{:?}", r.end); // job + second + barrier
    assert_eq!(r.end.cancelled, 0, "{:?}", r.end);
    assert_ledger(&r.after_leave);
    assert_ledger(&r.end);
}

fn assert_stopped(r: &RunningAbandon) {
    assert!(
        r.saw_stop_before_release,
        "CancelAndStop: the running function must see its stop token set"
    );
    assert_eq!(r.after_leave.running, 1, "{:?}", r.after_leave);
    assert_eq!(r.after_leave.stop_requests, 1, "{:?}", r.after_leave);
    assert_departure_counted(r);
    assert_eq!(r.end.completed, 3, "{:?}", r.end);
    assert_eq!(r.end.cancelled, 0, "{:?}", r.end);
    assert_ledger(&r.end);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_while_running_keep() {
    let r = leave_while_running(AbandonPolicy::Keep, true).await;
    let err = r.err.as_ref().expect("timed out");
    assert_eq!(timed_out_parts(err), (r.id, JobState::Running, Fate::Kept));
    assert_kept(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_while_running_cancel_if_queued_keeps_it_running() {
    let r = leave_while_running(AbandonPolicy::CancelIfQueued, true).await;
    let err = r.err.as_ref().expect("timed out");
    assert_eq!(timed_out_parts(err), (r.id, JobState::Running, Fate::Kept));
    assert_kept(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_while_running_cancel_and_stop_sets_the_stop_token() {
    let r = leave_while_running(AbandonPolicy::CancelAndStop, true).await;
    let err = r.err.as_ref().expect("timed out");
    assert_eq!(
        timed_out_parts(err),
        (r.id, JobState::Running, Fate::StopRequested)
    );
    assert_stopped(&r);
}

// ---------------------------------------------------------------------------
// 3. Caller drop while queued and while running, under each policy
// ---------------------------------------------------------------------------

async fn drop_while_queued(policy: AbandonPolicy, pool: Offloader) -> (bool, Metrics, Metrics) {
    let blocker = occupy(&pool, 1).await;
    let ran = flag();
    let r = ran.clone();
    let mut offload = pool.offload(move |_stop| r.store(true, Ordering::SeqCst));
    if let Some(p) = Some(policy).filter(|_| policy != AbandonPolicy::Keep) {
        offload = offload.on_abandon(p);
    }
    let (fut, _id) = accepted(offload.into_future()).await;
    let m = pool.metrics();
    assert_eq!((m.running, m.queued), (1, 1), "{m:?}");
    drop(fut);
    let after_drop = pool.metrics();
    blocker.release().await;
    drain_single(&pool).await;
    (ran.load(Ordering::SeqCst), after_drop, pool.metrics())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_while_queued_keep_runs_it() {
    let (ran, after_drop, end) =
        drop_while_queued(AbandonPolicy::Keep, pool(1, DEFAULT_QUEUE_CAPACITY)).await;
    assert!(ran, "Keep: a dropped caller's job still runs");
    assert_eq!(after_drop.queued, 1, "{after_drop:?}");
    assert_eq!(after_drop.callers_dropped, 1, "{after_drop:?}");
    assert_eq!(after_drop.callers_timed_out, 0, "{after_drop:?}");
    assert_eq!(after_drop.running_after_caller_left, 0, "{after_drop:?}");
    assert_eq!(end.completed, 3, "{end:?}");
    assert_eq!(end.cancelled, 0, "{end:?}");
    assert_ledger(&after_drop);
    assert_ledger(&end);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_while_queued_cancel_if_queued_never_runs() {
    let (ran, after_drop, end) = drop_while_queued(
        AbandonPolicy::CancelIfQueued,
        pool(1, DEFAULT_QUEUE_CAPACITY),
    )
    .await;
    assert!(
        !ran,
        "CancelIfQueued: a dropped caller's queued job never runs"
    );
    assert_eq!(after_drop.queued, 0, "{after_drop:?}");
    assert_eq!(after_drop.cancelled, 1, "{after_drop:?}");
    assert_eq!(end.cancelled, 1, "{end:?}");
    assert_eq!(end.completed, 2, "{end:?}");
    assert_ledger(&after_drop);
    assert_ledger(&end);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_while_queued_cancel_and_stop_never_runs() {
    let (ran, after_drop, end) = drop_while_queued(
        AbandonPolicy::CancelAndStop,
        pool(1, DEFAULT_QUEUE_CAPACITY),
    )
    .await;
    assert!(
        !ran,
        "CancelAndStop: a dropped caller's queued job never runs"
    );
    assert_eq!(after_drop.cancelled, 1, "{after_drop:?}");
    assert_eq!(end.cancelled, 1, "{end:?}");
    assert_eq!(end.completed, 2, "{end:?}");
    assert_ledger(&end);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_default_abandon_policy_applies_to_dropped_callers() {
    let pool = Offloader::builder()
        .max_in_flight(1)
        .abandon_policy(AbandonPolicy::CancelIfQueued)
        .build()
        .expect("valid");
    // `drop_while_queued` sets no per-call policy for Keep, so the pool's
    // default (CancelIfQueued) must apply.
    let (ran, after_drop, _end) = drop_while_queued(AbandonPolicy::Keep, pool).await;
    assert!(!ran, "the pool's CancelIfQueued default was not applied");
    assert_eq!(after_drop.cancelled, 1, "{after_drop:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_while_running_keep() {
    assert_kept(&leave_while_running(AbandonPolicy::Keep, false).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_while_running_cancel_if_queued_keeps_it_running() {
    assert_kept(&leave_while_running(AbandonPolicy::CancelIfQueued, false).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_while_running_cancel_and_stop_sets_the_stop_token() {
    assert_stopped(&leave_while_running(AbandonPolicy::CancelAndStop, false).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_an_unpolled_offload_submits_nothing() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let ran = flag();
    let r = ran.clone();
    let fut = pool
        .offload(move |_stop| r.store(true, Ordering::SeqCst))
        .into_future();
    drop(fut);
    drain_single(&pool).await;
    assert!(!ran.load(Ordering::SeqCst));
    let m = pool.metrics();
    assert_eq!(m.accepted, 1, "only the barrier was accepted: {m:?}");
    assert_eq!((m.callers_timed_out + m.callers_dropped), 0, "{m:?}");
}

// ---------------------------------------------------------------------------
// 4. A function that ignores its stop token keeps its permit
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_ignoring_its_stop_token_keeps_its_permit() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let conc = Concurrency::default();
    let (started_tx, mut started) = signal::<&'static str>();
    let (g, hold) = gate();
    let (c, tx) = (conc.clone(), started_tx.clone());
    let a = pool
        .offload(move |_stop| {
            let _in = c.enter();
            tx.send("a").expect("test alive");
            hold.wait(); // never looks at the token
            "a"
        })
        .spawn()
        .expect("accepted");
    recv("a started", &mut started).await;

    assert!(a.stop(), "first stop request takes effect");
    assert!(!a.stop(), "second stop request is a no-op");
    assert!(a.is_stopped());
    assert!(!a.cancel(), "a running job cannot be cancelled");
    assert_eq!(a.state(), JobState::Running);

    let (c, tx) = (conc.clone(), started_tx.clone());
    let mut b = pool
        .offload(move |_stop| {
            let _in = c.enter();
            tx.send("b").expect("test alive");
            "b"
        })
        .spawn()
        .expect("accepted");
    let err = b.blocking_wait(Some(SHORT)).expect_err("b must wait");
    assert_eq!(timed_out_parts(&err).1, JobState::Queued);
    assert_eq!(started.try_recv(), Err(TryRecvError::Empty));
    let m = pool.metrics();
    assert_eq!((m.running, m.queued, m.stop_requests), (1, 1, 1), "{m:?}");
    assert_eq!(a.state(), JobState::Running);

    g.open();
    assert_eq!(recv("b started", &mut started).await, "b");
    assert_eq!(within("a", a).await.unwrap(), "a");
    assert_eq!(within("b", b).await.unwrap(), "b");
    assert_eq!(conc.max(), 1);
}

// ---------------------------------------------------------------------------
// 5. cancel() before and after start
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_before_start_means_never_run() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let blocker = occupy(&pool, 1).await;
    let ran = flag();
    let r = ran.clone();
    let b = pool
        .offload(move |_stop| r.store(true, Ordering::SeqCst))
        .spawn()
        .expect("accepted");
    let id = b.id();
    assert_eq!(b.state(), JobState::Queued);
    assert!(b.cancel(), "a queued job is cancelled");
    assert!(!b.cancel(), "only the first cancel wins");
    assert_eq!(b.state(), JobState::Cancelled);
    assert!(b.is_finished());
    let m = pool.metrics();
    assert_eq!((m.queued, m.cancelled), (0, 1), "{m:?}");
    assert_ledger(&m);

    let err = within("cancelled handle", b).await.unwrap_err();
    assert!(
        matches!(err, Error::Cancelled { id: Some(got) } if got == id),
        "{err:?}"
    );
    assert!(err.is_cancelled());

    blocker.release().await;
    drain_single(&pool).await;
    assert!(!ran.load(Ordering::SeqCst), "a cancelled job ran");
    let m = pool.metrics();
    assert_eq!((m.completed, m.cancelled), (2, 1), "{m:?}");
    assert_ledger(&m);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_after_start_returns_false_and_the_function_keeps_running() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let (started_tx, mut started) = signal::<()>();
    let (g, hold) = gate();
    let done = flag();
    let d = done.clone();
    let a = pool
        .offload(move |_stop| {
            started_tx.send(()).expect("test alive");
            hold.wait();
            d.store(true, Ordering::SeqCst);
            "finished"
        })
        .spawn()
        .expect("accepted");
    recv("started", &mut started).await;
    assert!(
        !a.cancel(),
        "cancel after start must report that it did not cancel"
    );
    assert_eq!(a.state(), JobState::Running);
    let m = pool.metrics();
    assert_eq!((m.running, m.cancelled), (1, 0), "{m:?}");
    g.open();
    assert_eq!(within("a", a).await.unwrap(), "finished");
    assert!(done.load(Ordering::SeqCst));
}

/// ARCHITECTURE invariant 3: "Cancel after start sets the stop token and nothing
/// else; the permit stays held until the function returns." (stop.rs also
/// says stop is requested "by JobHandle::cancel on a running job".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_after_start_sets_the_stop_token() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let (started_tx, mut started) = signal::<()>();
    let (saw_tx, mut saw_stop) = signal::<bool>();
    let (g, hold) = gate();
    let (after, hold_after) = gate();
    let a = pool
        .offload(move |stop| {
            started_tx.send(()).expect("test alive");
            // Returns early once stop is requested...
            let saw = hold.wait_or_stop(stop);
            saw_tx.send(saw).expect("test alive");
            // ...and then the function still runs, holding its permit.
            hold_after.wait();
            saw
        })
        .spawn()
        .expect("accepted");
    recv("started", &mut started).await;
    assert!(!a.cancel());
    let requested = a.is_stopped();
    let saw = recv("the function saw the stop request", &mut saw_stop).await;
    let m = pool.metrics();
    // Never leave the worker held, whatever happened.
    g.open();
    after.open();
    assert_eq!(within("a", a).await.unwrap(), saw);
    assert!(
        requested && saw,
        "cancel() on a running job must request stop (requested={requested}, function saw={saw}, {m:?})"
    );
    assert_eq!(
        m.running, 1,
        "the permit stays held until the function returns: {m:?}"
    );
}

// ---------------------------------------------------------------------------
// 9. A panic is a result
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_is_a_result_and_the_worker_survives() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let (tid_tx, mut tid) = signal::<std::thread::ThreadId>();
    let tx = tid_tx.clone();
    let (fut, id) = {
        let blocker = occupy(&pool, 1).await;
        let queued = accepted(
            pool.offload(move |_stop| -> u32 {
                tx.send(std::thread::current().id()).expect("test alive");
                panic!("kaboom {}", 42)
            })
            .into_future(),
        )
        .await;
        blocker.release().await;
        queued
    };
    let err = within("panicking job", fut).await.unwrap_err();
    assert!(err.is_panic(), "{err:?}");
    assert_eq!(err.job_id(), Some(id));
    match &err {
        Error::Panicked {
            id: got, message, ..
        } => {
            assert_eq!(*got, id);
            assert!(message.contains("kaboom 42"), "message: {message:?}");
        }
        other => panic!("expected Panicked, got {other:?}"),
    }
    assert!(err.to_string().contains("kaboom 42"), "{err}");

    // The permit was released before the outcome was published.
    let m = pool.metrics();
    assert_eq!((m.running, m.panicked), (0, 1), "{m:?}");
    assert_ledger(&m);

    // The worker survived: the next job runs on the very same thread.
    let tx = tid_tx.clone();
    let v = within(
        "job after the panic",
        pool.offload(move |_stop| {
            tx.send(std::thread::current().id()).expect("test alive");
            7
        }),
    )
    .await
    .expect("runs");
    assert_eq!(v, 7);
    let first = recv("panicking job's thread", &mut tid).await;
    let second = recv("next job's thread", &mut tid).await;
    assert_eq!(first, second, "the worker thread did not survive the panic");
    let m = pool.metrics();
    assert_eq!((m.running, m.panicked, m.workers), (0, 1, 1), "{m:?}");
    assert_ledger(&m);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panics_with_str_and_non_string_payloads() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let h = pool
        .offload(|_stop| -> () { panic!("static str payload") })
        .spawn()
        .expect("accepted");
    let err = within("str panic", h).await.unwrap_err();
    assert!(matches!(&err, Error::Panicked { message, .. } if message == "static str payload"));

    let mut h = pool
        .offload(|_stop| -> () { std::panic::panic_any(42_u8) })
        .spawn()
        .expect("accepted");
    let err = within("non-string panic", &mut h).await.unwrap_err();
    assert!(err.is_panic(), "{err:?}");
    assert_eq!(h.state(), JobState::Panicked);
    let m = pool.metrics();
    assert_eq!((m.running, m.panicked), (0, 2), "{m:?}");
    assert_eq!(within("next", pool.offload(|_| 1)).await.unwrap(), 1);
}

// ---------------------------------------------------------------------------
// 10. Thread-spawn failure
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thread_spawn_failure_hands_the_closure_back_and_does_not_poison() {
    let pool = pool(1, 1);
    pool.__fail_next_thread_spawns(1);
    let ran = flag();
    let r = ran.clone();
    let err = pool
        .offload(move |_stop| {
            r.store(true, Ordering::SeqCst);
            "ran"
        })
        .spawn()
        .expect_err("the worker thread cannot be spawned");
    assert!(
        matches!(err.reason(), Error::ThreadSpawn(_)),
        "{:?}",
        err.reason()
    );
    let m = pool.metrics();
    assert_eq!(
        (m.rejected_spawn, m.accepted, m.workers),
        (1, 0, 0),
        "{m:?}"
    );
    assert_ledger(&m);

    // The closure comes back unrun, and the pool (and its one queue slot)
    // still works.
    let f = err.into_inner();
    assert!(!ran.load(Ordering::SeqCst));
    let h = pool.offload(f).spawn().expect("the next call succeeds");
    assert_eq!(within("retried job", h).await.unwrap(), "ran");
    assert!(ran.load(Ordering::SeqCst));
    let m = pool.metrics();
    assert_eq!(
        (m.rejected_spawn, m.accepted, m.completed, m.workers),
        (1, 1, 1, 1),
        "{m:?}"
    );
    assert_ledger(&m);
}

/// A failed spawn refuses a job only when no worker exists to run it: with
/// a busy worker the job is queued for it, and the failure is counted in
/// `spawn_failures` (issue 10, item 15).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thread_spawn_failure_queues_the_job_for_a_busy_worker() {
    let pool = pool(2, DEFAULT_QUEUE_CAPACITY);
    let a = occupy(&pool, 1).await;
    pool.__fail_next_thread_spawns(1);
    let b = pool
        .offload(|_stop| "b")
        .spawn()
        .expect("a busy worker exists: the job waits for it");
    let m = pool.metrics();
    assert_eq!(
        (
            m.accepted,
            m.running,
            m.queued,
            m.rejected_spawn,
            m.spawn_failures,
            m.workers
        ),
        (2, 1, 1, 0, 1, 1),
        "{m:?}"
    );
    assert_ledger(&m);
    assert_eq!(b.state(), offloader::JobState::Queued);

    // Awaiting form on a pool with no worker: refused, as an Error.
    let other = Offloader::builder().build().expect("valid");
    other.__fail_next_thread_spawns(1);
    let e = within("awaited refusal", other.offload(|_stop| 0))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::ThreadSpawn(_)), "{e:?}");
    assert!(e.is_busy());
    assert_eq!(e.job_id(), None);
    assert_eq!(
        within("other pool recovers", other.offload(|_| 5))
            .await
            .unwrap(),
        5
    );
    let m = other.metrics();
    assert_eq!((m.rejected_spawn, m.spawn_failures), (1, 1), "{m:?}");

    // The busy worker comes back for the queued job.
    a.release().await;
    assert_eq!(within("b", b).await.unwrap(), "b");
    let m = pool.metrics();
    assert_eq!(
        (m.accepted, m.completed, m.rejected_spawn, m.running),
        (2, 2, 0, 0),
        "{m:?}"
    );
    assert_ledger(&m);
}

// ---------------------------------------------------------------------------
// 11. The free function
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn free_function_offload() {
    assert_eq!(
        within("free offload", offloader::offload(|_stop| 40 + 2))
            .await
            .unwrap(),
        42
    );
    let v = within(
        "free offload with timeout",
        offloader::offload(|stop| stop.deadline().is_some()).with_timeout(HANG),
    )
    .await
    .unwrap();
    assert!(v, "with_timeout gives the function a deadline");

    // And a timeout that fires while the function is held.
    let (started_tx, mut started) = signal::<()>();
    let (g, hold) = gate();
    let (fut, id) = accepted(
        offloader::offload(move |_stop| {
            started_tx.send(()).expect("test alive");
            hold.wait();
        })
        .with_timeout(SHORT)
        .into_future(),
    )
    .await;
    recv("started", &mut started).await;
    let err = within("free offload times out", fut).await.unwrap_err();
    assert_eq!(timed_out_parts(&err), (id, JobState::Running, Fate::Kept));
    g.open();

    let h = offloader::offload(|_stop| "spawned")
        .spawn()
        .expect("accepted");
    assert_eq!(within("free spawn", h).await.unwrap(), "spawned");
    assert_ledger(&Offloader::global().metrics());
}

// ---------------------------------------------------------------------------
// 13. The queue bound
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_refuses_spawn_and_hands_the_closure_back() {
    let pool = pool(1, 1);
    let a = occupy(&pool, 1).await;
    let b = pool.offload(|_stop| "b").spawn().expect("one queue slot");
    let ran = flag();
    let r = ran.clone();
    let err = pool
        .offload(move |_stop| {
            r.store(true, Ordering::SeqCst);
            "c"
        })
        .spawn()
        .expect_err("the queue is full");
    assert!(
        matches!(err.reason(), Error::Full { capacity: 1 }),
        "{:?}",
        err.reason()
    );
    let m = pool.metrics();
    assert_eq!(
        (m.running, m.queued, m.accepted, m.rejected_full),
        (1, 1, 2, 1),
        "{m:?}"
    );
    assert_ledger(&m);

    // The very closure comes back, unrun.
    let c = err.into_inner();
    assert!(!ran.load(Ordering::SeqCst));
    assert_eq!(c(&StopToken::new()), "c");
    assert!(ran.load(Ordering::SeqCst));

    // Cancelling the queued job frees its slot at once.
    assert!(b.cancel());
    let d = pool
        .offload(|_stop| "d")
        .spawn()
        .expect("the slot was freed");
    a.release().await;
    assert_eq!(within("d", d).await.unwrap(), "d");
    assert!(within("b", b).await.unwrap_err().is_cancelled());
    let m = pool.metrics();
    assert_eq!((m.accepted, m.completed, m.cancelled), (3, 2, 1), "{m:?}");
    assert_ledger(&m);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awaited_offload_waits_for_room_or_times_out() {
    let pool = pool(1, 1);
    let a = occupy(&pool, 1).await;
    let b = pool.offload(|_stop| "b").spawn().expect("one queue slot");

    // Bounded wait for room: refused, never accepted, never run.
    let ran = flag();
    let r = ran.clone();
    let e = within(
        "wait for room with a timeout",
        pool.offload(move |_stop| r.store(true, Ordering::SeqCst))
            .with_timeout(SHORT),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::TimedOut {
                id: None,
                state: None,
                fate: Fate::Cancelled,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(e.job_id(), None);

    // Unbounded wait for room: backpressure, then accepted once room frees.
    let mut d = Box::pin(pool.offload(|_stop| "d").into_future());
    assert!(poll_once(d.as_mut()).await.is_pending());
    assert_eq!(d.job_id(), None, "not accepted while the queue is full");
    let m = pool.metrics();
    assert_eq!((m.accepted, m.queued), (2, 1), "{m:?}");
    a.gate.open();
    assert_eq!(within("d after room frees", d).await.unwrap(), "d");
    a.release().await;
    assert_eq!(within("b", b).await.unwrap(), "b");
    assert!(!ran.load(Ordering::SeqCst));
    let m = pool.metrics();
    assert_eq!((m.accepted, m.completed), (3, 3), "{m:?}");
    // The one bounded wait that timed out; never an immediate refusal.
    assert_eq!((m.rejected_timed_out, m.rejected_full), (1, 0), "{m:?}");
    assert_ledger(&m);
}

// ---------------------------------------------------------------------------
// Shutdown refusals (ARCHITECTURE inv. 6) and their metrics
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_runs_queued_work_and_refuses_new_work() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let a = occupy(&pool, 1).await;
    let ran = flag();
    let r = ran.clone();
    let b = pool
        .offload(move |_stop| r.store(true, Ordering::SeqCst))
        .spawn()
        .expect("accepted");
    pool.shutdown();
    assert!(pool.is_shutdown());
    assert!(!pool.is_terminated(), "jobs are still running and queued");

    let err = pool
        .offload(|_stop| "late")
        .spawn()
        .expect_err("refused after shutdown");
    assert!(
        matches!(err.reason(), Error::ShuttingDown { id: None }),
        "{err:?}"
    );
    assert_eq!(err.into_inner()(&StopToken::new()), "late");

    a.release().await;
    within("b", b).await.unwrap();
    assert!(ran.load(Ordering::SeqCst), "queued work still runs");
    let m = pool.metrics();
    assert_eq!((m.accepted, m.completed), (2, 2), "{m:?}");
    assert_ledger(&m);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_refusals_are_counted_in_the_metrics() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    pool.shutdown();
    let err = pool.offload(|_stop| ()).spawn().expect_err("refused");
    assert!(matches!(err.reason(), Error::ShuttingDown { id: None }));
    let e = within("awaited after shutdown", pool.offload(|_stop| ()))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::ShuttingDown { id: None }), "{e:?}");
    let m = pool.metrics();
    assert_eq!(
        m.rejected_shutdown, 2,
        "two jobs were refused because of the shutdown: {m:?}"
    );
    assert_eq!(m.rejected(), 2, "{m:?}");
}

/// What an `Offload` prints before it is submitted: its name, time limit,
/// deadline and abandon policy (not the function).
#[test]
fn an_offload_prints_its_options() {
    let pool = pool(1, 4);
    let plain = pool.offload(|_| ());
    assert_eq!(
        format!("{plain:?}"),
        "Offload { name: None, timeout: None, deadline: None, policy: None, .. }"
    );
    let set = pool
        .offload(|_| ())
        .name("probe")
        .with_timeout(std::time::Duration::from_secs(2))
        .on_abandon(AbandonPolicy::CancelIfQueued);
    assert_eq!(
        format!("{set:?}"),
        "Offload { name: Some(\"probe\"), timeout: Some(2s), deadline: None, policy: Some(CancelIfQueued), .. }"
    );
}

/// One job at a time needs one worker: a submit finds the worker that is
/// looking for work (or parked) instead of spawning another, however high
/// the limit (kills the mutant of `Workers::find` that never saw a
/// searching worker: mutation testing of state/workers.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_job_at_a_time_keeps_one_worker() {
    let pool = pool(16, DEFAULT_QUEUE_CAPACITY);
    for i in 0..200u32 {
        assert_eq!(within("a job", pool.offload(move |_| i)).await.unwrap(), i);
    }
    let m = pool.metrics();
    assert_eq!((m.completed, m.workers), (200, 1), "{m:?}");
}
