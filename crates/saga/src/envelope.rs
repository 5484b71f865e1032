//! The wire format every event travels in, and the errors that say exactly what is wrong
//! with a record that does not fit it.
//!
//! People type these by hand into `kafka-console-producer`, so parsing is strict about
//! what matters (an id, a type, a payload object, a timestamp) and names the offending
//! field when it fails:
//!
//! ```json
//! {"id":"…","type":"payment.succeeded","aggregate_id":"<order id>",
//!  "payload":{"order_id":"…","amount_cents":2598},"occurred_at":"2026-07-14T09:15:40Z"}
//! ```
//!
//! It also refuses, at once and with the reason, what would parse here and fail later in
//! PostgreSQL, where a failure looks like a surprise worth retrying: an `id`, `type` or
//! `aggregate_id` longer than [`MAX_TEXT_BYTES`] (an id must fit the inbox's index), and a
//! NUL character in any string or key (PostgreSQL's `text` and `jsonb` cannot hold one).
//! JSON nested deeper than serde_json's limit (128) is not JSON to it.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// The longest `id`, `type` and `aggregate_id` accepted, in bytes. The saga's own ids are
/// at most a UUID and two suffixes (`<uuid>:payment:notification`, 57 bytes); PostgreSQL's
/// btree, which the inbox's primary key is, refuses an entry of more than about 2.7 kB.
pub const MAX_TEXT_BYTES: usize = 256;

/// One event on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// Deterministic id: redelivering the cause can only ever produce this same id, which
    /// is what lets `processed_events` recognise a duplicate.
    pub id: String,
    /// What happened, e.g. `payment.succeeded`; selects the handler.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The order the event is about. Also the Kafka key, so one order's events share a
    /// partition and are seen in order.
    pub aggregate_id: String,
    /// The event's own fields; decoded by the handler into its typed payload.
    pub payload: serde_json::Value,
    /// When the producing transaction decided it; for people and timelines, never for
    /// ordering decisions.
    #[serde(with = "time::serde::rfc3339")]
    pub occurred_at: OffsetDateTime,
    /// Where the consumer read this copy; not on the wire.
    #[serde(skip)]
    pub delivery: Delivery,
}

/// The record an event was read from: guard 1 stores it with the id it claims, so the
/// story of an order knows which copy of an event took effect. Empty for an event built
/// in code rather than read from the broker.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub topic: Option<String>,
    pub partition: Option<i32>,
    pub offset: Option<i64>,
    /// The consumer's log span for this copy: the lines its handler writes are in it.
    pub span: tracing::Span,
    /// Its process span in the order's trace ([`crate::trace::Hop::process`]): what its
    /// handler writes continues it.
    pub hop: crate::trace::Hop,
}

/// Two deliveries are the same copy when read from the same place, whatever their spans.
impl PartialEq for Delivery {
    fn eq(&self, other: &Self) -> bool {
        (&self.topic, self.partition, self.offset) == (&other.topic, other.partition, other.offset)
    }
}

impl Default for Delivery {
    fn default() -> Self {
        Self {
            topic: None,
            partition: None,
            offset: None,
            span: tracing::Span::none(),
            hop: crate::trace::Hop::default(),
        }
    }
}

impl Delivery {
    pub fn of<M: rdkafka::Message>(message: &M) -> Self {
        Self {
            topic: Some(message.topic().to_owned()),
            partition: Some(message.partition()),
            offset: Some(message.offset()),
            ..Self::default()
        }
    }
}

/// Why a record is not a usable event. Each variant can never succeed on retry, so a
/// consumer dead-letters the record at once.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum EnvelopeError {
    #[error("record has no value")]
    Empty,
    #[error("record is a tombstone (a key with a null value); events are never deleted by key")]
    Tombstone,
    #[error("record value is not UTF-8 JSON: {0}")]
    NotJson(String),
    #[error("envelope field `{path}`: {message}")]
    Field { path: String, message: String },
    #[error("envelope field `{0}` must not be empty")]
    EmptyField(&'static str),
    #[error("envelope field `{field}` is {bytes} bytes long; the most is {MAX_TEXT_BYTES}")]
    TooLong { field: &'static str, bytes: usize },
    #[error("`{path}` contains a NUL character (\\u0000), which PostgreSQL cannot store")]
    Nul { path: String },
    #[error("aggregate_id `{aggregate_id}` does not match payload order_id `{order_id}`")]
    AggregateMismatch {
        aggregate_id: String,
        order_id: String,
    },
    #[error("payload of {event_type} field `{path}`: {message}")]
    Payload {
        event_type: String,
        path: String,
        message: String,
    },
}

impl Envelope {
    /// Parses `message`'s value, and notes where it was read.
    pub fn from_message<M: rdkafka::Message>(message: &M) -> Result<Self, EnvelopeError> {
        let value = message.payload().ok_or(EnvelopeError::Tombstone)?;
        let mut envelope = Self::from_slice(value)?;
        envelope.delivery = Delivery::of(message);
        Ok(envelope)
    }

    /// Parses a Kafka record value.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, EnvelopeError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(EnvelopeError::Empty);
        }
        // Syntax errors first, so "not JSON" is told apart from "JSON of the wrong shape".
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| EnvelopeError::NotJson(e.to_string()))?;
        // JSON can carry a NUL only as the escape `\u0000`: without one in the bytes, no
        // walk of the tree is needed (the common case, on every event).
        if bytes.windows(6).any(|w| w.eq_ignore_ascii_case(b"\\u0000")) {
            find_nul(&value, &mut String::from("(root)"))?;
        }
        let envelope: Envelope = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let message = e.into_inner().to_string();
            EnvelopeError::Field {
                // A missing field is reported at the root (`.`); the message names it.
                path: if path == "." { "(root)".into() } else { path },
                message,
            }
        })?;
        if envelope.id.trim().is_empty() {
            return Err(EnvelopeError::EmptyField("id"));
        }
        if envelope.event_type.trim().is_empty() {
            return Err(EnvelopeError::EmptyField("type"));
        }
        for (field, text) in [
            ("id", &envelope.id),
            ("type", &envelope.event_type),
            ("aggregate_id", &envelope.aggregate_id),
        ] {
            if text.len() > MAX_TEXT_BYTES {
                return Err(EnvelopeError::TooLong {
                    field,
                    bytes: text.len(),
                });
            }
        }
        if !envelope.payload.is_object() {
            return Err(EnvelopeError::Field {
                path: "payload".into(),
                message: "must be a JSON object".into(),
            });
        }
        Ok(envelope)
    }

    /// Decodes the payload into the event's typed fields, naming the field that does not fit.
    pub fn payload<T: DeserializeOwned>(&self) -> Result<T, EnvelopeError> {
        serde_path_to_error::deserialize(&self.payload).map_err(|e| {
            let path = e.path().to_string();
            EnvelopeError::Payload {
                event_type: self.event_type.clone(),
                path: if path == "." { "(root)".into() } else { path },
                message: e.into_inner().to_string(),
            }
        })
    }

    /// Refuses an event whose key field disagrees with its payload: a hand-typed replay
    /// with a copy-paste slip must not be applied to the wrong order.
    pub fn check_aggregate(&self, order_id: uuid::Uuid) -> Result<(), EnvelopeError> {
        if self.aggregate_id.parse() == Ok(order_id) {
            return Ok(());
        }
        Err(EnvelopeError::AggregateMismatch {
            aggregate_id: self.aggregate_id.clone(),
            order_id: order_id.to_string(),
        })
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an envelope always serialises")
    }
}

/// The first string or key holding a NUL, as a path like `payload.items[0].sku`.
fn find_nul(value: &serde_json::Value, path: &mut String) -> Result<(), EnvelopeError> {
    use serde_json::Value;
    use std::fmt::Write as _;
    let found = |path: &str| EnvelopeError::Nul {
        path: path.strip_prefix("(root).").unwrap_or(path).to_owned(),
    };
    match value {
        Value::String(text) if text.contains('\0') => Err(found(path)),
        Value::Array(items) => items.iter().enumerate().try_for_each(|(i, item)| {
            let len = path.len();
            let _ = write!(path, "[{i}]");
            find_nul(item, path)?;
            path.truncate(len);
            Ok(())
        }),
        Value::Object(fields) => fields.iter().try_for_each(|(key, item)| {
            let len = path.len();
            path.push('.');
            if key.contains('\0') {
                path.push_str(&key.replace('\0', "\\u0000"));
                return Err(found(path));
            }
            path.push_str(key);
            find_nul(item, path)?;
            path.truncate(len);
            Ok(())
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::PaymentResult;

    const TYPED_BY_HAND: &str = r#"{"id":"o-1:payment","type":"payment.succeeded","aggregate_id":"0b8e7f5c-8d1a-4f7e-9a57-3c1f2e4d5b6a","payload":{"order_id":"0b8e7f5c-8d1a-4f7e-9a57-3c1f2e4d5b6a","amount_cents":2598},"occurred_at":"2026-07-14T09:15:40Z"}"#;

    #[test]
    fn parses_the_envelope_people_type_by_hand() {
        let envelope = Envelope::from_slice(TYPED_BY_HAND.as_bytes()).unwrap();
        assert_eq!(envelope.id, "o-1:payment");
        assert_eq!(envelope.event_type, "payment.succeeded");
        let payment: PaymentResult = envelope.payload().unwrap();
        assert_eq!(payment.amount_cents, 2598);
        assert_eq!(payment.reason, None);
    }

    #[test]
    fn round_trips_through_json() {
        let envelope = Envelope::from_slice(TYPED_BY_HAND.as_bytes()).unwrap();
        assert_eq!(Envelope::from_slice(&envelope.to_json()).unwrap(), envelope);
    }

    #[test]
    fn not_json_is_reported_as_such() {
        let err = Envelope::from_slice(b"hello {").unwrap_err();
        assert!(matches!(err, EnvelopeError::NotJson(_)), "{err:?}");
    }

    #[test]
    fn an_empty_record_is_reported_as_empty() {
        assert_eq!(
            Envelope::from_slice(b"  \n").unwrap_err(),
            EnvelopeError::Empty
        );
    }

    #[test]
    fn a_missing_field_is_named() {
        let err = Envelope::from_slice(br#"{"id":"x","type":"t","aggregate_id":"a","payload":{}}"#)
            .unwrap_err();
        assert!(err.to_string().contains("occurred_at"), "{err}");
    }

    #[test]
    fn a_malformed_timestamp_is_named() {
        let raw = TYPED_BY_HAND.replace("2026-07-14T09:15:40Z", "yesterday");
        let err = Envelope::from_slice(raw.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("occurred_at"), "{err}");
    }

    #[test]
    fn an_empty_id_is_refused() {
        let raw = TYPED_BY_HAND.replace("o-1:payment", " ");
        assert_eq!(
            Envelope::from_slice(raw.as_bytes()).unwrap_err(),
            EnvelopeError::EmptyField("id")
        );
    }

    #[test]
    fn an_id_too_long_for_the_inbox_is_refused_with_its_length() {
        let raw = TYPED_BY_HAND.replace("o-1:payment", &"x".repeat(10_000));
        assert_eq!(
            Envelope::from_slice(raw.as_bytes()).unwrap_err(),
            EnvelopeError::TooLong {
                field: "id",
                bytes: 10_000
            }
        );
        let longest = TYPED_BY_HAND.replace("o-1:payment", &"x".repeat(MAX_TEXT_BYTES));
        assert!(Envelope::from_slice(longest.as_bytes()).is_ok());
    }

    #[test]
    fn a_nul_anywhere_is_refused_with_where_it_is() {
        for (raw, path) in [
            (TYPED_BY_HAND.replace("o-1:payment", "o-1\\u0000"), "id"),
            (
                TYPED_BY_HAND.replace("\"amount_cents\":2598", "\"x\":[1,\"a\\u0000\"]"),
                "payload.x[1]",
            ),
            (
                TYPED_BY_HAND.replace("\"amount_cents\"", "\"amount\\u0000cents\""),
                "payload.amount\\u0000cents",
            ),
        ] {
            assert_eq!(
                Envelope::from_slice(raw.as_bytes()).unwrap_err(),
                EnvelopeError::Nul { path: path.into() },
                "{raw}"
            );
        }
    }

    #[test]
    fn an_escaped_backslash_before_u0000_is_no_nul() {
        let raw = TYPED_BY_HAND.replace("o-1:payment", "o-1\\\\u0000");
        assert_eq!(
            Envelope::from_slice(raw.as_bytes()).unwrap().id,
            "o-1\\u0000"
        );
    }

    #[test]
    fn json_nested_past_the_parser_limit_is_not_json() {
        let raw = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let err = Envelope::from_slice(raw.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("recursion limit"), "{err}");
    }

    #[test]
    fn invalid_utf8_is_not_json() {
        let mut raw = TYPED_BY_HAND.as_bytes().to_vec();
        raw[10] = 0xff;
        let err = Envelope::from_slice(&raw).unwrap_err();
        assert!(matches!(err, EnvelopeError::NotJson(_)), "{err:?}");
    }

    /// The event typed by hand with `amount` written in its payload's amount, parsed.
    fn with_amount(amount: &str) -> Envelope {
        Envelope::from_slice(TYPED_BY_HAND.replace("2598", amount).as_bytes()).unwrap()
    }

    #[test]
    fn an_amount_past_i64_is_named() {
        let err = with_amount("99999999999999999999")
            .payload::<PaymentResult>()
            .unwrap_err();
        assert!(err.to_string().contains("amount_cents"), "{err}");
    }

    /// Found by the `envelope` fuzz target: without serde_json's `float_roundtrip`, this
    /// number parsed one ulp away from where its own output parses.
    #[test]
    fn a_number_in_the_payload_survives_a_round_trip_exactly() {
        let envelope = with_amount("94999999999999999499999");
        assert_eq!(Envelope::from_slice(&envelope.to_json()).unwrap(), envelope);
    }

    #[test]
    fn a_payload_field_of_the_wrong_type_is_named_with_its_path() {
        let err = with_amount("\"lots\"")
            .payload::<PaymentResult>()
            .unwrap_err();
        assert!(err.to_string().contains("amount_cents"), "{err}");
    }
}
