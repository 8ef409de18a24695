//! The lifecycle observer: every job's transitions arrive in order, exactly
//! once, including cancel, immediate shutdown and abandoned callers; a
//! panicking observer does not break the pool; the observer may call back
//! into the pool; and after `terminated()` every event has been delivered.
//! An observer behind by more than its lag holds admission back: callers
//! waiting for room are woken as it catches up, and one that gives up is
//! counted as a timed-out wait. A delivery thread that failed to spawn is
//! spawned again by the next job or by the shutdown, and a terminated pool
//! starts none.
//!
//! Ordering is by gates and "started" messages, never by sleeps.

mod support;

use std::future::{Future, IntoFuture};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Waker};
use std::time::Duration;

use offloader::{
    AbandonPolicy, Error, EventKind, Fate, JobEvent, JobId, JobState, Observer, Offloader,
};
use support::*;

fn observed(max_in_flight: usize, observer: Arc<dyn Observer>) -> Offloader {
    builder(max_in_flight, 16)
        .observer(observer)
        .build()
        .expect("valid configuration")
}

/// Checks that one job's events form a valid life:
/// `Accepted, [Abandoned{Queued}], then one of
///   Started, [Abandoned{Running}], Finished(Completed | Panicked)
///   Finished(Cancelled)
///   NeverStarted`.
fn assert_valid_life(id: JobId, kinds: &[EventKind]) {
    use EventKind::*;
    let fail = || panic!("job {id}: invalid event sequence {kinds:?}");
    let mut it = kinds.iter().copied().peekable();
    if it.next() != Some(Accepted) {
        fail();
    }
    if it.peek()
        == Some(&Abandoned {
            state: JobState::Queued,
        })
    {
        it.next();
    }
    match it.next() {
        Some(Started) => {
            if it.peek()
                == Some(&Abandoned {
                    state: JobState::Running,
                })
            {
                it.next();
            }
            match it.next() {
                Some(Finished(JobState::Completed | JobState::Panicked)) => {}
                _ => fail(),
            }
        }
        Some(Finished(JobState::Cancelled)) | Some(NeverStarted) => {}
        _ => fail(),
    }
    if it.next().is_some() {
        fail();
    }
}

// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_and_panicked_jobs_give_accepted_started_finished_in_order() {
    let log = Arc::new(Log::default());
    let pool = observed(2, log.clone());

    let h = pool.offload(|_stop| 1).name("one").spawn().expect("room");
    let id = h.id();
    assert_eq!(within("job", h).await.unwrap(), 1);
    let p = pool
        .offload(|_stop| -> u8 { panic!("observer test panic") })
        .spawn()
        .expect("room");
    let pid = p.id();
    assert!(within("panicking job", p).await.unwrap_err().is_panic());

    // idle() also waits for the delivery of every event.
    within("idle()", pool.idle()).await;
    assert_eq!(
        log.kinds(id),
        [
            EventKind::Accepted,
            EventKind::Started,
            EventKind::Finished(JobState::Completed)
        ]
    );
    assert_eq!(
        log.names(id),
        vec![Some("one".to_owned()); 3],
        "every event carries the name"
    );
    assert_eq!(
        log.kinds(pid),
        [
            EventKind::Accepted,
            EventKind::Started,
            EventKind::Finished(JobState::Panicked)
        ]
    );
    assert_eq!(log.len(), 6);
    let at: Vec<_> = log
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.id == id)
        .map(|e| e.at)
        .collect();
    assert!(
        at.windows(2).all(|w| w[0] <= w[1]),
        "timestamps follow the order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_job_gives_accepted_then_finished_cancelled() {
    let log = Arc::new(Log::default());
    let pool = observed(1, log.clone());
    let running = occupy(&pool, 1).await;
    let queued = pool
        .offload(|_stop| ())
        .name("cancel-me")
        .spawn()
        .expect("room");
    let qid = queued.id();
    assert!(queued.cancel());
    assert!(matches!(
        within("cancelled", queued).await,
        Err(Error::Cancelled { id: Some(_) })
    ));
    running.release().await;
    within("idle()", pool.idle()).await;
    assert_eq!(
        log.kinds(qid),
        [
            EventKind::Accepted,
            EventKind::Finished(JobState::Cancelled)
        ]
    );
    for (id, kinds) in log.by_job() {
        assert_valid_life(id, &kinds);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_now_gives_never_started_for_queued_jobs() {
    let log = Arc::new(Log::default());
    let pool = observed(1, log.clone());
    let (started_tx, mut started) = signal::<()>();
    let running = pool
        .offload(move |stop| {
            let _ = started_tx.send(());
            stop.sleep(Duration::from_secs(3600))
        })
        .name("running")
        .spawn()
        .expect("room");
    recv("a function started", &mut started).await;
    let rid = running.id();
    let queued: Vec<_> = (0..2)
        .map(|i| {
            pool.offload(|_stop| ())
                .name(format!("q{i}"))
                .spawn()
                .expect("room")
        })
        .collect();
    let unstarted = pool.shutdown_now();
    assert_eq!(unstarted.len(), 2);
    assert!(
        within("running", running).await.unwrap().is_err(),
        "its sleep saw the stop"
    );
    within("terminated()", pool.terminated()).await;
    for q in &queued {
        assert_eq!(
            log.kinds(q.id()),
            [EventKind::Accepted, EventKind::NeverStarted]
        );
        assert_eq!(log.names(q.id())[1].as_deref(), q.name());
    }
    assert_eq!(
        log.kinds(rid),
        [
            EventKind::Accepted,
            EventKind::Started,
            EventKind::Finished(JobState::Completed)
        ]
    );
    for q in queued {
        assert!(matches!(
            within("unstarted", q).await,
            Err(Error::ShuttingDown { id: Some(_) })
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timed_out_caller_gives_abandoned_with_the_jobs_state() {
    let log = Arc::new(Log::default());
    let pool = observed(1, log.clone());
    let (gate, hold) = gate();
    let (started_tx, mut started) = signal::<()>();

    // Submitted by one poll, then the test waits for "started" before it
    // lets the caller's timeout be observed: the job is running by then.
    let g = hold.clone();
    let mut fut = Box::pin(
        pool.offload(move |_stop| {
            let _ = started_tx.send(());
            g.wait();
            "late"
        })
        .with_timeout(Duration::from_millis(20))
        .into_future(),
    );
    assert!(poll_once(fut.as_mut()).await.is_pending());
    let id = fut.job_id().expect("accepted on the first poll");
    recv("a function started", &mut started).await;

    // A second caller times out while its job is still queued behind the
    // first; CancelIfQueued then cancels it.
    let mut queued_fut = Box::pin(
        pool.offload(|_stop| "never")
            .with_timeout(Duration::from_millis(20))
            .on_abandon(AbandonPolicy::CancelIfQueued)
            .into_future(),
    );
    assert!(poll_once(queued_fut.as_mut()).await.is_pending());
    let qid = queued_fut.job_id().expect("accepted on the first poll");

    let err = within("the running caller's timeout", fut)
        .await
        .unwrap_err();
    match err {
        Error::TimedOut {
            id: e, state, fate, ..
        } => {
            assert_eq!(e, Some(id));
            assert_eq!(state, Some(JobState::Running));
            assert_eq!(fate, Fate::Kept);
        }
        other => panic!("expected TimedOut, got {other:?}"),
    }
    let queued_err = within("the queued caller's timeout", queued_fut)
        .await
        .unwrap_err();

    gate.open();
    within("idle()", pool.idle()).await;
    assert_eq!(
        log.kinds(id),
        [
            EventKind::Accepted,
            EventKind::Started,
            EventKind::Abandoned {
                state: JobState::Running
            },
            EventKind::Finished(JobState::Completed)
        ]
    );
    assert_eq!(
        log.kinds(qid),
        [
            EventKind::Accepted,
            EventKind::Abandoned {
                state: JobState::Queued
            },
            EventKind::Finished(JobState::Cancelled)
        ]
    );
    // The caller asked for a bounded wait, so it is told that its wait ended
    // and what its policy did to the queued job (`Offload::with_timeout`:
    // "the wait ends with Error::TimedOut and the job follows the abandon
    // policy"), not a bare `Cancelled` as if somebody else had cancelled it.
    assert!(
        matches!(
            queued_err,
            Error::TimedOut { id: Some(e), state: Some(JobState::Queued), fate: Fate::Cancelled, .. }
                if e == qid
        ),
        "expected TimedOut {{ state: Queued, fate: Cancelled }}, got {queued_err:?}"
    );
}

/// Panics on every event, after counting it.
#[derive(Default)]
struct Panicky(AtomicUsize);

impl Observer for Panicky {
    fn on_event(&self, _event: &JobEvent) {
        self.0.fetch_add(1, Ordering::SeqCst);
        panic!("observer test panic: the observer itself is broken");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_observer_does_not_break_the_pool() {
    const N: usize = 8;
    let observer = Arc::new(Panicky::default());
    let pool = observed(2, observer.clone());
    let mut handles = Vec::new();
    for i in 0..N {
        handles.push(pool.offload(move |_stop| i * 3).spawn().expect("room"));
    }
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(
            within("a job under a panicking observer", h).await.unwrap(),
            i * 3
        );
    }
    // Awaited directly too (the observer panics on the caller's thread here).
    assert_eq!(
        within("direct", pool.offload(|_stop| "direct"))
            .await
            .unwrap(),
        "direct"
    );
    within("idle()", pool.idle()).await;
    pool.shutdown();
    within("terminated()", pool.terminated()).await;
    let m = pool.metrics();
    assert_eq!(m.completed, N as u64 + 1, "{m:?}");
    assert!(m.ledger_balances(), "{m:?}");
    assert_eq!(
        observer.0.load(Ordering::SeqCst),
        3 * (N + 1),
        "delivery goes on after each panic: every event still reaches the observer"
    );
}

/// Calls back into the pool from inside `on_event`.
#[derive(Default)]
struct Reentrant {
    pool: OnceLock<Offloader>,
    events: AtomicUsize,
    unbalanced: AtomicUsize,
    follow_up_submitted: AtomicBool,
    follow_up_refused: AtomicBool,
    log: Log,
}

impl Observer for Reentrant {
    fn on_event(&self, event: &JobEvent) {
        self.events.fetch_add(1, Ordering::SeqCst);
        self.log.on_event(event);
        let Some(pool) = self.pool.get() else {
            return;
        };
        let m = pool.metrics();
        if !m.ledger_balances() {
            self.unbalanced.fetch_add(1, Ordering::SeqCst);
        }
        let _ = pool.running_jobs();
        let _ = pool.is_shutdown();
        let _ = pool.is_terminated();
        // Once: submit a new job from inside the observer.
        if event.name.as_deref() == Some("trigger")
            && matches!(event.kind, EventKind::Finished(_))
            && !self.follow_up_submitted.swap(true, Ordering::SeqCst)
        {
            match pool.offload(|_stop| "follow-up").name("follow-up").spawn() {
                Ok(h) => h.detach(),
                Err(_) => self.follow_up_refused.store(true, Ordering::SeqCst),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_observer_may_call_back_into_the_pool() {
    let observer = Arc::new(Reentrant::default());
    // One permit: the held job below keeps every later job queued.
    let pool = observed(1, observer.clone());
    // The observer holds a clone of the pool (so the pool is never dropped
    // by this test; it is shut down explicitly).
    assert!(observer.pool.set(pool.clone()).is_ok());

    // The body runs in its own task so that a deadlock on a runtime thread
    // fails the test through the timeout instead of hanging it.
    let p = pool.clone();
    let body = tokio::spawn(async move {
        let (gate, hold) = gate();
        let (started_tx, mut started) = signal::<()>();

        let trigger = p
            .offload(|_stop| "trigger")
            .name("trigger")
            .spawn()
            .expect("room");
        assert_eq!(trigger.await.unwrap(), "trigger");
        p.idle().await; // the follow-up job was accepted during delivery
        for _ in 0..4 {
            assert_eq!(p.offload(|_stop| 1).await.unwrap(), 1);
        }
        let g = hold.clone();
        let held = p
            .offload(move |stop| {
                let _ = started_tx.send(());
                g.wait();
                stop.is_stopped()
            })
            .spawn()
            .expect("room");
        recv("a function started", &mut started).await;
        let _queued: Vec<_> = (0..3)
            .map(|_| p.offload(|_stop| ()).spawn().expect("room"))
            .collect();
        let queued_cancel = p.offload(|_stop| ()).spawn().expect("room");
        assert!(queued_cancel.cancel());
        let unstarted = p.shutdown_now();
        assert!(!unstarted.is_empty());
        gate.open();
        assert!(held.await.unwrap(), "the held job saw the stop request");
        p.terminated().await;
    });
    within("the re-entrant observer test body", body)
        .await
        .unwrap();

    assert!(pool.is_terminated());
    assert!(observer.follow_up_submitted.load(Ordering::SeqCst));
    assert!(
        !observer.follow_up_refused.load(Ordering::SeqCst),
        "a job submitted from inside the observer was refused"
    );
    assert_eq!(
        observer.unbalanced.load(Ordering::SeqCst),
        0,
        "a snapshot seen from the observer did not balance"
    );
    let m = pool.metrics();
    // trigger, follow-up, 4 direct, held, 3 queued, 1 cancelled.
    assert_eq!(m.accepted, 11, "{m:?}");
    assert_eq!((m.completed, m.cancelled, m.unstarted), (7, 1, 3), "{m:?}");
    let by_job = observer.log.by_job();
    assert_eq!(by_job.len(), 11);
    for (id, kinds) in &by_job {
        assert_valid_life(*id, kinds);
    }
    // 7 ran (3 events each), 1 cancelled and 3 unstarted (2 each).
    assert_eq!(observer.events.load(Ordering::SeqCst), 7 * 3 + 4 * 2);
}

/// Slow on purpose, so that delivery lags behind the transitions it
/// reports: termination must still wait for it.
#[derive(Default)]
struct SlowLog(Log);

impl Observer for SlowLog {
    fn on_event(&self, event: &JobEvent) {
        std::thread::sleep(Duration::from_millis(1));
        self.0.on_event(event);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_termination_every_event_has_been_delivered() {
    let observer = Arc::new(SlowLog::default());
    let pool = observed(2, observer.clone());

    // 5 completed jobs, awaited directly: 3 events each.
    for i in 0..5 {
        assert_eq!(
            within("direct", pool.offload(move |_stop| i))
                .await
                .unwrap(),
            i
        );
    }
    // 1 panicked: 3 events.
    let p = pool
        .offload(|_stop| -> () { panic!("observer test panic") })
        .spawn()
        .expect("room");
    assert!(within("panic", p).await.unwrap_err().is_panic());

    // 2 running (cooperative), 4 queued; one queued is cancelled (2 events),
    // three are handed back by shutdown_now (2 events each), the running
    // ones finish after their stop (3 events each).
    let (started_tx, mut started) = signal::<()>();
    let mut running = Vec::new();
    for _ in 0..2 {
        let tx = started_tx.clone();
        running.push(
            pool.offload(move |stop| {
                let _ = tx.send(());
                stop.sleep(Duration::from_secs(3600)).is_err()
            })
            .spawn()
            .expect("room"),
        );
    }
    recv("a function started", &mut started).await;
    recv("a function started", &mut started).await;
    let queued: Vec<_> = (0..4)
        .map(|_| pool.offload(|_stop| false).spawn().expect("room"))
        .collect();
    assert!(queued[0].cancel());
    let unstarted = pool.shutdown_now();
    assert_eq!(unstarted.len(), 3);

    // No waiting on any handle: termination alone must imply delivery.
    within("terminated()", pool.terminated()).await;
    let expected = 5 * 3 + 3 + 2 + 3 * 2 + 2 * 3;
    assert_eq!(
        observer.0.len(),
        expected,
        "terminated() returned before every event was delivered"
    );
    for (id, kinds) in observer.0.by_job() {
        assert_valid_life(id, &kinds);
    }
    for h in running {
        assert!(
            within("running", h).await.unwrap(),
            "stopped by shutdown_now"
        );
    }
    // The first was cancelled, the others returned unstarted.
    for (i, h) in queued.into_iter().enumerate() {
        let e = within("queued", h).await.unwrap_err();
        assert!(
            if i == 0 {
                e.is_cancelled()
            } else {
                e.is_shutdown()
            },
            "{e}"
        );
    }
}

/// Blocks, once, on the first event of kind `block_on` until `gate` opens,
/// after telling the test it is blocked.
struct BlockOnce {
    block_on: EventKind,
    gate: Hold,
    blocked: Mutex<Option<tokio::sync::mpsc::UnboundedSender<()>>>,
    log: Log,
}

impl BlockOnce {
    fn new(block_on: EventKind) -> (Arc<Self>, Gate, tokio::sync::mpsc::UnboundedReceiver<()>) {
        let (gate, hold) = gate();
        let (tx, rx) = signal();
        let me = Arc::new(BlockOnce {
            block_on,
            gate: hold,
            blocked: Mutex::new(Some(tx)),
            log: Log::default(),
        });
        (me, gate, rx)
    }
}

impl Observer for BlockOnce {
    fn on_event(&self, event: &JobEvent) {
        self.log.on_event(event);
        if event.kind == self.block_on {
            let tx = self.blocked.lock().unwrap().take();
            if let Some(tx) = tx {
                let _ = tx.send(());
                self.gate.wait();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_waits_for_an_observer_that_is_still_delivering() {
    let (observer, observer_gate, mut blocked) =
        BlockOnce::new(EventKind::Finished(JobState::Cancelled));
    let pool = observed(1, observer.clone());
    let running = occupy(&pool, 1).await;
    let queued = pool.offload(|_stop| ()).spawn().expect("room");
    let qid = queued.id();

    // The cancel's own thread delivers `Finished(Cancelled)` and is held
    // inside the observer.
    let canceller = tokio::task::spawn_blocking(move || queued.cancel());
    recv("the observer is blocked", &mut blocked).await;
    // The running job finishes meanwhile; its events queue up behind the
    // delivery in progress.
    running.release().await;
    let m = pool.metrics();
    assert_eq!(
        (m.queued, m.running, m.completed, m.cancelled),
        (0, 0, 1, 1),
        "{m:?}"
    );
    assert!(
        !pool.is_idle(),
        "idle while an event is still being delivered to the observer"
    );
    assert!(
        still_pending(pool.idle()).await,
        "idle() completed while the observer was still being called"
    );

    observer_gate.open();
    assert!(within("the cancel", canceller).await.unwrap());
    within("idle()", pool.idle()).await;
    assert_eq!(
        observer.log.kinds(qid),
        [
            EventKind::Accepted,
            EventKind::Finished(JobState::Cancelled)
        ]
    );
    assert_eq!(
        observer.log.len(),
        5,
        "every event delivered once idle() returned"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn termination_waits_for_an_observer_that_is_still_delivering() {
    let (observer, observer_gate, mut blocked) = BlockOnce::new(EventKind::NeverStarted);
    let pool = observed(1, observer.clone());
    let running = occupy(&pool, 1).await;
    let queued = pool.offload(|_stop| ()).spawn().expect("room");

    // shutdown_now's own thread delivers `NeverStarted` and is held there.
    let p = pool.clone();
    let stopper = tokio::task::spawn_blocking(move || p.shutdown_now());
    recv("the observer is blocked", &mut blocked).await;
    running.release().await;
    // Every job is terminal and every worker thread has exited; only the
    // delivery is still in progress.
    eventually("the worker exits", || pool.metrics().workers == 0).await;
    let m = pool.metrics();
    assert_eq!((m.queued, m.running, m.workers), (0, 0, 0), "{m:?}");
    assert!(
        !pool.is_terminated(),
        "terminated while an event is still being delivered to the observer"
    );
    assert!(
        still_pending(pool.terminated()).await,
        "terminated() completed while the observer was still being called"
    );

    observer_gate.open();
    let unstarted = within("shutdown_now()", stopper).await.unwrap();
    assert_eq!(unstarted.len(), 1);
    within("terminated()", pool.terminated()).await;
    assert_eq!(
        observer.log.len(),
        5,
        "every event delivered once terminated() returned"
    );
    assert!(matches!(
        within("unstarted", queued).await,
        Err(Error::ShuttingDown { id: Some(_) })
    ));
}

/// An observer that blocks on a gate: what a durable ledger's `fsync` does.
struct Slow {
    hold: Mutex<Option<Hold>>,
    threads: Mutex<Vec<String>>,
    seen: AtomicUsize,
}

impl Slow {
    fn new(hold: Hold) -> Arc<Slow> {
        Arc::new(Slow {
            hold: Mutex::new(Some(hold)),
            threads: Mutex::new(Vec::new()),
            seen: AtomicUsize::new(0),
        })
    }
}

impl Observer for Slow {
    fn on_event(&self, _event: &JobEvent) {
        let name = std::thread::current().name().unwrap_or("").to_owned();
        self.threads.lock().unwrap().push(name);
        // Only the first event blocks, until the test opens the gate.
        let hold = self.hold.lock().unwrap().take();
        if let Some(hold) = hold {
            hold.wait();
        }
        self.seen.fetch_add(1, Ordering::SeqCst);
    }
}

/// Issue 10, item 11: a slow observer runs on the pool's own delivery
/// thread: it stalls neither the submitting async thread (a timer on a
/// current-thread runtime keeps firing) nor a worker.
#[tokio::test(flavor = "current_thread")]
async fn a_slow_observer_stalls_neither_the_async_thread_nor_the_workers() {
    let (gate, hold) = gate();
    let slow = Slow::new(hold);
    let pool = Offloader::builder()
        .thread_name("obs-slow")
        .observer(slow.clone())
        .build()
        .unwrap();
    // The observer now blocks on its first event; spawn returns anyway.
    let h = pool.offload(|_| 5).spawn().unwrap();
    // The job runs and its outcome arrives while the observer is blocked.
    assert_eq!(within("the job", h).await.unwrap(), 5);
    // The async thread is free: a timer on it fires.
    within(
        "a timer on the same thread",
        tokio::time::sleep(Duration::from_millis(1)),
    )
    .await;
    assert_eq!(slow.seen.load(Ordering::SeqCst), 0, "still blocked");
    assert!(!pool.is_idle(), "idle waits for delivery");
    gate.open();
    within("every event delivered", pool.idle()).await;
    assert_eq!(slow.seen.load(Ordering::SeqCst), 3);
    let m = pool.metrics();
    assert_eq!((m.events_delivered, m.events_pending), (3, 0), "{m:?}");
    for name in slow.threads.lock().unwrap().iter() {
        assert_eq!(
            name, "obs-slow-observer",
            "delivered on the delivery thread"
        );
    }
    pool.shutdown();
    within("terminated", pool.terminated()).await;
}

/// Issue 10, item 11: an observer more than `observer_lag` events behind
/// holds admission back: `spawn` is refused with its own reason, awaited
/// offloads and `submit` wait (a timed `submit` gives up), nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_observer_holds_admission_back() {
    let (gate, hold) = gate();
    let slow = Slow::new(hold);
    let pool = Offloader::builder()
        .observer(slow.clone())
        .observer_lag(4)
        .build()
        .unwrap();
    let mut done = Vec::new();
    // Two jobs make six events; the observer is stuck on the first.
    for i in 0..2 {
        let h = pool.offload(move |_| i).spawn().unwrap();
        done.push(within("job", h).await.unwrap());
    }
    let err = pool
        .offload(|_| 9)
        .spawn()
        .expect_err("six events behind, bound four");
    match err.reason() {
        Error::ObserverBehind { lag } => assert!(*lag >= 4, "{lag}"),
        other => panic!("expected ObserverBehind, got {other:?}"),
    }
    let timed = within(
        "a timed submit",
        pool.offload(|_| 9)
            .with_timeout(Duration::from_millis(20))
            .submit(),
    )
    .await;
    let timed = timed.expect_err("gave up within its timeout");
    assert!(
        matches!(timed.reason(), Error::TimedOut { id: None, .. }),
        "its timeout passed while it waited for the observer: {:?}",
        timed.reason()
    );
    // An awaited offload waits for the observer to catch up.
    let waiting = tokio::spawn(pool.offload(|_| 7).into_future());
    assert!(!waiting.is_finished());
    let m = pool.metrics();
    assert!(m.events_pending >= 4 && m.rejected_observer == 1, "{m:?}");
    assert_eq!((m.rejected_full, m.rejected_timed_out), (0, 1), "{m:?}");
    assert!(m.ledger_balances(), "{m:?}");
    gate.open();
    assert_eq!(
        within("the waiting offload", waiting)
            .await
            .unwrap()
            .unwrap(),
        7
    );
    within("idle", pool.idle()).await;
    let m = pool.metrics();
    assert_eq!(m.events_pending, 0, "{m:?}");
    assert_eq!(m.events_delivered, slow.seen.load(Ordering::SeqCst) as u64);
    assert_eq!(m.accepted, 3, "{m:?}");
    assert_eq!(done, vec![0, 1]);
}

/// `reason` is a wait for room that timed out, never accepted, and the pool
/// counted it as such: neither as refused for a full queue nor for the
/// observer.
fn assert_a_timed_out_wait_for_room(reason: &Error, pool: &Offloader) {
    assert!(
        matches!(
            reason,
            Error::TimedOut {
                id: None,
                state: None,
                fate: Fate::Cancelled,
                ..
            }
        ),
        "{reason:?}"
    );
    let m = pool.metrics();
    assert_eq!(
        (m.rejected_timed_out, m.rejected_full, m.rejected_observer),
        (1, 0, 0),
        "{m:?}"
    );
}

/// A caller waiting for room that gives up while the observer keeps within
/// its lag times out never accepted (`TimedOut { id: None, .. }`) and is
/// counted as a timed-out wait (`rejected_timed_out`), neither as refused
/// for a full queue nor for the observer, even when the room freed just
/// then went to another waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_waiter_that_gives_up_counts_as_timed_out_when_the_observer_keeps_up() {
    let (observer, observer_gate, mut delivering) =
        BlockOnce::new(EventKind::Finished(JobState::Cancelled));
    let pool = builder(1, 1)
        .observer(observer)
        .build()
        .expect("valid configuration");
    let occupied = occupy(&pool, 1).await;
    let queued = pool.offload(|_| ()).spawn().expect("one may wait");
    // A delivered batch wakes every room waiter: let these be delivered
    // before any caller waits.
    eventually("events so far delivered", || {
        pool.metrics().events_pending == 0
    })
    .await;
    let mut cx = Context::from_waker(Waker::noop());
    // Two callers wait for room; the first registered is woken first.
    let mut first = Box::pin(pool.offload(|_| "first").submit());
    assert!(first.as_mut().poll(&mut cx).is_pending());
    let mut second = Box::pin(pool.offload(|_| "second").with_timeout(SHORT).submit());
    assert!(second.as_mut().poll(&mut cx).is_pending());
    // The freed slot goes to the first, which is not polled yet; the
    // observer holds the cancellation's delivery meanwhile.
    assert!(queued.cancel());
    recv("the cancellation being delivered", &mut delivering).await;

    let err = within("the second caller's timeout", second)
        .await
        .expect_err("its time-out passes while the slot is promised away");
    assert_a_timed_out_wait_for_room(err.reason(), &pool);
    observer_gate.open();
    let admitted = within("the first caller", first).await.expect("room");
    occupied.release().await;
    assert_eq!(within("the first job", admitted).await.unwrap(), "first");
}

/// A caller that gives up waiting for room while the queue is full *and*
/// the observer lags times out never accepted, counted as a timed-out wait
/// for room (not as refused for the observer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_timed_out_on_a_full_queue_counts_as_timed_out_though_the_observer_lags() {
    let (observer_gate, hold) = gate();
    let pool = builder(1, 2)
        .observer(Slow::new(hold))
        .observer_lag(4)
        .build()
        .expect("valid configuration");
    let occupied = occupy(&pool, 1).await;
    let queued: Vec<_> = (0..2)
        .map(|i| pool.offload(move |_| i).spawn().expect("room for two"))
        .collect();
    let m = pool.metrics();
    assert_eq!((m.queued, m.running), (2, 1), "{m:?}");
    assert!(
        m.events_pending >= 4,
        "the observer lags its full lag: {m:?}"
    );
    let err = within(
        "the caller's timeout",
        pool.offload(|_| 9).with_timeout(SHORT).submit(),
    )
    .await
    .expect_err("the queue stays full");
    assert_a_timed_out_wait_for_room(err.reason(), &pool);
    observer_gate.open();
    occupied.release().await;
    for (i, job) in queued.into_iter().enumerate() {
        assert_eq!(within("a queued job", job).await.unwrap(), i);
    }
}

/// A caller waiting for room because the observer lags is woken when the
/// observer catches up, with no job finishing to wake it: every delivered
/// batch of events wakes the callers waiting for room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_waiter_held_back_by_the_observer_is_woken_when_it_catches_up() {
    let (observer_gate, hold) = gate();
    let pool = builder(1, 4)
        .observer(Slow::new(hold))
        .observer_lag(2)
        .build()
        .expect("valid configuration");
    // Three events, the observer held at the first: admission is held back.
    assert_eq!(within("a job", pool.offload(|_| 1)).await.unwrap(), 1);
    let mut waiting = Box::pin(pool.offload(|_| 7).submit());
    assert!(waiting
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
        .is_pending());
    let m = pool.metrics();
    assert!(m.events_pending >= 2 && m.accepted == 1, "{m:?}");
    // Nothing finishes from here on: only the observer catching up frees
    // admission.
    observer_gate.open();
    let admitted = within("the waiter, once the observer caught up", waiting)
        .await
        .expect("admitted");
    assert_eq!(within("its job", admitted).await.unwrap(), 7);
}

/// `observer_lag(0)` is a configuration error.
#[test]
fn a_zero_observer_lag_is_refused() {
    let err = Offloader::builder().observer_lag(0).build().unwrap_err();
    assert_eq!(err.to_string(), "observer_lag must be at least 1, got 0");
}

/// An observer that waits on its own pool: what would deadlock is refused
/// at once (second hostile review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_waiting_on_its_own_pool_does_not_deadlock_it() {
    quiet_deliberate_panics();
    struct Waits {
        pool: Mutex<Option<offloader::WeakOffloader>>,
        seen: Mutex<Vec<String>>,
    }
    impl Observer for Waits {
        fn on_event(&self, event: &JobEvent) {
            if event.kind != EventKind::Accepted {
                return;
            }
            let Some(pool) = self.pool.lock().unwrap().clone().and_then(|w| w.upgrade()) else {
                return;
            };
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let mut seen = Vec::new();
            // Bounded waits on its own pool: answered at once.
            seen.push(format!(
                "await_termination {}",
                pool.blocking_await_termination(Some(HANG))
            ));
            // An offload that would wait for the observer's own lag.
            let submitted = rt.block_on(pool.offload(|_| 0).submit());
            seen.push(format!(
                "submit {}",
                matches!(
                    submitted.as_ref().map_err(|e| e.reason()),
                    Err(Error::ObserverBehind { .. })
                )
            ));
            // Unbounded: a clear panic instead of a deadlock.
            let idle =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.block_on(pool.idle())));
            seen.push(format!("idle panicked {}", idle.is_err()));
            *self.seen.lock().unwrap() = seen;
        }
    }
    let waits = Arc::new(Waits {
        pool: Mutex::new(None),
        seen: Mutex::new(Vec::new()),
    });
    let pool = Offloader::builder()
        .observer(waits.clone())
        .observer_lag(1)
        .build()
        .unwrap();
    *waits.pool.lock().unwrap() = Some(pool.downgrade());
    within("a job", pool.offload(|_| ())).await.unwrap();
    within("idle: every event delivered", pool.idle()).await;
    assert_eq!(
        *waits.seen.lock().unwrap(),
        vec![
            "await_termination false".to_owned(),
            "submit true".to_owned(),
            "idle panicked true".to_owned()
        ]
    );
}

/// Waits for the pool's termination, without a limit, from inside
/// `on_event` (catching what the call does).
#[derive(Default)]
struct WaitsForTermination {
    pool: OnceLock<Offloader>,
    outcomes: Mutex<Vec<String>>,
}

impl Observer for WaitsForTermination {
    fn on_event(&self, event: &JobEvent) {
        let Some(pool) = self.pool.get() else {
            return;
        };
        if !matches!(event.kind, EventKind::Finished(_)) {
            return;
        }
        let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.blocking_await_termination(None)
        }));
        let outcome = match waited {
            Ok(terminated) => format!("returned {terminated}"),
            Err(p) => p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default(),
        };
        self.outcomes.lock().unwrap().push(outcome);
    }
}

/// An observer that waits, without a limit, for its pool's termination
/// would wait for the delivery of the event it is handling: the call
/// panics at once with a message that says so, instead of hanging the
/// delivery thread, and the pool goes on (kills the mutant of
/// `refuse_on_delivery_thread` that lets the wait begin: found by mutation
/// testing of shutdown.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_waiting_for_termination_without_a_limit_is_refused() {
    let observer = Arc::new(WaitsForTermination::default());
    let pool = builder(1, 4).observer(observer.clone()).build().unwrap();
    assert!(observer.pool.set(pool.clone()).is_ok());
    within("a job", pool.offload(|_| ())).await.unwrap();
    within("idle: every event delivered", pool.idle()).await;
    let outcomes = observer.outcomes.lock().unwrap().clone();
    assert_eq!(outcomes.len(), 1, "{outcomes:?}");
    assert!(
        outcomes[0].contains("from the pool's own observer"),
        "{outcomes:?}"
    );
}

// ---------------------------------------------------------------------------
// The delivery thread

/// The life of a job that ran to completion, as the observer sees it.
const COMPLETED_LIFE: [EventKind; 3] = [
    EventKind::Accepted,
    EventKind::Started,
    EventKind::Finished(JobState::Completed),
];

/// An observed pool (`observer_lag` as given, else the default) whose
/// delivery thread failed to spawn, after one job ran: its three events
/// wait, none delivered. Returns the pool, the observer's log and the job.
async fn stranded_events(lag: Option<usize>) -> (Offloader, Arc<Log>, JobId) {
    let log = Arc::new(Log::default());
    let mut b = builder(1, 4).observer(log.clone());
    if let Some(lag) = lag {
        b = b.observer_lag(lag);
    }
    let pool = b.build().expect("valid configuration");
    pool.__fail_next_delivery_spawns(1);
    let first = pool.offload(|_| 1).spawn().expect("accepted");
    let id = first.id();
    assert_eq!(within("the first job", first).await.unwrap(), 1);
    let m = pool.metrics();
    assert_eq!((m.events_delivered, m.events_pending), (0, 3), "{m:?}");
    (pool, log, id)
}

/// The observer's delivery thread failing to spawn does not strand the
/// pool: the events wait, the next accepted job spawns the thread again and
/// it delivers them all, and the pool still terminates (the failed spawn
/// left no delivery thread counted as alive).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_delivery_spawn_is_retried_by_the_next_job() {
    let (pool, log, first_id) = stranded_events(None).await;
    let second = pool.offload(|_| 2).spawn().expect("accepted");
    let second_id = second.id();
    assert_eq!(within("the second job", second).await.unwrap(), 2);
    pool.shutdown();
    within("termination", pool.terminated()).await;
    assert_eq!(log.kinds(first_id), COMPLETED_LIFE);
    assert_eq!(log.kinds(second_id), COMPLETED_LIFE);
    let m = pool.metrics();
    assert_eq!((m.events_delivered, m.events_pending), (6, 0), "{m:?}");
    assert_ledger(&m);
}

/// Events held back by a delivery thread that failed to spawn do not hold
/// admission back for good: the next caller's attempt spawns the thread
/// again before admission is decided, so a waiting `submit` gets in once
/// the events are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_stranded_by_a_failed_delivery_spawn_do_not_block_admission() {
    let (pool, _log, _) = stranded_events(Some(2)).await;
    // Over the lag, with no thread to deliver: `submit` waits for room.
    let second = within("admission", pool.offload(|_| 2).submit())
        .await
        .expect("admitted once the events were delivered");
    assert_eq!(within("the second job", second).await.unwrap(), 2);
    pool.shutdown();
    within("termination", pool.terminated()).await;
    let m = pool.metrics();
    assert_eq!((m.events_delivered, m.events_pending), (6, 0), "{m:?}");
    assert_ledger(&m);
}

/// A delivery thread that failed to spawn, with no job after it, does not
/// keep the pool from terminating: the shutdown spawns it again and the
/// waiting events are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_delivers_events_stranded_by_a_failed_delivery_spawn() {
    let (pool, log, id) = stranded_events(None).await;
    pool.shutdown();
    within("termination", pool.terminated()).await;
    assert_eq!(log.kinds(id), COMPLETED_LIFE);
    assert_ledger(&pool.metrics());
}

/// A terminated pool with an observer stays terminated: a refused offload
/// and a second shutdown start no delivery thread (nothing is left to
/// deliver).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_observed_pool_stays_terminated() {
    let log = Arc::new(Log::default());
    let pool = builder(1, 4)
        .observer(log.clone())
        .build()
        .expect("valid configuration");
    assert_eq!(within("a job", pool.offload(|_| 1)).await.unwrap(), 1);
    pool.shutdown();
    within("termination", pool.terminated()).await;
    assert!(pool.is_terminated());
    let refused = pool.offload(|_| 2).spawn();
    assert!(
        matches!(refused, Err(ref e) if matches!(e.reason(), Error::ShuttingDown { id: None })),
        "refused after shutdown"
    );
    assert!(pool.is_terminated(), "a refused offload started a thread");
    pool.shutdown();
    assert!(pool.is_terminated(), "a second shutdown started a thread");
    assert_ledger(&pool.metrics());
}
