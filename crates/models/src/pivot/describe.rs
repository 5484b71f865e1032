//! The pivot model's steps in the course's words, as `scripts/model` prints them.

use super::{Action, KEYS, Payment, REFUND, Refund, World};

pub(super) fn describe(before: &World, after: &World, action: Action) -> String {
    match action {
        Action::IntendCharge if after.payment == Payment::Charging => {
            "ChargeOrder commits its intent: payment charging, key order:charge".to_owned()
        }
        Action::IntendCharge => "ChargeOrder meets the tombstone: it asks for nothing".to_owned(),
        Action::AskCharge => {
            let who = if before.charging {
                "ChargeOrder"
            } else {
                "RefundOrder resolves the charge:"
            };
            let row = match before.payment {
                Payment::None => " (no row names it yet)",
                _ => "",
            };
            format!(
                "{who} asks the provider to charge, key {}{row}",
                KEYS[after.charge_key]
            )
        }
        Action::LeaveToPerson => {
            "ChargeOrder leaves the unknown charge to a person: its key has expired".to_owned()
        }
        Action::ChargeAnswered => match before.payment {
            Payment::Voided => {
                "the charge's answer comes: the payment is voided already".to_owned()
            }
            _ => "the charge's answer comes: payment succeeded".to_owned(),
        },
        Action::ChargeAnswerLost => "the charge's answer is lost: payment unknown".to_owned(),
        Action::ProviderCommits(key) if key < REFUND => {
            format!(
                "the provider commits the charge {}: the card is charged",
                KEYS[key]
            )
        }
        Action::ProviderCommits(key) if after.refunds > before.refunds => {
            format!("the provider commits the refund {}", KEYS[key])
        }
        Action::ProviderCommits(key) => {
            format!(
                "the provider answers {} as the charge's one refund, made before",
                KEYS[key]
            )
        }
        Action::ProviderRefuses(key) => format!("the provider refuses the refund {}", KEYS[key]),
        Action::ProviderListsCharge => "the provider's list of charges shows the charge".to_owned(),
        Action::KeysExpire => {
            "the provider's key lifetime passes: it forgets its answers".to_owned()
        }
        Action::Cancel => "the customer cancels: order.cancelled".to_owned(),
        Action::DecideCancellation => describe_decision(before, after),
        Action::AskRefund => format!(
            "RefundOrder asks the provider to refund, key {}",
            KEYS[after.refund_key]
        ),
        Action::RefundAnswered => match after.refund {
            Refund::Refunded => {
                "the refund's answer comes: refunded, the cancellation answered".to_owned()
            }
            Refund::Failed => {
                "the refund's answer comes: refused, refund failed and answered".to_owned()
            }
            _ => "the refund's answer comes: refused, an error retried until dead-lettered"
                .to_owned(),
        },
        Action::RefundAnswerLost => "the refund's answer is lost: refund unknown".to_owned(),
    }
}

fn describe_decision(before: &World, after: &World) -> String {
    match (before.payment, after.payment, after.refund) {
        (Payment::None, _, _) => {
            "RefundOrder finds no payment: the tombstone, payment.voided".to_owned()
        }
        (Payment::Charging | Payment::Unknown, Payment::Voided, _) => {
            "RefundOrder finds no charge in the provider's list: voided, payment.voided".to_owned()
        }
        (_, _, Refund::Manual) => {
            "RefundOrder cannot resolve the charge: refund manual, payment.refund_failed".to_owned()
        }
        (_, _, Refund::Refunding) => "RefundOrder commits its intent: refund refunding".to_owned(),
        _ => "RefundOrder answers the cancellation".to_owned(),
    }
}
