//! The exactly-once count at the end of a run: each order's effects counted where they
//! are recorded, against one per order and one per cancellation.

use std::collections::HashMap;

use serde::Serialize;

use crate::db::Databases;
use crate::sql::Database;

/// Whether every order took effect exactly once, over the whole run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Effects {
    pub orders: i64,
    pub still_pending: i64,
    /// `payments` rows, orders decided (by their payment's outcome, or cancelled before
    /// it), orders notified of that, and the provider's charges: each must equal
    /// `orders`.
    pub payments: i64,
    pub outcome_events: i64,
    pub notifications: i64,
    /// The provider's charges for the run's orders (not those the benchmark asked for
    /// itself): the one effect no rollback undoes.
    pub charges: i64,
    /// Orders the customer cancelled, and of those, the refunds the provider made, the
    /// answers payment-service gave (each cancellation one), and the cancellations still
    /// unanswered: 0 once the saga has drained.
    pub cancellations: i64,
    pub refunds: i64,
    pub answers: i64,
    pub unsettled: i64,
    pub applied: HashMap<Database, i64>,
    /// Orders with more than one event of a kind for one cause.
    pub orders_with_repeated_events: i64,
    /// Orders the provider charged more than once.
    pub orders_charged_twice: i64,
    /// Outbox rows not yet published.
    pub unpublished: i64,
    /// Effects beyond one per order (and per cancellation); must be 0.
    pub extra_effects: i64,
    /// Effects missing; must be 0 once the saga has drained.
    pub missing_effects: i64,
}

async fn count(client: &tokio_postgres::Client, sql: &str) -> anyhow::Result<i64> {
    Ok(client.query_one(sql, &[]).await?.get(0))
}

/// The run's effects, each counted where it is recorded.
pub async fn effects(databases: &Databases) -> anyhow::Result<Effects> {
    let orders_db = databases.connect(Database::Orders).await?;
    let payments_db = databases.connect(Database::Payments).await?;
    let notifications_db = databases.connect(Database::Notifications).await?;
    let provider_db = databases.connect(Database::Provider).await?;
    let for_orders = format!(
        "reference NOT LIKE '{}%'",
        crate::load::DIRECT_CHARGE_PREFIX
    );
    let effects = Effects {
        orders: count(&orders_db, "SELECT count(*) FROM orders").await?,
        still_pending: count(&orders_db, "SELECT count(*) FROM orders WHERE status = 'pending'")
            .await?,
        payments: count(&payments_db, "SELECT count(*) FROM payments").await?,
        outcome_events: count(
            &orders_db,
            "SELECT count(DISTINCT key) FROM outbox WHERE type IN ('order.confirmed', 'order.cancelled')",
        )
        .await?,
        notifications: count(
            &notifications_db,
            "SELECT count(DISTINCT order_id) FROM notifications WHERE kind <> 'refunded'",
        )
        .await?,
        charges: count(&provider_db, &format!("SELECT count(*) FROM charges WHERE {for_orders}"))
            .await?,
        orders_charged_twice: count(
            &provider_db,
            &format!(
                "SELECT count(*) FROM (SELECT reference FROM charges WHERE {for_orders}
                  GROUP BY reference HAVING count(*) > 1) AS r"
            ),
        )
        .await?,
        cancellations: count(
            &orders_db,
            "SELECT count(*) FROM outbox WHERE type = 'order.cancelled' AND event_id LIKE '%:cancel'",
        )
        .await?,
        refunds: count(&provider_db, "SELECT count(*) FROM refunds").await?,
        answers: count(
            &payments_db,
            "SELECT count(*) FROM outbox WHERE type IN ('payment.refunded', 'payment.voided')",
        )
        .await?,
        unsettled: count(&orders_db, "SELECT count(*) FROM orders WHERE settled_at IS NULL")
            .await?,
        ..Effects::default()
    };
    events_and_inboxes(effects, [&orders_db, &payments_db, &notifications_db]).await
}

/// Each consumer's applied events against the events published for it, each outbox's
/// repeats, then what is extra and what is missing against one effect per order and per
/// cancellation.
async fn events_and_inboxes(
    mut effects: Effects,
    [orders_db, payments_db, notifications_db]: [&tokio_postgres::Client; 3],
) -> anyhow::Result<Effects> {
    let (orders, cancelled) = (effects.orders, effects.cancellations);
    // Every event published is applied once by the consumer it is for: order-service
    // applies all of payments; payment-service order.created and the cancellations;
    // notification-service the rest of orders.
    let published = |types: &str| format!("SELECT count(*) FROM outbox WHERE type IN ({types})");
    let for_consumers = [
        (
            Database::Orders,
            orders_db,
            payments_db,
            published(
                "'payment.succeeded', 'payment.failed', 'payment.refunded', 'payment.voided'",
            ),
        ),
        (
            Database::Payments,
            payments_db,
            orders_db,
            published("'order.created', 'order.cancelled'"),
        ),
        (
            Database::Notifications,
            notifications_db,
            orders_db,
            published("'order.confirmed', 'order.cancelled', 'order.refunded'"),
        ),
    ];
    let mut repeated = 0;
    for (database, client, publisher, events_for_it) in for_consumers {
        let applied = count(client, "SELECT count(*) FROM processed_events").await?;
        let expected = count(publisher, &events_for_it).await?;
        effects.applied.insert(database, applied);
        effects.extra_effects += (applied - expected).max(0);
        effects.missing_effects += (expected - applied).max(0);
        // An order's events of one type have one cause each: notification.sent one per
        // event told, the others one per order.
        repeated += count(
            client,
            "SELECT count(*) FROM (SELECT key, type, caused_by FROM outbox
              GROUP BY key, type, caused_by HAVING count(*) > 1) AS r",
        )
        .await?;
        effects.unpublished += count(
            client,
            "SELECT count(*) FROM outbox WHERE published_at IS NULL",
        )
        .await?;
    }
    effects.orders_with_repeated_events = repeated;
    let per_order = [
        effects.payments,
        effects.outcome_events,
        effects.notifications,
        effects.charges,
    ];
    for found in per_order {
        effects.extra_effects += (found - orders).max(0);
        effects.missing_effects += (orders - found).max(0);
    }
    effects.extra_effects +=
        (effects.refunds - cancelled).max(0) + (effects.answers - cancelled).max(0);
    effects.missing_effects += (cancelled - effects.answers).max(0);
    effects.extra_effects += repeated + effects.orders_charged_twice;
    Ok(effects)
}
