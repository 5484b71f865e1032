//! `/livez` by progress: an attempt that never ends is named, waiting out failures
//! between attempts is not.

use std::time::Duration;

use axum::http::StatusCode;
use saga::Outcome;
use saga::consumer::ConsumerSettings;
use saga::probes::{Probes, Progress, router};
use saga_testkit::{TestKafka, eventually};
use serde_json::Value;

use crate::recorder::Recorder;
use crate::run::{WAIT, settings, start_with, transient};

/// Far above an attempt of this handler (microseconds), far below the test's patience.
const STALL_AFTER: Duration = Duration::from_millis(500);

async fn livez(probes: Probes) -> (StatusCode, Value) {
    saga_testkit::get_json(router(probes), "/livez").await
}

#[tokio::test]
async fn a_handler_stuck_in_one_attempt_fails_liveness_naming_its_partition_and_retries_do_not() {
    let handler = Recorder::new(|event, attempt| {
        Box::pin(async move {
            match event.id.as_str() {
                "stuck" => std::future::pending().await,
                "flaky" if attempt <= 4 => Err(transient()),
                _ => Ok(Outcome::Applied),
            }
        })
    });
    let progress = Progress::default();
    let watched = progress.clone();
    let run = start_with(TestKafka::new().await, handler.clone(), move |kafka| {
        ConsumerSettings {
            progress: watched.clone(),
            ..settings(kafka)
        }
    })
    .await;
    let probes = Probes::database(run.db.pool.clone()).progress(progress, STALL_AFTER);

    // Four failures, with backoff between them, last longer than the bound together:
    // live at every look.
    run.produce(1, "flaky").await;
    eventually(WAIT, "the flaky record to be applied", || async {
        let (status, body) = livez(probes.clone()).await;
        assert_eq!(status, StatusCode::OK, "retrying is progress: {body}");
        handler
            .applied()
            .contains(&"flaky".to_owned())
            .then_some(())
    })
    .await;
    assert_eq!(handler.attempts("flaky"), 5);

    run.produce(0, "stuck").await;
    let body = eventually(WAIT, "/livez to turn 503", || async {
        let (status, body) = livez(probes.clone()).await;
        (status == StatusCode::SERVICE_UNAVAILABLE).then_some(body)
    })
    .await;
    assert_eq!(body["status"], "stalled");
    let stalled = body["stalled"].as_array().expect("a list of stalled work");
    assert_eq!(stalled.len(), 1, "{body}");
    assert_eq!(
        stalled[0]["work"],
        format!("consumer {}[0]", run.kafka.topics.orders)
    );
    // A stop waits for the record in hand, which never finishes here.
    run.shutdown.cancel();
    run.task.abort();
}
