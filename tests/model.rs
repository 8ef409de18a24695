//! Model-based property test of the contract (DESIGN.md).
//!
//! proptest generates a pool configuration and a sequence of operations:
//! offload with and without a timeout or a name (spawned for an owner
//! handle, submitted with backpressure, or awaited directly by a caller who
//! then times out or drops the future), cancel, stop, drop or detach a
//! handle, await it / wait on it with a timeout / wait on it from a plain
//! thread, functions that return, panic, wait on a gate (and wake on stop),
//! or wait on a gate ignoring their stop token, release one gate or all,
//! graceful shutdown, `shutdown_now`, a staged `close`, and `idle`.
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
//!   and in the metrics);
//! - no job is both cancelled (or returned unstarted) and run: the set of
//!   functions that ran equals the model's, and nothing ran twice;
//! - every handle's state, stop flag and outcome (value, panic message,
//!   cancelled, unstarted, timed out with the job's state and fate, outcome
//!   already taken) match the model, and the error texts say so;
//! - `shutdown_now` returns exactly the queued jobs (ids and names), a
//!   staged close reports what the model says it left behind;
//! - the pool is terminated (or idle) exactly when the model says so.
//!
//! Determinism: functions are held on gates that only operations open, so
//! which functions run is decided by the operations alone (FIFO queue,
//! `max_in_flight` permits). Caller time-outs that must fire are 1 ms long
//! and fire while the job can't finish (it waits on a closed gate); time-outs
//! that must not fire are 10 s long. The one race the model can't rule out
//! (a 1 ms time-out firing at the very first poll, before a worker picked the
//! job up) is linearized: the model then takes the time-out at the instant
//! of submission.
//!
//! CI runs 256 cases (about 3 s in a debug build). A longer run is one
//! command:
//!
//! ```text
//! PROPTEST_CASES=5000 cargo test --release --test model
//! ```
//!
//! A failure prints the shrunk pool configuration and operations, and the
//! steps as executed (which handle and job each one resolved to).

mod support;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use offloader::{
    AbandonPolicy, Error, Fate, JobHandle, JobId, JobState, Metrics, Offloader, Rejected,
    StopToken, SubmitError,
};
use proptest::prelude::*;
// Not a glob: this file's SHORT (1 ms) is its own.
use support::{builder, gate, poll_once, quiet_deliberate_panics, try_within, Gate, Hold, HANG};

/// A caller time-out that fires while the job waits on a closed gate.
const SHORT: Duration = Duration::from_millis(1);
/// A close budget that runs out because a function waits on a closed gate.
const BUDGET_SHORT: Duration = Duration::from_millis(10);
/// A time-out or budget that must not run out: the awaited thing happens
/// on its own, well before.
const LONG: Duration = Duration::from_secs(10);
/// How long the real system may take to reach the model's state.
const SETTLE: Duration = Duration::from_secs(10);
/// Message of the deliberate panics; it says `support::ON_PURPOSE`, so the
/// panic hook keeps them quiet.
const PANIC_MARK: &str = "model panic on purpose";

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
}

impl Kind {
    fn gated(self) -> bool {
        matches!(self, Kind::Gated | Kind::IgnoresStop)
    }
}

impl fmt::Debug for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Returns => "returns",
            Kind::Panics => "panics",
            Kind::Gated => "gated",
            Kind::IgnoresStop => "ignores-stop",
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
    /// time-out or a 1 ms `wait_timeout`.
    Await(u8),
    WaitTimeout(u8),
    /// `blocking_wait` on a plain thread (or `blocking_wait_timeout`).
    BlockingWait(u8),
    /// Opens the gate of gated job `g % gated jobs`.
    Release(u8),
    ReleaseAll,
    Shutdown,
    ShutdownNow,
    Close,
    Idle,
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
            Op::WaitTimeout(h) => write!(f, "wait_timeout(h{h})"),
            Op::BlockingWait(h) => write!(f, "blocking_wait(h{h})"),
            Op::Release(g) => write!(f, "release(g{g})"),
            Op::ReleaseAll => f.write_str("release_all"),
            Op::Shutdown => f.write_str("shutdown"),
            Op::ShutdownNow => f.write_str("shutdown_now"),
            Op::Close => f.write_str("close"),
            Op::Idle => f.write_str("idle"),
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
}

impl fmt::Debug for Cfg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pool(max_in_flight {}, queue_capacity {}, keep_alive {}, abandon {:?})",
            self.max_in_flight,
            self.queue_capacity,
            if self.short_keep_alive {
                "1ms"
            } else {
                "default"
            },
            self.policy
        )
    }
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        3 => Just(Kind::Returns),
        1 => Just(Kind::Panics),
        3 => Just(Kind::Gated),
        2 => Just(Kind::IgnoresStop),
    ]
}

fn policy() -> impl Strategy<Value = AbandonPolicy> {
    prop_oneof![
        Just(AbandonPolicy::Keep),
        Just(AbandonPolicy::CancelIfQueued),
        Just(AbandonPolicy::CancelAndStop),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let h = 0u8..8;
    prop_oneof![
        8 => (kind(), any::<bool>(), any::<bool>())
            .prop_map(|(kind, named, timeout)| Op::Spawn { kind, named, timeout }),
        2 => (kind(), any::<bool>()).prop_map(|(kind, named)| Op::Submit { kind, named }),
        4 => (
            kind(),
            any::<bool>(),
            prop_oneof![Just(Leave::TimesOut), Just(Leave::Drops)],
            proptest::option::of(policy()),
        )
            .prop_map(|(kind, named, leave, policy)| Op::Direct { kind, named, leave, policy }),
        3 => h.clone().prop_map(Op::Cancel),
        2 => h.clone().prop_map(Op::Stop),
        1 => h.clone().prop_map(Op::DropHandle),
        1 => h.clone().prop_map(Op::Detach),
        2 => h.clone().prop_map(Op::Await),
        1 => h.clone().prop_map(Op::WaitTimeout),
        1 => h.clone().prop_map(Op::BlockingWait),
        4 => h.prop_map(Op::Release),
        1 => Just(Op::ReleaseAll),
        1 => Just(Op::Shutdown),
        1 => Just(Op::ShutdownNow),
        1 => Just(Op::Close),
        1 => Just(Op::Idle),
    ]
}

fn scenario() -> impl Strategy<Value = (Cfg, Vec<Op>)> {
    let cfg = (1usize..=3, 1usize..=4, any::<bool>(), policy()).prop_map(
        |(max_in_flight, queue_capacity, short_keep_alive, policy)| Cfg {
            max_in_flight,
            queue_capacity,
            short_keep_alive,
            policy,
        },
    );
    (cfg, proptest::collection::vec(op(), 1..40))
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
}

/// The counters the model predicts; compared with [`Metrics`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Counts {
    accepted: u64,
    rejected_full: u64,
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
        }
    }

    /// Queued jobs waiting for a permit: those that a free permit starts at
    /// once are not waiting (ARCHITECTURE inv. 8). After [`Model::advance`]
    /// that is the whole queue, but the rule is the contract's.
    fn waiting(&self) -> usize {
        let free = self.max.saturating_sub(self.running.len());
        self.queue.len().saturating_sub(free)
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
                self.running.push(j);
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
            return Fate::AlreadyFinished;
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
            AbandonPolicy::CancelIfQueued if self.cancel_queued(j) => Fate::CancelledBeforeStart,
            AbandonPolicy::CancelAndStop if self.cancel_queued(j) => Fate::CancelledBeforeStart,
            AbandonPolicy::CancelAndStop => {
                self.stop(j);
                Fate::StopRequested
            }
            _ => Fate::KeptRunning,
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
                "    job {j}: {:?}{} {:?}, stop {}, gate {}\n",
                job.kind,
                job.name
                    .as_deref()
                    .map(|n| format!(" {n:?}"))
                    .unwrap_or_default(),
                job.st,
                job.stop,
                if job.gate_open { "open" } else { "closed" }
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
/// most at once.
#[derive(Default)]
struct Probe {
    ran: Mutex<Vec<usize>>,
    now: AtomicUsize,
    max: AtomicUsize,
}

struct Inside<'a>(&'a Probe);

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Probe {
    fn enter(&self, tag: usize) -> Inside<'_> {
        lock(&self.ran).push(tag);
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        Inside(self)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn make_func(kind: Kind, tag: usize, probe: Arc<Probe>, hold: Option<Hold>) -> Func {
    Box::new(move |stop: &StopToken| {
        let _inside = probe.enter(tag);
        match (kind, hold) {
            (Kind::Panics, _) => panic!("{PANIC_MARK} {tag}"),
            (Kind::Gated, Some(h)) => {
                h.wait_or_stop(stop);
            }
            (Kind::IgnoresStop, Some(h)) => h.wait(),
            _ => {}
        }
        Val {
            tag,
            stopped: stop.is_stopped(),
        }
    })
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
}

/// A producer waiting for room in `submit().await`.
struct Blocked {
    tag: usize,
    gate: Option<Gate>,
    fut: Submitting,
}

struct Harness {
    cfg: Cfg,
    pool: Offloader,
    model: Model,
    probe: Arc<Probe>,
    slots: Vec<Slot>,
    gates: HashMap<usize, Gate>,
    gated: Vec<usize>,
    ids: HashMap<usize, JobId>,
    blocked: Option<Blocked>,
    log: Vec<String>,
    /// How long the real system may take to reach the model's state.
    settle_within: Duration,
}

/// Fails the case with the steps so far and the model's state.
macro_rules! ensure {
    ($h:expr, $cond:expr, $($msg:tt)+) => {
        if !$cond {
            $h.fail(format!($($msg)+));
        }
    };
}

impl Harness {
    fn new(cfg: Cfg, model_cfg: Cfg) -> Harness {
        let mut b = builder(cfg.max_in_flight, cfg.queue_capacity)
            .abandon_policy(cfg.policy)
            .thread_name("model");
        if cfg.short_keep_alive {
            b = b.keep_alive(Duration::from_millis(1));
        }
        Harness {
            cfg,
            pool: b.build().expect("valid configuration"),
            model: Model::new(model_cfg),
            probe: Arc::default(),
            slots: Vec::new(),
            gates: HashMap::new(),
            gated: Vec::new(),
            ids: HashMap::new(),
            blocked: None,
            log: Vec::new(),
            settle_within: SETTLE,
        }
    }

    #[track_caller]
    fn fail(&self, msg: String) -> ! {
        panic!(
            "{msg}\n  {:?}\n  steps:\n    {}\n  model: {}  real: {:?}, idle {}, terminated {}",
            self.cfg,
            self.log.join("\n    "),
            self.model.summary(),
            self.pool.metrics(),
            self.pool.is_idle(),
            self.pool.is_terminated(),
        );
    }

    fn note(&mut self, s: String) {
        if let Some(last) = self.log.last_mut() {
            last.push_str(&s);
        }
    }

    /// Awaits `fut`, failing the case (with its steps) after [`HANG`].
    async fn within<F: IntoFuture>(&self, what: &str, fut: F) -> F::Output {
        match try_within(what, fut).await {
            Ok(v) => v,
            Err(hung) => self.fail(hung),
        }
    }

    fn make(&self, kind: Kind, tag: usize) -> (Func, Option<Gate>) {
        let (tx, hold) = if kind.gated() {
            let (tx, hold) = gate();
            (Some(tx), Some(hold))
        } else {
            (None, None)
        };
        (make_func(kind, tag, self.probe.clone(), hold), tx)
    }

    fn name(named: bool, tag: usize) -> Option<String> {
        named.then(|| format!("n{tag}"))
    }

    fn register(&mut self, tag: usize, id: Option<JobId>, gate: Option<Gate>) {
        if let Some(id) = id {
            if let Some(old) = self.ids.insert(tag, id) {
                ensure!(self, old == id, "job {tag} has two ids, {old} and {id}");
            }
        }
        if let Some(g) = gate {
            self.gates.insert(tag, g);
            self.gated.push(tag);
        }
        self.note(format!(" -> job {tag}"));
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
                matches!(got, Err(Error::Panicked { message, .. }) if *message == format!("{PANIC_MARK} {tag}"))
                    && text.contains("panicked")
                    && text.contains("worker survived")
                    && text.contains("permit was released")
            }
            St::Cancelled => {
                matches!(got, Err(Error::Cancelled { .. }))
                    && text.contains("cancelled before it started")
                    && text.contains("never ran")
            }
            St::Unstarted => {
                matches!(got, Err(Error::Unstarted { .. }))
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
            if *state == want_state && *fate == want_fate);
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
    fn check_snapshot(&self, m: &Metrics) {
        let max = self.cfg.max_in_flight as u64;
        ensure!(self, m.ledger_balances(), "ledger does not balance: {m:?}");
        ensure!(
            self,
            m.running <= max && m.max_running <= max && m.workers <= max,
            "more than max_in_flight {max} running or workers: {m:?}"
        );
        let inside = self.probe.max.load(Ordering::SeqCst);
        ensure!(
            self,
            inside <= self.cfg.max_in_flight,
            "{inside} functions ran at once under max_in_flight {max}"
        );
    }

    /// What still differs between the real system and the model, if
    /// anything (the real system may still be on its way).
    fn mismatch(&self, m: &Metrics) -> Option<String> {
        let c = &self.model.c;
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
        for (what, want, got) in pairs {
            if want != got {
                return Some(format!("metrics.{what}: model {want}, real {got}"));
            }
        }
        let mut ran = lock(&self.probe.ran).clone();
        ran.sort_unstable();
        if ran != self.model.started() {
            return Some(format!(
                "functions that ran: model {:?}, real {ran:?}",
                self.model.started()
            ));
        }
        for s in &self.slots {
            if self.model.jobs[s.tag].st.terminal() && !s.handle.is_finished() {
                return Some(format!("handle of job {} has no outcome yet", s.tag));
            }
        }
        if self.blocked.is_some() && self.model.blocked.is_none() {
            return Some("the blocked producer has not been served yet".to_owned());
        }
        // Idle includes every outcome published (pool.rs inv. 6), which
        // may lag the counters by a moment.
        if self.model.idle() && !self.pool.is_idle() {
            return Some("not idle yet".to_owned());
        }
        None
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
                });
            }
            Err(e) => {
                let text = e.to_string();
                ensure!(
                    self,
                    self.model.jobs.len() <= b.tag
                        && matches!(e.reason(), Rejected::ShuttingDown)
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
            let m = self.pool.metrics();
            self.check_snapshot(&m);
            let Some(diff) = self.mismatch(&m) else {
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
        if self.model.terminated() {
            self.within("termination the model predicts", self.pool.terminated())
                .await;
        } else {
            ensure!(
                self,
                !self.pool.is_terminated(),
                "terminated, but the model says it is not"
            );
        }
        ensure!(
            self,
            self.pool.is_shutdown() == self.model.shutdown,
            "is_shutdown() is {}",
            self.pool.is_shutdown()
        );
        ensure!(
            self,
            self.model.idle() || !self.pool.is_idle(),
            "idle, but the model has jobs queued or running"
        );
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
                s.handle.is_stop_requested() == job.stop,
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
        let mut running: Vec<(JobId, bool)> = self
            .pool
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
        let ran = lock(&self.probe.ran).clone();
        let mut dedup = ran.clone();
        dedup.sort_unstable();
        dedup.dedup();
        ensure!(
            self,
            dedup.len() == ran.len(),
            "a function ran twice: {ran:?}"
        );
    }

    async fn step(&mut self, n: usize, op: Op) {
        self.log.push(format!("{n}: {op:?}"));
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
                    drop(s);
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
            Op::WaitTimeout(h) => {
                if let Some(i) = self.pick(h) {
                    self.wait_timeout(i).await;
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
                    if let Some(gate) = self.gates.get_mut(&tag) {
                        gate.open();
                    }
                    self.model.release(tag);
                }
            }
            Op::ReleaseAll => {
                for gate in self.gates.values_mut() {
                    gate.open();
                }
                self.model.release_all();
            }
            Op::Shutdown => {
                self.pool.shutdown();
                self.model.shutdown();
                ensure!(
                    self,
                    self.pool.is_shutdown(),
                    "not shut down after shutdown()"
                );
            }
            Op::ShutdownNow => {
                let got = self.pool.shutdown_now();
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
            Op::Idle => {
                if self.model.idle() {
                    self.within("idle() on an idle pool", self.pool.idle())
                        .await;
                } else {
                    let mut idle = Box::pin(self.pool.idle());
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

    fn spawn(&mut self, kind: Kind, named: bool, timeout: bool) {
        let tag = self.model.jobs.len();
        let name = Self::name(named, tag);
        let (func, gate) = self.make(kind, tag);
        let mut o = self.pool.offload(func);
        if let Some(n) = &name {
            o = o.name(n.clone());
        }
        if timeout {
            o = o.with_timeout(SHORT);
        }
        let got = o.spawn();
        match self.model.refusal() {
            None => {
                let handle = match got {
                    Ok(h) => h,
                    Err(e) => self.fail(format!("spawn refused: {e}; the model accepts it")),
                };
                self.model.accept(kind, name, true);
                self.register(tag, Some(handle.id()), gate);
                self.slots.push(Slot {
                    tag,
                    handle,
                    timer: timeout,
                    taken: false,
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
                        matches!(e.reason(), Rejected::Full { capacity } if *capacity == self.cfg.queue_capacity)
                            && text.contains(&format!(
                                "queue is full ({} jobs waiting)",
                                self.cfg.queue_capacity
                            ))
                    }
                    (Err(e), Refusal::ShuttingDown) => {
                        matches!(e.reason(), Rejected::ShuttingDown)
                            && text.contains("shutting down")
                    }
                    (Ok(_), _) => false,
                };
                ensure!(
                    self,
                    ok && text.contains("handed back unrun"),
                    "spawn: expected a refusal ({refusal:?}), got {:?}",
                    got.as_ref().map(|h| h.id()).map_err(|e| e.to_string())
                );
                match refusal {
                    Refusal::Full => self.model.c.rejected_full += 1,
                    Refusal::ShuttingDown => self.model.c.rejected_shutdown += 1,
                }
                self.note(format!(" -> refused ({refusal:?})"));
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
        let mut o = self.pool.offload(func);
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
                });
            }
            Some(Refusal::ShuttingDown) => {
                let got = self.within("submit after shutdown", fut).await;
                let ok = matches!(&got, Err(e) if matches!(e.reason(), Rejected::ShuttingDown));
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
        let mut o = self.pool.offload(func);
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
                let ok = matches!(
                    &first,
                    Poll::Ready(Err(Error::Rejected(Rejected::ShuttingDown)))
                );
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
                let ok = matches!(&got, Err(Error::Rejected(Rejected::FullUntilTimeout { capacity, .. })) if *capacity == self.cfg.queue_capacity)
                    && text.contains("stayed full");
                ensure!(
                    self,
                    ok,
                    "offload on a full queue: expected FullUntilTimeout, got {got:?}"
                );
                self.model.c.rejected_full += 1;
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
                    let t = self.model.accept(kind, name, state != JobState::Queued);
                    self.register(t, Some(id), gate);
                    self.note(format!(" (timed out at the first poll, {state:?})"));
                    let want_state = self.model.jobs[t].st.job_state();
                    let want_fate = self.model.abandon(t, effective, true);
                    self.model.advance();
                    ensure!(
                        self,
                        state == want_state,
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
            try_within(&what, handle.wait_timeout(SHORT)).await
        };
        let got = waited.unwrap_or_else(|hung| self.fail(hung));
        if st.terminal() {
            self.check_outcome("await", tag, taken, &got);
            self.slots[i].taken = true;
        } else {
            self.check_timed_out("await", tag, st.job_state(), Fate::KeptRunning, &got);
        }
        // An await of the handle itself uses up its spawned time-out.
        if st.terminal() || timer {
            self.slots[i].timer = false;
        }
    }

    async fn wait_timeout(&mut self, i: usize) {
        let tag = self.slots[i].tag;
        let st = self.model.jobs[tag].st.clone();
        self.note(format!(" -> job {tag}"));
        let limit = if st.terminal() { LONG } else { SHORT };
        let what = format!("wait_timeout on job {tag}");
        let got = match try_within(&what, self.slots[i].handle.wait_timeout(limit)).await {
            Ok(got) => got,
            Err(hung) => self.fail(hung),
        };
        if st.terminal() {
            let taken = self.slots[i].taken;
            self.check_outcome("wait_timeout", tag, taken, &got);
            self.slots[i].taken = true;
        } else {
            self.check_timed_out("wait_timeout", tag, st.job_state(), Fate::KeptRunning, &got);
        }
    }

    fn blocking_wait(&mut self, i: usize) {
        let tag = self.slots[i].tag;
        let st = self.model.jobs[tag].st.clone();
        self.note(format!(" -> job {tag}"));
        let slot = self.slots.remove(i);
        let taken = slot.taken;
        if st.terminal() {
            let got = std::thread::spawn(move || slot.handle.blocking_wait())
                .join()
                .expect("blocking_wait thread");
            self.check_outcome("blocking_wait", tag, taken, &got);
        } else {
            let (slot, got) = std::thread::spawn(move || {
                let mut slot = slot;
                let got = slot.handle.blocking_wait_timeout(SHORT);
                (slot, got)
            })
            .join()
            .expect("blocking_wait_timeout thread");
            self.check_timed_out(
                "blocking_wait_timeout",
                tag,
                st.job_state(),
                Fate::KeptRunning,
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
        let report = self
            .within("close", self.pool.close(graceful, after_stop))
            .await;
        let want = self.model.close();
        self.note(format!(" -> {want:?}"));
        let unstarted: Vec<JobId> = report.unstarted.iter().map(|u| u.id).collect();
        let want_unstarted: Vec<JobId> = want.unstarted.iter().map(|j| self.ids[j]).collect();
        ensure!(
            self,
            report.escalated == want.escalated
                && report.terminated == want.terminated
                && unstarted == want_unstarted
                && report.panicked == want.panicked,
            "close report {report:?}, model {want:?}"
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
                report.still_running.is_empty() && report.completed == want.completed,
                "close report {report:?}, model {want:?}"
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
                    job.kind == Kind::Gated && job.started && self.ids.contains_key(j)
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
                report.completed <= want.completed,
                "close report {report:?}, model {want:?}"
            );
        }
    }

    /// After the last operation: release everything, collect every handle,
    /// wait for idleness, shut down, wait for termination, close the books.
    async fn finish(&mut self) {
        self.log.push("end: release every gate".to_owned());
        for _ in 0..3 {
            for gate in self.gates.values_mut() {
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
        self.within("idle() at the end", self.pool.idle()).await;
        self.log.push("end: shutdown, termination".to_owned());
        self.pool.shutdown();
        self.model.shutdown();
        self.settle().await;
        let m = self.pool.metrics();
        ensure!(
            self,
            self.pool.is_terminated()
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

fn run_case(cfg: Cfg, model_cfg: Cfg, ops: &[Op]) {
    run_case_within(cfg, model_cfg, ops, SETTLE);
}

fn run_case_within(cfg: Cfg, model_cfg: Cfg, ops: &[Op], settle_within: Duration) {
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
            eprintln!("case passed: {cfg:?}\n    {}", h.log.join("\n    "));
        }
    });
}

fn config() -> ProptestConfig {
    ProptestConfig {
        // `PROPTEST_CASES=5000` for a long run.
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(256),
        // The counterexample is printed; no regression file in the tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// The real offloader behaves as the sequential model of the contract,
    /// step by step.
    #[test]
    fn offloader_matches_the_model((cfg, ops) in scenario()) {
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
        Op::WaitTimeout(1),
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
    ];
    run_case(cfg, cfg, &ops);
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
