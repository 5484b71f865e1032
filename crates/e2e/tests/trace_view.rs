//! The trace viewer a test starts (`saga_e2e::viewer`): spans sent as OTLP over HTTP to its
//! collector reach its Zipkin, found there by trace id and by tag, each under its service;
//! and an order placed on the real binaries exporting to it is one trace on Zipkin's page,
//! in a real browser (Debian's chromium, headless through chromedriver), with the spans of
//! every service, the card provider's among them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fantoccini::Locator;
use saga_e2e::viewer::{Viewer, services_of};
use saga_e2e::{NOTIFICATION_SERVICE, ORDER_SERVICE, PAYMENT_PROVIDER, PAYMENT_SERVICE, Stack};
use saga_testkit::eventually;
use serde_json::{Value, json};
use uuid::Uuid;

const EVERY_SERVICE: [&str; 4] = [
    ORDER_SERVICE,
    PAYMENT_SERVICE,
    NOTIFICATION_SERVICE,
    PAYMENT_PROVIDER,
];
const WAIT: Duration = Duration::from_secs(60);

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

#[tokio::test]
async fn an_orders_trace_opened_in_zipkins_page_shows_the_spans_of_every_service_the_provider_included()
 {
    let viewer = Viewer::start().await;
    let endpoint = viewer.otlp_endpoint();
    // Exported every 100 ms rather than every 5 s: the test waits for spans, not a clock.
    let stack = Stack::start_with_env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ])
    .await;
    let order_id = stack.place_order(1).await;
    assert_eq!(stack.settled_order(order_id).await["status"], "confirmed");
    stack.notified(order_id).await;

    // The order's records are keyed by its id; payment-service's span of the order.created
    // it consumed says so, and the trace it belongs to started at the POST.
    let spans = viewer
        .await_tagged(
            PAYMENT_SERVICE,
            "messaging.kafka.message.key",
            &order_id.to_string(),
            &EVERY_SERVICE,
        )
        .await;
    let trace_id = spans[0]["traceId"].as_str().unwrap().to_owned();

    let (mut driver, browser) = saga_testkit::browser::open().await;
    browser.goto(&viewer.trace_page(&trace_id)).await.unwrap();
    // The page lists each span as `<service>: <span name>`, once it has rendered the trace.
    let shown = eventually(
        WAIT,
        "the trace page to list a span of every service",
        || {
            let browser = browser.clone();
            async move {
                let body = browser.find(Locator::Css("body")).await.ok()?;
                let text = body.text().await.ok()?;
                let rows =
                    |service: &str| text.lines().any(|l| l.starts_with(&format!("{service}: ")));
                EVERY_SERVICE.iter().all(|s| rows(s)).then_some(text)
            }
        },
    )
    .await;
    let png = browser.screenshot().await.unwrap();
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("zipkin-trace.png");
    std::fs::write(&shot, png).unwrap();
    assert!(
        shown.contains(&trace_id),
        "not trace {trace_id}'s page:\n{shown}"
    );
    assert!(
        shown.contains(&format!("Services\n{}\n", EVERY_SERVICE.len())),
        "the page counts other services than the saga's four:\n{shown}"
    );
    assert!(
        shown.contains(&format!("{PAYMENT_PROVIDER}: post /v1/charges")),
        "the provider's charge is not on the page:\n{shown}"
    );
    browser.close().await.unwrap();
    driver.kill().await.unwrap();
}
