//! Regressions from a hostile review of the core (issues 9 and 10): each
//! test reproduces a finding that once hung, panicked or lied, and now
//! holds. With them, the same guarantees for a room waiter's waker: foreign
//! code the worker runs after a job returns, before the next job is marked
//! started. Every wait is bounded; events are ordered by gates and signals.

mod support;

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Wake, Waker};
use std::time::Instant;

use offloader::{Error, JobHandle, JobState, Offloader};
use support::next_job::{NextJob, OnWake};
use support::{
    assert_ledger, gate, occupy, pool, quiet_deliberate_panics, recv, signal, within,
    within_blocking, IsIdle, HANG,
};

/// A waker whose last reference, when dropped, calls `on_drop`.
struct DropHook(Mutex<Option<Box<dyn FnOnce() + Send>>>);

impl Wake for DropHook {
    fn wake(self: Arc<Self>) {}
}

impl Drop for DropHook {
    fn drop(&mut self) {
        if let Some(f) = self.0.lock().unwrap().take() {
            f();
        }
    }
}

/// Finding 1: a waker's clone and drop are foreign code and ran under the
/// job's cell lock; a waker whose drop re-entered the pool on that job
/// (`shutdown_now` publishing its outcome) deadlocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waker_dropped_while_re_registering_may_re_enter_the_pool() {
    let pool = Offloader::builder().max_in_flight(1).build().unwrap();
    let occupied = occupy(&pool, 1).await;
    let mut queued = pool.offload(|_| 7).spawn().unwrap();
    let p = pool.clone();
    let reentered = Arc::new(AtomicBool::new(false));
    let r = reentered.clone();
    let first = Waker::from(Arc::new(DropHook(Mutex::new(Some(Box::new(move || {
        let _ = p.shutdown_now();
        r.store(true, Ordering::SeqCst);
    }))))));
    let second = Waker::from(Arc::new(DropHook(Mutex::new(None))));
    let handle_out = within_blocking("two polls, the second drops the first waker", move || {
        assert!(Pin::new(&mut queued)
            .poll(&mut Context::from_waker(&first))
            .is_pending());
        // The handle's slot now holds the last reference to `first`.
        drop(first);
        let r = Pin::new(&mut queued).poll(&mut Context::from_waker(&second));
        (queued, r.is_ready())
    });
    assert!(
        reentered.load(Ordering::SeqCst),
        "the drop re-entered the pool"
    );
    let (queued, _) = handle_out;
    let e = within("the outcome", queued).await.unwrap_err();
    assert!(matches!(e, Error::ShuttingDown { id: Some(_) }), "{e:?}");
    occupied.release().await;
    within("terminated", pool.terminated()).await;
}

/// Finding 2: a termination waiter on a runtime that was already shut down
/// had its joins refused by tokio, leaking them: the pool never terminated
/// for anybody. The joins now happen wherever the refused task is dropped.
#[test]
fn a_termination_waiter_on_a_dead_runtime_does_not_strand_the_joins() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let handle = rt.handle().clone();
    drop(rt);
    let pool = Offloader::builder().max_in_flight(2).build().unwrap();
    for _ in 0..4 {
        pool.offload(|_| ()).spawn().unwrap().detach();
    }
    pool.shutdown();
    let p = pool.clone();
    // Whatever this returns on a dead runtime, it must not hang or leak.
    let _ = std::thread::spawn(move || handle.block_on(p.terminated())).join();
    let p = pool.clone();
    assert!(
        within_blocking("blocking termination", move || p
            .blocking_await_termination(Some(HANG))),
        "{:?}",
        pool.metrics()
    );
    assert!(pool.is_terminated());
}

thread_local! {
    static ASK_ON_EXIT: RefCell<Option<AskOnExit>> = const { RefCell::new(None) };
}

/// A thread-local whose destructor asks the pool whether it terminated,
/// from the retiring worker itself.
struct AskOnExit {
    pool: Offloader,
    asked: Arc<AtomicUsize>,
}

impl Drop for AskOnExit {
    fn drop(&mut self) {
        let _ = self.pool.is_terminated();
        self.asked.fetch_add(1, Ordering::SeqCst);
    }
}

/// Finding 3: a retiring worker that asks for termination (from a
/// thread-local destructor or a waker it wakes) took its own handle and
/// tried to join itself: a panic that aborted the process from a
/// destructor, or a leaked join that kept the pool from ever terminating.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retiring_worker_asking_for_termination_does_not_join_itself() {
    let pool = Offloader::builder().max_in_flight(1).build().unwrap();
    let asked = Arc::new(AtomicUsize::new(0));
    let (p, a) = (pool.clone(), asked.clone());
    within(
        "a job",
        pool.offload(move |_| {
            ASK_ON_EXIT.with(|s| *s.borrow_mut() = Some(AskOnExit { pool: p, asked: a }))
        }),
    )
    .await
    .unwrap();
    pool.shutdown();
    within("terminated", pool.terminated()).await;
    assert_eq!(
        asked.load(Ordering::SeqCst),
        1,
        "the destructor ran and returned"
    );
    assert!(pool.is_terminated());
}

/// A waker that panics when woken.
struct Panics;

impl Wake for Panics {
    fn wake(self: Arc<Self>) {
        panic!("a waker that panics on purpose");
    }
}

/// A waker that records that it was woken.
#[derive(Default)]
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Finding 4: with tokio's `notify_waiters`, one panicking waker among the
/// `idle()` waiters kept the others from being woken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_idle_waiter_does_not_silence_the_others() {
    quiet_deliberate_panics();
    let pool = Offloader::builder().max_in_flight(1).build().unwrap();
    let occupied = occupy(&pool, 1).await;
    // Both registered, the hostile one first, by polling them by hand.
    let mut hostile = Box::pin(pool.idle());
    let mut honest = Box::pin(pool.idle());
    let panics = Waker::from(Arc::new(Panics));
    let flag = Arc::new(Flag::default());
    let flagged = Waker::from(flag.clone());
    assert!(hostile
        .as_mut()
        .poll(&mut Context::from_waker(&panics))
        .is_pending());
    assert!(honest
        .as_mut()
        .poll(&mut Context::from_waker(&flagged))
        .is_pending());
    occupied.release().await;
    let deadline = Instant::now() + HANG;
    while !flag.0.load(Ordering::SeqCst) {
        assert!(
            Instant::now() < deadline,
            "the honest idle() waiter was never woken"
        );
        tokio::task::yield_now().await;
    }
    assert!(honest
        .as_mut()
        .poll(&mut Context::from_waker(&flagged))
        .is_ready());
}

/// A detached job's result whose drop waits on a gate.
struct SlowDrop(Mutex<Option<support::Hold>>);

impl Drop for SlowDrop {
    fn drop(&mut self) {
        if let Some(hold) = self.0.lock().unwrap().take() {
            hold.wait();
        }
    }
}

/// Finding 5: the worker marked the next job `Running` (permit taken,
/// uncancellable) before running the previous job's foreign code, here a
/// detached result's slow drop. The next job now stays queued, and
/// cancellable, until that code is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_job_stays_queued_while_the_previous_result_drops() {
    let pool = Offloader::builder().max_in_flight(1).build().unwrap();
    let (drop_gate, drop_hold) = gate();
    let (tx, mut dropping) = signal();
    let (fn_gate, fn_hold) = gate();
    pool.offload(move |_| {
        fn_hold.wait();
        tx.send(()).unwrap();
        SlowDrop(Mutex::new(Some(drop_hold)))
    })
    .spawn()
    .unwrap()
    .detach();
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    let next = pool
        .offload(move |_| r.store(true, Ordering::SeqCst))
        .spawn()
        .unwrap();
    fn_gate.open();
    recv("the first function returned", &mut dropping).await;
    // Its result is being dropped now, held on `drop_gate`.
    assert_eq!(next.state(), JobState::Queued);
    assert!(next.cancel(), "its function has not started: cancel wins");
    drop_gate.open();
    within("idle", pool.idle()).await;
    assert!(
        !ran.load(Ordering::SeqCst),
        "cancelled before start: never ran"
    );
    let m = pool.metrics();
    assert_eq!((m.completed, m.cancelled), (1, 1), "{m:?}");
}

/// The same for a caller waiting for room: its waker is foreign code that
/// the worker runs after a job returns, and while it runs the next queued
/// job is not yet marked started. It stays `Queued` and cancellable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_job_stays_queued_while_a_room_waiter_is_woken() {
    let pool = pool(1, 1);
    // Its handle is kept but never polled: no waker of its own to run.
    let occupied = occupy(&pool, 1).await;
    let next = pool.offload(|_| "next").spawn().expect("one may wait");
    // A caller waiting for room, registered by hand with a waker that says
    // it was woken, then holds the thread that woke it on a gate.
    let (woken_tx, mut woken) = signal();
    let (waker_gate, waker_hold) = gate();
    let blocks = Waker::from(Arc::new(OnWake(Box::new(move || {
        let _ = woken_tx.send(());
        waker_hold.wait();
    }))));
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

thread_local! {
    static SLOW_EXIT: RefCell<Option<SlowExit>> = const { RefCell::new(None) };
}

/// A thread-local whose destructor waits for the test.
struct SlowExit(Option<mpsc::Receiver<()>>, Arc<AtomicBool>);

impl Drop for SlowExit {
    fn drop(&mut self) {
        if let Some(rx) = self.0.take() {
            let _ = rx.recv_timeout(HANG);
        }
        self.1.store(true, Ordering::SeqCst);
    }
}

/// Finding 6: `is_terminated()` joined the last threads inline, blocking for
/// as long as their thread-local destructors ran. It never blocks now: it
/// answers `false` while they run, and `true` once they were joined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn is_terminated_never_blocks_on_exiting_threads() {
    let pool = Offloader::builder().max_in_flight(1).build().unwrap();
    let (release, rx) = mpsc::channel::<()>();
    let exited = Arc::new(AtomicBool::new(false));
    let e = exited.clone();
    let rx = Mutex::new(Some(rx));
    within(
        "a job",
        pool.offload(move |_| {
            let rx = rx.lock().unwrap().take();
            SLOW_EXIT.with(|s| *s.borrow_mut() = Some(SlowExit(rx, e)))
        }),
    )
    .await
    .unwrap();
    pool.shutdown();
    // Wait until the worker retired (its destructor now blocks).
    let deadline = Instant::now() + HANG;
    while pool.metrics().workers != 0 {
        assert!(Instant::now() < deadline, "the worker never retired");
        tokio::task::yield_now().await;
    }
    let began = Instant::now();
    assert!(!pool.is_terminated(), "a thread is still exiting");
    assert!(began.elapsed() < HANG / 4, "is_terminated() blocked");
    assert!(!exited.load(Ordering::SeqCst));
    drop(release);
    within("terminated", pool.terminated()).await;
    assert!(exited.load(Ordering::SeqCst));
    assert!(pool.is_terminated());
}

/// Finding 7: while the OS refuses new threads, queued jobs that no worker
/// can start count against `queue_capacity`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_spawns_do_not_widen_the_queue() {
    let pool = Offloader::builder()
        .max_in_flight(8)
        .queue_capacity(1)
        .build()
        .unwrap();
    let occupied = occupy(&pool, 1).await;
    pool.__fail_next_thread_spawns(usize::MAX);
    let waiting = pool.offload(|_| ()).spawn().expect("one may wait");
    let err = pool
        .offload(|_| ())
        .spawn()
        .expect_err("no worker can start it: the queue is full");
    assert!(matches!(err.reason(), Error::Full { capacity: 1 }));
    let m = pool.metrics();
    assert_eq!((m.running, m.queued, m.workers), (1, 1, 1), "{m:?}");
    pool.__fail_next_thread_spawns(0);
    occupied.release().await;
    within("the waiting job", waiting).await.unwrap();
}

/// A waker whose first clone calls a hook (foreign code run where the waker
/// is cloned); waking it does nothing.
struct CloneHook(Mutex<Option<Box<dyn FnOnce() + Send>>>);

static CLONE_HOOK: std::task::RawWakerVTable =
    std::task::RawWakerVTable::new(hook_clone, hook_drop, |_| {}, hook_drop);

/// # Safety
/// `p` is a pointer of `Arc::into_raw` of a `CloneHook`, whose reference the
/// waker being cloned holds.
unsafe fn hook_clone(p: *const ()) -> std::task::RawWaker {
    // SAFETY: see the function's contract; the clone gets a reference of its own.
    let hook = unsafe {
        Arc::increment_strong_count(p.cast::<CloneHook>());
        &*p.cast::<CloneHook>()
    };
    let f = hook.0.lock().unwrap().take();
    if let Some(f) = f {
        f();
    }
    std::task::RawWaker::new(p, &CLONE_HOOK)
}

/// # Safety
/// As `hook_clone`; the waker dropped (or woken by value) gives up its reference.
unsafe fn hook_drop(p: *const ()) {
    // SAFETY: see the function's contract.
    drop(unsafe { Arc::from_raw(p.cast::<CloneHook>()) });
}

fn clone_hook(f: impl FnOnce() + Send + 'static) -> Waker {
    let hook = Arc::new(CloneHook(Mutex::new(Some(Box::new(f)))));
    let raw = std::task::RawWaker::new(Arc::into_raw(hook).cast(), &CLONE_HOOK);
    // SAFETY: the vtable's functions keep the contract of `RawWaker` for an
    // `Arc<CloneHook>` data pointer (each waker holds one reference).
    unsafe { Waker::from_raw(raw) }
}

/// Finding (2026-12-05) 1: a caller waiting for room registered its waker
/// in tokio's `Notify`, which clones it under the lock that `notify_one`
/// takes; a waker whose clone cancelled another job (freeing room, so
/// waking a room waiter) deadlocked on that lock. The `Notify` now holds a
/// waker of the pool's, and the caller's is cloned outside every lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_waiter_s_waker_may_call_into_the_pool_when_cloned() {
    let pool = pool(1, 1);
    let occupied = occupy(&pool, 1).await;
    let queued = Arc::new(pool.offload(|_| 1).spawn().unwrap());
    let mut submit = Box::pin(pool.offload(|_| 3).submit());
    let q = queued.clone();
    let polled = within_blocking("a room waiter polled with a re-entrant waker", move || {
        assert!(submit
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending());
        let reentrant = clone_hook(move || assert!(q.cancel(), "the queued job was queued"));
        match submit.as_mut().poll(&mut Context::from_waker(&reentrant)) {
            std::task::Poll::Ready(r) => r.ok(),
            std::task::Poll::Pending => None,
        }
    });
    let handle = polled.expect("the cancel freed room: the submit was accepted");
    occupied.release().await;
    assert_eq!(within("the submitted job", handle).await.unwrap(), 3);
    assert_eq!(queued.state(), JobState::Cancelled);
}

/// Finding (2026-12-05) 2: a panicking waker among the callers waiting for
/// room made tokio's `notify_waiters` drop the rest of its batch unwoken:
/// at shutdown, the honest waiters never learned they were refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_room_waiter_does_not_strand_the_others_at_shutdown() {
    quiet_deliberate_panics();
    let pool = pool(1, 1);
    let occupied = occupy(&pool, 1).await;
    let _queued = pool.offload(|_| ()).spawn().unwrap();
    let panics = Waker::from(Arc::new(Panics));
    let mut waiters: Vec<_> = (0..5)
        .map(|_| Box::pin(pool.offload(|_| ()).submit()))
        .collect();
    let flags: Vec<_> = (0..5).map(|_| Arc::new(Flag::default())).collect();
    for (i, w) in waiters.iter_mut().enumerate() {
        // The first and the last waiter's wakers panic.
        let waker = if i % 4 == 0 {
            panics.clone()
        } else {
            Waker::from(flags[i].clone())
        };
        assert!(w
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
    }
    pool.shutdown();
    for i in [1, 2, 3] {
        assert!(flags[i].0.load(Ordering::SeqCst), "waiter {i} was woken");
    }
    for w in waiters {
        let e = within("a refused waiter", w).await.unwrap_err();
        assert!(
            matches!(e.reason(), Error::ShuttingDown { id: None }),
            "{e:?}"
        );
    }
    occupied.release().await;
}

/// Finding (2026-12-05) 3: a batch call kept its task's waker under a lock
/// that a job's wake-up takes: a waker whose clone, or whose drop when
/// replaced, stopped the batch's group (waking its jobs' futures) took that
/// lock again and deadlocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_s_waker_may_stop_its_group_when_cloned_or_dropped() {
    for on_clone in [true, false] {
        let pool = Offloader::builder().max_in_flight(1).build().unwrap();
        let occupied = occupy(&pool, 1).await;
        let group = pool.group();
        let g = group.clone();
        let mut batch = Box::pin(std::future::IntoFuture::into_future(
            group.invoke_all((0..4).map(|i| move |_: &_| i)),
        ));
        let done = within_blocking("a batch polled with a re-entrant waker", move || {
            let stop = move || {
                g.stop();
            };
            let (first, second) = if on_clone {
                (Waker::noop().clone(), clone_hook(stop))
            } else {
                let dropped = Waker::from(Arc::new(DropHook(Mutex::new(Some(Box::new(stop))))));
                (dropped, Waker::noop().clone())
            };
            assert!(batch
                .as_mut()
                .poll(&mut Context::from_waker(&first))
                .is_pending());
            // The batch now holds the last reference to `first`.
            drop(first);
            match batch.as_mut().poll(&mut Context::from_waker(&second)) {
                std::task::Poll::Ready(out) => Ok(out),
                std::task::Poll::Pending => Err(batch),
            }
        });
        let out = match done {
            Ok(out) => out,
            Err(batch) => within("the stopped batch", batch).await,
        };
        assert_eq!(out.len(), 4);
        assert!(
            out.iter()
                .all(|r| r.as_ref().is_err_and(Error::is_cancelled)),
            "the group was stopped before its jobs ran: {out:?}"
        );
        occupied.release().await;
    }
}

/// Finding (2026-12-05) 4: `shutdown_now`'s documentation promised the
/// unstarted jobs in submission order, while the drain goes lane by lane.
/// The documented order: the jobs without a key first, then each key's
/// jobs together, each lane's in submission order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_now_reports_lane_by_lane_each_in_submission_order() {
    let pool = Offloader::builder().max_in_flight(1).build().unwrap();
    let occupied = occupy(&pool, 1).await;
    let keys = [None, Some("a"), Some("b"), None, Some("a"), Some("b"), None];
    let handles: Vec<_> = keys
        .iter()
        .map(|key| {
            let o = pool.offload(|_| ());
            match key {
                Some(k) => o.key(*k).spawn().unwrap(),
                None => o.spawn().unwrap(),
            }
        })
        .collect();
    let ids: Vec<_> = handles.iter().map(|h| h.id()).collect();
    let reported: Vec<_> = pool.shutdown_now().iter().map(|j| j.id).collect();
    let unkeyed = [ids[0], ids[3], ids[6]];
    let (a, b) = (vec![ids[1], ids[4]], vec![ids[2], ids[5]]);
    assert_eq!(reported[..3], unkeyed[..], "{reported:?}");
    let rest = &reported[3..];
    assert!(
        rest == [a.clone(), b.clone()].concat() || rest == [b, a].concat(),
        "{reported:?} vs {ids:?}"
    );
    occupied.release().await;
}

/// A result whose drop, if it runs on a pool thread, cancels the job
/// queued behind it and records whether that job's function had begun.
struct CancelsTheNext {
    next: NextJob,
    dropped: Arc<AtomicBool>,
}

impl Drop for CancelsTheNext {
    fn drop(&mut self) {
        let on_worker = std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("offloader"));
        if on_worker {
            self.next.fire();
        }
        self.dropped.store(true, Ordering::SeqCst);
    }
}

/// Regression (hostile review): a job's handle dropped just after its
/// outcome was published left the last reference, and the result's drop,
/// to the worker, which had already marked the next job started in the
/// same critical section: that job was uncancellable while its function
/// had not begun (194 of 200 iterations). A result with drop glue now ends
/// the chain: the next job is started after the drop, and a cancel from
/// inside the drop wins.
#[test]
fn a_result_dropped_by_the_worker_runs_before_the_next_job_is_started() {
    let pool = pool(1, 16);
    support::warm(&pool);
    for _ in 0..200 {
        let (open, hold) = gate();
        let next = NextJob::default();
        let dropped = Arc::new(AtomicBool::new(false));
        let result = CancelsTheNext {
            next: next.clone(),
            dropped: dropped.clone(),
        };
        let first = pool
            .offload(move |_| {
                hold.wait();
                result
            })
            .spawn()
            .expect("room");
        next.queue(&pool);
        open.open();
        while !first.is_finished() {
            std::hint::spin_loop();
        }
        // Dropped right after the outcome is published.
        drop(first);
        support::eventually_blocking("the result dropped", || dropped.load(Ordering::SeqCst));
        let outcome = next.wait().expect("the handle");
        let seen = *next.seen.lock().expect("not poisoned");
        if let Some((cancelled, begun)) = seen {
            assert!(
                cancelled || begun,
                "a cancel was refused for a job whose function had not begun"
            );
            assert_eq!(outcome.is_ok(), !cancelled, "{outcome:?}");
        }
    }
}

/// A panic's payload that no owner takes (its handle was dropped) is
/// dropped by the worker, user code again: the job queued behind it is
/// started only after that drop, so a cancel from inside the drop wins and
/// the job never runs.
#[test]
fn a_panic_payload_is_dropped_before_the_next_job_is_started() {
    quiet_deliberate_panics();
    let pool = pool(1, 16);
    support::warm(&pool);
    for _ in 0..20 {
        let (open, hold) = gate();
        let next = NextJob::default();
        let dropped = Arc::new(AtomicBool::new(false));
        let payload = CancelsTheNext {
            next: next.clone(),
            dropped: dropped.clone(),
        };
        let first = pool
            .offload(move |_| -> () {
                hold.wait();
                std::panic::panic_any(payload)
            })
            .spawn()
            .expect("room");
        next.queue(&pool);
        // Nobody takes the payload: the worker drops it with the job.
        drop(first);
        open.open();
        // No waker registered: nothing else holds the next job back.
        support::eventually_blocking("the payload dropped", || dropped.load(Ordering::SeqCst));
        let outcome = next.wait().expect("the handle");
        let seen = *next.seen.lock().expect("not poisoned");
        assert_eq!(seen, Some((true, false)), "cancelled before it began");
        assert!(
            matches!(outcome, Err(Error::Cancelled { id: Some(_) })),
            "{outcome:?}"
        );
        assert!(!next.begun.load(Ordering::SeqCst));
    }
}

/// Counts its drops.
struct CountsDrops(Arc<AtomicUsize>);

impl Drop for CountsDrops {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Regression (hostile review of a version that kept such results until
/// its chain of jobs ended): the last handle of a finished job, dropped
/// without taking the value, releases it at once, though the worker has
/// gone on to the next job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_handle_of_a_finished_job_releases_its_value() {
    let pool = pool(1, 16);
    let drops = Arc::new(AtomicUsize::new(0));
    let (open_a, hold_a) = gate();
    let d = drops.clone();
    let a = pool
        .offload(move |_| {
            hold_a.wait();
            CountsDrops(d)
        })
        .spawn()
        .expect("room");
    let (started, mut b_started) = signal();
    let (open_b, hold_b) = gate();
    let b = pool
        .offload(move |_| {
            let _ = started.send(());
            hold_b.wait();
        })
        .spawn()
        .expect("room");
    open_a.open();
    recv("the next job started", &mut b_started).await;
    assert!(a.is_finished());
    drop(a);
    assert_eq!(drops.load(Ordering::SeqCst), 1, "released with its handle");
    open_b.open();
    within("the next job", b).await.expect("runs");
}

/// Regression (hostile review): a group's idle waiters were woken on the
/// worker after it had marked the next job started (200 of 200): a job of
/// a group no longer chains the next one.
#[test]
fn a_group_idle_waker_runs_before_the_next_job_is_started() {
    let pool = pool(1, 16);
    support::warm(&pool);
    for _ in 0..50 {
        let group = pool.group();
        let next = NextJob::default();
        let (open, hold) = gate();
        let first = group.offload(move |_| hold.wait()).spawn().expect("room");
        next.queue(&pool);
        let waker = next.waker();
        let mut cx = Context::from_waker(&waker);
        let mut idle = Box::pin(group.idle());
        assert!(idle.as_mut().poll(&mut cx).is_pending());
        open.open();
        support::eventually_blocking("the idle waiter woken", || {
            next.seen.lock().expect("not poisoned").is_some()
        });
        next.wait();
        assert!(
            !next.refused_before_begun(),
            "cancel refused before the function began"
        );
        drop(first);
    }
}

/// Regression (hostile review): a job's limiter permit, given back to
/// another pool, woke that pool's room waiter on this worker after it had
/// marked the next job started (100 of 100).
#[test]
fn another_pools_waiter_woken_by_a_limiter_runs_before_the_next_job_is_started() {
    let one = support::builder(1, 16).build().expect("valid");
    let two = support::builder(1, 1).build().expect("valid");
    support::warm(&one);
    support::warm(&two);
    for _ in 0..30 {
        let limiter = offloader::Limiter::new(1);
        let next = NextJob::default();
        let (open, hold) = gate();
        let mut first = one
            .offload(move |_| hold.wait())
            .limiter(&limiter)
            .spawn()
            .expect("room");
        support::eventually_blocking("the first job holds the limiter", || {
            limiter.stats().in_use == 1
        });
        next.queue(&one);
        let mut blocked = two.offload(|_| ()).limiter(&limiter).spawn().expect("room");
        support::eventually_blocking("a lane of the other pool waits", || {
            limiter.stats().pools_waiting == 1
        });
        let waker = next.waker();
        let mut cx = Context::from_waker(&waker);
        let mut waiting = Box::pin(two.offload(|_| ()).limiter(&limiter).submit());
        assert!(
            waiting.as_mut().poll(&mut cx).is_pending(),
            "the other pool is full"
        );
        open.open();
        next.wait();
        assert!(
            !next.refused_before_begun(),
            "cancel refused before the function began"
        );
        let _ = first.blocking_wait(None);
        let _ = blocked.blocking_wait(None);
        let noop = Waker::noop();
        let mut cx = Context::from_waker(noop);
        support::eventually_blocking("the waiting caller admitted", || {
            waiting.as_mut().poll(&mut cx).is_ready()
        });
    }
}

/// The awaiting caller's waker runs on the worker that finished the job:
/// the next job is started only after it, so a cancel from inside the
/// waker wins (the worker reads the "waker registered" hint).
#[test]
fn an_awaiting_caller_s_waker_runs_before_the_next_job_is_started() {
    let pool = pool(1, 16);
    support::warm(&pool);
    for _ in 0..50 {
        let next = NextJob::default();
        let (open, hold) = gate();
        let mut first = pool.offload(move |_| hold.wait()).spawn().expect("room");
        next.queue(&pool);
        let waker = next.waker();
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut first).poll(&mut cx).is_pending());
        open.open();
        support::eventually_blocking("the caller's waker ran", || {
            next.seen.lock().expect("not poisoned").is_some()
        });
        assert_eq!(
            *next.seen.lock().expect("not poisoned"),
            Some((true, false)),
            "the next job cancelled before it began"
        );
        next.wait();
        assert!(!next.begun.load(Ordering::SeqCst));
    }
}

/// Offloads a job returning 5 to `pool` and waits for it: what a waker
/// or a drop on a worker does below.
fn offload_five_and_wait(pool: &Offloader) -> Result<u32, Error> {
    match pool.offload(|_| 5u32).spawn() {
        Ok(mut job) => job.blocking_wait(None),
        Err(refused) => panic!("refused: {:?}", refused.reason()),
    }
}

/// A waker whose first wake offloads and waits (`offload_five_and_wait`)
/// and sends the outcome.
fn offloads_and_waits_when_woken(
    pool: &Offloader,
    sent: mpsc::Sender<Result<u32, Error>>,
) -> Waker {
    let sent = Mutex::new(Some(sent));
    let pool = pool.clone();
    Waker::from(Arc::new(OnWake(Box::new(move || {
        if let Some(sent) = sent.lock().expect("not poisoned").take() {
            let _ = sent.send(offload_five_and_wait(&pool));
        }
    }))))
}

/// For limits 1 to 3: `from_the_worker` makes code run on a worker of a
/// warm pool that offloads and waits (`offload_five_and_wait`) and sends
/// the outcome. At one permit there is no other worker: the wait is
/// refused, not hung; above, it gets the job's value. Then the pool
/// settles with its ledger balanced.
fn waits_from_the_worker_end(
    from_the_worker: impl Fn(&Offloader, mpsc::Sender<Result<u32, Error>>) -> Option<JobHandle<()>>,
) {
    for limit in 1..=3 {
        let pool = pool(limit, 16);
        support::warm(&pool);
        let (sent, waited) = mpsc::channel();
        let job = from_the_worker(&pool, sent);
        let waited = waited
            .recv_timeout(HANG)
            .unwrap_or_else(|e| panic!("limit {limit}: the wait did not end: {e}"));
        if limit == 1 {
            assert!(
                matches!(waited, Err(Error::WouldDeadlock { .. })),
                "{waited:?}"
            );
        } else {
            assert_eq!(waited.ok(), Some(5), "limit {limit}");
        }
        if let Some(mut job) = job {
            assert!(job.blocking_wait(None).is_ok());
        }
        support::eventually_blocking("the pool idle", || pool.is_idle());
        support::assert_ledger(&pool.metrics());
    }
}

/// A result whose drop offloads a job to the pool it came from and waits
/// for it, sending the outcome.
struct OffloadsOnDrop(Offloader, mpsc::Sender<Result<u32, Error>>);

impl Drop for OffloadsOnDrop {
    fn drop(&mut self) {
        let _ = self.1.send(offload_five_and_wait(&self.0));
    }
}

/// Regression (a hostile check of a result's drop re-entering its pool):
/// a detached job's result whose drop offloads a job to the same pool and
/// waits for it hung for good at two permits or more. The dropping worker
/// was already counted as searching, so the new job woke no other worker,
/// and the one "searching" was blocked in the drop. A worker now counts as
/// searching only once no drop or subscriber is left to run on it. The
/// function returns only once its handle is detached: a result published
/// before would be dropped with the handle, on the test's thread.
#[test]
fn a_result_dropped_by_the_worker_may_offload_to_its_pool_and_wait() {
    waits_from_the_worker_end(|pool, sent| {
        let again = pool.clone();
        let (open, hold) = gate();
        pool.offload(move |_| {
            hold.wait();
            OffloadsOnDrop(again, sent)
        })
        .spawn()
        .expect("room")
        .detach();
        open.open();
        None
    });
}

/// Regression (hostile review): a waker woken on the worker, whose `wake`
/// offloads a job to the same pool and waits for it, stalled the whole
/// pool at two permits or more (the wait and every later job): the worker
/// counted as searching while it ran the waker. The job offloaded from the
/// waker now un-counts it.
#[test]
fn a_waker_woken_by_the_worker_may_offload_to_its_pool_and_wait() {
    waits_from_the_worker_end(|pool, sent| {
        let waker = offloads_and_waits_when_woken(pool, sent);
        let (open, hold) = gate();
        let mut job = pool.offload(move |_| hold.wait()).spawn().expect("room");
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut job).poll(&mut cx).is_pending());
        open.open();
        Some(job)
    });
}

/// The same for a waker a searching worker runs before it spins: an
/// `idle()` waiter's, woken as the worker settles the outcome it
/// published (its next lock). The waiter's future is leaked so that it
/// stays registered.
#[test]
fn an_idle_waiter_s_waker_woken_by_a_searcher_may_offload_and_wait() {
    waits_from_the_worker_end(|pool, sent| {
        let waker = offloads_and_waits_when_woken(pool, sent);
        let (open, hold) = gate();
        let job = pool.offload(move |_| hold.wait()).spawn().expect("room");
        let mut idle = Box::pin(pool.idle());
        let mut cx = Context::from_waker(&waker);
        assert!(idle.as_mut().poll(&mut cx).is_pending());
        std::mem::forget(idle);
        open.open();
        Some(job)
    });
}

/// A result whose drop tells `dropping` it began, then waits for a value
/// from a job someone else offloads, and reports what it got.
struct WaitsForAnotherJob {
    dropping: mpsc::Sender<()>,
    value: Mutex<mpsc::Receiver<u32>>,
    got: mpsc::Sender<Option<u32>>,
}

impl Drop for WaitsForAnotherJob {
    fn drop(&mut self) {
        let _ = self.dropping.send(());
        let value = self.value.lock().expect("not poisoned").recv_timeout(HANG);
        let _ = self.got.send(value.ok());
    }
}

/// A result's drop that waits for a job another thread offloads meanwhile
/// (no mark takes the worker out of the count: only not counting it while
/// the drop may run lets that job wake another worker).
#[test]
fn a_result_dropped_by_the_worker_may_wait_for_another_thread_s_job() {
    for limit in 2..=3 {
        let pool = pool(limit, 16);
        support::warm(&pool);
        let (dropping, began) = mpsc::channel();
        let (value, values) = mpsc::channel();
        let (got, report) = mpsc::channel();
        let result = WaitsForAnotherJob {
            dropping,
            value: Mutex::new(values),
            got,
        };
        // Returns only once its handle is detached: a result published
        // before would be dropped with the handle, on this thread, which
        // would then wait for the job below before offloading it.
        let (open, hold) = gate();
        pool.offload(move |_| {
            hold.wait();
            result
        })
        .spawn()
        .expect("room")
        .detach();
        open.open();
        began.recv_timeout(HANG).expect("the drop began");
        let mut job = pool
            .offload(move |_| {
                let _ = value.send(5);
            })
            .spawn()
            .expect("room");
        let got = report.recv_timeout(HANG * 2).expect("the drop ended");
        assert_eq!(got, Some(5), "limit {limit}: the other job ran meanwhile");
        assert!(job.blocking_wait(None).is_ok());
        support::eventually_blocking("the pool idle", || pool.is_idle());
        support::assert_ledger(&pool.metrics());
    }
}

/// A worker that chains the next job in the critical section of its
/// finish is not counted as searching while that job runs: a job offloaded
/// meanwhile, with the pool's other worker parked, wakes that worker
/// instead of waiting for the chained job's end (kills a mutant that
/// counted it).
#[test]
fn a_job_offloaded_while_a_chained_job_runs_wakes_the_parked_worker() {
    let pool = support::builder(2, 16)
        .thread_name("chain-count")
        .build()
        .expect("valid");
    support::warm(&pool);
    let (open_x1, hold_x1) = gate();
    let (open_x2, hold_x2) = gate();
    let (open_a, hold_a) = gate();
    let (started, starts) = mpsc::channel();
    let held = |hold: support::Hold, name: &'static str| {
        let started = started.clone();
        move |_: &offloader::StopToken| {
            let _ = started.send(name);
            hold.wait();
        }
    };
    let mut x1 = pool.offload(held(hold_x1, "x1")).spawn().expect("room");
    let mut x2 = pool.offload(held(hold_x2, "x2")).spawn().expect("room");
    let mut begun: Vec<_> = (0..2)
        .map(|_| starts.recv_timeout(HANG).expect("x1, x2"))
        .collect();
    begun.sort_unstable();
    assert_eq!(begun, ["x1", "x2"]);
    let mut a = pool.offload(held(hold_a, "a")).spawn().expect("room");
    // x1's worker takes `a` as x1 ends (no waker, a caller, no drop glue).
    open_x1.open();
    assert_eq!(starts.recv_timeout(HANG).expect("a"), "a");
    open_x2.open();
    support::eventually_blocking("x2's worker parked, a's blocked", || {
        x2.is_finished() && support::sleeping_threads_named("chain-count") == 2
    });
    let b = pool.offload(|_| 2u32).spawn().expect("room");
    let mut b = Some(b);
    support::eventually_blocking("b ran while a is held", || {
        b.as_ref().is_some_and(|b| b.is_finished())
    });
    assert_eq!(
        b.take().map(|mut b| b.blocking_wait(None).ok()),
        Some(Some(2))
    );
    open_a.open();
    assert!(a.blocking_wait(None).is_ok());
    assert!(x1.blocking_wait(None).is_ok() && x2.blocking_wait(None).is_ok());
}
