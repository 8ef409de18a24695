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
//! This page is a guide, in the order you meet the ideas: the failure, waiting
//! vs owning, abandon policies, the stop token and the deadline, shutdown,
//! the lifecycle observer and metrics. Every example on it runs as a test.
//! How the crate keeps its promises (the numbered invariants, the locks on a
//! job's path, the worker wake-up protocol) is in `docs/ARCHITECTURE.md` of
//! the repository.
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
//! A timeout ends the *waiting*, not the *work*. Tokio's `spawn_blocking`
//! cannot stop a function that has started (`JoinHandle::abort` does nothing
//! then), so a permit held by the *awaiting future* comes back while the
//! thread still runs. Here the permit belongs to the job: after caller A gives
//! up, the function still holds it, and the next job waits in the queue.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use offloader::{JobState, Offloader};
//!
//! let pool = Offloader::builder().max_in_flight(1).build()?;
//! let (release, gate) = std::sync::mpsc::channel::<()>();
//! let (started_tx, started_rx) = tokio::sync::oneshot::channel();
//!
//! // Caller A gives up after 10 ms; work_a is held on a gate until later.
//! let err = pool
//!     .offload(move |_stop| {
//!         let _ = started_tx.send(());
//!         gate.recv().ok()
//!     })
//!     .with_timeout(Duration::from_millis(10))
//!     .await
//!     .unwrap_err();
//! assert!(err.is_timeout()); // "... it was still running; the job goes on ..."
//! started_rx.await?; // a gate, never a sleep: work_a has started
//!
//! // work_a still holds the only permit, so work_b waits in the queue.
//! let work_b = pool.offload(|_stop| "b").spawn()?;
//! assert_eq!(work_b.state(), JobState::Queued);
//! assert_eq!(pool.metrics().running, 1);
//!
//! release.send(())?; // work_a returns; only now does work_b start
//! assert_eq!(work_b.await?, "b");
//! assert_eq!(pool.metrics().max_running, 1);
//! # Ok(()) }
//! ```
//!
//! `cargo run --example quickstart` runs both sides of the diagram and prints
//! what each does; `-- --timeline out.svg` draws it.
//!
//! # Waiting vs owning
//!
//! Awaiting an [`Offload`] waits for the outcome; [`Offload::with_timeout`]
//! bounds that wait, and the job's fate when it runs out is the abandon policy
//! (next section). [`Offload::spawn`] (or [`Offload::submit`], which waits for
//! queue room) hands you the *owner* [`JobHandle`] instead: a future of the
//! outcome that can be waited on with a timeout without being consumed
//! ([`JobHandle::wait_timeout`]), cancelled, stopped, detached, or waited on
//! from synchronous code ([`JobHandle::blocking_wait`]). Dropping a handle
//! detaches the job; the offloader still owns it and records its outcome.
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
//! let (tx, rx) = std::sync::mpsc::channel::<()>();
//! let mut job = pool
//!     .offload(move |_stop| { rx.recv().ok(); "report" })
//!     .name("report")
//!     .spawn()?;
//! assert!(job.wait_timeout(Duration::from_millis(5)).await.unwrap_err().is_timeout());
//! tx.send(())?; // ... do something else, then collect it:
//! assert_eq!(job.await?, "report");
//!
//! // The free function runs on a lazily built default offloader.
//! let v = offloader::offload(|_stop| std::env::var("HOME").is_ok())
//!     .with_timeout(Duration::from_secs(5))
//!     .await?;
//! # let _ = v;
//! # Ok(()) }
//! ```
//!
//! Errors say what happened to the *job*, not only to the wait:
//! [`Error::TimedOut`] carries the job's [`JobState`] when the wait ended and
//! its [`Fate`] (kept running, cancelled before start, stop requested, already
//! finished); [`Error::Cancelled`] and [`Error::Unstarted`] mean the function
//! never ran.
//!
//! # Abandon policies
//!
//! When a caller stops waiting (its timeout passes, or its future is dropped,
//! for example by `select!`) before the job finished, the job follows its
//! [`AbandonPolicy`], set on the [`Builder::abandon_policy`] and overridable
//! per call with [`Offload::on_abandon`]:
//!
//! | policy | job still queued | job running |
//! | --- | --- | --- |
//! | [`Keep`](AbandonPolicy::Keep) (default) | stays queued, will run | runs to completion |
//! | [`CancelIfQueued`](AbandonPolicy::CancelIfQueued) | cancelled: never runs | runs to completion |
//! | [`CancelAndStop`](AbandonPolicy::CancelAndStop) | cancelled: never runs | its stop token is set |
//!
//! In every case the permit stays held until the function really returns, and
//! the outcome is recorded in the [`Metrics`]. A queued job's cancel and its
//! start race atomically: exactly one wins.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use offloader::{AbandonPolicy, Offloader};
//!
//! let pool = Offloader::builder().max_in_flight(1).build()?;
//! let (started_tx, started_rx) = tokio::sync::oneshot::channel();
//! let (done_tx, done_rx) = tokio::sync::oneshot::channel();
//! let call = pool
//!     .offload(move |stop| {
//!         let _ = started_tx.send(());
//!         // Cooperative: wakes as soon as stop is requested.
//!         let r = stop.sleep(Duration::from_secs(60));
//!         let _ = done_tx.send(r.is_err());
//!     })
//!     .with_timeout(Duration::from_secs(60))
//!     .on_abandon(AbandonPolicy::CancelAndStop);
//! // The caller leaves as soon as the function runs (say, a user cancelled):
//! // its future is dropped, and CancelAndStop requests stop.
//! tokio::select! {
//!     _ = call => unreachable!("the function waits for stop"),
//!     _ = started_rx => {}
//! }
//! assert!(done_rx.await?); // the function saw the stop request and returned
//! pool.idle().await; // ... and only then was its permit released
//! let m = pool.metrics();
//! assert_eq!((m.callers_dropped, m.stop_requests, m.completed), (1, 1, 1));
//! # Ok(()) }
//! ```
//!
//! When the caller's own timeout passes instead, the error says so:
//! `Error::TimedOut { state: Running, fate: Fate::StopRequested, .. }`
//! ("stopped waiting for job #1 after 10ms: it was still running; stop was
//! requested; it holds its permit until the function returns").
//!
//! # The stop token and the deadline
//!
//! Every function receives a [`StopToken`]. Stop is a *request*: a function
//! that ignores it runs on, and keeps its permit, until it returns. The token
//! offers:
//!
//! - [`is_stopped`](StopToken::is_stopped) (one atomic load) and
//!   [`check`](StopToken::check), which returns [`Stopped`] to `?` out with,
//!   for loops with safe points;
//! - [`sleep`](StopToken::sleep) / [`sleep_until`](StopToken::sleep_until),
//!   which wake early on stop;
//! - [`deadline`](StopToken::deadline) and
//!   [`remaining`](StopToken::remaining): the instant after which nobody waits
//!   for the result (the caller's [`with_timeout`](Offload::with_timeout) or
//!   the job's own [`deadline`](Offload::deadline), whichever is earlier), to
//!   bound an SDK's own timeouts;
//! - [`on_stop`](StopToken::on_stop): a callback that aborts an SDK's own
//!   blocking call (interrupt a database connection, shut down a socket). It
//!   runs on the thread that requests stop. Keep the returned [`StopCallback`]
//!   guard alive while the call it protects runs: dropping it unregisters the
//!   callback, waiting for it if it is running right now.
//!
//! Stop is requested by [`JobHandle::stop`] (or [`JobHandle::cancel`] on a
//! running job), by the [`CancelAndStop`](AbandonPolicy::CancelAndStop)
//! policy, and by [`Offloader::shutdown_now`].
//!
//! A deadline bounding a blocking read: the socket's read timeout comes from
//! the token, so the function gives up when its answer stops being useful.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::net::UdpSocket;
//! use std::time::{Duration, Instant};
//! use offloader::Offloader;
//!
//! let pool = Offloader::builder().build()?;
//! let socket = UdpSocket::bind("127.0.0.1:0")?; // nobody will ever send to it
//! let r = pool
//!     .offload(move |stop| {
//!         // `Some(Duration::ZERO)` is an error for set_read_timeout: a deadline
//!         // that has already passed must be answered before the call.
//!         match stop.remaining() {
//!             Some(left) if left.is_zero() => return Err(std::io::ErrorKind::TimedOut.into()),
//!             left => socket.set_read_timeout(left)?,
//!         }
//!         let mut buf = [0u8; 64];
//!         socket.recv(&mut buf)
//!     })
//!     .deadline(Instant::now() + Duration::from_millis(20))
//!     .await?;
//! let kind = r.unwrap_err().kind(); // the read timed out at the deadline
//! assert!(matches!(kind, std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut));
//! # Ok(()) }
//! ```
//!
//! A stop request reaching into a blocking read through `on_stop`: the
//! callback shuts the socket down, and the read, blocked in the kernel,
//! returns at once.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::io::Read;
//! use std::net::{Shutdown, TcpListener, TcpStream};
//! use offloader::Offloader;
//!
//! let listener = TcpListener::bind("127.0.0.1:0")?; // accepts, never writes
//! let mut stream = TcpStream::connect(listener.local_addr()?)?;
//! let (started_tx, started_rx) = tokio::sync::oneshot::channel();
//!
//! let pool = Offloader::builder().build()?;
//! let job = pool
//!     .offload(move |stop| {
//!         let killer = stream.try_clone()?;
//!         let _guard = stop.on_stop(move || {
//!             let _ = killer.shutdown(Shutdown::Both);
//!         });
//!         let _ = started_tx.send(());
//!         let mut buf = [0u8; 64];
//!         stream.read(&mut buf) // blocks until the socket is shut down
//!     })
//!     .spawn()?;
//! started_rx.await?; // a gate, not a sleep
//! job.stop();
//! assert_eq!(job.await??, 0); // end of stream: the read returned early
//! # drop(listener);
//! # Ok(()) }
//! ```
//!
//! `examples/sqlite_interrupt.rs` does the same with SQLite's interrupt handle
//! (and contrasts `spawn_blocking`, where the query runs to its end);
//! `examples/blocking_socket.rs` combines the deadline and the stop callback
//! against a slow server.
//!
//! # Shutdown is a sequence
//!
//! After Java's `ExecutorService` and asyncio's `Queue.shutdown`:
//!
//! | call | new jobs | queued jobs | running jobs | returns |
//! | --- | --- | --- | --- | --- |
//! | [`shutdown`](Offloader::shutdown) | refused | still run | run on | at once |
//! | [`shutdown_now`](Offloader::shutdown_now) | refused | removed, *handed back* | stop requested | the [`UnstartedJob`]s |
//! | [`close`](Offloader::close)`(graceful, after_stop)` | refused | run for `graceful`, then handed back | stop requested after `graceful` | a [`CloseReport`] |
//!
//! Termination is its own fact: [`terminated`](Offloader::terminated) (or
//! [`await_termination`](Offloader::await_termination)) waits until every
//! accepted job is terminal and every worker thread has exited;
//! [`is_shutdown`](Offloader::is_shutdown) is not "done". Independently of
//! shutdown, [`idle`](Offloader::idle) waits until every accepted job is
//! terminal (not merely until the queue is empty), and
//! [`running_jobs`](Offloader::running_jobs) lists what runs now. Dropping the
//! last [`Offloader`] clone starts a graceful shutdown without blocking.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use offloader::Offloader;
//!
//! let pool = Offloader::builder().max_in_flight(1).build()?;
//! let (started_tx, started_rx) = tokio::sync::oneshot::channel();
//! let running = pool
//!     .offload(move |stop| {
//!         let _ = started_tx.send(());
//!         stop.sleep(Duration::from_secs(60)) // honours stop
//!     })
//!     .name("slow")
//!     .spawn()?;
//! let queued = pool.offload(|_stop| ()).name("never-ran").spawn()?;
//! started_rx.await?;
//!
//! // Graceful for 10 ms (the slow job will not finish), then immediate.
//! let report = pool.close(Duration::from_millis(10), Duration::from_secs(5)).await;
//! assert!(report.escalated && report.terminated);
//! assert_eq!(report.unstarted[0].name.as_deref(), Some("never-ran"));
//! assert!(report.still_running.is_empty());
//! assert!(queued.await.unwrap_err().is_cancelled()); // Error::Unstarted: never ran
//! assert!(running.await?.is_err()); // its sleep saw the stop request
//! assert!(pool.is_terminated());
//! # Ok(()) }
//! ```
//!
//! A job that ignores its stop token for the whole `after_stop` budget is
//! named in [`CloseReport::still_running`]; it keeps its thread and its permit
//! until it returns, and nothing pretends otherwise.
//!
//! # Job groups
//!
//! A request rarely offloads one function. [`Offloader::group`] gives a
//! [`JobGroup`]: offload through it as through the pool, then stop, await
//! or close its jobs together without shutting the pool down.
//! [`JobGroup::stop`] cancels the group's queued jobs (in one critical
//! section: none of them starts afterwards) and sets the stop token of its
//! running ones, which keep their permits until they return;
//! [`JobGroup::idle`] waits until every job of the group is terminal;
//! [`JobGroup::close`] is the staged version with a [`CloseReport`].
//! Groups nest like cancel scopes ([`JobGroup::child`]): a parent's stop
//! reaches every descendant, a child's stop stays below it, and a parent's
//! [`GroupMetrics`] and idleness include its descendants' jobs. Dropping the
//! last handle follows a [`GroupDropPolicy`] (default: the jobs go on).
//! With the `tokio-util` feature, a group or a single offload follows a
//! tokio-util `CancellationToken` (`JobGroup::stop_on`, `Offload::stop_on`),
//! and `StopToken::cancellation_token` hands a job's stop request to async
//! code, so a tree of async cancellation reaches blocking jobs.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = offloader::Offloader::builder().max_in_flight(4).build()?;
//! let request = pool.group();
//! let reads: Vec<_> = (0..20)
//!     .map(|i| request.offload(move |_stop| i * 2).spawn())
//!     .collect::<Result<_, _>>()?;
//! let mut total = 0;
//! for read in reads {
//!     match read.await {
//!         Ok(n) => total += n,
//!         Err(e) => {
//!             request.stop(); // the rest are cancelled or stopped
//!             return Err(e.into());
//!         }
//!     }
//! }
//! request.idle().await;
//! assert_eq!(total, 380);
//! assert_eq!(request.metrics().completed, 20);
//! # Ok(()) }
//! ```
//!
//! # Batch calls
//!
//! Each job of a batch is an ordinary offload: the same permits, timeouts
//! and abandon policies.
//!
//! - [`Offloader::invoke_all`]: every outcome, in input order;
//!   [`InvokeAll::with_timeout`] ends the wait, and each unfinished job
//!   follows its abandon policy and says so in its [`Error::TimedOut`].
//! - [`Offloader::invoke_any`]: the first `Ok` wins; the losers are
//!   cancelled if queued and stopped if running, and keep their permits
//!   until their functions return (`examples/race_mirrors.rs`).
//! - [`Offloader::map`]: a [`Map`] stream of outcomes, at most
//!   [`limit`](Map::limit) jobs in flight, items taken as room frees, in
//!   input order or [`unordered`](Map::unordered), going on past errors or
//!   [`stop_on_error`](Map::stop_on_error).
//!
//! The same calls on a [`JobGroup`] run in it (in a child of it for
//! `invoke_any` and `map`), so stopping the group stops them too.
//!
//! # The lifecycle observer
//!
//! [`Builder::observer`] takes an [`Observer`] that sees every job's
//! transitions ([`EventKind`]: accepted, started, finished with its state,
//! never started, caller left), in order, on the thread that caused each one.
//! Name jobs with a stable key ([`Offload::name`]) and the observer can keep a
//! durable ledger, from which a restarted process re-submits exactly the jobs
//! that never finished: `examples/durable_ledger.rs` does that with SQLite
//! across a forced close. Keep the observer fast: the thread that delivers
//! events waits for it.
//!
//! # Metrics
//!
//! [`Offloader::metrics`] returns one consistent [`Metrics`] snapshot:
//! counters change under the same lock as the transitions they count, so
//! `accepted = queued + running + terminal` holds exactly in every snapshot
//! ([`Metrics::ledger_balances`]). Besides the states, it counts callers that
//! timed out or dropped their future, jobs that were still running when their
//! caller left (`running_after_caller_left`: the work a naive timeout hides),
//! stop requests, refusals by cause, the peak of concurrently running
//! functions, and total queue and run time. [`Builder::stuck_after`] logs a
//! job that runs longer than a threshold.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use offloader::Offloader;
//!
//! let pool = Offloader::builder().max_in_flight(2).build()?;
//! let (started_tx, started_rx) = tokio::sync::oneshot::channel();
//! let (tx, rx) = std::sync::mpsc::channel::<()>();
//! let call = pool.offload(move |_stop| {
//!     let _ = started_tx.send(());
//!     rx.recv().ok()
//! });
//! tokio::select! {
//!     _ = call => unreachable!("the function waits for the gate"),
//!     _ = started_rx => {} // the caller leaves while the function runs
//! }
//! let m = pool.metrics();
//! assert_eq!((m.accepted, m.running, m.callers_dropped), (1, 1, 1));
//! assert_eq!(m.running_after_caller_left, 1);
//! assert!(m.ledger_balances());
//!
//! tx.send(())?;
//! pool.idle().await;
//! let m = pool.metrics();
//! assert_eq!((m.running, m.completed), (0, 1));
//! assert!(m.ledger_balances());
//! # Ok(()) }
//! ```
//!
//! # Examples
//!
//! Each runs in a few seconds with nothing but loopback, and exits non-zero
//! if what it demonstrates did not happen:
//!
//! - `quickstart`: the failure above, naive vs offloader, side by side
//!   (`-- --timeline out.svg` draws it);
//! - `sqlite_interrupt`: a stop token interrupting a long SQLite query, vs
//!   `spawn_blocking`, where the query runs to its end;
//! - `blocking_socket`: a deadline bounding a `TcpStream` read, and a stop
//!   request shutting the socket down;
//! - `durable_ledger`: a SQLite ledger fed by the observer, a forced staged
//!   close, and an idempotent recovery after a restart;
//! - `race_mirrors`: [`Offloader::invoke_any`] racing three local mirrors;
//!   the losers' stop tokens shut their sockets down, and their permits
//!   come back when their functions return.

#![forbid(unsafe_code)]
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

mod state;

mod config;
mod delivery;
mod pool;
mod worker;

mod control;

mod handle;
mod shutdown;

mod group;

mod offload;

mod awaited;
mod batch;
#[cfg(feature = "tokio-util")]
mod interop;
mod map;

#[cfg(all(test, loom))]
mod loom_tests;

pub use awaited::OffloadFuture;
pub use batch::{BatchError, InvokeAll};
pub use config::{
    Builder, DEFAULT_KEEP_ALIVE, DEFAULT_MAX_IN_FLIGHT, DEFAULT_OBSERVER_LAG,
    DEFAULT_QUEUE_CAPACITY,
};
pub use error::{BuildError, Error, Fate, Rejected, SubmitError};
pub use group::JobGroup;
pub use handle::JobHandle;
pub use id::{JobId, JobState};
pub use lane::{KeyStats, LaneKey};
pub use map::Map;
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
    /// The process-wide default offloader behind [`offload()`], built on
    /// first use with default settings. It is never dropped.
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
