//! Work dropped by a forced shutdown, found again after a restart.
//!
//! A lifecycle [`Observer`] writes every job's transitions (accepted,
//! started, returned, never started, caller left) to a SQLite ledger, keyed
//! by a stable job key that the user chose (the job's `.name(key)`). Then:
//!
//! 1. **Run 1** submits a batch of ten invoices to a pool of two. Two of
//!    them hit an upstream that hangs (they wait on their stop token), so the
//!    pool cannot drain: a staged `close(graceful, after_stop)` escalates,
//!    hands the four queued invoices back unstarted and stops the two that
//!    hang. Nothing is lost silently: the ledger says what happened to each.
//! 2. **Restart** (a new `Offloader`, a new ledger connection): read the
//!    ledger, re-submit exactly the jobs that never finished.
//! 3. **Restart again**: the ledger says nothing is left; a duplicate
//!    delivery of a finished invoice is submitted on purpose and does
//!    nothing, because each job applies its effect at most once (a `done`
//!    table keyed by the job key, checked and written in one transaction).
//!
//! "Finished" here means the job's *effect* was committed (`done`), which
//! is more than "the function returned": a job that was stopped returned
//! early without its effect, and must run again. The ledger tells which jobs
//! exist and how far they got; the `done` table tells which effects exist.
//!
//! The ledger lives in a uniquely named file in `std::env::temp_dir()`,
//! removed at the end, written with `synchronous=FULL` (every commit is
//! flushed to disk). The observer runs on the pool's own delivery thread, so
//! those flushes stall neither the async runtime nor a worker: the example
//! runs on a current-thread runtime with a 10 ms `tokio::time::interval`
//! ticking beside run 1, and checks that no tick came late by more than
//! `MAX_TICK_LATENESS` while the observer committed its events. The writes
//! use a bounded busy timeout: the observer never blocks forever.
//!
//! Run with `cargo run --release --example durable_ledger`. Exits with
//! status 1 if a job was lost, run twice, or re-submitted when it had
//! finished.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use offloader::{
    CloseReport, Error, EventKind, JobEvent, JobHandle, JobState, Observer, Offloader, StopToken,
};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use tokio::sync::mpsc;

/// Invoices in the batch.
const BATCH: usize = 10;
/// Invoices whose upstream hangs during run 1.
const HANGING: [&str; 2] = ["invoice-05", "invoice-06"];
/// Jobs running at once.
const MAX_IN_FLIGHT: usize = 2;
/// The close's budgets: graceful first, then after the stop request.
const GRACEFUL: Duration = Duration::from_millis(100);
const AFTER_STOP: Duration = Duration::from_secs(2);
/// The interval's period beside run 1, and the most a tick may come late
/// (a generous bound for a shared machine; an fsync per event on the async
/// thread would exceed it).
const TICK: Duration = Duration::from_millis(10);
const MAX_TICK_LATENESS: Duration = Duration::from_millis(100);
/// How long a SQLite write may wait for the file lock before it fails.
const BUSY_TIMEOUT: Duration = Duration::from_secs(2);

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let db = TempDb::new();
    let outcome = run(&db.path).await;
    drop(db); // removes the database files
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(db: &Path) -> Res<()> {
    create_schema(&open(db)?)?;
    println!("ledger: {}\n", db.display());
    let keys: Vec<String> = (1..=BATCH).map(|i| format!("invoice-{i:02}")).collect();

    // ---- Run 1: the batch, and a forced staged close in the middle of it.
    println!(
        "run 1: {BATCH} invoices, max_in_flight({MAX_IN_FLIGHT}); {HANGING:?} hit an upstream that hangs"
    );
    let (ledger, pool) = start(db, 1)?;
    // Beside run 1, on the same (single) async thread: an interval whose
    // worst lateness shows whether anything blocked that thread.
    let (ticking_tx, ticking_rx) = tokio::sync::oneshot::channel::<()>();
    let ticker = tokio::spawn(async move {
        let mut interval = tokio::time::interval(TICK);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut stop = ticking_rx;
        let mut worst = Duration::ZERO;
        let mut ticks = 0u32;
        loop {
            tokio::select! {
                at = interval.tick() => {
                    worst = worst.max(tokio::time::Instant::now() - at);
                    ticks += 1;
                }
                _ = &mut stop => return (worst, ticks),
            }
        }
    });
    let (started_tx, mut started_rx) = mpsc::unbounded_channel();
    let mut handles = Vec::new();
    for key in &keys {
        let hangs = HANGING.contains(&key.as_str());
        let job = Job::new(db, key, 1, hangs.then(|| started_tx.clone()));
        handles.push(pool.offload(move |stop| job.run(stop)).name(key).spawn()?);
    }
    // Gate: both hanging jobs hold the two permits, so everything before
    // them has returned and everything after them is queued.
    for _ in HANGING {
        started_rx
            .recv()
            .await
            .ok_or("a hanging job never started")?;
    }
    let m = pool.metrics();
    println!(
        "  both hanging jobs run: running {}, queued {}, completed {}",
        m.running, m.queued, m.completed
    );
    println!("  pool.close({GRACEFUL:?}, {AFTER_STOP:?}) ...");
    let report = pool.close(GRACEFUL, AFTER_STOP).await;
    println!("  {report}");
    println!(
        "  handed back unstarted: {:?}",
        report
            .unstarted
            .iter()
            .map(|j| j.name.as_deref().unwrap_or("?"))
            .collect::<Vec<_>>()
    );
    check_close(&report, &keys)?;
    for (key, handle) in keys.iter().zip(handles) {
        println!("  {key}: owner sees {}", owner_view(handle.await));
    }
    pool.idle().await; // every event committed to the ledger
    let _ = ticking_tx.send(());
    let (worst, ticks) = ticker.await?;
    let events = pool.metrics().events_delivered;
    println!(
        "  interval beside run 1: {ticks} ticks of {TICK:?}, worst lateness {worst:?}, while the observer committed {events} events with synchronous=FULL"
    );
    if worst > MAX_TICK_LATENESS {
        return Err(
            format!("a tick came {worst:?} late: something blocked the async thread").into(),
        );
    }
    ledger.check()?;
    drop(pool);

    // ---- Restart: a new pool, a new ledger connection; recover.
    let rerun = recover(db, 2, &keys).await?;
    // Expected: the hanging jobs (stopped) and every job queued behind them
    // (handed back unstarted).
    let expected = &keys[first_hanging(&keys)..];
    if rerun != expected {
        return Err(format!("restart re-submitted {rerun:?}, expected {expected:?}").into());
    }

    // ---- Restart again: nothing left; a duplicate delivery does nothing.
    let rerun = recover(db, 3, &keys).await?;
    if !rerun.is_empty() {
        return Err(format!("the second restart re-submitted {rerun:?}").into());
    }
    let (ledger, pool) = start(db, 3)?;
    let duplicate = Job::new(db, &keys[0], 3, None);
    let outcome = pool
        .offload(move |stop| duplicate.run(stop))
        .name(keys[0].clone())
        .await?;
    println!(
        "  duplicate delivery of {} (at-least-once upstream): {outcome:?}",
        keys[0]
    );
    if outcome != Ok(Applied::AlreadyDone) {
        return Err(format!("the duplicate delivery of {} was not a no-op", keys[0]).into());
    }
    pool.close(Duration::from_secs(1), Duration::from_secs(1))
        .await;
    ledger.check()?;

    verify(db, &keys)
}

/// Builds a pool whose observer writes to the ledger as run `run`.
fn start(db: &Path, run: i64) -> Res<(Arc<SqliteLedger>, Offloader)> {
    let ledger = Arc::new(SqliteLedger::open(db, run)?);
    let pool = Offloader::builder()
        .max_in_flight(MAX_IN_FLIGHT)
        .thread_name(format!("ledger-run-{run}"))
        .observer(ledger.clone())
        .build()?;
    Ok((ledger, pool))
}

/// What a restart does: read the ledger, re-submit every job that never
/// finished, wait for them. Returns the keys it re-submitted.
async fn recover(db: &Path, run: i64, batch: &[String]) -> Res<Vec<String>> {
    println!("\nrestart (run {run}): a new Offloader reads the ledger");
    let conn = open(db)?;
    let mut unfinished = conn.prepare(
        "SELECT j.job_key, j.state FROM jobs j LEFT JOIN done d USING (job_key)
         WHERE d.job_key IS NULL ORDER BY j.job_key",
    )?;
    let todo: Vec<(String, String)> = unfinished
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let known: i64 = conn.query_row("SELECT count(*) FROM jobs", [], |r| r.get(0))?;
    if known != batch.len() as i64 {
        return Err(format!(
            "the ledger knows {known} jobs, the batch had {}",
            batch.len()
        )
        .into());
    }
    for (key, state) in &todo {
        println!("  {key}: last ledger state {state:?}, no effect committed -> re-submit");
    }
    println!(
        "  {} of {} jobs never finished; re-submitting exactly those",
        todo.len(),
        batch.len()
    );

    let (ledger, pool) = start(db, run)?;
    let mut handles: Vec<(String, JobHandle<JobResult>)> = Vec::new();
    for (key, _) in &todo {
        let job = Job::new(db, key, run, None);
        let handle = pool.offload(move |stop| job.run(stop)).name(key).spawn()?;
        handles.push((key.clone(), handle));
    }
    for (key, handle) in handles {
        let outcome = handle.await?;
        println!("  {key}: {outcome:?}");
        if outcome != Ok(Applied::Now) {
            return Err(format!("{key}: expected its effect applied now, got {outcome:?}").into());
        }
    }
    let report = pool
        .close(Duration::from_secs(1), Duration::from_secs(1))
        .await;
    if !report.terminated || report.escalated {
        return Err(format!("the recovery pool did not close cleanly: {report}").into());
    }
    ledger.check()?;
    Ok(todo.into_iter().map(|(key, _)| key).collect())
}

// ---------------------------------------------------------------------------
// The ledger: an Observer that writes every transition to SQLite.

/// Writes each job's transitions to the `ledger` table (append-only history)
/// and its latest state to `jobs`, keyed by the job's name.
struct SqliteLedger {
    conn: Mutex<Connection>,
    run: i64,
    started: Instant,
    failed_writes: AtomicUsize,
}

impl SqliteLedger {
    fn open(db: &Path, run: i64) -> Res<Self> {
        Ok(SqliteLedger {
            conn: Mutex::new(open(db)?),
            run,
            started: Instant::now(),
            failed_writes: AtomicUsize::new(0),
        })
    }

    fn record(&self, event: &JobEvent, key: &str) -> rusqlite::Result<()> {
        let (what, state) = match event.kind {
            EventKind::Accepted => ("accepted", Some("accepted")),
            EventKind::Started => ("started", Some("started")),
            // Completed means the function returned, whatever it returned.
            EventKind::Finished(JobState::Completed) => ("returned", Some("returned")),
            EventKind::Finished(JobState::Panicked) => ("panicked", Some("panicked")),
            EventKind::Finished(JobState::Cancelled) => ("cancelled", Some("cancelled")),
            EventKind::Finished(_) => ("finished", Some("finished")),
            EventKind::NeverStarted => ("never started", Some("never started")),
            // The job's state does not change when its caller leaves.
            EventKind::Abandoned { .. } => ("caller left", None),
            _ => ("other", None),
        };
        let at_us = event.at.saturating_duration_since(self.started).as_micros() as i64;
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let tx = conn.transaction()?;
        tx.execute(
            "INSERT INTO ledger (run, job_key, job_id, event, at_us) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![self.run, key, event.id.as_u64() as i64, what, at_us],
        )?;
        if let Some(state) = state {
            tx.execute(
                "INSERT INTO jobs (job_key, state, run) VALUES (?1, ?2, ?3)
                 ON CONFLICT (job_key) DO UPDATE SET state = excluded.state, run = excluded.run",
                params![key, state, self.run],
            )?;
        }
        tx.commit()
    }

    /// Fails if any transition could not be written.
    fn check(&self) -> Res<()> {
        match self.failed_writes.load(Ordering::SeqCst) {
            0 => Ok(()),
            n => Err(format!("{n} ledger writes failed").into()),
        }
    }
}

impl Observer for SqliteLedger {
    fn on_event(&self, event: &JobEvent) {
        // Only jobs with a stable key can be found again after a restart.
        let Some(key) = event.name.as_deref() else {
            return;
        };
        if let Err(e) = self.record(event, key) {
            self.failed_writes.fetch_add(1, Ordering::SeqCst);
            eprintln!("ledger write failed for {key} {:?}: {e}", event.kind);
        }
    }
}

// ---------------------------------------------------------------------------
// The jobs: apply an invoice's effect at most once.

/// What a job did.
#[derive(Debug, PartialEq, Eq)]
enum Applied {
    /// The effect was committed by this run of the job.
    Now,
    /// The effect had already been committed; nothing was done.
    AlreadyDone,
}

/// Why a job returned without its effect.
#[derive(Debug, PartialEq, Eq)]
enum NotApplied {
    /// Stop was requested while it waited on the upstream.
    Stopped,
    /// The database said no.
    Db(String),
}

type JobResult = Result<Applied, NotApplied>;

/// One invoice to apply.
struct Job {
    db: PathBuf,
    key: String,
    run: i64,
    /// `Some` if the upstream hangs for this job: it says "started" here,
    /// then waits until stop is requested.
    hangs: Option<mpsc::UnboundedSender<String>>,
}

impl Job {
    fn new(db: &Path, key: &str, run: i64, hangs: Option<mpsc::UnboundedSender<String>>) -> Self {
        Job {
            db: db.to_owned(),
            key: key.to_owned(),
            run,
            hangs,
        }
    }

    fn run(self, stop: &StopToken) -> JobResult {
        if let Some(started) = &self.hangs {
            let _ = started.send(self.key.clone());
            // The upstream never answers; the token's sleep wakes on stop.
            // No transaction is open while it waits.
            stop.sleep(Duration::from_secs(3600))
                .map_err(|_| NotApplied::Stopped)?;
        }
        self.apply().map_err(|e| NotApplied::Db(e.to_string()))
    }

    /// Checks `done` and writes the effect in one write transaction, so the
    /// effect is applied at most once, however often the job is delivered.
    fn apply(&self) -> rusqlite::Result<Applied> {
        let mut conn = open(&self.db)?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let already: Option<i64> = tx
            .query_row(
                "SELECT run FROM done WHERE job_key = ?1",
                [&self.key],
                |r| r.get(0),
            )
            .optional()?;
        if already.is_some() {
            return Ok(Applied::AlreadyDone); // the transaction rolls back
        }
        // The effect: one row per application, never deduplicated, so a
        // second application would show.
        tx.execute(
            "INSERT INTO effects (job_key, run) VALUES (?1, ?2)",
            params![self.key, self.run],
        )?;
        tx.execute(
            "INSERT INTO done (job_key, run) VALUES (?1, ?2)",
            params![self.key, self.run],
        )?;
        tx.commit()?;
        Ok(Applied::Now)
    }
}

// ---------------------------------------------------------------------------
// Checks and helpers.

fn check_close(report: &CloseReport, keys: &[String]) -> Res<()> {
    let unstarted: Vec<&str> = report
        .unstarted
        .iter()
        .filter_map(|j| j.name.as_deref())
        .collect();
    let queued_behind: Vec<&str> = keys[last_hanging(keys) + 1..]
        .iter()
        .map(String::as_str)
        .collect();
    if !report.escalated || !report.terminated || !report.still_running.is_empty() {
        return Err(format!("expected an escalated close that terminated: {report}").into());
    }
    if unstarted != queued_behind {
        return Err(format!("expected {queued_behind:?} handed back, got {unstarted:?}").into());
    }
    Ok(())
}

fn first_hanging(keys: &[String]) -> usize {
    keys.iter()
        .position(|k| HANGING.contains(&k.as_str()))
        .unwrap_or(keys.len())
}

fn last_hanging(keys: &[String]) -> usize {
    keys.iter()
        .rposition(|k| HANGING.contains(&k.as_str()))
        .unwrap_or(keys.len())
}

fn owner_view(outcome: Result<JobResult, Error>) -> String {
    match outcome {
        Ok(Ok(applied)) => format!("{applied:?}"),
        Ok(Err(not)) => format!("returned without its effect: {not:?}"),
        Err(e) => format!("{e}"),
    }
}

/// The final word: every invoice's effect exists exactly once, and the
/// ledger shows each job's history run by run.
fn verify(db: &Path, keys: &[String]) -> Res<()> {
    let conn = open(db)?;
    println!("\nledger history (run: transitions) and effects:");
    let mut history = conn.prepare(
        "SELECT run, group_concat(event, ' > ') FROM
           (SELECT run, event FROM ledger WHERE job_key = ?1 ORDER BY seq)
         GROUP BY run ORDER BY run",
    )?;
    let mut failures = Vec::new();
    for key in keys {
        let runs: Vec<String> = history
            .query_map([key], |r| {
                Ok(format!(
                    "run {}: {}",
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?
                ))
            })?
            .collect::<Result<_, _>>()?;
        let effects: i64 = conn.query_row(
            "SELECT count(*) FROM effects WHERE job_key = ?1",
            [key],
            |r| r.get(0),
        )?;
        println!("  {key}  effects: {effects}  |  {}", runs.join("  |  "));
        if effects != 1 {
            failures.push(format!("{key} has {effects} effects"));
        }
    }
    let total: i64 = conn.query_row("SELECT count(*) FROM effects", [], |r| r.get(0))?;
    println!(
        "\n{total} effects for {} invoices: every invoice applied exactly once across 3 runs",
        keys.len()
    );
    if !failures.is_empty() || total != keys.len() as i64 {
        return Err(format!("exactly-once violated: {failures:?}, {total} effects").into());
    }
    Ok(())
}

fn open(db: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(db)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    Ok(conn)
}

fn create_schema(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS ledger (
             seq INTEGER PRIMARY KEY, run INTEGER NOT NULL, job_key TEXT NOT NULL,
             job_id INTEGER NOT NULL, event TEXT NOT NULL, at_us INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS jobs (
             job_key TEXT PRIMARY KEY, state TEXT NOT NULL, run INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS done (
             job_key TEXT PRIMARY KEY, run INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS effects (
             job_key TEXT NOT NULL, run INTEGER NOT NULL);",
    )
}

/// A uniquely named database file in the temp dir, removed (with its WAL
/// and shared-memory files) when dropped.
struct TempDb {
    path: PathBuf,
}

impl TempDb {
    fn new() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let name = format!(
            "offloader-durable-ledger-{}-{nanos}.sqlite3",
            std::process::id()
        );
        TempDb {
            path: std::env::temp_dir().join(name),
        }
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut p = self.path.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }
}
