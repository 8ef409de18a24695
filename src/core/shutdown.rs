//! Shutdown as a sequence: stop accepting, drain, terminate, report.
//!
//! After Java's `ExecutorService` (`shutdown`, `shutdownNow`,
//! `awaitTermination`) and asyncio's `Queue.shutdown`/`join`:
//!
//! - [`Offloader::shutdown`]: graceful; new jobs are refused, queued jobs
//!   still run.
//! - [`Offloader::shutdown_now`]: immediate; queued jobs are removed and
//!   handed back, running ones get their stop token set.
//! - [`Offloader::terminated`]: termination is its own fact: every
//!   accepted job is terminal and every pool thread has exited.
//! - [`Offloader::close`]: the staged close in one call, with a
//!   [`CloseReport`] that names what was left behind.
//! - [`Offloader::idle`]: every accepted job is terminal (asyncio's `join`),
//!   at any time, not only at shutdown.
//!
//! # Invariants
//!
//! 1. "Idle" is `queue` and `running` empty, every outcome published and
//!    every observer event delivered, read under the pool lock;
//!    "terminated" is idle plus shut down plus every pool thread retired
//!    *and joined*. Neither is ever inferred from the queue alone.
//! 2. Every change that can make either true happens under the pool lock,
//!    whose transition then asks (`After::settled`) for the waiters to be
//!    signalled after unlocking. Blocking waiters test the condition under
//!    the lock before waiting on the condvar; async waiters register their
//!    waker (wait_list.rs) before testing it. So no waiter misses the change.
//! 3. `shutdown_now` sets `shutdown` and starts the drain (from then on
//!    nothing starts: `State::start` takes no job while draining) in one
//!    critical section, then moves every queued job to `Unstarted`, a chunk
//!    per critical section: no job is accepted, or starts, after the call
//!    began, and every job queued then is in the list it returns.

use std::time::{Duration, Instant};

use crate::core::pool::{warn_delivery, Inner, Offloader};
use crate::core::report::{CloseReport, RunningJob, UnstartedJob};
use crate::core::settle::{blocking_wait, join_elsewhere, wait, wait_settled, Awaited, JoinOnDrop};
use crate::core::state::{After, State};
use crate::util::clock::Began;
use crate::util::quiet::drop_quietly;
use crate::util::sync::Arc;

/// Jobs `shutdown_now` drains per critical section: few enough that their
/// memory (about 128 KiB of jobs) is still in a core's cache when their
/// functions are discarded after unlocking, and that other callers of the
/// lock wait for tens of microseconds, not for the whole queue.
const DRAIN_CHUNK: usize = 1024;

impl Offloader {
    /// Starts a graceful shutdown and returns at once.
    ///
    /// From this instant every new job is refused with
    /// [`Error::ShuttingDown`](crate::Error::ShuttingDown) (a
    /// [`spawn`](crate::Offload::spawn) hands the function back), and
    /// callers waiting for room in a full queue wake with that error. Jobs
    /// already queued still run; worker threads exit once the queue is
    /// empty. Idempotent. Not the same as finished: see
    /// [`terminated`](Self::terminated).
    ///
    /// "Returns at once" has one exception: a `spawn` on another thread
    /// that is a few instructions into passing the pool's lock-free intake
    /// is let finish first (its job is then accepted, or refused), so a
    /// submitting thread preempted at that point holds the call until the
    /// OS runs it again.
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

    /// Shuts down immediately, handing the queued jobs back.
    ///
    /// New jobs are refused, queued jobs are removed and returned (their owner
    /// handles resolve to [`Error::ShuttingDown`](crate::Error::ShuttingDown)
    /// with their id), and running jobs get their stop token set.
    ///
    /// Running functions keep their permits until they really return;
    /// nothing pretends they stopped. Await [`terminated`](Self::terminated)
    /// for that.
    ///
    /// Every job queued when the call begins is returned, and none of them
    /// starts. They come lane by lane: first the jobs without a key or a
    /// limiter, then the jobs of each key (and of each set of limiters)
    /// together, each lane's in submission order — so a pool whose jobs
    /// have no keys or limiters returns them in submission order. The
    /// queue is drained a chunk at a time, so other callers of the pool
    /// wait for one chunk, not for the whole queue. If two calls race, each
    /// returns the jobs it drained; a later call returns an empty list. A
    /// job cancelled meanwhile (its handle's `cancel`, its group's stop)
    /// between two chunks ends cancelled instead, and is not returned.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// let pool = offloader::Offloader::builder().max_in_flight(1).build()?;
    /// let (started_tx, started_rx) = std::sync::mpsc::channel();
    /// let running = pool.offload(move |stop| {
    /// started_tx.send(()).ok();
    /// stop.sleep(Duration::from_secs(60))
    /// }).spawn()?;
    /// let queued = pool.offload(|_stop| ()).name("never").spawn()?;
    /// started_rx.recv()?;
    /// let unstarted = pool.shutdown_now();
    /// assert_eq!(unstarted.len(), 1);
    /// assert_eq!(unstarted[0].name.as_deref(), Some("never"));
    /// assert!(queued.await.unwrap_err().is_shutdown()); // returned unstarted
    /// assert!(running.await?.is_err()); // its sleep saw the stop request
    /// pool.terminated().await;
    /// # Ok(()) }
    /// ```
    pub fn shutdown_now(&self) -> Vec<UnstartedJob> {
        let inner = self.inner();
        if inner.config.global {
            // The global pool ignores shutdown requests.
            return Vec::new();
        }
        // Inv. 3: the shutdown begins in the critical section that starts
        // the drain, so nothing joins the queue or starts from it after
        // this call began. The queue is drained a chunk at a time, each
        // chunk's functions discarded while its jobs are still in cache: a
        // queue of a million jobs is walked once, and the lock is let go
        // between chunks.
        // ORDERING: a size hint for the report; the drain is under the lock.
        let mut unstarted = Vec::with_capacity(inner.queue_count.now());
        let mut chunk = Vec::with_capacity(DRAIN_CHUNK);
        let mut done = 0;
        // Group keys of the jobs published since the last lock.
        let mut grouped = Vec::new();
        let mut begun = false;
        let running = loop {
            let mut after = After::default();
            let mut first = None;
            let running = {
                let mut s = inner.lock();
                if !std::mem::replace(&mut begun, true) {
                    first = Some(inner.begin_shutdown(&mut s, &mut after));
                }
                s.published_many(done, grouped.drain(..), &mut after);
                s.drain_unstarted(&mut chunk, DRAIN_CHUNK, &mut after)
            };
            inner.after(after);
            if let Some(first) = first {
                first.report();
            }
            done = chunk.len();
            let now = crate::job::id::now_ns();
            unstarted.extend(chunk.drain(..).map(|task| {
                grouped.extend(task.core().membership().map(|m| m.group));
                let job = UnstartedJob::of(task.core(), now);
                task.discard();
                drop_quietly(task);
                job
            }));
            if let Some(running) = running {
                break running;
            }
        };
        let mut after = After::default();
        inner.lock().published_many(done, grouped, &mut after);
        inner.after(after);
        for task in &running {
            inner.stop(&**task);
        }
        drop_quietly(running);
        tracing::debug!(
            unstarted = unstarted.len(),
            "immediate shutdown: queued jobs returned, running jobs asked to stop"
        );
        unstarted
    }

    /// `true` once a shutdown has begun (no new jobs are accepted).
    ///
    /// Not the same as finished: see [`is_terminated`](Self::is_terminated).
    pub fn is_shutdown(&self) -> bool {
        self.inner().lock().is_shutdown()
    }

    /// `true` once shutdown has begun, every accepted job is terminal, every
    /// observer event has been delivered and every pool thread has exited and
    /// been joined.
    ///
    /// When the last threads have retired but are still exiting
    /// (thread-local destructors), it starts joining them on a helper thread
    /// and answers `false`; a later call answers `true`. It blocks only if
    /// the OS refuses that helper thread: it then joins them itself.
    pub fn is_terminated(&self) -> bool {
        let inner = self.inner();
        let exited = {
            let mut s = inner.lock();
            if s.is_terminated() || !s.threads_retired() {
                return s.is_terminated();
            }
            s.workers.take_exited()
        };
        if !exited.is_empty() {
            // Every pool thread has retired; the last ones may still be
            // running their thread-local destructors. They are joined off
            // this thread (which may be an async one), and a later call
            // answers `true`.
            join_elsewhere(JoinOnDrop {
                inner: inner.clone(),
                handles: exited,
            });
        }
        false
    }
    /// Waits until every accepted job is terminal: nothing queued *and* nothing
    /// running (asyncio's `Queue.join`).
    ///
    /// Works at any time, not only during shutdown; returns at once if the pool
    /// is idle.
    ///
    /// # Panics
    ///
    /// If called on one of this pool's worker threads — from a job (the
    /// wait includes that job's end, so it could never return) or from a
    /// waker or drop a worker runs between jobs (the job it just ran is
    /// settled after them) — or from this pool's observer (it includes
    /// delivering the event being delivered).
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
        wait(self.inner(), Awaited::Idle).await;
    }

    /// Waits until the pool has terminated: shut down, every accepted job
    /// terminal, every pool thread exited.
    ///
    /// Never returns if nothing shuts the pool down; bound it with
    /// `tokio::time::timeout`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// let pool = offloader::Offloader::builder().build()?;
    /// pool.offload(|_stop| ()).await?;
    /// pool.shutdown();
    /// tokio::time::timeout(Duration::from_secs(5), pool.terminated()).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Panics
    ///
    /// If called on one of this pool's own threads (a job, or code a
    /// worker runs between jobs, or the observer): termination waits for
    /// that thread too, so it could never return. With a limit,
    /// [`blocking_await_termination`](Self::blocking_await_termination)
    /// returns `false` there instead.
    pub async fn terminated(&self) {
        wait(self.inner(), Awaited::Termination).await;
    }

    /// Waits at most `limit` for termination, wherever it is called from;
    /// whether the pool terminated.
    async fn terminated_within(&self, limit: Duration) -> bool {
        let began = Began::now();
        // Under a paused test clock, the pool's threads finishing their
        // work hold the clock, as `spawn_blocking` tasks do.
        let _hold = self.inner().clock_holds.hold();
        tokio::time::timeout_at(
            began.timer_deadline(limit),
            wait_settled(self.inner(), Awaited::Termination),
        )
        .await
        .is_ok()
    }

    /// Blocks the current thread until the pool terminates or `limit` passes
    /// (`None`: no limit); returns whether it terminated.
    ///
    /// For synchronous callers; do not call it on an async runtime's thread.
    /// With a limit, on one of this pool's own threads, it returns `false` at
    /// once: termination waits for that thread too.
    ///
    /// # Panics
    ///
    /// Without a limit, on one of this pool's own threads, as
    /// [`terminated`](Self::terminated) does.
    pub fn blocking_await_termination(&self, limit: Option<Duration>) -> bool {
        if limit.is_some() && self.inner().is_own_thread() {
            // Termination waits for this thread: it cannot come meanwhile.
            return false;
        }
        let until = limit.and_then(|l| Instant::now().checked_add(l));
        blocking_wait(self.inner(), Awaited::Termination, until)
    }

    /// Closes the pool in stages, in one call, and reports what was left
    /// behind.
    ///
    /// First a graceful shutdown, waiting up to `graceful` for termination;
    /// then, if needed, an immediate shutdown (queued jobs handed back, stop
    /// requested on running ones), waiting up to `after_stop` more.
    ///
    /// Returns a [`CloseReport`] naming what was left behind, and logs each
    /// still-running job at `warn`.
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
        let began = Began::now();
        let before = self.metrics();
        if self.inner().config.global {
            // The global pool ignores shutdown requests.
            return CloseReport {
                completed: 0,
                panicked: 0,
                unstarted: Vec::new(),
                still_running: self.running_jobs(),
                escalated: false,
                terminated: false,
                took: began.waited(),
            };
        }
        self.shutdown();
        let mut unstarted = Vec::new();
        // Each stage waits its whole budget, on the pool's own threads too
        // (a job closing its pool: queued jobs still run meanwhile).
        let mut terminated = self.terminated_within(graceful).await;
        let escalated = !terminated;
        if escalated {
            unstarted = self.shutdown_now();
            terminated = self.terminated_within(after_stop).await;
        }
        // One snapshot: a job finishing now is in exactly one of the two.
        let (after, still_running) = {
            let s = self.inner().lock();
            (s.snapshot(), s.running_jobs())
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
            took: began.waited(),
        }
    }

    /// The jobs whose functions are running now.
    ///
    /// ```
    /// let pool = offloader::Offloader::builder().build().unwrap();
    /// assert!(pool.running_jobs().is_empty());
    /// ```
    pub fn running_jobs(&self) -> Vec<RunningJob> {
        self.inner().lock().running_jobs()
    }
}

impl Inner {
    /// A graceful shutdown; `true` if this call started it. The global
    /// pool ignores it.
    pub(crate) fn shutdown(self: &Arc<Self>) -> bool {
        if self.config.global {
            tracing::debug!("the global offloader ignores shutdown requests");
            return false;
        }
        let mut after = After::default();
        let begun = {
            let mut s = self.lock();
            self.begin_shutdown(&mut s, &mut after)
        };
        self.after(after);
        begun.report()
    }

    /// Under the pool lock: begins a shutdown (graceful unless the caller
    /// goes on to drain the queue in the same critical section). Reported,
    /// after unlocking, by [`ShutdownBegun::report`].
    pub(crate) fn begin_shutdown(
        self: &Arc<Self>,
        s: &mut State,
        after: &mut After,
    ) -> ShutdownBegun {
        let started = s.begin_shutdown(after);
        // Undelivered events keep the pool from terminating: if their
        // thread failed to spawn, this is the last chance to try again.
        let delivery_error = self.ensure_delivery(s);
        ShutdownBegun {
            started,
            delivery_error,
        }
    }
}

/// What [`Inner::begin_shutdown`] did, for logging after unlocking.
pub(crate) struct ShutdownBegun {
    started: bool,
    delivery_error: Option<std::io::Error>,
}

impl ShutdownBegun {
    /// Logs what happened (outside the lock); `true` if this call started
    /// the shutdown.
    pub(crate) fn report(self) -> bool {
        warn_delivery(self.delivery_error);
        if self.started {
            tracing::debug!("offloader shutting down: new jobs are refused, queued jobs still run");
        }
        self.started
    }
}
