//! One order's trace through the real binaries: the services export their spans with
//! OTLP to a receiver in the test (`saga_testkit::otlp`), which keeps what a viewer drops
//! (links, span kinds, every attribute), and the test reads the trace's shape from it.

use saga_e2e::{KEYBOARD, NOTIFICATION_SERVICE, ORDER_SERVICE, PAYMENT_PROVIDER, PAYMENT_SERVICE};
use saga_e2e::{SETTLE, Stack};
use saga_testkit::eventually;
use saga_testkit::otlp::{OtlpSink, Span};
use saga_testkit::tls::TestCa;
use serde_json::json;
use uuid::Uuid;

/// A vendor's `tracestate`, as a client may send one.
const CLIENT_STATE: &str = "vendor=opaque-1";

/// Exports every 100 ms instead of every 5 s: the test waits for spans, not for a clock.
const EXPORT_DELAY_MS: &str = "100";

async fn traced_stack(sink: &OtlpSink) -> Stack {
    Stack::start_with_env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", sink.endpoint()),
        ("OTEL_BSP_SCHEDULE_DELAY", EXPORT_DELAY_MS),
    ])
    .await
}

/// A trace context of the test's own, as a client's: its ids are known, so the order's
/// spans can be asked for by them.
fn client_context() -> (String, String, String) {
    let trace_id = Uuid::new_v4().simple().to_string();
    let span_id = Uuid::new_v4().simple().to_string()[..16].to_owned();
    let traceparent = format!("00-{trace_id}-{span_id}-01");
    (trace_id, span_id, traceparent)
}

/// The one span in `spans` that `service` made with `name` and, if given, for the event
/// `message_id`; the test fails naming what it looked for and what there was.
fn one<'a>(spans: &'a [Span], service: &str, name: &str, message_id: Option<&str>) -> &'a Span {
    let found: Vec<&Span> = spans
        .iter()
        .filter(|span| span.service == service && span.name == name)
        .filter(|span| {
            message_id.is_none_or(|id| span.attribute("messaging.message.id") == Some(id))
        })
        .collect();
    assert!(
        found.len() == 1,
        "expected one {service} span `{name}` for {message_id:?}, found {}; the trace holds:\n{}",
        found.len(),
        outline(spans)
    );
    found[0]
}

fn outline(spans: &[Span]) -> String {
    let lines = spans.iter().map(|span| {
        format!(
            "  {} {} [{}] {} parent {} id {} outcome {:?}",
            span.service,
            span.name,
            span.kind,
            span.attribute("messaging.message.id").unwrap_or("-"),
            span.parent_span_id,
            span.span_id,
            span.attribute("saga.outcome"),
        )
    });
    lines.collect::<Vec<_>>().join("\n")
}

/// `child` is `parent`'s child, and, for a record's process span, also links to it.
fn continues(child: &Span, parent: &Span) {
    assert_eq!(
        child.parent_span_id, parent.span_id,
        "{} `{}` is a child of {} `{}`",
        child.service, child.name, parent.service, parent.name
    );
    if child.kind == "consumer" {
        assert!(
            child
                .links
                .contains(&(parent.trace_id.clone(), parent.span_id.clone())),
            "{} `{}` links to the send span of its record",
            child.service,
            child.name
        );
    }
}

/// `span` was made directly inside `parent`, in the same service: a handler's own span
/// (`charge_order`) is not exported, so what it writes continues its process span.
fn child_of(span: &Span, parent: &Span, spans: &[Span]) {
    assert!(
        span.service == parent.service && span.parent_span_id == parent.span_id,
        "{} `{}` was made inside {} `{}`:\n{}",
        span.service,
        span.name,
        parent.service,
        parent.name,
        outline(spans)
    );
}

/// Places an order as a client whose request carries `traceparent`, and `tracestate` if
/// given; returns its id.
async fn place_traced_order(stack: &Stack, traceparent: &str, tracestate: Option<&str>) -> Uuid {
    let (http, _) = stack.api();
    let mut request = http.post(stack.api_url("/v1/orders"));
    if let Some(state) = tracestate {
        request = request.header("tracestate", state);
    }
    let placed = request
        .header("traceparent", traceparent)
        .json(&json!({
            "customer_id": "cust-trace",
            "items": [{ "product_id": KEYBOARD, "quantity": 1 }],
        }))
        .send()
        .await
        .expect("order-service answers");
    assert_eq!(placed.status(), 201);
    let order: serde_json::Value = placed.json().await.expect("a JSON body");
    order["id"].as_str().unwrap().parse().unwrap()
}

/// Replays the order's payment record by hand, headers and all, as a person would.
async fn replay_payment(stack: &Stack, order_id: Uuid, trace_id: &str) {
    let payment_id = saga::events::payment_result_id(&order_id.to_string());
    let payment = stack
        .kafka
        .read_all(&stack.kafka.topics.payments)
        .await
        .into_iter()
        .find(|record| saga::kafka::header(record, "event_id").as_deref() == Some(&payment_id))
        .expect("the payment's record was published");
    let traceparent = saga::kafka::header(&payment, "traceparent");
    assert!(traceparent.is_some_and(|context| context.contains(trace_id)));
    // The client's vendor state travels with the context, hop after hop.
    assert_eq!(
        saga::kafka::header(&payment, "tracestate").as_deref(),
        Some(CLIENT_STATE)
    );
    stack.kafka.replay(&payment).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_orders_trace_holds_every_hop_and_a_replayed_payment_meets_guard_1() {
    let sink = OtlpSink::keeping().await;
    let stack = traced_stack(&sink).await;
    let (trace_id, client_span, traceparent) = client_context();
    let order_id = place_traced_order(&stack, &traceparent, Some(CLIENT_STATE)).await;
    assert_eq!(stack.settled_order(order_id).await["status"], "confirmed");
    replay_payment(&stack, order_id, &trace_id).await;
    // The last hops, the replay's process span and the notification's record sent, and
    // the provider's span: each process exports on its own.
    let spans = eventually(SETTLE, "the trace's last spans to be exported", || async {
        let spans = sink.trace(&trace_id);
        let replayed = spans.iter().any(|span| {
            span.service == ORDER_SERVICE && span.attribute("saga.outcome") == Some("duplicate")
        });
        let notified = spans
            .iter()
            .any(|span| span.service == NOTIFICATION_SERVICE && span.name.starts_with("send "));
        let provider = spans.iter().any(|span| span.service == PAYMENT_PROVIDER);
        (replayed && notified && provider).then_some(spans)
    })
    .await;

    let topics = &stack.kafka.topics;
    let charge_order = placed_and_charged(&spans, topics, order_id, &client_span);
    let payment_id = saga::events::payment_result_id(&order_id.to_string());
    let send_payment = one(
        &spans,
        PAYMENT_SERVICE,
        &format!("send {}", topics.payments),
        Some(&payment_id),
    );
    child_of(send_payment, charge_order, &spans);
    let apply = applied_once_then_a_duplicate(&spans, topics, send_payment);
    let confirmed_id = saga::events::order_outcome_id(order_id);
    let send_confirmed = one(
        &spans,
        ORDER_SERVICE,
        &format!("send {}", topics.orders),
        Some(&confirmed_id),
    );
    child_of(send_confirmed, apply, &spans);
    let notify = one(
        &spans,
        NOTIFICATION_SERVICE,
        &format!("process {}", topics.orders),
        Some(&confirmed_id),
    );
    continues(notify, send_confirmed);
    assert_eq!(notify.attribute("saga.outcome"), Some("applied"));
    ignored_records_make_no_span(&spans, order_id, &confirmed_id);

    // Nothing in the trace hangs loose: every span's parent is in it, but the client's.
    // The log reads as it does untraced: the fields that name a span for the exporter
    // are not written into every line.
    for service in [ORDER_SERVICE, PAYMENT_SERVICE, NOTIFICATION_SERVICE] {
        let log = stack.log(service);
        assert!(
            log.contains("record{topic="),
            "{service} logged its records"
        );
        let named: Vec<&str> = log.lines().filter(|line| line.contains("otel.")).collect();
        assert!(named.is_empty(), "{service} logged otel fields: {named:#?}");
    }
    for span in &spans {
        // Only the hops are exported: a handler's own span and the log stay in the log.
        assert_ne!(span.kind, "internal", "{}", outline(&spans));
        let parent = &span.parent_span_id;
        assert!(
            *parent == client_span || spans.iter().any(|other| other.span_id == *parent),
            "{} `{}` has a parent outside the trace:\n{}",
            span.service,
            span.name,
            outline(&spans)
        );
    }
}

/// A record of another consumer's type on a shared topic makes no span: neither
/// notification-service's `order.created`, which it ended before the send span the test
/// waits for, nor payment-service's `order.confirmed`.
fn ignored_records_make_no_span(spans: &[Span], order_id: Uuid, confirmed_id: &str) {
    for (service, event_id) in [
        (NOTIFICATION_SERVICE, order_id.to_string()),
        (PAYMENT_SERVICE, confirmed_id.to_owned()),
    ] {
        let found = spans.iter().filter(|span| {
            span.service == service
                && span.kind == "consumer"
                && span.attribute("messaging.message.id") == Some(event_id.as_str())
        });
        assert_eq!(
            found.count(),
            0,
            "{service} ignores {event_id}:\n{}",
            outline(spans)
        );
    }
}

/// The POST, its `order.created` sent, payment-service's process span for it, its call
/// to the provider and the provider's side of it; returns the process span.
fn placed_and_charged<'a>(
    spans: &'a [Span],
    topics: &saga::Topics,
    order_id: Uuid,
    client_span: &str,
) -> &'a Span {
    let order_id = order_id.to_string();
    let post = one(spans, ORDER_SERVICE, "POST /v1/orders", None);
    assert_eq!(
        (post.kind, post.parent_span_id.as_str()),
        ("server", client_span)
    );
    let send_created = one(
        spans,
        ORDER_SERVICE,
        &format!("send {}", topics.orders),
        Some(&order_id),
    );
    continues(send_created, post);
    let charge_order = one(
        spans,
        PAYMENT_SERVICE,
        &format!("process {}", topics.orders),
        Some(&order_id),
    );
    continues(charge_order, send_created);
    assert_eq!(charge_order.attribute("saga.outcome"), Some("applied"));
    let call = one(spans, PAYMENT_SERVICE, "POST /v1/charges", None);
    assert_eq!(call.kind, "client");
    continues(call, charge_order);
    let charged = one(spans, PAYMENT_PROVIDER, "POST /v1/charges", None);
    assert_eq!(charged.kind, "server");
    continues(charged, call);
    charge_order
}

/// order-service's two process spans of the payment's record: the first delivery
/// applied, the replay met guard 1, both children of the one send. Returns the first.
fn applied_once_then_a_duplicate<'a>(
    spans: &'a [Span],
    topics: &saga::Topics,
    send_payment: &Span,
) -> &'a Span {
    let name = format!("process {}", topics.payments);
    let processed: Vec<&Span> = spans
        .iter()
        .filter(|span| span.service == ORDER_SERVICE && span.name == name)
        .collect();
    assert_eq!(processed.len(), 2, "{}", outline(spans));
    let outcome = |wanted: &str| {
        let found = processed
            .iter()
            .find(|span| span.attribute("saga.outcome") == Some(wanted));
        *found
            .unwrap_or_else(|| panic!("a process span with outcome {wanted}:\n{}", outline(spans)))
    };
    let group = topics.group(ORDER_SERVICE);
    for process in &processed {
        continues(process, send_payment);
        assert_eq!(
            process.attribute("messaging.consumer.group.name"),
            Some(group.as_str())
        );
    }
    outcome("duplicate");
    outcome("applied")
}

/// In batches, each record still has a process span of its own, in its own order's trace,
/// and what its handler writes continues that span, not the batch's first record's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_batches_each_record_is_processed_in_its_own_orders_trace() {
    const ORDERS: usize = 12;
    let sink = OtlpSink::keeping().await;
    let mut stack = Stack::start_with_env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", sink.endpoint()),
        ("OTEL_BSP_SCHEDULE_DELAY", EXPORT_DELAY_MS),
        ("CONSUMER_BATCH_SIZE", "16"),
    ])
    .await;
    let topics = stack.kafka.topics.clone();
    // Stopped, so that the outcomes wait for it and it starts on a backlog: batches.
    assert!(stack.terminate_service(NOTIFICATION_SERVICE).await);
    let mut orders = Vec::new();
    for _ in 0..ORDERS {
        let (trace_id, _, traceparent) = client_context();
        let order_id = place_traced_order(&stack, &traceparent, None).await;
        orders.push((order_id, trace_id));
    }
    for (order_id, _) in &orders {
        stack.settled_order(*order_id).await;
    }
    stack.start_service(NOTIFICATION_SERVICE).await;

    let name = format!("process {}", topics.orders);
    let mut batched = 0;
    for (order_id, trace_id) in &orders {
        let outcome = saga::events::order_outcome_id(*order_id);
        let spans = eventually(
            SETTLE,
            "the notification's spans to be exported",
            || async {
                let spans = sink.trace(trace_id);
                let sent = spans.iter().any(|span| {
                    span.service == NOTIFICATION_SERVICE && span.name.starts_with("send ")
                });
                sent.then_some(spans)
            },
        )
        .await;
        let process = one(&spans, NOTIFICATION_SERVICE, &name, Some(&outcome));
        assert_eq!(process.attribute("saga.outcome"), Some("applied"));
        let send = one(
            &spans,
            NOTIFICATION_SERVICE,
            &format!("send {}", topics.notifications),
            None,
        );
        child_of(send, process, &spans);
        let count = process.attribute("messaging.batch.message_count");
        batched += usize::from(count.is_some_and(|count| count != "1"));
    }
    // No client sent a `tracestate`: no record carries an empty one.
    for record in stack.kafka.read_all(&topics.notifications).await {
        assert!(saga::kafka::header(&record, "traceparent").is_some());
        assert_eq!(saga::kafka::header(&record, "tracestate"), None);
    }
    assert!(
        batched > 0,
        "the backlog was applied in batches (no process span says a batch of more than one)"
    );
}

/// With no endpoint set nothing is exported, but the context a client sent is carried on
/// all the same: every record of its order, through three services that export nothing,
/// belongs to the client's trace, so that a service exporting further on joins it. An
/// order placed with no context leaves none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_traces_off_the_callers_trace_context_is_carried_through_every_record() {
    let stack = Stack::start().await;
    let (trace_id, _, traceparent) = client_context();
    let traced = place_traced_order(&stack, &traceparent, Some(CLIENT_STATE)).await;
    let untraced = stack.place_order(1).await;
    for order_id in [traced, untraced] {
        assert_eq!(stack.settled_order(order_id).await["status"], "confirmed");
        stack.notified(order_id).await;
    }
    let topics = &stack.kafka.topics;
    for topic in [&topics.orders, &topics.payments, &topics.notifications] {
        let records = eventually(
            SETTLE,
            &format!("{topic} to hold both orders' records"),
            || async {
                let records = stack.kafka.read_all(topic).await;
                let of = |order: Uuid| records.iter().any(|r| key(r) == order.to_string());
                (of(traced) && of(untraced)).then_some(records)
            },
        )
        .await;
        for record in records {
            let context = saga::kafka::header(&record, "traceparent");
            let state = saga::kafka::header(&record, "tracestate");
            if key(&record) == traced.to_string() {
                let context = context.unwrap_or_else(|| panic!("a traceparent on {topic}"));
                assert_eq!(
                    context.split('-').nth(1),
                    Some(trace_id.as_str()),
                    "{topic}"
                );
                assert_eq!(state.as_deref(), Some(CLIENT_STATE), "{topic}");
            } else {
                assert_eq!((context, state), (None, None), "{topic}");
            }
        }
    }
}

fn key(record: &rdkafka::message::OwnedMessage) -> String {
    use rdkafka::Message as _;
    String::from_utf8_lossy(record.key().unwrap_or_default()).into_owned()
}

/// Over HTTPS, to a collector whose certificate a CA of the test's own signed: every
/// service exports its spans once `OTEL_EXPORTER_OTLP_CERTIFICATE` names that CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_go_over_https_to_a_collector_whose_ca_is_given() {
    let ca = TestCa::new("order-saga collector test CA");
    let sink = OtlpSink::keeping_over_tls(&ca).await;
    assert!(
        sink.endpoint().starts_with("https://"),
        "{}",
        sink.endpoint()
    );
    let ca_file = ca.ca_file().display().to_string();
    let stack = Stack::start_with_env(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", sink.endpoint()),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", &ca_file),
        ("OTEL_BSP_SCHEDULE_DELAY", EXPORT_DELAY_MS),
    ])
    .await;
    let (trace_id, _, traceparent) = client_context();
    let order_id = place_traced_order(&stack, &traceparent, None).await;
    assert_eq!(stack.settled_order(order_id).await["status"], "confirmed");
    eventually(SETTLE, "every service's spans over HTTPS", || async {
        let spans = sink.trace(&trace_id);
        let services = [
            ORDER_SERVICE,
            PAYMENT_SERVICE,
            NOTIFICATION_SERVICE,
            PAYMENT_PROVIDER,
        ];
        services
            .iter()
            .all(|service| spans.iter().any(|span| span.service == *service))
            .then_some(())
    })
    .await;
}

/// A collector whose certificate the service does not trust stops it at start, with
/// what OpenSSL said and the setting that fixes it, rather than losing every span.
#[tokio::test]
async fn a_collector_certificate_from_a_ca_not_given_stops_a_service_at_start_naming_why() {
    let ca = TestCa::new("order-saga collector test CA");
    let sink = OtlpSink::keeping_over_tls(&ca).await;
    let another = TestCa::new("another CA");
    let db = saga_testkit::TestDatabase::empty().await;
    let run = tokio::process::Command::new(saga_e2e::binary(PAYMENT_PROVIDER))
        .env("DATABASE_URL", &db.url)
        .env("HTTP_ADDR", "127.0.0.1:0")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", sink.endpoint())
        .env("OTEL_EXPORTER_OTLP_CERTIFICATE", another.ca_file())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(SETTLE, run)
        .await
        .expect("it stops at start")
        .expect("the provider's binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let error = stderr
        .lines()
        .find(|l| l.starts_with("Error: "))
        .unwrap_or_else(|| panic!("{stderr}"));
    let expected = format!(
        "Error: traces: the collector at {} refused TLS: ",
        sink.endpoint()
    );
    assert!(error.starts_with(&expected), "{error}");
    assert!(error.contains("certificate verify failed"), "{error}");
    assert!(
        error.ends_with("(the CA to trust: OTEL_EXPORTER_OTLP_CERTIFICATE)"),
        "{error}"
    );
}

#[test]
fn every_services_help_lists_the_opentelemetry_variables() {
    for service in [
        ORDER_SERVICE,
        PAYMENT_SERVICE,
        NOTIFICATION_SERVICE,
        PAYMENT_PROVIDER,
    ] {
        let help = std::process::Command::new(saga_e2e::binary(service))
            .arg("--help")
            .output()
            .expect("the service's binary runs");
        let help = String::from_utf8_lossy(&help.stdout);
        for variable in [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_SERVICE_NAME",
            "OTEL_TRACES_SAMPLER",
            "OTEL_SDK_DISABLED",
        ] {
            assert!(help.contains(variable), "{service} --help names {variable}");
        }
    }
}

/// A record no consumer can read is dead-lettered in its own trace, outcome
/// `dead_lettered`, and the dead letter keeps its trace context for whoever redrives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_record_is_dead_lettered_in_its_trace_and_keeps_its_context() {
    let sink = OtlpSink::keeping().await;
    let stack = traced_stack(&sink).await;
    let (trace_id, _, traceparent) = client_context();
    let orders = stack.kafka.topics.orders.clone();
    let traced = [("traceparent", traceparent.as_str())];
    stack
        .kafka
        .produce_with_headers(&orders, "not-an-order", b"{not json", &traced)
        .await;

    let dead_letters = stack.kafka.topics.dead_letter(&orders, PAYMENT_SERVICE);
    let dead = eventually(SETTLE, "the poison record to be dead-lettered", || async {
        stack.kafka.read_all(&dead_letters).await.into_iter().next()
    })
    .await;
    assert_eq!(
        saga::kafka::header(&dead, "traceparent"),
        Some(traceparent.clone())
    );
    let spans = eventually(
        SETTLE,
        "the poison's process span to be exported",
        || async {
            let spans = sink.trace(&trace_id);
            let payment = spans.iter().any(|span| span.service == PAYMENT_SERVICE);
            payment.then_some(spans)
        },
    )
    .await;
    let process = one(&spans, PAYMENT_SERVICE, &format!("process {orders}"), None);
    assert_eq!(process.attribute("saga.outcome"), Some("dead_lettered"));
}
