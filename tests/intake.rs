//! The intake (src/core/fast/intake.rs, ARCHITECTURE.md "The intake"): a job of no
//! group is accepted without the pool lock. Everything the locked path
//! promises still holds: the
//! queue bound, FIFO across both kinds of job, the ledger in every
//! snapshot, refuse-or-run at shutdown, a worker for every job.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use offloader::{Error, Limiter, Offloader};
use support::*;

/// Runs `submitters` threads that each offer jobs (counting their runs in
/// `ran`; every other one needing `limiter`, if given) until one is
/// refused or `each` were accepted, released together with `then` on the
/// calling thread; returns the jobs accepted.
fn race(
    pool: &Offloader,
    submitters: usize,
    each: usize,
    ran: &Arc<AtomicUsize>,
    limiter: Option<&Limiter>,
    then: impl FnOnce(),
) -> Vec<offloader::JobHandle<()>> {
    let start = Arc::new(Barrier::new(submitters + 1));
    let threads: Vec<_> = (0..submitters)
        .map(|_| {
            let (pool, ran, start) = (pool.clone(), ran.clone(), start.clone());
            let limiter = limiter.cloned();
            std::thread::spawn(move || {
                start.wait();
                let mut accepted = Vec::new();
                for i in 0..each {
                    let ran = ran.clone();
                    let job = pool.offload(move |_stop| {
                        ran.fetch_add(1, Ordering::SeqCst);
                    });
                    let job = match &limiter {
                        Some(l) if i % 2 == 1 => job.limiter(l),
                        _ => job,
                    };
                    match job.spawn() {
                        Ok(job) => accepted.push(job),
                        Err(refused) => {
                            assert!(
                                matches!(
                                    refused.reason(),
                                    Error::ShuttingDown { id: None } | Error::Full { .. }
                                ),
                                "{:?}",
                                refused.reason()
                            );
                            if matches!(refused.reason(), Error::ShuttingDown { id: None }) {
                                break;
                            }
                        }
                    }
                }
                accepted
            })
        })
        .collect();
    start.wait();
    then();
    threads
        .into_iter()
        .flat_map(|t| t.join().expect("a submitter"))
        .collect()
}

#[tokio::test]
async fn a_plain_job_offered_after_a_shutdown_is_refused() {
    let pool = pool(1, 16);
    within("a first job", pool.offload(|_stop| ()))
        .await
        .expect("runs");
    pool.shutdown();
    let refused = pool
        .offload(|_stop| ())
        .spawn()
        .expect_err("refused after shutdown");
    assert!(matches!(refused.reason(), Error::ShuttingDown { id: None }));
}

/// Invariant 8 and fast/intake.rs inv. 1: many threads offering plain jobs to
/// a pool whose permit is held get exactly `queue_capacity` of them in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_bound_holds_for_many_threads_at_the_intake() {
    for capacity in [1, 2, 64] {
        let pool = pool(1, capacity);
        let held = occupy(&pool, 1).await;
        let ran = Arc::new(AtomicUsize::new(0));
        let accepted = race(&pool, 4, 200, &ran, None, || ());
        assert_eq!(accepted.len(), capacity);
        let m = pool.metrics();
        assert_ledger(&m);
        assert_eq!((m.queued, m.running), (capacity as u64, 1));
        held.release().await;
        for job in accepted {
            within("a queued plain job", job).await.expect("runs");
        }
        assert_eq!(ran.load(Ordering::SeqCst), capacity);
    }
}

/// Round `round` of a shutdown racing the intake: a warm pool of 1–3
/// permits, two submitters released together with `shut` (which shuts the
/// pool down), every other job needing a limiter of 2 permits, and the
/// pool's termination awaited; the limiter then counts no job waiting or
/// running. Returns the pool, the runs counted and the jobs accepted.
fn shutdown_race(
    round: usize,
    shut: impl FnOnce(&Offloader),
) -> (Offloader, Arc<AtomicUsize>, Vec<offloader::JobHandle<()>>) {
    let pool = pool(1 + round % 3, 1 << 16);
    warm(&pool);
    let ran = Arc::new(AtomicUsize::new(0));
    let limiter = Limiter::new(2);
    let accepted = race(&pool, 2, 5_000, &ran, Some(&limiter), || shut(&pool));
    assert!(
        within_blocking("termination", {
            let pool = pool.clone();
            move || pool.blocking_await_termination(None)
        }),
        "terminated"
    );
    let stats = limiter.stats();
    assert_eq!((stats.waiting, stats.in_use), (0, 0), "round {round}");
    (pool, ran, accepted)
}

/// ARCH 4 and 6 (fast/intake.rs inv. 1): plain jobs offered while a graceful
/// shutdown begins are refused or run, never accepted and lost.
#[test]
fn a_shutdown_racing_the_intake_runs_or_refuses_every_job() {
    for round in 0..40 {
        let (pool, ran, accepted) = shutdown_race(round, Offloader::shutdown);
        for job in accepted.iter() {
            assert!(job.is_finished());
        }
        let m = pool.metrics();
        assert_ledger(&m);
        assert_eq!(ran.load(Ordering::SeqCst), accepted.len(), "round {round}");
        assert_eq!(m.completed, accepted.len() as u64 + 1);
    }
}

/// The same with `shutdown_now`: each plain job accepted runs or is in
/// the report, never both, never neither.
#[test]
fn shutdown_now_racing_the_intake_runs_or_reports_every_job() {
    for round in 0..40 {
        let reported = Mutex::new(0);
        let (pool, ran, accepted) = shutdown_race(round, |pool| {
            *reported.lock().expect("not poisoned") = pool.shutdown_now().len();
        });
        let reported = *reported.lock().expect("not poisoned");
        let m = pool.metrics();
        assert_ledger(&m);
        assert_eq!(m.unstarted, reported as u64);
        assert_eq!(
            ran.load(Ordering::SeqCst) + reported,
            accepted.len(),
            "round {round}"
        );
    }
}

/// Spawns `n` jobs needing `limiter`, each recording its index as it
/// runs: the record, and the handles in submission order.
fn limited_jobs_in_order(
    pool: &Offloader,
    limiter: &Limiter,
    n: usize,
) -> (Arc<Mutex<Vec<usize>>>, Vec<offloader::JobHandle<()>>) {
    let order = Arc::new(Mutex::new(Vec::new()));
    let jobs = (0..n)
        .map(|i| {
            let order = order.clone();
            pool.offload(move |_stop| order.lock().expect("not poisoned").push(i))
                .limiter(limiter)
                .spawn()
                .expect("room")
        })
        .collect();
    (order, jobs)
}

/// A job needing a limiter passes the intake: its limiter counts it as
/// waiting as soon as `spawn` returns, it waits in its own lane while the
/// limiter is full (holding back no plain job), and the jobs it waits with
/// start in submission order once a permit comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_job_passes_the_intake_and_waits_for_its_limiter() {
    let pool = pool(2, 64);
    warm(&pool);
    let limiter = Limiter::new(1);
    let (gate, hold) = gate();
    let (started, mut entered) = signal();
    let holder = pool
        .offload(move |_stop| {
            let _ = started.send(());
            hold.wait();
        })
        .limiter(&limiter)
        .spawn()
        .expect("room");
    recv("the holder started", &mut entered).await;
    let (order, jobs) = limited_jobs_in_order(&pool, &limiter, 10);
    let stats = limiter.stats();
    assert_eq!((stats.waiting, stats.in_use), (10, 1));
    // The second permit runs a plain job offered after them.
    within("a plain job", pool.offload(|_stop| 5))
        .await
        .expect("runs");
    assert_eq!(limiter.stats().waiting, 10);
    gate.open();
    within("the holder", holder).await.expect("runs");
    for job in jobs {
        within("a limited job", job).await.expect("runs");
    }
    assert_eq!(
        *order.lock().expect("not poisoned"),
        (0..10).collect::<Vec<_>>()
    );
    let stats = limiter.stats();
    assert_eq!((stats.waiting, stats.in_use, stats.high_water), (0, 0, 1));
}

/// FIFO across both doors: jobs passing the intake (plain, named, with a
/// timeout) and a group's jobs (which take the lock) offered in turn from
/// one thread start in that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_of_both_doors_start_in_submission_order() {
    let pool = pool(1, 64);
    let group = pool.group();
    let held = occupy(&pool, 1).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let jobs: Vec<_> = (0..40)
        .map(|i| {
            let order = order.clone();
            let f = move |_stop: &offloader::StopToken| order.lock().expect("not poisoned").push(i);
            match i % 4 {
                0 => group.offload(f).spawn(),
                1 => pool.offload(f).name("named").spawn(),
                2 => pool.offload(f).with_timeout(HANG).spawn(),
                _ => pool.offload(f).spawn(),
            }
            .expect("room")
        })
        .collect();
    held.release().await;
    for job in jobs {
        within("a job", job).await.expect("runs");
    }
    let order = order.lock().expect("not poisoned").clone();
    assert_eq!(order, (0..40).collect::<Vec<_>>());
}

/// More jobs than the intake's ring holds (256), every one needing a
/// limiter, while the one permit is held: a submitter that finds the ring
/// full gives its place and its limiter count back and takes the lock, so
/// the bound is exact (all 1,000 of a bound of 1,000 accepted, the next
/// refused), the limiter counts each job once, and they start in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_jobs_than_the_intake_holds_keep_the_bound_the_count_and_the_order() {
    const JOBS: usize = 1_000;
    let pool = pool(1, JOBS);
    let limiter = Limiter::new(1 << 20);
    let held = occupy(&pool, 1).await;
    let (order, jobs) = limited_jobs_in_order(&pool, &limiter, JOBS);
    let refused = pool.offload(|_stop| ()).spawn().map(|_| ());
    assert!(
        matches!(
            refused.as_ref().map_err(|e| e.reason()),
            Err(Error::Full { .. })
        ),
        "the bound is full: {refused:?}"
    );
    assert_eq!(pool.metrics().queued, JOBS as u64);
    assert_eq!(limiter.stats().waiting, JOBS);
    held.release().await;
    for job in jobs {
        within("a job", job).await.expect("runs");
    }
    assert_eq!(
        *order.lock().expect("not poisoned"),
        (0..JOBS).collect::<Vec<_>>()
    );
    assert_eq!(limiter.stats().waiting, 0);
    assert_ledger(&pool.metrics());
}

/// A plain job is in the ledger as soon as `spawn` returns, and a cancel
/// before its start means it never runs (ARCH 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_job_is_counted_and_cancellable_at_once() {
    let pool = pool(1, 16);
    let held = occupy(&pool, 1).await;
    let ran = flag();
    let r = ran.clone();
    let job = pool
        .offload(move |_stop| r.store(true, Ordering::SeqCst))
        .spawn()
        .expect("room");
    let m = pool.metrics();
    assert_ledger(&m);
    assert_eq!((m.accepted, m.queued), (2, 1));
    assert!(job.cancel(), "cancelled before its start");
    held.release().await;
    assert!(matches!(
        within("the cancelled job", job).await,
        Err(offloader::Error::Cancelled { id: Some(_) })
    ));
    drain_single(&pool).await;
    assert!(!ran.load(Ordering::SeqCst));
    let m = pool.metrics();
    assert_ledger(&m);
    assert_eq!(m.cancelled, 1);
}

/// fast/ring.rs inv. 2–3 through the pool: submitters racing at the intake
/// (some find another filling the place at the tail and take the lock)
/// each cancel every job right after its `spawn` returns. A job is never
/// hidden behind a place still being filled: every cancel wins, none runs,
/// and the ledger balances.
#[test]
fn racing_submitters_can_cancel_every_job_as_its_spawn_returns() {
    const SUBMITTERS: usize = 4;
    const EACH: usize = 20_000;
    let pool = pool(1, 1 << 20);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let held = rt.block_on(occupy(&pool, 1));
    let ran = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(SUBMITTERS));
    let threads: Vec<_> = (0..SUBMITTERS)
        .map(|_| {
            let (pool, ran, start) = (pool.clone(), ran.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                for _ in 0..EACH {
                    let ran = ran.clone();
                    let job = pool
                        .offload(move |_stop| {
                            ran.fetch_add(1, Ordering::SeqCst);
                        })
                        .spawn()
                        .expect("room");
                    assert!(job.cancel(), "a job whose spawn returned is queued");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a submitter");
    }
    let m = pool.metrics();
    assert_ledger(&m);
    let total = (SUBMITTERS * EACH) as u64;
    assert_eq!((m.accepted, m.cancelled, m.queued), (total + 1, total, 0));
    rt.block_on(held.release());
    rt.block_on(drain_single(&pool));
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

/// The last worker retiring at its keep-alive closes the intake first and
/// stays if a job passed meanwhile: no plain job waits for a worker that
/// is gone (run many times so that expiry and offers interleave).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_worker_leaves_no_job_at_the_intake() {
    let pool = builder(1, 16)
        .keep_alive(Duration::from_micros(50))
        .build()
        .expect("valid");
    for i in 0..2_000u32 {
        within(
            "a plain job on a pool whose worker comes and goes",
            pool.offload(move |_stop| i),
        )
        .await
        .expect("runs");
        // A varying pause of our own: the worker's keep-alive expires
        // before, during or after the next offer.
        let spins = (i * 7_919) % 20_000;
        for _ in 0..spins {
            std::hint::spin_loop();
        }
    }
    let m = pool.metrics();
    assert_ledger(&m);
    assert_eq!(m.completed, 2_000);
}

/// Every snapshot taken while plain jobs pass the intake balances, and
/// `accepted` never goes back.
#[test]
fn snapshots_balance_while_jobs_pass_the_intake() {
    let pool = pool(2, 1 << 16);
    warm(&pool);
    let ran = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (pool, done) = (pool.clone(), done.clone());
        std::thread::spawn(move || {
            let mut last = 0;
            let mut seen = 0u64;
            while !done.load(Ordering::SeqCst) {
                let m = pool.metrics();
                assert_ledger(&m);
                assert!(m.accepted >= last, "accepted went back");
                last = m.accepted;
                seen += 1;
            }
            seen
        })
    };
    let accepted = race(&pool, 2, 20_000, &ran, None, || ());
    let n = accepted.len();
    for mut job in accepted {
        assert!(job.blocking_wait(None).is_ok());
    }
    done.store(true, Ordering::SeqCst);
    assert!(watcher.join().expect("the watcher") > 0);
    assert_eq!(ran.load(Ordering::SeqCst), n);
    assert_ledger(&pool.metrics());
}

/// The intake is closed while no worker lives: with the last worker gone
/// (its keep-alive expired) and no thread to be had, a plain job is
/// refused, as on the locked path, rather than accepted with nobody to
/// run it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_worker_and_none_to_spawn_a_plain_job_is_refused() {
    let pool = builder(1, 16)
        .keep_alive(Duration::from_millis(1))
        .build()
        .expect("valid");
    within("a first job", pool.offload(|_stop| ()))
        .await
        .expect("runs");
    eventually("the worker retired", || pool.metrics().workers == 0).await;
    pool.__fail_next_thread_spawns(1);
    let refused = pool
        .offload(|_stop| ())
        .spawn()
        .expect_err("no worker to run it");
    assert!(matches!(refused.reason(), Error::ThreadSpawn(_)));
    within("the next job", pool.offload(|_stop| 2))
        .await
        .expect("a worker again");
    assert_ledger(&pool.metrics());
}

/// A parked worker of a pool with an intake sleeps: its look at the intake
/// before parking does not keep it awake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_worker_sleeps() {
    let pool = builder(1, 16)
        .thread_name("idle-sleeper")
        .keep_alive(Duration::from_secs(3600))
        .build()
        .expect("valid");
    within("a job", pool.offload(|_stop| ()))
        .await
        .expect("runs");
    eventually("the worker parked", || {
        sleeping_threads_named("idle-sleeper") == 1
    })
    .await;
    let before = cpu_ticks_of_threads_named("idle-sleeper");
    // A window of waiting, not an ordering of events.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let spent = cpu_ticks_of_threads_named("idle-sleeper") - before;
    assert!(spent <= 2, "the idle worker used {spent} ticks in 500 ms");
    within("a job after the wait", pool.offload(|_stop| ()))
        .await
        .expect("runs");
}
