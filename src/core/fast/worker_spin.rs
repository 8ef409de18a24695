//! The worker's spin (`README.md` §3 beside this file): a searching worker
//! that finds the queue empty spins once before it parks, one worker at a
//! time, looking only at hints.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::util::sync::Padded;

/// How long a worker spins (then yields) before it parks.
const SPIN_BUDGET: Duration = Duration::from_micros(50);

/// Which worker spins: at most one at a time, so that idle workers do not
/// take every core from the threads that submit. A hint: no decision of
/// the wake protocol rests on it.
pub(crate) struct WorkerSpin {
    enabled: bool,
    /// Set while a worker spins; on a line of its own, beside the intake
    /// that every submitter reads.
    spinner: Padded<AtomicBool>,
}

impl WorkerSpin {
    /// The spin of a pool with the fast layer on (`enabled`) or off.
    pub(crate) fn new(enabled: bool) -> Self {
        WorkerSpin {
            enabled: enabled && crate::util::sync::SPIN,
            spinner: Padded(AtomicBool::new(false)),
        }
    }

    /// Whether a worker may spin, as far as the flag tells: the layer is on
    /// and no other worker spins now.
    pub(crate) fn may_spin(&self) -> bool {
        // ORDERING: a hint (one spinner at a time); `spin` decides.
        self.enabled && !self.spinner.load(Ordering::Relaxed)
    }

    /// Spins until `job_waits` says a job waits for a worker, or the budget
    /// is spent; returns at once if another worker spins. Runs no foreign
    /// code and cannot panic, so the flag is always cleared.
    pub(crate) fn spin(&self, job_waits: impl Fn() -> bool) {
        if self
            .spinner
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let began = Instant::now();
        let mut round = 0u32;
        while !job_waits() {
            round += 1;
            if round < 64 {
                std::hint::spin_loop();
            } else if began.elapsed() >= SPIN_BUDGET {
                break;
            } else {
                std::thread::yield_now();
            }
        }
        self.spinner.store(false, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A spin ends as soon as a job waits, and clears the flag for the
    /// next spinner.
    #[test]
    fn a_spin_ends_when_a_job_waits_and_lets_the_next_one_spin() {
        let spin = WorkerSpin::new(true);
        assert!(spin.may_spin());
        let looks = AtomicUsize::new(0);
        spin.spin(|| looks.fetch_add(1, Ordering::Relaxed) == 2);
        assert_eq!(
            looks.load(Ordering::Relaxed),
            3,
            "stops at the look that saw a job"
        );
        assert!(spin.may_spin(), "the flag is cleared");
    }

    /// While one worker spins, another neither may spin nor does: it
    /// returns without looking.
    #[test]
    fn one_worker_spins_at_a_time() {
        let spin = WorkerSpin::new(true);
        spin.spin(|| {
            assert!(!spin.may_spin());
            let looked = AtomicBool::new(false);
            spin.spin(|| {
                looked.store(true, Ordering::Relaxed);
                true
            });
            assert!(!looked.load(Ordering::Relaxed), "a second spinner looked");
            true
        });
    }

    /// With the fast layer off no worker spins.
    #[test]
    fn off_with_the_layer() {
        assert!(!WorkerSpin::new(false).may_spin());
    }

    /// A spin with no job ever waiting ends when its budget is spent.
    #[test]
    fn a_spin_ends_when_its_budget_is_spent() {
        let spin = WorkerSpin::new(true);
        let began = Instant::now();
        spin.spin(|| false);
        assert!(began.elapsed() >= SPIN_BUDGET);
        assert!(spin.may_spin());
    }
}
