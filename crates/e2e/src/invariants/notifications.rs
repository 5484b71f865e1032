//! Notifications: one per order and kind of news, each telling of an event of the order's
//! story and of nothing else, each announced by one `notification.sent`.

use saga::events::*;

use super::Findings;
use super::databases::Databases;
use super::orders::{Announced, Fate, Need, Story, Tally, Wanted, check_announced, of};

/// The customer heard exactly the order's story: its payment's outcome if there was one
/// (`confirmed`, `declined`), its cancellation (`cancelled_by_customer`,
/// `cancelled_for_timeout`), its refund; each once, from the event that told it.
pub(super) fn check_its_notifications(
    story: &Story,
    refunded: bool,
    db: &Databases,
    announced: &Announced,
    findings: &mut Findings,
    tally: &mut Tally,
) {
    let Story { id, key, .. } = story;
    let outcome_told = of(&announced.by_order_service, key)
        .iter()
        .any(|r| r.event_id == order_outcome_id(*id) && r.event_type == ORDER_CONFIRMED);
    let mut wanted: Vec<(&str, String, Need)> = Vec::new();
    match story.fate {
        Fate::Confirmed => wanted.push(("confirmed", order_outcome_id(*id), Need::One)),
        Fate::Declined => wanted.push(("declined", order_outcome_id(*id), Need::One)),
        Fate::Cancelled(reason) => {
            if outcome_told {
                wanted.push(("confirmed", order_outcome_id(*id), Need::One));
            }
            let kind = if reason == CANCELLED_FOR_TIMEOUT {
                "cancelled_for_timeout"
            } else {
                "cancelled_by_customer"
            };
            wanted.push((kind, cancellation_id(*id), Need::One));
        }
    }
    if refunded {
        wanted.push(("refunded", order_refunded_id(*id), Need::One));
    }
    let told = db.notifications.get(id).map(Vec::as_slice).unwrap_or(&[]);
    for (kind, event_id, _) in &wanted {
        let n = told
            .iter()
            .filter(|n| n.kind == *kind && n.event_id == *event_id)
            .count();
        tally.one(*id, &format!("{kind} notification"), n, findings);
    }
    for notification in told {
        if !wanted.iter().any(|(kind, event_id, _)| {
            notification.kind == *kind && notification.event_id == *event_id
        }) {
            findings.violate(format!(
                "order {id} is {} ({:?}) but the customer was told {} (by {})",
                story.order.status,
                story.order.cancel_reason,
                notification.kind,
                notification.event_id
            ));
            tally.twice.insert(*id);
        }
    }
    let sent: Vec<Wanted> = wanted
        .into_iter()
        .map(|(_, event_id, need)| Wanted {
            event_id: notification_id(&event_id),
            event_type: NOTIFICATION_SENT,
            need,
        })
        .collect();
    let rows = of(&announced.sent, key);
    check_announced(
        *id,
        crate::NOTIFICATION_SERVICE,
        rows,
        &sent,
        findings,
        tally,
    );
}
