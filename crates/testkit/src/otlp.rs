//! An OTLP/HTTP receiver for tests and the benchmark: the services export their spans to
//! it (`OTEL_EXPORTER_OTLP_ENDPOINT` = [`OtlpSink::endpoint`]), and it keeps them decoded,
//! with every field a test asserts on (parents, links, kinds, attributes), which a viewer
//! such as Zipkin does not keep (it has no links). Or it counts and discards them
//! undecoded, so that the benchmark measures exporting, not storing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message as _;

/// One exported span, as a test reads it. Ids in lower-case hex, as `traceparent` has them.
#[derive(Debug, Clone)]
pub struct Span {
    pub service: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a trace's root.
    pub parent_span_id: String,
    pub name: String,
    /// `server`, `client`, `producer`, `consumer` or `internal`.
    pub kind: &'static str,
    pub attributes: HashMap<String, String>,
    /// The spans it links to, as (trace id, span id).
    pub links: Vec<(String, String)>,
    /// Whether its status is an error.
    pub failed: bool,
}

impl Span {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

#[derive(Default)]
struct Received {
    spans: Vec<Span>,
    count: u64,
}

/// A receiver listening on a free local port until dropped.
pub struct OtlpSink {
    endpoint: String,
    received: Arc<Mutex<Received>>,
    server: tokio::task::JoinHandle<()>,
}

impl OtlpSink {
    /// Starts a receiver that keeps every span.
    pub async fn keeping() -> Self {
        Self::start(true, None).await
    }

    /// Starts a receiver that keeps every span, over HTTPS with a certificate `ca` signed.
    pub async fn keeping_over_tls(ca: &crate::tls::TestCa) -> Self {
        Self::start(true, Some(ca.server())).await
    }

    /// Starts a receiver that counts spans, then drops them undecoded.
    pub async fn discarding() -> Self {
        Self::start(false, None).await
    }

    async fn start(keep: bool, tls: Option<(std::path::PathBuf, std::path::PathBuf)>) -> Self {
        let received = Arc::new(Mutex::new(Received::default()));
        let router = axum::Router::new()
            .route("/v1/traces", post(receive))
            .with_state((received.clone(), keep));
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free local port");
        let address = tcp.local_addr().expect("a bound listener's address");
        let listener = match tls {
            Some((cert, key)) => {
                saga::https::Listener::tls(tcp, &cert, &key).expect("the test CA's certificate")
            }
            None => saga::https::Listener::plain(tcp),
        };
        let endpoint = format!("{}://{address}", listener.scheme());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Self {
            endpoint,
            received,
            server,
        }
    }

    /// What `OTEL_EXPORTER_OTLP_ENDPOINT` is set to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Every span kept so far.
    pub fn spans(&self) -> Vec<Span> {
        self.received.lock().expect("not poisoned").spans.clone()
    }

    /// The spans kept so far in trace `trace_id`.
    pub fn trace(&self, trace_id: &str) -> Vec<Span> {
        let received = self.received.lock().expect("not poisoned");
        let spans = received
            .spans
            .iter()
            .filter(|span| span.trace_id == trace_id);
        spans.cloned().collect()
    }

    /// How many spans arrived, kept or not.
    pub fn count(&self) -> u64 {
        self.received.lock().expect("not poisoned").count
    }
}

impl Drop for OtlpSink {
    fn drop(&mut self) {
        self.server.abort();
    }
}

type Sink = (Arc<Mutex<Received>>, bool);

async fn receive(State((received, keep)): State<Sink>, body: Bytes) -> StatusCode {
    if !keep {
        let Ok(request) = Counted::decode(body) else {
            return StatusCode::BAD_REQUEST;
        };
        received.lock().expect("not poisoned").count += request.spans();
        return StatusCode::OK;
    }
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return StatusCode::BAD_REQUEST;
    };
    let mut spans = Vec::new();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|resource| &resource.attributes)
            .find(|attribute| attribute.key == "service.name")
            .and_then(|attribute| attribute.value.as_ref())
            .map(text)
            .unwrap_or_default();
        for span in resource
            .scope_spans
            .into_iter()
            .flat_map(|scope| scope.spans)
        {
            spans.push(Span {
                service: service.clone(),
                trace_id: hex(&span.trace_id),
                span_id: hex(&span.span_id),
                parent_span_id: hex(&span.parent_span_id),
                kind: kind(span.kind),
                attributes: span
                    .attributes
                    .iter()
                    .filter_map(|kv| Some((kv.key.clone(), text(kv.value.as_ref()?))))
                    .collect(),
                links: span
                    .links
                    .iter()
                    .map(|link| (hex(&link.trace_id), hex(&link.span_id)))
                    .collect(),
                failed: span.status.is_some_and(|status| status.code == 2),
                name: span.name,
            });
        }
    }
    let mut received = received.lock().expect("not poisoned");
    received.count += spans.len() as u64;
    received.spans.extend(spans);
    StatusCode::OK
}

/// Just enough of an `ExportTraceServiceRequest` to count its spans: prost skips every
/// other field unread, so that a discarding receiver spends next to nothing of the cores
/// the services it measures run on.
#[derive(Clone, PartialEq, prost::Message)]
struct Counted {
    #[prost(message, repeated, tag = "1")]
    resource_spans: Vec<CountedResource>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct CountedResource {
    #[prost(message, repeated, tag = "2")]
    scope_spans: Vec<CountedScope>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct CountedScope {
    #[prost(message, repeated, tag = "2")]
    spans: Vec<Skipped>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Skipped {}

impl Counted {
    fn spans(&self) -> u64 {
        let scopes = self.resource_spans.iter().flat_map(|r| &r.scope_spans);
        scopes.map(|scope| scope.spans.len() as u64).sum()
    }
}

fn kind(kind: i32) -> &'static str {
    match SpanKind::try_from(kind) {
        Ok(SpanKind::Server) => "server",
        Ok(SpanKind::Client) => "client",
        Ok(SpanKind::Producer) => "producer",
        Ok(SpanKind::Consumer) => "consumer",
        _ => "internal",
    }
}

fn text(value: &AnyValue) -> String {
    match &value.value {
        Some(any_value::Value::StringValue(text)) => text.clone(),
        Some(any_value::Value::IntValue(number)) => number.to_string(),
        Some(any_value::Value::BoolValue(flag)) => flag.to_string(),
        Some(any_value::Value::DoubleValue(number)) => number.to_string(),
        other => format!("{other:?}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span as ProtoSpan};

    use super::*;

    #[test]
    fn the_count_without_decoding_finds_every_span_of_every_resource_and_scope() {
        let scope = |spans: usize| ScopeSpans {
            spans: vec![
                ProtoSpan {
                    name: "send orders".to_owned(),
                    ..ProtoSpan::default()
                };
                spans
            ],
            ..ScopeSpans::default()
        };
        let request = ExportTraceServiceRequest {
            resource_spans: vec![
                ResourceSpans {
                    scope_spans: vec![scope(3), scope(0), scope(2)],
                    ..ResourceSpans::default()
                },
                ResourceSpans {
                    scope_spans: vec![scope(4)],
                    ..ResourceSpans::default()
                },
            ],
        };
        let counted = Counted::decode(request.encode_to_vec().as_slice()).unwrap();
        assert_eq!(counted.spans(), 9);
    }
}
