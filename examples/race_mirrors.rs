//! Racing three mirrors with `invoke_any`: the first answer wins, the
//! losers are stopped, and each loser's permit comes back when its function
//! really returns.
//!
//! Three local "mirrors" (plain std threads on `127.0.0.1:0`) answer
//! `GET file` after 20 ms, 5 s and 30 s. Each call is a blocking
//! `std::net::TcpStream` client inside an offloaded function, which
//! registers [`StopToken::on_stop`] with a `try_clone` of its stream that
//! shuts the socket down: when the fast mirror wins, the stop request wakes
//! the two reads blocked in the kernel, and the slow mirrors see their
//! clients hang up.
//!
//! ```text
//! mirror-a (5 s)   read ────────┤ stop → shutdown → returns; permit back
//! mirror-b (20 ms) read ─┤ "file from mirror-b" → wins
//! mirror-c (30 s)  read ────────┤ stop → shutdown → returns; permit back
//! ```
//!
//! The pool's observer records when each job finished, which is when its
//! permit was released. Only the servers sleep, to be slow.
//!
//! Run with `cargo run --release --example race_mirrors`. Exits with
//! status 1 if the fast mirror did not win, a loser was not stopped, or a
//! permit came back before its function returned.

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use offloader::{EventKind, JobEvent, JobId, Observer, Offloader, StopToken};

/// The mirrors and how long each takes to answer.
const MIRRORS: [(&str, Duration); 3] = [
    ("mirror-a", Duration::from_secs(5)),
    ("mirror-b", Duration::from_millis(20)),
    ("mirror-c", Duration::from_secs(30)),
];

/// How soon after the winner a stopped loser must have returned: far less
/// than the slow mirrors' delays (it takes well under a millisecond here).
const SLACK: Duration = Duration::from_secs(1);

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

/// What one fetch reports when its function returns.
struct Returned {
    mirror: &'static str,
    at: Instant,
    stopped: bool,
    result: String,
}

async fn run() -> Res<()> {
    let finished = Arc::new(Finished::default());
    let pool = Offloader::builder()
        .max_in_flight(3)
        .thread_name("mirror-client")
        .observer(finished.clone())
        .build()?;
    let (hung_up_tx, hung_up) = std::sync::mpsc::channel();
    let mut fetches = Vec::new();
    let (returned_tx, returned) = std::sync::mpsc::channel::<Returned>();
    for (name, delay) in MIRRORS {
        let addr = serve(name, delay, hung_up_tx.clone())?;
        println!("{name} listening on {addr}, answers after {delay:?}");
        let returned_tx = returned_tx.clone();
        fetches.push(move |stop: &StopToken| -> io::Result<String> {
            let result = fetch(stop, addr);
            let _ = returned_tx.send(Returned {
                mirror: name,
                at: Instant::now(),
                stopped: stop.is_stopped(),
                result: match &result {
                    Ok(body) => format!("{body:?}"),
                    Err(e) => format!("error: {e}"),
                },
            });
            result
        });
    }
    drop(returned_tx);

    let began = Instant::now();
    let (winner, body) = pool.invoke_any(fetches).await?;
    let won_at = Instant::now();
    let ms = |t: Instant| t.saturating_duration_since(began).as_secs_f64() * 1e3;
    println!(
        "\nwinner: {} with {body:?} at {:.1} ms; permits held right after: {}",
        MIRRORS[winner].0,
        ms(won_at),
        pool.metrics().running
    );
    pool.idle().await;

    let mut failures = Vec::new();
    if MIRRORS[winner].0 != "mirror-b" {
        failures.push(format!(
            "expected mirror-b to win, got {}",
            MIRRORS[winner].0
        ));
    }
    // Jobs are accepted in input order: the i-th id is the i-th mirror's.
    let events = finished.by_job();
    let ids: Vec<JobId> = events.keys().copied().collect();
    let mut reports: BTreeMap<&str, Returned> = BTreeMap::new();
    while let Ok(r) = returned.try_recv() {
        reports.insert(r.mirror, r);
    }
    println!();
    for (i, (name, delay)) in MIRRORS.iter().enumerate() {
        let Some(r) = reports.get(name) else {
            failures.push(format!("{name}: its function never reported"));
            continue;
        };
        let permit_back = ids.get(i).and_then(|id| events.get(id)).copied().flatten();
        println!(
            "{name}: function returned at {:>7.1} ms (stop requested: {}), {}; permit returned at {}",
            ms(r.at),
            r.stopped,
            r.result,
            permit_back.map_or("never".into(), |t| format!("{:.1} ms", ms(t)))
        );
        match permit_back {
            Some(t) if t >= r.at => {}
            Some(_) => failures.push(format!("{name}: permit back before its function returned")),
            None => failures.push(format!("{name}: no finish event")),
        }
        if i == winner {
            continue;
        }
        if !r.stopped {
            failures.push(format!("{name}: the loser was not stopped"));
        }
        if r.at > won_at + SLACK || r.at > began + *delay {
            failures.push(format!(
                "{name}: the loser returned {:.1} ms after the winner",
                (r.at - won_at).as_secs_f64() * 1e3
            ));
        }
    }
    // The servers notice the hang-ups on their own threads: wait (bounded)
    // for the two reports.
    let mut hung_up_on: Vec<&str> = Vec::new();
    while hung_up_on.len() < 2 {
        match hung_up.recv_timeout(Duration::from_secs(5)) {
            Ok(name) => hung_up_on.push(name),
            Err(_) => break,
        }
    }
    hung_up_on.sort_unstable();
    println!("mirrors whose client hung up before the answer: {hung_up_on:?}");
    if hung_up_on != ["mirror-a", "mirror-c"] {
        failures.push(format!(
            "expected mirror-a and mirror-c to see hang-ups, got {hung_up_on:?}"
        ));
    }
    let m = pool.metrics();
    println!(
        "metrics: completed {}, cancelled {}, stop requests {}, running {}",
        m.completed, m.cancelled, m.stop_requests, m.running
    );
    if failures.is_empty() {
        println!("\nok: the fast mirror won; both losers were stopped and their permits came back when their functions returned");
        Ok(())
    } else {
        Err(failures.join("; ").into())
    }
}

/// A blocking fetch whose stop request shuts its socket down.
fn fetch(stop: &StopToken, addr: SocketAddr) -> io::Result<String> {
    let mut stream = TcpStream::connect(addr)?;
    let for_stop = stream.try_clone()?;
    let _on_stop = stop.on_stop(move || {
        let _ = for_stop.shutdown(Shutdown::Both);
    });
    stream.write_all(b"GET file\n")?;
    let mut body = String::new();
    stream.read_to_string(&mut body)?;
    if body.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "no answer (the socket was shut down)",
        ));
    }
    Ok(body)
}

/// A mirror answering every request after `delay`, unless its client hangs
/// up first (then it says so on `hung_up`).
fn serve(
    name: &'static str,
    delay: Duration,
    hung_up: std::sync::mpsc::Sender<&'static str>,
) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let hung_up = hung_up.clone();
            thread::spawn(move || {
                let mut reader = BufReader::new(&stream);
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    return;
                }
                // Waits `delay` for the client to hang up (a read that
                // returns 0); a timeout means it is still there: answer.
                let _ = stream.set_read_timeout(Some(delay));
                let mut byte = [0u8; 1];
                match (&stream).read(&mut byte) {
                    Ok(0) => {
                        let _ = hung_up.send(name);
                    }
                    _ => {
                        let _ = (&stream).write_all(format!("file from {name}").as_bytes());
                    }
                }
            });
        }
    });
    Ok(addr)
}

/// The observer: when each job finished (released its permit).
#[derive(Default)]
struct Finished(Mutex<BTreeMap<JobId, Option<Instant>>>);

impl Observer for Finished {
    fn on_event(&self, event: &JobEvent) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let entry = map.entry(event.id).or_default();
        if let EventKind::Finished(_) = event.kind {
            *entry = Some(event.at);
        }
    }
}

impl Finished {
    fn by_job(&self) -> BTreeMap<JobId, Option<Instant>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
