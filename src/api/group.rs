//! Job groups: a set of jobs to stop, wait for and close together, nested
//! like cancel scopes. The bookkeeping lives in the pool's locked state
//! (`state/groups.rs`, invariants G1–G4); this module is the handle.

use std::fmt;
use std::future::poll_fn;
use std::task::Poll;
use std::time::Duration;

use crate::core::metrics::GroupMetrics;
use crate::core::pool::{Inner, Offloader};
use crate::core::report::{CloseReport, RunningJob, UnstartedJob};
use crate::core::state::{After, StoppedJobs};
use crate::job::policy::GroupDropPolicy;
use crate::util::clock::Began;
use crate::util::slab::Key;
use crate::util::sync::{Arc, AtomicBool, Ordering};

/// A set of jobs of one [`Offloader`] that are stopped, awaited and closed
/// together, without shutting the pool down.
///
/// Created by [`Offloader::group`]; nested with [`child`](Self::child).
///
/// Offload through the group as through the pool
/// ([`JobGroup::offload`]). [`stop`](Self::stop) cancels the group's queued
/// jobs and sets the stop token of its running ones, in the group and in
/// every descendant (a child's stop does not reach its parent);
/// [`idle`](Self::idle) waits until all of them are terminal;
/// [`close`](Self::close) does both in stages, with a report. Permits
/// follow the functions' real runs, as for every job: a stopped job keeps
/// its permit until its function returns.
///
/// Cloning gives another handle to the same group. When the last handle is
/// dropped, its [`GroupDropPolicy`] applies (default: the jobs go on). A
/// group handle, like an [`Offload`](crate::Offload) not yet submitted and
/// a [`Map`](crate::Map) stream, holds an [`Offloader`]
/// clone: the pool does not start its graceful shutdown on the drop of its
/// last other clone while one lives (keep a group out of the pool's own
/// observer, or it keeps the pool open for good).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// let pool = offloader::Offloader::builder().max_in_flight(1).build()?;
/// let reads = pool.group();
/// let (started_tx, started_rx) = std::sync::mpsc::channel();
/// let slow = reads.offload(move |stop| {
///     started_tx.send(()).ok();
///     stop.sleep(Duration::from_secs(60))
/// }).spawn()?;
/// let queued = reads.offload(|_stop| "never runs").spawn()?;
/// started_rx.recv()?;
/// reads.stop();
/// assert!(queued.await.unwrap_err().is_cancelled());
/// assert!(slow.await?.is_err()); // its sleep saw the stop request
/// reads.idle().await;
/// assert_eq!(reads.metrics().cancelled, 1);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct JobGroup {
    pub(crate) pool: Offloader,
    shared: Arc<Shared>,
}

/// What the clones of one group handle share; its drop is the group's.
struct Shared {
    inner: Arc<Inner>,
    key: Key,
    stop_on_drop: AtomicBool,
}

impl Offloader {
    /// A new, empty [`JobGroup`] of this pool.
    pub fn group(&self) -> JobGroup {
        JobGroup::new(self.clone(), None)
    }
}

impl JobGroup {
    fn new(pool: Offloader, parent: Option<Key>) -> JobGroup {
        let inner = pool.inner().clone();
        let key = inner.lock().groups.create(parent);
        JobGroup {
            pool,
            shared: Arc::new(Shared {
                inner,
                key,
                stop_on_drop: AtomicBool::new(false),
            }),
        }
    }

    /// A new group nested in this one: stopping or closing this group stops or
    /// closes the child too; the child's stop does not reach this group.
    ///
    /// This group's [`metrics`](Self::metrics) and [`idle`](Self::idle) include
    /// the child's jobs. A child of a stopped group is born stopped.
    pub fn child(&self) -> JobGroup {
        JobGroup::new(self.pool.clone(), Some(self.shared.key))
    }

    /// Sets what dropping the last handle to this group does (for every
    /// clone of it).
    pub fn on_drop(self, policy: GroupDropPolicy) -> JobGroup {
        // ORDERING: read by the last handle's drop, which synchronises with
        // every clone's drop through the `Arc`.
        self.shared
            .stop_on_drop
            .store(policy == GroupDropPolicy::Stop, Ordering::Relaxed);
        self
    }

    pub(crate) fn key(&self) -> Key {
        self.shared.key
    }

    /// Stops the group and its descendants.
    ///
    /// New offloads through them are refused
    /// ([`Error::Cancelled`](crate::Error::Cancelled), `id: None`), queued jobs
    /// are cancelled (they never run; their owners see
    /// [`Error::Cancelled`](crate::Error::Cancelled)) and running ones get
    /// their stop token set (they keep their permits until they return).
    ///
    /// Returns `false` if the group was already stopped.
    pub fn stop(&self) -> bool {
        self.shared.stop().is_some()
    }

    /// A consistent snapshot of the counts of the group's jobs, its
    /// descendants' included.
    pub fn metrics(&self) -> GroupMetrics {
        self.shared.inner.lock().groups.metrics(self.shared.key)
    }

    /// Waits until every job accepted through the group or a descendant is
    /// terminal and its outcome published.
    ///
    /// Jobs offloaded while it waits are waited for too. Only this group's
    /// waiters are woken when it becomes idle.
    ///
    /// Under a paused tokio clock, the wait holds the clock while the
    /// group's jobs run on real threads, as the pool's own waits do.
    ///
    /// # Panics
    ///
    /// If called from a job of this group or of a descendant (the wait
    /// includes that job's end, so it could never return), or from code a
    /// worker of the pool runs between jobs (a waker, a result's drop),
    /// where the job it just ran may still count.
    pub async fn idle(&self) {
        let (inner, key) = (&self.shared.inner, self.shared.key);
        if inner.is_worker_thread() {
            // In a job of the group, or between jobs (a waker or a drop
            // the worker runs, while the job it just ran, of the group
            // perhaps, is still counted): it would wait for itself.
            let own = match crate::util::sync::current_job() {
                Some(job) => inner.lock().job_in_group(job, key),
                None => true,
            };
            if own {
                panic!(
                    "offloader: JobGroup::idle() awaited from a job of that group (or from a \
                     waker or drop its worker runs between jobs); it waits for this thread's \
                     work to end and would never return. Wait from outside the pool."
                );
            }
        }
        self.idle_settled().await;
    }

    /// [`idle`](Self::idle) without the refusal of a wait that could never
    /// end on the pool's own threads: for a wait with a limit (`close`).
    async fn idle_settled(&self) {
        let (inner, key) = (&self.shared.inner, self.shared.key);
        let Some(list) = inner.lock().groups.wait_list(key) else {
            return;
        };
        let mut waiter = list.registration();
        let mut hold = None;
        poll_fn(|cx| {
            // Registered before the test: a wake-up after it is not lost.
            waiter.set(cx.waker());
            if inner.lock().groups.idle(key) {
                return Poll::Ready(());
            }
            if hold.is_none() {
                hold = inner.clock_holds.hold();
            }
            Poll::Pending
        })
        .await;
    }

    /// The running jobs of the group and its descendants.
    pub fn running_jobs(&self) -> Vec<RunningJob> {
        self.shared.inner.lock().group_running_jobs(self.shared.key)
    }

    /// Closes the group in stages, without shutting the pool down.
    ///
    /// New offloads through it (and its descendants) are refused at once, for
    /// good (its [`GroupMetrics::closed`]); its jobs get up to `graceful` to
    /// finish; then, if needed, the group is [stopped](Self::stop) and gets up
    /// to `after_stop` more.
    ///
    /// The report's `unstarted` lists the queued jobs the stop cancelled;
    /// `terminated` says whether the group went idle.
    ///
    /// Under a paused tokio clock the budgets are measured on that clock,
    /// which the waits hold while the group's jobs run (see
    /// [`idle`](Self::idle)): a job that never returns keeps the close
    /// waiting until the test advances the clock itself.
    ///
    /// # Panics
    ///
    /// Needs a tokio runtime with the time driver.
    pub async fn close(&self, graceful: Duration, after_stop: Duration) -> CloseReport {
        let began = Began::now();
        let before = self.metrics();
        let mut after = crate::core::state::After::default();
        self.shared
            .inner
            .lock()
            .group_close(self.shared.key, &mut after);
        self.shared.inner.after(after);
        let mut unstarted = Vec::new();
        let mut idle = self.idle_within(graceful).await;
        let escalated = !idle;
        if escalated {
            unstarted = self.shared.stop().unwrap_or_default();
            idle = self.idle_within(after_stop).await;
        }
        let (after, still_running) = {
            let s = self.shared.inner.lock();
            (
                s.groups.metrics(self.shared.key),
                s.group_running_jobs(self.shared.key),
            )
        };
        CloseReport {
            completed: after.completed - before.completed,
            panicked: after.panicked - before.panicked,
            unstarted,
            still_running,
            escalated,
            terminated: idle,
            took: began.waited(),
        }
    }

    async fn idle_within(&self, limit: Duration) -> bool {
        let began = Began::now();
        tokio::time::timeout_at(began.timer_deadline(limit), self.idle_settled())
            .await
            .is_ok()
    }
}

impl Shared {
    /// Stops the group: [`stop_group`].
    fn stop(&self) -> Option<Vec<UnstartedJob>> {
        stop_group(&self.inner, self.key)
    }
}

/// Stops group `key` of `inner` (G2 of state/groups.rs), which a handle or
/// a `stop_on` watch keeps (G3); `None` if it already was stopped. Returns
/// the queued jobs it cancelled.
pub(crate) fn stop_group(inner: &Inner, key: Key) -> Option<Vec<UnstartedJob>> {
    let mut after = After::default();
    let stopped = inner.lock().group_stop(key, &mut after);
    inner.after(after);
    stopped.map(|stopped| after_stop(inner, stopped))
}

/// After unlocking: discards the cancelled jobs' functions and runs the
/// stopped ones' stop callbacks. Returns the cancelled jobs.
fn after_stop(inner: &Inner, stopped: StoppedJobs) -> Vec<UnstartedJob> {
    let StoppedJobs { cancelled, running } = stopped;
    let now = crate::job::id::now_ns();
    let report = cancelled
        .iter()
        .map(|task| UnstartedJob::of(task.core(), now))
        .collect();
    inner.discard_cancelled(cancelled);
    for task in &running {
        crate::job::stop::run_stop_callbacks(&**task);
    }
    crate::util::quiet::drop_quietly(running);
    report
}

impl Drop for Shared {
    fn drop(&mut self) {
        // ORDERING: see `JobGroup::on_drop`.
        let stop = self.stop_on_drop.load(Ordering::Relaxed);
        let mut after = After::default();
        // One critical section: once the handle is gone the record may be
        // too, and its key reused by another group.
        let stopped = {
            let mut s = self.inner.lock();
            let stopped = if stop {
                s.group_stop(self.key, &mut after)
            } else {
                None
            };
            s.groups.handle_dropped(self.key, &mut after);
            stopped
        };
        self.inner.after(after);
        if let Some(stopped) = stopped {
            after_stop(&self.inner, stopped);
        }
    }
}

impl fmt::Debug for JobGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobGroup")
            .field("metrics", &self.metrics())
            .finish()
    }
}
