//! Helpers shared by `tests/lifecycle.rs`, `tests/observer.rs` and
//! `tests/stress_mix.rs`: gates that hold a blocking function until the test
//! opens them, "started" signals, a one-shot poll, and a guard that bounds
//! every async wait so a lost wake-up fails the test instead of hanging it.

#![allow(dead_code)]

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::mpsc;

/// Upper bound for any wait that must complete; only reached on a bug.
pub(crate) const HANG: Duration = Duration::from_secs(20);

/// Short bound used only to prove that something is still pending while the
/// function it depends on is held on a gate.
pub(crate) const PENDING: Duration = Duration::from_millis(30);

/// A one-way gate for blocking functions: `wait` blocks until `open`.
#[derive(Clone, Default)]
pub(crate) struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Blocks the calling (worker) thread until the gate is opened.
    pub(crate) fn wait(&self) {
        let (lock, cv) = &*self.0;
        let mut open = lock.lock().unwrap_or_else(|p| p.into_inner());
        while !*open {
            open = cv.wait(open).unwrap_or_else(|p| p.into_inner());
        }
    }

    pub(crate) fn open(&self) {
        let (lock, cv) = &*self.0;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cv.notify_all();
    }

    pub(crate) fn is_open(&self) -> bool {
        *self.0 .0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Opens the gate when dropped, so that a failing assertion never leaves a
/// worker thread blocked forever.
pub(crate) struct OpenOnDrop(pub(crate) Gate);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// A "started" channel: blocking functions send, the async test receives.
pub(crate) fn signal<T>() -> (mpsc::UnboundedSender<T>, mpsc::UnboundedReceiver<T>) {
    mpsc::unbounded_channel()
}

/// Receives the next signal, failing the test if none comes within [`HANG`].
pub(crate) async fn recv<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> T {
    tokio::time::timeout(HANG, rx.recv())
        .await
        .expect("timed out waiting for a signal from a function")
        .expect("every sender dropped before signalling")
}

/// Awaits `fut`, failing the test if it does not complete within [`HANG`].
pub(crate) async fn within<F: IntoFuture>(what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(HANG, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what} did not complete within {HANG:?}"),
    }
}

/// `true` if `fut` is still pending after [`PENDING`]. Used only while
/// whatever `fut` waits for is held on a gate.
pub(crate) async fn still_pending<F: IntoFuture>(fut: F) -> bool {
    tokio::time::timeout(PENDING, fut).await.is_err()
}

/// Polls `fut` exactly once; `true` if it completed.
pub(crate) async fn poll_once<F: Future + ?Sized>(mut fut: Pin<&mut F>) -> bool {
    std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_ready())).await
}

/// Waits (bounded by [`HANG`]) until `cond` holds, yielding in between.
/// A wait for a condition, not an ordering by sleep.
pub(crate) async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + HANG;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition never held within {HANG:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
