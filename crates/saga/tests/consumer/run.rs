//! A consumer started on a fresh namespace and database, what it committed, and the
//! records the tests produce for it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::producer::FutureProducer;
use saga::consumer::{self, ConsumerSettings};
use saga::{Applier, HandlerError};
use saga_testkit::{TestDatabase, TestKafka, eventually};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::recorder::Recorder;

pub const WAIT: Duration = Duration::from_secs(60);
pub const SERVICE: &str = "payment-service";

/// A database for the recorder's `applied` table.
pub async fn database() -> TestDatabase {
    let db = TestDatabase::empty().await;
    db.client()
        .await
        .batch_execute(
            "CREATE TABLE applied (seq bigserial PRIMARY KEY, event_id text NOT NULL, txid bigint NOT NULL)",
        )
        .await
        .unwrap();
    db
}

pub fn event(id: &str) -> Vec<u8> {
    saga_testkit::envelope(id, "order.created", Uuid::nil(), json!({}))
}

pub fn transient() -> HandlerError {
    HandlerError::Pool(deadpool_postgres::PoolError::Timeout(
        deadpool_postgres::TimeoutType::Wait,
    ))
}

pub struct Run {
    pub kafka: TestKafka,
    pub db: TestDatabase,
    pub shutdown: CancellationToken,
    pub task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

pub async fn start(kafka: TestKafka, handler: Recorder) -> Run {
    start_with(kafka, handler, settings).await
}

/// The producer a consumer sends its dead letters with, as a service's relay lends it.
pub fn dead_letters(kafka: &TestKafka) -> FutureProducer {
    saga::kafka::idempotent_producer(&kafka.brokers)
        .create()
        .unwrap()
}

pub async fn start_with(
    kafka: TestKafka,
    handler: Recorder,
    settings: impl Fn(&TestKafka) -> ConsumerSettings,
) -> Run {
    let db = database().await;
    let shutdown = CancellationToken::new();
    let applier = Arc::new(Applier::new(db.pool.clone(), handler));
    let task = tokio::spawn(consumer::run(
        settings(&kafka),
        applier,
        dead_letters(&kafka),
        shutdown.clone(),
    ));
    Run {
        kafka,
        db,
        shutdown,
        task,
    }
}

pub fn settings(kafka: &TestKafka) -> ConsumerSettings {
    let topics = &kafka.topics;
    ConsumerSettings::new(
        &kafka.brokers,
        topics.group(SERVICE),
        topics.orders.clone(),
        topics.dead_letter(&topics.orders, SERVICE),
    )
}

impl Run {
    pub async fn produce(&self, partition: i32, id: &str) {
        self.kafka
            .produce_to(&self.kafka.topics.orders, Some(partition), None, &event(id))
            .await;
    }

    pub async fn caught_up(&self) {
        let group = self.kafka.topics.group(SERVICE);
        eventually(WAIT, "the group to commit everything", || async {
            self.kafka
                .group_caught_up(&group, &self.kafka.topics.orders)
                .await
                .then_some(())
        })
        .await;
    }

    pub async fn committed(&self, partition: i32) -> i64 {
        self.kafka
            .committed_offset(
                &self.kafka.topics.group(SERVICE),
                &self.kafka.topics.orders,
                partition,
            )
            .await
    }

    /// What the `applied` table holds, in commit order: event id and transaction id.
    pub async fn committed_events(&self) -> Vec<(String, i64)> {
        self.db
            .client()
            .await
            .query("SELECT event_id, txid FROM applied ORDER BY seq", &[])
            .await
            .unwrap()
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect()
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// Produces the next numbered record, round robin over the three partitions.
pub async fn produce_next(kafka: &TestKafka, produced: &Mutex<Vec<String>>) {
    let (id, partition) = {
        let mut produced = produced.lock().unwrap();
        let n = produced.len();
        produced.push(format!("r-{n}"));
        (format!("r-{n}"), (n % 3) as i32)
    };
    kafka
        .produce_to(&kafka.topics.orders, Some(partition), None, &event(&id))
        .await;
}

pub fn batched(size: usize) -> impl Fn(&TestKafka) -> ConsumerSettings {
    move |kafka| ConsumerSettings {
        batch_size: size,
        ..settings(kafka)
    }
}

/// The records of one partition, in offset order, grouped by the transaction that
/// committed them.
pub fn transactions(committed: &[(String, i64)]) -> Vec<Vec<String>> {
    let mut grouped: Vec<(i64, Vec<String>)> = Vec::new();
    for (id, txid) in committed {
        match grouped.last_mut() {
            Some((last, ids)) if last == txid => ids.push(id.clone()),
            _ => grouped.push((*txid, vec![id.clone()])),
        }
    }
    grouped.into_iter().map(|(_, ids)| ids).collect()
}

/// A fresh namespace with `n` records `<prefix>-<i>` on `partition`, produced before any
/// consumer starts, so they are all waiting when one does.
pub async fn waiting_records(partition: i32, prefix: &str, n: usize) -> (TestKafka, Vec<String>) {
    let kafka = TestKafka::new().await;
    let ids: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
    for id in &ids {
        kafka
            .produce_to(&kafka.topics.orders, Some(partition), None, &event(id))
            .await;
    }
    (kafka, ids)
}
