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
//! a replayed event shows as a process span in the original's trace that met guard 1. A
//! record of another consumer's type on a shared topic has none ([`crate::Handler::ignores`]):
//! each order's trace would otherwise hold a span for every such record, saying only that.
//!
//! Only these hops are exported, each a [`Hop`] made with OpenTelemetry's own API, its
//! attributes given at once; the log's `tracing` spans and events stay in the log. Bridged
//! from `tracing` instead (`tracing-opentelemetry`), each hop was a `tracing` span that the
//! bridge looked up again for every attribute and made current again at every poll: near
//! a third of what traces cost the services (the benchmark's history has the figures).
//! What a handler writes continues its process span because the hop is current while the
//! handler runs ([`Hop::scope`], [`current_carrier`]).
//!
//! Spans are made only where [`crate::telemetry`] exports them
//! (`OTEL_EXPORTER_OTLP_ENDPOINT`). A service that does not export still carries the
//! context it was given: its hop is the caller's context, unchanged, and what it writes
//! and calls continues that, so the next service that exports joins the same trace. One
//! service without a collector leaves a gap in a trace, never a break. With no context
//! given, a hop is empty, and nothing is written to headers or the outbox.

use std::fmt::Display;
use std::future::Future;
use std::sync::OnceLock;

use futures::future::Either;
use opentelemetry::context::FutureExt as _;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{Link, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracer;
use rdkafka::message::{Header, Headers, OwnedHeaders};

static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// Whether spans are exported, so trace context is worth carrying.
pub fn enabled() -> bool {
    TRACER.get().is_some()
}

/// Makes hops with `tracer` from now on; the first call wins (tests start several
/// services in one process).
pub(crate) fn enable(tracer: SdkTracer) {
    let _ = TRACER.set(tracer);
}

/// The header names trace context travels in, on Kafka records and HTTP requests alike.
pub fn fields() -> Vec<String> {
    TraceContextPropagator::new()
        .fields()
        .map(str::to_owned)
        .collect()
}

/// A trace context as its two W3C values, as an outbox row stores them: `traceparent`,
/// and `tracestate` when it is not empty. Both `None` when tracing is off or nothing is
/// traced.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Carrier {
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

impl Injector for Carrier {
    fn set(&mut self, key: &str, value: String) {
        // The propagator writes `tracestate` even when it is empty: no value for nothing.
        if value.is_empty() {
            return;
        }
        match key {
            "traceparent" => self.traceparent = Some(value),
            "tracestate" => self.tracestate = Some(value),
            _ => {}
        }
    }
}

impl Extractor for Carrier {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => self.traceparent.as_deref(),
            "tracestate" => self.tracestate.as_deref(),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent", "tracestate"]
    }
}

/// The trace context of the hop the caller runs in, as a carrier: a handler's outbox rows
/// continue its record's process span, or the request's server span.
pub fn current_carrier() -> Carrier {
    let mut carrier = Carrier::default();
    TraceContextPropagator::new().inject_context(&Context::current(), &mut carrier);
    carrier
}

/// The remote context a carrier holds (none if it holds no valid `traceparent`).
fn context_from(carrier: &dyn Extractor) -> Context {
    TraceContextPropagator::new().extract(carrier)
}

/// One hop of an order's trace: an exported span, ended when the last clone of its hop
/// is dropped. Where spans are not exported, the context it was given, carried on; empty,
/// and free, where there is none.
#[derive(Debug, Clone, Default)]
pub struct Hop(Option<Context>);

impl Hop {
    /// The hop of a service that exports nothing: `parent` passed on as it came.
    fn carried(parent: Context) -> Self {
        Self(parent.span().span_context().is_valid().then_some(parent))
    }

    /// Starts a span under `parent`, also linked to it if `link` (a consumer's, as the
    /// messaging conventions ask); under nothing if `parent` holds no valid span.
    fn start(
        name: String,
        kind: SpanKind,
        parent: &Context,
        link: bool,
        attributes: Vec<KeyValue>,
    ) -> Self {
        let Some(tracer) = TRACER.get() else {
            return Self(None);
        };
        let mut builder = tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes);
        let remote = parent.span().span_context().clone();
        if link && remote.is_valid() {
            builder = builder.with_links(vec![Link::with_context(remote)]);
        }
        let span = builder.start_with_context(tracer, parent);
        Self(Some(parent.with_span(span)))
    }

    /// A consumer's process span for one record, continuing (parent and link) the send
    /// span whose context the record's headers carry.
    pub fn process<M: rdkafka::Message>(message: &M, group: &str) -> Self {
        let headers = message.headers().map(RecordHeaders);
        let parent = headers
            .as_ref()
            .map_or_else(Context::new, |headers| context_from(headers));
        if !enabled() {
            return Self::carried(parent);
        }
        let key = message
            .key()
            .map(String::from_utf8_lossy)
            .unwrap_or_default();
        // A hand-made record may have no `event_id` header: then no message id.
        let id = headers.as_ref().and_then(|headers| headers.get("event_id"));
        let mut attributes = messaging(message.topic(), "process", &key, id);
        attributes.extend([
            KeyValue::new("messaging.consumer.group.name", group.to_owned()),
            KeyValue::new(
                "messaging.destination.partition.id",
                message.partition().to_string(),
            ),
            KeyValue::new("messaging.kafka.offset", message.offset()),
        ]);
        let name = format!("process {}", message.topic());
        Self::start(name, SpanKind::Consumer, &parent, true, attributes)
    }

    /// The relay's producer span for one outbox row's record, continuing the context the
    /// row was written in (`stored`: its columns).
    pub fn send(topic: &str, key: &str, event_id: &str, stored: impl FnOnce() -> Carrier) -> Self {
        let parent = context_from(&stored());
        if !enabled() {
            return Self::carried(parent);
        }
        let attributes = messaging(topic, "send", key, Some(event_id));
        Self::start(
            format!("send {topic}"),
            SpanKind::Producer,
            &parent,
            false,
            attributes,
        )
    }

    /// A server span for one request (`POST /v1/orders`: its method and its route),
    /// continuing the caller's context if its headers carry one.
    pub fn server(method: &str, route: &str, path: &str, headers: &HttpHeaders<'_>) -> Self {
        if !enabled() {
            return Self::carried(context_from(headers));
        }
        let attributes = vec![
            KeyValue::new("http.request.method", method.to_owned()),
            KeyValue::new("http.route", route.to_owned()),
            KeyValue::new("url.path", path.to_owned()),
        ];
        let name = format!("{method} {route}");
        Self::start(
            name,
            SpanKind::Server,
            &context_from(headers),
            false,
            attributes,
        )
    }

    /// A client span for a call to another system over HTTP (`POST /v1/charges`: the
    /// request's method and its URL's path; `url` whole), under the hop the caller runs
    /// in. [`Hop::inject`] puts its context on the request.
    pub fn client(method: &str, path: &str, url: &str) -> Self {
        if !enabled() {
            return Self::carried(Context::current());
        }
        let attributes = vec![
            KeyValue::new("http.request.method", method.to_owned()),
            KeyValue::new("url.full", url.to_owned()),
        ];
        let name = format!("{method} {path}");
        Self::start(
            name,
            SpanKind::Client,
            &Context::current(),
            false,
            attributes,
        )
    }

    /// Sets an attribute, for a figure known only after the span began.
    pub fn set(&self, key: &'static str, value: impl Into<Value>) {
        if let Some(context) = &self.0 {
            context.span().set_attribute(KeyValue::new(key, value));
        }
    }

    /// What the guards made of a record, on its process span: `applied`, `duplicate`,
    /// `guarded`, `ignored` or `dead_lettered`.
    pub fn outcome(&self, outcome: &'static str) {
        self.set("saga.outcome", outcome);
    }

    /// Records on a send span where the broker put its record.
    pub fn sent(&self, partition: i32, offset: i64) {
        self.set("messaging.destination.partition.id", partition.to_string());
        self.set("messaging.kafka.offset", offset);
    }

    /// Marks the span as failed, with why.
    pub fn failed(&self, reason: impl Display) {
        if let Some(context) = &self.0 {
            context.span().set_status(Status::error(reason.to_string()));
        }
    }

    /// Runs `future` with this hop current: what it writes to the outbox, and the calls
    /// it makes, continue this span.
    pub fn scope<F: Future>(&self, future: F) -> impl Future<Output = F::Output> + use<F> {
        match &self.0 {
            Some(context) => Either::Left(future.with_context(context.clone())),
            None => Either::Right(future),
        }
    }

    /// `headers` with this hop's trace context added (unchanged when it has none).
    pub fn record_headers(&self, headers: OwnedHeaders) -> OwnedHeaders {
        let Some(context) = &self.0 else {
            return headers;
        };
        let mut injector = RecordInjector(Some(headers));
        TraceContextPropagator::new().inject_context(context, &mut injector);
        injector
            .0
            .expect("the injector always hands its headers back")
    }

    /// Adds this hop's trace context to an outgoing request's `headers`.
    pub fn inject(&self, headers: &mut axum::http::HeaderMap) {
        if let Some(context) = &self.0 {
            TraceContextPropagator::new().inject_context(context, &mut HttpInjector(headers));
        }
    }
}

fn messaging(topic: &str, operation: &'static str, key: &str, id: Option<&str>) -> Vec<KeyValue> {
    let mut attributes = vec![
        KeyValue::new("messaging.system", "kafka"),
        KeyValue::new("messaging.destination.name", topic.to_owned()),
        KeyValue::new("messaging.operation.type", operation),
        KeyValue::new("messaging.operation.name", operation),
        KeyValue::new("messaging.kafka.message.key", key.to_owned()),
    ];
    if let Some(id) = id.filter(|id| !id.is_empty()) {
        attributes.push(KeyValue::new("messaging.message.id", id.to_owned()));
    }
    attributes
}

/// A Kafka record's headers, read as a trace context carrier.
struct RecordHeaders<'a, H: Headers>(&'a H);

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

/// Adds trace context to a record's headers, which grow by value.
struct RecordInjector(Option<OwnedHeaders>);

impl Injector for RecordInjector {
    fn set(&mut self, key: &str, value: String) {
        if value.is_empty() {
            return;
        }
        self.0 = self.0.take().map(|headers| {
            headers.insert(Header {
                key,
                value: Some(&value),
            })
        });
    }
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

struct HttpInjector<'a>(&'a mut axum::http::HeaderMap);

impl Injector for HttpInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if value.is_empty() {
            return;
        }
        if let (Ok(name), Ok(value)) = (
            axum::http::HeaderName::from_bytes(key.as_bytes()),
            axum::http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}
