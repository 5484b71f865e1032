//! Records produced by hand, the way a person with `kafka-console-producer` or a
//! misbehaving upstream would: replays, conflicting events and poison. Each send returns
//! where the record landed, so a check can follow it to its handling or dead letter.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::Value;
use uuid::Uuid;

pub struct HandProducer {
    producer: FutureProducer,
}

impl HandProducer {
    pub fn new(brokers: &str) -> Self {
        Self {
            producer: ClientConfig::new()
                .set("bootstrap.servers", brokers)
                .create()
                .expect("a Kafka producer"),
        }
    }

    /// Produces `value` (keyed by `key`, to `partition` if given) and waits for the
    /// broker's acknowledgement; returns the record's partition and offset.
    pub async fn send(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&str>,
        value: &[u8],
    ) -> (i32, i64) {
        self.send_value(topic, partition, key, Some(value)).await
    }

    /// [`send`](Self::send), where `None` is a tombstone: a record with a null value.
    pub async fn send_value(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&str>,
        value: Option<&[u8]>,
    ) -> (i32, i64) {
        let mut record: FutureRecord<'_, str, [u8]> = FutureRecord::to(topic);
        if let Some(value) = value {
            record = record.payload(value);
        }
        if let Some(key) = key {
            record = record.key(key);
        }
        if let Some(partition) = partition {
            record = record.partition(partition);
        }
        let delivery = self
            .producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(e, _)| e)
            .expect("the broker acknowledges");
        (delivery.partition, delivery.offset)
    }
}

/// An envelope with `id`, `event_type` and `payload` about `order_id`.
pub fn envelope(id: &str, event_type: &str, order_id: Uuid, payload: Value) -> Vec<u8> {
    saga_testkit::envelope(id, event_type, order_id, payload)
}
