//! One order's trace, from its first request to its last event: W3C trace context
//! (`traceparent`, `tracestate`) carried through everything an order passes, and the spans
//! each service adds to it, named by OpenTelemetry's messaging and HTTP conventions.
//!
//! The context travels like this, each hop a span whose context the next hop continues:
//!
//! ```text
//! POST /v1/orders ──server span──▶ outbox row (traceparent column)
//!   relay ──"send orders" (producer) span──▶ Kafka record headers
//!     consumer ──"process orders" (consumer) span, parent and link: the send span
//!       ├─ POST /v1/charges (client span) ──HTTP headers──▶ provider (server span)
//!       └─ outbox row written in the handler's transaction ──▶ relay ──▶ …
//! ```
//!
//! A process span's parent is the send span of the record it handles, so one order's
//! events make one trace; it also links to it, as the conventions ask of a consumer, so a
//! viewer that follows links finds the producer even where the parent is not kept. Each
//! record has its own process span in batches too. Its `saga.outcome` attribute says what
//! the guards made of it (`applied`, `duplicate`, `guarded`, `ignored`, `dead_lettered`):
//! a replayed event shows as a process span in the original's trace that met guard 1.
//!
//! Only these hops are exported: the spans that declare `otel.kind` ([`exported`]). A
//! handler's own span (`charge_order`, …) and every log line stay in the log, where they
//! were; exported too, they tripled what each order costs to trace, for nothing the hops
//! do not already say. What a handler writes continues its process span all the same
//! ([`current_carrier`]).
//!
//! Off unless [`crate::telemetry`] exports spans (`OTEL_EXPORTER_OTLP_ENDPOINT`): then
//! nothing is read from or written to headers or the outbox, and a span costs what a
//! logging span costs. A service that does not export does not carry the context on
//! either, so a trace is whole only where every service exports.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use rdkafka::message::{Headers, OwnedHeaders};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported, so trace context is worth carrying.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

pub(crate) fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// The header names trace context travels in, on Kafka records and HTTP requests alike.
pub fn fields() -> Vec<String> {
    TraceContextPropagator::new()
        .fields()
        .map(str::to_owned)
        .collect()
}

/// A span's trace context as its carrier's `name → value` pairs: `traceparent`, and
/// `tracestate` when it is not empty. Empty when tracing is off or the span is not traced.
pub fn carrier_of(span: &Span) -> HashMap<String, String> {
    if enabled() {
        carrier(&span.context())
    } else {
        HashMap::new()
    }
}

/// The trace context of the innermost exported span the caller runs in, as a carrier
/// (see [`carrier_of`]): a handler's outbox rows continue its record's process span, or
/// the request's server span, through any span of its own the exporter leaves out.
pub fn current_carrier() -> HashMap<String, String> {
    if enabled() {
        // Entering an exported span makes its context current; entering a span the
        // exporter leaves out does not, so the current context is the nearest hop's.
        carrier(&opentelemetry::Context::current())
    } else {
        HashMap::new()
    }
}

fn carrier(context: &opentelemetry::Context) -> HashMap<String, String> {
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(context, &mut carrier);
    // The propagator writes `tracestate` even when it is empty: no header for nothing.
    carrier.retain(|_, value| !value.is_empty());
    carrier
}

/// Whether a span is exported: only the hops, which declare `otel.kind`; no log event.
pub(crate) fn exported(metadata: &tracing::Metadata<'_>) -> bool {
    metadata.is_span() && metadata.fields().field("otel.kind").is_some()
}

/// The remote context a carrier holds (none if it holds no valid `traceparent`).
pub fn context_from(carrier: &dyn Extractor) -> opentelemetry::Context {
    TraceContextPropagator::new().extract(carrier)
}

/// Makes `span` continue the remote context in `carrier`: its parent, and, for a
/// consumer, also a link (`link`), as the messaging conventions ask. Before the span is
/// first entered: a started span's parent cannot change.
pub fn continue_from(span: &Span, carrier: &dyn Extractor, link: bool) {
    if !enabled() {
        return;
    }
    let parent = context_from(carrier);
    let remote = parent.span().span_context().clone();
    if !remote.is_valid() {
        return;
    }
    // Only fails when no layer exports this span, which `enabled` has ruled out.
    let _ = span.set_parent(parent);
    if link {
        span.add_link(remote);
    }
}

/// Names `span` for the viewer and says which side of a call or a record it is (`server`,
/// `client`, `producer`, `consumer`). The span must declare `otel.name` and `otel.kind`
/// as empty fields: recorded only when tracing is on, and never in the text log.
pub fn name(span: &Span, name: &str, kind: &'static str) {
    if enabled() {
        span.record("otel.name", name);
        span.record("otel.kind", kind);
    }
}

/// Sets an attribute on `span`'s exported form only (the log does not show it).
pub fn attribute(span: &Span, key: &'static str, value: impl Into<opentelemetry::Value>) {
    if enabled() {
        span.set_attribute(key, value);
    }
}

/// A Kafka record's headers, read as a trace context carrier.
pub struct RecordHeaders<'a, H: Headers>(pub &'a H);

impl<H: Headers> Extractor for RecordHeaders<'_, H> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|header| header.key == key)
            .and_then(|header| std::str::from_utf8(header.value?).ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|header| header.key).collect()
    }
}

/// `headers` with `span`'s trace context added (unchanged when tracing is off).
pub fn into_record_headers(mut headers: OwnedHeaders, span: &Span) -> OwnedHeaders {
    for (key, value) in carrier_of(span) {
        headers = headers.insert(rdkafka::message::Header {
            key: &key,
            value: Some(&value),
        });
    }
    headers
}

/// HTTP headers, read as a trace context carrier.
pub struct HttpHeaders<'a>(pub &'a axum::http::HeaderMap);

impl Extractor for HttpHeaders<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(axum::http::HeaderName::as_str).collect()
    }
}

/// A client span for a call to another system over HTTP (`POST /v1/charges`: the
/// request's method and its URL's path, as the client parsed it; `url` whole), whose
/// context [`inject`] puts on the request. `Span::none()` when tracing is off.
pub fn client_span(method: &str, path: &str, url: &str) -> Span {
    if !enabled() {
        return Span::none();
    }
    let span = tracing::info_span!(
        "call",
        otel.name = tracing::field::Empty,
        otel.kind = tracing::field::Empty,
    );
    name(&span, &format!("{method} {path}"), "client");
    attribute(&span, "http.request.method", method.to_owned());
    attribute(&span, "url.full", url.to_owned());
    span
}

/// Adds `span`'s trace context to an outgoing request's `headers`.
pub fn inject(span: &Span, headers: &mut axum::http::HeaderMap) {
    for (key, value) in carrier_of(span) {
        if let (Ok(name), Ok(value)) = (
            axum::http::HeaderName::from_bytes(key.as_bytes()),
            axum::http::HeaderValue::from_str(&value),
        ) {
            headers.insert(name, value);
        }
    }
}

/// Marks `span` as failed, with why.
pub fn failed(span: &Span, reason: impl std::fmt::Display) {
    if enabled() {
        span.set_status(opentelemetry::trace::Status::error(reason.to_string()));
    }
}

/// The relay's producer span for one outbox row's record, continuing the context the row
/// was written in (`stored`: its `traceparent` and `tracestate` columns, read only when
/// tracing is on). `Span::none()` when it is off: the relay sends hundreds of rows a look.
pub fn send_span(
    topic: &str,
    key: &str,
    event_id: &str,
    stored: impl FnOnce() -> HashMap<String, String>,
) -> Span {
    if !enabled() {
        return Span::none();
    }
    let span = tracing::info_span!(
        "send",
        event_id,
        otel.name = tracing::field::Empty,
        otel.kind = tracing::field::Empty,
    );
    name(&span, &format!("send {topic}"), "producer");
    continue_from(&span, &stored(), false);
    messaging(&span, topic, "send", key, event_id);
    span
}

/// Records on the send span where the broker put its record.
pub fn sent(span: &Span, partition: i32, offset: i64) {
    attribute(
        span,
        "messaging.destination.partition.id",
        partition.to_string(),
    );
    attribute(span, "messaging.kafka.offset", offset);
}

/// A consumer's process span for one record: the parent of everything its handler does,
/// continuing (parent and link) the send span whose context the record's headers carry.
/// Its fields are the log's: every line about the record is logged in it, and the fault
/// suite finds each offset's fate by `topic`, `partition` and `offset`.
pub fn process_span<M: rdkafka::Message>(message: &M, group: &str) -> Span {
    let span = tracing::info_span!(
        "record",
        topic = message.topic(),
        partition = message.partition(),
        offset = message.offset(),
        event_id = tracing::field::Empty,
        otel.name = tracing::field::Empty,
        otel.kind = tracing::field::Empty,
    );
    if !enabled() {
        return span;
    }
    name(&span, &format!("process {}", message.topic()), "consumer");
    if let Some(headers) = message.headers() {
        continue_from(&span, &RecordHeaders(headers), true);
    }
    let key = message
        .key()
        .map(String::from_utf8_lossy)
        .unwrap_or_default();
    let id = message
        .headers()
        .and_then(|headers| RecordHeaders(headers).get("event_id").map(str::to_owned))
        .unwrap_or_default();
    // A hand-made record may have no `event_id` header: then no message id.
    messaging(&span, message.topic(), "process", &key, &id);
    attribute(&span, "messaging.consumer.group.name", group.to_owned());
    sent(&span, message.partition(), message.offset());
    span
}

/// What the guards made of a record, on its process span: `applied`, `duplicate`,
/// `guarded`, `ignored` or `dead_lettered`.
pub fn outcome(span: &Span, outcome: &'static str) {
    attribute(span, "saga.outcome", outcome);
}

fn messaging(span: &Span, topic: &str, operation: &'static str, key: &str, event_id: &str) {
    attribute(span, "messaging.system", "kafka");
    attribute(span, "messaging.destination.name", topic.to_owned());
    attribute(span, "messaging.operation.type", operation);
    attribute(span, "messaging.operation.name", operation);
    attribute(span, "messaging.kafka.message.key", key.to_owned());
    if !event_id.is_empty() {
        attribute(span, "messaging.message.id", event_id.to_owned());
    }
}
