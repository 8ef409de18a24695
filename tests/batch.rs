//! Batch calls (issue 13): `invoke_all`, `invoke_any` and `map`, with the
//! permit and abandon semantics of single offloads. Every wait is bounded;
//! events are ordered by gates and signals, never by sleeps.

mod support;

use std::future::poll_fn;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Waker};

use futures_core::Stream;
use offloader::{AbandonPolicy, AllFailed, BatchError, Error, Fate, JobState, StopToken};
use support::*;

/// The next item of a stream, within [`HANG`].
async fn next<S: Stream>(mut s: Pin<&mut S>) -> Option<S::Item> {
    within("the next item", poll_fn(|cx| s.as_mut().poll_next(cx))).await
}

type Call<T> = Box<dyn FnOnce(&StopToken) -> T + Send>;

/// Outcomes come back in input order, panics included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invoke_all_returns_every_outcome_in_order() {
    quiet_deliberate_panics();
    let pool = pool(2, 16);
    let fs: Vec<Call<usize>> = (0..6)
        .map(|i| -> Call<usize> {
            Box::new(move |_| {
                if i == 4 {
                    panic!("{}", ON_PURPOSE);
                }
                i * 10
            })
        })
        .collect();
    let out = within("invoke_all", pool.invoke_all(fs)).await;
    assert_eq!(out.len(), 6);
    for (i, o) in out.iter().enumerate() {
        match o {
            Ok(v) => assert_eq!(*v, i * 10),
            Err(e) => assert!(i == 4 && e.is_panic(), "{i}: {e}"),
        }
    }
    assert!(within("empty", pool.invoke_all(Vec::<Call<()>>::new()))
        .await
        .is_empty());
}

/// At the timeout, unfinished jobs follow the abandon policy and say so:
/// under `CancelIfQueued` the running one goes on, the queued ones are
/// cancelled; the finished one has its value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invoke_all_with_timeout_applies_the_abandon_policy() {
    let pool = pool(1, 16);
    let (g, hold) = gate();
    let (tx, mut started) = signal();
    let mut fs: Vec<Call<u32>> = vec![Box::new(|_| 1)];
    fs.push(Box::new(move |_| {
        tx.send(()).unwrap();
        hold.wait();
        2
    }));
    fs.push(Box::new(|_| 3));
    fs.push(Box::new(|_| 4));
    let batch = pool
        .invoke_all(fs)
        .with_timeout(SHORT)
        .on_abandon(AbandonPolicy::CancelIfQueued);
    let out = within("invoke_all", batch).await;
    recv("the held job ran", &mut started).await;
    assert_eq!(*out[0].as_ref().unwrap(), 1);
    match &out[1] {
        Err(Error::TimedOut { state, fate, .. }) => {
            assert_eq!((*state, *fate), (Some(JobState::Running), Fate::Kept));
        }
        other => panic!("{other:?}"),
    }
    for o in &out[2..] {
        match o {
            Err(Error::TimedOut { fate, .. }) => assert_eq!(*fate, Fate::Cancelled),
            other => panic!("{other:?}"),
        }
    }
    g.open();
    within("idle", pool.idle()).await;
    let m = pool.metrics();
    assert_eq!((m.completed, m.cancelled), (2, 2), "{m:?}");
}

/// The first `Ok` wins; the queued loser is cancelled and never runs; the
/// running loser gets its stop token set and keeps its permit until its
/// function returns: with two permits, an outside job waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invoke_any_stops_the_losers_which_keep_their_permits() {
    let pool = pool(2, 16);
    let (loser_gate, loser_hold) = gate();
    let (tx, mut started) = signal();
    let (win_gate, win_hold) = gate();
    let ran_queued = flag();
    let rq = ran_queued.clone();
    let tx2 = tx.clone();
    let fs: Vec<Call<Result<&str, String>>> = vec![
        Box::new(move |stop| {
            tx2.send(()).unwrap();
            // Ignores its stop token until the test lets it go.
            while !stop.is_stopped() {
                std::thread::yield_now();
            }
            loser_hold.wait();
            Err("stopped".into())
        }),
        Box::new(move |_| {
            tx.send(()).unwrap();
            win_hold.wait();
            Ok("winner")
        }),
        Box::new(move |_| {
            rq.store(true, Ordering::SeqCst);
            Ok("queued loser")
        }),
    ];
    let race = tokio::spawn({
        let pool = pool.clone();
        async move { pool.invoke_any(fs).await }
    });
    recv("first", &mut started).await;
    recv("second", &mut started).await;
    win_gate.open();
    let won = within("invoke_any", race).await.unwrap();
    assert_eq!(won.unwrap(), (1, "winner"));
    // The winner's permit may start the queued loser in the moment before
    // the stop (the worker takes the next job as its function returns);
    // otherwise the stop cancelled it and it never runs.
    within("the queued loser settled", async {
        while pool.metrics().cancelled == 0 && !ran_queued.load(Ordering::SeqCst) {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let cancelled = pool.metrics().cancelled;
    assert_eq!(cancelled + u64::from(ran_queued.load(Ordering::SeqCst)), 1);
    within("the queued loser finished", async {
        while pool.metrics().running > 1 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // One permit is free, the other is the stopped loser's: of two outside
    // jobs, the second waits until the loser's function returns.
    let (outside_gate, outside_hold) = gate();
    let (otx, mut outside_started) = signal();
    let first = pool
        .offload(move |_| {
            otx.send(()).unwrap();
            outside_hold.wait();
        })
        .spawn()
        .unwrap();
    recv("the first outside job", &mut outside_started).await;
    let second = pool.offload(|_| "second").spawn().unwrap();
    let m = pool.metrics();
    assert_eq!(m.running, 2, "{m:?}");
    assert_eq!(
        second.state(),
        JobState::Queued,
        "one permit is the loser's"
    );
    loser_gate.open();
    assert_eq!(
        within("the second outside job", second).await.unwrap(),
        "second"
    );
    outside_gate.open();
    within("the first outside job", first).await.unwrap();
    within("idle", pool.idle()).await;
}

/// If every function fails, the race fails with one error, `AllFailed`,
/// that holds every job's error in input order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invoke_any_returns_every_error_when_all_fail() {
    quiet_deliberate_panics();
    let pool = pool(2, 16);
    let fs: Vec<Call<Result<(), usize>>> = vec![
        Box::new(|_| Err(0)),
        Box::new(|_| panic!("{}", ON_PURPOSE)),
        Box::new(|_| Err(2)),
    ];
    let AllFailed { errors, .. } = within("invoke_any", pool.invoke_any(fs)).await.unwrap_err();
    assert_eq!(errors.len(), 3);
    assert!(matches!(errors[0], BatchError::Failed(0)));
    assert!(matches!(&errors[1], BatchError::Job(e) if e.is_panic()));
    assert!(matches!(errors[2], BatchError::Failed(2)));
    let none = pool.invoke_any(Vec::<Call<Result<(), String>>>::new());
    let failed = within("empty", none).await.unwrap_err();
    assert!(failed.errors.is_empty());
    assert_eq!(failed.to_string(), "no job to run");
}

/// `invoke_any`'s failure goes up with `?` into a boxed error (it used to
/// be a `Vec`, which is no error), and its message counts the failures and
/// quotes the first one once: no source repeats it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invoke_any_fails_with_one_error_that_travels_with_question_mark() {
    async fn race(
        pool: &offloader::Offloader,
        n: usize,
    ) -> Result<(usize, ()), Box<dyn std::error::Error + Send + Sync>> {
        let fs: Vec<Call<Result<(), std::io::Error>>> = (0..n)
            .map(|i| -> Call<Result<(), std::io::Error>> {
                Box::new(move |_| Err(std::io::Error::other(format!("mirror {i} is down"))))
            })
            .collect();
        Ok(pool.invoke_any(fs).await?)
    }
    let pool = pool(2, 16);
    let e = within("a race", race(&pool, 3)).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "all 3 jobs failed; job 0: the function failed: mirror 0 is down"
    );
    assert!(e.source().is_none(), "said once: {:?}", e.source());
    let failed = e.downcast::<AllFailed<std::io::Error>>().unwrap();
    assert_eq!(failed.errors.len(), 3);
    let e = within("a race of one", race(&pool, 1)).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "the only job failed: the function failed: mirror 0 is down"
    );
}

/// Batch calls print how many jobs they carry and their options, and a
/// group prints its counters (kills the `Debug` mutants of `InvokeAll`,
/// `InvokeAny` and `JobGroup`: mutation testing of batch.rs and group.rs).
#[test]
fn batch_calls_and_groups_print_what_they_hold() {
    let pool = pool(2, 16);
    let fs: Vec<Call<u8>> = vec![Box::new(|_| 1), Box::new(|_| 2)];
    let all = format!(
        "{:?}",
        pool.invoke_all(fs)
            .with_timeout(std::time::Duration::from_millis(5))
            .on_abandon(AbandonPolicy::CancelIfQueued)
    );
    assert!(all.starts_with("InvokeAll"), "{all}");
    assert!(all.contains("jobs: 2"), "{all}");
    assert!(
        all.contains("5ms") && all.contains("CancelIfQueued"),
        "{all}"
    );
    let fs: Vec<Call<Result<u8, ()>>> = vec![Box::new(|_| Ok(1))];
    let any = format!("{:?}", pool.invoke_any(fs));
    assert!(
        any.starts_with("InvokeAny") && any.contains("jobs: 1"),
        "{any}"
    );
    let group = format!("{:?}", pool.group());
    assert!(group.starts_with("JobGroup"), "{group}");
    assert!(group.contains("accepted: 0"), "{group}");
}

/// Dropping an `invoke_any` future stops its jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_invoke_any_stops_its_jobs() {
    let pool = pool(2, 16);
    let (_g, hold) = gate();
    let (tx, mut started) = signal();
    let (back_tx, mut back) = signal();
    let fs: Vec<Call<Result<(), ()>>> = (0..2)
        .map(|_| -> Call<Result<(), ()>> {
            let (hold, tx, back_tx) = (hold.clone(), tx.clone(), back_tx.clone());
            Box::new(move |stop| {
                tx.send(()).unwrap();
                back_tx.send(hold.wait_or_stop(stop)).unwrap();
                Ok(())
            })
        })
        .collect();
    let race = tokio::spawn({
        let pool = pool.clone();
        async move { pool.invoke_any(fs).await }
    });
    recv("first", &mut started).await;
    recv("second", &mut started).await;
    race.abort();
    assert!(recv("a job stopped", &mut back).await);
    assert!(recv("a job stopped", &mut back).await);
    within("idle", pool.idle()).await;
}

/// `map` keeps at most `limit` jobs in flight, takes items only as room
/// frees, and yields in input order even when a later item finishes
/// first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_is_bounded_lazy_and_ordered() {
    let pool = pool(8, 1024);
    let probe = Concurrency::default();
    let pulled = Arc::new(AtomicUsize::new(0));
    let p = pulled.clone();
    let items = (0..200usize).inspect(move |_| {
        p.fetch_add(1, Ordering::SeqCst);
    });
    let (g, hold) = gate();
    let (tx, mut second_done) = signal();
    let pr = probe.clone();
    let mut s = pin!(pool
        .map(items, move |i, _| {
            let _in = pr.enter();
            if i == 0 {
                hold.wait(); // item 0 finishes after item 1
            }
            if i == 1 {
                tx.send(()).unwrap();
            }
            Ok::<_, ()>(i)
        })
        .limit(3));
    let opener = tokio::spawn(async move {
        recv("item 1 done", &mut second_done).await;
        g.open();
    });
    for i in 0..200 {
        assert_eq!(next(s.as_mut()).await.unwrap().unwrap(), i);
        assert!(pulled.load(Ordering::SeqCst) <= i + 1 + 3, "taken lazily");
    }
    assert!(next(s.as_mut()).await.is_none());
    within("opener", opener).await.unwrap();
    assert!(probe.max() <= 3, "at most 3 in flight: {}", probe.max());
    assert_eq!(pulled.load(Ordering::SeqCst), 200);
}

/// `unordered` yields as jobs finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_unordered_yields_in_completion_order() {
    let pool = pool(2, 16);
    let (g, hold) = gate();
    let mut s = pin!(pool
        .map([0, 1], move |i, _| {
            if i == 0 {
                hold.wait();
            }
            Ok::<_, ()>(i)
        })
        .unordered());
    assert_eq!(next(s.as_mut()).await.unwrap().unwrap(), 1);
    g.open();
    assert_eq!(next(s.as_mut()).await.unwrap().unwrap(), 0);
    assert!(next(s.as_mut()).await.is_none());
}

/// `stop_on_error`: the outcomes before the error, then the error, then the
/// end; no more items are taken, and the jobs in flight are stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_stop_on_error_stops_the_rest() {
    let pool = pool(2, 16);
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    let (back_tx, mut back) = signal();
    let (_g, hold) = gate();
    // Item 3 fails only once item 4 runs beside it.
    let (four_tx, four_rx) = std::sync::mpsc::channel::<()>();
    let four_rx = std::sync::Mutex::new(four_rx);
    let mut s = pin!(pool
        .map(0..1000usize, move |i, stop| {
            r.fetch_add(1, Ordering::SeqCst);
            match i {
                3 => {
                    let _ = four_rx.lock().unwrap().recv_timeout(HANG);
                    Err(format!("item {i} failed"))
                }
                4 => {
                    four_tx.send(()).unwrap();
                    // Held until the stop reaches it.
                    back_tx.send(hold.wait_or_stop(stop)).unwrap();
                    Ok(i)
                }
                _ => Ok(i),
            }
        })
        .limit(2)
        .stop_on_error());
    for i in 0..3 {
        assert_eq!(next(s.as_mut()).await.unwrap().unwrap(), i);
    }
    match next(s.as_mut()).await {
        Some(Err(BatchError::Failed(e))) => assert_eq!(e, "item 3 failed"),
        other => panic!("{other:?}"),
    }
    assert!(next(s.as_mut()).await.is_none());
    assert!(recv("item 4 saw the stop", &mut back).await);
    within("idle", pool.idle()).await;
    assert!(
        ran.load(Ordering::SeqCst) <= 5,
        "no item past the window ran"
    );
}

/// By default the map goes on past errors and yields every outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_goes_on_past_errors_by_default() {
    let pool = pool(2, 16);
    let mut s = pin!(pool.map(0..10, |i, _| if i % 3 == 0 { Err(i) } else { Ok(i) }));
    let mut errors = Vec::new();
    let mut values = Vec::new();
    while let Some(o) = next(s.as_mut()).await {
        match o {
            Ok(v) => values.push(v),
            Err(BatchError::Failed(e)) => errors.push(e),
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(errors, [0, 3, 6, 9]);
    assert_eq!(values, [1, 2, 4, 5, 7, 8]);
}

/// Dropping a map stream stops its jobs in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_map_stops_its_jobs() {
    let pool = pool(2, 16);
    let (_g, hold) = gate();
    let (tx, mut started) = signal();
    let (back_tx, mut back) = signal();
    {
        let mut s = Box::pin(pool.map(0..2, move |_, stop| {
            tx.send(()).unwrap();
            back_tx.send(hold.wait_or_stop(stop)).unwrap();
            Ok::<_, ()>(())
        }));
        assert!(support::still_pending(poll_fn(|cx| s.as_mut().poll_next(cx))).await);
        recv("first", &mut started).await;
        recv("second", &mut started).await;
    }
    assert!(recv("stopped", &mut back).await);
    assert!(recv("stopped", &mut back).await);
    within("idle", pool.idle()).await;
}

/// Once the pool shuts down, a map over an endless iterator yields the
/// refusal and ends: it takes no more items (it used to yield refusals for
/// ever, without a pending poll).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_map_ends_once_its_jobs_can_no_longer_be_accepted() {
    let pool = pool(2, 16);
    let group = pool.group();
    let mut s = pin!(group.map(0u64.., |i, _| Ok::<_, ()>(i)).limit(4));
    for i in 0..5 {
        assert_eq!(next(s.as_mut()).await.unwrap().unwrap(), i);
    }
    group.stop();
    let (mut refused, mut after_stop) = (0, 0);
    while let Some(o) = next(s.as_mut()).await {
        // Bounded: an endless map that was not stopped fails here, not at
        // the harness's timeout.
        after_stop += 1;
        assert!(after_stop <= 100, "the map went on past the stop");
        if let Err(BatchError::Job(e)) = o {
            // Refused by the stopped group, or cancelled by its stop.
            assert!(e.is_cancelled(), "{e}");
            refused += u64::from(e.job_id().is_none());
        }
        assert!(refused <= 4, "no item is taken after the first refusal");
    }
    assert!(next(s.as_mut()).await.is_none(), "and it stays ended");
    assert!(group.metrics().rejected <= 4, "{:?}", group.metrics());
}

/// A batch's first poll submits at most a budget of its jobs and yields:
/// another task on a current-thread runtime runs between the polls.
#[tokio::test(flavor = "current_thread")]
async fn a_large_batch_yields_while_it_submits() {
    let pool = pool(2, 100_000);
    let fs: Vec<Call<u32>> = (0..20_000u32)
        .map(|i| -> Call<u32> { Box::new(move |_| i) })
        .collect();
    let ticks = Arc::new(AtomicUsize::new(0));
    let t = ticks.clone();
    let ticker = tokio::spawn(async move {
        loop {
            t.fetch_add(1, Ordering::SeqCst);
            tokio::task::yield_now().await;
        }
    });
    let out = within("invoke_all", pool.invoke_all(fs)).await;
    ticker.abort();
    assert_eq!(out.len(), 20_000);
    assert!(
        ticks.load(Ordering::SeqCst) >= 20_000 / 64 / 2,
        "the ticker ran only {} times",
        ticks.load(Ordering::SeqCst)
    );
}

/// `stop_on_error` in completion order: a job still in flight at the error
/// is stopped and its outcome is not yielded: the error is the last item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_unordered_stop_on_error_yields_nothing_after_the_error() {
    let pool = pool(2, 16);
    let (_g, hold) = gate();
    let (tx, mut started) = signal();
    let (back_tx, mut back) = signal();
    // Item 0 fails once item 1 runs; item 1 returns `Ok` once stopped.
    let (one_tx, one_rx) = std::sync::mpsc::channel::<()>();
    let one_rx = std::sync::Mutex::new(one_rx);
    let mut s = pin!(pool
        .map(0..2usize, move |i, stop| {
            if i == 0 {
                let _ = one_rx.lock().unwrap().recv_timeout(HANG);
                return Err("item 0 failed");
            }
            tx.send(()).unwrap();
            one_tx.send(()).unwrap();
            back_tx.send(hold.wait_or_stop(stop)).unwrap();
            Ok(i)
        })
        .unordered()
        .stop_on_error());
    match next(s.as_mut()).await {
        Some(Err(BatchError::Failed(e))) => assert_eq!(e, "item 0 failed"),
        other => panic!("{other:?}"),
    }
    recv("item 1 ran", &mut started).await;
    assert!(recv("item 1 saw the stop", &mut back).await);
    within("idle", pool.idle()).await;
    assert!(next(s.as_mut()).await.is_none(), "nothing after the error");
}

/// A no-op context, to poll a stream by hand.
fn noop_cx() -> Context<'static> {
    Context::from_waker(Waker::noop())
}

/// `unordered` is bounded too: at most `limit` jobs in flight, and items
/// are taken only as room frees (no window of waiting outcomes holds it
/// back, so the count of jobs in flight alone must).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_unordered_keeps_at_most_limit_jobs_in_flight() {
    let pool = pool(8, 1024);
    let probe = Concurrency::default();
    let pulled = Arc::new(AtomicUsize::new(0));
    let p = pulled.clone();
    let items = (0..100usize).inspect(move |_| {
        p.fetch_add(1, Ordering::SeqCst);
    });
    let (g, hold) = gate();
    let (tx, mut started) = signal();
    let pr = probe.clone();
    let mut s = pin!(pool
        .map(items, move |i, _| {
            let _in = pr.enter();
            tx.send(()).unwrap();
            hold.wait();
            Ok::<_, ()>(i)
        })
        .limit(3)
        .unordered());
    assert!(s.as_mut().poll_next(&mut noop_cx()).is_pending());
    assert_eq!(
        pulled.load(Ordering::SeqCst),
        3,
        "one poll takes `limit` items"
    );
    for _ in 0..3 {
        recv("a job of the map", &mut started).await;
    }
    assert_eq!(pool.metrics().accepted, 3);
    g.open();
    let mut out = Vec::new();
    while let Some(o) = next(s.as_mut()).await {
        out.push(o.unwrap());
    }
    out.sort_unstable();
    assert_eq!(out, (0..100).collect::<Vec<_>>());
    assert!(probe.max() <= 3, "at most 3 in flight: {}", probe.max());
}

/// A field of a `Map`'s `Debug` text (`taken`, `in_flight`).
fn map_field(debug: &str, name: &str) -> usize {
    let from = debug.find(&format!("{name}: ")).expect(name) + name.len() + 2;
    let digits: String = debug[from..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().expect(name)
}

/// In input order, at most `limit` outcomes wait to be yielded: while item
/// 0 is held, item 1's outcome comes back and frees a job's room, yet no
/// third item is taken (it would make three outcomes wait behind item 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_in_input_order_holds_at_most_limit_outcomes() {
    let pool = pool(8, 1024);
    let pulled = Arc::new(AtomicUsize::new(0));
    let p = pulled.clone();
    let items = (0..10usize).inspect(move |_| {
        p.fetch_add(1, Ordering::SeqCst);
    });
    let (g, hold) = gate();
    let mut s = pin!(pool
        .map(items, move |i, _| {
            if i == 0 {
                hold.wait();
            }
            Ok::<_, ()>(i)
        })
        .limit(2));
    // Polled until the map has seen an outcome (one job fewer in flight
    // than taken): item 1's, item 0 being held.
    eventually("item 1's outcome seen by the map", || {
        assert!(s.as_mut().poll_next(&mut noop_cx()).is_pending());
        let debug = format!("{s:?}");
        map_field(&debug, "taken") > map_field(&debug, "in_flight")
    })
    .await;
    let debug = format!("{s:?}");
    assert_eq!(
        (map_field(&debug, "taken"), map_field(&debug, "in_flight")),
        (2, 1),
        "{debug}"
    );
    assert_eq!(pulled.load(Ordering::SeqCst), 2);
    g.open();
    for i in 0..10 {
        assert_eq!(next(s.as_mut()).await.unwrap().unwrap(), i);
    }
    assert!(next(s.as_mut()).await.is_none());
}

/// `map` on a pool that shut down takes the items of one window (its
/// limit), yields each one's refusal, then takes no more and ends: what its
/// docs say (a hostile review found them promising a single refusal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_on_a_shut_down_pool_refuses_one_window_of_items_then_ends() {
    let pool = pool(2, 16);
    pool.shutdown();
    let taken = Arc::new(AtomicUsize::new(0));
    let counted = taken.clone();
    let items = (0..1000).inspect(move |_| {
        counted.fetch_add(1, Ordering::SeqCst);
    });
    let mut s = pin!(pool.map(items, |i, _stop| Ok::<_, ()>(i)).limit(4));
    let mut refusals = 0;
    while let Some(outcome) = next(s.as_mut()).await {
        match outcome {
            Err(BatchError::Job(Error::ShuttingDown { id: None })) => refusals += 1,
            other => panic!("only refusals: {other:?}"),
        }
    }
    assert_eq!(refusals, 4, "one refusal per item of the window");
    assert_eq!(taken.load(Ordering::SeqCst), 4, "no item taken after them");
}

/// `invoke_all` jobs for the abandon tests: job 0 (the running one) waits
/// for its stop; its stop callback, which runs on the abandoning thread,
/// waits (up to `SHORT`) for another job of the batch to start, which is
/// what a stopped job's permit allowed when the batch let go of its jobs in
/// order. `started` counts the functions that ran.
fn chain_probe(n: usize, started: &Arc<AtomicUsize>) -> Vec<Call<()>> {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = Arc::new(std::sync::Mutex::new(rx));
    (0..n)
        .map(|i| {
            let (started, tx, rx) = (started.clone(), tx.clone(), rx.clone());
            Box::new(move |stop: &StopToken| {
                started.fetch_add(1, Ordering::SeqCst);
                if i > 0 {
                    tx.send(()).ok();
                    return;
                }
                let guard = stop.on_stop(move || {
                    let _ = rx.lock().unwrap().recv_timeout(SHORT);
                });
                while !stop.is_stopped() {
                    std::thread::yield_now();
                }
                // Not dropped: the drop would wait for the callback running
                // on the abandoning thread (StopToken::on_stop).
                std::mem::forget(guard);
            }) as Call<()>
        })
        .collect()
}

/// Found by a hostile review: a dropped or timed-out `invoke_all` with
/// `CancelAndStop` let go of its jobs one at a time, in order, so the
/// running job's stop gave its permit to the next job, still queued and not
/// yet let go of, which then ran (and was only asked to stop): every job
/// of the batch ran. The queued jobs are let go of first now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_invoke_all_cancels_its_queued_jobs_before_stopping_the_running_one() {
    const N: usize = 10;
    for timeout in [false, true] {
        let pool = pool(1, 64);
        let started = Arc::new(AtomicUsize::new(0));
        let batch = pool
            .invoke_all(chain_probe(N, &started))
            .on_abandon(AbandonPolicy::CancelAndStop);
        if timeout {
            let outcomes = within(
                "the batch",
                batch.with_timeout(std::time::Duration::from_millis(50)),
            )
            .await;
            let fates: Vec<_> = outcomes
                .iter()
                .map(|o| match o {
                    Err(Error::TimedOut { fate, .. }) => *fate,
                    other => panic!("timed out: {other:?}"),
                })
                .collect();
            assert_eq!(fates[0], Fate::StopRequested);
            assert!(
                fates[1..].iter().all(|f| *f == Fate::Cancelled),
                "{fates:?}"
            );
        } else {
            let mut batch = Box::pin(std::future::IntoFuture::into_future(batch));
            assert!(support::poll_once(batch.as_mut()).await.is_pending());
            eventually("the first job runs", || started.load(Ordering::SeqCst) == 1).await;
            drop(batch);
        }
        within("idle", pool.idle()).await;
        assert_eq!(
            started.load(Ordering::SeqCst),
            1,
            "timeout {timeout}: only the first ran"
        );
        let m = pool.metrics();
        assert_eq!(m.cancelled, (N - 1) as u64, "{m:?}");
        assert_ledger(&m);
    }
}

/// Found by a hostile review of the batch's own timer: its functions no
/// longer saw the timeout as their stop token's deadline (a single
/// offload's `with_timeout` shows it), and a big batch whose time ran out
/// while it was still offering jobs reported the ones not yet offered as
/// refused for a full queue that never was. Each job gets the deadline,
/// and each job not yet offered its one try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invoke_all_with_timeout_shows_the_deadline_and_offers_every_job() {
    let pool = pool(2, 1_000_000);
    const N: u64 = 50_000;
    let fs: Vec<_> = (0..N).map(|i| move |_: &StopToken| i).collect();
    let _ = within(
        "the big batch",
        pool.invoke_all(fs)
            .with_timeout(std::time::Duration::from_millis(1)),
    )
    .await;
    within("idle", pool.idle()).await;
    let m = pool.metrics();
    assert_eq!(m.rejected_full, 0, "{m:?}");
    assert_eq!(m.accepted, N, "every job offered: {m:?}");
    assert_ledger(&m);
    let limit = std::time::Duration::from_secs(60);
    let seen = within(
        "the batch",
        pool.invoke_all([|s: &StopToken| s.deadline().is_some(); 3])
            .with_timeout(limit),
    )
    .await;
    assert!(seen.iter().all(|d| matches!(d, Ok(true))), "{seen:?}");
    assert_ledger(&pool.metrics());
}

/// A batch whose time runs out while some of its jobs still wait for room
/// in a full queue gives an outcome for every job: those never accepted
/// are refused (`TimedOut`, never accepted), in their places (kills the mutant of
/// the batch's leaving that skipped jobs still waiting for room, from
/// mutation testing of awaited.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_batch_refuses_the_jobs_still_waiting_for_room() {
    let pool = pool(1, 1);
    let occupied = occupy(&pool, 1).await;
    let fs: Vec<Call<u32>> = (0..3u32)
        .map(|i| Box::new(move |_: &StopToken| i) as Call<u32>)
        .collect();
    let outcomes = within(
        "the batch",
        pool.invoke_all(fs)
            .with_timeout(std::time::Duration::from_millis(20)),
    )
    .await;
    assert_eq!(outcomes.len(), 3, "{outcomes:?}");
    let refused = outcomes
        .iter()
        .filter(|o| matches!(o, Err(Error::TimedOut { id: None, .. })))
        .count();
    assert_eq!(
        refused, 2,
        "one took the queue's place, two waited: {outcomes:?}"
    );
    occupied.release().await;
    within("idle", pool.idle()).await;
    assert_ledger(&pool.metrics());
}

/// An item, value and error type that is `!Unpin`.
#[derive(Debug)]
struct Pinned(usize, std::marker::PhantomPinned);

/// `Map` is a stream over any iterator, and `Unpin` whatever it carries:
/// with `!Unpin` items, values and errors, `StreamExt::next` works on it
/// without `pin!` or `Box::pin`. (Before, `Map<vec::IntoIter<Pinned>, ..>`
/// was no `Stream` at all: this test did not compile.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_is_an_unpin_stream_over_not_unpin_items() {
    use futures_util::StreamExt;
    fn unpin<S: Unpin>(_: &S) {}
    let pool = pool(2, 16);
    let items: Vec<Pinned> = (0..4)
        .map(|i| Pinned(i, std::marker::PhantomPinned))
        .collect();
    let mut s = pool
        .map(items, |p, _| {
            if p.0 == 2 {
                Err(Pinned(p.0, std::marker::PhantomPinned))
            } else {
                Ok(Pinned(p.0 * 10, std::marker::PhantomPinned))
            }
        })
        .limit(2);
    unpin(&s);
    let mut out = Vec::new();
    while let Some(o) = within("the next item", s.next()).await {
        out.push(match o {
            Ok(v) => Ok(v.0),
            Err(BatchError::Failed(e)) => Err(e.0),
            Err(e) => panic!("{e:?}"),
        });
    }
    assert_eq!(out, [Ok(0), Ok(10), Err(2), Ok(30)]);
    let indexed: Vec<usize> = within(
        "collect",
        pool.map(vec![Pinned(0, std::marker::PhantomPinned)], |p, _| {
            Ok::<_, Pinned>(p)
        })
        .indexed()
        .map(|(i, o)| i + o.unwrap().0)
        .collect::<Vec<_>>(),
    )
    .await;
    assert_eq!(indexed, [0]);
}

/// `indexed` in completion order: each outcome comes with its item's
/// index, whatever order the jobs finish in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_indexed_unordered_names_each_outcome_s_item() {
    use futures_util::StreamExt;
    let pool = pool(2, 16);
    let (g, hold) = gate();
    let mut s = pool
        .map(["slow", "fast"], move |name, _| {
            if name == "slow" {
                hold.wait();
            }
            Ok::<_, ()>(name)
        })
        .unordered()
        .indexed();
    let mut next = async || {
        let (i, o) = within("the next item", s.next()).await?;
        Some((i, o.unwrap()))
    };
    assert_eq!(next().await, Some((1, "fast")));
    g.open();
    assert_eq!(next().await, Some((0, "slow")));
    assert_eq!(next().await, None);
}

/// `indexed` in input order with `stop_on_error`: the error names the item
/// that failed, item 1, although item 0 (still running, then stopped) was
/// never yielded; counting the outcomes (`enumerate`) would say 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_indexed_names_the_item_that_stopped_the_map() {
    use futures_util::StreamExt;
    let pool = pool(2, 16);
    let (_g, hold) = gate();
    let (tx, mut started) = signal();
    let (back_tx, mut back) = signal();
    let mut s = pool
        .map(0..2usize, move |i, stop| {
            if i == 1 {
                return Err("item 1 failed");
            }
            tx.send(()).unwrap();
            back_tx.send(hold.wait_or_stop(stop)).unwrap();
            Ok(i)
        })
        .stop_on_error()
        .indexed();
    match within("the error", s.next()).await {
        Some((1, Err(BatchError::Failed(e)))) => assert_eq!(e, "item 1 failed"),
        other => panic!("{other:?}"),
    }
    recv("item 0 ran", &mut started).await;
    assert!(recv("item 0 saw the stop", &mut back).await);
    assert!(within("the end", s.next()).await.is_none());
    within("idle", pool.idle()).await;
    assert!(format!("{s:?}").starts_with("Indexed(Map {"), "{s:?}");
}

/// `indexed` in input order without errors: indexes count up from 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_indexed_in_input_order_counts_up() {
    use futures_util::StreamExt;
    let pool = pool(2, 16);
    let out: Vec<(usize, Result<char, BatchError<()>>)> = within(
        "collect",
        pool.map("abcde".chars(), |c, _| Ok(c.to_ascii_uppercase()))
            .limit(2)
            .indexed()
            .collect(),
    )
    .await;
    let out: Vec<(usize, char)> = out.into_iter().map(|(i, o)| (i, o.unwrap())).collect();
    assert_eq!(out, [(0, 'A'), (1, 'B'), (2, 'C'), (3, 'D'), (4, 'E')]);
}
