//! The money, at the provider: the one effect no rollback of ours can undo. Per order:
//! charged at most once, for its amount; each charge refunded at most once, in full,
//! and only one that succeeded; charged minus refunded is the amount for a confirmed order and
//! 0 for every cancelled one, unless its refund failed *visibly* (the payment `failed` or
//! `manual`, the order showing why); the payment holds the provider's charge and refund,
//! and the order the same refund; no payment left undecided; nothing charged after
//! payment-service recorded the cancellation without its refund; and no charge for an
//! order the saga never saw.

use std::collections::HashSet;

use uuid::Uuid;

use super::Findings;
use super::databases::{Databases, ProviderCharge};
use super::orders::{Fate, Story, Tally};

/// The story's money at the provider against its payment; returns whether the order was
/// refunded (its payment records a refund).
pub(super) fn check_money(
    story: &Story,
    db: &Databases,
    findings: &mut Findings,
    tally: &mut Tally,
) -> bool {
    let Story { id, key, order, .. } = story;
    let charges = db.charges.get(key).map(Vec::as_slice).unwrap_or(&[]);
    findings.charges += charges.len();
    check_charged_at_most_once(*id, key, charges, findings, tally);
    check_refunded_at_most_once(*id, key, charges, findings, tally);
    let succeeded: i64 = charges
        .iter()
        .filter(|c| c.status == "succeeded")
        .map(|c| c.amount_cents)
        .sum();
    let refunded: i64 = charges
        .iter()
        .flat_map(|c| &c.refunds)
        .map(|r| r.amount_cents)
        .sum();
    let wanted = match story.fate {
        Fate::Confirmed => order.amount_cents,
        Fate::Declined | Fate::Cancelled(_) => 0,
    };
    // A refund that failed stands charged, visibly: counted, not a violation, when the
    // payment and the order both say so.
    let failed_visibly = story.payment.is_some_and(|payment| {
        matches!(payment.refund_status.as_deref(), Some("failed" | "manual"))
            && payment.refund_id.is_none()
    }) && order.refund_failure.is_some();
    if failed_visibly && succeeded - refunded == order.amount_cents {
        findings.refund_failed += 1;
    } else if succeeded - refunded != wanted {
        findings.violate(format!(
            "order {id} is {} ({:?}) for {} cents: charged {succeeded} minus refunded {refunded} should be {wanted}",
            order.status, order.cancel_reason, order.amount_cents
        ));
    }
    for charge in charges {
        if charge.amount_cents != order.amount_cents {
            findings.violate(format!(
                "order {id} is for {} cents but its charge {} is for {}",
                order.amount_cents, charge.id, charge.amount_cents
            ));
        }
    }
    check_the_payment_holds_the_money(story, charges, findings, tally)
}

fn check_charged_at_most_once(
    id: Uuid,
    key: &str,
    charges: &[ProviderCharge],
    findings: &mut Findings,
    tally: &mut Tally,
) {
    if charges.len() > 1 {
        findings.violate(format!(
            "order {id} was charged {} times at the provider: {}",
            charges.len(),
            charges
                .iter()
                .map(|c| c.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
        tally.charged_twice.insert(key.to_owned());
    }
}

/// At most one refund per charge, of a charge that succeeded, for no more than it took.
/// An order charged once is so refunded at most once; an order charged twice (which
/// [`check_charged_at_most_once`] reports) may have each charge refunded, which pays the
/// customer back, and is no second refund.
fn check_refunded_at_most_once(
    id: Uuid,
    key: &str,
    charges: &[ProviderCharge],
    findings: &mut Findings,
    tally: &mut Tally,
) {
    for charge in charges {
        findings.refunds += charge.refunds.len();
        if charge.refunds.len() > 1 {
            findings.violate(format!(
                "order {id}: its charge {} was refunded {} times at the provider: {}",
                charge.id,
                charge.refunds.len(),
                charge
                    .refunds
                    .iter()
                    .map(|r| r.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            tally.refunded_twice.insert(key.to_owned());
        }
        let back: i64 = charge.refunds.iter().map(|r| r.amount_cents).sum();
        if !charge.refunds.is_empty()
            && (charge.status != "succeeded" || back > charge.amount_cents)
        {
            findings.violate(format!(
                "order {id}: charge {} ({}, {} cents) was refunded {back} cents",
                charge.id, charge.status, charge.amount_cents
            ));
        }
    }
}

/// The payment's charge and refund are the provider's, the order's refund the
/// payment's; a tombstone saw nothing charged after it that it did not refund. Returns
/// whether the payment records a refund.
fn check_the_payment_holds_the_money(
    story: &Story,
    charges: &[ProviderCharge],
    findings: &mut Findings,
    tally: &mut Tally,
) -> bool {
    let Story { id, order, .. } = story;
    let Some(payment) = story.payment else {
        return false;
    };
    let undecided =
        |state: Option<&str>| matches!(state, Some("charging" | "unknown" | "refunding"));
    // A charge left to a person (`manual`) is decided as far as the saga can: visibly.
    let left_to_a_person = payment.refund_status.as_deref() == Some("manual");
    if (undecided(Some(&payment.status)) && !left_to_a_person)
        || undecided(payment.refund_status.as_deref())
    {
        findings.violate(format!(
            "order {id}: its payment is left undecided at rest: charge {}, refund {:?}",
            payment.status, payment.refund_status
        ));
        tally.lost.insert(*id);
    }
    let charge = charges
        .iter()
        .find(|c| payment.charge_id.as_deref() == Some(c.id.as_str()));
    match (&payment.charge_id, charge) {
        (Some(charge_id), None) => findings.violate(format!(
            "order {id}: its payment records charge {charge_id}, which the provider did not make for it"
        )),
        (None, _) if payment.status != "voided" && payment.refund_status.as_deref() != Some("manual") => {
            findings.violate(format!(
                "order {id}: its {} payment records no charge",
                payment.status
            ));
            tally.lost.insert(*id);
        }
        _ => {}
    }
    if let Some(charge) = charge
        && payment.status != "voided"
        && charge.status != payment.status
    {
        findings.violate(format!(
            "order {id}: its payment {} but the provider's charge {} {}",
            payment.status, charge.id, charge.status
        ));
    }
    let refund = charge
        .and_then(|c| c.refunds.first())
        .map(|r| r.id.as_str());
    let any_refund = charges.iter().any(|c| !c.refunds.is_empty());
    if payment.refund_id.as_deref() != refund || (any_refund && refund.is_none()) {
        findings.violate(format!(
            "order {id}: its payment records refund {:?}, the provider's charges list {:?}",
            payment.refund_id,
            charges
                .iter()
                .flat_map(|c| c.refunds.iter().map(|r| (c.id.as_str(), r.id.as_str())))
                .collect::<Vec<_>>()
        ));
    }
    if order.refund_id != payment.refund_id {
        findings.violate(format!(
            "order {id} records refund {:?}, its payment {:?}",
            order.refund_id, payment.refund_id
        ));
    }
    if payment.status == "voided" {
        for late in charges.iter().filter(|c| {
            c.status == "succeeded" && c.created_at > payment.created_at && c.refunds.is_empty()
        }) {
            findings.violate(format!(
                "order {id}: charge {} was made after payment-service recorded the cancellation, and never refunded",
                late.id
            ));
        }
    }
    payment.refund_id.is_some()
}

/// No charge at the provider for an order the saga never saw.
pub(super) fn check_no_charge_without_its_order(
    db: &Databases,
    findings: &mut Findings,
    tally: &mut Tally,
) {
    let known: HashSet<String> = db.orders.keys().map(Uuid::to_string).collect();
    for (reference, charges) in &db.charges {
        if !known.contains(reference) {
            findings.violate(format!(
                "{} charge(s) at the provider for {reference}, an order the saga never saw",
                charges.len()
            ));
            tally.charged_twice.insert(reference.clone());
        }
    }
}
