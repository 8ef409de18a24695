//! Leaf module: time for callers' waits.
//!
//! Two clocks meet here. A job's function runs on real threads in real
//! time, so its stop token's deadline is a `std` instant. A caller's wait is
//! timed by tokio's timer, so it is measured on tokio's clock too (one clock
//! for measuring and firing): under a paused test clock
//! (`#[tokio::test(start_paused = true)]`) a timeout fires and reports in
//! virtual time. And while a caller with a timeout waits for work running
//! on the pool's threads, [`hold_paused_clock`] keeps tokio from
//! auto-advancing the paused clock, as tokio does itself while a
//! `spawn_blocking` task runs.
//!
//! Durations come from users and may be anything up to `Duration::MAX`:
//! every addition here is checked, and a huge limit means "no limit".

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

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

/// When a caller began to wait, on both clocks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Began {
    /// Real time: for the job's stop-token deadline.
    pub(crate) real: Instant,
    /// Tokio's clock: for the caller's timer and the time it reports.
    timer: tokio::time::Instant,
}

impl Began {
    pub(crate) fn now() -> Began {
        Began {
            real: Instant::now(),
            timer: tokio::time::Instant::now(),
        }
    }

    /// When a wait of `limit` ends, on tokio's clock.
    pub(crate) fn timer_deadline(&self, limit: Duration) -> tokio::time::Instant {
        tokio::time::Instant::from_std(deadline_after(self.timer.into_std(), limit))
    }

    /// How long the caller has waited, on tokio's clock (the clock its
    /// timer fires by).
    pub(crate) fn waited(&self) -> Duration {
        self.timer.elapsed()
    }
}

/// Whether tokio's clock is paused here. Without tokio's `test-util`, and
/// with a running clock, tokio's `now` *is* std's `now`: read back to back,
/// the two differ by the time between the reads. A paused clock stands
/// still (real time runs away from it) or was advanced past real time. Two
/// clock reads; it misses only a clock paused in the last 50 µs.
fn tokio_clock_paused() -> bool {
    let tokio_now = tokio::time::Instant::now().into_std();
    let real = Instant::now();
    tokio_now > real || real.duration_since(tokio_now) > Duration::from_micros(50)
}

/// While alive, a blocking task on the caller's runtime keeps tokio's
/// paused clock from auto-advancing, for as long as `busy()` holds.
#[derive(Debug)]
pub(crate) struct ClockHold {
    done: std::sync::Arc<AtomicBool>,
}

impl Drop for ClockHold {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Release);
    }
}

/// If tokio's clock is paused, holds it (see [`ClockHold`]) while `busy()`
/// is true: a timed wait on work running on the pool's threads then sees
/// that work finish before its timer fires, as with `spawn_blocking`.
/// `None` (and nothing spawned) with a running clock or no runtime.
pub(crate) fn hold_paused_clock(busy: impl Fn() -> bool + Send + 'static) -> Option<ClockHold> {
    let rt = tokio::runtime::Handle::try_current().ok()?;
    if !tokio_clock_paused() {
        return None;
    }
    let done = std::sync::Arc::new(AtomicBool::new(false));
    let over = done.clone();
    // Tokio does not auto-advance a paused clock while a blocking task
    // runs. Polls every millisecond of real time: test clocks only.
    let _detached = rt.spawn_blocking(move || {
        while !over.load(Ordering::Acquire) && busy() {
            std::thread::park_timeout(Duration::from_millis(1));
        }
    });
    Some(ClockHold { done })
}
