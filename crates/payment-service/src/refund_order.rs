//! RefundOrder: every cancellation of an order is answered, once; a charge that stood for
//! it is refunded, once, or its refund's failure is recorded where everyone sees it.
//!
//! After the charge the saga can only move forward: no rollback of ours undoes a charge
//! at the provider. The compensation is a new transaction there, a refund, with the
//! idempotency key `<order id>:refund` ([`payment::refund_key`]): every redelivery, every
//! retry after a lost answer, asks with that same key, so the provider refunds once and
//! replays the first refund to every later call.
//!
//! Like the charge, the refund happens *before* the transaction ([`Handler::prepare`]),
//! after its intent ([`crate::refund`]), and only once the charge is *definite*:
//! 0. **What stands?** If the event id is in the inbox, nothing is asked. With no payment
//!    here, no charge was ever asked for (every charge's intent is its payment:
//!    [`crate::payment`]): nothing to refund. With a charge asked for and not answered
//!    (`charging`, `unknown`), the charge is **resolved first**, by asking for it again
//!    under its own key: the provider answers with the charge it made, or a decline, or
//!    makes it now (then it is refunded like any other); never by listing the order's
//!    charges, which cannot show one still committing. With a charge standing, it is
//!    refunded; with no charge id recorded, no refund can be asked for: `manual`.
//!
//! Then, in one transaction:
//! 1. **Dedupe.** The cancellation's id goes into `processed_events`; a redelivery stops
//!    here.
//! 2. **State, decided again under the lock.** `SELECT … FOR UPDATE` on the order's
//!    payment. The prepare ran outside any transaction, while the charge before this
//!    event in the partition may still have been committing: what it saw is checked
//!    again here, and if it is out of date the transaction commits nothing and the event
//!    is prepared again ([`HandlerError::Stale`]).
//! 3. Record the answer and enqueue it:
//!    - a charge resolved by this cancellation: its answer over its intent, with its
//!      `payment.succeeded` / `payment.failed`, as ChargeOrder would have;
//!    - a refund: `payment.refunded` with id `<order id>:refund`, one per order;
//!    - a refund refused (`failed`), or impossible (`manual`): `payment.refund_failed`
//!      with the reason, and the order waits, visibly, for an operator's retry
//!      ([`crate::retry_refund`]) or a person;
//!    - no payment at all: a **tombstone**, a `voided` payment, whose primary key stops
//!      a charge's intent for the order that comes later (its `order.created` redriven
//!      after the cancellation), as it stops a second charge;
//!    - a declined payment, or the tombstone: `payment.voided` with id
//!      `<cancellation id>:voided`.
//!
//! An already answered order (refunded, voided, or its refund failed) answers nothing
//! again: guarded.
//!
//! Only order-service's own cancellations move money
//! ([`events::is_order_services_cancellation`]). The order's state is order-service's: an
//! `order.cancelled` with another id (typed by hand, say) is not a cancellation
//! order-service recorded, and refunding on it would leave an order confirmed whose money
//! was paid back, a difference no later event could repair. It is ignored.

use deadpool_postgres::Pool;
use saga::events::{self, OrderOutcome, PaymentRefundFailed, PaymentVoided};
use saga::inbox;
use saga::outbox::{self, NewEvent};
use saga::{Envelope, Handler, HandlerError, Outcome, Step, Topics, Transaction, failpoint};
use uuid::Uuid;

use crate::payment::{self, CURRENCY, ChargeState, Payment};
use crate::provider::{Answer, ChargeRequest, Provider};
use crate::refund::{self, Ending, Standing};

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
pub struct Found {
    pub order: OrderOutcome,
    /// The charge's answer, if this cancellation resolved an undecided charge.
    pub resolved: Option<Resolved>,
    pub money: Money,
}

/// How an undecided charge was resolved.
#[derive(Debug)]
pub enum Resolved {
    /// Asked again under its key, and answered.
    Replayed(Answer),
    /// Nothing listed for the order ([`failpoint::LIST_DECIDES`] only): read as nothing
    /// charged, which is what loses a refund.
    NothingListed,
    /// The provider refused the request itself (its key used for another amount, say):
    /// the charge stays undecided, for a person, with the provider's answer.
    Undecidable(String),
}

/// What became of the order's money.
#[derive(Debug)]
pub enum Money {
    /// A charge stood, and is refunded now.
    Refunded {
        charge: Standing,
        refund: crate::provider::Refund,
    },
    /// A charge stood, and could not be refunded.
    NotRefunded(PaymentRefundFailed),
    /// No charge stood for the order.
    NothingCharged,
    /// The cancellation of this order was answered before.
    AnsweredBefore,
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
        // A connection for the read alone: none is held while the provider is waited for.
        let ahead = read_ahead(&pool.get().await?, event, order.order_id).await?;
        let payment = match ahead {
            Ahead::Duplicate => return Ok(Step::Done(Outcome::Duplicate)),
            Ahead::Payment(payment) => payment,
        };
        let found = |resolved, money| {
            Ok(Step::Apply(Found {
                order: order.clone(),
                resolved,
                money,
            }))
        };
        // No intent, no charge: every charge is asked for after its payment is committed.
        let Some(payment) = payment else {
            return found(None, Money::NothingCharged);
        };
        if payment.answered {
            return found(None, Money::AnsweredBefore);
        }
        let (resolved, charged) = match payment.state {
            ChargeState::Charging | ChargeState::Unknown => {
                let resolved = self.resolve(pool, &payment).await?;
                let charged = match &resolved {
                    Resolved::Replayed(Answer::Charged { charge_id, .. }) => {
                        Some(charge_id.clone())
                    }
                    Resolved::Replayed(Answer::Declined { .. }) | Resolved::NothingListed => None,
                    Resolved::Undecidable(reason) => {
                        let reason = format!(
                            "the charge asked for under {} could not be resolved: {reason}",
                            payment.charge_key()
                        );
                        let failed = not_refunded(&payment, None, reason, true);
                        return found(Some(resolved), Money::NotRefunded(failed));
                    }
                };
                (Some(resolved), charged)
            }
            ChargeState::Succeeded => match &payment.charge_id {
                Some(charge_id) => (None, Some(charge_id.clone())),
                None => {
                    let reason = "the payment succeeded with no charge id recorded, so no refund can be asked for: refund it by hand".to_owned();
                    return found(
                        None,
                        Money::NotRefunded(not_refunded(&payment, None, reason, true)),
                    );
                }
            },
            ChargeState::Failed => (None, None),
            // A tombstone is answered when written.
            ChargeState::Voided => return found(None, Money::AnsweredBefore),
        };
        let Some(charge_id) = charged else {
            return found(resolved, Money::NothingCharged);
        };
        let charge = Standing {
            charge_id,
            amount_cents: payment.amount_cents,
        };
        let money = match refund::ask(pool, &self.provider, order.order_id, &charge).await? {
            (_, Ending::Refunded(refund)) => Money::Refunded { charge, refund },
            (attempt, Ending::Refused { reason }) => {
                let mut failed = not_refunded(&payment, Some(&charge.charge_id), reason, false);
                failed.attempt = attempt;
                Money::NotRefunded(failed)
            }
        };
        found(resolved, money)
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

impl RefundOrder {
    /// The definite answer to `payment`'s undecided charge: the same request under the
    /// same key, which the provider answers from the key's stored answer, or by making
    /// the charge now, or with `409` while the first call still runs (retried).
    async fn resolve(&self, pool: &Pool, payment: &Payment) -> Result<Resolved, HandlerError> {
        if !payment.key_alive(self.provider.key_ttl) {
            return Ok(Resolved::Undecidable(format!(
                "no answer for {:.0} s, past the provider's key lifetime (PROVIDER_KEY_TTL {:?}): asking again could charge twice",
                payment.age.as_secs_f64(),
                self.provider.key_ttl
            )));
        }
        if failpoint::fires(failpoint::LIST_DECIDES) {
            return Ok(
                match standing_at_provider(&self.provider, payment.order_id).await? {
                    Some(charge) => Resolved::Replayed(Answer::Charged {
                        charge_id: charge.charge_id,
                        replayed: true,
                    }),
                    None => Resolved::NothingListed,
                },
            );
        }
        let request = ChargeRequest {
            amount_cents: payment.amount_cents,
            currency: CURRENCY,
            reference: payment.order_id.to_string(),
        };
        let key = payment.charge_key();
        match self.provider.charge(&key, &request).await {
            Ok(answer) => {
                tracing::info!(order_id = %payment.order_id, idempotency_key = key, ?answer,
                    "an undecided charge resolved for its cancellation");
                Ok(Resolved::Replayed(answer))
            }
            Err(error @ HandlerError::Unavailable(_)) => {
                let mark = payment::MARK_CHARGE_UNKNOWN;
                Err(payment::unanswered(pool, payment.order_id, mark, error).await)
            }
            Err(HandlerError::Rejected(reason)) => Ok(Resolved::Undecidable(reason)),
            Err(error) => Err(error),
        }
    }
}

/// The failure of `payment`'s refund, first attempt.
fn not_refunded(
    payment: &Payment,
    charge_id: Option<&str>,
    reason: String,
    manual: bool,
) -> PaymentRefundFailed {
    PaymentRefundFailed {
        order_id: payment.order_id,
        amount_cents: payment.amount_cents,
        charge_id: charge_id.map(str::to_owned),
        reason,
        manual,
        attempt: payment.refund_attempt.max(1),
    }
}

enum Ahead {
    Duplicate,
    /// The order's payment here, if any.
    Payment(Option<Box<Payment>>),
}

/// Guard 1, read ahead outside any transaction: a shortcut, which the transaction checks
/// again with the payment locked.
pub const READ_AHEAD: &str = "SELECT EXISTS (SELECT 1 FROM processed_events WHERE event_id = $1)";

async fn read_ahead(
    client: &deadpool_postgres::Client,
    event: &Envelope,
    order_id: Uuid,
) -> Result<Ahead, HandlerError> {
    let seen: bool = client
        .query_one(&client.prepare_cached(READ_AHEAD).await?, &[&event.id])
        .await?
        .get(0);
    if seen {
        return Ok(Ahead::Duplicate);
    }
    Ok(Ahead::Payment(
        Payment::find(client, order_id).await?.map(Box::new),
    ))
}

/// The order's charge at the provider that succeeded, if any, as its list shows it: only
/// for [`failpoint::LIST_DECIDES`], which restores the decision this list cannot make
/// (it does not show a charge still committing).
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

/// A declined payment's cancellation answered: nothing to refund.
pub const RECORD_ANSWERED: &str = "UPDATE payments SET answered_at = now() WHERE order_id = $1";

/// A charge read as never made ([`failpoint::LIST_DECIDES`] only): its intent voided.
pub const VOID_INTENT: &str = "
    UPDATE payments SET status = 'voided', answered_at = now(), updated_at = now()
     WHERE order_id = $1 AND status IN ('charging', 'unknown')";

/// The payment of an order cancelled before any charge was asked for: the tombstone
/// (`voided`). The insert is the lock, as a charge's intent is: an intent committing
/// meanwhile makes it insert nothing.
pub const INSERT_VOIDED: &str = "
    INSERT INTO payments (order_id, event_id, status, amount_cents, answered_at)
    VALUES ($1, $2, 'voided', $3, now())
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
    let order = &found.order;
    let stale = |what: &str| {
        Err(HandlerError::Stale(format!(
            "order {}: {what} while its cancellation was prepared",
            order.order_id
        )))
    };
    // Guard 2: what stands for the order now, locked.
    let Some(payment) = Payment::lock(tx, order.order_id).await? else {
        if !matches!(found.money, Money::NothingCharged) || found.resolved.is_some() {
            return stale("its payment vanished");
        }
        return tombstone(tx, topics, event, order).await;
    };
    if payment.answered {
        // Answered before: this cancellation delivered again after its id left the
        // inbox, or a copy with the other id order-service gives cancellations.
        return Ok(Outcome::Guarded);
    }
    let mut state = payment.state;
    match (&found.resolved, state.undecided()) {
        (Some(Resolved::Replayed(answer)), true) => {
            let order_of = (payment.order_id, payment.amount_cents);
            payment::record_charge(tx, topics, &payment.event_id, order_of, answer).await?;
            state = match answer {
                Answer::Charged { .. } => ChargeState::Succeeded,
                Answer::Declined { .. } => ChargeState::Failed,
            };
        }
        (Some(Resolved::NothingListed), true) => {
            tx.execute(&tx.prepare_cached(VOID_INTENT).await?, &[&order.order_id])
                .await?;
            state = ChargeState::Voided;
        }
        // Left for a person, its failure recorded below.
        (Some(Resolved::Undecidable(_)), true) => {}
        // Decided meanwhile by its own transaction: the same answer, under the same key.
        (Some(_), false) => {}
        (None, true) => return stale("a charge was asked for"),
        (None, false) => {}
    }
    let caused_by = Some(event.id.as_str());
    let answered = match &found.money {
        Money::Refunded { charge, refund } => {
            if payment
                .charge_id
                .as_deref()
                .is_some_and(|id| id != charge.charge_id)
            {
                return stale("another charge was recorded");
            }
            refund::record_refunded(tx, topics, order.order_id, charge, refund, caused_by).await?
        }
        Money::NotRefunded(failed) => {
            refund::record_not_refunded(tx, topics, failed, caused_by).await?
        }
        Money::NothingCharged if state == ChargeState::Succeeded => {
            return stale("a charge was recorded");
        }
        Money::NothingCharged => {
            tx.execute(
                &tx.prepare_cached(RECORD_ANSWERED).await?,
                &[&order.order_id],
            )
            .await?;
            enqueue_voided(tx, topics, event, order, "declined").await?;
            true
        }
        Money::AnsweredBefore => return stale("its answer was undone"),
    };
    Ok(if answered {
        Outcome::Applied
    } else {
        Outcome::Guarded
    })
}

/// The payment of an order cancelled before any was recorded here: the tombstone, and
/// `payment.voided`.
async fn tombstone(
    tx: &Transaction<'_>,
    topics: &Topics,
    event: &Envelope,
    order: &OrderOutcome,
) -> Result<Outcome, HandlerError> {
    let inserted = tx
        .execute(
            &tx.prepare_cached(INSERT_VOIDED).await?,
            &[&order.order_id, &event.id, &order.amount_cents],
        )
        .await?;
    if inserted == 0 {
        return Err(HandlerError::Stale(format!(
            "order {}: a charge was asked for while its cancellation was prepared",
            order.order_id
        )));
    }
    enqueue_voided(tx, topics, event, order, "not_charged").await?;
    Ok(Outcome::Applied)
}

/// `payment.voided`, answering the cancellation `event`: nothing was charged `because`.
async fn enqueue_voided(
    tx: &Transaction<'_>,
    topics: &Topics,
    event: &Envelope,
    order: &OrderOutcome,
    because: &str,
) -> Result<(), HandlerError> {
    outbox::enqueue(
        tx,
        &NewEvent {
            event_id: &events::voided_id(&event.id),
            topic: &topics.payments,
            key: &order.order_id.to_string(),
            event_type: events::PAYMENT_VOIDED,
            payload: &PaymentVoided {
                order_id: order.order_id,
                reason: because.to_owned(),
            },
            caused_by: Some(&event.id),
        },
    )
    .await?;
    Ok(())
}
