//! The saga end to end: three real binaries, the real broker, the real database.

use saga_e2e::{NOTIFICATION_SERVICE, ORDER_SERVICE, PAYMENT_SERVICE, Stack};
use saga_testkit::header;
use serde_json::json;

#[tokio::test]
async fn an_order_within_the_limit_is_confirmed_and_the_customer_notified_once() {
    let stack = Stack::start().await;

    let order_id = stack.place_order(2).await;

    let order = stack.settled_order(order_id).await;
    assert_eq!(order["status"], "confirmed", "{order}");
    assert_eq!(order["amount_cents"], 2598);
    assert_eq!(stack.notified(order_id).await, 1);
    let message: String = stack
        .notifications_db
        .client()
        .await
        .query_one(
            "SELECT message FROM notifications WHERE order_id = $1",
            &[&order_id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(message.contains("confirmed"), "{message}");
}

#[tokio::test]
async fn an_order_over_the_limit_is_cancelled_with_the_reason_and_notified_once() {
    let stack = Stack::start().await;

    // 100 keyboards: 129900 cents, over the default 100000 limit.
    let order_id = stack.place_order(100).await;

    let order = stack.settled_order(order_id).await;
    assert_eq!(order["status"], "cancelled", "{order}");
    assert_eq!(order["cancel_reason"], "amount exceeds limit");
    assert_eq!(stack.notified(order_id).await, 1);
}

#[tokio::test]
async fn a_payment_record_replayed_by_hand_has_no_second_effect() {
    let stack = Stack::start().await;
    let order_id = stack.place_order(2).await;
    assert_eq!(stack.settled_order(order_id).await["status"], "confirmed");
    stack.notified(order_id).await;
    let topics = &stack.kafka.topics;

    // Exactly the record payment-service published, typed by hand, produced twice with
    // no key, as the console producer does.
    let payment_id = format!("{order_id}:payment");
    let replay = saga_testkit::envelope(
        &payment_id,
        "payment.succeeded",
        order_id,
        json!({ "order_id": order_id, "amount_cents": 2598 }),
    );
    stack.kafka.produce(&topics.payments, None, &replay).await;
    stack.kafka.produce(&topics.payments, None, &replay).await;
    // And a late failure with a new id: guard 1 lets it through, guard 2 stops it.
    let late = saga_testkit::envelope(
        "late-failure-001",
        "payment.failed",
        order_id,
        json!({ "order_id": order_id, "amount_cents": 2598, "reason": "card declined" }),
    );
    stack.kafka.produce(&topics.payments, None, &late).await;
    stack.caught_up(ORDER_SERVICE, &topics.payments).await;
    stack.caught_up(NOTIFICATION_SERVICE, &topics.orders).await;

    assert_eq!(stack.get_order(order_id).await["status"], "confirmed");
    let db = &stack.orders_db;
    assert_eq!(
        db.count(
            "SELECT count(*) FROM processed_events WHERE event_id = $1",
            &[&payment_id]
        )
        .await,
        1
    );
    assert_eq!(
        db.count(
            "SELECT count(*) FROM processed_events WHERE event_id = 'late-failure-001'",
            &[]
        )
        .await,
        1
    );
    assert_eq!(
        db.count(
            "SELECT count(*) FROM outbox WHERE key = $1 AND type IN ('order.confirmed', 'order.cancelled')",
            &[&order_id.to_string()]
        )
        .await,
        1
    );
    assert_eq!(stack.notifications(order_id).await, 1);
}

#[tokio::test]
async fn an_order_created_replayed_by_hand_charges_once() {
    let stack = Stack::start().await;
    let order_id = stack.place_order(2).await;
    assert_eq!(stack.settled_order(order_id).await["status"], "confirmed");
    let topics = &stack.kafka.topics;

    stack.replay_order_created(order_id).await;
    stack.caught_up(PAYMENT_SERVICE, &topics.orders).await;
    stack.caught_up(ORDER_SERVICE, &topics.payments).await;

    let payments = &stack.payments_db;
    assert_eq!(
        payments
            .count(
                "SELECT count(*) FROM payments WHERE order_id = $1",
                &[&order_id]
            )
            .await,
        1
    );
    assert_eq!(payments.count("SELECT count(*) FROM outbox", &[]).await, 1);
    assert_eq!(stack.kafka.read_all(&topics.payments).await.len(), 1);
    // The replay was a known duplicate before any call: the provider was asked once.
    let provider = stack.provider();
    assert_eq!(provider.charges_for(&order_id.to_string()).await.len(), 1);
    assert_eq!(provider.stats().await["calls"], 1);
}

#[tokio::test]
async fn poison_records_are_dead_lettered_with_their_reason_and_the_partitions_move_on() {
    let stack = Stack::start().await;
    let topics = &stack.kafka.topics;
    let poison: [(&str, &[u8]); 3] = [
        ("not JSON", b"this is not json"),
        ("unknown type", br#"{"id":"p-2","type":"payment.disputed","aggregate_id":"x","payload":{},"occurred_at":"2026-07-14T09:15:40Z"}"#),
        ("missing field", br#"{"id":"p-3","type":"payment.succeeded","aggregate_id":"x","payload":{}}"#),
    ];
    // One in front of each partition, so whichever partition the next order's payment
    // lands on, it sits behind a poison record.
    for (partition, (_, value)) in poison.iter().enumerate() {
        stack
            .kafka
            .produce_to(
                &topics.payments,
                Some(partition as i32),
                Some("poison"),
                value,
            )
            .await;
    }

    let order_id = stack.place_order(2).await;

    assert_eq!(stack.settled_order(order_id).await["status"], "confirmed");
    stack.caught_up(ORDER_SERVICE, &topics.payments).await;
    let dead = stack
        .kafka
        .read_all(&topics.dead_letter(&topics.payments, ORDER_SERVICE))
        .await;
    assert_eq!(
        dead.len(),
        3,
        "every poison record is dead-lettered, nothing else"
    );
    let mut reasons: Vec<String> = dead
        .iter()
        .map(|m| header(m, "dlq.reason").unwrap())
        .collect();
    reasons.sort();
    assert!(
        reasons[0].contains("envelope field `(root)`: missing field `occurred_at`"),
        "{reasons:?}"
    );
    assert!(reasons[1].contains("not UTF-8 JSON"), "{reasons:?}");
    assert!(
        reasons[2].contains("unknown event type `payment.disputed`"),
        "{reasons:?}"
    );
    for message in &dead {
        assert_eq!(
            header(message, "dlq.original.topic").as_deref(),
            Some(topics.payments.as_str())
        );
        assert_eq!(
            header(message, "dlq.group").unwrap(),
            topics.group(ORDER_SERVICE)
        );
        assert!(header(message, "dlq.original.offset").is_some());
    }
}

#[tokio::test]
async fn a_database_outage_is_waited_out_and_the_event_applied_afterwards() {
    let mut stack = Stack::start().await;
    // Hold the saga before the payment so the result arrives while the database is down.
    assert!(stack.terminate_service(PAYMENT_SERVICE).await);
    let order_id = stack.place_order(2).await;
    stack.orders_db.refuse_connections().await;

    stack.start_service(PAYMENT_SERVICE).await;
    let payments = &stack.payments_db;
    saga_testkit::eventually(
        saga_e2e::SETTLE,
        "the payment result to be published",
        || async {
            let published = payments
                .count(
                    "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL",
                    &[],
                )
                .await;
            (published == 1).then_some(())
        },
    )
    .await;
    saga_testkit::eventually(
        saga_e2e::SETTLE,
        "order-service to hit the outage",
        || async {
            stack
                .log(ORDER_SERVICE)
                .contains("handler failed; retrying")
                .then_some(())
        },
    )
    .await;
    stack.orders_db.accept_connections().await;

    assert_eq!(stack.settled_order(order_id).await["status"], "confirmed");
    assert_eq!(stack.notified(order_id).await, 1);
    let topics = &stack.kafka.topics;
    let dead = stack
        .kafka
        .read_all(&topics.dead_letter(&topics.payments, ORDER_SERVICE))
        .await;
    assert!(dead.is_empty(), "a transient failure was dead-lettered");
}

#[tokio::test]
async fn sigterm_stops_a_service_cleanly_with_its_offsets_committed() {
    let mut stack = Stack::start().await;
    let order_id = stack.place_order(2).await;
    assert_eq!(stack.settled_order(order_id).await["status"], "confirmed");

    assert!(
        stack.terminate_service(ORDER_SERVICE).await,
        "exit status after SIGTERM"
    );

    let topics = &stack.kafka.topics;
    assert!(
        stack
            .kafka
            .group_caught_up(&topics.group(ORDER_SERVICE), &topics.payments)
            .await,
        "order-service stopped with uncommitted offsets"
    );
    let log = stack.log(ORDER_SERVICE);
    assert!(log.contains("SIGTERM received"), "{log}");
    assert!(log.contains("consumer stopped"), "{log}");
}
