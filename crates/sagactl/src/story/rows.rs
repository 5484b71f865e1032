//! The steps the databases hold: the order row, each service's outbox rows about the
//! order, the provider's charges and the customer's notification.

use std::collections::HashMap;

use time::OffsetDateTime;
use uuid::Uuid;

use super::fate::Effect;
use super::{Databases, Kind, Order, Step, money};

/// The order as order-service has it now, or `None` if it has no such order.
pub(super) async fn order(databases: &Databases, order_id: Uuid) -> anyhow::Result<Option<Order>> {
    let Some(row) = databases
        .orders()
        .query_opt(
            "SELECT id, status, customer_id, amount_cents, cancel_reason, created_at, updated_at
               FROM orders WHERE id = $1",
            &[&order_id],
        )
        .await?
    else {
        return Ok(None);
    };
    Ok(Some(Order {
        id: row.get("id"),
        status: row.get("status"),
        customer_id: row.get("customer_id"),
        amount_cents: row.get("amount_cents"),
        cancel_reason: row.get("cancel_reason"),
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

/// The provider's charges for the order keyed `key`.
pub(super) async fn charges(databases: &Databases, key: &str) -> anyhow::Result<Vec<Step>> {
    let mut steps = Vec::new();
    for row in databases
        .provider
        .query(
            "SELECT c.id, c.status, c.amount_cents, c.failure_message, c.created_at, k.key
               FROM charges c LEFT JOIN idempotency_keys k ON k.charge_id = c.id
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

/// The customer's notification.
pub(super) async fn notifications(
    databases: &Databases,
    order_id: Uuid,
) -> anyhow::Result<Vec<Step>> {
    let mut steps = Vec::new();
    for row in databases
        .of("notification-service")
        .query(
            "SELECT message, created_at FROM notifications WHERE order_id = $1",
            &[&order_id],
        )
        .await?
    {
        steps.push(Step {
            at: row.get("created_at"),
            actor: "notification-service".into(),
            kind: Kind::Notified,
            text: row.get("message"),
            detail: None,
        });
    }
    Ok(steps)
}
