//! Job groups (issue 13): stop, idle, close and metrics of a set of jobs,
//! nested groups, the drop policy, and their interplay with the pool's own
//! shutdown. Every wait is bounded; events are ordered by gates and
//! signals, never by sleeps.

mod support;

use std::future::Future;
use std::time::Duration;

use offloader::{Error, GroupDropPolicy, GroupMetrics, JobGroup, JobState, Offloader};
use support::*;

#[track_caller]
fn assert_group_ledger(m: &GroupMetrics) {
    assert!(m.ledger_balances(), "group ledger does not balance: {m:?}");
}

/// Offloads a job through `group` that signals `tx` when it starts and
/// returns when `hold` opens or its stop token is set (returning whether it
/// was stopped).
fn held(
    group: &JobGroup,
    hold: &Hold,
    tx: &tokio::sync::mpsc::UnboundedSender<()>,
) -> offloader::JobHandle<bool> {
    group
        .offload(gated_or_stop(hold, tx, ()))
        .spawn()
        .expect("accepted")
}

/// `stop` cancels the queued jobs (they never run), sets the stop token of
/// the running one, and the running one keeps its permit until it returns:
/// with one permit, a job of the pool outside the group starts only after
/// the stopped function returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_cancels_queued_and_stops_running_which_keep_their_permits() {
    let pool = pool(1, 16);
    let group = pool.group();
    let (_g, hold) = gate();
    let (tx, mut started) = signal();
    let (release, returns) = gate();
    let (back_tx, mut back) = signal();
    let running = group
        .offload(move |stop| {
            tx.send(()).unwrap();
            while !stop.is_stopped() {
                std::thread::yield_now();
            }
            // Stopped: holds its permit until the test lets it return.
            back_tx.send(()).unwrap();
            returns.wait();
            "stopped"
        })
        .spawn()
        .unwrap();
    recv("the group's first job", &mut started).await;
    let (qtx, _qrx) = signal();
    let queued: Vec<_> = (0..3).map(|_| held(&group, &hold, &qtx)).collect();
    let outsider = pool.offload(|_| "outsider").spawn().unwrap();
    assert!(group.stop());
    assert!(!group.stop(), "already stopped");
    assert!(group.metrics().stopped);
    for q in queued {
        let e = within("a cancelled job", q).await.unwrap_err();
        assert!(e.is_cancelled(), "{e}");
    }
    recv("the running job saw its stop", &mut back).await;
    let m = group.metrics();
    assert_eq!((m.running, m.cancelled, m.queued), (1, 3, 0), "{m:?}");
    assert_eq!(
        outsider.state(),
        JobState::Queued,
        "the stopped job still holds the only permit"
    );
    assert!(!group.is_idle());
    release.open();
    assert_eq!(within("the stopped job", running).await.unwrap(), "stopped");
    assert_eq!(within("the outsider", outsider).await.unwrap(), "outsider");
    within("the group idle", group.idle()).await;
    let m = group.metrics();
    assert_eq!((m.accepted, m.completed, m.cancelled), (4, 1, 3), "{m:?}");
    assert!(m.stopped);
    assert_group_ledger(&m);
    assert_ledger(&pool.metrics());
}

/// A stopped group refuses new jobs, hands the function back, and counts
/// the refusal; the pool itself still accepts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_group_refuses_new_jobs() {
    let pool = pool(2, 16);
    let group = pool.group();
    assert!(
        !group.metrics().closed && !group.metrics().stopped,
        "a new group is open"
    );
    group.stop();
    assert!(group.metrics().closed, "a stopped group is closed too");
    let refused = group.offload(|_| 7).spawn().unwrap_err();
    assert!(
        matches!(refused.reason(), Error::Cancelled { id: None }),
        "{refused}"
    );
    assert_eq!(refused.into_inner()(&offloader::StopToken::new()), 7);
    let awaited = group.offload(|_| 8).await.unwrap_err();
    assert!(
        matches!(awaited, Error::Cancelled { id: None }),
        "{awaited}"
    );
    let m = group.metrics();
    assert_eq!((m.accepted, m.rejected), (0, 2), "{m:?}");
    assert_eq!(within("the pool", pool.offload(|_| 9)).await.unwrap(), 9);
    let child = group.child();
    assert!(
        child.metrics().stopped,
        "a child of a stopped group is born stopped"
    );
    assert!(child.offload(|_| ()).spawn().is_err());
}

/// A stopped group refuses at once even when the pool's queue is full: a
/// caller told "full" would wait for room, through a group that can never
/// take its job (found by the model test: `invoke_all` through a stopped
/// group on a full pool hung).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_group_refuses_at_once_when_the_queue_is_full() {
    let pool = pool(1, 1);
    let occupied = occupy(&pool, 1).await;
    let queued = pool.offload(|_| ()).spawn().unwrap();
    assert!(matches!(
        pool.offload(|_| ()).spawn().unwrap_err().reason(),
        Error::Full { .. }
    ));
    let group = pool.group();
    group.stop();
    let refused = group.offload(|_| ()).spawn().unwrap_err();
    assert!(
        matches!(refused.reason(), Error::Cancelled { id: None }),
        "{refused}"
    );
    let awaited = within(
        "an awaited offload through a stopped group",
        group.offload(|_| ()),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(awaited, Error::Cancelled { id: None }),
        "{awaited}"
    );
    let submitted = within(
        "a submit through a stopped group",
        group.offload(|_| ()).submit(),
    )
    .await
    .unwrap_err();
    assert!(matches!(submitted.reason(), Error::Cancelled { id: None }));
    let all = within(
        "invoke_all through a stopped group",
        group.invoke_all(vec![|_: &offloader::StopToken| (); 2]),
    )
    .await;
    assert!(
        all.iter().all(|r| r
            .as_ref()
            .is_err_and(|e| matches!(e, Error::Cancelled { id: None }))),
        "{all:?}"
    );
    assert_eq!(group.metrics().rejected, 5);
    occupied.release().await;
    within("the queued job", queued).await.unwrap();
}

/// Stopping a parent reaches every descendant's jobs; stopping a child
/// does not reach its parent. A parent's metrics and idle cover its
/// descendants' jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_reaches_descendants_not_ancestors() {
    let pool = pool(4, 16);
    let parent = pool.group();
    let child = parent.child();
    let grandchild = child.child();
    let (_g, hold) = gate();
    let (tx, mut started) = signal();
    let p = held(&parent, &hold, &tx);
    let c = held(&child, &hold, &tx);
    let gc = held(&grandchild, &hold, &tx);
    for _ in 0..3 {
        recv("a job of the tree", &mut started).await;
    }
    assert_eq!(parent.metrics().running, 3);
    assert_eq!(child.metrics().running, 2);
    grandchild.stop();
    assert!(within("the grandchild's job", gc).await.unwrap(), "stopped");
    assert!(!child.metrics().stopped && !parent.metrics().stopped);
    assert!(!p.is_stopped() && !c.is_stopped());
    parent.stop();
    assert!(child.metrics().stopped);
    assert!(within("the child's job", c).await.unwrap(), "stopped");
    assert!(within("the parent's job", p).await.unwrap(), "stopped");
    within("the tree idle", parent.idle()).await;
    let m = parent.metrics();
    assert_eq!((m.accepted, m.completed), (3, 3), "{m:?}");
    assert_group_ledger(&m);
}

/// `idle` waits for every job of the group and its descendants, and only
/// for them: a job of the pool outside the group does not hold it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_waits_for_the_group_and_its_descendants_only() {
    let pool = pool(3, 16);
    let group = pool.group();
    within("an empty group is idle", group.idle()).await;
    let child = group.child();
    let (outside_gate, outside_hold) = gate();
    let outsider = pool.offload(move |_| outside_hold.wait()).spawn().unwrap();
    let (g, hold) = gate();
    let (tx, mut started) = signal();
    let job = held(&child, &hold, &tx);
    recv("the child's job", &mut started).await;
    assert!(still_pending(group.idle()).await, "the child's job runs");
    g.open();
    within("idle with the outsider still running", group.idle()).await;
    assert!(!within("the child's job", job).await.unwrap());
    assert!(group.is_idle());
    assert!(!pool.is_idle());
    outside_gate.open();
    within("the outsider", outsider).await.unwrap();
}

/// The default drop policy lets the jobs go on; `Stop` stops them when the
/// last handle goes (clones keep the group alive).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_group_follows_its_policy() {
    let pool = pool(2, 16);
    let (g, hold) = gate();
    let (tx, mut started) = signal();
    let kept = {
        let group = pool.group();
        held(&group, &hold, &tx)
    };
    recv("the kept job", &mut started).await;
    let stopped = {
        let group = pool.group().on_drop(GroupDropPolicy::Stop);
        let clone = group.clone();
        let job = held(&group, &hold, &tx);
        recv("the stopped job", &mut started).await;
        drop(group);
        assert!(!job.is_stopped(), "a clone still holds the group");
        drop(clone);
        job
    };
    assert!(within("the job of the dropped group", stopped)
        .await
        .unwrap());
    assert!(!kept.is_stopped(), "LetRun: the job goes on");
    g.open();
    assert!(!within("the kept job", kept).await.unwrap());
    within("idle", pool.idle()).await;
    assert_ledger(&pool.metrics());
}

/// `close`: new jobs are refused at once; jobs that finish within the
/// graceful budget need no stop. The report counts the jobs that finished
/// during the close, not those that finished before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_without_escalation() {
    quiet_deliberate_panics();
    let pool = pool(2, 16);
    let group = pool.group();
    // Finished before the close: not in its report.
    assert_eq!(
        within("an earlier job", group.offload(|_| 0))
            .await
            .unwrap(),
        0
    );
    let panicked = within(
        "an earlier panic",
        group.offload(|_| -> u8 { panic!("{}", ON_PURPOSE) }),
    )
    .await;
    assert!(panicked.unwrap_err().is_panic());
    // Held until the close has begun: a job finishing before its first poll
    // would not count in its report.
    let (g, hold) = gate();
    let jobs: Vec<_> = (0..4)
        .map(|i| {
            let hold = hold.clone();
            group
                .offload(move |_| {
                    hold.wait();
                    i
                })
                .spawn()
                .unwrap()
        })
        .collect();
    let mut closing = std::pin::pin!(group.close(HANG, Duration::from_secs(1)));
    assert!(poll_once(closing.as_mut()).await.is_pending());
    g.open();
    let report = within("the close", closing).await;
    assert!(report.terminated && !report.escalated, "{report}");
    assert_eq!((report.completed, report.panicked), (4, 0), "{report}");
    assert!(report.unstarted.is_empty() && report.still_running.is_empty());
    assert!(group.offload(|_| ()).spawn().is_err(), "closed");
    assert!(!group.metrics().stopped, "closed, not stopped");
    for (i, j) in jobs.into_iter().enumerate() {
        assert_eq!(within("a job", j).await.unwrap(), i);
    }
    assert_eq!(
        within("the pool still runs jobs", pool.offload(|_| 1))
            .await
            .unwrap(),
        1
    );
}

/// `close` escalates to a stop when the graceful budget passes: the queued
/// job is cancelled and reported, the running one that heeds its token
/// returns, one that ignores it is reported still running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_escalates_to_a_stop_and_reports_what_is_left() {
    let pool = pool(2, 16);
    let group = pool.group();
    let (stubborn_gate, stubborn_hold) = gate();
    let (_g, hold) = gate();
    let (tx, mut started) = signal();
    let tx2 = tx.clone();
    let stubborn = group
        .offload(move |_| {
            tx2.send(()).unwrap();
            stubborn_hold.wait();
        })
        .name("stubborn")
        .spawn()
        .unwrap();
    let heeds = held(&group, &hold, &tx);
    recv("first", &mut started).await;
    recv("second", &mut started).await;
    let queued = group.offload(|_| ()).name("queued").spawn().unwrap();
    let report = group.close(SHORT, SHORT).await;
    assert!(report.escalated && !report.terminated, "{report}");
    assert_eq!(report.unstarted.len(), 1, "{report}");
    assert_eq!(report.unstarted[0].name.as_deref(), Some("queued"));
    assert_eq!(report.still_running.len(), 1, "{report}");
    assert_eq!(report.still_running[0].name.as_deref(), Some("stubborn"));
    assert!(report.still_running[0].stop_requested);
    assert!(within("queued", queued).await.unwrap_err().is_cancelled());
    assert!(within("the job that heeds its token", heeds).await.unwrap());
    stubborn_gate.open();
    within("the stubborn job", stubborn).await.unwrap();
    within("idle", group.idle()).await;
    assert_group_ledger(&group.metrics());
}

/// The pool's own `shutdown_now` reaches group jobs like any others: the
/// group counts them unstarted and goes idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pools_shutdown_now_settles_group_jobs() {
    let pool = pool(1, 16);
    let group = pool.group();
    let child = group.child();
    let (_g, hold) = gate();
    let (tx, mut started) = signal();
    let running = held(&group, &hold, &tx);
    recv("running", &mut started).await;
    let queued: Vec<_> = (0..5)
        .map(|i| {
            let g = if i % 2 == 0 { &group } else { &child };
            g.offload(|_| ()).spawn().unwrap()
        })
        .collect();
    assert_eq!(pool.shutdown_now().len(), 5);
    assert!(within("running", running).await.unwrap());
    for q in queued {
        assert!(within("queued", q).await.is_err());
    }
    within("idle", group.idle()).await;
    let m = group.metrics();
    assert_eq!((m.unstarted, m.completed), (5, 1), "{m:?}");
    assert_eq!(child.metrics().unstarted, 2);
    assert_group_ledger(&m);
    within("terminated", pool.terminated()).await;
}

/// A job may stop its own group from inside (the stop takes the pool lock,
/// which no worker holds while running a function), and await another
/// group's idleness from a blocking wait elsewhere: nothing deadlocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_can_stop_its_own_group() {
    let pool = pool(2, 16);
    let group = pool.group();
    let inside = group.clone();
    let (_g, hold) = gate();
    let (tx, mut started) = signal();
    let sibling = held(&group, &hold, &tx);
    recv("the sibling", &mut started).await;
    let stopper = group
        .offload(move |stop| {
            let first = inside.stop();
            (first, stop.is_stopped())
        })
        .spawn()
        .unwrap();
    assert_eq!(within("the stopper", stopper).await.unwrap(), (true, true));
    assert!(within("the sibling", sibling).await.unwrap());
    within("idle", group.idle()).await;
}

/// Ledger identities hold for the pool and every group at every step of a
/// mixed run: groups created and dropped, jobs cancelled by handles, by
/// group stops, completed and panicked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledgers_hold_through_a_mixed_run() {
    quiet_deliberate_panics();
    let pool = pool(2, 4096);
    let root = pool.group();
    let mut handles = Vec::new();
    for round in 0..20usize {
        let g = if round % 3 == 0 {
            root.clone()
        } else {
            root.child()
        };
        for i in 0..20usize {
            let h = g
                .offload(move |_| {
                    if i % 7 == 3 {
                        panic!("{}", ON_PURPOSE);
                    }
                    i
                })
                .spawn()
                .unwrap();
            if i % 5 == 0 {
                h.cancel();
            }
            handles.push(h);
        }
        if round % 4 == 1 && round % 3 != 0 {
            g.stop();
        }
        assert_group_ledger(&root.metrics());
        assert_group_ledger(&g.metrics());
        assert_ledger(&pool.metrics());
    }
    for h in handles {
        let _ = within("a job", h).await;
    }
    within("idle", root.idle()).await;
    let (m, p) = (root.metrics(), pool.metrics());
    assert_eq!(m.accepted, 400);
    assert_eq!(m.queued + m.running, 0);
    assert_eq!(
        (m.completed, m.panicked, m.cancelled),
        (p.completed, p.panicked, p.cancelled),
        "every job of the pool went through the root group"
    );
    assert_group_ledger(&m);
}

/// A group that outlives its pool handle keeps the pool usable: the group
/// holds an [`Offloader`] clone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_keeps_its_pool() {
    let group = {
        let pool: Offloader = pool(1, 4);
        pool.group()
    };
    assert_eq!(within("a job", group.offload(|_| 5)).await.unwrap(), 5);
    assert_eq!(group.metrics().completed, 1);
}

/// A group's idleness does not wait for the next job its last job's worker
/// took in the same critical section (a job of no group, held on a gate):
/// the group's outcome is settled when it is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_does_not_wait_for_the_workers_next_job() {
    let pool = pool(1, 16);
    let group = pool.group();
    let (a_gate, a_hold) = gate();
    let (tx, mut started) = signal();
    // Kept, not polled: no waker, so the worker takes the next job at once.
    let a = group
        .offload(move |_| {
            tx.send(()).unwrap();
            a_hold.wait();
            1
        })
        .spawn()
        .unwrap();
    recv("a", &mut started).await;
    let (b_gate, b_hold) = gate();
    let b = pool.offload(move |_| b_hold.wait()).spawn().unwrap();
    a_gate.open();
    eventually("a finished", || a.is_finished()).await;
    within("the group idle while b runs", group.idle()).await;
    assert!(group.is_idle());
    assert_eq!(b.state(), JobState::Running);
    b_gate.open();
    assert_eq!(within("a", a).await.unwrap(), 1);
    within("b", b).await.unwrap();
}

/// One group becoming idle wakes its own idleness waiters, not those of
/// other groups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_going_idle_wakes_only_its_own_waiters() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Wake, Waker};

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let pool = pool(2, 16);
    let (x, y) = (pool.group(), pool.group());
    let (x_gate, x_hold) = gate();
    let (tx, mut started) = signal();
    let xj = held(&x, &x_hold, &tx);
    recv("x's job", &mut started).await;
    let count = Arc::new(Count(AtomicUsize::new(0)));
    let waker = Waker::from(count.clone());
    let mut x_idle = Box::pin(x.idle());
    assert!(x_idle
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    for i in 0..10 {
        assert_eq!(within("y's job", y.offload(move |_| i)).await.unwrap(), i);
        within("y idle", y.idle()).await;
    }
    assert_eq!(
        count.0.load(Ordering::SeqCst),
        0,
        "x's waiter was not woken"
    );
    x_gate.open();
    assert!(!within("x's job", xj).await.unwrap());
    eventually("x's waiter woken", || count.0.load(Ordering::SeqCst) > 0).await;
    within("x idle", x_idle).await;
}

/// Children dropped in any order leave the others linked: a parent's stop
/// still reaches every child that remains, and only those.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_children_leave_the_rest_reachable() {
    let pool = pool(2, 4096);
    let parent = pool.group();
    let mut children: Vec<Option<JobGroup>> = (0..200).map(|_| Some(parent.child())).collect();
    // Drop every third, then every other of the rest, from both ends.
    for (i, c) in children.iter_mut().enumerate() {
        if i % 3 == 0 {
            drop(c.take());
        }
    }
    for (i, c) in children.iter_mut().rev().enumerate() {
        if i % 2 == 0 {
            drop(c.take());
        }
    }
    let (_g, hold) = gate();
    let (tx, mut started) = signal();
    let blocker = held(&pool.group(), &hold, &tx);
    let blocker2 = held(&pool.group(), &hold, &tx);
    recv("blocker", &mut started).await;
    recv("blocker2", &mut started).await;
    let queued: Vec<_> = children
        .iter()
        .flatten()
        .map(|c| c.offload(|_| ()).spawn().unwrap())
        .collect();
    assert!(!queued.is_empty());
    assert_eq!(parent.metrics().queued as usize, queued.len());
    parent.stop();
    for q in queued {
        assert!(within("a child's job", q).await.unwrap_err().is_cancelled());
    }
    assert!(children.iter().flatten().all(|g| g.metrics().stopped));
    drop(children);
    drop(_g);
    within("blocker", blocker).await.unwrap();
    within("blocker2", blocker2).await.unwrap();
}

/// A close that was dropped, or that did not need to stop anything, leaves
/// the group closed (refusing jobs) but not stopped, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_close_leaves_the_group_closed_not_stopped() {
    let pool = pool(1, 16);
    let group = pool.group();
    let (g, hold) = gate();
    let (tx, mut started) = signal();
    let job = held(&group, &hold, &tx);
    recv("the job", &mut started).await;
    let closing = group.close(HANG, HANG);
    assert!(still_pending(closing).await);
    assert!(group.metrics().closed && !group.metrics().stopped);
    let m = group.metrics();
    assert!(m.closed && !m.stopped, "{m:?}");
    let refused = group.offload(|_| ()).spawn().unwrap_err();
    assert!(refused.to_string().contains("closing"), "{refused}");
    assert!(
        group.child().metrics().closed,
        "a child of a closed group is born closed"
    );
    g.open();
    assert!(!within("the job", job).await.unwrap());
}

/// A stop sets the flag of every running job of the group in one critical
/// section: a job that starts on the permit of the first stopped job finds
/// every other one already stopped (it could otherwise meet one of them
/// still running unstopped, as a barrier does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_reaches_every_running_job_at_once() {
    for _ in 0..50 {
        let pool = pool(2, 16);
        let group = pool.group();
        let (_g, hold) = gate();
        let (tx, mut started) = signal();
        let (token_tx, mut tokens) = signal();
        let first = held(&group, &hold, &tx);
        let second = group
            .offload({
                let then = gated_or_stop(&hold, &tx, ());
                move |stop: &offloader::StopToken| {
                    token_tx.send(stop.clone()).unwrap();
                    then(stop)
                }
            })
            .spawn()
            .unwrap();
        recv("first", &mut started).await;
        recv("second", &mut started).await;
        let second_token = recv("the second job's token", &mut tokens).await;
        // Queued behind both: starts on the first freed permit.
        let outsider = pool
            .offload(move |_| second_token.is_stopped())
            .spawn()
            .unwrap();
        group.stop();
        assert!(
            within("the outsider", outsider).await.unwrap(),
            "the outsider started while a stopped group's job was not yet stopped"
        );
        assert!(within("first", first).await.unwrap());
        assert!(within("second", second).await.unwrap());
    }
}

/// `running_jobs` lists the running jobs of the group and its descendants,
/// and only those: not a job of the pool outside the group, not a queued
/// one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_jobs_lists_the_group_and_its_descendants_only() {
    let pool = pool(3, 16);
    let parent = pool.group();
    let child = parent.child();
    let (g, hold) = gate();
    let (tx, mut started) = signal();
    let named = |group: &JobGroup, name: &'static str| {
        group
            .offload(gated(&hold, &tx, (), |_| ()))
            .name(name)
            .spawn()
            .unwrap()
    };
    let p = named(&parent, "parent's");
    let c = named(&child, "child's");
    let outside = pool
        .offload(gated(&hold, &tx, (), |_| ()))
        .name("outsider")
        .spawn()
        .unwrap();
    for _ in 0..3 {
        recv("a job", &mut started).await;
    }
    // Queued behind the three permits: not running.
    let queued = named(&child, "queued");
    let names = |group: &JobGroup| {
        let mut names: Vec<String> = group
            .running_jobs()
            .iter()
            .map(|j| j.name.as_deref().unwrap_or("?").to_owned())
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(&parent), ["child's", "parent's"]);
    assert_eq!(names(&child), ["child's"]);
    assert!(pool.group().running_jobs().is_empty());
    g.open();
    for job in [p, c, outside, queued] {
        within("a job", job).await.unwrap();
    }
    within("idle", parent.idle()).await;
    assert!(parent.running_jobs().is_empty());
}

/// Room freed for several callers at once lets them all in: a group's stop
/// cancels two queued jobs in one go (two slots, one wake-up), and the first
/// caller let in wakes the next while room is left. Every job is on one key
/// whose one permit is held meanwhile, so no start, finish or lane change
/// wakes anyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn room_freed_for_two_at_once_lets_two_waiting_callers_in() {
    let pool = builder(2, 2).max_per_key(1).build().expect("valid");
    let (gate, hold) = gate();
    let (tx, mut started) = signal::<&str>();
    let job = |label: &'static str| gated(&hold, &tx, label, |_| ());
    let occupant = pool
        .offload(job("occupant"))
        .key("k")
        .spawn()
        .expect("accepted");
    assert_eq!(recv("the occupant", &mut started).await, "occupant");
    let group = pool.group();
    let queued: Vec<_> = (0..2)
        .map(|_| group.offload(|_| ()).key("k").spawn().expect("room"))
        .collect();
    let mut w1 = Box::pin(pool.offload(job("w1")).key("k").submit());
    let mut w2 = Box::pin(pool.offload(job("w2")).key("k").submit());
    assert!(poll_once(w1.as_mut()).await.is_pending(), "full: w1 waits");
    assert!(poll_once(w2.as_mut()).await.is_pending(), "full: w2 waits");
    assert!(group.stop());
    let (h1, h2) = within("both waiting callers get in", async {
        (w1.await, w2.await)
    })
    .await;
    let (h1, h2) = (h1.expect("w1 accepted"), h2.expect("w2 accepted"));
    for q in queued {
        assert!(within("a cancelled job", q)
            .await
            .unwrap_err()
            .is_cancelled());
    }
    gate.open();
    within("the occupant", occupant).await.unwrap();
    within("w1's job", h1).await.unwrap();
    within("w2's job", h2).await.unwrap();
}

/// Found by a hostile review: a caller waiting for room with a job of a
/// group went on waiting after the group was stopped or closed; it learned
/// of the refusal only when room freed, which with a queue kept full is
/// never. The stop and the close now wake every caller waiting for room, as
/// a shutdown does: the group's are refused, the others wait on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_stopped_or_closed_refuses_its_callers_waiting_for_room() {
    for close in [false, true] {
        let pool = pool(1, 1);
        let occupied = occupy(&pool, 1).await;
        let queued = pool
            .offload(|_stop| ())
            .spawn()
            .expect("the queue's one place");
        let group = pool.group();
        // Each polled once (and so waiting for room) before the stop.
        let mut waiting = Box::pin(std::future::IntoFuture::into_future(
            group.offload(|_stop| 1),
        ));
        assert!(poll_once(waiting.as_mut()).await.is_pending());
        let mut other = Box::pin(std::future::IntoFuture::into_future(
            pool.offload(|_stop| 2),
        ));
        assert!(poll_once(other.as_mut()).await.is_pending());
        let waiting = tokio::spawn(waiting);
        let other = tokio::spawn(other);
        if close {
            // `close` stops the group once its graceful budget is spent:
            // a zero budget with the group idle just closes it.
            let report = group.close(Duration::ZERO, Duration::ZERO).await;
            assert!(report.still_running.is_empty(), "{report:?}");
        } else {
            group.stop();
        }
        let refused = within("the group's caller", waiting)
            .await
            .expect("task")
            .expect_err("refused");
        assert!(
            matches!(refused, Error::Cancelled { id: None }),
            "close {close}: {refused:?}"
        );
        assert!(
            !other.is_finished(),
            "the other caller still waits for room"
        );
        occupied.release().await;
        within("the queued job", queued).await.expect("ran");
        assert_eq!(
            within("the other caller", other).await.expect("task").ok(),
            Some(2)
        );
        assert_ledger(&pool.metrics());
    }
}
