//! The cooperative stop signal handed into every offloaded function.
//!
//! A token is a handle to a *stop source*: the job itself (so a job carries
//! no second allocation for its token) or, for [`StopToken::new`], a small
//! standalone one. The callback list and the sleepers' condvar live in a
//! [`StopExt`] that a source creates only when first needed.
//!
//! # Invariants
//!
//! 1. `is_stopped()` is one atomic load; no lock sits behind the flag.
//! 2. The flag goes from `false` to `true` once and never back; the thread
//!    whose swap flips it is the only one that fires the callbacks.
//! 3. The stopping thread sets the flag *before* it looks for the source's
//!    `StopExt`; a registering or sleeping thread creates (or finds) the
//!    `StopExt` *before* it reads the flag under the `StopExt`'s lock. So
//!    either the registrant sees the flag set, or the stopper finds the
//!    `StopExt` and drains it under its lock after the registrant pushed:
//!    every callback registered while its guard lives runs exactly once, and
//!    no sleeper misses the wake-up.
//! 4. No callback runs while any lock is held, and dropping a
//!    [`StopCallback`] guard waits for its callback if another thread is
//!    running it right now, so after the drop the callback is neither running
//!    nor will it ever run.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use crate::util::sync::{lock, thread, Arc, AtomicBool, Condvar, Mutex, Ordering};

/// Where a [`StopToken`]'s state lives: a job, or a standalone source.
pub(crate) trait StopSource: Send + Sync {
    /// The stop flag (inv. 1).
    fn stop_flag(&self) -> &AtomicBool;
    /// The deadline, if one applies.
    fn deadline(&self) -> Option<Instant>;
    /// The callback list and condvar; created on first use when `create`.
    fn ext(&self, create: bool) -> Option<Arc<StopExt>>;
}

/// Callbacks and sleepers of one stop source, allocated on first use.
pub(crate) struct StopExt {
    callbacks: Mutex<Callbacks>,
    changed: Condvar,
    /// Cancelled by one stop callback; each
    /// `StopToken::cancellation_token` is a child of it (interop.rs), so
    /// however many are asked for, one callback is registered.
    #[cfg(feature = "tokio-util")]
    pub(crate) token: std::sync::OnceLock<tokio_util::sync::CancellationToken>,
}

type Callback = Box<dyn FnOnce() + Send + 'static>;

struct Callbacks {
    next_key: u64,
    pending: Vec<(u64, Callback)>,
    /// The callback being run by the stopping thread right now, if any.
    running: Option<(u64, thread::ThreadId)>,
}

impl StopExt {
    pub(crate) fn new() -> Self {
        StopExt {
            callbacks: Mutex::new(Callbacks {
                next_key: 0,
                pending: Vec::new(),
                running: None,
            }),
            changed: Condvar::new(),
            #[cfg(feature = "tokio-util")]
            token: std::sync::OnceLock::new(),
        }
    }
}

/// Requests stop on `src`; `true` if this call made the request.
pub(crate) fn request_stop(src: &dyn StopSource) -> bool {
    if !mark_stopped(src) {
        return false;
    }
    run_stop_callbacks(src);
    true
}

/// The first half of [`request_stop`]: sets the flag; `true` if this call
/// set it, and must then call [`run_stop_callbacks`] (outside any lock of
/// ours: the callbacks are user code). Split so that a group stop sets the
/// flags of all its running jobs in one critical section.
pub(crate) fn mark_stopped(src: &dyn StopSource) -> bool {
    // ORDERING: AcqRel so that exactly one caller wins (inv. 2) and
    // publishes its writes to `is_stopped` readers.
    !src.stop_flag().swap(true, Ordering::AcqRel)
}

/// The second half of [`request_stop`], by the caller that set the flag:
/// wakes sleepers and runs the callbacks registered so far (inv. 3: one
/// registered later runs at once, as the flag is set).
pub(crate) fn run_stop_callbacks(src: &dyn StopSource) {
    // Inv. 3: the flag is set; now look for registrants and sleepers.
    let Some(ext) = src.ext(false) else {
        return;
    };
    let mut guard = lock(&ext.callbacks);
    ext.changed.notify_all();
    while let Some((key, callback)) = guard.pending.pop() {
        guard.running = Some((key, thread::current().id()));
        drop(guard);
        run_callback(callback);
        guard = lock(&ext.callbacks);
        guard.running = None;
        ext.changed.notify_all();
    }
}

/// A cooperative stop request, handed into every offloaded function.
///
/// The function checks it at safe points ([`is_stopped`](Self::is_stopped),
/// [`check`](Self::check)), sleeps on it ([`sleep`](Self::sleep)), reads the
/// caller's deadline ([`deadline`](Self::deadline),
/// [`remaining`](Self::remaining)), and registers callbacks that abort an
/// SDK's own blocking I/O ([`on_stop`](Self::on_stop)).
///
/// Stop is a *request*, never a kill switch: a function that ignores it keeps
/// running, and keeps its permit, until it returns.
///
/// Stop is requested by [`JobHandle::stop`](crate::JobHandle::stop), by
/// [`Offloader::shutdown_now`](crate::Offloader::shutdown_now), or by the
/// [`AbandonPolicy::CancelAndStop`](crate::AbandonPolicy::CancelAndStop)
/// policy when the caller stops waiting.
///
/// The token is cheap to clone (one reference count) and `Send + Sync`, so
/// it can be moved into a helper thread or a callback. A job's token *is* a
/// reference to the job (the job is its own stop source, to save an
/// allocation): a clone that escapes the function (stored in a struct, a
/// global, a long-lived callback) keeps the job's allocation alive, and with
/// it the job's outcome if nobody took it (a detached job's result is
/// dropped only when the last clone goes). Drop clones when the call they
/// serve returns.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use offloader::{Offloader, Stopped};
///
/// let pool = Offloader::builder().max_in_flight(1).build()?;
/// let job = pool
///     .offload(|stop| -> Result<u32, Stopped> {
///         let mut rounds = 0;
///         loop {
///             stop.check()?; // returns Err(Stopped) once stop is requested
///             rounds += 1;
///             stop.sleep(std::time::Duration::from_millis(1))?;
///         }
///     })
///     .spawn()?;
/// job.stop();
/// assert!(job.await?.is_err());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct StopToken {
    src: std::sync::Arc<dyn StopSource>,
}

/// The source behind [`StopToken::new`].
struct Standalone {
    stopped: AtomicBool,
    ext: Mutex<Option<Arc<StopExt>>>,
}

impl StopSource for Standalone {
    fn stop_flag(&self) -> &AtomicBool {
        &self.stopped
    }

    fn deadline(&self) -> Option<Instant> {
        None
    }

    fn ext(&self, create: bool) -> Option<Arc<StopExt>> {
        lazy_ext(&self.ext, create)
    }
}

/// Returns the `StopExt` kept in `slot`, creating it when `create`.
pub(crate) fn lazy_ext(slot: &Mutex<Option<Arc<StopExt>>>, create: bool) -> Option<Arc<StopExt>> {
    let mut slot = lock(slot);
    if create {
        return Some(slot.get_or_insert_with(|| Arc::new(StopExt::new())).clone());
    }
    slot.clone()
}

/// The error a function returns when it notices that stop was requested.
///
/// Produced by [`StopToken::check`] and [`StopToken::sleep`]; it converts
/// into [`std::io::Error`] (kind `Interrupted`) so that `?` works in functions
/// that return `io::Result`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stop was requested for this job; the function gave up cooperatively")]
pub struct Stopped;

impl From<Stopped> for std::io::Error {
    fn from(e: Stopped) -> Self {
        std::io::Error::new(std::io::ErrorKind::Interrupted, e)
    }
}

impl StopToken {
    /// Creates a token that is not stopped and has no deadline.
    ///
    /// The offloader makes one per job; this constructor is for calling a
    /// stop-aware function directly, in tests or outside the pool.
    ///
    /// ```
    /// let stop = offloader::StopToken::new();
    /// assert!(!stop.is_stopped());
    /// assert!(stop.request_stop());
    /// assert!(stop.is_stopped());
    /// ```
    pub fn new() -> Self {
        StopToken {
            src: std::sync::Arc::new(Standalone {
                stopped: AtomicBool::new(false),
                ext: Mutex::new(None),
            }),
        }
    }

    pub(crate) fn from_source(src: std::sync::Arc<dyn StopSource>) -> Self {
        StopToken { src }
    }

    /// How many callbacks wait for a stop request.
    #[cfg(all(test, not(loom), feature = "tokio-util"))]
    pub(crate) fn pending_callbacks(&self) -> usize {
        self.src
            .ext(false)
            .map_or(0, |ext| lock(&ext.callbacks).pending.len())
    }

    /// The callbacks and sleepers of this token's source, made now if need
    /// be (`None` if the source keeps none: a finished job's).
    #[cfg(feature = "tokio-util")]
    pub(crate) fn ext(&self) -> Option<Arc<StopExt>> {
        self.src.ext(true)
    }

    /// Returns `true` once stop has been requested.
    ///
    /// One atomic load.
    pub fn is_stopped(&self) -> bool {
        // ORDERING: Acquire pairs with the AcqRel swap in `request_stop`, so a
        // function that sees `true` also sees what the stopper wrote before.
        self.src.stop_flag().load(Ordering::Acquire)
    }

    /// Returns `Err(Stopped)` once stop has been requested, for `?`.
    ///
    /// ```
    /// fn work(stop: &offloader::StopToken) -> Result<(), offloader::Stopped> {
    ///     for _chunk in 0..3 {
    ///         stop.check()?;
    ///     }
    ///     Ok(())
    /// }
    /// let stop = offloader::StopToken::new();
    /// assert!(work(&stop).is_ok());
    /// stop.request_stop();
    /// assert_eq!(work(&stop), Err(offloader::Stopped));
    /// ```
    pub fn check(&self) -> Result<(), Stopped> {
        if self.is_stopped() {
            Err(Stopped)
        } else {
            Ok(())
        }
    }

    /// The instant after which nobody waits for this job's result, if one
    /// applies: the caller's [`with_timeout`](crate::Offload::with_timeout)
    /// or the job's own [`deadline`](crate::Offload::deadline), whichever is
    /// earlier.
    ///
    /// Passing the deadline does not stop the job by itself (what happens to
    /// an abandoned job is the abandon policy's business); it tells the
    /// function how long its answer is still useful, for example to set a
    /// socket's read timeout.
    pub fn deadline(&self) -> Option<Instant> {
        self.src.deadline()
    }

    /// Time left until [`deadline`](Self::deadline), saturating at zero;
    /// `None` when no deadline applies.
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline()
            .map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// Sleeps for `duration`, waking early if stop is requested.
    ///
    /// Returns `Err(Stopped)` if stop was requested before or during the
    /// sleep, `Ok(())` if the full duration passed.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// let stop = offloader::StopToken::new();
    /// let remote = stop.clone();
    /// std::thread::spawn(move || remote.request_stop());
    /// let t = Instant::now();
    /// assert!(stop.sleep(Duration::from_secs(60)).is_err());
    /// assert!(t.elapsed() < Duration::from_secs(60));
    /// ```
    pub fn sleep(&self, duration: Duration) -> Result<(), Stopped> {
        self.wait_for_stop(Instant::now().checked_add(duration))
    }

    fn wait_for_stop(&self, until: Option<Instant>) -> Result<(), Stopped> {
        self.check()?;
        let Some(ext) = self.src.ext(true) else {
            return Ok(());
        };
        let mut guard = lock(&ext.callbacks);
        loop {
            // Inv. 3: read under the StopExt lock, after it exists.
            self.check()?;
            let now = Instant::now();
            let wait = match until {
                Some(until) if now >= until => return Ok(()),
                Some(until) => until - now,
                None => Duration::from_secs(3600),
            };
            guard = match ext.changed.wait_timeout(guard, wait) {
                Ok((g, _)) => g,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    /// Requests stop.
    ///
    /// Returns `true` if this call made the request, `false` if stop had
    /// already been requested.
    ///
    /// The thread that makes the request runs the registered
    /// [`on_stop`](Self::on_stop) callbacks before this returns. A callback
    /// that panics is caught and logged; the others still run.
    pub fn request_stop(&self) -> bool {
        request_stop(&*self.src)
    }

    /// Registers `callback` to run once when stop is requested, or at once
    /// (on this thread) if it already was.
    ///
    /// Use it to abort an SDK's own blocking I/O: interrupt a database
    /// connection, shut down a socket. The callback runs on the thread that
    /// requests stop, so keep it short and non-blocking.
    ///
    /// Callbacks run **newest first** (in reverse order of registration), the
    /// way nested scopes unwind: a callback registered for an inner call
    /// runs before the one of the call around it.
    ///
    /// The returned guard unregisters the callback when dropped; if the
    /// callback is running on another thread at that moment, the drop waits
    /// for it to finish. So once the guard is gone the callback cannot touch
    /// a connection that the function has moved on to use for something
    /// else. Keep the guard alive for as long as the call it protects runs.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::Arc;
    ///
    /// let stop = offloader::StopToken::new();
    /// let fired = Arc::new(AtomicUsize::new(0));
    /// let f = fired.clone();
    /// let guard = stop.on_stop(move || {
    ///     f.fetch_add(1, Ordering::SeqCst);
    /// });
    /// stop.request_stop();
    /// stop.request_stop();
    /// assert_eq!(fired.load(Ordering::SeqCst), 1);
    /// drop(guard);
    /// ```
    pub fn on_stop<F>(&self, callback: F) -> StopCallback
    where
        F: FnOnce() + Send + 'static,
    {
        let Some(ext) = self.src.ext(true) else {
            run_callback(Box::new(callback));
            return StopCallback { registration: None };
        };
        let mut guard = lock(&ext.callbacks);
        // Inv. 3: read under the lock, after the StopExt exists; if false,
        // the stopper has yet to drain the list and will find this callback.
        if self.is_stopped() {
            drop(guard);
            run_callback(Box::new(callback));
            return StopCallback { registration: None };
        }
        let key = guard.next_key;
        guard.next_key += 1;
        guard.pending.push((key, Box::new(callback)));
        drop(guard);
        StopCallback {
            registration: Some((ext, key)),
        }
    }
}

fn run_callback(callback: Callback) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(callback)) {
        crate::util::quiet::drop_quietly(payload);
        tracing::warn!(
            "a stop callback panicked; the panic was caught and the other callbacks still ran"
        );
    }
}

impl Default for StopToken {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for StopToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StopToken")
            .field("stopped", &self.is_stopped())
            .field("deadline", &self.deadline())
            .finish()
    }
}

/// Guard returned by [`StopToken::on_stop`]; dropping it unregisters the
/// callback.
///
/// After the drop returns, the callback is neither running nor will it run:
/// if another thread is running it at that moment, the drop waits for it.
#[must_use = "dropping the guard unregisters the callback at once"]
pub struct StopCallback {
    registration: Option<(Arc<StopExt>, u64)>,
}

impl StopCallback {
    /// Lets go of the guard without unregistering: the callback stays
    /// registered until stop fires or the stop source is dropped.
    #[cfg(feature = "tokio-util")]
    pub(crate) fn detach(mut self) {
        self.registration = None;
    }

    /// Returns `true` if the callback is still waiting for a stop request.
    pub(crate) fn is_registered(&self) -> bool {
        match &self.registration {
            Some((ext, key)) => lock(&ext.callbacks).pending.iter().any(|(k, _)| k == key),
            None => false,
        }
    }
}

impl Drop for StopCallback {
    fn drop(&mut self) {
        let Some((ext, key)) = self.registration.take() else {
            return;
        };
        let me = thread::current().id();
        let mut guard = lock(&ext.callbacks);
        if let Some(i) = guard.pending.iter().position(|(k, _)| *k == key) {
            // `remove`, not `swap_remove`: the others keep their order
            // (newest first when they run).
            let (_, callback) = guard.pending.remove(i);
            drop(guard);
            // Dropped outside the lock: it is user code.
            drop(callback);
            return;
        }
        // Inv. 4: wait while another thread runs this very callback.
        while matches!(guard.running, Some((k, t)) if k == key && t != me) {
            guard = match ext.changed.wait(guard) {
                Ok(g) => g,
                Err(poisoned) => poisoned.into_inner(),
            };
        }
    }
}

impl fmt::Debug for StopCallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StopCallback")
            .field("registered", &self.is_registered())
            .finish()
    }
}
