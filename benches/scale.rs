#![allow(missing_docs)] // criterion's API items need no docs here
//! How the offloader's queue operations scale with the queue's length, under
//! criterion, for local profiling: `submit`, `cancel_newest_first`,
//! `cancel_random`, `timeout_storm` and `shutdown_now` on a queue of 1 000
//! and of 65 536 jobs behind a single blocked permit (see
//! `benches/common/scale.rs`). Throughput is reported per operation, so the
//! two sizes of one group should show the same elements/s.
//!
//! `cargo bench --bench scale` (filter with e.g. `-- cancel_random`). The
//! interleaved run up to 1 000 000 jobs, with a time guard per operation, is
//! the scale section of `cargo run --release --example compare`.

mod common;
#[path = "common/scale.rs"]
mod scale;

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};

use scale::{Meter, SCALE_OPS};

const SIZES: [usize; 2] = [1_000, 65_536];

fn main() {
    let rt = common::driver_runtime();
    let meter = Meter::new();
    let mut c = Criterion::default().configure_from_args();
    for op in SCALE_OPS {
        let mut g = c.benchmark_group(format!("scale_{}", op.name()));
        g.sampling_mode(SamplingMode::Flat)
            .sample_size(10)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(3));
        for n in SIZES {
            g.throughput(Throughput::Elements(n as u64));
            g.bench_with_input(
                BenchmarkId::from_parameter(scale::size_label(n)),
                &n,
                |b, &n| {
                    b.iter_custom(|iters| {
                        let mut total = Duration::ZERO;
                        for i in 0..iters {
                            let m = meter.clone();
                            total += rt
                                .block_on(
                                    rt.spawn(async move { scale::measure(op, n, i, &m).await }),
                                )
                                .expect("scale measurement");
                        }
                        total
                    })
                },
            );
        }
        g.finish();
    }
    c.final_summary();
}
