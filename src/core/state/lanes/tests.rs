//! The lane policies of L3, S2 and L5 that only the pool's own state shows:
//! how many idle lanes a pool keeps, when its lane slab gives memory back,
//! when tombstones are unlinked, and when callers waiting for room are
//! signalled. Found unpinned by mutation testing; each test names the
//! mutants it kills.

use std::sync::Arc;
use std::time::Duration;

use super::{KEEP_IDLE_LANES, KEEP_LANE_SLOTS};
use crate::core::state::{After, KeyLimits, Room, State, Wait};
use crate::job::cell::Task;
use crate::job::id::JobId;
use crate::job::lane::LaneKey;
use crate::job::limiter::{Limiter, TestPool};
use crate::job::record::new_core;
use crate::job::stop::StopToken;

/// A pool's state of `max_in_flight` permits and room for `capacity`
/// waiting jobs, whose keys run one job at a time; the watcher it gives
/// limiters is `watcher`.
fn state(max_in_flight: usize, capacity: usize, watcher: &Arc<TestPool>) -> State {
    let limits = KeyLimits {
        per_key: Some(1),
        ..KeyLimits::default()
    };
    State::new(
        max_in_flight,
        capacity,
        None,
        limits,
        Arc::new(crate::core::fast::intake::QueueCount::new()),
        TestPool::weak(watcher),
        None,
    )
}

fn job(key: Option<LaneKey>, limiters: Vec<Limiter>) -> Arc<dyn Task> {
    let limiters = crate::job::limiter::Limiters::from(limiters.as_slice());
    new_core(JobId::next(), None, None, None, key, limiters, None).into_task(|_: &StopToken| ())
}

fn accept(s: &mut State, key: Option<LaneKey>, limiters: Vec<Limiter>) -> Arc<dyn Task> {
    let task = job(key, limiters);
    // The place `admit` would reserve, whatever the bound.
    let (_, seen) = s.bound.exact();
    assert!(s.bound.reserve(seen));
    s.bound.take_reservation();
    s.accept(task.clone(), &mut After::default());
    task
}

/// Runs a job of `key` from start to finish.
fn run_one(s: &mut State, key: usize) {
    accept(s, Some(key.into()), Vec::new());
    let task = s.start(0, &mut After::default()).expect("a job to start");
    s.finish(task.core(), false, Duration::ZERO, &mut After::default());
}

/// L3: keys whose jobs come one at a time leave the `KEEP_IDLE_LANES` most
/// recently emptied lanes, and no more. Kills the mutants of
/// `lane_emptied` that drop an idle lane when they are fewer (`<`) or as
/// many (`>=`) as that.
#[test]
fn a_pool_keeps_the_lanes_of_its_last_idle_keys() {
    let watcher = Arc::new(TestPool);
    let mut s = state(2, 16, &watcher);
    for key in 0..KEEP_IDLE_LANES + 4 {
        run_one(&mut s, key);
    }
    assert_eq!(s.lanes.idle.len(), KEEP_IDLE_LANES);
    assert_eq!(
        s.lanes.slab.len(),
        1 + KEEP_IDLE_LANES,
        "the default lane and the idle ones"
    );
    assert!(
        s.lanes.slab.slots() <= 2 + KEEP_IDLE_LANES,
        "{}",
        s.lanes.slab.slots()
    );
    // The last key's lane is found again, not made anew.
    let last = KEEP_IDLE_LANES + 3;
    let slots = s.lanes.slab.slots();
    run_one(&mut s, last);
    assert_eq!(
        (s.lanes.slab.len(), s.lanes.slab.slots()),
        (1 + KEEP_IDLE_LANES, slots)
    );
}

/// Queues one job on each of `keys` keys, then cancels them all, first
/// queued first; returns the lane slab's slots at the peak.
fn burst_of_keys(s: &mut State, keys: usize) -> usize {
    let jobs: Vec<_> = (0..keys)
        .map(|k| accept(s, Some(k.into()), Vec::new()))
        .collect();
    let peak = s.lanes.slab.slots();
    for job in jobs {
        assert!(s.cancel_queued(job.core(), &mut After::default()));
    }
    peak
}

/// L3: once only the default lane holds jobs, a lane slab of at most
/// `KEEP_LANE_SLOTS` slots keeps them (the next burst of keys reuses
/// them), and a larger one gives them back. Kills the mutants of
/// `KEEP_LANE_SLOTS` (`4 + 16`, `4 / 16`: the bound is four times
/// `KEEP_IDLE_LANES`), of `lane_emptied` that compare
/// the slots by `>=`, or compact while keyed lanes still hold jobs (`||`:
/// the default lane would not come back as slot 0).
#[test]
fn a_lane_slab_gives_its_memory_back_only_beyond_its_bound() {
    // The bound: room for four times the idle lanes a pool keeps.
    let bound = 4 * KEEP_IDLE_LANES;
    assert_eq!(KEEP_LANE_SLOTS, bound);
    let watcher = Arc::new(TestPool);
    let mut s = state(1, usize::MAX, &watcher);
    let peak = burst_of_keys(&mut s, bound - 1);
    assert_eq!(peak, bound);
    assert_eq!(s.lanes.slab.slots(), bound, "kept for the next burst");
    assert_eq!(s.lanes.slab.len(), 1 + KEEP_IDLE_LANES);

    let mut s = state(1, usize::MAX, &watcher);
    let peak = burst_of_keys(&mut s, bound);
    assert_eq!(peak, bound + 1);
    assert_eq!(
        (s.lanes.slab.slots(), s.lanes.slab.len()),
        (1, 1),
        "given back"
    );
    // The default lane still works.
    let task = accept(&mut s, None, Vec::new());
    let started = s.start(0, &mut After::default()).expect("a start");
    assert!(Arc::ptr_eq(&task, &started));
}

/// S2: a lane's tombstones are unlinked once they outnumber its queued
/// jobs, not before. Kills the mutant of `lane_update` that unlinks them
/// when they are as many (`>=`).
#[test]
fn tombstones_are_unlinked_once_they_outnumber_the_queued_jobs() {
    let watcher = Arc::new(TestPool);
    let mut s = state(1, usize::MAX, &watcher);
    let key: LaneKey = "k".into();
    let _front = accept(&mut s, Some(key.clone()), Vec::new());
    let back = accept(&mut s, Some(key.clone()), Vec::new());
    assert!(s.cancel_queued(back.core(), &mut After::default()));
    let lane = s
        .lanes
        .slab
        .get(super::State::lane_of(back.core()))
        .expect("lane");
    assert_eq!((lane.queued, lane.tombstones), (1, 1), "as many: kept");
    let _third = accept(&mut s, Some(key), Vec::new());
    let mut after = After::default();
    let front = s.start(0, &mut after).expect("the front job");
    assert!(after.dead.is_empty());
    let lane = s
        .lanes
        .slab
        .get(super::State::lane_of(front.core()))
        .expect("lane");
    assert_eq!((lane.queued, lane.tombstones), (1, 1));
}

/// A pool of two permits and room for one waiting job, whose one queued
/// job is blocked on a limiter of no permits (so the queue is full), with
/// a caller waiting for room; its watcher is returned to keep it alive.
fn blocked_with_a_room_waiter() -> (Arc<TestPool>, Limiter, State) {
    let watcher = Arc::new(TestPool);
    let limiter = Limiter::new(0);
    let mut s = state(2, 1, &watcher);
    accept(&mut s, None, vec![limiter.clone()]);
    assert!(s.start(0, &mut After::default()).is_none(), "blocked");
    assert_eq!(limiter.stats().pools_waiting, 1);
    s.count_waiter(Wait::Room, true);
    (watcher, limiter, s)
}

/// L5: a lane readied by a limiter's grant adds startable jobs: a caller
/// waiting for room is signalled. Kills the mutant of `lane_update` that
/// signals only when a lane's startable jobs shrink (`<`).
#[test]
fn a_lane_readied_by_a_grant_signals_room() {
    let (_watcher, limiter, mut s) = blocked_with_a_room_waiter();
    limiter.set_permits(1);
    let mut after = After::default();
    s.limiter_freed(&limiter, &mut after);
    assert_eq!(after.room, Room::One);
    assert!(after.find_worker, "a worker is to start the readied lane");
}

/// L5: a job joining a blocked lane adds no startable job: no caller
/// waiting for room is signalled. Kills the mutant of `lane_update` that
/// signals when a lane's startable jobs stay as they were (`>=`).
#[test]
fn a_job_joining_a_blocked_lane_signals_no_room() {
    let (_watcher, limiter, mut s) = blocked_with_a_room_waiter();
    let mut after = After::default();
    s.accept(job(None, vec![limiter.clone()]), &mut after);
    assert_eq!(after.room, Room::None);
}
