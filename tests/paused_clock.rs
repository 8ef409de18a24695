//! Timeouts under tokio's paused test clock (issue 10, item 7): they work as
//! `spawn_blocking` + `tokio::time::timeout` do. While a timed caller waits
//! for work on the pool's threads, tokio does not auto-advance the paused
//! clock; the caller's timer fires, and reports, in virtual time.
//!
//! The jobs here take a little real time (`WORK`): that is the work being
//! waited for, not a way of ordering events; the assertions hold for any
//! length of it.

mod support;

use std::future::IntoFuture;
use std::time::Duration;

use offloader::{Error, Offloader};
use support::{gate, recv, signal, AwaitTermination, HANG};

/// The tests of this binary run one at a time: two of them count the
/// process's threads, which the others' pools and runtimes would change.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The real time a job takes.
const WORK: Duration = Duration::from_millis(100);

fn work(v: u32) -> impl FnOnce(&offloader::StopToken) -> u32 + Send + 'static {
    move |_| {
        std::thread::sleep(WORK);
        v
    }
}

#[tokio::test(start_paused = true)]
async fn with_timeout_waits_for_real_work_under_a_paused_clock() {
    let _serial = SERIAL.lock().await;
    let pool = Offloader::builder().build().unwrap();
    let began = tokio::time::Instant::now();
    let v = pool
        .offload(work(1))
        .with_timeout(Duration::from_secs(10))
        .await
        .expect("the job finishes long before 10 s of virtual time");
    assert_eq!(v, 1);
    assert!(began.elapsed() < Duration::from_secs(10));

    // The same with spawn_blocking, for reference: what users expect.
    let v = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::task::spawn_blocking(|| {
            std::thread::sleep(WORK);
            2
        }),
    )
    .await
    .expect("spawn_blocking holds the clock")
    .unwrap();
    assert_eq!(v, 2);

    // A spawned handle with a timeout, and a user's timeout around a handle.
    let h = pool
        .offload(work(3))
        .with_timeout(Duration::from_secs(10))
        .spawn()
        .unwrap();
    assert_eq!(h.await.unwrap(), 3);
    let mut h = pool.offload(work(4)).spawn().unwrap();
    let v = tokio::time::timeout(Duration::from_secs(10), &mut h).await;
    assert_eq!(v.expect("within 10 s of virtual time").unwrap(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_timeout_fires_and_reports_in_virtual_time() {
    let _serial = SERIAL.lock().await;
    let pool = Offloader::builder().build().unwrap();
    let (g, hold) = gate();
    let (tx, mut started) = signal();
    let caller = tokio::spawn(
        pool.offload(move |_| {
            tx.send(()).unwrap();
            hold.wait();
        })
        .with_timeout(Duration::from_secs(10))
        .into_future(),
    );
    recv("started", &mut started).await;
    // The job is held: only an explicit advance moves the clock.
    tokio::time::advance(Duration::from_secs(11)).await;
    let err = tokio::time::timeout(HANG, caller)
        .await
        .expect("the caller's timer fired")
        .unwrap()
        .unwrap_err();
    match &err {
        &Error::TimedOut { waited, .. } => {
            assert!(waited >= Duration::from_secs(10), "{waited:?}");
            assert!(err.to_string().contains("after 1"), "{err}");
        }
        other => panic!("expected TimedOut, got {other:?}"),
    }
    g.open();
    pool.idle().await;
}

/// A huge time limit means "no limit", in virtual time too: a year of
/// explicit advances does not fire it (the timer is set about thirty years
/// ahead, not a day or two), and the job's outcome still arrives.
#[tokio::test(start_paused = true)]
async fn a_huge_timeout_does_not_fire_within_a_year_of_virtual_time() {
    let _serial = SERIAL.lock().await;
    let pool = Offloader::builder().build().unwrap();
    for limit in [Duration::MAX, Duration::from_secs(u64::MAX / 2)] {
        let (g, hold) = gate();
        let (tx, mut started) = signal();
        let mut caller = tokio::spawn(
            pool.offload(move |_| {
                tx.send(()).unwrap();
                hold.wait();
                7
            })
            .with_timeout(limit)
            .into_future(),
        );
        recv("started", &mut started).await;
        for _ in 0..365 {
            tokio::time::advance(Duration::from_secs(86_400)).await;
        }
        // A timer that fired woke the caller: give it its turns.
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        assert!(!caller.is_finished(), "{limit:?} fired within a year");
        g.open();
        let out = tokio::time::timeout(HANG, &mut caller).await;
        assert_eq!(out.expect("the outcome arrived").unwrap().unwrap(), 7);
    }
    pool.idle().await;
}

#[tokio::test(start_paused = true)]
async fn close_and_await_termination_wait_for_real_work_under_a_paused_clock() {
    let _serial = SERIAL.lock().await;
    let pool = Offloader::builder().max_in_flight(2).build().unwrap();
    for i in 0..4 {
        pool.offload(work(i)).spawn().unwrap().detach();
    }
    let report = pool
        .close(Duration::from_secs(5), Duration::from_secs(5))
        .await;
    assert!(report.terminated && !report.escalated, "{report}");
    assert_eq!(report.completed, 4);

    let pool = Offloader::builder().build().unwrap();
    pool.offload(work(5)).spawn().unwrap().detach();
    pool.shutdown();
    assert!(pool.await_termination(Duration::from_secs(5)).await);
}

/// A job's thread-local whose destructor takes `WORK` of real time: it
/// runs when the worker thread exits.
struct SlowExit;

impl Drop for SlowExit {
    fn drop(&mut self) {
        std::thread::sleep(WORK);
    }
}

thread_local! {
    static SLOW_EXIT: std::cell::RefCell<Option<SlowExit>> = const { std::cell::RefCell::new(None) };
}

/// A pool thread still exiting (a job's thread-local destructor) is pool
/// work too: awaiting termination holds the clock until the thread has
/// been joined, although nothing is queued or running any more (the join
/// runs on a thread of its own meanwhile).
#[tokio::test(start_paused = true)]
async fn a_thread_still_exiting_holds_the_clock_for_await_termination() {
    let _serial = SERIAL.lock().await;
    let pool = Offloader::builder().max_in_flight(1).build().unwrap();
    pool.offload(|_| SLOW_EXIT.with(|s| *s.borrow_mut() = Some(SlowExit)))
        .await
        .unwrap();
    pool.shutdown();
    assert!(
        pool.await_termination(Duration::from_secs(5)).await,
        "terminated within 5 s of virtual time: the clock waits for the exiting thread"
    );
}

#[tokio::test(start_paused = true)]
async fn a_submit_waiting_for_room_keeps_its_timeout_in_virtual_time() {
    let _serial = SERIAL.lock().await;
    let pool = Offloader::builder()
        .max_in_flight(1)
        .queue_capacity(1)
        .build()
        .unwrap();
    pool.offload(work(1)).spawn().unwrap().detach();
    pool.offload(work(2)).spawn().unwrap().detach();
    // Room frees when the running job finishes in real time, long before
    // 10 s of virtual time.
    let h = pool
        .offload(work(3))
        .with_timeout(Duration::from_secs(10))
        .submit()
        .await
        .expect("room within the timeout");
    assert_eq!(h.await.unwrap(), 3);
}

/// A user's own `tokio::time::timeout` around an awaited offload, a handle
/// or `idle()`: as with `spawn_blocking`, the pool work holds the clock.
#[tokio::test(start_paused = true)]
async fn a_users_own_timeout_around_pool_work_holds_the_clock() {
    let _serial = SERIAL.lock().await;
    let pool = Offloader::builder().build().unwrap();
    let v = tokio::time::timeout(Duration::from_millis(10), pool.offload(work(1)))
        .await
        .expect("the work finishes before 10 ms of virtual time");
    assert_eq!(v.unwrap(), 1);
    let h = pool.offload(work(2)).spawn().unwrap();
    let v = tokio::time::timeout(Duration::from_millis(10), h)
        .await
        .expect("a handle too");
    assert_eq!(v.unwrap(), 2);
    pool.offload(work(3)).spawn().unwrap().detach();
    tokio::time::timeout(Duration::from_millis(10), pool.idle())
        .await
        .expect("idle() too");
}

/// The threads of this process.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

/// Many callers waiting under a paused clock hold it with one blocking
/// task for the pool, not one thread each (second hostile review).
#[tokio::test(start_paused = true)]
async fn many_waiting_callers_hold_the_clock_with_one_task() {
    let _serial = SERIAL.lock().await;
    let pool = Offloader::builder().max_in_flight(2).build().unwrap();
    let (g, hold) = gate();
    let (tx, started) = std::sync::mpsc::channel();
    pool.offload(move |_| {
        tx.send(()).unwrap();
        hold.wait();
    })
    .spawn()
    .unwrap()
    .detach();
    // Waited for on the blocking pool, which holds the paused clock.
    tokio::task::spawn_blocking(move || started.recv_timeout(HANG))
        .await
        .unwrap()
        .expect("the blocker started");
    let before = threads();
    let waiters: Vec<_> = (0..300)
        .map(|i| tokio::spawn(pool.offload(move |_| i).into_future()))
        .collect();
    // Let every caller reach its wait (polled once, pending).
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let during = threads();
    assert!(
        during <= before + 3,
        "{} threads for 300 waiting callers (before: {before})",
        during
    );
    g.open();
    for w in waiters {
        w.await.unwrap().unwrap();
    }
}

/// A clock paused, advanced and resumed runs again, with an offset from
/// real time: it is not mistaken for a paused one.
#[tokio::test]
async fn a_resumed_clock_is_not_held() {
    let _serial = SERIAL.lock().await;
    tokio::time::pause();
    tokio::time::advance(Duration::from_secs(1)).await;
    tokio::time::resume();
    let pool = Offloader::builder().max_in_flight(1).build().unwrap();
    // The clock runs again: the usual bounded waits work.
    let occupied = support::occupy(&pool, 1).await;
    let before = threads();
    let waiters: Vec<_> = (0..50)
        .map(|i| tokio::spawn(pool.offload(move |_| i).into_future()))
        .collect();
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(threads() <= before + 1, "a running clock needs no hold");
    occupied.gate.open();
    for w in waiters {
        w.await.unwrap().unwrap();
    }
}

/// A caller that polled its job once and then sleeps (a `map` stream not
/// polled between items, a future left aside) does not hold the paused clock
/// once the job is done: the sleep ends in virtual time. With a hold that
/// lasted until the next poll, the sleep never ended.
#[tokio::test(start_paused = true)]
async fn a_finished_job_nobody_polls_does_not_hold_the_clock() {
    use std::future::{poll_fn, Future};
    use std::pin::pin;

    use futures_core::Stream;

    let _serial = SERIAL.lock().await;
    let pool = Offloader::builder().max_in_flight(2).build().unwrap();
    // A future polled once, then left while its job finishes.
    let mut fut = pin!(pool.offload(work(1)).into_future());
    assert!(poll_fn(|cx| std::task::Poll::Ready(fut.as_mut().poll(cx).is_pending())).await);
    within_real(
        "an hour of virtual time",
        tokio::time::sleep(Duration::from_secs(3600)),
    )
    .await;
    assert_eq!(fut.await.unwrap(), 1);

    // A map stream consumed with a sleep between items.
    let mut s = pin!(pool.map(0..3u32, |i, _| Ok::<_, ()>(i)).limit(2));
    let mut got = Vec::new();
    while let Some(v) = poll_fn(|cx| s.as_mut().poll_next(cx)).await {
        got.push(v.unwrap());
        within_real(
            "a second of virtual time",
            tokio::time::sleep(Duration::from_secs(1)),
        )
        .await;
    }
    assert_eq!(got, [0, 1, 2]);
}

/// Awaits `fut`, failing if it takes `HANG` of *real* time (a timer of the
/// paused clock would measure virtual time; the bound comes from a thread).
async fn within_real<F: std::future::Future>(what: &str, fut: F) -> F::Output {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        std::thread::sleep(HANG);
        let _ = tx.send(());
    });
    tokio::select! {
        out = fut => out,
        _ = rx => panic!("{what}: not done within {HANG:?} of real time"),
    }
}

/// A job waiting for a limiter that no running function holds waits for
/// something outside the pool: the paused clock moves meanwhile (a timeout
/// fires, a timer that frees the limiter runs), and once the job can start
/// the clock is held again for its real work. All four hung for good when
/// such a job held the clock (found by a hostile review).
#[tokio::test(start_paused = true)]
async fn a_job_waiting_for_an_idle_limiter_lets_the_clock_move() {
    let _serial = SERIAL.lock().await;
    let l = offloader::Limiter::new(0);
    // A timed caller of a job that cannot start times out in virtual time.
    let pool = Offloader::builder().build().unwrap();
    let timed = pool
        .offload(|_| 1)
        .limiter(&l)
        .with_timeout(Duration::from_secs(1));
    let err = within_real("a timed wait for a blocked job", timed.into_future())
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    // A timer frees the limiter; the job then runs its real work, the
    // clock held (its caller's 10 s never pass during the 100 ms).
    let freer = {
        let l = l.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            l.set_permits(1);
        })
    };
    let began = tokio::time::Instant::now();
    let v = within_real(
        "a job whose limiter a timer frees",
        pool.offload(work(7))
            .limiter(&l)
            .with_timeout(Duration::from_secs(10))
            .into_future(),
    )
    .await
    .expect("runs once the timer freed the limiter");
    assert_eq!(v, 7);
    let waited = began.elapsed();
    assert!(
        waited >= Duration::from_millis(50) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
    freer.await.unwrap();
    // Termination and a staged close with a blocked job: bounded waits
    // end in virtual time.
    let l = offloader::Limiter::new(0);
    let pool = Offloader::builder().build().unwrap();
    let _blocked = pool.offload(|_| 1).limiter(&l).spawn().unwrap();
    pool.shutdown();
    let terminated = within_real(
        "await_termination(1 s)",
        pool.await_termination(Duration::from_secs(1)),
    )
    .await;
    assert!(!terminated, "the blocked job is still queued");
    let report = within_real(
        "close(1 s, 1 s)",
        pool.close(Duration::from_secs(1), Duration::from_secs(1)),
    )
    .await;
    assert!(
        report.escalated && report.terminated && report.unstarted.len() == 1,
        "{report:?}"
    );
}

/// A permit of a limiter given to another pool's function is work a
/// blocked job waits for: the clock its stalled pool let go is held again.
/// Pool `b`'s detached job is first in line; a timer gives the limiter a
/// permit, `b`'s function takes it for 300 ms of real work, and `a`'s timed
/// caller, behind it, gets its value instead of a timeout in virtual time
/// (found by a hostile review of the stall rule).
#[tokio::test(start_paused = true)]
async fn a_stalled_pool_holds_the_clock_again_when_another_pool_takes_the_limiter() {
    let _serial = SERIAL.lock().await;
    let l = offloader::Limiter::new(0);
    let (a, b) = (
        Offloader::builder().build().unwrap(),
        Offloader::builder().build().unwrap(),
    );
    let _detached = b
        .offload(|_| std::thread::sleep(Duration::from_millis(300)))
        .limiter(&l)
        .spawn()
        .unwrap();
    within_real("b in line", async {
        while l.stats().pools_waiting == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let caller = tokio::spawn(
        a.offload(|_| 7u32)
            .limiter(&l)
            .with_timeout(Duration::from_secs(10))
            .into_future(),
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    l.set_permits(1);
    let out = within_real("a's caller", caller).await.unwrap();
    assert_eq!(out.map_err(|e| e.to_string()), Ok(7));
}

/// A permit handed from a finishing function of pool `b` to a blocked job
/// of pool `a` keeps the clock held across the handover: a granted permit
/// counts as held. (With only running functions counted, `a` looked
/// stalled between `b`'s release and the grant's delivery, which a slow
/// waker of `b`'s caller stretched: `a`'s caller timed out. Found by a
/// hostile review.)
#[tokio::test(start_paused = true)]
async fn a_permit_handed_between_pools_keeps_the_clock_held() {
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Wake, Waker};
    struct SlowWaker;
    impl Wake for SlowWaker {
        fn wake(self: Arc<Self>) {
            // Work of the waker's own, on the releasing worker's thread.
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let _serial = SERIAL.lock().await;
    let l = offloader::Limiter::new(1);
    let (a, b) = (
        Offloader::builder().build().unwrap(),
        Offloader::builder().build().unwrap(),
    );
    let (g, hold) = gate();
    let (tx, mut started) = signal();
    let mut on_b = b
        .offload(move |_| {
            tx.send(()).unwrap();
            hold.wait();
        })
        .limiter(&l)
        .spawn()
        .unwrap();
    let waker = Waker::from(Arc::new(SlowWaker));
    assert!(
        std::future::Future::poll(Pin::new(&mut on_b), &mut Context::from_waker(&waker))
            .is_pending()
    );
    recv("b's function", &mut started).await;
    let caller = tokio::spawn(
        a.offload(|_| 7u32)
            .limiter(&l)
            .with_timeout(Duration::from_secs(10))
            .into_future(),
    );
    within_real("a's job waits for the limiter", async {
        while l.stats().waiting == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    g.open();
    let out = within_real("a's caller", caller).await.unwrap();
    assert_eq!(out.map_err(|e| e.to_string()), Ok(7));
    drop(on_b);
}

/// An idle pool nobody shuts down waits for a caller, not for work of its
/// own: a timed wait for its termination lets the paused clock move and
/// times out in virtual time, for a pool that ran a job, one that never
/// did, and the global pool (which never shuts down). Each hung for good
/// when an idle pool held the clock (found by a hostile review). After a
/// shutdown the same wait holds the clock until the threads are joined.
#[tokio::test(start_paused = true)]
async fn a_wait_for_the_termination_of_an_open_idle_pool_lets_the_clock_move() {
    let _serial = SERIAL.lock().await;
    let used = Offloader::builder().max_in_flight(2).build().unwrap();
    used.offload(work(1)).await.unwrap();
    let never_used = Offloader::builder().build().unwrap();
    for (what, pool) in [
        ("a pool that ran a job", &used),
        ("a pool that never ran one", &never_used),
        ("the global pool", Offloader::global()),
    ] {
        let began = tokio::time::Instant::now();
        let terminated = within_real(what, pool.await_termination(Duration::from_secs(1))).await;
        assert!(!terminated, "{what}: open, not terminated");
        assert!(
            began.elapsed() >= Duration::from_secs(1),
            "{what}: timed out in virtual time"
        );
        let waited = within_real(
            what,
            tokio::time::timeout(Duration::from_secs(1), pool.terminated()),
        )
        .await;
        assert!(waited.is_err(), "{what}: terminated() is still pending");
    }
    used.shutdown();
    assert!(
        within_real(
            "after shutdown",
            used.await_termination(Duration::from_secs(5))
        )
        .await,
        "shut down: terminated within 5 s of virtual time"
    );
}

/// Found by a hostile review: under a paused clock on a runtime with one
/// blocking thread, the clock hold of a wait for termination took that
/// thread, and the join of the pool's retired threads, queued on tokio's
/// blocking pool behind it, never ran: `close` hung for good. The join now
/// runs on a thread of its own.
#[test]
fn close_terminates_under_a_paused_clock_with_one_blocking_thread() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .max_blocking_threads(1)
        .build()
        .unwrap();
    rt.block_on(async {
        let _serial = SERIAL.lock().await;
        let pool = Offloader::builder().max_in_flight(2).build().unwrap();
        pool.offload(work(1)).spawn().unwrap().detach();
        let report = within_real(
            "close",
            pool.close(Duration::from_secs(10), Duration::from_secs(1)),
        )
        .await;
        assert!(report.terminated, "{report:?}");
    });
}
