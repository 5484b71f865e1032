//! The rows the checks read: the three services' databases and the provider's, read once.

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use crate::{PAYMENT_PROVIDER, SERVICES, Stack};

pub(super) struct Order {
    pub(super) status: String,
    pub(super) amount_cents: i64,
    pub(super) cancel_reason: Option<String>,
    /// `settled_at` is set: its outcome decided and its cancellation, if any, answered.
    pub(super) settled: bool,
    /// The refund payment-service reported for it.
    pub(super) refund_id: Option<String>,
    /// Why its refund failed, as payment-service reported it.
    pub(super) refund_failure: Option<String>,
}

pub(super) struct OutboxRow {
    pub(super) key: String,
    pub(super) event_type: String,
    pub(super) event_id: String,
}

/// payment-service's payment row: a charge's outcome, or a cancellation's tombstone.
pub(super) struct Payment {
    pub(super) event_id: String,
    /// `succeeded`, `failed`, or `voided` (the tombstone); `charging` or `unknown` while
    /// its charge is undecided, which no payment may be at rest.
    pub(super) status: String,
    pub(super) amount_cents: i64,
    pub(super) charge_id: Option<String>,
    pub(super) refund_id: Option<String>,
    /// `refunded`, `failed` or `manual` at rest; `refunding` or `unknown` while its
    /// refund is undecided.
    pub(super) refund_status: Option<String>,
    /// Refund attempts made: each failed one announced `payment.refund_failed`.
    pub(super) refund_attempt: i32,
    /// Seconds since the epoch: PostgreSQL's clock, which the provider's shares.
    pub(super) created_at: f64,
}

pub(super) struct Notification {
    /// The order event it tells of.
    pub(super) event_id: String,
    pub(super) kind: String,
}

/// A charge the provider made, and its refunds.
pub(super) struct ProviderCharge {
    pub(super) id: String,
    pub(super) status: String,
    pub(super) amount_cents: i64,
    /// Seconds since the epoch.
    pub(super) created_at: f64,
    pub(super) refunds: Vec<ProviderRefund>,
}

pub(super) struct ProviderRefund {
    pub(super) id: String,
    pub(super) amount_cents: i64,
}

/// The three databases' rows, read once.
pub(super) struct Databases {
    pub(super) orders: HashMap<Uuid, Order>,
    pub(super) payments: HashMap<Uuid, Vec<Payment>>,
    pub(super) notifications: HashMap<Uuid, Vec<Notification>>,
    /// The provider's charges by reference (the order id, as payment-service sends it).
    pub(super) charges: HashMap<String, Vec<ProviderCharge>>,
    pub(super) outboxes: HashMap<&'static str, Vec<OutboxRow>>,
    pub(super) inboxes: HashMap<&'static str, HashSet<String>>,
    pub(super) unpublished: HashMap<&'static str, i64>,
}

impl Databases {
    pub(super) async fn read(stack: &Stack) -> Self {
        let orders = read_orders(stack).await;
        let payments = read_payments(stack).await;
        let charges = read_charges(stack).await;
        let notifications = read_notifications(stack).await;
        let (outboxes, inboxes, unpublished) = read_outboxes_and_inboxes(stack).await;
        Self {
            orders,
            payments,
            notifications,
            charges,
            outboxes,
            inboxes,
            unpublished,
        }
    }

    /// `service`'s outbox rows per key, restricted to `types`.
    pub(super) fn outbox_by_key(
        &self,
        service: &str,
        types: &[&str],
    ) -> HashMap<String, Vec<&OutboxRow>> {
        let mut by_key: HashMap<String, Vec<&OutboxRow>> = HashMap::new();
        for row in &self.outboxes[service] {
            if types.contains(&row.event_type.as_str()) {
                by_key.entry(row.key.clone()).or_default().push(row);
            }
        }
        by_key
    }
}

pub(super) async fn rows(stack: &Stack, service: &str, sql: &str) -> Vec<tokio_postgres::Row> {
    stack
        .database(service)
        .client()
        .await
        .query(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{service}: {sql}: {e}"))
}

async fn read_orders(stack: &Stack) -> HashMap<Uuid, Order> {
    rows(
        stack,
        crate::ORDER_SERVICE,
        "SELECT id, status, amount_cents, cancel_reason, settled_at IS NOT NULL, refund_id,
                refund_failure
           FROM orders",
    )
    .await
    .into_iter()
    .map(|r| {
        (
            r.get::<_, Uuid>(0),
            Order {
                status: r.get(1),
                amount_cents: r.get(2),
                cancel_reason: r.get(3),
                settled: r.get(4),
                refund_id: r.get(5),
                refund_failure: r.get(6),
            },
        )
    })
    .collect()
}

async fn read_payments(stack: &Stack) -> HashMap<Uuid, Vec<Payment>> {
    let mut payments: HashMap<Uuid, Vec<Payment>> = HashMap::new();
    for r in rows(
        stack,
        crate::PAYMENT_SERVICE,
        "SELECT order_id, event_id, status, amount_cents, charge_id, refund_id,
                extract(epoch FROM created_at)::float8, refund_status, refund_attempt
           FROM payments",
    )
    .await
    {
        payments.entry(r.get(0)).or_default().push(Payment {
            event_id: r.get(1),
            status: r.get(2),
            amount_cents: r.get(3),
            charge_id: r.get(4),
            refund_id: r.get(5),
            created_at: r.get(6),
            refund_status: r.get(7),
            refund_attempt: r.get(8),
        });
    }
    payments
}

async fn read_charges(stack: &Stack) -> HashMap<String, Vec<ProviderCharge>> {
    let mut refunds: HashMap<String, Vec<ProviderRefund>> = HashMap::new();
    for r in rows(
        stack,
        PAYMENT_PROVIDER,
        "SELECT charge_id, id, amount_cents FROM refunds",
    )
    .await
    {
        refunds.entry(r.get(0)).or_default().push(ProviderRefund {
            id: r.get(1),
            amount_cents: r.get(2),
        });
    }
    let mut charges: HashMap<String, Vec<ProviderCharge>> = HashMap::new();
    for r in rows(
        stack,
        PAYMENT_PROVIDER,
        "SELECT reference, id, status, amount_cents, extract(epoch FROM created_at)::float8
           FROM charges ORDER BY created_at",
    )
    .await
    {
        let id: String = r.get(1);
        charges.entry(r.get(0)).or_default().push(ProviderCharge {
            refunds: refunds.remove(&id).unwrap_or_default(),
            id,
            status: r.get(2),
            amount_cents: r.get(3),
            created_at: r.get(4),
        });
    }
    charges
}

async fn read_notifications(stack: &Stack) -> HashMap<Uuid, Vec<Notification>> {
    let mut notifications: HashMap<Uuid, Vec<Notification>> = HashMap::new();
    for r in rows(
        stack,
        crate::NOTIFICATION_SERVICE,
        "SELECT order_id, event_id, kind FROM notifications",
    )
    .await
    {
        notifications
            .entry(r.get(0))
            .or_default()
            .push(Notification {
                event_id: r.get(1),
                kind: r.get(2),
            });
    }
    notifications
}

/// Each service's outbox rows and inbox ids, and how many of its outbox rows are unpublished.
type Boxes = (
    HashMap<&'static str, Vec<OutboxRow>>,
    HashMap<&'static str, HashSet<String>>,
    HashMap<&'static str, i64>,
);

async fn read_outboxes_and_inboxes(stack: &Stack) -> Boxes {
    let mut outboxes = HashMap::new();
    let mut inboxes = HashMap::new();
    let mut unpublished = HashMap::new();
    for service in SERVICES {
        let outbox = rows(
            stack,
            service,
            "SELECT key, type, event_id, published_at IS NULL FROM outbox",
        )
        .await;
        unpublished.insert(
            service,
            outbox.iter().filter(|r| r.get::<_, bool>(3)).count() as i64,
        );
        outboxes.insert(
            service,
            outbox
                .into_iter()
                .map(|r| OutboxRow {
                    key: r.get(0),
                    event_type: r.get(1),
                    event_id: r.get(2),
                })
                .collect(),
        );
        let inbox = rows(stack, service, "SELECT event_id FROM processed_events").await;
        inboxes.insert(service, inbox.into_iter().map(|r| r.get(0)).collect());
    }
    (outboxes, inboxes, unpublished)
}
