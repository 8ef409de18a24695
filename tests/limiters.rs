//! Shared limiters (issue 12): `Limiter` with `Offload::limiter`. A
//! limiter's permits are held for the functions' real run, across pools;
//! several limiters are taken together, all or none; a job waiting for a
//! limiter is queued, cancellable and holds back no other lane; FIFO within
//! a limiter: lanes blocked on it are readied first blocked first, one per
//! permit it frees or gains, and a lane that does not use its wake-up
//! passes it on. Ordered by gates and signals (`Limiter::set_permits` tells
//! the pools waiting for it before it returns), never by sleeps.

mod support;

use std::sync::{Arc, Mutex};

use offloader::{AbandonPolicy, JobHandle, JobState, Limiter, Offloader};
use support::*;

/// Spawns a job that needs `limiters`, signals `label` when it starts,
/// counts itself in `probe` while it runs, and waits on `hold`.
fn limited(
    pool: &Offloader,
    limiters: &[&Limiter],
    label: &str,
    probe: &Concurrency,
    hold: &Hold,
    started: &tokio::sync::mpsc::UnboundedSender<String>,
) -> JobHandle<()> {
    let (hold, started, probe, label) = (
        hold.clone(),
        started.clone(),
        probe.clone(),
        label.to_owned(),
    );
    let mut o = pool.offload(move |_| {
        let _in = probe.enter();
        started.send(label).expect("test alive");
        hold.wait();
    });
    for l in limiters {
        o = o.limiter(l);
    }
    o.spawn().expect("accepted")
}

/// Takes a permit of `l` with a running job of a pool of its own, held
/// until the gate opens; returns once it runs (keep the pool).
async fn held_elsewhere(l: &Limiter) -> (Offloader, Gate, JobHandle<()>) {
    let holder_pool = pool(1, 4);
    let (gate, hold) = gate();
    let (tx, mut started) = signal();
    let holder = limited(
        &holder_pool,
        &[l],
        "holder",
        &Concurrency::default(),
        &hold,
        &tx,
    );
    recv("the holder", &mut started).await;
    (holder_pool, gate, holder)
}

/// Asserts that `l` has no permit held, no job waiting and no pool in line.
fn assert_settled(l: &Limiter) {
    let s = l.stats();
    assert_eq!((s.in_use, s.waiting, s.pools_waiting), (0, 0, 0), "{s:?}");
}

/// A pool of two permits whose idle workers retire at once.
fn pool_retiring_at_once() -> Offloader {
    builder(2, 16)
        .keep_alive(std::time::Duration::from_millis(1))
        .build()
        .unwrap()
}

/// With `p` down to its one busy worker and its spawns failing, lets the
/// holder give the limiter's permit back: granted to `p`, the first pool in
/// line, it readies `p`'s blocked lane, which no worker can start.
async fn grant_with_no_worker_to_start_it(p: &Offloader, holder_gate: Gate, holder: JobHandle<()>) {
    eventually("p's idle workers retired", || p.metrics().workers == 1).await;
    p.__fail_next_thread_spawns(usize::MAX);
    holder_gate.open();
    within("the holder", holder).await.unwrap();
    eventually("a spawn failed", || p.metrics().spawn_failures >= 1).await;
}

/// `p`'s job `k1` (key "k") blocked on `l`, whose one permit a job of a
/// pool of its own holds, beside `r1`, which needs no limiter and runs on
/// one of `p`'s two permits until `r1_gate` opens.
struct KBlocked {
    holder_pool: Offloader,
    holder_gate: Gate,
    holder: JobHandle<()>,
    k1: JobHandle<&'static str>,
    r1_gate: Gate,
    r1: JobHandle<()>,
}

async fn k1_blocked_beside_r1(l: &Limiter, p: &Offloader) -> KBlocked {
    let (holder_pool, holder_gate, holder) = held_elsewhere(l).await;
    let k1 = p.offload(|_| "k1").key("k").limiter(l).spawn().unwrap();
    let (tx, mut started) = signal();
    let (r1_gate, r1_hold) = gate();
    let r1 = limited(p, &[], "r1", &Concurrency::default(), &r1_hold, &tx);
    assert_eq!(recv("r1", &mut started).await, "r1");
    KBlocked {
        holder_pool,
        holder_gate,
        holder,
        k1,
        r1_gate,
        r1,
    }
}

/// One limiter of two permits shared by two pools of four: at most two of
/// their functions run at once, the others wait in their queues, and
/// unlimited jobs of both pools still start beside them. A permit freed in
/// one pool starts a job waiting in the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_bounds_the_functions_of_every_pool_that_uses_it() {
    let sdk = Limiter::new(2);
    let (a, b) = (pool(4, 64), pool(4, 64));
    let probe = Concurrency::default();
    let (gate, hold) = gate();
    let (tx, mut started) = signal();
    let mut jobs = Vec::new();
    for i in 0..10 {
        let p = if i % 2 == 0 { &a } else { &b };
        jobs.push(limited(p, &[&sdk], &format!("l{i}"), &probe, &hold, &tx));
    }
    recv("a limited job", &mut started).await;
    recv("another limited job", &mut started).await;
    // Both pools still run unlimited jobs: no head-of-line blocking.
    let free = Concurrency::default();
    let others: Vec<_> = [&a, &b, &a, &b]
        .into_iter()
        .enumerate()
        .map(|(i, p)| limited(p, &[], &format!("u{i}"), &free, &hold, &tx))
        .collect();
    let mut got: Vec<String> = Vec::new();
    for _ in 0..4 {
        got.push(recv("the unlimited jobs", &mut started).await);
    }
    got.sort();
    assert_eq!(got, ["u0", "u1", "u2", "u3"]);
    let s = sdk.stats();
    assert_eq!((s.in_use, s.waiting, s.permits), (2, 8, 2), "{s:?}");
    assert_eq!(probe.now(), 2);
    let (ma, mb) = (a.metrics(), b.metrics());
    assert_eq!(ma.queued + mb.queued, 8, "{ma:?} {mb:?}");
    gate.open();
    for j in jobs.into_iter().chain(others) {
        within("every job", j).await.unwrap();
    }
    assert_eq!(probe.max(), 2, "never more than the limiter's permits");
    let s = sdk.stats();
    assert_eq!((s.in_use, s.waiting, s.high_water), (0, 0, 2), "{s:?}");
    assert_ledger(&a.metrics());
    assert_ledger(&b.metrics());
}

/// A caller's timeout gives nothing back: the timed-out function keeps its
/// limiter permit until it returns, and the next job of the limiter waits
/// until then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_comes_back_when_the_function_returns_not_when_the_caller_leaves() {
    let db = Limiter::new(1);
    let pool = pool(4, 16);
    let (gate, hold) = gate();
    let (tx, mut started) = signal();
    let (htx, hold2) = (tx.clone(), hold.clone());
    let slow = pool
        .offload(move |_| {
            htx.send("slow".to_owned()).unwrap();
            hold2.wait();
        })
        .limiter(&db)
        .with_timeout(SHORT)
        .on_abandon(AbandonPolicy::CancelAndStop);
    let slow = tokio::spawn(std::future::IntoFuture::into_future(slow));
    recv("the slow job", &mut started).await;
    let e = within("the caller's timeout", slow)
        .await
        .unwrap()
        .unwrap_err();
    assert!(e.is_timeout(), "{e}");
    let next = limited(&pool, &[&db], "next", &Concurrency::default(), &hold, &tx);
    assert_eq!(
        db.stats().in_use,
        1,
        "the timed-out function still holds it"
    );
    assert_eq!(next.state(), JobState::Queued);
    let m = pool.metrics();
    assert_eq!((m.running, m.queued), (1, 1), "{m:?}");
    gate.open();
    assert_eq!(recv("the next job", &mut started).await, "next");
    within("the next job", next).await.unwrap();
    assert_eq!(db.stats().in_use, 0);
}

/// Several limiters are taken together: a job that needs `a` and `b` waits
/// for `a` without holding `b`, so a job needing only `b` runs meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limiters_are_taken_all_or_none() {
    let (la, lb) = (Limiter::new(1), Limiter::new(1));
    let pool = pool(4, 16);
    let probe = Concurrency::default();
    let (gate_x, hold_x) = gate();
    let (gate_z, hold_z) = gate();
    let (tx, mut started) = signal();
    let x = limited(&pool, &[&la], "x", &probe, &hold_x, &tx);
    assert_eq!(recv("x", &mut started).await, "x");
    let y = limited(&pool, &[&la, &lb], "y", &probe, &hold_x, &tx);
    let z = limited(&pool, &[&lb], "z", &probe, &hold_z, &tx);
    assert_eq!(recv("z, while y waits for a", &mut started).await, "z");
    assert_eq!(y.state(), JobState::Queued);
    assert_eq!((la.stats().in_use, lb.stats().in_use), (1, 1));
    // x returns: `a` is free, but `b` is still z's.
    gate_x.open();
    within("x", x).await.unwrap();
    assert_eq!(y.state(), JobState::Queued, "y waits for b now");
    assert_eq!((la.stats().in_use, lb.stats().in_use), (0, 1));
    gate_z.open();
    assert_eq!(recv("y", &mut started).await, "y");
    within("z", z).await.unwrap();
    within("y", y).await.unwrap();
    let (sa, sb) = (la.stats(), lb.stats());
    assert_eq!((sa.in_use, sb.in_use, sa.waiting, sb.waiting), (0, 0, 0, 0));
    assert_eq!(sa.high_water, 1);
    assert_eq!(sb.high_water, 1);
}

/// Jobs of one limiter (and no key) start in submission order, and a job
/// waiting for a limiter holds back no other lane's job: unlimited and
/// keyed jobs behind it run first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_within_a_limiter_and_no_head_of_line_blocking() {
    let writer = Limiter::new(1);
    let pool = pool(2, 256);
    let order = Arc::new(Mutex::new(Vec::new()));
    let (gate, hold) = gate();
    let (tx, mut started) = signal();
    let first = limited(
        &pool,
        &[&writer],
        "first",
        &Concurrency::default(),
        &hold,
        &tx,
    );
    recv("the first writer", &mut started).await;
    let mut writes = Vec::new();
    for i in 0..50 {
        let order = order.clone();
        writes.push(
            pool.offload(move |_| order.lock().unwrap().push(i))
                .limiter(&writer)
                .spawn()
                .unwrap(),
        );
    }
    // Behind fifty waiting writers, on the one free permit.
    within("an unlimited job", pool.offload(|_| ()))
        .await
        .unwrap();
    within("a keyed job", pool.offload(|_| ()).key("k"))
        .await
        .unwrap();
    assert_eq!(writer.stats().waiting, 50);
    gate.open();
    within("the first writer", first).await.unwrap();
    for w in writes {
        within("a write", w).await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order, (0..50).collect::<Vec<_>>(), "submission order");
}

/// Spawns a job of `key` needing `limiters`, that signals `label` when it
/// starts, then waits on `hold`.
fn keyed_limited(
    pool: &Offloader,
    key: &str,
    limiters: &[&Limiter],
    label: &str,
    hold: &Hold,
    started: &tokio::sync::mpsc::UnboundedSender<String>,
) -> JobHandle<()> {
    let (hold, started, label) = (hold.clone(), started.clone(), label.to_owned());
    let mut o = pool
        .offload(move |_| {
            started.send(label).expect("test alive");
            hold.wait();
        })
        .key(key);
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

/// A lane readied by a limiter's freed permit whose front job was then
/// cancelled passes the wake-up on when its next job, which needs no
/// limiter, starts: the next lane blocked on that limiter starts with the
/// permit (L4) instead of waiting for a permit that is free.
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
/// block again behind the one after it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_blocked_on_a_limiter_start_first_blocked_first() {
    let l = Limiter::new(0);
    let p = pool(4, 16);
    let (gate_a, hold_a) = gate();
    let free = opened();
    let (tx, mut started) = signal();
    let a = keyed_limited(&p, "a", &[&l], "a", &hold_a, &tx);
    let b = keyed_limited(&p, "b", &[&l], "b", &free, &tx);
    let c = keyed_limited(&p, "c", &[&l], "c", &free, &tx);
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
/// after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_joining_a_blocked_lane_keeps_the_lane_s_turn() {
    let l = Limiter::new(0);
    let p = pool(4, 16);
    let free = opened();
    let (tx, mut started) = signal();
    let a1 = keyed_limited(&p, "a", &[&l], "a1", &free, &tx);
    let b1 = keyed_limited(&p, "b", &[&l], "b1", &free, &tx);
    a_start_after(&p).await;
    let a2 = keyed_limited(&p, "a", &[&l], "a2", &free, &tx);
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
/// two, while the first still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_permits_given_at_once_ready_two_blocked_lanes() {
    let l = Limiter::new(0);
    let p = pool(4, 16);
    let (gate, hold) = gate();
    let (tx, mut started) = signal();
    let a = keyed_limited(&p, "a", &[&l], "a", &hold, &tx);
    let b = keyed_limited(&p, "b", &[&l], "b", &hold, &tx);
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
/// not use to the next lane blocked on the first (L4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_that_blocks_on_another_limiter_passes_its_wake_up_on() {
    // `first` before `second`: a job needing both tries `first` first.
    let first = Limiter::new(0);
    let second = Limiter::new(1);
    let p = pool(4, 16);
    let (gate, hold) = gate();
    let free = opened();
    let (tx, mut started) = signal();
    let holder = limited(
        &p,
        &[&second],
        "holder",
        &Concurrency::default(),
        &hold,
        &tx,
    );
    assert_eq!(recv("the holder of second", &mut started).await, "holder");
    let both = keyed_limited(&p, "both", &[&first, &second], "both", &free, &tx);
    let one = keyed_limited(&p, "one", &[&first], "one", &free, &tx);
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
/// blocked keep their order (L4: first blocked first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freed_permit_readies_one_blocked_lane_not_all() {
    let l = Limiter::new(0);
    let p = pool(2, 16);
    let (gate_d, hold_d) = gate();
    let free = opened();
    let (tx, mut started) = signal();
    let a = keyed_limited(&p, "a", &[&l], "a", &free, &tx);
    let b = keyed_limited(&p, "b", &[&l], "b", &free, &tx);
    // "a", then "b", block on `l`.
    a_start_after(&p).await;
    // Every permit of the pool is taken: "d" waits in the ring, untried.
    let occupied = occupy(&p, 2).await;
    let d = keyed_limited(&p, "d", &[&l], "d", &hold_d, &tx);
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

/// A job waiting for a limiter is queued: cancel, a timeout under
/// `CancelIfQueued` and `shutdown_now` each leave it unstarted, and the
/// limiter stops counting it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_a_limiter_is_queued_for_cancel_timeout_and_shutdown() {
    let l = Limiter::new(1);
    let pool = pool(4, 16);
    let (gate, hold) = gate();
    let (tx, mut started) = signal();
    let probe = Concurrency::default();
    let running = limited(&pool, &[&l], "running", &probe, &hold, &tx);
    recv("the running job", &mut started).await;
    let cancelled = limited(&pool, &[&l], "cancelled", &probe, &hold, &tx);
    let timed = pool
        .offload(|_| ())
        .limiter(&l)
        .with_timeout(SHORT)
        .on_abandon(AbandonPolicy::CancelIfQueued);
    let left = limited(&pool, &[&l], "left", &probe, &hold, &tx);
    assert_eq!(l.stats().waiting, 2);
    assert!(cancelled.cancel());
    assert!(within("cancelled", cancelled)
        .await
        .unwrap_err()
        .is_cancelled());
    let e = within("timed out", timed).await.unwrap_err();
    assert!(e.is_timeout(), "{e}");
    assert_eq!(l.stats().waiting, 1);
    assert_eq!(pool.shutdown_now().len(), 1);
    assert!(within("left", left).await.unwrap_err().is_shutdown());
    assert_eq!(l.stats().waiting, 0);
    gate.open();
    within("running", running).await.unwrap();
    assert_eq!(l.stats().in_use, 0);
    let m = pool.metrics();
    assert_ledger(&m);
    assert_eq!((m.completed, m.cancelled, m.unstarted), (1, 2, 1), "{m:?}");
}

/// `set_permits`: a zero-permit limiter holds its jobs until permits are
/// given; a decrease takes nothing from running functions and takes effect
/// as they return.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_permits_takes_effect_as_permits_come_back() {
    let l = Limiter::new(0);
    let pool = pool(4, 16);
    let probe = Concurrency::default();
    let (gate_a, hold_a) = gate();
    let (gate_b, hold_b) = gate();
    let (tx, mut started) = signal();
    let a = limited(&pool, &[&l], "a", &probe, &hold_a, &tx);
    let b = limited(&pool, &[&l], "b", &probe, &hold_b, &tx);
    let c = limited(&pool, &[&l], "c", &probe, &hold_b, &tx);
    within("an unlimited job", pool.offload(|_| ()))
        .await
        .unwrap();
    assert_eq!(probe.now(), 0, "no permit, no start");
    l.set_permits(2);
    let mut got = vec![
        recv("a or b", &mut started).await,
        recv("a or b", &mut started).await,
    ];
    got.sort();
    assert_eq!(got, ["a", "b"]);
    l.set_permits(1);
    let s = l.stats();
    assert_eq!(
        (s.permits, s.in_use),
        (1, 2),
        "running functions keep theirs"
    );
    gate_a.open();
    within("a", a).await.unwrap();
    // One permit, still held by b: c waits.
    within("an unlimited job", pool.offload(|_| ()))
        .await
        .unwrap();
    assert_eq!(c.state(), JobState::Queued);
    gate_b.open();
    assert_eq!(recv("c", &mut started).await, "c");
    within("b", b).await.unwrap();
    within("c", c).await.unwrap();
    assert_eq!(probe.max(), 2);
}

/// A panicking function gives its limiter permit back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_gives_the_permit_back() {
    quiet_deliberate_panics();
    let l = Limiter::new(1);
    let pool = pool(2, 16);
    let e = within(
        "a panicking job",
        pool.offload(|_| -> () { panic!("{ON_PURPOSE}") })
            .limiter(&l),
    )
    .await
    .unwrap_err();
    assert!(e.is_panic(), "{e}");
    assert_eq!(l.stats().in_use, 0);
    within("the next job", pool.offload(|_| 5).limiter(&l))
        .await
        .unwrap();
}

/// A detached job waiting for a limiter held by another pool still runs
/// after its own pool's last handle is dropped: the graceful shutdown that
/// drop starts keeps a worker (and so the pool) for it (found by a hostile
/// review: the job was dropped unrun with the pool).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_waiting_for_a_limiter_outlives_its_dropped_pool() {
    let l = Limiter::new(1);
    let (_holder_pool, gate, holder) = held_elsewhere(&l).await;
    let p = pool(2, 4);
    let (ran_tx, mut ran) = signal::<()>();
    p.offload(move |_| ran_tx.send(()).unwrap())
        .limiter(&l)
        .spawn()
        .unwrap()
        .detach();
    // A start after it finds the limiter full and blocks its lane.
    within("an unlimited job", p.offload(|_| ())).await.unwrap();
    drop(p);
    gate.open();
    within("the holder", holder).await.unwrap();
    recv("the detached job ran", &mut ran).await;
    // Its permit comes back once its function has returned.
    eventually("the permit comes back", || l.stats().in_use == 0).await;
    assert_eq!(l.stats().waiting, 0);
}

/// Offers `n` jobs made by `job`; returns those accepted (every refusal
/// must be for a full queue).
fn offer<T, F>(
    n: usize,
    mut job: impl FnMut() -> Result<JobHandle<T>, offloader::SubmitError<F>>,
) -> Vec<JobHandle<T>> {
    let mut accepted = Vec::new();
    for _ in 0..n {
        match job() {
            Ok(h) => accepted.push(h),
            Err(refused) => assert!(refused.reason().to_string().contains("full"), "{refused}"),
        }
    }
    accepted
}

/// Invariant 8 with limiters, as the pool keeps it (ARCHITECTURE.md
/// "Shared limiters"): a lane of jobs needing a limiter counts as about to
/// start until a worker finds the limiter full, so at most `max_in_flight`
/// jobs more than the bound get in meanwhile, never an unbounded number:
/// plain jobs of a key behind a job of that key waiting for a limiter of
/// no permits fill the bound like any waiting job (a version that counted
/// such lanes as waiting let 201 of 201 in at a bound of 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_jobs_behind_a_limited_job_of_their_key_fill_the_bound() {
    let (max_in_flight, capacity) = (4, 2);
    let p = pool(max_in_flight, capacity);
    warm(&p);
    let l = Limiter::new(0);
    let front = p.offload(|_| ()).key("k").limiter(&l).spawn().unwrap();
    let behind = offer(200, || p.offload(|_| ()).key("k").spawn());
    assert!(
        behind.len() < capacity + max_in_flight,
        "{} got in",
        behind.len()
    );
    l.set_permits(1);
    within("the front job", front).await.unwrap();
    for job in behind {
        within("a job behind it", job).await.unwrap();
    }
    assert_settled(&l);
}

/// Jobs needing a limiter of free permits, offered in a burst while pool
/// permits are free, start at once and are not refused for a full queue
/// (invariant 8: they are not waiting); a version that counted them as
/// waiting took 4 to 12 of 50.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_limited_jobs_with_free_permits_is_not_refused() {
    let p = pool(64, 4);
    warm(&p);
    let l = Limiter::new(1000);
    let (gate, hold) = gate();
    let jobs = offer(50, || {
        let hold = hold.clone();
        p.offload(move |_| hold.wait()).limiter(&l).spawn()
    });
    assert_eq!(jobs.len(), 50);
    gate.open();
    for job in jobs {
        within("a limited job", job).await.unwrap();
    }
    assert_settled(&l);
}

/// A job of a key needing a limiter of no permits, behind plain jobs of
/// that key that take every pool permit, does not make room for more
/// plain jobs than the bound: once they run, at most the bound is queued
/// (a version that counted that key's lane as waiting left 9 queued at a
/// bound of 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_job_does_not_hide_the_plain_jobs_ahead_of_it() {
    let (max_in_flight, capacity) = (8, 1);
    let p = pool(max_in_flight, capacity);
    warm(&p);
    let l = Limiter::new(0);
    let (gate, hold) = gate();
    let mut jobs = offer(max_in_flight, || {
        let hold = hold.clone();
        p.offload(move |_| hold.wait()).key("a").spawn()
    });
    let limited = p.offload(|_| ()).key("a").limiter(&l).spawn();
    jobs.extend(offer(max_in_flight, || {
        let hold = hold.clone();
        p.offload(move |_| hold.wait()).spawn()
    }));
    eventually("every permit taken", || {
        p.metrics().running == max_in_flight as u64
    })
    .await;
    let m = p.metrics();
    assert!(m.queued <= capacity as u64, "{m:?}");
    gate.open();
    l.set_permits(1);
    for job in jobs {
        within("a held job", job).await.unwrap();
    }
    if let Ok(job) = limited {
        within("the limited job", job).await.unwrap();
    }
    assert_settled(&l);
}

/// A caller waiting for room whose plain job a freed permit would start at
/// once is let in when a job finishes, though a caller ahead of it waits
/// with a job needing a full limiter (refused again: the bound is full of
/// such jobs). Found by a hostile review: the one room signal went to the
/// first caller, refused, and the second waited for the next job to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_caller_behind_a_refused_limited_caller_gets_the_free_permit() {
    let p = pool(2, 1);
    warm(&p);
    let l = Limiter::new(0);
    // Each permit held on a gate of its own.
    let first_held = occupy(&p, 1).await;
    let second_held = occupy(&p, 1).await;
    let queued = p.offload(|_| ()).limiter(&l).spawn().unwrap();
    let mut limited = Box::pin(p.offload(|_| 1).limiter(&l).submit());
    assert!(
        poll_once(limited.as_mut()).await.is_pending(),
        "the bound is full"
    );
    let mut plain = Box::pin(p.offload(|_| 2).submit());
    assert!(poll_once(plain.as_mut()).await.is_pending(), "behind it");
    first_held.release().await;
    let plain = within("the plain caller's admission", plain).await.unwrap();
    assert_eq!(within("the plain job", plain).await.unwrap(), 2);
    assert!(
        poll_once(limited.as_mut()).await.is_pending(),
        "still full for it"
    );
    l.set_permits(1);
    second_held.release().await;
    within("the queued limited job", queued).await.unwrap();
    let limited = within("the limited caller's admission", limited)
        .await
        .unwrap();
    assert_eq!(within("the limited job", limited).await.unwrap(), 1);
    assert_settled(&l);
}

/// A caller's admission that fills the bound with a job joining a blocked
/// lane, while the pool permit is free, lets in a plain caller waiting
/// behind callers of limited jobs (found by a hostile review: the
/// admission signalled nobody, and the plain caller waited for the next
/// job to end while a fresh `spawn` was accepted at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_filling_the_bound_lets_a_plain_caller_take_the_free_permit() {
    let p = pool(1, 2);
    warm(&p);
    let l = Limiter::new(0);
    let first = p.offload(|_| ()).limiter(&l).spawn().unwrap();
    eventually("its lane blocked", || l.stats().pools_waiting == 1).await;
    let held = occupy(&p, 1).await;
    let queued = p.offload(|_| 3).spawn().unwrap();
    let mut w1 = Box::pin(p.offload(|_| 1).limiter(&l).submit());
    let mut w2 = Box::pin(p.offload(|_| 2).limiter(&l).submit());
    let mut w3 = Box::pin(p.offload(|_| 4).submit());
    assert!(
        poll_once(w1.as_mut()).await.is_pending(),
        "the bound is full"
    );
    assert!(
        poll_once(w2.as_mut()).await.is_pending(),
        "the bound is full"
    );
    assert!(
        poll_once(w3.as_mut()).await.is_pending(),
        "the bound is full"
    );
    held.release().await;
    assert_eq!(within("the queued job", queued).await.unwrap(), 3);
    // The first caller's job joins the blocked lane and fills the bound.
    let w1 = within("the first caller", w1).await.unwrap();
    assert!(poll_once(w2.as_mut()).await.is_pending(), "full for it");
    let w3 = within("the plain caller", w3).await.unwrap();
    assert_eq!(within("the plain job", w3).await.unwrap(), 4);
    l.set_permits(1);
    within("the first limited job", first).await.unwrap();
    assert_eq!(within("the first caller's job", w1).await.unwrap(), 1);
    let w2 = within("the second caller", w2).await.unwrap();
    assert_eq!(within("the second caller's job", w2).await.unwrap(), 2);
    assert_settled(&l);
}

/// Counts the wake-ups of the wakers made from it.
struct Wakes(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// With a pool of one permit and a bound of one full of a job blocked on a
/// limiter of no permits, and callers waiting for room (those `callers`
/// makes, polled once each with a counting waker): two plain jobs run,
/// passing beyond the full bound one after the other. Returns how many
/// wake-ups the callers got. A plain job makes two room events (its lane
/// grows a startable job as it joins; its finish frees its permit).
async fn wake_ups_of_callers_while_plain_jobs_pass<'a, F>(
    p: &'a Offloader,
    l: &'a Limiter,
    callers: impl FnOnce() -> Vec<std::pin::Pin<Box<F>>>,
) -> usize
where
    F: std::future::Future + ?Sized + 'a,
{
    let first = p.offload(|_| ()).limiter(l).spawn().unwrap();
    eventually("its lane blocked", || l.stats().pools_waiting == 1).await;
    let wakes = Arc::new(Wakes(std::sync::atomic::AtomicUsize::new(0)));
    let waker = std::task::Waker::from(wakes.clone());
    let mut cx = std::task::Context::from_waker(&waker);
    let mut waiting = callers();
    for w in &mut waiting {
        assert!(w.as_mut().poll(&mut cx).is_pending(), "the bound is full");
    }
    // One after the other on the pool's one worker: the second ends after
    // the first's wake-ups were sent.
    for _ in 0..2 {
        within("a plain job", p.offload(|_| ())).await.unwrap();
    }
    let woken = wakes.0.load(std::sync::atomic::Ordering::SeqCst);
    drop(waiting);
    l.set_permits(1);
    within("the limited job", first).await.unwrap();
    assert_settled(l);
    woken
}

/// Callers waiting for room whose jobs all need a limiter are not all
/// woken for a free permit none of them can take: one caller per room
/// event, as before the signal to every waiter existed (found by a hostile
/// review: with 1,000 such callers each finished job woke all of them, and
/// plain throughput fell by 60 %). Nor when a caller of a keyed job, whose
/// key is at its limit, waits with them (a second review: one such caller
/// made every finished job wake 1,000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_of_jobs_that_cannot_start_are_not_all_woken_for_a_free_permit() {
    use std::future::Future;
    type Caller<'a> = std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'a>>;
    let p = pool(1, 1);
    warm(&p);
    let l = Limiter::new(0);
    let limited = |p: &Offloader, l: &Limiter| -> Vec<Caller<'static>> {
        (0..10)
            .map(|_| {
                let f = p.offload(|_| ()).limiter(l).submit();
                Box::pin(async move {
                    let _ = f.await;
                }) as Caller<'static>
            })
            .collect()
    };
    let woken = wake_ups_of_callers_while_plain_jobs_pass(&p, &l, || limited(&p, &l)).await;
    assert!(
        woken <= 4,
        "{woken} wake-ups of 10 limited callers for two jobs"
    );

    let (p, l) = (
        builder(2, 1).max_per_key(1).build().unwrap(),
        Limiter::new(0),
    );
    warm(&p);
    let (gate, hold) = gate();
    let (tx, mut started) = signal();
    let at_limit = p
        .offload(move |_| {
            tx.send(()).unwrap();
            hold.wait();
        })
        .key("k")
        .spawn()
        .unwrap();
    recv("the key's job", &mut started).await;
    let woken = wake_ups_of_callers_while_plain_jobs_pass(&p, &l, || {
        let mut callers = limited(&p, &l);
        let keyed = p.offload(|_| ()).key("k").submit();
        callers.insert(
            0,
            Box::pin(async move {
                let _ = keyed.await;
            }),
        );
        callers
    })
    .await;
    assert!(woken <= 4, "{woken} wake-ups of 11 callers for two jobs");
    gate.open();
    within("the key's job", at_limit).await.unwrap();
}

/// A caller waiting for room is let in when a job held back by a limiter
/// starts (it counted as waiting: L5), not only when a job finishes (found
/// by a hostile review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn room_frees_when_a_job_waiting_for_a_limiter_starts() {
    let l = Limiter::new(0);
    let p = pool(2, 1);
    let (gate, hold) = gate();
    let (tx, mut started) = signal();
    let probe = Concurrency::default();
    let first = limited(&p, &[&l], "first", &probe, &hold, &tx);
    // A start after it tries its lane first, finds the limiter full and
    // blocks the lane: it now counts as waiting.
    within("an unlimited job", p.offload(|_| ())).await.unwrap();
    let full = p.offload(|_| ()).limiter(&l).spawn().unwrap_err();
    assert!(full.reason().to_string().contains("full"), "{full}");
    let mut waiter = Box::pin(p.offload(|_| 3).limiter(&l).submit());
    assert!(
        poll_once(waiter.as_mut()).await.is_pending(),
        "the queue is full: the caller waits for room"
    );
    l.set_permits(1);
    assert_eq!(recv("first", &mut started).await, "first");
    let admitted = within("the waiter gets in", waiter).await.unwrap();
    gate.open();
    within("the admitted job", admitted).await.unwrap();
    gate.open();
    within("first", first).await.unwrap();
}

/// When one pool stops watching a limiter (its last waiting job was
/// cancelled), the other pools waiting for it still hear of the next
/// permit (kills the mutant of `Limiter::unwatch` that dropped every other
/// watcher instead of this one, found by mutation testing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_that_stops_watching_leaves_the_others_watching() {
    let l = Limiter::new(1);
    let (_holder_pool, gate, holder) = held_elsewhere(&l).await;
    let (p, q) = (pool(2, 4), pool(2, 4));
    let on_p = p.offload(|_| "p").limiter(&l).spawn().unwrap();
    let on_q = q.offload(|_| "q").limiter(&l).spawn().unwrap();
    // A start in each pool finds the limiter full: both pools watch it.
    within("a job on p", p.offload(|_| ())).await.unwrap();
    within("a job on q", q.offload(|_| ())).await.unwrap();
    assert!(on_p.cancel(), "p's job was still waiting");
    gate.open();
    within("the holder", holder).await.unwrap();
    assert_eq!(within("q's job, woken", on_q).await.unwrap(), "q");
}

/// A function holding a limiter's last permit that blocking-waits for a
/// queued job of its pool needing the same limiter fails at once with
/// `WouldDeadlock` instead of hanging (the pool has permits to spare); with
/// a permit to spare the wait is served, and the refused job runs once the
/// waiting function returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_a_queued_job_needing_a_limiter_it_holds_cannot_deadlock() {
    for (permits, refused) in [(1, true), (2, false)] {
        let l = Limiter::new(permits);
        let pool = pool(4, 8);
        let (p, inner_l) = (pool.clone(), l.clone());
        let outer = pool
            .offload(move |_| {
                let mut inner = p.offload(|_| 5).limiter(&inner_l).spawn().unwrap();
                inner.blocking_wait(None).map_err(|e| e.to_string())
            })
            .limiter(&l);
        let waited = within("outer", outer).await.unwrap();
        if refused {
            let text = waited.expect_err("the waiter holds the only permit");
            assert!(text.contains("would never return"), "{text}");
        } else {
            assert_eq!(waited, Ok(5));
        }
        within("the inner job runs", pool.idle()).await;
        assert_eq!(pool.metrics().completed, 2);
        let s = l.stats();
        assert_eq!((s.in_use, s.waiting), (0, 0), "{s:?}");
    }
}

/// A limiter's free permit goes to whichever job can start, never to a pool
/// that cannot use it: pool `p`'s job waiting for the limiter is first in
/// line, but `p`'s only permit is held by a function that waits for a job
/// of pool `q` needing the same limiter. That job takes the permit, and
/// everything finishes. (A fairness scheme that reserved the permit for
/// `p`, tried and reverted in this issue, deadlocked here: found by a
/// hostile review.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_permit_goes_to_a_job_that_can_start_not_to_a_full_pool() {
    let l = Limiter::new(1);
    let (p, q) = (pool(1, 4), pool(2, 4));
    let (_holder_pool, holder_gate, holder) = held_elsewhere(&l).await;
    let first_in_line = p.offload(|_| "a").limiter(&l).spawn().unwrap();
    let (q2, l2) = (q.clone(), l.clone());
    let (tx, mut started) = signal();
    let nested = p
        .offload(move |_| {
            tx.send(()).unwrap();
            q2.offload(|_| "y")
                .limiter(&l2)
                .spawn()
                .unwrap()
                .blocking_wait(None)
        })
        .spawn()
        .unwrap();
    // The nested job runs on p's only permit: p's worker tried the limited
    // lane first (it is first in the ring) and found the limiter full.
    recv("the nested job", &mut started).await;
    holder_gate.open();
    within("the holder", holder).await.unwrap();
    assert_eq!(
        within("the nested job", nested).await.unwrap().unwrap(),
        "y"
    );
    assert_eq!(within("p's limited job", first_in_line).await.unwrap(), "a");
    let s = l.stats();
    assert_eq!((s.in_use, s.waiting, s.high_water), (0, 0, 1), "{s:?}");
}

/// The same without nesting: while pool `p` (first in line for the limiter)
/// has its only permit busy with an unrelated job, a job of pool `q` that
/// needs the limiter takes its free permit at once instead of idling until
/// `p` has room; and `set_permits(0)` keeps every job that has not started
/// from starting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_permit_is_not_held_for_a_busy_pool() {
    let l = Limiter::new(1);
    let (p, q) = (pool(1, 4), pool(2, 4));
    let (_holder_pool, holder_gate, holder) = held_elsewhere(&l).await;
    let on_p = p.offload(|_| "p").limiter(&l).spawn().unwrap();
    let (busy_gate, busy_hold) = gate();
    let (tx, mut started) = signal();
    let busy = limited(&p, &[], "busy", &Concurrency::default(), &busy_hold, &tx);
    recv("p's busy job", &mut started).await;
    holder_gate.open();
    within("the holder", holder).await.unwrap();
    let on_q = q.offload(|_| "q").limiter(&l).spawn().unwrap();
    assert_eq!(
        within("q's job, with p still busy", on_q).await.unwrap(),
        "q"
    );
    assert_eq!(on_p.state(), JobState::Queued);
    l.set_permits(0);
    busy_gate.open();
    within("p's busy job", busy).await.unwrap();
    within("a later job on p", p.offload(|_| ())).await.unwrap();
    assert_eq!(
        on_p.state(),
        JobState::Queued,
        "no permit: it must not start"
    );
    l.set_permits(1);
    assert_eq!(within("p's limited job", on_p).await.unwrap(), "p");
}

/// Pools sharing a limiter are served in turn (limiter/mod.rs M3): a pool whose
/// finishing job gives a permit back cannot take it again for its next job
/// while another pool waits for it. Before grants, pool `a` re-took the
/// permit in the same critical section that gave it back, and `b`'s job
/// waited behind all 20 of `a`'s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_given_back_goes_to_the_pool_that_waited_not_back_to_its_own() {
    let l = Limiter::new(1);
    let (a, b) = (pool(1, 64), pool(1, 4));
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let (gate, hold) = gate();
    let (tx, mut started) = signal();
    let first = limited(&a, &[&l], "a0", &Concurrency::default(), &hold, &tx);
    recv("a0", &mut started).await;
    let rest: Vec<_> = (1..=20)
        .map(|i| {
            let log = log.clone();
            a.offload(move |_| log.lock().unwrap().push(format!("a{i}")))
                .limiter(&l)
                .spawn()
                .unwrap()
        })
        .collect();
    let on_b = {
        let log = log.clone();
        b.offload(move |_| log.lock().unwrap().push("b".into()))
            .limiter(&l)
            .spawn()
            .unwrap()
    };
    // b's limited lane comes first in its ring: once a later unlimited job
    // of b ran, b's start found the limiter full and b waits for it.
    within("a job on b", b.offload(|_| ())).await.unwrap();
    assert_eq!(l.stats().pools_waiting, 1, "{:?}", l.stats());
    gate.open();
    within("a0", first).await.unwrap();
    for job in rest {
        within("a's jobs", job).await.unwrap();
    }
    within("b's job", on_b).await.unwrap();
    let log = log.lock().unwrap();
    let at = log.iter().position(|s| s == "b");
    assert_eq!(at, Some(0), "b's job waited behind a's: {log:?}");
    assert_settled(&l);
}

/// A permit that a finishing job gives back to its own pool, which waits
/// for it, starts that pool's waiting job next: the finishing worker's next
/// start in the same critical section takes it, not a plain job of the ring
/// (which would take the freed pool permit and leave the pool to decline
/// its own grant, its limited job waiting behind every plain one). Found by
/// a hostile review of grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_given_back_to_its_own_waiting_pool_goes_to_its_waiting_job() {
    let l = Limiter::new(1);
    let p = pool(2, 64);
    let (tx, mut started) = signal();
    let probe = Concurrency::default();
    let (first_gate, first_hold) = gate();
    let first = limited(&p, &[&l], "a1", &probe, &first_hold, &tx);
    assert_eq!(recv("a1", &mut started).await, "a1");
    let (open, open_hold) = gate();
    open.open();
    let second = limited(&p, &[&l], "a2", &probe, &open_hold, &tx);
    let (plain_gate, plain_hold) = gate();
    let plain: Vec<_> = (0..6)
        .map(|i| limited(&p, &[], &format!("c{i}"), &probe, &plain_hold, &tx))
        .collect();
    // a2's lane came first in the ring: it found the limiter full, then c0
    // took the pool's other permit.
    assert_eq!(recv("c0", &mut started).await, "c0");
    assert_eq!(l.stats().pools_waiting, 1);
    // a1's handle is kept, not awaited: its worker starts the next job in
    // the critical section that finishes a1.
    first_gate.open();
    assert_eq!(recv("the next start", &mut started).await, "a2");
    within("a2", second).await.unwrap();
    plain_gate.open();
    within("a1", first).await.unwrap();
    for job in plain {
        within("the plain jobs", job).await.unwrap();
    }
    assert_settled(&l);
}

/// A lane readied by a grant whose front job went away (cancelled) starts
/// its next job, which needs no limiter: the grant passes on only after
/// that start holds its pool permit. Passed on before (a hostile review's
/// finding), the pool counted that permit as free, readied another lane
/// blocked on the limiter with no permit left to start it, and held the
/// limiter's permit for it while a job of another pool that could start
/// waited. Deterministic: no worker can start the readied lane (spawns
/// fail) until its front job is cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_passed_on_by_a_starting_lane_is_not_held_without_a_permit() {
    let l = Limiter::new(1);
    let (q, p) = (pool(2, 8), pool_retiring_at_once());
    let (_holder_pool, holder_gate, holder) = held_elsewhere(&l).await;
    // Lanes "k" and "j" of p blocked on the limiter, "k" first; "k" has a
    // job needing no limiter behind its first.
    let k1 = p.offload(|_| "k1").key("k").limiter(&l).spawn().unwrap();
    let j1 = p.offload(|_| "j1").key("j").limiter(&l).spawn().unwrap();
    let (tx, mut started) = signal();
    let (k2_gate, k2_hold) = gate();
    let k2 = {
        let (hold, tx) = (k2_hold.clone(), tx.clone());
        p.offload(move |_| {
            tx.send("k2".to_owned()).unwrap();
            hold.wait();
        })
        .key("k")
        .spawn()
        .unwrap()
    };
    // r1 takes one of p's two permits and keeps it.
    let (r1_gate, r1_hold) = gate();
    let r1 = limited(&p, &[], "r1", &Concurrency::default(), &r1_hold, &tx);
    assert_eq!(recv("r1", &mut started).await, "r1");
    assert_eq!(l.stats().pools_waiting, 1);
    // Granted to p (one pool permit free): lane "k" readied.
    grant_with_no_worker_to_start_it(&p, holder_gate, holder).await;
    assert!(k1.cancel(), "k1 never started");
    p.__fail_next_thread_spawns(0);
    let nudge = p.offload(|_| ()).spawn().unwrap();
    assert_eq!(recv("k2", &mut started).await, "k2");
    // k2 holds p's last permit: the grant went back, and a job of q that
    // needs the limiter takes its permit.
    let on_q = q.offload(|_| "q").limiter(&l).spawn().unwrap();
    assert_eq!(within("q's limited job", on_q).await.unwrap(), "q");
    k2_gate.open();
    r1_gate.open();
    for h in [k2, r1] {
        within("p's jobs", h).await.unwrap();
    }
    within("nudge", nudge).await.unwrap();
    assert_eq!(within("j1", j1).await.unwrap(), "j1");
    assert_settled(&l);
}

/// Two functions, each holding one of a limiter's two permits, wait for
/// queued jobs of their pool needing it: the first wait is served, the
/// second — which would hold the last permit — is refused with
/// `WouldDeadlock`; twice in a row, so a wait that ended gave its count
/// back. (Kills the mutants of `Limiter::own_wait_begins` that never count
/// a wait and of `own_wait_ended` that never gives the count back.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_waits_that_would_hold_every_permit_of_a_limiter_one_is_refused() {
    let l = Limiter::new(2);
    let p = pool(4, 16);
    for round in 0..2 {
        let (g, hold) = gate();
        let (tx, mut started) = signal();
        let outer = |n: i32| {
            let (p2, l2, hold, tx) = (p.clone(), l.clone(), hold.clone(), tx.clone());
            p.offload(move |_| {
                tx.send(()).unwrap();
                hold.wait();
                let mut inner = p2.offload(move |_| n).limiter(&l2).spawn().unwrap();
                inner.blocking_wait(None).map_err(|e| e.to_string())
            })
            .limiter(&l)
            .spawn()
            .unwrap()
        };
        let (first, second) = (outer(1), outer(2));
        recv("the first outer job", &mut started).await;
        recv("the second outer job", &mut started).await;
        g.open();
        let first = within("first", first).await.unwrap();
        let second = within("second", second).await.unwrap();
        let refused = match (&first, &second) {
            (Err(text), Ok(2)) | (Ok(1), Err(text)) => text,
            _ => panic!("round {round}: exactly one wait is refused: {first:?} {second:?}"),
        };
        assert!(refused.contains("would never return"), "{refused}");
        within("idle", p.idle()).await;
        let s = l.stats();
        assert_eq!((s.in_use, s.waiting), (0, 0), "{s:?}");
    }
}

/// A grant whose pool has no lane left to use it goes back, to the next
/// waiting pool: `p` is granted the permit and readies its blocked lane,
/// but no worker can start it (spawns fail) before its only job is
/// cancelled; the grant then goes to `q`, whose job starts. (Kills the
/// mutants of `Limiter::leave` that keep a leaving pool's grants.) The pool
/// permit `p` promised to its readied lane is free again: a grant that
/// comes later readies a lane of `p` beside `r1`, still running. (Kills
/// the mutants of `State::lane_update` that count a readied lane left
/// without jobs up (`readied += 1`) or not at all (`/=`): `p` would
/// decline the grant for want of a permit.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_no_lane_can_use_goes_back_to_the_next_waiting_pool() {
    let l = Limiter::new(1);
    let (q, p) = (pool(2, 8), pool_retiring_at_once());
    let b = k1_blocked_beside_r1(&l, &p).await;
    let on_q = q.offload(|_| "q").limiter(&l).spawn().unwrap();
    within("a job on q", q.offload(|_| ())).await.unwrap();
    assert_eq!(l.stats().pools_waiting, 2);
    grant_with_no_worker_to_start_it(&p, b.holder_gate, b.holder).await;
    assert!(b.k1.cancel(), "k1 never started");
    assert_eq!(within("q's job, granted next", on_q).await.unwrap(), "q");
    p.__fail_next_thread_spawns(0);
    assert_settled(&l);
    let (_holder_pool, holder_gate, holder) = held_elsewhere(&l).await;
    let k2 = p.offload(|_| "k2").key("k").limiter(&l).spawn().unwrap();
    // A worker of `p` has tried k2's lane (ahead of the default lane in the
    // ring) when this job has run: k2 is blocked on `l`.
    within("a job on p", p.offload(|_| ())).await.unwrap();
    assert_eq!(l.stats().pools_waiting, 1);
    holder_gate.open();
    within("the second holder", holder).await.unwrap();
    assert_eq!(within("k2, granted beside r1", k2).await.unwrap(), "k2");
    b.r1_gate.open();
    within("r1", b.r1).await.unwrap();
    assert_settled(&l);
}

/// A `submit()` that waits for room keeps its name, key and limiters for
/// the try that is accepted (the first try hands them to the job it builds,
/// and a refusal gives them back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_waiting_for_room_keeps_its_name_key_and_limiters() {
    let pool = pool(1, 1);
    let l = Limiter::new(1);
    let occupied = occupy(&pool, 1).await;
    let queued = pool.offload(|_| ()).spawn().unwrap();
    let (inside, watch) = (pool.clone(), l.clone());
    let mut submit = Box::pin(
        pool.offload(move |_| (watch.stats().in_use, inside.key_stats(4)))
            .name("named")
            .key("k")
            .limiter(&l)
            .submit(),
    );
    assert!(poll_once(submit.as_mut()).await.is_pending(), "no room yet");
    assert_eq!(l.stats().waiting, 0, "a refused try counts no waiting job");
    occupied.release().await;
    within("the queued job", queued).await.unwrap();
    let handle = within("room", submit)
        .await
        .expect("accepted once room frees");
    assert_eq!(handle.name(), Some("named"));
    let (in_use, keys) = within("the job", handle).await.unwrap();
    assert_eq!(in_use, 1, "the job held its limiter's permit");
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_eq!((keys[0].key.to_string(), keys[0].running), ("k".into(), 1));
}

/// A pool leaves a limiter's line as soon as no lane of it is blocked on
/// the limiter: when the blocked job is cancelled, and when it starts
/// (kills the mutant of `State::stop_waiting` that keeps the pool in line:
/// found by mutation testing of state/lanes/limited.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_leaves_the_line_once_no_lane_waits() {
    let l = Limiter::new(1);
    let pool = pool(2, 16);
    // Cancelled while blocked.
    let (_holder_pool, gate, holder) = held_elsewhere(&l).await;
    let blocked = pool.offload(|_| ()).limiter(&l).spawn().unwrap();
    eventually("the pool waits in line", || l.stats().pools_waiting == 1).await;
    assert!(blocked.cancel());
    assert_eq!(l.stats().pools_waiting, 0, "{:?}", l.stats());
    // Started once the permit came back.
    let waiting = pool.offload(|_| ()).limiter(&l).spawn().unwrap();
    eventually("the pool waits in line", || l.stats().pools_waiting == 1).await;
    gate.open();
    within("the holder", holder).await.unwrap();
    within("the waiting job", waiting).await.unwrap();
    assert_settled(&l);
}

/// A pool with a long keep-alive whose last worker stays, after a graceful
/// shutdown, for a job blocked on a limiter (found by a hostile review).
fn kept_for_a_blocked_job() -> (Offloader, Limiter, JobHandle<()>) {
    let pool = builder(2, 16)
        .keep_alive(std::time::Duration::from_secs(120))
        .build()
        .unwrap();
    let l = Limiter::new(0);
    let job = pool.offload(|_| ()).limiter(&l).spawn().unwrap();
    (pool, l, job)
}

/// Once a shut-down pool's last blocked job leaves the queue, the worker
/// kept for it retires at once: the pool terminates without waiting for
/// its keep-alive, whether the job was drained by a staged `close`, by
/// `shutdown_now` after `shutdown`, or cancelled after `shutdown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_kept_for_a_blocked_job_retires_once_the_job_is_gone() {
    let short = std::time::Duration::from_millis(50);
    for how in ["close", "shutdown_now", "cancel"] {
        let (pool, l, job) = kept_for_a_blocked_job();
        eventually("the pool waits for the limiter", || {
            l.stats().pools_waiting == 1
        })
        .await;
        match how {
            "close" => {
                let report = within("close", pool.close(short, short)).await;
                assert_eq!(report.unstarted.len(), 1, "{report:?}");
            }
            "shutdown_now" => {
                pool.shutdown();
                // The woken last worker parks again for the blocked job.
                eventually("the kept worker parked", || pool.metrics().workers == 1).await;
                assert!(still_pending(pool.terminated()).await, "kept for the job");
                assert_eq!(pool.shutdown_now().len(), 1);
            }
            _ => {
                pool.shutdown();
                assert!(still_pending(pool.terminated()).await, "kept for the job");
                assert!(job.cancel());
            }
        }
        within("the job's end", job).await.unwrap_err();
        within(&format!("termination after {how}"), pool.terminated()).await;
        assert_eq!(pool.metrics().workers, 0, "{how}");
        assert_settled(&l);
    }
}

/// The worker kept for a job waiting on a limiter sleeps while it waits,
/// whatever the keep-alive: with `keep_alive(0)` it woke at once, took the
/// pool lock and parked again, a busy loop for as long as the limiter
/// stayed full (found by a hostile review: about a quarter of a core).
/// Counted in its own thread's CPU ticks over half a second of waiting.
/// The worker is still there after that window, in which its zero
/// keep-alive expired at once (kills the mutant of `may_retire` that lets
/// the last worker go with a job queued).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_kept_for_a_blocked_job_sleeps() {
    let pool = builder(2, 16)
        .keep_alive(std::time::Duration::ZERO)
        .thread_name("kept-sleeper")
        .build()
        .unwrap();
    let l = Limiter::new(0);
    let job = pool.offload(|_| 7).limiter(&l).spawn().unwrap();
    eventually("the pool waits for the limiter", || {
        l.stats().pools_waiting == 1
    })
    .await;
    eventually("one worker kept", || pool.metrics().workers == 1).await;
    let before = cpu_ticks_of_threads_named("kept-sleeper");
    // A window of waiting, not an ordering of events.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let spent = cpu_ticks_of_threads_named("kept-sleeper") - before;
    assert!(
        spent <= 2,
        "the kept worker used {spent} ticks in 500 ms of waiting"
    );
    assert_eq!(pool.metrics().workers, 1, "the kept worker stayed");
    assert_eq!(threads_named("kept-sleeper"), 1);
    l.set_permits(1);
    assert_eq!(
        within("the job, once a permit is given", job)
            .await
            .unwrap(),
        7
    );
}

/// A limiter listed twice for one job is one permit of it, taken and given
/// back once (kills the mutant of `normalise` that keeps repeats: the job
/// then locked the limiter twice and hung); limiters are equal only to
/// their clones, and their `Debug` shows their counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_listed_twice_is_one_permit() {
    let (l, other) = (Limiter::new(2), Limiter::new(2));
    assert_eq!(l, l.clone());
    assert_ne!(l, other);
    let pool = pool(2, 16);
    let watch = l.clone();
    let in_use = pool
        .offload(move |_| watch.stats().in_use)
        .limiter(&l)
        .limiter(&other)
        .limiter(&l);
    assert_eq!(within("a job listing l twice", in_use).await.unwrap(), 1);
    assert_settled(&l);
    assert_settled(&other);
    let shown = format!("{l:?}");
    assert!(
        shown.contains("permits: 2") && shown.contains("high_water: 1"),
        "{shown}"
    );
}

/// A decrease of a limiter's permits revokes a grant a pool holds (M3):
/// `p` is granted the permit and readies its blocked lane, but no worker
/// can start it (spawns fail); `set_permits(0)` takes the grant back, so
/// the job does not start when a worker comes, and the books stay exact
/// when it is cancelled. (Kills the mutants of `LimState::revoke_excess`
/// that leave the grant counted in the pool's entry: found by mutation
/// testing of limiter/.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decrease_revokes_a_grant_not_yet_spent() {
    let l = Limiter::new(1);
    let p = pool_retiring_at_once();
    let KBlocked {
        holder_pool,
        holder_gate,
        holder,
        k1,
        r1_gate,
        r1,
    } = k1_blocked_beside_r1(&l, &p).await;
    grant_with_no_worker_to_start_it(&p, holder_gate, holder).await;
    l.set_permits(0);
    assert_eq!(l.stats().permits, 0);
    p.__fail_next_thread_spawns(0);
    // A worker looks at the readied lane: no permit left for k1.
    within("a job on p", p.offload(|_| ())).await.unwrap();
    assert_eq!(
        k1.state(),
        JobState::Queued,
        "the revoked grant started nothing"
    );
    assert!(k1.cancel());
    r1_gate.open();
    within("r1", r1).await.unwrap();
    assert_settled(&l);
    // The limiter works on: the permit given back starts another pool's
    // job (a grant kept past the decrease would have kept it for `p`).
    l.set_permits(1);
    let again = holder_pool.offload(|_| "again").limiter(&l);
    assert_eq!(
        within("a job after the decrease", again).await.unwrap(),
        "again"
    );
    assert_settled(&l);
}

/// Found by a hostile review: `set_permits(usize::MAX)` (a natural "no
/// limit") with a pool waiting granted that pool one permit per loop turn,
/// under the limiter's lock, and never returned (memory grew by the
/// list of grants). A pool is now granted at most its `max_in_flight`
/// permits at once: the call returns at once, and the jobs of both waiting
/// pools run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_permits_to_usize_max_with_pools_waiting_returns_at_once() {
    let limiter = Limiter::new(0);
    let a = pool(2, 16);
    let b = pool(3, 16);
    let jobs: Vec<_> = (0..6)
        .flat_map(|i| {
            [
                a.offload(move |_stop| i)
                    .limiter(&limiter)
                    .spawn()
                    .expect("accepted"),
                b.offload(move |_stop| i)
                    .limiter(&limiter)
                    .spawn()
                    .expect("accepted"),
            ]
        })
        .collect();
    eventually("both pools wait for the limiter", || {
        limiter.stats().pools_waiting == 2
    })
    .await;
    let l = limiter.clone();
    let set = std::thread::spawn(move || l.set_permits(usize::MAX));
    within("set_permits(usize::MAX)", async {
        while !set.is_finished() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    for job in jobs {
        within("a limited job", job).await.expect("ran");
    }
    assert_ledger(&a.metrics());
    assert_ledger(&b.metrics());
}
