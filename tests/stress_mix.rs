//! Randomized stress mix (ARCHITECTURE invariants 1, 3, 4, 6, 8): a few thousand
//! jobs under a seeded PRNG, submitted every way the API allows, abandoned,
//! cancelled, stopped, detached and panicking, with a graceful or immediate
//! shutdown at a random moment, while a sampler thread checks every metrics
//! snapshot.
//!
//! Set `OFFLOADER_STRESS_SEED=<u64>` to replay one seed.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use offloader::{AbandonPolicy, Error, Fate, Metrics, StopToken, Stopped};
use support::*;

const MAX_IN_FLIGHT: u64 = 4;
const QUEUE_CAPACITY: u64 = 64;
const JOBS: usize = 4_000;
/// Most caller tasks alive at once.
const OUTSTANDING: usize = 96;

/// What the function does.
#[derive(Clone, Copy, Debug)]
enum Work {
    /// Returns at once.
    Quick,
    /// Sleeps on its token for this many microseconds.
    Sleep(u64),
    /// Checks its token `n` times, with short pauses.
    Poll(u32),
    /// Panics.
    Panic,
}

/// How the test submits and treats the job.
#[derive(Clone, Copy, Debug)]
enum Mode {
    /// Awaited directly with a random timeout and abandon policy.
    Await(Option<Duration>, AbandonPolicy),
    /// `spawn()`, then `cancel()` after some yields.
    SpawnCancel(u32),
    /// `spawn()`, then `stop()` after some yields.
    SpawnStop(u32),
    /// `spawn()`, then dropped (detached).
    SpawnDrop,
    /// `spawn()` and awaited.
    Spawn,
    /// `submit().await` (waits for room) and awaited.
    Submit,
}

fn body(
    work: Work,
    idx: usize,
    runs: &AtomicU32,
    conc: &Concurrency,
    stop: &StopToken,
) -> Result<usize, Stopped> {
    runs.fetch_add(1, Ordering::SeqCst);
    let _in = conc.enter();
    match work {
        Work::Quick => Ok(idx),
        Work::Sleep(us) => {
            stop.sleep(Duration::from_micros(us))?;
            Ok(idx)
        }
        Work::Poll(n) => {
            for _ in 0..n {
                stop.check()?;
                std::thread::sleep(Duration::from_micros(20));
            }
            Ok(idx)
        }
        // `ON_PURPOSE` keeps the panic hook quiet.
        Work::Panic => panic!("{ON_PURPOSE} {idx}"),
    }
}

/// What one job's caller or owner saw.
#[derive(Debug)]
enum Seen {
    /// The function returned (`Ok` at the pool level).
    Returned(Result<usize, Stopped>),
    Panicked,
    Cancelled {
        by_this_cancel: bool,
    },
    Unstarted,
    /// The caller's wait ended; `fate` is what happened to the job.
    TimedOut(Fate),
    Rejected(&'static str),
    /// Detached: nobody looks at the outcome.
    Detached,
}

fn classify(idx: usize, r: Result<Result<usize, Stopped>, Error>) -> Result<Seen, String> {
    Ok(match r {
        Ok(Ok(v)) if v != idx => return Err(format!("job {idx}: got the value of job {v}")),
        Ok(v) => Seen::Returned(v),
        Err(Error::Panicked { message, .. }) => {
            if *message != format!("{ON_PURPOSE} {idx}") {
                return Err(format!("job {idx}: unexpected panic message {message:?}"));
            }
            Seen::Panicked
        }
        Err(Error::Cancelled { id: Some(_) }) => Seen::Cancelled {
            by_this_cancel: false,
        },
        Err(Error::ShuttingDown { id: Some(_) }) => Seen::Unstarted,
        Err(Error::TimedOut { id: None, .. }) => Seen::Rejected("full until timeout"),
        Err(Error::TimedOut { fate, .. }) => Seen::TimedOut(fate),
        Err(Error::Full { .. }) => Seen::Rejected("full"),
        Err(Error::ShuttingDown { id: None }) => Seen::Rejected("shutting down"),
        // Too near its deadline (a tiny timeout under a policy that
        // cancels): refused, or shed at its turn; never ran either way.
        Err(Error::Overloaded { id: None }) => Seen::Rejected("overloaded"),
        Err(Error::Overloaded { id: Some(_) }) => Seen::Rejected("shed at its turn"),
        Err(other) => return Err(format!("job {idx}: unexpected error {other:?}")),
    })
}

struct Record {
    runs: AtomicU32,
}

/// What a caller task reports: the job's index and what it saw.
type Answer = (usize, Result<Seen, String>);

fn record(
    joined: Option<Result<Answer, tokio::task::JoinError>>,
    seen: &mut [Option<Seen>],
    errors: &mut Vec<String>,
) {
    if let Some(joined) = joined {
        let (idx, r) = joined.expect("caller task");
        match r {
            Ok(s) => seen[idx] = Some(s),
            Err(e) => errors.push(e),
        }
    }
}

fn check_snapshot(m: &Metrics) -> Result<(), String> {
    if !m.ledger_balances() {
        return Err(format!("ledger does not balance: {m:?}"));
    }
    if m.running > MAX_IN_FLIGHT || m.max_running > MAX_IN_FLIGHT {
        return Err(format!("more than {MAX_IN_FLIGHT} running: {m:?}"));
    }
    // Queued jobs that free permits will start at once are not waiting for
    // one: the capacity bounds the rest.
    if m.queued > QUEUE_CAPACITY + (MAX_IN_FLIGHT - m.running) {
        return Err(format!("queue beyond its capacity: {m:?}"));
    }
    if m.workers > MAX_IN_FLIGHT {
        return Err(format!("more workers than max_in_flight: {m:?}"));
    }
    Ok(())
}

async fn run_mix(seed: u64) -> Vec<usize> {
    quiet_deliberate_panics();
    let mut rng = Rng::new(seed);
    let pool = pool(MAX_IN_FLIGHT as usize, QUEUE_CAPACITY as usize);
    let conc = Concurrency::default();

    // The sampler: a plain thread, so it samples while runtime threads are
    // busy too.
    let sampling = Arc::new(AtomicBool::new(true));
    let samples = Arc::new(AtomicUsize::new(0));
    let sampler_ready = Arc::new(std::sync::Barrier::new(2));
    let sampler = {
        let (pool, sampling, samples) = (pool.clone(), sampling.clone(), samples.clone());
        let ready = sampler_ready.clone();
        std::thread::spawn(move || -> Result<(), String> {
            check_snapshot(&pool.metrics())?;
            ready.wait();
            while sampling.load(Ordering::SeqCst) {
                check_snapshot(&pool.metrics())?;
                samples.fetch_add(1, Ordering::SeqCst);
                std::thread::yield_now();
            }
            Ok(())
        })
    };
    // The sampler is running before the first job is submitted.
    tokio::task::block_in_place(|| sampler_ready.wait());

    let records: Vec<Arc<Record>> = (0..JOBS)
        .map(|_| {
            Arc::new(Record {
                runs: AtomicU32::new(0),
            })
        })
        .collect();
    let ids: Arc<Mutex<HashMap<u64, usize>>> = Arc::default();
    // Late enough that most jobs are accepted, early enough that some are
    // refused and, for an immediate shutdown, some are handed back.
    let shutdown_at = JOBS * 6 / 10 + rng.below(JOBS as u64 * 35 / 100) as usize;
    let immediate = rng.chance(50);
    let mut unstarted_ids = Vec::new();
    let attempts = Arc::new(AtomicU64::new(0));

    let mut tasks = tokio::task::JoinSet::new();
    let mut seen: Vec<Option<Seen>> = (0..JOBS).map(|_| None).collect();
    let mut errors = Vec::new();
    for (idx, rec) in records.iter().enumerate() {
        // The driver's own sample, on top of the sampler thread's.
        if let Err(e) = check_snapshot(&pool.metrics()) {
            panic!("seed {seed}: {e}");
        }
        // Bound the callers in flight (somewhat above what the queue holds,
        // so that the try form still meets a full queue now and then).
        while tasks.len() >= OUTSTANDING {
            let joined = within("a caller", tasks.join_next()).await;
            record(joined, &mut seen, &mut errors);
        }
        if idx == shutdown_at {
            if immediate {
                unstarted_ids = pool
                    .shutdown_now()
                    .into_iter()
                    .map(|u| u.id.as_u64())
                    .collect();
            } else {
                pool.shutdown();
            }
        }
        let work = match rng.below(10) {
            0..=3 => Work::Quick,
            4..=6 => Work::Sleep(rng.below(800)),
            7 | 8 => Work::Poll(rng.below(20) as u32),
            _ => Work::Panic,
        };
        let mode = match rng.below(12) {
            0..=3 => {
                let timeout = match rng.below(3) {
                    0 => None,
                    _ => Some(Duration::from_micros(rng.below(2_000))),
                };
                let policy = match rng.below(3) {
                    0 => AbandonPolicy::Keep,
                    1 => AbandonPolicy::CancelIfQueued,
                    _ => AbandonPolicy::CancelAndStop,
                };
                Mode::Await(timeout, policy)
            }
            4 => Mode::SpawnCancel(rng.below(4) as u32),
            5 => Mode::SpawnStop(rng.below(4) as u32),
            6 => Mode::SpawnDrop,
            7..=9 => Mode::Spawn,
            _ => Mode::Submit,
        };
        let rec = rec.clone();
        let c = conc.clone();
        let f = move |stop: &StopToken| body(work, idx, &rec.runs, &c, stop);
        attempts.fetch_add(1, Ordering::SeqCst);

        match mode {
            Mode::Await(timeout, policy) => {
                let mut o = pool.offload(f).on_abandon(policy);
                if let Some(t) = timeout {
                    o = o.with_timeout(t);
                }
                tasks.spawn(async move { (idx, classify(idx, o.await)) });
            }
            Mode::Submit => {
                let o = pool.offload(f);
                let ids = ids.clone();
                tasks.spawn(async move {
                    let seen = match o.submit().await {
                        Ok(h) => {
                            ids.lock().unwrap().insert(h.id().as_u64(), idx);
                            classify(idx, h.await)
                        }
                        Err(e) => classify(idx, Err(e.into())),
                    };
                    (idx, seen)
                });
            }
            Mode::Spawn | Mode::SpawnCancel(_) | Mode::SpawnStop(_) | Mode::SpawnDrop => {
                let h = match pool.offload(f).spawn() {
                    Ok(h) => h,
                    Err(e) => {
                        // Handed back unrun; drop it without calling it.
                        let seen = classify(idx, Err(e.into()));
                        tasks.spawn(async move { (idx, seen) });
                        continue;
                    }
                };
                ids.lock().unwrap().insert(h.id().as_u64(), idx);
                match mode {
                    Mode::SpawnDrop => {
                        drop(h);
                        tasks.spawn(async move { (idx, Ok(Seen::Detached)) });
                    }
                    Mode::SpawnCancel(yields) => {
                        tasks.spawn(async move {
                            for _ in 0..yields {
                                tokio::task::yield_now().await;
                            }
                            let won = h.cancel();
                            let seen = match classify(idx, h.await) {
                                Ok(Seen::Cancelled { .. }) => Ok(Seen::Cancelled { by_this_cancel: won }),
                                Ok(_) if won => Err(format!(
                                    "job {idx}: cancel() returned true but the outcome is not Cancelled"
                                )),
                                other => other,
                            };
                            (idx, seen)
                        });
                    }
                    Mode::SpawnStop(yields) => {
                        tasks.spawn(async move {
                            for _ in 0..yields {
                                tokio::task::yield_now().await;
                            }
                            h.stop();
                            (idx, classify(idx, h.await))
                        });
                    }
                    _ => {
                        tasks.spawn(async move { (idx, classify(idx, h.await)) });
                    }
                }
            }
        }
        if rng.chance(10) {
            tokio::task::yield_now().await;
        }
    }

    // Every caller and owner gets an answer.
    while !tasks.is_empty() {
        let joined = within("the remaining callers", tasks.join_next()).await;
        record(joined, &mut seen, &mut errors);
    }
    within("terminated()", pool.terminated()).await;
    assert!(pool.is_terminated());

    sampling.store(false, Ordering::SeqCst);
    let sampled = sampler.join().expect("sampler thread");
    assert_eq!(
        sampled,
        Ok(()),
        "seed {seed}: a metrics snapshot broke an invariant"
    );
    assert!(samples.load(Ordering::SeqCst) > 0);

    // Per job: ran at most once, and the outcome agrees with whether it ran.
    let mut never_run = 0u64;
    let mut tally: HashMap<String, u64> = HashMap::new();
    let mut misreported_timeouts = Vec::new();
    for (idx, s) in seen.iter().enumerate() {
        let runs = records[idx].runs.load(Ordering::SeqCst);
        if runs > 1 {
            errors.push(format!("job {idx} ran {runs} times"));
        }
        let Some(s) = s else {
            errors.push(format!("job {idx}: no answer recorded"));
            continue;
        };
        let kind = match s {
            Seen::Returned(Ok(_)) => "returned".to_owned(),
            Seen::Returned(Err(Stopped)) => "returned after a stop".to_owned(),
            Seen::Panicked => "panicked".to_owned(),
            Seen::Cancelled { .. } => "cancelled".to_owned(),
            Seen::Unstarted => "unstarted".to_owned(),
            Seen::TimedOut(fate) => format!("timed out ({fate:?})"),
            Seen::Rejected(why) => format!("rejected ({why})"),
            Seen::Detached => "detached".to_owned(),
        };
        *tally.entry(kind).or_default() += 1;
        if let Seen::Cancelled {
            by_this_cancel: false,
        } = s
        {
            // Only an owner's own cancel() should produce Error::Cancelled; a
            // timed-out caller whose policy cancelled the queued job should
            // get TimedOut { fate: Cancelled }. Checked last, so
            // that every other invariant is checked first.
            misreported_timeouts.push(idx);
        }
        let ok = match s {
            Seen::Returned(_) | Seen::Panicked => runs == 1,
            Seen::Cancelled { .. } | Seen::Unstarted | Seen::Rejected(_) => runs == 0,
            Seen::TimedOut(Fate::Cancelled) => runs == 0,
            Seen::TimedOut(_) | Seen::Detached => runs <= 1,
        };
        if !ok {
            errors.push(format!(
                "job {idx}: outcome {s:?} but the function ran {runs} times"
            ));
        }
        if runs == 0 {
            never_run += 1;
        }
    }
    let ids = ids.lock().unwrap();
    for id in &unstarted_ids {
        if let Some(&idx) = ids.get(id) {
            let runs = records[idx].runs.load(Ordering::SeqCst);
            if runs != 0 {
                errors.push(format!(
                    "job {idx} was returned unstarted but ran {runs} times"
                ));
            }
        }
    }
    assert!(
        errors.is_empty(),
        "seed {seed}: {} problems, first: {:#?}",
        errors.len(),
        &errors[..errors.len().min(10)]
    );

    // The mix really mixed (the seeds are fixed, so this is deterministic
    // given the scheduling-independent choices; it guards against a
    // generator that degenerates).
    for kind in ["returned", "panicked", "detached"] {
        assert!(
            tally.get(kind).copied().unwrap_or(0) > 0,
            "seed {seed}: no {kind:?} outcome in {tally:?}"
        );
    }
    assert!(
        tally.keys().any(|k| k.starts_with("rejected")),
        "seed {seed}: nothing was refused: {tally:?}"
    );

    // The final ledger.
    let m = pool.metrics();
    check_snapshot(&m).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    assert_eq!(
        (m.queued, m.running, m.workers),
        (0, 0, 0),
        "seed {seed}: {m:?}"
    );
    assert_eq!(
        m.accepted,
        m.completed + m.panicked + m.cancelled + m.unstarted + m.shed,
        "seed {seed}: {m:?}"
    );
    assert_eq!(
        m.accepted + m.rejected(),
        attempts.load(Ordering::SeqCst),
        "seed {seed}: every attempt was either accepted or refused: {m:?}"
    );
    let total_runs: u64 = records
        .iter()
        .map(|r| u64::from(r.runs.load(Ordering::SeqCst)))
        .sum();
    assert_eq!(
        total_runs,
        m.completed + m.panicked,
        "seed {seed}: every started function ends completed or panicked: {m:?}"
    );
    assert_eq!(JOBS as u64 - never_run, total_runs);
    if immediate {
        assert_eq!(
            m.unstarted,
            unstarted_ids.len() as u64,
            "seed {seed}: {m:?}"
        );
    } else {
        assert_eq!(m.unstarted, 0, "seed {seed}: {m:?}");
    }
    assert!(
        m.rejected_shutdown > 0 || shutdown_at == JOBS - 1,
        "seed {seed}: {m:?}"
    );
    let seen_max = conc.max() as u64;
    assert!(
        seen_max <= MAX_IN_FLIGHT,
        "seed {seed}: {seen_max} functions ran at once"
    );
    assert!(m.max_running <= MAX_IN_FLIGHT, "seed {seed}: {m:?}");
    assert_eq!(conc.now(), 0);

    let mut tally: Vec<_> = tally.into_iter().collect();
    tally.sort();
    eprintln!(
        "seed {seed}: {} shutdown at job {shutdown_at}; {} samples; {m:?}; outcomes {tally:?}",
        if immediate { "immediate" } else { "graceful" },
        samples.load(Ordering::SeqCst)
    );
    misreported_timeouts
}

/// Runs the mix for every seed, then reports callers whose timed-out wait
/// was answered with `Error::Cancelled` (checked after every seed's other
/// invariants, so that it cannot hide them).
async fn run_seeds(seeds: Vec<u64>) {
    let mut misreported = Vec::new();
    for seed in seeds {
        let jobs = run_mix(seed).await;
        if !jobs.is_empty() {
            misreported.push((seed, jobs.len(), jobs[..jobs.len().min(5)].to_vec()));
        }
    }
    assert!(
        misreported.is_empty(),
        "awaited callers whose own timeout cancelled their queued job (CancelIfQueued or \
         CancelAndStop) got Error::Cancelled instead of Error::TimedOut {{ state: Queued, \
         fate: Cancelled }}; (seed, count, first jobs): {misreported:?}"
    );
}

fn seeds(default: &[u64]) -> Vec<u64> {
    match std::env::var("OFFLOADER_STRESS_SEED") {
        Ok(s) => vec![s.parse().expect("OFFLOADER_STRESS_SEED must be a u64")],
        Err(_) => default.to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn randomized_mix_keeps_every_invariant() {
    run_seeds(seeds(&[0x5EED_0001, 0x5EED_0002, 0x5EED_0003])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized_mix_on_two_runtime_threads() {
    run_seeds(seeds(&[0xC0FF_EE01, 0xC0FF_EE02])).await;
}
