//! The steps the topics hold: every record about the order, each copy of an event
//! numbered, and what each consumer of its topic made of it.

use std::collections::{BTreeMap, HashMap};

use rdkafka::Message as _;
use rdkafka::message::OwnedMessage;
use saga::{Envelope, Topics};

use super::fate::{Effect, fate};
use super::{Databases, Kind, Step, consumers, place, records, timestamp};
use crate::Sources;

/// A record, and the event it holds if it is one.
type Event<'m> = (&'m OwnedMessage, Option<Envelope>);

/// A topic, and a service that consumes it.
type Consumer = (String, &'static str);

/// What the topics held about one order at one moment: its records on each topic, and
/// each consumer's committed offsets and dead letters there.
pub(super) struct OnTopics {
    records: BTreeMap<String, Vec<OwnedMessage>>,
    /// By topic and consumer: each partition's committed offset and end.
    offsets: HashMap<Consumer, BTreeMap<i32, (i64, i64)>>,
    dead_letters: HashMap<Consumer, Vec<OwnedMessage>>,
}

/// Reads every record about the order keyed `key`, then each consumer's offsets and dead
/// letters. Read before any database: a consumer commits its transaction before its
/// offset, so every record these offsets call handled has its claim and its effect
/// visible to what is read after.
pub(super) async fn read(sources: &Sources, key: &str) -> anyhow::Result<OnTopics> {
    let topics = &sources.topics;
    let mut on_topics = OnTopics {
        records: BTreeMap::new(),
        offsets: HashMap::new(),
        dead_letters: HashMap::new(),
    };
    for topic in [&topics.orders, &topics.payments, &topics.notifications] {
        let mine = records(&sources.kafka_brokers, topic)
            .await?
            .into_iter()
            .filter(|m| about(m, key))
            .collect();
        on_topics.records.insert(topic.clone(), mine);
    }
    for (topic, service, _) in consumers(topics) {
        let (brokers, group, consumed) = (
            sources.kafka_brokers.clone(),
            topics.group(service),
            topic.clone(),
        );
        let offsets = tokio::task::spawn_blocking(move || {
            saga::kafka::committed_and_end(&brokers, &group, &consumed)
        })
        .await??;
        let dead_letters =
            records(&sources.kafka_brokers, &topics.dead_letter(&topic, service)).await?;
        on_topics.offsets.insert((topic.clone(), service), offsets);
        on_topics
            .dead_letters
            .insert((topic, service), dead_letters);
    }
    Ok(on_topics)
}

/// Every record `on_topics` holds, and what each consumer made of it, pushed to `steps`;
/// true if a record is not handled yet.
pub(super) async fn tell(
    topics: &Topics,
    on_topics: &OnTopics,
    databases: &Databases,
    caused: &HashMap<(&str, String), Effect>,
    steps: &mut Vec<Step>,
) -> anyhow::Result<bool> {
    let mut open = false;
    for (topic, messages) in &on_topics.records {
        // Copies are numbered in the order they were written, whatever their partition.
        let mut events: Vec<Event<'_>> = messages
            .iter()
            .map(|m| (m, Envelope::from_message(m).ok()))
            .collect();
        events.sort_by_key(|(m, _)| (timestamp(m), m.partition(), m.offset()));
        record_steps(topic, &events, steps);
        for (consumed, service, handles) in consumers(topics) {
            if &consumed != topic {
                continue;
            }
            let read = (consumed, service);
            for (message, event) in &events {
                let copies: Vec<&OwnedMessage> = events
                    .iter()
                    .filter(|(_, other)| {
                        other.as_ref().map(|o| &o.id) == event.as_ref().map(|e| &e.id)
                    })
                    .map(|(m, _)| *m)
                    .collect();
                let step = fate(
                    service,
                    handles,
                    message,
                    event.as_ref(),
                    &copies,
                    &on_topics.offsets[&read],
                    &on_topics.dead_letters[&read],
                    databases.of(service),
                    caused,
                )
                .await?;
                open |= step.kind == Kind::Waiting;
                steps.push(step);
            }
        }
    }
    Ok(open)
}

/// Each of `events`, the records on `topic` in the order they were written, as a step.
fn record_steps(topic: &str, events: &[Event<'_>], steps: &mut Vec<Step>) {
    let mut copies: HashMap<String, usize> = HashMap::new();
    let mut totals: HashMap<String, usize> = HashMap::new();
    for (_, event) in events {
        if let Some(event) = event {
            *totals.entry(event.id.clone()).or_default() += 1;
        }
    }
    for (message, event) in events {
        let at = timestamp(message);
        let here = place(topic, message.partition(), message.offset());
        let keyed = message.key().is_some();
        steps.push(Step {
            at,
            actor: "kafka".into(),
            kind: Kind::Record,
            text: match event {
                Some(event) => format!("{} on {here}", event.event_type),
                None => format!("a record that is no event, on {here}"),
            },
            detail: event.as_ref().map(|event| {
                let n = copies.entry(event.id.clone()).or_default();
                *n += 1;
                let total = totals[&event.id];
                let mut detail = format!("id {}", event.id);
                if total > 1 {
                    detail.push_str(&format!(", copy {n} of {total}"));
                }
                if !keyed {
                    detail.push_str(", no key (produced by hand?)");
                }
                detail
            }),
        });
    }
}

/// Whether `message` is about the order keyed `key`: by its Kafka key, or, for a record
/// produced without one, by its envelope.
fn about(message: &OwnedMessage, key: &str) -> bool {
    match message.key() {
        Some(k) if k == key.as_bytes() => true,
        _ => Envelope::from_message(message).is_ok_and(|e| e.aggregate_id == key),
    }
}
