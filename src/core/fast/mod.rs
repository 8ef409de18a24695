//! The fast layer (issue 31): what makes the locked core fast, behind
//! [`Config::fast`](crate::core::config::Config::fast), off everywhere when the
//! crate is built with `--cfg offloader_plain`. Its protocol, with a proof
//! sketch for each fence pair, is in `README.md` beside this file.
//!
//! - [`intake`]: the lock-free front door of plain jobs: the queue bound's
//!   count word (shared with the locked door), the gate, the workers'
//!   word, and the ring the jobs wait in ([`ring`]).
//! - [`submit`]: a submitter passing the intake.
//! - [`chain`]: whether a worker that finished a job starts the next one in
//!   the same critical section (next-job chaining).
//! - [`caller_spin`]: how long an awaiting caller spins for its outcome.
//! - [`worker_spin`]: which worker spins for work before it parks, and how
//!   long.
//!
//! Outside this folder, but part of the layer: the intake's locked side
//! (`state/intake.rs`), the two places where `worker.rs` asks this folder
//! (whether to chain, whether to spin), and the waker hint
//! (`job/cell.rs`); the README says how each piece works with the others.

pub(crate) mod caller_spin;
pub(crate) mod chain;
pub(crate) mod intake;
mod ring;
pub(crate) mod submit;
pub(crate) mod worker_spin;

#[cfg(all(test, loom))]
mod loom;
#[cfg(all(test, not(loom)))]
mod tests;
