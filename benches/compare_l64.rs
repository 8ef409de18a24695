#![allow(missing_docs)] // criterion's API items need no docs here
//! `offloader` against its peers under criterion: throughput of 100 000
//! no-op jobs at limit 64. The limit-2 groups are in `benches/compare.rs`;
//! this is a separate binary because `blocking` reads
//! `BLOCKING_MAX_THREADS` once per process.
//!
//! `cargo bench --bench compare_l64`.

mod common;
#[path = "common/groups.rs"]
mod groups;

use common::{Peer, BLOCKING_MAX_THREADS, SYSTEMS};

const LIMIT: usize = 64;

fn main() {
    // Before any thread exists and before `blocking` starts its pool.
    std::env::set_var(BLOCKING_MAX_THREADS, LIMIT.to_string());
    let rt = common::driver_runtime();
    let peers: Vec<_> = SYSTEMS.map(|s| (s, Peer::build(s, LIMIT))).into();
    let mut c = criterion::Criterion::default().configure_from_args();
    groups::throughput(&mut c, &rt, &peers, LIMIT);
    c.final_summary();
    // Outside any async context: a peer may own a runtime.
    drop(peers);
}
