//! docs/asyncapi.yaml as JSON, and the ways into it the checks take.

use std::collections::BTreeSet;
use std::path::Path;

use saphyr::{LoadableYamlNode, ScalarOwned, YamlOwned};
use serde_json::{Map, Value, json};

/// The dead-letter topics' one message: the record as it was, with `dlq.*` headers.
pub(crate) const DEAD_LETTER: &str = "deadLetter";

pub(crate) fn contract() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/asyncapi.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut documents = YamlOwned::load_from_str(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(documents.len(), 1, "docs/asyncapi.yaml: one YAML document");
    to_json(documents.remove(0))
}

pub(crate) fn to_json(node: YamlOwned) -> Value {
    match node {
        YamlOwned::Value(ScalarOwned::Null) => Value::Null,
        YamlOwned::Value(ScalarOwned::Boolean(b)) => Value::Bool(b),
        YamlOwned::Value(ScalarOwned::Integer(i)) => json!(i),
        YamlOwned::Value(ScalarOwned::FloatingPoint(f)) => json!(f.into_inner()),
        YamlOwned::Value(ScalarOwned::String(s)) | YamlOwned::Representation(s, ..) => {
            Value::String(s)
        }
        YamlOwned::Sequence(items) => Value::Array(items.into_iter().map(to_json).collect()),
        YamlOwned::Mapping(mapping) => Value::Object(
            mapping
                .into_iter()
                .map(|(k, v)| match to_json(k) {
                    Value::String(k) => (k, to_json(v)),
                    other => (other.to_string(), to_json(v)),
                })
                .collect::<Map<_, _>>(),
        ),
        YamlOwned::Tagged(_, node) => to_json(*node),
        other => panic!("docs/asyncapi.yaml: no aliases or bad values, found {other:?}"),
    }
}

/// `value`, or what its `$ref` (`#/a/b`) points at, followed to the end.
pub(crate) fn resolve<'a>(doc: &'a Value, mut value: &'a Value) -> &'a Value {
    while let Some(reference) = value["$ref"].as_str() {
        let pointer = reference.strip_prefix('#').expect("only local references");
        value = doc
            .pointer(pointer)
            .unwrap_or_else(|| panic!("{reference} points at nothing"));
    }
    value
}

pub(crate) fn channels(doc: &Value) -> impl Iterator<Item = (&String, &Value)> {
    doc["channels"].as_object().into_iter().flatten()
}

pub(crate) fn address(channel: &Value, namespace: &str) -> String {
    channel["address"]
        .as_str()
        .expect("every channel has an address")
        .replace("{namespace}", namespace)
}

pub(crate) fn messages<'a>(
    doc: &'a Value,
    channel: &'a Value,
) -> impl Iterator<Item = (&'a str, &'a Value)> {
    channel["messages"]
        .as_object()
        .into_iter()
        .flatten()
        .map(move |(key, message)| (key.as_str(), resolve(doc, message)))
}

/// Every message of every channel, each once.
pub(crate) fn all_messages(doc: &Value) -> Vec<(&str, &Value)> {
    let mut seen = BTreeSet::new();
    channels(doc)
        .flat_map(|(_, channel)| messages(doc, channel))
        .filter(|(key, _)| seen.insert(*key))
        .collect()
}

pub(crate) fn event_messages(doc: &Value) -> Vec<(&str, &Value)> {
    all_messages(doc)
        .into_iter()
        .filter(|(key, _)| *key != DEAD_LETTER)
        .collect()
}

/// The part of a message's `allOf` that says its type and its payload's schema.
pub(crate) fn typed_part<'a>(doc: &'a Value, message: &'a Value) -> Option<&'a Value> {
    resolve(doc, &message["payload"])["allOf"]
        .as_array()?
        .iter()
        .map(|part| resolve(doc, part))
        .find(|part| part["properties"]["type"]["const"].is_string())
}

pub(crate) fn event_type<'a>(doc: &'a Value, message: &'a Value) -> Option<&'a str> {
    typed_part(doc, message)?["properties"]["type"]["const"].as_str()
}

/// The schema of a message's payload, as written (a `$ref` names it).
pub(crate) fn payload_schema<'a>(doc: &'a Value, message: &'a Value) -> Option<&'a Value> {
    let schema = &typed_part(doc, message)?["properties"]["payload"];
    schema.is_object().then_some(schema)
}

/// The operations of `action` whose messages include `event`.
pub(crate) fn operations<'a>(doc: &'a Value, action: &str, event: &str) -> Vec<&'a str> {
    let suffix = format!("/messages/{event}");
    doc["operations"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, op)| op["action"] == action)
        .filter(|(_, op)| {
            op["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|m| m["$ref"].as_str().is_some_and(|r| r.ends_with(&suffix)))
        })
        .map(|(name, _)| name.as_str())
        .collect()
}

pub(crate) fn keys(object: &Value) -> BTreeSet<String> {
    object
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, _)| k.clone())
        .collect()
}

pub(crate) fn strings(array: &Value) -> BTreeSet<String> {
    array
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}
