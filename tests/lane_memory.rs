//! Memory follows the keys in use (issue 12, L3): after a burst of a
//! hundred thousand keys has run, the pool gives back what its lanes took,
//! measured by a counting allocator (found by a hostile review: the lane
//! slab and the key index stayed at their peak).

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use support::*;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: defers to the system allocator; only counts the bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is System's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_keys_gives_its_memory_back() {
    const KEYS: u64 = 100_000;
    let pool = pool(2, 2 * KEYS as usize);
    within("a warm-up job", pool.offload(|_| ()).key("warm-up"))
        .await
        .unwrap();
    let before = LIVE.load(Ordering::SeqCst);
    let occupied = occupy(&pool, 2).await;
    let handles: Vec<_> = (0..KEYS)
        .map(|k| pool.offload(|_| ()).key(k).spawn().unwrap())
        .collect();
    let peak = LIVE.load(Ordering::SeqCst) - before;
    occupied.release().await;
    for h in handles {
        within("every job", h).await.unwrap();
    }
    pool.idle().await;
    assert!(pool.key_stats(1).is_empty());
    let left = LIVE.load(Ordering::SeqCst) - before;
    println!("{KEYS} keys: {peak} bytes at the peak, {left} left after");
    assert!(
        left < peak / 20,
        "{left} bytes left of {peak} at the peak: the lanes kept their memory"
    );
}
