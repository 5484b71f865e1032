//! `/metrics` of the real binaries after known traffic: every counter equals what the
//! databases and topics say, and each service's records received are the sum of their
//! outcomes.

use saga::metrics::{
    CHARGE_REQUESTS, CHARGES, CONSUMER_LAG, DEAD_LETTERS, EVENTS, HANDLER_DURATION, HTTP_DURATION,
    HTTP_REQUESTS, IDEMPOTENCY_REPLAYS, OUTBOX_OLDEST_AGE, OUTBOX_PUBLISHED, OUTBOX_UNPUBLISHED,
    PROVIDER_CALL_DURATION, PROVIDER_CALLS, RECORDS_RECEIVED, REFUND_FAULTS, REFUND_REQUESTS,
    REFUNDS, RETRIES,
};
use saga_e2e::metrics::Metrics;
use saga_e2e::{
    KEYBOARD, NOTIFICATION_SERVICE, ORDER_SERVICE, PAYMENT_PROVIDER, PAYMENT_SERVICE, SERVICES,
    SETTLE, Stack,
};
use saga_testkit::{TestDatabase, eventually};
use serde_json::json;
use uuid::Uuid;

/// Orders placed: quantities 2 are confirmed, 100 (129 900 cents) over the limit cancelled.
const QUANTITIES: [i32; 6] = [2, 2, 100, 2, 100, 2];

#[tokio::test]
async fn the_counters_equal_what_the_databases_and_topics_hold_and_reconcile() {
    let stack = Stack::start().await;
    let orders = place_the_orders(&stack).await;
    let n = orders.len() as u64;
    let cancelled = QUANTITIES.iter().filter(|q| **q == 100).count() as u64;
    for order_id in &orders {
        stack.settled_order(*order_id).await;
        stack.notified(*order_id).await;
    }
    send_copies_a_late_failure_and_poison(&stack, orders[0]).await;
    wait_until_every_record_is_handled_and_every_row_published(&stack).await;

    let order = stack.metrics(ORDER_SERVICE).await;
    let payment = stack.metrics(PAYMENT_SERVICE).await;
    let notification = stack.metrics(NOTIFICATION_SERVICE).await;
    let provider = stack.metrics(PAYMENT_PROVIDER).await;
    assert_order_service_counted(&stack, &order, n, cancelled).await;
    assert_payment_service_counted(&stack, &payment, n, cancelled).await;
    // notification-service, on orders: n outcomes, n + 1 order.created (ignored), 1 poison.
    assert_outcomes(
        &stack,
        NOTIFICATION_SERVICE,
        &notification,
        [n, 0, 0, n + 1, 1],
    )
    .await;
    assert_inbox(&notification, stack.database(NOTIFICATION_SERVICE), n).await;
    assert_provider_counted(&provider, n, cancelled);
    for (service, metrics) in [
        (ORDER_SERVICE, &order),
        (PAYMENT_SERVICE, &payment),
        (NOTIFICATION_SERVICE, &notification),
    ] {
        assert_eq!(metrics.count(RETRIES, &[]), 0, "{service}: nothing failed");
        assert_eq!(metrics.sum(OUTBOX_UNPUBLISHED, &[]), 0.0, "{service}");
        assert_eq!(metrics.sum(OUTBOX_OLDEST_AGE, &[]), 0.0, "{service}");
    }
    wait_for_no_consumer_lag(&stack).await;
}

/// A charged order its customer cancels is refunded, a declined one's cancellation
/// voided: each answer is counted once where it was committed (order-service applying
/// it), and the refund once by payment-service's client and by the provider, each count
/// what the databases hold.
#[tokio::test]
async fn a_refund_and_a_void_are_each_counted_once_as_the_databases_hold_them() {
    let stack = Stack::start().await;
    let charged = stack.place_order(2).await;
    let declined = stack.place_order(100).await;
    assert_eq!(stack.settled_order(charged).await["status"], "confirmed");
    assert_eq!(stack.settled_order(declined).await["status"], "cancelled");
    let (http, base) = stack.api();
    let cancel = http
        .post(format!("{base}/v1/orders/{charged}/cancel"))
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status().as_u16(), 202);
    eventually(SETTLE, "the refund to be recorded", || async {
        (stack.get_order(charged).await["refund"] == "refunded").then_some(())
    })
    .await;
    wait_until_every_record_is_handled_and_every_row_published(&stack).await;

    let order = stack.metrics(ORDER_SERVICE).await;
    let refunded = stack
        .database(ORDER_SERVICE)
        .count(
            "SELECT count(*) FROM orders WHERE refund_id IS NOT NULL",
            &[],
        )
        .await as u64;
    assert_eq!(refunded, 1);
    let answer = |event_type| [("type", event_type), ("outcome", "applied")];
    assert_eq!(order.count(EVENTS, &answer("payment.refunded")), refunded);
    assert_eq!(order.count(EVENTS, &answer("payment.voided")), 1);

    let payment = stack.metrics(PAYMENT_SERVICE).await;
    assert_eq!(
        payment.count(EVENTS, &answer("order.cancelled")),
        2,
        "both cancellations answered"
    );
    let refund_call = [
        ("call", "refund"),
        ("outcome", "refunded"),
        ("replayed", "false"),
    ];
    assert_eq!(payment.count(PROVIDER_CALLS, &refund_call), 1);
    assert_eq!(payment.count(PROVIDER_CALLS, &[("call", "refund")]), 1);
    assert_eq!(
        payment.observations(PROVIDER_CALL_DURATION, &[("call", "refund")]),
        1
    );
    assert_eq!(
        payment.count(PROVIDER_CALLS, &[("call", "charges_for")]),
        0,
        "the payment was recorded: no need to ask the provider"
    );
    assert_eq!(charge_calls(&payment), 2);

    let provider = stack.metrics(PAYMENT_PROVIDER).await;
    let refunds = stack
        .database(PAYMENT_PROVIDER)
        .count("SELECT count(*) FROM refunds", &[])
        .await as u64;
    assert_eq!(refunds, 1);
    assert_eq!(provider.count(REFUND_REQUESTS, &[]), 1);
    assert_eq!(provider.count(REFUNDS, &[("result", "succeeded")]), refunds);
    assert_eq!(provider.count(REFUND_FAULTS, &[]), 0);
    assert_eq!(provider.count(CHARGE_REQUESTS, &[]), 2);
}

/// Places an order of each of [`QUANTITIES`], and one more twice under one key; returns
/// their ids.
async fn place_the_orders(stack: &Stack) -> Vec<Uuid> {
    let (http, base) = stack.api();
    let mut orders = Vec::new();
    for quantity in QUANTITIES {
        orders.push(stack.place_order(quantity).await);
    }
    // One order placed twice under one key: the second POST is a replay.
    let keyed = || {
        http.post(format!("{base}/v1/orders"))
            .header("idempotency-key", "\"metrics-1\"")
            .json(&json!({ "customer_id": "cust-1",
                           "items": [{ "product_id": KEYBOARD, "quantity": 1 }] }))
            .send()
    };
    let first: serde_json::Value = keyed().await.unwrap().json().await.unwrap();
    let again = keyed().await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    orders.push(first["id"].as_str().unwrap().parse().unwrap());
    orders
}

/// Hand-replayed: two payment results and one order.created of order `replayed`; a late
/// failure with an id of its own (guard 2); poison: a non-event and an unknown type on
/// payments, a non-event on orders.
async fn send_copies_a_late_failure_and_poison(stack: &Stack, replayed: Uuid) {
    let topics = &stack.kafka.topics;
    let payment = saga_testkit::envelope(
        &format!("{replayed}:payment"),
        "payment.succeeded",
        replayed,
        json!({ "order_id": replayed, "amount_cents": 2598 }),
    );
    stack.kafka.produce(&topics.payments, None, &payment).await;
    stack.kafka.produce(&topics.payments, None, &payment).await;
    let late = saga_testkit::envelope(
        "late-failure-1",
        "payment.failed",
        replayed,
        json!({ "order_id": replayed, "amount_cents": 2598, "reason": "card declined" }),
    );
    stack.kafka.produce(&topics.payments, None, &late).await;
    stack.replay_order_created(replayed).await;
    let unknown = br#"{"id":"p-1","type":"payment.reversed","aggregate_id":"x","payload":{},"occurred_at":"2026-07-14T09:15:40Z"}"#;
    stack
        .kafka
        .produce(&topics.payments, None, b"not json")
        .await;
    stack.kafka.produce(&topics.payments, None, unknown).await;
    stack
        .kafka
        .produce(&topics.orders, None, b"not json either")
        .await;
}

async fn wait_until_every_record_is_handled_and_every_row_published(stack: &Stack) {
    for service in SERVICES {
        let (_, topic, _) = stack.subscription(service);
        stack.caught_up(service, &topic).await;
    }
    // Every outbox row published, notification-service's too (nobody consumes those).
    for service in SERVICES {
        let db = stack.database(service);
        eventually(SETTLE, &format!("{service}'s outbox to drain"), || async {
            let left = db
                .count(
                    "SELECT count(*) FROM outbox WHERE published_at IS NULL",
                    &[],
                )
                .await;
            (left == 0).then_some(())
        })
        .await;
    }
}

/// order-service, on payments: n results and a `payment.voided` answering each declined
/// order's cancellation, 2 replays (guard 1), 1 late failure (guard 2), 2 poison; and its
/// API's requests.
async fn assert_order_service_counted(stack: &Stack, order: &Metrics, n: u64, cancelled: u64) {
    let topics = &stack.kafka.topics;
    let on = [("topic", topics.payments.as_str())];
    assert_outcomes(stack, ORDER_SERVICE, order, [n + cancelled, 2, 1, 0, 2]).await;
    assert_eq!(
        order.count(RECORDS_RECEIVED, &on),
        stack.kafka.read_all(&topics.payments).await.len() as u64
    );
    assert_eq!(
        order.count(
            EVENTS,
            &[("type", "payment.failed"), ("outcome", "applied")]
        ),
        cancelled
    );
    assert_eq!(
        order.count(
            EVENTS,
            &[("type", "payment.voided"), ("outcome", "applied")]
        ),
        cancelled,
        "each declined order's cancellation answered: nothing to refund"
    );
    assert_eq!(order.count(EVENTS, &[("type", "payment.refunded")]), 0);
    assert_eq!(
        order.count(DEAD_LETTERS, &[("cause", "malformed")]),
        1,
        "the non-event"
    );
    assert_eq!(
        order.count(DEAD_LETTERS, &[("cause", "rejected")]),
        1,
        "the unknown type"
    );
    assert_eq!(
        order.observations(HANDLER_DURATION, &on),
        order.count(RECORDS_RECEIVED, &on) - 1,
        "every record that is an event is timed once (no retries), the non-event never"
    );
    // order.created and the outcome, per order.
    assert_inbox(order, stack.database(ORDER_SERVICE), 2 * n).await;
    assert_eq!(
        order.count(
            HTTP_REQUESTS,
            &[
                ("method", "POST"),
                ("route", "/v1/orders"),
                ("status", "201")
            ]
        ),
        n + 1,
        "every order, and the keyed one's replay"
    );
    assert_eq!(
        order.observations(HTTP_DURATION, &[("route", "/v1/orders")]),
        n + 1
    );
    assert!(
        order.count(HTTP_REQUESTS, &[("route", "/v1/orders/{id}")]) >= n,
        "GET by id is one series by its pattern, not one per id: {:?}",
        order.label_values(HTTP_REQUESTS, "route")
    );
    assert_eq!(order.count(IDEMPOTENCY_REPLAYS, &[]), 1);
}

/// payment-service, on orders: n order.created and the declined orders' cancellations
/// (each answered `payment.voided`), the confirmations (ignored), 1 replay, 1 poison; and
/// its calls to the provider.
async fn assert_payment_service_counted(stack: &Stack, payment: &Metrics, n: u64, cancelled: u64) {
    let confirmed = n - cancelled;
    assert_outcomes(
        stack,
        PAYMENT_SERVICE,
        payment,
        [n + cancelled, 1, 0, confirmed, 1],
    )
    .await;
    assert_inbox(payment, stack.database(PAYMENT_SERVICE), n + cancelled).await;
    let charged = [("outcome", "charged"), ("replayed", "false")];
    let declined = [("outcome", "declined"), ("replayed", "false")];
    assert_eq!(payment.count(PROVIDER_CALLS, &charged), confirmed);
    assert_eq!(payment.count(PROVIDER_CALLS, &declined), cancelled);
    assert_eq!(
        charge_calls(payment),
        n,
        "the replayed order.created was a duplicate before any call"
    );
    assert_eq!(
        payment.label_values(PROVIDER_CALLS, "call"),
        Vec::<String>::new(),
        "a declined payment is nothing to refund: no refund or list call"
    );
}

/// payment-service's charge calls: [`PROVIDER_CALLS`]' series without a `call` label
/// (a refund's and a list's carry one).
fn charge_calls(payment: &Metrics) -> u64 {
    let other_calls: u64 = payment
        .label_values(PROVIDER_CALLS, "call")
        .iter()
        .map(|call| payment.count(PROVIDER_CALLS, &[("call", call.as_str())]))
        .sum();
    payment.count(PROVIDER_CALLS, &[]) - other_calls
}

/// The provider: one request and one decided charge per order.
fn assert_provider_counted(provider: &Metrics, n: u64, cancelled: u64) {
    assert_eq!(provider.count(CHARGE_REQUESTS, &[]), n);
    assert_eq!(
        provider.count(CHARGES, &[("result", "succeeded")]),
        n - cancelled
    );
    assert_eq!(
        provider.count(CHARGES, &[("result", "declined")]),
        cancelled
    );
    assert_eq!(provider.count(IDEMPOTENCY_REPLAYS, &[]), 0);
}

/// librdkafka's statistics arrive every few seconds; lag is 0 once they catch up.
async fn wait_for_no_consumer_lag(stack: &Stack) {
    for service in SERVICES {
        let (_, topic, _) = stack.subscription(service);
        eventually(SETTLE, &format!("{service}'s lag to read 0"), || async {
            let metrics = stack.metrics(service).await;
            let partitions = metrics.label_values(CONSUMER_LAG, "partition");
            let lag = metrics.sum(CONSUMER_LAG, &[("topic", topic.as_str())]);
            (partitions.len() == 3 && lag == 0.0).then_some(())
        })
        .await;
    }
}

/// `service`'s outcomes on the topic it consumes, as `[applied, duplicate, guarded,
/// ignored, dead_lettered]`, and records received their sum; dead letters as many as the
/// outcome says, and as its dead-letter topic holds.
async fn assert_outcomes(stack: &Stack, service: &str, metrics: &Metrics, expected: [u64; 5]) {
    let (_, topic, dead_letters) = stack.subscription(service);
    let topic = topic.as_str();
    let outcomes = [
        "applied",
        "duplicate",
        "guarded",
        "ignored",
        "dead_lettered",
    ];
    let counted =
        outcomes.map(|outcome| metrics.count(EVENTS, &[("topic", topic), ("outcome", outcome)]));
    assert_eq!(counted, expected, "{topic}: {outcomes:?}");
    assert_eq!(
        metrics.label_values(EVENTS, "outcome").len(),
        expected.iter().filter(|n| **n > 0).count(),
        "no outcome outside the five"
    );
    assert_eq!(
        metrics.count(RECORDS_RECEIVED, &[("topic", topic)]),
        counted.iter().sum::<u64>(),
        "{topic}: records received = the sum of the outcomes"
    );
    assert_eq!(
        metrics.count(DEAD_LETTERS, &[("topic", topic)]),
        expected[4]
    );
    let on_topic = stack.kafka.read_all(&dead_letters).await.len() as u64;
    assert_eq!(on_topic, expected[4], "{dead_letters}");
}

/// The inbox holds one id per event applied or guarded, and the outbox's published rows
/// are what the relay counted.
async fn assert_inbox(metrics: &Metrics, db: &TestDatabase, outbox_rows: u64) {
    let applied_or_guarded = metrics.count(EVENTS, &[("outcome", "applied")])
        + metrics.count(EVENTS, &[("outcome", "guarded")]);
    let inbox = db.count("SELECT count(*) FROM processed_events", &[]).await as u64;
    assert_eq!(inbox, applied_or_guarded, "inbox rows");
    let published = db
        .count(
            "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL",
            &[],
        )
        .await as u64;
    assert_eq!(published, outbox_rows, "outbox rows");
    assert_eq!(metrics.count(OUTBOX_PUBLISHED, &[]), published);
}
