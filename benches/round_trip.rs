#![allow(missing_docs)] // criterion_group! generates undocumented items
//! Round-trip latency of a no-op job: offloader vs tokio's blocking pool.
//!
//! `cargo bench --bench round_trip`. The full comparison against every peer
//! lives in `examples/compare.rs`.

use criterion::{criterion_group, criterion_main, Criterion};

fn round_trip(c: &mut Criterion) {
    // The runtime users get by default (one worker per core).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let pool = offloader::Offloader::builder()
        .max_in_flight(2)
        .build()
        .expect("pool");
    let mut group = c.benchmark_group("round_trip_noop");
    group.bench_function("offloader", |b| {
        b.to_async(&rt)
            .iter(|| async { pool.offload(|_stop| 1u64).await.expect("ran") })
    });
    group.bench_function("spawn_blocking", |b| {
        b.to_async(&rt)
            .iter(|| async { tokio::task::spawn_blocking(|| 1u64).await.expect("ran") })
    });
    group.finish();
}

criterion_group!(benches, round_trip);
criterion_main!(benches);
