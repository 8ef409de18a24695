//! Fault injection: real faults where they can be had.
//!
//! Each case checks three things after the fault: the pool keeps serving (a
//! later job completes), nothing accepted is lost (the ledger balances and,
//! once idle, `accepted = terminal`), and the error a user sees says what
//! happened (asserted on pieces of its `Display` text).
//!
//! | fault | how it is produced |
//! |---|---|
//! | worker-thread creation fails | for real: a child process re-runs this binary under `sh -c 'ulimit -v ...; exec ...'` and fills the address space up to the limit, so a thread stack can't be mapped; in-process: `Builder::stack_size` too big to map |
//! | a result whose `Drop` panics | the worker drops a detached job's result |
//! | a panic payload whose `Drop` panics | `panic_any` with such a payload |
//! | a function whose `Drop` panics | cancelled, or handed back by `shutdown_now`, so it is dropped unrun |
//! | a panicking `on_stop` callback | fired by `stop()`, by `shutdown_now`, by a caller's time-out under `CancelAndStop` |
//! | a panicking lifecycle observer | panics on every event, for every kind of transition |
//! | a tokio runtime dropped while callers wait | built on its own thread, dropped with two callers waiting |
//! | several runtimes and plain threads | one pool, two current-thread runtimes, a multi-thread one, three plain threads, handles crossing between them |
//! | the last `Offloader` dropped inside an async task, or by its own job on a worker thread | |
//! | a million handles dropped without being awaited | in a child process, so that its RSS is its own |
//!
//! Nothing here orders events with sleeps: "the function runs" is a message
//! on a channel, "the function may return" is a gate. Bounded waits
//! ([`HANG`]) only run out if the library hangs.

mod support;

use std::future::{Future, IntoFuture};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use offloader::{
    AbandonPolicy, Error, EventKind, JobEvent, JobState, Metrics, Observer, Offloader, StopToken,
    DEFAULT_QUEUE_CAPACITY,
};
use support::*;

/// Marks deliberate panics (it says `support::ON_PURPOSE`), which the panic
/// hook keeps quiet.
const MARK: &str = "fault injection, on purpose:";
/// Set in a child process to the name of the child test it should run.
const CHILD_ENV: &str = "OFFLOADER_FAULTS_CHILD";

// ---------------------------------------------------------------------------
// Helpers

/// After idle: every accepted job is terminal.
#[track_caller]
fn assert_closed_books(m: &Metrics) {
    assert_ledger(m);
    assert_eq!(
        (m.queued, m.running, m.accepted),
        (0, 0, m.terminal()),
        "accepted jobs are not all terminal: {m:?}"
    );
}

/// Waits (bounded) until no thread named `name` is left: the pool behind
/// them has terminated even though nobody can ask it any more.
async fn threads_exit(name: &str) {
    let deadline = Instant::now() + HANG;
    while threads_named(name) > 0 {
        assert!(
            Instant::now() < deadline,
            "{} thread(s) named {name:?} still alive after {HANG:?}",
            threads_named(name)
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Re-runs this test binary, filtered to the ignored child test `test`,
/// optionally under a shell prefix (`ulimit ...`). Returns its stdout;
/// fails if the child failed.
fn run_child(test: &str, shell_prefix: Option<&str>) -> String {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = match shell_prefix {
        Some(prefix) => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!("{prefix}; exec \"$0\" \"$@\""))
                .arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    cmd.args([
        test,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, test);
    let out = cmd.output().expect("run the child test process");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child test {test} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    stdout
}

/// `true` in the child process started for `test`; a child test run any
/// other way does nothing.
fn in_child(test: &str) -> bool {
    let mine = std::env::var(CHILD_ENV).as_deref() == Ok(test);
    if !mine {
        eprintln!("{test}: runs only in the child process its parent test starts");
    }
    mine
}

// ---------------------------------------------------------------------------
// 1. Worker-thread creation failing for real

/// Address space left under RLIMIT_AS, in bytes.
fn address_space_left() -> u64 {
    let limits = std::fs::read_to_string("/proc/self/limits").expect("/proc/self/limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))
        .expect("a Max address space line");
    let soft: u64 = line
        .split_whitespace()
        .nth(3)
        .and_then(|v| v.parse().ok())
        .expect("a finite RLIMIT_AS (set by the parent's ulimit -v)");
    soft.saturating_sub(status_kib("VmSize:") * 1024)
}

/// Reserves address space (never touched, so no RSS) until less than one
/// MiB is left: no thread stack (2 MiB by default) can be mapped any more.
fn fill_address_space() -> Vec<Vec<u8>> {
    let mut ballast = Vec::new();
    for chunk in [256usize << 20, 16 << 20, 1 << 20] {
        loop {
            let mut v: Vec<u8> = Vec::new();
            if v.try_reserve_exact(chunk).is_err() {
                break;
            }
            ballast.push(v);
        }
    }
    ballast
}

const RLIMIT_CHILD: &str = "child_thread_spawn_fails_under_rlimit_as";

/// The pool meets a real `pthread_create` failure: a child process under
/// `ulimit -v` fills its address space so that no thread stack fits.
#[test]
fn real_thread_spawn_failure_under_rlimit_as() {
    // 4 GiB of address space: ample to start the test binary, tiny next to
    // the 128 TiB of a 64-bit process. The child fills what is left.
    let out = run_child(RLIMIT_CHILD, Some("ulimit -v 4194304"));
    assert!(
        out.contains("queued despite a failed spawn: spawn_failures 1"),
        "{out}"
    );
    assert!(
        out.contains("served while thread creation failed: 2 3"),
        "{out}"
    );
    assert!(out.contains("served after memory came back: 4 5"), "{out}");
    // The stuck-job monitor's spawn failed for real (kills the mutant of
    // `State::monitor_gone` that kept it counted as running, so that the
    // pool never terminated: mutation testing of state/workers.rs).
    assert!(
        out.contains("watched pool served without its monitor: 6 0"),
        "{out}"
    );
    assert!(out.contains("watched pool terminated"), "{out}");
}

#[test]
#[ignore = "runs in a child process started by real_thread_spawn_failure_under_rlimit_as"]
fn child_thread_spawn_fails_under_rlimit_as() {
    if !in_child(RLIMIT_CHILD) {
        return;
    }
    let pool = Offloader::builder()
        .max_in_flight(2)
        .thread_name("fault-rlimit")
        .build()
        .expect("valid configuration");
    println!(
        "address space left at start: {} MiB",
        address_space_left() >> 20
    );

    // Job 1 runs on the pool's first worker, held on a gate.
    let (g1, hold) = gate();
    let (tx, mut first_started) = signal();
    let mut one = pool
        .offload(move |_| {
            let _ = tx.send(());
            hold.wait();
            1
        })
        .spawn()
        .expect("accepted while memory is plentiful");
    recv_blocking("job 1", &mut first_started);

    // No thread stack can be mapped any more.
    let mut ballast = fill_address_space();
    let left = address_space_left();
    println!(
        "address space left after the ballast: {} KiB in {} chunks",
        left >> 10,
        ballast.len()
    );
    assert!(
        left < 2 << 20,
        "could not fill the address space: {left} left"
    );

    // Job 2 needs a second worker: the spawn fails for real. A worker
    // exists (busy with job 1), so the job is queued for it rather than
    // refused, and the failure is counted.
    let ran2 = Arc::new(AtomicBool::new(false));
    let r2 = ran2.clone();
    let mut two = pool
        .offload(move |_| {
            r2.store(true, Ordering::SeqCst);
            2
        })
        .spawn()
        .expect("queued for the busy worker although no thread can be created");
    let m = pool.metrics();
    println!(
        "queued despite a failed spawn: spawn_failures {}",
        m.spawn_failures
    );
    assert_eq!(
        (
            m.accepted,
            m.rejected_spawn,
            m.spawn_failures,
            m.running,
            m.queued
        ),
        (2, 0, 1, 1, 1),
        "{m:?}"
    );
    assert_ledger(&m);
    assert!(!ran2.load(Ordering::SeqCst));

    // The pool keeps serving with the worker it has: job 1 returns, jobs 2
    // and 3 run on the same worker, no new thread needed.
    g1.open();
    assert_eq!(one.blocking_wait(None).expect("job 1"), 1);
    assert_eq!(two.blocking_wait(None).expect("job 2"), 2);
    assert!(ran2.load(Ordering::SeqCst));
    // Wait until the worker is back looking for work: a worker that has
    // published an outcome but not yet re-entered its wait counts neither
    // as searching nor as parked, and a submit in that window tries to
    // spawn another thread (which fails here). `is_idle()` turns true only
    // once the worker has settled its last outcome inside that wait.
    let deadline = Instant::now() + HANG;
    while !pool.is_idle() {
        assert!(
            Instant::now() < deadline,
            "never idle: {:?}",
            pool.metrics()
        );
        std::thread::yield_now();
    }
    let mut three = pool
        .offload(|_| 3)
        .spawn()
        .expect("an existing worker takes it");
    let v3 = three.blocking_wait(None).expect("job 3");
    println!("served while thread creation failed: 2 {v3}");
    assert_eq!(threads_named("fault-rlimit"), 1);

    // A pool with a stuck-job monitor, and room left for one of its thread
    // stacks: its first job's worker is spawned, its monitor is not (the
    // job runs; stuck jobs go unreported). Below, once memory is back, it
    // still terminates after a shutdown: a monitor that never ran is not
    // waited for.
    const STACK: usize = 1 << 20;
    const ROOM: u64 = 1600 << 10;
    let watched = Offloader::builder()
        .max_in_flight(1)
        .thread_name("fault-watch")
        .stack_size(STACK)
        .stuck_after(Duration::from_secs(3600))
        .build()
        .expect("valid configuration");
    while address_space_left() < ROOM && ballast.pop().is_some() {}
    // Taken back down to the room by a parked thread whose stack is the
    // excess (an allocation could come from heap memory already mapped).
    let excess = address_space_left().saturating_sub(ROOM) as usize;
    let (release_pad, pad_released) = mpsc::channel::<()>();
    let pad = (excess > 64 << 10).then(|| {
        std::thread::Builder::new()
            .stack_size((excess - (16 << 10)) & !0xfff)
            .spawn(move || {
                let _ = pad_released.recv();
            })
            .expect("room for the pad thread")
    });
    println!(
        "room for the watched pool: {} KiB",
        address_space_left() >> 10
    );
    let mut six = watched.offload(|_| 6).spawn().expect("room for its worker");
    let v6 = six.blocking_wait(None).expect("job 6");
    println!(
        "watched pool served without its monitor: {v6} {}",
        threads_named("fault-watch-monitor")
    );

    // Memory comes back: two jobs at once need a second worker, which can be
    // created again; the refused function is handed in again and runs.
    drop(release_pad);
    if let Some(pad) = pad {
        pad.join().expect("the pad thread");
    }
    drop(ballast);
    let (g4, hold4) = gate();
    let (tx4, mut four_started) = signal();
    let mut four = pool
        .offload(move |_| {
            let _ = tx4.send(());
            hold4.wait();
            4
        })
        .spawn()
        .expect("accepted");
    recv_blocking("job 4", &mut four_started);
    // Job 5 runs while job 4 holds the first worker: on a second worker.
    let mut five = pool.offload(|_| 5).spawn().expect("accepted");
    let v5 = five.blocking_wait(None).expect("job 5");
    g4.open();
    let v4 = four.blocking_wait(None).expect("job 4");
    println!("served after memory came back: {v4} {v5}");

    pool.shutdown();
    assert!(pool.blocking_await_termination(Some(HANG)), "terminated");
    let m = pool.metrics();
    assert_closed_books(&m);
    assert_eq!(
        (m.accepted, m.completed, m.rejected_spawn, m.workers),
        (5, 5, 0, 0),
        "{m:?}"
    );
    assert!(m.spawn_failures >= 1, "{m:?}");

    watched.shutdown();
    assert!(
        watched.blocking_await_termination(Some(HANG)),
        "the pool whose monitor never started terminated"
    );
    println!("watched pool terminated");
}

/// A stack size no address space can hold: every worker spawn fails with
/// the OS's own error, for the `spawn`, `submit` and awaited forms alike;
/// nothing is accepted, and the pool still closes cleanly. Other pools
/// are unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_thread_spawn_failure_from_an_unmappable_stack() {
    let broken = Offloader::builder()
        .max_in_flight(2)
        .stack_size(1 << 50) // 1 PiB: more than a 47-bit address space
        .build()
        .expect("the size is only tried at the first spawn");
    let err = broken
        .offload(|_| 1)
        .name("never")
        .spawn()
        .expect_err("no stack of 1 PiB can be mapped");
    let Error::ThreadSpawn(io) = err.reason() else {
        panic!("expected a thread-spawn refusal, got {:?}", err.reason());
    };
    assert!(io.raw_os_error().is_some(), "an OS error: {io:?}");
    let text = err.to_string();
    assert!(
        text == "job refused, the function never ran: no worker thread could be spawned to run it",
        "{text}"
    );
    let awaited = within("awaited form", broken.offload(|_| 2))
        .await
        .expect_err("refused");
    assert!(
        awaited.is_busy() && awaited.job_id().is_none(),
        "{awaited:?}"
    );
    assert!(
        awaited.to_string()
            == "job refused, the function never ran: no worker thread could be spawned to run it",
        "{awaited}"
    );
    let submitted = within("submit form", broken.offload(|_| 3).submit()).await;
    assert!(
        matches!(&submitted, Err(e) if matches!(e.reason(), Error::ThreadSpawn(_))),
        "{:?}",
        submitted.map(|h| h.id())
    );
    let m = broken.metrics();
    assert_eq!(
        (m.accepted, m.rejected_spawn, m.workers),
        (0, 3, 0),
        "{m:?}"
    );
    assert_ledger(&m);

    // Another pool serves meanwhile; the broken one closes at once.
    let ok = builder(1, DEFAULT_QUEUE_CAPACITY)
        .thread_name("fault-unmap-ok")
        .build()
        .expect("valid configuration");
    assert_eq!(within("another pool", ok.offload(|_| 4)).await.unwrap(), 4);
    let report = within("close", broken.close(HANG, HANG)).await;
    assert!(report.terminated && !report.escalated, "{report}");
}

// ---------------------------------------------------------------------------
// 2. Panics where nobody expects them

/// Counts its drops, then panics.
struct PanicsOnDrop(Arc<AtomicUsize>, &'static str);

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
        // Not while a failing test unwinds: that would abort the binary.
        if !std::thread::panicking() {
            panic!("{MARK} {} dropped", self.1);
        }
    }
}

/// A detached job's result is dropped by the worker that published it. A
/// `Drop` that panics there must not kill the worker (a dead worker strands
/// the job it already took from the queue, and the pool never becomes idle
/// or terminates).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_whose_drop_panics_on_the_worker() {
    quiet_deliberate_panics();
    let pool = builder(1, DEFAULT_QUEUE_CAPACITY)
        .thread_name("fault-resdrop")
        .build()
        .expect("valid configuration");
    let drops = Arc::new(AtomicUsize::new(0));
    let (g, hold) = gate();
    let d = drops.clone();
    let bomb = pool
        .offload(move |_| {
            hold.wait();
            PanicsOnDrop(d, "result")
        })
        .spawn()
        .expect("accepted");
    // Queued behind it: the worker takes it in the same breath as it
    // finishes the first one.
    let next = pool.offload(|_| 7).spawn().expect("accepted");
    bomb.detach();
    g.open();
    assert_eq!(
        within("the job queued behind the bomb", next)
            .await
            .unwrap(),
        7
    );
    within("idle", pool.idle()).await;
    assert_eq!(
        drops.load(Ordering::SeqCst),
        1,
        "the result was dropped once"
    );
    let m = pool.metrics();
    assert_closed_books(&m);
    assert_eq!(m.completed, 2, "{m:?}");
    // The pool keeps serving, with the worker it had.
    assert_eq!(
        within("keeps serving", pool.offload(|_| 8)).await.unwrap(),
        8
    );
    pool.shutdown();
    assert!(
        pool.await_termination(HANG).await,
        "terminated: {:?}",
        pool.metrics()
    );
}

/// A panic payload whose own `Drop` panics: its owner gets it (and its
/// drop) with the error; one that nobody takes is dropped by the worker,
/// which survives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_payload_whose_drop_panics() {
    quiet_deliberate_panics();
    let pool = builder(1, DEFAULT_QUEUE_CAPACITY)
        .thread_name("fault-payload")
        .build()
        .expect("valid configuration");
    let drops = Arc::new(AtomicUsize::new(0));
    let d = drops.clone();
    let bomb = pool
        .offload(move |_| -> u32 { std::panic::panic_any(PanicsOnDrop(d, "panic payload")) })
        .spawn()
        .expect("accepted");
    let next = pool.offload(|_| 7u32).spawn().expect("accepted");
    let err = within("the panicking job", bomb)
        .await
        .expect_err("a panic is a result");
    let text = err.to_string();
    assert!(err.is_panic(), "{err:?}");
    assert!(
        text.contains("panicked") && text.contains("the worker survived"),
        "{text}"
    );
    assert_eq!(within("the job queued behind", next).await.unwrap(), 7);
    within("idle", pool.idle()).await;
    assert_eq!(drops.load(Ordering::SeqCst), 0, "the owner has the payload");
    let payload = err.into_panic();
    assert!(payload.is::<PanicsOnDrop>());
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(payload)));
    assert!(dropped.is_err(), "its drop panics, in its owner's hands");
    assert_eq!(drops.load(Ordering::SeqCst), 1);

    // Nobody takes it: the worker drops it, and survives its panic.
    let (open, hold) = gate();
    let d = drops.clone();
    let bomb = pool
        .offload(move |_| -> u32 {
            hold.wait();
            std::panic::panic_any(PanicsOnDrop(d, "panic payload"))
        })
        .spawn()
        .expect("accepted");
    drop(bomb);
    open.open();
    eventually("the worker dropped the payload", || {
        drops.load(Ordering::SeqCst) == 2
    })
    .await;
    within("idle", pool.idle()).await;
    let m = pool.metrics();
    assert_closed_books(&m);
    assert_eq!((m.panicked, m.completed), (2, 1), "{m:?}");
    assert_eq!(
        within("keeps serving", pool.offload(|_| 8u32))
            .await
            .unwrap(),
        8
    );
}

/// A function whose captured state panics when dropped, dropped unrun by a
/// cancel: the owner still learns that the job was cancelled, and the pool
/// still becomes idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_whose_drop_panics_when_cancelled() {
    quiet_deliberate_panics();
    let pool = builder(1, DEFAULT_QUEUE_CAPACITY)
        .thread_name("fault-fncancel")
        .build()
        .expect("valid configuration");
    let drops = Arc::new(AtomicUsize::new(0));
    let (g, hold) = gate();
    let (tx, mut running) = signal();
    let first = pool
        .offload(move |_| {
            let _ = tx.send(());
            hold.wait();
            1
        })
        .spawn()
        .expect("accepted");
    recv("first job", &mut running).await;
    let bomb = PanicsOnDrop(drops.clone(), "function");
    let queued = pool
        .offload(move |_| {
            let _keep = &bomb;
            2
        })
        .spawn()
        .expect("accepted");
    // Whether or not the drop's panic reaches the caller of cancel(), the
    // job must end cancelled and be counted as such.
    let cancelled = catch_unwind(AssertUnwindSafe(|| queued.cancel()));
    assert_eq!(drops.load(Ordering::SeqCst), 1, "the function was dropped");
    if let Ok(prevented) = cancelled {
        assert!(prevented, "cancel() of a queued job prevents its start");
    }
    let err = within(
        "the cancelled job's outcome (its function's drop panicked in cancel())",
        queued,
    )
    .await
    .expect_err("cancelled");
    assert!(
        matches!(err, Error::Cancelled { id: Some(_) })
            && err.to_string().contains("cancelled before it started"),
        "{err:?}"
    );
    g.open();
    assert_eq!(within("first", first).await.unwrap(), 1);
    within("idle after the cancel", pool.idle()).await;
    let m = pool.metrics();
    assert_closed_books(&m);
    assert_eq!((m.completed, m.cancelled), (1, 1), "{m:?}");
    assert_eq!(
        within("keeps serving", pool.offload(|_| 3)).await.unwrap(),
        3
    );
}

/// Functions whose drop panics, handed back unstarted by `shutdown_now`:
/// every queued job is still returned and resolved, and the pool
/// terminates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_whose_drop_panics_handed_back_by_shutdown_now() {
    quiet_deliberate_panics();
    let pool = builder(1, DEFAULT_QUEUE_CAPACITY)
        .thread_name("fault-fnnow")
        .build()
        .expect("valid configuration");
    let drops = Arc::new(AtomicUsize::new(0));
    let (g, hold) = gate();
    let (tx, mut running) = signal();
    let first = pool
        .offload(move |_| {
            let _ = tx.send(());
            hold.wait();
            1
        })
        .spawn()
        .expect("accepted");
    recv("first job", &mut running).await;
    let mut queued = Vec::new();
    for i in 0..3 {
        let bomb = PanicsOnDrop(drops.clone(), "function");
        let h = pool
            .offload(move |_| {
                let _keep = &bomb;
                i
            })
            .name(format!("bomb-{i}"))
            .spawn()
            .expect("accepted");
        queued.push(h);
    }
    let returned = catch_unwind(AssertUnwindSafe(|| pool.shutdown_now()));
    assert_eq!(
        drops.load(Ordering::SeqCst),
        3,
        "shutdown_now() stopped at the first function whose drop panicked: the other queued \
         jobs were never handed back ({:?})",
        returned
            .as_ref()
            .map(Vec::len)
            .map_err(|_| "shutdown_now panicked")
    );
    if let Ok(list) = &returned {
        let names: Vec<_> = list.iter().map(|u| u.name.as_deref()).collect();
        assert_eq!(names, [Some("bomb-0"), Some("bomb-1"), Some("bomb-2")]);
    }
    for h in queued {
        let err = within("a handed-back job's outcome", h)
            .await
            .expect_err("unstarted");
        assert!(
            matches!(err, Error::ShuttingDown { id: Some(_) })
                && err.to_string().contains("never started"),
            "{err:?}"
        );
    }
    g.open();
    assert_eq!(within("first", first).await.unwrap(), 1);
    assert!(
        pool.await_termination(HANG).await,
        "no termination: {:?}",
        pool.metrics()
    );
    let m = pool.metrics();
    assert_closed_books(&m);
    assert_eq!((m.completed, m.unstarted), (1, 3), "{m:?}");
}

/// A job registers two `on_stop` callbacks; the first to run panics. Fired
/// by `JobHandle::stop`, by `shutdown_now` and by a caller's time-out under
/// `CancelAndStop`: the panic stays inside the library, the other callback
/// still runs, the function sees the stop, and the pool goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_on_stop_callback() {
    quiet_deliberate_panics();

    /// The job: registers a quiet callback, then a panicking one (callbacks
    /// run newest first), signals, and sleeps until stopped.
    fn job(
        other_ran: Arc<AtomicBool>,
        tx: tokio::sync::mpsc::UnboundedSender<()>,
    ) -> impl FnOnce(&StopToken) -> Result<(), String> + Send + 'static {
        move |stop: &StopToken| {
            let o = other_ran.clone();
            let _quiet = stop.on_stop(move || o.store(true, Ordering::SeqCst));
            let _bomb = stop.on_stop(|| panic!("{MARK} on_stop callback"));
            let _ = tx.send(());
            stop.sleep(HANG * 2).map_err(|e| e.to_string())
        }
    }

    let pool = Offloader::builder()
        .max_in_flight(2)
        .thread_name("fault-onstop")
        .build()
        .expect("valid");

    // By the handle.
    let other = Arc::new(AtomicBool::new(false));
    let (tx, mut running) = signal();
    let h = pool
        .offload(job(other.clone(), tx))
        .spawn()
        .expect("accepted");
    recv("job stopped by its handle", &mut running).await;
    let requested = catch_unwind(AssertUnwindSafe(|| h.stop()));
    assert!(
        matches!(requested, Ok(true)),
        "stop() let a callback's panic escape or did not make the request"
    );
    assert!(other.load(Ordering::SeqCst), "the other callback still ran");
    let r = within("stopped job", h).await.expect("completed");
    assert!(
        r.as_ref().is_err_and(|e| e.contains("stop was requested")),
        "{r:?}"
    );

    // By a caller's time-out under CancelAndStop.
    let other = Arc::new(AtomicBool::new(false));
    let (tx, mut running) = signal();
    let mut fut = Box::pin(
        pool.offload(job(other.clone(), tx))
            .with_timeout(Duration::from_millis(1))
            .on_abandon(AbandonPolicy::CancelAndStop)
            .into_future(),
    );
    assert!(poll_once(fut.as_mut()).await.is_pending());
    recv("job stopped by its caller's time-out", &mut running).await;
    let err = within("the caller's time-out", fut)
        .await
        .expect_err("timed out");
    let text = err.to_string();
    assert!(
        err.is_timeout() && text.contains("still running") && text.contains("stop was requested"),
        "{text}"
    );
    assert!(other.load(Ordering::SeqCst));

    // By shutdown_now.
    let other = Arc::new(AtomicBool::new(false));
    let (tx, mut running) = signal();
    let h = pool
        .offload(job(other.clone(), tx))
        .spawn()
        .expect("accepted");
    recv("job stopped by shutdown_now", &mut running).await;
    let unstarted = catch_unwind(AssertUnwindSafe(|| pool.shutdown_now()));
    assert!(
        matches!(&unstarted, Ok(list) if list.is_empty()),
        "shutdown_now() let a callback's panic escape"
    );
    assert!(other.load(Ordering::SeqCst));
    let r = within("job stopped by shutdown_now", h)
        .await
        .expect("completed");
    assert!(r.is_err(), "{r:?}");
    assert!(pool.await_termination(HANG).await, "{:?}", pool.metrics());
    let m = pool.metrics();
    assert_closed_books(&m);
    assert_eq!((m.completed, m.stop_requests), (3, 3), "{m:?}");
}

/// An observer that panics on every event, for every kind of transition
/// (accepted, started, finished completed/panicked/cancelled, never
/// started, abandoned): every event is still offered, in order, the pool
/// serves, idles and terminates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_lifecycle_observer() {
    quiet_deliberate_panics();

    #[derive(Default)]
    struct Bomb(Mutex<Vec<(u64, EventKind)>>);

    impl Observer for Bomb {
        fn on_event(&self, event: &JobEvent) {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((event.id.as_u64(), event.kind));
            panic!("{MARK} observer, event {:?}", event.kind);
        }
    }

    let seen = Arc::new(Bomb::default());
    let pool = Offloader::builder()
        .max_in_flight(1)
        .observer(seen.clone())
        .thread_name("fault-observer")
        .build()
        .expect("valid");
    assert_eq!(within("completed", pool.offload(|_| 1)).await.unwrap(), 1);
    let err = within(
        "panicked",
        pool.offload(|_| -> u32 { panic!("{MARK} job") }),
    )
    .await
    .expect_err("panicked");
    assert!(
        err.is_panic() && err.to_string().contains("worker survived"),
        "{err}"
    );

    let (g, hold) = gate();
    let (tx, mut running) = signal();
    let held = pool
        .offload(move |_| {
            let _ = tx.send(());
            hold.wait();
            2
        })
        .spawn()
        .expect("accepted");
    recv("held job", &mut running).await;
    let cancelled = pool.offload(|_| 3).spawn().expect("accepted");
    assert!(cancelled.cancel());
    // A caller leaves a queued job (Abandoned), which stays queued (Keep).
    let mut left = Box::pin(pool.offload(|_| 4).into_future());
    assert!(poll_once(left.as_mut()).await.is_pending());
    drop(left);
    let unstarted = pool.shutdown_now();
    assert_eq!(unstarted.len(), 1);
    g.open();
    assert_eq!(within("held", held).await.unwrap(), 2);
    assert!(pool.await_termination(HANG).await, "{:?}", pool.metrics());
    let m = pool.metrics();
    assert_closed_books(&m);
    assert_eq!(
        (m.completed, m.panicked, m.cancelled, m.unstarted),
        (2, 1, 1, 1),
        "{m:?}"
    );

    let events = seen.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let kinds = |id: u64| -> Vec<EventKind> {
        events
            .iter()
            .filter(|(i, _)| *i == id)
            .map(|(_, k)| *k)
            .collect()
    };
    let ids: Vec<u64> = {
        let mut v: Vec<u64> = events.iter().map(|(i, _)| *i).collect();
        v.dedup();
        v.sort_unstable();
        v.dedup();
        v
    };
    assert_eq!(ids.len(), 5, "five jobs observed: {events:?}");
    use EventKind::*;
    assert_eq!(
        kinds(ids[0]),
        [Accepted, Started, Finished(JobState::Completed)]
    );
    assert_eq!(
        kinds(ids[1]),
        [Accepted, Started, Finished(JobState::Panicked)]
    );
    assert_eq!(
        kinds(ids[2]),
        [Accepted, Started, Finished(JobState::Completed)]
    );
    assert_eq!(kinds(ids[3]), [Accepted, Finished(JobState::Cancelled)]);
    assert_eq!(
        kinds(ids[4]),
        [
            Accepted,
            Abandoned {
                state: JobState::Queued
            },
            NeverStarted
        ]
    );
}

/// A stop callback that panics with a payload whose own `Drop` panics.
/// Whatever reaches the thread that requested the stop, the job's function
/// must still be able to return (its `StopCallback` guard must not wait
/// for a callback run that never ends) and release its permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_callback_whose_panic_payload_panics_on_drop() {
    quiet_deliberate_panics();
    let pool = builder(1, DEFAULT_QUEUE_CAPACITY)
        .thread_name("fault-cbpayload")
        .build()
        .expect("valid configuration");
    let drops = Arc::new(AtomicUsize::new(0));
    let (tx, mut running) = signal();
    let d = drops.clone();
    let h = pool
        .offload(move |stop: &StopToken| {
            let _guard = stop
                .on_stop(move || std::panic::panic_any(PanicsOnDrop(d, "stop callback payload")));
            let _ = tx.send(());
            // Wakes on the stop request; then the guard is dropped.
            stop.sleep(HANG * 2).is_err()
        })
        .spawn()
        .expect("accepted");
    recv("the job", &mut running).await;
    let requested = catch_unwind(AssertUnwindSafe(|| h.stop()));
    assert_eq!(drops.load(Ordering::SeqCst), 1, "the payload was dropped");
    let stopped = within("the function returning after its stop callback panicked", h)
        .await
        .expect("completed");
    assert!(stopped, "the function saw the stop request");
    assert!(
        matches!(requested, Ok(true)),
        "stop() let the payload's panic escape into its caller"
    );
    within("idle", pool.idle()).await;
    assert_closed_books(&pool.metrics());
    assert_eq!(
        within("keeps serving", pool.offload(|_| 3)).await.unwrap(),
        3
    );
}

/// An observer that panics once with a payload whose own `Drop` panics:
/// delivery must go on, the submitting caller must not see the observer's
/// panic, and the pool must still become idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_whose_panic_payload_panics_on_drop() {
    quiet_deliberate_panics();

    struct Once(AtomicBool, Arc<AtomicUsize>, AtomicUsize);

    impl Observer for Once {
        fn on_event(&self, _event: &JobEvent) {
            self.2.fetch_add(1, Ordering::SeqCst);
            if !self.0.swap(true, Ordering::SeqCst) {
                std::panic::panic_any(PanicsOnDrop(self.1.clone(), "observer payload"));
            }
        }
    }

    let drops = Arc::new(AtomicUsize::new(0));
    let observer = Arc::new(Once(
        AtomicBool::new(false),
        drops.clone(),
        AtomicUsize::new(0),
    ));
    let pool = Offloader::builder()
        .max_in_flight(1)
        .observer(observer.clone())
        .thread_name("fault-obspayload")
        .build()
        .expect("valid");
    // The first event (Accepted) is delivered by the pool's delivery
    // thread: the panic must neither reach the submitter nor stop delivery.
    let spawned = catch_unwind(AssertUnwindSafe(|| pool.offload(|_| 1).spawn()));
    let escaped = spawned.is_err();
    if let Ok(h) = spawned {
        assert_eq!(within("the job", h.expect("accepted")).await.unwrap(), 1);
    }
    let idle = tokio::time::timeout(HANG, pool.idle()).await.is_ok();
    assert_eq!(drops.load(Ordering::SeqCst), 1, "the payload was dropped");
    let offered = observer.2.load(Ordering::SeqCst);
    assert!(
        !escaped && idle && offered == 3,
        "observer payload panic: escaped into spawn(): {escaped}; idle (every event \
         delivered) within {HANG:?}: {idle}; events offered: {offered} of 3; {:?}",
        pool.metrics()
    );
    assert_closed_books(&pool.metrics());
}

// ---------------------------------------------------------------------------
// 3. Runtimes and threads

/// A current-thread runtime is built on its own thread, two callers start
/// waiting on it (an awaited offload with a timeout, and an owner handle),
/// then the runtime is dropped with them. The dropped awaited caller is
/// recorded and its job goes on (Keep); the pool serves another runtime;
/// the owner handle that was being awaited stays usable, from a plain
/// thread.
#[test]
fn a_runtime_dropped_while_callers_wait() {
    let pool = builder(3, DEFAULT_QUEUE_CAPACITY)
        .thread_name("fault-rtdrop")
        .build()
        .expect("valid configuration");
    let (ga, hold_a) = gate();
    let (gb, hold_b) = gate();
    let (tx_a, mut a_running) = signal();
    let (tx_b, mut b_running) = signal();
    let b = pool
        .offload(move |_| {
            let _ = tx_b.send(());
            hold_b.wait();
            "b"
        })
        .spawn()
        .expect("accepted");
    let b = Arc::new(Mutex::new(Some(b)));

    let (p, b2) = (pool.clone(), b.clone());
    within_blocking("the runtime's thread", move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let (tx, mut waiting) = tokio::sync::mpsc::unbounded_channel::<&str>();
        let tx2 = tx.clone();
        // Boxed as a `dyn Future + Send` outside the task: the closure's
        // higher-ranked signature otherwise trips rustc's `Send` inference
        // for async blocks.
        let mut a: Pin<Box<dyn Future<Output = Result<&str, Error>> + Send>> = Box::pin(
            p.offload(move |_: &StopToken| {
                let _ = tx_a.send(());
                hold_a.wait();
                "a"
            })
            .with_timeout(HANG)
            .on_abandon(AbandonPolicy::Keep)
            .into_future(),
        );
        rt.spawn(async move {
            assert!(poll_once(a.as_mut()).await.is_pending());
            let _ = tx.send("a");
            let _ = a.await;
        });
        rt.spawn(async move {
            let mut told = false;
            let _ = std::future::poll_fn(|cx| {
                let mut slot = b2.lock().unwrap_or_else(|p| p.into_inner());
                let handle = slot.as_mut().expect("handle b");
                let r = Pin::new(handle).poll(cx);
                if !told {
                    told = true;
                    let _ = tx2.send("b");
                }
                r
            })
            .await;
        });
        rt.block_on(async {
            waiting.recv().await;
            waiting.recv().await;
        });
        recv_blocking("job a", &mut a_running);
        recv_blocking("job b", &mut b_running);
        // Both callers are waiting and both functions run; drop the
        // runtime, and the callers with it.
        drop(rt);
    });

    let m = pool.metrics();
    assert_eq!(
        (
            m.accepted,
            m.running,
            m.callers_dropped,
            m.running_after_caller_left
        ),
        (2, 2, 1, 1),
        "{m:?}"
    );
    assert_ledger(&m);

    // Another runtime: the pool serves, and handle b's wait can be bounded
    // there even though its last waker belonged to the dropped runtime.
    let rt2 = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt2.block_on(async {
        assert_eq!(
            within("another runtime", pool.offload(|_| "c"))
                .await
                .unwrap(),
            "c"
        );
        let mut handle = b
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .expect("b");
        tokio::time::timeout(Duration::from_millis(1), &mut handle)
            .await
            .expect_err("b is held on its gate");
        assert_eq!(handle.state(), offloader::JobState::Running);
        *b.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
    });

    // From a plain thread.
    let mut handle = b
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .expect("b");
    let waiter = std::thread::spawn(move || handle.blocking_wait(None));
    ga.open();
    gb.open();
    assert_eq!(waiter.join().expect("plain thread").expect("b"), "b");
    rt2.block_on(async { within("idle", pool.idle()).await });
    let m = pool.metrics();
    assert_closed_books(&m);
    assert_eq!(m.completed, 3, "{m:?}");
}

/// One pool, used at once from two current-thread runtimes, a multi-thread
/// runtime and three plain threads, with handles crossing between them
/// (spawned on a runtime and waited on from a plain thread, and the other
/// way round).
#[test]
fn one_offloader_from_several_runtimes_and_plain_threads() {
    const PER: u64 = 200;
    const MAX: usize = 3;
    let pool = builder(MAX, 256)
        .thread_name("fault-multi")
        .build()
        .expect("valid");
    let inside = Concurrency::default();
    let job = {
        let inside = inside.clone();
        move |v: u64| {
            let inside = inside.clone();
            move |_: &StopToken| {
                let _in = inside.enter();
                std::thread::yield_now();
                v
            }
        }
    };
    let start = Arc::new(Barrier::new(6));
    // Handles spawned on runtime 0, waited on by plain thread 0; and the
    // other way round, plain thread 1 to runtime 1.
    let (to_plain, from_runtime) = mpsc::channel::<offloader::JobHandle<u64>>();
    let (to_runtime, from_plain) =
        tokio::sync::mpsc::unbounded_channel::<offloader::JobHandle<u64>>();
    let from_plain = Arc::new(Mutex::new(Some(from_plain)));
    let mut threads = Vec::new();

    for r in 0..2u64 {
        let (pool, job, start) = (pool.clone(), job.clone(), start.clone());
        let to_plain = to_plain.clone();
        let from_plain = from_plain.clone();
        threads.push(std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            start.wait();
            rt.block_on(async move {
                let mut sum = 0;
                for i in 0..PER {
                    let v = r * 1_000_000 + i;
                    let got = match i % 3 {
                        0 => pool.offload(job(v)).await.expect("awaited"),
                        1 => pool
                            .offload(job(v))
                            .spawn()
                            .expect("spawned")
                            .await
                            .expect("handle"),
                        _ => pool
                            .offload(job(v))
                            .submit()
                            .await
                            .expect("submitted")
                            .await
                            .expect("handle"),
                    };
                    assert_eq!(got, v);
                    sum += 1;
                    if r == 0 && i % 10 == 0 {
                        let h = pool.offload(job(7_000_000 + i)).spawn().expect("crossing");
                        to_plain.send(h).expect("plain thread 0 listens");
                    }
                }
                drop(to_plain);
                if r == 1 {
                    let mut rx = from_plain
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .take()
                        .expect("receiver");
                    while let Some(h) = rx.recv().await {
                        let id = h.id();
                        let v = h.await.expect("crossed from a plain thread");
                        assert!(v >= 8_000_000, "{id}: {v}");
                        sum += 1;
                    }
                }
                sum
            })
        }));
    }
    {
        let (pool, job, start) = (pool.clone(), job.clone(), start.clone());
        threads.push(std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            start.wait();
            rt.block_on(async move {
                let mut tasks = Vec::new();
                for t in 0..10u64 {
                    let (pool, job) = (pool.clone(), job.clone());
                    tasks.push(tokio::spawn(async move {
                        for i in 0..PER / 10 {
                            let v = 2_000_000 + t * 1000 + i;
                            assert_eq!(pool.offload(job(v)).await.expect("awaited"), v);
                        }
                    }));
                }
                for t in tasks {
                    t.await.expect("task");
                }
                PER
            })
        }));
    }
    for p in 0..3u64 {
        let (pool, job, start) = (pool.clone(), job.clone(), start.clone());
        let to_runtime = to_runtime.clone();
        threads.push(std::thread::spawn(move || {
            start.wait();
            let mut n = 0;
            for i in 0..PER {
                let v = 3_000_000 + p * 100_000 + i;
                let mut h = pool.offload(job(v)).spawn().expect("spawned");
                let got = if i % 2 == 0 {
                    h.blocking_wait(None)
                } else {
                    match h.blocking_wait(Some(HANG)) {
                        Ok(v) => Ok(v),
                        Err(e) => panic!("{e}"),
                    }
                };
                assert_eq!(got.expect("plain"), v);
                n += 1;
                if p == 1 && i % 10 == 0 {
                    let h = pool.offload(job(8_000_000 + i)).spawn().expect("crossing");
                    to_runtime.send(h).expect("runtime 1 listens");
                }
            }
            n
        }));
    }
    drop(to_plain);
    drop(to_runtime);
    // Plain thread 0's other job: wait on handles spawned on runtime 0.
    let crossing = std::thread::spawn(move || {
        let mut n = 0;
        while let Ok(mut h) = from_runtime.recv_timeout(HANG) {
            let v = h.blocking_wait(None).expect("crossed from a runtime");
            assert!(v >= 7_000_000);
            n += 1;
        }
        n
    });
    let total: u64 = threads
        .into_iter()
        .map(|t| t.join().expect("a user thread failed"))
        .sum::<u64>()
        + crossing.join().expect("crossing thread");
    let crossed = PER / 10 * 2;
    assert_eq!(total, 6 * PER + crossed);
    pool.shutdown();
    assert!(
        pool.blocking_await_termination(Some(HANG)),
        "{:?}",
        pool.metrics()
    );
    let m = pool.metrics();
    assert_closed_books(&m);
    assert_eq!(m.completed, 6 * PER + crossed, "{m:?}");
    assert!(inside.max() <= MAX && m.max_running <= MAX as u64, "{m:?}");
    // A late caller from a plain thread is told why it was refused.
    let late = pool.offload(|_| 0).spawn().expect_err("terminated");
    assert!(
        late.to_string()
            .contains("shutting down and accepts no new jobs"),
        "{late}"
    );
}

/// The last `Offloader` clone dropped inside an async task, with a job
/// running (held on a gate) and one queued: the drop returns at once (it
/// does not wait for the job), queued work still runs, the handles
/// resolve, and the pool's threads exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_offloader_dropped_inside_an_async_task() {
    let (g, hold) = gate();
    let (dropped_tx, dropped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let pool = builder(1, DEFAULT_QUEUE_CAPACITY)
            .thread_name("fault-lastdrop")
            .build()
            .expect("valid configuration");
        let (tx, mut running) = signal();
        let first = pool
            .offload(move |_| {
                let _ = tx.send(());
                hold.wait();
                1
            })
            .spawn()
            .expect("accepted");
        let queued = pool
            .offload(|_| 2)
            .name("queued")
            .spawn()
            .expect("accepted");
        recv("the held job", &mut running).await;
        drop(pool);
        let _ = dropped_tx.send(());
        (first.await, queued.await)
    });
    within("the drop returns while a job is held", dropped)
        .await
        .expect("the task reports the drop");
    g.open();
    let (first, queued) = within("the task", task).await.expect("task");
    assert_eq!(first.expect("held job"), 1);
    assert_eq!(queued.expect("queued job still runs after the drop"), 2);
    threads_exit("fault-lastdrop").await;
}

/// The same on a current-thread runtime, where a blocking drop would
/// block the only thread: a watchdog fails the test instead of hanging.
#[tokio::test(flavor = "current_thread")]
async fn the_last_offloader_dropped_inside_a_task_on_a_current_thread_runtime() {
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if done_rx.recv_timeout(HANG).is_err() {
            eprintln!("the last Offloader's drop blocked a current-thread runtime");
            std::process::exit(101);
        }
    });
    let (g, hold) = gate();
    let task = tokio::spawn(async move {
        let pool = builder(1, DEFAULT_QUEUE_CAPACITY)
            .thread_name("fault-lastdrop1")
            .build()
            .expect("valid configuration");
        let first = pool
            .offload(move |_| {
                hold.wait();
                1
            })
            .spawn()
            .expect("accepted");
        let queued = pool.offload(|_| 2).spawn().expect("accepted");
        drop(pool);
        (first, queued)
    });
    let (first, queued) = task.await.expect("task");
    let _ = done_tx.send(());
    watchdog.join().expect("watchdog");
    g.open();
    assert_eq!(within("first", first).await.unwrap(), 1);
    assert_eq!(within("queued", queued).await.unwrap(), 2);
    threads_exit("fault-lastdrop1").await;
}

/// The last clone is captured by a job's function, so it is dropped on a
/// worker thread when the function returns: the pool shuts down from its
/// own worker without deadlock, and its threads exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_offloader_dropped_by_its_own_job_on_a_worker() {
    let pool = builder(2, DEFAULT_QUEUE_CAPACITY)
        .thread_name("fault-selfdrop")
        .build()
        .expect("valid configuration");
    let clone = pool.clone();
    let h = pool
        .offload(move |_| {
            let keep = clone;
            assert!(!keep.is_shutdown());
            5
        })
        .spawn()
        .expect("accepted");
    drop(pool);
    assert_eq!(
        within("the job holding the last clone", h).await.unwrap(),
        5
    );
    threads_exit("fault-selfdrop").await;
}

// ---------------------------------------------------------------------------
// 4. A million handles dropped without being awaited

const MILLION_CHILD: &str = "child_a_million_dropped_handles";
/// The full million: about 4 s in a debug build on a 2-core machine
/// (0.7 s per 200 000), so there is no need to cut it down.
const MILLION: u64 = 1_000_000;
/// RSS may stay this much above the start once the pool is idle again.
const RSS_SLACK_KIB: u64 = 16 * 1024;

/// Runs [`child_a_million_dropped_handles`] in a child process, so that
/// the RSS it measures is not shared with the other tests of this binary.
#[test]
fn a_million_handles_dropped_without_being_awaited() {
    let out = run_child(MILLION_CHILD, None);
    let line = out
        .lines()
        .find(|l| l.contains("handles dropped: "))
        .unwrap_or_else(|| panic!("no figures from the child:\n{out}"));
    assert!(
        line.contains(&format!("handles dropped: {MILLION}")),
        "{line}"
    );
}

#[test]
#[ignore = "runs in a child process started by a_million_handles_dropped_without_being_awaited"]
fn child_a_million_dropped_handles() {
    if !in_child(MILLION_CHILD) {
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let pool = pool(4, 4096);
        // Warm-up: threads, the queue's buffer, the allocator's arenas.
        for i in 0..20_000u64 {
            drop(pool.offload(move |_| i).submit().await.expect("room"));
        }
        within("idle after warm-up", pool.idle()).await;
        let rss_start = status_kib("VmRSS:");
        let mut rss_peak = rss_start;
        for i in 0..MILLION {
            let h = pool.offload(move |_| i).submit().await.expect("room");
            if i % 2 == 0 {
                drop(h);
            } else {
                h.detach();
            }
            if i % 50_000 == 0 {
                rss_peak = rss_peak.max(status_kib("VmRSS:"));
                assert_ledger(&pool.metrics());
            }
        }
        within("idle after a million dropped handles", pool.idle()).await;
        let rss_end = status_kib("VmRSS:");
        let m = pool.metrics();
        assert_closed_books(&m);
        assert_eq!(
            (m.accepted, m.completed),
            (20_000 + MILLION, 20_000 + MILLION),
            "{m:?}"
        );
        assert_eq!(within("keeps serving", pool.offload(|_| 9u64)).await.unwrap(), 9);
        println!(
            "handles dropped: {MILLION}; RSS {rss_start} KiB at start, {rss_peak} KiB peak, {rss_end} KiB after idle"
        );
        assert!(
            rss_end <= rss_start + RSS_SLACK_KIB,
            "RSS grew from {rss_start} KiB to {rss_end} KiB"
        );
    });
}
