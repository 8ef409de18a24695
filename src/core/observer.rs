//! The lifecycle observer: a hook that sees every job's transitions, in
//! order, so that users can keep a durable ledger outside the process.
//!
//! # Invariants
//!
//! 1. Events are appended to the pool's event queue in the same critical
//!    section as the transition they report, so the queue's order is the
//!    order in which the transitions happened (per job and across jobs).
//! 2. One thread delivers, the pool's delivery thread (`src/core/delivery.rs`),
//!    in queue order, and never while holding the pool's lock: the observer
//!    is user code, and it never runs on a caller's async thread or on a
//!    worker that holds the next job's permit.
//! 3. Whoever appends an event rings the delivery thread's doorbell after
//!    unlocking (a bounded `crossbeam-channel` of one message, so a ring is
//!    never lost and never blocks); the delivery thread only waits on the
//!    doorbell after seeing the queue empty under the lock. So every event
//!    is delivered, once.
//! 4. The queue is bounded: admission waits (`submit`, `.await`) or is
//!    refused (`spawn`, [`Error::ObserverBehind`](crate::Error::ObserverBehind))
//!    while `observer_lag` events are undelivered, and an accepted job adds
//!    at most four events (accepted, started, finished or never started,
//!    abandoned). So at most `observer_lag + 4 × (queue_capacity +
//!    max_in_flight)` events ever wait.

use std::collections::VecDeque;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Instant, SystemTime};

use crate::job::id::{JobId, JobState};

/// Receives every job's lifecycle transitions.
///
/// Set with [`Builder::observer`](crate::Builder::observer). Events for one
/// pool arrive one at a time, exactly once, in the order the transitions
/// happened, on the pool's own delivery thread (`<thread_name>-observer`):
/// never on a caller's async thread, never on a worker. So the observer may
/// block (a durable ledger may `fsync`) without stalling a runtime or
/// holding a permit. It is never called while the pool's internal locks are
/// held, so it may call back into the pool: read metrics, offload work,
/// shut it down. What it must not do is *wait* on its own pool for
/// something that needs its events delivered: `idle()`, `terminated()` and
/// `blocking_await_termination(None)` panic there with a clear message
/// (the panic is caught and logged), `blocking_await_termination` with a
/// limit and `close` return at once without termination, and an offload that would wait for
/// the observer's own lag is refused with
/// [`Error::ObserverBehind`](crate::Error::ObserverBehind).
///
/// An observer that falls behind by more than
/// [`Builder::observer_lag`](crate::Builder::observer_lag) undelivered events
/// holds admission back: `submit` and awaited offloads wait for it,
/// [`spawn`](crate::Offload::spawn) is refused with
/// [`Error::ObserverBehind`](crate::Error::ObserverBehind). Nothing is
/// buffered without bound. [`Metrics::events_delivered`](crate::Metrics::events_delivered)
/// and [`Metrics::events_pending`](crate::Metrics::events_pending) show how it
/// keeps up; `idle()` and termination wait until every event is delivered. A
/// panic in the observer is caught and logged; delivery goes on.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use offloader::{EventKind, JobEvent, Observer, Offloader};
///
/// #[derive(Default)]
/// struct Ledger(Mutex<Vec<String>>);
///
/// impl Observer for Ledger {
///     fn on_event(&self, event: &JobEvent) {
///         self.0.lock().unwrap().push(format!("{} {:?}", event.id, event.kind));
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ledger = Arc::new(Ledger::default());
/// let pool = Offloader::builder().observer(ledger.clone()).build()?;
/// pool.offload(|_stop| ()).await?;
/// pool.idle().await;
/// let lines = ledger.0.lock().unwrap().clone();
/// assert_eq!(lines.len(), 3); // accepted, started, finished
/// # Ok(()) }
/// ```
///
/// An observer that needs its own pool (to read its metrics, say) holds a
/// [`WeakOffloader`](crate::WeakOffloader): a strong [`Offloader`](crate::Offloader)
/// inside the pool's own observer would keep the pool open forever.
///
/// ```
/// use std::sync::{Arc, Mutex, OnceLock};
/// use offloader::{JobEvent, Observer, Offloader, WeakOffloader};
///
/// #[derive(Default)]
/// struct Watch {
///     pool: OnceLock<WeakOffloader>,
///     queued_seen: Mutex<Vec<u64>>,
/// }
///
/// impl Observer for Watch {
///     fn on_event(&self, _event: &JobEvent) {
///         if let Some(pool) = self.pool.get().and_then(WeakOffloader::upgrade) {
///             self.queued_seen.lock().unwrap().push(pool.metrics().queued);
///         }
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let watch = Arc::new(Watch::default());
/// let pool = Offloader::builder().observer(watch.clone()).build()?;
/// watch.pool.set(pool.downgrade()).ok();
/// pool.offload(|_stop| ()).await?;
/// pool.idle().await; // every event delivered: the observer holds no upgrade
/// let weak = pool.downgrade();
/// drop(pool); // the observer's weak handle does not keep it open
/// assert!(weak.upgrade().is_none());
/// # Ok(()) }
/// ```
pub trait Observer: Send + Sync + 'static {
    /// Called once per transition.
    fn on_event(&self, event: &JobEvent);
}

/// One lifecycle transition of one job.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct JobEvent {
    /// The job's id (stable for the life of the process).
    pub id: JobId,
    /// The job's name, if it was given one (a user-chosen stable key, for a
    /// ledger that outlives the process).
    pub name: Option<std::sync::Arc<str>>,
    /// The job's key ([`Offload::key`](crate::Offload::key)), if it has one.
    pub key: Option<crate::job::lane::LaneKey>,
    /// What happened.
    pub kind: EventKind,
    /// When it happened (monotonic, for durations).
    pub at: Instant,
    /// When it happened by the wall clock, for a ledger kept on disk.
    pub at_wall: SystemTime,
    /// Whether stop had been requested for the job when this happened: a
    /// `Finished(Completed)` job with this set returned after being asked
    /// to stop, which a ledger may want to treat as not done.
    pub stop_requested: bool,
}

/// What happened to a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventKind {
    /// The job was accepted into the queue.
    Accepted,
    /// The function started (took a permit).
    Started,
    /// The job reached a terminal state: `Completed`, `Panicked` or
    /// `Cancelled` (before start).
    Finished(JobState),
    /// An immediate shutdown handed the job back unstarted; the function
    /// never ran. Record it to run it again after a restart.
    NeverStarted,
    /// The awaiting caller stopped waiting (time-out or drop) while the job
    /// was in `state`; what happened next follows as further events.
    Abandoned {
        /// The job's state when its caller left.
        state: JobState,
    },
}

/// Delivers a batch outside every lock (inv. 2).
pub(crate) fn deliver(observer: &dyn Observer, batch: &VecDeque<JobEvent>) {
    for event in batch {
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| observer.on_event(event))) {
            crate::util::quiet::drop_quietly(payload);
            crate::util::quiet::quietly(|| {
                tracing::warn!(id = event.id.0, kind = ?event.kind, "the lifecycle observer panicked; the panic was caught and delivery goes on");
            });
        }
    }
}

/// The observer, wrapped so that `Config` can derive `Debug` and `Clone`.
#[derive(Clone)]
pub(crate) struct ObserverSlot(pub(crate) std::sync::Arc<dyn Observer>);

impl fmt::Debug for ObserverSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Observer")
    }
}
