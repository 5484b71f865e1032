//! ChargeOrder: one payment per order, whatever `orders` redelivers.
//!
//! In one transaction:
//! 1. **Dedupe.** The `order.created` id goes into `processed_events`; a redelivery stops
//!    here.
//! 2. **State.** The payment row is the aggregate, and this event creates it, so there is
//!    no row to `SELECT … FOR UPDATE` yet: the insert itself is the lock. `INSERT … ON
//!    CONFLICT (order_id) DO NOTHING` makes a concurrent transaction for the same order
//!    wait on the primary key and then insert nothing; zero rows means the order was
//!    already charged (by another `order.created` for it, with a different id): stop.
//! 3. Enqueue `payment.succeeded` / `payment.failed` with id `<order.created id>:payment`,
//!    so a redelivered `order.created` can only ever produce the same result event.

use deadpool_postgres::Transaction;
use saga::events::{self, OrderCreated, PaymentResult};
use saga::outbox::{self, NewEvent};
use saga::{Envelope, Handler, HandlerError, Outcome, Topics};

/// Decides whether a payment succeeds. A stand-in for a payment provider, deterministic
/// so a replay decides the same way.
#[derive(Debug, Clone, Copy)]
pub struct PaymentPolicy {
    pub limit_cents: i64,
}

pub const AMOUNT_EXCEEDS_LIMIT: &str = "amount exceeds limit";

impl PaymentPolicy {
    /// `None` to charge, or the reason the payment fails.
    pub fn decline_reason(&self, amount_cents: i64) -> Option<&'static str> {
        (amount_cents > self.limit_cents).then_some(AMOUNT_EXCEEDS_LIMIT)
    }
}

pub struct ChargeOrder {
    topics: Topics,
    policy: PaymentPolicy,
}

impl ChargeOrder {
    pub fn new(topics: Topics, policy: PaymentPolicy) -> Self {
        Self { topics, policy }
    }
}

impl Handler for ChargeOrder {
    type Command = OrderCreated;

    fn decode(&self, event: &Envelope) -> Result<Option<OrderCreated>, HandlerError> {
        match event.event_type.as_str() {
            events::ORDER_CREATED => {}
            // The saga's outcomes share the topic; they are notification-service's.
            events::ORDER_CONFIRMED | events::ORDER_CANCELLED => return Ok(None),
            other => {
                return Err(HandlerError::rejected(format!(
                    "unknown event type `{other}` on the orders topic"
                )));
            }
        }
        let order: OrderCreated = event.payload()?;
        event.check_aggregate(order.order_id)?;
        Ok(Some(order))
    }

    async fn apply(
        &self,
        tx: &Transaction<'_>,
        event: &Envelope,
        order: OrderCreated,
    ) -> Result<Outcome, HandlerError> {
        charge_order(tx, &self.topics, self.policy, event, &order).await
    }
}

#[tracing::instrument(skip_all, fields(order_id = %order.order_id, event_id = %event.id))]
pub async fn charge_order(
    tx: &Transaction<'_>,
    topics: &Topics,
    policy: PaymentPolicy,
    event: &Envelope,
    order: &OrderCreated,
) -> Result<Outcome, HandlerError> {
    let decline_reason = policy.decline_reason(order.amount_cents);
    let status = if decline_reason.is_some() {
        "failed"
    } else {
        "succeeded"
    };

    // Each statement is prepared once per pooled connection (`prepare_cached`), not on
    // every call: parsing and planning it again, and the extra round trip that takes,
    // cost more than running it. The caller opened `tx` and commits it when this
    // returns `Ok`, whatever the outcome.

    // Guard 1: have we handled this very event before?
    let claimed = tx
        .execute(
            &tx.prepare_cached(
                "INSERT INTO processed_events (event_id) VALUES ($1) ON CONFLICT DO NOTHING",
            )
            .await?,
            &[&event.id],
        )
        .await?;
    if claimed == 0 {
        return Ok(Outcome::Duplicate);
    }

    // Guard 2: has this order been charged already?
    let inserted = tx
        .execute(
            &tx.prepare_cached(
                "INSERT INTO payments (order_id, event_id, status, amount_cents, reason)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (order_id) DO NOTHING",
            )
            .await?,
            &[
                &order.order_id,
                &event.id,
                &status,
                &order.amount_cents,
                &decline_reason,
            ],
        )
        .await?;
    if inserted == 0 {
        return Ok(Outcome::Guarded);
    }

    let result_id = events::payment_result_id(&event.id);
    let order_key = order.order_id.to_string();
    outbox::enqueue(
        tx,
        &NewEvent {
            event_id: &result_id,
            topic: &topics.payments,
            key: &order_key,
            event_type: if decline_reason.is_some() {
                events::PAYMENT_FAILED
            } else {
                events::PAYMENT_SUCCEEDED
            },
            payload: &PaymentResult {
                order_id: order.order_id,
                amount_cents: order.amount_cents,
                reason: decline_reason.map(str::to_owned),
            },
        },
    )
    .await?;
    Ok(Outcome::Applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declines_only_above_the_limit() {
        let policy = PaymentPolicy {
            limit_cents: 100_000,
        };
        assert_eq!(policy.decline_reason(100_000), None);
        assert_eq!(policy.decline_reason(100_001), Some(AMOUNT_EXCEEDS_LIMIT));
    }
}
