//! Interop with tokio-util's `CancellationToken` (issue 13; feature
//! `tokio-util`, run by `.ci/run` with `--features tokio-util`): a group
//! follows a token, and a job's stop token is watched as one.

#![cfg(feature = "tokio-util")]

mod support;

use offloader::{Error, StopToken};
use support::*;
use tokio_util::sync::CancellationToken;

/// Cancelling the token stops the group: its queued job is cancelled, its
/// running one sees its stop token, and new offloads are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_stops_when_its_token_is_cancelled() {
    let pool = pool(1, 16);
    let request = CancellationToken::new();
    let group = pool.group().stop_on(request.child_token());
    let (_g, hold) = gate();
    let (tx, mut started) = signal();
    let running = group
        .offload(gated_or_stop(&hold, &tx, ()))
        .spawn()
        .unwrap();
    recv("running", &mut started).await;
    let queued = group.offload(|_| ()).spawn().unwrap();
    assert!(!group.metrics().stopped);
    request.cancel();
    assert!(within("the running job", running).await.unwrap(), "stopped");
    assert!(within("the queued job", queued)
        .await
        .unwrap_err()
        .is_cancelled());
    assert!(group.metrics().stopped);
    assert!(group.offload(|_| ()).spawn().is_err());
}

/// An already cancelled token stops the group before `stop_on` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_already_cancelled_token_stops_at_once() {
    let pool = pool(1, 16);
    let token = CancellationToken::new();
    token.cancel();
    let group = pool.group().stop_on(token);
    assert!(group.metrics().stopped);
}

/// Outside a runtime the watch runs on the process's watch thread, which
/// sleeps until the token is cancelled and is woken by it (the token is
/// cancelled only once the thread is seen asleep: kills the mutant of the
/// thread's waker that never unparked it, from mutation testing of
/// interop.rs).
#[test]
fn stop_on_works_outside_a_runtime() {
    const WATCH: &str = "offloader-stop-on";
    let pool = pool(1, 16);
    let token = CancellationToken::new();
    let group = pool.group().stop_on(token.clone());
    eventually_blocking("the watch thread asleep", || {
        sleeping_threads_named(WATCH) > 0
    });
    token.cancel();
    eventually_blocking("the group stopped", || group.metrics().stopped);
}

/// A job's stop token, watched from async code as a cancellation token; a
/// token tree reaches the job through its group and comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_stop_token_is_watched_as_a_cancellation_token() {
    let pool = pool(1, 16);
    let root = CancellationToken::new();
    let group = pool.group().stop_on(root.child_token());
    let (token_tx, mut token_rx) = signal();
    let (_g, hold) = gate();
    let job = group
        .offload(move |stop: &StopToken| {
            token_tx.send(stop.cancellation_token()).unwrap();
            hold.wait_or_stop(stop)
        })
        .spawn()
        .unwrap();
    let watched = recv("the job's token", &mut token_rx).await;
    assert!(!watched.is_cancelled());
    root.cancel();
    within("the job's token cancelled", watched.cancelled()).await;
    assert!(within("the job", job).await.unwrap());
    let standalone = StopToken::new();
    standalone.request_stop();
    assert!(standalone.cancellation_token().is_cancelled());
}

/// A job follows a token: queued, it is cancelled and never runs; running,
/// its stop token is set; a job whose token was already cancelled never
/// runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_follows_a_token() {
    let pool = pool(1, 16);
    let request = CancellationToken::new();
    let (g, hold) = gate();
    let (tx, mut started) = signal();
    // Holds the one permit until the test lets it go, so the queued job
    // cannot start before its watch sees the cancellation (the watches are
    // tasks: a job that starts first has its stop token set instead).
    let running = pool
        .offload(move |stop| {
            tx.send(()).unwrap();
            hold.wait();
            stop.is_stopped()
        })
        .stop_on(request.child_token())
        .spawn()
        .unwrap();
    recv("running", &mut started).await;
    let ran = flag();
    let r = ran.clone();
    let queued = pool
        .offload(move |_| r.store(true, std::sync::atomic::Ordering::SeqCst))
        .stop_on(request.child_token())
        .spawn()
        .unwrap();
    let other = pool.offload(|_| "not following").spawn().unwrap();
    request.cancel();
    assert!(within("the queued job", queued)
        .await
        .unwrap_err()
        .is_cancelled());
    support::eventually("the running job asked to stop", || {
        pool.metrics().stop_requests == 1
    })
    .await;
    g.open();
    assert!(within("the running job", running).await.unwrap(), "stopped");
    assert_eq!(
        within("the other job", other).await.unwrap(),
        "not following"
    );
    assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
    let cancelled = CancellationToken::new();
    cancelled.cancel();
    let never = pool.offload(|_| ()).stop_on(cancelled).spawn().unwrap();
    assert!(within("never", never).await.unwrap_err().is_cancelled());
}

/// A job that follows a token cancelled already never runs, however fast
/// a free worker would take it: it is cancelled in the critical section
/// that accepts it (before, a worker started about one such job in 30 on a
/// pool with free permits, ahead of the watch that cancels it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_following_a_cancelled_token_never_runs() {
    let pool = pool(2, 16);
    let cancelled = CancellationToken::new();
    cancelled.cancel();
    let ran = flag();
    for _ in 0..300 {
        let r = ran.clone();
        let job = pool
            .offload(move |_| r.store(true, std::sync::atomic::Ordering::SeqCst))
            .stop_on(cancelled.clone())
            .spawn()
            .unwrap();
        assert!(within("the job", job).await.unwrap_err().is_cancelled());
    }
    assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
    let m = pool.metrics();
    assert_eq!((m.cancelled, m.completed), (300, 0), "{m:?}");
}

/// A job that follows a token cancelled already is cancelled while it is
/// accepted, not by its watch just after: with that moment held open and a
/// worker looking for work, the job still never runs (kills the mutant of
/// `Follow::is_cancelled` that left the cancel to the watch: mutation
/// testing of interop.rs; `a_job_following_a_cancelled_token_never_runs`
/// only catches it when the race falls that way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_following_a_cancelled_token_is_cancelled_as_it_is_accepted() {
    let pool = pool(2, 16);
    let cancelled = CancellationToken::new();
    cancelled.cancel();
    for _ in 0..10 {
        // A worker that has just finished a job looks for the next one for
        // a while before it parks.
        within("a warm-up job", pool.offload(|_| ())).await.unwrap();
        let (started_tx, started) = std::sync::mpsc::channel();
        // Holds the pool's `accepted` event (trace level, emitted on the
        // submitting thread after the accepting critical section) until the
        // job has started, at most `SHORT`: the window between accepting a
        // job and its watch seeing the token, held open.
        let started = std::sync::Mutex::new(started);
        let hold = OnEvents(move |event: &tracing::Event<'_>| {
            if *event.metadata().level() == tracing::Level::TRACE {
                let started = started.lock().unwrap_or_else(|e| e.into_inner());
                let _ = started.recv_timeout(SHORT);
            }
        });
        let job = tracing::subscriber::with_default(hold, || {
            pool.offload(move |_| {
                let _ = started_tx.send(());
            })
            .stop_on(cancelled.clone())
            .spawn()
            .unwrap()
        });
        let outcome = within("the job", job).await;
        assert!(
            matches!(&outcome, Err(e) if e.is_cancelled()),
            "{outcome:?}"
        );
    }
    let m = pool.metrics();
    assert_eq!((m.cancelled, m.completed), (10, 10), "{m:?}");
}

/// Found by a hostile review: outside a runtime, every job offloaded with
/// `stop_on` got a watch thread of its own until its function ran, so 300
/// queued jobs made 300 threads (and a full default queue 4096). One thread
/// now watches for the whole process, and each job still follows its
/// token: the queued ones are cancelled, the running one is asked to stop.
#[test]
fn queued_jobs_following_tokens_outside_a_runtime_share_one_watch_thread() {
    const WATCH: &str = "offloader-stop-on";
    const JOBS: usize = 300;
    let pool = pool(1, 1024);
    let (started_tx, mut started) = signal::<()>();
    let (gate, hold) = gate();
    let token = CancellationToken::new();
    // Held on a gate until every queued job is cancelled: none can start
    // before its watch sees the token.
    let running = pool
        .offload(move |stop| {
            started_tx.send(()).ok();
            hold.wait();
            stop.is_stopped()
        })
        .stop_on(token.child_token())
        .spawn()
        .expect("accepted");
    recv_blocking("the first job started", &mut started);
    let queued: Vec<_> = (0..JOBS)
        .map(|i| {
            pool.offload(move |_stop| i)
                .stop_on(token.child_token())
                .spawn()
                .expect("accepted")
        })
        .collect();
    assert_eq!(threads_named(WATCH), 1, "one watch thread for every job");
    token.cancel();
    eventually_blocking(
        "every queued job cancelled, the running one asked to stop",
        || {
            running.is_stopped()
                && queued
                    .iter()
                    .all(|j| j.state() == offloader::JobState::Cancelled)
        },
    );
    gate.open();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        assert_eq!(
            within("the running job", running).await.ok(),
            Some(true),
            "the running job was asked to stop"
        );
        for job in queued {
            let err = within("a queued job", job).await.expect_err("cancelled");
            assert!(err.is_cancelled(), "{err:?}");
        }
    });
    assert_ledger(&pool.metrics());
}

/// Found by a hostile review: a watch ran as a task of the runtime that
/// offloaded the job, and died with it; a short-lived runtime dropped while
/// the job ran left a later cancellation unheard. Watches now run on the
/// process's watch thread.
#[test]
fn a_watch_outlives_the_runtime_that_offloaded_the_job() {
    let pool = pool(1, 16);
    let token = CancellationToken::new();
    let (started_tx, mut started) = signal::<()>();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let mut job = {
        let _inside = rt.enter();
        pool.offload(move |stop| {
            started_tx.send(()).ok();
            while !stop.is_stopped() {
                std::thread::yield_now();
            }
        })
        .stop_on(token.clone())
        .spawn()
        .expect("accepted")
    };
    drop(rt);
    recv_blocking("the job started", &mut started);
    token.cancel();
    within_blocking("the job saw its stop", move || job.blocking_wait(None))
        .expect("returned once stopped");
}

/// Found by a hostile review: a job following a token cancelled already
/// waited for room in a full queue, though it is cancelled as it is
/// accepted and never takes a place. It is accepted (and cancelled) at
/// once now, however full the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_following_a_cancelled_token_is_not_held_back_by_a_full_queue() {
    let pool = pool(1, 1);
    let occupied = occupy(&pool, 1).await;
    let queued = pool
        .offload(|_stop| ())
        .spawn()
        .expect("the queue's one place");
    let cancelled = CancellationToken::new();
    cancelled.cancel();
    let never = pool
        .offload(|_stop| ())
        .stop_on(cancelled.clone())
        .spawn()
        .expect("accepted although the queue is full");
    assert!(within("never", never).await.unwrap_err().is_cancelled());
    let awaited = within("awaited", pool.offload(|_stop| ()).stop_on(cancelled)).await;
    assert!(
        awaited.unwrap_err().is_cancelled(),
        "not left waiting for room"
    );
    occupied.release().await;
    within("the queued job", queued).await.expect("ran");
    let m = pool.metrics();
    assert_eq!((m.cancelled, m.rejected_full), (2, 0), "{m:?}");
    assert_ledger(&m);
}

/// Found by a second hostile review: with one watch thread for the
/// process, a stop callback that blocked (a slow abort in one pool) held
/// every other watch: another pool's queued job, whose token was cancelled
/// meanwhile, was not cancelled, and ran. A watch now fires its stop on a
/// thread of the watch runtime's blocking pool.
#[test]
fn a_blocking_stop_callback_holds_no_other_watch() {
    let a = pool(1, 16);
    let b = pool(1, 16);
    let (ta, tb) = (CancellationToken::new(), CancellationToken::new());
    let (release, held) = gate();
    let (started_tx, mut started) = signal::<()>();
    let (abort_tx, mut aborting) = signal::<()>();
    let mut slow = a
        .offload(move |stop| {
            // Kept registered (a guard dropped before its callback runs
            // takes it back: the function may see the stop first).
            let abort = stop.on_stop(move || {
                abort_tx.send(()).ok();
                held.wait();
            });
            std::mem::forget(abort);
            started_tx.send(()).ok();
            while !stop.is_stopped() {
                std::thread::yield_now();
            }
        })
        .stop_on(ta.clone())
        .spawn()
        .expect("accepted");
    recv_blocking("the slow job started", &mut started);
    ta.cancel();
    recv_blocking("the slow abort runs", &mut aborting);
    let (b_gate, b_hold) = gate();
    let mut first = b
        .offload(move |_stop| b_hold.wait())
        .spawn()
        .expect("accepted");
    let queued = b
        .offload(|_stop| "ran")
        .stop_on(tb.clone())
        .spawn()
        .expect("accepted");
    tb.cancel();
    eventually_blocking("the other pool's queued job is cancelled", || {
        queued.state() == offloader::JobState::Cancelled
    });
    b_gate.open();
    release.open();
    first.blocking_wait(None).expect("ran");
    slow.blocking_wait(None).expect("stopped");
}

/// A stop callback that a watch fires may wait for a job
/// (`blocking_wait`), as one run by a plain thread may: the watch fires it
/// on a blocking-pool thread, not on the watch runtime's own (found by a
/// second hostile review, where it panicked).
#[test]
fn a_stop_callback_fired_by_a_watch_may_wait_for_a_job() {
    let a = pool(1, 16);
    let other = pool(1, 16);
    let token = CancellationToken::new();
    let (started_tx, mut started) = signal::<()>();
    let (done_tx, mut done) = signal::<Option<u32>>();
    let mut job = a
        .offload(move |stop| {
            // Kept registered (a guard dropped before its callback runs
            // takes it back: the function may see the stop first).
            let abort = stop.on_stop(move || {
                let waited = other.offload(|_stop| 1).spawn().ok();
                done_tx
                    .send(waited.and_then(|mut h| h.blocking_wait(None).ok()))
                    .ok();
            });
            std::mem::forget(abort);
            started_tx.send(()).ok();
            while !stop.is_stopped() {
                std::thread::yield_now();
            }
        })
        .stop_on(token.clone())
        .spawn()
        .expect("accepted");
    recv_blocking("the job started", &mut started);
    token.cancel();
    assert_eq!(recv_blocking("the callback waited", &mut done), Some(1));
    job.blocking_wait(None).expect("stopped");
}

/// Found by a second hostile review: a caller waiting for room with a job
/// following a token went on waiting when the token was cancelled (with a
/// queue kept full, for good). It stops waiting then: the job is accepted
/// and cancelled at once, without a place, for `.await` and `submit()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_waiting_for_room_follows_its_tokens_cancellation() {
    let pool = pool(1, 1);
    let occupied = occupy(&pool, 1).await;
    let queued = pool
        .offload(|_stop| ())
        .spawn()
        .expect("the queue's one place");
    let token = CancellationToken::new();
    // Each polled once, and so waiting for room, before the cancel.
    let mut awaited = Box::pin(std::future::IntoFuture::into_future(
        pool.offload(|_stop| 5).stop_on(token.clone()),
    ));
    assert!(poll_once(awaited.as_mut()).await.is_pending());
    let mut submitted = Box::pin(pool.offload(|_stop| 6).stop_on(token.clone()).submit());
    assert!(poll_once(submitted.as_mut()).await.is_pending());
    token.cancel();
    let err = within("the awaiting caller", awaited).await.unwrap_err();
    assert!(err.is_cancelled(), "{err:?}");
    let handle = within("the submitting caller", submitted)
        .await
        .expect("accepted, cancelled");
    assert!(within("its handle", handle)
        .await
        .unwrap_err()
        .is_cancelled());
    occupied.release().await;
    within("the queued job", queued).await.expect("ran");
    let m = pool.metrics();
    assert_eq!((m.cancelled, m.rejected_full), (2, 0), "{m:?}");
    assert_ledger(&m);
}

// ---------------------------------------------------------------------------
// Issue 33, item 4: `stop_on` that keeps its word.

/// An observer that holds every delivery until its gate opens.
struct StuckObserver(Hold);

impl offloader::Observer for StuckObserver {
    fn on_event(&self, _event: &offloader::JobEvent) {
        self.0.wait();
    }
}

/// Issue 33, busy loop: a `submit()` waiting for a lagging observer, whose
/// followed token was then cancelled, retried without yielding (every retry
/// refused `ObserverBehind`, its wait for the token over at once), so the
/// current-thread runtime it ran on froze: neither its own timeout nor
/// anything else on it ran again. It stops waiting now, refused, with its
/// function handed back; the awaiting form likewise.
#[test]
fn a_caller_waiting_for_a_lagging_observer_stops_when_its_token_is_cancelled() {
    let (gate, hold) = gate();
    let pool = offloader::Offloader::builder()
        .observer(std::sync::Arc::new(StuckObserver(hold)))
        .observer_lag(1)
        .build()
        .expect("pool");
    let (done_tx, done) = std::sync::mpsc::channel();
    let caller = pool.clone();
    // The caller's own thread and runtime: on the old code this thread
    // spins for good, and the test fails on the bounded wait below.
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            // The observer is stuck on the first job's first event.
            let first = caller.offload(|_stop| ()).spawn().expect("accepted");
            within("the first job", first).await.expect("ran");
            let token = CancellationToken::new();
            let mut submitted = Box::pin(
                caller
                    .offload(|_stop| 6)
                    .with_timeout(HANG)
                    .stop_on(token.clone())
                    .submit(),
            );
            assert!(
                poll_once(submitted.as_mut()).await.is_pending(),
                "waits for the observer"
            );
            let mut awaited = Box::pin(std::future::IntoFuture::into_future(
                caller.offload(|_stop| 7).stop_on(token.clone()),
            ));
            assert!(poll_once(awaited.as_mut()).await.is_pending());
            token.cancel();
            let submitted = submitted.await.map(|_| ()).map_err(|e| {
                let behind = matches!(e.reason(), Error::ObserverBehind { .. });
                (behind, e.into_inner()(&StopToken::new()))
            });
            let awaited = awaited.await.map(|_| ());
            done_tx.send((submitted, awaited.is_err())).ok();
        });
    });
    let (submitted, awaited_failed) = done
        .recv_timeout(HANG)
        .expect("the caller's runtime froze: its submit never yielded");
    assert_eq!(
        submitted,
        Err((true, 6)),
        "refused for the observer's lag, the function handed back"
    );
    assert!(awaited_failed, "the awaited offload never ran");
    gate.open();
    let m = pool.metrics();
    assert_eq!(m.accepted, 1, "only the first job: {m:?}");
}

/// The environment variable that marks a child process of this binary.
const CHILD_ENV: &str = "OFFLOADER_INTEROP_CHILD";

/// Re-runs this test binary, filtered to the ignored child test `test`,
/// alone in its process (its thread counts are its own); fails if it failed.
fn run_child(test: &str) {
    let exe = std::env::current_exe().expect("test binary path");
    let out = std::process::Command::new(exe)
        .args([
            test,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, test)
        .output()
        .expect("run the child test process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child test {test} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
}

/// `true` in the child process started for `test`.
fn in_child(test: &str) -> bool {
    std::env::var(CHILD_ENV).as_deref() == Ok(test)
}

/// Threads of this process now.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

/// Issue 33, a thread per job: cancelling one token that 20,000 queued
/// jobs followed started 126–254 threads, as each fired watch ran its stop
/// on a new blocking thread. However many watches fire at once, the stops
/// run on a few threads now.
#[test]
fn many_watches_firing_at_once_start_few_threads() {
    run_child("many_watches_firing_at_once_start_few_threads_child");
}

#[test]
#[ignore = "run in its own process by many_watches_firing_at_once_start_few_threads"]
fn many_watches_firing_at_once_start_few_threads_child() {
    const JOBS: usize = 20_000;
    if !in_child("many_watches_firing_at_once_start_few_threads_child") {
        return;
    }
    let pool = pool(1, JOBS);
    let (started_tx, mut started) = signal::<()>();
    let (gate, hold) = gate();
    let token = CancellationToken::new();
    let mut first = pool
        .offload(move |_stop| {
            started_tx.send(()).ok();
            hold.wait();
        })
        .spawn()
        .expect("accepted");
    recv_blocking("the first job started", &mut started);
    let queued: Vec<_> = (0..JOBS)
        .map(|i| {
            pool.offload(move |_stop| i)
                .stop_on(token.clone())
                .spawn()
                .expect("accepted")
        })
        .collect();
    let before = threads();
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(before));
    let sampling = flag();
    let sampler = {
        let (peak, sampling) = (peak.clone(), sampling.clone());
        std::thread::spawn(move || {
            while !sampling.load(std::sync::atomic::Ordering::SeqCst) {
                peak.fetch_max(threads(), std::sync::atomic::Ordering::SeqCst);
                std::thread::yield_now();
            }
        })
    };
    token.cancel();
    eventually_blocking("every queued job cancelled", || {
        pool.metrics().cancelled == JOBS as u64
    });
    sampling.store(true, std::sync::atomic::Ordering::SeqCst);
    sampler.join().expect("sampler");
    // The fired watches' threads linger idle for a while: counted now too.
    let grown = peak
        .load(std::sync::atomic::Ordering::SeqCst)
        .max(threads())
        .saturating_sub(before + 1);
    // Four stop threads, and room for a thread of the pool's own.
    assert!(grown <= 6, "{grown} threads started to run {JOBS} stops");
    gate.open();
    within_blocking("the first job", move || first.blocking_wait(None)).expect("ran");
    assert!(queued
        .iter()
        .all(|j| j.state() == offloader::JobState::Cancelled));
}

/// Issue 33, a lost stop: `stop_on(t); t.cancel(); drop(group)` with the
/// default drop policy lost the stop (the watch acted later, through a
/// weak handle that no longer upgraded): the queued job ran, the running
/// one never saw its stop. And a token cancelled after the last handle
/// went was not followed at all. Both are followed now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_follows_its_token_after_its_last_handle_is_dropped() {
    for cancel_first in [true, false] {
        let pool = pool(1, 16);
        let token = CancellationToken::new();
        let group = pool.group().stop_on(token.clone());
        let (_g, hold) = gate();
        let (tx, mut started) = signal();
        let running = group
            .offload(gated_or_stop(&hold, &tx, ()))
            .spawn()
            .unwrap();
        recv("running", &mut started).await;
        let ran = flag();
        let r = ran.clone();
        let queued = group
            .offload(move |_| r.store(true, std::sync::atomic::Ordering::SeqCst))
            .spawn()
            .unwrap();
        if cancel_first {
            token.cancel();
            drop(group);
        } else {
            drop(group);
            token.cancel();
        }
        let what = if cancel_first {
            "cancel, drop"
        } else {
            "drop, cancel"
        };
        let stopped = try_within("the running job", running)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(stopped.unwrap(), "{what}: the running job saw its stop");
        let err = within("the queued job", queued).await.unwrap_err();
        assert!(err.is_cancelled(), "{what}: {err:?}");
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst), "{what}");
    }
}

/// Issue 33, only the last token counted: `stop_on(a).stop_on(b)`, then
/// cancelling `a`, left the job queued, and it ran. Every token is
/// followed now, by a job as by a group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_follows_every_token_it_is_given() {
    let pool = pool(1, 16);
    let occupied = occupy(&pool, 1).await;
    let (a, b, c) = (
        CancellationToken::new(),
        CancellationToken::new(),
        CancellationToken::new(),
    );
    let first = pool
        .offload(|_stop| "first")
        .stop_on(a.clone())
        .stop_on(b.clone())
        .stop_on(c.clone())
        .spawn()
        .unwrap();
    let second = pool
        .offload(|_stop| "second")
        .stop_on(b.clone())
        .stop_on(c.clone())
        .spawn()
        .unwrap();
    let last = pool
        .offload(|_stop| "last")
        .stop_on(c.clone())
        .spawn()
        .unwrap();
    a.cancel();
    eventually("the job following a among others cancelled", || {
        first.state() == offloader::JobState::Cancelled
    })
    .await;
    b.cancel();
    eventually("the job following b among others cancelled", || {
        second.state() == offloader::JobState::Cancelled
    })
    .await;
    occupied.release().await;
    assert_eq!(within("the last job", last).await.unwrap(), "last");
    // A group, likewise: each token it follows stops it.
    let (x, y) = (CancellationToken::new(), CancellationToken::new());
    let group = pool.group().stop_on(x.clone()).stop_on(y.clone());
    y.cancel();
    eventually("the group stopped by its second token", || {
        group.metrics().stopped
    })
    .await;
}

/// Registration takes effect before `stop_on` returns: a token cancelled
/// already cancels the group's queued job and sets its running job's stop
/// token before it returns (no wait, no watch), and `stop_on` chains with
/// `on_drop` either way round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_token_stops_a_groups_jobs_before_stop_on_returns() {
    let pool = pool(1, 16);
    let group = pool.group().on_drop(offloader::GroupDropPolicy::Stop);
    let (_g, hold) = gate();
    let (tx, mut started) = signal();
    let running = group
        .offload(gated_or_stop(&hold, &tx, ()))
        .spawn()
        .unwrap();
    recv("running", &mut started).await;
    let queued = group.offload(|_| ()).spawn().unwrap();
    let token = CancellationToken::new();
    token.cancel();
    let group = group
        .stop_on(token)
        .on_drop(offloader::GroupDropPolicy::LetRun);
    assert_eq!(queued.state(), offloader::JobState::Cancelled);
    assert!(running.is_stopped());
    assert!(group.metrics().stopped);
    assert!(within("the running job", running).await.unwrap());
}

/// A job follows its tokens whatever becomes of its handle: dropped at
/// once, the queued job is still cancelled when a token is, and never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_follows_its_token_after_its_handle_is_dropped() {
    let pool = pool(1, 16);
    let occupied = occupy(&pool, 1).await;
    let token = CancellationToken::new();
    let ran = flag();
    let r = ran.clone();
    drop(
        pool.offload(move |_| r.store(true, std::sync::atomic::Ordering::SeqCst))
            .stop_on(CancellationToken::new())
            .stop_on(token.clone())
            .spawn()
            .unwrap(),
    );
    token.cancel();
    eventually("the dropped job cancelled", || {
        pool.metrics().cancelled == 1
    })
    .await;
    occupied.release().await;
    within("idle", pool.idle()).await;
    assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
    assert_ledger(&pool.metrics());
}

/// Issue 33: `stop_on` wrapped the function, so a refused `spawn` handed
/// back an unnameable wrapper. It hands back the caller's own function now,
/// of the type the caller named.
#[tokio::test]
async fn a_refused_job_following_tokens_hands_back_the_callers_own_function() {
    fn answer(_: &StopToken) -> u8 {
        42
    }
    let pool = pool(1, 1);
    pool.shutdown();
    let f: fn(&StopToken) -> u8 = answer;
    let (a, b) = (CancellationToken::new(), CancellationToken::new());
    match pool.offload(f).stop_on(a).stop_on(b).spawn() {
        Ok(_) => panic!("accepted after shutdown"),
        Err(e) => {
            assert!(e.reason().is_shutdown(), "{e}");
            let f: fn(&StopToken) -> u8 = e.into_inner();
            assert_eq!(f(&StopToken::new()), 42);
        }
    }
}

/// A job refused for a full queue, then accepted when room frees (a
/// `submit` waiting for room), follows its token: each attempt has its own
/// end of the watch, and the refused attempt's, which ends as that attempt
/// is dropped, is not the accepted job's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_accepted_after_a_refusal_follows_its_token() {
    let pool = pool(1, 1);
    let occupied = occupy(&pool, 1).await;
    let queued = pool.offload(|_| ()).spawn().expect("the one place");
    let token = CancellationToken::new();
    let ran = flag();
    let r = ran.clone();
    let mut submitted = Box::pin(
        pool.offload(move |_| r.store(true, std::sync::atomic::Ordering::SeqCst))
            .stop_on(token.clone())
            .submit(),
    );
    assert!(
        poll_once(submitted.as_mut()).await.is_pending(),
        "refused for the full queue, it waits for room"
    );
    assert!(queued.cancel());
    let job = within("room", submitted).await.expect("accepted");
    assert_eq!(job.state(), offloader::JobState::Queued);
    token.cancel();
    let err = within("the followed job", job).await.unwrap_err();
    assert!(
        matches!(err, Error::Cancelled { id: Some(_) }),
        "cancelled by its token while queued: {err:?}"
    );
    occupied.release().await;
    within("idle", pool.idle()).await;
    assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
}
