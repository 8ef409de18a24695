//! Leaf module: [`LaneKey`], the key that puts a job in a lane of its own
//! (`Offload::key`), and [`KeyStats`], a lane's counts.

use std::fmt;
use std::sync::Arc;

/// The key of a job's lane: jobs with equal keys share a lane.
///
/// A lane's running jobs are bounded by
/// [`Builder::max_per_key`](crate::Builder::max_per_key) (or a per-key
/// [`Builder::key_limit`](crate::Builder::key_limit)), and the pool serves
/// lanes in turn.
///
/// Made from a string or an integer; cheap to clone.
///
/// ```
/// use offloader::LaneKey;
/// assert_eq!(LaneKey::from("db-1"), LaneKey::from(String::from("db-1")));
/// assert_ne!(LaneKey::from(7u64), LaneKey::from("7"));
/// assert_eq!(LaneKey::from(7u64).to_string(), "7");
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LaneKey(Repr);

#[derive(Clone, PartialEq, Eq, Hash)]
enum Repr {
    Int(u64),
    Str(Arc<str>),
}

impl From<&str> for LaneKey {
    fn from(s: &str) -> Self {
        LaneKey(Repr::Str(s.into()))
    }
}

impl From<String> for LaneKey {
    fn from(s: String) -> Self {
        LaneKey(Repr::Str(s.into()))
    }
}

impl From<Arc<str>> for LaneKey {
    fn from(s: Arc<str>) -> Self {
        LaneKey(Repr::Str(s))
    }
}

impl From<u64> for LaneKey {
    fn from(n: u64) -> Self {
        LaneKey(Repr::Int(n))
    }
}

impl From<u32> for LaneKey {
    fn from(n: u32) -> Self {
        LaneKey(Repr::Int(n.into()))
    }
}

impl From<usize> for LaneKey {
    fn from(n: usize) -> Self {
        // usize is at most 64 bits on every target Rust supports.
        LaneKey(Repr::Int(n as u64))
    }
}

impl fmt::Display for LaneKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Repr::Int(n) => write!(f, "{n}"),
            Repr::Str(s) => f.write_str(s),
        }
    }
}

impl fmt::Debug for LaneKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Repr::Int(n) => write!(f, "LaneKey({n})"),
            Repr::Str(s) => write!(f, "LaneKey({s:?})"),
        }
    }
}

/// What a lane is for: a key, or (for jobs without a key) the set of
/// limiters its jobs need, by id, sorted. Jobs without either share the
/// default lane.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub(crate) enum LaneId {
    Key(LaneKey),
    /// One limiter (no allocation per job).
    Limiter(u64),
    Limiters(Vec<u64>),
}

/// One key's lane in a snapshot from
/// [`Offloader::key_stats`](crate::Offloader::key_stats).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyStats {
    /// The lane's key.
    pub key: LaneKey,
    /// Its jobs waiting to start.
    pub queued: u64,
    /// Its jobs running now.
    pub running: u64,
    /// How many of its jobs may run at once.
    pub limit: usize,
}
