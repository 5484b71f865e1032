//! Every record the services wrote in a test run, held to docs/asyncapi.yaml with a JSON
//! Schema validator: the envelope and the payload schema of its `type` on its topic's
//! channel, its key (`RecordKey`, and the envelope's `aggregate_id`), its headers
//! (`EventHeaders`, `event_id` and `event_type` the envelope's); a dead letter's headers
//! against the dead-letter message. `crates/saga/tests/asyncapi.rs` holds the document to
//! the code's types; this holds it to what went over the wire.
//!
//! It reads what the workspace's tests left on the broker, so it is `#[ignore]`d and run
//! after them (`scripts/test` runs it right after `cargo test --workspace`):
//! `cargo test -p saga-e2e --test event_records -- --ignored --nocapture`.
//!
//! Which records are the services':
//! - **Namespaces a service ran in.** A test's topics are `t<12 hex>.<topic>`. A namespace
//!   is read when the broker knows a consumer group of one of the services in it
//!   (`<namespace>order-service`, …): every e2e stack runs all three. The library's relay
//!   tests publish made-up events with no service behind them, and start no group.
//! - **Records the relay wrote.** The relay puts `event_id` and `event_type` headers on
//!   every record, and a redrive keeps them; a record a test wrote by hand (a poison on
//!   purpose, a replay as a person types it) has none, and is not checked.
//! - **Dead letters.** Their `dlq.*` headers are always the consumer's, and checked; the
//!   record a dead letter carries is checked as above, against its original topic, when
//!   the relay wrote it.

// The contract's loader and its ways in, shared with the library's own check of it.
#[allow(dead_code)]
#[path = "../../saga/tests/asyncapi/document.rs"]
mod document;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use document::{DEAD_LETTER, address, channels, contract, messages, resolve};
use jsonschema::{Draft, Validator};
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::{Headers, Message as _, OwnedMessage};
use regex::Regex;
use saga_e2e::SERVICES;
use serde_json::{Map, Value, json};

const TIMEOUT: Duration = Duration::from_secs(10);
/// How many problems the failure lists; the count says how many there were.
const SHOWN: usize = 40;

#[test]
#[ignore = "reads what the workspace's tests left on the broker: scripts/test runs it after them"]
fn every_record_the_services_wrote_matches_the_event_contract() {
    let schemas = Schemas::compile(&contract());
    let consumer = saga::kafka::reader(&saga_testkit::kafka_brokers()).unwrap();
    let namespaces = namespaces_a_service_ran_in(&consumer);
    let topics = topics_in(&consumer, &namespaces);
    let records = saga::kafka::read_topics(&consumer, &topics, Duration::from_secs(300)).unwrap();

    let mut tally = Tally::default();
    for record in &records {
        schemas.check(record, &mut tally);
    }
    println!(
        "{} records checked against docs/asyncapi.yaml ({} events, {} dead letters), {} \
         written by hand skipped, in {} topics of {} namespaces",
        tally.events + tally.dead_letters,
        tally.events,
        tally.dead_letters,
        tally.by_hand,
        topics.len(),
        namespaces.len(),
    );
    assert!(
        tally.problems.is_empty(),
        "{} records break docs/asyncapi.yaml:\n- {}",
        tally.problems.len(),
        tally.problems[..tally.problems.len().min(SHOWN)].join("\n- ")
    );
    assert!(
        tally.events > 0,
        "no record of the services' found: run the workspace's tests first"
    );
}

#[derive(Default)]
struct Tally {
    events: usize,
    dead_letters: usize,
    by_hand: usize,
    problems: Vec<String>,
}

/// An event message's schemas: its value, its headers, its key.
struct EventSchemas {
    value: Validator,
    headers: Validator,
    key: Validator,
}

struct Schemas {
    /// Per topic (its address under no namespace), per type on it.
    events: BTreeMap<String, BTreeMap<String, EventSchemas>>,
    /// The dead-letter topics (under no namespace), and their message's headers.
    dead_letter_topics: BTreeSet<String>,
    dead_letter_headers: Validator,
}

impl Schemas {
    fn compile(doc: &Value) -> Self {
        let mut events = BTreeMap::new();
        let mut dead_letter_topics = BTreeSet::new();
        let mut dead_letter_headers = None;
        for (_, channel) in channels(doc) {
            let topic = address(channel, "");
            for (key, message) in messages(doc, channel) {
                if key == DEAD_LETTER {
                    dead_letter_topics.insert(topic.clone());
                    dead_letter_headers = Some(validator(doc, &message["headers"]));
                    continue;
                }
                let schemas = EventSchemas {
                    value: validator(doc, &message["payload"]),
                    headers: validator(doc, own_or_traits(doc, message, "/headers")),
                    key: validator(doc, own_or_traits(doc, message, "/bindings/kafka/key")),
                };
                events
                    .entry(topic.clone())
                    .or_insert_with(BTreeMap::new)
                    .insert(key.to_owned(), schemas);
            }
        }
        Self {
            events,
            dead_letter_topics,
            dead_letter_headers: dead_letter_headers.expect("a dead-letter message"),
        }
    }

    fn check(&self, record: &OwnedMessage, tally: &mut Tally) {
        let (namespace, topic) = record.topic().split_at(NAMESPACE_LENGTH);
        let at = format!(
            "{} {}/{}",
            record.topic(),
            record.partition(),
            record.offset()
        );
        let (headers, mut problems) = headers_of(record);
        if self.dead_letter_topics.contains(topic) {
            tally.dead_letters += 1;
            let all = Value::Object(headers.clone());
            problems.extend(errors("headers", &self.dead_letter_headers, &all));
            let original = all["dlq.original.topic"].as_str().unwrap_or_default();
            let original = original.strip_prefix(namespace).unwrap_or(original);
            let own: Map<String, Value> = headers
                .iter()
                .filter(|(name, _)| !name.starts_with("dlq."))
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect();
            if written_by_the_relay(&own) {
                let (what, found) = self.check_event(original, record, &own);
                problems.extend(found.into_iter().map(|p| format!("{what}: {p}")));
            }
            for problem in problems {
                tally
                    .problems
                    .push(format!("{at}, a dead letter: {problem}"));
            }
            return;
        }
        if !written_by_the_relay(&headers) {
            tally.by_hand += 1;
            return;
        }
        tally.events += 1;
        let (what, found) = self.check_event(topic, record, &headers);
        problems.extend(found);
        for problem in problems {
            tally.problems.push(format!("{at}, {what}: {problem}"));
        }
    }

    /// Checks an event the relay wrote for `topic` (under no namespace): returns its type
    /// and what is wrong with it.
    fn check_event(
        &self,
        topic: &str,
        record: &OwnedMessage,
        headers: &Map<String, Value>,
    ) -> (String, Vec<String>) {
        let Some(types) = self.events.get(topic) else {
            return ("?".into(), vec![format!("no channel for topic `{topic}`")]);
        };
        let value: Value = match record.payload().map(serde_json::from_slice) {
            Some(Ok(value)) => value,
            Some(Err(error)) => return ("?".into(), vec![format!("value not JSON: {error}")]),
            None => return ("?".into(), vec!["no value".into()]),
        };
        let event_type = value["type"].as_str().unwrap_or("?").to_owned();
        let Some(schemas) = types.get(&event_type) else {
            let problem = format!("type `{event_type}` is not a message of topic `{topic}`");
            return (event_type, vec![problem]);
        };
        let mut problems = errors("value", &schemas.value, &value);
        problems.extend(errors(
            "headers",
            &schemas.headers,
            &Value::Object(headers.clone()),
        ));
        let key = record.key().map(String::from_utf8_lossy);
        match &key {
            Some(key) => problems.extend(errors("key", &schemas.key, &json!(key))),
            None => problems.push("no key".into()),
        }
        // What a schema cannot say: one part of the record is another's copy.
        for (what, copy, of) in [
            ("key", key.map(|k| json!(k)), &value["aggregate_id"]),
            (
                "header event_id",
                headers.get("event_id").cloned(),
                &value["id"],
            ),
            (
                "header event_type",
                headers.get("event_type").cloned(),
                &value["type"],
            ),
        ] {
            if copy.as_ref().is_some_and(|copy| copy != of) {
                problems.push(format!(
                    "{what} {} is not the envelope's {of}",
                    copy.unwrap()
                ));
            }
        }
        (event_type, problems)
    }
}

/// `t<12 hex>.`, the namespace a test's topics and groups begin with.
const NAMESPACE_LENGTH: usize = 14;

fn namespace_pattern() -> Regex {
    Regex::new(r"^t[0-9a-f]{12}\.").unwrap()
}

fn written_by_the_relay(headers: &Map<String, Value>) -> bool {
    headers.contains_key("event_id") && headers.contains_key("event_type")
}

/// A record's headers as the schemas see them: an object of text. A value that is not
/// text, or none, becomes null, which a header the document types refuses; a name twice
/// is a problem of its own.
fn headers_of(record: &OwnedMessage) -> (Map<String, Value>, Vec<String>) {
    let mut headers = Map::new();
    let mut problems = Vec::new();
    for header in record.headers().into_iter().flat_map(Headers::iter) {
        let value = header
            .value
            .and_then(|v| std::str::from_utf8(v).ok())
            .map_or(Value::Null, |v| json!(v));
        if headers.insert(header.key.to_owned(), value).is_some() {
            problems.push(format!("header {} twice", header.key));
        }
    }
    (headers, problems)
}

/// A validator of `schema`, a part of `doc` whose `$ref`s point into its components.
fn validator(doc: &Value, schema: &Value) -> Validator {
    let root = json!({"allOf": [schema], "components": doc["components"]});
    jsonschema::options()
        // AsyncAPI's schemas are JSON Schema draft 7, and it means its formats.
        .with_draft(Draft::Draft7)
        .should_validate_formats(true)
        .build(&root)
        .unwrap_or_else(|e| panic!("docs/asyncapi.yaml: {schema}: {e}"))
}

/// What `pointer` is in `message`, or in the first of its traits that has it.
fn own_or_traits<'a>(doc: &'a Value, message: &'a Value, pointer: &str) -> &'a Value {
    let traits = message["traits"].as_array().into_iter().flatten();
    std::iter::once(message)
        .chain(traits.map(|t| resolve(doc, t)))
        .find_map(|m| m.pointer(pointer))
        .unwrap_or_else(|| panic!("docs/asyncapi.yaml: {} has no {pointer}", message["name"]))
}

fn errors(what: &str, validator: &Validator, instance: &Value) -> Vec<String> {
    validator
        .iter_errors(instance)
        .map(|e| format!("{what} at `{}`: {e}", e.instance_path()))
        .collect()
}

/// The namespaces in which the broker knows a service's consumer group.
fn namespaces_a_service_ran_in(consumer: &BaseConsumer) -> BTreeSet<String> {
    let pattern = namespace_pattern();
    consumer
        .fetch_group_list(None, TIMEOUT)
        .expect("the broker lists its consumer groups")
        .groups()
        .iter()
        .filter_map(|group| {
            let namespace = pattern.find(group.name())?.as_str();
            SERVICES
                .iter()
                .any(|s| group.name() == format!("{namespace}{s}"))
                .then(|| namespace.to_owned())
        })
        .collect()
}

fn topics_in(consumer: &BaseConsumer, namespaces: &BTreeSet<String>) -> Vec<String> {
    let pattern = namespace_pattern();
    consumer
        .fetch_metadata(None, TIMEOUT)
        .expect("the broker lists its topics")
        .topics()
        .iter()
        .map(|t| t.name().to_owned())
        .filter(|t| {
            pattern
                .find(t)
                .is_some_and(|n| namespaces.contains(n.as_str()))
        })
        .collect()
}
