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

use crate::slab::{Key, Slab};

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

/// The paused-clock holds of one pool: while any caller waits on the
/// pool's work under a paused tokio clock, one blocking task (at most one
/// per pool, whatever the number of waiters) keeps tokio from
/// auto-advancing the clock, as tokio does itself while a `spawn_blocking`
/// task runs.
#[derive(Debug, Default)]
pub(crate) struct ClockHolds {
    // std's mutex in loom builds too: no proof rests on it.
    state: std::sync::Mutex<Holds>,
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
}

impl Holds {
    fn busy(&self) -> bool {
        self.waiting > 0 || self.jobs.values().any(|working| working())
    }
}

impl std::fmt::Debug for Holds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Holds")
            .field("waiting", &self.waiting)
            .field("running", &self.running)
            .finish_non_exhaustive()
    }
}

/// One caller's hold; dropping it (the wait ended) releases it.
#[derive(Debug)]
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
    fn lock(&self) -> std::sync::MutexGuard<'_, Holds> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// If tokio's clock is paused here, holds it for as long as the
    /// returned guard lives. `None` (and nothing spawned) with a running
    /// clock or outside a runtime.
    pub(crate) fn hold(self: &std::sync::Arc<Self>) -> Option<ClockHold> {
        self.hold_on(None)
    }

    /// [`hold`](Self::hold) for a caller waiting on one job: the clock is
    /// held only while `working()` says the job's work goes on.
    pub(crate) fn hold_while(
        self: &std::sync::Arc<Self>,
        working: impl Fn() -> bool + Send + 'static,
    ) -> Option<ClockHold> {
        self.hold_on(Some(Box::new(working)))
    }

    fn hold_on(
        self: &std::sync::Arc<Self>,
        working: Option<Box<dyn Fn() -> bool + Send>>,
    ) -> Option<ClockHold> {
        let rt = tokio::runtime::Handle::try_current().ok()?;
        if !tokio_clock_paused() {
            return None;
        }
        let (start, job) = {
            let mut s = self.lock();
            let job = match working {
                Some(w) => Some(s.jobs.insert(w)),
                None => {
                    s.waiting += 1;
                    None
                }
            };
            (!std::mem::replace(&mut s.running, true), job)
        };
        if start {
            let task = HoldTask {
                holds: self.clone(),
                ended: false,
            };
            // A runtime shutting down drops the task unrun: `HoldTask`'s
            // drop then lets the next hold start another.
            drop(rt.spawn_blocking(move || task.run()));
        }
        Some(ClockHold {
            holds: self.clone(),
            job,
        })
    }
}

/// The blocking task holding the clock: polls every millisecond of real
/// time until no caller waits on work still going on (test clocks only). A
/// hold taken later starts another.
struct HoldTask {
    holds: std::sync::Arc<ClockHolds>,
    /// It ran and cleared `running` itself.
    ended: bool,
}

impl HoldTask {
    fn run(mut self) {
        loop {
            {
                let mut s = self.holds.lock();
                if !s.busy() {
                    // Under the lock: a hold taken after this starts a task.
                    s.running = false;
                    self.ended = true;
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
