//! Topic and group names, and the Kafka client settings the saga relies on.

pub mod client;
mod startup;

pub use client::config as client_config;
pub use startup::{await_broker, denied, lacking};

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{Headers as _, Message, OwnedMessage};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

/// A header's value as text (lossily, should it not be UTF-8): the dead-letter
/// headers are read this way by the redrive tool and the tests.
pub fn header<M: Message>(message: &M, key: &str) -> Option<String> {
    header_bytes(message, key).map(|v| String::from_utf8_lossy(v).into_owned())
}

/// A header's value as text, borrowed from the record, if it is UTF-8: what the consumer
/// reads of a record before parsing it, with nothing copied.
pub fn header_str<'a, M: Message>(message: &'a M, key: &str) -> Option<&'a str> {
    header_bytes(message, key).and_then(|v| std::str::from_utf8(v).ok())
}

fn header_bytes<'a, M: Message>(message: &'a M, key: &str) -> Option<&'a [u8]> {
    message.headers()?.iter().find(|h| h.key == key)?.value
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
pub fn idempotent_producer(brokers: &str) -> rdkafka::ClientConfig {
    let mut config = client_config(brokers);
    config
        // librdkafka (2.12) already defaults to acks=all and forces it when idempotence is
        // on, and refuses to create a producer whose settings contradict it; stated here
        // because "acknowledged" must mean "in every in-sync replica", which is what lets a
        // relay mark a row published and a consumer move past a dead letter. Idempotence
        // itself is off by default in librdkafka: without it a retried send could duplicate
        // a record or, with several in flight, reorder one order's events.
        .set("acks", "all")
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

/// What a topic is created with: the brokers' `default.replication.factor`, which each
/// mode's properties file sets (1 on the single broker, 3 on the cluster), so that a
/// test's or the benchmark's topics are replicated as the saga's own are.
pub const BROKER_DEFAULT_REPLICATION: TopicReplication<'static> = TopicReplication::Fixed(-1);

/// Creates `topics` with `partitions` partitions each; existing ones are left alone.
pub async fn create_topics(
    brokers: &str,
    topics: &[String],
    partitions: i32,
) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = client_config(brokers).create()?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|name| NewTopic::new(name, partitions, BROKER_DEFAULT_REPLICATION))
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
    let client: BaseConsumer = client_config(brokers).create()?;
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

/// Every record now in `topic`, read from the start of each partition to its end by a
/// consumer that joins no group and commits nothing. Blocks: call it off the runtime's
/// workers. Reads what is retained, so its cost grows with the topic.
pub fn read_topic(brokers: &str, topic: &str) -> anyhow::Result<Vec<OwnedMessage>> {
    read_topics(
        &reader(brokers)?,
        &[topic.to_owned()],
        Duration::from_secs(30),
    )
}

/// Every record now in `topics`, with `consumer` (a [`reader`]), from the start of each
/// partition to where it ended when asked, within `within`. Read to where the reader's
/// position passes that end, not to a count of offsets: a relay's transaction markers take
/// offsets too. Blocks.
pub fn read_topics(
    consumer: &BaseConsumer,
    topics: &[String],
    within: Duration,
) -> anyhow::Result<Vec<OwnedMessage>> {
    let timeout = Duration::from_secs(10);
    let mut assignment = TopicPartitionList::new();
    let mut unread = BTreeMap::new();
    for topic in topics {
        for partition in 0..partition_count(consumer, topic)? {
            let (low, high) = consumer.fetch_watermarks(topic, partition, timeout)?;
            if high > low {
                assignment.add_partition_offset(topic, partition, Offset::Offset(low))?;
                unread.insert((topic.clone(), partition), high);
            }
        }
    }
    let mut records = Vec::new();
    if unread.is_empty() {
        return Ok(records);
    }
    consumer.assign(&assignment)?;
    let deadline = Instant::now() + within;
    while !unread.is_empty() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "timed out reading {topics:?}: {:?} not read to their end",
            unread.keys().collect::<Vec<_>>()
        );
        match consumer.poll(Duration::from_millis(500)) {
            Some(Ok(message)) => records.push(message.detach()),
            // It names the partition alone, not its topic: look at every position.
            Some(Err(KafkaError::PartitionEOF(_))) => {
                let positions = consumer.position()?;
                unread.retain(|(topic, partition), high| {
                    !matches!(
                        positions.find_partition(topic, *partition).map(|e| e.offset()),
                        Some(Offset::Offset(position)) if position >= *high
                    )
                });
            }
            Some(Err(error)) => return Err(error.into()),
            None => {}
        }
    }
    Ok(records)
}

/// The offset `group` has committed on each partition of `topic` (0 where it has none),
/// and the end of each partition, asked without joining the group. Blocks.
pub fn committed_and_end(
    brokers: &str,
    group: &str,
    topic: &str,
) -> anyhow::Result<BTreeMap<i32, (i64, i64)>> {
    let consumer: BaseConsumer = client_config(brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let timeout = Duration::from_secs(10);
    let partitions = partition_count(&consumer, topic)?;
    let mut wanted = TopicPartitionList::new();
    for partition in 0..partitions {
        wanted.add_partition(topic, partition);
    }
    let committed = consumer.committed_offsets(wanted, timeout)?;
    let mut offsets = BTreeMap::new();
    for partition in 0..partitions {
        let done = match committed
            .find_partition(topic, partition)
            .map(|e| e.offset())
        {
            Some(Offset::Offset(offset)) => offset,
            _ => 0,
        };
        let (_, end) = consumer.fetch_watermarks(topic, partition, timeout)?;
        offsets.insert(partition, (done, end));
    }
    Ok(offsets)
}

/// Whether `group` has committed past every record of `topic`: no record at or after
/// its committed offset on any partition. Not whether that offset is each partition's
/// end: a relay's Kafka transaction leaves a marker after its records, an offset no
/// consumer is handed, which a consumer stopped before it fetched the marker has not
/// committed past, though nothing is left for it. Blocks.
pub fn group_caught_up(brokers: &str, group: &str, topic: &str) -> anyhow::Result<bool> {
    let mut assignment = TopicPartitionList::new();
    for (partition, (done, end)) in committed_and_end(brokers, group, topic)? {
        if done < end {
            assignment.add_partition_offset(topic, partition, Offset::Offset(done))?;
        }
    }
    if assignment.count() == 0 {
        return Ok(true);
    }
    let consumer = reader(brokers)?;
    let mut unread = assignment.count();
    consumer.assign(&assignment)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while unread > 0 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "timed out reading {topic} past {group}'s offsets"
        );
        match consumer.poll(Duration::from_millis(500)) {
            Some(Ok(_)) => return Ok(false),
            Some(Err(KafkaError::PartitionEOF(_))) => unread -= 1,
            Some(Err(error)) => return Err(error.into()),
            None => {}
        }
    }
    Ok(true)
}

/// A consumer that reads partitions assigned by hand, committing nothing, and says where
/// each partition ends: a partition's offsets are not all records, as each Kafka
/// transaction of a relay leaves a marker, which a reader skips.
pub fn reader(brokers: &str) -> KafkaResult<BaseConsumer> {
    client_config(brokers)
        // Required by the client, used for nothing: the partitions are assigned by hand.
        .set("group.id", "order-saga-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()
}

fn partition_count(consumer: &BaseConsumer, topic: &str) -> anyhow::Result<i32> {
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    match metadata.topics().first() {
        Some(t) if t.error().is_none() => Ok(t.partitions().len() as i32),
        _ => anyhow::bail!("the broker does not serve topic {topic}"),
    }
}
