//! The pool's locked state, with one method per transition.
//!
//! Everything the pool knows about its jobs and threads lives in [`State`],
//! behind the pool's one mutex, with private fields. Each transition of a
//! job's path (`docs/ARCHITECTURE.md`) and of the protocols argued in
//! `README.md` beside this file (waking workers, lanes, the queue bound,
//! overload, the drain) is one method that updates the queue, the
//! counters, the observer's event queue and the job's state word together,
//! and records in an [`After`] the work to do once the lock is released:
//! threads to unpark, waiters to wake, events to deliver, a job whose
//! outcome must be published. The caller runs it with `Inner::after`
//! (pool.rs).
//!
//! Parts of it are sub-states that own their fields, each in its own file:
//! [`Workers`] (the threads), [`Bound`] (the queue bound's count and
//! reservations), [`Waiters`] (who waits for what), [`Groups`] (job
//! groups), `Lanes` (the lanes, their turns and the limiters they wait
//! for: lanes.rs) and `Events` (the observer's queue: events.rs). Their
//! methods keep only their own fields' rules; whatever must change more
//! than one of them is a method of [`State`]. `Workers`, `Bound` and
//! `Groups` are open to the crate, so that callers outside reach them
//! directly (`s.workers.park(..)`, `s.groups.metrics(..)`).
//!
//! # Invariants
//!
//! S1–S5 are how this module keeps invariants 1, 3, 4, 9 and 10 of
//! `docs/ARCHITECTURE.md`; L1–L5 are how lanes (lanes.rs) keep invariant 1
//! for a key's limit and a limiter's permits, and serve lanes in turn.
//!
//! - **S1 (permits).** A job moves `Queued → Running` only in
//!   [`State::start`], which links it into `running`; it leaves `running`
//!   only in [`State::finish`], after its function returned or unwound. A
//!   start never happens with `running.len() == max_in_flight`, because
//!   every worker runs one function at a time and there are at most
//!   `max_in_flight` workers. So `running <= max_in_flight` always.
//! - **S2 (queue = Queued + tombstones).** A job leaves `Queued` (for
//!   `Running`, `Cancelled`, `Shed` or `Unstarted`) only by
//!   `JobCore::transition`, under the lock. Starting and draining unlink it
//!   in the same critical section; a cancel or a shed leaves it linked as a
//!   *tombstone* (touching only the
//!   job, not its queue neighbours: a cancel at any position costs the same)
//!   and counts it. So the lanes' lists hold, each in submission order,
//!   exactly the jobs whose state word reads `Queued` (`queued` of them)
//!   plus `tombstones` cancelled ones; `running` holds exactly those reading
//!   `Running`. Tombstones are unlinked when they reach the front of their
//!   lane, and all of a lane's at once whenever they outnumber its queued
//!   jobs (a walk paid for by the cancels that made them), so they never
//!   hold more than the live queue's memory.
//! - **L1 (ring = startable lanes).** A lane is linked in `Lanes::ring` exactly
//!   when it has a queued job and fewer running jobs than its limit (and no
//!   immediate shutdown is draining); every change of a lane's counts ends
//!   in `lane_update`, which restores this. So [`State::start`] finds a
//!   startable job, if there is one, at the front of the ring's first lane.
//! - **L2 (turns).** A start takes the front job of the ring's first lane,
//!   which then goes to the back of the ring: among lanes with a startable
//!   job, each is served once per round, and a lane's jobs start in
//!   submission order. With only the default lane (no keys), that is the
//!   pool's FIFO order.
//! - **L4 (limiters block lanes, not the queue).** A lane whose front job
//!   cannot have a permit of one of its limiters (limiter/mod.rs) is out of the
//!   ring and in exactly one list: `limited[id].lanes`, the lanes blocked on
//!   that limiter, in the order they blocked (`blocked_on` names it). A
//!   permit granted to this pool (limiter/mod.rs M3) readies the first of them
//!   at the front of the ring (`woken_by` names the limiter; `readied`
//!   counts such lanes, each promised a pool permit); a readied lane that
//!   does not use the grant — its front job was cancelled, needs another
//!   full limiter, or needs none — passes it to the next, or gives it back.
//!   A cancel of a blocked lane's front job readies the lane too (its front
//!   changed); a cancel further back leaves it its place. So a lane waits
//!   only while its front job's limiter has no permit that another of this
//!   pool's lanes was readied for.
//! - **L5 (waiting counts lanes).** `startable_queued` is the sum, over
//!   the lanes in the ring, of `min(queued, limit - running)`: the queued
//!   jobs a free permit would start now; `lane_update` keeps each lane's
//!   share (`contrib`) and a blocked lane's is zero. Admission counts as
//!   waiting every queued job beyond `min(free permits, startable_queued)`
//!   (so a key's jobs held back by its limit fill the queue bound), and
//!   admits beyond the bound a job that would start at once (invariant 8).
//! - **L3 (lanes follow use).** A keyed lane exists while it holds a queued
//!   job, a tombstone or a running job, and afterwards only as one of the
//!   at most `KEEP_IDLE_LANES` most recently emptied (`Lanes::idle`, so that
//!   a key whose jobs come one at a time does not make and drop its lane
//!   for each); once only the default lane holds a job and the lane slab
//!   outgrew a few entries, the idle lanes go and the slab gives its
//!   memory back. The default lane always exists.
//! - **S3 (ledger).** Every counter changes in the critical section of the
//!   transition it counts, and [`State::snapshot`] copies them under the
//!   lock: `accepted = queued + running + terminal` in every snapshot.
//! - **S4 (nothing foreign under the lock).** No method here runs user
//!   code, drops a user value, wakes a waker or emits a tracing event or
//!   span. Whatever would (waking, unparking, discarding a function,
//!   delivering an event, dropping the slab's reference to a job) is
//!   handed out in an [`After`] or a return value.
//! - **S5 (O(1)).** Every per-job method is O(1) *amortised* in the number
//!   of queued jobs, in the number of keys and in `max_in_flight`: jobs,
//!   lanes and parked workers live in [`Slab`]s, and each knows its own
//!   key. The amortised parts are walks paid for in advance: a cancel that
//!   finds its lane's tombstones outnumbering its queued jobs unlinks them
//!   all (one cancel in a lane of a million jobs can take tens of
//!   milliseconds; a million cancels take what a million O(1) steps take),
//!   and the lane slab's compaction once the last keyed lane is gone.

use std::time::Duration;

use crate::job::cell::Task;
use crate::util::slab::{List, Slab};

mod admission;
mod bound;
pub(crate) use bound::Bound;
mod events;
mod groups;
mod intake;
use events::Events;
pub(crate) use groups::Groups;
pub(crate) use transitions::StoppedJobs;
mod lanes;
pub(crate) use lanes::KeyLimits;
use lanes::Lanes;
mod overload;
pub(crate) use lanes::OwnWaitMark;
mod queries;
mod transitions;
mod waiters;
pub(crate) use waiters::Wait;
use waiters::Waiters;
mod workers;
use crate::util::sync::{thread, Arc};
pub(crate) use workers::Workers;

/// Work left to do after the lock is released (S4). Transitions add to it;
/// `Inner::after` carries it out.
#[must_use = "the work after unlocking must be carried out"]
#[derive(Default)]
pub(crate) struct After {
    /// Claimed parked workers to unpark.
    pub(crate) unpark: Unpark,
    /// Callers waiting for room to wake.
    pub(crate) room: Room,
    /// The pool may have become idle or terminated and somebody waits.
    pub(crate) settled: bool,
    /// Observer events were queued.
    pub(crate) events: bool,
    /// A job reference the slab let go of, dropped after unlocking (the
    /// last reference drops the job's result, which is user code).
    pub(crate) release: Option<Arc<dyn Task>>,
    /// Tombstones unlinked from the queue (S2), dropped after unlocking.
    pub(crate) dead: Vec<Arc<dyn Task>>,
    /// Jobs shed at their turn (overload.rs): their functions to discard
    /// and outcomes to publish after unlocking.
    pub(crate) shed: Vec<Arc<dyn Task>>,
    /// Job groups that became idle: their waiters to wake.
    pub(crate) idle_groups: Vec<std::sync::Arc<crate::util::wait_list::WaitList>>,
    /// Limiters whose permits were given back: the pools to tell.
    pub(crate) limiter_wakes: Vec<crate::job::limiter::Wake>,
    /// A lane became startable outside a worker's or a submitter's path:
    /// make sure a worker will look (lanes.rs L4).
    pub(crate) find_worker: bool,
}

impl After {
    /// Whether there is nothing to carry out.
    pub(crate) fn is_empty(&self) -> bool {
        let After {
            unpark,
            room,
            settled,
            events,
            release,
            dead,
            shed,
            idle_groups,
            limiter_wakes,
            find_worker,
        } = self;
        unpark.is_empty()
            && *room == Room::None
            && !settled
            && !events
            && release.is_none()
            && dead.is_empty()
            && shed.is_empty()
            && idle_groups.is_empty()
            && limiter_wakes.is_empty()
            && !find_worker
    }

    /// Whether carrying this out runs foreign code (waiters' wakers; a
    /// limiter's permit given to another pool, which wakes its waiters; a
    /// shed job's function dropped).
    pub(crate) fn runs_foreign_code(&self) -> bool {
        self.room != Room::None
            || !self.shed.is_empty()
            || self.settled
            || !self.idle_groups.is_empty()
            || !self.limiter_wakes.is_empty()
    }
}

/// Claimed parked workers to unpark after unlocking. Usually one (a
/// submitter's or a starting worker's claim), kept without allocating; all
/// of them at a shutdown.
#[derive(Default)]
pub(crate) struct Unpark {
    first: Option<thread::Thread>,
    rest: Vec<thread::Thread>,
}

impl Unpark {
    pub(crate) fn push(&mut self, worker: thread::Thread) {
        match self.first {
            None => self.first = Some(worker),
            Some(_) => self.rest.push(worker),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    /// Unparks them all.
    pub(crate) fn unpark(self) {
        for worker in self.first.into_iter().chain(self.rest) {
            worker.unpark();
        }
    }
}

/// Which room waiters to wake.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Room {
    #[default]
    None,
    /// A slot freed: one waiter may take it.
    One,
    /// Shutdown (every waiter learns it is refused), an observer that
    /// caught up, or a free permit only some waiters' jobs can take.
    All,
}

/// Where a new or unclaimed job's worker comes from (the wake protocol,
/// state/README.md "Waking workers").
pub(crate) enum Worker {
    /// A worker is already searching; it will find the job.
    Searching,
    /// A parked worker was claimed: unpark it after unlocking.
    Claimed(thread::Thread),
    /// A new worker must be spawned, under the lock, with this id; it is
    /// already counted. Call [`State::spawn_failed`] if the spawn fails.
    Spawn(u64),
    /// Every worker is busy and there may be no more; one of them comes
    /// back to the queue when its function returns.
    Busy,
}

/// The counters behind [`Metrics`](crate::Metrics); changed only under the lock (S3).
#[derive(Default)]
struct Counts {
    accepted: u64,
    rejected_full: u64,
    rejected_timed_out: u64,
    rejected_overload: u64,
    rejected_shutdown: u64,
    rejected_spawn: u64,
    rejected_observer: u64,
    spawn_failures: u64,
    completed: u64,
    panicked: u64,
    cancelled: u64,
    unstarted: u64,
    shed: u64,
    callers_timed_out: u64,
    callers_dropped: u64,
    running_after_caller_left: u64,
    stop_requests: u64,
    max_running: u64,
    queue_wait_total: Duration,
    run_time_total: Duration,
}

/// The pool's state behind its one lock.
pub(crate) struct State {
    max_in_flight: usize,
    /// The queue bound and its reservations.
    pub(crate) bound: Bound,
    /// Every queued or running job, by the key its core records.
    jobs: Slab<Arc<dyn Task>>,
    /// Job groups (groups.rs).
    pub(crate) groups: Groups,
    /// The lanes and their turns (lanes.rs).
    lanes: Lanes,
    /// The lanes an immediate shutdown has still to drain, last first.
    drain_lanes: Vec<crate::util::slab::Key>,
    /// The `Queued` jobs, in every lane (S2).
    queued: usize,
    /// The cancelled jobs still linked in a lane (S2).
    tombstones: usize,
    /// Exactly the `Running` jobs; its length is the permits held (S1).
    running: List,
    /// The worker threads, and the pool's other threads.
    pub(crate) workers: Workers,
    /// Terminal jobs whose outcome is not yet published (or, for a
    /// worker's last job, not yet settled at its next lock).
    unpublished: usize,
    /// Who waits for room, idleness or a queued job.
    waiters: Waiters,
    shutdown: bool,
    /// An immediate shutdown is draining the queue: nothing starts.
    draining: bool,
    /// The observer's events (events.rs).
    events: Events,
    counts: Counts,
    /// Whether jobs are judged for their deadlines (overload.rs; off only
    /// by a test hook).
    judge: bool,
    /// The pool's intake (fast/intake.rs), if plain jobs may pass one: no
    /// observer, no stuck-job monitor.
    intake: Option<std::sync::Arc<crate::core::fast::intake::Intake>>,
}

impl State {
    pub(crate) fn new(
        max_in_flight: usize,
        queue_capacity: usize,
        observer_lag: Option<usize>,
        key_limits: KeyLimits,
        count: std::sync::Arc<crate::core::fast::intake::QueueCount>,
        watcher: std::sync::Weak<dyn crate::job::limiter::Watcher>,
        intake: Option<std::sync::Arc<crate::core::fast::intake::Intake>>,
    ) -> Self {
        State {
            max_in_flight,
            bound: Bound::new(queue_capacity, count),
            jobs: Slab::default(),
            groups: Groups::default(),
            lanes: Lanes::new(
                key_limits,
                crate::job::limiter::PoolRef::new(watcher, max_in_flight),
            ),
            drain_lanes: Vec::new(),
            queued: 0,
            tombstones: 0,
            running: List::default(),
            workers: Workers::new(max_in_flight, intake.clone()),
            unpublished: 0,
            waiters: Waiters::default(),
            shutdown: false,
            draining: false,
            events: Events::new(observer_lag),
            counts: Counts::default(),
            judge: true,
            intake,
        }
    }

    /// Transition *stop-accepting* (graceful shutdown); `false` if already
    /// shut down. Claims every parked worker (each re-checks the queue,
    /// drains it and exits) and wakes every room waiter.
    pub(crate) fn begin_shutdown(&mut self, after: &mut After) -> bool {
        if self.shutdown {
            return false;
        }
        self.shutdown = true;
        // Nothing passes the intake from now on (fast/intake.rs inv. 1).
        self.refresh_intake();
        self.workers.claim_all_parked(after);
        after.room = Room::All;
        self.settle_check(after);
        true
    }

    // ----- waiters and queries -------------------------------------------

    /// A running function (of the job `waiter`, this pool's slab key, if
    /// known) starts waiting for the queued job `waited` of this pool.
    /// Refused (and nothing counted) if the queued job could then never
    /// start: every permit of the pool, of its key's lane, or of a limiter
    /// both jobs need, would be held by a function waiting like this. The
    /// returned mark undoes the count ([`State::own_wait_ended`]).
    pub(crate) fn own_wait_begins(
        &mut self,
        waiter: Option<crate::util::slab::Key>,
        waited: &crate::job::record::JobCore,
    ) -> Result<OwnWaitMark, ()> {
        if self.waiters.own() + 1 >= self.max_in_flight {
            return Err(());
        }
        let mark = self.lane_own_wait(waiter, waited)?;
        self.waiters.count_own(true);
        Ok(mark)
    }

    /// A wait counted by [`State::own_wait_begins`] ended.
    pub(crate) fn own_wait_ended(&mut self, mark: OwnWaitMark) {
        self.waiters.count_own(false);
        self.lane_own_wait_ended(mark);
    }

    fn settle_check(&self, after: &mut After) {
        if self.waiters.for_settle() && (self.is_idle() || self.is_terminated()) {
            after.settled = true;
        }
    }

    /// Nothing of this pool runs or can start without something outside
    /// it (clock.rs lets a paused test clock move then): no function runs,
    /// no outcome or event is pending, and either the queue is empty and
    /// no pool thread is on its way out (an open pool waits for a caller's
    /// job or shutdown; a shut-down one has terminated), or no lane is
    /// startable and every lane holding jobs is blocked on a limiter no
    /// running function holds and none of whose permits is granted.
    pub(crate) fn stalled(&self) -> bool {
        if !self.running.is_empty() || self.unpublished > 0 || !self.events.is_drained() {
            return false;
        }
        if self.queued == 0 {
            return !self.shutdown || self.is_terminated();
        }
        !self.draining && !self.has_startable() && self.blocked_limiters_idle()
    }

    /// Every accepted job is terminal, its outcome published and every
    /// event delivered.
    pub(crate) fn is_idle(&self) -> bool {
        self.queued == 0
            && self.running.is_empty()
            && self.unpublished == 0
            && self.events.is_drained()
    }

    /// Shut down, idle, and every pool thread has exited *and been joined*
    /// (its thread-local destructors have run).
    pub(crate) fn is_terminated(&self) -> bool {
        self.threads_retired() && self.workers.all_joined()
    }

    /// Shut down, idle, and every pool thread has retired (some may still
    /// be exiting: see [`Workers::take_exited`]).
    pub(crate) fn threads_retired(&self) -> bool {
        self.shutdown && self.is_idle() && self.workers.all_retired()
    }

    /// Shut down, idle and no worker left (the monitor's exit condition).
    pub(crate) fn workers_done(&self) -> bool {
        self.shutdown && self.is_idle() && self.workers.live() == 0
    }

    pub(crate) fn is_shutdown(&self) -> bool {
        self.shutdown
    }
}
