//! Cancellations: each answered, and the orders cancelled exactly the ones the API
//! cancelled. The answer itself (`payment.refunded` or `payment.voided`, one per
//! cancellation) is one of payment-service's events, checked with them; here, that
//! order-service recorded it: the order settled.

use std::collections::BTreeSet;

use saga::events::CANCELLED_BY_CUSTOMER;
use uuid::Uuid;

use super::databases::Databases;
use super::orders::{Fate, Story, Tally};
use super::{Expected, Findings};

/// The story's cancellation answered and recorded: the order settled (`settled_at`),
/// and counted refunded or voided.
pub(super) fn check_its_answer(
    story: &Story,
    refunded: bool,
    findings: &mut Findings,
    tally: &mut Tally,
) {
    let Story { id, order, .. } = story;
    if !order.settled {
        findings.violate(format!(
            "order {id} is {} ({:?}) but never settled: its cancellation was not answered",
            order.status, order.cancel_reason
        ));
        tally.lost.insert(*id);
    }
    if let Fate::Cancelled(_) = story.fate {
        if refunded {
            findings.refunded += 1;
        } else if order.refund_failure.is_none() {
            findings.voided += 1;
        }
    }
}

/// The orders cancelled by the customer are exactly those whose cancellation the API
/// accepted, when the scenario says which it asked to cancel.
pub(super) fn check_the_cancelled_are_the_ones_asked_for(
    db: &Databases,
    expected: &Expected,
    findings: &mut Findings,
) {
    let Some(asked) = &expected.cancelled else {
        return;
    };
    let asked: BTreeSet<Uuid> = asked.iter().copied().collect();
    let by_customer: BTreeSet<Uuid> = db
        .orders
        .iter()
        .filter(|(_, o)| o.cancel_reason.as_deref() == Some(CANCELLED_BY_CUSTOMER))
        .map(|(id, _)| *id)
        .collect();
    for id in asked.difference(&by_customer) {
        findings.violate(format!(
            "the API accepted the cancellation of order {id}, which is not cancelled by the customer"
        ));
    }
    for id in by_customer.difference(&asked) {
        findings.violate(format!(
            "order {id} is cancelled by the customer, which no accepted request asked for"
        ));
    }
}
