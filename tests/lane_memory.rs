//! Memory follows the keys in use (issue 12, L3): after a burst of a
//! hundred thousand keys has run, the pool gives back what its lanes took,
//! measured by a counting allocator (found by a hostile review: the lane
//! slab and the key index stayed at their peak). Cancelled jobs left in a
//! lane as tombstones are let go of too, measured as the process's
//! resident size. One test measures at a time.

mod support;

use support::*;

support::counting_allocator!();

/// The count is the process's: one test measures at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_keys_gives_its_memory_back() {
    const KEYS: u64 = 100_000;
    let _alone = ONE_AT_A_TIME.lock().await;
    let pool = pool(2, 2 * KEYS as usize);
    within("a warm-up job", pool.offload(|_| ()).key("warm-up"))
        .await
        .unwrap();
    let before = counted::live_bytes();
    let occupied = occupy(&pool, 2).await;
    let handles: Vec<_> = (0..KEYS)
        .map(|k| pool.offload(|_| ()).key(k).spawn().unwrap())
        .collect();
    let peak = counted::live_bytes() - before;
    occupied.release().await;
    for h in handles {
        within("every job", h).await.unwrap();
    }
    pool.idle().await;
    assert!(pool.key_stats(1).is_empty());
    let left = counted::live_bytes() - before;
    println!("{KEYS} keys: {peak} bytes at the peak, {left} left after");
    assert!(
        left < peak / 20,
        "{left} bytes left of {peak} at the peak: the lanes kept their memory"
    );
}

/// A pool lets go of a limiter it waited for once no lane waits for it:
/// thousands of short-lived limiters, each blocking a job that is then
/// cancelled, leave nothing behind (found by a hostile review: the pool
/// kept every such limiter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limiters_nobody_waits_for_are_let_go() {
    const ROUNDS: usize = 5_000;
    let _alone = ONE_AT_A_TIME.lock().await;
    let pool = pool(1, 16);
    let round = |pool: &offloader::Offloader| {
        let l = offloader::Limiter::new(0);
        let job = pool.offload(|_| ()).limiter(&l).spawn().unwrap();
        (l, job)
    };
    for _ in 0..10 {
        let (_l, job) = round(&pool);
        within("a start that blocks the lane", pool.offload(|_| ()))
            .await
            .unwrap();
        assert!(job.cancel());
    }
    let before = counted::live_bytes();
    for _ in 0..ROUNDS {
        let (_l, job) = round(&pool);
        within("a start that blocks the lane", pool.offload(|_| ()))
            .await
            .unwrap();
        assert!(job.cancel());
    }
    let grew = counted::live_bytes() - before;
    println!("{ROUNDS} limiters waited for and cancelled: {grew} bytes kept");
    assert!(
        grew < 64 * 1024,
        "{grew} bytes kept for {ROUNDS} gone limiters"
    );
}

/// Keys that come and go one at a time while another key's job runs (so
/// the lane slab is never left to the default lane alone, which would give
/// all of it back) keep only the few lanes emptied last (L3): 20 000 keys
/// leave no lane behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_come_and_go_keep_only_a_few_idle_lanes() {
    const KEYS: usize = 20_000;
    let _alone = ONE_AT_A_TIME.lock().await;
    let pool = pool(2, 16);
    let (gate, hold) = gate();
    let held = pool
        .offload(move |_| hold.wait())
        .key("held")
        .spawn()
        .unwrap();
    for k in 0..100 {
        let key = format!("warm-up key {k}");
        within("a keyed job", pool.offload(|_| ()).key(key))
            .await
            .unwrap();
    }
    let before = counted::live_bytes();
    for k in 0..KEYS {
        let key = format!("a key that comes once, number {k}");
        within("a keyed job", pool.offload(|_| ()).key(key))
            .await
            .unwrap();
    }
    let grew = counted::live_bytes().saturating_sub(before);
    println!("{KEYS} keys one at a time: {grew} bytes kept");
    assert!(grew < 64 * 1024, "{grew} bytes kept for {KEYS} keys gone");
    gate.open();
    within("the held job", held).await.unwrap();
}

/// Cancelled jobs left in the queue as tombstones are let go of once they
/// outnumber the queued jobs, even while the queue's head cannot start: a
/// producer that keeps cancelling behind a held permit and a waiting job
/// keeps bounded memory, measured as the process's resident size.
#[test]
fn tombstones_are_let_go_of_behind_a_held_permit() {
    // Rounds of two cancels.
    const ROUNDS: usize = 200_000;
    // RSS may grow this much over those rounds; the tombstones of every
    // round, kept, would take several times more.
    const SLACK_KIB: u64 = 16 * 1024;
    let _alone = ONE_AT_A_TIME.blocking_lock();
    let pool = pool(1, 4);
    let (gate, hold) = gate();
    let (tx, mut started) = signal();
    let mut blocker = pool
        .offload(move |_| {
            tx.send(()).unwrap();
            hold.wait();
        })
        .spawn()
        .unwrap();
    recv_blocking("the blocker started", &mut started);
    // Never starts while the blocker runs: at least one queued job.
    let mut head = pool.offload(|_| "head").spawn().unwrap();
    let round = || {
        let a = pool.offload(|_| "a").name("tombstone").spawn().unwrap();
        let b = pool.offload(|_| "b").name("tombstone").spawn().unwrap();
        assert!(a.cancel() && b.cancel());
    };
    // Warm-up: the job slab's and the allocator's high-water marks.
    (0..1_000).for_each(|_| round());
    let rss_start = status_kib("VmRSS:");
    (0..ROUNDS).for_each(|_| round());
    let rss_end = status_kib("VmRSS:");
    let m = pool.metrics();
    assert_eq!((m.queued, m.running), (1, 1), "{m:?}");
    assert_eq!(m.cancelled, 2 * (1_000 + ROUNDS) as u64, "{m:?}");
    assert!(
        rss_end <= rss_start + SLACK_KIB,
        "RSS grew from {rss_start} KiB to {rss_end} KiB over {ROUNDS} rounds"
    );
    gate.open();
    blocker.blocking_wait(None).unwrap();
    assert_eq!(head.blocking_wait(None).unwrap(), "head");
}
