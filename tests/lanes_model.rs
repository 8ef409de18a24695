//! Model-based test of keys and limiters (issue 12): random sequences of
//! keyed and limited jobs, releases, cancels and limiter increases against
//! a model of the lanes. After every step the pool must settle where the
//! model says it can: every job the model can start has started (no lost
//! wake-up, no head-of-line blocking), and nothing more (checked inside
//! the functions, as they run: the pool's, each key's and each limiter's
//! bound). Jobs of one lane start in submission order. The pool's metrics,
//! each limiter's counts and the keys' lanes match the model after every
//! step, and the ledger balances.
//!
//! The model's lanes: a keyed job is in its key's lane; an unkeyed job
//! with limiters in the lane of its set of limiters; the rest in the
//! default lane. A lane's front queued job can start when a pool permit is
//! free, its key is below its limit, and each of its limiters has a free
//! permit.
//!
//! `PROPTEST_CASES=1000 cargo test --release --test lanes_model` for a
//! longer run.

mod support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use offloader::{JobHandle, Limiter, Offloader};
use proptest::prelude::*;
use support::model::{self, Steps};
use support::{Ledger, HANG};

const KEYS: [Option<&str>; 3] = [None, Some("a"), Some("b")];

#[derive(Debug, Clone, Copy)]
struct Cfg {
    max_in_flight: usize,
    per_key: usize,
    permits: [usize; 2],
}

#[derive(Debug, Clone, Copy)]
enum Op {
    /// A job of key `KEYS[key]` needing the limiters in bitmask `lims`.
    Spawn { key: usize, lims: u8 },
    /// Let the `i`-th running job (mod their number) return.
    Finish(usize),
    /// Cancel the `i`-th queued job (mod their number).
    Cancel(usize),
    /// `set_permits(permits + by)` on limiter `l`.
    Raise { l: usize, by: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Queued,
    Running,
    Done,
    Cancelled,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum LaneId {
    Default,
    Key(&'static str),
    Limiters(u8),
}

struct ModelJob {
    key: Option<&'static str>,
    lims: u8,
    st: St,
    gate: Arc<(Mutex<bool>, Condvar)>,
    handle: Option<JobHandle<()>>,
}

impl ModelJob {
    fn lane(&self) -> LaneId {
        match (self.key, self.lims) {
            (Some(k), _) => LaneId::Key(k),
            (None, 0) => LaneId::Default,
            (None, l) => LaneId::Limiters(l),
        }
    }

    fn needs(&self, l: usize) -> bool {
        self.lims & (1 << l) != 0
    }
}

/// What the running functions see, checked as they start.
#[derive(Default)]
struct Inside {
    running: usize,
    per_key: [usize; 3],
    per_lim: [usize; 2],
    violation: Option<String>,
}

struct Harness {
    cfg: Cfg,
    pool: Offloader,
    limiters: [Limiter; 2],
    permits: Arc<[AtomicUsize; 2]>,
    inside: Arc<Mutex<Inside>>,
    started_tx: std::sync::mpsc::Sender<usize>,
    started: std::sync::mpsc::Receiver<usize>,
    jobs: Vec<ModelJob>,
    log: Steps,
}

impl Harness {
    fn new(cfg: Cfg) -> Self {
        let pool = Offloader::builder()
            .max_in_flight(cfg.max_in_flight)
            .max_per_key(cfg.per_key)
            .queue_capacity(1024)
            .build()
            .expect("valid configuration");
        let (started_tx, started) = std::sync::mpsc::channel();
        Harness {
            cfg,
            pool,
            limiters: [Limiter::new(cfg.permits[0]), Limiter::new(cfg.permits[1])],
            permits: Arc::new([
                AtomicUsize::new(cfg.permits[0]),
                AtomicUsize::new(cfg.permits[1]),
            ]),
            inside: Arc::default(),
            started_tx,
            started,
            jobs: Vec::new(),
            log: Steps::default(),
        }
    }

    fn fail(&self, what: String) -> ! {
        self.log.fail(
            &what,
            &self.cfg,
            &format!("{:?}", self.jobs),
            &format!("{:?}", self.pool.metrics()),
        )
    }

    fn spawn(&mut self, key: usize, lims: u8) {
        let tag = self.jobs.len();
        let key_name = KEYS[key];
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let (inside, permits, tx, g) = (
            self.inside.clone(),
            self.permits.clone(),
            self.started_tx.clone(),
            gate.clone(),
        );
        let (m, k) = (self.cfg.max_in_flight, self.cfg.per_key);
        let mut o = self.pool.offload(move |_stop| {
            {
                let mut s = inside.lock().unwrap();
                s.running += 1;
                s.per_key[key] += 1;
                let mut bad = Vec::new();
                if s.running > m {
                    bad.push(format!(
                        "{} functions running, max_in_flight {m}",
                        s.running
                    ));
                }
                if key > 0 && s.per_key[key] > k {
                    bad.push(format!("key {key_name:?}: {} running", s.per_key[key]));
                }
                for l in 0..2 {
                    if lims & (1 << l) != 0 {
                        s.per_lim[l] += 1;
                        let p = permits[l].load(Ordering::SeqCst);
                        if s.per_lim[l] > p {
                            bad.push(format!(
                                "limiter {l}: {} running, {p} permits",
                                s.per_lim[l]
                            ));
                        }
                    }
                }
                if !bad.is_empty() && s.violation.is_none() {
                    s.violation = Some(format!("job {tag} started: {}", bad.join(", ")));
                }
            }
            let _ = tx.send(tag);
            let (open, cv) = &*g;
            let mut o = open.lock().unwrap();
            let deadline = std::time::Instant::now() + HANG;
            while !*o {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                o = cv.wait_timeout(o, left).unwrap().0;
            }
            drop(o);
            let mut s = inside.lock().unwrap();
            s.running -= 1;
            s.per_key[key] -= 1;
            for l in 0..2 {
                if lims & (1 << l) != 0 {
                    s.per_lim[l] -= 1;
                }
            }
        });
        if let Some(k) = key_name {
            o = o.key(k);
        }
        for l in 0..2 {
            if lims & (1 << l) != 0 {
                o = o.limiter(&self.limiters[l]);
            }
        }
        let handle = o
            .spawn()
            .unwrap_or_else(|e| self.fail(format!("refused: {e}")));
        self.jobs.push(ModelJob {
            key: key_name,
            lims,
            st: St::Queued,
            gate,
            handle: Some(handle),
        });
    }

    fn running_model(&self) -> (usize, [usize; 3], [usize; 2]) {
        let mut total = 0;
        let mut per_key = [0; 3];
        let mut per_lim = [0; 2];
        for j in self.jobs.iter().filter(|j| j.st == St::Running) {
            total += 1;
            if let Some(k) = KEYS.iter().position(|k| *k == j.key) {
                per_key[k] += 1;
            }
            for (l, n) in per_lim.iter_mut().enumerate() {
                if j.needs(l) {
                    *n += 1;
                }
            }
        }
        (total, per_key, per_lim)
    }

    /// A job the model says can start now: the front queued job of a lane
    /// whose key and limiters have room, with a pool permit free.
    fn startable(&self) -> Option<usize> {
        let (total, per_key, per_lim) = self.running_model();
        if total >= self.cfg.max_in_flight {
            return None;
        }
        let lanes: BTreeSet<LaneId> = self.jobs.iter().map(ModelJob::lane).collect();
        for lane in lanes {
            let Some(front) = self
                .jobs
                .iter()
                .position(|j| j.lane() == lane && j.st == St::Queued)
            else {
                continue;
            };
            let j = &self.jobs[front];
            let key_room = match KEYS.iter().position(|k| *k == j.key) {
                Some(0) | None => true,
                Some(k) => per_key[k] < self.cfg.per_key,
            };
            let lim_room =
                (0..2).all(|l| !j.needs(l) || per_lim[l] < self.permits[l].load(Ordering::SeqCst));
            if key_room && lim_room {
                return Some(front);
            }
        }
        None
    }

    /// Waits until every job the model can start has started; checks each
    /// start was allowed and in its lane's order.
    fn settle(&mut self) {
        loop {
            while let Ok(tag) = self.started.try_recv() {
                self.started_one(tag);
            }
            let Some(want) = self.startable() else {
                break;
            };
            match self.started.recv_timeout(HANG) {
                Ok(tag) => self.started_one(tag),
                Err(_) => self.fail(format!(
                    "job {want} could start ({HANG:?} waited) but did not"
                )),
            }
        }
        if let Some(v) = self.inside.lock().unwrap().violation.clone() {
            self.fail(v);
        }
        self.check_order();
        self.check_counts();
    }

    /// Jobs of one lane start in submission order: once settled, no job
    /// has started while an earlier one of its lane is still queued. (Not
    /// checked start by start: two jobs of a lane may start together and
    /// signal in either order.)
    fn check_order(&self) {
        for (t, j) in self.jobs.iter().enumerate() {
            if matches!(j.st, St::Running | St::Done) {
                let lane = j.lane();
                if let Some(e) = self.jobs[..t]
                    .iter()
                    .position(|e| e.lane() == lane && e.st == St::Queued)
                {
                    self.fail(format!(
                        "job {t} started before job {e} of its lane {lane:?}"
                    ));
                }
            }
        }
    }

    fn started_one(&mut self, tag: usize) {
        if self.jobs[tag].st != St::Queued {
            self.fail(format!("job {tag} started from {:?}", self.jobs[tag].st));
        }
        self.jobs[tag].st = St::Running;
        self.log.push(format!("  started {tag}"));
    }

    fn check_counts(&self) {
        let m = self.pool.metrics();
        let queued = self.jobs.iter().filter(|j| j.st == St::Queued).count();
        let (running, per_key, per_lim) = self.running_model();
        if !m.ledger_balances() || m.queued as usize != queued || m.running as usize != running {
            self.fail(format!(
                "metrics {m:?}; model queued {queued}, running {running}"
            ));
        }
        for (l, limiter) in self.limiters.iter().enumerate() {
            let s = limiter.stats();
            let waiting = self
                .jobs
                .iter()
                .filter(|j| j.st == St::Queued && j.needs(l))
                .count();
            if s.in_use != per_lim[l] || s.waiting != waiting {
                self.fail(format!(
                    "limiter {l}: {s:?}; model in use {}, waiting {waiting}",
                    per_lim[l]
                ));
            }
        }
        for stat in self.pool.key_stats(10) {
            let k = KEYS
                .iter()
                .position(|k| k.is_some_and(|k| stat.key == k.into()))
                .unwrap_or_else(|| self.fail(format!("unknown key {stat:?}")));
            let q = self
                .jobs
                .iter()
                .filter(|j| j.st == St::Queued && j.key == KEYS[k])
                .count();
            if stat.running as usize != per_key[k] || stat.queued as usize != q {
                self.fail(format!(
                    "{stat:?}; model running {}, queued {q}",
                    per_key[k]
                ));
            }
        }
    }

    fn finish(&mut self, i: usize) {
        let running: Vec<usize> = (0..self.jobs.len())
            .filter(|&t| self.jobs[t].st == St::Running)
            .collect();
        if running.is_empty() {
            self.log.push("finish: none running");
            return;
        }
        let tag = running[i % running.len()];
        self.log.push(format!("finish {tag}"));
        let (open, cv) = &*self.jobs[tag].gate;
        *open.lock().unwrap() = true;
        cv.notify_all();
        let mut handle = self.jobs[tag]
            .handle
            .take()
            .expect("a running job's handle");
        if let Err(e) = handle.blocking_wait(None) {
            self.fail(format!("job {tag} failed: {e}"));
        }
        self.jobs[tag].st = St::Done;
    }

    fn cancel(&mut self, i: usize) {
        let queued: Vec<usize> = (0..self.jobs.len())
            .filter(|&t| self.jobs[t].st == St::Queued)
            .collect();
        if queued.is_empty() {
            self.log.push("cancel: none queued");
            return;
        }
        let tag = queued[i % queued.len()];
        self.log.push(format!("cancel {tag}"));
        let handle = self.jobs[tag].handle.take().expect("a queued job's handle");
        // Settled: nothing the model cannot start starts, so it is queued.
        if !handle.cancel() {
            self.fail(format!("cancel of queued job {tag} lost"));
        }
        self.jobs[tag].st = St::Cancelled;
    }

    fn raise(&mut self, l: usize, by: usize) {
        let p = self.permits[l].load(Ordering::SeqCst) + by;
        self.log.push(format!("raise limiter {l} to {p}"));
        // The model's bound goes up first: a start it allows may follow at
        // once.
        self.permits[l].store(p, Ordering::SeqCst);
        self.limiters[l].set_permits(p);
    }

    fn run(&mut self, ops: &[Op]) {
        for op in ops {
            match *op {
                Op::Spawn { key, lims } => {
                    self.log.push(format!(
                        "spawn {} key {:?} lims {lims}",
                        self.jobs.len(),
                        KEYS[key]
                    ));
                    self.spawn(key, lims);
                }
                Op::Finish(i) => self.finish(i),
                Op::Cancel(i) => self.cancel(i),
                Op::Raise { l, by } => self.raise(l, by),
            }
            self.settle();
        }
        // Drain: let everything run.
        self.log.push("drain");
        while self.jobs.iter().any(|j| j.st == St::Running) {
            self.finish(0);
            self.settle();
        }
        if self.jobs.iter().any(|j| j.st == St::Queued) {
            self.fail("jobs left queued with nothing running".into());
        }
        let m = self.pool.metrics();
        if m.queued + m.running != 0 || !m.ledger_balances() {
            self.fail(format!("not idle at the end: {m:?}"));
        }
        if !self.pool.key_stats(10).is_empty() {
            self.fail("lanes left at the end".into());
        }
    }
}

impl std::fmt::Debug for ModelJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}/{:?}/{}", self.st, self.key, self.lims)
    }
}

fn cfg() -> impl Strategy<Value = Cfg> {
    (1usize..=3, 1usize..=2, 1usize..=2, 1usize..=2).prop_map(|(m, k, p0, p1)| Cfg {
        max_in_flight: m,
        per_key: k,
        permits: [p0, p1],
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0usize..3, 0u8..4).prop_map(|(key, lims)| Op::Spawn { key, lims }),
        3 => any::<usize>().prop_map(Op::Finish),
        1 => any::<usize>().prop_map(Op::Cancel),
        1 => (0usize..2, 1usize..=2).prop_map(|(l, by)| Op::Raise { l, by }),
    ]
}

proptest! {
    #![proptest_config(model::config(128))]

    #[test]
    fn keys_and_limiters_match_the_model(cfg in cfg(), ops in prop::collection::vec(op(), 1..40)) {
        let mut h = Harness::new(cfg);
        h.run(&ops);
    }
}

/// A fixed sequence touching every op, so that a plain `cargo test` always
/// runs each path once.
#[test]
fn every_operation_once() {
    let cfg = Cfg {
        max_in_flight: 2,
        per_key: 1,
        permits: [1, 1],
    };
    let mut h = Harness::new(cfg);
    h.run(&[
        Op::Spawn { key: 1, lims: 1 },
        Op::Spawn { key: 1, lims: 0 },
        Op::Spawn { key: 0, lims: 1 },
        Op::Spawn { key: 2, lims: 3 },
        Op::Spawn { key: 0, lims: 2 },
        Op::Spawn { key: 0, lims: 0 },
        Op::Cancel(1),
        Op::Raise { l: 0, by: 1 },
        Op::Finish(0),
        Op::Finish(0),
        Op::Spawn { key: 2, lims: 1 },
    ]);
}
