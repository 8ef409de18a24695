//! The failure `offloader` fixes, reproduced side by side.
//!
//! A limit of one blocking function at a time, and a caller that gives up
//! waiting after 50 ms while the function is still running:
//!
//! ```text
//! (a) Semaphore(1) + spawn_blocking + timeout
//! caller A:  acquire ─ spawn_blocking(work_a) ─ timeout! ─ permit released
//! thread:              work_a ─────────────────────────────────────── returns
//! caller B:                                      acquire ─ work_b ─── ...
//!                                                ^ two functions in flight under a limit of 1
//!
//! (b) Offloader with max_in_flight(1)
//! caller A:  offload(work_a) ─ timeout! (work_a still running; it keeps the permit)
//! worker:    work_a ─────────────────────────────────── returns, permit released
//! caller B:                 offload(work_b) ─ queued ────────────── work_b ── ...
//! ```
//!
//! A timeout ends the *waiting*, not the *work*. In (a) the permit lives in
//! the caller's future, so it is released when the caller stops waiting,
//! while the thread still runs. In (b) the permit is held by the job for as
//! long as the function really runs.
//!
//! Events are ordered with gates (channels the functions signal on and wait
//! on), never with sleeps. Each function counts itself "in flight" from its
//! first line to its return, and the example prints the highest count seen.
//!
//! Run with `cargo run --example quickstart`. It exits with status 1 if the
//! offloader ever lets more than one function run.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use offloader::Offloader;
use tokio::sync::{mpsc as events, Semaphore};

/// How long each caller is willing to wait. Short on purpose: `work_a` is
/// held on a gate until well after this has passed.
const CALLER_TIMEOUT: Duration = Duration::from_millis(50);

/// The concurrency limit both variants are asked to enforce.
const LIMIT: usize = 1;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!(
        "Limit: {LIMIT} blocking function at a time; callers wait at most {CALLER_TIMEOUT:?}.\n"
    );

    println!("(a) tokio::sync::Semaphore({LIMIT}) + spawn_blocking + tokio::time::timeout");
    let naive = naive_semaphore().await?;
    println!("naive semaphore + spawn_blocking: max in flight {naive} (limit {LIMIT})\n");

    println!("(b) Offloader::builder().max_in_flight({LIMIT})");
    let offloaded = with_offloader().await?;
    println!("offloader: max in flight {offloaded} (limit {LIMIT})");

    if offloaded > LIMIT {
        eprintln!("error: the offloader let {offloaded} functions run under a limit of {LIMIT}");
        std::process::exit(1);
    }
    Ok(())
}

/// (a) The hand-rolled version: the permit is a guard inside the caller's
/// future, so it is dropped together with that future when the timeout fires.
async fn naive_semaphore() -> Result<usize, Box<dyn std::error::Error>> {
    let (probe, mut log) = Probe::new();
    let semaphore = Arc::new(Semaphore::new(LIMIT));
    let (release_a, gate_a) = mpsc::channel::<()>();

    // Caller A: take the permit, run work_a on a blocking thread, give up
    // after CALLER_TIMEOUT.
    let p = probe.clone();
    let waited = tokio::time::timeout(CALLER_TIMEOUT, async {
        let _permit = semaphore.acquire().await?;
        tokio::task::spawn_blocking(move || p.run("work_a", || gate_a.recv().ok())).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
    let elapsed = waited.err().ok_or("caller A was expected to time out")?;
    log.expect(Step::Started("work_a")).await?;
    log.say(format!(
        "caller A: timeout says \"{elapsed}\"; its permit guard was dropped with its future"
    ));
    log.say(format!(
        "semaphore permits free: {}, yet work_a is still running",
        semaphore.available_permits()
    ));

    // Caller B: the permit is free, so work_b starts while work_a is held.
    let p = probe.clone();
    {
        let _permit = semaphore.acquire().await?;
        tokio::task::spawn_blocking(move || p.run("work_b", || ())).await?;
    }
    log.expect(Step::Started("work_b")).await?;
    log.expect(Step::Returned("work_b")).await?;

    // Only now let work_a return.
    release_a.send(())?;
    log.expect(Step::Returned("work_a")).await?;
    Ok(probe.max_in_flight())
}

/// (b) The same two callers through an `Offloader`: the permit belongs to the
/// job, not to the caller's future.
async fn with_offloader() -> Result<usize, Box<dyn std::error::Error>> {
    let (probe, mut log) = Probe::new();
    let pool = Offloader::builder().max_in_flight(LIMIT).build()?;
    let (release_a, gate_a) = mpsc::channel::<()>();

    // Caller A: offload work_a and give up after CALLER_TIMEOUT.
    let p = probe.clone();
    let err = pool
        .offload(move |_stop| p.run("work_a", || gate_a.recv().ok()))
        .name("work_a")
        .with_timeout(CALLER_TIMEOUT)
        .await
        .err()
        .ok_or("caller A was expected to time out")?;
    if !err.is_timeout() {
        return Err(format!("caller A: expected a timeout, got: {err}").into());
    }
    log.expect(Step::Started("work_a")).await?;
    log.say(format!("caller A: {err}"));

    // Caller B: offload work_b and keep the owner handle.
    let p = probe.clone();
    let mut job_b = pool
        .offload(move |_stop| p.run("work_b", || ()))
        .name("work_b")
        .spawn()?;
    // Give work_b every chance to start: it must not, work_a holds the permit.
    let still_waiting = job_b
        .wait_timeout(CALLER_TIMEOUT)
        .await
        .err()
        .ok_or("work_b finished while work_a still held the only permit")?;
    log.say(format!("caller B: {still_waiting}"));
    log.expect_nothing()?;
    log.say("work_b has not started: work_a still holds the only permit");
    let m = pool.metrics();
    log.say(format!(
        "metrics: running {} (work_a keeps the permit), queued {} (work_b waits for it), \
         callers timed out {}, running_after_caller_left {}",
        m.running, m.queued, m.callers_timed_out, m.running_after_caller_left
    ));
    if m.running != 1 || m.queued != 1 {
        return Err(format!("expected running 1 and queued 1, got {m:?}").into());
    }

    // Let work_a return: its permit goes to work_b only then.
    release_a.send(())?;
    log.expect(Step::Returned("work_a")).await?;
    log.expect(Step::Started("work_b")).await?;
    log.expect(Step::Returned("work_b")).await?;
    job_b.await?;

    let m = pool.metrics();
    log.say(format!(
        "metrics: completed {}, running {}, queued {}, max_running {}",
        m.completed, m.running, m.queued, m.max_running
    ));
    // Our own count, cross-checked against the pool's.
    Ok(probe.max_in_flight().max(usize::try_from(m.max_running)?))
}

/// A function's report: what happened, how many functions were in flight
/// right after it, and when.
type Report = (Step, usize, Instant);

/// What a function reports about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Started(&'static str),
    Returned(&'static str),
}

/// Counts functions in flight (from first line to return) and reports each
/// start and return to the async side, in order.
#[derive(Clone)]
struct Probe {
    shared: Arc<Counts>,
    events: events::UnboundedSender<Report>,
}

struct Counts {
    in_flight: AtomicUsize,
    max: AtomicUsize,
}

impl Probe {
    fn new() -> (Probe, Log) {
        let (events, rx) = events::unbounded_channel();
        let shared = Arc::new(Counts {
            in_flight: AtomicUsize::new(0),
            max: AtomicUsize::new(0),
        });
        let log = Log {
            rx,
            start: Instant::now(),
        };
        (Probe { shared, events }, log)
    }

    /// Runs `body` as the blocking function `name`, counted as in flight.
    fn run<T>(&self, name: &'static str, body: impl FnOnce() -> T) -> T {
        let now = self.shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.shared.max.fetch_max(now, Ordering::SeqCst);
        let _ = self.events.send((Step::Started(name), now, Instant::now()));
        let value = body();
        let now = self.shared.in_flight.fetch_sub(1, Ordering::SeqCst) - 1;
        let _ = self
            .events
            .send((Step::Returned(name), now, Instant::now()));
        value
    }

    fn max_in_flight(&self) -> usize {
        self.shared.max.load(Ordering::SeqCst)
    }
}

/// The async side of a [`Probe`]: waits for the functions' reports.
struct Log {
    rx: events::UnboundedReceiver<Report>,
    start: Instant,
}

impl Log {
    /// Waits for the next report and checks that it is `want`.
    async fn expect(&mut self, want: Step) -> Result<(), String> {
        let (step, in_flight, at) = self
            .rx
            .recv()
            .await
            .ok_or_else(|| format!("no more reports while waiting for {want:?}"))?;
        let (name, what) = match step {
            Step::Started(name) => (name, "started "),
            Step::Returned(name) => (name, "returned"),
        };
        self.print(at, format!("{name} {what}    in flight: {in_flight}"));
        if step == want {
            Ok(())
        } else {
            Err(format!("expected {want:?}, got {step:?}"))
        }
    }

    /// Checks that no function has reported anything new.
    fn expect_nothing(&mut self) -> Result<(), String> {
        match self.rx.try_recv() {
            Ok((step, ..)) => Err(format!("unexpected report: {step:?}")),
            Err(_) => Ok(()),
        }
    }

    /// Prints a line stamped with the time since the scenario began.
    fn say(&self, line: impl AsRef<str>) {
        self.print(Instant::now(), line);
    }

    fn print(&self, at: Instant, line: impl AsRef<str>) {
        let ms = at.duration_since(self.start).as_millis();
        println!("  [{ms:>4} ms] {}", line.as_ref());
    }
}
