//! Topic and group names, and the Kafka client settings the saga relies on.

use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Headers as _, Message};

/// A header's value as text (lossily, should it not be UTF-8): the dead-letter
/// headers are read this way by the redrive tool and the tests.
pub fn header<M: Message>(message: &M, key: &str) -> Option<String> {
    message
        .headers()?
        .iter()
        .find(|h| h.key == key)
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// The names of everything the saga puts on the broker, under one namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topics {
    namespace: String,
    pub orders: String,
    pub payments: String,
    pub notifications: String,
}

impl Topics {
    pub fn new(namespace: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            orders: format!("{namespace}orders"),
            payments: format!("{namespace}payments"),
            notifications: format!("{namespace}notifications"),
        }
    }

    /// The consumer group of `service`.
    pub fn group(&self, service: &str) -> String {
        format!("{}{service}", self.namespace)
    }

    /// Where `service` puts the records of `topic` it can never process,
    /// e.g. `payments.order-service.dlq`.
    pub fn dead_letter(&self, topic: &str, service: &str) -> String {
        format!("{topic}.{service}.dlq")
    }

    /// Every topic the saga uses, dead-letter topics included; what a deployment creates.
    pub fn all(&self) -> Vec<String> {
        vec![
            self.orders.clone(),
            self.payments.clone(),
            self.notifications.clone(),
            self.dead_letter(&self.orders, "payment-service"),
            self.dead_letter(&self.payments, "order-service"),
            self.dead_letter(&self.orders, "notification-service"),
        ]
    }
}

/// Settings for a producer that neither duplicates nor reorders on its own retries.
pub fn idempotent_producer(brokers: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        // Send at once: each event of an order waits on the one before it, so a linger
        // adds to every hop. The relay still batches: it hands librdkafka a whole batch
        // before awaiting the acknowledgements, and what queues up while a request is
        // in flight goes out together.
        .set("linger.ms", "0")
        // A send not acknowledged in this time is reported failed and retried by the
        // caller from its own durable state (outbox row, unstored offset).
        .set("message.timeout.ms", "30000");
    config
}

/// Creates `topics` with `partitions` partitions each; existing ones are left alone.
pub async fn create_topics(
    brokers: &str,
    topics: &[String],
    partitions: i32,
) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|name| NewTopic::new(name, partitions, TopicReplication::Fixed(1)))
        .collect();
    for result in admin.create_topics(&new, &AdminOptions::new()).await? {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => anyhow::bail!("cannot create topic {name}: {code}"),
        }
    }
    await_topics(brokers, topics, Duration::from_secs(30)).await
}

/// Returns once the broker serves every one of `topics`, each partition with a leader.
///
/// The controller acknowledges a new topic before the broker's metadata holds it; until
/// then a describe or a fetch meets "unknown topic", so whoever creates topics and uses
/// them at once waits here.
pub async fn await_topics(
    brokers: &str,
    topics: &[String],
    timeout: Duration,
) -> anyhow::Result<()> {
    let client: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let topics = topics.to_vec();
    // fetch_metadata blocks: off the runtime's workers.
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + timeout;
        loop {
            let mut missing = Vec::new();
            for name in &topics {
                let metadata = client.fetch_metadata(Some(name), Duration::from_secs(5))?;
                let served = metadata.topics().iter().any(|t| {
                    t.error().is_none()
                        && !t.partitions().is_empty()
                        && t.partitions().iter().all(|p| p.leader() >= 0)
                });
                if !served {
                    missing.push(name.as_str());
                }
            }
            if missing.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                anyhow::bail!("the broker does not serve topics {missing:?} after {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .await?
}
