//! A charge that lands after its order's cancellation is refunded, not dropped.
//!
//! RefundOrder leaves a tombstone (a `voided` payment) for an order cancelled before
//! anything was charged, and the payment's primary key stops a charge that comes later.
//! Its read ahead makes ChargeOrder call nothing for such an order. But ChargeOrder
//! prepares outside any transaction, ahead of the record before it: an `order.created`
//! redriven after its cancellation can be charged while the cancellation's transaction
//! is still committing the tombstone. Its own transaction then meets the tombstone: it
//! commits nothing, and the event is prepared again ([`met_tombstone`]). Prepared again,
//! it sees the tombstone and asks the provider what stands for the order; a charge
//! standing is refunded under the order's refund key ([`refund`]), and recorded on the
//! tombstone with `payment.refunded` ([`record`]).

use saga::events::{self, PaymentRefunded};
use saga::inbox;
use saga::outbox::{self, NewEvent};
use saga::{Envelope, HandlerError, Outcome, Topics, Transaction};
use uuid::Uuid;

use crate::provider::{Provider, Refund};
use crate::refund_order::{Standing, refund_charge, standing_at_provider};

/// A charge found standing for a cancelled order, and its refund.
#[derive(Debug)]
pub struct Refunded {
    pub order_id: Uuid,
    pub charge: Standing,
    pub refund: Refund,
}

/// Refunds the charge standing at the provider for `order_id`, cancelled here before its
/// charge was recorded; `None` when none stands.
pub async fn refund(provider: &Provider, order_id: Uuid) -> Result<Option<Refunded>, HandlerError> {
    let Some(charge) = standing_at_provider(provider, order_id).await? else {
        return Ok(None);
    };
    let refund = refund_charge(provider, order_id, &charge.charge_id, charge.amount_cents).await?;
    Ok(Some(Refunded {
        order_id,
        charge,
        refund,
    }))
}

/// Whether the payment a charge could not be recorded over is a tombstone still waiting
/// for a refund, locked.
pub const LOCK_TOMBSTONE: &str = "
    SELECT status = 'voided' AND refund_id IS NULL AS waiting
      FROM payments WHERE order_id = $1 FOR UPDATE";

/// Whether ChargeOrder's transaction, finding a payment for `order_id` where it was to
/// record a charge, found the order's tombstone: then the charge it holds must be
/// refunded, not dropped.
pub async fn met_tombstone(tx: &Transaction<'_>, order_id: Uuid) -> Result<bool, HandlerError> {
    let row = tx
        .query_opt(&tx.prepare_cached(LOCK_TOMBSTONE).await?, &[&order_id])
        .await?;
    Ok(row.is_some_and(|row| row.get("waiting")))
}

/// The charge and its refund, recorded on the tombstone.
pub const RECORD_ON_TOMBSTONE: &str = "
    UPDATE payments SET charge_id = $2, refund_id = $3, refunded_at = now()
     WHERE order_id = $1 AND status = 'voided' AND refund_id IS NULL";

/// Records `refunded` for the `order.created` `event`, in `tx`: guard 1, then the
/// tombstone, locked by the update; zero rows means the refund was recorded already.
pub async fn record(
    tx: &Transaction<'_>,
    topics: &Topics,
    event: &Envelope,
    refunded: &Refunded,
) -> Result<Outcome, HandlerError> {
    if !inbox::claim(tx, event).await? {
        return Ok(Outcome::Duplicate);
    }
    let updated = tx
        .execute(
            &tx.prepare_cached(RECORD_ON_TOMBSTONE).await?,
            &[
                &refunded.order_id,
                &refunded.charge.charge_id,
                &refunded.refund.refund_id,
            ],
        )
        .await?;
    if updated == 0 {
        return Ok(Outcome::Guarded);
    }
    outbox::enqueue(
        tx,
        &NewEvent {
            event_id: &events::refund_id(refunded.order_id),
            topic: &topics.payments,
            key: &refunded.order_id.to_string(),
            event_type: events::PAYMENT_REFUNDED,
            payload: &PaymentRefunded {
                order_id: refunded.order_id,
                amount_cents: refunded.charge.amount_cents,
                charge_id: refunded.charge.charge_id.clone(),
                refund_id: refunded.refund.refund_id.clone(),
            },
            caused_by: Some(&event.id),
        },
    )
    .await?;
    Ok(Outcome::Applied)
}
