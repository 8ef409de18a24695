//! The awaiting caller's short spin for the outcome of a job it just
//! submitted (fast/README.md §4): when recent jobs were short, a
//! caller looks for the outcome for a few microseconds before it parks,
//! since a wake-up of a parked async thread costs more than a short job.
//!
//! The spin pays only if the job can finish meanwhile, on another core.
//! When the cores are taken (another process burns one, say), the worker
//! that would finish the job waits for the core the caller spins on, and
//! each spin is lost: a round trip under a neighbour burning a core took
//! 9.7–10 µs with the spin and 5.8–6.7 µs without, and 5.5 µs with the
//! rule below (`docs/perf/history/2026-12-05-caller-spin-ab.txt`; 1.4 µs in steady
//! quiet rounds with and without it; in bursts after idle it costs, see
//! fast/README.md §6). So callers count the spins in a row that
//! found no outcome; after
//! [`MISSES`] of them they stop spinning, and spin again once in
//! [`PROBE`] awaits to learn whether spinning pays again (one spin that
//! finds its outcome resumes it).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::util::sync::Padded;

/// Callers spin for an outcome only while recent jobs ran shorter than this.
const MAX_RUN_NS: u64 = 5_000;
/// The longest a caller spins before it parks: well under the tens of
/// microseconds an async task may run between awaits.
const BUDGET: Duration = Duration::from_micros(20);
/// Spins in a row that found no outcome, after which callers stop.
const MISSES: u32 = 8;
/// While stopped, one await in this many spins, to find out if it pays.
const PROBE: u32 = 8;

/// What a pool's callers spin by, each word on a cache line of its own:
/// the workers write the run times, the callers their misses.
pub(crate) struct CallerSpin {
    /// Moving average of recent run times (ns).
    recent_run_ns: Padded<AtomicU64>,
    /// Spins in a row that found no outcome, then awaits since callers
    /// stopped spinning (from [`MISSES`] on).
    misses: Padded<AtomicU32>,
    /// Whether the pool's fast layer is on ([`crate::core::config::Config::fast`]).
    enabled: bool,
}

impl CallerSpin {
    pub(crate) fn new(enabled: bool) -> Self {
        CallerSpin {
            recent_run_ns: Padded(AtomicU64::new(1_000_000)),
            misses: Padded(AtomicU32::new(0)),
            enabled,
        }
    }

    /// How long an awaiting caller may spin now: zero when recent jobs
    /// were not short, when spins have stopped paying (but for a probe),
    /// without the fast layer, and under loom, whose scheduler cannot
    /// preempt a spin loop.
    pub(crate) fn budget(&self) -> Duration {
        if !self.enabled || !crate::util::sync::SPIN {
            return Duration::ZERO;
        }
        // ORDERING: hints; no proof rests on them.
        let recent = self.recent_run_ns.load(Ordering::Relaxed);
        if recent > MAX_RUN_NS {
            return Duration::ZERO;
        }
        let misses = self.misses.load(Ordering::Relaxed);
        if misses >= MISSES {
            // Counted for the probe too, so that the callers that ask
            // while it spins do not all probe.
            self.misses.store(misses.wrapping_add(1), Ordering::Relaxed);
            if (misses - MISSES) % PROBE != PROBE - 1 {
                return Duration::ZERO;
            }
        }
        Duration::from_nanos(4 * recent + 2_000).min(BUDGET)
    }

    /// A spin of [`budget`](Self::budget) found the outcome (`found`) or
    /// did not.
    pub(crate) fn note(&self, found: bool) {
        // ORDERING: a hint (racing callers may lose a count: harmless).
        let misses = self.misses.load(Ordering::Relaxed);
        if found {
            if misses != 0 {
                self.misses.store(0, Ordering::Relaxed);
            }
        } else {
            self.misses.store(misses.wrapping_add(1), Ordering::Relaxed);
        }
    }

    /// Folds one run time into the moving average.
    pub(crate) fn note_run_time(&self, ran: Duration) {
        // ORDERING: a hint for callers deciding whether to spin.
        let old = self.recent_run_ns.load(Ordering::Relaxed);
        let new = u64::try_from(ran.as_nanos()).unwrap_or(u64::MAX);
        let average = old - old / 8 + new / 8;
        // Written only when it moved by more than a sixteenth (and 64 ns):
        // every awaiting caller reads it.
        if average.abs_diff(old) > (old / 16).max(64) {
            self.recent_run_ns.store(average, Ordering::Relaxed);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn short_jobs() -> CallerSpin {
        let spin = CallerSpin::new(true);
        for _ in 0..200 {
            spin.note_run_time(Duration::from_nanos(500));
        }
        spin
    }

    /// `n` awaits that may spin and whose spins find nothing.
    fn misses(spin: &CallerSpin, n: u32) {
        for _ in 0..n {
            assert!(!spin.budget().is_zero());
            spin.note(false);
        }
    }

    #[test]
    fn callers_stop_after_misses_in_a_row_then_probe() {
        let spin = short_jobs();
        misses(&spin, MISSES);
        // Stopped: zero until the probe, one in PROBE awaits.
        let mut zeros = 0;
        while spin.budget().is_zero() {
            zeros += 1;
            assert!(zeros < PROBE, "a probe within {PROBE} awaits");
        }
        assert_eq!(zeros, PROBE - 1);
        // The probe missed: stopped again for as long.
        spin.note(false);
        assert!(spin.budget().is_zero());
        // A probe that finds its outcome resumes spinning.
        while spin.budget().is_zero() {}
        spin.note(true);
        assert!(!spin.budget().is_zero());
        assert!(!spin.budget().is_zero());
    }

    /// Regression (hostile review): every caller that asked while the
    /// probe spun probed too.
    #[test]
    fn one_caller_probes_at_a_time() {
        let spin = short_jobs();
        misses(&spin, MISSES);
        while spin.budget().is_zero() {}
        assert!(spin.budget().is_zero(), "the probe is out");
    }

    #[test]
    fn a_found_outcome_clears_the_misses() {
        let spin = short_jobs();
        for _ in 0..MISSES - 1 {
            spin.note(false);
        }
        spin.note(true);
        misses(&spin, MISSES - 1);
        assert!(!spin.budget().is_zero());
    }

    #[test]
    fn long_jobs_are_not_spun_for() {
        let spin = CallerSpin::new(true);
        assert!(spin.budget().is_zero(), "starts at 1 ms");
        let budget = short_jobs().budget();
        assert!(
            budget >= Duration::from_micros(2) && budget <= BUDGET,
            "{budget:?}"
        );
    }
}
