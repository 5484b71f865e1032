//! RefundOrder: every cancellation of an order is answered, once, and a charge that stood
//! for it is refunded, once.
//!
//! After the charge the saga can only move forward: no rollback of ours undoes a charge
//! at the provider. The compensation is a new transaction there, a refund, with the
//! idempotency key `<order id>:refund` ([`refund_key`]): every redelivery, every retry
//! after a lost answer, asks with that same key, so the provider refunds once and replays
//! the first refund to every later call.
//!
//! Like the charge, the refund happens *before* the transaction ([`Handler::prepare`]):
//! 0. **What stands?** If the event id is in the inbox, nothing is asked. With a charge
//!    recorded here and not refunded, it is refunded. With no payment here at all, the
//!    provider is asked for the order's charges: a charge can stand whose `order.created`
//!    was dead-lettered after the provider made it, and it is refunded too.
//!
//! Then, in one transaction:
//! 1. **Dedupe.** The cancellation's id goes into `processed_events`; a redelivery stops
//!    here.
//! 2. **State, decided again under the lock.** `SELECT … FOR UPDATE` on the order's
//!    payment. The prepare ran outside any transaction, while the charge before this
//!    event in the partition may still have been committing: so what it saw is checked
//!    again here. A charge standing that it did not refund means it is out of date: the
//!    transaction commits nothing and the event is prepared again ([`HandlerError::Stale`]).
//! 3. Record the answer and enqueue it:
//!    - a refund: the payment gets its refund, and `payment.refunded` goes out with id
//!      `<order id>:refund`, one per order whatever asked for it;
//!    - nothing charged and no payment: a **tombstone**, a `voided` payment. The payment's
//!      primary key then stops a charge for the order that comes later (its
//!      `order.created` redriven after the cancellation), as it stops a second charge;
//!    - a declined payment, or the tombstone: `payment.voided` with id
//!      `<cancellation id>:voided`.
//!
//! An already answered order (refunded, or voided) answers nothing again: guarded.
//!
//! Only order-service's own cancellations move money
//! ([`events::is_order_services_cancellation`]). The order's state is order-service's: an
//! `order.cancelled` with another id (typed by hand, say) is not a cancellation
//! order-service recorded, and refunding on it would leave an order confirmed whose money
//! was paid back, a difference no later event could repair. It is ignored.

use deadpool_postgres::Pool;
use saga::events::{self, OrderOutcome, PaymentRefunded, PaymentVoided};
use saga::inbox;
use saga::outbox::{self, NewEvent};
use saga::{Envelope, Handler, HandlerError, Outcome, Step, Topics, Transaction, failpoint};
use uuid::Uuid;

use crate::provider::{Provider, Refund, RefundRequest};

/// The idempotency key of an order's refund at the provider, and the id of its
/// `payment.refunded`: one per order.
pub fn refund_key(order_id: Uuid) -> String {
    events::refund_id(order_id)
}

pub struct RefundOrder {
    topics: Topics,
    provider: Provider,
}

impl RefundOrder {
    pub fn new(topics: Topics, provider: Provider) -> Self {
        Self { topics, provider }
    }
}

/// What [`RefundOrder::prepare`] found standing, and did.
#[derive(Debug)]
pub enum Found {
    /// A charge stood, and is refunded now.
    Refunded {
        order: OrderOutcome,
        charge_id: String,
        amount_cents: i64,
        refund: Refund,
    },
    /// No charge stood for the order.
    NothingCharged { order: OrderOutcome },
}

impl Handler for RefundOrder {
    type Command = OrderOutcome;
    type Prepared = Found;

    fn ignores(&self, event_type: &str) -> bool {
        // ChargeOrder's, notification-service's.
        matches!(
            event_type,
            events::ORDER_CREATED | events::ORDER_CONFIRMED | events::ORDER_REFUNDED
        )
    }

    fn decode(&self, event: &Envelope) -> Result<Option<OrderOutcome>, HandlerError> {
        match event.event_type.as_str() {
            events::ORDER_CANCELLED => {}
            other if self.ignores(other) => return Ok(None),
            other => {
                return Err(HandlerError::rejected(format!(
                    "unknown event type `{other}` on the orders topic"
                )));
            }
        }
        let order: OrderOutcome = event.payload()?;
        event.check_aggregate(order.order_id)?;
        if !events::is_order_services_cancellation(&event.id, order.order_id) {
            tracing::info!(order_id = %order.order_id, event_id = %event.id,
                "a cancellation order-service did not write: no money moves for it");
            return Ok(None);
        }
        Ok(Some(order))
    }

    async fn prepare(
        &self,
        pool: &Pool,
        event: &Envelope,
        order: OrderOutcome,
    ) -> Result<Step<Found>, HandlerError> {
        let standing = match read_ahead(pool, event, order.order_id).await? {
            Ahead::Duplicate => return Ok(Step::Done(Outcome::Duplicate)),
            Ahead::Payment(payment) => payment,
            Ahead::NoPayment => standing_at_provider(&self.provider, order.order_id).await?,
        };
        let Some(Standing {
            charge_id,
            amount_cents,
        }) = standing
        else {
            return Ok(Step::Apply(Found::NothingCharged { order }));
        };
        let refund =
            refund_charge(&self.provider, order.order_id, &charge_id, amount_cents).await?;
        Ok(Step::Apply(Found::Refunded {
            order,
            charge_id,
            amount_cents,
            refund,
        }))
    }

    async fn apply(
        &self,
        tx: &Transaction<'_>,
        event: &Envelope,
        found: Found,
    ) -> Result<Outcome, HandlerError> {
        refund_order(tx, &self.topics, event, found).await
    }
}

/// A charge standing for an order, not refunded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standing {
    pub charge_id: String,
    pub amount_cents: i64,
}

enum Ahead {
    Duplicate,
    /// The order's payment here: the charge standing, if any.
    Payment(Option<Standing>),
    NoPayment,
}

/// Guard 1 and the payment, read ahead outside any transaction: a shortcut, which the
/// transaction checks again with the payment locked.
pub const READ_AHEAD: &str = "
    SELECT EXISTS (SELECT 1 FROM processed_events WHERE event_id = $1) AS seen,
           p.status, p.charge_id, p.refund_id, p.amount_cents
      FROM (SELECT 1) one LEFT JOIN payments p ON p.order_id = $2";

async fn read_ahead(pool: &Pool, event: &Envelope, order_id: Uuid) -> Result<Ahead, HandlerError> {
    let client = pool.get().await?;
    let row = client
        .query_one(
            &client.prepare_cached(READ_AHEAD).await?,
            &[&event.id, &order_id],
        )
        .await?;
    if row.get("seen") {
        return Ok(Ahead::Duplicate);
    }
    let Some(status) = row.get::<_, Option<&str>>("status") else {
        return Ok(Ahead::NoPayment);
    };
    let refunded = row.get::<_, Option<&str>>("refund_id").is_some();
    let charge_id: Option<String> = row.get("charge_id");
    Ok(Ahead::Payment(match (status, charge_id, refunded) {
        ("succeeded", Some(charge_id), false) => Some(Standing {
            charge_id,
            amount_cents: row.get("amount_cents"),
        }),
        _ => None,
    }))
}

/// The order's charge at the provider that succeeded, if any. A charge refunded there
/// already counts as standing: its refund is then found again under the order's key.
pub async fn standing_at_provider(
    provider: &Provider,
    order_id: Uuid,
) -> Result<Option<Standing>, HandlerError> {
    let charges = provider.charges_for(&order_id.to_string()).await?;
    Ok(charges
        .into_iter()
        .find(|charge| charge.succeeded)
        .map(|charge| Standing {
            charge_id: charge.charge_id,
            amount_cents: charge.amount_cents,
        }))
}

/// Refunds `charge_id`, the order's charge, in full, under the order's refund key.
pub async fn refund_charge(
    provider: &Provider,
    order_id: Uuid,
    charge_id: &str,
    amount_cents: i64,
) -> Result<Refund, HandlerError> {
    let key = if failpoint::fires(failpoint::FRESH_REFUND_KEY) {
        format!("{}:{}", refund_key(order_id), Uuid::new_v4())
    } else {
        refund_key(order_id)
    };
    let refund = provider
        .refund(
            &key,
            &RefundRequest {
                charge_id: charge_id.to_owned(),
                amount_cents,
            },
        )
        .await?;
    tracing::info!(%order_id, charge_id, idempotency_key = key, ?refund, "provider refunded");
    Ok(refund)
}

/// Guard 2: the order's payment, locked, as the transaction decides on it, and whether
/// a cancellation of it was answered already.
pub const LOCK_PAYMENT: &str = "
    SELECT status, charge_id, answered_at IS NOT NULL AS answered
      FROM payments WHERE order_id = $1 FOR UPDATE";

/// A refund recorded with the payment it pays back: the cancellation is answered.
pub const RECORD_REFUND: &str = "
    UPDATE payments SET refund_id = $2, refunded_at = now(), answered_at = now()
     WHERE order_id = $1";

/// A declined payment's cancellation answered: nothing to refund.
pub const RECORD_ANSWERED: &str = "UPDATE payments SET answered_at = now() WHERE order_id = $1";

/// The payment of an order cancelled before a charge was recorded here: the tombstone
/// (`voided`), with the charge and its refund when the provider had one. The insert is
/// the lock, as a charge's is: a charge committing meanwhile makes it insert nothing.
pub const INSERT_VOIDED: &str = "
    INSERT INTO payments
        (order_id, event_id, status, amount_cents, charge_id, refund_id, refunded_at, answered_at)
    VALUES ($1, $2, 'voided', $3, $4, $5, CASE WHEN $5::text IS NULL THEN NULL ELSE now() END, now())
    ON CONFLICT (order_id) DO NOTHING";

/// Answers the cancellation `event` with what `found` says, in `tx`, which the consumer
/// opened and commits when this returns `Ok`, whatever the outcome.
#[tracing::instrument(skip_all, fields(event_id = %event.id))]
pub async fn refund_order(
    tx: &Transaction<'_>,
    topics: &Topics,
    event: &Envelope,
    found: Found,
) -> Result<Outcome, HandlerError> {
    // Guard 1: have we answered this very cancellation before?
    if !inbox::claim(tx, event).await? {
        return Ok(Outcome::Duplicate);
    }
    let order = match &found {
        Found::Refunded { order, .. } | Found::NothingCharged { order } => order,
    };
    // Guard 2: what stands for the order now, locked.
    let payment = tx
        .query_opt(&tx.prepare_cached(LOCK_PAYMENT).await?, &[&order.order_id])
        .await?;
    let Some(payment) = payment else {
        record_tombstone(tx, event, &found).await?;
        enqueue_answer(tx, topics, event, &found, "not_charged").await?;
        return Ok(Outcome::Applied);
    };
    let status: &str = payment.get("status");
    let charge_id: Option<&str> = payment.get("charge_id");
    if payment.get("answered") {
        // Answered before: this cancellation delivered again after its id left the
        // inbox, or a charge that met its tombstone and was refunded.
        return Ok(Outcome::Guarded);
    }
    match &found {
        Found::Refunded {
            charge_id: refunded,
            refund,
            ..
        } if charge_id == Some(refunded.as_str()) => {
            tx.pipeline(
                tx.prepare_cached(RECORD_REFUND).await?,
                vec![Box::new(order.order_id), Box::new(refund.refund_id.clone())],
            );
        }
        _ if status == "succeeded" => {
            return Err(HandlerError::Stale(format!(
                "order {} has a charge standing ({}) that this cancellation's prepare did not refund: it committed meanwhile",
                order.order_id,
                charge_id.unwrap_or("no charge id")
            )));
        }
        _ => tx.pipeline(
            tx.prepare_cached(RECORD_ANSWERED).await?,
            vec![Box::new(order.order_id)],
        ),
    }
    enqueue_answer(tx, topics, event, &found, "declined").await?;
    Ok(Outcome::Applied)
}

/// The payment of an order cancelled before any was recorded here: the tombstone, with
/// the provider's charge and its refund if one stood there.
async fn record_tombstone(
    tx: &Transaction<'_>,
    event: &Envelope,
    found: &Found,
) -> Result<(), HandlerError> {
    let (order, charge_id, refund_id) = match found {
        Found::Refunded {
            order,
            charge_id,
            refund,
            ..
        } => (
            order,
            Some(charge_id.as_str()),
            Some(refund.refund_id.as_str()),
        ),
        Found::NothingCharged { order } => (order, None, None),
    };
    let inserted = tx
        .execute(
            &tx.prepare_cached(INSERT_VOIDED).await?,
            &[
                &order.order_id,
                &event.id,
                &order.amount_cents,
                &charge_id,
                &refund_id,
            ],
        )
        .await?;
    if inserted == 0 {
        return Err(HandlerError::Stale(format!(
            "order {} got a payment while its cancellation was prepared",
            order.order_id
        )));
    }
    Ok(())
}

/// The answer to the cancellation `event`: `payment.refunded` if `found` a refund made,
/// else `payment.voided` for `nothing_because`.
async fn enqueue_answer(
    tx: &Transaction<'_>,
    topics: &Topics,
    event: &Envelope,
    found: &Found,
    nothing_because: &str,
) -> Result<(), HandlerError> {
    match found {
        Found::Refunded {
            order,
            charge_id,
            amount_cents,
            refund,
        } => {
            outbox::enqueue(
                tx,
                &NewEvent {
                    event_id: &events::refund_id(order.order_id),
                    topic: &topics.payments,
                    key: &order.order_id.to_string(),
                    event_type: events::PAYMENT_REFUNDED,
                    payload: &PaymentRefunded {
                        order_id: order.order_id,
                        amount_cents: *amount_cents,
                        charge_id: charge_id.clone(),
                        refund_id: refund.refund_id.clone(),
                    },
                    caused_by: Some(&event.id),
                },
            )
            .await?
        }
        Found::NothingCharged { order } => {
            outbox::enqueue(
                tx,
                &NewEvent {
                    event_id: &events::voided_id(&event.id),
                    topic: &topics.payments,
                    key: &order.order_id.to_string(),
                    event_type: events::PAYMENT_VOIDED,
                    payload: &PaymentVoided {
                        order_id: order.order_id,
                        reason: nothing_because.to_owned(),
                    },
                    caused_by: Some(&event.id),
                },
            )
            .await?
        }
    }
    Ok(())
}
