//! Conflicting and out-of-order events: hand-made copies, flips and late results for
//! orders the saga has decided, each of which a guard must stop or the consumers ignore.
//!
//! The flipped outcome (an `order.cancelled` for a confirmed order, an `order.confirmed`
//! for a declined one) carries an id of its own, `conflict-outcome-flip:<order id>`.
//! Only the ids order-service gives an order's outcome and cancellation
//! (`<id>:outcome`, `<id>:cancel`) are the order's state: payment-service refunds
//! nothing for any other, and logs it `ignored`. notification-service ignores such a
//! cancellation too, and a flipped confirmation meets guard 2, as the customer was told
//! the order's outcome once already. The checker then finds no refund and no
//! notification for it.

use std::collections::{BTreeMap, HashMap};

use saga::Topics;
use saga::events;
use saga_e2e::hand::{HandProducer, envelope};
use saga_e2e::invariants;
use saga_e2e::load::Load;
use saga_e2e::{NOTIFICATION_SERVICE, ORDER_SERVICE, PAYMENT_SERVICE, SERVICES, SETTLE, Stack};
use saga_testkit::eventually;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::{conclude, drain_and_check, orders, rate};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults runs it on its own"]
async fn conflicting_and_out_of_order_events_for_decided_orders_change_nothing() {
    let mut stack = Stack::start().await;
    let load = Load::start(&stack, orders(), rate());
    let producer = HandProducer::new(&stack.kafka.brokers);
    let topics = stack.kafka.topics.clone();
    let target = (orders() / 5).max(20);
    // Orders fully decided (the customer was notified) when targeted, with their status.
    let mut targeted: HashMap<Uuid, String> = HashMap::new();
    // (service, event id) → the outcome its handling must log.
    let mut wanted: Vec<(&str, String, &str)> = Vec::new();

    while targeted.len() < target {
        let batch = more_decided_orders(&stack, &targeted).await;
        for order in batch.into_iter().take(target - targeted.len()) {
            for conflict in conflicts_with(&order, &topics) {
                wanted.extend(send(&producer, &order, conflict).await);
            }
            targeted.insert(order.id, order.status);
        }
    }

    let (findings, _) = drain_and_check(&mut stack, load, None, Vec::new()).await;
    let mut wrong = outcomes_not_logged_last(&stack, &wanted);
    wrong.extend(decisions_changed(&stack, &targeted).await);
    let injected = format!(
        "{} hand-made events for {} decided and notified orders: late contradicting results, \
         results and outcomes flipped under their own ids, second order.created, the first \
         event replayed after the last",
        6 * targeted.len(),
        targeted.len()
    );
    conclude(
        "conflicting and out-of-order events for decided orders",
        &injected,
        &findings,
    );
    assert!(
        wrong.is_empty(),
        "hand-made events not stopped as expected:\n{}",
        wrong.join("\n")
    );
}

/// A hand-made event for a decided order, and the outcome each service that reads its
/// topic must log for it.
struct Conflict<'a> {
    topic: &'a str,
    event_id: String,
    event_type: &'static str,
    payload: Value,
    outcomes: Vec<(&'static str, &'static str)>,
}

/// Waits for decided and notified orders not yet in `targeted`.
async fn more_decided_orders(stack: &Stack, targeted: &HashMap<Uuid, String>) -> Vec<Decided> {
    eventually(
        SETTLE,
        "more orders to be decided and notified",
        || async move {
            let decided = decided_orders(stack, targeted).await;
            (!decided.is_empty()).then_some(decided)
        },
    )
    .await
}

/// The six events that contradict or repeat what the saga decided for `order`, in the
/// order they are sent.
fn conflicts_with<'a>(order: &Decided, topics: &'a Topics) -> Vec<Conflict<'a>> {
    let mut conflicts = contradicting_results(order, &topics.payments);
    conflicts.extend(repeated_and_flipped_order_events(order, &topics.orders));
    conflicts
}

/// On `payments`, for order-service: results that contradict the decision.
fn contradicting_results<'a>(order: &Decided, payments: &'a str) -> Vec<Conflict<'a>> {
    let id = order.id;
    let key = id.to_string();
    let flipped_result = if order.status == "confirmed" {
        events::PAYMENT_FAILED
    } else {
        events::PAYMENT_SUCCEEDED
    };
    let result_payload = json!({
        "order_id": id, "amount_cents": order.amount_cents, "reason": "card declined"
    });
    vec![
        // A late result contradicting the decision, with an id of its own: guard 2.
        Conflict {
            topic: payments,
            event_id: format!("conflict-late-result:{id}"),
            event_type: flipped_result,
            payload: result_payload.clone(),
            outcomes: vec![(ORDER_SERVICE, "guarded")],
        },
        // The decided result's own id with the opposite content: guard 1.
        Conflict {
            topic: payments,
            event_id: events::payment_result_id(&key),
            event_type: flipped_result,
            payload: result_payload,
            outcomes: vec![(ORDER_SERVICE, "duplicate")],
        },
    ]
}

/// On `orders`, for payment-service and notification-service: the order's events again,
/// out of order, or flipped.
fn repeated_and_flipped_order_events<'a>(order: &Decided, orders: &'a str) -> Vec<Conflict<'a>> {
    let id = order.id;
    let key = id.to_string();
    let (flipped_outcome, genuine_outcome) = if order.status == "confirmed" {
        (events::ORDER_CANCELLED, events::ORDER_CONFIRMED)
    } else {
        (events::ORDER_CONFIRMED, events::ORDER_CANCELLED)
    };
    let outcome_payload = json!({
        "order_id": id, "customer_id": order.customer_id, "amount_cents": order.amount_cents
    });
    let mut created_again = order.created.clone();
    created_again["amount_cents"] = json!(1);
    vec![
        // A second order.created for the order, for another amount: guard 2.
        Conflict {
            topic: orders,
            event_id: format!("conflict-created-again:{id}"),
            event_type: events::ORDER_CREATED,
            payload: created_again,
            outcomes: vec![
                (PAYMENT_SERVICE, "guarded"),
                (NOTIFICATION_SERVICE, "ignored"),
            ],
        },
        // The saga's first event again, after its last: guard 1.
        Conflict {
            topic: orders,
            event_id: key,
            event_type: events::ORDER_CREATED,
            payload: order.created.clone(),
            outcomes: vec![
                (PAYMENT_SERVICE, "duplicate"),
                (NOTIFICATION_SERVICE, "ignored"),
            ],
        },
        // The opposite outcome, with an id of its own: not one order-service gives an
        // order's outcome or cancellation, so it is not the order's state. It moves no
        // money, and tells the customer nothing: a cancellation is ignored, a
        // confirmation finds the outcome the customer was told (guard 2).
        Conflict {
            topic: orders,
            event_id: format!("conflict-outcome-flip:{id}"),
            event_type: flipped_outcome,
            payload: outcome_payload.clone(),
            outcomes: vec![
                (PAYMENT_SERVICE, "ignored"),
                (
                    NOTIFICATION_SERVICE,
                    if flipped_outcome == events::ORDER_CONFIRMED {
                        "guarded"
                    } else {
                        "ignored"
                    },
                ),
            ],
        },
        // The genuine outcome once more: guard 1, for payment-service too when it is a
        // decline's cancellation (which it answered); a confirmation is none of its
        // business.
        Conflict {
            topic: orders,
            event_id: events::order_outcome_id(id),
            event_type: genuine_outcome,
            payload: outcome_payload,
            outcomes: vec![
                (
                    PAYMENT_SERVICE,
                    if order.status == "confirmed" {
                        "ignored"
                    } else {
                        "duplicate"
                    },
                ),
                (NOTIFICATION_SERVICE, "duplicate"),
            ],
        },
    ]
}

/// Produces `conflict`, keyed by its order as the saga's own events are; returns (service,
/// event id, outcome) for each outcome it must meet.
async fn send(
    producer: &HandProducer,
    order: &Decided,
    conflict: Conflict<'_>,
) -> Vec<(&'static str, String, &'static str)> {
    let id = order.id;
    let key = id.to_string();
    producer
        .send(
            conflict.topic,
            None,
            Some(&key),
            &envelope(
                &conflict.event_id,
                conflict.event_type,
                id,
                conflict.payload,
            ),
        )
        .await;
    conflict
        .outcomes
        .into_iter()
        .map(|(service, outcome)| (service, conflict.event_id.clone(), outcome))
        .collect()
}

/// The hand-made events whose last logged outcome is not the one wanted.
fn outcomes_not_logged_last(stack: &Stack, wanted: &[(&str, String, &str)]) -> Vec<String> {
    let mut wrong = Vec::new();
    let logged: BTreeMap<&str, HashMap<String, Vec<String>>> = SERVICES
        .iter()
        .map(|s| (*s, invariants::outcomes_by_event(stack, s)))
        .collect();
    for (service, event_id, outcome) in wanted {
        let seen = logged[service].get(event_id).cloned().unwrap_or_default();
        // The hand-made record comes after the genuine one (same id) for guard-1 cases.
        let hand_made = seen.last();
        if hand_made.map(String::as_str) != Some(*outcome) {
            wrong.push(format!(
                "{service} {event_id}: {seen:?}, wanted {outcome} last"
            ));
        }
    }
    wrong
}

/// The targeted orders whose status is no longer the one they were decided with.
async fn decisions_changed(stack: &Stack, targeted: &HashMap<Uuid, String>) -> Vec<String> {
    let mut wrong = Vec::new();
    let statuses: HashMap<Uuid, String> = order_statuses(stack).await;
    for (id, status) in targeted {
        if statuses.get(id) != Some(status) {
            wrong.push(format!(
                "order {id} was {status}, is {:?}",
                statuses.get(id)
            ));
        }
    }
    wrong
}

/// An order the saga has decided and told the customer about.
struct Decided {
    id: Uuid,
    status: String,
    amount_cents: i64,
    customer_id: String,
    /// Its `order.created` payload, as published.
    created: Value,
}

/// Up to 20 decided and notified orders not in `skip`.
async fn decided_orders(stack: &Stack, skip: &HashMap<Uuid, String>) -> Vec<Decided> {
    let notified: Vec<Uuid> = stack
        .notifications_db
        .client()
        .await
        .query("SELECT order_id FROM notifications", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .filter(|id| !skip.contains_key(id))
        .take(20)
        .collect();
    let rows = stack
        .orders_db
        .client()
        .await
        .query(
            "SELECT o.id, o.status, o.amount_cents, o.customer_id, x.payload
               FROM orders o JOIN outbox x ON x.key = o.id::text AND x.type = 'order.created'
              WHERE o.id = ANY($1) AND o.status <> 'pending'",
            &[&notified],
        )
        .await
        .unwrap();
    rows.iter()
        .map(|r| Decided {
            id: r.get(0),
            status: r.get(1),
            amount_cents: r.get(2),
            customer_id: r.get(3),
            created: r.get(4),
        })
        .collect()
}

async fn order_statuses(stack: &Stack) -> HashMap<Uuid, String> {
    stack
        .orders_db
        .client()
        .await
        .query("SELECT id, status FROM orders", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}
