//! The systems compared by `benches/compare*.rs` and `examples/compare.rs`,
//! and the work they run. Shared so that the criterion benches and the
//! interleaved comparison measure exactly the same code paths.
//!
//! Included with `#[path]` by each target; not every target uses every item.
#![allow(dead_code)]

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use offloader::Offloader;
use tokio::sync::Semaphore;

/// Queue capacity given to the offloader in every measurement: room for a
/// whole throughput batch, so the comparison is about throughput and never
/// about backpressure (a full queue would only make `spawn()` fall back to
/// `submit().await`).
pub(crate) const OFFLOADER_QUEUE_CAPACITY: usize = 200_000;

/// The environment variable the `blocking` crate reads, once per process, for
/// the size of its thread pool.
pub(crate) const BLOCKING_MAX_THREADS: &str = "BLOCKING_MAX_THREADS";

/// One system under comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum System {
    /// `offloader::Offloader` with `max_in_flight(limit)`.
    Offloader,
    /// `tokio::task::spawn_blocking` on the default blocking pool (no limit
    /// but tokio's 512 threads).
    SpawnBlocking,
    /// `Semaphore(limit)` + `spawn_blocking`, the owned permit moved into the
    /// closure: the correct hand-rolled pattern.
    SemaphoreSpawnBlocking,
    /// `spawn_blocking` on a separate runtime built with
    /// `max_blocking_threads(limit)`.
    TokioCapped,
    /// `blocking::unblock`, limited by `BLOCKING_MAX_THREADS=limit`.
    BlockingUnblock,
    /// A reference, not a peer: the least a pool with per-job replies can
    /// do ([`ChannelPool`]). No target is set against it.
    ChannelPool,
}

/// Every system, in the order of the report.
pub(crate) const SYSTEMS: [System; 6] = [
    System::Offloader,
    System::SpawnBlocking,
    System::SemaphoreSpawnBlocking,
    System::TokioCapped,
    System::BlockingUnblock,
    System::ChannelPool,
];

impl System {
    /// The name used in reports and in the JSON output.
    pub(crate) fn name(self) -> &'static str {
        match self {
            System::Offloader => "offloader",
            System::SpawnBlocking => "spawn_blocking",
            System::SemaphoreSpawnBlocking => "semaphore_spawn_blocking",
            System::TokioCapped => "tokio_capped",
            System::BlockingUnblock => "blocking_unblock",
            System::ChannelPool => "channel_pool",
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<System> {
        SYSTEMS.into_iter().find(|s| s.name() == name)
    }
}

/// The tokio runtime that drives a measurement (the async side of an
/// application that offloads its blocking work). Every system in a process
/// gets the same one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Driver {
    /// What users get by default (`#[tokio::main]`): multi-thread, one
    /// worker per core, default blocking pool.
    Default,
    /// Multi-thread with a single worker, default blocking pool.
    OneWorker,
}

/// Both drivers, in the order of the report.
pub(crate) const DRIVERS: [Driver; 2] = [Driver::Default, Driver::OneWorker];

impl Driver {
    /// The name used on child command lines.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Driver::Default => "default",
            Driver::OneWorker => "one_worker",
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<Driver> {
        DRIVERS.into_iter().find(|d| d.name() == name)
    }

    /// Builds the runtime.
    pub(crate) fn runtime(self) -> tokio::runtime::Runtime {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        if self == Driver::OneWorker {
            b.worker_threads(1);
        }
        b.enable_all().build().expect("driver runtime")
    }
}

/// The runtime users get by default, [`Driver::Default`].
pub(crate) fn driver_runtime() -> tokio::runtime::Runtime {
    Driver::Default.runtime()
}

/// A gate that blocked functions wait on until it is opened.
#[derive(Default)]
pub(crate) struct Gate {
    open: std::sync::Mutex<bool>,
    cv: std::sync::Condvar,
}

impl Gate {
    pub(crate) fn wait(&self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        while !*open {
            open = self.cv.wait(open).unwrap_or_else(|e| e.into_inner());
        }
    }

    pub(crate) fn open(&self) {
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }
}

/// The blocking function every job runs: `iters` rounds of a serial
/// xorshift chain (0 for a no-op job). A calibrated loop, not a timed spin:
/// every call does the same work however busy the machine is.
#[inline(never)]
pub(crate) fn work(iters: u64) -> u64 {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..black_box(iters) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x = x.wrapping_add(black_box(i));
    }
    black_box(x)
}

/// The loop calibrated to a target duration on one thread.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Calibration {
    /// Iterations of [`work`] per job.
    pub(crate) iters: u64,
    /// What one job costs on one thread (best of many short trials).
    pub(crate) job: Duration,
}

/// The shortest wall time of `trials` runs of `f`. Each run is short (well
/// under a scheduler time slice), so on a busy machine the best of them is
/// one that nothing interrupted: the work's own cost.
fn best_of(trials: usize, mut f: impl FnMut()) -> Duration {
    (0..trials.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

/// Finds how many iterations of [`work`] take about `target` on one thread.
pub(crate) fn calibrate(target: Duration) -> Calibration {
    let mut iters = 256u64;
    loop {
        let took = best_of(5, || {
            black_box(work(iters));
        });
        if took >= Duration::from_micros(200) || iters >= 1 << 32 {
            iters = scale(iters, target, took);
            break;
        }
        iters *= 2;
    }
    // Refine once against the finer measurement.
    let iters = scale(iters, target, job_cost(iters, 50));
    Calibration {
        iters,
        job: job_cost(iters, 50),
    }
}

fn scale(iters: u64, target: Duration, took: Duration) -> u64 {
    let f = target.as_secs_f64() / took.as_secs_f64().max(1e-9);
    ((iters as f64 * f.clamp(1e-3, 1e3)).round() as u64).max(1)
}

/// The cost of one job of `iters` iterations on one thread: the best of
/// `trials` runs of 10 back-to-back calls (about 0.5 ms for a 50 µs job),
/// so that time the thread spent waiting for a core on a busy machine is
/// left out.
pub(crate) fn job_cost(iters: u64, trials: usize) -> Duration {
    const CALLS: u32 = 10;
    best_of(trials, || {
        for _ in 0..CALLS {
            black_box(work(iters));
        }
    }) / CALLS
}

/// A built system, ready to take jobs. Cheap to clone into tasks.
#[derive(Clone)]
pub(crate) enum Peer {
    Offloader(Offloader),
    SpawnBlocking,
    SemaphoreSpawnBlocking(Arc<Semaphore>),
    TokioCapped(tokio::runtime::Handle),
    BlockingUnblock,
    ChannelPool(Arc<ChannelPool>),
}

/// A [`Peer`] and what must outlive it. Drop it outside any async context
/// (it may own a runtime).
pub(crate) struct Built {
    pub(crate) peer: Peer,
    _capped: Option<tokio::runtime::Runtime>,
}

impl Peer {
    /// Builds `system` limited to `limit` concurrent functions.
    ///
    /// For [`System::BlockingUnblock`] the limit is whatever
    /// `BLOCKING_MAX_THREADS` said when the `blocking` pool first started in
    /// this process; the caller sets it (a warning is printed if it differs).
    /// [`System::SpawnBlocking`] has no limit to set.
    pub(crate) fn build(system: System, limit: usize) -> Built {
        let mut capped = None;
        let peer = match system {
            System::Offloader => Peer::Offloader(
                Offloader::builder()
                    .max_in_flight(limit)
                    .queue_capacity(OFFLOADER_QUEUE_CAPACITY)
                    .build()
                    .expect("offloader configuration"),
            ),
            System::SpawnBlocking => Peer::SpawnBlocking,
            System::SemaphoreSpawnBlocking => {
                Peer::SemaphoreSpawnBlocking(Arc::new(Semaphore::new(limit)))
            }
            System::TokioCapped => {
                // Its own runtime, used only for its blocking pool: a
                // current-thread runtime starts no thread of its own.
                let rt = tokio::runtime::Builder::new_current_thread()
                    .max_blocking_threads(limit)
                    .build()
                    .expect("capped runtime");
                let handle = rt.handle().clone();
                capped = Some(rt);
                Peer::TokioCapped(handle)
            }
            System::BlockingUnblock => {
                let set = std::env::var(BLOCKING_MAX_THREADS).ok();
                if set.as_deref() != Some(limit.to_string().as_str()) {
                    eprintln!(
                        "warning: blocking_unblock measured with {BLOCKING_MAX_THREADS}={set:?}, \
                         not {limit}"
                    );
                }
                Peer::BlockingUnblock
            }
            System::ChannelPool => Peer::ChannelPool(Arc::new(ChannelPool::new(limit))),
        };
        Built {
            peer,
            _capped: capped,
        }
    }

    /// Runs one job of `iters` iterations and waits for it.
    pub(crate) async fn round_trip(&self, iters: u64) -> u64 {
        match self {
            Peer::Offloader(pool) => pool
                .offload(move |_stop| work(iters))
                .await
                .expect("offloader job"),
            Peer::SpawnBlocking => tokio::task::spawn_blocking(move || work(iters))
                .await
                .expect("spawn_blocking job"),
            Peer::SemaphoreSpawnBlocking(sem) => {
                let permit = sem.clone().acquire_owned().await.expect("semaphore open");
                tokio::task::spawn_blocking(move || {
                    let _permit = permit;
                    work(iters)
                })
                .await
                .expect("spawn_blocking job")
            }
            Peer::TokioCapped(rt) => rt
                .spawn_blocking(move || work(iters))
                .await
                .expect("capped spawn_blocking job"),
            Peer::BlockingUnblock => blocking::unblock(move || work(iters)).await,
            Peer::ChannelPool(pool) => pool.call(move || work(iters)).await,
        }
    }

    /// Submits `n` jobs of `iters` iterations at once, then waits for all
    /// of them. Returns a checksum (so that nothing is optimized away) and
    /// how long submitting took.
    pub(crate) async fn batch(&self, n: usize, iters: u64) -> (u64, Duration) {
        let mut sum = 0u64;
        let began = Instant::now();
        let submitted;
        match self {
            Peer::Offloader(pool) => {
                (sum, submitted) = offloader_batch(pool, n, iters, None, None).await;
            }
            Peer::SpawnBlocking => {
                let jobs: Vec<_> = (0..n)
                    .map(|_| tokio::task::spawn_blocking(move || work(iters)))
                    .collect();
                submitted = began.elapsed();
                for job in jobs {
                    sum = sum.wrapping_add(job.await.expect("spawn_blocking job"));
                }
            }
            Peer::SemaphoreSpawnBlocking(sem) => {
                let jobs: Vec<_> = (0..n)
                    .map(|_| semaphore_task(sem, move || work(iters)))
                    .collect();
                submitted = began.elapsed();
                for job in jobs {
                    sum = sum.wrapping_add(job.await.expect("task"));
                }
            }
            Peer::TokioCapped(rt) => {
                let jobs: Vec<_> = (0..n)
                    .map(|_| rt.spawn_blocking(move || work(iters)))
                    .collect();
                submitted = began.elapsed();
                for job in jobs {
                    sum = sum.wrapping_add(job.await.expect("capped spawn_blocking job"));
                }
            }
            Peer::BlockingUnblock => {
                let jobs: Vec<_> = (0..n)
                    .map(|_| blocking::unblock(move || work(iters)))
                    .collect();
                submitted = began.elapsed();
                for job in jobs {
                    sum = sum.wrapping_add(job.await);
                }
            }
            Peer::ChannelPool(pool) => {
                let jobs: Vec<_> = (0..n).map(|_| pool.spawn(move || work(iters))).collect();
                submitted = began.elapsed();
                for job in jobs {
                    sum = sum.wrapping_add(job.await.expect("channel pool job"));
                }
            }
        }
        (sum, submitted)
    }

    /// [`batch`](Self::batch) of no-op jobs keyed round-robin over `keys`
    /// keys (`Offload::key`), for the offloader only: what a job's lane
    /// costs.
    pub(crate) async fn batch_keyed(&self, n: usize, keys: usize) -> Option<(u64, Duration)> {
        match self {
            Peer::Offloader(pool) => Some(offloader_batch(pool, n, 0, Some(keys), None).await),
            _ => None,
        }
    }

    /// [`batch`](Self::batch) of no-op jobs that each need one shared
    /// `Limiter` (of more permits than the pool has, so it never holds a
    /// job back), for the offloader only: what taking and giving back a
    /// limiter's permit costs.
    pub(crate) async fn batch_limited(&self, n: usize) -> Option<(u64, Duration)> {
        match self {
            Peer::Offloader(pool) => {
                let limiter = offloader::Limiter::new(1 << 20);
                Some(offloader_batch(pool, n, 0, None, Some(&limiter)).await)
            }
            _ => None,
        }
    }

    /// Submits `n` jobs of `iters` iterations at once, detached, and waits
    /// until the last one has returned: one wake-up for the whole batch
    /// instead of one per job. Returns a checksum.
    pub(crate) async fn batch_detached(&self, n: usize, iters: u64) -> u64 {
        let left = Arc::new(AtomicUsize::new(n));
        let done = Arc::new(tokio::sync::Notify::new());
        let sum = Arc::new(AtomicU64::new(0));
        for _ in 0..n {
            let (left, done, sum) = (left.clone(), done.clone(), sum.clone());
            self.detach(move || {
                let r = work(iters);
                sum.fetch_add(r, Ordering::Relaxed);
                if left.fetch_sub(1, Ordering::AcqRel) == 1 {
                    // Stores a permit if nobody waits yet: no lost wake-up.
                    done.notify_one();
                }
                r
            });
        }
        if n > 0 {
            done.notified().await;
        }
        sum.load(Ordering::Relaxed)
    }

    /// Submits `f` and lets it go: nobody waits for its outcome. Must be
    /// called on the driver runtime.
    pub(crate) fn detach<F>(&self, f: F)
    where
        F: FnOnce() -> u64 + Send + 'static,
    {
        match self {
            Peer::Offloader(pool) => match pool.offload(move |_stop| f()).spawn() {
                Ok(job) => job.detach(),
                Err(e) => panic!("offloader refused a job: {}", e.reason()),
            },
            Peer::SpawnBlocking => drop(tokio::task::spawn_blocking(f)),
            Peer::SemaphoreSpawnBlocking(sem) => drop(semaphore_task(sem, f)),
            Peer::TokioCapped(rt) => drop(rt.spawn_blocking(f)),
            Peer::BlockingUnblock => blocking::unblock(f).detach(),
            Peer::ChannelPool(pool) => pool.run(move || {
                std::hint::black_box(f());
            }),
        }
    }

    /// Submits `n` no-op jobs. With `keep`, returns every job's handle (the
    /// one each system gives its caller: `JobHandle`, `JoinHandle`,
    /// `blocking::Task`) in a vector sized for `n` up front; otherwise the
    /// jobs are detached. Must be called on the driver runtime.
    pub(crate) fn queue_noop(&self, n: usize, keep: bool) -> Box<dyn std::any::Any + Send> {
        if !keep {
            for _ in 0..n {
                self.detach(|| work(0));
            }
            return Box::new(());
        }
        fn kept<H: Send + 'static>(
            n: usize,
            mut f: impl FnMut() -> H,
        ) -> Box<dyn std::any::Any + Send> {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(f());
            }
            Box::new(v)
        }
        match self {
            Peer::Offloader(pool) => kept(n, || {
                pool.offload(|_stop| work(0))
                    .spawn()
                    .unwrap_or_else(|e| panic!("offloader refused a job: {}", e.reason()))
            }),
            Peer::SpawnBlocking => kept(n, || tokio::task::spawn_blocking(|| work(0))),
            Peer::SemaphoreSpawnBlocking(sem) => kept(n, || semaphore_task(sem, || work(0))),
            Peer::TokioCapped(rt) => kept(n, || rt.spawn_blocking(|| work(0))),
            Peer::BlockingUnblock => kept(n, || blocking::unblock(|| work(0))),
            Peer::ChannelPool(pool) => kept(n, || pool.spawn(|| work(0))),
        }
    }
}

/// The [`System::ChannelPool`] reference: `limit` threads, started at the
/// first job, taking boxed closures from one unbounded `crossbeam-channel`,
/// each job's result sent back over a tokio oneshot channel. Nothing of what
/// the offloader promises (no cancellation, stop token, timeout, metrics,
/// admission limit or shutdown sequence; a panic kills a thread): what
/// submitting a job and replying to its caller costs on the machine, and
/// so a ceiling for any pool with a handle per job.
pub(crate) struct ChannelPool {
    limit: usize,
    tx: crossbeam_channel::Sender<Box<dyn FnOnce() + Send>>,
    rx: crossbeam_channel::Receiver<Box<dyn FnOnce() + Send>>,
    started: std::sync::Once,
}

impl ChannelPool {
    fn new(limit: usize) -> ChannelPool {
        let (tx, rx) = crossbeam_channel::unbounded();
        ChannelPool {
            limit,
            tx,
            rx,
            started: std::sync::Once::new(),
        }
    }

    /// Queues `f` with nobody waiting for it. Its threads live as long as
    /// the process (a measuring child exits without dropping its pools).
    fn run(&self, f: impl FnOnce() + Send + 'static) {
        self.started.call_once(|| {
            for _ in 0..self.limit {
                let rx = self.rx.clone();
                std::thread::Builder::new()
                    .name("channel-pool".into())
                    .spawn(move || {
                        for job in rx {
                            job();
                        }
                    })
                    .expect("channel pool thread");
            }
        });
        self.tx.send(Box::new(f)).expect("channel pool open");
    }

    /// Queues `f`; the receiver is its handle.
    fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> tokio::sync::oneshot::Receiver<T> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.run(move || {
            let _ = reply.send(f());
        });
        rx
    }

    async fn call<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        self.spawn(f).await.expect("channel pool job")
    }
}

/// The hand-rolled pattern: a task that takes an owned permit, then runs
/// `f` on the blocking pool with the permit moved into the closure.
fn semaphore_task<F>(sem: &Arc<Semaphore>, f: F) -> tokio::task::JoinHandle<u64>
where
    F: FnOnce() -> u64 + Send + 'static,
{
    let sem = sem.clone();
    tokio::spawn(async move {
        let permit = sem.acquire_owned().await.expect("semaphore open");
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            f()
        })
        .await
        .expect("spawn_blocking job")
    })
}

/// The offloader's [`Peer::batch`], its jobs keyed round-robin over `keys`
/// keys if given, each needing `limiter` if given.
async fn offloader_batch(
    pool: &Offloader,
    n: usize,
    iters: u64,
    keys: Option<usize>,
    limiter: Option<&offloader::Limiter>,
) -> (u64, Duration) {
    let keyed = |o: offloader::Offload<_, u64>, i: usize| {
        let o = match keys {
            Some(k) => o.key(i % k.max(1)),
            None => o,
        };
        match limiter {
            Some(l) => o.limiter(l),
            None => o,
        }
    };
    let began = Instant::now();
    let mut jobs = Vec::with_capacity(n);
    for i in 0..n {
        let job = match keyed(pool.offload(move |_stop| work(iters)), i).spawn() {
            Ok(job) => job,
            // Only if the queue is full: wait for room.
            Err(e) => keyed(pool.offload(e.into_inner()), i)
                .submit()
                .await
                .expect("offloader accepts"),
        };
        jobs.push(job);
    }
    let submitted = began.elapsed();
    let mut sum = 0u64;
    for job in jobs {
        sum = sum.wrapping_add(job.await.expect("offloader job"));
    }
    (sum, submitted)
}
