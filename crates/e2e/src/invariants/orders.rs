//! Orders and their stories: every order accepted is there once and settled, the way its
//! amount and its cancellation want, with exactly the events its story has, each
//! announced by one outbox row; and every outbox row is published.
//!
//! An order's story is one of three: confirmed (and never cancelled), declined (its
//! payment failed, so order-service cancelled it: `<id>:outcome` is an `order.cancelled`),
//! or cancelled by the customer or the deadline (`<id>:cancel`), before or after its
//! payment's outcome. What each part of the saga must hold follows from the story and
//! from the money: whether the order was refunded.

use std::collections::{BTreeSet, HashMap, HashSet};

use saga::events::*;
use uuid::Uuid;

use super::cancellations::{check_its_answer, check_the_cancelled_are_the_ones_asked_for};
use super::charges::{check_money, check_no_charge_without_its_order};
use super::databases::{Databases, Order, OutboxRow, Payment};
use super::notifications::check_its_notifications;
use super::{Expected, Findings, PAYMENT_LIMIT_CENTS};

/// The orders found lost, applied twice, charged or refunded twice: each counted once,
/// however many of its effects say so.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) lost: BTreeSet<Uuid>,
    pub(super) twice: BTreeSet<Uuid>,
    pub(super) charged_twice: BTreeSet<String>,
    pub(super) refunded_twice: BTreeSet<String>,
}

impl Tally {
    /// Order `id` has `n` of `what`, which it must have exactly one of: none is lost, a
    /// second applied twice.
    pub(super) fn one(&mut self, id: Uuid, what: &str, n: usize, findings: &mut Findings) {
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

/// How an order's story ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fate {
    /// Charged and confirmed, never cancelled.
    Confirmed,
    /// Its payment failed: order-service cancelled it with the outcome's id.
    Declined,
    /// Cancelled by the customer (`customer`) or the deadline (`timeout`).
    Cancelled(&'static str),
}

/// An order settled, and what its story wants of the saga.
pub(super) struct Story<'a> {
    pub(super) id: Uuid,
    pub(super) key: String,
    pub(super) order: &'a Order,
    pub(super) fate: Fate,
    /// The id of the `order.cancelled` order-service wrote for it, if it cancelled it.
    pub(super) cancellation: Option<String>,
    /// Its payment row, if it has exactly one.
    pub(super) payment: Option<&'a Payment>,
}

/// Every outbox row, by order, per service.
pub(super) struct Announced<'a> {
    pub(super) by_order_service: HashMap<String, Vec<&'a OutboxRow>>,
    pub(super) by_payment_service: HashMap<String, Vec<&'a OutboxRow>>,
    pub(super) sent: HashMap<String, Vec<&'a OutboxRow>>,
}

impl<'a> Announced<'a> {
    fn read(db: &'a Databases) -> Self {
        let every = |service| {
            let mut by_key: HashMap<String, Vec<&OutboxRow>> = HashMap::new();
            for row in &db.outboxes[service] {
                by_key.entry(row.key.clone()).or_default().push(row);
            }
            by_key
        };
        Self {
            by_order_service: every(crate::ORDER_SERVICE),
            by_payment_service: every(crate::PAYMENT_SERVICE),
            sent: db.outbox_by_key(crate::NOTIFICATION_SERVICE, &[NOTIFICATION_SENT]),
        }
    }
}

/// `key`'s rows in `rows`, none if it has none.
pub(super) fn of<'m, 'a>(
    rows: &'m HashMap<String, Vec<&'a OutboxRow>>,
    key: &str,
) -> &'m [&'a OutboxRow] {
    rows.get(key).map(Vec::as_slice).unwrap_or(&[])
}

/// How many of an event a story has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Need {
    One,
    /// Its story may or may not have it (a customer's cancellation may come before or
    /// after the payment's outcome).
    AtMostOne,
}

/// An event a story has, by id and type.
pub(super) struct Wanted {
    pub(super) event_id: String,
    pub(super) event_type: &'static str,
    pub(super) need: Need,
}

/// `rows`, what `service` announced for order `id`, are exactly `wanted`: each needed
/// one once, none twice, none of another type, and nothing the story does not have.
pub(super) fn check_announced(
    id: Uuid,
    service: &str,
    rows: &[&OutboxRow],
    wanted: &[Wanted],
    findings: &mut Findings,
    tally: &mut Tally,
) {
    for w in wanted {
        let matching: Vec<&&OutboxRow> = rows.iter().filter(|r| r.event_id == w.event_id).collect();
        match (matching.len(), w.need) {
            (0, Need::One) => {
                findings.violate(format!(
                    "order {id}: {service} never announced {} {}",
                    w.event_type, w.event_id
                ));
                tally.lost.insert(id);
            }
            (0 | 1, _) => {}
            (n, _) => {
                findings.violate(format!(
                    "order {id}: {service} announced {} {} {n} times",
                    w.event_type, w.event_id
                ));
                tally.twice.insert(id);
            }
        }
        for row in matching.iter().filter(|r| r.event_type != w.event_type) {
            findings.violate(format!(
                "order {id}: {service} announced {} as {}, its story wants {}",
                row.event_id, row.event_type, w.event_type
            ));
        }
    }
    for row in rows {
        if !wanted.iter().any(|w| w.event_id == row.event_id) {
            findings.violate(format!(
                "order {id}: {service} announced {} {}, which its story does not have",
                row.event_type, row.event_id
            ));
            tally.twice.insert(id);
        }
    }
}

/// Every order, its story and its effects: one check a part of the saga.
pub(super) fn check_orders(db: &Databases, expected: &Expected, findings: &mut Findings) {
    findings.orders = db.orders.len();
    let mut tally = Tally::default();
    check_every_order_accepted_is_there_once(db, expected, findings, &mut tally);
    check_the_cancelled_are_the_ones_asked_for(db, expected, findings);
    let announced = Announced::read(db);
    for (id, order) in &db.orders {
        let Some(story) = story(*id, order, db, findings, &mut tally) else {
            continue;
        };
        check_it_went_the_way_its_amount_wants(&story, findings);
        let refunded = check_money(&story, db, findings, &mut tally);
        check_its_order_events(&story, refunded, &announced, findings, &mut tally);
        check_its_payment_events(&story, refunded, &announced, findings, &mut tally);
        check_its_answer(&story, refunded, findings, &mut tally);
        check_its_notifications(&story, refunded, db, &announced, findings, &mut tally);
    }
    check_no_effect_without_its_order(db, findings, &mut tally);
    check_no_charge_without_its_order(db, findings, &mut tally);
    check_every_outbox_row_published(db, findings);
    findings.lost += tally.lost.len();
    findings.applied_twice += tally.twice.len();
    findings.charged_twice += tally.charged_twice.len();
    findings.refunded_twice += tally.refunded_twice.len();
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

/// `order`'s story, counted by how it ended; `None`, and a violation, if the saga left
/// it undecided, or a payment too many or too few to tell.
fn story<'a>(
    id: Uuid,
    order: &'a Order,
    db: &'a Databases,
    findings: &mut Findings,
    tally: &mut Tally,
) -> Option<Story<'a>> {
    let fate = match (order.status.as_str(), order.cancel_reason.as_deref()) {
        ("confirmed", _) => Fate::Confirmed,
        ("cancelled", Some(CANCELLED_BY_CUSTOMER)) => Fate::Cancelled(CANCELLED_BY_CUSTOMER),
        ("cancelled", Some(CANCELLED_FOR_TIMEOUT)) => Fate::Cancelled(CANCELLED_FOR_TIMEOUT),
        ("cancelled", _) => Fate::Declined,
        _ => {
            findings.pending += 1;
            findings.violate(format!("order {id} is still {}", order.status));
            tally.lost.insert(id);
            return None;
        }
    };
    match fate {
        Fate::Confirmed => findings.confirmed += 1,
        Fate::Declined => findings.cancelled += 1,
        Fate::Cancelled(_) => {
            findings.cancelled += 1;
            findings.cancellations += 1;
        }
    }
    let payments = db.payments.get(&id).map(Vec::as_slice).unwrap_or(&[]);
    tally.one(id, "payment", payments.len(), findings);
    Some(Story {
        id,
        key: id.to_string(),
        order,
        fate,
        cancellation: match fate {
            Fate::Confirmed => None,
            Fate::Declined => Some(order_outcome_id(id)),
            Fate::Cancelled(_) => Some(cancellation_id(id)),
        },
        payment: (payments.len() == 1).then(|| &payments[0]),
    })
}

/// Confirmed within the provider's limit, declined past it; a cancelled order may be of
/// any amount.
fn check_it_went_the_way_its_amount_wants(story: &Story, findings: &mut Findings) {
    let Story { id, order, .. } = story;
    let within = order.amount_cents <= PAYMENT_LIMIT_CENTS;
    let wrong = match story.fate {
        Fate::Confirmed => !within,
        Fate::Declined => within,
        Fate::Cancelled(_) => false,
    };
    if wrong {
        findings.violate(format!(
            "order {id} of {} cents is {} ({:?})",
            order.amount_cents, order.status, order.cancel_reason
        ));
    }
}

/// order-service's events for the order: its `order.created`; the payment's outcome
/// (confirmed, declined, or, for an order cancelled before its payment, none); the
/// cancellation; and `order.refunded` if it was refunded.
fn check_its_order_events(
    story: &Story,
    refunded: bool,
    announced: &Announced,
    findings: &mut Findings,
    tally: &mut Tally,
) {
    let id = story.id;
    let one = |event_id: String, event_type, need| Wanted {
        event_id,
        event_type,
        need,
    };
    let mut wanted = vec![one(story.key.clone(), ORDER_CREATED, Need::One)];
    wanted.push(match story.fate {
        Fate::Confirmed => one(order_outcome_id(id), ORDER_CONFIRMED, Need::One),
        Fate::Declined => one(order_outcome_id(id), ORDER_CANCELLED, Need::One),
        Fate::Cancelled(_) => one(order_outcome_id(id), ORDER_CONFIRMED, Need::AtMostOne),
    });
    if let Fate::Cancelled(_) = story.fate {
        wanted.push(one(cancellation_id(id), ORDER_CANCELLED, Need::One));
    }
    if refunded {
        wanted.push(one(order_refunded_id(id), ORDER_REFUNDED, Need::One));
    }
    let rows = of(&announced.by_order_service, &story.key);
    check_announced(id, crate::ORDER_SERVICE, rows, &wanted, findings, tally);
}

/// The payment, as the story wants it, and payment-service's events for the order: the
/// charge's result (none for a tombstone), and the cancellation's answer, a refund or a
/// void.
fn check_its_payment_events(
    story: &Story,
    refunded: bool,
    announced: &Announced,
    findings: &mut Findings,
    tally: &mut Tally,
) {
    let Story { id, order, .. } = story;
    let Some(payment) = story.payment else {
        return;
    };
    let allowed: &[&str] = match story.fate {
        Fate::Confirmed => &["succeeded"],
        Fate::Declined => &["failed"],
        Fate::Cancelled(_) => &["succeeded", "failed", "voided"],
    };
    if !allowed.contains(&payment.status.as_str()) || payment.amount_cents != order.amount_cents {
        findings.violate(format!(
            "order {id} is {} ({:?}) for {} cents but its payment is {} for {}",
            order.status,
            order.cancel_reason,
            order.amount_cents,
            payment.status,
            payment.amount_cents
        ));
    }
    let mut wanted: Vec<(String, &str)> = Vec::new();
    match payment.status.as_str() {
        "succeeded" => wanted.push((payment_result_id(&payment.event_id), PAYMENT_SUCCEEDED)),
        "failed" => wanted.push((payment_result_id(&payment.event_id), PAYMENT_FAILED)),
        _ => {}
    }
    let mut wanted: Vec<Wanted> = wanted
        .into_iter()
        .map(|(event_id, event_type)| Wanted {
            event_id,
            event_type,
            need: Need::One,
        })
        .collect();
    if refunded {
        wanted.push(Wanted {
            event_id: refund_id(*id),
            event_type: PAYMENT_REFUNDED,
            need: Need::One,
        });
    }
    // Each refund attempt that failed was announced, the last only if it is the one
    // standing (a retry after it may have refunded).
    let failed_attempts = match payment.refund_status.as_deref() {
        Some("failed" | "manual") => payment.refund_attempt.max(1),
        _ => payment.refund_attempt - 1,
    };
    for attempt in 1..=failed_attempts {
        wanted.push(Wanted {
            event_id: refund_failed_id(*id, attempt),
            event_type: PAYMENT_REFUND_FAILED,
            need: Need::One,
        });
    }
    let answered_failed = matches!(payment.refund_status.as_deref(), Some("failed" | "manual"));
    if let Some(cancellation) = &story.cancellation {
        // A tombstone's cancellation (from before charges had intents) was answered
        // `voided` before a charge made meanwhile landed and was refunded on it: both
        // answers then stand.
        let need = match (refunded || answered_failed, payment.status.as_str()) {
            (false, _) => Some(Need::One),
            (true, "voided") => Some(Need::AtMostOne),
            (true, _) => None,
        };
        if let Some(need) = need {
            wanted.push(Wanted {
                event_id: voided_id(cancellation),
                event_type: PAYMENT_VOIDED,
                need,
            });
        }
    }
    let rows = of(&announced.by_payment_service, &story.key);
    check_announced(*id, crate::PAYMENT_SERVICE, rows, &wanted, findings, tally);
}

/// No payment or notification for an order that does not exist.
fn check_no_effect_without_its_order(db: &Databases, findings: &mut Findings, tally: &mut Tally) {
    let payments = db.payments.keys().map(|id| ("payment", id));
    let notifications = db.notifications.keys().map(|id| ("notification", id));
    for (what, id) in payments.chain(notifications) {
        if !db.orders.contains_key(id) {
            findings.violate(format!("a {what} exists for order {id}, which does not"));
            tally.twice.insert(*id);
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
