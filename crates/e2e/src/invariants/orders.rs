//! Orders and their effects: every order accepted is there once and decided, the right
//! way for its amount, with one payment, one outcome event and one notification, each
//! matching it and announced by one outbox row; and every outbox row is published.

use std::collections::{BTreeSet, HashMap, HashSet};

use saga::events::*;
use uuid::Uuid;

use super::charges::{check_charge, check_no_charge_without_its_order};
use super::databases::{Databases, Effect, Order, OutboxRow};
use super::{Expected, Findings, PAYMENT_LIMIT_CENTS};

/// The orders found lost, applied twice or charged twice: each counted once, however
/// many of its effects say so.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) lost: BTreeSet<Uuid>,
    pub(super) twice: BTreeSet<Uuid>,
    pub(super) charged_twice: BTreeSet<String>,
}

impl Tally {
    /// Order `id` has `n` of `what`, which it must have exactly one of: none is lost, a
    /// second applied twice.
    fn one(&mut self, id: Uuid, what: &str, n: usize, findings: &mut Findings) {
        match n {
            1 => {}
            0 => {
                findings.violate(format!("order {id} has no {what}"));
                self.lost.insert(id);
            }
            n => {
                findings.violate(format!("order {id} has {n} {what}s"));
                self.twice.insert(id);
            }
        }
    }
}

/// A decided order, and what its status wants of its effects.
pub(super) struct Decided<'a> {
    pub(super) id: Uuid,
    pub(super) key: String,
    pub(super) order: &'a Order,
    pub(super) confirmed: bool,
    wanted_payment: &'static str,
    wanted_event: &'static str,
}

/// The outbox rows that announce an order's effects, by order.
struct Announced<'a> {
    created: HashMap<String, Vec<&'a OutboxRow>>,
    outcomes: HashMap<String, Vec<&'a OutboxRow>>,
    results: HashMap<String, Vec<&'a OutboxRow>>,
    sent: HashMap<String, Vec<&'a OutboxRow>>,
}

impl<'a> Announced<'a> {
    fn read(db: &'a Databases) -> Self {
        Self {
            created: db.outbox_by_key(crate::ORDER_SERVICE, &[ORDER_CREATED]),
            outcomes: db.outbox_by_key(crate::ORDER_SERVICE, &[ORDER_CONFIRMED, ORDER_CANCELLED]),
            results: db.outbox_by_key(crate::PAYMENT_SERVICE, &[PAYMENT_SUCCEEDED, PAYMENT_FAILED]),
            sent: db.outbox_by_key(crate::NOTIFICATION_SERVICE, &[NOTIFICATION_SENT]),
        }
    }
}

/// `key`'s rows in `rows`, none if it has none.
fn of<'m, 'a>(rows: &'m HashMap<String, Vec<&'a OutboxRow>>, key: &str) -> &'m [&'a OutboxRow] {
    rows.get(key).map(Vec::as_slice).unwrap_or(&[])
}

/// Orders, payments, outcome events and notifications: one each per order, consistent.
pub(super) fn check_orders(db: &Databases, expected: &Expected, findings: &mut Findings) {
    findings.orders = db.orders.len();
    let mut tally = Tally::default();
    check_every_order_accepted_is_there_once(db, expected, findings, &mut tally);
    let announced = Announced::read(db);
    for (id, order) in &db.orders {
        let Some(decided) = decided(*id, order, findings, &mut tally) else {
            continue;
        };
        check_it_went_the_way_its_amount_wants(&decided, findings);
        check_its_outcome_event(&decided, &announced, findings, &mut tally);
        let payments = db.payments.get(id).map(Vec::as_slice).unwrap_or(&[]);
        check_its_payment(&decided, payments, &announced, findings, &mut tally);
        check_its_notification(&decided, db, &announced, findings, &mut tally);
        check_charge(&decided, db, payments, findings, &mut tally);
    }
    check_no_effect_without_its_order(db, findings, &mut tally);
    check_no_charge_without_its_order(db, findings, &mut tally);
    check_every_outbox_row_published(db, findings);
    findings.lost += tally.lost.len();
    findings.applied_twice += tally.twice.len();
    findings.charged_twice += tally.charged_twice.len();
}

/// No order the API accepted is missing, and none is there twice.
fn check_every_order_accepted_is_there_once(
    db: &Databases,
    expected: &Expected,
    findings: &mut Findings,
    tally: &mut Tally,
) {
    for id in &expected.accepted {
        if !db.orders.contains_key(id) {
            findings.violate(format!(
                "order {id} was accepted but is not in the database"
            ));
            tally.lost.insert(*id);
        }
    }
    if let Some(offered) = expected.offered {
        // A retry placed its order again instead of getting the first one back.
        let accepted: HashSet<&Uuid> = expected.accepted.iter().collect();
        for id in db.orders.keys().filter(|id| !accepted.contains(id)) {
            findings.violate(format!(
                "order {id} is in the database but no POST got it back: of {offered} orders \
                 offered, each with its own Idempotency-Key, one was placed twice"
            ));
            tally.twice.insert(*id);
        }
    }
}

/// `order` counted by its status; `None`, and a violation, if the saga left it undecided.
fn decided<'a>(
    id: Uuid,
    order: &'a Order,
    findings: &mut Findings,
    tally: &mut Tally,
) -> Option<Decided<'a>> {
    let (confirmed, wanted_payment, wanted_event) = match order.status.as_str() {
        "confirmed" => {
            findings.confirmed += 1;
            (true, "succeeded", ORDER_CONFIRMED)
        }
        "cancelled" => {
            findings.cancelled += 1;
            (false, "failed", ORDER_CANCELLED)
        }
        _ => {
            findings.pending += 1;
            findings.violate(format!("order {id} is still {}", order.status));
            tally.lost.insert(id);
            return None;
        }
    };
    Some(Decided {
        id,
        key: id.to_string(),
        order,
        confirmed,
        wanted_payment,
        wanted_event,
    })
}

/// Confirmed within the provider's limit, cancelled past it.
fn check_it_went_the_way_its_amount_wants(decided: &Decided, findings: &mut Findings) {
    let Decided { id, order, .. } = decided;
    let should_confirm = order.amount_cents <= PAYMENT_LIMIT_CENTS;
    if decided.confirmed != should_confirm {
        findings.violate(format!(
            "order {id} of {} cents is {}",
            order.amount_cents, order.status
        ));
    }
}

/// One `order.created` and one outcome event announced, the outcome the status says.
fn check_its_outcome_event(
    decided: &Decided,
    announced: &Announced,
    findings: &mut Findings,
    tally: &mut Tally,
) {
    let Decided { id, key, order, .. } = decided;
    let created_rows = of(&announced.created, key);
    tally.one(
        *id,
        "order.created outbox row",
        created_rows.len(),
        findings,
    );
    let outcome_rows = of(&announced.outcomes, key);
    tally.one(*id, "outcome outbox row", outcome_rows.len(), findings);
    for row in outcome_rows {
        if row.event_type != decided.wanted_event || row.event_id != order_outcome_id(*id) {
            findings.violate(format!(
                "order {id} is {} but its outcome event is {} {}",
                order.status, row.event_type, row.event_id
            ));
        }
    }
}

/// One payment, for the order's amount and as its status says, and one payment result
/// announced for it.
fn check_its_payment(
    decided: &Decided,
    payments: &[Effect],
    announced: &Announced,
    findings: &mut Findings,
    tally: &mut Tally,
) {
    let Decided { id, key, order, .. } = decided;
    tally.one(*id, "payment", payments.len(), findings);
    for payment in payments {
        if payment.status != decided.wanted_payment
            || payment.amount_cents != Some(order.amount_cents)
        {
            findings.violate(format!(
                "order {id} is {} for {} cents but its payment {} for {:?}",
                order.status, order.amount_cents, payment.status, payment.amount_cents
            ));
        }
    }
    let result_rows = of(&announced.results, key);
    tally.one(
        *id,
        "payment result outbox row",
        result_rows.len(),
        findings,
    );
    for row in result_rows {
        let matches_payment = payments
            .iter()
            .any(|p| row.event_id == payment_result_id(&p.event_id));
        let wanted_type = if decided.confirmed {
            PAYMENT_SUCCEEDED
        } else {
            PAYMENT_FAILED
        };
        if !matches_payment || row.event_type != wanted_type {
            findings.violate(format!(
                "order {id}: payment result {} {} does not match its payment",
                row.event_type, row.event_id
            ));
        }
    }
}

/// One notification, telling the customer the order's status, and one
/// `notification.sent` announced.
fn check_its_notification(
    decided: &Decided,
    db: &Databases,
    announced: &Announced,
    findings: &mut Findings,
    tally: &mut Tally,
) {
    let Decided { id, key, order, .. } = decided;
    let notifications = db.notifications.get(id).map(Vec::as_slice).unwrap_or(&[]);
    tally.one(*id, "notification", notifications.len(), findings);
    for notification in notifications {
        if notification.status != order.status || notification.event_id != order_outcome_id(*id) {
            findings.violate(format!(
                "order {id} is {} but the customer was told {} (by {})",
                order.status, notification.status, notification.event_id
            ));
        }
    }
    tally.one(
        *id,
        "notification.sent outbox row",
        of(&announced.sent, key).len(),
        findings,
    );
}

/// No payment or notification for an order that does not exist.
fn check_no_effect_without_its_order(db: &Databases, findings: &mut Findings, tally: &mut Tally) {
    for (what, effects) in [
        ("payment", &db.payments),
        ("notification", &db.notifications),
    ] {
        for id in effects.keys() {
            if !db.orders.contains_key(id) {
                findings.violate(format!("a {what} exists for order {id}, which does not"));
                tally.twice.insert(*id);
            }
        }
    }
}

/// Every outbox row published, once the saga is quiet.
fn check_every_outbox_row_published(db: &Databases, findings: &mut Findings) {
    for (service, n) in &db.unpublished {
        if *n > 0 {
            findings.violate(format!("{service}: {n} outbox rows never published"));
        }
    }
}
