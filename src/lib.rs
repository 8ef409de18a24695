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

// The crate in four layers, each naming only the layers above it in this
// list (tests/layout.rs checks it): `util` knows nothing of jobs; `job` is
// what a job is; `core` is the pool; `api` is what a user calls.
// docs/ARCHITECTURE.md maps every file.
mod util;

mod job;

mod core;

mod api;

// The README's example runs as a doctest: what it shows is what runs.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub use api::awaited::OffloadFuture;
pub use api::batch::{AllFailed, BatchError, InvokeAll, InvokeAny};
pub use api::group::JobGroup;
pub use api::handle::JobHandle;
pub use api::map::{Indexed, Map};
pub use api::offload::Offload;
pub use core::config::{
    Builder, DEFAULT_KEEP_ALIVE, DEFAULT_MAX_IN_FLIGHT, DEFAULT_OBSERVER_LAG,
    DEFAULT_QUEUE_CAPACITY,
};
pub use core::metrics::{GroupMetrics, Metrics};
pub use core::observer::{EventKind, JobEvent, Observer};
pub use core::pool::{Offloader, WeakOffloader};
pub use core::report::{CloseReport, RunningJob, UnstartedJob};
pub use job::error::{BuildError, Error, Fate, SubmitError};
pub use job::id::{JobId, JobState};
pub use job::lane::{KeyStats, LaneKey};
pub use job::limiter::{Limiter, LimiterStats};
pub use job::policy::{AbandonPolicy, GroupDropPolicy};
pub use job::stop::{StopCallback, StopToken, Stopped};

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
