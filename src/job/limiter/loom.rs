//! Loom models of shared limiters (limiter/mod.rs M1–M3; lanes.rs L4): a
//! cancel racing a limited job's start leaks no permit, and two pools
//! taking two limiters in opposite orders neither deadlock nor lose the
//! wake-up of a permit given back in the other pool; a cancel in one pool
//! racing a permit given back by another leaves no permit behind; a grant
//! to a pool that goes away before it hears of it goes to the next pool in
//! line.

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

use crate::core::loom::{cancel_while_awaiting, pool, Branches};
use crate::{Error, Limiter};

#[test]
fn limited_start_vs_cancel() {
    static BRANCHES: Branches<2> = Branches::new();
    loom::model(|| {
        let pool = pool(1);
        let limiter = Limiter::new(1);
        let job = pool
            .offload(|_stop| 7)
            .limiter(&limiter)
            .spawn()
            .expect("accepted");
        let (outcome, cancelled) = cancel_while_awaiting(job);
        match outcome {
            Err(Error::Cancelled { id: Some(_) }) => {
                assert!(cancelled);
                BRANCHES.hit(0);
            }
            Ok(7) => {
                assert!(!cancelled);
                BRANCHES.hit(1);
            }
            other => panic!("unexpected outcome {other:?}"),
        }
        let s = limiter.stats();
        assert_eq!((s.in_use, s.waiting), (0, 0), "no permit leaked: {s:?}");
        assert!(pool.metrics().ledger_balances());
    });
    BRANCHES.assert_all(["cancelled", "ran"]);
}

#[test]
fn two_pools_two_limiters_opposite_orders() {
    loom::model(|| {
        let (p, q) = (pool(1), pool(1));
        let (a, b) = (Limiter::new(1), Limiter::new(1));
        let ran = Arc::new(AtomicUsize::new(0));
        let (r1, r2) = (ran.clone(), ran.clone());
        let mut x = p
            .offload(move |_stop| r1.fetch_add(1, Ordering::SeqCst))
            .limiter(&a)
            .limiter(&b)
            .spawn()
            .expect("accepted");
        let mut y = q
            .offload(move |_stop| r2.fetch_add(1, Ordering::SeqCst))
            .limiter(&b)
            .limiter(&a)
            .spawn()
            .expect("accepted");
        let other = thread::spawn(move || y.blocking_wait(None).is_ok());
        assert!(x.blocking_wait(None).is_ok());
        assert!(other.join().unwrap());
        assert_eq!(ran.load(Ordering::SeqCst), 2);
        let (sa, sb) = (a.stats(), b.stats());
        assert_eq!(
            (sa.in_use, sb.in_use, sa.high_water, sb.high_water),
            (0, 0, 1, 1)
        );
    });
}

/// A cancel in one pool racing a permit given back by another: pool `a`
/// gives the permit back while pool `b`'s waiting job is cancelled.
/// Whether `b` was woken first or left first, `a`'s second job gets the
/// permit, and none is left behind.
#[test]
fn give_back_vs_cancel_in_another_pool() {
    static BRANCHES: Branches<2> = Branches::new();
    loom::model(|| {
        let (a, b) = (pool(1), pool(1));
        let l = Limiter::new(1);
        let mut first = a.offload(|_stop| 1).limiter(&l).spawn().expect("accepted");
        let waiting = b.offload(|_stop| 2).limiter(&l).spawn().expect("accepted");
        let mut second = a.offload(|_stop| 3).limiter(&l).spawn().expect("accepted");
        let waiting = Arc::new(waiting);
        let canceller = {
            let waiting = waiting.clone();
            thread::spawn(move || waiting.cancel())
        };
        assert_eq!(first.blocking_wait(None).ok(), Some(1));
        assert_eq!(second.blocking_wait(None).ok(), Some(3));
        let cancelled = canceller.join().unwrap();
        let outcome = loom::future::block_on(std::future::poll_fn(|cx| waiting.poll_outcome(cx)));
        match outcome {
            Err(Error::Cancelled { id: Some(_) }) => {
                assert!(cancelled);
                BRANCHES.hit(0);
            }
            Ok(2) => {
                assert!(!cancelled);
                BRANCHES.hit(1);
            }
            other => panic!("unexpected outcome {other:?}"),
        }
        let s = l.stats();
        assert_eq!(
            (s.in_use, s.waiting, s.high_water, s.pools_waiting),
            (0, 0, 1, 0),
            "{s:?}"
        );
    });
    BRANCHES.assert_all(["cancelled", "ran"]);
}

/// A grant in flight to a pool that goes away: pool `b`'s waiting job is
/// cancelled and `b` shut down and dropped while pool `a`'s first job gives
/// the permit back (granted to `b`, first in line). Whether `b` heard of
/// its grant (and gave it back) or was gone first (its state's `Drop` gives
/// it back, M3), pool `c`'s job, in line behind `b`'s, gets the permit.
#[test]
fn grant_to_a_pool_that_goes_away() {
    loom::model(|| {
        let (a, b, c) = (pool(1), pool(1), pool(1));
        let l = Limiter::new(1);
        let gate = Arc::new(AtomicUsize::new(0));
        let g = gate.clone();
        let mut first = a
            .offload(move |_stop| {
                // Holds the permit until both others are in line.
                while g.load(Ordering::SeqCst) < 2 {
                    thread::yield_now();
                }
                1
            })
            .limiter(&l)
            .spawn()
            .expect("accepted");
        let mut waiting = b.offload(|_stop| 2).limiter(&l).spawn().expect("accepted");
        gate.fetch_add(1, Ordering::SeqCst);
        let mut last = c.offload(|_stop| 3).limiter(&l).spawn().expect("accepted");
        gate.fetch_add(1, Ordering::SeqCst);
        let leaver = thread::spawn(move || {
            // Too late to cancel: it started (its pool's worker may have
            // tried before `c`'s), and runs to its end.
            if !waiting.cancel() {
                assert_eq!(waiting.blocking_wait(None).ok(), Some(2));
            }
            b.shutdown();
            drop(b);
        });
        assert_eq!(first.blocking_wait(None).ok(), Some(1));
        leaver.join().unwrap();
        assert_eq!(last.blocking_wait(None).ok(), Some(3));
        let s = l.stats();
        assert_eq!((s.in_use, s.waiting, s.pools_waiting), (0, 0, 0), "{s:?}");
    });
}
