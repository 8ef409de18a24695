//! The service this crate is for: an HTTP endpoint whose handler runs a
//! blocking SQLite query, under a concurrency limit and a per-request
//! timeout.
//!
//! - `GET /q` runs one query (a recursive CTE calibrated at startup to take
//!   about `--query-ms` milliseconds, 20 by default) and answers 200 with
//!   its result, or 503 when the query could not be answered within
//!   `--timeout-ms` (100 by default). Four queries at a time is the
//!   database's budget.
//! - `GET /stats` answers JSON: queries running now and the most ever
//!   running at once (counted around the real SQLite call), queries
//!   started, finished and interrupted, the process's threads and memory,
//!   the pool's `Metrics` in the offloader variant, and the handler's own
//!   time for its 503s by cause (refused at admission, shed at its turn,
//!   timed out): count, p50, p99 and max in milliseconds.
//! - `GET /metrics` answers the Prometheus text format, through the
//!   `metrics` facade and `metrics-exporter-prometheus`: the pool's metrics
//!   (`Metrics::publish`, feature `metrics`) and the query counters.
//!
//! Two ways to hold the limit:
//!
//! ```text
//! default, the natural way with offloader:
//!   pool.offload(query).with_timeout(timeout).on_abandon(CancelAndStop).await
//!   the job holds its permit while SQLite runs; at the timeout a queued job
//!   is cancelled and a running one is stopped: its stop token calls the
//!   connection's interrupt handle, and the permit comes back when SQLite
//!   has returned
//!
//! --naive: Semaphore(4) + spawn_blocking + tokio::time::timeout
//!   the permit lives in the handler's future: at the timeout it is released
//!   while the query goes on, so the next request starts another one
//! ```
//!
//! Each thread that runs queries keeps one SQLite connection (in memory),
//! opened on its first query: the offloader's worker threads are reused,
//! so the default variant has at most four; the naive variant has one per
//! blocking thread tokio spawned. On its first query each such thread also
//! puts itself under Linux's `SCHED_IDLE` policy (both variants), so that
//! the runtime's threads, which answer HTTP, never wait for a CPU behind a
//! query: measured in `benches/service`, the p99 of the 503s at three times
//! the capacity falls from 7–60 ms to about 4 ms (a refusal itself takes
//! about 10 µs in the handler), and the 200s come sooner too
//! (`docs/perf/history/2026-12-06-order-b-503.md`).
//!
//! Run it with `cargo run --release --example service` (then
//! `curl localhost:3000/q`, `/stats`, `/metrics`). Options:
//!
//! - `--addr ADDR` (default `127.0.0.1:3000`);
//! - `--naive`: the `Semaphore` + `spawn_blocking` + `timeout` handler;
//! - `--timeout-ms N`: the per-request timeout (default 100);
//! - `--query-ms N`: how long one query should take on this machine, alone
//!   (default 20; calibrated at startup);
//! - `--rows N`: how many rows the query counts, instead of calibrating (the
//!   benchmark calibrates once and starts every server with the same
//!   query);
//! - `--no-idle-db`: the threads that run queries keep the default
//!   scheduling policy;
//! - `--self-check`: what CI runs. Binds `127.0.0.1:0`, sends a few dozen
//!   requests over TCP from eight concurrent connections (twice the limit)
//!   with a 2 s timeout unless `--timeout-ms` says otherwise, and exits
//!   with status 1 unless every answer is 200, at most four queries ran at
//!   once, and `/stats` and `/metrics` answer with the pool's metrics.
//!
//! `benches/service/run.sh` drives both variants with a real load generator
//! at several offered loads; its results are in `docs/perf/`.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use offloader::{AbandonPolicy, Offloader, StopToken};
use rusqlite::{Connection, ErrorCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// The database's budget: queries that may run at once, in both variants.
const LIMIT: usize = 4;

/// Counts `?1` rows generated one by one by a recursive CTE: CPU work inside
/// one `sqlite3_step`, which only SQLite's interrupt can end early.
const QUERY: &str = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < ?1) \
                     SELECT count(*) FROM c";

/// The name of the pool in `/metrics`.
const POOL: &str = "db";

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

struct Args {
    addr: SocketAddr,
    naive: bool,
    timeout: Option<Duration>,
    query_ms: u64,
    rows: Option<i64>,
    self_check: bool,
    idle_db: bool,
}

fn parse_args() -> Res<Args> {
    let mut args = Args {
        addr: "127.0.0.1:3000".parse()?,
        naive: false,
        timeout: None,
        query_ms: 20,
        rows: None,
        self_check: false,
        idle_db: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--addr" => args.addr = value()?.parse()?,
            "--naive" => args.naive = true,
            "--timeout-ms" => args.timeout = Some(Duration::from_millis(value()?.parse()?)),
            "--query-ms" => args.query_ms = value()?.parse()?,
            "--rows" => args.rows = Some(value()?.parse()?),
            "--self-check" => args.self_check = true,
            "--no-idle-db" => args.idle_db = false,
            other => {
                return Err(format!(
                    "unknown argument {other:?}; usage: service [--addr ADDR] [--naive] \
                     [--timeout-ms N] [--query-ms N] [--rows N] [--no-idle-db] [--self-check]"
                )
                .into())
            }
        }
    }
    Ok(args)
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

async fn run() -> Res<()> {
    let args = parse_args()?;
    let rows = match args.rows {
        Some(rows) => rows,
        None => {
            let target = Duration::from_millis(args.query_ms);
            tokio::task::spawn_blocking(move || calibrate(target)).await??
        }
    };
    let timeout = args.timeout.unwrap_or(if args.self_check {
        // Generous: the check must not flake on a loaded CI machine.
        Duration::from_secs(2)
    } else {
        Duration::from_millis(100)
    });
    let app = Arc::new(App {
        db: Arc::new(Db::new(rows, args.idle_db)),
        timeout,
        naive: args.naive,
        pool: Offloader::builder()
            .max_in_flight(LIMIT)
            .queue_capacity(64)
            .thread_name("db")
            .build()?,
        semaphore: Semaphore::new(LIMIT),
        prometheus: PrometheusBuilder::new().install_recorder()?,
    });
    let router = Router::new()
        .route(
            "/q",
            if args.naive {
                get(query_naive)
            } else {
                get(query)
            },
        )
        .route("/stats", get(stats))
        .route("/metrics", get(metrics))
        .with_state(app.clone());

    let addr = if args.self_check {
        SocketAddr::from(([127, 0, 0, 1], 0))
    } else {
        args.addr
    };
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    println!(
        "service ({}): limit {LIMIT}, timeout {timeout:?}, query of {rows} rows; listening on http://{addr}",
        if args.naive {
            "naive: Semaphore + spawn_blocking + timeout"
        } else {
            "offloader"
        },
    );

    if !args.self_check {
        axum::serve(listener, router)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
        // Staged: queued queries still run for a second, then running ones
        // are interrupted.
        let report = app
            .pool
            .close(Duration::from_secs(1), Duration::from_secs(1))
            .await;
        println!("pool closed: {report:?}");
        return Ok(());
    }

    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let checked = tokio::time::timeout(Duration::from_secs(60), self_check(addr, &app)).await;
    server.abort();
    match checked {
        Ok(result) => result,
        Err(_) => Err("the self-check did not finish within 60 s".into()),
    }
}

/// Finds how many rows the CTE counts in about `target` on this machine,
/// alone on one thread (best of three probes).
fn calibrate(target: Duration) -> Res<i64> {
    let conn = Connection::open_in_memory()?;
    let probe: i64 = 200_000;
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        count_rows(&conn, probe)?;
        best = best.min(t.elapsed());
    }
    let per_row = best.as_secs_f64() / probe as f64;
    Ok(((target.as_secs_f64() / per_row.max(1e-12)) as i64).max(1))
}

fn count_rows(conn: &Connection, rows: i64) -> rusqlite::Result<i64> {
    conn.query_row(QUERY, [rows], |row| row.get(0))
}

struct App {
    db: Arc<Db>,
    timeout: Duration,
    naive: bool,
    /// The default variant's limit.
    pool: Offloader,
    /// The naive variant's limit.
    semaphore: Semaphore,
    prometheus: PrometheusHandle,
}

/// The database: the query and the counters kept around its real SQLite
/// call, in both variants.
struct Db {
    rows: i64,
    running: AtomicU64,
    max_running: AtomicU64,
    started: AtomicU64,
    finished: AtomicU64,
    interrupted: AtomicU64,
    failed: AtomicU64,
    /// Stopped after the function began but before its query did.
    stopped_before_query: AtomicU64,
    /// Each thread that runs queries puts itself under `SCHED_IDLE` on its
    /// first query (unless `--no-idle-db`).
    idle: bool,
    /// The handler's own time for each 503 (the first million), in
    /// microseconds, by cause.
    unavailable: std::sync::Mutex<Vec<(Cause, u32)>>,
}

/// Why a request was answered 503.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cause {
    /// Refused at admission (`Overloaded` without an id, or `Full`).
    Refused,
    /// Shed at its turn (`Overloaded` with an id).
    Shed,
    /// The caller's timeout.
    Timeout,
    /// Anything else (shutdown).
    Other,
}

impl Cause {
    const ALL: [(Cause, &'static str); 4] = [
        (Cause::Refused, "refused"),
        (Cause::Shed, "shed"),
        (Cause::Timeout, "timeout"),
        (Cause::Other, "other"),
    ];

    fn of(e: &offloader::Error) -> Self {
        match e {
            offloader::Error::Overloaded { id: Some(_) } => Cause::Shed,
            _ if e.is_busy() => Cause::Refused,
            _ if e.is_timeout() => Cause::Timeout,
            _ => Cause::Other,
        }
    }
}

thread_local! {
    /// This thread's connection, opened on its first query.
    static CONN: RefCell<Option<Connection>> = const { RefCell::new(None) };
}

impl Db {
    fn new(rows: i64, idle: bool) -> Self {
        Db {
            rows,
            running: AtomicU64::new(0),
            max_running: AtomicU64::new(0),
            started: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            interrupted: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            stopped_before_query: AtomicU64::new(0),
            idle,
            unavailable: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn record_unavailable(&self, cause: Cause, began: Instant) {
        let us = u32::try_from(began.elapsed().as_micros()).unwrap_or(u32::MAX);
        if let Ok(mut v) = self.unavailable.lock() {
            // Bounded: the first million 503s (8 MB) are enough for a run.
            if v.len() < 1 << 20 {
                v.push((cause, us));
            }
        }
    }

    /// Per cause: count, p50, p99, max of the handler's time of the 503s,
    /// in milliseconds, as JSON.
    fn unavailable_json(&self) -> String {
        let all = self
            .unavailable
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default();
        let parts: Vec<String> = Cause::ALL
            .iter()
            .map(|(cause, name)| {
                let mut us: Vec<u32> = all
                    .iter()
                    .filter(|(c, _)| c == cause)
                    .map(|(_, t)| *t)
                    .collect();
                us.sort_unstable();
                let q = |p: f64| {
                    if us.is_empty() {
                        0.0
                    } else {
                        let i = ((p * us.len() as f64).ceil() as usize).clamp(1, us.len()) - 1;
                        f64::from(us[i]) / 1e3
                    }
                };
                format!(
                    "\"{name}\": [{}, {:.3}, {:.3}, {:.3}]",
                    us.len(),
                    q(0.5),
                    q(0.99),
                    q(1.0)
                )
            })
            .collect();
        format!("{{{}}}", parts.join(", "))
    }

    /// Puts this thread under `SCHED_IDLE`, once per thread (Linux): the
    /// queries are CPU-bound and run in the time the threads that answer
    /// HTTP do not need, so that a request the pool refuses at once is
    /// answered at once, not after a query's time slice. Under the
    /// default policy a woken runtime worker waits for a CPU behind four
    /// running queries on two cores (milliseconds); a normal thread waking
    /// preempts an idle-policy one at once. The price: any other busy
    /// process on the machine also comes before the queries.
    fn lower_this_thread(&self) {
        thread_local! {
            static LOWERED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        }
        if !self.idle || LOWERED.with(|l| l.replace(true)) {
            return;
        }
        #[cfg(target_os = "linux")]
        {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: pid 0 is the calling thread; `param` is a valid
            // sched_param that outlives the call.
            let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
            if r != 0 {
                eprintln!(
                    "sched_setscheduler(SCHED_IDLE): {}",
                    std::io::Error::last_os_error()
                );
            }
        }
    }

    /// Runs the query on this thread's connection. With a stop token, a
    /// stop request interrupts it (SQLite's interrupt handle).
    fn query(&self, stop: Option<&StopToken>) -> rusqlite::Result<i64> {
        self.lower_this_thread();
        CONN.with(|cell| {
            let mut cell = cell.borrow_mut();
            let conn = match &mut *cell {
                Some(conn) => conn,
                empty => empty.insert(Connection::open_in_memory()?),
            };
            // Kept for as long as the query runs: dropping it unregisters
            // the callback.
            let _interrupt = stop.map(|stop| {
                let handle = conn.get_interrupt_handle();
                stop.on_stop(move || handle.interrupt())
            });
            if stop.is_some_and(StopToken::is_stopped) {
                // An interrupt sent before the query starts is not seen
                // by SQLite (see examples/sqlite_interrupt.rs).
                self.stopped_before_query.fetch_add(1, Ordering::Relaxed);
                return Err(interrupted());
            }
            self.run(conn)
        })
    }

    fn run(&self, conn: &Connection) -> rusqlite::Result<i64> {
        self.started.fetch_add(1, Ordering::Relaxed);
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_running.fetch_max(now, Ordering::SeqCst);
        let result = count_rows(conn, self.rows);
        self.running.fetch_sub(1, Ordering::SeqCst);
        let outcome = match &result {
            Ok(_) => &self.finished,
            Err(e) if e.sqlite_error_code() == Some(ErrorCode::OperationInterrupted) => {
                &self.interrupted
            }
            Err(_) => &self.failed,
        };
        outcome.fetch_add(1, Ordering::Relaxed);
        result
    }
}

fn interrupted() -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_INTERRUPT),
        Some("stopped before the query started".into()),
    )
}

/// `GET /q`, the natural way: the pool holds the limit, the caller's
/// timeout cancels a queued query and interrupts a running one.
async fn query(State(app): State<Arc<App>>) -> Response {
    let began = Instant::now();
    let db = app.db.clone();
    let result = app
        .pool
        .offload(move |stop: &StopToken| db.query(Some(stop)))
        .with_timeout(app.timeout)
        .on_abandon(AbandonPolicy::CancelAndStop)
        .await;
    match result {
        Ok(Ok(n)) => (StatusCode::OK, format!("{n}\n")).into_response(),
        Ok(Err(e)) => internal_error(e),
        Err(e) if e.is_busy() || e.is_timeout() || e.is_shutdown() => {
            app.db.record_unavailable(Cause::of(&e), began);
            unavailable(e)
        }
        Err(e) => internal_error(e),
    }
}

/// `GET /q --naive`: a semaphore held by the handler's future, released at
/// the timeout while the query goes on.
async fn query_naive(State(app): State<Arc<App>>) -> Response {
    let began = Instant::now();
    let db = app.db.clone();
    let work = async {
        let _permit = app.semaphore.acquire().await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(
            tokio::task::spawn_blocking(move || db.query(None)).await??,
        )
    };
    match tokio::time::timeout(app.timeout, work).await {
        Ok(Ok(n)) => (StatusCode::OK, format!("{n}\n")).into_response(),
        Ok(Err(e)) => internal_error(e),
        Err(elapsed) => {
            app.db.record_unavailable(Cause::Timeout, began);
            unavailable(elapsed)
        }
    }
}

fn unavailable(e: impl std::fmt::Display) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, "1")],
        format!("{e}\n"),
    )
        .into_response()
}

fn internal_error(e: impl std::fmt::Display) -> Response {
    (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response()
}

/// `GET /stats`: JSON, written by hand (numbers, and the pool's metrics as
/// their `Debug` text, which has no quotes or backslashes to escape).
async fn stats(State(app): State<Arc<App>>) -> Response {
    let db = &app.db;
    let n = |c: &AtomicU64| c.load(Ordering::SeqCst);
    let (rss_kb, rss_peak_kb) = memory_kb();
    let pool = if app.naive {
        "null".to_owned()
    } else {
        format!("\"{:?}\"", app.pool.metrics())
    };
    let body = format!(
        concat!(
            "{{\"variant\": \"{}\", \"limit\": {}, \"timeout_ms\": {}, \"rows\": {}, ",
            "\"running\": {}, \"max_running\": {}, \"started\": {}, \"finished\": {}, ",
            "\"interrupted\": {}, \"failed\": {}, \"stopped_before_query\": {}, ",
            "\"threads\": {}, \"rss_kb\": {}, \"rss_peak_kb\": {}, \"pool\": {}, ",
            "\"handler_503_ms\": {}}}\n"
        ),
        if app.naive { "naive" } else { "offloader" },
        LIMIT,
        app.timeout.as_millis(),
        db.rows,
        n(&db.running),
        n(&db.max_running),
        n(&db.started),
        n(&db.finished),
        n(&db.interrupted),
        n(&db.failed),
        n(&db.stopped_before_query),
        threads(),
        rss_kb,
        rss_peak_kb,
        pool,
        db.unavailable_json(),
    );
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// `GET /metrics`: the Prometheus text format.
async fn metrics(State(app): State<Arc<App>>) -> Response {
    if !app.naive {
        app.pool.metrics().publish(POOL);
    }
    let db = &app.db;
    let n = |c: &AtomicU64| c.load(Ordering::SeqCst);
    metrics::gauge!("db_queries_running").set(n(&db.running) as f64);
    metrics::gauge!("db_queries_max_running").set(n(&db.max_running) as f64);
    metrics::counter!("db_queries_started_total").absolute(n(&db.started));
    metrics::counter!("db_queries_finished_total").absolute(n(&db.finished));
    metrics::counter!("db_queries_interrupted_total").absolute(n(&db.interrupted));
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.prometheus.render(),
    )
        .into_response()
}

/// Threads of this process now.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

/// (VmRSS, VmHWM) of this process in KiB: resident memory now and at most.
fn memory_kb() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Eight connections (twice the limit), six requests each, then `/stats`
/// and `/metrics`: every answer 200, the limit held, the pool's metrics
/// published.
async fn self_check(addr: SocketAddr, app: &App) -> Res<()> {
    const CLIENTS: usize = 2 * LIMIT;
    const EACH: usize = 6;
    let started = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for _ in 0..EACH {
                    statuses.push(http_get(addr, "/q").await?.0);
                }
                Res::Ok(statuses)
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for client in clients {
        statuses.extend(client.await??);
    }
    let elapsed = started.elapsed();
    let mut problems = Vec::new();
    let not_ok = statuses.iter().filter(|&&s| s != 200).count();
    if not_ok > 0 {
        let mut seen = statuses.clone();
        seen.sort_unstable();
        seen.dedup();
        let counts: Vec<String> = seen
            .iter()
            .map(|s| format!("{} × {s}", statuses.iter().filter(|&x| x == s).count()))
            .collect();
        problems.push(format!(
            "{not_ok} of {} answers were not 200: {}",
            statuses.len(),
            counts.join(", ")
        ));
    }

    let (status, stats) = http_get(addr, "/stats").await?;
    let field = |name: &str| -> Option<u64> {
        let rest = stats.split(&format!("\"{name}\": ")).nth(1)?;
        rest.split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    let max_running = field("max_running");
    let finished = field("finished");
    if status != 200 {
        problems.push(format!("/stats answered {status}"));
    }
    match max_running {
        Some(m) if (1..=LIMIT as u64).contains(&m) => {}
        other => problems.push(format!(
            "/stats: max_running {other:?}, expected 1..={LIMIT}"
        )),
    }
    let pool = app.pool.metrics();
    if !app.naive && pool.max_running > LIMIT as u64 {
        problems.push(format!("the pool's max_running is {}", pool.max_running));
    }

    let (status, text) = http_get(addr, "/metrics").await?;
    if status != 200 {
        problems.push(format!("/metrics answered {status}"));
    }
    let completed = format!(
        "offloader_completed_total{{pool=\"{POOL}\"}} {}",
        statuses.len()
    );
    let mut wanted = vec!["db_queries_finished_total"];
    if !app.naive {
        wanted.extend([
            completed.as_str(),
            "# TYPE offloader_running gauge",
            "offloader_max_running{pool=\"db\"}",
        ]);
    }
    for wanted in wanted {
        if !text.contains(wanted) {
            problems.push(format!("/metrics does not show {wanted:?}"));
        }
    }

    println!(
        "self-check: {} requests from {CLIENTS} connections in {elapsed:.2?}: {} answered 200; \
         most queries at once {max_running:?} (limit {LIMIT}), finished {finished:?}; pool: {pool:?}",
        statuses.len(),
        statuses.len() - not_ok,
    );
    if problems.is_empty() {
        println!("self-check passed");
        Ok(())
    } else {
        Err(format!("self-check failed:\n  {}", problems.join("\n  ")).into())
    }
}

/// One HTTP/1.1 GET on its own connection: (status, body).
async fn http_get(addr: SocketAddr, path: &str) -> Res<(u16, String)> {
    let mut stream = TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no end of headers in {answer:?}"))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    Ok((status, body.to_owned()))
}
