//! The error type answers a caller's questions (issue 33, item 1): each
//! real refusal and failure answers exactly one predicate, a refusal goes
//! up with `?` whatever the function captures, and stays downcastable to
//! `offloader::Error` once converted; a chain prints its reason once; a
//! panic's payload comes back.

mod support;

use std::sync::mpsc;

use offloader::{Error, Offloader, StopToken};
use support::*;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The status a service answers, from the predicates alone (the table in
/// `Error`'s docs).
fn status(e: &Error) -> u16 {
    if e.is_busy() || e.is_shutdown() {
        503
    } else if e.is_timeout() {
        504
    } else if e.is_cancelled() {
        499
    } else {
        500
    }
}

/// What `anyhow`'s `{:#}` prints: each message of the chain, joined.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut next = e.source();
    while let Some(s) = next {
        parts.push(s.to_string());
        next = s.source();
    }
    parts.join(": ")
}

/// Which predicates `e` answers, by name.
fn answers(e: &Error) -> Vec<&'static str> {
    [
        (e.is_busy(), "busy"),
        (e.is_timeout(), "timeout"),
        (e.is_shutdown(), "shutdown"),
        (e.is_cancelled(), "cancelled"),
        (e.is_panic(), "panic"),
    ]
    .into_iter()
    .filter_map(|(yes, name)| yes.then_some(name))
    .collect()
}

/// A handler whose function captures a `Receiver` (not `Sync`) sends a
/// refusal up with `?` into `Box<dyn Error + Send + Sync>` (E0277 before);
/// as it is, it prints its reason once; converted first, it downcasts to
/// `offloader::Error` and answers 503.
#[tokio::test]
async fn a_refusal_goes_up_with_question_mark_and_stays_an_offloader_error() {
    fn spawn_raw(pool: &Offloader) -> Result<(), BoxError> {
        let (_tx, rx) = mpsc::channel::<u8>();
        let job = pool.offload(move |_| rx.try_recv().ok()).spawn()?;
        drop(job);
        Ok(())
    }
    fn spawn_converted(pool: &Offloader) -> Result<(), BoxError> {
        let (_tx, rx) = mpsc::channel::<u8>();
        let job = pool
            .offload(move |_| rx.try_recv().ok())
            .spawn()
            .map_err(Error::from)?;
        drop(job);
        Ok(())
    }
    let pool = pool(1, 1);
    pool.shutdown();
    let reason = "job refused, the function never ran: the offloader is shutting down and accepts no new jobs";

    let raw = spawn_raw(&pool).unwrap_err();
    assert_eq!(chain(raw.as_ref()), reason, "the reason, once");

    let converted = spawn_converted(&pool).unwrap_err();
    assert_eq!(chain(converted.as_ref()), reason, "the reason, once");
    let e = converted
        .downcast_ref::<Error>()
        .expect("a converted refusal downcasts to offloader::Error");
    assert!(matches!(e, Error::ShuttingDown { id: None }), "{e:?}");
    assert_eq!(status(e), 503);
}

/// A `SubmitError` of a function that is not `Sync` is an error that is
/// `Send + Sync + 'static`, debug-printable without `F: Debug`, and gives
/// the function back.
#[tokio::test]
async fn a_submit_error_of_a_non_sync_function_is_a_sync_error() {
    fn static_error<E: std::error::Error + Send + Sync + 'static>(_: &E) {}
    let pool = pool(1, 1);
    pool.shutdown();
    let (tx, rx) = mpsc::channel::<u8>();
    let refused = pool
        .offload(move |_| rx.try_recv().ok())
        .spawn()
        .unwrap_err();
    static_error(&refused);
    assert!(format!("{refused:?}").starts_with("SubmitError"));
    assert!(refused.reason().is_shutdown());
    tx.send(7).unwrap();
    let f = refused.into_inner();
    assert_eq!(f(&StopToken::new()), Some(7), "the function itself, unrun");
}

/// Each real refusal and failure answers exactly one predicate, the one
/// the status table maps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_real_error_answers_exactly_one_predicate() {
    let pool = pool(1, 1);
    let occupied = occupy(&pool, 1).await;
    let queued = pool.offload(|_| ()).spawn().expect("queued");

    // Busy: the queue is full.
    let full = Error::from(pool.offload(|_| ()).spawn().unwrap_err());
    assert_eq!(answers(&full), ["busy"], "{full}");
    assert_eq!(status(&full), 503);

    // Timeout, never accepted: the queue stayed full.
    let waited = within("a wait for room", pool.offload(|_| ()).with_timeout(SHORT))
        .await
        .unwrap_err();
    assert_eq!(answers(&waited), ["timeout"], "{waited}");
    assert_eq!(waited.job_id(), None);
    assert_eq!(status(&waited), 504);

    // Cancelled: before it started, and refused by a stopped group.
    assert!(queued.cancel());
    let cancelled = within("the cancelled job", queued).await.unwrap_err();
    assert_eq!(answers(&cancelled), ["cancelled"], "{cancelled}");
    let group = pool.group();
    group.stop();
    let refused = Error::from(group.offload(|_| ()).spawn().unwrap_err());
    assert_eq!(answers(&refused), ["cancelled"], "{refused}");
    assert_eq!((status(&cancelled), status(&refused)), (499, 499));

    // Shutdown: returned unstarted, then refused.
    let unstarted = pool.offload(|_| ()).spawn().expect("queued");
    let handed_back = pool.shutdown_now();
    assert_eq!(handed_back.len(), 1);
    let unstarted = within("the unstarted job", unstarted).await.unwrap_err();
    assert_eq!(answers(&unstarted), ["shutdown"], "{unstarted}");
    assert!(unstarted.job_id().is_some());
    let after = within("an offload after shutdown", pool.offload(|_| ()))
        .await
        .unwrap_err();
    assert_eq!(answers(&after), ["shutdown"], "{after}");
    assert_eq!((status(&unstarted), status(&after)), (503, 503));
    occupied.release().await;

    // A panic.
    let other = self::pool(1, 1);
    let panicked = within(
        "a panicking job",
        other.offload(|_| -> () { panic!("{ON_PURPOSE}") }),
    )
    .await
    .unwrap_err();
    assert_eq!(answers(&panicked), ["panic"], "{panicked}");
    assert_eq!(status(&panicked), 500);
}

/// The panic's real payload comes back through `into_panic`, to the first
/// wait that gets the error; a later wait on the same handle gets the
/// message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panics_payload_comes_back_to_its_first_wait() {
    #[derive(Debug, PartialEq)]
    struct Payload(u32);
    let pool = pool(1, 1);
    let mut job = pool
        .offload(|_| -> () { std::panic::panic_any(Payload(42)) })
        .spawn()
        .expect("accepted");
    let first = within("the panic", &mut job).await.unwrap_err();
    assert!(first.is_panic(), "{first}");
    let payload = first.into_panic();
    assert_eq!(payload.downcast_ref::<Payload>(), Some(&Payload(42)));
    let later = within("the panic again", job).await.unwrap_err();
    assert!(later.is_panic(), "{later}");
    let message = later.into_panic();
    assert_eq!(
        message.downcast_ref::<String>().map(String::as_str),
        Some("<non-string panic payload>")
    );
}

/// `into_panic` on an error that is not a panic is a program error, and
/// says so.
#[test]
#[should_panic(expected = "not a panic")]
fn into_panic_of_another_error_panics() {
    let pool = pool(1, 1);
    pool.shutdown();
    let e = Error::from(pool.offload(|_| ()).spawn().unwrap_err());
    drop(e.into_panic());
}
