//! Topic and group names, and the Kafka client settings the saga relies on.

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
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
    Ok(())
}
