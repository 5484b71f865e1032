//! The steps the databases hold: the order row and its cancellation, each service's
//! outbox rows about the order, the provider's charges and refunds, payment-service's
//! tombstone and the customer's notifications.

use std::collections::HashMap;

use saga::events;
use time::OffsetDateTime;
use uuid::Uuid;

use super::fate::Effect;
use super::{Databases, Kind, Order, Step, money};

/// The order as order-service has it now, or `None` if it has no such order.
pub(super) async fn order(databases: &Databases, order_id: Uuid) -> anyhow::Result<Option<Order>> {
    let Some(row) = databases
        .orders()
        .query_opt(
            "SELECT id, status, customer_id, amount_cents, cancel_reason, refund_id, settled_at,
                    refund_failure, created_at, updated_at
               FROM orders WHERE id = $1",
            &[&order_id],
        )
        .await?
    else {
        return Ok(None);
    };
    let status: String = row.get("status");
    let refund_id: Option<String> = row.get("refund_id");
    let settled_at: Option<OffsetDateTime> = row.get("settled_at");
    let refund_failure: Option<String> = row.get("refund_failure");
    // As order-service's API says it (RefundState).
    let refund = match (status.as_str(), &refund_id, &refund_failure, settled_at) {
        ("cancelled", Some(_), _, _) => Some("refunded"),
        ("cancelled", None, Some(_), _) => Some("failed"),
        ("cancelled", None, None, Some(_)) => Some("not_charged"),
        ("cancelled", None, None, None) => Some("pending"),
        _ => None,
    };
    Ok(Some(Order {
        id: row.get("id"),
        status,
        customer_id: row.get("customer_id"),
        amount_cents: row.get("amount_cents"),
        cancel_reason: row.get("cancel_reason"),
        refund,
        refund_id,
        refund_failure,
        settled_at,
        created_at: row.get("created_at"),
        updated_at: row.get("updated_at"),
    }))
}

pub(super) fn placed(order: &Order) -> Step {
    Step {
        at: order.created_at,
        actor: "order-service".into(),
        kind: Kind::Placed,
        text: format!(
            "order placed: {} for {} (POST /v1/orders)",
            money(order.amount_cents),
            order.customer_id
        ),
        detail: None,
    }
}

/// The cancellation by the customer or the deadline, if the order had one. A declined
/// payment's cancellation is told by the provider's decline and order-service's
/// `order.cancelled`.
pub(super) fn cancellation(order: &Order) -> Option<Step> {
    let text = match order.cancel_reason.as_deref()? {
        events::CANCELLED_BY_CUSTOMER => {
            "cancelled by the customer (POST /v1/orders/{id}/cancel)".to_owned()
        }
        events::CANCELLED_FOR_TIMEOUT => {
            "cancelled by the deadline: still pending after ORDER_PAYMENT_TIMEOUT".to_owned()
        }
        _ => return None,
    };
    Some(Step {
        at: order.updated_at,
        actor: "order-service".into(),
        kind: Kind::Cancelled,
        text: text.replace("{id}", &order.id.to_string()),
        detail: Some(match order.refund {
            Some("pending") => "refund: pending, payment-service has not answered yet".into(),
            Some("refunded") => format!(
                "refund: refunded, {}",
                order.refund_id.as_deref().unwrap_or_default()
            ),
            Some("failed") => format!(
                "refund: FAILED, {}; try again: sagactl refund retry {}",
                order.refund_failure.as_deref().unwrap_or_default(),
                order.id
            ),
            _ => "refund: not charged".into(),
        }),
    })
}

/// What each service wrote to its outbox about the order keyed `key`, pushed to `steps`
/// (`open` set if a row is unpublished), and what each row's cause made each service
/// write.
pub(super) async fn outbox<'d>(
    databases: &'d Databases,
    key: &str,
    steps: &mut Vec<Step>,
    open: &mut bool,
) -> anyhow::Result<HashMap<(&'d str, String), Effect>> {
    let mut caused: HashMap<(&str, String), Effect> = HashMap::new();
    for (service, client) in &databases.by_service {
        let rows = client
            .query(
                "SELECT event_id, topic, type, occurred_at, published_at, caused_by
                   FROM outbox WHERE key = $1 ORDER BY id",
                &[&key],
            )
            .await?;
        for row in rows {
            let event_id: String = row.get("event_id");
            let event_type: String = row.get("type");
            let topic: String = row.get("topic");
            let cause: Option<String> = row.get("caused_by");
            if let Some(cause) = &cause {
                caused
                    .entry((service, cause.clone()))
                    .or_insert_with(|| Effect {
                        types: Vec::new(),
                        at: row.get("occurred_at"),
                    })
                    .types
                    .push(event_type.clone());
            }
            steps.push(Step {
                at: row.get("occurred_at"),
                actor: (*service).into(),
                kind: Kind::Written,
                text: format!("wrote {event_type} to its outbox"),
                detail: Some(match &cause {
                    Some(cause) => format!("id {event_id}, caused by {cause}"),
                    None => format!("id {event_id}, in the order's own transaction"),
                }),
            });
            match row.get::<_, Option<OffsetDateTime>>("published_at") {
                Some(at) => steps.push(Step {
                    at,
                    actor: (*service).into(),
                    kind: Kind::Published,
                    text: format!("relay published {event_type} to {topic}"),
                    detail: None,
                }),
                None => {
                    *open = true;
                    steps.push(Step {
                        at: row.get("occurred_at"),
                        actor: (*service).into(),
                        kind: Kind::Waiting,
                        text: format!("{event_type} not published yet"),
                        detail: None,
                    });
                }
            }
        }
    }
    Ok(caused)
}

/// The provider's charges for the order keyed `key`, each with the key it was made
/// under. A refund's key names the charge it refunds too (and its refund), so only the
/// keys without a refund are the charge's own.
pub(super) async fn charges(databases: &Databases, key: &str) -> anyhow::Result<Vec<Step>> {
    let mut steps = Vec::new();
    for row in databases
        .provider
        .query(
            "SELECT c.id, c.status, c.amount_cents, c.failure_message, c.created_at, k.key
               FROM charges c
               LEFT JOIN idempotency_keys k ON k.charge_id = c.id AND k.refund_id IS NULL
              WHERE c.reference = $1 ORDER BY c.created_at",
            &[&key],
        )
        .await?
    {
        let id: String = row.get("id");
        let amount: i64 = row.get("amount_cents");
        let idempotency_key: Option<String> = row.get("key");
        let succeeded = row.get::<_, String>("status") == "succeeded";
        steps.push(Step {
            at: row.get("created_at"),
            actor: "payment-provider".into(),
            kind: if succeeded {
                Kind::Charged
            } else {
                Kind::Declined
            },
            text: if succeeded {
                format!("charged {} as {id}", money(amount))
            } else {
                format!(
                    "declined {}: {}",
                    money(amount),
                    row.get::<_, Option<String>>("failure_message")
                        .unwrap_or_default()
                )
            },
            detail: idempotency_key.map(|k| format!("Idempotency-Key {k}")),
        });
    }
    Ok(steps)
}

/// The provider's refunds of the order keyed `key`'s charges, each with the key it was
/// made under (none once that key expired).
pub(super) async fn refunds(databases: &Databases, key: &str) -> anyhow::Result<Vec<Step>> {
    let rows = databases
        .provider
        .query(
            "SELECT r.id, r.charge_id, r.amount_cents, r.created_at, k.key
               FROM refunds r
               JOIN charges c ON c.id = r.charge_id
               LEFT JOIN idempotency_keys k ON k.refund_id = r.id
              WHERE c.reference = $1 ORDER BY r.created_at",
            &[&key],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| {
            let id: String = row.get("id");
            let charge: String = row.get("charge_id");
            let key: Option<String> = row.get("key");
            Step {
                at: row.get("created_at"),
                actor: "payment-provider".into(),
                kind: Kind::Refunded,
                text: format!(
                    "refunded {} of {charge} as {id}",
                    money(row.get("amount_cents"))
                ),
                detail: key.map(|k| format!("Idempotency-Key {k}")),
            }
        })
        .collect())
}

/// payment-service's own record of the order's money, where the provider's charges and
/// refunds do not tell it: its tombstone (the `voided` payment a cancellation left where
/// no charge was asked for, which stops any charge for the order later), a charge asked
/// for whose answer is not known, and a refund undecided, refused or left to a person.
pub(super) async fn payment(databases: &Databases, order_id: Uuid) -> anyhow::Result<Vec<Step>> {
    let Some(row) = databases
        .of("payment-service")
        .query_opt(
            "SELECT event_id, status, charge_id, charge_key, refund_id, refund_status,
                    refund_key, refund_reason, refund_attempt, created_at, updated_at
               FROM payments WHERE order_id = $1",
            &[&order_id],
        )
        .await?
    else {
        return Ok(Vec::new());
    };
    Ok(charge_step(&row)
        .into_iter()
        .chain(refund_step(&row, order_id))
        .collect())
}

/// The payment's charge, where the provider's charges do not tell it: its tombstone, or
/// its answer not known yet.
fn charge_step(row: &tokio_postgres::Row) -> Option<Step> {
    let status: &str = row.get("status");
    let charge: Option<String> = row.get("charge_id");
    let refund: Option<String> = row.get("refund_id");
    let event_id: String = row.get("event_id");
    match status {
        "voided" => Some(Step {
            at: row.get("created_at"),
            actor: "payment-service".into(),
            kind: Kind::Tombstone,
            text: match (&charge, &refund) {
                (Some(charge), Some(refund)) => format!(
                    "tombstone: cancelled before a charge was recorded here; the provider's {charge} is refunded as {refund}"
                ),
                (Some(charge), None) => format!(
                    "tombstone: cancelled before a charge was recorded here; the provider's {charge} stands"
                ),
                _ => "cancelled before any charge: no charge will be made".to_owned(),
            },
            detail: Some(format!("a voided payment, left by {event_id}")),
        }),
        "charging" | "unknown" => Some(Step {
            at: row.get("updated_at"),
            actor: "payment-service".into(),
            kind: Kind::Unknown,
            text: format!(
                "charge {}: asked for under {}, its answer not known yet",
                if status == "unknown" {
                    "unknown"
                } else {
                    "being asked for"
                },
                row.get::<_, Option<String>>("charge_key")
                    .unwrap_or_default()
            ),
            detail: Some(
                "only the same key's answer decides it; the order's cancellation asks again".into(),
            ),
        }),
        _ => None,
    }
}

/// The payment's refund, where the provider's refunds do not tell it: refused, left to a
/// person, or its answer not known yet.
fn refund_step(row: &tokio_postgres::Row, order_id: Uuid) -> Option<Step> {
    let refund_status: Option<&str> = row.get("refund_status");
    let reason: Option<String> = row.get("refund_reason");
    let attempt: i32 = row.get("refund_attempt");
    let key: Option<String> = row.get("refund_key");
    let (kind, text) = match refund_status {
        Some("failed") => (
            Kind::RefundFailed,
            format!(
                "refund FAILED (attempt {attempt}): {}",
                reason.unwrap_or_default()
            ),
        ),
        Some("manual") => (
            Kind::RefundFailed,
            format!("refund left to a person: {}", reason.unwrap_or_default()),
        ),
        Some(undecided @ ("refunding" | "unknown")) => (
            Kind::Unknown,
            format!(
                "refund {}: asked for under {}, its answer not known yet",
                if undecided == "unknown" {
                    "unknown"
                } else {
                    "being asked for"
                },
                key.unwrap_or_default()
            ),
        ),
        _ => return None,
    };
    Some(Step {
        at: row.get("updated_at"),
        actor: "payment-service".into(),
        kind,
        text,
        detail: (refund_status == Some("failed"))
            .then(|| format!("try again: sagactl refund retry {order_id}")),
    })
}

/// The customer's notifications, one per kind of news.
pub(super) async fn notifications(
    databases: &Databases,
    order_id: Uuid,
) -> anyhow::Result<Vec<Step>> {
    let mut steps = Vec::new();
    for row in databases
        .of("notification-service")
        .query(
            "SELECT kind, message, created_at FROM notifications
              WHERE order_id = $1 ORDER BY created_at",
            &[&order_id],
        )
        .await?
    {
        steps.push(Step {
            at: row.get("created_at"),
            actor: "notification-service".into(),
            kind: Kind::Notified,
            text: row.get("message"),
            detail: Some(format!("kind {}", row.get::<_, String>("kind"))),
        });
    }
    Ok(steps)
}
