//! Next-job chaining (`README.md` §2 beside this file): whether a worker
//! that finished a job may start the next one in the same critical section.
//!
//! The decision, over what the worker knows under the pool lock of the job
//! it just finished: the worker ([`Inner::work_loop`](crate::core::pool::Inner::work_loop))
//! asks [`may_chain_after`] only with the fast layer on, and starts the next
//! job ([`State::start`](crate::core::state::State::start)) when it says yes.

use crate::job::record::JobCore;
use crate::util::sync::{fence, Ordering};

/// What the worker knows of the job it just finished, under the pool lock,
/// after [`State::finish`](crate::core::state::State::finish): the seven terms
/// of the chaining rule (terms 1–3 in one field, term 7 negated).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Finished {
    /// Terms 1–3: foreign code is left for this thread before the next
    /// job's function could run: a tracing subscriber's, for the job's span
    /// or last log lines; the drop of a panic's payload; the drop of a
    /// result with drop glue (its handle may go at any moment and leave the
    /// last reference to this worker).
    pub(crate) user_code: bool,
    /// Term 4: the transition left foreign work for after the lock (room or
    /// idle waiters to wake, a group idle, a limiter permit given to
    /// another pool).
    pub(crate) foreign_after: bool,
    /// Term 5: the job is of a group (its idle waiters may be woken when the
    /// outcome is published).
    pub(crate) in_group: bool,
    /// Term 6: the waker hint, read after fence F4 (`README.md`): a waiter's
    /// waker is registered and would run on this thread at the publish.
    pub(crate) waker_hint: bool,
    /// Term 7, negated: a caller still waits for the outcome. When none
    /// does, the job is detached and its last reference is dropped on this
    /// worker.
    pub(crate) caller_waiting: bool,
}

/// Whether the worker may mark the next queued job started in the critical
/// section that finished `done`.
///
/// The promise it keeps: a job is marked started only if **nothing foreign
/// runs on this thread before that job's function does**. A started job is
/// `Running` and can no longer be cancelled; marked started while another
/// job's foreign code (a subscriber, a drop, a waker) runs on its worker,
/// it could wait for that code forever, since that code may offload a job
/// and wait for it. So the answer is `true` only when none of the seven
/// terms of [`Finished`] holds; otherwise the worker takes the next job at
/// its next lock, after that code has run.
pub(crate) fn may_chain(done: Finished) -> bool {
    let Finished {
        user_code,
        foreign_after,
        in_group,
        waker_hint,
        caller_waiting,
    } = done;
    !user_code && !foreign_after && !in_group && !waker_hint && caller_waiting
}

/// Fence F4, then [`may_chain`] over `core`, the job the worker just
/// finished in this critical section (its outcome not yet published):
/// `user_code` is terms 1–3, `foreign_after` term 4 (the transition left
/// foreign work for after the lock).
pub(crate) fn may_chain_after(core: &JobCore, user_code: bool, foreign_after: bool) -> bool {
    // ORDERING: fence pair F4 of `README.md`, with a caller registering
    // its waker (job/cell.rs `poll_outcome`): the job is terminal now;
    // either the hint shows that caller's waker, or the caller sees the
    // terminal state and takes its waker back.
    fence(Ordering::SeqCst);
    may_chain(Finished {
        user_code,
        foreign_after,
        in_group: core.membership().is_some(),
        waker_hint: core.waker_hint(),
        caller_waiting: core.caller_waiting(),
    })
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Chaining is allowed only when no term holds: each term alone
    /// forbids it.
    #[test]
    fn each_term_alone_forbids_chaining() {
        let clear = Finished {
            user_code: false,
            foreign_after: false,
            in_group: false,
            waker_hint: false,
            caller_waiting: true,
        };
        assert!(may_chain(clear));
        let each = [
            Finished {
                user_code: true,
                ..clear
            },
            Finished {
                foreign_after: true,
                ..clear
            },
            Finished {
                in_group: true,
                ..clear
            },
            Finished {
                waker_hint: true,
                ..clear
            },
            Finished {
                caller_waiting: false,
                ..clear
            },
        ];
        for done in each {
            assert!(!may_chain(done), "{done:?}");
        }
    }
}
