//! Lifecycle contract (ARCHITECTURE invariants 4, 6, 7, 8): graceful, immediate and
//! staged shutdown (an immediate one drains the queue a chunk at a time,
//! starting nothing meanwhile), rejection of new work and of producers
//! blocked on a full queue, idleness and termination as facts separate from
//! "queue empty" (the observer's and the monitor's threads live until the
//! shutdown, not until the workers retire), running-job reports, the
//! stuck-job warning, try-form backpressure, and dropping the last
//! `Offloader` clone.
//!
//! Ordering is always by gates and "started" messages: a function that must
//! still be running is held on a [`Gate`] the test opens only after it has
//! checked what it wanted to check. The short [`SHORT`] waits only prove
//! that something is still waiting on a function held on a gate.

mod support;

use std::collections::HashMap;
use std::fmt;
use std::future::IntoFuture;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use offloader::{
    Error, EventKind, JobEvent, JobId, JobState, Observer, Offloader, StopToken, Stopped,
};
use support::*;

fn is_shutting_down(err: &Error) -> bool {
    matches!(err, Error::ShuttingDown { id: None })
}

// ---------------------------------------------------------------------------
// (a) graceful shutdown
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_running_and_queued_jobs_then_terminates() {
    const N: usize = 6;
    let pool = pool(2, 16);
    let (gate, hold) = gate();
    let (started_tx, mut started) = signal::<usize>();
    let ran = Arc::new(AtomicU64::new(0));

    let mut handles = Vec::new();
    for i in 0..N {
        let ran = ran.clone();
        let h = pool
            .offload(gated(&hold, &started_tx, i, move |_| {
                ran.fetch_add(1, Ordering::SeqCst);
                i * 10
            }))
            .name(format!("graceful-{i}"))
            .spawn()
            .expect("the queue has room");
        handles.push(h);
    }
    // Two of them run (and are held), four wait in the queue.
    recv("a function started", &mut started).await;
    recv("a function started", &mut started).await;
    let m = pool.metrics();
    assert_eq!((m.accepted, m.running, m.queued), (N as u64, 2, 4), "{m:?}");

    pool.shutdown();
    // Shut down is not terminated: both facts read while the jobs still run.
    assert!(
        pool.is_shutdown(),
        "is_shutdown() must be true right after shutdown()"
    );
    assert!(
        !pool.is_terminated(),
        "terminated while two functions are held on a gate"
    );
    assert!(!pool.is_idle(), "idle while jobs are running and queued");
    let m = pool.metrics();
    assert_eq!(
        (m.running, m.queued),
        (2, 4),
        "graceful shutdown must not drop queued jobs: {m:?}"
    );
    assert!(m.ledger_balances(), "{m:?}");
    assert!(
        still_pending(pool.terminated()).await,
        "terminated() completed while functions were held on a gate"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);

    // New work is refused at once.
    let refused = pool.offload(|_stop| 0).spawn().expect_err("shut down");
    assert!(
        matches!(refused.reason(), Error::ShuttingDown { id: None }),
        "{refused:?}"
    );

    gate.open();
    for (i, h) in handles.into_iter().enumerate() {
        let v = within("a job accepted before shutdown", h)
            .await
            .expect("jobs accepted before a graceful shutdown still run");
        assert_eq!(v, i * 10);
    }
    within("terminated() after every job finished", pool.terminated()).await;
    assert!(pool.is_terminated());
    assert!(pool.is_idle());
    assert!(pool.is_shutdown());
    let m = pool.metrics();
    assert_eq!(
        m.workers, 0,
        "terminated means every worker thread exited: {m:?}"
    );
    assert_eq!(
        (m.completed, m.queued, m.running),
        (N as u64, 0, 0),
        "{m:?}"
    );
    assert_eq!(m.rejected_shutdown, 1, "{m:?}");
    assert_eq!(m.max_running, 2, "{m:?}");
    assert!(m.ledger_balances(), "{m:?}");
    assert_eq!(ran.load(Ordering::SeqCst), N as u64);
    assert!(pool.await_termination(Duration::ZERO).await);
    let p = pool.clone();
    assert!(
        tokio::task::spawn_blocking(move || p.blocking_await_termination(Some(Duration::ZERO)))
            .await
            .unwrap()
    );
}

// ---------------------------------------------------------------------------
// (b) rejection after shutdown, and producers blocked on a full queue
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_work_after_shutdown_is_rejected_and_the_closure_handed_back() {
    let pool = pool(1, 4);
    pool.shutdown();
    assert!(pool.is_shutdown());
    let ran = flag();

    // Awaited directly.
    let r = ran.clone();
    let err = pool
        .offload(move |_stop| r.store(true, Ordering::SeqCst))
        .await
        .expect_err("refused after shutdown");
    assert!(is_shutting_down(&err), "{err:?}");
    assert!(err.is_shutdown());
    assert_eq!(err.job_id(), None, "a refused job was never accepted");

    // Try form: the closure comes back unrun and still callable.
    let r = ran.clone();
    let refused = pool
        .offload(move |_stop| {
            r.store(true, Ordering::SeqCst);
            41 + 1
        })
        .name("refused")
        .spawn()
        .expect_err("refused after shutdown");
    assert!(
        matches!(refused.reason(), Error::ShuttingDown { id: None }),
        "{refused:?}"
    );
    assert!(
        !ran.load(Ordering::SeqCst),
        "the refused closure must not have run"
    );
    let f = refused.into_inner();
    assert_eq!(f(&StopToken::new()), 42);
    assert!(
        ran.swap(false, Ordering::SeqCst),
        "the handed-back closure is the original one"
    );

    // Waiting form.
    let r = ran.clone();
    let refused = pool
        .offload(move |_stop| {
            r.store(true, Ordering::SeqCst);
            "submitted"
        })
        .submit()
        .await
        .expect_err("refused after shutdown");
    assert!(
        matches!(refused.reason(), Error::ShuttingDown { id: None }),
        "{refused:?}"
    );
    let f = refused.into_inner();
    assert!(!ran.load(Ordering::SeqCst));
    assert_eq!(f(&StopToken::new()), "submitted");

    let m = pool.metrics();
    assert_eq!((m.accepted, m.rejected_shutdown), (0, 3), "{m:?}");
    assert!(m.ledger_balances(), "{m:?}");
    within(
        "terminated() of a pool that never ran anything",
        pool.terminated(),
    )
    .await;
    assert!(pool.is_terminated());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_blocked_on_a_full_queue_are_woken_by_shutdown() {
    let pool = pool(1, 1);
    let (gate, hold) = gate();
    let (started_tx, mut started) = signal::<()>();

    let g = hold.clone();
    let running = pool
        .offload(move |_stop| {
            let _ = started_tx.send(());
            g.wait();
            "running"
        })
        .spawn()
        .expect("room");
    recv("a function started", &mut started).await;
    let queued = pool
        .offload(|_stop| "queued")
        .spawn()
        .expect("one slot of room");
    // The queue is now full: one running (held), one queued.

    let submit_ran = flag();
    let direct_ran = flag();

    // Producer 1: `submit().await` waits for room.
    let (p, r) = (pool.clone(), submit_ran.clone());
    let mut submitter = tokio::spawn(async move {
        match p
            .offload(move |_stop| {
                r.store(true, Ordering::SeqCst);
                "p1"
            })
            .name("blocked-submit")
            .submit()
            .await
        {
            Ok(_handle) => Ok(()),
            Err(e) => {
                let shutting_down = matches!(e.reason(), Error::ShuttingDown { id: None });
                let f = e.into_inner();
                Err((shutting_down, f))
            }
        }
    });
    // Producer 2: a directly awaited offload waits for room too.
    let (p, r) = (pool.clone(), direct_ran.clone());
    let mut direct = tokio::spawn(async move {
        p.offload(move |_stop| r.store(true, Ordering::SeqCst))
            .name("blocked-await")
            .await
    });

    assert!(
        still_pending(&mut submitter).await,
        "submit() must wait while the queue is full"
    );
    assert!(
        still_pending(&mut direct).await,
        "an awaited offload must wait while the queue is full"
    );
    let m = pool.metrics();
    assert_eq!(
        (m.accepted, m.rejected_shutdown, m.rejected_full),
        (2, 0, 0),
        "{m:?}"
    );

    pool.shutdown();

    let submitted = within("the blocked submit() after shutdown", submitter)
        .await
        .expect("producer task");
    match submitted {
        Err((shutting_down, f)) => {
            assert!(shutting_down, "a blocked producer must see ShuttingDown");
            assert!(!submit_ran.load(Ordering::SeqCst));
            assert_eq!(
                f(&StopToken::new()),
                "p1",
                "the closure is handed back unrun"
            );
        }
        Ok(()) => panic!("a producer blocked on a full queue was accepted after shutdown"),
    }
    let awaited = within("the blocked awaited offload after shutdown", direct)
        .await
        .expect("producer task");
    match awaited {
        Err(e) => assert!(is_shutting_down(&e), "expected ShuttingDown, got {e:?}"),
        Ok(()) => panic!("a producer blocked on a full queue was accepted after shutdown"),
    }
    let m = pool.metrics();
    assert_eq!((m.accepted, m.rejected_shutdown), (2, 2), "{m:?}");
    assert!(m.ledger_balances(), "{m:?}");

    // Work accepted before the shutdown still runs.
    gate.open();
    assert_eq!(within("the running job", running).await.unwrap(), "running");
    assert_eq!(within("the queued job", queued).await.unwrap(), "queued");
    within("terminated()", pool.terminated()).await;
    // (`submit_ran` was set by the test itself when it called the handed-back
    // closure; the pool never ran either producer's function.)
    assert!(!direct_ran.load(Ordering::SeqCst));
    let m = pool.metrics();
    assert_eq!((m.accepted, m.completed, m.workers), (2, 2, 0), "{m:?}");
}

// ---------------------------------------------------------------------------
// (c) idle and terminated wait for running jobs, not for an empty queue
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_waits_for_a_running_job_when_the_queue_is_empty() {
    let pool = pool(1, 4);
    let (gate, hold) = gate();
    let (started_tx, mut started) = signal::<()>();

    let g = hold.clone();
    let h = pool
        .offload(move |_stop| {
            let _ = started_tx.send(());
            g.wait();
            7
        })
        .spawn()
        .expect("room");
    recv("a function started", &mut started).await;
    let m = pool.metrics();
    assert_eq!((m.queued, m.running), (0, 1), "{m:?}");
    assert!(
        !pool.is_idle(),
        "is_idle() with an empty queue but a running job"
    );
    assert!(
        still_pending(pool.idle()).await,
        "idle() completed while a job was running (only the queue was empty)"
    );

    gate.open();
    within("idle() after the job returned", pool.idle()).await;
    assert!(pool.is_idle());
    assert!(
        h.state().is_terminal(),
        "idle() returned before the job was terminal: {:?}",
        h.state()
    );
    let m = pool.metrics();
    assert_eq!((m.completed, m.running, m.queued), (1, 0, 0), "{m:?}");
    assert!(!pool.is_shutdown(), "idle is not shut down");
    assert!(!pool.is_terminated(), "idle is not terminated");

    // The pool keeps accepting work after being idle.
    assert_eq!(
        within("a job after idle", pool.offload(|_stop| 5))
            .await
            .unwrap(),
        5
    );
    within("idle() on an idle pool", pool.idle()).await;
    assert_eq!(within("the first handle", h).await.unwrap(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_during_normal_operation_means_every_accepted_job_is_terminal() {
    const N: usize = 5;
    let pool = pool(2, 8);
    let (gate, hold) = gate();
    let (started_tx, mut started) = signal::<()>();

    let mut handles = Vec::new();
    for i in 0..N {
        handles.push(
            pool.offload(gated(&hold, &started_tx, (), move |_| {
                if i == 3 {
                    panic!("idle test panic");
                }
                i
            }))
            .spawn()
            .expect("room"),
        );
    }
    // One more, cancelled while queued: terminal without running.
    let cancelled = pool.offload(|_stop| usize::MAX).spawn().expect("room");
    recv("a function started", &mut started).await;
    recv("a function started", &mut started).await;
    assert!(cancelled.cancel());

    // A waiter parked before the release reads a snapshot as soon as idle()
    // returns: every accepted job must already be terminal in it.
    let p = pool.clone();
    let mut waiter = tokio::spawn(async move {
        p.idle().await;
        p.metrics()
    });
    assert!(
        still_pending(&mut waiter).await,
        "idle() completed with jobs running and queued"
    );
    gate.open();
    let m = within("idle() waiter", waiter).await.unwrap();
    assert_eq!((m.queued, m.running), (0, 0), "{m:?}");
    assert_eq!(m.accepted, m.terminal(), "{m:?}");
    assert_eq!(
        (m.completed, m.panicked, m.cancelled),
        (N as u64 - 1, 1, 1),
        "{m:?}"
    );
    assert!(!pool.is_shutdown());

    for (i, h) in handles.into_iter().enumerate() {
        let r = within("a job after idle", h).await;
        if i == 3 {
            assert!(r.unwrap_err().is_panic());
        } else {
            assert_eq!(r.unwrap(), i);
        }
    }
    assert!(within("the cancelled job", cancelled)
        .await
        .unwrap_err()
        .is_cancelled());

    // Still accepting.
    let h = pool
        .offload(|_stop| "after")
        .spawn()
        .expect("still accepting after idle");
    assert_eq!(within("a job after idle", h).await.unwrap(), "after");
    within("idle()", pool.idle()).await;
    let m = pool.metrics();
    assert_eq!(m.accepted, N as u64 + 2, "{m:?}");
    assert!(m.ledger_balances(), "{m:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_waits_for_a_running_job_after_shutdown() {
    let pool = pool(1, 4);
    let (gate, hold) = gate();
    let (started_tx, mut started) = signal::<()>();

    let g = hold.clone();
    let h = pool
        .offload(move |_stop| {
            let _ = started_tx.send(());
            g.wait();
            "done"
        })
        .spawn()
        .expect("room");
    recv("a function started", &mut started).await;
    pool.shutdown();
    let m = pool.metrics();
    assert_eq!((m.queued, m.running), (0, 1), "{m:?}");
    assert!(pool.is_shutdown());
    assert!(
        !pool.is_terminated(),
        "terminated with a function still running"
    );
    assert!(
        still_pending(pool.terminated()).await,
        "terminated() completed while a function was held on a gate (the queue was merely empty)"
    );
    assert!(!pool.await_termination(SHORT).await);
    let p = pool.clone();
    let blocking = tokio::task::spawn_blocking(move || p.blocking_await_termination(Some(SHORT)));
    assert!(
        !blocking.await.unwrap(),
        "blocking_await_termination reported termination too early"
    );

    // A blocking waiter without a limit, parked before the release.
    let p = pool.clone();
    let blocking = tokio::task::spawn_blocking(move || p.blocking_await_termination(None));
    gate.open();
    assert_eq!(within("the held job", h).await.unwrap(), "done");
    within("terminated()", pool.terminated()).await;
    assert!(within("blocking_await_termination(None)", blocking)
        .await
        .unwrap());
    assert!(pool.is_terminated());
    assert_eq!(pool.metrics().workers, 0);
}

/// A result whose drop blocks on a gate, after reporting the thread that
/// drops it.
struct DropsSlowly {
    gate: Hold,
    dropping: tokio::sync::mpsc::UnboundedSender<Option<String>>,
}

impl Drop for DropsSlowly {
    fn drop(&mut self) {
        let _ = self
            .dropping
            .send(std::thread::current().name().map(str::to_owned));
        self.gate.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_waits_for_worker_threads_not_only_for_jobs() {
    const THREAD: &str = "term-wkr";
    let pool = Offloader::builder()
        .max_in_flight(1)
        .thread_name(THREAD)
        .build()
        .expect("valid configuration");
    let (gate, hold) = gate();
    let (drop_gate, drop_hold) = support::gate();
    let (started_tx, mut started) = signal::<()>();
    let (dropping_tx, mut dropping) = signal::<Option<String>>();

    // A detached job whose result nobody collects: the pool drops it, and
    // that drop (user code) is held on a gate.
    let (g, dg) = (hold.clone(), drop_hold.clone());
    let h = pool
        .offload(move |_stop| {
            let _ = started_tx.send(());
            g.wait();
            DropsSlowly {
                gate: dg,
                dropping: dropping_tx,
            }
        })
        .spawn()
        .expect("room");
    recv("a function started", &mut started).await;
    h.detach();
    pool.shutdown();
    gate.open();
    let dropped_on = recv("the result is being dropped", &mut dropping).await;
    // The job is terminal and nothing is queued or running. (`is_idle()`
    // also waits for the worker to settle the published outcome, which it
    // does after this drop, so it is not the condition to wait for here.)
    eventually("the job is terminal", || {
        let m = pool.metrics();
        (m.queued, m.running, m.completed) == (0, 0, 1)
    })
    .await;
    let m = pool.metrics();
    assert_eq!((m.queued, m.running, m.completed), (0, 0, 1), "{m:?}");
    if dropped_on.as_deref() == Some(THREAD) {
        // A pool thread is still busy with user code: not terminated.
        assert_eq!(m.workers, 1, "{m:?}");
        assert!(
            !pool.is_terminated(),
            "terminated while a worker thread is still alive"
        );
        assert!(
            still_pending(pool.terminated()).await,
            "terminated() completed while a worker thread was still alive"
        );
    }
    drop_gate.open();
    within("terminated()", pool.terminated()).await;
    assert_eq!(pool.metrics().workers, 0);
}

/// The observer's delivery thread and the stuck-job monitor live until the
/// pool is shut down: an open pool whose workers all retired (keep-alive)
/// keeps them, and they are gone once it terminated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helper_threads_outlive_retired_workers_while_the_pool_is_open() {
    let pool = builder(1, 4)
        .thread_name("kept")
        .observer(Arc::new(Log::default()))
        .stuck_after(HANG)
        .keep_alive(Duration::from_millis(1))
        .build()
        .expect("valid configuration");
    let occupied = occupy(&pool, 1).await;
    eventually("both helper threads named", || {
        threads_named("kept-observer") == 1 && threads_named("kept-monitor") == 1
    })
    .await;
    occupied.release().await;
    eventually("the worker retired after its keep-alive", || {
        pool.metrics().workers == 0
    })
    .await;
    // The retiring worker wakes both helpers; they must not exit.
    assert!(
        still_pending(eventually("a helper thread exited", || {
            threads_named("kept-observer") + threads_named("kept-monitor") < 2
        }))
        .await,
        "a helper thread exited while the pool is open"
    );
    pool.shutdown();
    within("termination", pool.terminated()).await;
    assert_eq!(
        threads_named("kept-observer") + threads_named("kept-monitor"),
        0
    );
}

// ---------------------------------------------------------------------------
// (d) immediate shutdown
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_now_returns_queued_jobs_and_stops_running_ones() {
    let pool = pool(2, 8);
    let (gate, hold) = gate();
    let (started_tx, mut started) = signal::<&'static str>();

    // Running job 1 honours its token: its sleep wakes at the stop request.
    let tx = started_tx.clone();
    let cooperative = pool
        .offload(move |stop| {
            let _ = tx.send("cooperative");
            stop.sleep(Duration::from_secs(3600))
        })
        .name("cooperative")
        .spawn()
        .expect("room");
    // Running job 2 ignores its token and waits on the gate.
    let stubborn = pool
        .offload(gated(&hold, &started_tx, "stubborn", |stop| {
            stop.is_stopped()
        }))
        .name("stubborn")
        .spawn()
        .expect("room");
    let mut names = [
        recv("a function started", &mut started).await,
        recv("a function started", &mut started).await,
    ];
    names.sort_unstable();
    assert_eq!(names, ["cooperative", "stubborn"]);

    // Three queued jobs that would set a flag if they ever ran.
    let mut queued = Vec::new();
    for i in 0..3 {
        let ran = flag();
        let r = ran.clone();
        let h = pool
            .offload(move |_stop| r.store(true, Ordering::SeqCst))
            .name(format!("queued-{i}"))
            .spawn()
            .expect("room");
        queued.push((h, ran));
    }
    let m = pool.metrics();
    assert_eq!((m.running, m.queued), (2, 3), "{m:?}");

    let unstarted = pool.shutdown_now();
    assert!(pool.is_shutdown());
    assert_eq!(unstarted.len(), 3, "{unstarted:?}");
    for (u, (h, _)) in unstarted.iter().zip(&queued) {
        assert_eq!(
            u.id,
            h.id(),
            "unstarted jobs come back in queue order with their ids"
        );
        assert_eq!(u.name.as_deref(), h.name(), "and their names");
    }
    // The stubborn job keeps running and keeps its permit.
    let m = pool.metrics();
    assert_eq!(m.unstarted, 3, "{m:?}");
    assert_eq!(m.queued, 0, "{m:?}");
    assert!(m.ledger_balances(), "{m:?}");

    let mut queued_flags = Vec::new();
    for (h, ran) in queued {
        let id = h.id();
        let err = within("an unstarted job's handle", h).await.unwrap_err();
        assert!(
            matches!(err, Error::ShuttingDown { id: Some(e) } if e == id),
            "{err:?}"
        );
        assert!(err.is_shutdown());
        assert!(
            !ran.load(Ordering::SeqCst),
            "a job returned unstarted ran anyway"
        );
        queued_flags.push(ran);
    }

    // The cooperative function saw its token and returned early.
    let r = within("the cooperative job", cooperative)
        .await
        .expect("it returned");
    assert_eq!(
        r,
        Err(Stopped),
        "the running job's sleep must have seen the stop request"
    );

    let m = pool.metrics();
    assert_eq!(
        m.running, 1,
        "the stubborn job still holds its permit: {m:?}"
    );
    assert_eq!(m.completed, 1, "{m:?}");
    let running = pool.running_jobs();
    assert_eq!(running.len(), 1, "{running:?}");
    assert_eq!(running[0].id, stubborn.id());
    assert!(
        running[0].stop_requested,
        "shutdown_now must set the running job's stop token"
    );
    assert!(stubborn.is_stopped());
    assert!(!pool.is_terminated());
    assert!(
        still_pending(pool.terminated()).await,
        "terminated() completed while a function that ignores its token still runs"
    );
    assert_eq!(
        pool.metrics().running,
        1,
        "the permit is held until the function returns"
    );

    gate.open();
    assert!(
        within("the stubborn job", stubborn).await.unwrap(),
        "it saw the stop request when it finally looked"
    );
    within("terminated()", pool.terminated()).await;
    let m = pool.metrics();
    assert_eq!(
        (m.completed, m.unstarted, m.running, m.workers),
        (2, 3, 0, 0),
        "{m:?}"
    );
    assert_eq!(m.stop_requests, 2, "{m:?}");
    assert!(m.ledger_balances(), "{m:?}");
    assert!(
        pool.shutdown_now().is_empty(),
        "a second shutdown_now has nothing to return"
    );
    for ran in queued_flags {
        assert!(
            !ran.load(Ordering::SeqCst),
            "a job returned unstarted ran after termination"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_now_after_a_graceful_shutdown_still_returns_the_queue() {
    let pool = pool(1, 4);
    let running = occupy(&pool, 1).await;
    let ran = flag();
    let r = ran.clone();
    let queued = pool
        .offload(move |_stop| r.store(true, Ordering::SeqCst))
        .name("late")
        .spawn()
        .expect("room");

    pool.shutdown();
    let unstarted = pool.shutdown_now();
    assert_eq!(unstarted.len(), 1, "{unstarted:?}");
    assert_eq!(unstarted[0].id, queued.id());
    assert_eq!(unstarted[0].name.as_deref(), Some("late"));
    assert!(matches!(
        within("queued", queued).await,
        Err(Error::ShuttingDown { id: Some(_) })
    ));
    running.release().await;
    within("terminated()", pool.terminated()).await;
    assert!(!ran.load(Ordering::SeqCst));
}

/// Opens its gate when it sees a job that never started.
struct OpenOnUnstarted(Gate);

impl Observer for OpenOnUnstarted {
    fn on_event(&self, event: &JobEvent) {
        if event.kind == EventKind::NeverStarted {
            self.0.open();
        }
    }
}

/// `shutdown_now` drains the queue a chunk at a time and lets go of the
/// lock between chunks: every job queued when it began comes back
/// unstarted, in submission order, across chunk boundaries and tombstones,
/// even when permits free in the middle of the drain (the first chunk's
/// events open the gate the running jobs wait on): once the drain has
/// begun, no start takes a queued job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_now_drains_in_chunks_and_nothing_starts_meanwhile() {
    const N: usize = 50_000;
    let (g, hold) = gate();
    let pool = builder(2, N)
        .observer(Arc::new(OpenOnUnstarted(g)))
        .observer_lag(4 * N)
        .build()
        .expect("valid configuration");
    let (tx, mut started) = signal();
    let running: Vec<_> = (0..2)
        .map(|_| {
            pool.offload(gated(&hold, &tx, (), |_| ()))
                .spawn()
                .expect("accepted")
        })
        .collect();
    recv("the first permit's job", &mut started).await;
    recv("the second permit's job", &mut started).await;
    let handles: Vec<_> = (0..N)
        .map(|i| pool.offload(move |_| i).spawn().expect("accepted"))
        .collect();
    // Every third job cancelled: tombstones, fewer than the queued jobs,
    // stay linked between the jobs the drain returns.
    let mut kept = Vec::new();
    for (i, h) in handles.iter().enumerate() {
        if i % 3 == 0 {
            assert!(h.cancel());
        } else {
            kept.push(h.id());
        }
    }
    let unstarted: Vec<JobId> = pool.shutdown_now().into_iter().map(|u| u.id).collect();
    assert_eq!(
        unstarted.len(),
        kept.len(),
        "nothing started during the drain"
    );
    assert!(unstarted == kept, "in submission order");
    for h in running {
        within("a running job", h).await.unwrap();
    }
    within("terminated", pool.terminated()).await;
    let m = pool.metrics();
    assert_eq!(m.completed, 2, "{m:?}");
    assert_eq!(m.unstarted as usize, kept.len(), "{m:?}");
    assert_ledger(&m);
}

/// Records, when a queued job's function is dropped unrun, how many jobs
/// the pool still had queued.
struct QueuedAtDrop {
    pool: offloader::WeakOffloader,
    seen: Arc<Mutex<Vec<u64>>>,
}

impl Drop for QueuedAtDrop {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            self.seen.lock().unwrap().push(pool.metrics().queued);
        }
    }
}

/// `shutdown_now` lets go of the lock between chunks of its drain, and
/// drops a chunk's functions before it drains the next: when the first
/// function is dropped, the jobs of the later chunks are still queued (a
/// drain in one critical section would hold the lock, and every other
/// caller of the pool, for the whole queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_now_drops_a_chunk_before_draining_the_next() {
    const N: usize = 5_000;
    let pool = builder(1, N).build().expect("valid configuration");
    let (g, hold) = gate();
    let (tx, mut started) = signal();
    let running = pool
        .offload(move |_| {
            tx.send(()).unwrap();
            hold.wait();
        })
        .spawn()
        .expect("accepted");
    recv("the running job", &mut started).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    for _ in 0..N {
        let probe = QueuedAtDrop {
            pool: pool.downgrade(),
            seen: seen.clone(),
        };
        pool.offload(move |_| drop(probe))
            .spawn()
            .expect("accepted")
            .detach();
    }
    assert_eq!(pool.shutdown_now().len(), N);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), N, "every function dropped unrun");
    assert!(
        seen[0] > 0 && seen[0] < N as u64,
        "the first chunk's functions were dropped with {} jobs still queued",
        seen[0]
    );
    assert_eq!(*seen.last().unwrap(), 0);
    g.open();
    within("the running job", running).await.unwrap();
    within("terminated", pool.terminated()).await;
}

// ---------------------------------------------------------------------------
// (e) staged close
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_close_escalates_and_reports_a_function_that_ignores_its_token() {
    let pool = pool(1, 8);
    let (gate, hold) = gate();
    let (started_tx, mut started) = signal::<()>();

    let g = hold.clone();
    let stubborn = pool
        .offload(move |_stop| {
            let _ = started_tx.send(());
            g.wait(); // ignores its stop token
            "done anyway"
        })
        .name("stubborn")
        .spawn()
        .expect("room");
    recv("a function started", &mut started).await;
    let mut queued = Vec::new();
    for i in 0..2 {
        let ran = flag();
        let r = ran.clone();
        let h = pool
            .offload(move |_stop| r.store(true, Ordering::SeqCst))
            .name(format!("later-{i}"))
            .spawn()
            .expect("room");
        queued.push((h, ran));
    }

    // The gate stays closed for the whole close: neither stage can finish.
    let report = within(
        "close()",
        pool.close(Duration::from_millis(30), Duration::from_millis(30)),
    )
    .await;
    assert!(!gate.is_open());
    assert!(
        report.escalated,
        "the graceful stage cannot have sufficed: {report:?}"
    );
    assert!(!report.terminated, "{report:?}");
    assert_eq!(report.still_running.len(), 1, "{report:?}");
    let still = &report.still_running[0];
    assert_eq!(still.id, stubborn.id());
    assert_eq!(still.name.as_deref(), Some("stubborn"));
    assert!(
        still.stop_requested,
        "the immediate stage requests stop: {still:?}"
    );
    assert!(
        still.caller_waiting,
        "its owner handle still exists: {still:?}"
    );
    assert_eq!(report.unstarted.len(), 2, "{report:?}");
    for (u, (h, _)) in report.unstarted.iter().zip(&queued) {
        assert_eq!(u.id, h.id());
        assert_eq!(u.name.as_deref(), h.name());
    }
    assert_eq!((report.completed, report.panicked), (0, 0), "{report:?}");
    let text = report.to_string();
    assert!(
        text.contains("gave up") && text.contains("stubborn"),
        "{text}"
    );

    assert!(pool.is_shutdown());
    assert!(!pool.is_terminated());
    assert_eq!(
        pool.metrics().running,
        1,
        "the stubborn job keeps its permit"
    );

    gate.open();
    assert_eq!(
        within("the stubborn job", stubborn).await.unwrap(),
        "done anyway"
    );
    for (h, ran) in queued {
        assert!(matches!(
            within("an unstarted job", h).await,
            Err(Error::ShuttingDown { id: Some(_) })
        ));
        assert!(!ran.load(Ordering::SeqCst));
    }
    within("terminated() after the release", pool.terminated()).await;
    let m = pool.metrics();
    assert_eq!((m.completed, m.unstarted, m.workers), (1, 2, 0), "{m:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_close_that_finishes_in_the_graceful_stage() {
    const N: usize = 5;
    let pool = pool(2, 8);
    let (gate, hold) = gate();
    let (started_tx, mut started) = signal::<()>();
    let mut handles = Vec::new();
    for i in 0..N {
        handles.push(
            pool.offload(gated(&hold, &started_tx, (), move |_| {
                if i == 4 {
                    panic!("close test panic");
                }
                i
            }))
            .spawn()
            .expect("room"),
        );
    }
    recv("a function started", &mut started).await;
    recv("a function started", &mut started).await;

    let p = pool.clone();
    let closing = tokio::spawn(async move {
        p.close(Duration::from_secs(10), Duration::from_secs(1))
            .await
    });
    // close() snapshots the metrics before it shuts the pool down, so once
    // the pool reports shut down, every job below counts as finished during
    // the close.
    eventually("close() has begun", || pool.is_shutdown()).await;
    gate.open();
    let report = within("close()", closing).await.unwrap();
    assert!(!report.escalated, "{report:?}");
    assert!(report.terminated, "{report:?}");
    assert_eq!(
        (report.completed, report.panicked),
        (N as u64 - 1, 1),
        "{report:?}"
    );
    assert!(report.unstarted.is_empty(), "{report:?}");
    assert!(report.still_running.is_empty(), "{report:?}");
    assert!(report.to_string().contains("terminated"), "{report}");
    assert!(pool.is_terminated());
    assert_eq!(pool.metrics().workers, 0);
    for (i, h) in handles.into_iter().enumerate() {
        let r = within("a job finished during close", h).await;
        if i == 4 {
            assert!(r.unwrap_err().is_panic());
        } else {
            assert_eq!(r.unwrap(), i);
        }
    }
}

// ---------------------------------------------------------------------------
// (f) running_jobs()
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_jobs_reports_name_stop_request_and_waiting_owner() {
    let pool = pool(1, 4);
    assert!(pool.running_jobs().is_empty());
    let (gate, hold) = gate();
    let (started_tx, mut started) = signal::<()>();

    // Ignores its stop token.
    let h = pool
        .offload(gated(&hold, &started_tx, (), |_| ()))
        .name("watched")
        .spawn()
        .expect("room");
    recv("a function started", &mut started).await;
    let id = h.id();

    let jobs = pool.running_jobs();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0].id, id);
    assert_eq!(jobs[0].name.as_deref(), Some("watched"));
    assert!(!jobs[0].stop_requested, "{jobs:?}");
    assert!(jobs[0].caller_waiting, "the owner handle exists: {jobs:?}");

    assert!(h.stop());
    assert!(!h.stop(), "only the first stop request counts");
    let jobs = pool.running_jobs();
    assert_eq!(jobs.len(), 1, "stop is a request, not a kill: {jobs:?}");
    assert!(jobs[0].stop_requested, "{jobs:?}");
    assert!(jobs[0].caller_waiting, "{jobs:?}");

    drop(h);
    let jobs = pool.running_jobs();
    assert_eq!(
        jobs.len(),
        1,
        "dropping the handle detaches, the job runs on: {jobs:?}"
    );
    assert_eq!(jobs[0].id, id);
    assert!(
        !jobs[0].caller_waiting,
        "nobody can collect the outcome any more: {jobs:?}"
    );
    assert!(jobs[0].stop_requested);
    assert_eq!(pool.metrics().stop_requests, 1);

    gate.open();
    within("idle()", pool.idle()).await;
    assert!(pool.running_jobs().is_empty());

    // An awaiting caller counts as waiting while its future exists.
    let (gate, hold) = support::gate();
    let g = hold.clone();
    let mut fut = Box::pin(
        pool.offload(move |_stop| {
            let _ = started_tx.send(());
            g.wait();
        })
        .name("awaited")
        .into_future(),
    );
    assert!(poll_once(fut.as_mut()).await.is_pending(), "held on a gate");
    recv("a function started", &mut started).await;
    let jobs = pool.running_jobs();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0].name.as_deref(), Some("awaited"));
    assert!(jobs[0].caller_waiting, "{jobs:?}");
    drop(fut); // default policy Keep: the job runs on
    let jobs = pool.running_jobs();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert!(!jobs[0].caller_waiting, "{jobs:?}");
    assert!(
        !jobs[0].stop_requested,
        "Keep does not request stop: {jobs:?}"
    );
    gate.open();
    within("idle()", pool.idle()).await;
    let m = pool.metrics();
    assert_eq!((m.completed, m.callers_dropped), (2, 1), "{m:?}");
}

/// `RunningJob::running_for` counts from the start of the function and
/// `UnstartedJob::queued_for` from acceptance. Checked only against bounds
/// that follow from the monotonic clock and the gate order (no duration is
/// assumed for anything): the 50 ms pause only makes the two clocks differ
/// measurably.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_for_counts_from_the_start_and_queued_for_from_acceptance() {
    use std::time::Instant;
    const GAP: Duration = Duration::from_millis(50);
    let pool = pool(1, 4);
    let (gate_a, hold_a) = gate();
    let (gate_b, hold_b) = gate();
    let (started_tx, mut started) = signal::<&'static str>();

    let a = pool
        .offload(gated(&hold_a, &started_tx, "a", |_| ()))
        .spawn()
        .expect("room");
    assert_eq!(recv("a function started", &mut started).await, "a");
    let b_accepted = Instant::now();
    let b = pool
        .offload(gated(&hold_b, &started_tx, "b", |_| ()))
        .name("b")
        .spawn()
        .expect("room");
    tokio::time::sleep(GAP).await; // b waits in the queue at least this long
    let b_released = Instant::now();
    gate_a.open();
    assert_eq!(recv("a function started", &mut started).await, "b");
    let jobs = pool.running_jobs();
    let observed = Instant::now();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    // b started after a was released, so it cannot have run longer than that.
    assert!(
        jobs[0].running_for <= observed - b_released,
        "running_for {:?} exceeds the time since b could start ({:?}); queued for at least {GAP:?} since {:?} ago",
        jobs[0].running_for,
        observed - b_released,
        observed - b_accepted,
    );

    // A job queued behind b, handed back by shutdown_now.
    let c_before = Instant::now();
    let c = pool.offload(|_stop| ()).name("c").spawn().expect("room");
    let c_accepted = Instant::now();
    tokio::time::sleep(GAP).await;
    let before_shutdown = Instant::now();
    let unstarted = pool.shutdown_now();
    let after_shutdown = Instant::now();
    assert_eq!(unstarted.len(), 1);
    let q = unstarted[0].queued_for;
    assert!(
        q >= before_shutdown - c_accepted && q <= after_shutdown - c_before,
        "queued_for {q:?} outside [{:?}, {:?}]",
        before_shutdown - c_accepted,
        after_shutdown - c_before
    );
    gate_b.open();
    within("a", a).await.unwrap();
    within("b", b).await.unwrap();
    assert!(within("c", c).await.unwrap_err().is_shutdown());
    within("terminated()", pool.terminated()).await;
}

// ---------------------------------------------------------------------------
// (h) the stuck-job warning
// ---------------------------------------------------------------------------

/// What the monitor reported of one stuck job: the job's span name, the
/// level, the message, and its `running_for` field.
type StuckReport = (Option<String>, tracing::Level, String, Option<Duration>);

/// A minimal `tracing` subscriber that records, for every event whose
/// message mentions "stuck", the `name` field of the span it belongs to,
/// and the message of every warning.
#[derive(Default)]
struct StuckRecorder {
    next_span: AtomicU64,
    span_names: Mutex<HashMap<u64, String>>,
    stuck: Mutex<Vec<StuckReport>>,
    /// Every warning: the name of the job whose span it belongs to, if
    /// any, and its message.
    warnings: Mutex<Vec<(Option<String>, String)>>,
}

#[derive(Default)]
struct Fields {
    message: Option<String>,
    name: Option<String>,
    running_for: Option<Duration>,
}

/// Reads back a `Duration`'s `Debug` text (`1.5ms`, `20.000042s`, `7ns`),
/// exactly: it prints every significant digit.
fn parse_debug_duration(text: &str) -> Option<Duration> {
    let at = text.find(|c: char| !c.is_ascii_digit() && c != '.')?;
    let (number, unit) = text.split_at(at);
    let unit_ns: u128 = match unit {
        "s" => 1_000_000_000,
        "ms" => 1_000_000,
        "µs" => 1_000,
        "ns" => 1,
        _ => return None,
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let mut ns = whole.parse::<u128>().ok()? * unit_ns;
    if !fraction.is_empty() {
        let scale = 10u128.checked_pow(u32::try_from(fraction.len()).ok()?)?;
        ns += fraction.parse::<u128>().ok()? * unit_ns / scale;
    }
    Some(Duration::from_nanos(u64::try_from(ns).ok()?))
}

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        match field.name() {
            "message" => self.message = Some(format!("{value:?}")),
            "name" => self.name = Some(format!("{value:?}")),
            "running_for" => self.running_for = parse_debug_duration(&format!("{value:?}")),
            _ => {}
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        match field.name() {
            "message" => self.message = Some(value.to_owned()),
            "name" => self.name = Some(value.to_owned()),
            _ => {}
        }
    }
}

impl StuckRecorder {
    fn stuck_reports_for(&self, job_name: &str) -> Vec<StuckReport> {
        self.stuck
            .lock()
            .unwrap()
            .iter()
            .filter(|(name, ..)| name.as_deref() == Some(job_name))
            .cloned()
            .collect()
    }
}

impl StuckRecorder {
    /// Whether a warning contained `part`: about the job named `job`, or
    /// about anything with `None`.
    fn warned(&self, job: Option<&str>, part: &str) -> bool {
        self.warnings
            .lock()
            .unwrap()
            .iter()
            .any(|(j, m)| job.is_none_or(|job| j.as_deref() == Some(job)) && m.contains(part))
    }
}

/// A caller that stops waiting while its job runs on, holding its permit,
/// is warned of at `warn` (the permit is not free until the function
/// returns); one whose queued job is cancelled instead is not. Under a
/// paused clock, so that each time-out fires when the test advances it.
#[tokio::test(start_paused = true)]
async fn a_caller_leaving_a_running_job_is_warned_of() {
    const KEEPS: &str = "keeps-running-probe";
    const CANCELLED: &str = "cancelled-probe";
    const WARNING: &str = "the job keeps running and holds its permit";
    let recorder = stuck_recorder();
    let pool = Offloader::builder()
        .max_in_flight(1)
        .build()
        .expect("valid configuration");
    let (gate, hold) = gate();
    let (started_tx, mut started) = signal::<()>();
    let running = tokio::spawn(
        pool.offload(move |_stop| {
            let _ = started_tx.send(());
            hold.wait();
        })
        .name(KEEPS)
        .with_timeout(Duration::from_secs(1))
        .into_future(),
    );
    recv("a function started", &mut started).await;
    let queued = tokio::spawn(
        pool.offload(|_| ())
            .name(CANCELLED)
            .with_timeout(Duration::from_secs(1))
            .on_abandon(offloader::AbandonPolicy::CancelIfQueued)
            .into_future(),
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    let err = within("the caller's time-out", running)
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, Error::TimedOut { .. }), "{err:?}");
    let err = within("the queued caller's time-out", queued)
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, Error::TimedOut { .. }), "{err:?}");
    assert!(
        recorder.warned(Some(KEEPS), WARNING),
        "no warning for {KEEPS}"
    );
    assert!(
        !recorder.warned(Some(CANCELLED), WARNING),
        "warned for a cancelled job"
    );
    gate.open();
    within("idle", pool.idle()).await;
}

/// A failed spawn of the observer's delivery thread is not silent: the
/// submit that tried it logs a warning (the events wait for the next job).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_delivery_spawn_is_logged_at_warn() {
    let recorder = stuck_recorder();
    let log = Arc::new(Log::default());
    let pool = Offloader::builder()
        .observer(log.clone())
        .build()
        .expect("valid configuration");
    pool.__fail_next_delivery_spawns(1);
    let job = pool.offload(|_| 1).spawn().expect("accepted");
    assert!(
        recorder.warned(None, "could not spawn the observer's delivery thread"),
        "no warning"
    );
    assert_eq!(within("the job", job).await.unwrap(), 1);
}

/// Installed once as the global default: the warning is emitted on the
/// pool's monitor thread, which a thread-local default would not cover.
struct Global(&'static StuckRecorder);

impl tracing::Subscriber for Global {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.is_span() || *metadata.level() <= tracing::Level::WARN
    }

    fn new_span(&self, attrs: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let id = self.0.next_span.fetch_add(1, Ordering::Relaxed) + 1;
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(name) = fields.name {
            self.0.span_names.lock().unwrap().insert(id, name);
        }
        tracing::span::Id::from_u64(id)
    }

    fn record(&self, _span: &tracing::span::Id, _values: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _span: &tracing::span::Id, _follows: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let Some(message) = fields.message else {
            return;
        };
        let job = event.parent().and_then(|id| {
            self.0
                .span_names
                .lock()
                .unwrap()
                .get(&id.into_u64())
                .cloned()
        });
        if *event.metadata().level() == tracing::Level::WARN {
            self.0
                .warnings
                .lock()
                .unwrap()
                .push((job.clone(), message.clone()));
        }
        if !message.contains("stuck") {
            return;
        }
        self.0.stuck.lock().unwrap().push((
            job,
            *event.metadata().level(),
            message,
            fields.running_for,
        ));
    }

    fn enter(&self, _span: &tracing::span::Id) {}

    fn exit(&self, _span: &tracing::span::Id) {}
}

fn stuck_recorder() -> &'static StuckRecorder {
    static RECORDER: OnceLock<&'static StuckRecorder> = OnceLock::new();
    RECORDER.get_or_init(|| {
        let recorder: &'static StuckRecorder = Box::leak(Box::default());
        tracing::subscriber::set_global_default(Global(recorder))
            .expect("no other global subscriber in this test binary");
        recorder
    })
}

/// The stuck-job monitor sleeps between looks (a quarter of the threshold,
/// at most a second): while a job runs under a long threshold, its thread
/// uses next to no CPU. Counted in its own thread's CPU ticks over half a
/// second of a held job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stuck_job_monitor_sleeps_between_looks() {
    let pool = Offloader::builder()
        .max_in_flight(1)
        .thread_name("mon")
        .stuck_after(Duration::from_secs(60))
        .build()
        .expect("valid configuration");
    let (gate, hold) = gate();
    let (started_tx, mut started) = signal::<()>();
    let h = pool
        .offload(move |_stop| {
            let _ = started_tx.send(());
            hold.wait();
        })
        .spawn()
        .expect("room");
    recv("a function started", &mut started).await;
    eventually("the monitor thread runs", || {
        threads_named("mon-monitor") == 1
    })
    .await;
    let before = cpu_ticks_of_threads_named("mon-monitor");
    // A window of waiting, not an ordering of events.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let spent = cpu_ticks_of_threads_named("mon-monitor") - before;
    assert!(spent <= 2, "the monitor used {spent} ticks in 500 ms");
    gate.open();
    within("the held job", h).await.unwrap();
}

/// A job held past `stuck_after` is reported once, at WARN, and only once
/// it has run longer than the threshold (`State::newly_stuck`): the report's
/// `running_for` is past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_running_past_stuck_after_is_reported_once_at_warn() {
    const NAME: &str = "stuck-probe";
    const STUCK_AFTER: Duration = Duration::from_millis(20);
    let recorder = stuck_recorder();
    let pool = Offloader::builder()
        .max_in_flight(1)
        .stuck_after(STUCK_AFTER)
        .build()
        .expect("valid configuration");
    let (gate, hold) = gate();
    let (started_tx, mut started) = signal::<()>();
    let g = hold.clone();
    let h = pool
        .offload(move |_stop| {
            let _ = started_tx.send(());
            g.wait();
        })
        .name(NAME)
        .spawn()
        .expect("room");
    recv("a function started", &mut started).await;

    // Held on the gate until the monitor has reported it.
    eventually("the monitor reports the held job as stuck", || {
        !recorder.stuck_reports_for(NAME).is_empty()
    })
    .await;
    // Keep it held across several more monitor ticks (the tick is at most
    // 10 ms here): a job is reported once, not once per tick. This wait only
    // gives a repeated report the chance to show up; it orders nothing.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h.state(), JobState::Running);
    gate.open();
    within("the stuck job", h).await.unwrap();
    pool.shutdown();
    within(
        "terminated() (the monitor thread exits too)",
        pool.terminated(),
    )
    .await;

    let reports = recorder.stuck_reports_for(NAME);
    assert_eq!(
        reports.len(),
        1,
        "exactly one stuck report expected: {reports:?}"
    );
    assert_eq!(reports[0].1, tracing::Level::WARN, "{reports:?}");
    let running_for = reports[0].3.expect("a running_for field");
    assert!(running_for > STUCK_AFTER, "reported too early: {reports:?}");
}

// ---------------------------------------------------------------------------
// (i) backpressure, try form
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn_on_a_full_queue_is_refused_with_full_and_hands_the_closure_back() {
    let pool = pool(1, 1);
    let (gate, hold) = gate();
    let (started_tx, mut started) = signal::<()>();
    let g = hold.clone();
    let running = pool
        .offload(move |_stop| {
            let _ = started_tx.send(());
            g.wait();
            "running"
        })
        .spawn()
        .expect("room");
    recv("a function started", &mut started).await;
    let queued = pool
        .offload(|_stop| "queued")
        .spawn()
        .expect("one slot of room");

    let ran = flag();
    let r = ran.clone();
    let refused = pool
        .offload(move |_stop| {
            r.store(true, Ordering::SeqCst);
            "third"
        })
        .name("third")
        .spawn()
        .expect_err("the queue is full");
    match refused.reason() {
        Error::Full { capacity } => assert_eq!(*capacity, 1),
        other => panic!("expected Error::Full, got {other:?}"),
    }
    assert!(!ran.load(Ordering::SeqCst));
    let f = refused.into_inner();
    assert_eq!(
        f(&StopToken::new()),
        "third",
        "the original closure is handed back"
    );

    // Converted into the crate's error for `?`.
    let err: Error = pool
        .offload(|_stop| "fourth")
        .spawn()
        .expect_err("still full")
        .into();
    assert!(matches!(err, Error::Full { capacity: 1 }), "{err:?}");

    let m = pool.metrics();
    assert_eq!(
        (m.accepted, m.rejected_full, m.queued, m.running),
        (2, 2, 1, 1),
        "{m:?}"
    );
    assert!(m.queued <= 1, "the queue never grows past its capacity");
    assert!(m.ledger_balances(), "{m:?}");

    gate.open();
    assert_eq!(within("running", running).await.unwrap(), "running");
    assert_eq!(within("queued", queued).await.unwrap(), "queued");
    within("idle()", pool.idle()).await;
    // Room again once the queue drained.
    let h = pool
        .offload(|_stop| "room again")
        .spawn()
        .expect("the queue drained");
    assert_eq!(within("after", h).await.unwrap(), "room again");
    assert_eq!(pool.metrics().rejected_full, 2);
}

// ---------------------------------------------------------------------------
// (j) dropping the last Offloader clone
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_clone_shuts_down_gracefully_without_blocking() {
    // At most 15 bytes: Linux truncates thread names there.
    const THREAD: &str = "drop-last-wkr";
    let pool = builder(1, 8)
        .thread_name(THREAD)
        // Only a shutdown can make the worker exit within this test.
        .keep_alive(Duration::from_secs(3600))
        .build()
        .expect("valid configuration");
    let (gate, hold) = gate();
    let (started_tx, mut started) = signal::<()>();
    let g = hold.clone();
    let held = pool
        .offload(move |_stop| {
            let _ = started_tx.send(());
            g.wait();
            "held"
        })
        .name("held")
        .spawn()
        .expect("room");
    recv("a function started", &mut started).await;
    let queued: Vec<_> = (0..3)
        .map(|i| pool.offload(move |_stop| i).spawn().expect("room"))
        .collect();

    // The drop happens on a runtime thread while a function is held: it must
    // return at once (starting a graceful shutdown), not wait for the job.
    let dropper = tokio::spawn(async move { drop(pool) });
    within("dropping the last Offloader clone", dropper)
        .await
        .unwrap();
    assert!(!gate.is_open());
    assert_eq!(
        held.state(),
        JobState::Running,
        "the held job is still running"
    );
    assert!(!held.is_finished());

    gate.open();
    assert_eq!(within("the held job", held).await.unwrap(), "held");
    for (i, h) in queued.into_iter().enumerate() {
        assert_eq!(
            within("a queued job after the last clone was dropped", h)
                .await
                .unwrap(),
            i,
            "queued jobs still run after a graceful shutdown"
        );
    }
    // The shutdown really began: the worker exits long before its keep-alive.
    #[cfg(target_os = "linux")]
    eventually(
        "the worker thread exits after the drop-started shutdown",
        || threads_named(THREAD) == 0,
    )
    .await;
}

/// ARCHITECTURE inv. 7: after `idle()` every accepted job is terminal *and* its
/// outcome can be taken: no handle is left waiting for a publish that
/// trails the terminal transition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_idle_every_outcome_is_available() {
    let pool = pool(2, 64);
    for round in 0..300 {
        let handles: Vec<_> = (0..4)
            .map(|i| pool.offload(move |_stop| i).spawn().expect("room"))
            .collect();
        within("idle()", pool.idle()).await;
        for h in &handles {
            assert!(
                h.is_finished(),
                "round {round}: idle() returned before job {} was published",
                h.id()
            );
        }
        for (i, h) in handles.into_iter().enumerate() {
            assert_eq!(h.await.expect("completed"), i);
        }
    }
}

/// The close report counts what finished *during* the close, not before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_report_counts_only_what_finished_during_the_close() {
    let pool = pool(1, 8);
    for _ in 0..3 {
        pool.offload(|_stop| ()).await.expect("completed");
    }
    let _ = pool
        .offload(|_stop| -> () { panic!("on purpose, before the close") })
        .await;
    pool.offload(|_stop| ()).spawn().expect("room").detach();
    pool.offload(|_stop| -> () { panic!("on purpose, during the close") })
        .spawn()
        .expect("room")
        .detach();
    let report = within(
        "close",
        pool.close(Duration::from_secs(20), Duration::from_secs(1)),
    )
    .await;
    assert!(report.terminated && !report.escalated, "{report:?}");
    assert!(report.completed <= 1 && report.panicked <= 1, "{report:?}");
    let m = pool.metrics();
    assert_eq!((m.completed, m.panicked), (4, 2), "{m:?}");
}

/// A blocking wait for termination with a limit returns `true` when the pool
/// terminates within it, and `false` when it does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_await_termination_with_a_limit() {
    let pool = pool(1, 8);
    let job = occupy(&pool, 1).await;
    pool.shutdown();
    let p = pool.clone();
    let short = tokio::task::spawn_blocking(move || {
        p.blocking_await_termination(Some(Duration::from_millis(5)))
    });
    assert!(
        !within("short wait", short).await.expect("thread"),
        "terminated while a job still runs"
    );
    let (about_tx, about_rx) = std::sync::mpsc::channel();
    let p = pool.clone();
    let long = std::thread::spawn(move || {
        let _ = about_tx.send(());
        p.blocking_await_termination(Some(Duration::from_secs(60)))
    });
    about_rx.recv().expect("waiter started");
    job.release().await;
    assert!(
        long.join().expect("thread"),
        "the pool terminated within the limit"
    );
}

/// A waker that, when woken, opens a gate, then waits until the pool has
/// counted one completed job (the gated one), a bounded wait on an event.
/// `shutdown_now` wakes callers waiting for room after the critical section
/// that set the shutdown: a worker that finishes its job meanwhile must not
/// start the next one, which `shutdown_now` is about to return.
struct OpenGateOnWake {
    gate: Mutex<Option<Gate>>,
    pool: Offloader,
}

impl std::task::Wake for OpenGateOnWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let Some(gate) = self.gate.lock().unwrap().take() else {
            return;
        };
        gate.open();
        eventually_blocking("the gated job is counted completed", || {
            self.pool.metrics().completed >= 1
        });
    }
}

/// Found by a hostile review: `shutdown_now` set `shutdown` in one critical
/// section and began draining in the next, and between them it woke the
/// callers waiting for room. A worker finishing its job in that gap started
/// the next queued job, which then ran instead of being returned.
#[test]
fn shutdown_now_returns_the_queued_job_though_a_worker_finishes_while_it_wakes_room_waiters() {
    let pool = pool(1, 1);
    let (gate, hold) = gate();
    let (started_tx, mut started) = signal::<()>();
    let first = pool
        .offload(move |_stop| {
            started_tx.send(()).ok();
            hold.wait();
        })
        .spawn()
        .expect("accepted");
    recv_blocking("the first job started", &mut started);
    let queued = pool
        .offload(|_stop| "ran")
        .name("queued")
        .spawn()
        .expect("accepted: the queue's one place");
    // A caller waiting for room, polled with the waker that opens the gate.
    let mut waiting = Box::pin(pool.offload(|_stop| ()).submit());
    let waker = std::task::Waker::from(Arc::new(OpenGateOnWake {
        gate: Mutex::new(Some(gate)),
        pool: pool.clone(),
    }));
    let mut cx = std::task::Context::from_waker(&waker);
    assert!(
        std::future::Future::poll(waiting.as_mut(), &mut cx).is_pending(),
        "waits for room"
    );

    let unstarted = pool.shutdown_now();

    let names: Vec<_> = unstarted.iter().map(|j| j.name.as_deref()).collect();
    assert_eq!(names, [Some("queued")], "the queued job is returned");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        first.await.expect("the first job ran");
        let err = queued.await.expect_err("never started");
        assert!(
            matches!(err, Error::ShuttingDown { id: Some(_) }),
            "{err:?}"
        );
        let refused = waiting.await.expect_err("refused at shutdown");
        assert!(
            matches!(refused.reason(), Error::ShuttingDown { id: None }),
            "{refused:?}"
        );
    });
    assert_ledger(&pool.metrics());
}

/// Runs `fut` to completion on a fresh current-thread runtime: how a job
/// function waits on async code.
fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(fut)
}

/// The panic message of a job that must have panicked.
fn panic_message(outcome: Result<(), Error>) -> String {
    match outcome {
        Err(Error::Panicked { message, .. }) => message,
        other => panic!("the job should have panicked: {other:?}"),
    }
}

/// Found by a hostile review: a job that waited, without a limit, for its
/// own pool to be idle or terminated stayed running for good (the wait
/// includes its own end, or its thread's exit), where the observer's
/// thread got a clear panic. Now each is a panic naming the mistake, which
/// the job reports; a limited blocking wait for termination returns
/// `false` at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_that_include_the_calling_job_panic_instead_of_hanging() {
    quiet_deliberate_panics();
    let pool = pool(2, 16);
    let weak = pool.downgrade();
    let idle = pool
        .offload(move |_stop| {
            let p = weak.upgrade().expect("pool alive");
            block_on(p.idle());
        })
        .spawn()
        .expect("accepted");
    let message = panic_message(within("idle()", idle).await);
    assert!(
        message.contains("idle() awaited on one of the pool's own worker threads"),
        "{message}"
    );

    let weak = pool.downgrade();
    let terminated = pool
        .offload(move |_stop| {
            let p = weak.upgrade().expect("pool alive");
            block_on(p.terminated());
        })
        .spawn()
        .expect("accepted");
    let message = panic_message(within("terminated()", terminated).await);
    assert!(message.contains("termination awaited"), "{message}");

    let weak = pool.downgrade();
    let blocking = pool
        .offload(move |_stop| {
            let p = weak.upgrade().expect("pool alive");
            p.blocking_await_termination(None);
        })
        .spawn()
        .expect("accepted");
    let message = panic_message(within("blocking_await_termination(None)", blocking).await);
    assert!(message.contains("termination awaited"), "{message}");

    let weak = pool.downgrade();
    let limited = pool
        .offload(move |_stop| {
            let p = weak.upgrade().expect("pool alive");
            p.blocking_await_termination(Some(Duration::from_secs(3600)))
        })
        .spawn()
        .expect("accepted");
    assert!(
        !within("limited wait", limited).await.expect("returned"),
        "a limited wait for termination returns false at once on the pool's own thread"
    );

    // A group's idleness, from a job of the group or of a child group; a
    // job of another group may wait for it.
    let group = pool.group();
    let child = group.child();
    let other = pool.group();
    for (what, from) in [("the group", &group), ("a child group", &child)] {
        let g = group.clone();
        let job = from
            .offload(move |_stop| block_on(g.idle()))
            .spawn()
            .expect("accepted");
        let message = panic_message(within(what, job).await);
        assert!(
            message.contains("JobGroup::idle() awaited"),
            "{what}: {message}"
        );
    }
    let g = group.clone();
    let outsider = other
        .offload(move |_stop| block_on(g.idle()))
        .spawn()
        .expect("accepted");
    within("another group", outsider)
        .await
        .expect("a job of another group waits for the group to be idle");
    pool.shutdown();
    assert!(pool.await_termination(HANG).await, "terminated");
    assert_ledger(&pool.metrics());
}

/// Records whether awaiting its pool's `idle()` panicked when dropped.
struct IdleOnDrop(Offloader, Arc<Mutex<Option<String>>>);

impl Drop for IdleOnDrop {
    fn drop(&mut self) {
        let pool = self.0.clone();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            block_on(pool.idle());
        }));
        let seen = match caught {
            Ok(()) => "returned".to_string(),
            Err(p) => p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".into()),
        };
        *self.1.lock().unwrap() = Some(seen);
    }
}

/// Found by a second hostile review: `idle()` from a detached result's drop
/// on the worker hung for good (the job it belongs to stays counted until
/// the worker's next lock, after the drop), and from a waker on the worker
/// it panicked with the message meant for jobs. Both panic with a message
/// that says why, on any worker thread of the pool.
#[test]
fn idle_from_a_drop_the_worker_runs_panics_instead_of_hanging() {
    quiet_deliberate_panics();
    let pool = pool(2, 16);
    let seen = Arc::new(Mutex::new(None));
    let (gate, hold) = gate();
    let (p, s) = (pool.clone(), seen.clone());
    // Detached before the function returns: the worker drops the result.
    pool.offload(move |_stop| {
        hold.wait();
        IdleOnDrop(p, s)
    })
    .spawn()
    .expect("accepted")
    .detach();
    gate.open();
    eventually_blocking("the drop ran", || seen.lock().unwrap().is_some());
    let seen = seen.lock().unwrap().clone().unwrap_or_default();
    assert!(
        seen.contains("idle() awaited on one of the pool's own worker threads"),
        "{seen}"
    );
}

/// Found by a second hostile review: `close` from one of the pool's jobs
/// escalated at once (its wait for termination answered `false` at once
/// there), handing back jobs its graceful budget would have run; a group's
/// `close` from a job of the group panicked. Each waits its budgets again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_from_a_job_waits_its_graceful_budget() {
    let graceful = Duration::from_millis(100);
    let pool = pool(4, 64);
    let p = pool.clone();
    let closer = pool
        .offload(move |_stop| block_on(p.close(graceful, Duration::ZERO)))
        .spawn()
        .expect("accepted");
    let report = within("close from a job", closer).await.expect("returned");
    assert!(
        report.took >= graceful,
        "the graceful stage waited: {report:?}"
    );
    assert!(report.escalated && !report.terminated, "{report:?}");

    let pool = self::pool(2, 16);
    let group = pool.group();
    let g = group.clone();
    let closer = group
        .offload(move |_stop| block_on(g.close(graceful, Duration::ZERO)))
        .spawn()
        .expect("accepted");
    let report = within("a group's close from its job", closer)
        .await
        .expect("returned a report, did not panic");
    assert!(report.took >= graceful && report.escalated, "{report:?}");
    assert!(group.metrics().stopped);
}
