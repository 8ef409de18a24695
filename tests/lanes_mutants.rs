//! Keyed lanes and limiter-blocked lanes (`state/lanes.rs`, L1–L5): the
//! behaviours that mutation testing of that module found unpinned by the
//! other lane tests. Each test names the mutant it kills. Ordered by gates,
//! signals and synchronous calls (`Limiter::set_permits` tells the pools
//! waiting for it before it returns), never by sleeps.

mod support;

use offloader::{Error, JobHandle, LaneKey, Limiter, Offloader};
use support::*;

/// Spawns a job of `key` (if any) needing `limiters`, that signals `label`
/// when it starts, then waits on `hold`.
fn job(
    pool: &Offloader,
    key: Option<&str>,
    limiters: &[&Limiter],
    label: &str,
    hold: &Hold,
    started: &tokio::sync::mpsc::UnboundedSender<String>,
) -> JobHandle<()> {
    let (hold, started, label) = (hold.clone(), started.clone(), label.to_owned());
    let mut o = pool.offload(move |_| {
        started.send(label).expect("test alive");
        hold.wait();
    });
    if let Some(key) = key {
        o = o.key(key);
    }
    for l in limiters {
        o = o.limiter(l);
    }
    o.spawn().expect("accepted")
}

/// A hold whose gate is open already: its functions return at once.
fn opened() -> Hold {
    let (gate, hold) = gate();
    gate.open();
    hold
}

/// A start that goes through every lane ahead of the default lane in the
/// ring: an unlimited, unkeyed job, awaited. Lanes whose front job cannot
/// have its limiter's permit are blocked on it when this returns, in the
/// order they were tried.
async fn a_start_after(pool: &Offloader) {
    within("an unlimited job", pool.offload(|_| ()))
        .await
        .expect("an unlimited job runs");
}

/// A job that must wait for its lane (its key is at its limit) wakes no
/// worker: the worker running its key's job comes back to the queue. Kills
/// the mutants of `State::lane_has_room` that return `true`, or compare
/// with `<=` or `==` (a lane exactly at its limit has no room), and the
/// mutant of `State::has_startable` that returns `true` (a worker that
/// took the last startable job wakes another for nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_waiting_for_its_lane_wakes_no_worker() {
    let pool = builder(4, 16).max_per_key(1).build().unwrap();
    let (gate, hold) = gate();
    let (tx, mut started) = signal();
    let a0 = job(&pool, Some("a"), &[], "a0", &hold, &tx);
    assert_eq!(recv("a0", &mut started).await, "a0");
    assert_eq!(pool.metrics().workers, 1, "a0's worker took the only job");
    let a1 = job(&pool, Some("a"), &[], "a1", &hold, &tx);
    let a2 = job(&pool, Some("a"), &[], "a2", &hold, &tx);
    let m = pool.metrics();
    assert_eq!((m.running, m.queued), (1, 2), "{m:?}");
    assert_eq!(m.workers, 1, "no worker for jobs held back by their key");
    gate.open();
    for h in [a0, a1, a2] {
        within("every job", h).await.unwrap();
    }
    assert_eq!(pool.metrics().completed, 3);
}

/// A job of a key below its limit gets a worker of its own and starts
/// beside its key's running job. Kills the mutants of
/// `State::lane_has_room` that compare with `>` or `==`, or return
/// `false` (the job would wait for the busy worker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_of_a_key_below_its_limit_starts_beside_the_running_one() {
    let pool = builder(4, 16).key_limit("k", 2).build().unwrap();
    let (gate, hold) = gate();
    let (tx, mut started) = signal();
    let k0 = job(&pool, Some("k"), &[], "k0", &hold, &tx);
    assert_eq!(recv("k0", &mut started).await, "k0");
    let k1 = job(&pool, Some("k"), &[], "k1", &hold, &tx);
    assert_eq!(recv("k1, while k0 runs", &mut started).await, "k1");
    assert_eq!(pool.metrics().running, 2);
    gate.open();
    within("k0", k0).await.unwrap();
    within("k1", k1).await.unwrap();
}

/// With the queue bound reached and permits free, a job of a key exactly
/// at its limit is refused (it would wait for its lane: it counts as
/// waiting), while a job of a key below its limit is admitted (it starts
/// at once). Kills the mutants of `State::would_start_at_once` that
/// compare the lane's jobs with its limit by `<=` or `==` (refusal), and
/// by `>` (admission).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_beyond_the_bound_asks_whether_the_key_has_room() {
    let pool = builder(4, 1)
        .max_per_key(1)
        .key_limit("wide", 2)
        .build()
        .unwrap();
    let (gate, hold) = gate();
    let (tx, mut started) = signal();
    let mut handles = vec![job(&pool, Some("a"), &[], "a0", &hold, &tx)];
    assert_eq!(recv("a0", &mut started).await, "a0");
    handles.push(job(&pool, Some("wide"), &[], "w0", &hold, &tx));
    assert_eq!(recv("w0", &mut started).await, "w0");
    // One job waits for its key: the bound of one is reached, two permits
    // are free.
    handles.push(job(&pool, Some("b"), &[], "b0", &hold, &tx));
    assert_eq!(recv("b0", &mut started).await, "b0");
    handles.push(job(&pool, Some("b"), &[], "b1", &hold, &tx));
    let m = pool.metrics();
    assert_eq!((m.running, m.queued), (3, 1), "{m:?}");
    // Key "a": one running, its limit one: the job would wait.
    let refused = pool.offload(|_| ()).key("a").spawn().unwrap_err();
    assert!(
        matches!(refused.reason(), Error::Full { capacity: 1 }),
        "{refused}"
    );
    // Key "wide": one running, its limit two: the job starts at once.
    handles.push(job(&pool, Some("wide"), &[], "w1", &hold, &tx));
    assert_eq!(recv("w1", &mut started).await, "w1");
    assert_ledger(&pool.metrics());
    gate.open();
    for h in handles {
        within("every job", h).await.unwrap();
    }
}

/// `key_stats` lists the busiest keys first (queued and running jobs),
/// ties broken by running jobs, and keeps the first `n`. Kills the mutants
/// of `State::key_stats` that sort by `queued - running` or
/// `queued * running` on either side of the comparison (the keys' lanes
/// are made in an order none of them sorts right).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_stats_lists_the_busiest_keys_first() {
    let pool = builder(8, 64)
        .max_per_key(1)
        .key_limit("duo", 2)
        .key_limit("pair", 2)
        .key_limit("trio", 3)
        .build()
        .unwrap();
    let (gate, hold) = gate();
    let (tx, mut started) = signal();
    let spawn = |key: &str, n: usize| {
        (0..n)
            .map(|_| job(&pool, Some(key), &[], key, &hold, &tx))
            .collect::<Vec<_>>()
    };
    // Each key runs up to its limit: 2 + 2 + 3 + 1 = 8 permits.
    let mut handles = spawn("duo", 2);
    handles.extend(spawn("pair", 2));
    handles.extend(spawn("trio", 3));
    handles.extend(spawn("flood", 1));
    for _ in 0..8 {
        recv("every key at its limit", &mut started).await;
    }
    handles.extend(spawn("flood", 6));
    handles.extend(spawn("pair", 4));
    handles.extend(spawn("trio", 3));
    let got: Vec<(LaneKey, u64, u64, usize)> = pool
        .key_stats(10)
        .into_iter()
        .map(|s| (s.key, s.running, s.queued, s.limit))
        .collect();
    assert_eq!(
        got,
        [
            (LaneKey::from("flood"), 1, 6, 1),
            (LaneKey::from("trio"), 3, 3, 3),
            (LaneKey::from("pair"), 2, 4, 2),
            (LaneKey::from("duo"), 2, 0, 2),
        ]
    );
    let top: Vec<LaneKey> = pool.key_stats(2).into_iter().map(|s| s.key).collect();
    assert_eq!(top, [LaneKey::from("flood"), LaneKey::from("trio")]);
    gate.open();
    for h in handles {
        within("every job", h).await.unwrap();
    }
    assert!(pool.key_stats(10).is_empty());
}

/// A lane whose only queued job is cancelled is dropped at once: its
/// tombstone is unlinked then (it outnumbers the lane's queued jobs), not
/// left to keep the lane. Kills the mutants of `State::lane_update` that
/// unlink a lane's tombstones only when they are fewer than (`<`) or as
/// many as (`==`) its queued jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_whose_only_job_is_cancelled_is_dropped_at_once() {
    let pool = pool(1, 16);
    let occupied = occupy(&pool, 1).await;
    let queued = pool.offload(|_| ()).key("k").spawn().unwrap();
    assert_eq!(pool.key_stats(5).len(), 1);
    assert!(queued.cancel());
    assert!(pool.key_stats(5).is_empty(), "{:?}", pool.key_stats(5));
    occupied.release().await;
    assert!(within("the cancelled job", queued)
        .await
        .unwrap_err()
        .is_cancelled());
}

/// A lane readied by a limiter's freed permit whose front job was then
/// cancelled passes the wake-up on when its next job, which needs no
/// limiter, starts: the next lane blocked on that limiter starts with the
/// permit (L4). Kills the mutant of `State::lane_pop` that drops the `!`
/// of `!uses(id)` (the lane kept the wake-up it did not use, and the other
/// lane waited for a permit that was free).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_up_its_lane_did_not_use_passes_to_the_next_blocked_lane() {
    let l = Limiter::new(0);
    let p = pool(2, 16);
    let first = p.offload(|_| "first").key("k").limiter(&l).spawn().unwrap();
    let other = p.offload(|_| "other").limiter(&l).spawn().unwrap();
    // Lane "k", then the lane of `l`'s unkeyed jobs, block on `l`.
    a_start_after(&p).await;
    let second = p.offload(|_| "second").key("k").spawn().unwrap();
    // Every permit of the pool is taken: nothing starts from here on until
    // the blockers return.
    let occupied = occupy(&p, 2).await;
    // The permit readies lane "k" (the first blocked on `l`) ...
    l.set_permits(1);
    // ... whose front job then leaves: its next job needs no limiter.
    assert!(first.cancel());
    occupied.release().await;
    assert_eq!(within("second", second).await.unwrap(), "second");
    assert_eq!(
        within("the other lane's job, woken", other).await.unwrap(),
        "other"
    );
    assert_eq!(l.stats().in_use, 0);
}

/// Lanes blocked on a limiter are readied first blocked first, one per
/// freed permit: a lane that took the permit it was readied for does not
/// pass the wake-up on (which would make the next lane try, fail, and
/// block again behind the one after it). Kills the mutant of
/// `State::lane_pop` that tests `l.id() != id` for the limiters the popped
/// job uses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_blocked_on_a_limiter_start_first_blocked_first() {
    let l = Limiter::new(0);
    let p = pool(4, 16);
    let (gate_a, hold_a) = gate();
    let free = opened();
    let (tx, mut started) = signal();
    let a = job(&p, Some("a"), &[&l], "a", &hold_a, &tx);
    let b = job(&p, Some("b"), &[&l], "b", &free, &tx);
    let c = job(&p, Some("c"), &[&l], "c", &free, &tx);
    a_start_after(&p).await;
    l.set_permits(1);
    assert_eq!(recv("a, readied first", &mut started).await, "a");
    // Any lane readied meanwhile has been tried when this job starts.
    a_start_after(&p).await;
    gate_a.open();
    within("a", a).await.unwrap();
    assert_eq!(recv("the next lane", &mut started).await, "b");
    assert_eq!(recv("the last lane", &mut started).await, "c");
    within("b", b).await.unwrap();
    within("c", c).await.unwrap();
}

/// A job joining a lane blocked on a limiter leaves the lane where it is
/// in the limiter's list: it does not lose its turn to a lane that blocked
/// after it. Kills the mutant of `State::lane_update` that takes a lane
/// with queued jobs (`queued != 0`) out of its blocked list on every
/// update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_joining_a_blocked_lane_keeps_the_lane_s_turn() {
    let l = Limiter::new(0);
    let p = pool(4, 16);
    let free = opened();
    let (tx, mut started) = signal();
    let a1 = job(&p, Some("a"), &[&l], "a1", &free, &tx);
    let b1 = job(&p, Some("b"), &[&l], "b1", &free, &tx);
    a_start_after(&p).await;
    let a2 = job(&p, Some("a"), &[&l], "a2", &free, &tx);
    // A lane taken out of the blocked list would be tried here, and block
    // again behind "b".
    a_start_after(&p).await;
    l.set_permits(1);
    let order = [
        recv("the first start", &mut started).await,
        recv("the second start", &mut started).await,
        recv("the third start", &mut started).await,
    ];
    assert_eq!(order[0], "a1", "{order:?}");
    for h in [a1, b1, a2] {
        within("every job", h).await.unwrap();
    }
}

/// Permits given at once ready as many lanes blocked on the limiter: two
/// lanes blocked on a limiter both start when it goes from no permit to
/// two, while the first still runs. Kills the mutant of
/// `State::limiter_freed` that drops the `!` of `!self.pass_wake(..)` (it
/// readied one lane and stopped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_permits_given_at_once_ready_two_blocked_lanes() {
    let l = Limiter::new(0);
    let p = pool(4, 16);
    let (gate, hold) = gate();
    let (tx, mut started) = signal();
    let a = job(&p, Some("a"), &[&l], "a", &hold, &tx);
    let b = job(&p, Some("b"), &[&l], "b", &hold, &tx);
    a_start_after(&p).await;
    assert_eq!(l.stats().permits, 0);
    l.set_permits(2);
    assert_eq!(l.stats().permits, 2, "the new count, at once");
    let mut got = [
        recv("a lane readied", &mut started).await,
        recv("both lanes readied", &mut started).await,
    ];
    got.sort();
    assert_eq!(got, ["a", "b"]);
    assert_eq!(l.stats().in_use, 2);
    gate.open();
    within("a", a).await.unwrap();
    within("b", b).await.unwrap();
}

/// A lane readied by one limiter's permit whose front job then finds
/// another limiter full blocks on that one and passes the permit it did
/// not use to the next lane blocked on the first (L4). Kills the mutant
/// of `State::lane_block` that passes the wake-up on only when the lane
/// blocks again on the limiter that woke it (`w == id`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_that_blocks_on_another_limiter_passes_its_wake_up_on() {
    // `first` before `second`: a job needing both tries `first` first.
    let first = Limiter::new(0);
    let second = Limiter::new(1);
    let p = pool(4, 16);
    let (gate, hold) = gate();
    let free = opened();
    let (tx, mut started) = signal();
    let holder = job(&p, None, &[&second], "holder", &hold, &tx);
    assert_eq!(recv("the holder of second", &mut started).await, "holder");
    let both = job(&p, Some("both"), &[&first, &second], "both", &free, &tx);
    let one = job(&p, Some("one"), &[&first], "one", &free, &tx);
    // Both lanes block on `first`, "both" ahead.
    a_start_after(&p).await;
    // The permit readies "both", which then finds `second` full.
    first.set_permits(1);
    assert_eq!(
        recv("the next lane blocked on first", &mut started).await,
        "one"
    );
    within("one", one).await.unwrap();
    gate.open();
    within("the holder", holder).await.unwrap();
    assert_eq!(recv("both, last", &mut started).await, "both");
    within("both", both).await.unwrap();
}

/// A permit granted to the pool readies one lane blocked on the limiter,
/// not all of them, and that lane starts next (at the front of the ring,
/// ahead of a lane that has not tried the limiter yet); the lanes still
/// blocked keep their order (L4: first blocked first). Kills the mutant of
/// `State::lane_update` that passes a readied lane's grant on while the
/// lane still has queued jobs (`queued != 0`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freed_permit_readies_one_blocked_lane_not_all() {
    let l = Limiter::new(0);
    let p = pool(2, 16);
    let (gate_d, hold_d) = gate();
    let free = opened();
    let (tx, mut started) = signal();
    let a = job(&p, Some("a"), &[&l], "a", &free, &tx);
    let b = job(&p, Some("b"), &[&l], "b", &free, &tx);
    // "a", then "b", block on `l`.
    a_start_after(&p).await;
    // Every permit of the pool is taken: "d" waits in the ring, untried.
    let occupied = occupy(&p, 2).await;
    let d = job(&p, Some("d"), &[&l], "d", &hold_d, &tx);
    // The permit goes to the pool once a permit of it frees: it readies
    // "a", first blocked, ahead of "d" in the ring.
    l.set_permits(1);
    occupied.release().await;
    assert_eq!(recv("a, readied", &mut started).await, "a");
    assert_eq!(recv("b, blocked next", &mut started).await, "b");
    assert_eq!(recv("d, last to try", &mut started).await, "d");
    gate_d.open();
    within("a", a).await.unwrap();
    within("b", b).await.unwrap();
    within("d", d).await.unwrap();
}

/// A lane whose front job finds its limiter full leaves the ring (L4) and
/// the start goes on to the next lane at once: the pool's lock is not held
/// by a start that retries the blocked lane. Run on a helper thread, so
/// that a pool stuck under its lock fails the test instead of hanging it.
/// Kills the mutant of `State::lane_block` that does nothing (the start
/// retried the blocked lane forever, holding the lock; the other tests
/// hang on that lock).
#[test]
fn a_lane_blocked_on_a_full_limiter_does_not_stall_the_pool() {
    let (ran, cancelled) = within_blocking("an unlimited job behind a blocked lane", || {
        let l = Limiter::new(0);
        let p = pool(1, 4);
        let waiting = p.offload(|_| ()).limiter(&l).spawn().unwrap();
        let ran = p.offload(|_| 7).spawn().unwrap().blocking_wait(None);
        (ran.ok(), waiting.cancel())
    });
    assert_eq!(ran, Some(7));
    assert!(cancelled, "the limited job was still waiting");
}
