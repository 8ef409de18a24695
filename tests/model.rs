//! Model-based property test of the contract (docs/ARCHITECTURE.md).
//!
//! proptest generates a pool configuration and a sequence of operations:
//! offload with and without a timeout or a name (spawned for an owner
//! handle, submitted with backpressure, or awaited directly by a caller who
//! then times out or drops the future), batches of many jobs at once (owner
//! handles, or callers who keep awaiting), cancel, stop, drop or detach a
//! handle, cancel / stop / leave (time out or drop the awaiting caller)
//! aimed at the front, the back or any position of the queue, await it /
//! wait on it with a timeout / wait on it from a plain thread, functions
//! that return, panic, wait on a gate (and wake on stop), wait on a gate
//! ignoring their stop token, or meet at a barrier of `max_in_flight`,
//! release one gate, a running job's gate or all, graceful shutdown,
//! `shutdown_now`, a staged `close`, dropping the last `Offloader` clone,
//! and `idle`.
//!
//! Each operation is applied to the real offloader and to [`Model`], a small
//! sequential model of the contract. After every operation the real system
//! is given a bounded time (never a sleep used as an ordering) to reach the
//! state the model predicts: the functions the model says run have sent
//! their "started" record, the counters match, owner handles of finished
//! jobs have their outcome. Then, and in every metrics snapshot on the way:
//!
//! - the ledger identity `accepted = queued + running + terminal`;
//! - at most `max_in_flight` functions run (counted inside the functions,
//!   and in the metrics), and at least as many ran at once as the model
//!   says must have (`max_running`, and the functions started during a
//!   shutdown's drain: the drain runs at the full width);
//! - no job is both cancelled (or returned unstarted) and run: the set of
//!   functions that ran equals the model's, and nothing ran twice;
//! - jobs start in FIFO order: the order of the observer's `Started` events
//!   (or, with one permit, of the functions' own start records) is the
//!   model's, whatever was cancelled or abandoned where in the queue;
//! - every handle's state, stop flag and outcome (value, panic message,
//!   cancelled, unstarted, timed out with the job's state and fate, outcome
//!   already taken) match the model, and the error texts say so; so does
//!   every awaiting caller's outcome;
//! - `shutdown_now` returns exactly the queued jobs (ids and names), a
//!   staged close reports what the model says it left behind;
//! - the pool is terminated (or idle) exactly when the model says so; after
//!   the last clone is dropped, its worker threads exit once the model's
//!   drain is over.
//!
//! Determinism: functions are held on gates that only operations open, so
//! which functions run is decided by the operations alone (FIFO queue,
//! `max_in_flight` permits). Caller time-outs that must fire are 1 ms long
//! and fire while the job can't finish (it waits on a closed gate); time-outs
//! that must not fire are 10 s long. The one race the model can't rule out
//! (a 1 ms time-out firing at the very first poll, before a worker picked the
//! job up) is linearized: the model then takes the time-out at the instant
//! of submission. A batch does not wait for the pool between its jobs: the
//! real pool may lag behind the model, never run ahead of it, so admission
//! stays exact (a job is refused `Full` when `queued - free permits >=
//! queue_capacity`), and the batch waits only where the lag could turn an
//! acceptance into a refusal. An awaiting caller is told its job finished
//! by its waker, never by a guess.
//!
//! Two property tests: `offloader_matches_the_model` (256 cases in CI,
//! `max_in_flight` 1–3, queue 1–4, batches of up to 6) and
//! `long_queues_match_the_model` (64 cases in CI, `max_in_flight` 1–4,
//! queue 50–400, batches of up to 300, so queues of hundreds). A longer run
//! is one command (the long-queue test runs a quarter as many cases, at
//! least 64; `MODEL_LONG_CASES` overrides):
//!
//! ```text
//! PROPTEST_CASES=2000 cargo test --release --test model
//! ```
//!
//! A failure prints the shrunk pool configuration and operations, and the
//! steps as executed (which handle and job each one resolved to).

mod support;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::{poll_fn, Future, IntoFuture};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use futures_core::Stream;
use offloader::{
    AbandonPolicy, AllFailed, BatchError, Error, EventKind, Fate, JobEvent, JobGroup, JobHandle,
    JobId, JobState, Metrics, Observer, OffloadFuture, Offloader, StopToken, SubmitError,
    WeakOffloader,
};
use proptest::prelude::*;
use support::model::{self, ensure, Steps};
// Not a glob: this file's SHORT (1 ms) is its own.
use support::{
    builder, gate, poll_once, quiet_deliberate_panics, threads_named, try_within, Gate, Hold,
    IsIdle, Ledger, HANG, ON_PURPOSE,
};

/// A caller time-out that fires while the job waits on a closed gate.
const SHORT: Duration = Duration::from_millis(1);
/// A close budget that runs out because a function waits on a closed gate.
const BUDGET_SHORT: Duration = Duration::from_millis(10);
/// A time-out or budget that must not run out: the awaited thing happens
/// on its own, well before.
const LONG: Duration = Duration::from_secs(10);
/// How long the real system may take to reach the model's state.
const SETTLE: Duration = Duration::from_secs(10);
/// The most a barrier function waits for its group: past every test-side
/// bound, yet finite.
const BARRIER_LIMIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------
// Operations

/// What a job's function does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Returns at once.
    Returns,
    /// Panics at once.
    Panics,
    /// Waits on its gate; a stop request wakes it too (cooperative).
    Gated,
    /// Waits on its gate and ignores its stop token.
    IgnoresStop,
    /// Waits at a barrier of `max_in_flight` until that many barrier
    /// functions wait at once (then the group returns), or its gate opens,
    /// or stop is requested. It returns on its own only if the pool runs
    /// the queue at its full width.
    Barrier,
}

impl Kind {
    fn gated(self) -> bool {
        matches!(self, Kind::Gated | Kind::IgnoresStop | Kind::Barrier)
    }
}

impl fmt::Debug for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Returns => "returns",
            Kind::Panics => "panics",
            Kind::Gated => "gated",
            Kind::IgnoresStop => "ignores-stop",
            Kind::Barrier => "barrier",
        })
    }
}

/// How a caller awaiting an offload directly stops waiting, if the job does
/// not finish first.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Leave {
    /// Its `with_timeout` passes.
    TimesOut,
    /// It drops the future (no timeout set).
    Drops,
}

/// Which job a positional operation aims at, among the jobs it can act on
/// (with an owner handle, or with an awaiting caller): in the model's
/// queue, front to back, or among the running jobs, in start order.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pos {
    Front,
    Back,
    /// `i % candidates`: anywhere, mostly in the middle of a long queue.
    At(u16),
    Running(u8),
}

impl fmt::Debug for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Pos::Front => f.write_str("front"),
            Pos::Back => f.write_str("back"),
            Pos::At(i) => write!(f, "#{i}"),
            Pos::Running(i) => write!(f, "running#{i}"),
        }
    }
}

/// The kinds of a batch's jobs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mix {
    Gated,
    Barrier,
    /// Every kind, by a hash of the seed and the job's index.
    Mixed(u32),
}

impl Mix {
    fn kind(self, i: usize) -> Kind {
        match self {
            Mix::Gated => Kind::Gated,
            Mix::Barrier => Kind::Barrier,
            Mix::Mixed(seed) => {
                let x = (u64::from(seed) ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                    .wrapping_mul(0xBF58_476D_1CE4_E5B9);
                const TABLE: [Kind; 10] = [
                    Kind::Returns,
                    Kind::Returns,
                    Kind::Returns,
                    Kind::Panics,
                    Kind::Gated,
                    Kind::Gated,
                    Kind::Gated,
                    Kind::IgnoresStop,
                    Kind::Barrier,
                    Kind::Barrier,
                ];
                TABLE[((x >> 32) % TABLE.len() as u64) as usize]
            }
        }
    }
}

/// What a job of an `invoke_any` or a `map` gives: its function returns
/// `Ok`, returns `Err` (both complete, for the pool), or panics.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Answer {
    Ok,
    Err,
    Panics,
}

impl Answer {
    /// `invoke_any`: often none of a few jobs succeeds.
    const ANY: [Answer; 4] = [Answer::Ok, Answer::Err, Answer::Err, Answer::Panics];
    /// `map`: mostly successes, so that a `stop_on_error` map gets going.
    const MAP: [Answer; 6] = [
        Answer::Ok,
        Answer::Ok,
        Answer::Ok,
        Answer::Ok,
        Answer::Err,
        Answer::Panics,
    ];

    /// Job `i`'s answer, by a hash of the seed and the index.
    fn of(table: &[Answer], seed: u8, i: usize) -> Answer {
        let x = (u64::from(seed) ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .wrapping_mul(0xBF58_476D_1CE4_E5B9);
        table[((x >> 32) % table.len() as u64) as usize]
    }

    fn kind(self) -> Kind {
        match self {
            Answer::Ok | Answer::Err => Kind::Returns,
            Answer::Panics => Kind::Panics,
        }
    }
}

/// How a `map` is set up.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct MapHow {
    limit: usize,
    ordered: bool,
    stop_on_error: bool,
}

/// Who waits for a batch's jobs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Callers {
    /// `spawn()`, keeping the owner handles (every third job named).
    Handles,
    /// Callers awaiting `offload(f)` directly, who keep waiting until an
    /// operation makes them leave (or their job finishes). With `timeout`,
    /// a 1 ms `with_timeout` on those whose job can't finish at once.
    /// Their `on_abandon` cycles through none, `Keep`, `CancelIfQueued`,
    /// `CancelAndStop`.
    Awaiting { timeout: bool },
}

/// What follows a batch at once, before the pool is given time to settle.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Then {
    Nothing,
    Shutdown,
    Close,
    DropLast,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `offload(f)[.name][.with_timeout(1ms)].spawn()`, keeping the handle.
    Spawn {
        kind: Kind,
        named: bool,
        timeout: bool,
    },
    /// `offload(f)[.name].submit().await`: waits for room in a full queue.
    Submit {
        kind: Kind,
        named: bool,
    },
    /// `offload(f)[.on_abandon(p)]` awaited directly by a caller who leaves.
    Direct {
        kind: Kind,
        named: bool,
        leave: Leave,
        policy: Option<AbandonPolicy>,
    },
    /// `cancel()` on handle `h % live handles`.
    Cancel(u8),
    Stop(u8),
    DropHandle(u8),
    Detach(u8),
    /// Await the handle: its outcome if the job finished, else its spawned
    /// time-out or a 1 ms `tokio::time::timeout` around it.
    Await(u8),
    TimeoutAround(u8),
    /// `blocking_wait` on a plain thread (with or without a limit).
    BlockingWait(u8),
    /// Opens the gate of gated job `g % gated jobs`.
    Release(u16),
    /// Opens the gate of running job `i % running jobs` (model order).
    ReleaseRunning(u8),
    ReleaseAll,
    /// `n` jobs offered one after the other, then `then`.
    Batch {
        n: u16,
        mix: Mix,
        callers: Callers,
        then: Then,
    },
    /// `cancel()` on the owner handle of the job at `Pos`.
    CancelAt(Pos),
    /// `stop()` on the owner handle of the job at `Pos`.
    StopAt(Pos),
    /// The caller awaiting the job at `Pos` times out (if it has a time-out)
    /// or drops its future.
    LeaveAt(Pos, Leave),
    Shutdown,
    ShutdownNow,
    Close,
    /// Drops the test's `Offloader`, after the callers and the blocked
    /// producer that hold clones of it left: the last clone.
    DropLast,
    Idle,
    /// `stop()` on job group `g % 2` (group 1 is a child of group 0).
    StopGroup(u8),
    /// `invoke_all` of `n` jobs that return or panic, through the pool or
    /// group `g % 2`, awaited to the end; offered only when it cannot wait
    /// on a gate (nothing queued, a permit free) or is refused outright.
    InvokeAll {
        n: u8,
        group: Option<u8>,
    },
    /// `invoke_any` of `n` jobs that return `Ok`, return `Err` or panic (by
    /// `seed`: [`Answer::of`]), through the pool or group `g % 2`, awaited
    /// to the end; offered like `InvokeAll`, and only when none of its jobs
    /// can find the queue full (so they are accepted in input order).
    InvokeAny {
        n: u8,
        seed: u8,
        group: Option<u8>,
    },
    /// `map` over `n` items (each returns `Ok`, returns `Err` or panics, by
    /// `seed`) through the pool or group `g % 2`, `.limit(limit)`,
    /// `.unordered()` unless `ordered`, `.stop_on_error()` if
    /// `stop_on_error`, collected to its end; offered like `InvokeAny`
    /// (with `min(n, limit)` jobs at once).
    Map {
        n: u8,
        limit: u8,
        ordered: bool,
        stop_on_error: bool,
        seed: u8,
        group: Option<u8>,
    },
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let flags = |named: bool, extra: &str| {
            let mut s = String::new();
            if named {
                s.push_str(", named");
            }
            s.push_str(extra);
            s
        };
        match *self {
            Op::Spawn {
                kind,
                named,
                timeout,
            } => write!(
                f,
                "spawn({kind:?}{})",
                flags(named, if timeout { ", timeout" } else { "" })
            ),
            Op::Submit { kind, named } => write!(f, "submit({kind:?}{})", flags(named, "")),
            Op::Direct {
                kind,
                named,
                leave,
                policy,
            } => {
                let leave = match leave {
                    Leave::TimesOut => ", caller times out",
                    Leave::Drops => ", caller drops it",
                };
                let policy = match policy {
                    None => String::new(),
                    Some(p) => format!(", on_abandon {p:?}"),
                };
                write!(f, "await({kind:?}{}{policy})", flags(named, leave))
            }
            Op::Cancel(h) => write!(f, "cancel(h{h})"),
            Op::Stop(h) => write!(f, "stop(h{h})"),
            Op::DropHandle(h) => write!(f, "drop(h{h})"),
            Op::Detach(h) => write!(f, "detach(h{h})"),
            Op::Await(h) => write!(f, "await(h{h})"),
            Op::TimeoutAround(h) => write!(f, "timeout(&mut h{h})"),
            Op::BlockingWait(h) => write!(f, "blocking_wait(h{h})"),
            Op::Release(g) => write!(f, "release(g{g})"),
            Op::ReleaseRunning(i) => write!(f, "release(running#{i})"),
            Op::ReleaseAll => f.write_str("release_all"),
            Op::Batch {
                n,
                mix,
                callers,
                then,
            } => {
                let callers = match callers {
                    Callers::Handles => "spawned",
                    Callers::Awaiting { timeout: true } => "awaited, 1 ms time-outs",
                    Callers::Awaiting { timeout: false } => "awaited",
                };
                let then = match then {
                    Then::Nothing => "",
                    Then::Shutdown => ", then shutdown",
                    Then::Close => ", then close",
                    Then::DropLast => ", then drop the last clone",
                };
                write!(f, "batch({n} x {mix:?}, {callers}{then})")
            }
            Op::CancelAt(p) => write!(f, "cancel(at {p:?})"),
            Op::StopAt(p) => write!(f, "stop(at {p:?})"),
            Op::LeaveAt(p, leave) => {
                let leave = match leave {
                    Leave::TimesOut => "times out",
                    Leave::Drops => "drops it",
                };
                write!(f, "caller leaves(at {p:?}, {leave})")
            }
            Op::Shutdown => f.write_str("shutdown"),
            Op::ShutdownNow => f.write_str("shutdown_now"),
            Op::Close => f.write_str("close"),
            Op::DropLast => f.write_str("drop_last_clone"),
            Op::Idle => f.write_str("idle"),
            Op::StopGroup(g) => write!(f, "stop(group{})", g % 2),
            Op::InvokeAll { n, group } => match group {
                Some(g) => write!(f, "group{}.invoke_all({n})", g % 2),
                None => write!(f, "invoke_all({n})"),
            },
            Op::InvokeAny { n, seed, group } => {
                if let Some(g) = group {
                    write!(f, "group{}.", g % 2)?;
                }
                write!(f, "invoke_any({n}, seed {seed})")
            }
            Op::Map {
                n,
                limit,
                ordered,
                stop_on_error,
                seed,
                group,
            } => {
                if let Some(g) = group {
                    write!(f, "group{}.", g % 2)?;
                }
                write!(
                    f,
                    "map({n}, seed {seed}, limit {limit}{}{})",
                    if ordered { "" } else { ", unordered" },
                    if stop_on_error { ", stop_on_error" } else { "" }
                )
            }
        }
    }
}

/// The pool under test.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Cfg {
    max_in_flight: usize,
    queue_capacity: usize,
    /// 1 ms instead of the default: workers retire and respawn all the time.
    short_keep_alive: bool,
    policy: AbandonPolicy,
    /// A lifecycle observer records the `Started` events (start order).
    observer: bool,
}

impl fmt::Debug for Cfg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pool(max_in_flight {}, queue_capacity {}, keep_alive {}, abandon {:?}{})",
            self.max_in_flight,
            self.queue_capacity,
            if self.short_keep_alive {
                "1ms"
            } else {
                "default"
            },
            self.policy,
            if self.observer { ", observer" } else { "" }
        )
    }
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        3 => Just(Kind::Returns),
        1 => Just(Kind::Panics),
        3 => Just(Kind::Gated),
        2 => Just(Kind::IgnoresStop),
        1 => Just(Kind::Barrier),
    ]
}

fn policy() -> impl Strategy<Value = AbandonPolicy> {
    prop_oneof![
        Just(AbandonPolicy::Keep),
        Just(AbandonPolicy::CancelIfQueued),
        Just(AbandonPolicy::CancelAndStop),
    ]
}

fn leave() -> impl Strategy<Value = Leave> {
    prop_oneof![Just(Leave::TimesOut), Just(Leave::Drops)]
}

fn pos() -> impl Strategy<Value = Pos> {
    prop_oneof![
        2 => Just(Pos::Front),
        2 => Just(Pos::Back),
        4 => any::<u16>().prop_map(Pos::At),
        1 => (0u8..4).prop_map(Pos::Running),
    ]
}

fn batch(max_n: u16) -> impl Strategy<Value = Op> {
    let mix = prop_oneof![
        3 => Just(Mix::Gated),
        2 => Just(Mix::Barrier),
        3 => any::<u32>().prop_map(Mix::Mixed),
    ];
    let callers = prop_oneof![
        3 => Just(Callers::Handles),
        2 => Just(Callers::Awaiting { timeout: true }),
        1 => Just(Callers::Awaiting { timeout: false }),
    ];
    let then = prop_oneof![
        6 => Just(Then::Nothing),
        1 => Just(Then::Shutdown),
        1 => Just(Then::Close),
        1 => Just(Then::DropLast),
    ];
    (1..=max_n, mix, callers, then).prop_map(|(n, mix, callers, then)| Op::Batch {
        n,
        mix,
        callers,
        then,
    })
}

fn op() -> impl Strategy<Value = Op> {
    let h = 0u8..8;
    prop_oneof![
        8 => (kind(), any::<bool>(), any::<bool>())
            .prop_map(|(kind, named, timeout)| Op::Spawn { kind, named, timeout }),
        2 => (kind(), any::<bool>()).prop_map(|(kind, named)| Op::Submit { kind, named }),
        4 => direct(),
        3 => h.clone().prop_map(Op::Cancel),
        2 => h.clone().prop_map(Op::Stop),
        1 => h.clone().prop_map(Op::DropHandle),
        1 => h.clone().prop_map(Op::Detach),
        2 => h.clone().prop_map(Op::Await),
        1 => h.clone().prop_map(Op::TimeoutAround),
        1 => h.clone().prop_map(Op::BlockingWait),
        4 => (0u16..8).prop_map(Op::Release),
        1 => h.prop_map(Op::ReleaseRunning),
        1 => Just(Op::ReleaseAll),
        2 => batch(6),
        1 => pos().prop_map(Op::CancelAt),
        1 => pos().prop_map(Op::StopAt),
        1 => (pos(), leave()).prop_map(|(p, l)| Op::LeaveAt(p, l)),
        1 => Just(Op::Shutdown),
        1 => Just(Op::ShutdownNow),
        1 => Just(Op::Close),
        1 => Just(Op::DropLast),
        1 => Just(Op::Idle),
        1 => (0u8..2).prop_map(Op::StopGroup),
        1 => (1u8..6, proptest::option::of(0u8..2))
            .prop_map(|(n, group)| Op::InvokeAll { n, group }),
        1 => invoke_any_op(6),
        1 => map_op(8, 4),
    ]
}

fn invoke_any_op(max_n: u8) -> impl Strategy<Value = Op> {
    (1..=max_n, any::<u8>(), proptest::option::of(0u8..2))
        .prop_map(|(n, seed, group)| Op::InvokeAny { n, seed, group })
}

fn map_op(max_n: u8, max_limit: u8) -> impl Strategy<Value = Op> {
    (
        1..=max_n,
        1..=max_limit,
        any::<bool>(),
        any::<bool>(),
        any::<u8>(),
        proptest::option::of(0u8..2),
    )
        .prop_map(|(n, limit, ordered, stop_on_error, seed, group)| Op::Map {
            n,
            limit,
            ordered,
            stop_on_error,
            seed,
            group,
        })
}

fn direct() -> impl Strategy<Value = Op> {
    (
        kind(),
        any::<bool>(),
        leave(),
        proptest::option::of(policy()),
    )
        .prop_map(|(kind, named, leave, policy)| Op::Direct {
            kind,
            named,
            leave,
            policy,
        })
}

/// Operations aimed at positions, and releases: what fills the middle of
/// a long-queue case and follows its shutdown.
fn aimed_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => pos().prop_map(Op::CancelAt),
        2 => pos().prop_map(Op::StopAt),
        5 => (pos(), leave()).prop_map(|(p, l)| Op::LeaveAt(p, l)),
        3 => any::<u8>().prop_map(Op::ReleaseRunning),
        2 => any::<u16>().prop_map(Op::Release),
        1 => (0u8..8).prop_map(Op::Await),
        1 => Just(Op::Idle),
        1 => (0u8..2).prop_map(Op::StopGroup),
    ]
}

/// Operations for long queues before any shutdown: mostly batches and
/// operations aimed at positions in the queue.
fn long_op() -> impl Strategy<Value = Op> {
    let only = |then: Then| {
        move |op: Op| match op {
            Op::Batch {
                n, mix, callers, ..
            } => Op::Batch {
                n,
                mix,
                callers,
                then,
            },
            op => op,
        }
    };
    prop_oneof![
        6 => batch(300).prop_map(only(Then::Nothing)),
        2 => (kind(), any::<bool>(), any::<bool>())
            .prop_map(|(kind, named, timeout)| Op::Spawn { kind, named, timeout }),
        1 => (kind(), any::<bool>()).prop_map(|(kind, named)| Op::Submit { kind, named }),
        2 => direct(),
        14 => aimed_op(),
        1 => Just(Op::ReleaseAll),
        1 => invoke_any_op(80),
        1 => map_op(120, 8),
    ]
}

/// How a long-queue case ends, if it does before the harness's own end:
/// a shutdown of each kind, at once after a batch or not.
fn ending() -> impl Strategy<Value = Vec<Op>> {
    let then = prop_oneof![
        Just(Then::Shutdown),
        Just(Then::Close),
        Just(Then::DropLast)
    ];
    prop_oneof![
        1 => Just(vec![]),
        1 => Just(vec![Op::Shutdown]),
        1 => Just(vec![Op::ShutdownNow]),
        1 => Just(vec![Op::Close]),
        1 => Just(vec![Op::DropLast]),
        3 => (batch(300), then).prop_map(|(op, then)| match op {
            Op::Batch {
                n, mix, callers, ..
            } => vec![Op::Batch {
                n,
                mix,
                callers,
                then,
            }],
            op => vec![op],
        }),
    ]
}

fn scenario() -> impl Strategy<Value = (Cfg, Vec<Op>)> {
    let cfg = (
        1usize..=3,
        1usize..=4,
        any::<bool>(),
        policy(),
        any::<bool>(),
    )
        .prop_map(
            |(max_in_flight, queue_capacity, short_keep_alive, policy, observer)| Cfg {
                max_in_flight,
                queue_capacity,
                short_keep_alive,
                policy,
                observer,
            },
        );
    (cfg, proptest::collection::vec(op(), 1..40))
}

fn long_scenario() -> impl Strategy<Value = (Cfg, Vec<Op>)> {
    let cfg = (1usize..=4, 50usize..=400, any::<bool>(), policy()).prop_map(
        |(max_in_flight, queue_capacity, short_keep_alive, policy)| Cfg {
            max_in_flight,
            queue_capacity,
            short_keep_alive,
            policy,
            observer: true,
        },
    );
    let ops = (
        proptest::collection::vec(long_op(), 1..24),
        ending(),
        proptest::collection::vec(
            prop_oneof![5 => aimed_op(), 1 => Just(Op::ReleaseAll)],
            0..8,
        ),
    )
        .prop_map(|(mut ops, end, after)| {
            ops.extend(end);
            ops.extend(after);
            ops
        });
    (cfg, ops)
}

// ---------------------------------------------------------------------------
// The model

/// What a function returns: its job's tag (index in acceptance order) and
/// whether its stop token was set when it returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Val {
    tag: usize,
    stopped: bool,
}

#[derive(Debug, Clone, PartialEq)]
enum St {
    Queued,
    Running,
    Completed(Val),
    Panicked,
    Cancelled,
    Unstarted,
}

impl St {
    fn terminal(&self) -> bool {
        !matches!(self, St::Queued | St::Running)
    }

    fn job_state(&self) -> JobState {
        match self {
            St::Queued => JobState::Queued,
            St::Running => JobState::Running,
            St::Completed(_) => JobState::Completed,
            St::Panicked => JobState::Panicked,
            St::Cancelled => JobState::Cancelled,
            St::Unstarted => JobState::Unstarted,
        }
    }
}

#[derive(Debug, Clone)]
struct MJob {
    kind: Kind,
    name: Option<String>,
    st: St,
    stop: bool,
    gate_open: bool,
    started: bool,
    /// A barrier function whose group met: it returns.
    passed: bool,
    /// Started after a shutdown began (during the drain).
    drain: bool,
    /// The job group it was offloaded through, if any.
    group: Option<usize>,
}

/// The counters the model predicts; compared with [`Metrics`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Counts {
    accepted: u64,
    rejected_full: u64,
    rejected_timed_out: u64,
    rejected_shutdown: u64,
    completed: u64,
    panicked: u64,
    cancelled: u64,
    unstarted: u64,
    callers_timed_out: u64,
    callers_dropped: u64,
    running_after_caller_left: u64,
    stop_requests: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    Full,
    ShuttingDown,
}

/// What a staged close does, by the model.
#[derive(Debug, Clone)]
struct CloseModel {
    escalated: bool,
    terminated: bool,
    unstarted: Vec<usize>,
    still_running: Vec<usize>,
    completed: u64,
    panicked: u64,
}

/// The contract, sequentially: a FIFO queue in which at most `cap` jobs
/// wait for a permit, at most `max` running, jobs finishing as soon as
/// their function can return.
#[derive(Debug, Clone)]
struct Model {
    max: usize,
    cap: usize,
    policy: AbandonPolicy,
    shutdown: bool,
    jobs: Vec<MJob>,
    queue: VecDeque<usize>,
    running: Vec<usize>,
    /// A producer blocked in `submit().await` on a full queue.
    blocked: Option<(Kind, Option<String>)>,
    c: Counts,
    /// Every start, in order: FIFO.
    start_order: Vec<usize>,
    /// The most functions that were running at once while none of them
    /// could return: the pool must have run them at once too, so its
    /// `max_running` is at least this.
    max_running: usize,
    /// The same, counting only functions started during a shutdown's
    /// drain: a graceful shutdown drains at the full width.
    drain_width: usize,
    /// Job groups 0 and 1 (a child of 0): stopped, and jobs they refused.
    group_stopped: [bool; 2],
    group_rejected: [u64; 2],
}

impl Model {
    fn new(cfg: Cfg) -> Model {
        Model {
            max: cfg.max_in_flight,
            cap: cfg.queue_capacity,
            policy: cfg.policy,
            shutdown: false,
            jobs: Vec::new(),
            queue: VecDeque::new(),
            running: Vec::new(),
            blocked: None,
            c: Counts::default(),
            start_order: Vec::new(),
            max_running: 0,
            drain_width: 0,
            group_stopped: [false; 2],
            group_rejected: [0; 2],
        }
    }

    /// The group a spawned job with this tag goes through: none, group 0
    /// or group 1, in turn.
    fn group_for(tag: usize) -> Option<usize> {
        [None, Some(0), Some(1)][tag % 3]
    }

    /// Whether group `inner` is `outer` or below it.
    fn in_group(inner: Option<usize>, outer: usize) -> bool {
        inner.is_some_and(|g| g >= outer)
    }

    /// `JobGroup::stop` on group `g`: marks it and its child stopped, then,
    /// in one step, cancels their queued jobs and asks their running ones to
    /// stop; `false` if it was already stopped.
    fn stop_group(&mut self, g: usize) -> bool {
        if self.group_stopped[g] {
            return false;
        }
        for s in &mut self.group_stopped[g..] {
            *s = true;
        }
        let members: Vec<usize> = (0..self.jobs.len())
            .filter(|&j| Self::in_group(self.jobs[j].group, g))
            .collect();
        for &j in &members {
            if self.jobs[j].st == St::Queued {
                self.queue.retain(|&q| q != j);
                self.jobs[j].st = St::Cancelled;
                self.c.cancelled += 1;
            }
        }
        for &j in &members {
            if self.jobs[j].st == St::Running && !self.jobs[j].stop {
                self.jobs[j].stop = true;
                self.c.stop_requests += 1;
            }
        }
        self.advance();
        true
    }

    /// Group `g`'s metrics as the model predicts them (its child's jobs
    /// included).
    fn group_metrics(&self, g: usize) -> [u64; 9] {
        let mut m = [0u64; 9];
        for job in self.jobs.iter().filter(|j| Self::in_group(j.group, g)) {
            m[0] += 1;
            m[match job.st {
                St::Queued => 1,
                St::Running => 2,
                St::Completed(_) => 3,
                St::Panicked => 4,
                St::Cancelled => 5,
                St::Unstarted => 6,
            }] += 1;
        }
        m[7] = self.group_rejected[g];
        m[8] = u64::from(self.group_stopped[g]);
        m
    }

    /// Queued jobs waiting for a permit: those that a free permit starts at
    /// once are not waiting (ARCHITECTURE inv. 8). After [`Model::advance`]
    /// that is the whole queue, but the rule is the contract's.
    fn waiting(&self) -> usize {
        let free = self.max.saturating_sub(self.running.len());
        self.queue.len().saturating_sub(free)
    }

    /// Jobs queued or running.
    fn unfinished(&self) -> usize {
        self.queue.len() + self.running.len()
    }

    /// Jobs in a terminal state.
    fn terminal(&self) -> u64 {
        self.c.completed + self.c.panicked + self.c.cancelled + self.c.unstarted
    }

    /// Why a new job would be refused right now, if it would. A producer
    /// blocked on a full queue means the queue is full: it is served as
    /// soon as there is room.
    fn refusal(&self) -> Option<Refusal> {
        if self.shutdown {
            Some(Refusal::ShuttingDown)
        } else if self.waiting() >= self.cap || self.blocked.is_some() {
            Some(Refusal::Full)
        } else {
            None
        }
    }

    /// Accepts a job (the caller checked [`Model::refusal`]); with
    /// `advance`, lets the system run until it settles.
    fn accept(&mut self, kind: Kind, name: Option<String>, advance: bool) -> usize {
        let tag = self.jobs.len();
        self.jobs.push(MJob {
            kind,
            name,
            st: St::Queued,
            stop: false,
            gate_open: false,
            started: false,
            passed: false,
            drain: false,
            group: None,
        });
        self.queue.push_back(tag);
        self.c.accepted += 1;
        if advance {
            self.advance();
        }
        tag
    }

    fn can_finish(&self, j: usize) -> bool {
        let job = &self.jobs[j];
        match job.kind {
            Kind::Returns | Kind::Panics => true,
            Kind::Gated => job.gate_open || job.stop,
            Kind::IgnoresStop => job.gate_open,
            Kind::Barrier => job.gate_open || job.stop || job.passed,
        }
    }

    /// Runs the system until nothing more happens without an operation:
    /// functions that can return do, freed permits go to the queue's head,
    /// freed room to a blocked producer.
    fn advance(&mut self) {
        loop {
            let mut changed = false;
            let done: Vec<usize> = self
                .running
                .iter()
                .copied()
                .filter(|&j| self.can_finish(j))
                .collect();
            for j in done {
                self.running.retain(|&r| r != j);
                let job = &mut self.jobs[j];
                if job.kind == Kind::Panics {
                    job.st = St::Panicked;
                    self.c.panicked += 1;
                } else {
                    job.st = St::Completed(Val {
                        tag: j,
                        stopped: job.stop,
                    });
                    self.c.completed += 1;
                }
                changed = true;
            }
            while self.running.len() < self.max {
                let Some(j) = self.queue.pop_front() else {
                    break;
                };
                self.jobs[j].st = St::Running;
                self.jobs[j].started = true;
                self.jobs[j].drain = self.shutdown;
                self.start_order.push(j);
                self.running.push(j);
                changed = true;
            }
            // Functions that can't return now were all running at once.
            let stuck: Vec<usize> = self
                .running
                .iter()
                .copied()
                .filter(|&j| !self.can_finish(j))
                .collect();
            self.max_running = self.max_running.max(stuck.len());
            let drained = stuck.iter().filter(|&&j| self.jobs[j].drain).count();
            self.drain_width = self.drain_width.max(drained);
            // A barrier group meets when every permit is held by a barrier
            // function waiting for it.
            if !stuck.is_empty()
                && stuck.len() == self.max
                && stuck.iter().all(|&j| self.jobs[j].kind == Kind::Barrier)
            {
                for j in stuck {
                    self.jobs[j].passed = true;
                }
                changed = true;
            }
            if !self.shutdown && self.waiting() < self.cap {
                if let Some((kind, name)) = self.blocked.take() {
                    self.accept(kind, name, false);
                    changed = true;
                }
            }
            if !changed {
                return;
            }
        }
    }

    fn cancel_queued(&mut self, j: usize) -> bool {
        if self.jobs[j].st != St::Queued {
            return false;
        }
        self.queue.retain(|&q| q != j);
        self.jobs[j].st = St::Cancelled;
        self.c.cancelled += 1;
        self.advance();
        true
    }

    /// Cancels the queued jobs `tags` in one step (a group stop), before
    /// any of them could start.
    fn cancel_unstarted(&mut self, tags: std::ops::Range<usize>) {
        for j in tags {
            assert_eq!(self.jobs[j].st, St::Queued, "job {j} is not queued");
            self.queue.retain(|&q| q != j);
            self.jobs[j].st = St::Cancelled;
            self.c.cancelled += 1;
        }
    }

    /// `JobHandle::cancel`.
    fn cancel(&mut self, j: usize) -> bool {
        if self.cancel_queued(j) {
            return true;
        }
        if self.jobs[j].st == St::Running {
            self.stop(j);
        }
        false
    }

    /// `JobHandle::stop`.
    fn stop(&mut self, j: usize) -> bool {
        // A finished job has nothing to stop: false, and nothing counted.
        if self.jobs[j].stop || self.jobs[j].st.terminal() {
            return false;
        }
        self.jobs[j].stop = true;
        self.c.stop_requests += 1;
        self.advance();
        true
    }

    /// An awaiting caller leaves an unfinished job.
    fn abandon(&mut self, j: usize, policy: AbandonPolicy, timed_out: bool) -> Fate {
        if self.jobs[j].st.terminal() {
            // Nothing to leave: nothing counted, no policy applied.
            return Fate::Finished;
        }
        if timed_out {
            self.c.callers_timed_out += 1;
        } else {
            self.c.callers_dropped += 1;
        }
        if self.jobs[j].st == St::Running {
            self.c.running_after_caller_left += 1;
        }
        match policy {
            AbandonPolicy::CancelIfQueued if self.cancel_queued(j) => Fate::Cancelled,
            AbandonPolicy::CancelAndStop if self.cancel_queued(j) => Fate::Cancelled,
            AbandonPolicy::CancelAndStop => {
                self.stop(j);
                Fate::StopRequested
            }
            _ => Fate::Kept,
        }
    }

    fn release(&mut self, j: usize) {
        self.jobs[j].gate_open = true;
        self.advance();
    }

    fn release_all(&mut self) {
        for j in &mut self.jobs {
            j.gate_open = true;
        }
        self.advance();
    }

    /// `shutdown()`, or the last `Offloader` clone dropped.
    fn shutdown(&mut self) {
        if self.shutdown {
            return;
        }
        self.shutdown = true;
        if self.blocked.take().is_some() {
            self.c.rejected_shutdown += 1;
        }
        self.advance();
    }

    /// Returns the tags handed back unstarted, in queue order.
    fn shutdown_now(&mut self) -> Vec<usize> {
        self.shutdown();
        let drained: Vec<usize> = self.queue.drain(..).collect();
        for &j in &drained {
            self.jobs[j].st = St::Unstarted;
            self.c.unstarted += 1;
        }
        for j in self.running.clone() {
            self.stop(j);
        }
        self.advance();
        drained
    }

    fn close(&mut self) -> CloseModel {
        let (completed, panicked) = (self.c.completed, self.c.panicked);
        self.shutdown();
        let mut m = CloseModel {
            escalated: false,
            terminated: true,
            unstarted: Vec::new(),
            still_running: Vec::new(),
            completed: 0,
            panicked: 0,
        };
        if !self.idle() {
            m.escalated = true;
            m.unstarted = self.shutdown_now();
            m.terminated = self.idle();
            m.still_running = self.running.clone();
        }
        m.completed = self.c.completed - completed;
        m.panicked = self.c.panicked - panicked;
        m
    }

    fn idle(&self) -> bool {
        self.queue.is_empty() && self.running.is_empty()
    }

    fn terminated(&self) -> bool {
        self.shutdown && self.idle()
    }

    fn started(&self) -> Vec<usize> {
        (0..self.jobs.len())
            .filter(|&j| self.jobs[j].started)
            .collect()
    }

    /// One line per job, for failure messages.
    fn summary(&self) -> String {
        let mut s = format!(
            "shutdown {}, queue {:?}, running {:?}, blocked producer {}\n",
            self.shutdown,
            self.queue,
            self.running,
            self.blocked.is_some()
        );
        for (j, job) in self.jobs.iter().enumerate() {
            s.push_str(&format!(
                "    job {j}: {:?}{} {:?}, stop {}, gate {}{}\n",
                job.kind,
                job.name
                    .as_deref()
                    .map(|n| format!(" {n:?}"))
                    .unwrap_or_default(),
                job.st,
                job.stop,
                if job.gate_open { "open" } else { "closed" },
                if job.passed { ", met its group" } else { "" }
            ));
        }
        s
    }
}

// ---------------------------------------------------------------------------
// The real side: functions, gates, and what they record

type Func = Box<dyn FnOnce(&StopToken) -> Val + Send>;
type Submitting = Pin<Box<dyn Future<Output = Result<JobHandle<Val>, SubmitError<Func>>>>>;

/// What the functions record: which ran (in order), how many run now, the
/// most at once; and the same for those started during a shutdown's drain.
#[derive(Default)]
struct Probe {
    ran: Mutex<Vec<usize>>,
    now: AtomicUsize,
    max: AtomicUsize,
    /// Set by the test just before it starts a shutdown (of any kind).
    drain: AtomicBool,
    drain_now: AtomicUsize,
    drain_max: AtomicUsize,
}

struct Inside<'a> {
    probe: &'a Probe,
    drain: bool,
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.probe.now.fetch_sub(1, Ordering::SeqCst);
        if self.drain {
            self.probe.drain_now.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Probe {
    fn enter(&self, tag: usize) -> Inside<'_> {
        lock(&self.ran).push(tag);
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        let drain = self.drain.load(Ordering::SeqCst);
        if drain {
            let n = self.drain_now.fetch_add(1, Ordering::SeqCst) + 1;
            self.drain_max.fetch_max(n, Ordering::SeqCst);
        }
        Inside { probe: self, drain }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The barrier [`Kind::Barrier`] functions meet at: `size` of them
/// waiting at once, none stopped or released, pass together.
struct Rendezvous {
    size: usize,
    /// Functions waiting now (by a number of their own, with what lets
    /// them out), and the number of groups that met.
    state: Mutex<(Vec<Waiting>, u64)>,
    changed: Condvar,
    next: AtomicUsize,
}

/// A function waiting at the [`Rendezvous`].
struct Waiting {
    me: usize,
    open: Arc<AtomicBool>,
    stop: StopToken,
}

impl Waiting {
    /// Released by its gate or a stop request: it no longer counts, even
    /// before it wakes up to leave (a group stop asks several functions in
    /// turn, and a newcomer must not meet one that is already asked).
    fn leaving(&self) -> bool {
        self.open.load(Ordering::SeqCst) || self.stop.is_stopped()
    }
}

impl Rendezvous {
    fn new(size: usize) -> Arc<Rendezvous> {
        Arc::new(Rendezvous {
            size,
            state: Mutex::new((Vec::new(), 0)),
            changed: Condvar::new(),
            next: AtomicUsize::new(0),
        })
    }

    fn notify(&self) {
        // Taken so that the notification cannot fall between a waiter's
        // check and its wait.
        let _state = lock(&self.state);
        self.changed.notify_all();
    }

    /// Waits for the group, the gate (`open`) or a stop request. A function
    /// whose gate is open or whose stop was requested does not join.
    fn meet(self: &Arc<Self>, open: &Arc<AtomicBool>, stop: &StopToken) {
        let me = self.clone();
        let _wake = stop.on_stop(move || me.notify());
        let deadline = Instant::now() + BARRIER_LIMIT;
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        let mut state = lock(&self.state);
        let waiting = Waiting {
            me: id,
            open: open.clone(),
            stop: stop.clone(),
        };
        if waiting.leaving() {
            return;
        }
        state.0.retain(|w| !w.leaving());
        state.0.push(waiting);
        if state.0.len() == self.size {
            state.0.clear();
            state.1 += 1;
            self.changed.notify_all();
            return;
        }
        let group = state.1;
        loop {
            if state.1 != group {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if open.load(Ordering::SeqCst) || stop.is_stopped() || left.is_zero() {
                state.0.retain(|w| w.me != id);
                return;
            }
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// The test's end of a barrier function's gate; dropping it opens it.
struct BarrierGate {
    open: Arc<AtomicBool>,
    at: Arc<Rendezvous>,
}

impl BarrierGate {
    fn open(&self) {
        self.open.store(true, Ordering::SeqCst);
        self.at.notify();
    }
}

impl Drop for BarrierGate {
    fn drop(&mut self) {
        self.open();
    }
}

/// The test's end of a job's gate.
enum JobGate {
    Plain(Gate),
    Barrier(BarrierGate),
}

impl JobGate {
    fn open(&self) {
        match self {
            JobGate::Plain(g) => g.open(),
            JobGate::Barrier(g) => g.open(),
        }
    }
}

/// The function's end of its gate.
enum Held {
    Plain(Hold),
    Barrier(Arc<AtomicBool>, Arc<Rendezvous>),
}

fn make_func(kind: Kind, tag: usize, probe: Arc<Probe>, held: Option<Held>) -> Func {
    Box::new(move |stop: &StopToken| {
        let _inside = probe.enter(tag);
        match (kind, held) {
            (Kind::Panics, _) => panic!("{ON_PURPOSE} {tag}"),
            (Kind::Gated, Some(Held::Plain(h))) => {
                h.wait_or_stop(stop);
            }
            (Kind::IgnoresStop, Some(Held::Plain(h))) => h.wait(),
            (Kind::Barrier, Some(Held::Barrier(open, at))) => at.meet(&open, stop),
            _ => {}
        }
        Val {
            tag,
            stopped: stop.is_stopped(),
        }
    })
}

/// Records the order of the `Started` events.
#[derive(Default)]
struct Starts(Mutex<Vec<JobId>>);

impl Observer for Starts {
    fn on_event(&self, event: &JobEvent) {
        if event.kind == EventKind::Started {
            lock(&self.0).push(event.id);
        }
    }
}

/// An awaiting caller's waker: counts its wake-ups. The job's outcome wakes
/// it once; a caller's 1 ms timer once more.
#[derive(Default)]
struct Wakes(AtomicUsize);

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

type Awaiting = Pin<Box<OffloadFuture<Func, Val>>>;

/// Polls an awaiting caller once with its own waker.
fn poll_caller(fut: &mut Awaiting, wakes: &Arc<Wakes>) -> Poll<Result<Val, Error>> {
    let waker = Waker::from(wakes.clone());
    fut.as_mut().poll(&mut Context::from_waker(&waker))
}

// ---------------------------------------------------------------------------
// The harness

/// A live owner handle.
struct Slot {
    tag: usize,
    handle: JobHandle<Val>,
    /// Its spawned `with_timeout` has not been used up by an await yet.
    timer: bool,
    /// Its outcome was taken by an earlier wait.
    taken: bool,
    /// Its holder left at its spawned time-out (the policy was applied
    /// then): dropping it does nothing more.
    left: bool,
}

/// A producer waiting for room in `submit().await`.
struct Blocked {
    tag: usize,
    gate: Option<JobGate>,
    fut: Submitting,
}

/// A caller awaiting `offload(f)` directly, still waiting.
struct Caller {
    tag: usize,
    fut: Awaiting,
    /// It has a 1 ms time-out (else it can only leave by dropping).
    timer: bool,
    /// The abandon policy that applies when it leaves.
    policy: AbandonPolicy,
    wakes: Arc<Wakes>,
}

impl Caller {
    /// Whether the job's outcome is published: only its wake-up says so
    /// (the 1 ms timer wakes it once too).
    fn woken_by_outcome(&self) -> bool {
        let needed = 1 + usize::from(self.timer);
        self.wakes.0.load(Ordering::SeqCst) >= needed
    }
}

/// What the model said at the last settled step, to tell how far the real
/// pool may lag behind it since.
#[derive(Default)]
struct Settled {
    counts: Counts,
    terminal: u64,
    states: Vec<JobState>,
}

/// What a batch that stopped early tells of its jobs: how many at least
/// ran (those whose outcomes it returned and those before them), how many
/// at most were accepted (those it took), and how many outcomes it
/// returned (their jobs had finished before the stop).
struct StoppedBatch {
    ran_at_least: usize,
    accepted_at_most: usize,
    finished: usize,
}

/// The tag of the job a batch outcome comes from: its value, its error
/// value or its panic message says it.
fn answer_tag(got: &Result<Val, BatchError<Val>>) -> Option<usize> {
    match got {
        Ok(v) | Err(BatchError::Failed(v)) => Some(v.tag),
        Err(BatchError::Job(Error::Panicked { message, .. })) => {
            message.strip_prefix(ON_PURPOSE)?.trim_start().parse().ok()
        }
        _ => None,
    }
}

struct Harness {
    cfg: Cfg,
    /// `None` once the last clone was dropped.
    pool: Option<Offloader>,
    weak: WeakOffloader,
    thread: String,
    starts: Option<Arc<Starts>>,
    rendezvous: Arc<Rendezvous>,
    model: Model,
    probe: Arc<Probe>,
    slots: Vec<Slot>,
    callers: Vec<Caller>,
    gates: HashMap<usize, JobGate>,
    gated: Vec<usize>,
    ids: HashMap<usize, JobId>,
    tags: HashMap<JobId, usize>,
    blocked: Option<Blocked>,
    settled: Settled,
    /// Inside a batch: no note per job.
    batching: bool,
    log: Steps,
    /// How long the real system may take to reach the model's state.
    settle_within: Duration,
    /// Job groups 0 and 1 (a child of 0); let go of with the last clone.
    groups: Option<[JobGroup; 2]>,
}

impl Harness {
    fn new(cfg: Cfg, model_cfg: Cfg) -> Harness {
        // Its own thread name, to see its workers exit after the last
        // clone is dropped (at most 15 bytes on Linux).
        static POOLS: AtomicUsize = AtomicUsize::new(0);
        let thread = format!("model{}", POOLS.fetch_add(1, Ordering::Relaxed) % 1_000_000);
        let mut b = builder(cfg.max_in_flight, cfg.queue_capacity)
            .abandon_policy(cfg.policy)
            .thread_name(thread.clone());
        if cfg.short_keep_alive {
            b = b.keep_alive(Duration::from_millis(1));
        }
        let starts = cfg.observer.then(|| Arc::new(Starts::default()));
        if let Some(s) = &starts {
            b = b.observer(s.clone());
        }
        let pool = b.build().expect("valid configuration");
        // The model predicts every refusal; a refusal for a deadline rests
        // on measured run times, which it cannot predict (tests/overload.rs
        // checks those).
        pool.__judge_no_deadlines();
        let group = pool.group();
        let groups = Some([group.clone(), group.child()]);
        Harness {
            cfg,
            weak: pool.downgrade(),
            pool: Some(pool),
            thread,
            starts,
            rendezvous: Rendezvous::new(cfg.max_in_flight),
            model: Model::new(model_cfg),
            probe: Arc::default(),
            slots: Vec::new(),
            callers: Vec::new(),
            gates: HashMap::new(),
            gated: Vec::new(),
            ids: HashMap::new(),
            tags: HashMap::new(),
            blocked: None,
            settled: Settled::default(),
            batching: false,
            log: Steps::default(),
            settle_within: SETTLE,
            groups,
        }
    }

    #[track_caller]
    fn fail(&self, msg: String) -> ! {
        let real = match &self.pool {
            Some(p) => format!(
                "{:?}, idle {}, terminated {}",
                p.metrics(),
                p.is_idle(),
                p.is_terminated()
            ),
            None => format!(
                "last clone dropped; functions inside now {}",
                self.probe.now.load(Ordering::SeqCst)
            ),
        };
        self.log.fail(&msg, &self.cfg, &self.model.summary(), &real)
    }

    /// The pool; only called where the last clone has not been dropped.
    #[track_caller]
    fn pool(&self) -> &Offloader {
        match &self.pool {
            Some(p) => p,
            None => self.fail("the last clone was dropped".to_owned()),
        }
    }

    /// `true` (with a note) if the operation needs the pool and the last
    /// clone is gone.
    fn no_pool(&mut self) -> bool {
        if self.pool.is_none() {
            self.note(" -> skipped (the last clone was dropped)".to_owned());
        }
        self.pool.is_none()
    }

    fn note(&mut self, s: String) {
        self.log.note(&s);
    }

    /// Awaits `fut`, failing the case (with its steps) after [`HANG`].
    async fn within<F: IntoFuture>(&self, what: &str, fut: F) -> F::Output {
        match try_within(what, fut).await {
            Ok(v) => v,
            Err(hung) => self.fail(hung),
        }
    }

    fn make(&self, kind: Kind, tag: usize) -> (Func, Option<JobGate>) {
        let (tx, held) = match kind {
            Kind::Barrier => {
                let open = Arc::new(AtomicBool::new(false));
                let at = self.rendezvous.clone();
                let g = BarrierGate {
                    open: open.clone(),
                    at: at.clone(),
                };
                (Some(JobGate::Barrier(g)), Some(Held::Barrier(open, at)))
            }
            k if k.gated() => {
                let (tx, hold) = gate();
                (Some(JobGate::Plain(tx)), Some(Held::Plain(hold)))
            }
            _ => (None, None),
        };
        (make_func(kind, tag, self.probe.clone(), held), tx)
    }

    fn name(named: bool, tag: usize) -> Option<String> {
        named.then(|| format!("n{tag}"))
    }

    fn register(&mut self, tag: usize, id: Option<JobId>, gate: Option<JobGate>) {
        if let Some(id) = id {
            if let Some(old) = self.ids.insert(tag, id) {
                ensure!(self, old == id, "job {tag} has two ids, {old} and {id}");
            }
            if let Some(old) = self.tags.insert(id, tag) {
                ensure!(self, old == tag, "id {id} names jobs {old} and {tag}");
            }
        }
        if let Some(g) = gate {
            self.gates.insert(tag, g);
            self.gated.push(tag);
        }
        if !self.batching {
            self.note(format!(" -> job {tag}"));
        }
    }

    fn pick(&self, h: u8) -> Option<usize> {
        (!self.slots.is_empty()).then(|| h as usize % self.slots.len())
    }

    /// Checks an outcome against the model's final state for job `tag`.
    fn check_outcome(&self, what: &str, tag: usize, taken: bool, got: &Result<Val, Error>) {
        let id = self.ids.get(&tag).copied();
        let text = got
            .as_ref()
            .err()
            .map(ToString::to_string)
            .unwrap_or_default();
        if let Err(e) = got {
            ensure!(
                self,
                id.is_none() || e.job_id() == id,
                "{what}: error for job {tag} names {:?}, expected {id:?}: {e}",
                e.job_id()
            );
        }
        // A value is taken once; an error outcome is returned again by
        // every later wait.
        if taken && matches!(self.model.jobs[tag].st, St::Completed(_)) {
            ensure!(
                self,
                matches!(got, Err(Error::OutcomeTaken { .. })) && text.contains("already taken"),
                "{what}: job {tag}'s outcome was taken before, got {got:?}"
            );
            return;
        }
        let ok = match &self.model.jobs[tag].st {
            St::Completed(v) => matches!(got, Ok(g) if g == v),
            St::Panicked => {
                matches!(got, Err(Error::Panicked { message, .. }) if *message == format!("{ON_PURPOSE} {tag}"))
                    && text.contains("panicked")
                    && text.contains("worker survived")
                    && text.contains("permit was released")
            }
            St::Cancelled => {
                matches!(got, Err(Error::Cancelled { id: Some(_) }))
                    && text.contains("cancelled before it started")
                    && text.contains("never ran")
            }
            St::Unstarted => {
                matches!(got, Err(Error::ShuttingDown { id: Some(_) }))
                    && text.contains("never started")
                    && text.contains("unstarted")
            }
            st => self.fail(format!(
                "{what}: checking an outcome of job {tag} while it is {st:?}"
            )),
        };
        ensure!(
            self,
            ok,
            "{what}: job {tag} is {:?} by the model, its owner got {got:?} ({text})",
            self.model.jobs[tag].st
        );
    }

    /// Checks a caller's time-out error.
    fn check_timed_out(
        &self,
        what: &str,
        tag: usize,
        want_state: JobState,
        want_fate: Fate,
        got: &Result<Val, Error>,
    ) {
        let text = got
            .as_ref()
            .err()
            .map(ToString::to_string)
            .unwrap_or_default();
        let ok = matches!(got, Err(Error::TimedOut { state, fate, .. })
            if *state == Some(want_state) && *fate == want_fate);
        ensure!(
            self,
            ok,
            "{what}: job {tag}: expected a time-out with the job {want_state:?} and fate {want_fate:?}, got {got:?}"
        );
        let id = self.ids[&tag];
        ensure!(
            self,
            text.contains(&format!("stopped waiting for job {id}"))
                && text.contains(&want_state.to_string())
                && text.contains(&want_fate.to_string()),
            "{what}: the time-out error does not say what happened to job {tag}: {text}"
        );
    }

    /// Every snapshot, at every instant: the ledger and the limit.
    fn check_snapshot(&self, m: Option<&Metrics>) {
        let max = self.cfg.max_in_flight as u64;
        if let Some(m) = m {
            ensure!(self, m.ledger_balances(), "ledger does not balance: {m:?}");
            ensure!(
                self,
                m.running <= max && m.max_running <= max && m.workers <= max,
                "more than max_in_flight {max} running or workers: {m:?}"
            );
        }
        let inside = self.probe.max.load(Ordering::SeqCst);
        ensure!(
            self,
            inside <= self.cfg.max_in_flight,
            "{inside} functions ran at once under max_in_flight {max}"
        );
    }

    /// The start order the real pool shows so far, as tags (`None`: a job
    /// whose id the test never saw), if it can show it: the observer's
    /// `Started` events; with one permit, the functions' own records too.
    fn real_start_order(&self) -> Option<Vec<Option<usize>>> {
        if let Some(starts) = &self.starts {
            let ids = lock(&starts.0);
            return Some(ids.iter().map(|id| self.tags.get(id).copied()).collect());
        }
        (self.cfg.max_in_flight == 1)
            .then(|| lock(&self.probe.ran).iter().map(|&t| Some(t)).collect())
    }

    /// Fails at once if the real start order so far is not a prefix of the
    /// model's (FIFO among the jobs left in the queue); returns whether it
    /// is all of it.
    fn check_start_order(&self) -> bool {
        let Some(real) = self.real_start_order() else {
            return true;
        };
        let want = &self.model.start_order;
        let prefix = real.len() <= want.len()
            && real.iter().zip(want).all(|(got, &w)| match got {
                Some(t) => *t == w,
                None => !self.ids.contains_key(&w),
            });
        ensure!(
            self,
            prefix,
            "start order (FIFO): model {want:?}, real {real:?}"
        );
        real.len() == want.len()
    }

    /// What still differs between the real system and the model, if
    /// anything (the real system may still be on its way).
    fn mismatch(&self, m: Option<&Metrics>) -> Option<String> {
        let c = &self.model.c;
        if let Some(m) = m {
            let pairs = [
                ("accepted", c.accepted, m.accepted),
                ("queued", self.model.queue.len() as u64, m.queued),
                ("running", self.model.running.len() as u64, m.running),
                ("completed", c.completed, m.completed),
                ("panicked", c.panicked, m.panicked),
                ("cancelled", c.cancelled, m.cancelled),
                ("unstarted", c.unstarted, m.unstarted),
                ("rejected_full", c.rejected_full, m.rejected_full),
                (
                    "rejected_timed_out",
                    c.rejected_timed_out,
                    m.rejected_timed_out,
                ),
                (
                    "rejected_shutdown",
                    c.rejected_shutdown,
                    m.rejected_shutdown,
                ),
                ("rejected_spawn", 0, m.rejected_spawn),
                (
                    "callers_timed_out",
                    c.callers_timed_out,
                    m.callers_timed_out,
                ),
                ("callers_dropped", c.callers_dropped, m.callers_dropped),
                (
                    "running_after_caller_left",
                    c.running_after_caller_left,
                    m.running_after_caller_left,
                ),
                ("stop_requests", c.stop_requests, m.stop_requests),
            ];
            let diffs: Vec<String> = pairs
                .iter()
                .filter(|(_, want, got)| want != got)
                .map(|(what, want, got)| format!("metrics.{what}: model {want}, real {got}"))
                .collect();
            if !diffs.is_empty() {
                return Some(diffs.join("; "));
            }
            if m.max_running < self.model.max_running as u64 {
                return Some(format!(
                    "metrics.max_running: model at least {}, real {}",
                    self.model.max_running, m.max_running
                ));
            }
        } else {
            // No metrics without a pool: what the functions record.
            let inside = self.probe.now.load(Ordering::SeqCst);
            if inside != self.model.running.len() {
                return Some(format!(
                    "functions inside now: model {}, real {inside}",
                    self.model.running.len()
                ));
            }
        }
        // A start out of FIFO order fails at once, not as a lag.
        let all_starts = self.check_start_order();
        let ran = lock(&self.probe.ran).clone();
        if ran.len() != self.model.start_order.len() {
            return Some(format!(
                "functions that ran: model {}, real {}",
                self.model.start_order.len(),
                ran.len()
            ));
        }
        let mut ran = ran;
        ran.sort_unstable();
        if ran != self.model.started() {
            return Some(format!(
                "functions that ran: model {:?}, real {ran:?}",
                self.model.started()
            ));
        }
        if !all_starts {
            return Some("not every start event delivered yet".to_owned());
        }
        let drain = self.probe.drain_max.load(Ordering::SeqCst);
        if drain < self.model.drain_width {
            return Some(format!(
                "functions started during the drain at once: model at least {}, real {drain}",
                self.model.drain_width
            ));
        }
        for s in &self.slots {
            if self.model.jobs[s.tag].st.terminal() && !s.handle.is_finished() {
                return Some(format!("handle of job {} has no outcome yet", s.tag));
            }
        }
        for c in &self.callers {
            if self.model.jobs[c.tag].st.terminal() && !c.woken_by_outcome() {
                return Some(format!(
                    "the caller awaiting job {} was not woken by its outcome yet",
                    c.tag
                ));
            }
        }
        if self.blocked.is_some() && self.model.blocked.is_none() {
            return Some("the blocked producer has not been served yet".to_owned());
        }
        // Idle includes every outcome published (pool.rs inv. 6), which
        // may lag the counters by a moment.
        if let Some(pool) = &self.pool {
            if self.model.idle() && !pool.is_idle() {
                return Some("not idle yet".to_owned());
            }
        }
        None
    }

    /// Callers awaiting a job the model finished were woken by its outcome
    /// (`mismatch` waited for that): each polls it, as a real caller would.
    fn resolve_callers(&mut self) {
        let mut i = 0;
        while i < self.callers.len() {
            let tag = self.callers[i].tag;
            if !self.model.jobs[tag].st.terminal() {
                i += 1;
                continue;
            }
            let mut c = self.callers.remove(i);
            match poll_caller(&mut c.fut, &c.wakes) {
                Poll::Ready(got) => self.check_outcome("an awaiting caller", tag, false, &got),
                Poll::Pending => self.fail(format!(
                    "the caller awaiting job {tag} was woken, yet has no outcome"
                )),
            }
        }
    }

    /// Polls the producer blocked in `submit().await`, if any, and checks
    /// what it got against the model.
    async fn poll_blocked(&mut self) {
        let Some(b) = self.blocked.as_mut() else {
            return;
        };
        let Poll::Ready(got) = poll_once(b.fut.as_mut()).await else {
            return;
        };
        let b = self.blocked.take().expect("blocked producer");
        ensure!(
            self,
            self.model.blocked.is_none(),
            "the producer blocked on a full queue got through while the model's queue is full: {:?}",
            got.as_ref().map(|h| h.id()).map_err(|e| e.to_string())
        );
        match got {
            Ok(handle) => {
                let accepted = self.model.jobs.len() > b.tag;
                ensure!(
                    self,
                    accepted,
                    "the blocked producer was accepted; the model refused it"
                );
                self.log
                    .push(format!("   (blocked producer accepted as job {})", b.tag));
                self.register(b.tag, Some(handle.id()), b.gate);
                self.slots.push(Slot {
                    tag: b.tag,
                    handle,
                    timer: false,
                    taken: false,
                    left: false,
                });
            }
            Err(e) => {
                let text = e.to_string();
                ensure!(
                    self,
                    self.model.jobs.len() <= b.tag
                        && matches!(e.reason(), Error::ShuttingDown { id: None })
                        && text.contains("shutting down"),
                    "the blocked producer got {text}; the model accepted it"
                );
                self.log
                    .push("   (blocked producer woken by the shutdown)".to_owned());
            }
        }
    }

    /// Waits (bounded) until the real system is in the model's state, then
    /// checks everything observable.
    async fn settle(&mut self) {
        let deadline = Instant::now() + self.settle_within;
        let mut round = 0u32;
        loop {
            self.poll_blocked().await;
            let m = self.pool.as_ref().map(Offloader::metrics);
            self.check_snapshot(m.as_ref());
            let Some(diff) = self.mismatch(m.as_ref()) else {
                break;
            };
            if Instant::now() > deadline {
                self.fail(format!(
                    "the offloader did not reach the model's state within {:?}: {diff}",
                    self.settle_within
                ));
            }
            // A bounded wait for a condition, not an ordering: poll again.
            round += 1;
            if round < 200 {
                std::thread::yield_now();
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        self.resolve_callers();
        match self.pool.clone() {
            Some(pool) => {
                if self.model.terminated() {
                    self.within("termination the model predicts", pool.terminated())
                        .await;
                } else {
                    ensure!(
                        self,
                        !pool.is_terminated(),
                        "terminated, but the model says it is not"
                    );
                }
                ensure!(
                    self,
                    pool.is_shutdown() == self.model.shutdown,
                    "is_shutdown() is {}",
                    pool.is_shutdown()
                );
                ensure!(
                    self,
                    self.model.idle() || !pool.is_idle(),
                    "idle, but the model has jobs queued or running"
                );
                self.check_running_jobs(&pool);
                self.check_groups();
            }
            None => {
                ensure!(
                    self,
                    self.weak.upgrade().is_none(),
                    "the pool is open again after its last clone was dropped"
                );
                if self.model.terminated() {
                    // The drop-started shutdown ends: every worker exits.
                    let deadline = Instant::now() + HANG;
                    while threads_named(&self.thread) > 0 {
                        ensure!(
                            self,
                            Instant::now() < deadline,
                            "worker threads {} still alive {HANG:?} after the drain the model predicts",
                            self.thread
                        );
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            }
        }
        for s in &self.slots {
            let job = &self.model.jobs[s.tag];
            ensure!(
                self,
                s.handle.state() == job.st.job_state(),
                "handle of job {} reports {:?}, model {:?}",
                s.tag,
                s.handle.state(),
                job.st
            );
            ensure!(
                self,
                s.handle.is_stopped() == job.stop,
                "handle of job {}: is_stop_requested() is {}",
                s.tag,
                job.stop
            );
            ensure!(
                self,
                s.handle.id() == self.ids[&s.tag] && s.handle.name() == job.name.as_deref(),
                "handle of job {}: id {} name {:?}",
                s.tag,
                s.handle.id(),
                s.handle.name()
            );
        }
        let ran = lock(&self.probe.ran).clone();
        let mut dedup = ran.clone();
        dedup.sort_unstable();
        dedup.dedup();
        ensure!(
            self,
            dedup.len() == ran.len(),
            "a function ran twice: {ran:?}"
        );
        self.settled = Settled {
            counts: self.model.c.clone(),
            terminal: self.model.terminal(),
            states: self.model.jobs.iter().map(|j| j.st.job_state()).collect(),
        };
    }

    /// Each job group's metrics match the model's.
    fn check_groups(&self) {
        let Some(groups) = &self.groups else {
            return;
        };
        for (g, group) in groups.iter().enumerate() {
            let m = group.metrics();
            let got = [
                m.accepted,
                m.queued,
                m.running,
                m.completed,
                m.panicked,
                m.cancelled,
                m.unstarted,
                m.rejected,
                u64::from(m.stopped),
            ];
            let want = self.model.group_metrics(g);
            ensure!(
                self,
                m.ledger_balances() && got == want,
                "group {g}: metrics {got:?}, model {want:?} (accepted, queued, running, completed, panicked, cancelled, unstarted, rejected, stopped)"
            );
        }
    }

    fn check_running_jobs(&self, pool: &Offloader) {
        let mut running: Vec<(JobId, bool)> = pool
            .running_jobs()
            .iter()
            .map(|r| (r.id, r.stop_requested))
            .collect();
        running.sort();
        let mut want: Vec<(JobId, bool)> = self
            .model
            .running
            .iter()
            .filter_map(|&j| Some((*self.ids.get(&j)?, self.model.jobs[j].stop)))
            .collect();
        want.sort();
        if want.len() == self.model.running.len() {
            ensure!(
                self,
                running == want,
                "running_jobs() lists {running:?}, the model {want:?}"
            );
        }
    }

    /// Whether the real pool's state of job `tag` may differ from the
    /// model's because the model moved it since the last settled step (the
    /// real pool may lag behind the model, never run ahead of it).
    fn moved_since_settled(&self, tag: usize) -> bool {
        self.settled.states.get(tag).copied() != Some(self.model.jobs[tag].st.job_state())
    }

    /// Whether the real pool, lagging behind the model by the jobs the
    /// model finished since the last settled step, could refuse a job
    /// `Full` that the model accepts. Its unfinished jobs are at most the
    /// model's plus that lag.
    fn lag_could_refuse(&self) -> bool {
        let lag = (self.model.terminal() - self.settled.terminal) as usize;
        (self.model.unfinished() + lag).saturating_sub(self.model.max) >= self.model.cap
    }

    async fn step(&mut self, n: usize, op: Op) {
        self.log.push(format!("{n}: {op:?}"));
        let needs_pool = matches!(
            op,
            Op::Spawn { .. }
                | Op::Submit { .. }
                | Op::Direct { .. }
                | Op::Batch { .. }
                | Op::Shutdown
                | Op::ShutdownNow
                | Op::Close
                | Op::DropLast
                | Op::Idle
                | Op::StopGroup(_)
                | Op::InvokeAll { .. }
                | Op::InvokeAny { .. }
                | Op::Map { .. }
        );
        if needs_pool && self.no_pool() {
            self.settle().await;
            return;
        }
        match op {
            Op::Spawn {
                kind,
                named,
                timeout,
            } => self.spawn(kind, named, timeout),
            Op::Submit { kind, named } => self.submit(kind, named).await,
            Op::Direct {
                kind,
                named,
                leave,
                policy,
            } => self.direct(kind, named, leave, policy).await,
            Op::Batch {
                n,
                mix,
                callers,
                then,
            } => self.batch(n, mix, callers, then).await,
            Op::CancelAt(pos) => {
                if let Some(tag) = self.target(pos, |h, t| h.slot_of(t).is_some()) {
                    let i = self.slot_of(tag).expect("a slot");
                    let got = self.slots[i].handle.cancel();
                    let want = self.model.cancel(tag);
                    self.note(format!(": {got}"));
                    ensure!(
                        self,
                        got == want,
                        "cancel() on job {tag} returned {got}, model {want}"
                    );
                }
            }
            Op::StopAt(pos) => {
                if let Some(tag) = self.target(pos, |h, t| h.slot_of(t).is_some()) {
                    let i = self.slot_of(tag).expect("a slot");
                    let got = self.slots[i].handle.stop();
                    let want = self.model.stop(tag);
                    self.note(format!(": {got}"));
                    ensure!(
                        self,
                        got == want,
                        "stop() on job {tag} returned {got}, model {want}"
                    );
                }
            }
            Op::LeaveAt(pos, leave) => {
                if let Some(tag) = self.target(pos, |h, t| h.caller_of(t).is_some()) {
                    let i = self.caller_of(tag).expect("a caller");
                    let c = self.callers.remove(i);
                    self.leave(c, leave).await;
                }
            }
            Op::ReleaseRunning(i) => {
                if !self.model.running.is_empty() {
                    let tag = self.model.running[i as usize % self.model.running.len()];
                    self.note(format!(" -> job {tag}"));
                    if let Some(gate) = self.gates.get(&tag) {
                        gate.open();
                    }
                    self.model.release(tag);
                }
            }
            Op::DropLast => self.drop_last().await,
            Op::Cancel(h) => {
                if let Some(i) = self.pick(h) {
                    let tag = self.slots[i].tag;
                    let got = self.slots[i].handle.cancel();
                    let want = self.model.cancel(tag);
                    self.note(format!(" -> job {tag}: {got}"));
                    ensure!(
                        self,
                        got == want,
                        "cancel() on job {tag} returned {got}, model {want}"
                    );
                }
            }
            Op::Stop(h) => {
                if let Some(i) = self.pick(h) {
                    let tag = self.slots[i].tag;
                    let got = self.slots[i].handle.stop();
                    let want = self.model.stop(tag);
                    self.note(format!(" -> job {tag}: {got}"));
                    ensure!(
                        self,
                        got == want,
                        "stop() on job {tag} returned {got}, model {want}"
                    );
                }
            }
            Op::DropHandle(h) => {
                if let Some(i) = self.pick(h) {
                    let s = self.slots.remove(i);
                    self.note(format!(" -> job {}", s.tag));
                    // Dropping the handle leaves under the pool's policy,
                    // quietly under `Keep` (a detach).
                    let policy = self.model.policy;
                    if !s.left && policy != AbandonPolicy::Keep {
                        self.model.abandon(s.tag, policy, false);
                    }
                    drop(s);
                    self.model.advance();
                }
            }
            Op::Detach(h) => {
                if let Some(i) = self.pick(h) {
                    let s = self.slots.remove(i);
                    self.note(format!(" -> job {}", s.tag));
                    s.handle.detach();
                }
            }
            Op::Await(h) => {
                if let Some(i) = self.pick(h) {
                    self.await_handle(i).await;
                }
            }
            Op::TimeoutAround(h) => {
                if let Some(i) = self.pick(h) {
                    self.timeout_around(i).await;
                }
            }
            Op::BlockingWait(h) => {
                if let Some(i) = self.pick(h) {
                    self.blocking_wait(i);
                }
            }
            Op::Release(g) => {
                if !self.gated.is_empty() {
                    let tag = self.gated[g as usize % self.gated.len()];
                    self.note(format!(" -> job {tag}"));
                    if let Some(gate) = self.gates.get(&tag) {
                        gate.open();
                    }
                    self.model.release(tag);
                }
            }
            Op::ReleaseAll => {
                for gate in self.gates.values() {
                    gate.open();
                }
                self.model.release_all();
            }
            Op::Shutdown => self.shutdown(),
            Op::ShutdownNow => {
                self.probe.drain.store(true, Ordering::SeqCst);
                let got = self.pool().shutdown_now();
                let want = self.model.shutdown_now();
                self.note(format!(" -> unstarted jobs {want:?}"));
                let got: Vec<(JobId, Option<String>)> = got
                    .iter()
                    .map(|u| (u.id, u.name.as_deref().map(str::to_owned)))
                    .collect();
                let want: Vec<(JobId, Option<String>)> = want
                    .iter()
                    .map(|&j| (self.ids[&j], self.model.jobs[j].name.clone()))
                    .collect();
                ensure!(
                    self,
                    got == want,
                    "shutdown_now() returned {got:?}, the model's queue was {want:?}"
                );
            }
            Op::Close => self.close().await,
            Op::InvokeAll { n, group } => {
                self.invoke_all(usize::from(n), group.map(|g| usize::from(g % 2)))
                    .await;
            }
            Op::InvokeAny { n, seed, group } => {
                self.invoke_any(usize::from(n), seed, group.map(|g| usize::from(g % 2)))
                    .await;
            }
            Op::Map {
                n,
                limit,
                ordered,
                stop_on_error,
                seed,
                group,
            } => {
                let how = MapHow {
                    limit: usize::from(limit),
                    ordered,
                    stop_on_error,
                };
                self.map(usize::from(n), how, seed, group.map(|g| usize::from(g % 2)))
                    .await;
            }
            Op::StopGroup(g) => {
                let g = usize::from(g % 2);
                let groups = self.groups.as_ref().expect("open with the pool");
                let got = groups[g].stop();
                let want = self.model.stop_group(g);
                self.note(format!(": {got}"));
                ensure!(
                    self,
                    got == want,
                    "group {g} stop() returned {got}, model {want}"
                );
            }
            Op::Idle => {
                let pool = self.pool().clone();
                if self.model.idle() {
                    self.within("idle() on an idle pool", pool.idle()).await;
                } else {
                    let mut idle = Box::pin(pool.idle());
                    let ready = poll_once(idle.as_mut()).await.is_ready();
                    ensure!(
                        self,
                        !ready,
                        "idle() returned while the model has jobs queued or running"
                    );
                }
            }
        }
        self.settle().await;
    }

    fn shutdown(&mut self) {
        self.probe.drain.store(true, Ordering::SeqCst);
        self.pool().shutdown();
        self.model.shutdown();
        ensure!(
            self,
            self.pool().is_shutdown(),
            "not shut down after shutdown()"
        );
    }

    fn slot_of(&self, tag: usize) -> Option<usize> {
        self.slots.iter().position(|s| s.tag == tag)
    }

    fn caller_of(&self, tag: usize) -> Option<usize> {
        self.callers.iter().position(|c| c.tag == tag)
    }

    /// The job `pos` aims at among those `eligible` (noted with its place).
    fn target(&mut self, pos: Pos, eligible: impl Fn(&Self, usize) -> bool) -> Option<usize> {
        let (line, what): (Vec<usize>, &str) = match pos {
            Pos::Running(_) => (self.model.running.clone(), "running"),
            _ => (self.model.queue.iter().copied().collect(), "queued"),
        };
        let candidates: Vec<usize> = line
            .iter()
            .copied()
            .filter(|&t| eligible(self, t))
            .collect();
        if candidates.is_empty() {
            self.note(format!(" -> no {what} job to aim at"));
            return None;
        }
        let k = match pos {
            Pos::Front => 0,
            Pos::Back => candidates.len() - 1,
            Pos::At(i) => i as usize % candidates.len(),
            Pos::Running(i) => i as usize % candidates.len(),
        };
        let tag = candidates[k];
        let place = line.iter().position(|&t| t == tag).expect("in line");
        self.note(format!(
            " -> job {tag}, {what} {} of {}",
            place + 1,
            line.len()
        ));
        Some(tag)
    }

    /// An awaiting caller leaves its unfinished job: its 1 ms time-out
    /// passes (if it has one and `leave` says so), or it drops the future.
    async fn leave(&mut self, c: Caller, leave: Leave) -> Fate {
        let tag = c.tag;
        let st = self.model.jobs[tag].st.clone();
        // Settled: the real job is where the model has it.
        ensure!(
            self,
            !st.terminal() && !self.moved_since_settled(tag),
            "a caller leaves job {tag}, which the model has {st:?} since the last settled step"
        );
        if leave == Leave::TimesOut && c.timer {
            let got = self.within("the caller's 1 ms time-out", c.fut).await;
            let fate = self.model.abandon(tag, c.policy, true);
            if !self.batching {
                self.note(format!(", times out: {fate:?}"));
            }
            self.check_timed_out("awaited in a batch", tag, st.job_state(), fate, &got);
            fate
        } else {
            drop(c.fut);
            let fate = self.model.abandon(tag, c.policy, false);
            if !self.batching {
                self.note(format!(", drops it: {fate:?}"));
            }
            fate
        }
    }

    /// [`Harness::leave`] without a note.
    async fn leave_quietly(&mut self, c: Caller, leave: Leave) -> Fate {
        self.batching = true;
        let fate = self.leave(c, leave).await;
        self.batching = false;
        fate
    }

    /// `n` jobs, offered one after the other without waiting for the pool
    /// (but where its lag could refuse one the model accepts), then `then`.
    async fn batch(&mut self, n: u16, mix: Mix, callers: Callers, then: Then) {
        let first = self.model.jobs.len();
        let (full, shut) = (self.model.c.rejected_full, self.model.c.rejected_shutdown);
        let mut waits = 0;
        self.batching = true;
        for i in 0..usize::from(n) {
            let kind = mix.kind(i);
            if self.model.refusal().is_none() && self.lag_could_refuse() {
                waits += 1;
                self.settle().await;
            }
            match callers {
                Callers::Handles => self.spawn(kind, i % 3 == 0, false),
                Callers::Awaiting { timeout } => {
                    const POLICIES: [Option<AbandonPolicy>; 4] = [
                        None,
                        Some(AbandonPolicy::Keep),
                        Some(AbandonPolicy::CancelIfQueued),
                        Some(AbandonPolicy::CancelAndStop),
                    ];
                    if !self.await_kept(kind, timeout, POLICIES[i % 4]).await {
                        break;
                    }
                }
            }
        }
        self.batching = false;
        let last = self.model.jobs.len();
        self.note(format!(
            " -> jobs {first}..{last}, refused full {} shutting down {}, waited for the pool {waits} times",
            self.model.c.rejected_full - full,
            self.model.c.rejected_shutdown - shut
        ));
        match then {
            Then::Nothing => {}
            Then::Shutdown => self.shutdown(),
            Then::Close => {
                let mut sim = self.model.clone();
                if sim.close().escalated {
                    // The immediate stage hands back what is queued then:
                    // the real pool must have started what the model did.
                    self.settle().await;
                }
                self.close().await;
            }
            Then::DropLast => self.drop_last().await,
        }
    }

    /// Offers a job to a caller who awaits it and keeps waiting; `false` if
    /// the model refuses it (the caller would wait for room, or get the
    /// shutdown error: left to the single operations).
    async fn await_kept(
        &mut self,
        kind: Kind,
        timeout: bool,
        policy: Option<AbandonPolicy>,
    ) -> bool {
        if self.model.refusal().is_some() {
            return false;
        }
        let tag = self.model.jobs.len();
        // A 1 ms time-out only on a job that can't finish at once: every
        // permit is held by a function that can't return, so it queues.
        let timer = timeout && self.model.running.len() >= self.model.max;
        let (func, gate) = self.make(kind, tag);
        let mut o = self.pool().offload(func);
        if let Some(p) = policy {
            o = o.on_abandon(p);
        }
        if timer {
            o = o.with_timeout(SHORT);
        }
        let effective = policy.unwrap_or(self.model.policy);
        let mut fut: Awaiting = Box::pin(o.into_future());
        let wakes = Arc::new(Wakes::default());
        match poll_caller(&mut fut, &wakes) {
            Poll::Pending => {
                let id = fut.job_id();
                ensure!(self, id.is_some(), "an accepted offload has no job id");
                self.model.accept(kind, None, true);
                self.register(tag, id, gate);
                self.callers.push(Caller {
                    tag,
                    fut,
                    timer,
                    policy: effective,
                    wakes,
                });
            }
            Poll::Ready(Err(Error::TimedOut {
                state, fate, id, ..
            })) if timer => {
                // The 1 ms time-out ran out at the very first poll: the
                // caller left at the instant of submission (the job queued).
                self.model.accept(kind, None, false);
                self.register(tag, id, gate);
                let want_fate = self.model.abandon(tag, effective, true);
                self.model.advance();
                self.log.push(format!(
                    "   (job {tag}: timed out at the first poll, {fate:?})"
                ));
                ensure!(
                    self,
                    state == Some(JobState::Queued) && fate == want_fate,
                    "job {tag} timed out at the first poll {state:?} with fate {fate:?}, model Queued and {want_fate:?}"
                );
            }
            Poll::Ready(got) => {
                // Finished before the first poll returned: only a job the
                // model finishes at once.
                let id = got.as_ref().err().and_then(Error::job_id);
                self.model.accept(kind, None, true);
                self.register(tag, id, gate);
                self.check_outcome("an awaiting caller at its first poll", tag, false, &got);
            }
        }
        true
    }

    /// Drops the last `Offloader` clone: first the blocked producer and the
    /// awaiting callers, which hold clones, give up; then the test's own.
    async fn drop_last(&mut self) {
        if self
            .callers
            .iter()
            .any(|c| self.model.jobs[c.tag].st.terminal())
        {
            // They take their outcome first: only their wake-up says it is
            // there.
            self.settle().await;
        }
        if self.blocked.take().is_some() {
            self.model.blocked = None;
            self.note(" -> the blocked producer gives up".to_owned());
        }
        let mut fates: Vec<Fate> = Vec::new();
        while let Some(c) = self.callers.pop() {
            if self.moved_since_settled(c.tag) {
                // The real job may not be where the model put it yet (or
                // finished, and the caller takes its outcome): settle
                // first, with the caller back in line.
                self.callers.push(c);
                self.settle().await;
                continue;
            }
            fates.push(self.leave_quietly(c, Leave::Drops).await);
        }
        if !fates.is_empty() {
            let count = |f: Fate| fates.iter().filter(|&&g| g == f).count();
            self.note(format!(
                " -> {} awaiting callers dropped: {} kept, {} cancelled, {} stopped",
                fates.len(),
                count(Fate::Kept),
                count(Fate::Cancelled),
                count(Fate::StopRequested)
            ));
        }
        self.probe.drain.store(true, Ordering::SeqCst);
        // Groups hold clones of the pool (their jobs go on: `LetRun`).
        self.groups = None;
        self.pool = None;
        ensure!(
            self,
            self.weak.upgrade().is_none(),
            "the pool stays open after the test dropped its last clone"
        );
        self.model.shutdown();
    }

    /// `invoke_all` of `n` jobs (every fourth panics) through the pool or a
    /// group: refused outright after a shutdown or a group stop, else run
    /// only when the model says none of its jobs can wait on a gate.
    async fn invoke_all(&mut self, n: usize, group: Option<usize>) {
        let refusal = if self.model.shutdown {
            Some(Error::ShuttingDown { id: None })
        } else if group.is_some_and(|g| self.model.group_stopped[g]) {
            Some(Error::Cancelled { id: None })
        } else {
            None
        };
        // Nor find the queue full: a job waiting for room could be
        // overtaken by a later one of the batch (the start order would not
        // be input order; found by the mutation-testing helper as a flake).
        if refusal.is_none() && !self.batch_has_room(n) {
            self.note(" -> skipped (its jobs could wait on a gate or for room)".to_owned());
            return;
        }
        let first = self.model.jobs.len();
        let kinds: Vec<Kind> = (0..n)
            .map(|i| {
                if i % 4 == 3 {
                    Kind::Panics
                } else {
                    Kind::Returns
                }
            })
            .collect();
        let funcs: Vec<Func> = kinds
            .iter()
            .enumerate()
            .map(|(i, &kind)| self.make(kind, first + i).0)
            .collect();
        let batch = match (group, &self.groups) {
            (Some(g), Some(groups)) => groups[g].invoke_all(funcs),
            _ => self.pool().invoke_all(funcs),
        };
        let out = self.within("invoke_all", batch).await;
        ensure!(
            self,
            out.len() == n,
            "invoke_all gave {} outcomes for {n}",
            out.len()
        );
        if let Some(r) = refusal {
            for o in &out {
                let refused = matches!(o, Err(got) if std::mem::discriminant(got) == std::mem::discriminant(&r) && got.job_id().is_none());
                ensure!(
                    self,
                    refused,
                    "invoke_all: expected {r:?} refusals, got {o:?}"
                );
            }
            match r {
                Error::ShuttingDown { id: None } => self.model.c.rejected_shutdown += n as u64,
                _ => {
                    let g = group.expect("a group refusal");
                    for c in &mut self.model.group_rejected[..=g] {
                        *c += n as u64;
                    }
                }
            }
            self.note(format!(" -> refused ({r:?})"));
            return;
        }
        for (i, &kind) in kinds.iter().enumerate() {
            let tag = self.model.accept(kind, None, false);
            self.model.jobs[tag].group = group;
            ensure!(self, tag == first + i, "tags out of step");
        }
        self.model.advance();
        for (i, o) in out.iter().enumerate() {
            self.check_outcome("invoke_all", first + i, false, o);
        }
        self.note(format!(" -> jobs {first}..{}", first + n));
    }

    /// Why a batch through the pool or `group` is refused outright, if it
    /// is: after a shutdown, or once the group is stopped.
    fn batch_refusal(&self, group: Option<usize>) -> Option<Error> {
        if self.model.shutdown {
            Some(Error::ShuttingDown { id: None })
        } else if group.is_some_and(|g| self.model.group_stopped[g]) {
            Some(Error::Cancelled { id: None })
        } else {
            None
        }
    }

    /// Whether `at_once` jobs of a batch, submitted back to back, can
    /// neither wait on a gate (nothing queued, a permit free) nor find the
    /// queue full, however far the pool got with the earlier ones (a
    /// permit is released before the outcome is published): then each is
    /// accepted at its first try, so in input order, and they start in
    /// that order.
    fn batch_has_room(&self, at_once: usize) -> bool {
        let free = self.model.max.saturating_sub(self.model.running.len());
        self.model.queue.is_empty() && free > 0 && at_once <= free + self.model.cap
    }

    /// Counts `count` refusals `r` (from [`Harness::batch_refusal`]) of a
    /// batch through the pool or `group`: a group's count in the group and
    /// its ancestors (a batch's own group is a child of it).
    fn count_batch_refusals(&mut self, r: &Error, group: Option<usize>, count: usize) {
        match r {
            Error::ShuttingDown { id: None } => self.model.c.rejected_shutdown += count as u64,
            _ => {
                let g = group.expect("a group refusal");
                for c in &mut self.model.group_rejected[..=g] {
                    *c += count as u64;
                }
            }
        }
        self.note(format!(" -> {count} refused ({r:?})"));
    }

    fn check_refused(&self, what: &str, r: &Error, got: &BatchError<Val>) {
        let refused = matches!(got, BatchError::Job(e)
            if std::mem::discriminant(e) == std::mem::discriminant(r) && e.job_id().is_none());
        ensure!(
            self,
            refused,
            "{what}: expected {r:?} refusals, got {got:?}"
        );
    }

    /// The model accepts the jobs of a batch, `first..`, through `group`
    /// (their own group is a child of it), in input order.
    fn accept_batch(&mut self, first: usize, answers: &[Answer], group: Option<usize>) {
        for (i, a) in answers.iter().enumerate() {
            let tag = self.model.accept(a.kind(), None, false);
            self.model.jobs[tag].group = group;
            ensure!(self, tag == first + i, "tags out of step");
        }
    }

    /// Checks the outcome of job `tag` of an `invoke_any` or a `map`: the
    /// kind its answer gives, and the value, error value or panic the
    /// model's final state says.
    fn check_answer(
        &self,
        what: &str,
        tag: usize,
        answer: Answer,
        got: Result<Val, BatchError<Val>>,
    ) {
        let got = match (answer, got) {
            (Answer::Ok, Ok(v)) | (Answer::Err, Err(BatchError::Failed(v))) => Ok(v),
            (Answer::Panics, Err(BatchError::Job(e))) => Err(e),
            (answer, got) => self.fail(format!(
                "{what}: job {tag} answers {answer:?}, its outcome is {got:?}"
            )),
        };
        self.check_outcome(what, tag, false, &got);
    }

    /// After a batch stopped early (an `invoke_any` won, a `map` stopped on
    /// an error): the stop of its group cancelled its queued jobs and asked
    /// its running ones to stop, and the jobs it had not submitted yet
    /// never were. How many ran, and how many were accepted, is the pool's
    /// timing: waits (bounded) until none of them is queued or running,
    /// then learns both, within the bounds the contract sets:
    ///
    /// - the functions that ran (their own records) are the batch's first
    ///   `ran` jobs (accepted at the first try, in input order, and started
    ///   in FIFO order), at least `ran_at_least` of them;
    /// - `accepted` (the metrics) is between `ran` and `accepted_at_most`,
    ///   and the jobs accepted that did not run were cancelled;
    /// - stop requests went only to jobs still running at the stop (not
    ///   the `finished` ones whose outcomes the batch returned); a dropped
    ///   caller was counted only with its job still running; no caller
    ///   timed out.
    ///
    /// The model then accepts `accepted` jobs, cancels those that did not
    /// run and runs the others. Returns `(accepted, ran)`.
    async fn learn_stopped_batch(
        &mut self,
        what: &str,
        first: usize,
        answers: &[Answer],
        group: Option<usize>,
        bounds: StoppedBatch,
    ) -> (usize, usize) {
        let n = answers.len();
        let pool = self.pool().clone();
        let running = self.model.running.len() as u64;
        let deadline = Instant::now() + HANG;
        let mut round = 0u32;
        let m = loop {
            let m = pool.metrics();
            if m.queued == 0 && m.running == running {
                break m;
            }
            ensure!(
                self,
                Instant::now() < deadline,
                "{what}: jobs of the batch still queued or running {HANG:?} after it returned: {m:?}"
            );
            // A bounded wait for a condition, not an ordering: poll again.
            round += 1;
            if round < 200 {
                std::thread::yield_now();
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        let c = &self.model.c;
        let delta = |got: u64, had: u64| got.wrapping_sub(had) as usize;
        let accepted = delta(m.accepted, c.accepted);
        let cancelled = delta(m.cancelled, c.cancelled);
        let stops = delta(m.stop_requests, c.stop_requests);
        let dropped = delta(m.callers_dropped, c.callers_dropped);
        let left_running = delta(m.running_after_caller_left, c.running_after_caller_left);
        let timed_out = delta(m.callers_timed_out, c.callers_timed_out);
        let mut ran: Vec<usize> = lock(&self.probe.ran)
            .iter()
            .copied()
            .filter(|t| (first..first + n).contains(t))
            .collect();
        ran.sort_unstable();
        let k = ran.len();
        ensure!(
            self,
            ran.iter().copied().eq(first..first + k),
            "{what}: the functions that ran, {ran:?}, are not the batch's first ones (jobs {first}..{})",
            first + n
        );
        ensure!(
            self,
            bounds.ran_at_least <= k && k <= accepted && accepted <= bounds.accepted_at_most.min(n),
            "{what}: {k} of the batch's functions ran (at least {} must have), {accepted} jobs accepted (at most {} could be)",
            bounds.ran_at_least,
            bounds.accepted_at_most.min(n)
        );
        ensure!(
            self,
            cancelled == accepted - k,
            "{what}: {cancelled} jobs cancelled, but {accepted} accepted and {k} ran"
        );
        ensure!(
            self,
            stops <= k.saturating_sub(bounds.finished)
                && dropped == left_running
                && dropped <= stops
                && timed_out == 0,
            "{what}: {stops} stop requests, {dropped} callers dropped ({left_running} with the job running), {timed_out} timed out; {k} ran, {} of them gave the batch's outcomes",
            bounds.finished
        );
        self.accept_batch(first, &answers[..accepted], group);
        self.model.cancel_unstarted(first + k..first + accepted);
        let c = &mut self.model.c;
        c.stop_requests += stops as u64;
        c.callers_dropped += dropped as u64;
        c.running_after_caller_left += left_running as u64;
        self.model.advance();
        (accepted, k)
    }

    /// `invoke_any` of `n` jobs (their answers by `seed`) through the pool
    /// or a group: refused outright after a shutdown or a group stop, else
    /// run only when its jobs can neither wait on a gate nor for room.
    /// A winner must be a job answering `Ok`, with its value; with none,
    /// every error, in input order.
    async fn invoke_any(&mut self, n: usize, seed: u8, group: Option<usize>) {
        let refusal = self.batch_refusal(group);
        if refusal.is_none() && !self.batch_has_room(n) {
            self.note(" -> skipped (its jobs could wait on a gate or for room)".to_owned());
            return;
        }
        let first = self.model.jobs.len();
        let answers: Vec<Answer> = (0..n).map(|i| Answer::of(&Answer::ANY, seed, i)).collect();
        let fs: Vec<_> = answers
            .iter()
            .enumerate()
            .map(|(i, &a)| {
                let func = self.make(a.kind(), first + i).0;
                move |stop: &StopToken| -> Result<Val, Val> {
                    let v = func(stop);
                    if a == Answer::Err {
                        Err(v)
                    } else {
                        Ok(v)
                    }
                }
            })
            .collect();
        let target = group.and_then(|g| Some(self.groups.as_ref()?[g].clone()));
        let pool = self.pool().clone();
        let race = async move {
            match target {
                Some(g) => g.invoke_any(fs).await,
                None => pool.invoke_any(fs).await,
            }
        };
        let out = self.within("invoke_any", race).await;
        if let Some(r) = refusal {
            let errors = match out {
                Err(failed) => failed.errors,
                Ok(won) => self.fail(format!("invoke_any: expected {r:?} refusals, got {won:?}")),
            };
            ensure!(
                self,
                errors.len() == n,
                "invoke_any gave {} errors for {n} refused jobs",
                errors.len()
            );
            for e in &errors {
                self.check_refused("invoke_any", &r, e);
            }
            self.count_batch_refusals(&r, group, n);
            return;
        }
        match out {
            Ok((w, v)) => {
                ensure!(
                    self,
                    answers.get(w) == Some(&Answer::Ok),
                    "invoke_any: job {w} of {n} won, its answer is {:?} ({answers:?})",
                    answers.get(w)
                );
                let bounds = StoppedBatch {
                    ran_at_least: w + 1,
                    accepted_at_most: n,
                    finished: 1,
                };
                let (accepted, ran) = self
                    .learn_stopped_batch("invoke_any", first, &answers, group, bounds)
                    .await;
                // Jobs go unsubmitted only after a winner that returned
                // before its first poll looked (the jobs before it were
                // all submitted, so all ran).
                ensure!(
                    self,
                    accepted == n || (accepted == w + 1 && ran == accepted),
                    "invoke_any: job {w} won, {accepted} of {n} jobs accepted, {ran} ran"
                );
                self.check_answer("invoke_any", first + w, Answer::Ok, Ok(v));
                self.note(format!(
                    " -> job {} won ({answers:?}); jobs {first}..{} accepted, {ran} ran",
                    first + w,
                    first + accepted
                ));
            }
            Err(AllFailed { errors, .. }) => {
                ensure!(
                    self,
                    !answers.contains(&Answer::Ok) && errors.len() == n,
                    "invoke_any failed with {} errors, the answers are {answers:?}: {errors:?}",
                    errors.len()
                );
                self.accept_batch(first, &answers, group);
                self.model.advance();
                for (i, e) in errors.into_iter().enumerate() {
                    self.check_answer("invoke_any", first + i, answers[i], Err(e));
                }
                self.note(format!(
                    " -> all failed ({answers:?}): jobs {first}..{}",
                    first + n
                ));
            }
        }
    }

    /// `map` over `n` items (their answers by `seed`) through the pool or a
    /// group, collected to its end: refused outright after a shutdown or a
    /// group stop (the refusal of each item it took, or just the first
    /// with `stop_on_error`), else run only when its jobs can neither wait
    /// on a gate nor for room. One outcome per item (in input order unless
    /// unordered), or with `stop_on_error` successes then the first error
    /// to come.
    async fn map(&mut self, n: usize, how: MapHow, seed: u8, group: Option<usize>) {
        let refusal = self.batch_refusal(group);
        if refusal.is_none() && !self.batch_has_room(n.min(how.limit)) {
            self.note(" -> skipped (its jobs could wait on a gate or for room)".to_owned());
            return;
        }
        let first = self.model.jobs.len();
        let answers: Vec<Answer> = (0..n).map(|i| Answer::of(&Answer::MAP, seed, i)).collect();
        let items: Vec<(Func, bool)> = answers
            .iter()
            .enumerate()
            .map(|(i, &a)| (self.make(a.kind(), first + i).0, a == Answer::Err))
            .collect();
        let call = |(func, fails): (Func, bool), stop: &StopToken| -> Result<Val, Val> {
            let v = func(stop);
            if fails {
                Err(v)
            } else {
                Ok(v)
            }
        };
        let target = group.and_then(|g| Some(self.groups.as_ref()?[g].clone()));
        let mut stream = match &target {
            Some(g) => g.map(items, call),
            None => self.pool().map(items, call),
        }
        .limit(how.limit);
        if !how.ordered {
            stream = stream.unordered();
        }
        if how.stop_on_error {
            stream = stream.stop_on_error();
        }
        let collect = async move {
            let mut stream = pin!(stream);
            let mut out = Vec::new();
            while let Some(o) = poll_fn(|cx| stream.as_mut().poll_next(cx)).await {
                out.push(o);
            }
            out
        };
        let out = self.within("map", collect).await;
        if let Some(r) = refusal {
            let want = if how.stop_on_error {
                1
            } else {
                n.min(how.limit)
            };
            ensure!(
                self,
                out.len() == want,
                "map gave {} outcomes, expected {want} refusals",
                out.len()
            );
            for o in &out {
                match o {
                    Err(e) => self.check_refused("map", &r, e),
                    Ok(v) => self.fail(format!("map: expected {r:?} refusals, got {v:?}")),
                }
            }
            self.count_batch_refusals(&r, group, want);
            return;
        }
        let tags: Vec<Option<usize>> = out.iter().map(answer_tag).collect();
        let mut sorted = tags.clone();
        sorted.sort_unstable();
        sorted.dedup();
        ensure!(
            self,
            sorted.len() == tags.len()
                && tags
                    .iter()
                    .all(|t| t.is_some_and(|t| (first..first + n).contains(&t))),
            "map: outcomes of jobs {tags:?}, not one each of jobs {first}..{}: {out:?}",
            first + n
        );
        let rel: Vec<usize> = tags.iter().flatten().map(|t| t - first).collect();
        let fails = answers.iter().any(|&a| a != Answer::Ok);
        if !how.stop_on_error || !fails {
            ensure!(
                self,
                out.len() == n && (!how.ordered || rel.iter().copied().eq(0..n)),
                "map: outcomes of jobs {tags:?} for jobs {first}..{}{}",
                first + n,
                if how.ordered { " in input order" } else { "" }
            );
            self.accept_batch(first, &answers, group);
            self.model.advance();
            self.note(format!(" -> jobs {first}..{}", first + n));
        } else {
            // Successes, then the first error to come, then the end.
            let j = out.len().saturating_sub(1);
            ensure!(
                self,
                !out.is_empty() && out[..j].iter().all(Result::is_ok) && out[j].is_err(),
                "map with stop_on_error: expected successes then one error, got {out:?}"
            );
            // In input order, the successes before the first gap; at most
            // `limit` items are taken beyond the outcomes yielded.
            ensure!(
                self,
                (!how.ordered || rel[..j].iter().copied().eq(0..j))
                    && rel.iter().all(|&t| t < j + how.limit),
                "map with stop_on_error, limit {}: outcomes of jobs {tags:?}{}",
                how.limit,
                if how.ordered { " in input order" } else { "" }
            );
            let bounds = StoppedBatch {
                ran_at_least: rel.iter().max().map_or(0, |&t| t + 1),
                accepted_at_most: j + how.limit,
                finished: out.len(),
            };
            let (accepted, ran) = self
                .learn_stopped_batch("map", first, &answers, group, bounds)
                .await;
            self.note(format!(
                " -> stopped by job {}: jobs {first}..{} accepted, {ran} ran",
                first + rel[j],
                first + accepted
            ));
        }
        for (o, &t) in out.into_iter().zip(&rel) {
            self.check_answer("map", first + t, answers[t], o);
        }
    }

    fn spawn(&mut self, kind: Kind, named: bool, timeout: bool) {
        let tag = self.model.jobs.len();
        let name = Self::name(named, tag);
        let (func, gate) = self.make(kind, tag);
        let group = Model::group_for(tag);
        let mut o = match (group, &self.groups) {
            (Some(g), Some(groups)) => groups[g].offload(func),
            _ => self.pool().offload(func),
        };
        if let Some(n) = &name {
            o = o.name(n.clone());
        }
        if timeout {
            o = o.with_timeout(SHORT);
        }
        let got = o.spawn();
        if let Some(g) =
            // A stopped group refuses before a full queue does (only a
            // shutdown comes first).
            group.filter(|&g| !self.model.shutdown && self.model.group_stopped[g])
        {
            ensure!(
                self,
                matches!(&got, Err(e) if matches!(e.reason(), Error::Cancelled { id: None })),
                "spawn through stopped group {g}: expected Cancelled {{ id: None }}, got {:?}",
                got.as_ref().map(|h| h.id()).map_err(|e| e.to_string())
            );
            // Counted in the group and its ancestors (group 0 is group 1's).
            for r in &mut self.model.group_rejected[..=g] {
                *r += 1;
            }
            if !self.batching {
                self.note(format!(" -> refused (group {g} stopped)"));
            }
            return;
        }
        match self.model.refusal() {
            None => {
                let handle = match got {
                    Ok(h) => h,
                    Err(e) => self.fail(format!("spawn refused: {e}; the model accepts it")),
                };
                self.model.accept(kind, name, false);
                self.model.jobs[tag].group = group;
                self.model.advance();
                self.register(tag, Some(handle.id()), gate);
                self.slots.push(Slot {
                    tag,
                    handle,
                    timer: timeout,
                    taken: false,
                    left: false,
                });
            }
            Some(refusal) => {
                let text = got
                    .as_ref()
                    .err()
                    .map(ToString::to_string)
                    .unwrap_or_default();
                let ok = match (&got, refusal) {
                    (Err(e), Refusal::Full) => {
                        matches!(e.reason(), Error::Full { capacity } if *capacity == self.cfg.queue_capacity)
                            && text.contains(&format!(
                                "queue is full ({} waiting)",
                                self.cfg.queue_capacity
                            ))
                    }
                    (Err(e), Refusal::ShuttingDown) => {
                        matches!(e.reason(), Error::ShuttingDown { id: None })
                            && text.contains("shutting down")
                    }
                    (Ok(_), _) => false,
                };
                ensure!(
                    self,
                    ok && text.starts_with("job refused, the function never ran: "),
                    "spawn: expected a refusal ({refusal:?}), got {:?}",
                    got.as_ref().map(|h| h.id()).map_err(|e| e.to_string())
                );
                match refusal {
                    Refusal::Full => self.model.c.rejected_full += 1,
                    Refusal::ShuttingDown => self.model.c.rejected_shutdown += 1,
                }
                if !self.batching {
                    self.note(format!(" -> refused ({refusal:?})"));
                }
                // The function comes back unrun.
                if let Err(e) = got {
                    drop(e.into_inner());
                }
            }
        }
    }

    async fn submit(&mut self, kind: Kind, named: bool) {
        let tag = self.model.jobs.len();
        let name = Self::name(named, tag);
        let (func, gate) = self.make(kind, tag);
        let mut o = self.pool().offload(func);
        if let Some(n) = &name {
            o = o.name(n.clone());
        }
        let mut fut: Submitting = Box::pin(o.submit());
        match self.model.refusal() {
            None => {
                let handle = match self.within("submit with room", fut).await {
                    Ok(h) => h,
                    Err(e) => self.fail(format!("submit refused: {e}; the model accepts it")),
                };
                self.model.accept(kind, name, true);
                self.register(tag, Some(handle.id()), gate);
                self.slots.push(Slot {
                    tag,
                    handle,
                    timer: false,
                    taken: false,
                    left: false,
                });
            }
            Some(Refusal::ShuttingDown) => {
                let got = self.within("submit after shutdown", fut).await;
                let ok = matches!(&got, Err(e) if matches!(e.reason(), Error::ShuttingDown { id: None }));
                ensure!(self, ok, "submit after shutdown was not refused");
                self.model.c.rejected_shutdown += 1;
                self.note(" -> refused (shutting down)".to_owned());
            }
            Some(Refusal::Full) => {
                let pending = poll_once(fut.as_mut()).await.is_pending();
                ensure!(
                    self,
                    pending,
                    "submit on a full queue did not wait for room"
                );
                if self.blocked.is_none() {
                    self.note(" -> waits for room".to_owned());
                    self.model.blocked = Some((kind, name));
                    self.blocked = Some(Blocked { tag, gate, fut });
                } else {
                    self.note(" -> waits for room; given up".to_owned());
                }
            }
        }
    }

    /// A caller awaiting `offload(f)` directly, who leaves (time-out or
    /// drop) unless the job finishes first.
    async fn direct(
        &mut self,
        kind: Kind,
        named: bool,
        leave: Leave,
        policy: Option<AbandonPolicy>,
    ) {
        let tag = self.model.jobs.len();
        let name = Self::name(named, tag);
        let effective = policy.unwrap_or(self.model.policy);
        let refusal = self.model.refusal();
        let finishes = refusal.is_none() && {
            let mut sim = self.model.clone();
            let t = sim.accept(kind, name.clone(), true);
            sim.jobs[t].st.terminal()
        };
        let limit = match leave {
            Leave::TimesOut if finishes => Some(LONG),
            Leave::TimesOut => Some(SHORT),
            Leave::Drops => None,
        };
        let (func, gate) = self.make(kind, tag);
        let mut o = self.pool().offload(func);
        if let Some(n) = &name {
            o = o.name(n.clone());
        }
        if let Some(p) = policy {
            o = o.on_abandon(p);
        }
        if let Some(l) = limit {
            o = o.with_timeout(l);
        }
        let mut fut = Box::pin(o.into_future());
        let first = poll_once(fut.as_mut()).await;
        match refusal {
            Some(Refusal::ShuttingDown) => {
                let ok = matches!(&first, Poll::Ready(Err(Error::ShuttingDown { id: None })));
                ensure!(self, ok, "offload after shutdown: got {first:?}");
                self.model.c.rejected_shutdown += 1;
                self.note(" -> refused (shutting down)".to_owned());
            }
            Some(Refusal::Full) => {
                ensure!(
                    self,
                    first.is_pending() || leave == Leave::TimesOut,
                    "offload on a full queue did not wait for room: {first:?}"
                );
                if leave == Leave::Drops {
                    drop(fut);
                    self.note(" -> waited for room; dropped".to_owned());
                    return;
                }
                let got = match first {
                    Poll::Ready(r) => r,
                    Poll::Pending => self.within("waiting for room", fut).await,
                };
                let text = got
                    .as_ref()
                    .err()
                    .map(ToString::to_string)
                    .unwrap_or_default();
                let ok = matches!(
                    &got,
                    Err(Error::TimedOut {
                        id: None,
                        state: None,
                        fate: Fate::Cancelled,
                        ..
                    })
                ) && text.contains("full queue");
                ensure!(
                    self,
                    ok,
                    "offload on a full queue: expected a timeout never accepted, got {got:?}"
                );
                self.model.c.rejected_timed_out += 1;
                self.note(" -> the queue stayed full".to_owned());
            }
            None if finishes => {
                let id = fut.job_id();
                self.model.accept(kind, name, true);
                self.register(tag, id, gate);
                self.settle().await;
                let got = match first {
                    Poll::Ready(r) => r,
                    Poll::Pending => self.within("a finishing job", fut).await,
                };
                self.check_outcome("awaited directly", tag, false, &got);
            }
            None => {
                if let Poll::Ready(got) = first {
                    // The 1 ms time-out ran out at the very first poll: the
                    // caller left at the instant of submission.
                    let (state, fate, id) = match &got {
                        Err(Error::TimedOut {
                            state, fate, id, ..
                        }) => (*state, *fate, *id),
                        _ => self.fail(format!("first poll of an unfinished job returned {got:?}")),
                    };
                    let t = self
                        .model
                        .accept(kind, name, state != Some(JobState::Queued));
                    self.register(t, id, gate);
                    self.note(format!(" (timed out at the first poll, {state:?})"));
                    let want_state = self.model.jobs[t].st.job_state();
                    let want_fate = self.model.abandon(t, effective, true);
                    self.model.advance();
                    ensure!(
                        self,
                        state == Some(want_state),
                        "timed out at the first poll with the job {state:?}, model {want_state:?}"
                    );
                    self.check_timed_out("awaited directly", t, want_state, want_fate, &got);
                    ensure!(
                        self,
                        fate == want_fate,
                        "fate {fate:?}, model {want_fate:?}"
                    );
                    return;
                }
                let id = fut.job_id();
                ensure!(self, id.is_some(), "an accepted offload has no job id");
                self.model.accept(kind, name, true);
                self.register(tag, id, gate);
                self.settle().await;
                let want_state = self.model.jobs[tag].st.job_state();
                match leave {
                    Leave::TimesOut => {
                        let got = self.within("the caller's 1 ms time-out", fut).await;
                        let want_fate = self.model.abandon(tag, effective, true);
                        self.check_timed_out("awaited directly", tag, want_state, want_fate, &got);
                    }
                    Leave::Drops => {
                        drop(fut);
                        self.model.abandon(tag, effective, false);
                    }
                }
            }
        }
    }

    async fn await_handle(&mut self, i: usize) {
        let tag = self.slots[i].tag;
        let st = self.model.jobs[tag].st.clone();
        self.note(format!(" -> job {tag}"));
        let (timer, taken) = (self.slots[i].timer, self.slots[i].taken);
        let handle = &mut self.slots[i].handle;
        let what = format!("await on job {tag}");
        let waited = if st.terminal() || timer {
            // The outcome, or the handle's own (spawned) time-out.
            try_within(&what, handle).await
        } else {
            try_within(&what, user_timeout(SHORT, handle)).await
        };
        let got = waited.unwrap_or_else(|hung| self.fail(hung));
        if st.terminal() {
            self.check_outcome("await", tag, taken, &got);
            self.slots[i].taken = true;
        } else if timer && !self.slots[i].left {
            // The handle's own time-out: its holder leaves, under the
            // pool's policy.
            let fate = self.model.abandon(tag, self.model.policy, true);
            self.slots[i].left = true;
            self.check_timed_out("await", tag, st.job_state(), fate, &got);
            self.model.advance();
        } else {
            self.check_timed_out("await", tag, st.job_state(), Fate::Kept, &got);
        }
        // An await of the handle itself uses up its spawned time-out.
        if st.terminal() || timer {
            self.slots[i].timer = false;
        }
    }

    async fn timeout_around(&mut self, i: usize) {
        if self.slots[i].timer {
            // The handle's own time-out, set at the spawn, runs out no
            // later than the user's, and the handle is polled first: this
            // is an await of the handle.
            return self.await_handle(i).await;
        }
        let tag = self.slots[i].tag;
        let st = self.model.jobs[tag].st.clone();
        self.note(format!(" -> job {tag}"));
        let limit = if st.terminal() { LONG } else { SHORT };
        let what = format!("timeout(&mut handle) on job {tag}");
        let got = match try_within(&what, user_timeout(limit, &mut self.slots[i].handle)).await {
            Ok(got) => got,
            Err(hung) => self.fail(hung),
        };
        if st.terminal() {
            let taken = self.slots[i].taken;
            self.check_outcome("timeout(&mut handle)", tag, taken, &got);
            self.slots[i].taken = true;
        } else {
            self.check_timed_out(
                "timeout(&mut handle)",
                tag,
                st.job_state(),
                Fate::Kept,
                &got,
            );
        }
    }

    fn blocking_wait(&mut self, i: usize) {
        let tag = self.slots[i].tag;
        let st = self.model.jobs[tag].st.clone();
        self.note(format!(" -> job {tag}"));
        let mut slot = self.slots.remove(i);
        let taken = slot.taken;
        if st.terminal() {
            let got = std::thread::spawn(move || slot.handle.blocking_wait(None))
                .join()
                .expect("blocking_wait thread");
            self.check_outcome("blocking_wait", tag, taken, &got);
        } else {
            let (slot, got) = std::thread::spawn(move || {
                let mut slot = slot;
                let got = slot.handle.blocking_wait(Some(SHORT));
                (slot, got)
            })
            .join()
            .expect("limited blocking_wait thread");
            self.check_timed_out(
                "blocking_wait(Some(_))",
                tag,
                st.job_state(),
                Fate::Kept,
                &got,
            );
            self.slots.insert(i, slot);
        }
    }

    async fn close(&mut self) {
        let mut sim = self.model.clone();
        let want = sim.close();
        // Budgets that run out only when the model says they must.
        let graceful = if want.escalated { BUDGET_SHORT } else { LONG };
        let after_stop = if want.terminated { LONG } else { BUDGET_SHORT };
        // Right after a batch, functions the model finished may finish in
        // the real pool during the close: its report counts them too.
        let lag_completed = self.model.c.completed - self.settled.counts.completed;
        let lag_panicked = self.model.c.panicked - self.settled.counts.panicked;
        self.probe.drain.store(true, Ordering::SeqCst);
        let pool = self.pool().clone();
        let report = self.within("close", pool.close(graceful, after_stop)).await;
        drop(pool);
        let want = self.model.close();
        self.note(format!(" -> {want:?}"));
        let unstarted: Vec<JobId> = report.unstarted.iter().map(|u| u.id).collect();
        let want_unstarted: Vec<JobId> = want.unstarted.iter().map(|j| self.ids[j]).collect();
        ensure!(
            self,
            report.escalated == want.escalated
                && report.terminated == want.terminated
                && unstarted == want_unstarted
                && (want.panicked..=want.panicked + lag_panicked).contains(&report.panicked),
            "close report {report:?}, model {want:?} (+{lag_panicked} panicked before)"
        );
        let text = report.to_string();
        ensure!(
            self,
            text.contains(if want.terminated {
                "terminated"
            } else {
                "gave up"
            }),
            "close report text: {text}"
        );
        if want.terminated {
            ensure!(
                self,
                report.still_running.is_empty()
                    && (want.completed..=want.completed + lag_completed)
                        .contains(&report.completed),
                "close report {report:?}, model {want:?} (+{lag_completed} completed before)"
            );
        } else {
            // Functions that ignore their stop token are still running, and
            // named; cooperative ones stopped by the immediate stage may
            // still be on their way out when the short budget ends.
            let listed: Vec<JobId> = report.still_running.iter().map(|r| r.id).collect();
            let stopped_now: Vec<JobId> = self
                .model
                .jobs
                .iter()
                .enumerate()
                .filter(|(j, job)| {
                    matches!(job.kind, Kind::Gated | Kind::Barrier)
                        && job.started
                        && self.ids.contains_key(j)
                })
                .map(|(j, _)| self.ids[&j])
                .collect();
            for j in &want.still_running {
                let id = self.ids[j];
                ensure!(
                    self,
                    listed.contains(&id) && text.contains(&format!("still running: job {id}")),
                    "close report does not list job {j} ({id}) as still running: {report:?}"
                );
            }
            for r in &report.still_running {
                let known = want.still_running.iter().any(|j| self.ids[j] == r.id)
                    || stopped_now.contains(&r.id);
                ensure!(
                    self,
                    known && r.stop_requested,
                    "close report lists {r:?} as still running"
                );
            }
            ensure!(
                self,
                report.completed <= want.completed + lag_completed,
                "close report {report:?}, model {want:?} (+{lag_completed} completed before)"
            );
        }
    }

    /// After the last operation: release everything, collect every handle,
    /// wait for idleness, shut down, wait for termination, close the books.
    async fn finish(&mut self) {
        self.log.push("end: release every gate".to_owned());
        for _ in 0..3 {
            for gate in self.gates.values() {
                gate.open();
            }
            self.model.release_all();
            self.settle().await;
            if self.model.idle() {
                break;
            }
        }
        self.log.push("end: await every handle".to_owned());
        for i in 0..self.slots.len() {
            let tag = self.slots[i].tag;
            let taken = self.slots[i].taken;
            let handle = &mut self.slots[i].handle;
            let got = match try_within(&format!("awaiting job {tag} at the end"), handle).await {
                Ok(got) => got,
                Err(hung) => self.fail(hung),
            };
            self.check_outcome("final await", tag, taken, &got);
            self.slots[i].taken = true;
        }
        ensure!(
            self,
            self.callers.is_empty(),
            "{} awaiting callers left after every job finished",
            self.callers.len()
        );
        let Some(pool) = self.pool.clone() else {
            // The last clone was dropped: the drain ends, the workers exit.
            self.log.push("end: drained, workers exit".to_owned());
            self.settle().await;
            let c = &self.model.c;
            ensure!(
                self,
                lock(&self.probe.ran).len() == (c.completed + c.panicked) as usize,
                "{} functions ran, the model completed or panicked {}",
                lock(&self.probe.ran).len(),
                c.completed + c.panicked
            );
            return;
        };
        self.within("idle() at the end", pool.idle()).await;
        self.log.push("end: shutdown, termination".to_owned());
        self.shutdown();
        self.settle().await;
        let m = pool.metrics();
        ensure!(
            self,
            pool.is_terminated()
                && m.accepted == m.terminal()
                && m.queued == 0
                && m.running == 0
                && m.workers == 0,
            "terminated pool with work or workers left: {m:?}"
        );
        ensure!(
            self,
            lock(&self.probe.ran).len() == m.completed as usize + m.panicked as usize,
            "{} functions ran, {} completed or panicked",
            lock(&self.probe.ran).len(),
            m.completed + m.panicked
        );
    }
}

fn run_case(cfg: Cfg, model_cfg: Cfg, ops: &[Op]) -> Model {
    run_case_within(cfg, model_cfg, ops, SETTLE)
}

/// Runs one case; returns the model at its end.
fn run_case_within(cfg: Cfg, model_cfg: Cfg, ops: &[Op], settle_within: Duration) -> Model {
    quiet_deliberate_panics();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let mut h = Harness::new(cfg, model_cfg);
        h.settle_within = settle_within;
        for (n, op) in ops.iter().enumerate() {
            h.step(n, *op).await;
        }
        h.finish().await;
        if std::env::var_os("MODEL_VERBOSE").is_some() {
            eprintln!("case passed: {cfg:?}\n    {}", h.log.lines());
        }
        h.model.clone()
    })
}

/// Long-queue cases cost several short ones: a quarter as many as
/// `PROPTEST_CASES` (at least 64), or `MODEL_LONG_CASES`.
fn long_config() -> ProptestConfig {
    let cases = model::env_cases("MODEL_LONG_CASES")
        .or_else(|| model::env_cases("PROPTEST_CASES").map(|n| (n / 4).max(64)))
        .unwrap_or(64);
    ProptestConfig {
        cases,
        ..model::config(256)
    }
}

proptest! {
    #![proptest_config(model::config(256))]

    /// The real offloader behaves as the sequential model of the contract,
    /// step by step.
    #[test]
    fn offloader_matches_the_model((cfg, ops) in scenario()) {
        run_case(cfg, cfg, &ops);
    }
}

proptest! {
    #![proptest_config(long_config())]

    /// The same with queue capacities in the hundreds and batches of up to
    /// 300 jobs behind held permits: cancel, stop and callers leaving at
    /// every position of long queues, shutdowns that drain them.
    #[test]
    fn long_queues_match_the_model((cfg, ops) in long_scenario()) {
        run_case(cfg, cfg, &ops);
    }
}

/// Every operation at least once, in a fixed sequence, whatever proptest
/// draws.
#[test]
fn every_operation_once() {
    use Kind::*;
    let cfg = Cfg {
        max_in_flight: 2,
        queue_capacity: 2,
        short_keep_alive: true,
        policy: AbandonPolicy::Keep,
        observer: true,
    };
    let ops = [
        Op::Spawn {
            kind: Gated,
            named: true,
            timeout: true,
        },
        Op::Spawn {
            kind: IgnoresStop,
            named: false,
            timeout: false,
        },
        Op::Spawn {
            kind: Returns,
            named: true,
            timeout: false,
        },
        Op::Spawn {
            kind: Panics,
            named: false,
            timeout: false,
        },
        // The queue is full now.
        Op::Spawn {
            kind: Returns,
            named: false,
            timeout: false,
        },
        Op::Direct {
            kind: Returns,
            named: false,
            leave: Leave::TimesOut,
            policy: None,
        },
        Op::Submit {
            kind: Gated,
            named: true,
        },
        Op::Await(0),
        Op::TimeoutAround(1),
        Op::BlockingWait(0),
        Op::Cancel(3),
        Op::Stop(1),
        Op::Release(1),
        Op::Direct {
            kind: Gated,
            named: true,
            leave: Leave::TimesOut,
            policy: Some(AbandonPolicy::CancelAndStop),
        },
        Op::Direct {
            kind: IgnoresStop,
            named: false,
            leave: Leave::Drops,
            policy: Some(AbandonPolicy::CancelIfQueued),
        },
        Op::Idle,
        Op::Spawn {
            kind: Gated,
            named: false,
            timeout: false,
        },
        Op::Spawn {
            kind: Returns,
            named: true,
            timeout: true,
        },
        Op::Await(1),
        Op::DropHandle(0),
        Op::Detach(0),
        Op::ReleaseAll,
        Op::Batch {
            n: 3,
            mix: Mix::Gated,
            callers: Callers::Handles,
            then: Then::Nothing,
        },
        // Job groups: the child's stop, spawns through a stopped group
        // (refused) and through the others, the parent's stop, twice.
        Op::StopGroup(1),
        Op::Batch {
            n: 3,
            mix: Mix::Gated,
            callers: Callers::Handles,
            then: Then::Nothing,
        },
        Op::StopGroup(0),
        Op::StopGroup(0),
        Op::Batch {
            n: 3,
            mix: Mix::Mixed(1),
            callers: Callers::Awaiting { timeout: true },
            then: Then::Nothing,
        },
        Op::LeaveAt(Pos::Front, Leave::TimesOut),
        Op::CancelAt(Pos::Back),
        Op::StopAt(Pos::At(1)),
        Op::ReleaseRunning(1),
        Op::LeaveAt(Pos::Running(0), Leave::Drops),
        Op::ReleaseAll,
        Op::Spawn {
            kind: IgnoresStop,
            named: true,
            timeout: false,
        },
        Op::Spawn {
            kind: Returns,
            named: true,
            timeout: false,
        },
        Op::Spawn {
            kind: Returns,
            named: true,
            timeout: false,
        },
        Op::Close,
        Op::Spawn {
            kind: Returns,
            named: false,
            timeout: false,
        },
        Op::ShutdownNow,
        Op::Shutdown,
        Op::ReleaseAll,
        Op::Idle,
        Op::DropLast,
        Op::Await(0),
    ];
    run_case(cfg, cfg, &ops);
}

/// A queue of hundreds behind held permits: cancel, stop and callers
/// leaving (time-out and drop, under each policy) at its front, back and
/// middle, FIFO among what is left; then a graceful shutdown drains it.
#[test]
fn long_queue_aimed_at_every_position() {
    let cfg = Cfg {
        max_in_flight: 3,
        queue_capacity: 300,
        short_keep_alive: false,
        policy: AbandonPolicy::Keep,
        observer: true,
    };
    let mut ops = vec![
        Op::Batch {
            n: 200,
            mix: Mix::Gated,
            callers: Callers::Handles,
            then: Then::Nothing,
        },
        Op::Batch {
            n: 100,
            mix: Mix::Mixed(7),
            callers: Callers::Awaiting { timeout: true },
            then: Then::Nothing,
        },
        // 297 wait behind 3 running: room for 3 more (`queue_capacity`
        // counts the jobs waiting for a permit), the other 2 are refused.
        Op::Batch {
            n: 5,
            mix: Mix::Gated,
            callers: Callers::Handles,
            then: Then::Nothing,
        },
    ];
    for p in [Pos::Front, Pos::Back, Pos::At(97), Pos::At(1)] {
        ops.push(Op::CancelAt(p));
        ops.push(Op::StopAt(p));
    }
    for (p, l) in [
        (Pos::Front, Leave::TimesOut),
        (Pos::Back, Leave::TimesOut),
        (Pos::At(40), Leave::Drops),
        (Pos::At(41), Leave::TimesOut),
        (Pos::At(42), Leave::TimesOut),
        (Pos::At(43), Leave::TimesOut),
        (Pos::At(44), Leave::Drops),
        (Pos::At(45), Leave::Drops),
    ] {
        ops.push(Op::LeaveAt(p, l));
    }
    ops.extend([
        Op::ReleaseRunning(0),
        Op::ReleaseRunning(1),
        Op::CancelAt(Pos::Front),
        Op::ReleaseRunning(2),
        Op::Shutdown,
        Op::LeaveAt(Pos::At(3), Leave::TimesOut),
        Op::CancelAt(Pos::At(10)),
        // The three running since before the shutdown, oldest first.
        Op::ReleaseRunning(0),
        Op::ReleaseRunning(0),
        Op::ReleaseRunning(0),
        Op::ReleaseAll,
        Op::Idle,
    ]);
    let model = run_case(cfg, cfg, &ops);
    assert_eq!(model.max_running, 3);
    assert_eq!(model.drain_width, 3, "the drain ran at the full width");
    assert_eq!(model.c.rejected_full, 2);
}

/// A graceful shutdown, a close and dropping the last clone each drain a
/// queue of barrier jobs at the full width: a barrier function returns on
/// its own only once `max_in_flight` of them wait at once. Both on a fresh
/// pool (the shutdown right after the batch, while workers are still being
/// woken) and behind held permits released one at a time after it.
#[test]
fn every_shutdown_drains_at_the_full_width() {
    for then in [Then::Shutdown, Then::Close, Then::DropLast] {
        for max_in_flight in [2, 3, 4] {
            let cfg = Cfg {
                max_in_flight,
                queue_capacity: 100,
                short_keep_alive: true,
                policy: AbandonPolicy::Keep,
                observer: true,
            };
            let batch = Op::Batch {
                n: 10 * max_in_flight as u16,
                mix: Mix::Barrier,
                callers: Callers::Handles,
                then,
            };
            let model = run_case(cfg, cfg, &[batch]);
            assert_eq!(model.max_running, max_in_flight, "{then:?}");
            if then == Then::Close {
                // Behind held permits a close escalates: what is queued
                // comes back unstarted.
                continue;
            }
            let held = Op::Spawn {
                kind: Kind::Gated,
                named: false,
                timeout: false,
            };
            let mut ops = vec![held; max_in_flight];
            ops.push(batch);
            ops.extend((0..max_in_flight).map(|_| Op::ReleaseRunning(0)));
            let model = run_case(cfg, cfg, &ops);
            assert_eq!(model.drain_width, max_in_flight, "{then:?}");
        }
    }
}

/// A staged close that gives up on a function ignoring its stop token,
/// with a producer blocked on the full queue (woken by the shutdown with
/// an error), a queued job handed back, and termination only once the
/// stubborn function returns.
#[test]
fn staged_close_gives_up_and_wakes_a_blocked_producer() {
    use Kind::*;
    let cfg = Cfg {
        max_in_flight: 1,
        queue_capacity: 1,
        short_keep_alive: false,
        policy: AbandonPolicy::CancelIfQueued,
        observer: false,
    };
    let ops = [
        Op::Spawn {
            kind: IgnoresStop,
            named: true,
            timeout: false,
        },
        Op::Spawn {
            kind: Gated,
            named: true,
            timeout: false,
        },
        Op::Submit {
            kind: Returns,
            named: false,
        },
        Op::Idle,
        Op::Close,
        Op::Await(1),
        Op::Idle,
        Op::Release(0),
        Op::Idle,
    ];
    run_case(cfg, cfg, &ops);
}

/// The checker is not vacuous: against a model that allows one more
/// function to run than the pool does, the same kind of sequence fails.
#[test]
#[should_panic(expected = "did not reach the model's state")]
fn a_wrong_model_is_caught() {
    let cfg = Cfg {
        max_in_flight: 1,
        queue_capacity: 4,
        short_keep_alive: false,
        policy: AbandonPolicy::Keep,
        observer: false,
    };
    let wrong = Cfg {
        max_in_flight: 2,
        ..cfg
    };
    let ops = [
        Op::Spawn {
            kind: Kind::Gated,
            named: false,
            timeout: false,
        },
        Op::Spawn {
            kind: Kind::Gated,
            named: false,
            timeout: false,
        },
    ];
    // Reaching the wrong state is impossible: give up after one second.
    run_case_within(cfg, wrong, &ops, Duration::from_secs(1));
}

/// Not vacuous about the order either: a model that starts the queue's
/// second job before its first is caught as soon as the pool starts them.
#[test]
#[should_panic(expected = "start order (FIFO)")]
fn a_start_out_of_fifo_order_is_caught() {
    let cfg = Cfg {
        max_in_flight: 2,
        queue_capacity: 4,
        short_keep_alive: false,
        policy: AbandonPolicy::Keep,
        observer: true,
    };
    quiet_deliberate_panics();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let mut h = Harness::new(cfg, cfg);
        let gated = Op::Spawn {
            kind: Kind::Gated,
            named: false,
            timeout: false,
        };
        for n in 0..4 {
            h.step(n, gated).await;
        }
        // The model's queue out of order: [3, 2].
        h.model.queue.swap(0, 1);
        h.step(4, Op::ReleaseRunning(0)).await;
    });
}

/// Also not vacuous about who runs: a job the model still has queued but
/// which the real pool started is caught at the next operation.
#[test]
#[should_panic(expected = "cancel() on job 0 returned false, model true")]
fn a_job_run_behind_the_models_back_is_caught() {
    let cfg = Cfg {
        max_in_flight: 1,
        queue_capacity: 4,
        short_keep_alive: false,
        policy: AbandonPolicy::Keep,
        observer: false,
    };
    quiet_deliberate_panics();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let mut h = Harness::new(cfg, cfg);
        // A model with no permit at all: its job stays queued.
        h.model.max = 0;
        h.log
            .push("spawn(gated), the model never starting it".to_owned());
        h.spawn(Kind::Gated, false, false);
        // Let the real pool start it (its start record arrives).
        let deadline = Instant::now() + HANG;
        while lock(&h.probe.ran).is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        h.step(1, Op::Cancel(0)).await;
    });
}

/// A user's `tokio::time::timeout` around `&mut handle`; when it runs out,
/// what the handle shows then, in the shape of the error the handle's own
/// time-out gives (the job goes on under the handle: `Fate::Kept`).
async fn user_timeout(limit: Duration, handle: &mut JobHandle<Val>) -> Result<Val, Error> {
    match tokio::time::timeout(limit, &mut *handle).await {
        Ok(got) => got,
        Err(_) => Err(Error::TimedOut {
            id: Some(handle.id()),
            waited: limit,
            state: Some(handle.state()),
            fate: Fate::Kept,
        }),
    }
}
