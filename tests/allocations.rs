//! What a job costs the submitting thread in allocations (issue 11): one,
//! whatever it carries. A job with a limiter, a deadline, a key or a name
//! keeps those parts in its own allocation (a second one per job, and a
//! third for the limiter list, cost the limited batch half its speed), and
//! the first limiter needs no list. Counted by an allocator that counts the
//! calls made on the thread that asks for them.

mod support;

use std::future::{Future, IntoFuture};
use std::time::{Duration, Instant};

use support::*;

support::counting_allocator!();
use counted::allocations_of;

const JOBS: usize = 2_000;

/// Spawns `JOBS` jobs made by `make` behind a held permit (so that they
/// stay queued and no worker runs meanwhile) and returns the allocations
/// per job on the submitting thread; then lets them all run.
async fn per_job<F>(make: F) -> f64
where
    F: Fn(
        &offloader::Offloader,
    ) -> offloader::Offload<Box<dyn FnOnce(&offloader::StopToken) + Send>, ()>,
{
    let pool = pool(1, 2 * JOBS);
    // Warm up every lazily built part (the pool's threads, lanes, slab).
    within("a warm-up job", make(&pool)).await.unwrap();
    let occupied = occupy(&pool, 1).await;
    let mut handles = Vec::with_capacity(JOBS);
    let ((), made) = allocations_of(|| {
        for _ in 0..JOBS {
            handles.push(make(&pool).spawn().expect("room"));
        }
    });
    occupied.release().await;
    for h in handles {
        within("every job", h).await.unwrap();
    }
    made as f64 / JOBS as f64
}

/// A function that captures nothing: its box allocates nothing.
fn noop() -> Box<dyn FnOnce(&offloader::StopToken) + Send> {
    Box::new(|_| ())
}

/// Room for the pool's structures growing as the queue does (amortised).
const GROWTH: f64 = 0.05;

/// `per` is `n` allocations per job, give or take the growth (and at
/// least `n`: the counter sees the job's own).
fn assert_about(per: f64, n: f64, what: &str) {
    assert!(
        per >= n && per <= n + GROWTH,
        "{per} allocations per {what}, expected {n}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_plain_job_is_one_allocation() {
    let per = per_job(|p| p.offload(noop())).await;
    assert_about(per, 1.0, "plain job");
}

#[tokio::test(flavor = "current_thread")]
async fn a_job_with_one_limiter_is_one_allocation() {
    let limiter = offloader::Limiter::new(1 << 20);
    let per = per_job(|p| p.offload(noop()).limiter(&limiter)).await;
    assert_about(per, 1.0, "job with a limiter");
}

#[tokio::test(flavor = "current_thread")]
async fn a_job_with_a_deadline_and_a_key_is_one_allocation() {
    let at = Instant::now() + Duration::from_secs(3600);
    let per = per_job(|p| p.offload(noop()).deadline(at).key(7u64)).await;
    assert_about(per, 1.0, "job with a deadline and a key");
}

/// Two limiters need their list, and the lane their ids: two allocations
/// more (four before the job kept its parts).
#[tokio::test(flavor = "current_thread")]
async fn a_job_with_two_limiters_is_three_allocations() {
    let (a, b) = (
        offloader::Limiter::new(1 << 20),
        offloader::Limiter::new(1 << 20),
    );
    let per = per_job(|p| p.offload(noop()).limiter(&a).limiter(&b)).await;
    assert_about(per, 3.0, "job with two limiters");
}

/// `offload(f).with_timeout(d).await`, the usual call: the job is the only
/// allocation of the caller's polls (the awaiting future keeps its timer
/// inline; the owner handle inside it got a boxed timer of its own, at
/// once dropped, and an await that found its job running boxed a check for
/// a paused test clock). Each job waits on a gate until its caller's
/// first poll has returned `Pending`, so every await takes the waiting
/// path.
#[tokio::test(flavor = "current_thread")]
async fn an_awaited_job_with_a_timeout_is_one_allocation() {
    let pool = pool(1, 16);
    let limit = Duration::from_secs(3600);
    within("a warm-up job", pool.offload(noop()).with_timeout(limit))
        .await
        .unwrap();
    let mut made = 0;
    for _ in 0..JOBS {
        // The test's own allocations (the gate, the boxed function) first.
        let (open, gate) = std::sync::mpsc::sync_channel::<()>(1);
        let f: Box<dyn FnOnce(&offloader::StopToken) + Send> = Box::new(move |_| {
            let _ = gate.recv();
        });
        let mut fut = std::pin::pin!(pool.offload(f).with_timeout(limit).into_future());
        let mut first = true;
        let out = std::future::poll_fn(|cx| {
            let (poll, n) = allocations_of(|| fut.as_mut().poll(cx));
            made += n;
            if std::mem::take(&mut first) {
                assert!(poll.is_pending(), "the job waits on its gate");
                open.send(()).expect("the job holds the gate");
            }
            poll
        })
        .await;
        out.unwrap();
    }
    assert_about(made as f64 / JOBS as f64, 1.0, "awaited job with a timeout");
}

/// The same when the await first waits for room in a full queue: a timeout
/// costs no allocation there either (the handle the wait for room returned
/// kept a boxed timer of its own, found by a hostile review).
#[tokio::test(flavor = "current_thread")]
async fn waiting_for_room_a_timeout_costs_no_allocation() {
    async fn polls_allocate(limit: Option<Duration>) -> u64 {
        let pool = pool(1, 1);
        let occupied = occupy(&pool, 1).await;
        let queued = pool.offload(noop()).spawn().expect("room for one");
        let call = pool.offload(noop());
        let call = match limit {
            Some(limit) => call.with_timeout(limit),
            None => call,
        };
        let mut fut = std::pin::pin!(call.into_future());
        let mut release = Some(occupied);
        let mut made = 0;
        std::future::poll_fn(|cx| {
            let (poll, n) = allocations_of(|| fut.as_mut().poll(cx));
            made += n;
            if let Some(occupied) = release.take() {
                assert!(poll.is_pending(), "the queue is full: it waits for room");
                // Released outside the count; the blocker returns on its
                // own thread.
                drop(occupied.gate);
            }
            poll
        })
        .await
        .unwrap();
        within("the queued job", queued).await.unwrap();
        made
    }
    // The fewest of a few rounds each: a round whose wait for room is woken
    // once more than needed (how the blocker's thread and this one are
    // scheduled) allocates once more, timed or not (seen on a loaded CI
    // machine, in either variant).
    let mut untimed = u64::MAX;
    let mut timed = u64::MAX;
    for _ in 0..5 {
        untimed = untimed.min(polls_allocate(None).await);
        timed = timed.min(polls_allocate(Some(Duration::from_secs(3600))).await);
    }
    assert_eq!(timed, untimed, "allocations of the caller's polls");
}
