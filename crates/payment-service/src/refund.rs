//! A refund of an order's charge: its intent committed before the call, the call under the
//! attempt's key, and its ending recorded with the event that announces it. Shared by the
//! cancellation ([`crate::refund_order`]) and an operator's retry of a refused refund
//! ([`crate::retry_refund`]), so both ask, and record, the same way.
//!
//! Every refund ends visibly: `refunded` with `payment.refunded`; `failed` (the provider
//! refused it: a closed card, a disputed charge) or `manual` (nothing here can ask for
//! it) with `payment.refund_failed` and the reason. A refusal is an answer, not an
//! outage: it is recorded at once, never retried by the consumer and never left in a
//! dead letter. Only a call with no answer is asked again, under the same key.

use deadpool_postgres::Pool;
use saga::events::{self, PaymentRefundFailed, PaymentRefunded};
use saga::outbox::{self, NewEvent};
use saga::{HandlerError, Topics, Transaction, failpoint};
use uuid::Uuid;

use crate::payment::{self, refund_key};
use crate::provider::{Provider, Refund, RefundRequest};

/// A charge standing, to be refunded in full.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standing {
    pub charge_id: String,
    pub amount_cents: i64,
}

/// How a refund attempt ended.
#[derive(Debug)]
pub enum Ending {
    Refunded(Refund),
    /// The provider refused it: `failed`, and an operator may try again.
    Refused {
        reason: String,
    },
}

/// The refund's intent: `refunding` under the attempt's key, committed before the call.
/// Only a refund not decided yet (none, `refunding`, `unknown`) takes it, keeping the key
/// an earlier attempt named; a retry of a `failed` one moves to the next attempt first
/// ([`crate::retry_refund::NEXT_ATTEMPT`]). Nothing back: decided meanwhile.
///
/// `updated_at` is set when the attempt begins, not when it is asked again: how long it
/// has gone undecided is what the metrics and alerts watch.
pub const INTENT_TO_REFUND: &str = "
    UPDATE payments
       SET refund_status = 'refunding', refund_attempt = greatest(refund_attempt, 1),
           refund_key = coalesce(refund_key, $2),
           updated_at = CASE WHEN refund_status IS NULL THEN now() ELSE updated_at END
     WHERE order_id = $1
       AND (refund_status IS NULL OR refund_status IN ('refunding', 'unknown'))
    RETURNING refund_key, refund_attempt";

/// Asks the provider to refund `charge` of `order_id`, after committing the intent; the
/// attempt's number with how it ended. `Stale` if the refund was decided meanwhile, and
/// `Unavailable` (the attempt marked `unknown`) if no answer came.
pub async fn ask(
    pool: &Pool,
    provider: &Provider,
    order_id: Uuid,
    charge: &Standing,
) -> Result<(i32, Ending), HandlerError> {
    // A connection for the intent alone: none is held while the provider is waited for.
    let intent = {
        let client = pool.get().await?;
        client
            .query_opt(
                &client.prepare_cached(INTENT_TO_REFUND).await?,
                &[&order_id, &refund_key(order_id, 1)],
            )
            .await?
    };
    let Some(intent) = intent else {
        return Err(HandlerError::Stale(format!(
            "order {order_id}'s refund was decided while this one was prepared"
        )));
    };
    let (key, attempt): (String, i32) = (intent.get(0), intent.get(1));
    let key = if failpoint::fires(failpoint::FRESH_REFUND_KEY) {
        format!("{key}:{}", Uuid::new_v4())
    } else {
        key
    };
    let request = RefundRequest {
        charge_id: charge.charge_id.clone(),
        amount_cents: charge.amount_cents,
    };
    let ending = match provider.refund(&key, &request).await {
        Ok(refund) => Ending::Refunded(refund),
        Err(HandlerError::Rejected(reason)) => Ending::Refused { reason },
        Err(error @ HandlerError::Unavailable(_)) => {
            let mark = payment::MARK_REFUND_UNKNOWN;
            return Err(payment::unanswered(pool, order_id, mark, error).await);
        }
        Err(error) => return Err(error),
    };
    tracing::info!(%order_id, charge_id = charge.charge_id, idempotency_key = key, ?ending, "provider answered the refund");
    Ok((attempt, ending))
}

/// The refund recorded on its payment; the cancellation is answered. Guard 2 in the
/// statement: only a refund not decided yet is recorded.
pub const RECORD_REFUND: &str = "
    UPDATE payments
       SET refund_status = 'refunded', refund_id = $2, refund_reason = NULL,
           refunded_at = now(), answered_at = coalesce(answered_at, now()), updated_at = now()
     WHERE order_id = $1 AND refund_status IS DISTINCT FROM 'refunded'";

/// A refund that could not be made, recorded with why: `failed` or `manual`. Only a
/// refund not decided yet takes it: two retries refused under one attempt's key record
/// the refusal once.
pub const RECORD_NOT_REFUNDED: &str = "
    UPDATE payments
       SET refund_status = $2, refund_reason = $3, refund_attempt = greatest(refund_attempt, 1),
           answered_at = coalesce(answered_at, now()), updated_at = now()
     WHERE order_id = $1 AND (refund_status IS NULL OR refund_status IN ('refunding', 'unknown'))";

/// Records `refund` of `charge` for `order_id` and enqueues `payment.refunded` (id
/// `<order id>:refund`, one per order, whichever attempt made it), caused by `caused_by`.
/// `false` if a refund was recorded already.
pub async fn record_refunded(
    tx: &Transaction<'_>,
    topics: &Topics,
    order_id: Uuid,
    charge: &Standing,
    refund: &Refund,
    caused_by: Option<&str>,
) -> Result<bool, HandlerError> {
    let updated = tx
        .execute(
            &tx.prepare_cached(RECORD_REFUND).await?,
            &[&order_id, &refund.refund_id],
        )
        .await?;
    if updated == 0 {
        return Ok(false);
    }
    outbox::enqueue(
        tx,
        &NewEvent {
            event_id: &events::refund_id(order_id),
            topic: &topics.payments,
            key: &order_id.to_string(),
            event_type: events::PAYMENT_REFUNDED,
            payload: &PaymentRefunded {
                order_id,
                amount_cents: charge.amount_cents,
                charge_id: charge.charge_id.clone(),
                refund_id: refund.refund_id.clone(),
            },
            caused_by,
        },
    )
    .await?;
    Ok(true)
}

/// Records that `failed.attempt` could not refund `order_id`'s charge, and enqueues
/// `payment.refund_failed` (one per attempt). `false` if the refund was decided already:
/// made, or this attempt's failure recorded by another caller.
pub async fn record_not_refunded(
    tx: &Transaction<'_>,
    topics: &Topics,
    failed: &PaymentRefundFailed,
    caused_by: Option<&str>,
) -> Result<bool, HandlerError> {
    let status = if failed.manual { "manual" } else { "failed" };
    let updated = tx
        .execute(
            &tx.prepare_cached(RECORD_NOT_REFUNDED).await?,
            &[&failed.order_id, &status, &failed.reason],
        )
        .await?;
    if updated == 0 {
        return Ok(false);
    }
    tracing::warn!(order_id = %failed.order_id, status, reason = failed.reason, attempt = failed.attempt,
        "a cancelled order's charge could not be refunded");
    outbox::enqueue(
        tx,
        &NewEvent {
            event_id: &events::refund_failed_id(failed.order_id, failed.attempt),
            topic: &topics.payments,
            key: &failed.order_id.to_string(),
            event_type: events::PAYMENT_REFUND_FAILED,
            payload: failed,
            caused_by,
        },
    )
    .await?;
    Ok(true)
}
