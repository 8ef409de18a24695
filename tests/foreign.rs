//! Nothing foreign runs under a lock of the pool (ARCHITECTURE.md
//! invariant 9): a tracing subscriber, wakers and an observer that each
//! call back into the pool (`metrics()`, `is_idle()`, `running_jobs()`)
//! from inside every callback must never deadlock, whatever the pool is
//! doing. If any of them ran under the pool lock, its call back into the
//! pool would block forever on that lock, and the watchdog below would fail
//! the test.
//!
//! This file is its own test binary because it installs a process-wide
//! tracing subscriber.

mod support;

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use offloader::{AbandonPolicy, JobEvent, Observer, Offloader, WeakOffloader};
use support::{gate, recv, signal, within, IsIdle, Ledger, HANG};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// The pool every callback calls back into.
static POOL: OnceLock<Mutex<Option<WeakOffloader>>> = OnceLock::new();
/// How many callbacks called back.
static CALLS: AtomicUsize = AtomicUsize::new(0);

/// Calls into the pool the way a user's callback might.
fn call_back() {
    let weak = POOL.get().and_then(|p| p.lock().unwrap().clone());
    if let Some(pool) = weak.and_then(|w| w.upgrade()) {
        let m = pool.metrics();
        assert!(m.ledger_balances(), "{m:?}");
        let _ = pool.is_idle();
        let _ = pool.running_jobs();
        CALLS.fetch_add(1, Ordering::SeqCst);
    }
}

/// A subscriber that listens to everything and calls back into the pool
/// from every span and event.
struct Reentrant {
    next: AtomicU64,
}

impl Subscriber for Reentrant {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        call_back();
        Id::from_u64(self.next.fetch_add(1, Ordering::Relaxed))
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {
        call_back();
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
    /// Spans the pool opens close here: calls back too.
    fn try_close(&self, _: Id) -> bool {
        call_back();
        true
    }
}

struct ReentrantObserver;

impl Observer for ReentrantObserver {
    fn on_event(&self, _: &JobEvent) {
        call_back();
    }
}

struct ReentrantWaker;

impl Wake for ReentrantWaker {
    fn wake(self: Arc<Self>) {
        call_back();
    }
}

#[test]
fn callbacks_that_call_back_into_the_pool_never_deadlock() {
    tracing::subscriber::set_global_default(Reentrant {
        next: AtomicU64::new(1),
    })
    .expect("the only subscriber of this test binary");
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(scenario());
        let _ = done_tx.send(());
    });
    done_rx
        .recv_timeout(HANG * 2)
        .expect("a callback deadlocked on the pool lock (or the scenario hung)");
    assert!(CALLS.load(Ordering::SeqCst) > 50, "callbacks did call back");
}

async fn scenario() {
    let pool = Offloader::builder()
        .max_in_flight(2)
        .queue_capacity(2)
        .observer(Arc::new(ReentrantObserver))
        .stuck_after(Duration::from_millis(1))
        .abandon_policy(AbandonPolicy::CancelAndStop)
        .build()
        .unwrap();
    *POOL.get_or_init(|| Mutex::new(None)).lock().unwrap() = Some(pool.downgrade());
    let waker = Waker::from(Arc::new(ReentrantWaker));
    let mut cx = Context::from_waker(&waker);

    // A running job whose handle is polled with the re-entrant waker.
    let (g, hold) = gate();
    let (tx, mut started) = signal();
    let mut running = pool
        .offload(move |stop| {
            tx.send(()).unwrap();
            hold.wait_or_stop(stop)
        })
        .spawn()
        .unwrap();
    recv("started", &mut started).await;
    assert!(std::pin::Pin::new(&mut running).poll(&mut cx).is_pending());

    // idle() polled with the same waker: woken by the pool's Notify.
    let mut idle = pin!(pool.idle());
    assert!(idle.as_mut().poll(&mut cx).is_pending());

    // A second permit's job, then queued ones: cancel, a producer waiting
    // for room (woken when a slot frees), a caller timing out.
    let (g2, hold2) = gate();
    let second = pool.offload(move |_| hold2.wait()).spawn().unwrap();
    let queued = pool.offload(|_| ()).spawn().unwrap();
    let queued2 = pool.offload(|_| ()).spawn().unwrap();
    let mut waiting = pin!(pool.offload(|_| 1).submit());
    assert!(waiting.as_mut().poll(&mut cx).is_pending());
    assert!(queued.cancel());
    // Its handle gone, the pool's tombstone is the job's last reference.
    drop(queued);
    let admitted = within("producer", waiting).await.unwrap();
    let timed_out = pool
        .offload(|_| ())
        .with_timeout(Duration::from_millis(5))
        .await;
    assert!(timed_out.is_err());
    assert!(running.stop());
    g.open();
    g2.open();
    within("running", running).await.unwrap();
    within("second", second).await.unwrap();
    within("queued2", queued2).await.unwrap();
    within("admitted", admitted).await.unwrap();
    within("idle", idle).await;

    // Cancelled jobs that outnumber the queued ones are unlinked all at
    // once (state/mod.rs S2), with every callback calling back.
    let occupied = support::occupy(&pool, 2).await;
    let first = pool.offload(|_| ()).spawn().unwrap();
    let last = pool.offload(|_| ()).spawn().unwrap();
    assert!(first.cancel());
    drop(first);
    assert!(last.cancel());
    drop(last);
    assert_eq!(pool.metrics().queued, 0);
    occupied.release().await;
    within("idle again", pool.idle()).await;

    // A panic, then an immediate shutdown with a queue, then termination.
    support::quiet_deliberate_panics();
    let _ = within(
        "panic",
        pool.offload(|_| -> () { panic!("a job that panics on purpose") }),
    )
    .await;
    let (g3, hold3) = gate();
    let (tx3, mut started3) = signal();
    let blocker = pool
        .offload(move |stop| {
            tx3.send(()).unwrap();
            hold3.wait_or_stop(stop)
        })
        .spawn()
        .unwrap();
    recv("blocker", &mut started3).await;
    let _queued = pool.offload(|_| ()).spawn().unwrap();
    let report = within("close", pool.close(Duration::from_millis(1), HANG)).await;
    assert!(report.terminated, "{report}");
    g3.open();
    let _ = within("blocker", blocker).await;
    within("terminated", pool.terminated()).await;
}
