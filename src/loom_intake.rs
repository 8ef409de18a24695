//! Loom models of the intake (intake.rs inv. 1–2): a plain job passing it
//! while a shutdown closes it, while the only worker goes to park, and
//! while a searching worker takes another job.
//! Listed in the table of `loom_tests.rs`.

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;

use crate::loom_tests::{shutdown_vs_submit_on, Branches};
use crate::Offloader;

/// A one-permit pool with its intake on, whose worker lives (the intake
/// opens once one does): its first job went through the lock and ran.
fn warm_pool() -> Offloader {
    let pool = match Offloader::builder().max_in_flight(1).intake(true).build() {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    };
    let first = pool.offload(|_| ()).spawn().expect("accepted");
    assert!(first.blocking_wait().is_ok());
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
        let job = pool
            .offload(move |_| r.store(true, Ordering::SeqCst))
            .spawn()
            .expect("accepted");
        assert!(job.blocking_wait().is_ok());
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
        let pool = match Offloader::builder().max_in_flight(2).intake(true).build() {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        };
        let first = pool.offload(|_| ()).spawn().expect("accepted");
        assert!(first.blocking_wait().is_ok());
        let done = Arc::new((loom::sync::Mutex::new(false), loom::sync::Condvar::new()));
        let (wait, set) = (done.clone(), done);
        let a = pool
            .offload(move |_| {
                let (flag, cv) = &*wait;
                let mut set = flag.lock().expect("not poisoned");
                while !*set {
                    set = cv.wait(set).expect("not poisoned");
                }
            })
            .spawn()
            .expect("accepted");
        let b = pool
            .offload(move |_| {
                let (flag, cv) = &*set;
                *flag.lock().expect("not poisoned") = true;
                cv.notify_all();
            })
            .spawn()
            .expect("accepted");
        assert!(b.blocking_wait().is_ok());
        assert!(a.blocking_wait().is_ok());
        drop(pool);
    });
}
