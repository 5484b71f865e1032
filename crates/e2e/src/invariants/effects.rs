//! The saga's effects as a whole: counted, to compare before and after a replay, and
//! looked at for any effect only half there, which no moment may show.

use std::collections::BTreeMap;

use super::databases::rows;
use crate::{SERVICES, Stack};

/// What [`half_applied`] looks for, per service: what is half there, and the query that
/// finds it.
const HALF_APPLIED: [(&str, &str, &str); 11] = [
    (
        crate::ORDER_SERVICE,
        "status and outcome event disagree",
        "SELECT o.id::text FROM orders o
          WHERE (o.status <> 'pending') <> EXISTS (SELECT 1 FROM outbox x
                 WHERE x.key = o.id::text AND x.type IN ('order.confirmed', 'order.cancelled'))",
    ),
    (
        crate::ORDER_SERVICE,
        "order without its order.created outbox row",
        "SELECT o.id::text FROM orders o WHERE NOT EXISTS (SELECT 1 FROM outbox x
          WHERE x.key = o.id::text AND x.type = 'order.created')",
    ),
    (
        crate::ORDER_SERVICE,
        "inbox row without its effect (a decided order, a settled one)",
        "SELECT p.event_id FROM processed_events p WHERE NOT EXISTS (SELECT 1 FROM orders o
          WHERE (p.event_id = o.id::text || ':payment' AND o.status <> 'pending')
             OR (p.event_id = o.id::text || ':refund' AND o.settled_at IS NOT NULL)
             OR (p.event_id LIKE o.id::text || ':%:voided' AND o.settled_at IS NOT NULL)
             OR (p.event_id LIKE o.id::text || ':refund\\_failed:%'
                 AND o.settled_at IS NOT NULL AND o.refund_failure IS NOT NULL))",
    ),
    (
        crate::ORDER_SERVICE,
        "order decided by its payment without its payment result in the inbox",
        "SELECT o.id::text FROM orders o
          WHERE o.status <> 'pending' AND o.cancel_reason IS DISTINCT FROM 'customer'
            AND o.cancel_reason IS DISTINCT FROM 'timeout' AND NOT EXISTS
          (SELECT 1 FROM processed_events p WHERE p.event_id = o.id::text || ':payment')",
    ),
    (
        crate::PAYMENT_SERVICE,
        "decided charge without its result outbox row",
        "SELECT p.event_id FROM payments p
          WHERE p.status NOT IN ('voided', 'charging', 'unknown') AND NOT EXISTS
          (SELECT 1 FROM outbox x WHERE x.event_id = p.event_id || ':payment')",
    ),
    (
        crate::PAYMENT_SERVICE,
        "inbox row and payment disagree",
        "SELECT coalesce(e.event_id, p.event_id) FROM processed_events e
           FULL JOIN payments p ON p.event_id = e.event_id
          WHERE (e.event_id IS NULL OR p.event_id IS NULL)
            AND coalesce(e.event_id, p.event_id) NOT LIKE '%:%'
            -- A charge's intent is written before its event is applied, and a
            -- cancellation may decide it (answered) before its event ever is.
            AND NOT (e.event_id IS NULL
                     AND (p.status IN ('charging', 'unknown') OR p.answered_at IS NOT NULL))",
    ),
    (
        crate::PAYMENT_SERVICE,
        "outbox row without its payment, or a cancellation's answer without its inbox row",
        "SELECT x.event_id FROM outbox x WHERE NOT EXISTS (SELECT 1 FROM payments p
          WHERE (x.type IN ('payment.succeeded', 'payment.failed')
                 AND x.event_id = p.event_id || ':payment')
             OR (x.type = 'payment.refunded' AND p.refund_id IS NOT NULL
                 AND x.key = p.order_id::text)
             OR (x.type = 'payment.voided' AND x.key = p.order_id::text
                 AND EXISTS (SELECT 1 FROM processed_events e
                              WHERE x.event_id = e.event_id || ':voided'))
             OR (x.type = 'payment.refund_failed' AND x.key = p.order_id::text
                 AND p.refund_attempt >= 1 AND p.answered_at IS NOT NULL))",
    ),
    (
        crate::PAYMENT_SERVICE,
        "refund recorded without its payment.refunded",
        "SELECT p.order_id::text FROM payments p WHERE p.refund_id IS NOT NULL
            AND NOT EXISTS (SELECT 1 FROM outbox x WHERE x.event_id = p.order_id::text || ':refund')",
    ),
    (
        crate::NOTIFICATION_SERVICE,
        "notification without its outbox row",
        "SELECT n.event_id FROM notifications n WHERE NOT EXISTS (SELECT 1 FROM outbox x
          WHERE x.event_id = n.event_id || ':notification')",
    ),
    (
        crate::NOTIFICATION_SERVICE,
        "inbox row and notification disagree",
        "SELECT coalesce(e.event_id, n.event_id) FROM processed_events e
           FULL JOIN notifications n ON n.event_id = e.event_id
          WHERE e.event_id IS NULL OR n.event_id IS NULL",
    ),
    (
        crate::NOTIFICATION_SERVICE,
        "notification.sent outbox row without its notification",
        "SELECT x.event_id FROM outbox x WHERE NOT EXISTS (SELECT 1 FROM notifications n
          WHERE x.event_id = n.event_id || ':notification')",
    ),
];

/// Effects that are only half there, which no moment may show (so it is checked while a
/// killed service is still down, too): a status, payment, answer or notification without
/// its outbox row or its inbox row, an outbox row without its effect, an inbox row without
/// its effect. Only for runs without hand-made conflicting events, whose ids are in the
/// inbox with no effect of their own.
pub async fn half_applied(stack: &Stack) -> Vec<String> {
    let mut violations = Vec::new();
    for (service, what, sql) in HALF_APPLIED {
        for row in rows(stack, service, sql).await {
            let id: String = row.get(0);
            violations.push(format!("{service}: {what}: {id}"));
        }
    }
    violations
}

/// Every effect the saga has had, counted: orders by status, payments by status,
/// notifications, and each service's outbox and inbox rows. Equal before and after a
/// replay means the replay had no effect.
pub async fn effects(stack: &Stack) -> BTreeMap<String, i64> {
    const COUNTS: [(&str, &str); 5] = [
        (
            crate::ORDER_SERVICE,
            "SELECT 'orders ' || status, count(*) FROM orders GROUP BY status",
        ),
        (
            crate::PAYMENT_SERVICE,
            "SELECT 'payments ' || status, count(*) FROM payments GROUP BY status",
        ),
        (
            crate::NOTIFICATION_SERVICE,
            "SELECT 'notifications ' || kind, count(*) FROM notifications GROUP BY kind",
        ),
        (
            crate::ORDER_SERVICE,
            "SELECT 'order-service outbox ' || type, count(*) FROM outbox GROUP BY type",
        ),
        (
            crate::PAYMENT_SERVICE,
            "SELECT 'payment-service outbox ' || type, count(*) FROM outbox GROUP BY type",
        ),
    ];
    let mut effects = BTreeMap::new();
    for (service, sql) in COUNTS {
        for row in rows(stack, service, sql).await {
            effects.insert(row.get(0), row.get(1));
        }
    }
    for service in SERVICES {
        for (table, sql) in [
            ("outbox", "SELECT count(*) FROM outbox"),
            ("processed_events", "SELECT count(*) FROM processed_events"),
        ] {
            let n: i64 = rows(stack, service, sql).await[0].get(0);
            effects.insert(format!("{service} {table}"), n);
        }
    }
    effects
}
