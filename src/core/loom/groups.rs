//! Loom models of job groups (state/groups.rs G1–G2): a group's stop
//! racing its queued member's start, and a parent's stop racing an offload
//! through its child. Listed in the table of `mod.rs`.

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

use crate::core::loom::{pool, Branches};
use crate::Error;

#[test]
fn group_stop_vs_start() {
    static BRANCHES: Branches<3> = Branches::new();
    loom::model(|| {
        let pool = pool(1);
        let group = pool.group();
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let mut job = group
            .offload(move |stop| {
                r.store(true, Ordering::SeqCst);
                stop.is_stopped()
            })
            .spawn()
            .expect("accepted");
        let stopper = {
            let group = group.clone();
            thread::spawn(move || group.stop())
        };
        let outcome = job.blocking_wait(None);
        assert!(stopper.join().unwrap(), "the first stop");
        let ran = ran.load(Ordering::SeqCst);
        match outcome {
            Err(Error::Cancelled { id: Some(_) }) => {
                assert!(!ran, "a cancelled job never runs");
                BRANCHES.hit(0);
            }
            Ok(true) => {
                assert!(ran);
                BRANCHES.hit(1);
            }
            Ok(false) => {
                // Returned before the stop reached it.
                assert!(ran);
                BRANCHES.hit(2);
            }
            Err(e) => panic!("unexpected outcome {e}"),
        }
        let m = group.metrics();
        assert!(m.ledger_balances() && m.stopped, "{m:?}");
        assert_eq!((m.accepted, m.cancelled + m.completed), (1, 1));
        let p = pool.metrics();
        assert_eq!((p.cancelled, p.completed), (m.cancelled, m.completed));
        drop(group);
        drop(pool);
    });
    BRANCHES.assert_all(["cancelled", "ran, stopped", "ran before the stop"]);
}

#[test]
fn nested_stop_vs_child_offload() {
    static BRANCHES: Branches<3> = Branches::new();
    loom::model(|| {
        let pool = pool(1);
        let parent = pool.group();
        let child = parent.child();
        let stopper = {
            let parent = parent.clone();
            thread::spawn(move || parent.stop())
        };
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        match child
            .offload(move |_| r.store(true, Ordering::SeqCst))
            .spawn()
        {
            Err(refused) => {
                assert!(matches!(
                    refused.reason(),
                    crate::Error::Cancelled { id: None }
                ));
                BRANCHES.hit(0);
            }
            Ok(mut job) => match job.blocking_wait(None) {
                Err(Error::Cancelled { id: Some(_) }) => {
                    assert!(!ran.load(Ordering::SeqCst));
                    BRANCHES.hit(1);
                }
                Ok(()) => {
                    assert!(ran.load(Ordering::SeqCst));
                    BRANCHES.hit(2);
                }
                Err(e) => panic!("unexpected outcome {e}"),
            },
        }
        stopper.join().unwrap();
        assert!(child.metrics().stopped, "a parent's stop reaches its child");
        let (c, p) = (child.metrics(), parent.metrics());
        assert!(c.ledger_balances() && p.ledger_balances());
        assert_eq!(c.accepted, p.accepted, "the parent counts its child's jobs");
        assert_eq!(c.accepted + c.rejected, 1);
        drop((child, parent, pool));
    });
    BRANCHES.assert_all(["refused", "cancelled", "ran"]);
}
