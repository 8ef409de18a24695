//! A tracing subscriber is foreign code on the worker too: while it is
//! called for a finished job's span and last log lines, the job queued
//! next has not been marked started (ARCHITECTURE.md "A job's path",
//! step 5), so a cancel from inside the subscriber wins and the job never
//! runs. A pool traced at `debug` or finer does not chain jobs.
//!
//! Its own test binary: it installs a process-wide subscriber.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use offloader::Error;
use support::next_job::NextJob;
use support::{gate, pool};
use tracing::level_filters::LevelFilter;

/// The job the subscriber cancels, once armed.
static NEXT: OnceLock<Mutex<Option<NextJob>>> = OnceLock::new();
/// Set once the first job may return: events before are not its last.
static ARMED: AtomicBool = AtomicBool::new(false);

fn next() -> std::sync::MutexGuard<'static, Option<NextJob>> {
    NEXT.get_or_init(|| Mutex::new(None))
        .lock()
        .expect("not poisoned")
}

/// On the first event a worker emits once armed (the first job's
/// "completed" line), cancels the job queued next.
fn cancel_the_next() {
    if ARMED.swap(false, Ordering::SeqCst) {
        if let Some(next) = next().as_ref() {
            next.fire();
        }
    }
}

#[test]
fn a_subscriber_called_for_a_finished_job_runs_before_the_next_is_started() {
    support::worker_subscriber::install(|| LevelFilter::DEBUG, cancel_the_next);
    let pool = pool(1, 16);
    support::warm(&pool);
    for round in 0..50 {
        let (open, hold) = gate();
        let (began, begun) = std::sync::mpsc::channel();
        let mut first = pool
            .offload(move |_| {
                let _ = began.send(());
                hold.wait();
            })
            .spawn()
            .expect("room");
        let queued = NextJob::default();
        queued.queue(&pool);
        *next() = Some(queued.clone());
        // Armed once the first job's "started" line is behind it: the
        // worker's next event is the first job's last.
        begun
            .recv_timeout(support::HANG)
            .expect("the first job began");
        ARMED.store(true, Ordering::SeqCst);
        open.open();
        // No waker registered (that alone would end the chain).
        while !first.is_finished() {
            std::hint::spin_loop();
        }
        assert!(first.blocking_wait(None).is_ok());
        let outcome = queued.wait().expect("the handle");
        assert_eq!(
            *queued.seen.lock().expect("not poisoned"),
            Some((true, false)),
            "round {round}: the subscriber's cancel won before the job began"
        );
        assert!(
            matches!(outcome, Err(Error::Cancelled { id: Some(_) })),
            "{outcome:?}"
        );
        assert!(!queued.begun.load(Ordering::SeqCst));
    }
}
