//! Idempotency keys: the inbox pattern for HTTP. The consumers make a redelivered *event*
//! harmless with its id; an API makes a retried *request* harmless with the
//! `Idempotency-Key` the client sends (the IETF HTTPAPI draft "The Idempotency-Key HTTP
//! Header Field", and Stripe's API before it). The first request with a key does the work
//! and stores its response in the same transaction; every later one with that key gets
//! the stored response back, marked `Idempotent-Replayed: true`.
//!
//! This module holds what every keyed endpoint shares: reading the header
//! ([`IdempotencyKey::from_headers`]), telling "the same request" from "another request
//! under the same key" ([`Fingerprint`]), and answering a replay ([`replay`]). The SQL that
//! claims the key stays in the endpoint, next to the work it guards, as the guards' SQL
//! stays in each handler.

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The request header (the draft's name; HTTP header names are case-insensitive).
pub const HEADER: HeaderName = HeaderName::from_static("idempotency-key");
/// Set on a response that is a stored one replayed (Stripe's name; the draft has none).
pub const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// Stripe's limit; long enough for any UUID, ULID or `<client>:<request>` scheme.
pub const MAX_LENGTH: usize = 255;

/// A key as the client sent it, unquoted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

/// Why a request's `Idempotency-Key` header cannot be used. Each message names the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("Idempotency-Key is sent more than once; send one")]
    Repeated,
    #[error("Idempotency-Key must not be empty")]
    Empty,
    #[error("Idempotency-Key must be at most {MAX_LENGTH} characters, this one has {0}")]
    TooLong(usize),
    #[error(
        "Idempotency-Key must be a quoted string (\"8e03978e-…\", RFC 9651) or a bare key of \
         visible ASCII characters without quotes, backslashes, commas or semicolons: {0}"
    )]
    Malformed(String),
}

impl IdempotencyKey {
    /// The request's key: `None` without the header, an error if it is unusable.
    pub fn from_headers(headers: &HeaderMap) -> Result<Option<Self>, KeyError> {
        let mut values = headers.get_all(&HEADER).iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(KeyError::Repeated);
        }
        Self::parse(value.as_bytes()).map(Some)
    }

    /// Accepts the draft's form, a structured-field string (`"8e03978e-…"`, parameters
    /// ignored as RFC 9651 asks of unknown ones), and the bare key Stripe's clients send
    /// (`8e03978e-…`). Commas are refused in a bare key because a proxy joins repeated
    /// header lines with them.
    pub fn parse(value: &[u8]) -> Result<Self, KeyError> {
        let value = value.trim_ascii();
        let key = if value.first() == Some(&b'"') {
            let item: sfv::Item = sfv::Parser::new(value)
                .parse()
                .map_err(|error| KeyError::Malformed(error.to_string()))?;
            match item.bare_item {
                sfv::BareItem::String(key) => key.as_str().to_owned(),
                _ => return Err(KeyError::Malformed("not a string".to_owned())),
            }
        } else {
            if let Some(bad) = value
                .iter()
                .find(|&&b| !b.is_ascii_graphic() || b"\"\\,;".contains(&b))
            {
                return Err(KeyError::Malformed(format!(
                    "{:?} is not allowed in a bare key",
                    char::from(*bad)
                )));
            }
            String::from_utf8(value.to_vec()).expect("visible ASCII is UTF-8")
        };
        match key.len() {
            0 => Err(KeyError::Empty),
            n if n > MAX_LENGTH => Err(KeyError::TooLong(n)),
            _ => Ok(Self(key)),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What makes two requests "the same request": method, path, and the body as parsed, so
/// whitespace and the order of an object's keys do not count, and every value does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// SHA-256 of `METHOD path\n` and `body` written with every object's keys sorted.
    pub fn of(method: &str, path: &str, body: &Value) -> Self {
        let mut digest = Sha256::new();
        digest.update(format!("{method} {path}\n"));
        digest.update(serde_json::to_vec(&sorted(body)).expect("a Value serializes"));
        Self(digest.finalize().into())
    }

    /// As stored in a `bytea` column.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// `value` with the keys of every object in sorted order, whether serde_json's maps keep
/// insertion order (its `preserve_order` feature, which any crate in the build may turn
/// on) or not.
fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by_key(|(key, _)| *key);
            Value::Object(
                entries
                    .into_iter()
                    .map(|(key, value)| (key.clone(), sorted(value)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// A JSON response with the given `status`, `Location` and `body`, already serialized so
/// that a replay can send the very bytes of the first answer.
pub fn response(status: StatusCode, location: &str, body: String) -> Response {
    (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (
                header::LOCATION,
                HeaderValue::try_from(location).expect("a path is a valid header value"),
            ),
        ],
        body,
    )
        .into_response()
}

/// The stored first answer, sent again and marked as a replay.
pub fn replay(status: StatusCode, location: &str, body: String) -> Response {
    ::metrics::counter!(crate::metrics::IDEMPOTENCY_REPLAYS).increment(1);
    let mut response = response(status, location, body);
    response
        .headers_mut()
        .insert(REPLAYED, HeaderValue::from_static("true"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(value: &str) -> Result<String, KeyError> {
        IdempotencyKey::parse(value.as_bytes()).map(|key| key.0)
    }

    #[test]
    fn the_drafts_quoted_form_and_stripes_bare_form_give_the_same_key() {
        let uuid = "8e03978e-40d5-43e8-bc93-6894a57f9324";
        assert_eq!(parse(&format!("\"{uuid}\"")).unwrap(), uuid);
        assert_eq!(parse(uuid).unwrap(), uuid);
        assert_eq!(parse(&format!(" \"{uuid}\";v=1 ")).unwrap(), uuid);
        assert_eq!(parse(r#""a \"quoted\" key""#).unwrap(), r#"a "quoted" key"#);
    }

    #[test]
    fn an_unusable_key_is_refused_naming_the_rule() {
        assert_eq!(parse(""), Err(KeyError::Empty));
        assert_eq!(parse(r#""""#), Err(KeyError::Empty));
        assert_eq!(parse(&"k".repeat(256)), Err(KeyError::TooLong(256)));
        assert_eq!(parse(&"k".repeat(255)).unwrap().len(), 255);
        for bad in [r#""unterminated"#, "two words", "a,b", "a;b", r#""a", "b""#] {
            assert!(
                matches!(parse(bad), Err(KeyError::Malformed(_))),
                "{bad}: {:?}",
                parse(bad)
            );
        }
        assert!(matches!(parse(r#""é""#), Err(KeyError::Malformed(_))));
    }

    #[test]
    fn a_header_sent_twice_is_refused_and_a_missing_one_is_none() {
        let mut headers = HeaderMap::new();
        assert_eq!(IdempotencyKey::from_headers(&headers), Ok(None));
        headers.append(&HEADER, HeaderValue::from_static("a"));
        assert_eq!(
            IdempotencyKey::from_headers(&headers)
                .unwrap()
                .unwrap()
                .as_str(),
            "a"
        );
        headers.append(&HEADER, HeaderValue::from_static("a"));
        assert_eq!(
            IdempotencyKey::from_headers(&headers),
            Err(KeyError::Repeated)
        );
    }

    #[test]
    fn key_order_and_whitespace_do_not_change_the_fingerprint_but_values_do() {
        let a: Value = serde_json::from_str(r#"{"b": [{"y": 1, "x": 2}], "a": "s"}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":"s","b":[{"x":2,"y":1}]}"#).unwrap();
        let of = |body: &Value| Fingerprint::of("POST", "/v1/orders", body);
        assert_eq!(of(&a), of(&b));
        assert_ne!(of(&a), of(&json!({"a": "s", "b": [{"x": 2, "y": 2}]})));
        assert_ne!(of(&a), of(&json!({"a": "s", "b": [{"x": 2, "y": 1}, {}]})));
        assert_ne!(of(&a), Fingerprint::of("POST", "/v1/other", &a));
    }
}
