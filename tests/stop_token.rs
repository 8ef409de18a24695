//! The stop token: `on_stop` callbacks, the stop-aware sleep, `check`, and
//! the deadline the function sees.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

use offloader::{JobState, StopToken, Stopped, DEFAULT_QUEUE_CAPACITY};
use support::*;

fn counter() -> (Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let c = Arc::new(AtomicUsize::new(0));
    (c.clone(), c)
}

// ---------------------------------------------------------------------------
// 6. Stop callbacks
// ---------------------------------------------------------------------------

#[test]
fn on_stop_runs_exactly_once_when_stop_is_requested() {
    let stop = StopToken::new();
    let (fired, f) = counter();
    let guard = stop.on_stop(move || {
        f.fetch_add(1, Ordering::SeqCst);
    });
    assert!(format!("{guard:?}").contains("registered: true"));
    assert_eq!(
        fired.load(Ordering::SeqCst),
        0,
        "ran before any stop request"
    );
    assert!(stop.request_stop(), "the first request wins");
    assert_eq!(
        fired.load(Ordering::SeqCst),
        1,
        "ran when stop was requested"
    );
    assert!(!stop.request_stop(), "a second request is a no-op");
    assert_eq!(fired.load(Ordering::SeqCst), 1, "ran twice");
    assert!(format!("{guard:?}").contains("registered: false"));
    drop(guard);
    assert_eq!(fired.load(Ordering::SeqCst), 1);
}

#[test]
fn concurrent_stop_requests_fire_each_callback_once() {
    for _round in 0..50 {
        let stop = StopToken::new();
        let (fired, f) = counter();
        let guards: Vec<_> = (0..4)
            .map(|_| {
                let f = f.clone();
                stop.on_stop(move || {
                    f.fetch_add(1, Ordering::SeqCst);
                })
            })
            .collect();
        let barrier = Arc::new(Barrier::new(4));
        let winners: usize = (0..4)
            .map(|_| {
                let (stop, barrier) = (stop.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    stop.request_stop()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| usize::from(t.join().expect("no panic")))
            .sum();
        assert_eq!(
            winners, 1,
            "exactly one request_stop call makes the request"
        );
        assert_eq!(
            fired.load(Ordering::SeqCst),
            4,
            "each callback exactly once"
        );
        drop(guards);
    }
}

#[test]
fn on_stop_registered_after_stop_runs_at_once_on_this_thread() {
    let stop = StopToken::new();
    stop.request_stop();
    let here = std::thread::current().id();
    let r: Arc<std::sync::Mutex<Option<std::thread::ThreadId>>> = Arc::default();
    let r2 = r.clone();
    let guard = stop.on_stop(move || {
        *r2.lock().unwrap() = Some(std::thread::current().id());
    });
    assert_eq!(
        *r.lock().unwrap(),
        Some(here),
        "a callback registered after stop runs before on_stop returns"
    );
    assert!(format!("{guard:?}").contains("registered: false"));
    drop(guard);
}

#[test]
fn dropping_the_guard_before_stop_means_it_never_runs() {
    let stop = StopToken::new();
    let (fired, f) = counter();
    let (kept, k) = counter();
    let dropped = stop.on_stop(move || {
        f.fetch_add(1, Ordering::SeqCst);
    });
    let _kept = stop.on_stop(move || {
        k.fetch_add(1, Ordering::SeqCst);
    });
    drop(dropped);
    stop.request_stop();
    assert_eq!(
        fired.load(Ordering::SeqCst),
        0,
        "an unregistered callback ran"
    );
    assert_eq!(kept.load(Ordering::SeqCst), 1);
}

#[test]
fn a_panicking_callback_does_not_prevent_the_others() {
    let stop = StopToken::new();
    let (fired, f) = counter();
    let mut guards = Vec::new();
    for i in 0..5 {
        let f = f.clone();
        guards.push(stop.on_stop(move || {
            if i == 2 {
                panic!("callback {i} panics on purpose");
            }
            f.fetch_add(1, Ordering::SeqCst);
        }));
    }
    assert!(stop.request_stop(), "request_stop itself must not panic");
    assert_eq!(
        fired.load(Ordering::SeqCst),
        4,
        "the other callbacks all ran"
    );
    assert!(stop.is_stopped());
    // The token still works afterwards.
    let (late, l) = counter();
    let _g = stop.on_stop(move || {
        l.fetch_add(1, Ordering::SeqCst);
    });
    assert_eq!(late.load(Ordering::SeqCst), 1);
    assert_eq!(stop.check(), Err(Stopped));
}

#[test]
fn dropping_the_guard_waits_for_a_callback_running_on_another_thread() {
    let stop = StopToken::new();
    let (in_cb_tx, in_cb_rx) = mpsc::channel();
    let (g, hold) = gate();
    let finished = Arc::new(AtomicBool::new(false));
    let fin = finished.clone();
    let guard = stop.on_stop(move || {
        in_cb_tx.send(()).expect("test alive");
        hold.wait();
        fin.store(true, Ordering::SeqCst);
    });
    let stopper = {
        let stop = stop.clone();
        std::thread::spawn(move || stop.request_stop())
    };
    in_cb_rx.recv_timeout(HANG).expect("callback runs");
    let (dropped_tx, dropped_rx) = mpsc::channel();
    let fin = finished.clone();
    let dropper = std::thread::spawn(move || {
        drop(guard);
        // After the drop returns the callback must have finished.
        dropped_tx
            .send(fin.load(Ordering::SeqCst))
            .expect("test alive");
    });
    // Give a broken drop the chance to return early.
    assert!(
        dropped_rx.recv_timeout(SHORT).is_err(),
        "the guard's drop returned while its callback was still running"
    );
    g.open();
    assert!(
        dropped_rx.recv_timeout(HANG).expect("drop returns"),
        "the callback had not finished when the guard's drop returned"
    );
    assert!(stopper.join().expect("no panic"));
    dropper.join().expect("no panic");
}

#[test]
fn a_callback_may_drop_its_own_guard_without_deadlock() {
    let stop = StopToken::new();
    let slot: Arc<std::sync::Mutex<Option<offloader::StopCallback>>> = Arc::default();
    let s = slot.clone();
    let (fired, f) = counter();
    let guard = stop.on_stop(move || {
        f.fetch_add(1, Ordering::SeqCst);
        // Dropping its own registration from inside the callback.
        drop(s.lock().unwrap().take());
    });
    *slot.lock().unwrap() = Some(guard);
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || done_tx.send(stop.request_stop()));
    assert!(done_rx
        .recv_timeout(HANG)
        .expect("request_stop deadlocked or panicked"));
    assert_eq!(fired.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handle_stop_fires_the_jobs_callback_to_abort_blocking_io() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let (started_tx, mut started) = signal::<()>();
    let h = pool
        .offload(move |stop| -> std::io::Result<&'static str> {
            // A stand-in for an SDK call blocked on its own I/O: the
            // callback aborts it, as closing a socket would.
            let (abort_tx, blocked_io) = mpsc::channel::<()>();
            let _abort = stop.on_stop(move || {
                let _ = abort_tx.send(());
            });
            started_tx.send(()).expect("test alive");
            match blocked_io.recv_timeout(HANG) {
                Ok(()) => Err(Stopped.into()),
                Err(_) => Ok("the I/O was never aborted"),
            }
        })
        .spawn()
        .expect("accepted");
    recv("started", &mut started).await;
    assert!(h.stop());
    let out = within("aborted job", h).await.expect("completed");
    let err = out.expect_err("the callback aborted the blocked call");
    assert_eq!(err.kind(), std::io::ErrorKind::Interrupted);
    let m = pool.metrics();
    assert_eq!(
        (m.stop_requests, m.completed, m.running),
        (1, 1, 0),
        "{m:?}"
    );
}

// ---------------------------------------------------------------------------
// 7. Stop-aware sleep
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_aware_sleep_wakes_early_on_handle_stop() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let (sleeping_tx, mut sleeping) = signal::<()>();
    let mut h = pool
        .offload(move |stop| {
            sleeping_tx.send(()).expect("test alive");
            // An hour: only a stop request can end this within the test.
            stop.sleep(Duration::from_secs(3600))
        })
        .spawn()
        .expect("accepted");
    recv("about to sleep", &mut sleeping).await;
    // The function is (about to be) asleep, not finished.
    tokio::time::timeout(SHORT, &mut h)
        .await
        .expect_err("sleeping");
    assert_eq!(h.state(), JobState::Running);

    assert!(h.stop());
    let out = within("sleep wakes on stop", h).await.expect("completed");
    assert_eq!(out, Err(Stopped));
}

#[test]
fn stop_aware_sleep_without_a_pool() {
    let stop = StopToken::new();
    // Not stopped: the full (tiny) duration passes.
    assert_eq!(stop.sleep(Duration::from_millis(1)), Ok(()));
    assert_eq!(stop.sleep(Duration::ZERO), Ok(()));

    let (sleeping_tx, sleeping_rx) = mpsc::channel();
    let sleeper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            sleeping_tx.send(()).expect("test alive");
            stop.sleep(Duration::from_secs(3600))
        })
    };
    sleeping_rx.recv_timeout(HANG).expect("sleeper runs");
    assert!(stop.request_stop());
    let (joined_tx, joined_rx) = mpsc::channel();
    std::thread::spawn(move || joined_tx.send(sleeper.join()));
    let out = joined_rx
        .recv_timeout(HANG)
        .expect("the sleeper woke on stop")
        .expect("no panic");
    assert_eq!(out, Err(Stopped));

    // Already stopped: returns at once.
    assert_eq!(stop.sleep(Duration::from_secs(3600)), Err(Stopped));
    assert_eq!(stop.sleep(Duration::MAX), Err(Stopped));
}

#[test]
fn check_and_stopped_into_io_error() {
    let stop = StopToken::default();
    assert!(!stop.is_stopped());
    assert_eq!(stop.check(), Ok(()));
    stop.request_stop();
    assert!(stop.is_stopped());
    assert_eq!(stop.check(), Err(Stopped));
    let io: std::io::Error = stop.check().unwrap_err().into();
    assert_eq!(io.kind(), std::io::ErrorKind::Interrupted);
    // Clones share the one flag.
    let clone = stop.clone();
    assert!(clone.is_stopped());
}

// ---------------------------------------------------------------------------
// 8. The deadline inside the function
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_is_visible_inside_the_function() {
    let pool = pool(2, DEFAULT_QUEUE_CAPACITY);
    let limit = Duration::from_secs(30);

    // Awaited with a timeout.
    let (deadline, remaining) = within(
        "awaited with timeout",
        pool.offload(|stop| (stop.deadline(), stop.remaining()))
            .with_timeout(limit),
    )
    .await
    .unwrap();
    let deadline = deadline.expect("with_timeout sets a deadline");
    let remaining = remaining.expect("and a remaining time");
    assert!(remaining <= limit, "{remaining:?} > {limit:?}");
    assert!(deadline <= Instant::now() + limit);

    // Spawned with a timeout.
    let h = pool
        .offload(|stop| (stop.deadline(), stop.remaining()))
        .with_timeout(limit)
        .spawn()
        .unwrap();
    let (deadline, remaining) = within("spawned with timeout", h).await.unwrap();
    assert!(deadline.is_some());
    assert!(remaining.expect("remaining") <= limit);

    // No timeout, no deadline.
    let (deadline, remaining) = within(
        "no timeout",
        pool.offload(|stop| (stop.deadline(), stop.remaining())),
    )
    .await
    .unwrap();
    assert_eq!((deadline, remaining), (None, None));

    // An explicit deadline is passed through unchanged.
    let at = Instant::now() + Duration::from_secs(60);
    let (deadline, remaining) = within(
        "explicit deadline",
        pool.offload(|stop| (stop.deadline(), stop.remaining()))
            .deadline(at),
    )
    .await
    .unwrap();
    assert_eq!(deadline, Some(at));
    assert!(remaining.expect("remaining") <= Duration::from_secs(60));

    // Both: the earlier one wins.
    let far = Instant::now() + Duration::from_secs(3600);
    let (deadline, _) = within(
        "timeout earlier than deadline",
        pool.offload(|stop| (stop.deadline(), stop.remaining()))
            .deadline(far)
            .with_timeout(limit),
    )
    .await
    .unwrap();
    let deadline = deadline.expect("deadline");
    assert!(deadline < far);
    assert!(deadline <= Instant::now() + limit);
    let near = Instant::now() + Duration::from_secs(5);
    let (deadline, _) = within(
        "deadline earlier than timeout",
        pool.offload(|stop| (stop.deadline(), stop.remaining()))
            .deadline(near)
            .with_timeout(Duration::from_secs(3600)),
    )
    .await
    .unwrap();
    assert_eq!(deadline, Some(near));

    // A passed deadline: remaining saturates at zero, the job still runs.
    let past = Instant::now();
    let remaining = within(
        "passed deadline",
        pool.offload(|stop| stop.remaining()).deadline(past),
    )
    .await
    .unwrap();
    assert_eq!(remaining, Some(Duration::ZERO));
}

/// Each registration is its own: dropping one guard unregisters exactly its
/// callback, whichever order the guards go in.
#[test]
fn dropping_one_guard_unregisters_only_its_own_callback() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let stop = offloader::StopToken::new();
    let first = std::sync::Arc::new(AtomicUsize::new(0));
    let second = std::sync::Arc::new(AtomicUsize::new(0));
    let (f, s) = (first.clone(), second.clone());
    let keep = stop.on_stop(move || {
        f.fetch_add(1, Ordering::SeqCst);
    });
    let gone = stop.on_stop(move || {
        s.fetch_add(1, Ordering::SeqCst);
    });
    drop(gone);
    assert!(format!("{keep:?}").contains("registered: true"));
    stop.request_stop();
    assert_eq!(first.load(Ordering::SeqCst), 1);
    assert_eq!(second.load(Ordering::SeqCst), 0);
    drop(keep);
}

/// What a token and a callback guard print: whether stop was requested
/// and the deadline; whether the callback is still registered.
#[test]
fn a_token_and_a_callback_guard_print_their_state() {
    let token = StopToken::new();
    let guard = token.on_stop(|| {});
    assert_eq!(
        format!("{token:?}"),
        "StopToken { stopped: false, deadline: None }"
    );
    assert_eq!(format!("{guard:?}"), "StopCallback { registered: true }");
    assert!(token.request_stop());
    assert_eq!(
        format!("{token:?}"),
        "StopToken { stopped: true, deadline: None }"
    );
    assert_eq!(format!("{guard:?}"), "StopCallback { registered: false }");
}

/// Found by a hostile review: dropping the guard of a callback in the middle
/// moved the newest callback into its place, so the callbacks no longer ran
/// newest first as documented.
#[test]
fn callbacks_run_newest_first_after_a_guard_in_the_middle_is_dropped() {
    let stop = StopToken::new();
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let push = |n: u32| {
        let log = log.clone();
        move || log.lock().unwrap().push(n)
    };
    let _a = stop.on_stop(push(1));
    let b = stop.on_stop(push(2));
    let _c = stop.on_stop(push(3));
    let _d = stop.on_stop(push(4));
    drop(b);
    stop.request_stop();
    assert_eq!(*log.lock().unwrap(), [4, 3, 1]);
}
