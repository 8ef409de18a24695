//! Shutdown as a sequence: stop accepting, drain, terminate, report.
//!
//! After Java's `ExecutorService` (`shutdown`, `shutdownNow`,
//! `awaitTermination`) and asyncio's `Queue.shutdown`/`join`:
//!
//! - [`Offloader::shutdown`]: graceful; new jobs are refused, queued jobs
//!   still run.
//! - [`Offloader::shutdown_now`]: immediate; queued jobs are removed and
//!   handed back, running ones get their stop token set.
//! - [`Offloader::terminated`] / [`Offloader::await_termination`]:
//!   termination is its own fact: every accepted job is terminal and every
//!   pool thread has exited.
//! - [`Offloader::close`]: the staged close in one call, with a
//!   [`CloseReport`] that names what was left behind.
//! - [`Offloader::idle`]: every accepted job is terminal (asyncio's `join`),
//!   at any time, not only at shutdown.
//!
//! # Invariants
//!
//! 1. "Idle" is `queue` and `running` empty and every observer event
//!    delivered, read under the pool lock; "terminated" is idle plus shut
//!    down plus no live pool thread. Neither is ever inferred from the queue
//!    alone.
//! 2. Every change that can make either true happens under the pool lock and
//!    is followed, under the same lock, by [`Inner::signal_if_settled`].
//!    Blocking waiters test the condition under the lock before waiting on
//!    the condvar; async waiters enable their `Notified` before testing it.
//!    So no waiter misses the change.
//! 3. `shutdown_now` moves every queued job to `Unstarted` in one critical
//!    section with setting `shutdown`, so no job can be accepted, or start,
//!    after the list it returns was taken.

use std::fmt;
use std::pin::pin;
use std::time::{Duration, Instant};

use crate::error::{Error, Pretty};
use crate::job::{JobId, QUEUED, UNSTARTED};
use crate::observer::EventKind;
use crate::pool::{Inner, Offloader, Shared, Waiting};
use crate::sync::{lock, Arc};

/// A job that an immediate shutdown removed from the queue; its function
/// never ran. Its owner handle resolves to [`Error::Unstarted`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnstartedJob {
    /// The job's id.
    pub id: JobId,
    /// The job's name, if it had one.
    pub name: Option<std::sync::Arc<str>>,
    /// How long it had waited in the queue.
    pub queued_for: Duration,
}

/// A job whose function is running now.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunningJob {
    /// The job's id.
    pub id: JobId,
    /// The job's name, if it had one.
    pub name: Option<std::sync::Arc<str>>,
    /// How long the function has been running.
    pub running_for: Duration,
    /// Whether stop has been requested through its token.
    pub stop_requested: bool,
    /// Whether a caller's future or an owner handle for it still exists
    /// (somebody may still collect the outcome).
    pub caller_waiting: bool,
    /// Whether an awaiting caller stopped waiting (timed out or dropped its
    /// future) while the job was unfinished: the job outlives its caller.
    pub caller_left: bool,
}

/// What a staged [`Offloader::close`] did and left behind. Data, not only a
/// log line.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CloseReport {
    /// Jobs whose function returned during the close.
    pub completed: u64,
    /// Jobs whose function panicked during the close.
    pub panicked: u64,
    /// Jobs handed back unstarted by the immediate stage (empty if the
    /// graceful stage sufficed).
    pub unstarted: Vec<UnstartedJob>,
    /// Jobs still running when the close gave up: their functions ignored
    /// the stop request for the whole second budget, and still hold their
    /// permits.
    pub still_running: Vec<RunningJob>,
    /// Whether the immediate stage was needed.
    pub escalated: bool,
    /// Whether the pool terminated within the budgets.
    pub terminated: bool,
    /// How long the close took.
    pub took: Duration,
}

impl fmt::Display for CloseReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "close {} after {}: {} completed, {} panicked, {} returned unstarted, {} still running",
            if self.terminated {
                "terminated"
            } else {
                "gave up"
            },
            Pretty(self.took),
            self.completed,
            self.panicked,
            self.unstarted.len(),
            self.still_running.len()
        )?;
        for job in &self.still_running {
            write!(
                f,
                "\n  still running: job {} {:?} for {}, stop requested: {}",
                job.id,
                job.name.as_deref().unwrap_or(""),
                Pretty(job.running_for),
                job.stop_requested
            )?;
        }
        Ok(())
    }
}

impl Offloader {
    /// Starts a graceful shutdown and returns at once.
    ///
    /// From this instant every new job is refused with
    /// [`Rejected::ShuttingDown`](crate::Rejected::ShuttingDown) (a
    /// [`spawn`](crate::Offload::spawn) hands the function back), and
    /// callers waiting for room in a full queue wake with that error. Jobs
    /// already queued still run; worker threads exit once the queue is
    /// empty. Idempotent. Not the same as finished: see
    /// [`terminated`](Self::terminated).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = offloader::Offloader::builder().build()?;
    /// let job = pool.offload(|_stop| 1).spawn()?;
    /// pool.shutdown();
    /// assert!(pool.offload(|_stop| 2).spawn().is_err());
    /// assert_eq!(job.await?, 1); // accepted before the shutdown: still runs
    /// pool.terminated().await;
    /// # Ok(()) }
    /// ```
    pub fn shutdown(&self) {
        self.inner().shutdown();
    }

    /// Shuts down immediately: new jobs are refused, queued jobs are removed
    /// and returned (their owner handles resolve to [`Error::Unstarted`]),
    /// and running jobs get their stop token set.
    ///
    /// Running functions keep their permits until they really return;
    /// nothing pretends they stopped. Await [`terminated`](Self::terminated)
    /// for that.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// let pool = offloader::Offloader::builder().max_in_flight(1).build()?;
    /// let (started_tx, started_rx) = std::sync::mpsc::channel();
    /// let running = pool.offload(move |stop| {
    ///     started_tx.send(()).ok();
    ///     stop.sleep(Duration::from_secs(60))
    /// }).spawn()?;
    /// let queued = pool.offload(|_stop| ()).name("never").spawn()?;
    /// started_rx.recv()?;
    /// let unstarted = pool.shutdown_now();
    /// assert_eq!(unstarted.len(), 1);
    /// assert_eq!(unstarted[0].name.as_deref(), Some("never"));
    /// assert!(queued.await.unwrap_err().is_cancelled());
    /// assert!(running.await?.is_err()); // its sleep saw the stop request
    /// pool.terminated().await;
    /// # Ok(()) }
    /// ```
    pub fn shutdown_now(&self) -> Vec<UnstartedJob> {
        let inner = self.inner();
        inner.shutdown();
        let mut s = lock(&inner.shared);
        // Inv. 3: `shutdown` is set, so nothing joins the queue after this.
        let drained: Vec<_> = s.queue.drain(..).collect();
        for task in &drained {
            let won = task.core().transition(QUEUED, UNSTARTED);
            debug_assert!(won, "a queued job is in state Queued");
            s.counts.unstarted += 1;
            s.unpublished += 1;
            if inner.config.observer.is_some() {
                s.events.push(task.core(), EventKind::NeverStarted);
            }
        }
        let running = s.running.clone();
        inner.signal_if_settled(&s);
        drop(s);
        let unstarted = drained
            .into_iter()
            .map(|task| {
                let core = task.core();
                let job = UnstartedJob {
                    id: core.id,
                    name: core.name().cloned(),
                    queued_for: core.clock(),
                };
                task.discard(Error::Unstarted { id: core.id });
                job
            })
            .collect::<Vec<_>>();
        inner.published(unstarted.len());
        for task in &running {
            inner.stop(&**task);
        }
        inner.flush_events();
        tracing::debug!(
            unstarted = unstarted.len(),
            running = running.len(),
            "immediate shutdown: queued jobs returned, running jobs asked to stop"
        );
        unstarted
    }

    /// `true` once a shutdown has begun (no new jobs are accepted). Not the
    /// same as finished: see [`is_terminated`](Self::is_terminated).
    pub fn is_shutdown(&self) -> bool {
        lock(&self.inner().shared).shutdown
    }

    /// `true` once shutdown has begun, every accepted job is terminal, every
    /// observer event has been delivered and every pool thread has exited.
    pub fn is_terminated(&self) -> bool {
        lock(&self.inner().shared).is_terminated()
    }

    /// `true` if every accepted job is terminal right now (nothing queued,
    /// nothing running).
    pub fn is_idle(&self) -> bool {
        lock(&self.inner().shared).is_idle()
    }

    /// Waits until every accepted job is terminal: nothing queued *and*
    /// nothing running (asyncio's `Queue.join`). Works at any time, not only
    /// during shutdown; returns at once if the pool is idle.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = offloader::Offloader::builder().build()?;
    /// for i in 0..10 {
    ///     pool.offload(move |_stop| i * 2).spawn()?.detach();
    /// }
    /// pool.idle().await;
    /// assert_eq!(pool.metrics().completed, 10);
    /// # Ok(()) }
    /// ```
    pub async fn idle(&self) {
        wait(self.inner(), Shared::is_idle).await;
    }

    /// Waits until the pool has terminated: shut down, every accepted job
    /// terminal, every pool thread exited. Never returns if nothing shuts
    /// the pool down.
    pub async fn terminated(&self) {
        wait(self.inner(), Shared::is_terminated).await;
    }

    /// Waits at most `limit` for termination; returns whether the pool
    /// terminated.
    ///
    /// # Panics
    ///
    /// Needs a tokio runtime with the time driver.
    pub async fn await_termination(&self, limit: Duration) -> bool {
        tokio::time::timeout(limit, self.terminated()).await.is_ok()
    }

    /// Blocks the current thread until the pool terminates or `limit`
    /// passes (`None`: no limit); returns whether it terminated. For
    /// synchronous callers; do not call it on an async runtime's thread.
    pub fn blocking_await_termination(&self, limit: Option<Duration>) -> bool {
        let until = limit.and_then(|l| Instant::now().checked_add(l));
        blocking_wait(self.inner(), Shared::is_terminated, until)
    }

    /// Closes the pool in stages, in one call: a graceful shutdown, waiting
    /// up to `graceful` for termination; then, if needed, an immediate
    /// shutdown (queued jobs handed back, stop requested on running ones),
    /// waiting up to `after_stop` more. Returns a [`CloseReport`] naming
    /// what was left behind, and logs each still-running job at `warn`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// let pool = offloader::Offloader::builder().build()?;
    /// pool.offload(|_stop| ()).spawn()?.detach();
    /// let report = pool.close(Duration::from_secs(5), Duration::from_secs(1)).await;
    /// assert!(report.terminated);
    /// assert!(report.still_running.is_empty());
    /// # Ok(()) }
    /// ```
    pub async fn close(&self, graceful: Duration, after_stop: Duration) -> CloseReport {
        let began = Instant::now();
        let before = self.metrics();
        self.shutdown();
        let mut unstarted = Vec::new();
        let mut terminated = self.await_termination(graceful).await;
        let escalated = !terminated;
        if escalated {
            unstarted = self.shutdown_now();
            terminated = self.await_termination(after_stop).await;
        }
        // One snapshot: a job finishing now is in exactly one of the two.
        let (after, still_running) = {
            let s = lock(&self.inner().shared);
            (s.snapshot(), running_list(&s))
        };
        for job in &still_running {
            tracing::warn!(
                id = job.id.0,
                name = job.name.as_deref().unwrap_or(""),
                running_for = ?job.running_for,
                stop_requested = job.stop_requested,
                "close gave up on a job that is still running; it keeps its thread and permit until it returns"
            );
        }
        CloseReport {
            completed: after.completed - before.completed,
            panicked: after.panicked - before.panicked,
            unstarted,
            still_running,
            escalated,
            terminated,
            took: began.elapsed(),
        }
    }

    /// The jobs whose functions are running now.
    ///
    /// ```
    /// let pool = offloader::Offloader::builder().build().unwrap();
    /// assert!(pool.running_jobs().is_empty());
    /// ```
    pub fn running_jobs(&self) -> Vec<RunningJob> {
        running_list(&lock(&self.inner().shared))
    }
}

/// The running jobs, read under the lock the caller holds.
fn running_list(s: &Shared) -> Vec<RunningJob> {
    s.running
        .iter()
        .map(|task| {
            let core = task.core();
            RunningJob {
                id: core.id,
                name: core.name().cloned(),
                running_for: core.clock(),
                stop_requested: core.is_stop_requested(),
                caller_waiting: core.caller_waiting(),
                caller_left: core.caller_left(),
            }
        })
        .collect()
}

/// Waits until `settled` holds (inv. 2, async side).
async fn wait(inner: &Arc<Inner>, settled: fn(&Shared) -> bool) {
    // Counted so that transitions signal it (pool.rs `signal_if_settled`).
    let _registered = Waiting::new(inner, |s| &mut s.settle_waiters);
    loop {
        let mut notified = pin!(inner.progress.notified());
        notified.as_mut().enable();
        if settled(&lock(&inner.shared)) {
            return;
        }
        notified.await;
    }
}

/// Blocks until `settled` holds or `until` passes (inv. 2, blocking side).
pub(crate) fn blocking_wait(
    inner: &Inner,
    settled: fn(&Shared) -> bool,
    until: Option<Instant>,
) -> bool {
    let mut s = lock(&inner.shared);
    s.settle_waiters += 1;
    loop {
        if settled(&s) {
            s.settle_waiters -= 1;
            return true;
        }
        let wait = match until {
            None => Duration::from_secs(3600),
            Some(until) => {
                let now = Instant::now();
                if now >= until {
                    s.settle_waiters -= 1;
                    return false;
                }
                until - now
            }
        };
        s = match inner.changed.wait_timeout(s, wait) {
            Ok((g, _)) => g,
            Err(poisoned) => poisoned.into_inner().0,
        };
    }
}

impl Inner {
    /// The stuck-job monitor: reports each job running longer than
    /// `stuck_after` once at `warn`; exits when the pool has terminated
    /// (apart from itself).
    pub(crate) fn monitor_loop(self: Arc<Self>) {
        let threshold = self.config.stuck_after.unwrap_or(Duration::MAX);
        let tick = (threshold / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let mut reported: Vec<JobId> = Vec::new();
        let mut s = lock(&self.shared);
        // Counted as a waiter so that the last worker's exit wakes it.
        s.settle_waiters += 1;
        while !(s.shutdown && s.is_idle() && s.workers == 0) {
            reported.retain(|id| s.running.iter().any(|t| t.core().id == *id));
            let stuck: Vec<_> = s
                .running
                .iter()
                .filter_map(|task| {
                    let core = task.core();
                    let running_for = core.clock();
                    (running_for > threshold && !reported.contains(&core.id))
                        .then(|| (core.id, core.span(), running_for, core.is_stop_requested()))
                })
                .collect();
            drop(s);
            for (id, span, running_for, stop_requested) in stuck {
                reported.push(id);
                tracing::warn!(
                    parent: &span,
                    ?running_for,
                    stop_requested,
                    "job is stuck: it has run longer than the stuck_after threshold"
                );
            }
            s = lock(&self.shared);
            s = match self.changed.wait_timeout(s, tick) {
                Ok((g, _)) => g,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        s.settle_waiters -= 1;
        s.monitor = false;
        self.signal_if_settled(&s);
    }
}
