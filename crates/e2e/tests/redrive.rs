//! Dead letters sent back once their cause is fixed, with the real `redrive-dlq` binary.

use rdkafka::Message as _;
use rdkafka::message::{Header, Headers, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
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
    restore_order(&stack, order_id).await;
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

/// The order a dead-lettered payment was for, back in order-service's database (as if
/// restored from a backup): the cause fixed.
async fn restore_order(stack: &Stack, order_id: Uuid) {
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
}

/// A header as the test compares it: its name, and its value byte for byte.
type RawHeader = (String, Option<Vec<u8>>);

async fn produce_with_headers(
    stack: &Stack,
    topic: &str,
    key: &str,
    value: &[u8],
    headers: &[RawHeader],
) {
    let mut owned = OwnedHeaders::new();
    for (name, value) in headers {
        owned = owned.insert(Header {
            key: name,
            value: value.as_deref(),
        });
    }
    let producer: FutureProducer = saga::kafka::idempotent_producer(&stack.kafka.brokers)
        .create()
        .unwrap();
    let record = FutureRecord::to(topic)
        .key(key)
        .payload(value)
        .headers(owned);
    producer
        .send(record, SETTLE)
        .await
        .map_err(|(e, _)| e)
        .expect("the broker acknowledges");
}

fn headers_of(record: &OwnedMessage) -> Vec<RawHeader> {
    record
        .headers()
        .into_iter()
        .flat_map(Headers::iter)
        .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
        .collect()
}

#[tokio::test]
async fn a_dead_letter_keeps_its_records_headers_and_a_redrive_carries_them_back() {
    let stack = Stack::start().await;
    let topics = &stack.kafka.topics;
    let dead_letters = topics.dead_letter(&topics.payments, ORDER_SERVICE);
    // A payment for an order order-service does not have, caused by an event, traced,
    // and with a header of its producer's own that is not even text.
    let order_id = Uuid::new_v4();
    let payment = saga_testkit::envelope(
        &format!("{order_id}:payment"),
        "payment.succeeded",
        order_id,
        json!({ "order_id": order_id, "amount_cents": 2598 }),
    );
    let own: Vec<RawHeader> = [
        ("causation_id", order_id.to_string().into_bytes()),
        (
            "traceparent",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_vec(),
        ),
        (
            "tracestate",
            b"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7".to_vec(),
        ),
        ("x-anything", vec![0xff, 0x00, 0xfe, b'a']),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), Some(v)))
    .collect();
    let key = order_id.to_string();
    produce_with_headers(&stack, &topics.payments, &key, &payment, &own).await;

    let dead = eventually(SETTLE, "the payment to be dead-lettered", || async {
        stack.kafka.read_all(&dead_letters).await.pop()
    })
    .await;
    let kept = headers_of(&dead);
    assert_eq!(
        kept[..own.len()],
        own[..],
        "the record's headers, byte for byte"
    );
    assert!(
        kept[own.len()..].iter().all(|(k, _)| k.starts_with("dlq.")),
        "then only why it is here: {kept:?}"
    );

    restore_order(&stack, order_id).await;
    let printed = stack.redrive(&dead_letters, None).await;
    assert!(printed.contains("redriven 1 records"), "{printed}");

    let sent_back = stack
        .kafka
        .read_all(&topics.payments)
        .await
        .into_iter()
        .find(|m| header(m, "dlq.redriven.from").is_some())
        .expect("the payment sent back");
    let from = format!("{dead_letters}/{}/{}", dead.partition(), dead.offset());
    let redriven_from = ("dlq.redriven.from".to_owned(), Some(from.into_bytes()));
    assert_eq!(
        headers_of(&sent_back),
        [own, vec![redriven_from]].concat(),
        "the record's own headers again, and where it was"
    );
    assert_eq!(sent_back.key(), Some(key.as_bytes()), "the original key");
    assert_eq!(
        sent_back.payload(),
        Some(payment.as_slice()),
        "the original bytes"
    );
    assert_eq!(stack.settled_order(order_id).await["status"], "confirmed");
}
