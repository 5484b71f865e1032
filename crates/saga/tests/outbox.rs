//! The outbox and its relay against the real database and broker.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use rdkafka::message::Message;
use saga::outbox::{self, NewEvent};
use saga::{Envelope, LocalRelay, OutboxRelay, Transaction};
use saga_testkit::{TestDatabase, TestKafka, eventually, header};
use serde_json::json;
use tokio_postgres::{AsyncMessage, NoTls};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(60);

/// Enqueues an `order.created` with `event_id`, caused by the event `cause-<event_id>`.
async fn enqueue(db: &TestDatabase, topic: &str, key: &str, event_id: &str) {
    let client = db.client().await;
    let tx = Transaction::begin(&client);
    outbox::enqueue(
        &tx,
        &NewEvent {
            event_id,
            topic,
            key,
            event_type: "order.created",
            payload: &json!({ "n": event_id }),
            caused_by: Some(&format!("cause-{event_id}")),
        },
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

fn relay(
    db: &TestDatabase,
    kafka: &TestKafka,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    lingering_relay(db, kafka, Duration::ZERO)
}

fn lingering_relay(
    db: &TestDatabase,
    kafka: &TestKafka,
    linger: Duration,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let relay = OutboxRelay::new(&db.url, &kafka.brokers, Duration::from_millis(100))
        .unwrap()
        .linger(linger);
    let shutdown = CancellationToken::new();
    (shutdown.clone(), tokio::spawn(relay.run(shutdown)))
}

/// Waits until `topic` holds `records` records.
async fn on_the_topic(kafka: &TestKafka, topic: &str, records: usize) {
    eventually(WAIT, &format!("{records} records on {topic}"), || async {
        (kafka.read_all(topic).await.len() == records).then_some(())
    })
    .await;
}

async fn all_published(db: &TestDatabase, rows: i64) {
    eventually(
        WAIT,
        &format!("{rows} rows to be marked published"),
        || async {
            let published = db
                .count(
                    "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL",
                    &[],
                )
                .await;
            (published == rows).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn committed_rows_are_published_in_order_keyed_by_order_then_marked_published() {
    let (db, kafka) = tokio::join!(TestDatabase::saga_tables_only(), TestKafka::new());
    let topic = &kafka.topics.orders;
    for n in 0..30 {
        enqueue(
            &db,
            topic,
            &format!("order-{}", n % 3),
            &format!("event-{n:02}"),
        )
        .await;
    }
    let (stop, task) = relay(&db, &kafka);

    all_published(&db, 30).await;

    let records = kafka.read_all(topic).await;
    assert_eq!(records.len(), 30);
    let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for record in &records {
        let key = String::from_utf8(record.key().unwrap().to_vec()).unwrap();
        let envelope = Envelope::from_slice(record.payload().unwrap()).unwrap();
        assert_eq!(envelope.aggregate_id, key);
        assert_eq!(header(record, "event_id").unwrap(), envelope.id);
        assert_eq!(
            header(record, "event_type").as_deref(),
            Some("order.created")
        );
        assert_eq!(
            header(record, "causation_id").unwrap(),
            format!("cause-{}", envelope.id)
        );
        by_key.entry(key).or_default().push(envelope.id);
    }
    for (key, ids) in by_key {
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted, "{key}'s events out of order");
        assert_eq!(ids.len(), 10);
    }
    stop.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_rolled_back_transaction_publishes_nothing() {
    let (db, kafka) = tokio::join!(TestDatabase::saga_tables_only(), TestKafka::new());
    let topic = &kafka.topics.orders;
    {
        let client = db.client().await;
        let tx = Transaction::begin(&client);
        let event = NewEvent {
            event_id: "never",
            topic,
            key: "k",
            event_type: "order.created",
            payload: &json!({}),
            caused_by: None,
        };
        outbox::enqueue(&tx, &event).await.unwrap();
        // Sends the BEGIN and the pipelined insert with it; the drop then rolls back.
        tx.execute("SELECT 1", &[]).await.unwrap();
        drop(tx);
    }
    enqueue(&db, topic, "k", "committed").await;
    let (stop, task) = relay(&db, &kafka);

    all_published(&db, 1).await;

    let ids: Vec<String> = kafka
        .read_all(topic)
        .await
        .iter()
        .map(|r| header(r, "event_id").unwrap())
        .collect();
    assert_eq!(ids, ["committed"]);
    stop.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_second_event_with_the_same_id_is_refused_by_the_database() {
    let db = TestDatabase::saga_tables_only().await;
    enqueue(&db, "orders", "k", "o-1:outcome").await;

    let client = db.client().await;
    let tx = Transaction::begin(&client);
    let again = NewEvent {
        event_id: "o-1:outcome",
        topic: "orders",
        key: "k",
        event_type: "order.cancelled",
        payload: &json!({}),
        caused_by: None,
    };
    outbox::enqueue(&tx, &again).await.unwrap();
    // The insert is pipelined: its error is the commit's.
    let error = tx.commit().await.unwrap_err();

    assert_eq!(
        error.code(),
        Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION)
    );
}

/// A standby relay publishes nothing while the active one holds the lock, and takes over
/// when it stops: every row reaches the topic exactly once.
#[tokio::test]
async fn one_relay_publishes_at_a_time_and_a_standby_takes_over() {
    let (db, kafka) = tokio::join!(TestDatabase::saga_tables_only(), TestKafka::new());
    let topic = &kafka.topics.orders;
    let (stop_active, active) = relay(&db, &kafka);
    enqueue(&db, topic, "k", "first").await;
    all_published(&db, 1).await;

    let (stop_standby, standby) = relay(&db, &kafka);
    for n in 0..100 {
        enqueue(
            &db,
            topic,
            &format!("k{}", n % 7),
            &format!("while-both-{n}"),
        )
        .await;
    }
    all_published(&db, 101).await;
    stop_active.cancel();
    active.await.unwrap().unwrap();
    for n in 0..100 {
        enqueue(&db, topic, &format!("k{}", n % 7), &format!("after-{n}")).await;
    }
    all_published(&db, 201).await;

    let records = kafka.read_all(topic).await;
    let mut ids: Vec<String> = records
        .iter()
        .map(|r| header(r, "event_id").unwrap())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(
        records.len(),
        201,
        "some rows were published more than once"
    );
    assert_eq!(ids.len(), 201);
    stop_standby.cancel();
    standby.await.unwrap().unwrap();
}

/// A relay that started on a nearly empty outbox still finds the rows it marks through
/// the primary key once the table has grown, before any analyze: a plan kept from the
/// small table read the whole outbox at every mark.
#[tokio::test]
async fn a_relay_started_on_a_small_outbox_marks_rows_by_key_once_it_has_grown() {
    let (db, kafka) = tokio::join!(TestDatabase::saga_tables_only(), TestKafka::new());
    let topic = &kafka.topics.orders;
    // This test's own queries never scan the outbox: whatever scan the table's counters
    // show is the relay's.
    let watcher = db.client().await;
    watcher
        .batch_execute(
            "SET enable_seqscan = off;
             ALTER TABLE outbox SET (autovacuum_enabled = false)",
        )
        .await
        .unwrap();
    let published = async |rows: i64| {
        eventually(WAIT, &format!("{rows} rows published"), || async {
            let left: i64 = watcher
                .query_one(
                    "SELECT count(*) FROM outbox WHERE published_at IS NULL",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            let all: i64 = watcher
                .query_one(
                    "SELECT count(*) FROM outbox WHERE event_id LIKE 'event-%'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            (left == 0 && all == rows).then_some(())
        })
        .await
    };
    let (stop, task) = relay(&db, &kafka);
    // More marks than a prepared statement's first, custom, plans (five), while the
    // outbox holds a few hundred rows.
    let mut rows = 0;
    for look in 0..10 {
        for n in 0..30 {
            enqueue(&db, topic, "k", &format!("event-{look}-{n}")).await;
            rows += 1;
        }
        published(rows).await;
    }
    // Grown by 100 000 rows published long ago, as an outbox grows between analyzes.
    watcher
        .batch_execute(
            "INSERT INTO outbox (event_id, topic, key, type, payload, published_at)
             SELECT 'old-' || i, 'elsewhere', 'k', 'order.created', '{}', now()
               FROM generate_series(1, 100000) AS i",
        )
        .await
        .unwrap();
    for n in 0..5 {
        enqueue(&db, topic, "k", &format!("event-late-{n}")).await;
        rows += 1;
        published(rows).await;
    }

    // The relay's counters reach the view once its session flushes them (within seconds
    // of going idle); every row it marked, counted there, says they have.
    let seq_tup_read = eventually(WAIT, "the relay's marks in the statistics", || async {
        let row = watcher
            .query_one(
                "SELECT n_tup_upd, seq_tup_read FROM pg_stat_user_tables WHERE relname = 'outbox'",
                &[],
            )
            .await
            .unwrap();
        let (updated, read): (i64, i64) = (row.get(0), row.get(1));
        (updated >= rows).then_some(read)
    })
    .await;
    assert!(
        seq_tup_read < 100_000,
        "the relay scanned the grown outbox ({seq_tup_read} rows read by sequential scans)"
    );
    stop.cancel();
    task.await.unwrap().unwrap();
}

/// The rows committed while the relay lingers after a look go out together: the next look
/// reads them all, and the look after it marks them all, in one transaction (one `now()`).
#[tokio::test]
async fn rows_committed_while_the_relay_lingers_go_out_in_one_look() {
    let (db, kafka) = tokio::join!(TestDatabase::saga_tables_only(), TestKafka::new());
    let topic = &kafka.topics.orders;
    // Far longer than ten inserts take, and than the test waits for anything but them.
    let (stop, task) = lingering_relay(&db, &kafka, Duration::from_secs(3));
    enqueue(&db, topic, "k", "first").await;
    on_the_topic(&kafka, topic, 1).await;
    for n in 0..10 {
        enqueue(&db, topic, &format!("k{n}"), &format!("stream-{n}")).await;
    }
    all_published(&db, 11).await;

    let marks = db
        .count(
            "SELECT count(DISTINCT published_at) FROM outbox WHERE event_id LIKE 'stream-%'",
            &[],
        )
        .await;
    assert_eq!(
        marks, 1,
        "the rows committed during one linger took {marks} marks"
    );
    assert_eq!(kafka.read_all(topic).await.len(), 11);
    stop.cancel();
    task.await.unwrap().unwrap();
}

/// Stopped while it lingers, a relay marks the rows the broker has acknowledged before
/// it ends, instead of leaving them to be published again by the next relay. (The row
/// reaches the topic within the test's wait although the linger is ten minutes: the relay
/// lingers only after a look that found rows, never before one.)
#[tokio::test]
async fn a_relay_stopped_while_lingering_marks_what_the_broker_acknowledged() {
    let (db, kafka) = tokio::join!(TestDatabase::saga_tables_only(), TestKafka::new());
    let topic = &kafka.topics.orders;
    let (stop, task) = lingering_relay(&db, &kafka, Duration::from_secs(600));
    enqueue(&db, topic, "k", "only").await;
    on_the_topic(&kafka, topic, 1).await;
    stop.cancel();
    task.await.unwrap().unwrap();

    let unmarked = db
        .count(
            "SELECT count(*) FROM outbox WHERE published_at IS NULL",
            &[],
        )
        .await;
    assert_eq!(unmarked, 0, "an acknowledged row was left unmarked");
}

/// Long enough that a relay woken by neither a NOTIFY nor its writers never looks again
/// within [`WAIT`]: what it publishes, it was woken for.
const NEVER: Duration = Duration::from_secs(3600);

/// A relay that looks only when woken, with the handle its writers wake it by.
fn relay_woken_by(
    db: &TestDatabase,
    kafka: &TestKafka,
    local: &LocalRelay,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let relay = OutboxRelay::new(&db.url, &kafka.brokers, NEVER)
        .unwrap()
        .woken_by(local.clone());
    let shutdown = CancellationToken::new();
    (shutdown.clone(), tokio::spawn(relay.run(shutdown)))
}

/// Enqueues `event_ids` in one transaction beside `local`.
async fn enqueue_beside(db: &TestDatabase, local: &LocalRelay, topic: &str, event_ids: &[String]) {
    let client = db.client().await;
    let tx = Transaction::begin(&client).waking(Some(local));
    for event_id in event_ids {
        outbox::enqueue(
            &tx,
            &NewEvent {
                event_id,
                topic,
                key: "k",
                event_type: "order.created",
                payload: &json!({ "n": event_id }),
                caused_by: None,
            },
        )
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
}

/// Counts the NOTIFYs on the outbox's channel, in a session of its own that listens for
/// as long as the returned client lives.
async fn count_notifications(db: &TestDatabase) -> (tokio_postgres::Client, Arc<AtomicUsize>) {
    let (client, mut connection) = tokio_postgres::connect(&db.url, NoTls).await.unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notification(_) = message {
                counted.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    client.batch_execute("LISTEN outbox").await.unwrap();
    (client, count)
}

async fn is_published(db: &TestDatabase, event_id: &str) -> bool {
    db.count(
        "SELECT count(*) FROM outbox WHERE event_id = $1 AND published_at IS NOT NULL",
        &[&event_id],
    )
    .await
        == 1
}

/// Rows in a writer's `n`th transaction.
fn rows_in(n: usize) -> usize {
    1 + n % 3
}

async fn until_active(local: &LocalRelay) {
    eventually(WAIT, "the relay to take the lock", || async {
        local.is_active().then_some(())
    })
    .await;
}

/// Each writer waits for its rows before writing the next, so each transaction's rows
/// are published only if its own commit woke the relay: the relay never polls, and no
/// NOTIFY is sent. Four writers at once wake it while it looks, publishes and waits, in
/// every order. A transaction writes one to three rows, as a batch writes several.
#[tokio::test]
async fn writers_beside_the_active_relay_wake_it_in_memory_and_send_no_notify() {
    const WRITERS: usize = 4;
    const TRANSACTIONS_EACH: usize = 100;
    let (db, kafka) = tokio::join!(TestDatabase::saga_tables_only(), TestKafka::new());
    let topic = &kafka.topics.orders;
    let local = LocalRelay::default();
    let (stop, task) = relay_woken_by(&db, &kafka, &local);
    until_active(&local).await;
    let (_listening, notifications) = count_notifications(&db).await;

    let writers = (0..WRITERS).map(|writer| {
        let (db, local) = (&db, &local);
        async move {
            for n in 0..TRANSACTIONS_EACH {
                let event_ids: Vec<String> = (0..rows_in(n))
                    .map(|row| format!("writer-{writer}-{n}-{row}"))
                    .collect();
                enqueue_beside(db, local, topic, &event_ids).await;
                let last = event_ids.last().expect("at least one row");
                tokio::time::timeout(WAIT, async {
                    while !is_published(db, last).await {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                })
                .await
                .unwrap_or_else(|_| panic!("{last} committed and never published"));
            }
        }
    });
    futures::future::join_all(writers).await;

    // A writer that is not beside the relay NOTIFYs, and the listener hears it: the
    // count of zero before it is one the listener could have told.
    let rows = WRITERS * (0..TRANSACTIONS_EACH).map(rows_in).sum::<usize>();
    enqueue(&db, topic, "k", "from-elsewhere").await;
    all_published(&db, (rows + 1) as i64).await;
    eventually(WAIT, "the NOTIFY of the row from elsewhere", || async {
        (notifications.load(Ordering::SeqCst) > 0).then_some(())
    })
    .await;
    assert_eq!(
        notifications.load(Ordering::SeqCst),
        1,
        "the writers beside the active relay sent NOTIFYs"
    );
    on_the_topic(&kafka, topic, rows + 1).await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert!(
        !local.is_active(),
        "a stopped relay still counted as active"
    );
}

/// With two instances, the writers beside the standby NOTIFY the active relay, in the
/// other instance, which would otherwise not hear of their rows until it polls.
#[tokio::test]
async fn writers_beside_a_standby_relay_notify_the_active_one() {
    let (db, kafka) = tokio::join!(TestDatabase::saga_tables_only(), TestKafka::new());
    let topic = &kafka.topics.orders;
    let (active_local, standby_local) = (LocalRelay::default(), LocalRelay::default());
    let (stop_active, active) = relay_woken_by(&db, &kafka, &active_local);
    until_active(&active_local).await;
    let (stop_standby, standby) = relay_woken_by(&db, &kafka, &standby_local);

    for n in 0..20 {
        let event_ids = [format!("beside-the-standby-{n}")];
        enqueue_beside(&db, &standby_local, topic, &event_ids).await;
        all_published(&db, n + 1).await;
    }
    assert!(!standby_local.is_active());
    on_the_topic(&kafka, topic, 20).await;
    for (stop, task) in [(stop_active, active), (stop_standby, standby)] {
        stop.cancel();
        task.await.unwrap().unwrap();
    }
}
