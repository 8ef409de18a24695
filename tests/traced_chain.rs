//! A tracing subscriber is foreign code on the worker too: while it is
//! called for a finished job's span and last log lines, the job queued
//! next has not been marked started (ARCHITECTURE.md "A job's path",
//! step 5), so a cancel from inside the subscriber wins and the job never
//! runs. A pool traced at `debug` or finer does not chain jobs.
//!
//! Its own test binary: it installs a process-wide subscriber.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use offloader::Error;
use support::next_job::NextJob;
use support::{gate, pool};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// The job the subscriber cancels, once armed.
static NEXT: OnceLock<Mutex<Option<NextJob>>> = OnceLock::new();
/// Set once the first job may return: events before are not its last.
static ARMED: AtomicBool = AtomicBool::new(false);

fn next() -> std::sync::MutexGuard<'static, Option<NextJob>> {
    NEXT.get_or_init(|| Mutex::new(None))
        .lock()
        .expect("not poisoned")
}

/// Listens to everything; on the first event a worker emits once armed
/// (the first job's "completed" line), cancels the job queued next.
struct CancelsOnTheWorker {
    ids: AtomicU64,
}

impl Subscriber for CancelsOnTheWorker {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::DEBUG)
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(self.ids.fetch_add(1, Ordering::Relaxed))
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {
        let on_worker = std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("offloader"));
        if on_worker && ARMED.swap(false, Ordering::SeqCst) {
            if let Some(next) = next().as_ref() {
                next.fire();
            }
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn a_subscriber_called_for_a_finished_job_runs_before_the_next_is_started() {
    tracing::subscriber::set_global_default(CancelsOnTheWorker {
        ids: AtomicU64::new(1),
    })
    .expect("the only subscriber of this test binary");
    let pool = pool(1, 16);
    support::warm(&pool);
    for round in 0..50 {
        let (open, hold) = gate();
        let first = pool.offload(move |_| hold.wait()).spawn().expect("room");
        let queued = NextJob::default();
        queued.queue(&pool);
        *next() = Some(queued.clone());
        ARMED.store(true, Ordering::SeqCst);
        open.open();
        // No waker registered (that alone would end the chain).
        while !first.is_finished() {
            std::hint::spin_loop();
        }
        assert!(first.blocking_wait().is_ok());
        let outcome = queued.wait().expect("the handle");
        assert_eq!(
            *queued.seen.lock().expect("not poisoned"),
            Some((true, false)),
            "round {round}: the subscriber's cancel won before the job began"
        );
        assert!(
            matches!(outcome, Err(Error::Cancelled { .. })),
            "{outcome:?}"
        );
        assert!(!queued.begun.load(Ordering::SeqCst));
    }
}
