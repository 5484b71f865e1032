//! SettleCancellation: payment-service's answer to an order's cancellation settles the
//! order, once; a refund is recorded and announced to the customer, once.
//!
//! In one transaction:
//! 1. **Dedupe.** The answer's id goes into `processed_events`; a redelivery stops here.
//! 2. **State.** `SELECT … FOR UPDATE` locks the order. An order settled already (its
//!    answer applied under another id), or with a refund recorded already, is left as
//!    it is: guarded.
//! 3. `payment.voided`: the order has settled. `payment.refunded`: the refund is
//!    recorded, the order has settled, and `order.refunded` goes out on `orders` with id
//!    `<order id>:refunded`, for notification-service to tell the customer.
//!    `payment.refund_failed`: the order has settled with its refund `failed` and the
//!    reason, shown by `GET /v1/orders/{id}`; a refund recorded later (an operator's
//!    retry) is `payment.refunded` as ever.
//!
//! order-service announces the refund on its own topic, rather than notification-service
//! reading payments: the customer hears what order-service recorded, in the order it
//! recorded it, and the saga keeps its six topics.

use deadpool_postgres::Pool;
use saga::events::{self, OrderRefunded, PaymentRefundFailed, PaymentRefunded, PaymentVoided};
use saga::inbox;
use saga::outbox::{self, NewEvent};
use saga::{Envelope, Handler, HandlerError, Outcome, Step, Topics, Transaction};
use uuid::Uuid;

pub struct SettleCancellation {
    topics: Topics,
}

impl SettleCancellation {
    pub fn new(topics: Topics) -> Self {
        Self { topics }
    }
}

/// payment-service's answer.
#[derive(Debug)]
pub enum Answer {
    Refunded(PaymentRefunded),
    Voided(PaymentVoided),
    RefundFailed(PaymentRefundFailed),
}

impl Answer {
    fn order_id(&self) -> Uuid {
        match self {
            Answer::Refunded(refunded) => refunded.order_id,
            Answer::Voided(voided) => voided.order_id,
            Answer::RefundFailed(failed) => failed.order_id,
        }
    }
}

impl Handler for SettleCancellation {
    type Command = Answer;
    type Prepared = Answer;

    fn ignores(&self, event_type: &str) -> bool {
        // The payment's result: ApplyPaymentResult's.
        matches!(
            event_type,
            events::PAYMENT_SUCCEEDED | events::PAYMENT_FAILED
        )
    }

    fn decode(&self, event: &Envelope) -> Result<Option<Answer>, HandlerError> {
        let answer = match event.event_type.as_str() {
            events::PAYMENT_REFUNDED => Answer::Refunded(event.payload()?),
            events::PAYMENT_VOIDED => Answer::Voided(event.payload()?),
            events::PAYMENT_REFUND_FAILED => Answer::RefundFailed(event.payload()?),
            other if self.ignores(other) => return Ok(None),
            other => {
                return Err(HandlerError::rejected(format!(
                    "unknown event type `{other}`: the payments topic carries {}",
                    events::PAYMENTS_TYPES.join(", ")
                )));
            }
        };
        event.check_aggregate(answer.order_id())?;
        Ok(Some(answer))
    }

    /// Nothing leaves the database.
    async fn prepare(
        &self,
        _: &Pool,
        _: &Envelope,
        answer: Answer,
    ) -> Result<Step<Answer>, HandlerError> {
        Ok(Step::Apply(answer))
    }

    async fn apply(
        &self,
        tx: &Transaction<'_>,
        event: &Envelope,
        answer: Answer,
    ) -> Result<Outcome, HandlerError> {
        settle_cancellation(tx, &self.topics, event, &answer).await
    }
}

/// Guard 2: locks the order, and reads whether it has settled or been refunded.
pub const LOCK_ORDER: &str = "
    SELECT customer_id, amount_cents, settled_at IS NOT NULL AS settled,
           refund_id IS NOT NULL AS refunded
      FROM orders WHERE id = $1 FOR UPDATE";

/// The order has settled, with its refund if it had one, or why its refund failed.
pub const SETTLE: &str = "
    UPDATE orders
       SET settled_at = coalesce(settled_at, now()), refund_id = coalesce($2, refund_id),
           refund_failure = coalesce($3, refund_failure)
     WHERE id = $1";

/// Applies payment-service's `answer` to its order in `tx`, which the consumer opened and
/// commits when this returns `Ok`, whatever the outcome.
#[tracing::instrument(skip_all, fields(order_id = %answer.order_id(), event_id = %event.id))]
pub async fn settle_cancellation(
    tx: &Transaction<'_>,
    topics: &Topics,
    event: &Envelope,
    answer: &Answer,
) -> Result<Outcome, HandlerError> {
    // Guard 1: have we applied this very answer before?
    if !inbox::claim(tx, event).await? {
        return Ok(Outcome::Duplicate);
    }
    let order_id = answer.order_id();
    // Guard 2: has the order settled, or been refunded, already?
    let Some(order) = tx
        .query_opt(&tx.prepare_cached(LOCK_ORDER).await?, &[&order_id])
        .await?
    else {
        // Rolled back on drop: the id is not recorded, so a corrected redrive can apply.
        return Err(HandlerError::rejected(format!(
            "order {order_id} does not exist"
        )));
    };
    let (refund_id, failure) = match answer {
        // A refund is news even for a settled order: one whose refund failed is refunded
        // on an operator's retry.
        Answer::Refunded(_) if order.get("refunded") => return Ok(Outcome::Guarded),
        Answer::Voided(_) if order.get("settled") => return Ok(Outcome::Guarded),
        // Each failed attempt is news until a refund is recorded.
        Answer::RefundFailed(_) if order.get("refunded") => return Ok(Outcome::Guarded),
        Answer::Refunded(refunded) => (Some(refunded.refund_id.clone()), None),
        Answer::Voided(_) => (None, None),
        Answer::RefundFailed(failed) => (None, Some(failed.reason.clone())),
    };
    tx.pipeline(
        tx.prepare_cached(SETTLE).await?,
        vec![Box::new(order_id), Box::new(refund_id), Box::new(failure)],
    );
    if let Answer::Refunded(refunded) = answer {
        outbox::enqueue(
            tx,
            &NewEvent {
                event_id: &events::order_refunded_id(order_id),
                topic: &topics.orders,
                key: &order_id.to_string(),
                event_type: events::ORDER_REFUNDED,
                payload: &OrderRefunded {
                    order_id,
                    customer_id: order.get("customer_id"),
                    amount_cents: refunded.amount_cents,
                },
                caused_by: Some(&event.id),
            },
        )
        .await?;
    }
    Ok(Outcome::Applied)
}
