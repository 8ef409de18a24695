//! Edges of the pool's locked state (`src/state/`) that the other files
//! leave open, found by mutation testing: each test fails on a mutant of a
//! state transition that the rest of the suite let through. Every wait is
//! bounded; events are ordered by gates and signals, never by sleeps.

mod support;

use std::sync::{Arc, Mutex};

use offloader::{EventKind, JobEvent, JobId, JobState, Observer};
use support::*;

/// Records every event it is given.
#[derive(Default)]
struct Log(Mutex<Vec<JobEvent>>);

impl Observer for Log {
    fn on_event(&self, event: &JobEvent) {
        self.0.lock().unwrap().push(event.clone());
    }
}

impl Log {
    fn kinds(&self, id: JobId) -> Vec<EventKind> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.id == id)
            .map(|e| e.kind)
            .collect()
    }
}

/// The observer's delivery thread failing to spawn does not strand the
/// pool: the events wait, the next accepted job spawns the thread again and
/// it delivers them all, and the pool still terminates (a failed spawn must
/// not leave the delivery thread counted as alive: `State::delivery_gone`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_delivery_spawn_is_retried_by_the_next_job() {
    let log = Arc::new(Log::default());
    let pool = builder(1, 4)
        .observer(log.clone())
        .build()
        .expect("valid configuration");
    pool.__fail_next_delivery_spawns(1);
    let first = pool.offload(|_| 1).spawn().expect("accepted");
    let first_id = first.id();
    assert_eq!(within("the first job", first).await.unwrap(), 1);
    // No delivery thread: its three events wait.
    let m = pool.metrics();
    assert_eq!((m.events_delivered, m.events_pending), (0, 3), "{m:?}");

    let second = pool.offload(|_| 2).spawn().expect("accepted");
    let second_id = second.id();
    assert_eq!(within("the second job", second).await.unwrap(), 2);
    pool.shutdown();
    within("termination", pool.terminated()).await;

    let done = [
        EventKind::Accepted,
        EventKind::Started,
        EventKind::Finished(JobState::Completed),
    ];
    assert_eq!(log.kinds(first_id), done);
    assert_eq!(log.kinds(second_id), done);
    let m = pool.metrics();
    assert_eq!((m.events_delivered, m.events_pending), (6, 0), "{m:?}");
    assert_ledger(&m);
}
