//! A tracing subscriber that waits, on a worker's log line, for a job
//! another thread offloads meanwhile: the worker called it with nobody
//! counting on it to look at the queue, even when the level was raised
//! while the finished job ran (hostile review: the worker read the level
//! before the function ran, counted itself as searching, and the job
//! woke nobody — a hang at two permits or more). (A job the subscriber
//! offloads itself would un-count the worker through its mark.)
//!
//! Its own test binary: it installs a process-wide subscriber.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};

use support::{pool, IsIdle, HANG};
use tracing::level_filters::LevelFilter;

/// Whether the subscriber listens (its level: everything, or nothing).
static ON: AtomicBool = AtomicBool::new(false);
/// Set by the first worker event the subscriber acts on.
static ACTED: AtomicBool = AtomicBool::new(false);
/// Where the subscriber says it waits, the value it waits for, and where
/// it reports what it got.
type Target = (
    mpsc::Sender<()>,
    mpsc::Receiver<u32>,
    mpsc::Sender<Option<u32>>,
);
static TO: OnceLock<Mutex<Option<Target>>> = OnceLock::new();

fn level() -> LevelFilter {
    if ON.load(Ordering::SeqCst) {
        LevelFilter::TRACE
    } else {
        LevelFilter::OFF
    }
}

/// On the first event a worker emits, waits for a value a job sends.
fn wait_for_another_job() {
    if ACTED.swap(true, Ordering::SeqCst) {
        return;
    }
    let to = TO
        .get()
        .and_then(|t| t.lock().expect("not poisoned").take());
    if let Some((waiting, value, got)) = to {
        let _ = waiting.send(());
        let _ = got.send(value.recv_timeout(HANG).ok());
    }
}

#[test]
fn a_subscriber_may_wait_for_a_job_after_the_level_rose_during_a_job() {
    support::worker_subscriber::install(level, wait_for_another_job);
    let pool = pool(2, 16);
    support::warm(&pool);
    let (waiting, waits) = mpsc::channel();
    let (value, values) = mpsc::channel();
    let (got, report) = mpsc::channel();
    *TO.get_or_init(|| Mutex::new(None))
        .lock()
        .expect("not poisoned") = Some((waiting, values, got));
    let mut job = pool
        .offload(|_| {
            // Logging turned up while the job runs (a reload layer would).
            ON.store(true, Ordering::SeqCst);
            tracing::callsite::rebuild_interest_cache();
            7u32
        })
        .spawn()
        .expect("room");
    waits.recv_timeout(HANG).expect("the subscriber waits");
    let mut other = pool
        .offload(move |_| {
            let _ = value.send(1);
        })
        .spawn()
        .expect("room");
    let got = report
        .recv_timeout(HANG * 2)
        .expect("the subscriber's wait ended");
    assert_eq!(got, Some(1), "the other job ran meanwhile");
    assert!(other.blocking_wait(None).is_ok());
    assert_eq!(job.blocking_wait(None).ok(), Some(7));
    support::eventually_blocking("the pool idle", || pool.is_idle());
    support::assert_ledger(&pool.metrics());
}
