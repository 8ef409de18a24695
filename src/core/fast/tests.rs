//! Tests of the intake (fast/intake.rs): what passes it, when it opens and
//! closes, and how admission and closing treat a place reserved at it.

use std::sync::mpsc;

use crate::{JobHandle, Offloader};

fn closed(pool: &Offloader) -> bool {
    pool.inner().queue_count.is_closed()
}

fn counted(pool: &Offloader) -> usize {
    pool.inner().queue_count.now()
}

/// A one-permit pool whose permit is held by a function waiting on the
/// returned sender; its worker lives, so its intake is open.
fn held(intake: bool) -> (Offloader, mpsc::Sender<()>, JobHandle<()>) {
    held_in(
        Offloader::builder()
            .max_in_flight(1)
            .queue_capacity(4)
            .fast(intake),
    )
}

/// The pool `builder` builds, one of its permits held as by [`held`].
fn held_in(builder: crate::Builder) -> (Offloader, mpsc::Sender<()>, JobHandle<()>) {
    let pool = builder.build().expect("valid");
    let (go, wait) = mpsc::channel::<()>();
    let (started, running) = mpsc::channel::<()>();
    let blocker = pool
        .offload(move |_stop| {
            let _ = started.send(());
            let _ = wait.recv();
        })
        .spawn()
        .expect("accepted");
    running.recv().expect("the blocker started");
    (pool, go, blocker)
}

#[test]
fn the_intake_opens_once_a_worker_lives_and_closes_at_shutdown() {
    let pool = Offloader::builder()
        .max_in_flight(1)
        .fast(true)
        .build()
        .expect("valid");
    assert!(closed(&pool), "no worker yet: the first job takes the lock");
    let mut first = pool.offload(|_stop| ()).spawn().expect("accepted");
    assert!(first.blocking_wait(None).is_ok());
    assert!(!closed(&pool));
    pool.shutdown();
    assert!(closed(&pool));
    assert_eq!(counted(&pool), 0);
}

/// The ring is made by the first job that passes the intake: a pool that
/// never takes one (or whose jobs all take the lock) keeps none, and a
/// job through the lock leaves it unmade.
#[test]
fn the_ring_is_made_by_the_first_job_through_the_intake() {
    let pool = Offloader::builder()
        .max_in_flight(1)
        .fast(true)
        .build()
        .expect("valid");
    let intake = || pool.inner().intake.as_ref().expect("an intake");
    assert!(!intake().has_ring(), "a pool built keeps no ring");
    assert!(intake().is_empty() && intake().pop().is_none());
    // The first job takes the lock (no worker yet): still no ring.
    let mut first = pool.offload(|_stop| ()).spawn().expect("accepted");
    assert!(first.blocking_wait(None).is_ok());
    assert!(!closed(&pool), "a worker lives: the intake is open");
    assert!(!intake().has_ring(), "a job through the lock makes none");
    let mut second = pool.offload(|_stop| 2).spawn().expect("accepted");
    assert_eq!(second.blocking_wait(None).ok(), Some(2));
    assert!(intake().has_ring(), "the job through the intake made it");
}

#[test]
fn a_job_waits_in_the_intake_until_the_next_lock() {
    let (pool, go, mut blocker) = held(true);
    let intake = pool.inner().intake.clone().expect("an intake");
    let mut job = pool.offload(|_stop| 7).spawn().expect("accepted");
    // Nobody took the lock since: the worker runs the blocker.
    assert!(!intake.is_empty(), "the job passed the intake");
    assert_eq!(counted(&pool), 1, "its place is reserved");
    let m = pool.metrics();
    assert!(intake.is_empty(), "the snapshot's lock moved it");
    assert_eq!((m.accepted, m.queued), (2, 1));
    assert!(m.ledger_balances());
    // A named and keyed job passes it too, and one needing a limiter
    // (counted as waiting by its submitter); one of a group takes the
    // lock, which moves the others into the queue ahead of it.
    let mut named = pool
        .offload(|_stop| 8)
        .name("named")
        .key("k")
        .spawn()
        .expect("accepted");
    let limiter = crate::Limiter::new(4);
    let mut limited = pool
        .offload(|_stop| 9)
        .limiter(&limiter)
        .spawn()
        .expect("accepted");
    assert_eq!(limiter.stats().waiting, 1, "counted as it passed");
    assert_eq!(counted(&pool), 3);
    assert!(!intake.is_empty());
    let group = pool.group();
    let mut grouped = group.offload(|_stop| 10).spawn().expect("accepted");
    assert!(intake.is_empty());
    assert_eq!(counted(&pool), 4);
    assert_eq!(limiter.stats().waiting, 1, "counted once");
    go.send(()).expect("the blocker waits");
    assert!(blocker.blocking_wait(None).is_ok());
    assert_eq!(job.blocking_wait(None).ok(), Some(7));
    assert_eq!(named.blocking_wait(None).ok(), Some(8));
    assert_eq!(limited.blocking_wait(None).ok(), Some(9));
    assert_eq!(grouped.blocking_wait(None).ok(), Some(10));
    assert_eq!(limiter.stats().waiting, 0);
    assert_eq!(counted(&pool), 0);
}

#[test]
fn a_pool_without_an_intake_takes_the_lock_for_every_job() {
    let (pool, go, mut blocker) = held(false);
    assert!(pool.inner().intake.is_none());
    let mut job = pool.offload(|_stop| 7).spawn().expect("accepted");
    assert_eq!(counted(&pool), 1);
    go.send(()).expect("the blocker waits");
    assert!(blocker.blocking_wait(None).is_ok());
    assert_eq!(job.blocking_wait(None).ok(), Some(7));
}

#[test]
fn a_caller_waiting_for_room_closes_the_intake_until_it_leaves() {
    let (pool, go, mut blocker) = held(true);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let queued: Vec<_> = (0..4)
        .map(|i| pool.offload(move |_stop| i).spawn().expect("room"))
        .collect();
    assert!(!closed(&pool));
    rt.block_on(async {
        let mut waiting = Box::pin(pool.offload(|_stop| 9).submit());
        assert!(futures_poll_once(waiting.as_mut()).await.is_pending());
        assert!(closed(&pool), "a caller waits for room");
        drop(waiting);
    });
    assert!(!closed(&pool), "it left");
    go.send(()).expect("the blocker waits");
    assert!(blocker.blocking_wait(None).is_ok());
    for (i, mut job) in queued.into_iter().enumerate() {
        assert_eq!(job.blocking_wait(None).ok(), Some(i));
    }
}

/// Regression (hostile review): a job taking the lock was refused as
/// if the queue were full while a job reserved at the intake, which a
/// free permit would start, was still on its way. Admission closes the
/// intake, waits for that job, and judges on the exact queue.
#[test]
fn a_job_at_the_intake_that_will_start_does_not_fill_the_queue() {
    let (pool, go, mut blocker) = held_in(
        Offloader::builder()
            .max_in_flight(2)
            .queue_capacity(1)
            .fast(true),
    );
    // A submitter at the intake, between its reservation and its push.
    let inner = pool.inner();
    assert!(inner.queue_count.reserve_at_intake(1));
    let group = pool.group();
    let (done, result) = mpsc::channel();
    let locked = std::thread::spawn(move || {
        let _ = done.send(
            group
                .offload(|_stop| 2)
                .spawn()
                .map_err(|e| format!("{:?}", e.reason())),
        );
    });
    // Still waiting, it is judged after the push (a refusal found now
    // is reported after the push: the pool's shutdown would otherwise
    // wait for the reserved place).
    let early = result.recv_timeout(std::time::Duration::from_millis(30));
    fill_reserved_place(&pool);
    let admitted = match early {
        Ok(judged) => judged,
        Err(_) => result
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("admission once the job arrived"),
    };
    let mut handle = admitted.expect("room: the job at the intake starts on the free permit");
    locked.join().expect("the submitter");
    go.send(()).expect("the blocker waits");
    assert!(blocker.blocking_wait(None).is_ok());
    assert_eq!(handle.blocking_wait(None).ok(), Some(2));
}

/// intake.rs inv. 1: closing the intake (here, a shutdown) waits for a
/// place reserved at it to be filled, and takes its job into the queue,
/// where the shutdown runs it; it does not return while the job is still
/// on its way, to be pushed into an intake nobody empties.
#[test]
fn a_shutdown_waits_for_a_place_reserved_at_the_intake() {
    let (pool, go, mut blocker) = held(true);
    assert!(pool.inner().queue_count.reserve_at_intake(4));
    let (done, shut) = mpsc::channel();
    let closer = pool.clone();
    let shutting = std::thread::spawn(move || {
        closer.shutdown();
        let _ = done.send(());
    });
    // It cannot have returned: the place is still empty. (If this thread
    // looked too soon, the check passes without proving anything; it
    // never fails on a correct pool.)
    assert!(
        shut.recv_timeout(std::time::Duration::from_millis(50))
            .is_err(),
        "the shutdown returned while a reserved place was empty"
    );
    fill_reserved_place(&pool);
    shut.recv_timeout(std::time::Duration::from_secs(20))
        .expect("the shutdown returns once the place is filled");
    shutting.join().expect("the closer");
    let intake = pool.inner().intake.clone().expect("an intake");
    assert!(intake.is_empty(), "the closing took the job into the queue");
    let m = pool.metrics();
    assert!(m.ledger_balances());
    assert_eq!((m.accepted, m.queued, m.running), (2, 1, 1));
    go.send(()).expect("the blocker waits");
    assert!(blocker.blocking_wait(None).is_ok());
    assert!(pool.blocking_await_termination(Some(std::time::Duration::from_secs(20))));
    let m = pool.metrics();
    assert_eq!((m.accepted, m.completed), (2, 2), "the job ran");
}

/// Fills a place reserved at `pool`'s intake by hand (as a submitter
/// would after its reservation) with a plain job returning 1.
fn fill_reserved_place(pool: &Offloader) {
    let core = crate::job::record::new_core(
        crate::job::id::JobId::next(),
        None,
        None,
        None,
        None,
        Default::default(),
        None,
    );
    let job = core.into_task(|_: &crate::StopToken| 1);
    let pushed = pool.inner().intake.as_ref().expect("an intake").push(job);
    assert!(pushed.is_ok(), "the ring has room");
}

/// Polls `fut` once.
async fn futures_poll_once<F: std::future::Future + ?Sized>(
    fut: std::pin::Pin<&mut F>,
) -> std::task::Poll<F::Output> {
    let mut fut = Some(fut);
    std::future::poll_fn(move |cx| {
        std::task::Poll::Ready(fut.take().map_or(std::task::Poll::Pending, |f| f.poll(cx)))
    })
    .await
}

/// The hint a spinning worker reads (`QueueCount::in_queue`) shows a job
/// queued through the lock, and stops showing it once the job left the
/// queue: a spinner that missed such jobs would spin its whole budget
/// beside them.
#[test]
fn a_job_queued_through_the_lock_shows_to_spinners() {
    let (pool, go, mut blocker) = held(true);
    assert!(!pool.inner().queue_count.in_queue(), "nothing queued yet");
    // A group's job takes the lock (its group's admission is decided there).
    let group = pool.group();
    let mut grouped = group.offload(|_stop| 3).spawn().expect("accepted");
    assert!(pool.inner().intake.as_ref().is_some_and(|i| i.is_empty()));
    assert!(pool.inner().queue_count.in_queue(), "a spinner sees it");
    go.send(()).expect("the blocker waits");
    assert!(blocker.blocking_wait(None).is_ok());
    assert_eq!(grouped.blocking_wait(None).ok(), Some(3));
    assert!(!pool.inner().queue_count.in_queue(), "it left the queue");
}
