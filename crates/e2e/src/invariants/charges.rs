//! Charges: one per order at the provider, for the order's amount, succeeded for a
//! confirmed order and declined for a cancelled one, its id the one the payment holds;
//! and none for an order the saga never saw.

use std::collections::HashSet;

use uuid::Uuid;

use super::Findings;
use super::databases::{Databases, Effect};
use super::orders::{Decided, Tally};

/// `decided`'s one charge at the provider, matching the order and its `payments`.
pub(super) fn check_charge(
    decided: &Decided,
    db: &Databases,
    payments: &[Effect],
    findings: &mut Findings,
    tally: &mut Tally,
) {
    let Decided { id, key, order, .. } = decided;
    let charges = db.charges.get(key).map(Vec::as_slice).unwrap_or(&[]);
    match charges.len() {
        1 => {}
        0 => {
            findings.violate(format!("order {id} has no charge at the provider"));
            tally.lost.insert(*id);
        }
        n => {
            findings.violate(format!(
                "order {id} was charged {n} times at the provider: {}",
                charges
                    .iter()
                    .map(|c| c.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            tally.charged_twice.insert(key.clone());
        }
    }
    let wanted_charge = if decided.confirmed {
        "succeeded"
    } else {
        "failed"
    };
    for charge in charges {
        if charge.status != wanted_charge || charge.amount_cents != order.amount_cents {
            findings.violate(format!(
                "order {id} is {} for {} cents but its charge {} {} for {}",
                order.status, order.amount_cents, charge.id, charge.status, charge.amount_cents
            ));
        }
    }
    for payment in payments {
        if !charges
            .iter()
            .any(|c| payment.charge_id.as_deref() == Some(c.id.as_str()))
        {
            findings.violate(format!(
                "order {id}: its payment records charge {:?}, which the provider did not make for it",
                payment.charge_id
            ));
        }
    }
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
