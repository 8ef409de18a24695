//! One job: its state machine, the function, and the slot its outcome goes to.
//!
//! # State machine
//!
//! ```text
//!            ┌──────────── start (worker) ────────────┐
//!  Queued ───┤                                        ▼
//!            ├── cancel (owner/policy) ──▶ Cancelled   Running ──▶ Completed
//!            ├── shed at its turn ───────▶ Shed               └──▶ Panicked
//!            └── shutdown_now ───────────▶ Unstarted
//! ```
//!
//! # Invariants
//!
//! 1. The state word leaves `Queued` exactly once, by one check-and-store
//!    made under the pool lock (`JobCore::transition`); `Running`,
//!    `Cancelled`, `Shed` and `Unstarted` all start with that move, so a job is never
//!    both cancelled and run (ARCHITECTURE.md invariant 3).
//! 2. The function is taken out of its cell only by the thread whose move won:
//!    the worker that moved the job to `Running` calls it, the thread that
//!    moved it to `Cancelled`/`Shed`/`Unstarted` drops it (for `Shed`,
//!    the worker that shed it, after unlocking).
//! 3. The outcome is published once, under the slot lock, after the state
//!    word is terminal; a waiter registers under the same lock, so either it
//!    sees the outcome or the publisher sees (and wakes) the waiter: no
//!    wake-up is lost.
//! 4. The pool's running list is decremented (the permit released) after the
//!    function returned or finished unwinding and *before* the outcome is
//!    published, so an owner that has its outcome can rely on the permit
//!    being free again.
//!
//! # Memory
//!
//! A queued job is one allocation: the state words, a timestamp, the
//! function and its outcome slot share it, and so does the job's stop
//! token (the job *is* the token's stop source). Rare parts (a name, a
//! deadline, stop callbacks) live behind thin pointers allocated only when
//! used. The unit test at the end of this file pins the size.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Instant;

use crate::job::error::Error;
use crate::job::id::{CANCELLED, COMPLETED, PANICKED, QUEUED, RUNNING, SHED, UNSTARTED};
use crate::job::record::{Extras, JobCore};
use crate::job::stop::{StopExt, StopSource, StopToken};
use crate::util::quiet::{drop_quietly, wake_quietly};
use crate::util::sync::{fence, lock, park_timeout, thread, Arc, AtomicBool, Mutex, Ordering};

/// The type-erased face of a job that the queue and the workers see. A job
/// is its own stop source.
pub(crate) trait Task: StopSource {
    fn core(&self) -> &JobCore;

    /// Calls the function (the caller must have won `Queued → Running`),
    /// then calls `returned` with whether it panicked, then publishes the
    /// outcome (inv. 4: `returned` releases the permit first).
    fn run(&self, stop: &StopToken, returned: &mut dyn FnMut(bool));

    /// Whether dropping the function's value runs code (`T` has drop
    /// glue): then whoever drops the job last, perhaps its worker, runs it.
    fn result_needs_drop(&self) -> bool;

    /// Drops the never-run function and publishes its outcome: the error
    /// its state word names (the caller must have won `Queued → Cancelled`,
    /// `Queued → Unstarted` or `Queued → Shed`).
    fn discard(&self);

    /// Whether the outcome is published (or already taken).
    fn is_published(&self) -> bool;
}

/// The typed face of a job that its owner handle sees.
pub(crate) trait Outcome<T>: Task {
    fn poll_outcome(&self, cx: &mut Context<'_>) -> Poll<Result<T, Error>>;
    /// Blocks until the outcome is published or `until` passes; `None` on
    /// timeout.
    fn wait_outcome(&self, until: Option<Instant>) -> Option<Result<T, Error>>;
    /// Drops the published outcome nobody will take (its handle goes), if
    /// there is one: after unlocking, catching a panic of its drop (user
    /// code: a value's or a panic payload's `Drop`).
    fn drop_published(&self);
}

/// A job with its function, outcome and stop state, in one allocation,
/// with its rare parts if it has any (`N = 1`, job/record.rs).
pub(crate) struct Job<F, T, const N: usize = 0> {
    core: JobCore<[Extras; N]>,
    cell: Mutex<Cell<F, T>>,
}

/// The function, then the outcome; the waiter's waker and the stop
/// callbacks live in the states that need them, so that they share space.
///
/// The state word (`JobCore::state`) is the job's state; the cell follows
/// it, and this table ties the two (checked by `debug_assert!` after every
/// change of the cell, see `cell_matches`):
///
/// | cell        | state word                                                        |
/// |-------------|-------------------------------------------------------------------|
/// | `Queued`    | `Queued`; or the winner of the swap out of `Queued` (`Running`, `Cancelled`, `Unstarted`, `Shed`) before it took the function |
/// | `Running`   | `Running`; or `Completed`/`Panicked` before the outcome is published |
/// | `Published` | terminal                                                          |
/// | `Taken`     | terminal                                                          |
enum Cell<F, T> {
    Queued {
        func: F,
        waker: Option<Waker>,
    },
    Running {
        waker: Option<Waker>,
        /// Stop callbacks and sleepers, created on first use by the running
        /// function (stop.rs inv. 3).
        stop_ext: Option<Arc<StopExt>>,
    },
    /// Errors are boxed to keep the job small. The stop state outlives the
    /// function: a callback guard it handed out keeps working.
    Published {
        outcome: Result<T, Box<Error>>,
        stop_ext: Option<Arc<StopExt>>,
    },
    Taken {
        stop_ext: Option<Arc<StopExt>>,
    },
    /// The function was discarded unrun: the state word (`Cancelled`, `Shed` or
    /// `Unstarted`) says which error every wait gets. Nothing to allocate
    /// for the error, so a cancel or a drain touches only the job.
    NeverRan,
}

/// Whether `cell` may go with the state word `word` (the table above).
fn cell_matches<F, T>(cell: &Cell<F, T>, word: u8) -> bool {
    match cell {
        Cell::Queued { .. } => true,
        Cell::Running { .. } => matches!(word, RUNNING | COMPLETED | PANICKED),
        Cell::Published { .. } | Cell::Taken { .. } => {
            matches!(word, COMPLETED | PANICKED | CANCELLED | UNSTARTED | SHED)
        }
        Cell::NeverRan => matches!(word, CANCELLED | UNSTARTED | SHED),
    }
}

impl<F, T> Cell<F, T> {
    fn waker_slot(&mut self) -> Option<&mut Option<Waker>> {
        match self {
            Cell::Queued { waker, .. } | Cell::Running { waker, .. } => Some(waker),
            Cell::Published { .. } | Cell::Taken { .. } | Cell::NeverRan => None,
        }
    }

    fn stop_ext(&mut self) -> Option<&mut Option<Arc<StopExt>>> {
        match self {
            Cell::Queued { .. } | Cell::NeverRan => None,
            Cell::Running { stop_ext, .. }
            | Cell::Published { stop_ext, .. }
            | Cell::Taken { stop_ext } => Some(stop_ext),
        }
    }
}

impl<F, T, const N: usize> Job<F, T, N>
where
    F: FnOnce(&StopToken) -> T + Send + 'static,
    T: Send + 'static,
{
    pub(crate) fn new(core: JobCore<[Extras; N]>, func: F) -> Self {
        Job {
            core,
            cell: Mutex::new(Cell::Queued { func, waker: None }),
        }
    }

    /// The outcome of a job whose state is already terminal: its worker is
    /// between finishing it and publishing it, which involves no foreign
    /// code, so the wait is short.
    fn await_imminent_outcome(&self) -> Result<T, Error> {
        let mut round = 0u32;
        loop {
            if let Some(outcome) = self.take_published(&mut lock(&self.cell)) {
                return outcome;
            }
            round += 1;
            if round < 64 {
                std::hint::spin_loop();
            } else {
                thread::yield_now();
            }
        }
    }

    /// Puts `waker` in the cell's waker slot (if the job is unpublished),
    /// keeping the core's waker hint in step; returns the replaced waker,
    /// for the caller to drop after unlocking.
    fn set_waker(&self, cell: &mut Cell<F, T>, waker: Option<Waker>) -> Option<Waker> {
        let slot = cell.waker_slot()?;
        self.core.set_waker_hint(waker.is_some());
        std::mem::replace(slot, waker)
    }

    /// Takes the function back out of a job the pool refused (it never
    /// reached the queue, so its state word still reads `Queued`).
    pub(crate) fn take_refused(&self) -> Option<F> {
        debug_assert_eq!(self.core.state_word(), QUEUED);
        let mut cell = lock(&self.cell);
        match std::mem::replace(&mut *cell, Cell::Taken { stop_ext: None }) {
            Cell::Queued { func, .. } => Some(func),
            other => {
                *cell = other;
                None
            }
        }
    }

    /// Takes the function out of its cell (inv. 2), leaving `Running`.
    pub(crate) fn take_func(&self) -> Option<F> {
        let mut cell = lock(&self.cell);
        match std::mem::replace(&mut *cell, Cell::Taken { stop_ext: None }) {
            Cell::Queued { func, waker } => {
                *cell = Cell::Running {
                    waker,
                    stop_ext: None,
                };
                debug_assert!(cell_matches(&cell, self.core.state_word()));
                Some(func)
            }
            other => {
                *cell = other;
                None
            }
        }
    }

    /// The error of a job whose function was discarded unrun, from its
    /// state word (the one source of truth: see the table on `Cell`).
    fn never_ran(&self) -> Error {
        let state = self.core.state();
        Error::never_ran(self.core.id, state).unwrap_or(Error::ShuttingDown {
            id: Some(self.core.id),
        })
    }

    /// Publishes the outcome and wakes the waiter (inv. 3).
    fn publish(&self, outcome: Result<T, Box<Error>>) {
        let mut cell = lock(&self.cell);
        let stop_ext = cell.stop_ext().and_then(Option::take);
        let previous = std::mem::replace(&mut *cell, Cell::Published { outcome, stop_ext });
        debug_assert!(cell_matches(&cell, self.core.state_word()));
        drop(cell);
        self.core.set_waker_hint(false);
        // Woken outside the lock; inv. 3 only needs the publish under it.
        let waker = match previous {
            Cell::Queued { waker, .. } | Cell::Running { waker, .. } => waker,
            Cell::Published { .. } | Cell::Taken { .. } | Cell::NeverRan => None,
        };
        if let Some(w) = waker {
            // Foreign code: a panicking waker must not kill the worker.
            wake_quietly(w);
        }
    }

    /// Takes a published outcome; `None` if not published yet. A value is
    /// taken once (later waits get [`Error::OutcomeTaken`]); an error stays
    /// and every later wait gets it again.
    fn take_published(&self, cell: &mut Cell<F, T>) -> Option<Result<T, Error>> {
        match cell {
            Cell::Published {
                outcome: Err(e), ..
            } => return Some(Err(e.again())),
            Cell::Taken { .. } => {
                return Some(Err(Error::OutcomeTaken {
                    id: Some(self.core.id),
                }))
            }
            Cell::NeverRan => return Some(Err(self.never_ran())),
            Cell::Queued { .. } | Cell::Running { .. } => return None,
            Cell::Published { outcome: Ok(_), .. } => {}
        }
        match std::mem::replace(cell, Cell::Taken { stop_ext: None }) {
            Cell::Published { outcome, stop_ext } => {
                *cell = Cell::Taken { stop_ext };
                debug_assert!(cell_matches(cell, self.core.state_word()));
                Some(outcome.map_err(|e| *e))
            }
            // Matched above.
            other => {
                *cell = other;
                None
            }
        }
    }
}

impl<F, T, const N: usize> StopSource for Job<F, T, N>
where
    F: FnOnce(&StopToken) -> T + Send + 'static,
    T: Send + 'static,
{
    fn stop_flag(&self) -> &AtomicBool {
        &self.core.stopped
    }

    fn deadline(&self) -> Option<Instant> {
        self.core.extras()?.deadline
    }

    fn ext(&self, create: bool) -> Option<Arc<StopExt>> {
        let mut cell = lock(&self.cell);
        match cell.stop_ext() {
            Some(stop_ext) if create => Some(
                stop_ext
                    .get_or_insert_with(|| Arc::new(StopExt::new()))
                    .clone(),
            ),
            Some(stop_ext) => stop_ext.clone(),
            // Queued or never run: only a request to stop asks (nothing to
            // tell); a token exists only once the cell has left `Queued`
            // for its function's run, so no callback or sleeper comes here.
            None => {
                debug_assert!(!create, "a token of a job that never ran");
                None
            }
        }
    }
}

impl<F, T, const N: usize> Task for Job<F, T, N>
where
    F: FnOnce(&StopToken) -> T + Send + 'static,
    T: Send + 'static,
{
    fn core(&self) -> &JobCore {
        &self.core
    }

    fn result_needs_drop(&self) -> bool {
        std::mem::needs_drop::<T>()
    }

    fn run(&self, stop: &StopToken, returned: &mut dyn FnMut(bool)) {
        let Some(func) = self.take_func() else {
            // Unreachable by inv. 2; report rather than panic in a worker.
            returned(false);
            return;
        };
        let result = catch_unwind(AssertUnwindSafe(|| func(stop)));
        self.core.function_gone();
        // Inv. 4: the permit is released before the outcome is visible.
        returned(result.is_err());
        // Published before anything foreign runs (the panic payload's drop):
        // a caller that saw the job finish waits for exactly this
        // (`await_imminent_outcome`).
        match result {
            Ok(value) => self.publish(Ok(value)),
            // The payload goes with the error to its owner; dropped by the
            // worker with the job if nobody takes it (worker.rs, quietly).
            Err(payload) => self.publish(Err(Box::new(Error::panicked(self.core.id, payload)))),
        }
    }

    fn is_published(&self) -> bool {
        matches!(
            *lock(&self.cell),
            Cell::Published { .. } | Cell::Taken { .. } | Cell::NeverRan
        )
    }

    fn discard(&self) {
        let mut cell = lock(&self.cell);
        let previous = std::mem::replace(&mut *cell, Cell::NeverRan);
        debug_assert!(cell_matches(&cell, self.core.state_word()));
        self.core.set_waker_hint(false);
        drop(cell);
        // The function is user code: dropped here, outside every lock.
        if let Cell::Queued { func, waker } = previous {
            drop_quietly(func);
            self.core.function_gone();
            if let Some(w) = waker {
                wake_quietly(w);
            }
        }
    }
}

impl<F, T, const N: usize> Outcome<T> for Job<F, T, N>
where
    F: FnOnce(&StopToken) -> T + Send + 'static,
    T: Send + 'static,
{
    fn drop_published(&self) {
        let outcome = {
            let mut cell = lock(&self.cell);
            match std::mem::replace(&mut *cell, Cell::Taken { stop_ext: None }) {
                Cell::Published { outcome, stop_ext } => {
                    *cell = Cell::Taken { stop_ext };
                    debug_assert!(cell_matches(&cell, self.core.state_word()));
                    Some(outcome)
                }
                // Not yet published (the worker drops it), or taken.
                other => {
                    *cell = other;
                    None
                }
            }
        };
        drop_quietly(outcome);
    }

    fn poll_outcome(&self, cx: &mut Context<'_>) -> Poll<Result<T, Error>> {
        {
            let mut cell = lock(&self.cell);
            if let Some(outcome) = self.take_published(&mut cell) {
                return Poll::Ready(outcome);
            }
            if let Some(Some(w)) = cell.waker_slot() {
                // Compares two pointers; runs no waker code.
                if w.will_wake(cx.waker()) {
                    return Poll::Pending;
                }
            }
        }
        // A waker's clone and drop are foreign code: never under the cell
        // lock (ARCHITECTURE.md invariant 9).
        let new = cx.waker().clone();
        let mut cell = lock(&self.cell);
        if let Some(outcome) = self.take_published(&mut cell) {
            drop(cell);
            drop_quietly(new);
            return Poll::Ready(outcome);
        }
        // Registered under the cell lock: `publish` sees it (inv. 3).
        let old = self.set_waker(&mut cell, Some(new));
        // ORDERING: fence pair F4 of src/core/fast/README.md, with the worker's
        // fence between finishing a job and reading the waker hint
        // (worker.rs `work_loop`): either the worker sees this waker (and
        // starts no next job before waking it), or this caller sees the job
        // already finished and takes its waker back, so that no waker runs
        // on the worker once the next job is marked started.
        fence(Ordering::SeqCst);
        // Only a worker's finish (Completed, Panicked) is followed by a
        // next job; a cancelled or unstarted job's waker runs on the
        // cancelling thread as usual.
        if matches!(self.core.state_word(), COMPLETED | PANICKED) {
            let mine = self.set_waker(&mut cell, None);
            drop(cell);
            drop_quietly(old);
            drop_quietly(mine);
            // The outcome is being published right now, by a worker that
            // runs nothing else first: wait for it here.
            return Poll::Ready(self.await_imminent_outcome());
        }
        drop(cell);
        drop_quietly(old);
        Poll::Pending
    }

    fn wait_outcome(&self, until: Option<Instant>) -> Option<Result<T, Error>> {
        let waker = Waker::from(std::sync::Arc::new(ThreadWaker(thread::current())));
        loop {
            let mut cell = lock(&self.cell);
            if let Some(outcome) = self.take_published(&mut cell) {
                return Some(outcome);
            }
            // The replaced waker may be a caller's (foreign): dropped outside.
            let old = self.set_waker(&mut cell, Some(waker.clone()));
            drop(cell);
            drop_quietly(old);
            match until {
                None => thread::park(),
                Some(until) => {
                    let now = Instant::now();
                    if now >= until {
                        let mut cell = lock(&self.cell);
                        let old = self.set_waker(&mut cell, None);
                        drop(cell);
                        drop_quietly(old);
                        return None;
                    }
                    park_timeout(until - now);
                }
            }
        }
    }
}

/// Wakes a thread blocked in [`Outcome::wait_outcome`].
struct ThreadWaker(thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.unpark();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Memory target (issue 4: at most 128 bytes per queued job): a queued
    /// no-op job is one allocation of at most 88 bytes with its reference
    /// counts (a 96-byte malloc chunk), plus its 16-byte queue slot.
    #[test]
    fn a_queued_noop_job_is_one_small_allocation() {
        let crate::job::record::NewCore::Plain(core) = crate::job::record::new_core(
            crate::job::id::JobId(1),
            None,
            None,
            None,
            None,
            Default::default(),
            None,
        ) else {
            panic!("a job with nothing set is plain");
        };
        let job = Job::new(core, |_: &StopToken| 0u64);
        let bytes = std::mem::size_of_val(&job) + 2 * std::mem::size_of::<usize>();
        assert!(
            bytes <= 88,
            "a no-op job takes {bytes} bytes with its Arc counts"
        );
    }
}
