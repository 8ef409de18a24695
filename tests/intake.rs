//! The intake (src/intake.rs): plain jobs accepted without the pool lock.

mod support;

use support::*;

#[tokio::test]
async fn a_plain_job_offered_after_a_shutdown_is_refused() {
    let pool = pool(1, 16);
    within("a first job", pool.offload(|_stop| ()))
        .await
        .expect("runs");
    pool.shutdown();
    let refused = pool
        .offload(|_stop| ())
        .spawn()
        .expect_err("refused after shutdown");
    assert!(matches!(
        refused.reason(),
        offloader::Rejected::ShuttingDown
    ));
}
