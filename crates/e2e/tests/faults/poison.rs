//! Poison: records no consumer can ever apply, mixed into the live stream, each to be
//! dead-lettered with its reason while the records behind it flow.

use saga::events;
use saga_e2e::hand::{HandProducer, envelope};
use saga_e2e::invariants::Poison;
use saga_e2e::load::Load;
use saga_e2e::{NOTIFICATION_SERVICE, ORDER_SERVICE, PAYMENT_SERVICE, Stack};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::{assert_under_load, at, conclude, cycles, drain_and_check, orders, rate};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults runs it on its own"]
async fn poison_records_mixed_into_the_stream_are_dead_lettered_with_their_reason_and_hold_nothing_up()
 {
    let mut stack = Stack::start().await;
    let load = Load::start(&stack, orders(), rate());
    let producer = HandProducer::new(&stack.kafka.brokers);
    let topics = stack.kafka.topics.clone();
    let batches = 5 * cycles();
    let mut poison = Vec::new();

    for batch in 1..=batches {
        load.reached(at(batch, batches)).await;
        assert_under_load(&load, "the poison was produced");
        for (topic, kinds) in [
            (&topics.payments, payments_poison()),
            (&topics.orders, orders_poison()),
        ] {
            for (i, kind) in kinds.into_iter().enumerate() {
                // Spread over the partitions, each in front of live records.
                let partition = ((batch + i) % 3) as i32;
                let (partition, offset) = producer
                    .send_value(
                        topic,
                        Some(partition),
                        Some("poison"),
                        kind.bytes.as_deref(),
                    )
                    .await;
                poison.push(Poison {
                    topic: topic.clone(),
                    partition,
                    offset,
                    rejected_by: kind.rejected_by,
                    reason: kind.reason.to_owned(),
                });
            }
        }
    }

    let produced = poison.len();
    let (findings, _) = drain_and_check(&mut stack, load, None, poison).await;
    let injected = format!(
        "{produced} poison records ({} kinds on payments, {} on orders, {batches} batches) among live ones",
        payments_poison().len(),
        orders_poison().len()
    );
    conclude("poison records mixed into the stream", &injected, &findings);
}

struct PoisonKind {
    /// `None` is a tombstone.
    bytes: Option<Vec<u8>>,
    rejected_by: Vec<&'static str>,
    reason: &'static str,
}

/// Records on `payments` that order-service can never apply.
fn payments_poison() -> Vec<PoisonKind> {
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
    let by_order_service = || vec![ORDER_SERVICE];
    let mut kinds = unparseable(a, by_order_service);
    kinds.push(PoisonKind {
        bytes: Some(overflowing_amount(a, events::PAYMENT_SUCCEEDED)),
        rejected_by: by_order_service(),
        reason: "payload of payment.succeeded field `amount_cents`",
    });
    kinds.extend([
        PoisonKind {
            bytes: Some(b"this is not json".to_vec()),
            rejected_by: by_order_service(),
            reason: "not UTF-8 JSON",
        },
        PoisonKind {
            bytes: Some(envelope(&format!("poison-{a}"), "payment.disputed", a, json!({}))),
            rejected_by: by_order_service(),
            reason: "unknown event type `payment.disputed`",
        },
        PoisonKind {
            bytes: Some(format!(
                r#"{{"id":"poison-{a}","type":"payment.succeeded","aggregate_id":"{a}","payload":{{}}}}"#
            )
            .into_bytes()),
            rejected_by: by_order_service(),
            reason: "missing field `occurred_at`",
        },
        PoisonKind {
            bytes: Some(envelope(
                &format!("{a}:payment"),
                events::PAYMENT_SUCCEEDED,
                a,
                json!({ "order_id": a, "amount_cents": 1299 }),
            )),
            rejected_by: by_order_service(),
            reason: "does not exist",
        },
        PoisonKind {
            bytes: Some(envelope(
                &format!("{a}:payment"),
                events::PAYMENT_SUCCEEDED,
                a,
                json!({ "order_id": b, "amount_cents": 1299 }),
            )),
            rejected_by: by_order_service(),
            reason: "does not match payload order_id",
        },
    ]);
    kinds
}

/// Records on `orders` that payment-service, notification-service or both can never
/// apply.
fn orders_poison() -> Vec<PoisonKind> {
    let a = Uuid::new_v4();
    let both = || vec![PAYMENT_SERVICE, NOTIFICATION_SERVICE];
    let mut kinds = unparseable(a, both);
    // notification-service ignores order.created without reading its payload.
    kinds.push(PoisonKind {
        bytes: Some(overflowing_amount(a, events::ORDER_CREATED)),
        rejected_by: vec![PAYMENT_SERVICE],
        reason: "payload of order.created field `amount_cents`",
    });
    kinds.extend([
        PoisonKind {
            bytes: Some(b"{\"id\": truncated".to_vec()),
            rejected_by: both(),
            reason: "not UTF-8 JSON",
        },
        PoisonKind {
            bytes: Some(envelope(
                &format!("poison-{a}"),
                "order.shipped",
                a,
                json!({}),
            )),
            rejected_by: both(),
            reason: "unknown event type `order.shipped`",
        },
        PoisonKind {
            bytes: Some(
                format!(r#"{{"id":"poison-{a}","type":"order.created","aggregate_id":"{a}"}}"#)
                    .into_bytes(),
            ),
            rejected_by: both(),
            reason: "missing field",
        },
        // notification-service ignores order.created without reading its payload.
        PoisonKind {
            bytes: Some(envelope(
                &a.to_string(),
                events::ORDER_CREATED,
                a,
                json!({ "order_id": a, "customer_id": "c", "amount_cents": "lots", "items": [] }),
            )),
            rejected_by: vec![PAYMENT_SERVICE],
            reason: "payload of order.created field `amount_cents`",
        },
        // payment-service ignores outcomes without reading their payload.
        PoisonKind {
            bytes: Some(envelope(
                &events::order_outcome_id(a),
                events::ORDER_CONFIRMED,
                a,
                json!({ "order_id": a, "amount_cents": 1299 }),
            )),
            rejected_by: vec![NOTIFICATION_SERVICE],
            reason: "missing field `customer_id`",
        },
    ]);
    kinds
}

/// Records no consumer can parse, on whichever topic: what a careless or hostile producer
/// sends. The envelope refuses each at once, so none costs a retry or reaches PostgreSQL.
fn unparseable(a: Uuid, rejected_by: fn() -> Vec<&'static str>) -> Vec<PoisonKind> {
    let fine = |id: &str| envelope(id, events::ORDER_CONFIRMED, a, json!({ "order_id": a }));
    let long_id: String = std::iter::repeat_with(|| Uuid::new_v4().simple().to_string())
        .flat_map(|chunk| chunk.chars().collect::<Vec<_>>())
        .take(10_000)
        .collect();
    let mut invalid_utf8 = fine(&format!("poison-{a}"));
    let at = invalid_utf8
        .iter()
        .position(|&b| b == b'p')
        .expect("the id");
    invalid_utf8.splice(at..at, [0xff, 0xfe]);
    let mut undated: Value = serde_json::from_slice(&fine(&format!("poison-{a}"))).unwrap();
    undated["occurred_at"] = json!("the day before yesterday");
    let kind = |bytes: Option<Vec<u8>>, reason| PoisonKind {
        bytes,
        rejected_by: rejected_by(),
        reason,
    };
    vec![
        kind(
            Some(fine(&long_id)),
            "envelope field `id` is 10000 bytes long",
        ),
        kind(
            Some(envelope(
                &format!("poison-{a}"),
                events::ORDER_CONFIRMED,
                a,
                json!({ "order_id": a, "customer_id": "c\u{0}" }),
            )),
            "`payload.customer_id` contains a NUL character",
        ),
        kind(
            Some(format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)).into_bytes()),
            "recursion limit exceeded",
        ),
        kind(Some(invalid_utf8), "not UTF-8 JSON"),
        kind(Some(Vec::new()), "record has no value"),
        kind(None, "record is a tombstone"),
        kind(
            Some(serde_json::to_vec(&undated).unwrap()),
            "envelope field `occurred_at`",
        ),
    ]
}

/// An event of `event_type` whose `amount_cents` is past what an `i64` holds.
fn overflowing_amount(a: Uuid, event_type: &str) -> Vec<u8> {
    let event = envelope(
        &format!("poison-{a}"),
        event_type,
        a,
        json!({ "order_id": a, "customer_id": "c", "amount_cents": 1, "items": [] }),
    );
    String::from_utf8(event)
        .unwrap()
        .replace(
            "\"amount_cents\":1",
            "\"amount_cents\":99999999999999999999",
        )
        .into_bytes()
}
