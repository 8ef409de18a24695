//! A stop token and a deadline reaching into blocking socket I/O.
//!
//! The example starts a deliberately slow server on `127.0.0.1:0` (plain
//! std threads) and makes three calls to it, each one a blocking
//! `std::net::TcpStream` client running inside an offloaded function:
//!
//! ```text
//! 1. deadline   offload(call "HANG").deadline(now + 300 ms)
//!               set_read_timeout(stop.remaining()) ─ read ──────┤ timed out at the deadline
//! 2. abandon    select! { offload(call "HANG").on_abandon(CancelAndStop), user cancels }
//!               read ──────────┤ the caller drops its future → stop → on_stop: shutdown(Both)
//! 3. normal     offload(call "SLOW 50").with_timeout(2 s)
//!               read ──────┤ "pong after 50 ms"
//! ```
//!
//! The function sets its socket's read timeout from
//! [`StopToken::remaining`], so the deadline bounds every read, and
//! registers [`StopToken::on_stop`] with a `try_clone` of the stream that
//! shuts the socket down, so a stop request wakes a read that is blocked in
//! the kernel right now. Every event is ordered by the server's own reports
//! (a gate), never by sleeps; only the server sleeps, to be slow.
//!
//! Run with `cargo run --release --example blocking_socket`. Exits with
//! status 1 if any call did not end the way it demonstrates.

use std::future::IntoFuture;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use offloader::{AbandonPolicy, Offloader, StopToken};
use tokio::sync::mpsc;

/// The deadline given to call 1.
const DEADLINE: Duration = Duration::from_millis(300);

/// How long the server takes to answer call 3.
const SLOW_REPLY: Duration = Duration::from_millis(50);

/// How soon after the deadline, or after the stop request, a function must
/// have returned. Generous: both take well under a millisecond here.
const SLACK: Duration = Duration::from_millis(200);

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

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

async fn run() -> Res<()> {
    let (server, mut seen) = SlowServer::start()?;
    let pool = Offloader::builder()
        .max_in_flight(4)
        .thread_name("socket-client")
        .build()?;
    let addr = server.addr;
    // Every function reports when it returned and whether stop had been
    // requested, whether or not its caller is still there to hear it.
    let (report_tx, mut reports) = mpsc::unbounded_channel::<Report>();
    let traced = move |name: &'static str, request: String| {
        let report_tx = report_tx.clone();
        move |stop: &StopToken| {
            let result = call(stop, addr, &request);
            let _ = report_tx.send(Report {
                name,
                returned: Instant::now(),
                stop_requested: stop.is_stopped(),
                result: result.as_ref().map(Clone::clone).map_err(clone_err),
            });
            result
        }
    };
    println!("slow server listening on {addr}\n");

    // 1. The deadline bounds the read. The caller has no timeout of its own:
    //    it waits for the function, which gives up at the job's deadline.
    println!("1. deadline: offload(call \"HANG\").deadline(now + {DEADLINE:?})");
    let mut log = Timeline::new();
    let deadline = Instant::now() + DEADLINE;
    log.at(deadline, "the job's deadline");
    let r1 = pool
        .offload(traced("deadline", "HANG".into()))
        .name("deadline")
        .deadline(deadline)
        .await?;
    log.at(Instant::now(), format!("caller got {}", show(&r1)));
    let f1 = reports.recv().await.ok_or("call 1 sent no report")?;
    log.at(
        f1.returned,
        format!(
            "function returned ({:+.1} ms from the deadline; late by the kernel's timer tick and scheduling)",
            after(f1.returned, deadline)
        ),
    );
    log.at(seen.received("HANG").await?, "server: got \"HANG\"");
    log.at(
        seen.closed().await?,
        "server: the client closed the connection",
    );
    log.print();
    match &r1 {
        Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
        other => {
            return Err(format!("call 1: expected a read timed out, got {}", show(other)).into())
        }
    }
    if f1.returned < deadline || f1.returned > deadline + SLACK {
        return Err(format!(
            "call 1: the function returned {:+.1} ms from the deadline",
            after(f1.returned, deadline)
        )
        .into());
    }

    // 2. The caller abandons; CancelAndStop requests stop; the on_stop
    //    callback shuts the socket down and the blocked read returns at once.
    //    "The user cancels" as soon as the server has the request: a gate.
    println!(
        "\n2. abandon: select! {{ offload(call \"HANG\").with_timeout(5 s).on_abandon(CancelAndStop), user cancels }}"
    );
    let mut log = Timeline::new();
    let abandoned_call = pool
        .offload(traced("abandoned", "HANG".into()))
        .name("abandoned")
        .with_timeout(Duration::from_secs(5))
        .on_abandon(AbandonPolicy::CancelAndStop)
        .into_future();
    // Boxed, so that `drop` below really drops the future (a `pin!`ned one
    // would live on until the end of the scope).
    let mut abandoned_call = Box::pin(abandoned_call);
    let received = tokio::select! {
        _ = &mut abandoned_call => {
            return Err("call 2: the call finished before the user cancelled".into())
        }
        received = seen.received("HANG") => received?,
    };
    log.at(received, "server: got \"HANG\"; the user cancels");
    let dropped_at = Instant::now();
    log.at(
        dropped_at,
        "caller: drops the offload future (its own timeout was 5 s)",
    );
    drop(abandoned_call);
    let f2 = reports.recv().await.ok_or("call 2 sent no report")?;
    log.at(
        f2.returned,
        format!(
            "function returned {} ({:+.1} ms from the drop), stop requested: {}",
            show(&f2.result),
            after(f2.returned, dropped_at),
            f2.stop_requested
        ),
    );
    log.at(
        seen.closed().await?,
        "server: the client closed the connection",
    );
    log.print();
    match &f2.result {
        Err(e) if e.kind() == io::ErrorKind::ConnectionAborted && f2.stop_requested => {}
        other => {
            return Err(format!(
                "call 2: expected the socket shut down by the stop request, got {}",
                show(other)
            )
            .into())
        }
    }
    if f2.returned > dropped_at + SLACK {
        return Err(format!(
            "call 2: returned {:.1} ms after the caller left",
            after(f2.returned, dropped_at)
        )
        .into());
    }

    // 3. A call that completes normally, well within its caller's timeout.
    let slow = SLOW_REPLY.as_millis();
    println!("\n3. normal: offload(call \"SLOW {slow}\").with_timeout(2 s)");
    let mut log = Timeline::new();
    let r3 = pool
        .offload(traced("normal", format!("SLOW {slow}")))
        .name("normal")
        .with_timeout(Duration::from_secs(2))
        .await?;
    log.at(Instant::now(), format!("caller got {}", show(&r3)));
    log.at(
        seen.received(&format!("SLOW {slow}")).await?,
        format!("server: got \"SLOW {slow}\"; sleeping {slow} ms"),
    );
    log.at(
        seen.closed().await?,
        "server: the client closed the connection",
    );
    let f3 = reports.recv().await.ok_or("call 3 sent no report")?;
    log.at(f3.returned, "function returned");
    log.print();
    if !matches!(&r3, Ok(reply) if reply.starts_with("pong")) {
        return Err(format!("call 3: expected a pong, got {}", show(&r3)).into());
    }

    pool.idle().await;
    let m = pool.metrics();
    println!(
        "\nmetrics: accepted {}, completed {}, running {}, callers dropped {}, stop requests {}",
        m.accepted, m.completed, m.running, m.callers_dropped, m.stop_requests
    );
    if m.running != 0
        || m.completed != 3
        || m.stop_requests != 1
        || m.accepted != m.queued + m.running + m.terminal()
    {
        return Err(format!("unexpected metrics: {m:?}").into());
    }
    for f in [&f1, &f2, &f3] {
        println!("  {:<9} -> {}", f.name, show(&f.result));
    }
    let report = pool
        .close(Duration::from_secs(1), Duration::from_secs(1))
        .await;
    println!("{report}");
    server.stop()?;
    Ok(())
}

/// What a function reports about itself.
struct Report {
    name: &'static str,
    returned: Instant,
    stop_requested: bool,
    result: io::Result<String>,
}

fn clone_err(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}

/// Lines stamped with the instant they describe, printed in time order.
struct Timeline {
    t0: Instant,
    lines: Vec<(Instant, String)>,
}

impl Timeline {
    fn new() -> Self {
        Timeline {
            t0: Instant::now(),
            lines: Vec::new(),
        }
    }

    fn at(&mut self, when: Instant, line: impl Into<String>) {
        self.lines.push((when, line.into()));
    }

    fn print(mut self) {
        self.lines.sort_by_key(|(when, _)| *when);
        for (when, line) in self.lines {
            println!("  [{:>6.1} ms] {line}", after(when, self.t0));
        }
    }
}

/// The blocking client: one request line, one reply line.
///
/// The read timeout comes from the token's deadline, and a stop request
/// shuts the socket down, waking a read blocked in the kernel.
fn call(stop: &StopToken, addr: SocketAddr, request: &str) -> io::Result<String> {
    let stream = TcpStream::connect(addr)?;
    let killer = stream.try_clone()?;
    // Keep the guard alive while the socket is in use. If stop was already
    // requested, the callback runs right here and every read below fails.
    let _shutdown_on_stop = stop.on_stop(move || {
        let _ = killer.shutdown(Shutdown::Both);
    });

    // `set_read_timeout(Some(Duration::ZERO))` is an error, so a deadline
    // that has already passed is answered here.
    let read_timeout = match stop.remaining() {
        Some(left) if left.is_zero() => return Err(deadline_passed()),
        other => other,
    };
    stream.set_read_timeout(read_timeout)?;

    (&stream).write_all(format!("{request}\n").as_bytes())?;
    let mut reply = String::new();
    match BufReader::new(&stream).read_line(&mut reply) {
        // A read timeout is `WouldBlock` on Unix and `TimedOut` on Windows.
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Err(deadline_passed())
        }
        Err(e) => Err(e),
        Ok(0) if stop.is_stopped() => Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "the socket was shut down by the stop request",
        )),
        Ok(0) => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the server closed the connection",
        )),
        Ok(_) => Ok(reply.trim_end().to_owned()),
    }
}

fn deadline_passed() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "read timed out: the job's deadline passed",
    )
}

fn show(r: &io::Result<String>) -> String {
    match r {
        Ok(s) => format!("Ok({s:?})"),
        Err(e) => format!("Err({:?}: {e})", e.kind()),
    }
}

/// Milliseconds from `earlier` to `later`, negative if `later` is earlier.
fn after(later: Instant, earlier: Instant) -> f64 {
    match later.checked_duration_since(earlier) {
        Some(d) => d.as_secs_f64() * 1e3,
        None => -(earlier.duration_since(later).as_secs_f64() * 1e3),
    }
}

/// What the server saw, in order.
enum Seen {
    Received(String, Instant),
    Closed(Instant),
}

/// The async side of the server's reports.
struct ServerLog(mpsc::UnboundedReceiver<Seen>);

impl ServerLog {
    async fn next(&mut self) -> Res<Seen> {
        Ok(self.0.recv().await.ok_or("the server stopped reporting")?)
    }

    /// Waits for the server to have received `want`.
    async fn received(&mut self, want: &str) -> Res<Instant> {
        loop {
            if let Seen::Received(line, at) = self.next().await? {
                if line == want {
                    return Ok(at);
                }
            }
        }
    }

    /// Waits for the server to see a client close its connection.
    async fn closed(&mut self) -> Res<Instant> {
        loop {
            if let Seen::Closed(at) = self.next().await? {
                return Ok(at);
            }
        }
    }
}

/// A deliberately slow line server on loopback.
///
/// `SLOW <ms>` is answered with `pong after <ms> ms` after sleeping that
/// long; `HANG` is never answered: the server just waits for the client to
/// go away. Each connection is served by its own thread.
struct SlowServer {
    addr: SocketAddr,
    stopping: Arc<AtomicBool>,
    acceptor: thread::JoinHandle<()>,
}

impl SlowServer {
    fn start() -> io::Result<(SlowServer, ServerLog)> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let (tx, rx) = mpsc::unbounded_channel();
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = stopping.clone();
        let acceptor = thread::Builder::new()
            .name("slow-server".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let tx = tx.clone();
                    let _ = thread::Builder::new()
                        .name("slow-server-conn".into())
                        .spawn(move || serve(conn, tx));
                }
            })?;
        Ok((
            SlowServer {
                addr,
                stopping,
                acceptor,
            },
            ServerLog(rx),
        ))
    }

    /// Stops accepting and joins the acceptor thread.
    fn stop(self) -> Res<()> {
        self.stopping.store(true, Ordering::SeqCst);
        // Wake the blocked accept().
        let _ = TcpStream::connect(self.addr);
        self.acceptor
            .join()
            .map_err(|_| "the server thread panicked")?;
        Ok(())
    }
}

fn serve(conn: TcpStream, seen: mpsc::UnboundedSender<Seen>) {
    let mut reader = BufReader::new(&conn);
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let request = line.trim_end().to_owned();
    let _ = seen.send(Seen::Received(request.clone(), Instant::now()));
    if let Some(ms) = request.strip_prefix("SLOW ") {
        let ms: u64 = ms.parse().unwrap_or(0);
        thread::sleep(Duration::from_millis(ms)); // the server is slow: that's the point
        let _ = (&conn).write_all(format!("pong after {ms} ms\n").as_bytes());
    }
    // Wait for the client to go away (EOF or error), then report it.
    let mut rest = String::new();
    while matches!(reader.read_line(&mut rest), Ok(n) if n > 0) {
        rest.clear();
    }
    let _ = seen.send(Seen::Closed(Instant::now()));
}
