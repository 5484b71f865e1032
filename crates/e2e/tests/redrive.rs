//! Dead letters sent back once their cause is fixed, with the real `redrive-dlq` binary.

use rdkafka::Message as _;
use saga_e2e::{NOTIFICATION_SERVICE, ORDER_SERVICE, SETTLE, Stack};
use saga_testkit::{eventually, header};
use serde_json::json;
use uuid::Uuid;

#[tokio::test]
async fn a_dead_letter_redriven_once_its_cause_is_fixed_applies_once_and_a_repeated_redrive_changes_nothing()
 {
    let stack = Stack::start().await;
    let topics = &stack.kafka.topics;
    let dead_letters = topics.dead_letter(&topics.payments, ORDER_SERVICE);
    // A payment for an order order-service does not have (lost in a restore, say).
    let order_id = Uuid::new_v4();
    let payment_id = format!("{order_id}:payment");
    let payment = saga_testkit::envelope(
        &payment_id,
        "payment.succeeded",
        order_id,
        json!({ "order_id": order_id, "amount_cents": 2598 }),
    );
    stack
        .kafka
        .produce(&topics.payments, Some(&order_id.to_string()), &payment)
        .await;
    let dead = eventually(SETTLE, "the payment to be dead-lettered", || async {
        let dead = stack.kafka.read_all(&dead_letters).await;
        (!dead.is_empty()).then_some(dead)
    })
    .await;
    assert!(
        header(&dead[0], "dlq.reason")
            .unwrap()
            .contains("does not exist")
    );

    // The cause fixed: the order row restored.
    stack
        .orders_db
        .client()
        .await
        .execute(
            "INSERT INTO orders (id, customer_id, status, amount_cents) VALUES ($1, 'cust-1', 'pending', 2598)",
            &[&order_id],
        )
        .await
        .unwrap();
    let printed = stack.redrive(&dead_letters, None).await;

    assert!(printed.contains("redriven 1 records"), "{printed}");
    assert_eq!(stack.settled_order(order_id).await["status"], "confirmed");
    assert_eq!(stack.notified(order_id).await, 1);
    let sent_back: Vec<_> = stack
        .kafka
        .read_all(&topics.payments)
        .await
        .into_iter()
        .filter(|m| header(m, "dlq.redriven.from").is_some())
        .collect();
    assert_eq!(sent_back.len(), 1);
    assert_eq!(
        sent_back[0].payload(),
        Some(payment.as_slice()),
        "the original bytes"
    );
    assert_eq!(
        sent_back[0].key(),
        Some(order_id.to_string().as_bytes()),
        "the original key"
    );

    // Its own group remembers: a second run sends nothing.
    let again = stack.redrive(&dead_letters, None).await;
    assert!(again.contains("redriven 0 records"), "{again}");

    // Another group sends it all again on purpose: the inbox stops it.
    let forced = stack.redrive(&dead_letters, Some("redrive-again")).await;
    assert!(forced.contains("redriven 1 records"), "{forced}");
    stack.caught_up(ORDER_SERVICE, &topics.payments).await;
    stack.caught_up(NOTIFICATION_SERVICE, &topics.orders).await;
    let log = stack.log(ORDER_SERVICE);
    let handled: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(&payment_id) && l.contains("event handled"))
        .collect();
    assert_eq!(handled.len(), 2, "{handled:?}");
    assert!(handled[0].contains("outcome=\"applied\""), "{handled:?}");
    assert!(handled[1].contains("outcome=\"duplicate\""), "{handled:?}");
    assert_eq!(stack.get_order(order_id).await["status"], "confirmed");
    assert_eq!(stack.notifications(order_id).await, 1);
    assert_eq!(
        stack.kafka.read_all(&dead_letters).await.len(),
        1,
        "nothing dead-lettered again"
    );
}
