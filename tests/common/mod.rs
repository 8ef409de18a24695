//! Helpers shared by the integration tests: gates that hold a function until
//! the test releases it, "started" signals, a concurrency tracker, and guards
//! that turn a hang into a failure.
//!
//! Nothing here orders events with sleeps: every "the function is running
//! now" or "the function may return now" is a message on a channel.

#![allow(dead_code)]

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::task::Poll;
use std::time::Duration;

use offloader::{JobHandle, Metrics, Offloader, StopToken};

/// Generous upper bound on any single wait in a test; only reached if the
/// library hangs (then the test fails instead of hanging forever).
pub(crate) const HANG: Duration = Duration::from_secs(20);

/// A caller-side timeout that is short because the function it bounds is
/// held on a gate until after the timeout has been observed.
pub(crate) const SHORT: Duration = Duration::from_millis(30);

/// Awaits `fut`, failing the test if it takes longer than [`HANG`].
pub(crate) async fn within<F: IntoFuture>(what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(HANG, fut).await {
        Ok(v) => v,
        Err(_) => panic!("hung for {HANG:?} waiting for: {what}"),
    }
}

/// Polls `fut` exactly once; returns `true` if it completed.
pub(crate) async fn poll_once<F: Future + ?Sized>(mut fut: Pin<&mut F>) -> bool {
    std::future::poll_fn(move |cx| Poll::Ready(fut.as_mut().poll(cx).is_ready())).await
}

/// The test's end of a gate: `open` lets the held function return.
#[derive(Debug)]
pub(crate) struct Gate {
    tx: Option<mpsc::Sender<()>>,
}

impl Gate {
    /// Lets the held function go on.
    pub(crate) fn open(&mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(());
        }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        // A failing test must not leave worker threads held forever.
        self.open();
    }
}

/// The function's end of a gate.
#[derive(Debug)]
pub(crate) struct Hold {
    rx: mpsc::Receiver<()>,
    tx: mpsc::Sender<()>,
}

impl Hold {
    /// Blocks the calling (worker) thread until the gate is opened. Ignores
    /// any stop token on purpose.
    pub(crate) fn wait(self) {
        // A timeout only happens if the test itself is broken or hung.
        let _ = self.rx.recv_timeout(HANG);
    }

    /// Blocks until the gate is opened *or* stop is requested on `stop`
    /// (through an `on_stop` callback); returns `stop.is_stopped()`.
    pub(crate) fn wait_or_stop(self, stop: &StopToken) -> bool {
        let tx = self.tx.clone();
        let _guard = stop.on_stop(move || {
            let _ = tx.send(());
        });
        let _ = self.rx.recv_timeout(HANG);
        stop.is_stopped()
    }
}

/// A new gate: the test keeps `Gate`, the function takes `Hold`.
pub(crate) fn gate() -> (Gate, Hold) {
    let (tx, rx) = mpsc::channel();
    (
        Gate {
            tx: Some(tx.clone()),
        },
        Hold { rx, tx },
    )
}

/// A "started" signal: the function sends, the async test receives.
pub(crate) fn signal<T>() -> (
    tokio::sync::mpsc::UnboundedSender<T>,
    tokio::sync::mpsc::UnboundedReceiver<T>,
) {
    tokio::sync::mpsc::unbounded_channel()
}

/// Receives the next signal within [`HANG`], failing the test otherwise.
pub(crate) async fn recv<T>(what: &str, rx: &mut tokio::sync::mpsc::UnboundedReceiver<T>) -> T {
    within(what, rx.recv())
        .await
        .unwrap_or_else(|| panic!("signal channel closed while waiting for: {what}"))
}

/// Counts functions running right now (inside the function body) and the
/// most ever seen at once.
#[derive(Clone, Debug, Default)]
pub(crate) struct Concurrency {
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
}

impl Concurrency {
    /// Call first thing in the function; keep the guard until it returns.
    pub(crate) fn enter(&self) -> InFlight {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        InFlight {
            now: self.now.clone(),
        }
    }

    pub(crate) fn now(&self) -> usize {
        self.now.load(Ordering::SeqCst)
    }

    pub(crate) fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }
}

/// Leaves the in-flight count when dropped (also while unwinding).
#[derive(Debug)]
pub(crate) struct InFlight {
    now: Arc<AtomicUsize>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// On a `max_in_flight(1)` pool, waits until every job accepted before this
/// call has reached a terminal state *and* been counted: the one worker
/// takes jobs in order and counts each before publishing it, so once this
/// no-op job's outcome is here, everything ahead of it is done.
pub(crate) async fn drain_single(pool: &Offloader) {
    within(
        "a barrier job on a single-worker pool",
        pool.offload(|_stop| ()),
    )
    .await
    .expect("barrier job runs");
}

/// Asserts the ledger identity of one snapshot, with a useful message.
pub(crate) fn assert_ledger(m: &Metrics) {
    assert!(
        m.ledger_balances(),
        "ledger does not balance: accepted {} != queued {} + running {} + terminal {} ({m:?})",
        m.accepted,
        m.queued,
        m.running,
        m.terminal()
    );
}

/// Submits a job that signals that it started and then waits on a gate;
/// returns once that function is running, with the gate that releases it.
pub(crate) async fn occupy(pool: &Offloader) -> (Gate, JobHandle<()>) {
    let (gate, hold) = gate();
    let (tx, mut rx) = signal();
    let handle = pool
        .offload(move |_stop| {
            tx.send(()).expect("test alive");
            hold.wait();
        })
        .name("blocker")
        .spawn()
        .expect("blocker accepted");
    recv("blocker started", &mut rx).await;
    (gate, handle)
}

/// Keeps the output readable: panics whose message says "on purpose" are
/// not printed; every other panic goes to the default hook.
pub(crate) fn quiet_intentional_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            if !msg.contains("on purpose") {
                default(info);
            }
        }));
    });
}
