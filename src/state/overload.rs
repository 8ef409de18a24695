//! Overload: the pool's estimate of how long a run takes ([`Pace`]), and
//! the two decisions it feeds, so that a pool under more load than it can
//! serve refuses early and finishes what it starts instead of running
//! work whose caller is gone:
//!
//! - **admission** ([`State::would_miss_at_admission`]): a job is refused
//!   ([`Error::Overloaded`](crate::Error::Overloaded), `id: None`) when the
//!   jobs ahead of it and its own run would take longer than the time left
//!   before its deadline. A caller refused for a full queue is judged as if
//!   it waited behind the whole bound and every caller already waiting for
//!   room: if waiting cannot help, it is refused now, not at its timeout.
//! - **start** ([`State::shed_at_turn`]): a job whose turn comes with less
//!   time left than a run takes is *shed*: `Queued → Shed`, like a cancel,
//!   and its caller gets [`Error::Overloaded`](crate::Error::Overloaded)
//!   with its id. It never takes a permit.
//!
//! Only a job with a deadline whose abandon policy cancels it is judged
//! (`JobCore::shed_deadline`): nobody wants it late. Under
//! [`AbandonPolicy::Keep`](crate::AbandonPolicy::Keep) a job's caller may
//! leave and still want the work done, so such a job is never refused or
//! shed for time.
//!
//! And a job is judged only when another job could use its place: not at
//! admission if it would start at once on a free permit, nor at its turn
//! if no other job is queued. A pool that is not overloaded runs whatever
//! it is given, and every run it finishes corrects the estimate: one very
//! long run cannot leave the pool refusing every job for good.
//!
//! The estimate is the mean and mean deviation of recent run times, as TCP
//! estimates a round trip (RFC 6298: gains 1/8 and 1/4): a run *needs*
//! `mean + 2·deviation`, and the jobs ahead take `mean` each, `permits` at
//! a time. Only runs that ended on their own count: a function stopped at
//! its caller's timeout ran short, and counting it would make the pool
//! think runs are quicker than they are just when it is overloaded.
//! Until a first run has ended there is no estimate and nothing is judged.

use std::time::{Duration, Instant};

use super::{After, State};
use crate::job_core::JobCore;

/// Recent run times: a mean and a mean deviation, in nanoseconds.
#[derive(Default)]
pub(super) struct Pace {
    mean: u64,
    dev: u64,
    known: bool,
    /// Test hook: no estimate is kept.
    off: bool,
}

impl Pace {
    /// Counts a run of `ran` that ended on its own.
    pub(super) fn record(&mut self, ran: Duration) {
        let ran = u64::try_from(ran.as_nanos()).unwrap_or(u64::MAX);
        if self.off {
            return;
        }
        if !self.known {
            self.known = true;
            self.mean = ran;
            self.dev = ran / 2;
            return;
        }
        let gap = ran.abs_diff(self.mean);
        // dev += (|gap| - dev) / 4; mean += (ran - mean) / 8.
        self.dev = self.dev - self.dev / 4 + gap / 4;
        self.mean = if ran >= self.mean {
            self.mean + gap / 8
        } else {
            self.mean - gap / 8
        };
    }

    /// What a run is expected to need: `mean + 2·deviation`.
    fn need(&self) -> Option<Duration> {
        self.known
            .then(|| Duration::from_nanos(self.mean.saturating_add(self.dev.saturating_mul(2))))
    }

    /// How long `ahead` jobs take on `permits` permits.
    fn wait_behind(&self, ahead: usize, permits: usize) -> Duration {
        let ahead = u64::try_from(ahead).unwrap_or(u64::MAX);
        let permits = u64::try_from(permits.max(1)).unwrap_or(u64::MAX);
        Duration::from_nanos(self.mean.saturating_mul(ahead) / permits)
    }
}

impl State {
    /// Test hook (`Offloader::__judge_no_deadlines`): forgets the estimate
    /// and keeps none.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn judge_no_deadlines(&mut self) {
        self.pace = Pace {
            off: true,
            ..Pace::default()
        };
    }

    /// Counts the run time of a job whose function returned on its own
    /// (not stopped, not panicked) in the pool's estimate.
    pub(super) fn record_run(&mut self, core: &JobCore, panicked: bool, ran: Duration) {
        if !panicked && !core.is_stop_requested() {
            self.pace.record(ran);
        }
    }

    /// Whether the new job of `core` would miss its deadline behind
    /// `ahead` jobs waiting for a permit: refused then. Not with a free
    /// permit it would take at once.
    pub(super) fn would_miss_at_admission(&self, core: &JobCore, ahead: usize) -> bool {
        let Some(deadline) = core.shed_deadline() else {
            return false;
        };
        let Some(need) = self.pace.need() else {
            return false;
        };
        if self.would_start_at_once(core, self.free_permits()) {
            return false;
        }
        let wait = self.pace.wait_behind(ahead, self.max_in_flight);
        let left = deadline.saturating_duration_since(Instant::now());
        left < wait.saturating_add(need)
    }

    /// Where a caller waiting for room would be: behind the whole bound
    /// and every caller already waiting for room.
    pub(super) fn ahead_of_a_room_waiter(&self) -> usize {
        self.bound
            .capacity()
            .saturating_add(self.waiters.room_count())
    }

    /// At its turn, sheds the queued job of `core` if too little time is
    /// left before its deadline for a run and another job is queued to
    /// take its place: transition *shed*, `Queued → Shed`, as a cancel
    /// (S2: it stays linked as a tombstone), its function discarded after
    /// unlocking. `true` if it did. `now` is read once per start, when the
    /// first job that may be shed is seen.
    pub(super) fn shed_at_turn(
        &mut self,
        core: &JobCore,
        now: &mut Option<Instant>,
        after: &mut After,
    ) -> bool {
        let Some(deadline) = core.shed_deadline() else {
            return false;
        };
        let Some(need) = self.pace.need() else {
            return false;
        };
        if self.queued < 2 {
            return false;
        }
        let now = *now.get_or_insert_with(Instant::now);
        if deadline.saturating_duration_since(now) >= need {
            return false;
        }
        self.shed(core, after)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The first run sets the estimate; later runs move it by an eighth of
    /// their gap (the mean) and a quarter of the gap's change (the
    /// deviation).
    #[test]
    fn the_estimate_follows_runs_as_tcp_follows_round_trips() {
        let mut p = Pace::default();
        assert_eq!(p.need(), None);
        p.record(Duration::from_millis(80));
        assert_eq!((p.mean, p.dev), (80_000_000, 40_000_000));
        assert_eq!(p.need(), Some(Duration::from_millis(160)));
        p.record(Duration::from_millis(160));
        // gap 80 ms: dev = 40 - 10 + 20 = 50; mean = 80 + 10 = 90.
        assert_eq!((p.mean, p.dev), (90_000_000, 50_000_000));
        p.record(Duration::from_millis(10));
        // gap 80 ms: dev = 50 - 12.5 + 20 = 57.5; mean = 90 - 10 = 80.
        assert_eq!((p.mean, p.dev), (80_000_000, 57_500_000));
        assert_eq!(p.need(), Some(Duration::from_millis(195)));
        // Jobs ahead share the permits.
        assert_eq!(p.wait_behind(6, 4), Duration::from_millis(120));
        assert_eq!(p.wait_behind(6, 0), Duration::from_millis(480));
    }

    /// Runs of a steady length converge on it, with the deviation decaying.
    #[test]
    fn steady_runs_converge() {
        let mut p = Pace::default();
        for _ in 0..200 {
            p.record(Duration::from_millis(20));
        }
        assert_eq!(p.mean, 20_000_000);
        assert!(p.dev < 1_000, "{}", p.dev);
    }

    /// Extreme runs saturate instead of overflowing.
    #[test]
    fn extreme_runs_saturate() {
        let mut p = Pace::default();
        p.record(Duration::MAX);
        p.record(Duration::ZERO);
        assert!(p.need().is_some());
        assert!(p.wait_behind(usize::MAX, 1) > Duration::ZERO);
    }
}
