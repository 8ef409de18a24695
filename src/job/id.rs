//! Leaf module: a job's identity and the values of its state word.
//!
//! Every other module may import from here; this module imports nothing of
//! the crate, so the ids and states that errors, jobs and the pool all name
//! sit below them (no import circles).

use std::fmt;
use std::sync::OnceLock;
use std::time::Instant;

/// A job's identity: unique within one process, increasing in order of
/// submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobId(pub(crate) u64);

/// The next job id, shared by every pool of the process (ids are unique
/// in it). A plain std atomic: ids are not modelled by loom. On a cache
/// line of its own: every submit writes it, and the statics beside it (the
/// clock's epoch, read by every worker at every job) would lose their line
/// to each write.
static NEXT_JOB_ID: OwnLine = OwnLine(std::sync::atomic::AtomicU64::new(1));

/// A counter alone on its cache line (crate::util::sync's `Padded`, which this
/// leaf module does not import).
#[repr(align(128))]
struct OwnLine(std::sync::atomic::AtomicU64);

impl JobId {
    /// The id as a number.
    pub fn as_u64(self) -> u64 {
        self.0
    }

    /// Allocates the next job id: unique in the process, across pools.
    pub(crate) fn next() -> JobId {
        // ORDERING: only uniqueness matters; ids are not part of any proof.
        JobId(
            NEXT_JOB_ID
                .0
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        )
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
    /// Dropped from the queue at its turn because it could not finish
    /// before its deadline at the pool's recent run times (see
    /// [`Offload::with_timeout`](crate::Offload::with_timeout)); the
    /// function never ran.
    Shed,
}

impl JobState {
    /// `true` for the terminal states: all but `Queued` and `Running`.
    pub fn is_terminal(self) -> bool {
        !matches!(self, JobState::Queued | JobState::Running)
    }

    pub(crate) fn from_u8(v: u8) -> JobState {
        match v {
            QUEUED => JobState::Queued,
            RUNNING => JobState::Running,
            COMPLETED => JobState::Completed,
            PANICKED => JobState::Panicked,
            CANCELLED => JobState::Cancelled,
            SHED => JobState::Shed,
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
            JobState::Shed => "not started: too little time left before its deadline",
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
/// Terminal: dropped at its turn, too near its deadline to finish.
pub(crate) const SHED: u8 = 6;

/// Nanoseconds since a process-wide epoch: 8 bytes where an `Instant`
/// takes 16.
pub(crate) fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}
