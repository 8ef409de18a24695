// The crate's documentation, its guide, lives in guide.md (rendered by
// rustdoc as the crate root's page; its examples run as doctests).
#![doc = include_str!("guide.md")]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]

// Leaves first: each module imports only from those above it.
mod clock;
mod id;
mod lane;
mod limiter;
mod policy;
mod quiet;
mod ready;
mod slab;
mod sync;
mod wait_list;

mod error;
mod metrics;
mod stop;

mod job;
mod job_core;
mod observer;
mod report;

mod fast;

mod state;

mod config;
mod delivery;
mod monitor;
mod pool;
mod waits;
mod worker;

mod lanes;

mod control;

mod handle;
mod settle;
mod shutdown;

mod group;

mod offload;

mod awaited;
mod batch;
#[cfg(feature = "metrics")]
mod export;
#[cfg(feature = "tokio-util")]
mod interop;
mod map;

// The README's example runs as a doctest: what it shows is what runs.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(all(test, loom))]
mod loom_groups;
#[cfg(all(test, loom))]
mod loom_limiters;
#[cfg(all(test, loom))]
mod loom_tests;

pub use awaited::OffloadFuture;
pub use batch::{AllFailed, BatchError, InvokeAll, InvokeAny};
pub use config::{
    Builder, DEFAULT_KEEP_ALIVE, DEFAULT_MAX_IN_FLIGHT, DEFAULT_OBSERVER_LAG,
    DEFAULT_QUEUE_CAPACITY,
};
pub use error::{BuildError, Error, Fate, SubmitError};
pub use group::JobGroup;
pub use handle::JobHandle;
pub use id::{JobId, JobState};
pub use lane::{KeyStats, LaneKey};
pub use limiter::{Limiter, LimiterStats};
pub use map::{Indexed, Map};
pub use metrics::{GroupMetrics, Metrics};
pub use observer::{EventKind, JobEvent, Observer};
pub use offload::Offload;
pub use policy::{AbandonPolicy, GroupDropPolicy};
pub use pool::{Offloader, WeakOffloader};
pub use report::{CloseReport, RunningJob, UnstartedJob};
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
    /// The process-wide default offloader behind [`offload()`], built on first
    /// use with default settings.
    ///
    /// It is never dropped.
    ///
    /// Like Java's common pool, it **ignores shutdown requests**: any
    /// library in the process can reach it, so none may close it for the
    /// others. [`shutdown`](Self::shutdown), [`shutdown_now`](Self::shutdown_now)
    /// and [`close`](Self::close) do nothing on it (`shutdown_now` returns
    /// no jobs; `close` reports `terminated: false` at once). Build your own
    /// pool with [`Offloader::builder`] to control its lifecycle.
    ///
    /// ```
    /// let global = offloader::Offloader::global();
    /// global.shutdown(); // ignored
    /// assert!(!global.is_shutdown());
    /// ```
    pub fn global() -> &'static Offloader {
        static GLOBAL: std::sync::OnceLock<Offloader> = std::sync::OnceLock::new();
        GLOBAL.get_or_init(|| Offloader::from_config(Builder::default().into_global()))
    }
}
