//! Overload: an estimate of how long a run takes ([`Pace`], one per lane),
//! and the two decisions it feeds, so that a pool under more load than it
//! can serve refuses early and finishes what it starts instead of running
//! work whose caller is gone:
//!
//! - **admission** ([`State::would_miss_at_admission`]): a job is refused
//!   ([`Error::Overloaded`](crate::Error::Overloaded), `id: None`) when the
//!   jobs queued ahead of it in its lane, sharing the permits its lane may
//!   use, and its own run would take longer than the time left before its
//!   deadline. A caller refused for a full queue is judged as if it waited
//!   behind the whole bound and every caller already waiting for room: if
//!   waiting cannot help, it is refused now, not at its timeout.
//! - **start** ([`State::shed_at_turn`]): a job whose turn comes with less
//!   time left than a run needs is *shed*: `Queued → Shed`, like a cancel,
//!   and its caller gets [`Error::Overloaded`](crate::Error::Overloaded)
//!   with its id. It never takes a permit.
//!
//! Only a job with a deadline whose abandon policy cancels it is judged
//! (`JobCore::shed_deadline`): nobody wants it late. Under
//! [`AbandonPolicy::Keep`](crate::AbandonPolicy::Keep) a job's caller may
//! leave and still want the work done, so such a job is never refused or
//! shed for time.
//!
//! And a job is judged only when other jobs would use its place: not at
//! admission if it would start at once on a free permit, nor at its turn
//! unless the other startable queued jobs would take every free permit,
//! its own included. A pool that is not overloaded runs whatever it is
//! given, and every run it finishes corrects the estimate: one very long
//! run cannot leave the pool refusing every job for good.
//!
//! The estimate is the mean and mean deviation of the lane's recent run
//! times (a key's lane, a set of limiters' lane, or the default lane of
//! every other job), as TCP estimates a round trip (RFC 6298: gains 1/8
//! and 1/4). Admission asks that the jobs ahead, the running ones' rest
//! and the job's own run each get `mean + 4·deviation` (TCP's
//! retransmission timeout), as many at a time as the lane may run; the
//! start sheds a job only with less than `mean + deviation` left. The
//! margin between the two is on purpose: a job admitted is rarely shed at
//! its turn, where its caller's answer is no longer immediate. A run that was
//! stopped (its caller's timeout, say) ran at least that long: it counts
//! only if it is longer than the mean, so that stopped runs can raise the
//! estimate but never pull it down just when the pool is overloaded. A
//! run that panicked does not count. Until a lane's first run has ended
//! it has no estimate and nothing in it is judged.

use std::time::{Duration, Instant};

use super::{After, State};
use crate::job::record::JobCore;

/// The deviations beyond the mean that admission asks of each run it
/// counts (TCP's retransmission timeout, RFC 6298 §2)...
const ADMIT: u64 = 4;
/// ... and that the start asks of a job's own run. Measured in the service
/// benchmark at three times its capacity: 4 and 1 shed fewer than one job
/// in a hundred at its turn and stop fewer than one in a hundred started,
/// where 2 and 2 shed twelve in a hundred.
const START: u64 = 1;

/// The most jobs shed at their turn in one critical section: a burst
/// admitted before its lane had an estimate may meet its deadlines all at
/// once, and the pool lock is held for one chunk of it at a time, as
/// `shutdown_now` drains (the worker that shed looks again after
/// discarding them).
pub(super) const SHED_CHUNK: usize = 1024;

/// Recent run times: a mean and a mean deviation, in nanoseconds.
#[derive(Default)]
pub(super) struct Pace {
    mean: u64,
    dev: u64,
    known: bool,
}

impl Pace {
    /// Counts a run of `ran`; a `stopped` one only if it raises the mean
    /// (it would have run longer).
    pub(super) fn record(&mut self, ran: Duration, stopped: bool) {
        let ran = u64::try_from(ran.as_nanos()).unwrap_or(u64::MAX);
        if stopped && self.known && ran <= self.mean {
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

    /// What a run needs: `mean + k·deviation`, with `k` = [`ADMIT`] or
    /// [`START`].
    fn need(&self, k: u64) -> Option<Duration> {
        self.known.then(|| Duration::from_nanos(self.need_ns(k)))
    }

    fn need_ns(&self, k: u64) -> u64 {
        self.mean.saturating_add(self.dev.saturating_mul(k))
    }

    /// How long a job waits for a permit behind `ahead` queued jobs, all
    /// `permits` busy: until the running jobs and those ahead have had a
    /// run's need each, `permits` at a time.
    fn wait_behind(&self, ahead: usize, permits: usize) -> Duration {
        let turns = u64::try_from(ahead).unwrap_or(u64::MAX).saturating_add(1);
        let permits = u64::try_from(permits.max(1)).unwrap_or(u64::MAX);
        Duration::from_nanos(self.need_ns(ADMIT).saturating_mul(turns) / permits)
    }
}

impl State {
    /// Test hook (`Offloader::__judge_no_deadlines`): no job is judged.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn judge_no_deadlines(&mut self) {
        self.judge = false;
    }

    /// Whether the new job of `core` would miss its deadline: behind the
    /// jobs queued in its lane, or behind `ahead` jobs if given (a caller
    /// that would wait for room). Refused then. Not with a free permit it
    /// would take at once.
    pub(super) fn would_miss_at_admission(&self, core: &JobCore, ahead: Option<usize>) -> bool {
        let Some(deadline) = core.shed_deadline() else {
            return false;
        };
        if !self.judge || self.would_start_at_once(core, self.free_permits()) {
            return false;
        }
        let Some((pace, queued, permits)) = self.lane_load(core) else {
            return false;
        };
        let Some(need) = pace.need(ADMIT) else {
            return false;
        };
        let wait = pace.wait_behind(ahead.unwrap_or(queued), permits);
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
    /// left before its deadline for a run and the other startable queued
    /// jobs would take every free permit: transition *shed*, `Queued →
    /// Shed`, as a cancel (S2: it stays linked as a tombstone), its
    /// function discarded after unlocking. `true` if it did. `now` is read
    /// once per start, when the first job that may be shed is seen.
    pub(super) fn shed_at_turn(
        &mut self,
        core: &JobCore,
        now: &mut Option<Instant>,
        after: &mut After,
    ) -> bool {
        let Some(deadline) = core.shed_deadline() else {
            return false;
        };
        // This job is one of the startable ones.
        if !self.judge || self.lanes.startable_queued().saturating_sub(1) < self.free_permits() {
            return false;
        }
        let Some(need) = self.lane_pace(core).and_then(|p| p.need(START)) else {
            return false;
        };
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
        assert_eq!(p.need(START), None);
        p.record(Duration::from_millis(80), false);
        assert_eq!((p.mean, p.dev), (80_000_000, 40_000_000));
        assert_eq!(p.need(START), Some(Duration::from_millis(120)));
        p.record(Duration::from_millis(160), false);
        // gap 80 ms: dev = 40 - 10 + 20 = 50; mean = 80 + 10 = 90.
        assert_eq!((p.mean, p.dev), (90_000_000, 50_000_000));
        p.record(Duration::from_millis(10), false);
        // gap 80 ms: dev = 50 - 12.5 + 20 = 57.5; mean = 90 - 10 = 80.
        assert_eq!((p.mean, p.dev), (80_000_000, 57_500_000));
        assert_eq!(p.need(START), Some(Duration::from_micros(137_500)));
        assert_eq!(p.need(ADMIT), Some(Duration::from_millis(310)));
        // Six jobs ahead and the running ones' rest, a run's admission
        // need each, share the permits (at least one).
        assert_eq!(p.wait_behind(6, 4), Duration::from_micros(542_500));
        assert_eq!(p.wait_behind(6, 0), Duration::from_millis(2_170));
    }

    /// Runs of a steady length converge on it, with the deviation decaying.
    #[test]
    fn steady_runs_converge() {
        let mut p = Pace::default();
        for _ in 0..200 {
            p.record(Duration::from_millis(20), false);
        }
        assert_eq!(p.mean, 20_000_000);
        assert!(p.dev < 1_000, "{}", p.dev);
    }

    /// A stopped run ran at least that long: it raises the mean, never
    /// lowers it; the first run sets the estimate, stopped or not.
    #[test]
    fn a_stopped_run_only_raises_the_estimate() {
        let mut p = Pace::default();
        p.record(Duration::from_millis(100), true);
        assert_eq!(p.mean, 100_000_000);
        p.record(Duration::from_millis(50), true);
        assert_eq!(p.mean, 100_000_000, "a short stopped run says nothing");
        p.record(Duration::from_millis(180), true);
        assert_eq!(p.mean, 110_000_000, "a long one raises it");
        p.record(Duration::from_millis(30), false);
        assert_eq!(p.mean, 100_000_000, "a finished run counts either way");
    }

    /// Extreme runs saturate instead of overflowing.
    #[test]
    fn extreme_runs_saturate() {
        let mut p = Pace::default();
        p.record(Duration::MAX, false);
        p.record(Duration::ZERO, false);
        assert!(p.need(ADMIT).is_some());
        assert!(p.wait_behind(usize::MAX, 1) > Duration::ZERO);
    }
}
