//! Configuration: the [`Builder`], its defaults and its validation.

use std::time::Duration;

use crate::core::observer::{Observer, ObserverSlot};
use crate::core::state::KeyLimits;
use crate::job::error::{BuildError, BuildErrorKind};
use crate::job::policy::AbandonPolicy;

/// Largest queue capacity (2^31 jobs): far beyond any sane configuration,
/// and small enough that queued and running jobs are addressed by 32-bit
/// slab keys (slab.rs).
pub(crate) const MAX_QUEUE_CAPACITY: usize = 1 << 31;
/// Largest `max_in_flight` (2^20): a thread per permit.
pub(crate) const MAX_IN_FLIGHT: usize = 1 << 20;

// Every queued or running job, and every parked worker, has a 32-bit slab
// key (slab.rs): the bounds leave room for all of them.
const _: () = assert!(MAX_QUEUE_CAPACITY + 2 * MAX_IN_FLIGHT < u32::MAX as usize);

/// Default for [`Builder::max_in_flight`].
pub const DEFAULT_MAX_IN_FLIGHT: usize = 64;
/// Default for [`Builder::queue_capacity`].
pub const DEFAULT_QUEUE_CAPACITY: usize = 4096;
/// Default for [`Builder::observer_lag`].
pub const DEFAULT_OBSERVER_LAG: usize = 1024;
/// Default for [`Builder::keep_alive`].
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(10);

/// Configures and builds an [`Offloader`](crate::Offloader).
///
/// ```
/// use std::time::Duration;
/// use offloader::{AbandonPolicy, Offloader};
///
/// let pool = Offloader::builder()
///     .max_in_flight(8)
///     .queue_capacity(1_000)
///     .keep_alive(Duration::from_secs(30))
///     .thread_name("sdk-io")
///     .abandon_policy(AbandonPolicy::CancelIfQueued)
///     .build()
///     .expect("valid configuration");
/// # drop(pool);
/// ```
#[derive(Debug, Clone)]
pub struct Builder {
    config: Config,
}

#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) max_in_flight: usize,
    pub(crate) queue_capacity: usize,
    pub(crate) keep_alive: Duration,
    pub(crate) thread_name: String,
    pub(crate) stack_size: Option<usize>,
    pub(crate) abandon: AbandonPolicy,
    pub(crate) stuck_after: Option<Duration>,
    pub(crate) observer: Option<ObserverSlot>,
    pub(crate) observer_lag: usize,
    /// The process-wide pool, which ignores shutdown requests.
    pub(crate) global: bool,
    pub(crate) key_limits: KeyLimits,
    /// The fast layer: the lock-free intake for plain jobs, next-job
    /// chaining in a finishing worker, and the worker's and the awaiting
    /// caller's short spins. The locked core is complete without it.
    /// Off under loom unless a model turns it on, and off everywhere when
    /// the crate is built with `--cfg offloader_plain` (CI runs the whole
    /// test suite both ways).
    pub(crate) fast: bool,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            config: Config {
                max_in_flight: DEFAULT_MAX_IN_FLIGHT,
                queue_capacity: DEFAULT_QUEUE_CAPACITY,
                keep_alive: DEFAULT_KEEP_ALIVE,
                thread_name: "offloader-worker".to_owned(),
                stack_size: None,
                abandon: AbandonPolicy::Keep,
                stuck_after: None,
                observer: None,
                observer_lag: DEFAULT_OBSERVER_LAG,
                global: false,
                key_limits: KeyLimits::default(),
                fast: cfg!(not(any(loom, offloader_plain))),
            },
        }
    }
}

impl Builder {
    /// Turns the fast layer ([`Config::fast`]) on or off: for loom models
    /// and tests of both doors.
    #[cfg(any(test, loom))]
    pub(crate) fn fast(mut self, on: bool) -> Self {
        self.config.fast = on;
        self
    }

    /// How many functions may run at once (default [`DEFAULT_MAX_IN_FLIGHT`]).
    ///
    /// Also the most worker threads the pool ever has.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.config.max_in_flight = n;
        self
    }

    /// How many accepted jobs may wait for a permit (default
    /// [`DEFAULT_QUEUE_CAPACITY`]).
    ///
    /// Beyond it, awaiting an offload waits for room and
    /// [`Offload::spawn`](crate::Offload::spawn) fails with
    /// [`Error::Full`](crate::Error::Full).
    ///
    /// Memory: a queued job takes about 120 bytes. A pool that takes jobs
    /// also keeps a lock-free front door for up to 2048 of them (64 bytes
    /// a place, made by the first job that passes it; fewer places when
    /// `n` is below 2048), so a pool of a small capacity stays small.
    pub fn queue_capacity(mut self, n: usize) -> Self {
        self.config.queue_capacity = n;
        self
    }

    /// How long an idle worker thread waits for work before it exits
    /// (default [`DEFAULT_KEEP_ALIVE`]).
    pub fn keep_alive(mut self, d: Duration) -> Self {
        self.config.keep_alive = d;
        self
    }

    /// The name given to worker threads (default `offloader-worker`; the
    /// stuck-job monitor gets `<name>-monitor`).
    ///
    /// A name containing a NUL byte is refused by [`build`](Self::build).
    pub fn thread_name(mut self, name: impl Into<String>) -> Self {
        self.config.thread_name = name.into();
        self
    }

    /// The stack size of worker threads (default: the platform's, 2 MiB
    /// for Rust threads on Linux).
    ///
    /// The operating system rounds small values up to its minimum (16 KiB
    /// on Linux), and nothing can check what a function needs: a function
    /// whose frames outgrow the stack overflows it, which aborts the whole
    /// process (Rust cannot catch a stack overflow). A 4 KiB setting aborts
    /// on a function with a 64 KiB local buffer. Size it for the deepest
    /// call an offloaded function makes, with margin.
    pub fn stack_size(mut self, bytes: usize) -> Self {
        self.config.stack_size = Some(bytes);
        self
    }

    /// What happens to a job whose awaiting caller stops waiting (time-out or
    /// drop) before it finished (default [`AbandonPolicy::Keep`]).
    ///
    /// Overridable per call with
    /// [`Offload::on_abandon`](crate::Offload::on_abandon).
    ///
    /// The default keeps the job: a caller's timeout or drop ends its wait
    /// and changes nothing about the job unless a policy says so, since
    /// the library cannot know whether the work may be lost. A service
    /// whose callers give up on their requests should set
    /// [`CancelIfQueued`](AbandonPolicy::CancelIfQueued) or
    /// [`CancelAndStop`](AbandonPolicy::CancelAndStop) here, so that no
    /// permit goes to a request nobody waits for (see
    /// [`AbandonPolicy`]'s docs for why and an example).
    pub fn abandon_policy(mut self, policy: AbandonPolicy) -> Self {
        self.config.abandon = policy;
        self
    }

    /// Reports a job at `warn`, once, when its function has run longer than
    /// `threshold` (default: never).
    ///
    /// Checked by one monitor thread, started with the first job when a
    /// threshold is set; running jobs are also listed by
    /// [`Offloader::running_jobs`](crate::Offloader::running_jobs).
    pub fn stuck_after(mut self, threshold: Duration) -> Self {
        self.config.stuck_after = Some(threshold);
        self
    }

    /// Calls `observer` with every job's lifecycle transitions, in order, so
    /// they can be kept in a durable ledger outside the process.
    pub fn observer(mut self, observer: std::sync::Arc<dyn Observer>) -> Self {
        self.config.observer = Some(ObserverSlot(observer));
        self
    }

    /// How many lifecycle events may wait undelivered before admission is held
    /// back (default [`DEFAULT_OBSERVER_LAG`]).
    ///
    /// `submit` and awaited offloads wait for the observer,
    /// [`Offload::spawn`](crate::Offload::spawn) is refused with
    /// [`Error::ObserverBehind`](crate::Error::ObserverBehind).
    ///
    /// Events of jobs already accepted are never held back, so at most
    /// `observer_lag + 4 × (queue_capacity + max_in_flight)` events wait.
    pub fn observer_lag(mut self, events: usize) -> Self {
        self.config.observer_lag = events;
        self
    }

    /// How many jobs of one key ([`Offload::key`](crate::Offload::key)) may run
    /// at once (default: no limit but `max_in_flight`).
    ///
    /// Jobs of a key at its limit wait in its lane without holding back other
    /// keys' jobs, and the pool serves the keys with a startable job in turn.
    /// Zero is refused by [`build`](Self::build).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = offloader::Offloader::builder()
    ///     .max_in_flight(8)
    ///     .max_per_key(2)
    ///     .key_limit("primary-db", 1)
    ///     .build()?;
    /// let rows = pool.offload(|_stop| 42).key("primary-db").await?;
    /// assert_eq!(rows, 42);
    /// # Ok(()) }
    /// ```
    pub fn max_per_key(mut self, n: usize) -> Self {
        self.config.key_limits.per_key = Some(n);
        self
    }

    /// How many jobs of `key` may run at once, overriding
    /// [`max_per_key`](Self::max_per_key) for that key.
    ///
    /// Zero is refused by [`build`](Self::build).
    pub fn key_limit(mut self, key: impl Into<crate::job::lane::LaneKey>, n: usize) -> Self {
        std::sync::Arc::make_mut(&mut self.config.key_limits.keys).insert(key.into(), n);
        self
    }

    /// The validated configuration (`Builder::build`, pool.rs, makes the
    /// pool from it).
    pub(crate) fn into_config(self) -> Result<Config, BuildError> {
        self.config.validate()?;
        Ok(self.config)
    }
}

impl Builder {
    /// The configuration of the process-wide pool: the defaults (valid by
    /// construction, checked by a test), ignoring shutdown requests.
    pub(crate) fn into_global(self) -> Config {
        Config {
            global: true,
            ..self.config
        }
    }
}

impl Config {
    /// Every setting checked here, so that nothing fails later inside the
    /// pool (a thread name with a NUL would make every spawn panic).
    fn validate(&self) -> Result<(), BuildError> {
        if self.max_in_flight == 0 {
            return Err(BuildErrorKind::ZeroInFlight.into());
        }
        if self.max_in_flight > MAX_IN_FLIGHT {
            return Err(BuildErrorKind::TooManyInFlight {
                got: self.max_in_flight,
                max: MAX_IN_FLIGHT,
            }
            .into());
        }
        if self.queue_capacity == 0 || self.queue_capacity > MAX_QUEUE_CAPACITY {
            return Err(BuildErrorKind::QueueCapacity {
                got: self.queue_capacity,
                max: MAX_QUEUE_CAPACITY,
            }
            .into());
        }
        if self.observer_lag == 0 {
            return Err(BuildErrorKind::ZeroObserverLag.into());
        }
        if self.key_limits.per_key == Some(0) {
            return Err(BuildErrorKind::ZeroPerKey.into());
        }
        if let Some((key, _)) = self.key_limits.keys.iter().find(|(_, &n)| n == 0) {
            return Err(BuildErrorKind::ZeroKeyLimit { key: key.clone() }.into());
        }
        if self.thread_name.contains('\0') {
            return Err(BuildErrorKind::ThreadName {
                name: self.thread_name.clone(),
            }
            .into());
        }
        Ok(())
    }
}
