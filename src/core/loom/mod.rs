//! Loom models of the state machines the invariants rest on.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --lib --release loom`
//! (`.ci/run` does, with `LOOM_MAX_PREEMPTIONS=2`). Each model names the
//! invariant of `docs/ARCHITECTURE.md` (and of the module docs) it covers:
//!
//! | model | covers |
//! |---|---|
//! | `start_vs_cancel` | ARCH 3; job/cell.rs inv. 1–2; state S2: exactly one of start and cancel wins, a cancelled job never runs |
//! | `completion_vs_blocking_waiter`, `completion_vs_async_waiter` | job/cell.rs inv. 3: no lost wake-up between publishing an outcome and registering a waiter |
//! | `permit_released_before_outcome` | ARCH 1; job/cell.rs inv. 4; state S1: the permit is held while the function runs, released before the owner sees the outcome, and the limit holds with a detached predecessor |
//! | `stop_callback_vs_request` | stop.rs inv. 2–3: a callback registered while stop fires runs exactly once |
//! | `stop_callback_drop_vs_request` | stop.rs inv. 4: after the guard's drop the callback is not running and never runs |
//! | `shutdown_vs_submit` | ARCH 4 and 6; shutdown.rs inv. 3: a job submitted while a shutdown begins is either refused (function handed back, never run) or accepted and run; nothing is lost |
//! | `termination_vs_last_worker_exit` | ARCH 6; shutdown.rs inv. 1–2: a termination waiter wakes when the last worker exits, and only then |
//! | `shutdown_now_vs_start` | ARCH 3, 4 and 6: a queued job is either handed back unstarted (never run) or started, never both |
//! | `job_stop_callback_vs_request` | stop.rs inv. 2–3 on a *job's* token (the job is its own stop source; its `StopExt` is created lazily under the job's slot lock): a callback registered by the running function while `JobHandle::stop` fires runs exactly once, whether the stop comes before, during or after the registration |
//! | `job_stop_callback_drop_vs_request` | stop.rs inv. 4 on a job's token: once the function has dropped its guard, the callback is not running and never runs |
//! | `completion_vs_replaced_async_waker` | job/cell.rs inv. 3 with the async waker: a handle polled with one waker, then awaited with another (`will_wake` false, replaced under the slot lock) never misses the outcome |
//! | `group_stop_vs_start` (`groups.rs`) | state/groups.rs G2 and G1: a group stop racing its queued member's start either cancels it (never runs) or leaves it running with its token set (or finds it finished); the group's and the pool's ledgers agree |
//! | `nested_stop_vs_child_offload` (`groups.rs`) | G2 through nesting: an offload through a child while its parent stops is either refused or accepted and then cancelled, stopped or finished; nothing is lost |
//! | `abandon_cancel_and_stop_vs_start` | ARCH 2 and 3; `AbandonPolicy::CancelAndStop`: a caller leaving while the job starts either cancels it (never runs) or requests stop on the running function, exactly one, and the departure is counted |
//!
//! The models of the intake and its ring (fast/intake.rs, fast/ring.rs) are in
//! `core/fast/loom.rs`, those of shared limiters (limiter/mod.rs M1–M3) in
//! `job/limiter/loom.rs`; their module docs say what each covers.

use std::future::Future as _;
use std::sync::atomic::AtomicUsize as StdAtomicUsize;

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

use crate::{Error, Offloader};

mod groups;

pub(crate) fn pool(max_in_flight: usize) -> Offloader {
    match Offloader::builder().max_in_flight(max_in_flight).build() {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

/// Cancels `job` on another thread while this one awaits it: the outcome,
/// and whether the cancel prevented the start.
pub(crate) fn cancel_while_awaiting<T: Send + 'static>(
    job: crate::api::handle::JobHandle<T>,
) -> (Result<T, Error>, bool) {
    let job = Arc::new(job);
    let canceller = {
        let job = job.clone();
        thread::spawn(move || job.cancel())
    };
    let outcome = loom::future::block_on(std::future::poll_fn(|cx| job.poll_outcome(cx)));
    (outcome, canceller.join().unwrap())
}

#[test]
fn start_vs_cancel() {
    loom::model(|| {
        let pool = pool(1);
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let job = pool
            .offload(move |_| r.store(true, Ordering::SeqCst))
            .spawn()
            .expect("accepted");
        let (outcome, cancelled) = cancel_while_awaiting(job);
        let ran = ran.load(Ordering::SeqCst);
        match outcome {
            Ok(()) => assert!(ran && !cancelled, "ran={ran} cancelled={cancelled}"),
            Err(Error::Cancelled { id: Some(_) }) => assert!(!ran && cancelled),
            Err(e) => panic!("unexpected outcome {e}"),
        }
        let m = pool.metrics();
        assert!(m.ledger_balances());
        assert_eq!(m.completed + m.cancelled, 1);
        drop(pool);
    });
}

#[test]
fn completion_vs_blocking_waiter() {
    loom::model(|| {
        let pool = pool(1);
        let mut job = pool.offload(|_| 7).spawn().expect("accepted");
        assert_eq!(job.blocking_wait(None).ok(), Some(7));
        drop(pool);
    });
}

#[test]
fn completion_vs_async_waiter() {
    loom::model(|| {
        let pool = pool(1);
        let job = pool.offload(|_| 7).spawn().expect("accepted");
        assert_eq!(loom::future::block_on(job).ok(), Some(7));
        drop(pool);
    });
}

#[test]
fn permit_released_before_outcome() {
    loom::model(|| {
        let pool = pool(1);
        let in_flight = Arc::new(AtomicUsize::new(0));
        let max_seen = std::sync::Arc::new(StdAtomicUsize::new(0));
        let work = |in_flight: Arc<AtomicUsize>, max_seen: std::sync::Arc<StdAtomicUsize>| {
            move |_: &crate::StopToken| {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                max_seen.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                in_flight.fetch_sub(1, Ordering::SeqCst);
            }
        };
        // The first job's owner walks away (detaches); the second must still
        // wait for the first function to return.
        pool.offload(work(in_flight.clone(), max_seen.clone()))
            .spawn()
            .expect("accepted")
            .detach();
        let mut second = pool
            .offload(work(in_flight.clone(), max_seen.clone()))
            .spawn()
            .expect("accepted");
        second.blocking_wait(None).expect("completed");
        // The permit is released before the outcome is published.
        let m = pool.metrics();
        assert!(m.max_running <= 1);
        assert!(m.ledger_balances());
        assert_eq!(max_seen.load(std::sync::atomic::Ordering::SeqCst), 1);
        // The second job's permit is back; only the first may still run.
        assert!(m.running <= 1);
        assert!(m.completed >= 1);
        drop(pool);
    });
}

#[test]
fn stop_callback_vs_request() {
    loom::model(|| {
        let stop = crate::StopToken::new();
        let fired = Arc::new(AtomicUsize::new(0));
        let stopper = {
            let stop = stop.clone();
            thread::spawn(move || stop.request_stop())
        };
        let f = fired.clone();
        let guard = stop.on_stop(move || {
            f.fetch_add(1, Ordering::SeqCst);
        });
        assert!(stopper.join().unwrap());
        assert_eq!(fired.load(Ordering::SeqCst), 1);
        drop(guard);
        assert_eq!(fired.load(Ordering::SeqCst), 1);
    });
}

#[test]
fn stop_callback_drop_vs_request() {
    loom::model(|| {
        let stop = crate::StopToken::new();
        // 0: not run, 1: running, 2: finished.
        let phase = Arc::new(AtomicUsize::new(0));
        let p = phase.clone();
        let guard = stop.on_stop(move || {
            p.store(1, Ordering::SeqCst);
            p.store(2, Ordering::SeqCst);
        });
        let stopper = {
            let stop = stop.clone();
            thread::spawn(move || stop.request_stop())
        };
        drop(guard);
        let after_drop = phase.load(Ordering::SeqCst);
        assert_ne!(
            after_drop, 1,
            "callback still running after its guard was dropped"
        );
        stopper.join().unwrap();
        assert_eq!(
            phase.load(Ordering::SeqCst),
            after_drop,
            "callback ran after its guard was dropped"
        );
    });
}

#[test]
fn shutdown_vs_submit() {
    loom::model(|| shutdown_vs_submit_on(pool(1), None));
}

/// The body of `shutdown_vs_submit` on `pool` (also run with the intake
/// open: fast/loom.rs), counting in `branches` which outcome each
/// iteration saw (0: refused; 1: accepted and run).
pub(crate) fn shutdown_vs_submit_on(pool: Offloader, branches: Option<&Branches<2>>) {
    let hit = |i| branches.inspect(|b| b.hit(i));
    let ran = Arc::new(AtomicBool::new(false));
    let closer = {
        let pool = pool.clone();
        thread::spawn(move || pool.shutdown())
    };
    let r = ran.clone();
    let submitted = pool
        .offload(move |_| r.store(true, Ordering::SeqCst))
        .spawn();
    closer.join().unwrap();
    match submitted {
        Ok(mut job) => {
            hit(1);
            assert!(job.blocking_wait(None).is_ok());
            assert!(ran.load(Ordering::SeqCst));
        }
        Err(refused) => {
            hit(0);
            assert!(matches!(
                refused.reason(),
                crate::Error::ShuttingDown { id: None }
            ));
            let _func = refused.into_inner();
            assert!(!ran.load(Ordering::SeqCst));
        }
    }
    assert!(pool.blocking_await_termination(None));
    let m = pool.metrics();
    assert!(m.ledger_balances());
    assert_eq!(m.accepted, m.completed);
    assert_eq!(m.workers, 0);
}

#[test]
fn termination_vs_last_worker_exit() {
    loom::model(|| {
        let pool = pool(1);
        pool.offload(|_| ()).spawn().expect("accepted").detach();
        let waiter = {
            let pool = pool.clone();
            thread::spawn(move || pool.blocking_await_termination(None))
        };
        assert!(!pool.is_terminated() || pool.metrics().workers == 0);
        pool.shutdown();
        assert!(waiter.join().unwrap());
        assert!(pool.is_terminated());
        let m = pool.metrics();
        assert_eq!((m.workers, m.running, m.queued, m.completed), (0, 0, 0, 1));
    });
}

#[test]
fn shutdown_now_vs_start() {
    loom::model(|| {
        let pool = pool(1);
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let mut job = pool
            .offload(move |_| r.store(true, Ordering::SeqCst))
            .spawn()
            .expect("accepted");
        let id = job.id();
        let closer = {
            let pool = pool.clone();
            thread::spawn(move || pool.shutdown_now())
        };
        let outcome = job.blocking_wait(None);
        let unstarted = closer.join().unwrap();
        let handed_back = unstarted.iter().any(|u| u.id == id);
        let ran = ran.load(Ordering::SeqCst);
        match outcome {
            Ok(()) => assert!(ran && !handed_back),
            Err(Error::ShuttingDown { id: Some(_) }) => assert!(!ran && handed_back),
            Err(e) => panic!("unexpected outcome {e}"),
        }
        assert!(pool.blocking_await_termination(None));
        let m = pool.metrics();
        assert!(m.ledger_balances());
        assert_eq!(m.completed + m.unstarted, 1);
    });
}

/// Counts, across the iterations of one model, how often each branch was
/// taken: a model that never reaches a branch does not check it.
pub(crate) struct Branches<const N: usize>([StdAtomicUsize; N]);

impl<const N: usize> Branches<N> {
    pub(crate) const fn new() -> Self {
        Branches([const { StdAtomicUsize::new(0) }; N])
    }

    pub(crate) fn hit(&self, i: usize) {
        self.0[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    #[track_caller]
    pub(crate) fn assert_all(&self, names: [&str; N]) {
        for (i, name) in names.iter().enumerate() {
            let n = self.0[i].load(std::sync::atomic::Ordering::Relaxed);
            assert!(n > 0, "the model never reached the branch {name:?}");
        }
    }
}

#[test]
fn job_stop_callback_vs_request() {
    // 0: the callback ran at registration (stop came first); 1: it was
    // still registered when the function returned (the stopper ran it);
    // 2: the job had finished before the stop, which was then no request.
    static BRANCHES: Branches<3> = Branches::new();
    loom::model(|| {
        let pool = pool(1);
        let fired = Arc::new(AtomicUsize::new(0));
        let f = fired.clone();
        let job = pool
            .offload(move |stop: &crate::StopToken| {
                let f2 = f.clone();
                let guard = stop.on_stop(move || {
                    f2.fetch_add(1, Ordering::SeqCst);
                });
                let registered = guard.is_registered();
                // The guard goes out with the outcome: the callback stays
                // registered for as long as the owner keeps it.
                (guard, registered)
            })
            .spawn()
            .expect("accepted");
        let job = Arc::new(job);
        let stopper = {
            let job = job.clone();
            thread::spawn(move || job.stop())
        };
        let outcome = loom::future::block_on(std::future::poll_fn(|cx| job.poll_outcome(cx)));
        let Ok((guard, registered)) = outcome else {
            panic!("the job completes");
        };
        if !stopper.join().unwrap() {
            // The job had finished: a stop on a finished job is no request
            // and fires nothing, now or when the guard goes.
            assert_eq!(fired.load(Ordering::SeqCst), 0, "nothing to stop");
            drop(guard);
            assert_eq!(fired.load(Ordering::SeqCst), 0, "nothing to stop");
            BRANCHES.hit(2);
            return;
        }
        assert_eq!(fired.load(Ordering::SeqCst), 1, "ran exactly once");
        drop(guard);
        assert_eq!(fired.load(Ordering::SeqCst), 1, "ran exactly once");
        BRANCHES.hit(usize::from(registered));
        let m = pool.metrics();
        assert!(m.ledger_balances());
        assert_eq!((m.completed, m.stop_requests), (1, 1));
        drop(pool);
    });
    BRANCHES.assert_all([
        "stop before registration",
        "stop after registration",
        "stop after the job finished",
    ]);
}

#[test]
fn job_stop_callback_drop_vs_request() {
    // Phase of the callback when the function dropped its guard: 0 never
    // ran (and never will), 2 ran to completion.
    static BRANCHES: Branches<2> = Branches::new();
    loom::model(|| {
        let pool = pool(1);
        // 0: not run, 1: running, 2: finished.
        let phase = Arc::new(AtomicUsize::new(0));
        let p = phase.clone();
        let job = pool
            .offload(move |stop: &crate::StopToken| {
                let p2 = p.clone();
                let guard = stop.on_stop(move || {
                    p2.store(1, Ordering::SeqCst);
                    p2.store(2, Ordering::SeqCst);
                });
                drop(guard);
                p.load(Ordering::SeqCst)
            })
            .spawn()
            .expect("accepted");
        let job = Arc::new(job);
        let stopper = {
            let job = job.clone();
            thread::spawn(move || job.stop())
        };
        let after_drop = loom::future::block_on(std::future::poll_fn(|cx| job.poll_outcome(cx)))
            .expect("the job completes");
        assert_ne!(
            after_drop, 1,
            "callback still running after its guard was dropped"
        );
        stopper.join().unwrap();
        assert_eq!(
            phase.load(Ordering::SeqCst),
            after_drop,
            "callback ran after its guard was dropped"
        );
        BRANCHES.hit(after_drop / 2);
        drop(pool);
    });
    BRANCHES.assert_all(["dropped before stop", "stop before the drop"]);
}

/// A waker that records that it was woken, for a first poll by hand.
struct FlagWaker(AtomicBool);

impl std::task::Wake for FlagWaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn completion_vs_replaced_async_waker() {
    // 0: ready at the first poll; 1: pending, then completed under the
    // replacement waker.
    static BRANCHES: Branches<2> = Branches::new();
    loom::model(|| {
        let pool = pool(1);
        let mut job = pool.offload(|_| 7).spawn().expect("accepted");
        let flag = std::sync::Arc::new(FlagWaker(AtomicBool::new(false)));
        let waker = std::task::Waker::from(flag.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        match std::pin::Pin::new(&mut job).poll(&mut cx) {
            std::task::Poll::Ready(v) => {
                assert_eq!(v.ok(), Some(7));
                BRANCHES.hit(0);
            }
            std::task::Poll::Pending => {
                // Awaited again under loom's own waker: the first waker is
                // replaced (or has already been woken); either way the
                // outcome arrives.
                assert_eq!(loom::future::block_on(job).ok(), Some(7));
                BRANCHES.hit(1);
            }
        }
        drop(pool);
    });
    BRANCHES.assert_all(["ready at once", "pending, then replaced waker"]);
}

#[test]
fn abandon_cancel_and_stop_vs_start() {
    // 0: cancelled before start; 1: stop requested on the running (or
    // just finished, not yet published) function; 2: already finished.
    static BRANCHES: Branches<3> = Branches::new();
    loom::model(|| {
        let pool = pool(1);
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let job = pool
            .offload(move |_: &crate::StopToken| r.store(true, Ordering::SeqCst))
            .spawn()
            .expect("accepted");
        let job = Arc::new(job);
        let leaver = {
            let job = job.clone();
            thread::spawn(move || {
                job.abandon(
                    crate::AbandonPolicy::CancelAndStop,
                    crate::job::policy::Departure::Dropped,
                )
            })
        };
        let outcome = loom::future::block_on(std::future::poll_fn(|cx| job.poll_outcome(cx)));
        let fate = leaver.join().unwrap();
        let ran = ran.load(Ordering::SeqCst);
        let m = pool.metrics();
        match fate {
            crate::Fate::Cancelled => {
                assert!(matches!(outcome, Err(Error::Cancelled { id: Some(_) })) && !ran);
                assert_eq!((m.cancelled, m.completed, m.stop_requests), (1, 0, 0));
                BRANCHES.hit(0);
            }
            crate::Fate::StopRequested => {
                assert!(outcome.is_ok() && ran && job.is_stopped());
                assert_eq!((m.cancelled, m.completed, m.stop_requests), (0, 1, 1));
                BRANCHES.hit(1);
            }
            crate::Fate::Finished => {
                // Finished before the caller left, or while it was leaving
                // (the stop then found nothing left to stop).
                assert!(outcome.is_ok() && ran);
                assert_eq!((m.cancelled, m.completed, m.stop_requests), (0, 1, 0));
                BRANCHES.hit(2);
            }
            other => panic!("unexpected fate {other:?}"),
        }
        assert!(m.ledger_balances());
        // A caller leaving an unfinished job is counted; one leaving a job
        // that had already finished records nothing. With Finished
        // either can have happened (the job may finish between the departure
        // and the stop), never more than one departure.
        if fate == crate::Fate::Finished {
            assert!(m.callers_dropped <= 1);
        } else {
            assert_eq!(m.callers_dropped, 1);
        }
        drop(pool);
    });
    BRANCHES.assert_all([
        "cancelled before start",
        "stop requested",
        "already finished",
    ]);
}
