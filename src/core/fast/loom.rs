//! Loom models of the intake (fast/intake.rs inv. 1–3), of its ring (fast/ring.rs
//! inv. 1–3) and of next-job chaining (fence pair F4 of fast/README.md).
//! Run with the others (`core/loom/mod.rs`).
//!
//! | model | covers |
//! |---|---|
//! | `intake_vs_shutdown` | ARCH 4 and 6; fast/intake.rs inv. 1: a plain job offered at the intake while a shutdown closes it is either refused (function handed back, never run) or accepted and run |
//! | `intake_vs_parking_worker` | fast/intake.rs inv. 2: a plain job appended to the intake while the only worker stops searching and parks is seen by it or wakes it; it runs |
//! | `intake_vs_a_searcher_taking_a_job` | fast/intake.rs inv. 2 at two permits: a job appended while the only searcher takes another job (its submitter saw a searcher and woke nobody) gets the second worker instead of waiting for the first job's end (that job waits for it: without the searcher's look at the intake, a deadlock) |
//! | `a_full_intake_vs_the_worker_emptying_it` | fast/intake.rs inv. 3: jobs offered to a full intake (two slots under loom) while the worker empties it take the lock, which empties it first: every job runs, in the order offered, and the ledger balances |
//! | `ring_producers_vs_the_consumer` | fast/ring.rs inv. 1–3: two producers race for the last free place of a two-place ring, on its second lap, while the consumer takes the value ahead of it: the oldest value leaves first, each value is taken or handed back exactly once, and only one producer at most is refused |
//! | `a_returned_push_is_never_hidden_behind_one_going_in` | fast/ring.rs inv. 2–3: a value whose push returned is taken by a consumer that knows of it, never hidden behind a place still being filled (so a job whose `spawn` returned is in the queue at the next lock) |
//! | `producers_with_room_are_never_told_full` | fast/ring.rs inv. 2: a producer that read `tail` before another claimed and filled that position reads it again, and is not told "full" while the ring has room |
//! | `a_finishing_worker_vs_a_caller_registering_its_waker` | fence pair F4 (fast/README.md "Next-job chaining"): a caller registers its waker on a job while the worker finishes it with a second job queued; the caller is woken or sees the outcome (no lost wake-up), its waker never runs on the worker after the next job is marked started, and the ledger balances |

use std::future::Future as _;
use std::task::{Context, Poll, Waker};

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;

use crate::core::loom::{shutdown_vs_submit_on, Branches};
use crate::{JobHandle, JobState, Offloader};

/// A flag one thread waits on until another sets it (loom's mutex and
/// condition variable).
#[derive(Clone)]
struct Gate(Arc<(loom::sync::Mutex<bool>, loom::sync::Condvar)>);

impl Gate {
    fn new() -> Self {
        Gate(Arc::new((
            loom::sync::Mutex::new(false),
            loom::sync::Condvar::new(),
        )))
    }

    fn wait(&self) {
        let (flag, cv) = &*self.0;
        let mut set = flag.lock().expect("not poisoned");
        while !*set {
            set = cv.wait(set).expect("not poisoned");
        }
    }

    fn open(&self) {
        let (flag, cv) = &*self.0;
        *flag.lock().expect("not poisoned") = true;
        cv.notify_all();
    }
}

/// A one-permit pool with its intake on, whose worker lives (the intake
/// opens once one does): its first job went through the lock and ran.
fn warm_pool() -> Offloader {
    let pool = match Offloader::builder().max_in_flight(1).fast(true).build() {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    };
    let mut first = pool.offload(|_| ()).spawn().expect("accepted");
    assert!(first.blocking_wait(None).is_ok());
    pool
}

/// Inv. 1: a job offered while a shutdown begins is refused (its function
/// handed back, never run) or accepted and run; never accepted and lost.
#[test]
fn intake_vs_shutdown() {
    static BRANCHES: Branches<2> = Branches::new();
    loom::model(|| shutdown_vs_submit_on(warm_pool(), Some(&BRANCHES)));
    BRANCHES.assert_all(["refused", "accepted and run"]);
}

/// Inv. 2: a job appended while the only worker stops searching and parks
/// is seen by the worker, or finds it parked and wakes it; it runs.
#[test]
fn intake_vs_parking_worker() {
    loom::model(|| {
        let pool = warm_pool();
        // The worker is on its way from the first job to its park.
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let mut job = pool
            .offload(move |_| r.store(true, Ordering::SeqCst))
            .spawn()
            .expect("accepted");
        assert!(job.blocking_wait(None).is_ok());
        assert!(ran.load(Ordering::SeqCst));
        let m = pool.metrics();
        assert!(m.ledger_balances());
        assert_eq!(m.completed, 2);
        drop(pool);
    });
}

/// Inv. 2 with two permits: a worker that ends its search by taking a job
/// looks at the intake again, so a job appended while it was still counted
/// as searching (its submitter woke nobody) gets the other worker, and does
/// not wait for the first one's job to end. Here that job waits for the
/// second: without the look, the pool deadlocks.
#[test]
fn intake_vs_a_searcher_taking_a_job() {
    loom::model(|| {
        let pool = match Offloader::builder().max_in_flight(2).fast(true).build() {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        };
        let mut first = pool.offload(|_| ()).spawn().expect("accepted");
        assert!(first.blocking_wait(None).is_ok());
        let done = Gate::new();
        let set = done.clone();
        let mut a = pool
            .offload(move |_| done.wait())
            .spawn()
            .expect("accepted");
        let mut b = pool.offload(move |_| set.open()).spawn().expect("accepted");
        assert!(b.blocking_wait(None).is_ok());
        assert!(a.blocking_wait(None).is_ok());
        drop(pool);
    });
}

/// Inv. 3: under loom the intake holds two jobs. Three jobs offered while
/// the one worker's job is held, released from another thread meanwhile:
/// the third finds the intake full (if the worker has not emptied it yet)
/// and goes through the lock, whose holder empties it first. All three
/// run, in the order offered, and the ledger balances.
#[test]
fn a_full_intake_vs_the_worker_emptying_it() {
    static BRANCHES: Branches<2> = Branches::new();
    loom::model(|| {
        let pool = warm_pool();
        let gate = Gate::new();
        let started = Arc::new(AtomicBool::new(false));
        let (wait, began) = (gate.clone(), started.clone());
        let mut held = pool
            .offload(move |_| {
                began.store(true, Ordering::SeqCst);
                wait.wait();
            })
            .spawn()
            .expect("accepted");
        let opener = loom::thread::spawn(move || gate.open());
        let order = Arc::new(loom::sync::Mutex::new(Vec::new()));
        let jobs: Vec<_> = (0..3)
            .map(|i| {
                let order = order.clone();
                pool.offload(move |_| order.lock().expect("not poisoned").push(i))
                    .spawn()
                    .expect("accepted")
            })
            .collect();
        // Whether the held job had started when the three were offered
        // (then the intake was emptied by nobody but their own lock).
        BRANCHES.hit(usize::from(started.load(Ordering::SeqCst)));
        opener.join().expect("the opener");
        assert!(held.blocking_wait(None).is_ok());
        for mut job in jobs {
            assert!(job.blocking_wait(None).is_ok());
        }
        assert_eq!(*order.lock().expect("not poisoned"), [0, 1, 2]);
        let m = pool.metrics();
        assert!(m.ledger_balances());
        assert_eq!(m.completed, 5);
        drop(pool);
    });
    BRANCHES.assert_all(["held job not started yet", "held job started"]);
}

/// fast/ring.rs inv. 1–3: two producers race for the ring's last free place
/// (on its second lap) while the consumer takes the value ahead of it:
/// each value accepted is taken exactly once, in the order of its
/// position; a producer is refused (full, or the other filling the place
/// at the tail) only while the first claimer succeeds.
#[test]
fn ring_producers_vs_the_consumer() {
    loom::model(|| {
        let ring = Arc::new(super::ring::Ring::new(2));
        // Lap one passes: the next position, 2, is the first place's again.
        assert_eq!(ring.push(0), Ok(()));
        assert_eq!(ring.pop(), Some(0));
        assert_eq!(ring.push(5), Ok(()));
        let producers: Vec<_> = [1, 10]
            .into_iter()
            .map(|v| {
                let ring = ring.clone();
                loom::thread::spawn(move || ring.push(v).err())
            })
            .collect();
        let mut got: Vec<i32> = ring.pop().into_iter().collect();
        let refused: Vec<i32> = producers
            .into_iter()
            .filter_map(|p| p.join().expect("producer"))
            .map(super::ring::Refused::into_inner)
            .collect();
        while let Some(v) = ring.pop() {
            got.push(v);
        }
        assert!(ring.is_empty());
        assert_eq!(got[0], 5, "the oldest value leaves first");
        // Two places: with 5 still in, one of the two is refused at most;
        // with 5 taken, neither is.
        assert!(refused.len() <= 1, "refused {refused:?}");
        let mut all: Vec<i32> = got.iter().chain(&refused).copied().collect();
        all.sort_unstable();
        assert_eq!(all, [1, 5, 10], "each value taken or refused, once");
    });
}

/// fast/ring.rs inv. 2–3: a value whose push has returned is never hidden
/// behind a place another producer is still filling: a consumer that
/// knows of the push (here through a flag) takes that value.
#[test]
fn a_returned_push_is_never_hidden_behind_one_going_in() {
    loom::model(|| {
        let ring = Arc::new(super::ring::Ring::new(2));
        let pushed = Arc::new(AtomicBool::new(false));
        let first = {
            let ring = ring.clone();
            loom::thread::spawn(move || ring.push(1).is_ok())
        };
        let second = {
            let (ring, pushed) = (ring.clone(), pushed.clone());
            loom::thread::spawn(move || {
                let ok = ring.push(2).is_ok();
                if ok {
                    pushed.store(true, Ordering::Release);
                }
                ok
            })
        };
        if pushed.load(Ordering::Acquire) {
            let mut got = Vec::new();
            while let Some(v) = ring.pop() {
                got.push(v);
            }
            assert!(got.contains(&2), "a returned push is in: {got:?}");
        }
        let first = first.join().expect("first");
        let second = second.join().expect("second");
        assert!(first || second, "the first claimer succeeds");
    });
}

/// fast/ring.rs inv. 2: in a ring with room for both, two producers are never
/// told "full", whatever their interleaving (one that read `tail` before
/// the other moved it reads it again); at most one is told "busy".
#[test]
fn producers_with_room_are_never_told_full() {
    loom::model(|| {
        let ring = Arc::new(super::ring::Ring::new(4));
        let producers: Vec<_> = [1, 2]
            .into_iter()
            .map(|v| {
                let ring = ring.clone();
                loom::thread::spawn(move || ring.push(v))
            })
            .collect();
        let mut busy = 0;
        for p in producers {
            match p.join().expect("producer") {
                Ok(()) => {}
                Err(super::ring::Refused::Busy(_)) => busy += 1,
                Err(super::ring::Refused::Full(v)) => panic!("{v} told full with room"),
            }
        }
        assert!(busy <= 1);
    });
}

/// An awaiting caller's waker: when woken it notes whether the job queued
/// behind the awaited one was already marked started (it must not be: the
/// waker runs on the worker, F4), then lets the caller go on.
struct ChainWaker {
    next: std::sync::Arc<JobHandle<()>>,
    next_started: AtomicBool,
    woken: Gate,
}

impl std::task::Wake for ChainWaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        if self.next.state() != JobState::Queued {
            self.next_started.store(true, Ordering::SeqCst);
        }
        self.woken.open();
    }
}

/// F4: a caller registers its waker on a job while its worker finishes it,
/// a second job queued behind it (so the worker decides whether to chain
/// it). Either the worker sees the waker and does not chain (it wakes the
/// waker first, with the next job still queued), or the caller sees the
/// job finished, takes its waker back and gets the outcome at once: the
/// outcome is never lost (a lost wake-up leaves the caller blocked on its
/// gate, which loom reports), the waker never runs on the worker once the
/// next job is marked started, and the ledger balances.
#[test]
fn a_finishing_worker_vs_a_caller_registering_its_waker() {
    // 0: ready at the first poll; 1: pending, then woken.
    static BRANCHES: Branches<2> = Branches::new();
    loom::model(|| {
        let pool = warm_pool();
        // The awaited job waits until the next job is queued behind it.
        let go = Gate::new();
        let wait = go.clone();
        let mut job = pool
            .offload(move |_| {
                wait.wait();
                7
            })
            .spawn()
            .expect("accepted");
        let next = std::sync::Arc::new(pool.offload(|_| ()).spawn().expect("accepted"));
        let chain = std::sync::Arc::new(ChainWaker {
            next: next.clone(),
            next_started: AtomicBool::new(false),
            woken: Gate::new(),
        });
        let waker = Waker::from(chain.clone());
        let mut cx = Context::from_waker(&waker);
        go.open();
        match std::pin::Pin::new(&mut job).poll(&mut cx) {
            Poll::Ready(v) => {
                assert_eq!(v.ok(), Some(7));
                BRANCHES.hit(0);
            }
            Poll::Pending => {
                chain.woken.wait();
                assert!(
                    !chain.next_started.load(Ordering::SeqCst),
                    "the waker ran on the worker after the next job was marked started"
                );
                match std::pin::Pin::new(&mut job).poll(&mut cx) {
                    Poll::Ready(v) => assert_eq!(v.ok(), Some(7)),
                    Poll::Pending => panic!("woken, but the outcome is not published"),
                }
                BRANCHES.hit(1);
            }
        }
        let after = loom::future::block_on(std::future::poll_fn(|cx| next.poll_outcome(cx)));
        assert!(after.is_ok());
        let m = pool.metrics();
        assert!(m.ledger_balances());
        assert_eq!(m.completed, 3);
        drop(pool);
    });
    BRANCHES.assert_all(["ready at the first poll", "pending, then woken"]);
}
