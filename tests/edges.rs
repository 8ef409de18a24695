//! The edges (issue 10): full-width drain after a graceful shutdown, honest
//! backpressure, huge durations, bad names, panicking wakers, termination
//! that joins, stop on a finished job, repeatable errors, a submit that
//! keeps its timeout while waiting for room, the weak handle, the global
//! pool ignoring shutdown, a function's wait for a queued job of its own
//! pool refused when it would deadlock (and counted only while it lasts).
//! Every concurrent event is ordered by a gate or a signal; every wait is
//! bounded.

mod support;

use std::cell::RefCell;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use offloader::{Error, Fate, JobState, Offloader};
use support::{
    assert_ledger, gate, gated, occupy, pool, recv, signal, within, AwaitTermination, HANG,
};

/// A rendezvous: `arrive(n)` blocks until `n` callers are inside at once
/// (true) or [`HANG`] passes (false).
#[derive(Default)]
struct Meeting {
    inside: Mutex<usize>,
    changed: Condvar,
}

impl Meeting {
    fn arrive(&self, n: usize) -> bool {
        let mut inside = self.inside.lock().unwrap();
        *inside += 1;
        self.changed.notify_all();
        let (inside, timeout) = self
            .changed
            .wait_timeout_while(inside, HANG, |inside| *inside < n)
            .unwrap();
        drop(inside);
        !timeout.timed_out()
    }
}

/// Spawns `n` jobs on `pool` that meet at one [`Meeting`], job `i` waiting
/// for `need(i)` arrivals; each returns whether its meeting happened.
fn meeting_jobs(
    pool: &Offloader,
    n: usize,
    need: impl Fn(usize) -> usize,
) -> Vec<offloader::JobHandle<bool>> {
    let meeting = Arc::new(Meeting::default());
    (0..n)
        .map(|i| {
            let (m, k) = (meeting.clone(), need(i));
            pool.offload(move |_| m.arrive(k)).spawn().unwrap()
        })
        .collect()
}

/// Item 1: after a graceful shutdown, queued jobs drain at the full
/// `max_in_flight` width: eight queued jobs meet four at a time, which one
/// thread could never do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_drains_at_full_width() {
    for round in 0..5 {
        let pool = Offloader::builder().max_in_flight(4).build().unwrap();
        // Jobs 0–3 meet as four; jobs 4–7 arrive with 4 already counted,
        // so they need only themselves to be there.
        let handles = meeting_jobs(&pool, 8, |i| if i < 4 { 4 } else { 8 });
        pool.shutdown();
        for (i, h) in handles.into_iter().enumerate() {
            assert!(
                within("a drained job", h).await.unwrap(),
                "round {round}: job {i} never met its peers: the drain ran narrower than 4"
            );
        }
        within("termination", pool.terminated()).await;
        let m = pool.metrics();
        assert_eq!((m.completed, m.max_running), (8, 4), "{m:?}");
    }
}

/// Item 1, the last clone dropped and `close`: the same width.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_clone_and_close_drain_at_full_width() {
    let pool = Offloader::builder().max_in_flight(4).build().unwrap();
    let handles = meeting_jobs(&pool, 4, |_| 4);
    drop(pool);
    for h in handles {
        assert!(within("drained after drop", h).await.unwrap());
    }

    let pool = Offloader::builder().max_in_flight(4).build().unwrap();
    let handles = meeting_jobs(&pool, 4, |_| 4);
    let report = within("close", pool.close(HANG, HANG)).await;
    assert!(report.terminated && !report.escalated, "{report}");
    assert_eq!(report.completed, 4);
    for h in handles {
        assert!(within("drained by close", h).await.unwrap());
    }
}

/// Item 2: `queue_capacity` counts jobs *waiting for a permit*. On an idle
/// pool with four permits and a capacity of one, five jobs are accepted back
/// to back (four start, one waits) and the sixth is refused. Exact whatever
/// the timing: a start moves a job from queued to running, and the bound is
/// on their sum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_capacity_bounds_the_jobs_beyond_the_permits() {
    let pool = Offloader::builder()
        .max_in_flight(4)
        .queue_capacity(1)
        .build()
        .unwrap();
    let mut gates = Vec::new();
    let mut handles = Vec::new();
    for _ in 0..5 {
        let (g, hold) = gate();
        gates.push(g);
        handles.push(pool.offload(move |_| hold.wait()).spawn().expect("room"));
    }
    let err = pool
        .offload(|_| ())
        .spawn()
        .expect_err("4 running or about to, 1 waiting: full");
    assert!(matches!(err.reason(), Error::Full { capacity: 1 }));
    let m = pool.metrics();
    assert_eq!(
        (m.accepted, m.queued + m.running, m.rejected_full),
        (5, 5, 1)
    );
    for g in &gates {
        g.open();
    }
    for h in handles {
        within("job", h).await.unwrap();
    }
}

/// Item 3: `Duration::MAX` (and other huge durations) everywhere a user
/// gives one: no panic, no overflow, and it means "no limit".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_durations_mean_no_limit() {
    let pool = Offloader::builder()
        .keep_alive(Duration::MAX)
        .stuck_after(Duration::MAX)
        .build()
        .unwrap();
    for limit in [Duration::MAX, Duration::from_secs(u64::MAX / 2)] {
        let h = pool.offload(|_| 1).with_timeout(limit).spawn().unwrap();
        assert_eq!(within("spawned", h).await.unwrap(), 1);
        let h = pool
            .offload(|_| 2)
            .with_timeout(limit)
            .submit()
            .await
            .unwrap();
        assert_eq!(within("submitted", h).await.unwrap(), 2);
        let v = within("awaited", pool.offload(|_| 3).with_timeout(limit))
            .await
            .unwrap();
        assert_eq!(v, 3);
        let mut h = pool.offload(|_| 4).spawn().unwrap();
        assert_eq!(
            within("timeout", tokio::time::timeout(limit, &mut h))
                .await
                .unwrap()
                .unwrap(),
            4
        );
        let mut h = pool.offload(|_| 5).spawn().unwrap();
        let v = tokio::task::spawn_blocking(move || h.blocking_wait(Some(limit)))
            .await
            .unwrap();
        assert_eq!(v.unwrap(), 5);
        let deadline_ok = pool
            .offload(|stop| {
                stop.remaining()
                    .is_none_or(|r| r > Duration::from_secs(3600))
            })
            .with_timeout(limit);
        assert!(within("deadline", deadline_ok).await.unwrap());
    }
    let report = within("close", pool.close(Duration::MAX, Duration::MAX)).await;
    assert!(report.terminated, "{report}");
    assert!(within("await_termination", pool.await_termination(Duration::MAX)).await);
    assert!(pool.blocking_await_termination(Some(Duration::MAX)));
}

/// Item 4: a thread name with a NUL byte is refused at `build()`.
#[test]
fn a_thread_name_with_nul_is_a_build_error() {
    let err = Offloader::builder()
        .thread_name("io\0pool")
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"thread_name must not contain a NUL byte, got "io\0pool""#
    );
    let err = Offloader::builder()
        .max_in_flight(usize::MAX)
        .build()
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("max_in_flight must be at most "),
        "{err}"
    );
}

/// A waker whose `wake` panics; counts its calls.
struct PanickingWaker(AtomicUsize);

impl Wake for PanickingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
        panic!("a waker that panics on purpose");
    }
}

/// Item 5: a waker that panics is foreign code; the panic is caught, the
/// worker survives, the books stay right, and the pool goes on at
/// `max_in_flight(1)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_waker_does_not_wedge_the_pool() {
    support::quiet_deliberate_panics();
    let pool = Offloader::builder().max_in_flight(1).build().unwrap();
    let (g, hold) = gate();
    let (tx, mut started) = signal();
    let mut job = pool
        .offload(move |_| {
            tx.send(()).unwrap();
            hold.wait();
            7
        })
        .spawn()
        .unwrap();
    recv("started", &mut started).await;
    let waker_state = Arc::new(PanickingWaker(AtomicUsize::new(0)));
    let waker = Waker::from(waker_state.clone());
    let mut cx = Context::from_waker(&waker);
    assert!(Pin::new(&mut job).poll(&mut cx).is_pending());
    g.open(); // the worker publishes the outcome and wakes the panicking waker
    within("the pool idles", pool.idle()).await;
    assert_eq!(waker_state.0.load(Ordering::SeqCst), 1);
    assert_eq!(within("the outcome", job).await.unwrap(), 7);
    let m = pool.metrics();
    assert_eq!((m.running, m.completed, m.workers), (0, 1, 1), "{m:?}");
    // The one permit is free and the worker alive: the next job runs.
    assert_eq!(within("next job", pool.offload(|_| 8)).await.unwrap(), 8);

    // A producer waiting for room, polled with a panicking waker, woken when
    // a slot frees: caught too.
    let pool = Offloader::builder()
        .max_in_flight(1)
        .queue_capacity(1)
        .build()
        .unwrap();
    let occupied = occupy(&pool, 1).await;
    let queued = pool.offload(|_| ()).spawn().unwrap();
    let waiting = pool.offload(|_| 9).submit();
    let mut waiting = pin!(waiting);
    let waker_state = Arc::new(PanickingWaker(AtomicUsize::new(0)));
    let waker = Waker::from(waker_state.clone());
    assert!(waiting
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    assert!(queued.cancel(), "frees the slot, waking the producer");
    assert_eq!(waker_state.0.load(Ordering::SeqCst), 1);
    let h = within("the producer gets in", waiting).await.unwrap();
    occupied.release().await;
    assert_eq!(within("its job", h).await.unwrap(), 9);
    within("idle", pool.idle()).await;
    assert_ledger(&pool.metrics());
}

thread_local! {
    static EXIT_SIGNAL: RefCell<Option<ExitRecorder>> = const { RefCell::new(None) };
}

/// A thread-local whose destructor takes a while and then records that it
/// ran.
struct ExitRecorder {
    exited: Arc<AtomicBool>,
    release: std::sync::mpsc::Receiver<()>,
}

impl Drop for ExitRecorder {
    fn drop(&mut self) {
        // Waits (bounded) for the test to let the destructor finish, so the
        // test knows the thread is still exiting while it checks.
        let _ = self.release.recv_timeout(Duration::from_millis(50));
        self.exited.store(true, Ordering::SeqCst);
    }
}

/// Item 6: termination means every pool thread was *joined*: a worker's
/// thread-local destructors have run when `terminated()` returns, and
/// `is_terminated()` is false while they still run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn termination_waits_for_thread_local_destructors() {
    for how in ["async", "blocking", "polling"] {
        let pool = Offloader::builder().max_in_flight(1).build().unwrap();
        let exited = Arc::new(AtomicBool::new(false));
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let e = exited.clone();
        pool.offload(move |_| {
            EXIT_SIGNAL.with(|s| {
                *s.borrow_mut() = Some(ExitRecorder {
                    exited: e,
                    release: release_rx,
                })
            });
        })
        .await
        .unwrap();
        pool.shutdown();
        match how {
            "async" => within("terminated", pool.terminated()).await,
            "blocking" => {
                let p = pool.clone();
                let done =
                    tokio::task::spawn_blocking(move || p.blocking_await_termination(Some(HANG)))
                        .await
                        .unwrap();
                assert!(done);
            }
            _ => {
                let p = pool.clone();
                tokio::task::spawn_blocking(move || {
                    let deadline = std::time::Instant::now() + HANG;
                    while !p.is_terminated() {
                        assert!(std::time::Instant::now() < deadline, "never terminated");
                        std::thread::yield_now();
                    }
                })
                .await
                .unwrap();
            }
        }
        assert!(
            exited.load(Ordering::SeqCst),
            "{how}: terminated before the worker's thread-locals were destroyed"
        );
        assert!(pool.is_terminated());
        assert_eq!(pool.metrics().workers, 0);
        drop(release_tx);
    }
}

/// Item 8: `stop()` on a finished job is no request: `false`, not counted,
/// the flag untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_on_a_finished_job_is_no_request() {
    let pool = Offloader::builder().build().unwrap();
    let mut h = pool.offload(|_| 1).spawn().unwrap();
    assert_eq!(within("value", &mut h).await.unwrap(), 1);
    assert!(!h.stop());
    assert!(!h.is_stopped());
    assert!(!h.cancel());
    assert_eq!(pool.metrics().stop_requests, 0);
    // A cancelled (never started) job: terminal too.
    let one = Offloader::builder().max_in_flight(1).build().unwrap();
    let occupied = occupy(&one, 1).await;
    let queued = one.offload(|_| ()).spawn().unwrap();
    assert!(queued.cancel());
    assert!(!queued.stop());
    assert_eq!(one.metrics().stop_requests, 0);
    occupied.release().await;
}

/// Item 9: a `submit()` waiting for room keeps its `with_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_submit_keeps_its_timeout() {
    let pool = Offloader::builder()
        .max_in_flight(1)
        .queue_capacity(1)
        .build()
        .unwrap();
    let occupied = occupy(&pool, 1).await;
    let _queued = pool.offload(|_| ()).spawn().unwrap();
    let err = within(
        "a submit bounded by its timeout",
        pool.offload(|_| 5)
            .with_timeout(Duration::from_millis(50))
            .submit(),
    )
    .await
    .expect_err("no room within the timeout");
    match err.reason() {
        Error::TimedOut {
            id: None,
            waited,
            state: None,
            fate: Fate::Cancelled,
        } => {
            assert!(*waited >= Duration::from_millis(50), "{waited:?}")
        }
        other => panic!("expected a timeout never accepted, got {other:?}"),
    }
    assert_eq!(err.into_inner()(&offloader::StopToken::new()), 5);
    let m = pool.metrics();
    assert_eq!((m.rejected_timed_out, m.rejected_full), (1, 0), "{m:?}");
    occupied.release().await;
}

/// Item 10: an error outcome is returned again by every later wait; only a
/// value is taken once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_outcomes_are_repeatable() {
    support::quiet_deliberate_panics();
    let pool = Offloader::builder().max_in_flight(1).build().unwrap();
    let occupied = occupy(&pool, 1).await;
    let mut cancelled = pool.offload(|_| ()).spawn().unwrap();
    assert!(cancelled.cancel());
    occupied.release().await;
    for _ in 0..3 {
        let e = within("cancelled", &mut cancelled).await.unwrap_err();
        assert!(matches!(e, Error::Cancelled { id: Some(_) }), "{e:?}");
    }
    let e = cancelled.blocking_wait(None).unwrap_err();
    assert!(matches!(e, Error::Cancelled { id: Some(_) }), "{e:?}");

    let mut panicked = pool
        .offload(|_| -> u8 { panic!("a job that panics on purpose") })
        .spawn()
        .unwrap();
    for _ in 0..3 {
        let e = within("panicked", &mut panicked).await.unwrap_err();
        assert!(
            matches!(&e, Error::Panicked { message, .. } if message.contains("on purpose")),
            "{e:?}"
        );
    }
    let e = within("panicked, awaited", panicked).await.unwrap_err();
    assert!(e.is_panic());

    let mut value = pool.offload(|_| 3).spawn().unwrap();
    assert_eq!(within("value", &mut value).await.unwrap(), 3);
    let e = within("taken", &mut value).await.unwrap_err();
    assert!(matches!(e, Error::OutcomeTaken { .. }), "{e:?}");
}

/// Item 12: an observer holding a weak handle does not keep its pool open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weak_handle_does_not_keep_the_pool_open() {
    struct Holder(Mutex<Option<offloader::WeakOffloader>>, AtomicUsize);
    impl offloader::Observer for Holder {
        fn on_event(&self, _e: &offloader::JobEvent) {
            let weak = self.0.lock().unwrap().clone();
            if let Some(pool) = weak.and_then(|w| w.upgrade()) {
                let _ = pool.metrics();
                self.1.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
    let holder = Arc::new(Holder(Mutex::new(None), AtomicUsize::new(0)));
    let pool = Offloader::builder()
        .observer(holder.clone())
        .build()
        .unwrap();
    *holder.0.lock().unwrap() = Some(pool.downgrade());
    within("a job", pool.offload(|_| ())).await.unwrap();
    within("every event delivered", pool.idle()).await;
    assert!(holder.1.load(Ordering::SeqCst) >= 1);
    let weak = pool.downgrade();
    let watcher = pool.clone();
    drop(pool);
    assert!(weak.upgrade().is_some(), "one clone left");
    drop(watcher);
    assert!(weak.upgrade().is_none(), "the last clone is gone");
    assert!(format!("{weak:?}").contains("open: false"));
}

/// Item 14: the process-wide pool ignores shutdown requests, with work in
/// it: nothing queued is handed back, nothing is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_pool_ignores_shutdown() {
    let global = Offloader::global();
    // Every permit of the global pool held, one job queued behind them.
    let occupied = occupy(global, offloader::DEFAULT_MAX_IN_FLIGHT).await;
    let queued = global.offload(|_| 41).spawn().unwrap();
    global.shutdown();
    assert!(global.shutdown_now().is_empty(), "nothing handed back");
    let report = within("close", global.close(Duration::ZERO, Duration::ZERO)).await;
    assert!(!report.terminated && !report.escalated && report.unstarted.is_empty());
    assert!(!global.is_shutdown());
    assert_eq!(queued.state(), JobState::Queued);
    occupied.release().await;
    assert_eq!(within("the queued job", queued).await.unwrap(), 41);
    assert_eq!(
        within("free function", offloader::offload(|_| 42))
            .await
            .unwrap(),
        42
    );
}

/// The job state after each outcome, as a handle reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_handle_reports_its_terminal_state() {
    let pool = Offloader::builder().build().unwrap();
    let mut h = pool.offload(|_| ()).spawn().unwrap();
    within("done", &mut h).await.unwrap();
    assert_eq!(h.state(), JobState::Completed);
}

/// Item 13: a function that blocking-waits a queued job of its own pool
/// while every other permit is held the same way fails at once with
/// `WouldDeadlock` instead of hanging; the waited job still runs after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_a_queued_job_of_the_own_pool_cannot_deadlock() {
    let pool = Offloader::builder().max_in_flight(1).build().unwrap();
    let inner_pool = pool.clone();
    let outer = pool.offload(move |_| {
        let mut inner = inner_pool.offload(|_| "inner").spawn().unwrap();
        let id = inner.id();
        let waited = inner.blocking_wait(None);
        (id, waited.map_err(|e| (e.job_id(), e.to_string())))
    });
    let (id, waited) = within("outer", outer).await.unwrap();
    let (err_id, text) = waited.expect_err("one permit, held by the waiter: would deadlock");
    assert_eq!(err_id, Some(id));
    assert!(text.contains("would never return"), "{text}");
    within("the inner job runs once the outer returned", pool.idle()).await;
    assert_eq!(pool.metrics().completed, 2);

    // Two permits: the first such wait is fine (the other permit can run
    // the job); the second, which would hold the last permit, is refused.
    // Both outer jobs run (holding both permits) before either offloads its
    // inner job, which then stays queued; which of the two waits first is
    // up to the scheduler, so the test asks for exactly one refusal.
    let pool = Offloader::builder().max_in_flight(2).build().unwrap();
    let (g, hold) = gate();
    let (tx, mut started) = signal();
    let outer = |n: i32| {
        let (p, hold, tx) = (pool.clone(), hold.clone(), tx.clone());
        pool.offload(move |_| {
            tx.send(()).unwrap();
            hold.wait();
            let mut inner = p.offload(move |_| n).spawn().unwrap();
            inner.blocking_wait(None).map_err(|e| e.to_string())
        })
        .spawn()
        .unwrap()
    };
    let (first, second) = (outer(1), outer(2));
    recv("the first outer job runs", &mut started).await;
    recv("the second outer job runs", &mut started).await;
    g.open();
    let second = within("second", second).await.unwrap();
    let first = within("first", first).await.unwrap();
    // The refused wait's permit, once its job returned, ran the other's
    // inner job.
    let (refused, served, value) = match (&first, &second) {
        (Err(text), Ok(v)) => (text, v, 2),
        (Ok(v), Err(text)) => (text, v, 1),
        _ => panic!("exactly one wait is refused: {first:?} {second:?}"),
    };
    assert!(refused.contains("would never return"), "{refused}");
    assert_eq!(*served, value);
    within("idle", pool.idle()).await;
}

/// A function's blocking wait for a queued job of its own pool counts only
/// while it lasts: two rounds of two such waits on a two-permit pool each
/// see exactly one refused (`WouldDeadlock`: it would hold the last
/// permit) and one served, so a wait that ended no longer counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_wait_for_an_own_queued_job_no_longer_counts() {
    let pool = pool(2, 8);
    for round in 0..2 {
        let (both, hold) = gate();
        let (tx, mut started) = signal();
        let waiters: Vec<_> = (0..2)
            .map(|i| {
                let p = pool.clone();
                // Both permits held once the gate opens: the inner job queues.
                pool.offload(gated(&hold, &tx, (), move |_| {
                    let mut inner = p.offload(move |_| i).spawn().unwrap();
                    inner.blocking_wait(None).map_err(|e| e.to_string())
                }))
                .spawn()
                .unwrap()
            })
            .collect();
        for _ in 0..2 {
            recv("both waiters hold a permit", &mut started).await;
        }
        both.open();
        let mut served = 0;
        let mut refused = Vec::new();
        for h in waiters {
            match within("a waiter", h).await.unwrap() {
                Ok(_) => served += 1,
                Err(text) => refused.push(text),
            }
        }
        assert_eq!(served, 1, "round {round}: refused {refused:?}");
        assert!(
            refused.len() == 1 && refused[0].contains("would never return"),
            "round {round}: {refused:?}"
        );
        within("idle", pool.idle()).await;
    }
    let m = pool.metrics();
    assert_eq!(m.completed, 8, "{m:?}");
}

/// Item 16: `blocking_wait` on a current-thread runtime's thread panics
/// with a clear message instead of stalling every task of the runtime.
#[tokio::test(flavor = "current_thread")]
#[should_panic(expected = "current-thread tokio runtime")]
async fn blocking_wait_on_a_current_thread_runtime_panics() {
    support::quiet_deliberate_panics();
    let pool = Offloader::builder().build().unwrap();
    let mut h = pool.offload(|_| 1).spawn().unwrap();
    let _ = h.blocking_wait(None);
}

/// The same with a limit.
#[tokio::test(flavor = "current_thread")]
#[should_panic(expected = "blocking_wait called on a current-thread tokio runtime")]
async fn a_limited_blocking_wait_on_a_current_thread_runtime_panics() {
    support::quiet_deliberate_panics();
    let pool = Offloader::builder().build().unwrap();
    let mut h = pool.offload(|_| 1).spawn().unwrap();
    let _ = h.blocking_wait(Some(std::time::Duration::from_secs(1)));
}

/// Item 16, the legitimate places: `spawn_blocking` of a current-thread
/// runtime, and a multi-thread runtime's worker (through `block_in_place`,
/// so the worker's other tasks keep running meanwhile).
#[tokio::test(flavor = "current_thread")]
async fn blocking_wait_from_spawn_blocking_on_a_current_thread_runtime() {
    let pool = Offloader::builder().build().unwrap();
    let mut h = pool.offload(|_| 2).spawn().unwrap();
    let v = within(
        "spawn_blocking",
        tokio::task::spawn_blocking(move || h.blocking_wait(None)),
    )
    .await
    .unwrap();
    assert_eq!(v.unwrap(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn blocking_wait_on_a_multi_thread_worker_lets_other_tasks_run() {
    let pool = Offloader::builder().build().unwrap();
    let (g, hold) = gate();
    let (tx, mut started) = signal();
    let mut h = pool
        .offload(move |_| {
            tx.send(()).unwrap();
            hold.wait();
            3
        })
        .spawn()
        .unwrap();
    recv("started", &mut started).await;
    // The only runtime worker blocks in blocking_wait; a task spawned on the
    // runtime still runs (block_in_place moved it) and opens the gate.
    let opener = tokio::spawn(async move { g.open() });
    assert_eq!(h.blocking_wait(None).unwrap(), 3);
    within("the opener", opener).await.unwrap();
}

/// One stuck-job monitor per pool, however many jobs are accepted (kills a
/// mutant that started one per job).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_monitor_thread_per_pool() {
    let pool = Offloader::builder()
        .thread_name("mon1")
        .stuck_after(Duration::from_secs(3600))
        .build()
        .unwrap();
    for i in 0..20 {
        pool.offload(move |_| i).spawn().unwrap().detach();
    }
    within("idle", pool.idle()).await;
    // A new thread names itself as it starts: wait for the name to show.
    support::eventually("the monitor thread named", || {
        support::threads_named("mon1-monitor") >= 1
    })
    .await;
    assert_eq!(support::threads_named("mon1-monitor"), 1);
    pool.shutdown();
    within("terminated", pool.terminated()).await;
    // Joined at termination; the kernel lists a joined thread in
    // /proc/self/task for a moment after its join returns (the join waits
    // for the thread's exit to clear its tid, not for its task to be
    // released), so the count is polled.
    support::eventually("the monitor thread gone", || {
        support::threads_named("mon1-monitor") == 0
    })
    .await;
}

/// A blocking wait from outside the pool (a `spawn_blocking` thread) for a
/// queued job while every permit is busy waits for it: only the pool's own
/// functions are refused with `WouldDeadlock` (kills the mutant of
/// `Inner::is_own_worker` that takes every caller for one of the pool's
/// own: found by mutation testing of worker.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_wait_from_outside_the_pool_is_not_refused() {
    let pool = Offloader::builder().max_in_flight(1).build().unwrap();
    let occupied = occupy(&pool, 1).await;
    let mut queued = pool.offload(|_| 5).spawn().unwrap();
    let mut waiter = tokio::task::spawn_blocking(move || queued.blocking_wait(None));
    assert!(
        support::still_pending(&mut waiter).await,
        "the outside wait waits while the permit is busy"
    );
    occupied.release().await;
    assert_eq!(
        within("the outside wait", waiter).await.unwrap().unwrap(),
        5
    );
}

/// Wakes a flag and records the state of another job when woken.
struct Records {
    next: Arc<offloader::JobHandle<u8>>,
    seen: Mutex<Option<JobState>>,
}

impl Wake for Records {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        *self.seen.lock().unwrap() = Some(self.next.state());
    }
}

/// A job is never marked started while another job's foreign code runs on
/// its worker's thread: the waker of the first job's caller runs on the
/// worker before the next job's function, and sees that job still queued
/// (so still cancellable). Kills the mutants of `work_loop`'s "foreign code
/// next" test that start the next job first: found by mutation testing of
/// worker.rs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_job_is_not_started_while_a_waker_runs_on_its_thread() {
    let pool = Offloader::builder().max_in_flight(1).build().unwrap();
    let (g, hold) = gate();
    let (tx, mut started) = signal();
    let mut first = pool
        .offload(move |_| {
            tx.send(()).unwrap();
            hold.wait();
            1u8
        })
        .spawn()
        .unwrap();
    recv("the first job", &mut started).await;
    let next = Arc::new(pool.offload(|_| 2u8).spawn().unwrap());
    let waker = Arc::new(Records {
        next: next.clone(),
        seen: Mutex::new(None),
    });
    let w = Waker::from(waker.clone());
    assert!(Pin::new(&mut first)
        .poll(&mut Context::from_waker(&w))
        .is_pending());
    g.open();
    // Not polled again until its waker ran (a poll would replace it).
    support::eventually("the first caller's waker ran", || {
        waker.seen.lock().unwrap().is_some()
    })
    .await;
    assert_eq!(within("the first job", first).await.unwrap(), 1);
    let seen = *waker.seen.lock().unwrap();
    assert_eq!(
        seen,
        Some(JobState::Queued),
        "the waker ran before the next start"
    );
    drop(w);
    drop(waker);
    let Ok(next) = Arc::try_unwrap(next) else {
        panic!("the waker let go of the next job's handle");
    };
    assert_eq!(within("the next job", next).await.unwrap(), 2);
}

/// Records the state of another job when dropped.
struct DropRecords {
    next: Arc<Mutex<Option<Arc<offloader::JobHandle<u8>>>>>,
    seen: Arc<Mutex<Option<JobState>>>,
}

impl Drop for DropRecords {
    fn drop(&mut self) {
        let next = self.next.lock().unwrap().clone();
        *self.seen.lock().unwrap() = next.map(|n| n.state());
    }
}

/// The same for a detached job's result, dropped on the worker's thread
/// (user code): the next job is still queued while it drops. Kills the
/// mutant of that test that starts the next job first when no caller
/// waits: found by mutation testing of worker.rs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_job_is_not_started_while_a_detached_result_drops() {
    let pool = Offloader::builder().max_in_flight(1).build().unwrap();
    let (g, hold) = gate();
    let (tx, mut started) = signal();
    let next_slot = Arc::new(Mutex::new(None));
    let seen = Arc::new(Mutex::new(None));
    let result = DropRecords {
        next: next_slot.clone(),
        seen: seen.clone(),
    };
    pool.offload(move |_| {
        tx.send(()).unwrap();
        hold.wait();
        result
    })
    .spawn()
    .unwrap()
    .detach();
    recv("the detached job", &mut started).await;
    let next = Arc::new(pool.offload(|_| 2u8).spawn().unwrap());
    *next_slot.lock().unwrap() = Some(next.clone());
    g.open();
    support::eventually("the detached result dropped", || {
        seen.lock().unwrap().is_some()
    })
    .await;
    assert_eq!(*seen.lock().unwrap(), Some(JobState::Queued));
    next_slot.lock().unwrap().take();
    let Ok(next) = Arc::try_unwrap(next) else {
        panic!("only this test holds the next job's handle");
    };
    assert_eq!(within("the next job", next).await.unwrap(), 2);
}
