//! Soak: a randomized mix at full load, for as long as you like.
//!
//! ```text
//! cargo run --release --example soak                  # a short run (5 s)
//! cargo run --release --example soak -- --seconds 600 # ten minutes
//! cargo run --release --example soak -- --seconds 30 --seed 7
//! ```
//!
//! Pools with random limits, queue sizes, keep-alives and abandon policies
//! come and go, two at a time: each is driven by 24 tasks offloading
//! functions of varied length (instant, busy for some microseconds, a
//! stop-aware sleep, a sleep that ignores its stop token, a panic) and
//! awaiting, timing out, cancelling, stopping, dropping and detaching them,
//! then closed at full load by one of `close`, `shutdown_now`, `shutdown`,
//! or `idle` followed by `shutdown`, or by dropping its last clone.
//!
//! Checked all the time: the ledger identity in every metrics snapshot,
//! no more functions running (counted inside the functions and in the
//! metrics) than the pool's limit, every outcome consistent with what the
//! function did (a cancelled or unstarted job never ran, a value is the
//! function's own, a panic carries its message), and after each pool's
//! end: termination within a bound, `accepted = terminal`, no worker left.
//! At the end, RSS must not have grown by more than 64 MiB over the start.
//!
//! Exits non-zero if any check failed. Prints the figures either way.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use offloader::{AbandonPolicy, Error, Fate, JobState, Offloader, StopToken};

/// RSS may grow by at most this much over the start.
const RSS_BOUND_KIB: u64 = 64 * 1024;
/// Driver tasks per pool.
const DRIVERS: usize = 24;
/// Bound on any wait that only a bug can make long (termination, a driver
/// winding down). Every function in the mix returns within a few ms.
const HANG: Duration = Duration::from_secs(30);
/// Message of the deliberate panics, which the panic hook keeps quiet.
const PANIC_MARK: &str = "soak: deliberate panic";

fn main() {
    let args = match Args::parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("soak: {e}\nusage: soak [--seconds N] [--seed S]");
            std::process::exit(2);
        }
    };
    quiet_deliberate_panics();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let totals = Arc::new(Totals::default());
    let rss_start = rss_kib();
    let began = Instant::now();
    println!(
        "soak: {} s, seed {}, {} drivers per pool, two pools at a time; RSS at start {} KiB",
        args.seconds, args.seed, DRIVERS, rss_start
    );
    rt.block_on(run(args, totals.clone()));
    drop(rt);
    let rss_end = rss_kib();
    let t = &totals;
    let failures = t.failures.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let grown = rss_end.saturating_sub(rss_start);
    println!("soak: ran for {:.1} s", began.elapsed().as_secs_f64());
    println!(
        "  pools: {} built, {} ended by close, {} by shutdown_now, {} by shutdown, {} by idle+shutdown, {} by dropping the last clone",
        get(&t.pools),
        get(&t.end_close),
        get(&t.end_now),
        get(&t.end_shutdown),
        get(&t.end_idle),
        get(&t.end_drop)
    );
    println!(
        "  jobs: {} accepted, {} ran ({} completed, {} panicked), {} cancelled before start, {} returned unstarted, {} rejected",
        get(&t.accepted),
        get(&t.completed) + get(&t.panicked),
        get(&t.completed),
        get(&t.panicked),
        get(&t.cancelled),
        get(&t.unstarted),
        get(&t.rejected)
    );
    println!(
        "  callers: {} operations, {} timed out, {} stop requests",
        get(&t.ops),
        get(&t.timed_out),
        get(&t.stop_requests)
    );
    println!(
        "  ledger checks: {} snapshots checked (ledger identity, running <= limit), {} failed checks",
        get(&t.checks),
        failures.len()
    );
    println!(
        "  max running observed: {} of a limit of {} (worst pool by ratio); {} pools ran at their limit; over the limit: {} times",
        get(&t.worst_seen),
        get(&t.worst_limit),
        get(&t.reached_limit),
        get(&t.over_limit)
    );
    println!(
        "  RSS: {} KiB at start, {} KiB at end ({:+} KiB; bound +{} KiB)",
        rss_start,
        rss_end,
        rss_end as i64 - rss_start as i64,
        RSS_BOUND_KIB
    );
    let mut failed = failures;
    if grown > RSS_BOUND_KIB {
        failed.push(format!(
            "RSS grew by {grown} KiB, more than the bound of {RSS_BOUND_KIB} KiB"
        ));
    }
    if get(&t.pools) == 0 || get(&t.completed) == 0 {
        failed.push("no pool ran any job".to_owned());
    }
    if failed.is_empty() {
        println!("soak: OK");
    } else {
        println!("soak: FAILED, {} problem(s):", failed.len());
        for f in failed.iter().take(20) {
            println!("  - {f}");
        }
        std::process::exit(1);
    }
}

struct Args {
    seconds: u64,
    seed: u64,
}

impl Args {
    fn parse() -> Result<Args, String> {
        let mut a = Args {
            seconds: 5,
            seed: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1),
        };
        let mut it = std::env::args().skip(1);
        while let Some(arg) = it.next() {
            let mut value = |name: &str| {
                it.next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .ok_or(format!("{name} needs a number"))
            };
            match arg.as_str() {
                "--seconds" => a.seconds = value("--seconds")?,
                "--seed" => a.seed = value("--seed")?,
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(a)
    }
}

/// Counters over the whole run.
#[derive(Default)]
struct Totals {
    pools: AtomicU64,
    end_close: AtomicU64,
    end_now: AtomicU64,
    end_shutdown: AtomicU64,
    end_idle: AtomicU64,
    end_drop: AtomicU64,
    accepted: AtomicU64,
    completed: AtomicU64,
    panicked: AtomicU64,
    cancelled: AtomicU64,
    unstarted: AtomicU64,
    rejected: AtomicU64,
    timed_out: AtomicU64,
    stop_requests: AtomicU64,
    ops: AtomicU64,
    checks: AtomicU64,
    worst_seen: AtomicU64,
    worst_limit: AtomicU64,
    over_limit: AtomicU64,
    reached_limit: AtomicU64,
    failures: Mutex<Vec<String>>,
}

fn get(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

fn add(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
}

impl Totals {
    fn fail(&self, msg: String) {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if f.len() < 100 {
            eprintln!("soak: CHECK FAILED: {msg}");
            f.push(msg);
        }
    }

    fn failed(&self) -> bool {
        !self
            .failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// Records the most functions a pool was seen running, keeping the worst
    /// ratio to its limit.
    fn saw_running(&self, seen: u64, limit: u64) {
        if seen == limit {
            add(&self.reached_limit, 1);
        }
        let (ws, wl) = (get(&self.worst_seen), get(&self.worst_limit).max(1));
        if seen * wl > ws * limit || (ws == 0 && wl == 1) {
            self.worst_seen.store(seen, Ordering::Relaxed);
            self.worst_limit.store(limit, Ordering::Relaxed);
        }
    }
}

/// splitmix64: small, fast, good enough for choosing a mix.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn policy(&mut self) -> AbandonPolicy {
        match self.below(3) {
            0 => AbandonPolicy::Keep,
            1 => AbandonPolicy::CancelIfQueued,
            _ => AbandonPolicy::CancelAndStop,
        }
    }
}

fn quiet_deliberate_panics() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let p = info.payload();
        let msg = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if !msg.starts_with(PANIC_MARK) {
            previous(info);
        }
    }));
}

/// Resident set size of this process, from /proc/self/status.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Starts pools two at a time until the time is up, then waits for the
/// last ones to end.
async fn run(args: Args, totals: Arc<Totals>) {
    let until = Instant::now() + Duration::from_secs(args.seconds);
    let mut rng = Rng(args.seed);
    let mut pools = tokio::task::JoinSet::new();
    let mut last_report = Instant::now();
    while Instant::now() < until {
        while pools.len() < 2 && Instant::now() < until {
            let seed = rng.next();
            let t = totals.clone();
            pools.spawn(async move {
                if let Err(e) = one_pool(seed, t.clone(), until).await {
                    t.fail(e);
                }
            });
        }
        if let Some(Err(e)) = pools.join_next().await {
            totals.fail(format!("a pool task failed: {e}"));
        }
        if last_report.elapsed() >= Duration::from_secs(60) {
            last_report = Instant::now();
            println!(
                "soak: ... {} pools, {} jobs ran, {} checks, RSS {} KiB",
                get(&totals.pools),
                get(&totals.completed) + get(&totals.panicked),
                get(&totals.checks),
                rss_kib()
            );
        }
    }
    while let Some(r) = pools.join_next().await {
        if let Err(e) = r {
            totals.fail(format!("a pool task failed: {e}"));
        }
    }
}

/// What the functions of one pool share: no pool clone in here, or a
/// queued function would keep its own pool alive.
struct Inside {
    limit: usize,
    /// Functions inside their body now, and the most ever at once.
    now: AtomicUsize,
    max: AtomicUsize,
    totals: Arc<Totals>,
}

/// What one pool's drivers share.
struct Ctx {
    pool: Offloader,
    limit: usize,
    inside: Arc<Inside>,
    /// Ran-flags of jobs whose owner was told the function never ran;
    /// re-checked after termination.
    never_ran: Mutex<Vec<Arc<AtomicBool>>>,
    stop: AtomicBool,
    totals: Arc<Totals>,
}

impl Ctx {
    /// One metrics snapshot, checked.
    fn check(&self) {
        let m = self.pool.metrics();
        add(&self.totals.checks, 1);
        let limit = self.limit as u64;
        if m.accepted != m.queued + m.running + m.terminal() {
            self.totals.fail(format!("ledger does not balance: {m:?}"));
        }
        if m.running > limit || m.max_running > limit || m.workers > limit {
            add(&self.totals.over_limit, 1);
            self.totals
                .fail(format!("over the limit of {limit}: {m:?}"));
        }
        let inside = self.inside.now.load(Ordering::SeqCst) as u64;
        if inside > limit {
            add(&self.totals.over_limit, 1);
            self.totals.fail(format!(
                "{inside} functions inside their body, limit {limit}"
            ));
        }
    }
}

/// One pool's life: build, drive at full load, end it one way or another,
/// check what is left.
async fn one_pool(seed: u64, totals: Arc<Totals>, until: Instant) -> Result<(), String> {
    let mut rng = Rng(seed);
    let limit = 1 + rng.below(8) as usize;
    let capacity = [1, 4, 16, 64, 256][rng.below(5) as usize];
    let keep_alive = [1, 20, 10_000][rng.below(3) as usize];
    static POOL_NO: AtomicU64 = AtomicU64::new(0);
    // A name of its own (at most 15 bytes, the kernel's limit), so that the
    // pool's threads can be told apart in /proc.
    let thread_name = format!("soak-{}", POOL_NO.fetch_add(1, Ordering::Relaxed));
    let pool = Offloader::builder()
        .max_in_flight(limit)
        .queue_capacity(capacity)
        .keep_alive(Duration::from_millis(keep_alive))
        .abandon_policy(rng.policy())
        .thread_name(thread_name.clone())
        .build()
        .map_err(|e| format!("build: {e}"))?;
    add(&totals.pools, 1);
    let ctx = Arc::new(Ctx {
        pool: pool.clone(),
        limit,
        inside: Arc::new(Inside {
            limit,
            now: AtomicUsize::new(0),
            max: AtomicUsize::new(0),
            totals: totals.clone(),
        }),
        never_ran: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
        totals: totals.clone(),
    });
    let mut drivers = tokio::task::JoinSet::new();
    for _ in 0..DRIVERS {
        let (c, s) = (ctx.clone(), rng.next());
        drivers.spawn(driver(c, s));
    }
    let checker = {
        let c = ctx.clone();
        tokio::spawn(async move {
            while !c.stop.load(Ordering::SeqCst) {
                c.check();
                tokio::time::sleep(Duration::from_micros(500)).await;
            }
        })
    };
    // The load runs for a while (a duration, not an ordering of events).
    let load = Duration::from_millis(300 + rng.below(1200));
    let end = (Instant::now() + load).min(until);
    tokio::time::sleep_until(end.into()).await;

    // End the pool at full load.
    let ending = rng.below(5);
    let mut still_held = Some(pool);
    match ending {
        0 => {
            add(&totals.end_close, 1);
            let p = still_held.as_ref().expect("pool");
            let graceful = Duration::from_millis(rng.below(20));
            let report = p.close(graceful, HANG).await;
            if !report.terminated || !report.still_running.is_empty() {
                return Err(format!("close did not terminate: {report}"));
            }
        }
        1 => {
            add(&totals.end_now, 1);
            let p = still_held.as_ref().expect("pool");
            let _unstarted = p.shutdown_now();
            if tokio::time::timeout(HANG, p.terminated()).await.is_err() {
                return Err(format!("no termination after shutdown_now: {p:?}"));
            }
        }
        2 => {
            add(&totals.end_shutdown, 1);
            let p = still_held.as_ref().expect("pool");
            p.shutdown();
            if tokio::time::timeout(HANG, p.terminated()).await.is_err() {
                return Err(format!("no termination after shutdown: {p:?}"));
            }
        }
        3 => {
            add(&totals.end_idle, 1);
            ctx.stop.store(true, Ordering::SeqCst);
            wind_down(&mut drivers, &totals).await?;
            let p = still_held.as_ref().expect("pool");
            if tokio::time::timeout(HANG, p.idle()).await.is_err() {
                return Err(format!("never idle with no producer left: {p:?}"));
            }
            let m = p.metrics();
            if m.queued != 0 || m.running != 0 || m.accepted != m.terminal() {
                return Err(format!("idle but not finished: {m:?}"));
            }
            p.shutdown();
            if tokio::time::timeout(HANG, p.terminated()).await.is_err() {
                return Err(format!("no termination after idle + shutdown: {p:?}"));
            }
        }
        _ => {
            // The last clone goes: the drop starts a graceful shutdown.
            // The drivers' and the checker's clones go first.
            add(&totals.end_drop, 1);
            ctx.stop.store(true, Ordering::SeqCst);
            wind_down(&mut drivers, &totals).await?;
            checker_done(checker).await?;
            let ctx = Arc::into_inner(ctx).ok_or("a pool context is still shared")?;
            drop(still_held.take());
            // `ctx.pool` is the last clone now.
            let watch = watch_handle(&ctx.pool).ok_or("no room for the watched job")?;
            let m = ctx.pool.metrics();
            let never_ran =
                std::mem::take(&mut *ctx.never_ran.lock().unwrap_or_else(|p| p.into_inner()));
            drop(ctx);
            // A job accepted before the drop still completes ...
            match tokio::time::timeout(HANG, watch).await {
                Ok(Ok(7)) => {}
                other => return Err(format!("job accepted before the last drop: {other:?}")),
            }
            // ... and every thread of the pool exits.
            let deadline = Instant::now() + HANG;
            while threads_named(&thread_name) > 0 {
                if Instant::now() > deadline {
                    return Err(format!(
                        "threads of a dropped pool still alive after {HANG:?}: {m:?}"
                    ));
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            if never_ran.iter().any(|r| r.load(Ordering::SeqCst)) {
                return Err("a job reported as never run ran after the last drop".to_owned());
            }
            // Counted as of the drop (jobs still running then are not).
            add(&totals.accepted, m.accepted);
            add(&totals.completed, m.completed);
            add(&totals.panicked, m.panicked);
            add(&totals.cancelled, m.cancelled);
            add(&totals.unstarted, m.unstarted);
            add(&totals.rejected, m.rejected());
            return Ok(());
        }
    }
    let pool = still_held.take().expect("pool");
    ctx.stop.store(true, Ordering::SeqCst);
    wind_down(&mut drivers, &totals).await?;
    checker_done(checker).await?;
    final_checks(&ctx, &pool, &totals)
}

/// Threads of this process whose name is `name`.
fn threads_named(name: &str) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    dir.filter_map(Result::ok)
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .map(|c| c.trim_end() == name)
                .unwrap_or(false)
        })
        .count()
}

/// A job submitted just before the last clone is dropped: the handle still
/// receives its outcome after the drop.
fn watch_handle(pool: &Offloader) -> Option<offloader::JobHandle<u32>> {
    // The pool is not shut down yet, and the drivers are gone, so the queue
    // has room unless every slot is taken by jobs still waiting; in that
    // case wait for room without a runtime (the jobs are short).
    let deadline = Instant::now() + HANG;
    loop {
        match pool.offload(|_| 7u32).spawn() {
            Ok(h) => return Some(h),
            Err(e) if matches!(e.reason(), Error::Full { .. }) => {
                if Instant::now() > deadline {
                    return None;
                }
                std::thread::yield_now();
            }
            Err(_) => return None,
        }
    }
}

async fn wind_down(
    drivers: &mut tokio::task::JoinSet<Result<(), String>>,
    totals: &Totals,
) -> Result<(), String> {
    let all = async {
        while let Some(r) = drivers.join_next().await {
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => totals.fail(e),
                Err(e) => totals.fail(format!("a driver task failed: {e}")),
            }
        }
    };
    tokio::time::timeout(HANG, all)
        .await
        .map_err(|_| "drivers did not wind down".to_owned())
}

async fn checker_done(checker: tokio::task::JoinHandle<()>) -> Result<(), String> {
    tokio::time::timeout(HANG, checker)
        .await
        .map_err(|_| "checker did not stop".to_owned())?
        .map_err(|e| format!("checker failed: {e}"))
}

/// After termination: the ledger is closed, nothing is left, and every job
/// reported as never run really never ran.
fn final_checks(ctx: &Ctx, pool: &Offloader, totals: &Totals) -> Result<(), String> {
    let m = pool.metrics();
    ctx.check();
    if !pool.is_terminated() {
        return Err(format!("not terminated at the end: {m:?}"));
    }
    if m.accepted != m.terminal() || m.queued != 0 || m.running != 0 || m.workers != 0 {
        return Err(format!("terminated with work or workers left: {m:?}"));
    }
    if pool.offload(|_| 0u32).spawn().is_ok() {
        return Err("a terminated pool accepted a job".to_owned());
    }
    let never_ran = ctx.never_ran.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(i) = never_ran.iter().position(|r| r.load(Ordering::SeqCst)) {
        return Err(format!(
            "job #{i} of the never-run list ran after its owner was told it never would"
        ));
    }
    let inside_max = ctx.inside.max.load(Ordering::SeqCst) as u64;
    totals.saw_running(inside_max.max(m.max_running), ctx.limit as u64);
    add(&totals.accepted, m.accepted);
    add(&totals.completed, m.completed);
    add(&totals.panicked, m.panicked);
    add(&totals.cancelled, m.cancelled);
    add(&totals.unstarted, m.unstarted);
    add(&totals.rejected, m.rejected());
    add(&totals.timed_out, m.callers_timed_out);
    add(&totals.stop_requests, m.stop_requests);
    Ok(())
}

/// What a job's function does.
#[derive(Debug, Clone, Copy)]
enum Body {
    Instant,
    Busy(u64),
    StopAwareSleep(u64),
    IgnoresStop(u64),
    Panics,
}

impl Body {
    fn random(rng: &mut Rng) -> Body {
        match rng.below(100) {
            0..=4 => Body::Panics,
            5..=39 => Body::Instant,
            40..=64 => Body::Busy(rng.below(200)),
            65..=89 => Body::StopAwareSleep(rng.below(3000)),
            _ => Body::IgnoresStop(rng.below(2000)),
        }
    }
}

/// A job's function: returns `value`, after doing what `body` says.
fn func(
    ctx: &Arc<Ctx>,
    body: Body,
    value: u64,
    ran: Arc<AtomicBool>,
) -> impl FnOnce(&StopToken) -> u64 + Send + 'static {
    let inside = ctx.inside.clone();
    move |stop: &StopToken| {
        ran.store(true, Ordering::SeqCst);
        let now = inside.now.fetch_add(1, Ordering::SeqCst) + 1;
        inside.max.fetch_max(now, Ordering::SeqCst);
        struct Leave<'a>(&'a AtomicUsize);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let _leave = Leave(&inside.now);
        if now > inside.limit {
            add(&inside.totals.over_limit, 1);
            inside.totals.fail(format!(
                "{now} functions inside their body under a limit of {}",
                inside.limit
            ));
        }
        match body {
            Body::Instant => {}
            Body::Busy(us) => {
                let t = Instant::now();
                while t.elapsed() < Duration::from_micros(us) {
                    std::hint::spin_loop();
                }
            }
            Body::StopAwareSleep(us) => {
                let _ = stop.sleep(Duration::from_micros(us));
            }
            Body::IgnoresStop(us) => std::thread::sleep(Duration::from_micros(us)),
            Body::Panics => panic!("{PANIC_MARK} {value}"),
        }
        value
    }
}

/// What the owner of one job saw; checked against what the function did.
fn judge(
    ctx: &Ctx,
    what: &str,
    body: Body,
    value: u64,
    ran: &Arc<AtomicBool>,
    outcome: &Result<u64, Error>,
) {
    let bad = |why: String| ctx.totals.fail(format!("{what} ({body:?}): {why}"));
    let never_ran = || {
        if ran.load(Ordering::SeqCst) {
            bad(format!("told it never ran, but it ran: {outcome:?}"));
        }
        ctx.never_ran
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(ran.clone());
    };
    match outcome {
        Ok(v) if *v == value && !matches!(body, Body::Panics) => {}
        Ok(v) => bad(format!("value {v}, expected {value}")),
        Err(Error::Panicked { message, .. }) => {
            if !matches!(body, Body::Panics) || !message.contains(PANIC_MARK) {
                bad(format!("unexpected panic: {message}"));
            }
            let text = outcome.as_ref().unwrap_err().to_string();
            if !text.contains("panicked") || !text.contains("permit was released") {
                bad(format!("panic error does not say what happened: {text}"));
            }
        }
        Err(
            e @ (Error::Cancelled { id: Some(_) }
            | Error::ShuttingDown { id: Some(_) }
            | Error::Overloaded { id: Some(_) }),
        ) => {
            let text = e.to_string();
            if !text.contains("never") {
                bad(format!("never-run error does not say so: {text}"));
            }
            never_ran();
        }
        Err(Error::TimedOut { id: None, .. }) => {
            if ran.load(Ordering::SeqCst) {
                bad("refused, but it ran".to_owned());
            }
        }
        Err(Error::TimedOut { fate, state, .. }) => {
            if state.is_some_and(JobState::is_terminal) && *fate != Fate::Finished {
                bad(format!("timed out in a terminal state: {outcome:?}"));
            }
            if *fate == Fate::Cancelled {
                never_ran();
            }
        }
        Err(
            Error::Full { .. } | Error::Overloaded { id: None } | Error::ShuttingDown { id: None },
        ) => {
            if ran.load(Ordering::SeqCst) {
                bad("rejected, but it ran".to_owned());
            }
        }
        Err(e) => bad(format!("unexpected error: {e}")),
    }
}

/// Polls `fut` once; `Some` if it completed.
async fn poll_once<F: Future + ?Sized>(mut fut: Pin<&mut F>) -> Option<F::Output> {
    std::future::poll_fn(move |cx| match fut.as_mut().poll(cx) {
        Poll::Ready(v) => Poll::Ready(Some(v)),
        Poll::Pending => Poll::Ready(None),
    })
    .await
}

/// One driver: random operations until told to stop.
async fn driver(ctx: Arc<Ctx>, seed: u64) -> Result<(), String> {
    let mut rng = Rng(seed);
    let mut value = seed >> 20;
    while !ctx.stop.load(Ordering::SeqCst) {
        value += 1;
        add(&ctx.totals.ops, 1);
        let body = Body::random(&mut rng);
        let ran = Arc::new(AtomicBool::new(false));
        let f = func(&ctx, body, value, ran.clone());
        let pool = &ctx.pool;
        let timeout = Duration::from_micros(rng.below(3000));
        match rng.below(9) {
            0 | 1 => {
                // Awaited directly, with a timeout and a policy.
                let r = pool
                    .offload(f)
                    .with_timeout(timeout)
                    .on_abandon(rng.policy())
                    .await;
                judge(&ctx, "awaited with a timeout", body, value, &ran, &r);
            }
            2 => {
                // Awaited directly without a timeout.
                let r = pool.offload(f).name("plain").await;
                judge(&ctx, "awaited", body, value, &ran, &r);
            }
            3 => match pool.offload(f).spawn() {
                // Spawned and dropped (detached) at once.
                Ok(h) => {
                    if rng.below(2) == 0 {
                        h.detach();
                    } else {
                        drop(h);
                    }
                }
                Err(e) => judge(&ctx, "spawn", body, value, &ran, &Err(e.into())),
            },
            4 => match pool.offload(f).spawn() {
                // Cancelled, maybe after letting it start.
                Ok(h) => {
                    if rng.below(2) == 0 {
                        tokio::task::yield_now().await;
                    }
                    let prevented = h.cancel();
                    let r = h.await;
                    if prevented && !matches!(r, Err(Error::Cancelled { id: Some(_) })) {
                        ctx.totals
                            .fail(format!("cancel() returned true but the outcome was {r:?}"));
                    }
                    judge(&ctx, "cancelled", body, value, &ran, &r);
                }
                Err(e) => judge(&ctx, "spawn", body, value, &ran, &Err(e.into())),
            },
            5 => match pool.offload(f).spawn() {
                // Stopped, then awaited.
                Ok(h) => {
                    h.stop();
                    let r = h.await;
                    judge(&ctx, "stopped", body, value, &ran, &r);
                }
                Err(e) => judge(&ctx, "spawn", body, value, &ran, &Err(e.into())),
            },
            6 => match pool.offload(f).spawn() {
                // A wait that may time out, then the rest of the wait.
                Ok(mut h) => {
                    let r = match tokio::time::timeout(timeout, &mut h).await {
                        Ok(r) => r,
                        Err(_) => h.await,
                    };
                    judge(&ctx, "timeout then await", body, value, &ran, &r);
                }
                Err(e) => judge(&ctx, "spawn", body, value, &ran, &Err(e.into())),
            },
            7 => {
                // Waits for room, then for the outcome.
                match pool.offload(f).submit().await {
                    Ok(h) => {
                        let r = h.await;
                        judge(&ctx, "submitted", body, value, &ran, &r);
                    }
                    Err(e) => judge(&ctx, "submit", body, value, &ran, &Err(e.into())),
                }
            }
            _ => {
                // The caller's future is dropped after one poll.
                let mut fut = Box::pin(pool.offload(f).on_abandon(rng.policy()).into_future());
                if let Some(r) = poll_once(fut.as_mut()).await {
                    judge(&ctx, "polled once", body, value, &ran, &r);
                }
                drop(fut);
            }
        }
        ctx.check();
        if ctx.totals.failed() {
            // Keep going is pointless; the run fails anyway.
            return Ok(());
        }
        if pool.is_shutdown() {
            // The pool is ending: no need to spin on rejections.
            tokio::task::yield_now().await;
        }
    }
    Ok(())
}
