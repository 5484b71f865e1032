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

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

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
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Delivery {
    pub topic: Option<String>,
    pub partition: Option<i32>,
    pub offset: Option<i64>,
}

impl Delivery {
    pub fn of<M: rdkafka::Message>(message: &M) -> Self {
        Self {
            topic: Some(message.topic().to_owned()),
            partition: Some(message.partition()),
            offset: Some(message.offset()),
        }
    }
}

/// Why a record is not a usable event. Each variant can never succeed on retry, so a
/// consumer dead-letters the record at once.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum EnvelopeError {
    #[error("record has no value")]
    Empty,
    #[error("record value is not UTF-8 JSON: {0}")]
    NotJson(String),
    #[error("envelope field `{path}`: {message}")]
    Field { path: String, message: String },
    #[error("envelope field `{0}` must not be empty")]
    EmptyField(&'static str),
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
        let mut envelope = Self::from_slice(message.payload().unwrap_or_default())?;
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
    fn a_payload_field_of_the_wrong_type_is_named_with_its_path() {
        let raw = TYPED_BY_HAND.replace("2598", "\"lots\"");
        let envelope = Envelope::from_slice(raw.as_bytes()).unwrap();
        let err = envelope.payload::<PaymentResult>().unwrap_err();
        assert!(err.to_string().contains("amount_cents"), "{err}");
    }
}
