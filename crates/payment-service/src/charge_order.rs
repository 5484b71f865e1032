//! ChargeOrder: one charge per order at the card provider, one payment per order here,
//! whatever `orders` redelivers and whatever the provider's answers lose.
//!
//! The charge is a call to another system, which no rollback of ours can undo, so it
//! happens *before* the transaction ([`Handler::prepare`]), and only after its intent is
//! committed ([`crate::payment`]):
//! 0. **Intent.** One autocommitted statement ([`INTENT_TO_CHARGE`]) reads guard 1 ahead
//!    (is the event in the inbox?) and inserts the order's payment `charging`, with the
//!    charge's key, unless the order has a payment. Only an intent this event wrote, now
//!    or on an earlier delivery, is followed by a call: a duplicate, an order charged,
//!    being charged for another `order.created`, or cancelled (its tombstone holds the
//!    key), makes none. The call asks with the idempotency key `<order id>:charge`
//!    ([`charge_key`]): every redelivery, every retry after a timeout or a lost answer,
//!    every instance that takes the partition over, asks with that same key, so the
//!    provider charges once and answers every later call with the first charge. A call
//!    that gets no answer leaves the payment `unknown`, and is made again.
//!
//! Then, in one transaction:
//! 1. **Dedupe.** The `order.created` id goes into `processed_events`; a redelivery stops
//!    here.
//! 2. **State.** The answer is recorded over the intent ([`payment::RECORD_CHARGE`]): the
//!    update locks the payment, and updates nothing if the charge was decided meanwhile
//!    (a cancellation that resolved it first): guarded.
//! 3. With it, `payment.succeeded` / `payment.failed` (with the provider's decline
//!    reason) is enqueued with id `<order.created id>:payment`, so a redelivered
//!    `order.created` can only ever produce the same result event.

use deadpool_postgres::Pool;
use saga::events::{self, OrderCreated};
use saga::inbox;
use saga::{Envelope, Handler, HandlerError, Outcome, Step, Topics, Transaction, failpoint};
use uuid::Uuid;

use crate::payment::{self, CURRENCY, ChargeState, Payment, charge_key};
use crate::provider::{Answer, ChargeRequest, Provider};

pub struct ChargeOrder {
    topics: Topics,
    provider: Provider,
}

impl ChargeOrder {
    pub fn new(topics: Topics, provider: Provider) -> Self {
        Self { topics, provider }
    }
}

/// What [`ChargeOrder::prepare`] learnt, for the transaction.
#[derive(Debug)]
pub enum Charge {
    /// The provider's answer about this order, under the key of this event's intent.
    Answered { order: OrderCreated, answer: Answer },
    /// The order had a payment, or another event's intent, before this event: nothing
    /// was asked.
    AlreadyCharged,
}

impl Handler for ChargeOrder {
    type Command = OrderCreated;
    type Prepared = Charge;

    fn ignores(&self, event_type: &str) -> bool {
        // The saga's outcomes share the topic: notification-service's, and a
        // cancellation RefundOrder's.
        matches!(
            event_type,
            events::ORDER_CONFIRMED | events::ORDER_CANCELLED | events::ORDER_REFUNDED
        )
    }

    fn decode(&self, event: &Envelope) -> Result<Option<OrderCreated>, HandlerError> {
        match event.event_type.as_str() {
            events::ORDER_CREATED => {}
            other if self.ignores(other) => return Ok(None),
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

    async fn prepare(
        &self,
        pool: &Pool,
        event: &Envelope,
        order: OrderCreated,
    ) -> Result<Step<Charge>, HandlerError> {
        let client = pool.get().await?;
        let key = match intend(&client, event, &order, self.provider.key_ttl).await? {
            Intent::Duplicate => return Ok(Step::Done(Outcome::Duplicate)),
            Intent::NotOurs => return Ok(Step::Apply(Charge::AlreadyCharged)),
            Intent::Ours { key } => key,
        };
        // Asked outside any transaction, holding no connection while it waits.
        drop(client);
        let key = if failpoint::fires(failpoint::FRESH_CHARGE_KEY) {
            format!("{key}:{}", Uuid::new_v4())
        } else {
            key
        };
        let request = ChargeRequest {
            amount_cents: order.amount_cents,
            currency: CURRENCY,
            reference: order.order_id.to_string(),
        };
        let answer = match self.provider.charge(&key, &request).await {
            Ok(answer) => answer,
            Err(error @ HandlerError::Unavailable(_)) => {
                let mark = payment::MARK_CHARGE_UNKNOWN;
                return Err(payment::unanswered(pool, order.order_id, mark, error).await);
            }
            Err(error) => return Err(error),
        };
        tracing::info!(order_id = %order.order_id, idempotency_key = key, ?answer, "provider answered");
        Ok(Step::Apply(Charge::Answered { order, answer }))
    }

    async fn apply(
        &self,
        tx: &Transaction<'_>,
        event: &Envelope,
        charge: Charge,
    ) -> Result<Outcome, HandlerError> {
        let answered = match &charge {
            Charge::Answered { order, answer } => Some((order, answer)),
            Charge::AlreadyCharged => None,
        };
        charge_order(tx, &self.topics, event, answered).await
    }
}

/// What [`INTENT_TO_CHARGE`] found.
enum Intent {
    /// Guard 1, read ahead: the event was applied.
    Duplicate,
    /// The order's payment is this event's intent, new or from an earlier delivery whose
    /// charge is undecided: the charge is asked for, under `key`.
    Ours { key: String },
    /// The order has a payment that is not this event's undecided intent: no call.
    NotOurs,
}

/// Guard 1 read ahead, and the charge's intent: the order's payment inserted `charging`
/// with its key, unless the event is in the inbox or the order has a payment; then the
/// payment that stood. One autocommitted statement, so the intent is committed before
/// the call it names. The final `SELECT` sees the payment as it stood before the insert
/// (one snapshot): `intended` says the insert made it.
pub const INTENT_TO_CHARGE: &str = "
    WITH seen AS (
        SELECT EXISTS (SELECT 1 FROM processed_events WHERE event_id = $1) AS seen
    ), intent AS (
        INSERT INTO payments (order_id, event_id, status, amount_cents, charge_key)
        SELECT $2, $1, 'charging', $3, $4 FROM seen WHERE NOT seen.seen
        ON CONFLICT (order_id) DO NOTHING
        RETURNING 1
    )
    SELECT seen.seen, EXISTS (SELECT 1 FROM intent) AS intended,
           p.event_id, p.status, p.charge_key,
           greatest(extract(epoch FROM now() - p.created_at), 0)::float8 AS age
      FROM seen LEFT JOIN payments p ON p.order_id = $2";

/// The intent this event may follow with a call. An undecided intent of its own older
/// than the provider's key lifetime (`key_ttl`) is not asked again: the provider may have
/// forgotten the key, and the same request could charge a second time. The event is
/// rejected, the payment left `unknown` and escalated, for the order's cancellation (its
/// deadline's, if no one else's) to leave it to a person.
async fn intend(
    client: &deadpool_postgres::Client,
    event: &Envelope,
    order: &OrderCreated,
    key_ttl: std::time::Duration,
) -> Result<Intent, HandlerError> {
    let key = charge_key(order.order_id);
    let row = client
        .query_one(
            &client.prepare_cached(INTENT_TO_CHARGE).await?,
            &[&event.id, &order.order_id, &order.amount_cents, &key],
        )
        .await?;
    if row.get("seen") {
        return Ok(Intent::Duplicate);
    }
    if row.get("intended") {
        return Ok(Intent::Ours { key });
    }
    let standing = match row.get::<_, Option<&str>>("status") {
        Some(status) => Standing {
            event_id: row.get("event_id"),
            state: ChargeState::parse(status),
            charge_key: row.get("charge_key"),
            age: row.get("age"),
        },
        // The insert met a payment committed after the statement's snapshot was taken
        // (a copy of this very event writing its intent, say), which the snapshot cannot
        // show: read it now.
        None => match Payment::find(client, order.order_id).await? {
            Some(payment) => Standing {
                event_id: payment.event_id,
                state: payment.state,
                charge_key: payment.charge_key,
                age: payment.age.as_secs_f64(),
            },
            None => {
                return Err(HandlerError::Stale(format!(
                    "order {}: its payment was neither written nor found",
                    order.order_id
                )));
            }
        },
    };
    let ours = standing.event_id == event.id && standing.state.undecided();
    if ours && standing.age >= key_ttl.as_secs_f64() {
        return Err(HandlerError::rejected(format!(
            "order {}: its charge has had no answer for {:.0} s, past the provider's key lifetime (PROVIDER_KEY_TTL {key_ttl:?}): asking again could charge twice",
            order.order_id, standing.age
        )));
    }
    Ok(if ours {
        Intent::Ours {
            key: standing.charge_key.unwrap_or(key),
        }
    } else {
        Intent::NotOurs
    })
}

/// The payment an intent found standing in its place.
struct Standing {
    event_id: String,
    state: ChargeState,
    charge_key: Option<String>,
    /// Seconds since it was written.
    age: f64,
}

/// Records the provider's `answer` about `order` (`None`: the order was found charged
/// before any call) in `tx`, which the consumer opened and commits when this returns
/// `Ok`, whatever the outcome.
///
/// Its statements are named constants ([`inbox::CLAIM_EVENT`], [`INSERT_PAYMENT`], the
/// outbox's), each prepared once per pooled connection: the benchmark's `charge` script
/// runs the same constants, in this order, as the ceiling it measures the service against
/// (`crates/bench/src/sql/transactions.rs`).
#[tracing::instrument(skip_all, fields(event_id = %event.id))]
pub async fn charge_order(
    tx: &Transaction<'_>,
    topics: &Topics,
    event: &Envelope,
    answered: Option<(&OrderCreated, &Answer)>,
) -> Result<Outcome, HandlerError> {
    // Guard 1: have we handled this very event before?
    if !inbox::claim(tx, event).await? {
        return Ok(Outcome::Duplicate);
    }
    // Nothing was asked: the order's payment was someone else's, or decided, already.
    let Some((order, answer)) = answered else {
        return Ok(Outcome::Guarded);
    };
    // Guard 2 and the state change: the answer over the intent, unless decided meanwhile.
    if !payment::record_charge(
        tx,
        topics,
        &event.id,
        (order.order_id, order.amount_cents),
        answer,
    )
    .await?
    {
        return Ok(Outcome::Guarded);
    }
    Ok(Outcome::Applied)
}
