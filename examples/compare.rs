//! `offloader` against its peers, every measurement in one interleaved run,
//! then how the offloader's own queue operations scale with the queue length.
//!
//! ```text
//! cargo run --release --example compare                  # full run, table (about 5 minutes on 2 cores)
//! cargo run --release --example compare -- --json        # ... and one JSON object on the last line
//! cargo run --release --example compare -- --quick       # well under a minute, to keep it working (CI)
//! cargo run --release --example compare -- --rounds 3 --scale-max 65536
//! ```
//!
//! Options: `--rounds N` (default 7, quick 2); `--scale-max N`, the longest
//! queue of the scale section (default 1 000 000; quick runs never go past
//! 4 096; 0 leaves the section out); `--scale-guard S`, how many seconds one
//! scale operation may take before it is reported as too slow instead of
//! being waited for (default 10, quick 2).
//!
//! # Systems
//!
//! (See `benches/common/mod.rs`, shared with the criterion benches.)
//! `offloader`; `spawn_blocking` (tokio's default blocking pool);
//! `semaphore_spawn_blocking` (`Semaphore(limit)` + `spawn_blocking` with the
//! owned permit moved into the closure); `tokio_capped` (`spawn_blocking` on
//! a separate runtime built with `max_blocking_threads(limit)`);
//! `blocking_unblock` (`blocking::unblock` with `BLOCKING_MAX_THREADS=limit`);
//! and `channel_pool`, a reference rather than a peer: `limit` threads on one
//! unbounded `crossbeam-channel` of boxed closures, each result sent back on
//! a tokio oneshot, none of the offloader's promises kept (no cancellation,
//! stop token, timeout, metrics, admission limit or shutdown sequence). It is
//! what submitting a job and replying to its caller costs on the machine: a
//! ceiling for any pool with a handle per job. No target is set against it;
//! the diagnostics compare it with `tokio_capped` (the ceiling of the
//! throughput target) and with the offloader.
//!
//! # Runtimes and passes
//!
//! Every measuring child drives its jobs from a task on a tokio runtime, the
//! same for every system. Each round has three passes, in an order that
//! rotates from round to round:
//!
//! - default (keys without suffix): the runtime users get by default,
//!   `Builder::new_multi_thread().enable_all()` with its default worker
//!   count, one per core (what `#[tokio::main]` gives);
//! - one worker (keys ending in `_one_worker`): the same with
//!   `worker_threads(1)`;
//! - noisy neighbour (keys ending in `_noisy`): the default runtime's
//!   children again, while another process (this binary, `__burn`) runs one
//!   thread burning CPU at normal priority for the whole pass; the
//!   two-plain-threads reference of the pass runs with it too.
//!
//! # Metrics (per system; medians over rounds)
//!
//! - `latency_ns`: one no-op job submitted and awaited, sequentially (limit 2),
//!   in a process that does nothing else.
//! - `throughput_l2`, `throughput_l64`: 100 000 no-op jobs submitted at once,
//!   then all awaited; jobs/s from the first submit to the last completion.
//!   The offloader gets `queue_capacity(200_000)` so the batch fits: this is
//!   about throughput, not backpressure.
//! - `throughput_l2_keyed` (offloader only): the same batch with its jobs
//!   keyed round-robin over 16 keys (`Offload::key`, no per-key limit), so
//!   that each job pays for its lane; target: a keyed job costs at most
//!   1.5 × a plain one (`keyed_cost_vs_plain`).
//! - `throughput_l2_limited` (offloader only): the same batch with every job
//!   needing one shared `Limiter` of more permits than the pool has (so it
//!   never holds a job back): the cost of taking and giving back its
//!   permit; target `limited_cost_vs_plain` ≤ 1.5.
//! - `efficiency_l2`: 10 000 jobs of ~50 µs of CPU work (a calibrated loop),
//!   limit 2: ideal time (jobs × one job's cost / 2 cores) over measured
//!   time. The job's cost is the best of 50 short single-thread runs (10
//!   calls each, well under a scheduler time slice), measured again every
//!   pass, so a busy machine does not inflate it. `efficiency_l2.raw_threads`
//!   is the same work on two plain threads (each running half the jobs back
//!   to back) in the same pass: what the machine allowed.
//! - `peak_threads_l2`: the most threads the process had while running the
//!   limit-2 throughput batches (sampled every 2 ms from
//!   `/proc/self/status`), minus the threads it had before the system was
//!   first used (its own: main, the runtime's workers, the sampler, a
//!   watchdog). Both numbers are printed.
//! - `cpu_ns_per_job_noop`, `cpu_ns_per_job_50us`: user + system CPU time
//!   the child process spent per job during the limit-2 throughput batch
//!   (no-op jobs) and the efficiency batch (50 µs jobs, the work included).
//!   Read from `/proc/self/task/*/schedstat` (ns, per thread) just before
//!   and after the batch, summed over the threads, less the thread-count
//!   sampler's own. Threads that exit during a batch take their time with
//!   them, so when a thread of the first reading is gone, or when the
//!   process's `utime + stime` from `/proc/self/stat` (which keeps exited
//!   threads, in 10 ms ticks) exceeds the sum by more than two ticks, the
//!   tick count is used instead (the diagnostics say how often). Everything
//!   the process does counts: the runtime's workers submitting and awaiting,
//!   and the pool's threads.
//! - `bytes_per_queued_job`: VmRSS growth over 100 000 detached no-op jobs
//!   that stay queued behind a pool whose threads are all blocked on a gate
//!   (limit 1; tokio's default pool: all its 512 threads), in a fresh process
//!   per system, round and runtime, after a first 1 000 queued jobs that are
//!   not counted (one-time costs of the first queued job). Offloader handles
//!   are detached (`JobHandle::detach`), tokio `JoinHandle`s dropped,
//!   `blocking` tasks `detach`ed: every system keeps only what it needs
//!   itself. `bytes_per_queued_job_with_handle`: the same with every
//!   handle the caller gets kept in a vector (`JobHandle`, `JoinHandle`,
//!   `blocking::Task`). Not measured in the noisy pass.
//!
//! Diagnostics (printed, not in the JSON): the limit-2 throughput batch split
//! into submitting and the rest; efficiency with detached jobs and a single
//! wake-up for the whole batch (the cost of waking the caller per job, left
//! out); and efficiency over the CPU the child could actually get (idle or
//! its own, from `/proc/stat`), which takes a noisy neighbour out.
//!
//! # Scale section (offloader only)
//!
//! `scale_<op>_<n>`: ns per operation with `n` = 1 000 (`1k`), 65 536
//! (`64k`) and 1 000 000 (`1m`) queued jobs (quick: `1k` and `4k`), each
//! operation and size in a fresh process, sizes interleaved within a round
//! (see `benches/common/scale.rs`): `submit` (per `spawn()`),
//! `cancel_newest_first`, `cancel_random` (per cancel), `timeout_storm` (per
//! caller timing out while queued) and `shutdown_now` (per queued job), on a
//! default runtime, behind one permit held by a function blocked on a gate;
//! and three references without the offloader (no target):
//! `floor_random_touch` and `floor_serial_touch` (what a random touch of `n`
//! job-sized objects costs, with and without the processor looking ahead to
//! the next one), from which the report derives the least a cancel in random
//! order can cost at the largest size, and `floor_fresh_report` (`n`
//! report-sized values written into a vector allocated up front, as
//! `shutdown_now` writes its report), which the report takes out of
//! `shutdown_now`'s cost at the largest size. Small sizes repeat the operation in the
//! process (up to 16 times; the median counts). An operation that runs past `--scale-guard` is reported
//! as too slow (`null`, and in `scale_too_slow` with how far it got) and is
//! not tried again at that size or larger. `scale_ratio_<op>`: cost at the
//! largest size over cost at the smallest.
//!
//! # Targets
//!
//! Ratios of this run's medians; `rounds_held` counts the rounds in which
//! each held on that round's own values. Latency ≤ 0.6 × `spawn_blocking`;
//! `throughput_l2` ≥ 3 × `tokio_capped` (and ≥ 10 × the semaphore pattern);
//! `throughput_l64` ≥ 5 × `tokio_capped`; `efficiency_l2` ≥ 0.90 × two plain
//! threads; CPU per no-op job ≤ `tokio_capped`'s; the offloader's
//! `throughput_l2` spread ((max − min) / median over rounds) ≤ 30 % (a
//! round counts as held when within ±15 % of the median); in the noisy pass
//! the offloader keeps at least the fraction of its `throughput_l2` that
//! `tokio_capped` keeps; at most 2 threads above its own; bytes per queued
//! job ≤ 128, ≤ 160 with the handle kept; every scale operation's cost at
//! the largest size ≤ 2 × its cost at 1 000.
//!
//! # JSON (last line with `--json`)
//!
//! Every metric above as `{system: value}` under its key, for each pass
//! (`latency_ns`, `latency_ns_one_worker`, `latency_ns_noisy`, ...), with
//! `efficiency_l2*.raw_threads`; `rounds`; `rounds_held` and `target_ratio`
//! (target → count, median ratio); `spread_throughput_l2` (system →
//! fraction, default runtime); `scale_<op>_<n>`, `scale_ratio_<op>`,
//! `scale_ratio_of`, `scale_rounds` and `scale_too_slow`.
//!
//! # How it is fair
//!
//! - Every system runs in its own child processes (this binary re-executed
//!   with a hidden subcommand): per runtime one for latency, one for the
//!   limit-2 batches, one for the limit-64 batches. The `blocking` crate
//!   reads `BLOCKING_MAX_THREADS` once per process, so every system gets the
//!   same treatment, and one system's idle threads cannot skew another's
//!   thread count.
//! - Rounds: each pass runs every measurement once per system, in an order
//!   that rotates from round to round, so that drift on a shared machine
//!   hits every system alike. The report gives medians over rounds, their
//!   spread, and for each target in how many rounds it held.
//! - The children are warmed up (threads started, allocator primed) before
//!   the first round.

#![warn(missing_docs)]

#[path = "../benches/common/mod.rs"]
mod common;
#[path = "../benches/common/scale.rs"]
mod scale;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    Driver, Gate, Peer, System, BLOCKING_MAX_THREADS, DRIVERS, OFFLOADER_QUEUE_CAPACITY, SYSTEMS,
};
use scale::{ScaleOp, SCALE_OPS};

const USAGE: &str =
    "usage: compare [--quick] [--json] [--rounds N] [--scale-max N] [--scale-guard SECONDS]";

/// Per-round metrics, measured in every pass.
const ROUND_METRICS: [&str; 7] = [
    "latency_ns",
    "throughput_l2",
    "throughput_l64",
    "efficiency_l2",
    "peak_threads_l2",
    "cpu_ns_per_job_noop",
    "cpu_ns_per_job_50us",
];

/// How many keys the keyed throughput batch spreads its jobs over.
const KEYS: usize = 16;

/// Memory metrics, measured under both runtimes but not in the noisy pass.
const BYTES_METRICS: [&str; 2] = ["bytes_per_queued_job", "bytes_per_queued_job_with_handle"];

/// A small queue repeats a scale operation in its process at most this
/// many times.
const MAX_SCALE_REPS: usize = 16;

/// `/proc`'s clock tick (USER_HZ), in ns.
const TICK_NS: u64 = 10_000_000;

/// The conditions a round measures every system under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Condition {
    /// The default runtime.
    Default,
    /// The one-worker runtime.
    OneWorker,
    /// The default runtime with a process burning a core beside it.
    Noisy,
}

const CONDITIONS: [Condition; 3] = [Condition::Default, Condition::OneWorker, Condition::Noisy];

impl Condition {
    /// The suffix of its JSON keys.
    fn suffix(self) -> &'static str {
        match self {
            Condition::Default => "",
            Condition::OneWorker => "_one_worker",
            Condition::Noisy => "_noisy",
        }
    }

    fn driver(self) -> Driver {
        match self {
            Condition::OneWorker => Driver::OneWorker,
            Condition::Default | Condition::Noisy => Driver::Default,
        }
    }

    fn of(driver: Driver) -> Condition {
        match driver {
            Driver::Default => Condition::Default,
            Driver::OneWorker => Condition::OneWorker,
        }
    }

    fn title(self) -> String {
        match self {
            Condition::Default => {
                format!("default runtime (multi-thread, {} workers)", cores().max(1))
            }
            Condition::OneWorker => "one-worker runtime (multi-thread, 1 worker)".into(),
            Condition::Noisy => {
                "noisy neighbour (default runtime; another process burns a core)".into()
            }
        }
    }

    /// Memory per queued job does not depend on a neighbour's CPU use.
    fn has_bytes(self) -> bool {
        self != Condition::Noisy
    }

    fn metrics(self) -> Vec<&'static str> {
        let mut m = ROUND_METRICS.to_vec();
        if self.has_bytes() {
            m.extend(BYTES_METRICS);
        }
        m
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(0, |n| n.get())
}

/// How much work a run does.
#[derive(Debug, Clone)]
struct Plan {
    quick: bool,
    latency_jobs: usize,
    /// The latency jobs of a pass are measured in this many chunks, each
    /// chunk interleaved across the systems.
    latency_chunks: usize,
    throughput_jobs: usize,
    efficiency_jobs: usize,
    queued_jobs: usize,
    rounds: usize,
    /// Stop starting rounds (after `min_rounds`) once the next would end
    /// past this.
    budget: Duration,
    min_rounds: usize,
    /// Stop starting rounds once the next would end past this, even before
    /// `min_rounds` (a very slow machine).
    hard_budget: Duration,
    /// Any long-lived process of the run exits with an error past this.
    watchdog: Duration,
    /// Queue lengths of the scale section (empty: no scale section).
    scale_sizes: Vec<usize>,
    /// A scale child repeats its operation up to `scale_ops / n` times.
    scale_ops: usize,
    /// One scale operation longer than this is reported as too slow.
    scale_guard: Duration,
    /// Stop starting scale rounds (after `min_rounds`) once the next would
    /// end past this, counted from the section's start.
    scale_budget: Duration,
}

impl Plan {
    fn full() -> Plan {
        Plan {
            quick: false,
            latency_jobs: 10_000,
            latency_chunks: 5,
            throughput_jobs: 100_000,
            efficiency_jobs: 10_000,
            queued_jobs: 100_000,
            rounds: 7,
            budget: Duration::from_secs(540),
            min_rounds: 7,
            hard_budget: Duration::from_secs(900),
            watchdog: Duration::from_secs(2400),
            scale_sizes: scale_sizes(1_000_000, false),
            scale_ops: 65_536,
            scale_guard: Duration::from_secs(10),
            scale_budget: Duration::from_secs(480),
        }
    }

    fn quick() -> Plan {
        Plan {
            quick: true,
            latency_jobs: 1_000,
            latency_chunks: 1,
            throughput_jobs: 5_000,
            efficiency_jobs: 400,
            queued_jobs: 10_000,
            rounds: 2,
            budget: Duration::from_secs(30),
            min_rounds: 1,
            hard_budget: Duration::from_secs(40),
            watchdog: Duration::from_secs(150),
            scale_sizes: scale_sizes(1_000_000, true),
            scale_ops: 16_384,
            scale_guard: Duration::from_secs(2),
            scale_budget: Duration::from_secs(20),
        }
    }
}

/// The scale section's queue lengths up to `max`: 1 000, 65 536 and
/// 1 000 000 (quick: 1 000 and 4 096), and `max` itself if it falls below
/// the largest.
fn scale_sizes(max: usize, quick: bool) -> Vec<usize> {
    let standard: &[usize] = if quick {
        &[1_000, 4_096]
    } else {
        &[1_000, 65_536, 1_000_000]
    };
    let mut sizes: Vec<usize> = standard.iter().copied().filter(|&n| n <= max).collect();
    if max > 0 && !sizes.contains(&max) && standard.last().is_some_and(|&top| max < top) {
        sizes.push(max);
    }
    sizes
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("__serve") => return serve(&args[1..]),
        Some("__bytes") => return bytes_child(&args[1..]),
        Some("__scale") => return scale_child(&args[1..]),
        Some("__burn") => return burn(&args[1..]),
        _ => {}
    }
    let mut json = false;
    let mut quick = false;
    let mut rounds = None;
    let mut scale_max = 1_000_000;
    let mut scale_guard = None;
    let mut it = args.iter();
    let number = |it: &mut std::slice::Iter<'_, String>| {
        it.next()
            .and_then(|v| v.replace('_', "").parse::<usize>().ok())
            .unwrap_or_else(|| fail(USAGE))
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--json" => json = true,
            "--rounds" => rounds = Some(number(&mut it)),
            "--scale-max" => scale_max = number(&mut it),
            "--scale-guard" => scale_guard = Some(number(&mut it)),
            "-h" | "--help" => {
                println!("{USAGE}");
                return;
            }
            other => fail(&format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    let mut plan = if quick { Plan::quick() } else { Plan::full() };
    if let Some(r) = rounds {
        plan.rounds = r.max(1);
        plan.min_rounds = plan.min_rounds.min(plan.rounds);
    }
    plan.scale_sizes = scale_sizes(scale_max, quick);
    if let Some(s) = scale_guard {
        plan.scale_guard = Duration::from_secs(s.max(1) as u64);
    }
    watchdog(plan.watchdog, "compare");
    let report = run(plan);
    report.print(json);
}

fn fail(msg: &str) -> ! {
    eprintln!("{msg}");
    std::process::exit(2);
}

/// Ends this process with an error if it is still running after `limit`,
/// so that a hung system cannot hang CI. Children get one too: they exit
/// on their own even if the parent is gone.
fn watchdog(limit: Duration, who: &'static str) {
    std::thread::Builder::new()
        .name("watchdog".into())
        .spawn(move || {
            std::thread::sleep(limit);
            eprintln!("compare: {who} still running after {limit:?}; giving up");
            std::process::exit(3);
        })
        .expect("watchdog thread");
}

/// This binary re-executed as a child: `sub` and its arguments.
fn child_command(sub: &str, args: &[String]) -> Command {
    let exe = std::env::current_exe().expect("path of this executable");
    let mut cmd = Command::new(exe);
    cmd.arg(sub).args(args).stderr(Stdio::inherit());
    cmd
}

// ---------------------------------------------------------------------------
// The parent: children, rounds, report.

/// A child process serving measurements of one system at one limit.
struct Server {
    system: System,
    limit: usize,
    driver: Driver,
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    /// Threads the child had before the system was first used.
    own_threads: usize,
}

impl Server {
    fn start(system: System, limit: usize, driver: Driver, watchdog: Duration) -> Server {
        let mut cmd = child_command(
            "__serve",
            &[
                system.name().into(),
                limit.to_string(),
                watchdog.as_secs().to_string(),
                driver.name().into(),
            ],
        );
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        if system == System::BlockingUnblock {
            cmd.env(BLOCKING_MAX_THREADS, limit.to_string());
        }
        let mut child = cmd.spawn().expect("spawn a measuring child");
        let input = child.stdin.take().expect("child stdin");
        let output = BufReader::new(child.stdout.take().expect("child stdout"));
        let mut server = Server {
            system,
            limit,
            driver,
            child,
            input,
            output,
            own_threads: 0,
        };
        server.own_threads = server.read_reply("ready")[0] as usize;
        server
    }

    fn who(&self) -> String {
        format!(
            "child for {} (limit {}, {} runtime)",
            self.system.name(),
            self.limit,
            self.driver.name()
        )
    }

    fn ask(&mut self, command: &str) -> Vec<f64> {
        if writeln!(self.input, "{command}")
            .and_then(|()| self.input.flush())
            .is_err()
        {
            fail(&format!("{} is gone", self.who()));
        }
        let tag = command.split(' ').next().unwrap_or_default().to_owned();
        self.read_reply(&tag)
    }

    fn read_reply(&mut self, tag: &str) -> Vec<f64> {
        let mut line = String::new();
        match self.output.read_line(&mut line) {
            Ok(n) if n > 0 => {}
            _ => fail(&format!("{} died before answering {tag:?}", self.who())),
        }
        let mut words = line.split_whitespace();
        if words.next() != Some(tag) {
            fail(&format!("unexpected answer from child: {line:?}"));
        }
        words.map(|w| w.parse().unwrap_or(f64::NAN)).collect()
    }

    fn stop(mut self) {
        let _ = writeln!(self.input, "exit");
        let _ = self.input.flush();
        drop(self.input);
        let _ = self.child.wait();
    }
}

/// The measuring children of one runtime, one per system for each of
/// latency, the limit-2 batches and the limit-64 batches. Latency has
/// children of its own: a pool that an earlier batch grew to hundreds of
/// idle threads (tokio's default pool) hands each job to a different cold
/// thread, which would make that peer look slower than a process that only
/// makes sequential calls.
struct ServerSet {
    lat: Vec<Server>,
    l2: Vec<Server>,
    l64: Vec<Server>,
}

impl ServerSet {
    fn start(driver: Driver, watchdog: Duration) -> ServerSet {
        let start = |limit| {
            SYSTEMS
                .iter()
                .map(|&s| Server::start(s, limit, driver, watchdog))
                .collect()
        };
        ServerSet {
            lat: start(2),
            l2: start(2),
            l64: start(64),
        }
    }

    /// Starts threads and primes allocators; results dropped.
    fn warm_up(&mut self, plan: &Plan, iters: u64) {
        for s in self.lat.iter_mut() {
            s.ask(&format!("latency {}", plan.latency_jobs / 10));
        }
        for s in self.l2.iter_mut() {
            s.ask(&format!("throughput {}", plan.throughput_jobs / 10));
            s.ask(&format!("efficiency {} {iters}", plan.efficiency_jobs / 10));
            s.ask(&format!("detached {} {iters}", plan.efficiency_jobs / 10));
        }
        for s in self.l64.iter_mut() {
            s.ask(&format!("throughput {}", plan.throughput_jobs / 10));
        }
    }

    fn stop(self) {
        for s in self.lat.into_iter().chain(self.l2).chain(self.l64) {
            s.stop();
        }
    }
}

/// The noisy neighbour: a process of its own with one thread burning CPU
/// at normal priority until its stdin closes.
struct Burner {
    child: Child,
    input: Option<ChildStdin>,
}

impl Burner {
    /// Returns once the burning thread runs.
    fn start(watchdog: Duration) -> Burner {
        let mut cmd = child_command("__burn", &[watchdog.as_secs().to_string()]);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn the noisy neighbour");
        let input = child.stdin.take();
        let mut line = String::new();
        let mut out = BufReader::new(child.stdout.take().expect("burner stdout"));
        if out.read_line(&mut line).map_or(true, |n| n == 0) || line.trim() != "burning" {
            fail(&format!("the noisy neighbour did not start: {line:?}"));
        }
        Burner { child, input }
    }

    fn stop(mut self) {
        drop(self.input.take());
        let _ = self.child.wait();
    }
}

/// What one pass measured for one system.
#[derive(Debug, Clone, Copy, Default)]
struct Round {
    latency_ns: f64,
    throughput_l2: f64,
    /// The offloader's limit-2 throughput with its jobs keyed over
    /// [`KEYS`] keys (0 for the other systems).
    throughput_l2_keyed: f64,
    /// The offloader's limit-2 throughput with each job needing one shared
    /// `Limiter` (0 for the other systems).
    throughput_l2_limited: f64,
    throughput_l64: f64,
    efficiency_l2: f64,
    peak_threads_l2: f64,
    /// CPU ns per job of the limit-2 throughput batch.
    cpu_noop_ns: f64,
    /// CPU ns per job of the efficiency batch.
    cpu_50us_ns: f64,
    /// How many of those two CPU readings fell back to 10 ms ticks.
    cpu_from_ticks: f64,
    /// Diagnostics, not targets: ns per job spent submitting the limit-2
    /// throughput batch, and in the rest of it (until the last outcome).
    submit_ns_l2: f64,
    drain_ns_l2: f64,
    /// Efficiency with detached jobs and one wake-up for the whole batch
    /// (default pass only).
    efficiency_detached_l2: f64,
    /// Efficiency over the CPU the child could get: work / (core-seconds
    /// idle or used by the child during the run); see [`CpuMark`].
    efficiency_adjusted_l2: f64,
}

/// Picks one measurement out of a [`Round`].
type Field = fn(&Round) -> f64;

/// Memory growth of one `__bytes` child.
#[derive(Debug, Clone, Copy)]
struct Bytes {
    per_job: f64,
    before_kb: f64,
    after_kb: f64,
}

impl Bytes {
    const FAILED: Bytes = Bytes {
        per_job: f64::NAN,
        before_kb: f64::NAN,
        after_kb: f64::NAN,
    };
}

/// Everything measured under one [`Condition`].
#[derive(Default)]
struct PassData {
    rounds: BTreeMap<&'static str, Vec<Round>>,
    /// Efficiency of two plain threads running the same work, per round.
    reference: Vec<f64>,
    /// The same, over the CPU this process could get (see [`CpuMark`]).
    reference_adjusted: Vec<f64>,
    /// Per round: (system, handles kept) → bytes per queued job.
    bytes: BTreeMap<(&'static str, bool), Vec<Bytes>>,
}

/// One scale operation at one queue length, over rounds.
#[derive(Debug, Default)]
struct ScaleCell {
    /// ns per operation in each scale round; NaN where not measured.
    per_round: Vec<f64>,
    too_slow: Option<TooSlow>,
    failed: bool,
}

impl ScaleCell {
    fn gave_up(&self) -> bool {
        self.failed || self.too_slow.is_some()
    }
}

#[derive(Debug, Clone, Copy)]
struct TooSlow {
    done: usize,
    seconds: f64,
}

#[derive(Debug, Default)]
struct ScaleData {
    sizes: Vec<usize>,
    /// (index in [`SCALE_OPS`], n) → cell.
    cells: BTreeMap<(usize, usize), ScaleCell>,
    rounds: usize,
    elapsed: Duration,
}

/// Everything the run measured.
struct Report {
    plan: Plan,
    calibration: common::Calibration,
    /// Indexed by [`Condition`].
    passes: [PassData; 3],
    own_threads_l2: BTreeMap<(Driver, &'static str), usize>,
    scale: ScaleData,
    elapsed: Duration,
    /// `/proc/loadavg`'s one-minute load when the run began and ended.
    load: (String, String),
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

fn run(plan: Plan) -> Report {
    let began = Instant::now();
    let load_before = load_average();
    eprintln!(
        "compare: {} run on {} cores; progress on stderr, report on stdout",
        if plan.quick { "quick" } else { "full" },
        cores()
    );

    // Calibrate while nothing else of ours runs.
    let calibration = common::calibrate(Duration::from_micros(50));
    eprintln!(
        "calibrated: {} iterations = {:.1} µs per job",
        calibration.iters,
        calibration.job.as_secs_f64() * 1e6
    );

    // Indexed by `Driver as usize`.
    let mut sets: Vec<ServerSet> = DRIVERS
        .iter()
        .map(|&d| ServerSet::start(d, plan.watchdog))
        .collect();
    for set in sets.iter_mut() {
        set.warm_up(&plan, calibration.iters);
    }
    eprintln!("warmed up after {:.1} s", began.elapsed().as_secs_f64());

    let mut passes: [PassData; 3] = Default::default();
    let n = SYSTEMS.len();
    for round in 0..plan.rounds {
        let round_began = Instant::now();
        for p in 0..CONDITIONS.len() {
            let cond = CONDITIONS[(p + round) % CONDITIONS.len()];
            let burner = (cond == Condition::Noisy).then(|| Burner::start(plan.watchdog));
            let set = &mut sets[cond.driver() as usize];
            let pass = measure_pass(cond, set, &plan, calibration.iters, round);
            if let Some(b) = burner {
                b.stop();
            }
            let data = &mut passes[cond as usize];
            for (k, s) in SYSTEMS.iter().enumerate() {
                data.rounds
                    .entry(s.name())
                    .or_default()
                    .push(pass.results[k]);
            }
            data.reference.push(pass.reference);
            data.reference_adjusted.push(pass.reference_adjusted);
        }
        // Memory per queued job: a fresh process per system, runtime and
        // kind of submission.
        for driver in DRIVERS {
            for keep in [false, true] {
                for i in 0..n {
                    let s = SYSTEMS[(i + round) % n];
                    let b = measure_bytes(s, plan.queued_jobs, driver, keep, plan.watchdog);
                    passes[Condition::of(driver) as usize]
                        .bytes
                        .entry((s.name(), keep))
                        .or_default()
                        .push(b);
                }
            }
        }
        let took = round_began.elapsed();
        eprintln!(
            "round {}/{} took {:.1} s",
            round + 1,
            plan.rounds,
            took.as_secs_f64()
        );
        let done = round + 1;
        let next_ends = began.elapsed() + took.mul_f64(1.1);
        if done < plan.rounds
            && ((done >= plan.min_rounds && next_ends > plan.budget)
                || next_ends > plan.hard_budget)
        {
            eprintln!("time budget reached: stopping after {done} rounds");
            break;
        }
    }
    let mut own_threads_l2 = BTreeMap::new();
    for set in &sets {
        for s in &set.l2 {
            own_threads_l2.insert((s.driver, s.system.name()), s.own_threads);
        }
    }
    for set in sets {
        set.stop();
    }

    let scale = run_scale(&plan);

    Report {
        plan,
        calibration,
        passes,
        own_threads_l2,
        scale,
        elapsed: began.elapsed(),
        load: (load_before, load_average()),
    }
}

/// What one pass measured.
struct Pass {
    results: [Round; SYSTEMS.len()],
    reference: f64,
    reference_adjusted: f64,
}

/// Every per-round measurement of every system once under `cond`, in an
/// order rotated by `round`.
fn measure_pass(
    cond: Condition,
    set: &mut ServerSet,
    plan: &Plan,
    iters: u64,
    round: usize,
) -> Pass {
    let n = SYSTEMS.len();
    let mut results = [Round::default(); SYSTEMS.len()];
    let order = |i: usize| (i + round) % n;

    // Latency in chunks, each interleaved: finer-grained than a pass.
    let chunks = plan.latency_chunks.max(1);
    for chunk in 0..chunks {
        for i in 0..n {
            let k = (i + round + chunk) % n;
            let r = set.lat[k].ask(&format!("latency {}", plan.latency_jobs / chunks));
            results[k].latency_ns += r[0] / chunks as f64;
        }
    }
    let jobs = plan.throughput_jobs as f64;
    for i in 0..n {
        let k = order(i);
        let r = set.l2[k].ask(&format!("throughput {}", plan.throughput_jobs));
        results[k].throughput_l2 = jobs / r[0];
        results[k].peak_threads_l2 = r[1];
        results[k].submit_ns_l2 = r[2] * 1e9 / jobs;
        results[k].drain_ns_l2 = (r[0] - r[2]) * 1e9 / jobs;
        results[k].cpu_noop_ns = r[3] / jobs;
        results[k].cpu_from_ticks += r[4];
    }
    // A keyed job's cost: the offloader only, beside its plain batch.
    if let Some(k) = SYSTEMS.iter().position(|s| *s == System::Offloader) {
        let r = set.l2[k].ask(&format!("throughput_keyed {} {KEYS}", plan.throughput_jobs));
        results[k].throughput_l2_keyed = jobs / r[0];
        let r = set.l2[k].ask(&format!("throughput_keyed {} 0", plan.throughput_jobs));
        results[k].throughput_l2_limited = jobs / r[0];
    }
    for i in 0..n {
        let k = order(i);
        let r = set.l64[k].ask(&format!("throughput {}", plan.throughput_jobs));
        results[k].throughput_l64 = jobs / r[0];
    }
    // The job's cost is measured again each pass (frequency drift).
    let job = common::job_cost(iters, 50).as_secs_f64();
    let ideal = plan.efficiency_jobs as f64 * job / 2.0;
    // Efficiency: the five systems and the two-thread reference, rotated.
    let (mut reference, mut reference_adjusted) = (f64::NAN, f64::NAN);
    for i in 0..=n {
        let k = (i + round) % (n + 1);
        if k == n {
            let mark = CpuMark::now();
            let took = reference_run(plan.efficiency_jobs, iters);
            reference = ideal / took;
            reference_adjusted = 2.0 * ideal / mark.available_since();
        } else {
            let r = set.l2[k].ask(&format!("efficiency {} {iters}", plan.efficiency_jobs));
            results[k].efficiency_l2 = ideal / r[0];
            results[k].efficiency_adjusted_l2 = 2.0 * ideal / r[1];
            results[k].cpu_50us_ns = r[2] / plan.efficiency_jobs as f64;
            results[k].cpu_from_ticks += r[3];
        }
    }
    // Diagnostic: the same work detached, one wake-up per batch.
    for i in 0..n {
        let k = order(i);
        results[k].efficiency_detached_l2 = if cond == Condition::Default {
            let r = set.l2[k].ask(&format!("detached {} {iters}", plan.efficiency_jobs));
            ideal / r[0]
        } else {
            f64::NAN
        };
    }
    Pass {
        results,
        reference,
        reference_adjusted,
    }
}

/// Two plain threads, each running half the jobs back to back: what a
/// perfect two-thread pool would take. Returns seconds.
fn reference_run(jobs: usize, iters: u64) -> f64 {
    let t = Instant::now();
    let halves = [jobs / 2, jobs - jobs / 2];
    let threads: Vec<_> = halves
        .into_iter()
        .map(|n| {
            std::thread::spawn(move || {
                (0..n).fold(0u64, |acc, _| acc.wrapping_add(common::work(iters)))
            })
        })
        .collect();
    for th in threads {
        std::hint::black_box(th.join().expect("reference thread"));
    }
    t.elapsed().as_secs_f64()
}

fn measure_bytes(
    system: System,
    jobs: usize,
    driver: Driver,
    keep: bool,
    watchdog: Duration,
) -> Bytes {
    let mut cmd = child_command(
        "__bytes",
        &[
            system.name().into(),
            jobs.to_string(),
            watchdog.as_secs().to_string(),
            driver.name().into(),
            u8::from(keep).to_string(),
        ],
    );
    if system == System::BlockingUnblock {
        cmd.env(BLOCKING_MAX_THREADS, "1");
    }
    let what = format!(
        "bytes_per_queued_job{} for {} ({} runtime)",
        if keep { "_with_handle" } else { "" },
        system.name(),
        driver.name()
    );
    let out = match cmd.output() {
        Ok(out) if out.status.success() => out,
        Ok(out) => {
            eprintln!("{what} failed: {}", out.status);
            return Bytes::FAILED;
        }
        Err(e) => {
            eprintln!("{what}: {e}");
            return Bytes::FAILED;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<f64> = text
        .split_whitespace()
        .skip(1)
        .filter_map(|w| w.parse().ok())
        .collect();
    match v[..] {
        [per_job, before_kb, after_kb] => Bytes {
            per_job,
            before_kb,
            after_kb,
        },
        _ => {
            eprintln!("{what}: unexpected answer {text:?}");
            Bytes::FAILED
        }
    }
}

/// What one scale child reported.
enum ScaleOutcome {
    /// ns per operation (median over the child's repetitions).
    Done(f64),
    TooSlow(TooSlow),
    Failed,
}

/// The scale section: every operation at every size, sizes interleaved
/// within a round, a fresh process each.
fn run_scale(plan: &Plan) -> ScaleData {
    let mut data = ScaleData {
        sizes: plan.scale_sizes.clone(),
        ..ScaleData::default()
    };
    if data.sizes.is_empty() {
        return data;
    }
    let began = Instant::now();
    let sizes = data.sizes.clone();
    for round in 0..plan.rounds {
        let round_began = Instant::now();
        for (oi, &op) in SCALE_OPS.iter().enumerate() {
            for j in 0..sizes.len() {
                let n = sizes[(j + round) % sizes.len()];
                // Once too slow (or broken) at some size, not tried again
                // there or at any larger size.
                let skip = sizes
                    .iter()
                    .any(|&m| m <= n && data.cells.get(&(oi, m)).is_some_and(ScaleCell::gave_up));
                let value = if skip {
                    f64::NAN
                } else {
                    let reps = (plan.scale_ops / n).clamp(1, MAX_SCALE_REPS);
                    match scale_run(op, n, reps, plan.scale_guard, round) {
                        ScaleOutcome::Done(ns) => ns,
                        ScaleOutcome::TooSlow(t) => {
                            eprintln!(
                                "scale: {} at {} too slow: {} of {n} done after {:.1} s",
                                op.name(),
                                scale::size_label(n),
                                t.done,
                                t.seconds
                            );
                            data.cells.entry((oi, n)).or_default().too_slow = Some(t);
                            f64::NAN
                        }
                        ScaleOutcome::Failed => {
                            data.cells.entry((oi, n)).or_default().failed = true;
                            f64::NAN
                        }
                    }
                };
                data.cells.entry((oi, n)).or_default().per_round.push(value);
            }
        }
        data.rounds += 1;
        let took = round_began.elapsed();
        eprintln!(
            "scale round {}/{} took {:.1} s",
            round + 1,
            plan.rounds,
            took.as_secs_f64()
        );
        let done = round + 1;
        if done < plan.rounds
            && done >= plan.min_rounds
            && began.elapsed() + took.mul_f64(1.1) > plan.scale_budget
        {
            eprintln!("scale time budget reached: stopping after {done} rounds");
            break;
        }
    }
    data.elapsed = began.elapsed();
    data
}

/// Runs one `__scale` child.
fn scale_run(op: ScaleOp, n: usize, reps: usize, guard: Duration, round: usize) -> ScaleOutcome {
    // Setting up a million queued jobs takes a few seconds; the guard
    // bounds each measured operation.
    let watchdog = guard.as_secs() * reps as u64 + 120;
    let out = child_command(
        "__scale",
        &[
            op.name().into(),
            n.to_string(),
            reps.to_string(),
            guard.as_millis().to_string(),
            watchdog.to_string(),
            round.to_string(),
        ],
    )
    .output();
    let what = format!("scale {} at {}", op.name(), scale::size_label(n));
    let out = match out {
        Ok(out) if out.status.success() => out,
        Ok(out) => {
            eprintln!("{what} failed: {}", out.status);
            return ScaleOutcome::Failed;
        }
        Err(e) => {
            eprintln!("{what}: {e}");
            return ScaleOutcome::Failed;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let words: Vec<&str> = text.split_whitespace().collect();
    match words[..] {
        ["scale", "ok", ns] => ns.parse().map_or(ScaleOutcome::Failed, ScaleOutcome::Done),
        ["scale", "too_slow", done, seconds] => ScaleOutcome::TooSlow(TooSlow {
            done: done.parse().unwrap_or(0),
            seconds: seconds.parse().unwrap_or(f64::NAN),
        }),
        _ => {
            eprintln!("{what}: unexpected answer {text:?}");
            ScaleOutcome::Failed
        }
    }
}

// ---------------------------------------------------------------------------
// Statistics and the report.

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// (max - min) / median, over rounds.
fn spread(v: &[f64]) -> f64 {
    let med = median(v.to_vec());
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (hi - lo) / med
}

/// `1234567.8` as `1,234,568`.
fn grouped(x: f64) -> String {
    if !x.is_finite() {
        return "n/a".into();
    }
    let digits = format!("{:.0}", x.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if x < 0.0 {
        out.insert(0, '-');
    }
    out
}

/// Values to 3 decimals, space-separated.
fn list(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.3}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn json_number(x: f64, decimals: usize) -> String {
    if x.is_finite() {
        format!("{x:.decimals$}")
    } else {
        "null".into()
    }
}

/// `"key": {"a": 1, "b": 2}`.
fn json_object(key: &str, cells: &[(String, String)]) -> String {
    let body: Vec<String> = cells.iter().map(|(k, v)| format!("\"{k}\": {v}")).collect();
    format!("\"{key}\": {{{}}}", body.join(", "))
}

/// The per-round field of a metric measured in every pass.
fn field(metric: &str) -> Option<Field> {
    let f: Field = match metric {
        "latency_ns" => |r| r.latency_ns,
        "throughput_l2" => |r| r.throughput_l2,
        "throughput_l2_keyed" => |r| r.throughput_l2_keyed,
        "throughput_l2_limited" => |r| r.throughput_l2_limited,
        "throughput_l64" => |r| r.throughput_l64,
        "efficiency_l2" => |r| r.efficiency_l2,
        "peak_threads_l2" => |r| r.peak_threads_l2,
        "cpu_ns_per_job_noop" => |r| r.cpu_noop_ns,
        "cpu_ns_per_job_50us" => |r| r.cpu_50us_ns,
        _ => return None,
    };
    Some(f)
}

#[derive(Debug, Clone, Copy)]
enum Need {
    AtMost(f64),
    AtLeast(f64),
}

impl Need {
    fn holds(self, value: f64) -> bool {
        match self {
            Need::AtMost(n) => value <= n,
            Need::AtLeast(n) => value >= n,
        }
    }

    fn show(self) -> String {
        match self {
            Need::AtMost(n) => format!("<= {n}"),
            Need::AtLeast(n) => format!(">= {n}"),
        }
    }
}

struct Target {
    /// Its name in `rounds_held` and `target_ratio`.
    key: String,
    what: String,
    value: f64,
    need: Need,
    /// Its value in each round.
    per_round: Vec<f64>,
    /// What a round's own value must meet to count as held.
    round_need: Need,
    note: String,
}

impl Target {
    fn held(&self) -> usize {
        self.per_round
            .iter()
            .filter(|&&v| self.round_need.holds(v))
            .count()
    }
}

/// Shorter system names for table columns.
fn short(name: &str) -> &str {
    match name {
        "semaphore_spawn_blocking" => "semaphore+sb",
        other => other,
    }
}

const LABEL: usize = 36;
const CELL: usize = 17;

fn row(out: &mut String, label: &str, cells: impl IntoIterator<Item = String>) {
    let _ = write!(out, "{label:<LABEL$}");
    for c in cells {
        let _ = write!(out, "{c:>CELL$}");
    }
    out.push('\n');
}

impl Report {
    fn pass(&self, c: Condition) -> &PassData {
        &self.passes[c as usize]
    }

    fn series(&self, c: Condition, system: &str, f: impl Fn(&Round) -> f64) -> Vec<f64> {
        self.pass(c)
            .rounds
            .get(system)
            .map(|rs| rs.iter().map(f).collect())
            .unwrap_or_default()
    }

    fn bytes_series(&self, c: Condition, system: &str, keep: bool) -> Vec<f64> {
        self.pass(c)
            .bytes
            .get(&(system, keep))
            .map(|bs| bs.iter().map(|b| b.per_job).collect())
            .unwrap_or_default()
    }

    /// Rounds measured (the same for every pass).
    fn rounds(&self) -> usize {
        self.pass(Condition::Default).reference.len()
    }

    fn reference(&self, c: Condition) -> f64 {
        median(self.pass(c).reference.clone())
    }

    fn own_threads(&self, c: Condition, system: &str) -> f64 {
        self.own_threads_l2
            .get(&(c.driver(), system))
            .copied()
            .unwrap_or(0) as f64
    }

    /// The most threads seen over every limit-2 throughput batch.
    fn raw_peak(&self, c: Condition, system: &str) -> f64 {
        self.series(c, system, |r| r.peak_threads_l2)
            .into_iter()
            .fold(f64::NAN, f64::max)
    }

    /// The value reported for `metric` and `system` under `c`.
    fn value(&self, c: Condition, metric: &str, system: &str) -> f64 {
        match metric {
            "peak_threads_l2" => self.raw_peak(c, system) - self.own_threads(c, system),
            "bytes_per_queued_job" => median(self.bytes_series(c, system, false)),
            "bytes_per_queued_job_with_handle" => median(self.bytes_series(c, system, true)),
            m => field(m).map_or(f64::NAN, |f| median(self.series(c, system, f))),
        }
    }

    fn per_round_ratio(&self, c: Condition, f: Field, a: &str, b: &str) -> Vec<f64> {
        self.series(c, a, f)
            .iter()
            .zip(self.series(c, b, f))
            .map(|(x, y)| x / y)
            .collect()
    }

    /// A scale cell's median, NaN if it ever was too slow or failed.
    fn scale_value(&self, oi: usize, n: usize) -> f64 {
        match self.scale.cells.get(&(oi, n)) {
            Some(cell) if !cell.gave_up() => median(cell.per_round.clone()),
            _ => f64::NAN,
        }
    }

    fn scale_cell_text(&self, oi: usize, n: usize) -> String {
        match self.scale.cells.get(&(oi, n)) {
            Some(cell) if cell.failed => "failed".into(),
            Some(cell) if cell.too_slow.is_some() => "too slow".into(),
            Some(cell) if cell.per_round.iter().all(|v| v.is_nan()) => "skipped".into(),
            Some(cell) => grouped(median(cell.per_round.clone())),
            None => "n/a".into(),
        }
    }

    fn targets(&self) -> Vec<Target> {
        let c = Condition::Default;
        let off = "offloader";
        let ratio = |key: &str, what: &str, metric: &str, peer: &str, need: Need| Target {
            key: key.into(),
            what: what.into(),
            value: self.value(c, metric, off) / self.value(c, metric, peer),
            need,
            per_round: field(metric)
                .map(|f| self.per_round_ratio(c, f, off, peer))
                .unwrap_or_default(),
            round_need: need,
            note: String::new(),
        };
        let mut t = vec![
            ratio(
                "latency_vs_spawn_blocking",
                "latency: offloader / spawn_blocking",
                "latency_ns",
                "spawn_blocking",
                Need::AtMost(0.6),
            ),
            ratio(
                "throughput_l2_vs_tokio_capped",
                "throughput_l2: offloader / tokio_capped",
                "throughput_l2",
                "tokio_capped",
                Need::AtLeast(3.0),
            ),
            ratio(
                "throughput_l2_vs_semaphore_spawn_blocking",
                "throughput_l2: offloader / semaphore_spawn_blocking",
                "throughput_l2",
                "semaphore_spawn_blocking",
                Need::AtLeast(10.0),
            ),
            ratio(
                "throughput_l64_vs_tokio_capped",
                "throughput_l64: offloader / tokio_capped",
                "throughput_l64",
                "tokio_capped",
                Need::AtLeast(5.0),
            ),
        ];
        let plain = self.series(c, off, |r| r.throughput_l2);
        let keyed = self.series(c, off, |r| r.throughput_l2_keyed);
        t.push(Target {
            key: "keyed_cost_vs_plain".into(),
            what: format!("keyed job cost: offloader keyed ({KEYS} keys) / plain"),
            value: median(plain.clone()) / median(keyed.clone()),
            need: Need::AtMost(1.5),
            per_round: plain.iter().zip(&keyed).map(|(p, k)| p / k).collect(),
            round_need: Need::AtMost(1.5),
            note: "cost = 1 / throughput_l2".into(),
        });
        let limited = self.series(c, off, |r| r.throughput_l2_limited);
        t.push(Target {
            key: "limited_cost_vs_plain".into(),
            what: "limited job cost: offloader with a Limiter / plain".into(),
            value: median(plain.clone()) / median(limited.clone()),
            need: Need::AtMost(1.5),
            per_round: plain.iter().zip(&limited).map(|(p, k)| p / k).collect(),
            round_need: Need::AtMost(1.5),
            note: "cost = 1 / throughput_l2".into(),
        });
        let eff = self.series(c, off, |r| r.efficiency_l2);
        t.push(Target {
            key: "efficiency_l2_vs_raw_threads".into(),
            what: "efficiency_l2: offloader / two plain threads".into(),
            value: self.value(c, "efficiency_l2", off) / self.reference(c),
            need: Need::AtLeast(0.90),
            per_round: eff
                .iter()
                .zip(&self.pass(c).reference)
                .map(|(e, r)| e / r)
                .collect(),
            round_need: Need::AtLeast(0.90),
            note: String::new(),
        });
        t.push(ratio(
            "cpu_noop_vs_tokio_capped",
            "cpu per no-op job: offloader / tokio_capped",
            "cpu_ns_per_job_noop",
            "tokio_capped",
            Need::AtMost(1.0),
        ));
        let thr = self.series(c, off, |r| r.throughput_l2);
        let med = median(thr.clone());
        t.push(Target {
            key: "spread_throughput_l2".into(),
            what: "throughput_l2 spread: offloader".into(),
            value: spread(&thr),
            need: Need::AtMost(0.30),
            per_round: thr.iter().map(|x| (x / med - 1.0).abs()).collect(),
            round_need: Need::AtMost(0.15),
            note: "a round holds within ±15% of the median".into(),
        });
        let kept = |system: &str| {
            let quiet = self.series(Condition::Default, system, |r| r.throughput_l2);
            let noisy = self.series(Condition::Noisy, system, |r| r.throughput_l2);
            let per_round: Vec<f64> = noisy.iter().zip(&quiet).map(|(n, q)| n / q).collect();
            (median(noisy) / median(quiet), per_round)
        };
        let (kept_off, kept_off_r) = kept(off);
        let (kept_cap, kept_cap_r) = kept("tokio_capped");
        t.push(Target {
            key: "noisy_throughput_l2_kept_vs_tokio_capped".into(),
            what: "noisy: throughput_l2 kept, offloader / tokio_capped".into(),
            value: kept_off / kept_cap,
            need: Need::AtLeast(1.0),
            per_round: kept_off_r
                .iter()
                .zip(&kept_cap_r)
                .map(|(a, b)| a / b)
                .collect(),
            round_need: Need::AtLeast(1.0),
            note: format!(
                "kept = noisy / default: offloader {kept_off:.3}, tokio_capped {kept_cap:.3}"
            ),
        });
        let own = self.own_threads(c, off);
        t.push(Target {
            key: "peak_threads_l2".into(),
            what: "peak_threads_l2: offloader (threads above its own)".into(),
            value: self.value(c, "peak_threads_l2", off),
            need: Need::AtMost(2.0),
            per_round: self
                .series(c, off, |r| r.peak_threads_l2)
                .iter()
                .map(|p| p - own)
                .collect(),
            round_need: Need::AtMost(2.0),
            note: String::new(),
        });
        for (keep, key, limit) in [
            (false, "bytes_per_queued_job", 128.0),
            (true, "bytes_per_queued_job_with_handle", 160.0),
        ] {
            t.push(Target {
                key: key.into(),
                what: format!("{key}: offloader"),
                value: self.value(c, key, off),
                need: Need::AtMost(limit),
                per_round: self.bytes_series(c, off, keep),
                round_need: Need::AtMost(limit),
                note: String::new(),
            });
        }
        let sizes = &self.scale.sizes;
        if let (Some(&small), Some(&big)) = (sizes.first(), sizes.last()) {
            if big > small {
                let (s, b) = (scale::size_label(small), scale::size_label(big));
                for (oi, op) in SCALE_OPS.iter().enumerate() {
                    if op.is_reference() {
                        continue;
                    }
                    let per = |n| {
                        self.scale
                            .cells
                            .get(&(oi, n))
                            .map(|c: &ScaleCell| c.per_round.clone())
                            .unwrap_or_default()
                    };
                    let note = match self.scale.cells.get(&(oi, big)) {
                        Some(cell) if cell.gave_up() => {
                            format!("{} at {b}", self.scale_cell_text(oi, big))
                        }
                        _ => String::new(),
                    };
                    t.push(Target {
                        key: format!("scale_{}", op.name()),
                        what: format!("scale {}: cost at {b} / at {s}", op.name()),
                        value: self.scale_value(oi, big) / self.scale_value(oi, small),
                        need: Need::AtMost(2.0),
                        per_round: per(big)
                            .iter()
                            .zip(per(small))
                            .map(|(x, y)| x / y)
                            .collect(),
                        round_need: Need::AtMost(2.0),
                        note,
                    });
                }
            }
        }
        t
    }

    fn print(&self, json: bool) {
        let mut out = String::new();
        let p = &self.plan;
        let names: Vec<&str> = SYSTEMS.iter().map(|s| s.name()).collect();
        let _ = writeln!(
            out,
            "\noffloader vs peers: {} run, {} round(s), {} cores, {:.1} s; \
             load average before/after: {} / {}",
            if p.quick { "quick" } else { "full" },
            self.rounds(),
            cores(),
            self.elapsed.as_secs_f64(),
            self.load.0,
            self.load.1,
        );
        let _ = writeln!(
            out,
            "child processes per system and runtime: latency, limit 2, limit 64; \
             offloader queue_capacity {OFFLOADER_QUEUE_CAPACITY};\n\
             latency {} sequential jobs; throughput {} jobs at once; efficiency {} jobs \
             of {:.1} µs ({} iterations);\nbytes: {} queued jobs, a fresh process per \
             system, runtime and round",
            p.latency_jobs,
            p.throughput_jobs,
            p.efficiency_jobs,
            self.calibration.job.as_secs_f64() * 1e6,
            self.calibration.iters,
            p.queued_jobs,
        );

        for c in CONDITIONS {
            self.print_condition(&mut out, c, &names);
        }

        // Spread: how noisy each timed metric was.
        if self.rounds() > 1 {
            let _ = writeln!(
                out,
                "\nspread over rounds, (max - min) / median, default runtime:"
            );
            for metric in [
                "latency_ns",
                "throughput_l2",
                "throughput_l64",
                "efficiency_l2",
                "cpu_ns_per_job_noop",
            ] {
                let f = field(metric).expect("a per-round metric");
                row(
                    &mut out,
                    metric,
                    names.iter().map(|n| {
                        format!(
                            "{:.0}%",
                            100.0 * spread(&self.series(Condition::Default, n, f))
                        )
                    }),
                );
            }
        }

        // Diagnostics.
        let _ = writeln!(out, "\ndiagnostics (medians; not targets):");
        let c = Condition::Default;
        let diag: [(&str, Field); 3] = [
            ("l2 batch: submit ns/job", |r| r.submit_ns_l2),
            ("l2 batch: rest ns/job", |r| r.drain_ns_l2),
            ("efficiency_l2, detached", |r| r.efficiency_detached_l2),
        ];
        for (label, f) in diag {
            row(
                &mut out,
                label,
                names.iter().map(|n| {
                    let v = median(self.series(c, n, f));
                    if label.starts_with("efficiency") {
                        format!("{v:.3}")
                    } else {
                        grouped(v)
                    }
                }),
            );
        }
        // The ceiling: what a pool that keeps none of the promises does.
        let (ceiling, capped, off) = (
            System::ChannelPool.name(),
            System::TokioCapped.name(),
            System::Offloader.name(),
        );
        let vs_capped = self.per_round_ratio(c, |r| r.throughput_l2, ceiling, capped);
        let _ = writeln!(
            out,
            "  ceiling (channel_pool, no promise kept): throughput_l2 {:.3}x tokio_capped, \
             3x or more in {} of {} rounds; the offloader's {:.3}x channel_pool's",
            self.value(c, "throughput_l2", ceiling) / self.value(c, "throughput_l2", capped),
            vs_capped.iter().filter(|&&r| r >= 3.0).count(),
            vs_capped.len(),
            self.value(c, "throughput_l2", off) / self.value(c, "throughput_l2", ceiling),
        );
        // Each pass reads CPU twice per system.
        let readings = 2 * self.rounds() * CONDITIONS.len();
        row(
            &mut out,
            "cpu readings from ticks, of all",
            names.iter().map(|n| {
                let ticks: f64 = CONDITIONS
                    .iter()
                    .map(|&c| self.series(c, n, |r| r.cpu_from_ticks).iter().sum::<f64>())
                    .sum();
                format!("{ticks} / {readings}")
            }),
        );
        if !p.quick {
            // Too short in quick runs for /proc/stat's 10 ms ticks.
            for c in [Condition::Default, Condition::Noisy] {
                row(
                    &mut out,
                    &format!("efficiency_l2{}, noise-adjusted", c.suffix()),
                    names.iter().map(|n| {
                        format!(
                            "{:.3}",
                            median(self.series(c, n, |r| r.efficiency_adjusted_l2))
                        )
                    }),
                );
                let _ = writeln!(
                    out,
                    "  two plain threads, noise-adjusted: {:.3}",
                    median(self.pass(c).reference_adjusted.clone())
                );
            }
            let _ = writeln!(
                out,
                "  (noise-adjusted: work / CPU that was idle or ours during the run, \
                 in 10 ms ticks, about ±2%)"
            );
        }

        self.print_scale(&mut out);

        // Targets.
        let _ = writeln!(
            out,
            "\ntargets (ratios of this run's medians, default runtime; \
             held = rounds in which it held)"
        );
        let targets = self.targets();
        let mut all = true;
        for t in &targets {
            let ok = t.need.holds(t.value);
            all &= ok;
            let _ = writeln!(
                out,
                "  {:<54}{:>9.3}  {:<9}{:<6}{}/{} held{}",
                t.what,
                t.value,
                t.need.show(),
                if ok { "PASS" } else { "FAIL" },
                t.held(),
                t.per_round.len(),
                if t.note.is_empty() {
                    String::new()
                } else {
                    format!("  ({})", t.note)
                }
            );
            if t.per_round.len() > 1 {
                let _ = writeln!(out, "      per round: {}", list(&t.per_round));
            }
        }
        let _ = writeln!(
            out,
            "  {}",
            if all {
                "all targets met"
            } else {
                "some targets not met"
            }
        );
        print!("{out}");
        if json {
            println!("{}", self.json(&targets));
        }
    }

    fn print_condition(&self, out: &mut String, c: Condition, names: &[&str]) {
        let _ = writeln!(out, "\n== {} ==", c.title());
        row(
            out,
            "metric (median over rounds)",
            names.iter().map(|n| short(n).to_owned()),
        );
        for metric in c.metrics() {
            let label = match metric {
                "latency_ns" => "latency_ns (lower is better)",
                "throughput_l2" => "throughput_l2 (jobs/s)",
                "throughput_l64" => "throughput_l64 (jobs/s)",
                "efficiency_l2" => "efficiency_l2 (ideal/actual)",
                "peak_threads_l2" => "peak_threads_l2 (above own)",
                "bytes_per_queued_job_with_handle" => "bytes_per_queued_job, with handle",
                other => other,
            };
            row(
                out,
                label,
                names.iter().map(|n| {
                    let v = self.value(c, metric, n);
                    match metric {
                        "efficiency_l2" if v.is_finite() => format!("{v:.3}"),
                        m if m.starts_with("bytes") && v.is_finite() => format!("{v:.2}"),
                        _ => grouped(v),
                    }
                }),
            );
        }
        let _ = writeln!(
            out,
            "  efficiency_l2 of two plain threads: {:.3} (per round: {})",
            self.reference(c),
            list(&self.pass(c).reference)
        );
        row(
            out,
            "  raw peak / own threads",
            names.iter().map(|n| {
                format!(
                    "{} / {}",
                    grouped(self.raw_peak(c, n)),
                    self.own_threads(c, n)
                )
            }),
        );
        if c.has_bytes() {
            row(
                out,
                "  RSS before → after (MiB), last",
                names.iter().map(|n| {
                    match self.pass(c).bytes.get(&(*n, false)).and_then(|b| b.last()) {
                        Some(b) if b.per_job.is_finite() => {
                            format!("{:.1} → {:.1}", b.before_kb / 1024.0, b.after_kb / 1024.0)
                        }
                        _ => "n/a".into(),
                    }
                }),
            );
        }
        if c == Condition::Noisy {
            for metric in ["throughput_l2", "throughput_l64"] {
                row(
                    out,
                    &format!("{metric} kept (noisy/default)"),
                    names.iter().map(|n| {
                        let v =
                            self.value(c, metric, n) / self.value(Condition::Default, metric, n);
                        format!("{v:.3}")
                    }),
                );
            }
        }
    }

    fn print_scale(&self, out: &mut String) {
        let s = &self.scale;
        if s.sizes.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "\nscale: offloader, max_in_flight(1) held by a blocked function; ns per \
             operation, median over {} round(s), {:.1} s; guard {} s per operation",
            s.rounds,
            s.elapsed.as_secs_f64(),
            self.plan.scale_guard.as_secs()
        );
        let _ = write!(out, "{:<24}", "operation");
        for &n in &s.sizes {
            let _ = write!(out, "{:>12}", scale::size_label(n));
        }
        let _ = writeln!(out, "{:>12}  spread at each size", "ratio");
        for (oi, op) in SCALE_OPS.iter().enumerate() {
            let _ = write!(out, "{:<24}", op.name());
            for &n in &s.sizes {
                let _ = write!(out, "{:>12}", self.scale_cell_text(oi, n));
            }
            let ratio = match (s.sizes.first(), s.sizes.last()) {
                (Some(&a), Some(&b)) if b > a => self.scale_value(oi, b) / self.scale_value(oi, a),
                _ => f64::NAN,
            };
            let spreads: Vec<String> = s
                .sizes
                .iter()
                .map(|&n| {
                    let v = self
                        .scale
                        .cells
                        .get(&(oi, n))
                        .map(|c| c.per_round.clone())
                        .unwrap_or_default();
                    let sp = spread(&v);
                    if sp.is_finite() {
                        format!("{:.0}%", 100.0 * sp)
                    } else {
                        "-".into()
                    }
                })
                .collect();
            let _ = writeln!(
                out,
                "{:>12}  {}",
                if ratio.is_finite() {
                    format!("{ratio:.2}")
                } else {
                    "n/a".into()
                },
                spreads.join(" ")
            );
            for &n in &s.sizes {
                if let Some(t) = s.cells.get(&(oi, n)).and_then(|c| c.too_slow) {
                    let _ = writeln!(
                        out,
                        "    {} at {}: {} of {n} done in {:.1} s ({} ns each so far); \
                         not tried again at this size or larger",
                        op.name(),
                        scale::size_label(n),
                        t.done,
                        t.seconds,
                        grouped(t.seconds * 1e9 / t.done.max(1) as f64)
                    );
                }
            }
        }
        self.scale_cold_line(out);
        self.scale_fresh_report(out);
    }

    /// The smallest and the largest size of the scale section, when there
    /// is a larger one, and the report rows of `ops`: what the lines derived
    /// from the scale table start from.
    fn scale_ends<const N: usize>(&self, ops: [ScaleOp; N]) -> Option<(usize, usize, [usize; N])> {
        let s = &self.scale;
        let (&small, &big) = (s.sizes.first()?, s.sizes.last()?);
        if big <= small {
            return None;
        }
        let mut rows = [0; N];
        for (row, op) in rows.iter_mut().zip(ops) {
            *row = SCALE_OPS.iter().position(|&o| o == op)?;
        }
        Some((small, big, rows))
    }

    /// What `shutdown_now` costs at the largest size without writing its
    /// report into memory the process never touched (see
    /// `floor_fresh_report` in benches/common/scale.rs).
    fn scale_fresh_report(&self, out: &mut String) {
        let Some((small, big, [shut, fresh])) =
            self.scale_ends([ScaleOp::ShutdownNow, ScaleOp::FloorFreshReport])
        else {
            return;
        };
        let at = |oi, n| self.scale_value(oi, n);
        let own = at(shut, big) - at(fresh, big);
        if !own.is_finite() {
            return;
        }
        let (sl, bl) = (scale::size_label(small), scale::size_label(big));
        let _ = writeln!(
            out,
            "  a fresh report vector (floor_fresh_report at {bl}): {} ns per job; shutdown_now \
             at {bl} less that: {} ns = {:.2}x shutdown_now at {sl}",
            grouped(at(fresh, big)),
            grouped(own),
            own / at(shut, small)
        );
    }

    /// What one cold line paid in full adds to a cancel in random order:
    /// the least its cost at the largest size can be, given its cost at the
    /// smallest (see `floor_serial_touch` in benches/common/scale.rs).
    fn scale_cold_line(&self, out: &mut String) {
        let Some((small, big, [cancel, chase])) =
            self.scale_ends([ScaleOp::CancelRandom, ScaleOp::FloorSerialTouch])
        else {
            return;
        };
        let at = |oi, n| self.scale_value(oi, n);
        let line = at(chase, big) - at(chase, small);
        let least = at(cancel, small) + line;
        if !least.is_finite() {
            return;
        }
        let (sl, bl) = (scale::size_label(small), scale::size_label(big));
        let _ = writeln!(
            out,
            "  one cold line paid in full (floor_serial_touch at {bl} - at {sl}): {} ns; \
             cancel_random at {sl} + that line: {} ns = {:.2}x cancel_random at {sl} \
             (measured at {bl}: {} ns)",
            grouped(line),
            grouped(least),
            least / at(cancel, small),
            grouped(at(cancel, big))
        );
    }

    fn json(&self, targets: &[Target]) -> String {
        let mut parts = Vec::new();
        for c in CONDITIONS {
            for metric in c.metrics() {
                let decimals = match metric {
                    "efficiency_l2" => 4,
                    "throughput_l2" | "throughput_l64" | "peak_threads_l2" => 0,
                    m if m.starts_with("bytes") => 2,
                    _ => 1,
                };
                let mut cells: Vec<(String, String)> = SYSTEMS
                    .iter()
                    .map(|s| {
                        (
                            s.name().to_owned(),
                            json_number(self.value(c, metric, s.name()), decimals),
                        )
                    })
                    .collect();
                if metric == "efficiency_l2" {
                    cells.push(("raw_threads".into(), json_number(self.reference(c), 4)));
                }
                parts.push(json_object(&format!("{metric}{}", c.suffix()), &cells));
            }
        }
        // The offloader alone has keyed and limited jobs.
        for c in CONDITIONS {
            for metric in ["throughput_l2_keyed", "throughput_l2_limited"] {
                let v = self.value(c, metric, System::Offloader.name());
                let cells = [(System::Offloader.name().to_owned(), json_number(v, 0))];
                parts.push(json_object(&format!("{metric}{}", c.suffix()), &cells));
            }
        }
        parts.push(format!("\"rounds\": {}", self.rounds()));
        let held: Vec<(String, String)> = targets
            .iter()
            .map(|t| (t.key.clone(), t.held().to_string()))
            .collect();
        parts.push(json_object("rounds_held", &held));
        let ratios: Vec<(String, String)> = targets
            .iter()
            .map(|t| (t.key.clone(), json_number(t.value, 4)))
            .collect();
        parts.push(json_object("target_ratio", &ratios));
        let spreads: Vec<(String, String)> = SYSTEMS
            .iter()
            .map(|s| {
                let v = self.series(Condition::Default, s.name(), |r| r.throughput_l2);
                (s.name().to_owned(), json_number(spread(&v), 4))
            })
            .collect();
        parts.push(json_object("spread_throughput_l2", &spreads));

        let s = &self.scale;
        let mut too_slow = Vec::new();
        for (oi, op) in SCALE_OPS.iter().enumerate() {
            for &n in &s.sizes {
                let key = format!("scale_{}_{}", op.name(), scale::size_label(n));
                parts.push(format!(
                    "\"{key}\": {}",
                    json_number(self.scale_value(oi, n), 1)
                ));
                if let Some(t) = s.cells.get(&(oi, n)).and_then(|c| c.too_slow) {
                    too_slow.push((
                        key,
                        format!(
                            "{{\"done\": {}, \"of\": {n}, \"seconds\": {}}}",
                            t.done,
                            json_number(t.seconds, 2)
                        ),
                    ));
                }
            }
        }
        if let (Some(&small), Some(&big)) = (s.sizes.first(), s.sizes.last()) {
            if big > small {
                for (oi, op) in SCALE_OPS.iter().enumerate() {
                    parts.push(format!(
                        "\"scale_ratio_{}\": {}",
                        op.name(),
                        json_number(self.scale_value(oi, big) / self.scale_value(oi, small), 3)
                    ));
                }
                parts.push(format!(
                    "\"scale_ratio_of\": \"{}/{}\"",
                    scale::size_label(big),
                    scale::size_label(small)
                ));
            }
        }
        parts.push(format!("\"scale_rounds\": {}", s.rounds));
        parts.push(json_object("scale_too_slow", &too_slow));
        format!("{{{}}}", parts.join(", "))
    }
}

// ---------------------------------------------------------------------------
// The children.

/// `/proc/self/status` field `key` (e.g. `Threads:`), as a number; 0 if it
/// cannot be read (not Linux).
fn proc_status(key: &str) -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// utime + stime of this process, exited threads included, in clock ticks
/// (`/proc/self/stat` fields 14 and 15).
fn own_ticks() -> u64 {
    let me = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may contain spaces): state is
    // field 3, utime 14, stime 15.
    let after = me.rsplit_once(')').map_or("", |(_, rest)| rest);
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)
}

/// A point in time on the machine's CPU accounting (`/proc/stat`, in
/// USER_HZ = 100 ticks): how much CPU time was idle, and how much this
/// process used. Between two marks, idle + ours is the CPU this process
/// could have had; what other processes used or the hypervisor stole is
/// left out. This separates a system's overhead from a noisy neighbour.
#[derive(Debug, Clone, Copy)]
struct CpuMark {
    idle: u64,
    ours: u64,
}

impl CpuMark {
    fn now() -> CpuMark {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let cpu: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .filter_map(|v| v.parse().ok())
            .collect();
        // user nice system idle iowait ...
        let idle = cpu.get(3).copied().unwrap_or(0) + cpu.get(4).copied().unwrap_or(0);
        CpuMark {
            idle,
            ours: own_ticks(),
        }
    }

    /// Core-seconds since this mark that were idle or used by this process.
    fn available_since(&self) -> f64 {
        let now = CpuMark::now();
        let ticks = now.idle.saturating_sub(self.idle) + now.ours.saturating_sub(self.ours);
        ticks as f64 / 100.0
    }
}

/// The CPU time of every thread of this process (ns, from
/// `/proc/self/task/*/schedstat`), and of the process (ticks, from
/// `/proc/self/stat`).
struct CpuSnapshot {
    /// (thread id, ns on a CPU), sorted by thread id.
    threads: Vec<(u32, u64)>,
    ticks: u64,
}

impl CpuSnapshot {
    fn take() -> CpuSnapshot {
        let mut threads = Vec::new();
        if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
            for entry in dir.flatten() {
                let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                    continue;
                };
                // A thread that exited since the listing has no file left.
                let ns = std::fs::read_to_string(entry.path().join("schedstat"))
                    .ok()
                    .and_then(|s| s.split_whitespace().next()?.parse().ok());
                if let Some(ns) = ns {
                    threads.push((tid, ns));
                }
            }
        }
        threads.sort_unstable();
        CpuSnapshot {
            threads,
            ticks: own_ticks(),
        }
    }

    fn thread(&self, tid: u32) -> Option<u64> {
        self.threads
            .binary_search_by_key(&tid, |&(t, _)| t)
            .ok()
            .map(|i| self.threads[i].1)
    }

    /// CPU ns used since `before` by every thread but `exclude`. Falls back
    /// to the tick count when a thread's time may have been lost with it
    /// (see the module docs); then the second value is 1.
    fn used_since(&self, before: &CpuSnapshot, exclude: Option<u32>) -> (f64, u8) {
        let ns: u64 = self
            .threads
            .iter()
            .filter(|&&(tid, _)| Some(tid) != exclude)
            .map(|&(tid, now)| now.saturating_sub(before.thread(tid).unwrap_or(0)))
            .sum();
        let vanished = before
            .threads
            .iter()
            .any(|&(tid, _)| self.thread(tid).is_none());
        let ticks_ns = self.ticks.saturating_sub(before.ticks) * TICK_NS;
        if self.threads.is_empty() || vanished || ticks_ns > ns + 2 * TICK_NS {
            (ticks_ns as f64, 1)
        } else {
            (ns as f64, 0)
        }
    }
}

fn threads() -> usize {
    proc_status("Threads:")
}

fn rss_kb() -> usize {
    proc_status("VmRSS:")
}

/// The calling thread's id, from `/proc/thread-self` (`PID/task/TID`).
fn thread_id() -> Option<u32> {
    std::fs::read_link("/proc/thread-self")
        .ok()?
        .file_name()?
        .to_str()?
        .parse()
        .ok()
}

/// Samples the process's thread count every 2 ms while active (a read of
/// `/proc/self/status` is not free: sampling faster takes CPU from the
/// measured system; the CPU metrics leave the sampler's own time out).
struct Sampler {
    active: Arc<AtomicBool>,
    peak: Arc<AtomicUsize>,
    thread: std::thread::Thread,
    tid: Option<u32>,
}

impl Sampler {
    fn start() -> Sampler {
        let active = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicUsize::new(0));
        let (a, p) = (active.clone(), peak.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        let handle = std::thread::Builder::new()
            .name("sampler".into())
            .spawn(move || {
                let _ = tx.send(thread_id());
                loop {
                    if a.load(Ordering::Acquire) {
                        p.fetch_max(threads(), Ordering::AcqRel);
                        std::thread::sleep(Duration::from_millis(2));
                    } else {
                        std::thread::park();
                    }
                }
            })
            .expect("sampler thread");
        Sampler {
            active,
            peak,
            thread: handle.thread().clone(),
            tid: rx.recv().ok().flatten(),
        }
    }

    fn begin(&self) {
        self.peak.store(threads(), Ordering::Release);
        self.active.store(true, Ordering::Release);
        self.thread.unpark();
    }

    fn end(&self) -> usize {
        self.active.store(false, Ordering::Release);
        self.peak.fetch_max(threads(), Ordering::AcqRel);
        self.peak.load(Ordering::Acquire)
    }
}

/// Positional argument `i` of a child, parsed.
fn arg<T: std::str::FromStr>(args: &[String], i: usize) -> T {
    args.get(i)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| fail(&format!("child: bad argument {i} in {args:?}")))
}

fn arg_system(args: &[String], i: usize) -> System {
    args.get(i)
        .and_then(|n| System::from_name(n))
        .unwrap_or_else(|| fail("child: unknown system"))
}

fn arg_driver(args: &[String], i: usize) -> Driver {
    args.get(i)
        .and_then(|n| Driver::from_name(n))
        .unwrap_or_else(|| fail("child: unknown runtime"))
}

/// `__serve SYSTEM LIMIT WATCHDOG_S RUNTIME`: answers one measurement per
/// line of stdin (`latency N`, `throughput N`, `efficiency N ITERS`,
/// `detached N ITERS`, `exit`).
fn serve(args: &[String]) {
    let system = arg_system(args, 0);
    let limit: usize = arg(args, 1);
    watchdog(Duration::from_secs(arg(args, 2)), "a measuring child");
    let rt = arg_driver(args, 3).runtime();
    let sampler = Sampler::start();
    let built = Peer::build(system, limit);
    let own = threads();
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "ready {own}");
    let _ = stdout.flush();
    for line in std::io::stdin().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| {
            words
                .get(i)
                .and_then(|w| w.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let peer = built.peer.clone();
        let reply = match words.first().copied() {
            Some("latency") => {
                let n = num(1);
                let took = on_runtime(&rt, async move {
                    let t = Instant::now();
                    for _ in 0..n {
                        std::hint::black_box(peer.round_trip(0).await);
                    }
                    t.elapsed()
                });
                format!("latency {}", took.as_nanos() as f64 / n.max(1) as f64)
            }
            Some("throughput") => {
                let n = num(1) as usize;
                let cpu = CpuSnapshot::take();
                sampler.begin();
                let (took, submitted) = on_runtime(&rt, async move {
                    let t = Instant::now();
                    let (sum, submitted) = peer.batch(n, 0).await;
                    std::hint::black_box(sum);
                    (t.elapsed(), submitted)
                });
                let peak = sampler.end();
                let (cpu_ns, ticks) = CpuSnapshot::take().used_since(&cpu, sampler.tid);
                format!(
                    "throughput {} {peak} {} {cpu_ns} {ticks}",
                    took.as_secs_f64(),
                    submitted.as_secs_f64()
                )
            }
            Some("throughput_keyed") => {
                // Keys > 0: keyed over that many keys; 0: one limiter.
                let (n, keys) = (num(1) as usize, num(2) as usize);
                let took = on_runtime(&rt, async move {
                    let t = Instant::now();
                    let done = if keys > 0 {
                        peer.batch_keyed(n, keys).await
                    } else {
                        peer.batch_limited(n).await
                    };
                    std::hint::black_box(done.is_some().then(|| t.elapsed()))
                });
                format!(
                    "throughput_keyed {}",
                    took.map_or(f64::NAN, |t| t.as_secs_f64())
                )
            }
            Some("efficiency") => {
                let (n, iters) = (num(1) as usize, num(2));
                let cpu = CpuSnapshot::take();
                let (took, avail) = on_runtime(&rt, async move {
                    let mark = CpuMark::now();
                    let t = Instant::now();
                    std::hint::black_box(peer.batch(n, iters).await);
                    (t.elapsed(), mark.available_since())
                });
                let (cpu_ns, ticks) = CpuSnapshot::take().used_since(&cpu, sampler.tid);
                format!("efficiency {} {avail} {cpu_ns} {ticks}", took.as_secs_f64())
            }
            Some("detached") => {
                let (n, iters) = (num(1) as usize, num(2));
                let took = on_runtime(&rt, async move {
                    let t = Instant::now();
                    std::hint::black_box(peer.batch_detached(n, iters).await);
                    t.elapsed()
                });
                format!("detached {}", took.as_secs_f64())
            }
            _ => break,
        };
        let _ = writeln!(stdout, "{reply}");
        let _ = stdout.flush();
    }
    // Do not wait for pools to wind down.
    std::process::exit(0);
}

/// Runs `fut` as a task on the driver runtime's workers, as application
/// code would run.
fn on_runtime<T: Send + 'static>(
    rt: &tokio::runtime::Runtime,
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    rt.block_on(rt.spawn(fut)).expect("measurement task")
}

/// `__bytes SYSTEM JOBS WATCHDOG_S RUNTIME KEEP`: RSS growth per queued job
/// (handles kept if KEEP is 1). Prints `bytes PER_JOB BEFORE_KB AFTER_KB`.
fn bytes_child(args: &[String]) {
    let system = arg_system(args, 0);
    let jobs: usize = arg(args, 1);
    watchdog(Duration::from_secs(arg(args, 2)), "a memory child");
    let rt = arg_driver(args, 3).runtime();
    let keep = arg::<u8>(args, 4) == 1;
    // Block every thread the system may use: its limit is 1, except tokio's
    // default pool, whose limit is its 512 threads.
    let (limit, blockers) = match system {
        System::SpawnBlocking => (1, 512),
        _ => (1, 1),
    };
    let built = Peer::build(system, limit);
    let peer = built.peer.clone();
    let gate = Arc::new(Gate::default());
    let g = gate.clone();
    let (before, after) = on_runtime(&rt, async move {
        let (started, mut running) = tokio::sync::mpsc::unbounded_channel();
        for _ in 0..blockers {
            let (g, started) = (g.clone(), started.clone());
            peer.detach(move || {
                let _ = started.send(());
                g.wait();
                0
            });
        }
        for _ in 0..blockers {
            running.recv().await.expect("a blocker started");
        }
        // A first 1% of queued jobs outside the measurement: one-time costs
        // of the first queued job (lazy initialisation, the queue's first
        // buffer) are not a cost per job. Every system gets the same.
        let first = peer.queue_noop(jobs / 100, keep);
        let before = rss_kb();
        let queued = peer.queue_noop(jobs, keep);
        // Submitting is synchronous for every system but the semaphore
        // pattern, whose tasks hold all their state from the spawn on
        // (polling them allocates nothing more): nothing to wait for.
        let after = rss_kb();
        drop((first, queued));
        (before, after)
    });
    let per_job = (after as f64 - before as f64) * 1024.0 / jobs.max(1) as f64;
    println!("bytes {per_job:.2} {before} {after}");
    let _ = std::io::stdout().flush();
    gate.open();
    std::process::exit(0);
}

/// `__scale OP N REPS GUARD_MS WATCHDOG_S SEED`: times a scale operation
/// REPS times on a queue of N (see `benches/common/scale.rs`). Prints
/// `scale ok NS_PER_OP` (the median), or `scale too_slow DONE SECONDS` as
/// soon as one operation has run for GUARD_MS.
fn scale_child(args: &[String]) {
    let op = args
        .first()
        .and_then(|n| ScaleOp::from_name(n))
        .unwrap_or_else(|| fail("child: unknown scale operation"));
    let n: usize = arg(args, 1);
    let reps: usize = arg(args, 2);
    let guard = Duration::from_millis(arg(args, 3));
    watchdog(Duration::from_secs(arg(args, 4)), "a scale child");
    let seed: u64 = arg(args, 5);
    let rt = common::driver_runtime();
    let meter = scale::Meter::new();
    meter.watch(guard, |done, took| {
        println!("scale too_slow {done} {:.3}", took.as_secs_f64());
        let _ = std::io::stdout().flush();
        std::process::exit(0);
    });
    let mut per_op = Vec::with_capacity(reps);
    for rep in 0..reps {
        let m = meter.clone();
        let seed = seed * 1_000 + rep as u64;
        let took = on_runtime(&rt, async move { scale::measure(op, n, seed, &m).await });
        per_op.push(took.as_nanos() as f64 / n.max(1) as f64);
    }
    println!("scale ok {:.3}", median(per_op));
    let _ = std::io::stdout().flush();
    std::process::exit(0);
}

/// `__burn WATCHDOG_S`: one thread burning CPU until stdin closes.
fn burn(args: &[String]) {
    watchdog(Duration::from_secs(arg(args, 0)), "the noisy neighbour");
    std::thread::Builder::new()
        .name("burn".into())
        .spawn(|| loop {
            std::hint::black_box(common::work(1 << 16));
        })
        .expect("burning thread");
    println!("burning");
    let _ = std::io::stdout().flush();
    let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
    std::process::exit(0);
}
