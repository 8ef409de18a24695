//! One SQLite file, two pools, one writer at a time: a shared `Limiter`.
//!
//! SQLite allows one writer per database file. Two subsystems of a service
//! each have their own pool (`ingest`, four threads; `billing`, two), and
//! both write to the same file. Each write is a blocking rusqlite
//! transaction (`BEGIN IMMEDIATE`, a batch of inserts, `COMMIT`) with no
//! busy timeout, so a second writer inside the file at the same moment
//! fails at once with "database is locked".
//!
//! Round 1 runs the writes without a limiter: the pools' threads collide in
//! the file. Round 2 gives every write `.limiter(&writer)` with
//! `Limiter::new(1)`: a write starts only when it holds a pool permit *and*
//! the one writer permit, which goes back only when its function returns
//! (never with a caller's timeout). Reads, which need no limiter, run on
//! both pools meanwhile.
//!
//! Run with `cargo run --release --example sqlite_single_writer`. Exits with
//! status 1 if round 2 saw a "database is locked" error, two writers in the
//! file at once, a lost row, or a limiter permit still held at the end.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use offloader::{JobHandle, Limiter, Offloader};
use rusqlite::{Connection, ErrorCode, TransactionBehavior};

/// Writes per pool per round, and rows per write.
const WRITES: usize = 40;
const ROWS: usize = 200;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

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

/// What one round saw.
#[derive(Debug, Default)]
struct Seen {
    locked: usize,
    most_writers: usize,
    rows: i64,
    reads: usize,
}

async fn run() -> Res<()> {
    let db = TempDb::new();
    let conn = Connection::open(&db.path)?;
    conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE events (pool TEXT, n INTEGER);")?;
    // Kept open to the end: the last connection to close a WAL database
    // checkpoints it under an exclusive lock, which a writer starting at
    // that moment would meet as "database is locked" — a reader's close,
    // not a second writer. With this one open, no other is ever the last.
    let _keeper = conn;
    let ingest = Offloader::builder()
        .max_in_flight(4)
        .thread_name("ingest")
        .build()?;
    let billing = Offloader::builder()
        .max_in_flight(2)
        .thread_name("billing")
        .build()?;

    let unguarded = round(&db.path, &ingest, &billing, None).await?;
    println!(
        "without a limiter: {} writes failed with \"database is locked\"; up to {} writers in the file at once; {} reads",
        unguarded.locked, unguarded.most_writers, unguarded.reads
    );
    let writer = Limiter::new(1);
    let guarded = round(&db.path, &ingest, &billing, Some(&writer)).await?;
    let stats = writer.stats();
    println!(
        "with Limiter::new(1) shared by both pools: {} writes failed; up to {} writer at once; {} reads; limiter {stats:?}",
        guarded.locked, guarded.most_writers, guarded.reads
    );

    let mut failures = Vec::new();
    if guarded.locked != 0 {
        failures.push(format!("{} writes found the file locked", guarded.locked));
    }
    if guarded.most_writers != 1 || stats.high_water != 1 {
        failures.push(format!(
            "{} writers in the file at once (limiter high-water {})",
            guarded.most_writers, stats.high_water
        ));
    }
    let want = (2 * WRITES * ROWS) as i64;
    if guarded.rows != want {
        failures.push(format!("{} rows written, {want} expected", guarded.rows));
    }
    if stats.in_use != 0 || stats.waiting != 0 {
        failures.push(format!("limiter not idle at the end: {stats:?}"));
    }
    if failures.is_empty() {
        println!("ok: one writer at a time across both pools, every row written");
        Ok(())
    } else {
        Err(failures.join("; ").into())
    }
}

/// Every write (and a read after each) of both pools, with `writer` as
/// the writes' limiter if given. Counts the rows this round wrote.
async fn round(
    path: &Path,
    ingest: &Offloader,
    billing: &Offloader,
    writer: Option<&Limiter>,
) -> Res<Seen> {
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tag = if writer.is_some() {
        "guarded"
    } else {
        "unguarded"
    };
    let mut writes: Vec<JobHandle<Result<(), rusqlite::Error>>> = Vec::new();
    let mut reads = Vec::new();
    for i in 0..WRITES {
        for pool in [ingest, billing] {
            let (file, inside, most) = (path.to_owned(), inside.clone(), most.clone());
            let write = pool.offload(move |_stop| write(&file, tag, &inside, &most));
            let write = match writer {
                Some(l) => write.limiter(l),
                None => write,
            };
            writes.push(write.name(format!("write-{i}")).spawn()?);
            // A read needs no limiter: it runs beside the waiting writes.
            let path = path.to_owned();
            reads.push(pool.offload(move |_stop| count(&path)).spawn()?);
        }
    }
    let mut seen = Seen::default();
    for w in writes {
        match w.await? {
            Ok(()) => {}
            Err(e) if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) => seen.locked += 1,
            Err(e) => return Err(e.into()),
        }
    }
    for r in reads {
        r.await??;
        seen.reads += 1;
    }
    seen.most_writers = most.load(Ordering::SeqCst);
    let conn = Connection::open(path)?;
    seen.rows = conn.query_row("SELECT count(*) FROM events WHERE pool = ?1", [tag], |r| {
        r.get(0)
    })?;
    Ok(seen)
}

/// One write: a transaction of `ROWS` inserts, taken with `BEGIN
/// IMMEDIATE` and no busy timeout (a second writer fails at once). Counts
/// the writers inside the transaction.
fn write(
    path: &Path,
    tag: &str,
    inside: &AtomicUsize,
    most: &AtomicUsize,
) -> Result<(), rusqlite::Error> {
    let mut conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::ZERO)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
    most.fetch_max(now, Ordering::SeqCst);
    let wrote = (|| {
        let mut insert = tx.prepare_cached("INSERT INTO events (pool, n) VALUES (?1, ?2)")?;
        for n in 0..ROWS {
            insert.execute(rusqlite::params![tag, n as i64])?;
        }
        Ok::<_, rusqlite::Error>(())
    })();
    inside.fetch_sub(1, Ordering::SeqCst);
    wrote?;
    tx.commit()
}

/// One read (WAL readers never wait for the writer).
fn count(path: &Path) -> Result<i64, rusqlite::Error> {
    let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    conn.query_row("SELECT count(*) FROM events", [], |r| r.get(0))
}

/// A database file in the temp directory, removed at the end.
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
            "offloader-single-writer-{}-{nanos}.sqlite3",
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
