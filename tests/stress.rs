//! Stress: cancel racing start (exactly one wins, per job), and the ledger
//! identity and the concurrency limit under a randomized mix of timeouts,
//! drops, cancels, stops and panics.

mod support;

use std::future::IntoFuture;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use offloader::{AbandonPolicy, Error, JobHandle, JobState, Metrics, Offloader, StopToken};
use support::*;

/// Takes snapshots on its own thread until told to stop; each must balance
/// and respect the limit. Returns how many it took.
fn spawn_snapshotter(
    pool: Offloader,
    limit: usize,
    done: Arc<AtomicBool>,
) -> thread::JoinHandle<(usize, Metrics)> {
    thread::spawn(move || {
        let mut n = 0;
        let mut last = pool.metrics();
        while !done.load(Ordering::SeqCst) {
            let m = pool.metrics();
            assert_ledger(&m);
            assert!(m.running <= limit as u64, "{m:?}");
            assert!(m.max_running <= limit as u64, "{m:?}");
            // Counters only grow.
            assert!(m.accepted >= last.accepted && m.completed >= last.completed);
            assert!(m.cancelled >= last.cancelled && m.panicked >= last.panicked);
            last = m;
            n += 1;
            // Sampling cadence only; nothing is ordered by this sleep.
            thread::sleep(Duration::from_micros(200));
        }
        (n, last)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_racing_start_exactly_one_wins_for_every_job() {
    const N: usize = 20_000;
    const LIMIT: usize = 3;
    let pool = pool(LIMIT, 256);
    let flags: Arc<Vec<AtomicBool>> = Arc::new((0..N).map(|_| AtomicBool::new(false)).collect());
    let conc = Concurrency::default();
    let done = Arc::new(AtomicBool::new(false));
    let snapshots = spawn_snapshotter(pool.clone(), LIMIT, done.clone());

    // Producer thread: submits every job, retrying with the handed-back
    // closure when the queue is full.
    let (to_cancel, cancel_rx) = mpsc::sync_channel::<(usize, JobHandle<usize>)>(16);
    let producer = {
        let (pool, flags, conc) = (pool.clone(), flags.clone(), conc.clone());
        thread::spawn(move || {
            let mut full = 0_u64;
            for i in 0..N {
                let (flags, conc) = (flags.clone(), conc.clone());
                let mut f = move |_stop: &StopToken| {
                    let _in = conc.enter();
                    flags[i].store(true, Ordering::SeqCst);
                    i
                };
                let h = loop {
                    match pool.offload(f).spawn() {
                        Ok(h) => break h,
                        Err(e) => {
                            assert!(matches!(e.reason(), Error::Full { .. }), "{e}");
                            full += 1;
                            f = e.into_inner();
                            thread::yield_now();
                        }
                    }
                };
                to_cancel.send((i, h)).expect("canceller alive");
            }
            full
        })
    };

    // Canceller thread: cancels every job as soon as it gets its handle,
    // racing the workers that start it.
    let (to_check, mut check_rx) =
        tokio::sync::mpsc::unbounded_channel::<(usize, JobHandle<usize>, bool, JobState)>();
    let canceller = thread::spawn(move || {
        for (i, h) in cancel_rx {
            let won = h.cancel();
            let state = h.state();
            to_check.send((i, h, won, state)).expect("checker alive");
        }
    });

    // This task: collects every outcome and checks it against the cancel.
    let mut ran = vec![false; N];
    let (mut n_ran, mut n_cancelled) = (0_usize, 0_usize);
    let collect = async {
        while let Some((i, h, won, state)) = check_rx.recv().await {
            let id = h.id();
            if won {
                assert_eq!(
                    state,
                    JobState::Cancelled,
                    "job {i}: cancel won but state is {state:?}"
                );
            } else {
                assert!(
                    matches!(state, JobState::Running | JobState::Completed),
                    "job {i}: cancel lost, so the job must have started, but state is {state:?}"
                );
            }
            match (won, h.await) {
                (true, Err(Error::Cancelled { id: Some(got) })) if got == id => n_cancelled += 1,
                (false, Ok(v)) if v == i => {
                    ran[i] = true;
                    n_ran += 1;
                }
                (won, out) => panic!("job {i}: cancel returned {won} but the outcome is {out:?}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(120), collect)
        .await
        .expect("the stress run hung");
    let full = producer.join().expect("producer");
    canceller.join().expect("canceller");
    done.store(true, Ordering::SeqCst);
    let (n_snapshots, _) = snapshots.join().expect("every snapshot balanced");

    // Never both, never neither.
    for (i, flag) in flags.iter().enumerate() {
        assert_eq!(
            flag.load(Ordering::SeqCst),
            ran[i],
            "job {i}: the function {} but the outcome says it {}",
            if ran[i] { "did not run" } else { "ran" },
            if ran[i] { "ran" } else { "was cancelled" },
        );
    }
    assert_eq!(n_ran + n_cancelled, N);
    let m = pool.metrics();
    assert_eq!(m.accepted, N as u64, "{m:?}");
    assert_eq!(m.accepted, m.completed + m.cancelled, "{m:?}");
    assert_eq!(
        (m.completed, m.cancelled),
        (n_ran as u64, n_cancelled as u64),
        "{m:?}"
    );
    assert_eq!((m.queued, m.running, m.panicked), (0, 0, 0), "{m:?}");
    assert_eq!(m.rejected_full, full, "{m:?}");
    assert_ledger(&m);
    assert!(conc.max() <= LIMIT, "{} functions at once", conc.max());
    assert!(m.max_running <= LIMIT as u64, "{m:?}");
    assert!(n_snapshots > 0);
    eprintln!(
        "ran {n_ran}, cancelled {n_cancelled}, queue-full retries {full}, {n_snapshots} snapshots"
    );
}

fn policy(r: u64) -> AbandonPolicy {
    match r % 3 {
        0 => AbandonPolicy::Keep,
        1 => AbandonPolicy::CancelIfQueued,
        _ => AbandonPolicy::CancelAndStop,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_and_limit_hold_under_a_randomized_mix() {
    const OPS: usize = 1_500;
    const LIMIT: usize = 3;
    let seed = 0x9E37_79B9_7F4A_7C15_u64;
    let pool = pool(LIMIT, 128);
    let conc = Concurrency::default();
    let done = Arc::new(AtomicBool::new(false));
    let snapshots = spawn_snapshotter(pool.clone(), LIMIT, done.clone());
    let mut rng = Rng::new(seed);
    let mut tasks = tokio::task::JoinSet::new();
    quiet_deliberate_panics();

    for op in 0..OPS {
        // Waves, so that most jobs find room in the queue; some still do not.
        if op % 200 == 199 {
            while let Some(r) = within("a wave of ops", tasks.join_next()).await {
                r.expect("no op panicked");
            }
        }
        let (kind, r1, r2) = (rng.below(7), rng.below(1000), rng.below(1000));
        let c = conc.clone();
        // Short stop-aware work: 0..=300 µs in a few slices.
        let work = move |stop: &StopToken| -> Result<u64, offloader::Stopped> {
            let _in = c.enter();
            for _ in 0..3 {
                stop.sleep(Duration::from_micros(r1 / 10))?;
            }
            Ok(r1)
        };
        let pool = pool.clone();
        tasks.spawn(async move {
            match kind {
                // Awaited, no limit.
                0 => {
                    let out = pool.offload(work).await.expect("runs");
                    assert_eq!(out, Ok(r1));
                }
                // Awaited with a tiny timeout under a random policy.
                1 => {
                    let out = pool
                        .offload(work)
                        .with_timeout(Duration::from_micros(r2))
                        .on_abandon(policy(r2))
                        .await;
                    match out {
                        Ok(_) => {}
                        Err(e) if e.is_timeout() || e.is_cancelled() => {}
                        // Too near its deadline under a policy that
                        // cancels: refused, or shed at its turn.
                        Err(Error::Overloaded { .. }) => {}
                        Err(e) => panic!("op {op}: unexpected {e:?}"),
                    }
                }
                // Spawned, then dropped (detached).
                2 => match pool.offload(work).spawn() {
                    Ok(h) => drop(h),
                    Err(e) => assert!(matches!(e.reason(), Error::Full { .. })),
                },
                // Spawned, cancelled, awaited: the outcome matches the cancel.
                3 => match pool.offload(work).spawn() {
                    Ok(h) => {
                        let won = h.cancel();
                        match (won, h.await) {
                            (true, Err(Error::Cancelled { id: Some(_) })) | (false, Ok(_)) => {}
                            (won, out) => panic!("op {op}: cancel {won}, outcome {out:?}"),
                        }
                    }
                    Err(e) => assert!(matches!(e.reason(), Error::Full { .. })),
                },
                // Spawned, stopped, awaited.
                4 => match pool.offload(work).spawn() {
                    Ok(h) => {
                        h.stop();
                        assert!(matches!(h.await, Ok(Ok(_)) | Ok(Err(offloader::Stopped))));
                    }
                    Err(e) => assert!(matches!(e.reason(), Error::Full { .. })),
                },
                // A panic, now and then.
                5 if r2 % 4 == 0 => {
                    let e = pool
                        .offload(move |stop: &StopToken| -> u64 {
                            let _ = work(stop);
                            panic!("op {op} panics on purpose")
                        })
                        .await
                        .unwrap_err();
                    assert!(e.is_panic(), "{e:?}");
                }
                // Polled once, then dropped, under a random policy.
                6 => {
                    let mut fut = Box::pin(pool.offload(work).on_abandon(policy(r2)).into_future());
                    let _ = poll_once(fut.as_mut()).await;
                    drop(fut);
                }
                // Awaited with a timeout under a random policy.
                _ => {
                    let out = pool
                        .offload(work)
                        .with_timeout(Duration::from_micros(r2 * 2))
                        .on_abandon(policy(r1))
                        .await;
                    if let Err(e) = out {
                        assert!(
                            e.is_timeout() || e.is_cancelled() || e.is_busy() || e.is_shutdown(),
                            "{e:?}"
                        );
                    }
                }
            }
        });
    }
    let all = async {
        while let Some(r) = tasks.join_next().await {
            r.expect("no op panicked");
        }
    };
    tokio::time::timeout(Duration::from_secs(120), all)
        .await
        .expect("the stress run hung");

    // Detached and abandoned jobs may still be finishing: wait (bounded)
    // until nothing is queued or running.
    let quiet = async {
        loop {
            let m = pool.metrics();
            if m.queued == 0 && m.running == 0 {
                break m;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    let m = within("the pool to become quiet", quiet).await;
    done.store(true, Ordering::SeqCst);
    let (n_snapshots, _) = snapshots.join().expect("every snapshot balanced");

    assert_ledger(&m);
    assert_eq!(
        m.accepted,
        m.completed + m.panicked + m.cancelled + m.shed,
        "{m:?}"
    );
    assert!(m.max_running <= LIMIT as u64, "{m:?}");
    assert!(conc.max() <= LIMIT, "{} functions at once", conc.max());
    assert_eq!(conc.now(), 0);
    assert!(n_snapshots > 0);
    eprintln!("{m:?}");
}
