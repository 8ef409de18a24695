//! Leaf module: time for callers' waits.
//!
//! Two clocks meet here. A job's function runs on real threads in real
//! time, so its stop token's deadline is a `std` instant. A caller's wait is
//! timed by tokio's timer, so it is measured on tokio's clock too (one clock
//! for measuring and firing): under a paused test clock
//! (`#[tokio::test(start_paused = true)]`) a timeout fires and reports in
//! virtual time. And while a caller with a timeout waits for work running
//! on the pool's threads, [`ClockHolds::hold`] keeps tokio from
//! auto-advancing the paused clock, as tokio does itself while a
//! `spawn_blocking` task runs.
//!
//! Durations come from users and may be anything up to `Duration::MAX`:
//! every addition here is checked, and a huge limit means "no limit".

use std::time::{Duration, Instant};

use crate::util::slab::{Key, Slab};

/// Far enough ahead to mean "never" for a timer (about 30 years), near
/// enough that every timer implementation can hold it.
const NEVER: Duration = Duration::from_secs(86_400 * 365 * 30);

/// `began + limit`, or a far-future instant if that overflows or is beyond
/// what timers hold: a user's `Duration::MAX` means "no limit", not a panic.
pub(crate) fn deadline_after(began: Instant, limit: Duration) -> Instant {
    began
        .checked_add(limit.min(NEVER))
        .or_else(|| began.checked_add(Duration::from_secs(86_400)))
        .unwrap_or(began)
}

/// When a caller began to wait, on both clocks; read only for a caller
/// with a time limit (two clock reads saved per untimed submit).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Began(Option<Stamps>);

#[derive(Debug, Clone, Copy)]
struct Stamps {
    /// Real time: for the job's stop-token deadline.
    real: Instant,
    /// Tokio's clock: for the caller's timer and the time it reports.
    timer: tokio::time::Instant,
}

impl Began {
    pub(crate) fn now() -> Began {
        Began(Some(Stamps {
            real: Instant::now(),
            timer: tokio::time::Instant::now(),
        }))
    }

    /// [`now`](Self::now) if the caller has a time `limit`, else nothing
    /// read: an untimed wait never asks when it began.
    pub(crate) fn if_limited(limit: Option<Duration>) -> Began {
        match limit {
            Some(_) => Began::now(),
            None => Began(None),
        }
    }

    /// When the wait began in real time (`None` for an untimed caller).
    pub(crate) fn real(&self) -> Option<Instant> {
        self.0.map(|s| s.real)
    }

    /// When a wait of `limit` ends, on tokio's clock (from now if the
    /// beginning was not read).
    pub(crate) fn timer_deadline(&self, limit: Duration) -> tokio::time::Instant {
        let from = self.0.map_or_else(tokio::time::Instant::now, |s| s.timer);
        tokio::time::Instant::from_std(deadline_after(from.into_std(), limit))
    }

    /// How long the caller has waited, on tokio's clock (the clock its
    /// timer fires by); zero if the beginning was not read.
    pub(crate) fn waited(&self) -> Duration {
        self.0.map_or(Duration::ZERO, |s| s.timer.elapsed())
    }
}

/// Whether tokio's clock is paused here: it stands still while real time
/// moves. A running clock (tokio's `now` is std's, offset or not) gives two
/// different readings back to back, which costs two clock reads and ends
/// the check; two equal readings (a paused clock, or a coarse clock source)
/// are confirmed over 2 µs of real time.
fn tokio_clock_paused() -> bool {
    let first = tokio::time::Instant::now();
    if tokio::time::Instant::now() != first {
        return false;
    }
    let real = Instant::now();
    while real.elapsed() < Duration::from_micros(2) {
        std::hint::spin_loop();
    }
    tokio::time::Instant::now() == first
}

/// The runtime here if its clock is paused.
fn paused_runtime() -> Option<tokio::runtime::Handle> {
    let rt = tokio::runtime::Handle::try_current().ok()?;
    tokio_clock_paused().then_some(rt)
}

/// The paused-clock holds of one pool: while any caller waits on the
/// pool's work under a paused tokio clock, one blocking task (at most one
/// per pool, whatever the number of waiters) keeps tokio from
/// auto-advancing the clock, as tokio does itself while a `spawn_blocking`
/// task runs. Not while the pool's work has *stalled*, when only
/// something outside the pool can move it on: nothing runs and every
/// queued job waits for a limiter no running function holds (a timer
/// perhaps frees it), or the pool is idle and open (a wait for its
/// termination lasts until a caller shuts it down). The clock then moves,
/// and the first transition after the stall (a grant, a new job, the
/// shutdown) holds it again.
pub(crate) struct ClockHolds {
    // std's mutex in loom builds too: no proof rests on it.
    state: std::sync::Mutex<Holds>,
    /// Whether the pool's work has stalled (reads the pool's state).
    stalled: Box<dyn Fn() -> bool + Send + Sync>,
    /// Holds are registered but the task ended because the work stalled.
    dormant: std::sync::atomic::AtomicBool,
}

/// Some pool's holds went dormant in this process (only ever under a
/// paused test clock): a limiter that grants a permit then tells every
/// pool in its line, whose stall may have ended with it.
static ANY_DORMANT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether some pool's holds ever went dormant in this process.
pub(crate) fn any_dormant() -> bool {
    // ORDERING: a hint; set before the dormant flag it announces.
    ANY_DORMANT.load(std::sync::atomic::Ordering::Acquire)
}

#[derive(Default)]
struct Holds {
    /// Callers waiting on the pool as a whole now.
    waiting: usize,
    /// Callers waiting on one job each, with a test of whether that job's
    /// work is still going on: a finished job holds nothing, even if its
    /// caller has not looked at it yet (a stream that is not polled).
    jobs: Slab<Box<dyn Fn() -> bool + Send>>,
    /// The blocking task runs.
    running: bool,
    /// The runtime of the last hold: where a dormant hold's task starts
    /// again.
    runtime: Option<tokio::runtime::Handle>,
}

impl Holds {
    fn busy(&self) -> bool {
        self.waiting > 0 || self.jobs.values().any(|working| working())
    }
}

/// One caller's hold; dropping it (the wait ended) releases it.
pub(crate) struct ClockHold {
    holds: std::sync::Arc<ClockHolds>,
    /// Its entry in `Holds::jobs`, if it waits on one job.
    job: Option<Key>,
}

impl Drop for ClockHold {
    fn drop(&mut self) {
        let mut s = self.holds.lock();
        let working = match self.job {
            Some(key) => s.jobs.remove(key),
            None => {
                s.waiting -= 1;
                None
            }
        };
        drop(s);
        // Dropped after unlocking: it owns a reference to the job.
        drop(working);
    }
}

impl ClockHolds {
    /// The holds of a pool whose work has stalled when `stalled` says so.
    pub(crate) fn new(stalled: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        ClockHolds {
            state: std::sync::Mutex::default(),
            stalled: Box::new(stalled),
            dormant: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// After a transition of the pool (outside its lock): if the holds
    /// went dormant when the work stalled, holds the clock again while
    /// they wait (the next check lets it go if the work is still stalled).
    pub(crate) fn wake_if_dormant(self: &std::sync::Arc<Self>) {
        // ORDERING: set under the holds' lock before the task ends; a stale
        // `false` means no dormant hold was seen yet, and the task that
        // made it dormant re-checks the stall after setting it. The
        // process-wide flag, set first and never cleared, is looked at
        // first: read-only outside paused test clocks, its line is never
        // taken away from the submitters and workers that read it.
        if !any_dormant() || !self.dormant.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let runtime = {
            let mut s = self.lock();
            if !self
                .dormant
                .swap(false, std::sync::atomic::Ordering::AcqRel)
                || s.running
                || !s.busy()
            {
                return;
            }
            s.running = true;
            s.runtime.clone()
        };
        self.start_task(runtime);
    }

    fn start_task(self: &std::sync::Arc<Self>, runtime: Option<tokio::runtime::Handle>) {
        let task = HoldTask {
            holds: self.clone(),
            ended: false,
        };
        match runtime {
            // A runtime shutting down drops the task unrun: `HoldTask`'s
            // drop then lets the next hold start another.
            Some(rt) => drop(rt.spawn_blocking(move || task.run())),
            None => drop(task),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Holds> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// If tokio's clock is paused here, holds it for as long as the
    /// returned guard lives. `None` (and nothing spawned) with a running
    /// clock or outside a runtime.
    pub(crate) fn hold(self: &std::sync::Arc<Self>) -> Option<ClockHold> {
        let rt = paused_runtime()?;
        Some(self.hold_on(rt, None))
    }

    /// [`hold`](Self::hold) for a caller waiting on one job: the clock is
    /// held only while `working()` says the job's work goes on.
    pub(crate) fn hold_while(
        self: &std::sync::Arc<Self>,
        working: impl Fn() -> bool + Send + 'static,
    ) -> Option<ClockHold> {
        // Boxed only under a paused clock: an await that found its job
        // still running allocates nothing for this.
        let rt = paused_runtime()?;
        Some(self.hold_on(rt, Some(Box::new(working))))
    }

    fn hold_on(
        self: &std::sync::Arc<Self>,
        rt: tokio::runtime::Handle,
        working: Option<Box<dyn Fn() -> bool + Send>>,
    ) -> ClockHold {
        let (start, job) = {
            let mut s = self.lock();
            let job = match working {
                Some(w) => Some(s.jobs.insert(w)),
                None => {
                    s.waiting += 1;
                    None
                }
            };
            s.runtime = Some(rt.clone());
            (!std::mem::replace(&mut s.running, true), job)
        };
        if start {
            self.dormant
                .store(false, std::sync::atomic::Ordering::Release);
            self.start_task(Some(rt));
        }
        ClockHold {
            holds: self.clone(),
            job,
        }
    }
}

/// The blocking task holding the clock: polls every millisecond of real
/// time until no caller waits on work still going on, or the pool's work
/// stalls (test clocks only). A hold taken later, or the pool's next
/// transition after a stall, starts another.
struct HoldTask {
    holds: std::sync::Arc<ClockHolds>,
    /// It ran and cleared `running` itself.
    ended: bool,
}

impl HoldTask {
    fn run(mut self) {
        loop {
            // Reads the pool's state outside the holds' lock (the check
            // may hold the last reference to the pool).
            let stalled = (self.holds.stalled)();
            {
                let mut s = self.holds.lock();
                if !s.busy() {
                    // Under the lock: a hold taken after this starts a task.
                    s.running = false;
                    self.ended = true;
                    return;
                }
                if stalled {
                    s.running = false;
                    self.ended = true;
                    ANY_DORMANT.store(true, std::sync::atomic::Ordering::Release);
                    self.holds
                        .dormant
                        .store(true, std::sync::atomic::Ordering::Release);
                    drop(s);
                    // A transition between the check and the flag saw no
                    // dormant hold: look once more.
                    if !(self.holds.stalled)() {
                        self.holds.wake_if_dormant();
                    }
                    return;
                }
            }
            std::thread::park_timeout(Duration::from_millis(1));
        }
    }
}

impl Drop for HoldTask {
    fn drop(&mut self) {
        if !self.ended {
            // Dropped unrun (a runtime shutting down): the next hold starts
            // another.
            self.holds.lock().running = false;
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A hold task dropped unrun (its runtime shutting down, or none to
    /// run on) clears `running`, so that the next hold starts another; one
    /// that ran leaves `running` to whoever set it since.
    #[test]
    fn a_hold_task_dropped_unrun_lets_the_next_hold_start_one() {
        let holds = std::sync::Arc::new(ClockHolds::new(|| false));
        holds.lock().running = true;
        holds.start_task(None);
        assert!(!holds.lock().running, "dropped unrun: running cleared");

        holds.lock().running = true;
        drop(HoldTask {
            holds: holds.clone(),
            ended: true,
        });
        assert!(holds.lock().running, "a task that ran leaves running alone");
    }

    /// `deadline_after` caps a huge limit at about thirty years ahead.
    #[test]
    fn a_huge_limit_is_capped_far_ahead() {
        let now = Instant::now();
        let far = deadline_after(now, Duration::MAX);
        assert_eq!(far, now + NEVER);
        assert!(NEVER >= Duration::from_secs(86_400 * 365 * 29));
    }
}
