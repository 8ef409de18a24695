//! Memory follows the keys in use (issue 12, L3): after a burst of a
//! hundred thousand keys has run, the pool gives back what its lanes took,
//! measured by a counting allocator (found by a hostile review: the lane
//! slab and the key index stayed at their peak).

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
