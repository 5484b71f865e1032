//! docs/asyncapi.yaml held to the code, so the contract a reader trusts cannot drift from
//! what the services send: its channels are exactly `Topics`, each topic's messages
//! exactly the catalog's types, each payload schema exactly the fields the payload struct
//! sends (and requires exactly those it always sends), its headers those the outbox, its
//! trace context propagator and the dead-letter code write, and every example decodes
//! with the services' decoders.
//! scripts/check-docs checks that it is valid AsyncAPI; this checks that it is true.
//! Each check returns what differs, so a failure names the field, type or topic.

use std::collections::BTreeSet;
use std::path::Path;

use saga::Topics;
use saga::envelope::{Envelope, EnvelopeError};
use saga::events::{self, *};
use serde_json::{Value, json};
use uuid::Uuid;

#[path = "asyncapi/document.rs"]
mod document;
use document::*;

const ORDER: &str = "0b8e7f5c-8d1a-4f7e-9a57-3c1f2e4d5b6a";

#[test]
fn the_channels_are_exactly_the_topics_of_the_code() {
    assert_none(channel_problems(&contract()));
}

#[test]
fn each_topic_carries_exactly_the_catalogs_types() {
    assert_none(type_problems(&contract()));
}

#[test]
fn each_payload_schema_has_exactly_the_fields_its_struct_sends() {
    assert_none(payload_problems(&contract()));
}

#[test]
fn every_example_decodes_with_the_services_decoders() {
    assert_none(example_problems(&contract()));
}

#[test]
fn the_headers_are_those_the_code_writes() {
    assert_none(header_problems(&contract()));
}

#[test]
fn a_topic_missing_from_the_document_is_named() {
    let mut doc = contract();
    doc["channels"]
        .as_object_mut()
        .unwrap()
        .remove("notifications");
    assert_names(channel_problems(&doc), &["notifications"]);
}

#[test]
fn a_type_missing_from_its_topic_is_named() {
    let mut doc = contract();
    doc["channels"]["orders"]["messages"]
        .as_object_mut()
        .unwrap()
        .remove(ORDER_REFUNDED);
    assert_names(type_problems(&doc), &["order.refunded"]);
}

#[test]
fn a_field_renamed_in_the_document_alone_is_named_both_ways() {
    let mut doc = contract();
    let refunded = &mut doc["components"]["schemas"]["PaymentRefunded"];
    let properties = refunded["properties"].as_object_mut().unwrap();
    let charge = properties.remove("charge_id").unwrap();
    properties.insert("charge".into(), charge);
    refunded["required"] = json!(["order_id", "amount_cents", "charge", "refund_id"]);
    assert_names(payload_problems(&doc), &["`charge_id`", "`charge`"]);
}

#[test]
fn a_required_field_the_code_does_not_always_send_is_named() {
    let mut doc = contract();
    doc["components"]["schemas"]["PaymentResult"]["required"]
        .as_array_mut()
        .unwrap()
        .push(json!("reason"));
    assert_names(payload_problems(&doc), &["`reason`"]);
}

#[test]
fn an_example_the_decoders_refuse_is_named_with_their_reason() {
    let mut doc = contract();
    doc["components"]["messages"][PAYMENT_SUCCEEDED]["examples"][0]["payload"]["payload"]["amount_cents"] =
        json!("lots");
    assert_names(example_problems(&doc), &["amount_cents"]);
}

#[test]
fn additional_properties_false_where_the_decoders_accept_them_is_named() {
    let mut doc = contract();
    doc["components"]["schemas"]["PaymentVoided"]["additionalProperties"] = json!(false);
    assert_names(payload_problems(&doc), &["PaymentVoided"]);
}

#[test]
fn a_header_the_code_does_not_write_is_named() {
    let mut doc = contract();
    doc["components"]["schemas"]["EventHeaders"]["properties"]["baggage"] =
        json!({"type": "string"});
    assert_names(header_problems(&doc), &["baggage"]);
}

#[test]
fn a_trace_context_header_missing_from_the_document_is_named() {
    let mut doc = contract();
    doc["components"]["schemas"]["EventHeaders"]["properties"]
        .as_object_mut()
        .unwrap()
        .remove("tracestate");
    assert_names(header_problems(&doc), &["tracestate"]);
}

// The checks.

fn channel_problems(doc: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    // Under no namespace and under one: the prefix must sit where Topics puts it.
    for namespace in ["", "t0123456789ab."] {
        let code: BTreeSet<String> = Topics::new(namespace).all().into_iter().collect();
        let document: BTreeSet<String> = channels(doc)
            .map(|(_, channel)| address(channel, namespace))
            .collect();
        differ(
            &mut problems,
            &format!("topics under namespace `{namespace}`"),
            &code,
            &document,
        );
    }
    problems
}

fn type_problems(doc: &Value) -> Vec<String> {
    let topics = Topics::new("");
    let expected = |topic: &str| -> BTreeSet<String> {
        let types: &[&str] = match topic {
            t if t == topics.orders => &ORDERS_TYPES,
            t if t == topics.payments => &PAYMENTS_TYPES,
            t if t == topics.notifications => &[NOTIFICATION_SENT],
            _ => &[DEAD_LETTER],
        };
        types.iter().map(|t| t.to_string()).collect()
    };
    let mut problems = Vec::new();
    for (name, channel) in channels(doc) {
        let topic = address(channel, "");
        let mut document = BTreeSet::new();
        for (key, message) in messages(doc, channel) {
            let declared = event_type(doc, message).unwrap_or(DEAD_LETTER);
            if declared != key {
                problems.push(format!(
                    "channel {name}: message `{key}` has payload type `{declared}`"
                ));
            }
            document.insert(key.to_owned());
        }
        differ(
            &mut problems,
            &format!("types on topic {topic}"),
            &expected(&topic),
            &document,
        );
    }
    for event in ORDERS_TYPES
        .iter()
        .chain(&PAYMENTS_TYPES)
        .chain(&[NOTIFICATION_SENT])
    {
        let senders = operations(doc, "send", event);
        if senders.len() != 1 {
            problems.push(format!(
                "`{event}` is sent by {} operations ({senders:?}); one service writes each type",
                senders.len()
            ));
        }
    }
    problems
}

fn payload_problems(doc: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let envelope = value(&sample_envelope(json!({})));
    let schema = json!({"$ref": "#/components/schemas/Envelope"});
    compare(
        doc,
        "the envelope",
        &schema,
        &envelope,
        &envelope,
        &mut problems,
    );
    for (event, message) in event_messages(doc) {
        let Some((full, minimal)) = samples(event) else {
            problems.push(format!("`{event}`: no payload struct known for it here"));
            continue;
        };
        match payload_schema(doc, message) {
            Some(schema) => compare(doc, event, schema, &full, &minimal, &mut problems),
            None => problems.push(format!("`{event}`: no payload schema")),
        }
    }
    problems
}

fn example_problems(doc: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    for (key, message) in all_messages(doc) {
        let examples = resolve(doc, &message["examples"]).as_array();
        if examples.is_none_or(Vec::is_empty) {
            problems.push(format!("`{key}` has no example"));
        }
        for example in examples.into_iter().flatten() {
            let name = format!("`{key}` example {}", example["name"]);
            if let Err(problem) = check_example(key, example) {
                problems.push(format!("{name}: {problem}"));
            }
        }
    }
    problems
}

fn header_problems(doc: &Value) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let read = |file: &str| std::fs::read_to_string(src.join(file)).unwrap();
    // The outbox's headers and the redrive's are written as `key: "…"`; the dead
    // letters' as `("dlq.…", value)` pairs. The trace context's are what W3C's
    // propagator injects: `saga::trace::fields()`, the propagator's own list.
    let mut event_headers = literals_after(&read("outbox.rs"), "key: \"");
    event_headers.extend(literals_after(&read("redrive.rs"), "key: \""));
    event_headers.extend(saga::trace::fields());
    let dead_letter_headers: BTreeSet<String> =
        literals_after(&read("consumer/dead_letters.rs"), "(\"dlq.")
            .into_iter()
            .map(|name| format!("dlq.{name}"))
            .collect();
    let mut problems = Vec::new();
    for (name, code) in [
        ("EventHeaders", event_headers),
        ("DeadLetterHeaders", dead_letter_headers),
    ] {
        let schema = &doc["components"]["schemas"][name];
        differ(
            &mut problems,
            &format!("headers ({name})"),
            &code,
            &keys(&schema["properties"]),
        );
    }
    // Every dead-letter header is set on every dead letter.
    let dead_letters = &doc["components"]["schemas"]["DeadLetterHeaders"];
    differ(
        &mut problems,
        "required dead-letter headers",
        &keys(&dead_letters["properties"]),
        &strings(&dead_letters["required"]),
    );
    problems
}

// How a payload schema is compared with its struct.

/// A sample of each type's payload struct: with every optional field set, and with none.
fn samples(event: &str) -> Option<(Value, Value)> {
    let order_id: Uuid = ORDER.parse().unwrap();
    let both = |value: Value| Some((value.clone(), value));
    let outcome = |reason: Option<&str>| OrderOutcome {
        order_id,
        customer_id: "cust-1".into(),
        amount_cents: 2598,
        reason: reason.map(str::to_owned),
    };
    let result = |reason: Option<&str>| PaymentResult {
        order_id,
        amount_cents: 2598,
        reason: reason.map(str::to_owned),
    };
    match event {
        ORDER_CREATED => both(value(&OrderCreated {
            order_id,
            customer_id: "cust-1".into(),
            amount_cents: 2598,
            items: vec![OrderItem {
                product_id: Uuid::new_v4(),
                quantity: 2,
                unit_price_cents: 1299,
            }],
        })),
        ORDER_CONFIRMED | ORDER_CANCELLED => {
            Some((value(&outcome(Some("customer"))), value(&outcome(None))))
        }
        PAYMENT_SUCCEEDED | PAYMENT_FAILED => {
            Some((value(&result(Some("declined"))), value(&result(None))))
        }
        ORDER_REFUNDED => both(value(&OrderRefunded {
            order_id,
            customer_id: "cust-1".into(),
            amount_cents: 2598,
        })),
        PAYMENT_REFUNDED => both(value(&PaymentRefunded {
            order_id,
            amount_cents: 2598,
            charge_id: "ch_1".into(),
            refund_id: "re_1".into(),
        })),
        PAYMENT_VOIDED => both(value(&PaymentVoided {
            order_id,
            reason: "not_charged".into(),
        })),
        PAYMENT_REFUND_FAILED => {
            let failed = |charge_id: Option<&str>| PaymentRefundFailed {
                order_id,
                amount_cents: 2598,
                charge_id: charge_id.map(str::to_owned),
                reason: "charge_disputed".into(),
                manual: charge_id.is_none(),
                attempt: 1,
            };
            Some((value(&failed(Some("ch_1"))), value(&failed(None))))
        }
        NOTIFICATION_SENT => both(value(&NotificationSent {
            order_id,
            customer_id: "cust-1".into(),
            message: "Your order is confirmed.".into(),
        })),
        _ => None,
    }
}

fn value<T: serde::Serialize>(sample: &T) -> Value {
    serde_json::to_value(sample).unwrap()
}

/// Compares `schema` with what the code sends: `full` (every optional field set) names
/// every property, `minimal` (none set) the required ones. Nested objects, and arrays of
/// them, are compared the same way.
fn compare(
    doc: &Value,
    what: &str,
    schema: &Value,
    full: &Value,
    minimal: &Value,
    problems: &mut Vec<String>,
) {
    let what = match schema["$ref"].as_str().and_then(|r| r.rsplit('/').next()) {
        Some(name) => format!("{what} ({name})"),
        None => what.to_owned(),
    };
    let schema = resolve(doc, schema);
    let (Some(full), Some(minimal)) = (full.as_object(), minimal.as_object()) else {
        return;
    };
    let properties = keys(&schema["properties"]);
    let sent: BTreeSet<String> = full.keys().cloned().collect();
    for field in sent.difference(&properties) {
        problems.push(format!(
            "{what}: the code sends `{field}`, the document has no such property"
        ));
    }
    for field in properties.difference(&sent) {
        problems.push(format!(
            "{what}: the document has property `{field}`, the code sends no such field"
        ));
    }
    let always: BTreeSet<String> = minimal.keys().cloned().collect();
    let required = strings(&schema["required"]);
    for field in required.difference(&always) {
        problems.push(format!(
            "{what}: `{field}` is required in the document, the code does not always send it"
        ));
    }
    for field in always.difference(&required) {
        problems.push(format!(
            "{what}: the code always sends `{field}`, the document does not require it"
        ));
    }
    // serde ignores a field it does not know: a schema must not forbid one.
    if schema["additionalProperties"] == json!(false) {
        problems.push(format!(
            "{what}: additionalProperties is false, but the decoder ignores unknown fields"
        ));
    }
    for (field, value) in full {
        let property = &schema["properties"][field];
        let minimal = minimal.get(field).unwrap_or(&Value::Null);
        let (value, minimal, property) = match value {
            Value::Array(items) => (&items[0], &minimal[0], &resolve(doc, property)["items"]),
            _ => (value, minimal, property),
        };
        compare(
            doc,
            &format!("{what}.{field}"),
            property,
            value,
            minimal,
            problems,
        );
    }
}

// How an example is decoded.

/// Decodes `example` as the services do; a dead letter's value need only be an envelope.
fn check_example(key: &str, example: &Value) -> Result<(), String> {
    let bytes = serde_json::to_vec(&example["payload"]).unwrap();
    let envelope = Envelope::from_slice(&bytes).map_err(|e| e.to_string())?;
    if key == DEAD_LETTER {
        return Ok(());
    }
    if envelope.event_type != key {
        return Err(format!("its type is `{}`", envelope.event_type));
    }
    let order_id = decode(&envelope).map_err(|e| e.to_string())?;
    envelope
        .check_aggregate(order_id)
        .map_err(|e| e.to_string())?;
    for (header, value) in [
        ("event_id", &envelope.id),
        ("event_type", &envelope.event_type),
    ] {
        if let Some(said) = example["headers"][header].as_str()
            && said != value
        {
            return Err(format!(
                "header {header} `{said}` is not the envelope's `{value}`"
            ));
        }
    }
    // An unknown field is ignored, as the schemas' additionalProperties say.
    let mut extended = example["payload"].clone();
    extended["payload"]["not_a_field"] = json!(1);
    extended["not_a_field"] = json!(1);
    let extended = serde_json::to_vec(&extended).unwrap();
    Envelope::from_slice(&extended)
        .and_then(|envelope| decode(&envelope))
        .map_err(|e| format!("with an unknown field added: {e}"))?;
    Ok(())
}

/// The payload as the type's handler decodes it; its order id.
fn decode(envelope: &Envelope) -> Result<Uuid, EnvelopeError> {
    Ok(match envelope.event_type.as_str() {
        ORDER_CREATED => envelope.payload::<OrderCreated>()?.order_id,
        ORDER_CONFIRMED | ORDER_CANCELLED => envelope.payload::<OrderOutcome>()?.order_id,
        ORDER_REFUNDED => envelope.payload::<OrderRefunded>()?.order_id,
        PAYMENT_SUCCEEDED | PAYMENT_FAILED => envelope.payload::<PaymentResult>()?.order_id,
        PAYMENT_REFUNDED => envelope.payload::<PaymentRefunded>()?.order_id,
        PAYMENT_VOIDED => envelope.payload::<PaymentVoided>()?.order_id,
        PAYMENT_REFUND_FAILED => envelope.payload::<PaymentRefundFailed>()?.order_id,
        NOTIFICATION_SENT => envelope.payload::<NotificationSent>()?.order_id,
        other => panic!("no decoder known here for `{other}`"),
    })
}

fn sample_envelope(payload: Value) -> Envelope {
    let example = json!({"id": ORDER, "type": events::ORDER_CREATED, "aggregate_id": ORDER,
        "payload": payload, "occurred_at": "2026-07-14T09:15:38Z"});
    Envelope::from_slice(&serde_json::to_vec(&example).unwrap()).unwrap()
}

/// The string literals that follow `opening` in `source`.
fn literals_after(source: &str, opening: &str) -> BTreeSet<String> {
    source
        .split(opening)
        .skip(1)
        .filter_map(|rest| rest.split_once('"').map(|(literal, _)| literal.to_owned()))
        .collect()
}

fn differ(
    problems: &mut Vec<String>,
    what: &str,
    code: &BTreeSet<String>,
    document: &BTreeSet<String>,
) {
    let missing: Vec<_> = code.difference(document).collect();
    let extra: Vec<_> = document.difference(code).collect();
    if !missing.is_empty() {
        problems.push(format!(
            "{what}: in the code, not in the document: {missing:?}"
        ));
    }
    if !extra.is_empty() {
        problems.push(format!(
            "{what}: in the document, not in the code: {extra:?}"
        ));
    }
}

fn assert_none(problems: Vec<String>) {
    assert!(
        problems.is_empty(),
        "docs/asyncapi.yaml disagrees with the code:\n- {}",
        problems.join("\n- ")
    );
}

/// The check found a problem naming each of `what`, and no problem about anything else.
fn assert_names(problems: Vec<String>, what: &[&str]) {
    let named = |problem: &String| what.iter().any(|w| problem.contains(w));
    assert!(
        what.iter().all(|w| problems.iter().any(|p| p.contains(w))) && problems.iter().all(named),
        "expected problems naming {what:?} alone, got {problems:#?}"
    );
}
