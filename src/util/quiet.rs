//! Leaf module: running foreign code so that its panic cannot escape into
//! the pool's own code paths.
//!
//! Users' drops, wakers, observers and stop callbacks are foreign code. A
//! panic in one of them is caught here, logged at `warn`, and its payload
//! dropped quietly (or leaked if dropping it panics too), so a worker never
//! dies half-way through its bookkeeping (ARCHITECTURE.md, invariant 5).
//! A tracing subscriber is foreign code too: on a worker, the pool's own
//! log lines go through [`quietly`], and a panic there is not logged (that
//! would call the subscriber again).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::task::Waker;

/// Drops user-owned `value`; a panic from its `Drop` is caught and logged
/// (its own payload leaked rather than dropped).
pub(crate) fn drop_quietly<V>(value: V) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(move || drop(value))) {
        quietly(|| {
            tracing::warn!("a user value panicked while being dropped; the panic was caught");
        });
        std::mem::forget(payload);
    }
}

/// Runs `f`, the pool's own code calling a tracing subscriber (a log line,
/// a span entered or left, ...); `None` if the subscriber panicked. The
/// panic is not logged, and its payload is dropped inside a catch (leaked
/// if that panics too).
pub(crate) fn quietly<T>(f: impl FnOnce() -> T) -> Option<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(value) => Some(value),
        Err(payload) => {
            if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
                std::mem::forget(again);
            }
            None
        }
    }
}

/// Whether a log line at `level` may reach a tracing subscriber: two
/// loads of tracing's statics, no subscriber call (so it may be asked
/// under a lock of ours).
pub(crate) fn may_log(level: tracing::Level) -> bool {
    level <= tracing::level_filters::STATIC_MAX_LEVEL
        && level <= tracing::level_filters::LevelFilter::current()
}

/// Runs foreign `f` (`what` names it in the log); a panic is caught and
/// logged. Returns whether `f` returned normally.
pub(crate) fn call_quietly(what: &'static str, f: impl FnOnce()) -> bool {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(()) => true,
        Err(payload) => {
            drop_quietly(payload);
            quietly(|| {
                tracing::warn!(
                    what,
                    "foreign code panicked; the panic was caught and the pool's books are kept"
                );
            });
            false
        }
    }
}

/// Wakes `waker`; a panicking `wake` is caught (a waker is foreign code).
pub(crate) fn wake_quietly(waker: Waker) {
    call_quietly("a waker", move || waker.wake());
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
