#![allow(missing_docs)] // criterion's API items need no docs here
//! `offloader` against its peers under criterion, limit 2: round-trip
//! latency of a no-op job, throughput of 100 000 no-op jobs, and efficiency
//! on 10 000 jobs of ~50 µs of CPU work.
//!
//! `cargo bench --bench compare` (and `--bench compare_l64` for throughput
//! at limit 64). The peers, shared with `examples/compare.rs`, are
//! `tokio::task::spawn_blocking` (default pool), `Semaphore` +
//! `spawn_blocking` with the owned permit moved into the closure, a runtime
//! built with `max_blocking_threads(limit)`, and `blocking::unblock`.
//!
//! `blocking` sizes its pool from `BLOCKING_MAX_THREADS` once per process,
//! so each limit is its own bench binary that sets it before anything runs.
//! For one interleaved run of every measurement (less sensitive to machine
//! drift than these sequential groups), use
//! `cargo run --release --example compare`.

mod common;
#[path = "common/groups.rs"]
mod groups;

use std::time::Duration;

use common::{Peer, BLOCKING_MAX_THREADS, SYSTEMS};

const LIMIT: usize = 2;

fn main() {
    // Before any thread exists and before `blocking` starts its pool.
    std::env::set_var(BLOCKING_MAX_THREADS, LIMIT.to_string());
    let cal = common::calibrate(Duration::from_micros(50));
    let rt = common::driver_runtime();
    let peers: Vec<_> = SYSTEMS.map(|s| (s, Peer::build(s, LIMIT))).into();
    let mut c = criterion::Criterion::default().configure_from_args();
    groups::latency(&mut c, &rt, &peers);
    groups::throughput(&mut c, &rt, &peers, LIMIT);
    groups::efficiency(&mut c, &rt, &peers, LIMIT, cal);
    c.final_summary();
    // Outside any async context: a peer may own a runtime.
    drop(peers);
}
