//! `offloader` against its peers, every measurement in one interleaved run.
//!
//! ```text
//! cargo run --release --example compare              # full run, table (< 2 minutes on 2 cores)
//! cargo run --release --example compare -- --json    # ... and one JSON object on the last line
//! cargo run --release --example compare -- --quick   # a few seconds, to keep it working (CI)
//! ```
//!
//! Systems (see `benches/common/mod.rs`, shared with the criterion benches):
//! `offloader`; `spawn_blocking` (tokio's default blocking pool);
//! `semaphore_spawn_blocking` (`Semaphore(limit)` + `spawn_blocking` with the
//! owned permit moved into the closure); `tokio_capped` (`spawn_blocking` on
//! a separate runtime built with `max_blocking_threads(limit)`);
//! `blocking_unblock` (`blocking::unblock` with `BLOCKING_MAX_THREADS=limit`).
//!
//! Metrics:
//!
//! - `latency_ns`: one no-op job submitted and awaited, sequentially (limit 2),
//!   in a process that does nothing else.
//! - `throughput_l2`, `throughput_l64`: 100 000 no-op jobs submitted at once,
//!   then all awaited; jobs/s from the first submit to the last completion.
//!   The offloader gets `queue_capacity(200_000)` so the batch fits: this is
//!   about throughput, not backpressure.
//! - `efficiency_l2`: 10 000 jobs of ~50 µs of CPU work (a calibrated loop),
//!   limit 2: ideal time (jobs × one job's cost / 2 cores) over measured
//!   time. The job's cost is the best of 50 short single-thread runs (10
//!   calls each, well under a scheduler time slice), measured again every
//!   round, so a busy machine does not inflate it. Two plain threads running
//!   the same work are shown as the reference for what the machine allowed.
//! - `peak_threads_l2`: the most threads the process had while running the
//!   limit-2 throughput batches (sampled every 2 ms from
//!   `/proc/self/status`), minus the threads it had before the system was
//!   first used (its own: main, the driver runtime's worker, the sampler, a
//!   watchdog). Both numbers are printed.
//! - `bytes_per_queued_job`: VmRSS growth over 100 000 detached no-op jobs
//!   that stay queued behind a pool whose threads are all blocked on a gate
//!   (limit 1; tokio's default pool: all its 512 threads), in a fresh process
//!   per system, after a first 1 000 queued jobs that are not counted (so
//!   that one-time costs of the first queued job are left out). Offloader handles are detached (`JobHandle::detach`), tokio
//!   `JoinHandle`s dropped, `blocking` tasks `detach`ed: every system keeps
//!   only what it needs itself.
//!
//! Diagnostics (printed, not in the JSON): the limit-2 throughput batch split
//! into submitting and the rest; efficiency with detached jobs and a single
//! wake-up for the whole batch (the cost of waking the caller per job, left
//! out); and efficiency over the CPU the child could actually get (idle or
//! its own, from `/proc/stat`), which takes a noisy neighbour out.
//!
//! How it is fair:
//!
//! - Every system runs in its own child processes (this binary re-executed
//!   with a hidden subcommand): one for latency, one for the limit-2 batches,
//!   one for the limit-64 batches. The `blocking` crate reads
//!   `BLOCKING_MAX_THREADS` once per process, so every system gets the same
//!   treatment, and one system's idle threads cannot skew another's thread
//!   count. Every child drives its jobs from the same runtime: tokio
//!   multi-thread, one worker, the measured code in a task on it.
//! - Rounds: each round runs every measurement once per system, in an order
//!   that rotates from round to round, so that drift on a shared machine
//!   hits every system alike. The report gives medians over rounds, their
//!   spread, and for each target in how many rounds it held.
//! - The children are warmed up (threads started, allocator primed) before
//!   the first round.

#![warn(missing_docs)]

#[path = "../benches/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use common::{Peer, System, BLOCKING_MAX_THREADS, OFFLOADER_QUEUE_CAPACITY, SYSTEMS};

const USAGE: &str = "usage: compare [--quick] [--json] [--rounds N]";

/// Every metric, in the order of the report and of the JSON object.
const METRICS: [&str; 6] = [
    "latency_ns",
    "throughput_l2",
    "throughput_l64",
    "efficiency_l2",
    "peak_threads_l2",
    "bytes_per_queued_job",
];

/// How much work a run does.
#[derive(Debug, Clone, Copy)]
struct Plan {
    quick: bool,
    latency_jobs: usize,
    /// The latency jobs of a round are measured in this many chunks, each
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
    /// Any process of the run exits with an error past this.
    watchdog: Duration,
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
            budget: Duration::from_secs(90),
            min_rounds: 3,
            hard_budget: Duration::from_secs(100),
            watchdog: Duration::from_secs(170),
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
            rounds: 1,
            budget: Duration::from_secs(20),
            min_rounds: 1,
            hard_budget: Duration::from_secs(30),
            watchdog: Duration::from_secs(90),
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("__serve") => return serve(&args[1..]),
        Some("__bytes") => return bytes_child(&args[1..]),
        _ => {}
    }
    let mut json = false;
    let mut plan = Plan::full();
    let mut rounds = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => plan = Plan::quick(),
            "--json" => json = true,
            "--rounds" => {
                rounds = it.next().and_then(|v| v.parse::<usize>().ok());
                if rounds.is_none() {
                    fail(USAGE);
                }
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return;
            }
            other => fail(&format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if let Some(r) = rounds {
        plan.rounds = r.max(1);
        plan.min_rounds = plan.min_rounds.min(plan.rounds);
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

// ---------------------------------------------------------------------------
// The parent: children, rounds, report.

/// A child process serving measurements of one system at one limit.
struct Server {
    system: System,
    limit: usize,
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    /// Threads the child had before the system was first used.
    own_threads: usize,
}

impl Server {
    fn start(system: System, limit: usize, watchdog: Duration) -> Server {
        let exe = std::env::current_exe().expect("path of this executable");
        let mut cmd = Command::new(exe);
        cmd.args([
            "__serve",
            system.name(),
            &limit.to_string(),
            &watchdog.as_secs().to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
        if system == System::BlockingUnblock {
            cmd.env(BLOCKING_MAX_THREADS, limit.to_string());
        }
        let mut child = cmd.spawn().expect("spawn a measuring child");
        let input = child.stdin.take().expect("child stdin");
        let output = BufReader::new(child.stdout.take().expect("child stdout"));
        let mut server = Server {
            system,
            limit,
            child,
            input,
            output,
            own_threads: 0,
        };
        server.own_threads = server.read_reply("ready")[0] as usize;
        server
    }

    fn ask(&mut self, command: &str) -> Vec<f64> {
        if writeln!(self.input, "{command}")
            .and_then(|()| self.input.flush())
            .is_err()
        {
            fail(&format!(
                "child for {} (limit {}) is gone",
                self.system.name(),
                self.limit
            ));
        }
        let tag = command.split(' ').next().unwrap_or_default().to_owned();
        self.read_reply(&tag)
    }

    fn read_reply(&mut self, tag: &str) -> Vec<f64> {
        let mut line = String::new();
        match self.output.read_line(&mut line) {
            Ok(n) if n > 0 => {}
            _ => fail(&format!(
                "child for {} (limit {}) died before answering {tag:?}",
                self.system.name(),
                self.limit
            )),
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

/// What one round measured for one system.
#[derive(Debug, Clone, Copy, Default)]
struct Round {
    latency_ns: f64,
    throughput_l2: f64,
    throughput_l64: f64,
    efficiency_l2: f64,
    peak_threads_l2: f64,
    /// Diagnostics, not targets: ns per job spent submitting the limit-2
    /// throughput batch, and in the rest of it (until the last outcome).
    submit_ns_l2: f64,
    drain_ns_l2: f64,
    /// Efficiency with detached jobs and one wake-up for the whole batch.
    efficiency_detached_l2: f64,
    /// Efficiency over the CPU the child could get: work / (core-seconds
    /// idle or used by the child during the run); see [`CpuMark`].
    efficiency_adjusted_l2: f64,
}

/// Picks one measurement out of a [`Round`].
type Field = fn(&Round) -> f64;

/// Everything the run measured.
struct Report {
    plan: Plan,
    calibration: common::Calibration,
    rounds: BTreeMap<&'static str, Vec<Round>>,
    /// Efficiency of two plain threads running the same work, per round.
    reference: Vec<f64>,
    /// The same, over the CPU this process could get (see [`CpuMark`]).
    reference_adjusted: Vec<f64>,
    own_threads_l2: BTreeMap<&'static str, usize>,
    bytes: BTreeMap<&'static str, Option<Bytes>>,
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

#[derive(Debug, Clone, Copy)]
struct Bytes {
    per_job: f64,
    before_kb: f64,
    after_kb: f64,
}

fn run(plan: Plan) -> Report {
    let began = Instant::now();
    let load_before = load_average();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    eprintln!(
        "compare: {} run on {cores} cores; progress on stderr, report on stdout",
        if plan.quick { "quick" } else { "full" }
    );

    // Calibrate while nothing else of ours runs.
    let calibration = common::calibrate(Duration::from_micros(50));
    eprintln!(
        "calibrated: {} iterations = {:.1} µs per job",
        calibration.iters,
        calibration.job.as_secs_f64() * 1e6
    );

    // Latency has children of its own: a pool that an earlier batch grew to
    // hundreds of idle threads (tokio's default pool) hands each job to a
    // different cold thread, which would make that peer look slower than a
    // process that only makes sequential calls.
    let mut lat: Vec<Server> = SYSTEMS
        .iter()
        .map(|&s| Server::start(s, 2, plan.watchdog))
        .collect();
    let mut l2: Vec<Server> = SYSTEMS
        .iter()
        .map(|&s| Server::start(s, 2, plan.watchdog))
        .collect();
    let mut l64: Vec<Server> = SYSTEMS
        .iter()
        .map(|&s| Server::start(s, 64, plan.watchdog))
        .collect();

    // Warm-up: start threads, prime allocators; results dropped.
    for s in lat.iter_mut() {
        s.ask(&format!("latency {}", plan.latency_jobs / 10));
    }
    for s in l2.iter_mut() {
        s.ask(&format!("throughput {}", plan.throughput_jobs / 10));
        s.ask(&format!(
            "efficiency {} {}",
            plan.efficiency_jobs / 10,
            calibration.iters
        ));
        s.ask(&format!(
            "detached {} {}",
            plan.efficiency_jobs / 10,
            calibration.iters
        ));
    }
    for s in l64.iter_mut() {
        s.ask(&format!("throughput {}", plan.throughput_jobs / 10));
    }
    eprintln!("warmed up after {:.1} s", began.elapsed().as_secs_f64());

    let mut rounds: BTreeMap<&'static str, Vec<Round>> = BTreeMap::new();
    let mut reference = Vec::new();
    let mut reference_adjusted = Vec::new();
    let n = SYSTEMS.len();
    for round in 0..plan.rounds {
        let round_began = Instant::now();
        let mut results = [Round::default(); SYSTEMS.len()];
        let order = |i: usize| (i + round) % n;

        // Latency in chunks, each interleaved: finer-grained than a round.
        let chunks = plan.latency_chunks.max(1);
        for chunk in 0..chunks {
            for i in 0..n {
                let k = (i + round + chunk) % n;
                let r = lat[k].ask(&format!("latency {}", plan.latency_jobs / chunks));
                results[k].latency_ns += r[0] / chunks as f64;
            }
        }
        for i in 0..n {
            let k = order(i);
            let r = l2[k].ask(&format!("throughput {}", plan.throughput_jobs));
            let jobs = plan.throughput_jobs as f64;
            results[k].throughput_l2 = jobs / r[0];
            results[k].peak_threads_l2 = r[1];
            results[k].submit_ns_l2 = r[2] * 1e9 / jobs;
            results[k].drain_ns_l2 = (r[0] - r[2]) * 1e9 / jobs;
        }
        for i in 0..n {
            let k = order(i);
            let r = l64[k].ask(&format!("throughput {}", plan.throughput_jobs));
            results[k].throughput_l64 = plan.throughput_jobs as f64 / r[0];
        }
        // The job's cost is measured again each round (frequency drift).
        let job = common::job_cost(calibration.iters, 50).as_secs_f64();
        let ideal = plan.efficiency_jobs as f64 * job / 2.0;
        // Efficiency: the five systems and the two-thread reference, rotated.
        for i in 0..=n {
            let k = (i + round) % (n + 1);
            if k == n {
                let mark = CpuMark::now();
                let took = reference_run(plan.efficiency_jobs, calibration.iters);
                reference.push(ideal / took);
                reference_adjusted.push(2.0 * ideal / mark.available_since());
            } else {
                let r = l2[k].ask(&format!(
                    "efficiency {} {}",
                    plan.efficiency_jobs, calibration.iters
                ));
                results[k].efficiency_l2 = ideal / r[0];
                results[k].efficiency_adjusted_l2 = 2.0 * ideal / r[1];
            }
        }
        // Diagnostic: the same work detached, one wake-up per batch.
        for i in 0..n {
            let k = order(i);
            let r = l2[k].ask(&format!(
                "detached {} {}",
                plan.efficiency_jobs, calibration.iters
            ));
            results[k].efficiency_detached_l2 = ideal / r[0];
        }
        for (k, s) in SYSTEMS.iter().enumerate() {
            rounds.entry(s.name()).or_default().push(results[k]);
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
    let own_threads_l2 = l2
        .iter()
        .map(|s| (s.system.name(), s.own_threads))
        .collect();
    for s in lat.into_iter().chain(l2).chain(l64) {
        s.stop();
    }

    // Memory per queued job, one fresh process per system.
    let mut bytes = BTreeMap::new();
    for s in SYSTEMS {
        bytes.insert(s.name(), measure_bytes(s, plan.queued_jobs, plan.watchdog));
    }

    Report {
        plan,
        calibration,
        rounds,
        reference,
        reference_adjusted,
        own_threads_l2,
        bytes,
        elapsed: began.elapsed(),
        load: (load_before, load_average()),
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

fn measure_bytes(system: System, jobs: usize, watchdog: Duration) -> Option<Bytes> {
    let exe = std::env::current_exe().expect("path of this executable");
    let mut cmd = Command::new(exe);
    cmd.args([
        "__bytes",
        system.name(),
        &jobs.to_string(),
        &watchdog.as_secs().to_string(),
    ])
    .stderr(Stdio::inherit());
    if system == System::BlockingUnblock {
        cmd.env(BLOCKING_MAX_THREADS, "1");
    }
    let out = match cmd.output() {
        Ok(out) if out.status.success() => out,
        Ok(out) => {
            eprintln!(
                "bytes_per_queued_job for {} failed: {}",
                system.name(),
                out.status
            );
            return None;
        }
        Err(e) => {
            eprintln!("bytes_per_queued_job for {}: {e}", system.name());
            return None;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<f64> = text
        .split_whitespace()
        .skip(1)
        .filter_map(|w| w.parse().ok())
        .collect();
    match v[..] {
        [per_job, before_kb, after_kb] => Some(Bytes {
            per_job,
            before_kb,
            after_kb,
        }),
        _ => {
            eprintln!("unexpected bytes answer: {text:?}");
            None
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

enum Need {
    AtMost(f64),
    AtLeast(f64),
}

struct Target {
    what: String,
    value: f64,
    need: Need,
    /// Its value in each round (empty for one-off measurements).
    per_round: Vec<f64>,
}

impl Target {
    fn holds(value: f64, need: &Need) -> bool {
        match *need {
            Need::AtMost(n) => value <= n,
            Need::AtLeast(n) => value >= n,
        }
    }
}

impl Report {
    fn series(&self, system: &str, f: impl Fn(&Round) -> f64) -> Vec<f64> {
        self.rounds
            .get(system)
            .map(|rs| rs.iter().map(f).collect())
            .unwrap_or_default()
    }

    /// The value reported for `metric` and `system`.
    fn value(&self, metric: &str, system: &str) -> f64 {
        let pick = |f: fn(&Round) -> f64| median(self.series(system, f));
        match metric {
            "latency_ns" => pick(|r| r.latency_ns),
            "throughput_l2" => pick(|r| r.throughput_l2),
            "throughput_l64" => pick(|r| r.throughput_l64),
            "efficiency_l2" => pick(|r| r.efficiency_l2),
            "peak_threads_l2" => {
                let peak = self.raw_peak(system);
                let own = self.own_threads_l2.get(system).copied().unwrap_or(0) as f64;
                peak - own
            }
            "bytes_per_queued_job" => self
                .bytes
                .get(system)
                .copied()
                .flatten()
                .map_or(f64::NAN, |b| b.per_job),
            _ => f64::NAN,
        }
    }

    /// The most threads seen over every limit-2 throughput batch.
    fn raw_peak(&self, system: &str) -> f64 {
        self.series(system, |r| r.peak_threads_l2)
            .into_iter()
            .fold(f64::NAN, f64::max)
    }

    fn per_round(&self, metric: fn(&Round) -> f64, a: &str, b: &str) -> Vec<f64> {
        self.series(a, metric)
            .iter()
            .zip(self.series(b, metric))
            .map(|(x, y)| x / y)
            .collect()
    }

    fn targets(&self) -> Vec<Target> {
        let ratio = |what: &str, metric: &str, f: fn(&Round) -> f64, peer: &str, need: Need| {
            let value = self.value(metric, "offloader") / self.value(metric, peer);
            Target {
                what: what.into(),
                value,
                need,
                per_round: self.per_round(f, "offloader", peer),
            }
        };
        vec![
            ratio(
                "latency: offloader / spawn_blocking",
                "latency_ns",
                |r| r.latency_ns,
                "spawn_blocking",
                Need::AtMost(0.6),
            ),
            ratio(
                "throughput_l2: offloader / tokio_capped",
                "throughput_l2",
                |r| r.throughput_l2,
                "tokio_capped",
                Need::AtLeast(3.0),
            ),
            ratio(
                "throughput_l2: offloader / semaphore_spawn_blocking",
                "throughput_l2",
                |r| r.throughput_l2,
                "semaphore_spawn_blocking",
                Need::AtLeast(10.0),
            ),
            ratio(
                "throughput_l64: offloader / tokio_capped",
                "throughput_l64",
                |r| r.throughput_l64,
                "tokio_capped",
                Need::AtLeast(5.0),
            ),
            Target {
                what: "efficiency_l2: offloader".into(),
                value: self.value("efficiency_l2", "offloader"),
                need: Need::AtLeast(0.90),
                per_round: self.series("offloader", |r| r.efficiency_l2),
            },
            Target {
                what: "peak_threads_l2: offloader (threads above its own)".into(),
                value: self.value("peak_threads_l2", "offloader"),
                need: Need::AtMost(2.0),
                per_round: Vec::new(),
            },
            Target {
                what: "bytes_per_queued_job: offloader".into(),
                value: self.value("bytes_per_queued_job", "offloader"),
                need: Need::AtMost(128.0),
                per_round: Vec::new(),
            },
        ]
    }

    fn print(&self, json: bool) {
        let mut out = String::new();
        let p = &self.plan;
        let measured = self.rounds.values().map(Vec::len).max().unwrap_or(0);
        let _ = writeln!(
            out,
            "\noffloader vs peers: {} run, {measured} round(s), {} cores, {:.1} s; \
             load average before/after: {} / {}",
            if p.quick { "quick" } else { "full" },
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            self.elapsed.as_secs_f64(),
            self.load.0,
            self.load.1,
        );
        let _ = writeln!(
            out,
            "driver: tokio multi-thread runtime, 1 worker, child processes per system: latency, limit 2, limit 64;\n\
             offloader queue_capacity {OFFLOADER_QUEUE_CAPACITY}; latency {} sequential jobs; \
             throughput {} jobs at once;\nefficiency {} jobs of {:.1} µs ({} iterations); \
             bytes: {} queued jobs, detached",
            p.latency_jobs,
            p.throughput_jobs,
            p.efficiency_jobs,
            self.calibration.job.as_secs_f64() * 1e6,
            self.calibration.iters,
            p.queued_jobs,
        );

        // Main table: medians.
        let names: Vec<&str> = SYSTEMS.iter().map(|s| s.name()).collect();
        let short = |n: &str| match n {
            "semaphore_spawn_blocking" => "semaphore+sb".to_owned(),
            other => other.to_owned(),
        };
        let _ = write!(out, "\n{:<30}", "metric (median over rounds)");
        for n in &names {
            let _ = write!(out, "{:>17}", short(n));
        }
        out.push('\n');
        for metric in METRICS {
            let label = match metric {
                "latency_ns" => "latency_ns (lower is better)",
                "throughput_l2" => "throughput_l2 (jobs/s)",
                "throughput_l64" => "throughput_l64 (jobs/s)",
                "efficiency_l2" => "efficiency_l2 (ideal/actual)",
                "peak_threads_l2" => "peak_threads_l2 (above own)",
                _ => "bytes_per_queued_job",
            };
            let _ = write!(out, "{label:<30}");
            for n in &names {
                let v = self.value(metric, n);
                let cell = match metric {
                    "efficiency_l2" if v.is_finite() => format!("{v:.3}"),
                    "bytes_per_queued_job" if v.is_finite() => format!("{v:.2}"),
                    _ => grouped(v),
                };
                let _ = write!(out, "{cell:>17}");
            }
            out.push('\n');
        }
        let _ = write!(out, "{:<30}", "  raw peak / own threads");
        for n in &names {
            let own = self.own_threads_l2.get(n).copied().unwrap_or(0);
            let cell = format!("{} / {own}", grouped(self.raw_peak(n)));
            let _ = write!(out, "{cell:>17}");
        }
        out.push('\n');
        let _ = write!(out, "{:<30}", "  RSS before → after (MiB)");
        for n in &names {
            let cell = match self.bytes.get(n).copied().flatten() {
                Some(b) => format!("{:.1} → {:.1}", b.before_kb / 1024.0, b.after_kb / 1024.0),
                None => "n/a".into(),
            };
            let _ = write!(out, "{cell:>17}");
        }
        out.push('\n');
        let _ = writeln!(
            out,
            "  (RSS is counted in 4 KiB pages: resolution {:.2} bytes per job)",
            4096.0 / p.queued_jobs.max(1) as f64
        );

        // Spread: how noisy each timed metric was.
        if measured > 1 {
            let _ = writeln!(out, "\nspread over rounds, (max - min) / median:");
            let timed: [(&str, Field); 4] = [
                ("latency_ns", |r| r.latency_ns),
                ("throughput_l2", |r| r.throughput_l2),
                ("throughput_l64", |r| r.throughput_l64),
                ("efficiency_l2", |r| r.efficiency_l2),
            ];
            for (metric, f) in timed {
                let _ = write!(out, "{metric:<30}");
                for n in &names {
                    let cell = format!("{:.0}%", 100.0 * spread(&self.series(n, f)));
                    let _ = write!(out, "{cell:>17}");
                }
                out.push('\n');
            }
        }
        let _ = writeln!(
            out,
            "\nreference: two plain threads running the same efficiency work: {:.3} \
             (median; what this machine allows, per round: {})",
            median(self.reference.clone()),
            list(&self.reference)
        );

        // Diagnostics.
        let _ = writeln!(out, "\ndiagnostics (medians; not targets):");
        let diag: [(&str, Field); 4] = [
            ("l2 batch: submit ns/job", |r| r.submit_ns_l2),
            ("l2 batch: rest ns/job", |r| r.drain_ns_l2),
            ("efficiency_l2, detached", |r| r.efficiency_detached_l2),
            ("efficiency_l2, noise-adjusted", |r| {
                r.efficiency_adjusted_l2
            }),
        ];
        for (label, f) in diag {
            if p.quick && label.ends_with("noise-adjusted") {
                // Too short for /proc/stat's 10 ms ticks.
                continue;
            }
            let _ = write!(out, "{label:<30}");
            for n in &names {
                let v = median(self.series(n, f));
                let cell = if label.starts_with("efficiency") {
                    format!("{v:.3}")
                } else {
                    grouped(v)
                };
                let _ = write!(out, "{cell:>17}");
            }
            out.push('\n');
        }
        if !p.quick {
            let _ = writeln!(
                out,
                "  (noise-adjusted: work / CPU that was idle or ours during the run, \
                 in 10 ms ticks, about ±2%; two plain threads: {:.3})",
                median(self.reference_adjusted.clone())
            );
        }

        // Targets.
        let _ = writeln!(
            out,
            "\ntargets (ratios of this run's medians; rounds = rounds in which it held)"
        );
        let mut all = true;
        for t in self.targets() {
            let ok = Target::holds(t.value, &t.need);
            all &= ok;
            let need = match t.need {
                Need::AtMost(n) => format!("<= {n}"),
                Need::AtLeast(n) => format!(">= {n}"),
            };
            let held = t
                .per_round
                .iter()
                .filter(|&&v| Target::holds(v, &t.need))
                .count();
            let rounds = if t.per_round.is_empty() {
                String::new()
            } else {
                format!("{held}/{} rounds", t.per_round.len())
            };
            let _ = writeln!(
                out,
                "  {:<54}{:>9.3}  {:<9}{:<6}{rounds}",
                t.what,
                t.value,
                need,
                if ok { "PASS" } else { "FAIL" }
            );
            if t.per_round.len() > 1 {
                let _ = writeln!(out, "      per round: {}", list(&t.per_round));
            }
        }
        if !p.quick {
            // Information only: the same target over the CPU the run could
            // get, for a machine shared with others.
            let adjusted = self.series("offloader", |r| r.efficiency_adjusted_l2);
            let held = adjusted.iter().filter(|&&e| e >= 0.90).count();
            let v = median(adjusted.clone());
            let _ = writeln!(
                out,
                "  {:<54}{v:>9.3}  {:<9}{:<6}{held}/{} rounds  (information, not a target)",
                "efficiency_l2: offloader, noise-adjusted",
                ">= 0.9",
                if v >= 0.90 { "pass" } else { "fail" },
                adjusted.len()
            );
            let _ = writeln!(
                out,
                "      per round: {}  (two plain threads: {})",
                list(&adjusted),
                list(&self.reference_adjusted)
            );
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
            let decimals = |m: &str| match m {
                "efficiency_l2" => 4,
                "throughput_l2" | "throughput_l64" | "peak_threads_l2" => 0,
                "bytes_per_queued_job" => 2,
                _ => 1,
            };
            let body: Vec<String> = METRICS
                .iter()
                .map(|m| {
                    let cells: Vec<String> = SYSTEMS
                        .iter()
                        .map(|s| {
                            format!(
                                "\"{}\": {}",
                                s.name(),
                                json_number(self.value(m, s.name()), decimals(m))
                            )
                        })
                        .collect();
                    format!("\"{m}\": {{{}}}", cells.join(", "))
                })
                .collect();
            println!("{{{}}}", body.join(", "));
        }
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
        let me = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // Fields after the command name (which may contain spaces): state is
        // field 3, utime 14, stime 15.
        let after = me.rsplit_once(')').map_or("", |(_, rest)| rest);
        let f: Vec<u64> = after
            .split_whitespace()
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        let ours = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
        CpuMark { idle, ours }
    }

    /// Core-seconds since this mark that were idle or used by this process.
    fn available_since(&self) -> f64 {
        let now = CpuMark::now();
        let ticks = now.idle.saturating_sub(self.idle) + now.ours.saturating_sub(self.ours);
        ticks as f64 / 100.0
    }
}

fn threads() -> usize {
    proc_status("Threads:")
}

fn rss_kb() -> usize {
    proc_status("VmRSS:")
}

/// Samples the process's thread count every 2 ms while active (a read of
/// `/proc/self/status` is not free: sampling faster takes CPU from the
/// measured system).
struct Sampler {
    active: Arc<AtomicBool>,
    peak: Arc<AtomicUsize>,
    thread: std::thread::Thread,
}

impl Sampler {
    fn start() -> Sampler {
        let active = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicUsize::new(0));
        let (a, p) = (active.clone(), peak.clone());
        let handle = std::thread::Builder::new()
            .name("sampler".into())
            .spawn(move || loop {
                if a.load(Ordering::Acquire) {
                    p.fetch_max(threads(), Ordering::AcqRel);
                    std::thread::sleep(Duration::from_millis(2));
                } else {
                    std::thread::park();
                }
            })
            .expect("sampler thread");
        Sampler {
            active,
            peak,
            thread: handle.thread().clone(),
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

fn child_args(args: &[String]) -> (System, usize, Duration) {
    let system = args
        .first()
        .and_then(|n| System::from_name(n))
        .unwrap_or_else(|| fail("child: unknown system"));
    let n = args
        .get(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| fail("child: bad number"));
    let limit = args
        .get(2)
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(170), Duration::from_secs);
    (system, n, limit)
}

/// `__serve SYSTEM LIMIT WATCHDOG_S`: answers one measurement per line of
/// stdin (`latency N`, `throughput N`, `efficiency N ITERS`,
/// `detached N ITERS`, `exit`).
fn serve(args: &[String]) {
    let (system, limit, wd) = child_args(args);
    watchdog(wd, "a measuring child");
    let rt = common::driver_runtime();
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
                sampler.begin();
                let (took, submitted) = on_runtime(&rt, async move {
                    let t = Instant::now();
                    let (sum, submitted) = peer.batch(n, 0).await;
                    std::hint::black_box(sum);
                    (t.elapsed(), submitted)
                });
                let peak = sampler.end();
                format!(
                    "throughput {} {peak} {}",
                    took.as_secs_f64(),
                    submitted.as_secs_f64()
                )
            }
            Some("efficiency") => {
                let (n, iters) = (num(1) as usize, num(2));
                let (took, avail) = on_runtime(&rt, async move {
                    let mark = CpuMark::now();
                    let t = Instant::now();
                    std::hint::black_box(peer.batch(n, iters).await);
                    (t.elapsed(), mark.available_since())
                });
                format!("efficiency {} {avail}", took.as_secs_f64())
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

/// Runs `fut` as a task on the driver runtime's worker, as application
/// code would run.
fn on_runtime<T: Send + 'static>(
    rt: &tokio::runtime::Runtime,
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    rt.block_on(rt.spawn(fut)).expect("measurement task")
}

/// A gate blocked jobs wait on.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    fn wait(&self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        while !*open {
            open = self.cv.wait(open).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn open(&self) {
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }
}

/// `__bytes SYSTEM JOBS WATCHDOG_S`: RSS growth per queued job. Prints
/// `bytes PER_JOB BEFORE_KB AFTER_KB`.
fn bytes_child(args: &[String]) {
    let (system, jobs, wd) = child_args(args);
    watchdog(wd, "a memory child");
    // Block every thread the system may use: its limit is 1, except tokio's
    // default pool, whose limit is its 512 threads.
    let (limit, blockers) = match system {
        System::SpawnBlocking => (1, 512),
        _ => (1, 1),
    };
    let rt = common::driver_runtime();
    let built = Peer::build(system, limit);
    let peer = built.peer.clone();
    let gate = Arc::new(Gate::default());
    let started = Arc::new(AtomicUsize::new(0));
    let g = gate.clone();
    let (before, after) = on_runtime(&rt, async move {
        for _ in 0..blockers {
            let (g, s) = (g.clone(), started.clone());
            peer.detach(move || {
                s.fetch_add(1, Ordering::AcqRel);
                g.wait();
                0
            });
        }
        while started.load(Ordering::Acquire) < blockers {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // A first 1% of queued jobs outside the measurement: one-time costs
        // of the first queued job (lazy initialisation, the queue's first
        // buffer) are not a cost per job. Every system gets the same.
        for _ in 0..jobs / 100 {
            peer.detach(|| common::work(0));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let before = rss_kb();
        for _ in 0..jobs {
            peer.detach(|| common::work(0));
        }
        // Let every submission settle (spawned tasks polled once, waiting).
        tokio::time::sleep(Duration::from_millis(200)).await;
        (before, rss_kb())
    });
    let per_job = (after as f64 - before as f64) * 1024.0 / jobs.max(1) as f64;
    println!("bytes {per_job:.2} {before} {after}");
    let _ = std::io::stdout().flush();
    gate.open();
    std::process::exit(0);
}
