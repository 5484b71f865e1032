//! The trace viewer a test starts (`saga_e2e::viewer`): spans sent as OTLP over HTTP to its
//! collector reach its Zipkin, found there by trace id and by tag, each under its service.

use std::time::{SystemTime, UNIX_EPOCH};

use saga_e2e::viewer::{Viewer, services_of};
use serde_json::{Value, json};
use uuid::Uuid;

/// One span of `service` in OTLP's JSON encoding (the services send the same as protobuf).
fn otlp_span(
    service: &str,
    trace_id: &str,
    span_id: &str,
    parent: &str,
    tag: (&str, &str),
) -> Value {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    json!({ "resourceSpans": [{
        "resource": { "attributes": [
            { "key": "service.name", "value": { "stringValue": service } },
        ]},
        "scopeSpans": [{ "scope": { "name": "trace_view" }, "spans": [{
            "traceId": trace_id,
            "spanId": span_id,
            "parentSpanId": parent,
            "name": format!("{service} work"),
            "kind": 2,
            "startTimeUnixNano": (now - 5_000_000).to_string(),
            "endTimeUnixNano": now.to_string(),
            "attributes": [{ "key": tag.0, "value": { "stringValue": tag.1 } }],
        }]}],
    }]})
}

#[tokio::test]
async fn spans_sent_to_the_collector_are_found_in_zipkin_by_trace_id_and_by_tag_under_their_services()
 {
    let viewer = Viewer::start().await;
    let trace_id = Uuid::new_v4().simple().to_string();
    let order_id = Uuid::new_v4().to_string();
    let http = reqwest::Client::new();
    for (service, span_id, parent) in [
        ("order-service", "00f067aa0ba902b7", ""),
        ("payment-service", "00f067aa0ba902b8", "00f067aa0ba902b7"),
    ] {
        let body = otlp_span(service, &trace_id, span_id, parent, ("order.id", &order_id));
        let response = http
            .post(format!("{}/v1/traces", viewer.otlp_endpoint()))
            .json(&body)
            .send()
            .await
            .expect("the collector answers");
        assert!(response.status().is_success(), "{}", response.status());
    }

    let both = ["order-service", "payment-service"];
    let spans = viewer.await_trace(&trace_id, &both).await;
    assert_eq!(spans.len(), 2, "{spans:?}");
    assert_eq!(services_of(&spans), both.map(str::to_owned).into());

    let tagged = viewer
        .await_tagged("payment-service", "order.id", &order_id, &both)
        .await;
    assert!(
        tagged
            .iter()
            .all(|span| span["traceId"] == trace_id.as_str()),
        "{tagged:?}"
    );
    let other = Uuid::new_v4().to_string();
    assert!(
        viewer
            .traces_tagged("payment-service", "order.id", &other)
            .await
            .is_empty(),
        "no trace is tagged with an order never sent"
    );
    assert!(
        viewer
            .trace(&Uuid::new_v4().simple().to_string())
            .await
            .is_empty(),
        "an unknown trace has no spans"
    );
}
