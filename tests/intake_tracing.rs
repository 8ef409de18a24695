//! A tracing subscriber is foreign code. The intake's "accepted" line runs
//! after the job is in the intake (ARCHITECTURE.md "The intake"): a
//! subscriber that calls into the pool there, or panics, must not stop a
//! shutdown or leave a place in the queue bound reserved for good
//! (regressions from a hostile review). And a subscriber that panics on a
//! worker thread must not kill the worker.
//!
//! Its own test binary: it installs a process-wide subscriber (a
//! thread's own subscriber misses events whose call sites another thread
//! cached as uninteresting), armed for one thread at a time.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::ThreadId;

use offloader::Offloader;
use support::*;

/// A thread, by id or (a pool's) by name.
#[derive(PartialEq)]
enum Who {
    Id(ThreadId),
    Named(&'static str),
}

impl Who {
    fn is_current(&self) -> bool {
        let me = std::thread::current();
        match self {
            Who::Id(id) => *id == me.id(),
            Who::Named(name) => me.name() == Some(name),
        }
    }
}

type Armed = Mutex<Vec<(Who, Box<dyn FnOnce() + Send>)>>;

/// What to run at the next event of a thread, per thread (the process-wide
/// subscriber runs it).
fn armed() -> &'static Armed {
    static ARMED: OnceLock<Armed> = OnceLock::new();
    ARMED.get_or_init(|| {
        tracing::subscriber::set_global_default(OnEvents(|_: &tracing::Event<'_>| {
            let hook = {
                let mut armed = armed()
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let at = armed.iter().position(|(who, _)| who.is_current());
                at.map(|i| armed.swap_remove(i).1)
            };
            if let Some(hook) = hook {
                hook();
            }
        }))
        .expect("the only subscriber");
        Mutex::new(Vec::new())
    })
}

/// Offers a plain job from a thread of its own that runs `on_event` at the
/// job's "accepted" line (its first event); returns the thread.
fn offer_traced(
    pool: &Offloader,
    ran: &Arc<AtomicUsize>,
    on_event: impl FnOnce() + Send + 'static,
) -> std::thread::JoinHandle<std::thread::Result<bool>> {
    let (pool, ran) = (pool.clone(), ran.clone());
    let armed = armed();
    std::thread::spawn(move || {
        armed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((Who::Id(std::thread::current().id()), Box::new(on_event)));
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.offload(move |_stop| {
                ran.fetch_add(1, Ordering::SeqCst);
            })
            .spawn()
            .is_ok()
        }))
    })
}

/// Regression (hostile review): the "accepted" line ran between the job's
/// reservation and its push, while a shutdown waited for that push under
/// the pool lock; a subscriber calling into the pool there deadlocked.
#[test]
fn a_subscriber_calling_into_the_pool_at_accepted_races_a_shutdown() {
    let pool = pool(1, 16);
    warm(&pool);
    let ran = Arc::new(AtomicUsize::new(0));
    let (at_event, in_event) = std::sync::mpsc::channel();
    let watched = pool.clone();
    let submitter = offer_traced(&pool, &ran, move || {
        let _ = at_event.send(());
        // Until the shutdown that runs meanwhile is seen (bounded).
        let until = std::time::Instant::now() + HANG;
        while !watched.is_shutdown() && std::time::Instant::now() < until {
            std::thread::yield_now();
        }
    });
    in_event.recv_timeout(HANG).expect("the subscriber's event");
    within_blocking("a shutdown while a subscriber is at \"accepted\"", {
        let pool = pool.clone();
        move || pool.shutdown()
    });
    let accepted = submitter.join().expect("the submitter").expect("no panic");
    assert!(accepted, "accepted before the shutdown");
    assert!(within_blocking("termination", {
        let pool = pool.clone();
        move || pool.blocking_await_termination(None)
    }));
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_ledger(&pool.metrics());
}

/// Regression (hostile review): a subscriber panicking at "accepted" left
/// the job's reserved place unfilled for good (the next offer found the
/// queue full, and shutdown waited forever). The job is accepted, and runs.
#[test]
fn a_subscriber_panicking_at_accepted_loses_no_job_and_no_room() {
    quiet_deliberate_panics();
    let pool = pool(1, 1);
    warm(&pool);
    let ran = Arc::new(AtomicUsize::new(0));
    let submitter = offer_traced(&pool, &ran, || panic!("{ON_PURPOSE}"));
    assert!(
        submitter.join().expect("the submitter").is_err(),
        "the panic reached the caller"
    );
    // On a helper thread that owns the pool: if a place were left reserved
    // for good, the next offer or the shutdown would wait for it, and only
    // that thread would hang (the test fails by its bound).
    let m = within_blocking("the next job, shutdown and termination", move || {
        let mut next = pool
            .offload(|_stop| 5)
            .spawn()
            .expect("room for the next job");
        assert_eq!(next.blocking_wait(None).ok(), Some(5));
        pool.shutdown();
        assert!(pool.blocking_await_termination(None));
        pool.metrics()
    });
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "the job accepted before the panic ran"
    );
    assert_ledger(&m);
    assert_eq!((m.accepted, m.completed), (3, 3));
}

/// The locked path's order: a job of a group takes the pool lock, claims
/// the parked worker, and unparks it after unlocking; a subscriber that
/// panicked at its "accepted" line, logged before that unpark, left the
/// worker parked until its keep-alive (here a minute) with the job queued.
#[test]
fn a_subscriber_panicking_at_accepted_leaves_no_claimed_worker_parked() {
    quiet_deliberate_panics();
    let pool = builder(1, 16)
        .thread_name("trc-park")
        .keep_alive(std::time::Duration::from_secs(60))
        .build()
        .expect("valid");
    warm(&pool);
    eventually_blocking("the worker parked", || {
        sleeping_threads_named("trc-park") == 1
    });
    let group = pool.group();
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    let submitter = std::thread::spawn(move || {
        armed()
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((
                Who::Id(std::thread::current().id()),
                Box::new(|| panic!("{ON_PURPOSE}")),
            ));
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            group
                .offload(move |_stop| {
                    r.fetch_add(1, Ordering::SeqCst);
                })
                .spawn()
                .map(offloader::JobHandle::detach)
        }))
        .is_err()
    });
    assert!(
        submitter.join().expect("the submitter"),
        "the panic reached the caller"
    );
    eventually_blocking("the group's job ran", || ran.load(Ordering::SeqCst) == 1);
    assert_ledger(&pool.metrics());
}

/// A subscriber that panics at a worker's log line (the job's "started")
/// leaves the worker running: the job runs, its permit comes back, and the
/// next job runs on the same worker. It killed the worker, the job never
/// finished and the pool took no job again.
#[test]
fn a_subscriber_panicking_on_a_worker_leaves_the_worker_running() {
    quiet_deliberate_panics();
    let pool = builder(1, 16)
        .thread_name("trc-wpanic")
        .build()
        .expect("valid");
    warm(&pool);
    armed()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push((
            Who::Named("trc-wpanic"),
            Box::new(|| panic!("{ON_PURPOSE}")),
        ));
    let m = within_blocking(
        "a job whose start log line panics, then the next one",
        move || {
            let mut job = pool.offload(|_stop| 1).spawn().expect("room");
            assert_eq!(job.blocking_wait(None).ok(), Some(1));
            let mut next = pool.offload(|_stop| 2).spawn().expect("room");
            assert_eq!(next.blocking_wait(None).ok(), Some(2));
            pool.metrics()
        },
    );
    assert_ledger(&m);
    assert_eq!((m.completed, m.running, m.workers), (3, 0, 1));
}
