//! A stop token reaching into a real blocking library: SQLite's interrupt.
//!
//! One long query (a recursive CTE that counts about a second's worth of
//! rows) is run twice, each time by a caller that gives up after 200 ms:
//!
//! ```text
//! (a) Offloader, with_timeout(200 ms), AbandonPolicy::CancelAndStop
//! caller:   offload(query) ─ timeout! → stop requested → on_stop: interrupt()
//! worker:   query ──────────────────────┤ SQLITE_INTERRUPT, returns; permit back
//! next job:                   queued ───┴ starts
//!
//! (b) tokio::task::spawn_blocking + tokio::time::timeout (+ JoinHandle::abort)
//! caller:   spawn_blocking(query) ─ timeout! ─ abort() (does nothing)
//! thread:   query ──────────────────────────────────────────── runs to the end
//! ```
//!
//! In (a) the function registers `conn.get_interrupt_handle().interrupt()`
//! with [`StopToken::on_stop`] and keeps the returned guard alive for as long
//! as the query runs. When the caller's timeout passes, the
//! `CancelAndStop` policy requests stop, the callback interrupts the
//! connection, and the query ends with SQLite's interrupt error. The example
//! prints how long after the timeout the function really returned and when
//! its permit came back (the next job started, `metrics().running`,
//! `running_jobs()`, `idle().await`).
//!
//! In (b) nothing reaches into the query: it runs to its end on a thread
//! nobody waits for, and `JoinHandle::abort` has no effect on a blocking
//! task that has started.
//!
//! One SQLite detail worth knowing: `sqlite3_interrupt` only affects
//! statements that are running. A statement that starts while no other
//! statement runs on the connection clears a pending interrupt. So the
//! function checks the token after registering the callback and right
//! before the query; a stop that lands in the instant between that check and
//! SQLite's first step would let the query run to its end. If that matters,
//! rusqlite's `hooks` feature has `progress_handler`, which can poll
//! `stop.is_stopped()` from inside the VM loop.
//!
//! Run with `cargo run --release --example sqlite_interrupt`. Exits with
//! status 1 if (a) was not interrupted, returned late, or gave its permit
//! back before the function returned, or if (b) did not run to its end.

use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use offloader::{AbandonPolicy, Error, Fate, Offloader, StopToken};
use rusqlite::{Connection, ErrorCode};

/// How long each caller waits for the query.
const CALLER_TIMEOUT: Duration = Duration::from_millis(200);

/// How long the query should run when nobody interrupts it.
const QUERY_RUNS_FOR: Duration = Duration::from_secs(1);

/// The interrupted query must return within this much after the timeout.
/// Generous on purpose: interruption takes microseconds; the point is that
/// it is nowhere near the rest of the query's second.
const RETURN_BUDGET: Duration = Duration::from_millis(150);

/// Counts `?1` rows generated one by one by a recursive CTE: pure VM work
/// inside a single `sqlite3_step`, which nothing outside SQLite can pause.
const QUERY: &str = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < ?1) \
                     SELECT count(*) FROM c";

fn count_rows(conn: &Connection, rows: i64) -> rusqlite::Result<i64> {
    conn.query_row(QUERY, [rows], |row| row.get(0))
}

/// What the blocking function reports about itself, sent over a channel
/// because in both scenarios its caller has left by the time it returns.
struct Report {
    result: rusqlite::Result<i64>,
    started: Instant,
    returned: Instant,
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

async fn run() -> Res<()> {
    let rows = tokio::task::spawn_blocking(calibrate).await??;
    println!(
        "The query: a recursive CTE counting {rows} rows (calibrated to run about {QUERY_RUNS_FOR:?} on this machine); \
         each caller waits at most {CALLER_TIMEOUT:?}.\n"
    );

    println!("(a) Offloader, with_timeout({CALLER_TIMEOUT:?}), AbandonPolicy::CancelAndStop, on_stop → interrupt()");
    let a = with_offloader(rows).await?;
    println!();
    println!("(b) tokio::task::spawn_blocking + tokio::time::timeout({CALLER_TIMEOUT:?})");
    let b = with_spawn_blocking(rows).await?;

    println!();
    println!(
        "offloader + CancelAndStop: the function returned {:.1} ms after the timeout (interrupted); \
         its permit came back {:.1} ms after the timeout",
        ms(a.returned_after),
        ms(a.permit_back_after)
    );
    println!(
        "spawn_blocking + timeout:  the function returned {:.1} ms after the timeout (ran to the end)",
        ms(b)
    );
    Ok(())
}

/// Finds how many rows the CTE counts in about [`QUERY_RUNS_FOR`] on this
/// machine, so the example stays short everywhere.
fn calibrate() -> Res<i64> {
    let conn = Connection::open_in_memory()?;
    let probe: i64 = 300_000;
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        count_rows(&conn, probe)?;
        best = best.min(t.elapsed());
    }
    let per_row = best.as_secs_f64() / probe as f64;
    let rows = (QUERY_RUNS_FOR.as_secs_f64() / per_row.max(1e-9)) as i64;
    Ok(rows.clamp(probe, 2_000_000_000))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Lines stamped with the instant they describe, printed in time order
/// (the function's own reports arrive after the caller's lines).
struct Timeline {
    t0: Instant,
    lines: Vec<(Instant, String)>,
}

impl Timeline {
    fn new() -> Self {
        Timeline {
            t0: Instant::now(),
            lines: Vec::new(),
        }
    }

    fn at(&mut self, when: Instant, line: impl Into<String>) {
        self.lines.push((when, line.into()));
    }

    fn print(mut self) {
        self.lines.sort_by_key(|(when, _)| *when);
        for (when, line) in self.lines {
            let ms = when.saturating_duration_since(self.t0).as_secs_f64() * 1e3;
            println!("  [{ms:>7.1} ms] {line}");
        }
    }
}

/// How a query's result reads in the timeline.
fn describe(result: &rusqlite::Result<i64>) -> String {
    match result {
        Ok(n) => format!("Ok({n})"),
        Err(e) => match e.sqlite_error_code() {
            Some(code) => format!("Err({code:?}: {e})"),
            None => format!("Err({e})"),
        },
    }
}

struct Timings {
    returned_after: Duration,
    permit_back_after: Duration,
}

/// (a) The query as an offloaded job whose stop token interrupts it.
async fn with_offloader(rows: i64) -> Res<Timings> {
    let pool = Offloader::builder()
        .max_in_flight(1)
        .thread_name("sqlite")
        .build()?;
    let mut log = Timeline::new();

    let (report_tx, mut report_rx) = tokio::sync::mpsc::unbounded_channel();
    let interrupted_at = Arc::new(OnceLock::new());
    let marker = interrupted_at.clone();
    let outcome = pool
        .offload(move |stop: &StopToken| {
            let started = Instant::now();
            let result = (|| {
                let conn = Connection::open_in_memory()?;
                let handle = conn.get_interrupt_handle();
                // Keep the guard for as long as the query runs: dropping it
                // unregisters the callback (and waits for it if it is running
                // on another thread right now).
                let _interrupt = stop.on_stop(move || {
                    let _ = marker.set(Instant::now());
                    handle.interrupt();
                });
                if stop.is_stopped() {
                    // Stopped before the query began: SQLite would not see an
                    // interrupt sent now (see the module docs).
                    return Err(rusqlite::Error::SqliteFailure(
                        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_INTERRUPT),
                        Some("stopped before the query started".into()),
                    ));
                }
                count_rows(&conn, rows)
            })();
            let returned = Instant::now();
            let _ = report_tx.send(Report {
                result,
                started,
                returned,
            });
        })
        .name("big-cte")
        .with_timeout(CALLER_TIMEOUT)
        .on_abandon(AbandonPolicy::CancelAndStop)
        .await;
    let timed_out = Instant::now();

    // The caller's view: the wait ended; the error says what became of the job.
    let err = match outcome {
        Err(e) => e,
        Ok(()) => return Err("the query finished before the caller's timeout".into()),
    };
    log.at(timed_out, format!("caller: {err}"));
    if !matches!(
        err,
        Error::TimedOut {
            fate: Fate::StopRequested,
            ..
        }
    ) {
        return Err(format!("expected a time-out with stop requested, got: {err}").into());
    }
    if let Some(i) = interrupted_at.get() {
        log.at(
            *i,
            "on_stop callback: conn interrupt handle's interrupt() called, on the caller's thread",
        );
    }

    // What the pool says right after the timeout. The interrupt was sent
    // before the error above was returned, so the query may already have
    // ended; whatever the snapshot says, it is consistent.
    let m = pool.metrics();
    let running: Vec<String> = pool
        .running_jobs()
        .iter()
        .map(|j| {
            format!(
                "job {} {:?}, running for {:.1?}, stop requested: {}",
                j.id,
                j.name.as_deref().unwrap_or(""),
                j.running_for,
                j.stop_requested
            )
        })
        .collect();
    log.at(
        Instant::now(),
        format!(
            "pool right after the timeout: metrics().running = {}, running_jobs() = {running:?}",
            m.running
        ),
    );

    // The next job needs the only permit: it starts when the query has
    // returned, not when the caller left.
    let next = pool
        .offload(|_stop| Instant::now())
        .name("next-query")
        .spawn()?;
    pool.idle().await;
    let idle_at = Instant::now();
    let next_started = next.await?;
    let m = pool.metrics();

    let report = report_rx
        .recv()
        .await
        .ok_or("the offloaded function sent no report")?;
    log.at(report.started, "function: the query started");
    log.at(
        report.returned,
        format!("function: the query returned {}", describe(&report.result)),
    );
    log.at(next_started, "next job started: the permit came back");
    log.at(
        idle_at,
        format!(
            "idle().await returned: metrics().running = {}, completed = {}, stop_requests = {}, running_jobs() = {:?}",
            m.running,
            m.completed,
            m.stop_requests,
            pool.running_jobs()
        ),
    );
    log.print();

    let interrupted = matches!(
        &report.result,
        Err(e) if e.sqlite_error_code() == Some(ErrorCode::OperationInterrupted)
    );
    if !interrupted {
        return Err(format!(
            "the query was not interrupted: {}",
            describe(&report.result)
        )
        .into());
    }
    let returned_after = report.returned.saturating_duration_since(timed_out);
    if report.returned > timed_out + RETURN_BUDGET {
        return Err(format!(
            "the interrupted query returned {returned_after:?} after the timeout (budget {RETURN_BUDGET:?})"
        )
        .into());
    }
    if next_started < report.returned {
        return Err(
            "the next job started before the query had returned: permit released early".into(),
        );
    }
    if m.running != 0 || m.accepted != m.queued + m.running + m.terminal() {
        return Err(format!("unexpected metrics after idle(): {m:?}").into());
    }
    Ok(Timings {
        returned_after,
        permit_back_after: next_started.saturating_duration_since(timed_out),
    })
}

/// (b) The same query through `spawn_blocking`, with a timeout and even an
/// explicit `abort()`: nothing reaches into it.
async fn with_spawn_blocking(rows: i64) -> Res<Duration> {
    let mut log = Timeline::new();
    let (report_tx, report_rx) = tokio::sync::oneshot::channel();
    let mut task = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let result = Connection::open_in_memory().and_then(|conn| count_rows(&conn, rows));
        let _ = report_tx.send(Report {
            result,
            started,
            returned: Instant::now(),
        });
    });
    let waited = tokio::time::timeout(CALLER_TIMEOUT, &mut task).await;
    let timed_out = Instant::now();
    if waited.is_ok() {
        return Err("the query finished before the caller's timeout".into());
    }
    log.at(
        timed_out,
        "caller: tokio::time::timeout elapsed; JoinHandle::abort() called",
    );
    task.abort();

    let report = report_rx.await?;
    log.at(report.started, "function: the query started");
    log.at(
        report.returned,
        format!(
            "function: the query returned {}: it ran to the end",
            describe(&report.result)
        ),
    );
    let joined = task.await;
    log.at(
        Instant::now(),
        match &joined {
            Ok(()) => {
                "JoinHandle resolved Ok(()): abort() had no effect on a started blocking task"
                    .to_string()
            }
            Err(e) => format!("JoinHandle resolved Err({e})"),
        },
    );
    log.print();
    match report.result {
        Ok(n) if n == rows => Ok(report.returned.saturating_duration_since(timed_out)),
        other => Err(format!(
            "expected the unstoppable query to count {rows} rows, got {}",
            describe(&other)
        )
        .into()),
    }
}
