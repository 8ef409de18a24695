//! Memory bounds of issue 13's long-lived parts (and of races that come and
//! go), measured as the process's
//! resident size: its own binary, one test, so that the size is this test's
//! alone.

mod support;

use std::future::poll_fn;
use std::pin::{pin, Pin};

use futures_core::Stream;
use support::*;

/// The next item of a stream, within [`HANG`].
async fn next<S: Stream>(mut s: Pin<&mut S>) -> Option<S::Item> {
    within("the next item", poll_fn(|cx| s.as_mut().poll_next(cx))).await
}

/// The ready set's memory follows the jobs in flight: a long unordered map
/// polls only current futures (a late wake-up of a finished job's future
/// used to poll the future that took its slot, leaving a stale entry per
/// job). And a group's record goes with its last handle: 300 000 groups
/// (and children), each with a job, created and dropped, leave the pool's
/// state as it was (a record kept per group grew it by tens of MB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_maps_and_many_groups_keep_their_memory() {
    let pool = pool(4, 64);
    let before = status_kib("VmRSS");
    let mut s = pin!(pool
        .map(0..400_000u64, |i, _| Ok::<_, ()>(i))
        .limit(8)
        .unordered());
    let mut n = 0u64;
    while let Some(o) = next(s.as_mut()).await {
        o.unwrap();
        n += 1;
    }
    assert_eq!(n, 400_000);
    let grown = status_kib("VmRSS").saturating_sub(before);
    assert!(
        grown < 16 * 1024,
        "RSS grew by {grown} KiB over 400k map items"
    );

    let before = status_kib("VmRSS");
    for i in 0..150_000u64 {
        let parent = pool.group();
        let child = parent.child();
        assert_eq!(within("a job", child.offload(move |_| i)).await.unwrap(), i);
    }
    let grown = status_kib("VmRSS").saturating_sub(before);
    assert!(
        grown < 16 * 1024,
        "RSS grew by {grown} KiB over 300k groups"
    );

    // A race's set of futures goes with it, wake-ups of its losers queued
    // or not (they kept it, and the racing task's waker, in a cycle: 150 to
    // 280 bytes per race, found by a hostile review).
    let before = status_kib("VmRSS");
    for _ in 0..100_000 {
        let fs: Vec<_> = (0..3)
            .map(|j| move |_: &offloader::StopToken| if j == 1 { Ok(j) } else { Err(j) })
            .collect();
        let won = within("a race", pool.invoke_any(fs)).await;
        assert!(won.is_ok() || won.is_err_and(|e| e.errors.len() == 3));
    }
    within("idle", pool.idle()).await;
    let grown = status_kib("VmRSS").saturating_sub(before);
    assert!(grown < 8 * 1024, "RSS grew by {grown} KiB over 100k races");
}
