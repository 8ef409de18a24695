//! One job: its state machine, the function, and the slot its outcome goes to.
//!
//! # State machine
//!
//! ```text
//!            ┌──────────── start (worker) ────────────┐
//!  Queued ───┤                                        ▼
//!            ├── cancel (owner/policy) ──▶ Cancelled   Running ──▶ Completed
//!            └── shutdown_now ───────────▶ Unstarted          └──▶ Panicked
//! ```
//!
//! # Invariants
//!
//! 1. The state word leaves `Queued` exactly once, by one successful
//!    compare-and-swap; `Running`, `Cancelled` and `Unstarted` all start with
//!    that swap, so a job is never both cancelled and run (DESIGN inv. 3).
//! 2. The function is taken out of its cell only by the thread whose swap won:
//!    the worker that moved the job to `Running` calls it, the thread that
//!    moved it to `Cancelled`/`Unstarted` drops it.
//! 3. The outcome is published once, under the slot lock, after the state
//!    word is terminal; a waiter registers under the same lock, so either it
//!    sees the outcome or the publisher sees (and wakes) the waiter: no
//!    wake-up is lost.
//! 4. The pool's running count is decremented (the permit released) after the
//!    function returned or finished unwinding and *before* the outcome is
//!    published, so an owner that has its outcome can rely on the permit
//!    being free again.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::stop::StopToken;
use crate::sync::{lock, thread, AtomicBool, AtomicU8, Mutex, Ordering};

/// A job's identity: unique within one process, increasing in order of
/// submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobId(pub(crate) u64);

impl JobId {
    /// The id as a number.
    pub fn as_u64(self) -> u64 {
        self.0
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum JobState {
    /// Accepted, waiting in the queue for a permit; the function has not
    /// started.
    Queued,
    /// The function is running and holds a permit.
    Running,
    /// The function returned a value.
    Completed,
    /// The function panicked; the panic was caught.
    Panicked,
    /// Cancelled while queued; the function never ran.
    Cancelled,
    /// Removed from the queue by an immediate shutdown; the function never
    /// ran.
    Unstarted,
}

impl JobState {
    /// `true` for the four terminal states.
    pub fn is_terminal(self) -> bool {
        !matches!(self, JobState::Queued | JobState::Running)
    }

    fn from_u8(v: u8) -> JobState {
        match v {
            QUEUED => JobState::Queued,
            RUNNING => JobState::Running,
            COMPLETED => JobState::Completed,
            PANICKED => JobState::Panicked,
            CANCELLED => JobState::Cancelled,
            _ => JobState::Unstarted,
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            JobState::Queued => "queued (not started)",
            JobState::Running => "running",
            JobState::Completed => "completed",
            JobState::Panicked => "panicked",
            JobState::Cancelled => "cancelled before start",
            JobState::Unstarted => "returned unstarted at shutdown",
        })
    }
}

/// Accepted, waiting for a permit.
pub(crate) const QUEUED: u8 = 0;
/// The function runs and holds a permit.
pub(crate) const RUNNING: u8 = 1;
/// Terminal: the function returned.
pub(crate) const COMPLETED: u8 = 2;
/// Terminal: the function panicked.
pub(crate) const PANICKED: u8 = 3;
/// Terminal: cancelled while queued.
pub(crate) const CANCELLED: u8 = 4;
/// Terminal: handed back unstarted by an immediate shutdown.
pub(crate) const UNSTARTED: u8 = 5;

/// What every job has, whatever its function and result types.
pub(crate) struct JobCore {
    pub(crate) id: JobId,
    pub(crate) name: Option<std::sync::Arc<str>>,
    state: AtomicU8,
    pub(crate) stop: StopToken,
    pub(crate) accepted_at: Instant,
    started_at: OnceLock<Instant>,
    /// Set when a caller stopped waiting while the job was not finished.
    caller_left: AtomicBool,
    /// Set while an awaiting caller (not a detached handle) waits.
    caller_waiting: AtomicBool,
    pub(crate) span: tracing::Span,
}

impl JobCore {
    pub(crate) fn new(id: JobId, name: Option<std::sync::Arc<str>>, stop: StopToken) -> Self {
        let span = match &name {
            Some(n) => tracing::trace_span!("offload", id = id.0, name = %n),
            None => tracing::trace_span!("offload", id = id.0),
        };
        JobCore {
            id,
            name,
            state: AtomicU8::new(QUEUED),
            stop,
            accepted_at: Instant::now(),
            started_at: OnceLock::new(),
            caller_left: AtomicBool::new(false),
            caller_waiting: AtomicBool::new(false),
            span,
        }
    }

    pub(crate) fn state(&self) -> JobState {
        // ORDERING: Acquire pairs with the AcqRel transitions below.
        JobState::from_u8(self.state.load(Ordering::Acquire))
    }

    /// Moves the job from `from` to `to`; `true` if this call made the move.
    pub(crate) fn transition(&self, from: u8, to: u8) -> bool {
        // ORDERING: AcqRel so that the winner of the swap out of `Queued`
        // also owns the function cell (inv. 2) and readers of the state see
        // everything the winner wrote before.
        let won = self
            .state
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if won && to == RUNNING {
            let _ = self.started_at.set(Instant::now());
        }
        won
    }

    /// How long the function has run (or ran, if it finished), if it started.
    pub(crate) fn started_at(&self) -> Option<Instant> {
        self.started_at.get().copied()
    }

    pub(crate) fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    pub(crate) fn mark_caller_left(&self) {
        self.caller_left.store(true, Ordering::Release);
    }

    pub(crate) fn caller_left(&self) -> bool {
        self.caller_left.load(Ordering::Acquire)
    }

    pub(crate) fn set_caller_waiting(&self, waiting: bool) {
        self.caller_waiting.store(waiting, Ordering::Release);
    }

    pub(crate) fn caller_waiting(&self) -> bool {
        self.caller_waiting.load(Ordering::Acquire)
    }
}

/// The type-erased face of a job that the queue and the workers see.
pub(crate) trait Task: Send + Sync {
    fn core(&self) -> &JobCore;

    /// Runs the function (the caller must have won `Queued → Running`).
    /// `returned` is called once the function returned or finished
    /// unwinding, with `true` if it panicked, before the outcome is
    /// published (inv. 4).
    fn run(&self, returned: &mut dyn FnMut(bool));

    /// Drops the never-run function and publishes `error` as the outcome
    /// (the caller must have won `Queued → Cancelled/Unstarted`).
    fn discard(&self, error: Error);
}

/// The typed face of a job that its owner handle sees.
pub(crate) trait Outcome<T>: Send + Sync {
    fn core(&self) -> &JobCore;
    fn poll_outcome(&self, cx: &mut Context<'_>) -> Poll<Result<T, Error>>;
    /// Blocks until the outcome is published or `until` passes; `None` on
    /// timeout.
    fn wait_outcome(&self, until: Option<Instant>) -> Option<Result<T, Error>>;
    fn is_published(&self) -> bool;
}

/// A job with its function and outcome slot, in one allocation.
pub(crate) struct Job<F, T> {
    core: JobCore,
    func: Mutex<Option<F>>,
    slot: Mutex<Slot<T>>,
}

struct Slot<T> {
    outcome: Option<Result<T, Error>>,
    published: bool,
    waker: Option<Waker>,
    thread: Option<thread::Thread>,
}

impl<F, T> Job<F, T>
where
    F: FnOnce(&StopToken) -> T + Send + 'static,
    T: Send + 'static,
{
    pub(crate) fn new(core: JobCore, func: F) -> Self {
        Job {
            core,
            func: Mutex::new(Some(func)),
            slot: Mutex::new(Slot {
                outcome: None,
                published: false,
                waker: None,
                thread: None,
            }),
        }
    }

    /// Takes the function back out of a job that was never queued.
    pub(crate) fn take_func(&self) -> Option<F> {
        lock(&self.func).take()
    }

    /// Takes a published outcome; a second take reports `OutcomeTaken`.
    fn take(&self, slot: &mut Slot<T>) -> Result<T, Error> {
        slot.outcome
            .take()
            .unwrap_or(Err(Error::OutcomeTaken { id: self.core.id }))
    }

    fn publish(&self, outcome: Result<T, Error>) {
        let mut slot = lock(&self.slot);
        slot.outcome = Some(outcome);
        slot.published = true;
        let waker = slot.waker.take();
        let thread = slot.thread.take();
        drop(slot);
        // Woken outside the lock (inv. 3 only needs the publish under it).
        if let Some(w) = waker {
            w.wake();
        }
        if let Some(t) = thread {
            t.unpark();
        }
    }
}

impl<F, T> Task for Job<F, T>
where
    F: FnOnce(&StopToken) -> T + Send + 'static,
    T: Send + 'static,
{
    fn core(&self) -> &JobCore {
        &self.core
    }

    fn run(&self, returned: &mut dyn FnMut(bool)) {
        let Some(func) = self.take_func() else {
            // Unreachable by inv. 2; report rather than panic in a worker.
            returned(false);
            return;
        };
        let stop = &self.core.stop;
        let result = catch_unwind(AssertUnwindSafe(|| func(stop)));
        returned(result.is_err());
        let outcome = result.map_err(|payload| Error::Panicked {
            id: self.core.id,
            message: panic_message(payload.as_ref()),
        });
        self.publish(outcome);
    }

    fn discard(&self, error: Error) {
        // The function is user code: dropped here, outside every pool lock.
        drop(self.take_func());
        self.publish(Err(error));
    }
}

impl<F, T> Outcome<T> for Job<F, T>
where
    F: FnOnce(&StopToken) -> T + Send + 'static,
    T: Send + 'static,
{
    fn core(&self) -> &JobCore {
        &self.core
    }

    fn poll_outcome(&self, cx: &mut Context<'_>) -> Poll<Result<T, Error>> {
        let mut slot = lock(&self.slot);
        if slot.published {
            return Poll::Ready(self.take(&mut slot));
        }
        // Registered under the slot lock: `publish` sees it (inv. 3).
        match &mut slot.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            w => *w = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    fn wait_outcome(&self, until: Option<Instant>) -> Option<Result<T, Error>> {
        loop {
            let mut slot = lock(&self.slot);
            if slot.published {
                return Some(self.take(&mut slot));
            }
            slot.thread = Some(thread::current());
            drop(slot);
            match until {
                None => thread::park(),
                Some(until) => {
                    let now = Instant::now();
                    if now >= until {
                        lock(&self.slot).thread = None;
                        return None;
                    }
                    park_timeout(until - now);
                }
            }
        }
    }

    fn is_published(&self) -> bool {
        lock(&self.slot).published
    }
}

#[cfg(not(loom))]
fn park_timeout(d: Duration) {
    std::thread::park_timeout(d);
}

#[cfg(loom)]
fn park_timeout(_d: Duration) {
    // loom has no timed park; a plain park explores the wake-up paths, and a
    // timed wait in a model is treated as "woken".
    loom::thread::yield_now();
}

/// The message of a caught panic, if its payload is a string.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "<non-string panic payload>".to_owned()
    }
}
