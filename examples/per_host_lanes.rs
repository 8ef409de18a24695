//! Per-host lanes: calls keyed by host with `max_per_key(2)`, so a slow
//! host's calls queue in their own lane while the other hosts' calls keep
//! flowing.
//!
//! Three local "hosts" (std threads on `127.0.0.1:0`) answer one line per
//! connection. `slow` holds every answer until this program lets it go;
//! `fast-a` and `fast-b` answer at once. Each call is a blocking
//! `std::net::TcpStream` client inside an offloaded function, keyed by its
//! host. The pool has four permits; six calls to `slow` are submitted
//! first, then six to each fast host.
//!
//! ```text
//! without keys: slow slow slow slow | 4 permits held, 12 fast calls stuck behind
//! with keys:    slow slow  fast-a fast-b ... | slow's other 4 wait in its lane
//! ```
//!
//! Only the calls' own blocking I/O orders anything: the slow host cannot
//! answer until every fast call has, so the fast calls can only finish if
//! the slow host's calls did not take every permit.
//!
//! Run with `cargo run --release --example per_host_lanes`. Exits with
//! status 1 if a fast call did not finish while the slow host's calls
//! waited, or the slow host ever served more than two calls at once.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use offloader::{JobHandle, Offloader, StopToken};

/// How many calls go to each host.
const CALLS: usize = 6;
/// Calls of one host that may run at once.
const PER_HOST: usize = 2;
/// The slow host answers by itself after this long, so that nothing here
/// can hang for good.
const GUARD: Duration = Duration::from_secs(20);

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Res<()> {
    println!("without keys:");
    let stuck = round(false).await?;
    println!("\nwith keys (max_per_key({PER_HOST})):");
    let flowed = round(true).await?;
    let mut failures = Vec::new();
    if stuck.fast_done_while_slow_held != 0 {
        failures.push(format!(
            "without keys, {} fast calls finished while the slow host held every permit",
            stuck.fast_done_while_slow_held
        ));
    }
    if flowed.fast_done_while_slow_held != 2 * CALLS {
        failures.push(format!(
            "with keys, only {} of {} fast calls finished while the slow host's calls waited",
            flowed.fast_done_while_slow_held,
            2 * CALLS
        ));
    }
    if flowed.slow_at_once > PER_HOST {
        failures.push(format!(
            "the slow host served {} calls at once, more than {PER_HOST}",
            flowed.slow_at_once
        ));
    }
    if failures.is_empty() {
        println!("\nok: the slow host's calls queued in their lane; the fast hosts' calls flowed");
        Ok(())
    } else {
        Err(failures.join("; ").into())
    }
}

/// What one round showed.
struct Round {
    fast_done_while_slow_held: usize,
    slow_at_once: usize,
}

/// Submits the calls, with or without keys, and reports what finished
/// while the slow host held its answers.
async fn round(keyed: bool) -> Res<Round> {
    let mut builder = Offloader::builder()
        .max_in_flight(4)
        .thread_name("host-client");
    if keyed {
        builder = builder.max_per_key(PER_HOST);
    }
    let pool = builder.build()?;
    let slow = Host::serve("slow", true)?;
    let fast = [Host::serve("fast-a", false)?, Host::serve("fast-b", false)?];
    let began = Instant::now();
    let call = |host: &Host| -> Res<JobHandle<io::Result<String>>> {
        let (name, addr) = (host.name, host.addr);
        let offload = pool.offload(move |stop: &StopToken| fetch(stop, addr, name));
        let offload = if keyed { offload.key(name) } else { offload };
        Ok(offload.spawn()?)
    };
    let slow_calls = (0..CALLS).map(|_| call(&slow)).collect::<Res<Vec<_>>>()?;
    let mut fast_calls = Vec::new();
    for _ in 0..CALLS {
        for host in &fast {
            fast_calls.push(call(host)?);
        }
    }
    // The fast calls can finish only on permits the slow host's calls left:
    // with keys they all should, soon; without, none can, and a short look
    // shows it.
    let patience = if keyed {
        GUARD / 2
    } else {
        Duration::from_millis(300)
    };
    let mut fast_done = 0;
    for h in fast_calls.iter_mut() {
        match tokio::time::timeout(patience, h).await {
            Ok(Ok(Ok(_))) => fast_done += 1,
            Ok(other) => return Err(format!("a fast call failed: {other:?}").into()),
            Err(_) => break,
        }
    }
    let m = pool.metrics();
    println!(
        "  {fast_done} of {} fast calls done at {:.0} ms while the slow host held its answers; running {}, queued {}",
        2 * CALLS,
        began.elapsed().as_secs_f64() * 1e3,
        m.running,
        m.queued
    );
    for s in pool.key_stats(3) {
        println!(
            "    lane {:<7} running {} queued {} (limit {})",
            s.key.to_string(),
            s.running,
            s.queued,
            s.limit
        );
    }
    slow.release();
    // The fast calls awaited above already gave their outcomes.
    for h in slow_calls
        .into_iter()
        .chain(fast_calls.into_iter().skip(fast_done))
    {
        h.await??;
    }
    println!(
        "  all {} calls done at {:.0} ms; the slow host served at most {} at once",
        3 * CALLS,
        began.elapsed().as_secs_f64() * 1e3,
        slow.max_at_once()
    );
    Ok(Round {
        fast_done_while_slow_held: fast_done,
        slow_at_once: slow.max_at_once(),
    })
}

/// One blocking call: connect, ask, read the one-line answer. A stop
/// request shuts the socket down, which ends a read blocked in the kernel.
fn fetch(stop: &StopToken, addr: SocketAddr, host: &str) -> io::Result<String> {
    let mut stream = TcpStream::connect(addr)?;
    let closer = stream.try_clone()?;
    let _shut = stop.on_stop(move || {
        let _ = closer.shutdown(Shutdown::Both);
    });
    writeln!(stream, "GET / HTTP/1.0 host={host}")?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    Ok(line.trim_end().to_owned())
}

/// A local host: a listener thread, one thread per connection.
struct Host {
    name: &'static str,
    addr: SocketAddr,
    gate: Arc<(Mutex<bool>, Condvar)>,
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
}

impl Host {
    /// Serves `name`; a `slow` host holds each answer until released.
    fn serve(name: &'static str, slow: bool) -> io::Result<Host> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let host = Host {
            name,
            addr: listener.local_addr()?,
            gate: Arc::new((Mutex::new(!slow), Condvar::new())),
            now: Arc::default(),
            max: Arc::default(),
        };
        let (gate, now, max) = (host.gate.clone(), host.now.clone(), host.max.clone());
        thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (gate, now, max) = (gate.clone(), now.clone(), max.clone());
                thread::spawn(move || {
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    max.fetch_max(n, Ordering::SeqCst);
                    // The call counts as served until its answer is about
                    // to leave: once the client has the answer, its job can
                    // end and the next call connect, before this thread
                    // would run again.
                    let _ = answer(conn, name, &gate, || {
                        now.fetch_sub(1, Ordering::SeqCst);
                    });
                });
            }
        });
        Ok(host)
    }

    /// Lets a slow host answer.
    fn release(&self) {
        let (open, changed) = &*self.gate;
        *open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        changed.notify_all();
    }

    fn max_at_once(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }
}

/// Reads the request line, waits for the gate (or the guard), calls
/// `served`, answers.
fn answer(
    conn: TcpStream,
    name: &str,
    gate: &(Mutex<bool>, Condvar),
    served: impl FnOnce(),
) -> io::Result<()> {
    let mut request = String::new();
    let asked = conn
        .try_clone()
        .and_then(|c| BufReader::new(c).read_line(&mut request));
    let (open, changed) = gate;
    let held = open.lock().unwrap_or_else(|e| e.into_inner());
    drop(
        changed
            .wait_timeout_while(held, GUARD, |open| !*open)
            .unwrap_or_else(|e| e.into_inner()),
    );
    served();
    asked?;
    let mut conn = conn;
    writeln!(conn, "200 OK from {name}")
}
