//! The criterion groups of `benches/compare.rs` and `benches/compare_l64.rs`.
//!
//! Every measurement runs as a task on the shared driver runtime (as
//! application code would), timed with `iter_custom`. Sample sizes and times
//! are kept modest: the long batches use flat sampling with 10 samples.
//!
//! Included with `#[path]` by each bench; not every bench uses every group.
#![allow(dead_code)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, SamplingMode, Throughput};

use crate::common::{Built, Calibration, System};

/// Jobs in one throughput batch.
pub(crate) const THROUGHPUT_JOBS: usize = 100_000;
/// Jobs in one efficiency batch.
pub(crate) const EFFICIENCY_JOBS: usize = 10_000;

type Peers = [(System, Built)];

fn on_runtime<T: Send + 'static>(
    rt: &tokio::runtime::Runtime,
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    rt.block_on(rt.spawn(fut)).expect("measurement task")
}

fn long_batches(g: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    g.sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
}

/// Sequential round trip of one no-op job.
pub(crate) fn latency(c: &mut Criterion, rt: &tokio::runtime::Runtime, peers: &Peers) {
    let mut g = c.benchmark_group("latency_noop");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for (system, built) in peers {
        g.bench_function(system.name(), |b| {
            b.iter_custom(|iters| {
                let peer = built.peer.clone();
                on_runtime(rt, async move {
                    let t = Instant::now();
                    for _ in 0..iters {
                        black_box(peer.round_trip(0).await);
                    }
                    t.elapsed()
                })
            })
        });
    }
    g.finish();
}

/// 100 000 no-op jobs submitted at once, then all awaited.
pub(crate) fn throughput(
    c: &mut Criterion,
    rt: &tokio::runtime::Runtime,
    peers: &Peers,
    limit: usize,
) {
    let mut g = c.benchmark_group(format!("throughput_l{limit}"));
    long_batches(&mut g);
    g.throughput(Throughput::Elements(THROUGHPUT_JOBS as u64));
    for (system, built) in peers {
        g.bench_function(system.name(), |b| {
            b.iter_custom(|iters| {
                let peer = built.peer.clone();
                on_runtime(rt, async move {
                    let t = Instant::now();
                    for _ in 0..iters {
                        black_box(peer.batch(THROUGHPUT_JOBS, 0).await);
                    }
                    t.elapsed()
                })
            })
        });
    }
    g.finish();
}

/// 10 000 jobs of ~50 µs of CPU work submitted at once, then all awaited.
/// Efficiency = the printed ideal time / criterion's time.
pub(crate) fn efficiency(
    c: &mut Criterion,
    rt: &tokio::runtime::Runtime,
    peers: &Peers,
    limit: usize,
    cal: Calibration,
) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let parallel = limit.min(cores).max(1);
    let ideal = cal.job * EFFICIENCY_JOBS as u32 / parallel as u32;
    eprintln!(
        "efficiency_l{limit}: {EFFICIENCY_JOBS} jobs of {:.1} µs ({} iterations); \
         ideal time on {parallel} cores = {:.1} ms; efficiency = ideal / time",
        cal.job.as_secs_f64() * 1e6,
        cal.iters,
        ideal.as_secs_f64() * 1e3
    );
    let mut g = c.benchmark_group(format!("efficiency_l{limit}"));
    long_batches(&mut g);
    g.throughput(Throughput::Elements(EFFICIENCY_JOBS as u64));
    for (system, built) in peers {
        g.bench_function(system.name(), |b| {
            b.iter_custom(|iters| {
                let peer = built.peer.clone();
                let work = cal.iters;
                on_runtime(rt, async move {
                    let t = Instant::now();
                    for _ in 0..iters {
                        black_box(peer.batch(EFFICIENCY_JOBS, work).await);
                    }
                    t.elapsed()
                })
            })
        });
    }
    g.finish();
}
