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
//!
//! `cargo run --example quickstart -- --timeline timeline.svg` also draws
//! both scenarios as an SVG timeline from the instants recorded during the
//! run: each caller's wait, each function's lifetime, and who holds the
//! permit (for the offloader, as reported by its own lifecycle observer).
//! `docs/timeline.svg` was made this way.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use offloader::{EventKind, JobEvent, JobState, Observer, Offloader};
use tokio::sync::{mpsc as events, Semaphore, SemaphorePermit};

/// How long each caller is willing to wait. Short on purpose: `work_a` is
/// held on a gate until well after this has passed.
const CALLER_TIMEOUT: Duration = Duration::from_millis(50);

/// The concurrency limit both variants are asked to enforce.
const LIMIT: usize = 1;

/// How long `work_b` works. Only its duration: nothing is ordered by it.
/// Long enough to be seen in the timeline picture.
const WORK_B: Duration = Duration::from_millis(20);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let timeline = match timeline_path() {
        Ok(path) => path,
        Err(usage) => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    println!(
        "Limit: {LIMIT} blocking function at a time; callers wait at most {CALLER_TIMEOUT:?}.\n"
    );

    println!("(a) tokio::sync::Semaphore({LIMIT}) + spawn_blocking + tokio::time::timeout");
    let (naive, naive_run) = naive_semaphore().await?;
    println!("naive semaphore + spawn_blocking: max in flight {naive} (limit {LIMIT})\n");

    println!("(b) Offloader::builder().max_in_flight({LIMIT})");
    let (offloaded, offloader_run) = with_offloader().await?;
    println!("offloader: max in flight {offloaded} (limit {LIMIT})");

    if let Some(path) = timeline {
        std::fs::write(&path, svg(&[naive_run, offloader_run]))?;
        println!("\ntimeline written to {path}");
    }

    if offloaded > LIMIT {
        eprintln!("error: the offloader let {offloaded} functions run under a limit of {LIMIT}");
        std::process::exit(1);
    }
    Ok(())
}

/// (a) The hand-rolled version: the permit is a guard inside the caller's
/// future, so it is dropped together with that future when the timeout fires.
async fn naive_semaphore() -> Result<(usize, Run), Box<dyn std::error::Error>> {
    let (probe, mut log) = Probe::new();
    let semaphore = Arc::new(Semaphore::new(LIMIT));
    let (release_a, gate_a) = mpsc::channel::<()>();

    // Caller A: take the permit, run work_a on a blocking thread, give up
    // after CALLER_TIMEOUT.
    let p = probe.clone();
    let a_began = Instant::now();
    let waited = tokio::time::timeout(CALLER_TIMEOUT, async {
        let _permit = log.hold(semaphore.acquire().await?, "caller A's future");
        tokio::task::spawn_blocking(move || p.run("work_a", || gate_a.recv().ok())).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await;
    log.span(Lane::CallerA, "waits", a_began, Instant::now());
    log.mark(Instant::now(), "A times out");
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
    let b_began = Instant::now();
    {
        let _permit = log.hold(semaphore.acquire().await?, "caller B's future");
        tokio::task::spawn_blocking(move || p.run("work_b", || std::thread::sleep(WORK_B))).await?;
    }
    log.span(Lane::CallerB, "waits", b_began, Instant::now());
    log.expect(Step::Started("work_b")).await?;
    log.expect(Step::Returned("work_b")).await?;

    // Only now let work_a return.
    release_a.send(())?;
    log.expect(Step::Returned("work_a")).await?;
    let run = log.finish(
        "(a) Semaphore(1) + spawn_blocking + timeout: the permit lives in the caller's future",
    );
    Ok((probe.max_in_flight(), run))
}

/// (b) The same two callers through an `Offloader`: the permit belongs to the
/// job, not to the caller's future.
async fn with_offloader() -> Result<(usize, Run), Box<dyn std::error::Error>> {
    let (probe, mut log) = Probe::new();
    // The pool's own lifecycle events say when each job took and released
    // the permit (for the timeline picture).
    let permits = Arc::new(PermitLog::default());
    let pool = Offloader::builder()
        .max_in_flight(LIMIT)
        .observer(permits.clone())
        .build()?;
    let (release_a, gate_a) = mpsc::channel::<()>();

    // Caller A: offload work_a and give up after CALLER_TIMEOUT.
    let p = probe.clone();
    let a_began = Instant::now();
    let err = pool
        .offload(move |_stop| p.run("work_a", || gate_a.recv().ok()))
        .name("work_a")
        .with_timeout(CALLER_TIMEOUT)
        .await
        .err()
        .ok_or("caller A was expected to time out")?;
    log.span(Lane::CallerA, "waits", a_began, Instant::now());
    log.mark(Instant::now(), "A times out");
    if !err.is_timeout() {
        return Err(format!("caller A: expected a timeout, got: {err}").into());
    }
    log.expect(Step::Started("work_a")).await?;
    log.say(format!("caller A: {err}"));

    // Caller B: offload work_b and keep the owner handle.
    let p = probe.clone();
    let b_began = Instant::now();
    let mut job_b = pool
        .offload(move |_stop| p.run("work_b", || std::thread::sleep(WORK_B)))
        .name("work_b")
        .spawn()?;
    // Give work_b every chance to start: it must not, work_a holds the permit.
    // A timeout around `&mut job_b` leaves the handle (and the job) alone.
    if tokio::time::timeout(CALLER_TIMEOUT, &mut job_b)
        .await
        .is_ok()
    {
        return Err("work_b finished while work_a still held the only permit".into());
    }
    log.say(format!(
        "caller B: stopped waiting after {CALLER_TIMEOUT:?}; work_b is {:?}",
        job_b.state()
    ));
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
    log.span(
        Lane::CallerB,
        "waits (owner handle)",
        b_began,
        Instant::now(),
    );

    let m = pool.metrics();
    log.say(format!(
        "metrics: completed {}, running {}, queued {}, max_running {}",
        m.completed, m.running, m.queued, m.max_running
    ));
    // Every lifecycle event has been delivered once the pool is idle.
    pool.idle().await;
    for (name, from, to) in permits.holds() {
        log.span(Lane::Permit, format!("job {name}"), from, to);
    }
    for (name, from, to) in permits.queued() {
        let lane = if name == "work_a" {
            Lane::WorkA
        } else {
            Lane::WorkB
        };
        lock(&log.run)
            .spans
            .push(Span::queued(lane, format!("{name} queued"), from, to));
    }
    let run = log.finish("(b) Offloader, max_in_flight(1): the permit belongs to the job");
    // Our own count, cross-checked against the pool's.
    Ok((
        probe.max_in_flight().max(usize::try_from(m.max_running)?),
        run,
    ))
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
            run: Arc::new(Mutex::new(Recorded::default())),
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

/// The async side of a [`Probe`]: waits for the functions' reports, and
/// records what happened when, for the timeline picture.
struct Log {
    rx: events::UnboundedReceiver<Report>,
    start: Instant,
    run: Arc<Mutex<Recorded>>,
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
        {
            let mut run = lock(&self.run);
            match step {
                Step::Started(name) => run.started.push((name, at)),
                Step::Returned(name) => {
                    let lane = if name == "work_a" {
                        Lane::WorkA
                    } else {
                        Lane::WorkB
                    };
                    if let Some(i) = run.started.iter().position(|(n, _)| *n == name) {
                        let (_, from) = run.started.remove(i);
                        run.spans
                            .push(Span::new(lane, format!("{name} runs"), from, at));
                    }
                }
            }
        }
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

    /// Records a bar for the timeline.
    fn span(&self, lane: Lane, label: impl Into<String>, from: Instant, to: Instant) {
        lock(&self.run)
            .spans
            .push(Span::new(lane, label.into(), from, to));
    }

    /// Records a labelled instant for the timeline.
    fn mark(&self, at: Instant, label: &'static str) {
        lock(&self.run).marks.push((at, label));
    }

    /// Wraps a semaphore permit so that the timeline learns when it was
    /// taken and when it was dropped.
    fn hold<'a>(&self, permit: SemaphorePermit<'a>, holder: &'static str) -> HeldPermit<'a> {
        HeldPermit {
            _permit: permit,
            holder,
            since: Instant::now(),
            run: self.run.clone(),
        }
    }

    /// The recorded scenario, with its title.
    fn finish(self, title: &'static str) -> Run {
        let recorded = std::mem::take(&mut *lock(&self.run));
        Run {
            title,
            start: self.start,
            spans: recorded.spans,
            marks: recorded.marks,
        }
    }
}

// ---------------------------------------------------------------------------
// The timeline picture (`--timeline PATH`): hand-written SVG of the instants
// recorded above.

/// `Some(path)` for `--timeline PATH`; no arguments is the plain run.
fn timeline_path() -> Result<Option<String>, String> {
    let mut args = std::env::args().skip(1);
    match (args.next().as_deref(), args.next(), args.next()) {
        (None, _, _) => Ok(None),
        (Some("--timeline"), Some(path), None) => Ok(Some(path)),
        _ => Err("usage: quickstart [--timeline PATH.svg]".into()),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The rows of one scenario in the picture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    CallerA,
    CallerB,
    WorkA,
    WorkB,
    Permit,
}

impl Lane {
    const ALL: [Lane; 5] = [
        Lane::CallerA,
        Lane::CallerB,
        Lane::WorkA,
        Lane::WorkB,
        Lane::Permit,
    ];

    fn title(self) -> &'static str {
        match self {
            Lane::CallerA => "caller A (waits)",
            Lane::CallerB => "caller B (waits)",
            Lane::WorkA => "work_a (function)",
            Lane::WorkB => "work_b (function)",
            Lane::Permit => "the permit (limit 1)",
        }
    }

    fn colour(self) -> &'static str {
        match self {
            Lane::CallerA | Lane::CallerB => "#9ecae1",
            Lane::WorkA | Lane::WorkB => "#fdae6b",
            Lane::Permit => "#a1d99b",
        }
    }
}

/// One bar: `lane` was busy from `from` to `to`.
struct Span {
    lane: Lane,
    label: String,
    from: Instant,
    to: Instant,
    colour: &'static str,
}

impl Span {
    fn new(lane: Lane, label: String, from: Instant, to: Instant) -> Self {
        Span {
            lane,
            label,
            from,
            to,
            colour: lane.colour(),
        }
    }

    /// A job waiting in the offloader's queue for the permit.
    fn queued(lane: Lane, label: String, from: Instant, to: Instant) -> Self {
        Span {
            colour: "#d9d9d9",
            ..Span::new(lane, label, from, to)
        }
    }
}

/// What one scenario recorded while it ran.
#[derive(Default)]
struct Recorded {
    spans: Vec<Span>,
    marks: Vec<(Instant, &'static str)>,
    started: Vec<(&'static str, Instant)>,
}

/// One finished scenario, ready to draw.
struct Run {
    title: &'static str,
    start: Instant,
    spans: Vec<Span>,
    marks: Vec<(Instant, &'static str)>,
}

impl Run {
    fn ms(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.start).as_secs_f64() * 1e3
    }

    fn end_ms(&self) -> f64 {
        self.spans.iter().map(|s| self.ms(s.to)).fold(0.0, f64::max)
    }

    /// When both functions ran at once, if they ever did.
    fn overlap(&self) -> Option<(f64, f64)> {
        let lane = |l: Lane| {
            self.spans
                .iter()
                .find(|s| s.lane == l && s.colour == l.colour())
        };
        let (a, b) = (lane(Lane::WorkA)?, lane(Lane::WorkB)?);
        let from = self.ms(a.from).max(self.ms(b.from));
        let to = self.ms(a.to).min(self.ms(b.to));
        (to > from).then_some((from, to))
    }
}

/// A permit of the naive scenario that records how long it was held.
struct HeldPermit<'a> {
    _permit: SemaphorePermit<'a>,
    holder: &'static str,
    since: Instant,
    run: Arc<Mutex<Recorded>>,
}

impl Drop for HeldPermit<'_> {
    fn drop(&mut self) {
        lock(&self.run).spans.push(Span::new(
            Lane::Permit,
            self.holder.to_owned(),
            self.since,
            Instant::now(),
        ));
    }
}

/// The offloader's lifecycle observer: when each job took the permit
/// (`Started`) and gave it back (`Finished`).
#[derive(Default)]
struct PermitLog(Mutex<Vec<(String, EventKind, Instant)>>);

impl Observer for PermitLog {
    fn on_event(&self, event: &JobEvent) {
        let name = event.name.as_deref().unwrap_or("?").to_owned();
        lock(&self.0).push((name, event.kind, event.at));
    }
}

impl PermitLog {
    /// From `Accepted` to `Started`, per job that waited in the queue.
    fn queued(&self) -> Vec<(String, Instant, Instant)> {
        let events = lock(&self.0);
        events
            .iter()
            .filter(|(_, kind, _)| *kind == EventKind::Accepted)
            .filter_map(|(name, _, from)| {
                let to = events
                    .iter()
                    .find(|(n, kind, _)| n == name && *kind == EventKind::Started)?;
                (to.2.saturating_duration_since(*from) > Duration::from_millis(1))
                    .then(|| (name.clone(), *from, to.2))
            })
            .collect()
    }

    fn holds(&self) -> Vec<(String, Instant, Instant)> {
        let events = lock(&self.0);
        events
            .iter()
            .filter(|(_, kind, _)| *kind == EventKind::Started)
            .filter_map(|(name, _, from)| {
                let to = events.iter().find(|(n, kind, _)| {
                    n == name
                        && matches!(
                            kind,
                            EventKind::Finished(JobState::Completed | JobState::Panicked)
                        )
                })?;
                Some((name.clone(), *from, to.2))
            })
            .collect()
    }
}

/// Draws the scenarios one above the other on one time axis.
fn svg(runs: &[Run]) -> String {
    const WIDTH: f64 = 960.0;
    const LEFT: f64 = 170.0;
    const RIGHT: f64 = 30.0;
    const LANE: f64 = 26.0;
    const BAR: f64 = 18.0;
    const TITLE: f64 = 44.0;
    const AXIS: f64 = 46.0;
    const GAP: f64 = 16.0;
    const TOP: f64 = 52.0;

    let step = 25.0;
    let end = runs.iter().map(Run::end_ms).fold(step, f64::max);
    let end = (end / step).ceil() * step;
    let x = |ms: f64| LEFT + ms / end * (WIDTH - LEFT - RIGHT);
    let panel = TITLE + LANE * Lane::ALL.len() as f64 + AXIS;
    let height = TOP + panel * runs.len() as f64 + GAP * (runs.len() as f64 - 1.0) + 40.0;

    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r##"<rect width="100%" height="100%" fill="#ffffff"/>
<text x="16" y="24" font-size="16" font-weight="bold">A caller gives up after {} ms while its function still runs (limit: 1 at a time)</text>
<text x="16" y="42" fill="#555555">Recorded by `cargo run --example quickstart -- --timeline`: real instants of one run. Red: two functions in flight under a limit of one.</text>"##,
        CALLER_TIMEOUT.as_millis()
    );
    let mut y0 = TOP;
    for run in runs {
        let _ = writeln!(
            out,
            r#"<text x="16" y="{:.1}" font-size="13" font-weight="bold">{}</text>"#,
            y0 + 16.0,
            xml(run.title)
        );
        let lanes_top = y0 + TITLE;
        let lanes_bottom = lanes_top + LANE * Lane::ALL.len() as f64;
        // Both functions in flight at once.
        if let Some((from, to)) = run.overlap() {
            let _ = writeln!(
                out,
                r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#e34a33" fill-opacity="0.25" stroke="#e34a33"/>
<text x="{:.1}" y="{:.1}" fill="#b30000" font-weight="bold">2 in flight under a limit of 1 ({:.1} ms)</text>"##,
                x(from),
                lanes_top,
                (x(to) - x(from)).max(2.0),
                lanes_bottom - lanes_top,
                x(from),
                lanes_bottom + 32.0,
                to - from,
            );
        }
        for (i, lane) in Lane::ALL.iter().enumerate() {
            let y = lanes_top + LANE * i as f64;
            let _ = writeln!(
                out,
                r##"<line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#eeeeee"/>
<text x="16" y="{:.1}">{}</text>"##,
                y + LANE,
                WIDTH - RIGHT,
                y + LANE,
                y + LANE / 2.0 + 4.0,
                lane.title()
            );
            for span in run.spans.iter().filter(|s| s.lane == *lane) {
                let (from, to) = (x(run.ms(span.from)), x(run.ms(span.to)));
                let _ = writeln!(
                    out,
                    r##"<rect x="{from:.1}" y="{:.1}" width="{:.1}" height="{BAR}" rx="3" fill="{}" stroke="#555555" stroke-width="0.5"><title>{}: {:.1} ms to {:.1} ms</title></rect>"##,
                    y + (LANE - BAR) / 2.0,
                    (to - from).max(2.0),
                    span.colour,
                    xml(&span.label),
                    run.ms(span.from),
                    run.ms(span.to),
                );
                // Label inside the bar when it fits, else after it; a
                // sliver of queueing gets no label (hover shows it).
                let fits = to - from >= 6.5 * span.label.len() as f64 + 8.0;
                let lx = if fits { from + 4.0 } else { to + 4.0 };
                if fits || span.colour == lane.colour() {
                    let _ = writeln!(
                        out,
                        r#"<text x="{lx:.1}" y="{:.1}" font-size="11">{}</text>"#,
                        y + LANE / 2.0 + 4.0,
                        xml(&span.label),
                    );
                }
            }
        }
        for (at, label) in &run.marks {
            let mx = x(run.ms(*at));
            let _ = writeln!(
                out,
                r##"<line x1="{mx:.1}" y1="{:.1}" x2="{mx:.1}" y2="{lanes_bottom:.1}" stroke="#333333" stroke-dasharray="4 3"/>
<text x="{:.1}" y="{:.1}" font-size="11" fill="#333333">{}</text>"##,
                lanes_top - 14.0,
                mx + 4.0,
                lanes_top - 4.0,
                xml(label)
            );
        }
        // The time axis.
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{lanes_bottom:.1}" x2="{:.1}" y2="{lanes_bottom:.1}" stroke="#333333"/>"##,
            WIDTH - RIGHT
        );
        let mut t = 0.0;
        while t <= end + 0.01 {
            let tx = x(t);
            let _ = writeln!(
                out,
                r##"<line x1="{tx:.1}" y1="{lanes_bottom:.1}" x2="{tx:.1}" y2="{:.1}" stroke="#333333"/>
<text x="{tx:.1}" y="{:.1}" font-size="10" text-anchor="middle">{t:.0} ms</text>"##,
                lanes_bottom + 4.0,
                lanes_bottom + 16.0
            );
            t += step;
        }
        y0 += panel + GAP;
    }
    let _ = writeln!(
        out,
        r##"<text x="16" y="{:.1}" fill="#555555">Blue: a caller waiting. Orange: a function running. Grey: queued for the permit. Green: who holds the only permit. Dashed: caller A's timeout.</text>"##,
        height - 14.0
    );
    out.push_str("</svg>\n");
    out
}

/// Escapes text for SVG.
fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
