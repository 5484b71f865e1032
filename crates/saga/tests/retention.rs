//! The pruner against a real PostgreSQL, and the inbox's window against a real broker.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic};
use rdkafka::client::DefaultClientContext;
use saga::retention::{CheckError, PRUNER_LOCK, Pace, Pruner, Target, Window, check_inbox_window};
use saga_testkit::{TestDatabase, TestKafka};
use tokio_util::sync::CancellationToken;

const DAY: Duration = Duration::from_secs(86_400);

async fn database() -> TestDatabase {
    TestDatabase::saga_tables_only().await
}

fn pruner(db: &TestDatabase, targets: Vec<Target>, batch: i64) -> Pruner {
    let pace = Pace {
        interval: Duration::from_secs(60),
        batch,
        duty_cycle: 100,
    };
    Pruner::new(&db.url, targets, pace).unwrap()
}

/// A pass that no shutdown interrupts.
fn running() -> CancellationToken {
    CancellationToken::new()
}

/// `n` event ids `<prefix><i>` applied `days_ago` days ago, the lower `i` the older.
async fn applied(db: &TestDatabase, prefix: &str, n: i32, days_ago: i32) {
    db.client()
        .await
        .execute(
            "INSERT INTO processed_events (event_id, processed_at)
             SELECT $1 || i, now() - make_interval(days => $3) + make_interval(secs => i)
               FROM generate_series(1, $2) i",
            &[&prefix, &n, &days_ago],
        )
        .await
        .unwrap();
}

/// `n` outbox rows written 30 days ago and published `published_hours_ago` hours ago, or
/// never.
async fn outbox_rows(db: &TestDatabase, prefix: &str, n: i32, published_hours_ago: Option<i32>) {
    db.client()
        .await
        .execute(
            "INSERT INTO outbox (event_id, topic, key, type, payload, occurred_at, published_at)
             SELECT $1 || i, 'orders', 'k', 'order.created', '{}', now() - interval '30 days',
                    now() - make_interval(hours => $3)
               FROM generate_series(1, $2) i",
            &[&prefix, &n, &published_hours_ago],
        )
        .await
        .unwrap();
}

async fn count(db: &TestDatabase, sql: &str) -> i64 {
    db.count(sql, &[]).await
}

#[tokio::test]
async fn rows_past_their_window_go_newer_ones_and_unpublished_ones_stay() {
    let db = database().await;
    applied(&db, "old-", 300, 20).await;
    applied(&db, "new-", 200, 1).await;
    outbox_rows(&db, "sent-long-ago-", 100, Some(48)).await;
    outbox_rows(&db, "sent-just-now-", 50, Some(1)).await;
    outbox_rows(&db, "never-sent-", 40, None).await;

    let pass = pruner(
        &db,
        vec![Target::inbox(14 * DAY), Target::outbox(DAY)],
        1000,
    )
    .pass(&running())
    .await
    .unwrap();

    assert!(!pass.skipped);
    assert_eq!(pass.deleted("processed_events"), 300);
    assert_eq!(pass.deleted("outbox"), 100);
    let left = "SELECT count(*) FROM processed_events WHERE event_id LIKE 'new-%'";
    assert_eq!(count(&db, left).await, 200);
    assert_eq!(
        count(&db, "SELECT count(*) FROM processed_events").await,
        200
    );
    let recent = "SELECT count(*) FROM outbox WHERE event_id LIKE 'sent-just-now-%'";
    assert_eq!(count(&db, recent).await, 50);
    let unpublished = "SELECT count(*) FROM outbox WHERE published_at IS NULL";
    assert_eq!(
        count(&db, unpublished).await,
        40,
        "an unpublished row was deleted, though 30 days old"
    );
    assert_eq!(count(&db, "SELECT count(*) FROM outbox").await, 90);
}

/// The test holds one old row locked, as a consumer's transaction would; the pruner's
/// batch that reaches it waits. Meanwhile every earlier batch is already committed and its
/// rows are gone for everyone: the prune is a series of short transactions, not one.
#[tokio::test]
async fn a_prune_goes_in_batches_each_committed_before_the_next_begins() {
    let db = database().await;
    applied(&db, "e-", 2050, 20).await;
    let mut client = db.client().await;
    let holder = client.transaction().await.unwrap();
    // The 1201st oldest: in the third batch of 500.
    holder
        .execute(
            "SELECT 1 FROM processed_events WHERE event_id = 'e-1201' FOR UPDATE",
            &[],
        )
        .await
        .unwrap();
    let pruner = pruner(&db, vec![Target::inbox(14 * DAY)], 500);

    let pass = tokio::spawn(async move { pruner.pass(&running()).await.unwrap() });
    db.a_session_waits_on_a_lock().await;

    assert_eq!(
        count(&db, "SELECT count(*) FROM processed_events").await,
        2050 - 1000,
        "the first two batches are committed while the third waits"
    );
    assert!(!pass.is_finished());
    holder.commit().await.unwrap();
    let pass = pass.await.unwrap();
    let batches: Vec<u64> = pass.batches.iter().map(|(_, n)| *n).collect();
    assert_eq!(batches, [500, 500, 500, 500, 50]);
    assert_eq!(count(&db, "SELECT count(*) FROM processed_events").await, 0);
}

/// A service stopping does not wait out a long prune: the pass ends after the batch in
/// hand, and the next pass picks up where it stopped.
#[tokio::test]
async fn a_pass_stops_after_the_batch_in_hand_when_the_service_stops() {
    let db = database().await;
    applied(&db, "e-", 2050, 20).await;
    let stopping = CancellationToken::new();
    stopping.cancel();

    let pass = pruner(&db, vec![Target::inbox(14 * DAY)], 500)
        .pass(&stopping)
        .await
        .unwrap();

    assert!(pass.interrupted);
    assert_eq!(pass.batches, [("processed_events", 500)]);
    assert_eq!(
        count(&db, "SELECT count(*) FROM processed_events").await,
        1550
    );
}

#[tokio::test]
async fn a_pruner_that_finds_another_pruning_skips_its_turn() {
    let db = database().await;
    applied(&db, "e-", 100, 20).await;
    let other = db.client().await;
    other
        .execute("SELECT pg_advisory_lock($1)", &[&PRUNER_LOCK])
        .await
        .unwrap();
    let pruner = pruner(&db, vec![Target::inbox(14 * DAY)], 1000);

    let pass = pruner.pass(&running()).await.unwrap();

    assert!(pass.skipped);
    assert_eq!(pass.deleted("processed_events"), 0);
    assert_eq!(
        count(&db, "SELECT count(*) FROM processed_events").await,
        100
    );
    other
        .execute("SELECT pg_advisory_unlock($1)", &[&PRUNER_LOCK])
        .await
        .unwrap();
    let pass = pruner.pass(&running()).await.unwrap();
    assert!(!pass.skipped);
    assert_eq!(pass.deleted("processed_events"), 100);
}

/// An expired key that a new request takes over while a batch would delete it is checked
/// again as it is then, and kept.
#[tokio::test]
async fn a_row_that_is_young_again_by_the_time_its_batch_reaches_it_is_kept() {
    let db = database().await;
    let mut client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE idempotency_keys (key text PRIMARY KEY, created_at timestamptz NOT NULL);
             INSERT INTO idempotency_keys
             SELECT 'k' || i, now() - interval '2 days' FROM generate_series(1, 10) i",
        )
        .await
        .unwrap();
    let request = client.transaction().await.unwrap();
    request
        .execute(
            "UPDATE idempotency_keys SET created_at = now() WHERE key = 'k5'",
            &[],
        )
        .await
        .unwrap();
    let pruner = pruner(&db, vec![Target::idempotency_keys(DAY)], 1000);

    let pass = tokio::spawn(async move { pruner.pass(&running()).await.unwrap() });
    db.a_session_waits_on_a_lock().await;
    request.commit().await.unwrap();
    let pass = pass.await.unwrap();

    assert_eq!(pass.deleted("idempotency_keys"), 9);
    let left = "SELECT count(*) FROM idempotency_keys WHERE key = 'k5'";
    assert_eq!(count(&db, left).await, 1);
}

async fn topic_with_retention(kafka: &TestKafka, name: &str, retention_ms: &str) -> String {
    let topic = format!("{}{name}", kafka.namespace);
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &kafka.brokers)
        .create()
        .unwrap();
    let new = NewTopic::new(&topic, 1, saga::kafka::BROKER_DEFAULT_REPLICATION)
        .set("retention.ms", retention_ms);
    for result in admin
        .create_topics(&[new], &AdminOptions::new())
        .await
        .unwrap()
    {
        result.unwrap();
    }
    saga::kafka::await_topics(
        &kafka.brokers,
        std::slice::from_ref(&topic),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    topic
}

#[tokio::test]
async fn an_inbox_window_shorter_than_a_topics_retention_is_refused_naming_both() {
    let kafka = TestKafka::new().await;
    let hour = topic_with_retention(&kafka, "one-hour", "3600000").await;
    let two_hours = topic_with_retention(&kafka, "two-hours", "7200000").await;
    let forever = topic_with_retention(&kafka, "forever", "-1").await;
    let topics = [hour.clone(), two_hours.clone()];
    let check = |topics: Vec<String>, window: Window| {
        let brokers = kafka.brokers.clone();
        async move { check_inbox_window(&brokers, &topics, window).await }
    };

    let refused = check(topics.to_vec(), Window::Of(Duration::from_secs(5400)))
        .await
        .unwrap_err();
    let message = refused.to_string();
    assert!(matches!(refused, CheckError::Refused(_)), "{message}");
    for part in [
        "INBOX_RETENTION is 1h 30m",
        &two_hours,
        "up to 2h (retention.ms 7200000)",
        "Set INBOX_RETENTION to at least 2h",
    ] {
        assert!(message.contains(part), "{part:?} not in: {message}");
    }

    let exact = Window::Of(Duration::from_secs(7200));
    assert_eq!(check(topics.to_vec(), exact).await.unwrap(), exact);
    let forever_too = vec![hour.clone(), forever];
    assert_eq!(
        check(forever_too, Window::Of(14 * DAY)).await.unwrap(),
        Window::Off,
        "no window covers a topic that keeps its records for ever: keep every id"
    );
    assert_eq!(
        check(topics.to_vec(), Window::Off).await.unwrap(),
        Window::Off
    );
    let missing = format!("{}no-such-topic", kafka.namespace);
    let unknown = check(vec![hour.clone(), missing.clone()], Window::Of(DAY))
        .await
        .unwrap_err();
    assert!(
        matches!(&unknown, CheckError::UnknownTopic(topic) if *topic == missing),
        "a topic the broker does not serve is waited for, not read as one without \
         retention: {unknown}"
    );
}
