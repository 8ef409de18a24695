//! What people read: error messages, states and reports say what happened to
//! the job (ARCHITECTURE inv. 2), with its id, its state and its fate.

mod support;

use std::future::IntoFuture;
use std::time::Duration;

use offloader::{AbandonPolicy, Error, JobState, DEFAULT_QUEUE_CAPACITY};
use support::{eventually, gate, occupy, pool, recv, signal, within};

#[test]
fn job_states_read_as_what_happened() {
    let cases = [
        (JobState::Queued, "queued (not started)"),
        (JobState::Running, "running"),
        (JobState::Completed, "completed"),
        (JobState::Panicked, "panicked"),
        (JobState::Cancelled, "cancelled before start"),
        (JobState::Unstarted, "returned unstarted at shutdown"),
    ];
    for (state, text) in cases {
        assert_eq!(state.to_string(), text);
        assert_eq!(
            state.is_terminal(),
            !matches!(state, JobState::Queued | JobState::Running)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_names_the_job_its_state_and_its_fate_and_the_job_outlives_its_caller() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let (open, hold) = gate();
    let (started_tx, mut started) = signal::<()>();
    let running = pool
        .offload(move |_stop| {
            let _ = started_tx.send(());
            hold.wait();
        })
        .name("slow")
        .with_timeout(Duration::from_millis(30))
        .on_abandon(AbandonPolicy::Keep);
    let caller = tokio::spawn(running.into_future());
    recv("started", &mut started).await;
    // The function may start before its caller's first poll has registered
    // the wait (a spinning caller is not registered yet).
    eventually("the caller registers its wait", || {
        pool.running_jobs()
            .first()
            .is_some_and(|j| j.caller_waiting)
    })
    .await;
    // While the caller still waits, the job has not outlived anybody.
    let before = pool.running_jobs();
    assert_eq!(before.len(), 1);
    assert!(
        before[0].caller_waiting && !before[0].caller_left,
        "{before:?}"
    );

    let err = within("the caller's timeout", caller)
        .await
        .expect("task")
        .unwrap_err();
    let id = err.job_id().expect("accepted");
    let text = err.to_string();
    assert!(text.contains(&format!("job #{}", id.as_u64())), "{text}");
    assert!(text.contains("it was still running"), "{text}");
    assert!(text.contains("goes on under its owner"), "{text}");
    assert!(text.contains("ms"), "{text}");

    let after = pool.running_jobs();
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].id, id);
    assert!(
        after[0].caller_left && !after[0].caller_waiting,
        "{after:?}"
    );
    open.open();
    within("idle", pool.idle()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawned_job_whose_owner_keeps_its_handle_has_not_lost_its_caller() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let job = occupy(&pool, 1).await;
    let listed = pool.running_jobs();
    assert!(
        listed[0].caller_waiting && !listed[0].caller_left,
        "{listed:?}"
    );
    job.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_panicked_and_unstarted_errors_say_the_function_never_ran_or_how_it_ended() {
    let pool = pool(1, DEFAULT_QUEUE_CAPACITY);
    let busy = occupy(&pool, 1).await;
    let queued = pool.offload(|_stop| ()).spawn().expect("room");
    assert!(queued.cancel());
    let text = within("cancelled", queued).await.unwrap_err().to_string();
    assert!(
        text.contains("cancelled before it started") && text.contains("never ran"),
        "{text}"
    );

    let later = pool
        .offload(|_stop| ())
        .name("later")
        .spawn()
        .expect("room");
    let unstarted = pool.shutdown_now();
    assert_eq!(unstarted.len(), 1);
    let text = within("unstarted", later).await.unwrap_err().to_string();
    assert!(
        text.contains("never started") && text.contains("shut down immediately"),
        "{text}"
    );
    busy.release().await;

    let pool = support::pool(1, DEFAULT_QUEUE_CAPACITY);
    let err = pool
        .offload(|_stop| -> () { panic!("on purpose: disk on fire") })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Panicked { message, .. } if message == "on purpose: disk on fire")
    );
    let text = err.to_string();
    assert!(
        text.contains("panicked: on purpose: disk on fire") && text.contains("permit was released"),
        "{text}"
    );
}
