//! A tracing subscriber that offloads a job to the pool from a worker's
//! log line and waits for it: the worker called it with nobody counting on
//! it to look at the queue, even when the level was raised while the
//! finished job ran (hostile review: the worker read the level before the
//! function ran, counted itself as searching, and the subscriber's job
//! woke nobody — a hang at two permits or more).
//!
//! Its own test binary: it installs a process-wide subscriber.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};

use offloader::{Error, Offloader};
use support::{pool, HANG};
use tracing::level_filters::LevelFilter;

/// Whether the subscriber listens (its level: everything, or nothing).
static ON: AtomicBool = AtomicBool::new(false);
/// Set by the first worker event the subscriber acts on.
static ACTED: AtomicBool = AtomicBool::new(false);
/// The pool the subscriber offloads to, and where it reports its wait's
/// outcome.
type Target = (Offloader, mpsc::Sender<Result<u32, Error>>);
static TO: OnceLock<Mutex<Option<Target>>> = OnceLock::new();

fn level() -> LevelFilter {
    if ON.load(Ordering::SeqCst) {
        LevelFilter::TRACE
    } else {
        LevelFilter::OFF
    }
}

/// On the first event a worker emits, offloads a job and waits for it.
fn offload_and_wait() {
    if ACTED.swap(true, Ordering::SeqCst) {
        return;
    }
    let to = TO
        .get()
        .and_then(|t| t.lock().expect("not poisoned").take());
    if let Some((pool, report)) = to {
        let waited = match pool.offload(|_| 1u32).spawn() {
            Ok(mut job) => job.blocking_wait_timeout(HANG),
            Err(refused) => panic!("refused: {:?}", refused.reason()),
        };
        let _ = report.send(waited);
    }
}

#[test]
fn a_subscriber_may_offload_and_wait_after_the_level_rose_during_a_job() {
    support::worker_subscriber::install(level, offload_and_wait);
    let pool = pool(2, 16);
    support::warm(&pool);
    let (report, waited) = mpsc::channel();
    *TO.get_or_init(|| Mutex::new(None))
        .lock()
        .expect("not poisoned") = Some((pool.clone(), report));
    let job = pool
        .offload(|_| {
            // Logging turned up while the job runs (a reload layer would).
            ON.store(true, Ordering::SeqCst);
            tracing::callsite::rebuild_interest_cache();
            7u32
        })
        .spawn()
        .expect("room");
    let waited = waited
        .recv_timeout(HANG * 2)
        .expect("the subscriber's wait ended");
    assert_eq!(waited.ok(), Some(1));
    assert_eq!(job.blocking_wait().ok(), Some(7));
    support::eventually_blocking("the pool idle", || pool.is_idle());
    support::assert_ledger(&pool.metrics());
}
