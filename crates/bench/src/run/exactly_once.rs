//! The exactly-once check at the end of a run: each order's effects counted in the
//! services' databases, and the events the saga gave up on.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer as _};

use crate::db::Databases;
use crate::measure;

use super::Settings;

/// What the run's orders did in the services' databases, then the records in its
/// dead-letter topics.
pub(super) async fn count(
    databases: &Databases,
    settings: &Settings,
    namespace: &str,
) -> anyhow::Result<(measure::Effects, i64)> {
    let effects = measure::effects(databases).await?;
    let dead_letters = dead_letters(settings, namespace)?;
    Ok((effects, dead_letters))
}

/// Records in this run's dead-letter topics: each one is an event the saga gave up on.
fn dead_letters(settings: &Settings, namespace: &str) -> anyhow::Result<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &settings.brokers)
        .set("group.id", format!("{namespace}bench-watermarks"))
        .create()?;
    let topics = saga::Topics::new(namespace);
    let mut total = 0;
    for (topic, service) in [
        (&topics.orders, "payment-service"),
        (&topics.payments, "order-service"),
        (&topics.orders, "notification-service"),
    ] {
        let dlq = topics.dead_letter(topic, service);
        for partition in 0..settings.partitions {
            let (low, high) =
                consumer.fetch_watermarks(&dlq, partition, Duration::from_secs(10))?;
            total += high - low;
        }
    }
    Ok(total)
}
