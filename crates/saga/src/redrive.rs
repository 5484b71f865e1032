//! Redrive: sends the records of a dead-letter topic back to the topics they came from,
//! once whatever made them fail is fixed (a missing row restored, a handler corrected).
//!
//! Guarantees:
//! - **Byte for byte.** Each dead letter is produced to its `dlq.original.topic` with its
//!   original key and value, so it lands on the partition of its key like the original
//!   did, and with the original's headers (its causation id, its trace context): the dead
//!   letter's headers but the `dlq.*` ones, in order, then a `dlq.redriven.from` header
//!   that says where it came from: the record again, not its dead letter. A record
//!   redriven before carries only this redrive's `dlq.redriven.from`, since its dead
//!   letter kept no `dlq.*` header of the record's (`consumer::dead_letters` says why).
//! - **Committed only after the broker acknowledged.** The redrive reads with a consumer
//!   group of its own (by default `<dead-letter topic>.redrive`) and commits a dead
//!   letter's offset only once its copy is acknowledged. A redrive that dies half way
//!   resends at most what was not committed; a second redrive resends nothing.
//! - **Safe to repeat.** A record sent back twice (a crash, or a redrive run again from
//!   another group on purpose) is a duplicate delivery like any other: the consumer's
//!   inbox stops it.
//! - **It ends.** It reads up to the end each partition had when it started: a record
//!   that fails again is dead-lettered again, after that end, and waits for the next run.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context as _;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _};
use rdkafka::message::{Header, Headers, Message as _, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

use crate::kafka::header;

/// What every header a trip through a dead-letter topic writes begins with.
const DEAD_LETTER_HEADERS: &str = "dlq.";

/// Dead letters sent per round trip: produced together, acknowledged, then committed.
const BATCH: usize = 100;
const TIMEOUT: Duration = Duration::from_secs(10);

/// What a redrive did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Redriven {
    /// Records sent back, per original topic.
    pub by_topic: BTreeMap<String, usize>,
}

impl Redriven {
    pub fn total(&self) -> usize {
        self.by_topic.values().sum()
    }
}

/// The consumer group a redrive of `dead_letter_topic` uses unless told otherwise.
pub fn default_group(dead_letter_topic: &str) -> String {
    format!("{dead_letter_topic}.redrive")
}

/// Sends every dead letter of `dead_letter_topic` that `group` has not sent yet back to
/// its original topic.
pub async fn redrive(
    brokers: &str,
    dead_letter_topic: &str,
    group: &str,
) -> anyhow::Result<Redriven> {
    let producer: FutureProducer = crate::kafka::idempotent_producer(brokers).create()?;
    let (brokers, topic, group) = (
        brokers.to_owned(),
        dead_letter_topic.to_owned(),
        group.to_owned(),
    );
    let handle = tokio::runtime::Handle::current();
    // librdkafka's consumer calls block; the sends are awaited on the runtime.
    tokio::task::spawn_blocking(move || {
        redrive_blocking(&brokers, &topic, &group, |batch| {
            handle.block_on(send_back(&producer, &topic, batch))
        })
    })
    .await?
}

/// A record's own headers, without those of a trip through a dead-letter topic: every
/// header but the `dlq.*` ones, in order, each value byte for byte (a header without a
/// value stays without one).
pub(crate) fn own_headers<H: Headers>(headers: Option<&H>) -> OwnedHeaders {
    let mut own = OwnedHeaders::new();
    for header in headers.into_iter().flat_map(Headers::iter) {
        if !header.key.starts_with(DEAD_LETTER_HEADERS) {
            own = own.insert(Header {
                key: header.key,
                value: header.value,
            });
        }
    }
    own
}

/// A dead letter read, not yet sent back.
struct DeadLetter {
    partition: i32,
    offset: i64,
    original_topic: String,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    /// The original record's headers ([`own_headers`]).
    headers: OwnedHeaders,
}

fn redrive_blocking(
    brokers: &str,
    topic: &str,
    group: &str,
    mut send: impl FnMut(&[DeadLetter]) -> anyhow::Result<()>,
) -> anyhow::Result<Redriven> {
    let consumer: BaseConsumer = crate::kafka::client_config(brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    let (assignment, ends) = unread(&consumer, topic)?;
    let mut redriven = Redriven::default();
    if ends.is_empty() {
        return Ok(redriven);
    }
    consumer.assign(&assignment)?;

    // The next offset to read, per partition still to read.
    let mut next: BTreeMap<i32, i64> = assignment
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(offset) => Some((e.partition(), offset)),
            _ => None,
        })
        .collect();
    let unfinished = |next: &BTreeMap<i32, i64>| next.iter().any(|(p, at)| *at < ends[p]);
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        while batch.len() < BATCH && unfinished(&next) {
            let message = consumer.poll(TIMEOUT).with_context(|| {
                format!("{topic}: nothing to read within {TIMEOUT:?} before the end")
            })??;
            let (partition, offset) = (message.partition(), message.offset());
            next.insert(partition, offset + 1);
            // Dead-lettered after the start: left for the next redrive.
            if offset >= ends[&partition] {
                continue;
            }
            let original_topic = header(&message, "dlq.original.topic").with_context(|| {
                format!("{topic} {partition}/{offset} has no dlq.original.topic header")
            })?;
            batch.push(DeadLetter {
                partition,
                offset,
                original_topic,
                key: message.key().map(<[u8]>::to_vec),
                value: message.payload().map(<[u8]>::to_vec),
                headers: own_headers(message.headers()),
            });
        }
        if batch.is_empty() {
            break;
        }
        send(&batch)?;
        // Acknowledged: only now may the group move past them.
        let mut read_to: BTreeMap<i32, i64> = BTreeMap::new();
        for letter in &batch {
            // Unlike store_offset, commit takes the next offset to read: offset + 1.
            read_to.insert(letter.partition, letter.offset + 1);
            *redriven
                .by_topic
                .entry(letter.original_topic.clone())
                .or_default() += 1;
        }
        let mut offsets = TopicPartitionList::new();
        for (partition, offset) in read_to {
            offsets.add_partition_offset(topic, partition, Offset::Offset(offset))?;
        }
        consumer.commit(&offsets, CommitMode::Sync)?;
        batch.clear();
    }
    Ok(redriven)
}

/// Where `consumer`'s group got to in each partition of `topic` that it has not read to
/// the end (the assignment to read from), and where each of those partitions ends now.
fn unread(
    consumer: &BaseConsumer,
    topic: &str,
) -> anyhow::Result<(TopicPartitionList, BTreeMap<i32, i64>)> {
    let metadata = consumer
        .fetch_metadata(Some(topic), TIMEOUT)
        .with_context(|| format!("cannot read the metadata of {topic}"))?;
    let partitions = match metadata.topics().first() {
        Some(t) if t.error().is_none() => t.partitions().len() as i32,
        _ => anyhow::bail!("no topic {topic}"),
    };
    let mut wanted = TopicPartitionList::new();
    for partition in 0..partitions {
        wanted.add_partition(topic, partition);
    }
    let committed = consumer.committed_offsets(wanted, TIMEOUT)?;
    let mut assignment = TopicPartitionList::new();
    let mut ends = BTreeMap::new();
    for partition in 0..partitions {
        let (low, high) = consumer.fetch_watermarks(topic, partition, TIMEOUT)?;
        let from = match committed
            .find_partition(topic, partition)
            .map(|e| e.offset())
        {
            Some(Offset::Offset(offset)) => offset.max(low),
            _ => low,
        };
        if from < high {
            assignment.add_partition_offset(topic, partition, Offset::Offset(from))?;
            ends.insert(partition, high);
        }
    }
    Ok((assignment, ends))
}

/// Produces `batch` to the original topics and waits until the broker acknowledged all.
async fn send_back(
    producer: &FutureProducer,
    dead_letter_topic: &str,
    batch: &[DeadLetter],
) -> anyhow::Result<()> {
    let mut deliveries = Vec::with_capacity(batch.len());
    for letter in batch {
        let from = format!("{dead_letter_topic}/{}/{}", letter.partition, letter.offset);
        let headers = letter.headers.clone().insert(Header {
            key: "dlq.redriven.from",
            value: Some(from.as_str()),
        });
        let mut record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(&letter.original_topic).headers(headers);
        if let Some(key) = &letter.key {
            record = record.key(key);
        }
        if let Some(value) = &letter.value {
            record = record.payload(value);
        }
        deliveries.push((
            from.clone(),
            producer
                .send_result(record)
                .map_err(|(error, _)| anyhow::anyhow!("cannot send {from} back: {error}"))?,
        ));
    }
    for (from, delivery) in deliveries {
        match delivery.await {
            Ok(Ok(_)) => {}
            Ok(Err((error, _))) => anyhow::bail!("{from} not acknowledged: {error}"),
            Err(_) => anyhow::bail!("{from}: the producer went away"),
        }
    }
    Ok(())
}
