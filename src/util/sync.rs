//! The one place that chooses between `std` and `loom` synchronisation types.
//!
//! Everything whose interleavings the loom models explore (job states, the
//! pool's shared state, result slots, stop tokens) imports from here. Plain
//! metric counters that are not part of any proof stay on `std` atomics so
//! they do not blow up the models' state space.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU8, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};
#[cfg(loom)]
pub(crate) use loom::thread;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU8, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::thread;

/// Whether workers and callers spin before they park (worker.rs,
/// fast/caller_spin.rs): spinning saves a futex wake-up when jobs arrive back
/// to back. Off under loom, whose scheduler cannot preempt a spin loop.
pub(crate) const SPIN: bool = cfg!(not(loom));

/// `std`'s `Arc` in both builds: jobs are shared as `Arc<dyn Task>` and the
/// pool as `self: &Arc<Self>`, neither of which loom's `Arc` supports
/// (unsized coercion and arbitrary self types are unstable). Reference
/// counts are not what the models check; the states behind them are.
pub(crate) use std::sync::Arc;

/// Aligns its value to a cache line pair (128 bytes: x86-64's prefetcher
/// pulls lines in pairs; one of aarch64's larger lines), so that a value
/// written by some threads does not slow down the readers of its
/// neighbours. Part of the fast layer (core/fast/README.md §5): a crate
/// built with `--cfg offloader_plain` pads nothing.
#[cfg_attr(not(offloader_plain), repr(align(128)))]
pub(crate) struct Padded<T>(pub(crate) T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// One round of a short spin: a CPU hint; under loom, a yield (loom's
/// scheduler cannot preempt a spin).
pub(crate) fn spin_hint() {
    #[cfg(not(loom))]
    std::hint::spin_loop();
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// Parks the current thread for at most `timeout`.
#[cfg(not(loom))]
pub(crate) fn park_timeout(timeout: std::time::Duration) {
    std::thread::park_timeout(timeout);
}

/// loom has no timed park: a timed wait in a model is an untimed one (so
/// workers in models never retire by keep-alive, and models use no timed
/// waits that must expire).
#[cfg(loom)]
pub(crate) fn park_timeout(_timeout: std::time::Duration) {
    loom::thread::park();
}

/// Locks `m`, recovering the guard if a previous holder panicked.
///
/// No code of ours panics while holding one of these locks (user code is
/// never run under them), so a poisoned lock only means a thread died
/// elsewhere; the protected data is still consistent. Treating poison as an
/// error would turn one unrelated panic into a failure for every later caller.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Which of a pool's own threads the current thread is, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A worker that runs jobs.
    Worker,
    /// The observer's delivery thread.
    Delivery,
}

#[cfg(not(loom))]
std::thread_local! {
    /// The pool (its address) and role of this thread, if it is a pool's.
    static POOL_THREAD: std::cell::Cell<Option<(usize, Role)>> = const { std::cell::Cell::new(None) };
}

std::thread_local! {
    /// The slab key of the job whose function this worker thread runs now.
    static CURRENT_JOB: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

std::thread_local! {
    /// The pool (its address) that counts this worker thread as searching
    /// while wakers run on it after a job; 0 for none.
    static SEARCHING_MARK: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Sets this worker thread's searching mark for `pool`.
pub(crate) fn set_searching_mark(pool: usize) {
    #[cfg(not(loom))]
    SEARCHING_MARK.with(|t| t.set(pool));
    #[cfg(loom)]
    let _ = pool;
}

/// Takes `pool`'s searching mark from this thread: whether it held it.
/// Under loom, which keeps no marks, `untracked`.
pub(crate) fn take_searching_mark(pool: usize, untracked: bool) -> bool {
    #[cfg(not(loom))]
    {
        let _ = untracked;
        SEARCHING_MARK.with(|t| {
            let held = t.get() == pool;
            if held {
                t.set(0);
            }
            held
        })
    }
    #[cfg(loom)]
    {
        let _ = pool;
        untracked
    }
}

/// Records the job (its slab key) whose function this worker runs now, or
/// that it runs none (loom: nothing).
pub(crate) fn set_current_job(key: Option<u32>) {
    #[cfg(not(loom))]
    CURRENT_JOB.with(|t| t.set(key));
    #[cfg(loom)]
    let _ = key;
}

/// The job whose function this worker thread runs now (loom: none).
pub(crate) fn current_job() -> Option<u32> {
    #[cfg(not(loom))]
    {
        CURRENT_JOB.with(std::cell::Cell::get)
    }
    #[cfg(loom)]
    {
        None
    }
}

/// Marks the current thread as `pool`'s thread in `role` (loom: nothing;
/// the models do not use the marks).
pub(crate) fn mark_pool_thread(pool: usize, role: Role) {
    #[cfg(not(loom))]
    POOL_THREAD.with(|t| t.set(Some((pool, role))));
    #[cfg(loom)]
    let _ = (pool, role);
}

/// Whether the current thread is `pool`'s thread in `role`.
pub(crate) fn is_pool_thread(pool: usize, role: Role) -> bool {
    #[cfg(not(loom))]
    {
        POOL_THREAD.with(|t| t.get() == Some((pool, role)))
    }
    #[cfg(loom)]
    {
        let _ = (pool, role);
        false
    }
}
