//! The memory of a long `map` (issue 13): its own binary, so that the
//! process's resident size is this test's alone.

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
/// job), and one poll submits at most a budget of jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_map_keeps_its_memory() {
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
    assert!(grown < 16 * 1024, "RSS grew by {grown} KiB over 400k items");
}
