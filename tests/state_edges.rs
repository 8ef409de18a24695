//! Edges of the pool's locked state (`src/core/state/`) that the other files
//! leave open, found by mutation testing: each test fails on a mutant of a
//! state transition that the rest of the suite let through. Every wait is
//! bounded; events are ordered by gates and signals, never by sleeps.

mod support;

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Wake, Waker};

use offloader::{Error, EventKind, Fate, JobEvent, JobId, JobState, Observer, Offloader};
use support::*;
use tokio::sync::mpsc::UnboundedSender;

/// The life of a job that ran to completion, as the observer sees it.
const COMPLETED_LIFE: [EventKind; 3] = [
    EventKind::Accepted,
    EventKind::Started,
    EventKind::Finished(JobState::Completed),
];

/// An observed pool (`observer_lag` as given, else the default) whose
/// delivery thread failed to spawn, after one job ran: its three events
/// wait, none delivered. Returns the pool, the observer's log and the job.
async fn stranded_events(lag: Option<usize>) -> (Offloader, Arc<Log>, JobId) {
    let log = Arc::new(Log::default());
    let mut b = builder(1, 4).observer(log.clone());
    if let Some(lag) = lag {
        b = b.observer_lag(lag);
    }
    let pool = b.build().expect("valid configuration");
    pool.__fail_next_delivery_spawns(1);
    let first = pool.offload(|_| 1).spawn().expect("accepted");
    let id = first.id();
    assert_eq!(within("the first job", first).await.unwrap(), 1);
    let m = pool.metrics();
    assert_eq!((m.events_delivered, m.events_pending), (0, 3), "{m:?}");
    (pool, log, id)
}

/// The observer's delivery thread failing to spawn does not strand the
/// pool: the events wait, the next accepted job spawns the thread again and
/// it delivers them all, and the pool still terminates (a failed spawn must
/// not leave the delivery thread counted as alive: `State::delivery_gone`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_delivery_spawn_is_retried_by_the_next_job() {
    let (pool, log, first_id) = stranded_events(None).await;
    let second = pool.offload(|_| 2).spawn().expect("accepted");
    let second_id = second.id();
    assert_eq!(within("the second job", second).await.unwrap(), 2);
    pool.shutdown();
    within("termination", pool.terminated()).await;
    assert_eq!(log.kinds(first_id), COMPLETED_LIFE);
    assert_eq!(log.kinds(second_id), COMPLETED_LIFE);
    let m = pool.metrics();
    assert_eq!((m.events_delivered, m.events_pending), (6, 0), "{m:?}");
    assert_ledger(&m);
}

/// Events held back by a delivery thread that failed to spawn do not hold
/// admission back for good: the next caller's attempt spawns the thread
/// again before admission is decided, so a waiting `submit` gets in once
/// the events are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_stranded_by_a_failed_delivery_spawn_do_not_block_admission() {
    let (pool, _log, _) = stranded_events(Some(2)).await;
    // Over the lag, with no thread to deliver: `submit` waits for room.
    let second = within("admission", pool.offload(|_| 2).submit())
        .await
        .expect("admitted once the events were delivered");
    assert_eq!(within("the second job", second).await.unwrap(), 2);
    pool.shutdown();
    within("termination", pool.terminated()).await;
    let m = pool.metrics();
    assert_eq!((m.events_delivered, m.events_pending), (6, 0), "{m:?}");
    assert_ledger(&m);
}

/// A delivery thread that failed to spawn, with no job after it, does not
/// keep the pool from terminating: the shutdown spawns it again and the
/// waiting events are delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_delivers_events_stranded_by_a_failed_delivery_spawn() {
    let (pool, log, id) = stranded_events(None).await;
    pool.shutdown();
    within("termination", pool.terminated()).await;
    assert_eq!(log.kinds(id), COMPLETED_LIFE);
    assert_ledger(&pool.metrics());
}

/// A terminated pool with an observer stays terminated: a refused offload
/// and a second shutdown start no delivery thread (nothing is left to
/// deliver).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_observed_pool_stays_terminated() {
    let log = Arc::new(Log::default());
    let pool = builder(1, 4)
        .observer(log.clone())
        .build()
        .expect("valid configuration");
    assert_eq!(within("a job", pool.offload(|_| 1)).await.unwrap(), 1);
    pool.shutdown();
    within("termination", pool.terminated()).await;
    assert!(pool.is_terminated());
    let refused = pool.offload(|_| 2).spawn();
    assert!(
        matches!(refused, Err(ref e) if matches!(e.reason(), Error::ShuttingDown { id: None })),
        "refused after shutdown"
    );
    assert!(pool.is_terminated(), "a refused offload started a thread");
    pool.shutdown();
    assert!(pool.is_terminated(), "a second shutdown started a thread");
    assert_ledger(&pool.metrics());
}

/// A waker that, when woken, says so and then blocks its thread on a gate.
struct Blocks(UnboundedSender<()>, Hold);

impl Wake for Blocks {
    fn wake(self: Arc<Self>) {
        let _ = self.0.send(());
        self.1.wait();
    }
}

/// A room waiter's waker is foreign code that the worker runs after a job
/// returns: while it runs, the next queued job is not yet marked started.
/// It stays `Queued` and cancellable (`After::runs_foreign_code` counts a
/// room wake-up; ARCHITECTURE.md "A job's path", step 5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_job_stays_queued_while_a_room_waiter_is_woken() {
    let pool = pool(1, 1);
    // Its handle is kept but never polled: no waker of its own to run.
    let occupied = occupy(&pool, 1).await;
    let next = pool.offload(|_| "next").spawn().expect("one may wait");
    // A caller waiting for room, registered by hand with a waker that
    // holds the thread that wakes it.
    let (woken_tx, mut woken) = signal();
    let (waker_gate, waker_hold) = gate();
    let blocks = Waker::from(Arc::new(Blocks(woken_tx, waker_hold)));
    let mut waiting = Box::pin(pool.offload(|_| "waiter").submit());
    assert!(waiting
        .as_mut()
        .poll(&mut Context::from_waker(&blocks))
        .is_pending());

    occupied.gate.open();
    recv("the room waiter woken by the worker", &mut woken).await;
    // The worker is inside that waker now.
    assert_eq!(next.state(), JobState::Queued);
    assert!(next.cancel(), "its function has not started: cancel wins");
    waker_gate.open();

    let admitted = within("the room waiter", waiting)
        .await
        .expect("room freed");
    assert_eq!(
        within("the waiter's job", admitted).await.unwrap(),
        "waiter"
    );
    for h in occupied.handles {
        within("the blocker", h).await.unwrap();
    }
    let m = pool.metrics();
    assert_eq!((m.completed, m.cancelled), (2, 1), "{m:?}");
    assert_ledger(&m);
}

/// An observer that holds the delivery thread on a gate while it delivers
/// a cancellation, after saying so.
struct HoldsCancels(UnboundedSender<()>, Hold);

impl Observer for HoldsCancels {
    fn on_event(&self, event: &JobEvent) {
        if event.kind == EventKind::Finished(JobState::Cancelled) {
            let _ = self.0.send(());
            self.1.wait();
        }
    }
}

/// A caller that gives up waiting for room on an observed pool whose
/// observer is within its lag times out never accepted (`TimedOut { id: None, .. }`), counted in
/// `rejected_timed_out`, even if the room freed just then went to another
/// waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_room_waiter_is_refused_full_when_the_observer_keeps_up() {
    let (delivering_tx, mut delivering) = signal();
    let (observer_gate, observer_hold) = gate();
    let pool = builder(1, 1)
        .observer(Arc::new(HoldsCancels(delivering_tx, observer_hold)))
        .build()
        .expect("valid configuration");
    let occupied = occupy(&pool, 1).await;
    let queued = pool.offload(|_| ()).spawn().expect("one may wait");
    // A delivered batch wakes every room waiter: let these be delivered
    // before any caller waits.
    eventually("events so far delivered", || {
        pool.metrics().events_pending == 0
    })
    .await;
    let mut cx = Context::from_waker(Waker::noop());
    // Two callers wait for room; the first registered is woken first.
    let mut first = Box::pin(pool.offload(|_| "first").submit());
    assert!(first.as_mut().poll(&mut cx).is_pending());
    let mut second = Box::pin(pool.offload(|_| "second").with_timeout(SHORT).submit());
    assert!(second.as_mut().poll(&mut cx).is_pending());
    // The freed slot goes to the first, which is not polled yet; the
    // observer holds the cancellation's delivery meanwhile.
    assert!(queued.cancel());
    recv("the cancellation being delivered", &mut delivering).await;

    let err = within("the second caller's timeout", second)
        .await
        .expect_err("its time-out passes while the slot is promised away");
    assert!(
        matches!(
            err.reason(),
            Error::TimedOut {
                id: None,
                state: None,
                fate: Fate::Cancelled,
                ..
            }
        ),
        "{:?}",
        err.reason()
    );
    let m = pool.metrics();
    assert_eq!(
        (m.rejected_timed_out, m.rejected_full, m.rejected_observer),
        (1, 0, 0),
        "{m:?}"
    );
    observer_gate.open();
    let admitted = within("the first caller", first).await.expect("room");
    occupied.release().await;
    assert_eq!(within("the first job", admitted).await.unwrap(), "first");
}

/// A caller that gives up waiting for room while the queue is full *and*
/// the observer lags times out never accepted, counted as a timed-out wait
/// for room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_timed_out_on_a_full_queue_is_refused_full_though_the_observer_lags() {
    let (observer_gate, hold) = gate();
    let pool = builder(1, 2)
        .observer(Arc::new(HoldsFirst(hold, Default::default())))
        .observer_lag(4)
        .build()
        .expect("valid configuration");
    let occupied = occupy(&pool, 1).await;
    let queued: Vec<_> = (0..2)
        .map(|i| pool.offload(move |_| i).spawn().expect("room for two"))
        .collect();
    let m = pool.metrics();
    assert_eq!((m.queued, m.running), (2, 1), "{m:?}");
    assert!(
        m.events_pending >= 4,
        "the observer lags its full lag: {m:?}"
    );
    let err = within(
        "the caller's timeout",
        pool.offload(|_| 9).with_timeout(SHORT).submit(),
    )
    .await
    .expect_err("the queue stays full");
    assert!(
        matches!(
            err.reason(),
            Error::TimedOut {
                id: None,
                state: None,
                fate: Fate::Cancelled,
                ..
            }
        ),
        "{:?}",
        err.reason()
    );
    let m = pool.metrics();
    assert_eq!(
        (m.rejected_timed_out, m.rejected_full, m.rejected_observer),
        (1, 0, 0),
        "{m:?}"
    );
    observer_gate.open();
    occupied.release().await;
    for (i, job) in queued.into_iter().enumerate() {
        assert_eq!(within("a queued job", job).await.unwrap(), i);
    }
}

/// An observer that holds the delivery thread on a gate at its first event.
struct HoldsFirst(Hold, std::sync::atomic::AtomicBool);

impl Observer for HoldsFirst {
    fn on_event(&self, _event: &JobEvent) {
        if !self.1.swap(true, std::sync::atomic::Ordering::SeqCst) {
            self.0.wait();
        }
    }
}

/// A caller waiting for room because the observer lags is woken when the
/// observer catches up, with no job finishing to wake it: every delivered
/// batch wakes the room waiters (`State::events_done`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_waiter_held_back_by_the_observer_is_woken_when_it_catches_up() {
    let (observer_gate, hold) = gate();
    let pool = builder(1, 4)
        .observer(Arc::new(HoldsFirst(hold, Default::default())))
        .observer_lag(2)
        .build()
        .expect("valid configuration");
    // Three events, the observer held at the first: admission is held back.
    assert_eq!(within("a job", pool.offload(|_| 1)).await.unwrap(), 1);
    let mut waiting = Box::pin(pool.offload(|_| 7).submit());
    assert!(waiting
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
        .is_pending());
    let m = pool.metrics();
    assert!(m.events_pending >= 2 && m.accepted == 1, "{m:?}");
    // Nothing finishes from here on: only the observer catching up frees
    // admission.
    observer_gate.open();
    let admitted = within("the waiter, once the observer caught up", waiting)
        .await
        .expect("admitted");
    assert_eq!(within("its job", admitted).await.unwrap(), 7);
}

/// A function's blocking wait for a queued job of its own pool is counted
/// only while it lasts: two rounds of two such waits on a two-permit pool
/// each see exactly one refused (`WouldDeadlock`, it would hold the last
/// permit) and one served; a wait that ended no longer counts
/// (`State::own_wait_ended`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_wait_for_an_own_queued_job_no_longer_counts() {
    let pool = pool(2, 8);
    for round in 0..2 {
        let (both, hold) = gate();
        let (tx, mut started) = signal();
        let waiters: Vec<_> = (0..2)
            .map(|i| {
                let p = pool.clone();
                // Both permits held once the gate opens: the inner job queues.
                pool.offload(gated(&hold, &tx, (), move |_| {
                    let mut inner = p.offload(move |_| i).spawn().unwrap();
                    inner.blocking_wait(None).map_err(|e| e.to_string())
                }))
                .spawn()
                .unwrap()
            })
            .collect();
        for _ in 0..2 {
            recv("both waiters hold a permit", &mut started).await;
        }
        both.open();
        let mut served = 0;
        let mut refused = Vec::new();
        for h in waiters {
            match within("a waiter", h).await.unwrap() {
                Ok(_) => served += 1,
                Err(text) => refused.push(text),
            }
        }
        assert_eq!(served, 1, "round {round}: refused {refused:?}");
        assert!(
            refused.len() == 1 && refused[0].contains("would never return"),
            "round {round}: {refused:?}"
        );
        within("idle", pool.idle()).await;
    }
    let m = pool.metrics();
    assert_eq!(m.completed, 8, "{m:?}");
}

/// The observer's delivery thread and the stuck-job monitor live until the
/// pool is shut down: an open pool whose workers all retired (keep-alive)
/// keeps them (`State::workers_done`: shut down, idle and no worker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helper_threads_outlive_retired_workers_while_the_pool_is_open() {
    let pool = builder(1, 4)
        .thread_name("stedge")
        .observer(Arc::new(Log::default()))
        .stuck_after(HANG)
        .keep_alive(std::time::Duration::from_millis(1))
        .build()
        .expect("valid configuration");
    let occupied = occupy(&pool, 1).await;
    eventually("both helper threads named", || {
        threads_named("stedge-observer") == 1 && threads_named("stedge-monitor") == 1
    })
    .await;
    occupied.release().await;
    eventually("the worker retired after its keep-alive", || {
        pool.metrics().workers == 0
    })
    .await;
    // The retiring worker wakes both helpers; they must not exit.
    assert!(
        still_pending(eventually("a helper thread exited", || {
            threads_named("stedge-observer") + threads_named("stedge-monitor") < 2
        }))
        .await,
        "a helper thread exited while the pool is open"
    );
    pool.shutdown();
    within("termination", pool.terminated()).await;
    assert_eq!(
        threads_named("stedge-observer") + threads_named("stedge-monitor"),
        0
    );
}

/// Rounds of two cancels in [`tombstones_are_let_go_of_behind_a_held_permit`].
const ROUNDS: usize = 200_000;
/// RSS may grow this much over those rounds; the tombstones of every
/// round, kept, would take several times more.
const TOMBSTONE_SLACK_KIB: u64 = 16 * 1024;

/// Cancelled jobs left in the queue as tombstones are let go of once they
/// outnumber the queued jobs, even while the queue's head cannot start: a
/// producer that keeps cancelling behind a held permit and a waiting job
/// keeps bounded memory (S2: `State::cancel_queued` unlinks them all when
/// they outnumber the queued jobs, `State::unlink_tombstones`).
#[test]
fn tombstones_are_let_go_of_behind_a_held_permit() {
    let pool = pool(1, 4);
    let (gate, hold) = gate();
    let (tx, mut started) = signal();
    let mut blocker = pool
        .offload(move |_| {
            tx.send(()).unwrap();
            hold.wait();
        })
        .spawn()
        .unwrap();
    recv_blocking("the blocker started", &mut started);
    // Never starts while the blocker runs: at least one queued job.
    let mut head = pool.offload(|_| "head").spawn().unwrap();
    let round = || {
        let a = pool.offload(|_| "a").name("tombstone").spawn().unwrap();
        let b = pool.offload(|_| "b").name("tombstone").spawn().unwrap();
        assert!(a.cancel() && b.cancel());
    };
    // Warm-up: the job slab's and the allocator's high-water marks.
    (0..1_000).for_each(|_| round());
    let rss_start = status_kib("VmRSS:");
    (0..ROUNDS).for_each(|_| round());
    let rss_end = status_kib("VmRSS:");
    let m = pool.metrics();
    assert_eq!((m.queued, m.running), (1, 1), "{m:?}");
    assert_eq!(m.cancelled, 2 * (1_000 + ROUNDS) as u64, "{m:?}");
    assert!(
        rss_end <= rss_start + TOMBSTONE_SLACK_KIB,
        "RSS grew from {rss_start} KiB to {rss_end} KiB over {ROUNDS} rounds"
    );
    gate.open();
    blocker.blocking_wait(None).unwrap();
    assert_eq!(head.blocking_wait(None).unwrap(), "head");
}

/// Opens its gate when it sees a job that never started.
struct OpenOnUnstarted(Gate);

impl Observer for OpenOnUnstarted {
    fn on_event(&self, event: &JobEvent) {
        if event.kind == EventKind::NeverStarted {
            self.0.open();
        }
    }
}

/// `shutdown_now` drains the queue a chunk at a time and lets go of the
/// lock between chunks: every job queued when it began comes back
/// unstarted, in submission order, across chunk boundaries and tombstones,
/// even when permits free in the middle of the drain (the first chunk's
/// events open the gate the running jobs wait on): once the drain has
/// begun, no start takes a queued job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_now_drains_in_chunks_and_nothing_starts_meanwhile() {
    const N: usize = 50_000;
    let (g, hold) = gate();
    let pool = builder(2, N)
        .observer(Arc::new(OpenOnUnstarted(g)))
        .observer_lag(4 * N)
        .build()
        .expect("valid configuration");
    let (tx, mut started) = signal();
    let running: Vec<_> = (0..2)
        .map(|_| {
            pool.offload(gated(&hold, &tx, (), |_| ()))
                .spawn()
                .expect("accepted")
        })
        .collect();
    recv("the first permit's job", &mut started).await;
    recv("the second permit's job", &mut started).await;
    let handles: Vec<_> = (0..N)
        .map(|i| pool.offload(move |_| i).spawn().expect("accepted"))
        .collect();
    // Every third job cancelled: tombstones, fewer than the queued jobs,
    // stay linked between the jobs the drain returns.
    let mut kept = Vec::new();
    for (i, h) in handles.iter().enumerate() {
        if i % 3 == 0 {
            assert!(h.cancel());
        } else {
            kept.push(h.id());
        }
    }
    let unstarted: Vec<JobId> = pool.shutdown_now().into_iter().map(|u| u.id).collect();
    assert_eq!(
        unstarted.len(),
        kept.len(),
        "nothing started during the drain"
    );
    assert!(unstarted == kept, "in submission order");
    for h in running {
        within("a running job", h).await.unwrap();
    }
    within("terminated", pool.terminated()).await;
    let m = pool.metrics();
    assert_eq!(m.completed, 2, "{m:?}");
    assert_eq!(m.unstarted as usize, kept.len(), "{m:?}");
    assert_ledger(&m);
}

/// Records, when a queued job's function is dropped unrun, how many jobs
/// the pool still had queued.
struct QueuedAtDrop {
    pool: offloader::WeakOffloader,
    seen: Arc<std::sync::Mutex<Vec<u64>>>,
}

impl Drop for QueuedAtDrop {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            self.seen.lock().unwrap().push(pool.metrics().queued);
        }
    }
}

/// `shutdown_now` lets go of the lock between chunks of its drain, and
/// drops a chunk's functions before it drains the next: when the first
/// function is dropped, the jobs of the later chunks are still queued (a
/// drain in one critical section would hold the lock, and every other
/// caller of the pool, for the whole queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_now_drops_a_chunk_before_draining_the_next() {
    const N: usize = 5_000;
    let pool = builder(1, N).build().expect("valid configuration");
    let (g, hold) = gate();
    let (tx, mut started) = signal();
    let running = pool
        .offload(move |_| {
            tx.send(()).unwrap();
            hold.wait();
        })
        .spawn()
        .expect("accepted");
    recv("the running job", &mut started).await;
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    for _ in 0..N {
        let probe = QueuedAtDrop {
            pool: pool.downgrade(),
            seen: seen.clone(),
        };
        pool.offload(move |_| drop(probe))
            .spawn()
            .expect("accepted")
            .detach();
    }
    assert_eq!(pool.shutdown_now().len(), N);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), N, "every function dropped unrun");
    assert!(
        seen[0] > 0 && seen[0] < N as u64,
        "the first chunk's functions were dropped with {} jobs still queued",
        seen[0]
    );
    assert_eq!(*seen.last().unwrap(), 0);
    g.open();
    within("the running job", running).await.unwrap();
    within("terminated", pool.terminated()).await;
}
