//! Run blocking functions from async Rust without lying about their lifetime.
//!
//! `offloader` runs synchronous functions (SDK calls, file and database I/O,
//! compression) on its own bounded pool of threads, and keeps four promises
//! that a hand-rolled `Semaphore` + `spawn_blocking` + `timeout` breaks:
//!
//! 1. **A permit is held for as long as the function really runs**, not for
//!    as long as somebody awaits it. With `max_in_flight(n)`, at no instant
//!    do more than `n` functions run, whatever callers do.
//! 2. **Waiting is not owning.** A caller's timeout or a dropped future ends
//!    the *wait*. What happens to the *job* is an explicit [`AbandonPolicy`],
//!    and the error says what state the job was in.
//! 3. **Cancel before start means never run**, and a cancel after start is a
//!    cooperative [`StopToken`] request handed into the function.
//! 4. **A panic is a result**: the owner gets [`Error::Panicked`], the worker
//!    survives, the permit is released.
//!
//! # The failure it prevents
//!
//! ```text
//! Semaphore(1) + spawn_blocking + timeout
//! caller A:  acquire ─ spawn_blocking(work_a) ─ timeout! ─ permit released
//! thread 1:            work_a ──────────────────────────────────────── returns
//! caller B:                                      acquire ─ work_b ──── ...
//!                                                ^ two functions in flight under a limit of 1
//!
//! offloader, max_in_flight(1)
//! caller A:  offload(work_a) ─ timeout! (job #1 still running; it keeps the permit)
//! worker:    work_a ─────────────────────────────────── returns, permit released
//! caller B:                 offload(work_b) ─ queued ───────────── work_b ── ...
//! ```
//!
//! # Waiting vs owning
//!
//! Awaiting an [`Offload`] waits for the outcome; [`Offload::with_timeout`]
//! bounds that wait. [`Offload::spawn`] gives an owner [`JobHandle`]: a
//! future of the outcome that can be waited on with a timeout without being
//! consumed, cancelled, stopped, detached, or waited on from synchronous
//! code.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use offloader::Offloader;
//!
//! let pool = Offloader::builder().max_in_flight(4).build()?;
//!
//! // Await directly.
//! let n = pool.offload(|_stop| 2 + 2).await?;
//! assert_eq!(n, 4);
//!
//! // Bound the caller's wait; the job follows the abandon policy.
//! let r = pool
//!     .offload(|stop| stop.sleep(Duration::from_secs(60)))
//!     .with_timeout(Duration::from_millis(20))
//!     .await;
//! assert!(r.unwrap_err().is_timeout());
//!
//! // Keep an owner handle; stop waiting without giving it up.
//! let mut job = pool.offload(|_stop| "report").name("report").spawn()?;
//! let _maybe = job.wait_timeout(Duration::from_millis(1)).await;
//! if !job.is_finished() {
//!     // ... do something else, then collect it later.
//! }
//! let _ = job.await;
//!
//! // The free function runs on a lazily built default offloader.
//! let v = offloader::offload(|_stop| std::env::var("HOME").is_ok())
//!     .with_timeout(Duration::from_secs(5))
//!     .await?;
//! # let _ = v;
//! # Ok(()) }
//! ```
//!
//! # Abandon policies
//!
//! When a caller stops waiting before the job finished, the job follows its
//! [`AbandonPolicy`]: [`Keep`](AbandonPolicy::Keep) (the default: it runs to
//! completion and its outcome is recorded),
//! [`CancelIfQueued`](AbandonPolicy::CancelIfQueued), or
//! [`CancelAndStop`](AbandonPolicy::CancelAndStop) (cancel if queued, request
//! stop if running). The permit is never released early.
//!
//! # The stop token and the deadline
//!
//! Every function receives a [`StopToken`]: a one-load
//! [`is_stopped`](StopToken::is_stopped), a [`check`](StopToken::check) to
//! `?` out with, a [`sleep`](StopToken::sleep) that wakes early, the
//! caller's [`deadline`](StopToken::deadline), and
//! [`on_stop`](StopToken::on_stop) callbacks to abort an SDK's own I/O.
//!
//! # Shutdown
//!
//! [`Offloader::shutdown`] rejects new work at once and lets queued work run;
//! [`Offloader::is_shutdown`] and [`Offloader::is_terminated`] are different
//! facts. Dropping the last [`Offloader`] clone starts a graceful shutdown.
//!
//! # Metrics
//!
//! [`Offloader::metrics`] returns one consistent [`Metrics`] snapshot in
//! which `accepted = queued + running + terminal` always holds.

#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]

mod error;
mod handle;
mod job;
mod lifecycle;
mod metrics;
mod observer;
mod offload;
mod pool;
mod stop;
mod sync;

#[cfg(all(test, loom))]
mod loom_tests;

pub use error::{BuildError, Error, Fate, Rejected, SubmitError};
pub use handle::JobHandle;
pub use job::{JobId, JobState};
pub use lifecycle::{CloseReport, RunningJob, UnstartedJob};
pub use metrics::Metrics;
pub use observer::{EventKind, JobEvent, Observer};
pub use offload::{AbandonPolicy, Offload, OffloadFuture};
pub use pool::{
    Builder, Offloader, DEFAULT_KEEP_ALIVE, DEFAULT_MAX_IN_FLIGHT, DEFAULT_QUEUE_CAPACITY,
};
pub use stop::{StopCallback, StopToken, Stopped};

/// Prepares `f` to run on the process-wide default [`Offloader`], built on
/// first use with the [`Builder`]'s defaults.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), offloader::Error> {
/// let v = offloader::offload(|_stop| 40 + 2).await?;
/// assert_eq!(v, 42);
/// # Ok(()) }
/// ```
pub fn offload<F, T>(f: F) -> Offload<F, T>
where
    F: FnOnce(&StopToken) -> T + Send + 'static,
    T: Send + 'static,
{
    Offloader::global().offload(f)
}

impl Offloader {
    /// The process-wide default offloader behind [`offload()`], built on
    /// first use with default settings. It is never dropped.
    pub fn global() -> &'static Offloader {
        static GLOBAL: std::sync::OnceLock<Offloader> = std::sync::OnceLock::new();
        GLOBAL.get_or_init(|| match Builder::default().build() {
            Ok(pool) => pool,
            // The defaults are valid by construction (checked by a test).
            Err(e) => unreachable!("default offloader configuration is invalid: {e}"),
        })
    }
}
