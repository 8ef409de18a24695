//! The pool: its settings, its locked state and the transitions that keep
//! the invariants, the fast layer beside them, its threads, and what it
//! reports. `README.md` beside this file covers waits, termination and the
//! paused clock; `state/README.md` the locked state's protocols;
//! `fast/README.md` the fast layer's.
//!
//! - [`config`]: `Builder` and `Config`.
//! - [`state`]: `State`, the one `Mutex` per pool, and its transitions
//!   (accept, start, finish, cancel, shed, drain): plain data, no waker,
//!   no tracing, no foreign code.
//! - [`fast`]: the fast layer (intake, next-job chaining, spins).
//! - [`pool`]: `Offloader` and `Inner`: the lock, the work after it, the
//!   door that accepts a job.
//! - [`worker`]: a worker's loop: lock, start, run, lock, finish, publish.
//! - [`control`], [`waits`], [`lanes`]: cancel, stop and a caller
//!   leaving; waits from inside the pool; keys' lanes and limiter grants.
//! - [`shutdown`], [`settle`]: stop accepting, drain, terminate, report;
//!   waits for idleness and termination.
//! - [`delivery`], [`monitor`], [`observer`]: the observer's thread and
//!   events; the stuck-job monitor.
//! - [`metrics`], [`report`]: snapshots and the close report.

pub(crate) mod config;
pub(crate) mod control;
pub(crate) mod delivery;
pub(crate) mod fast;
pub(crate) mod lanes;
pub(crate) mod metrics;
pub(crate) mod monitor;
pub(crate) mod observer;
pub(crate) mod pool;
pub(crate) mod report;
pub(crate) mod settle;
pub(crate) mod shutdown;
pub(crate) mod state;
pub(crate) mod waits;
pub(crate) mod worker;

#[cfg(all(test, loom))]
pub(crate) mod loom;
