//! NotifyCustomer: one notification per order, on its decided outcome.
//!
//! In one transaction:
//! 1. **Dedupe.** The outcome event's id goes into `processed_events`; a redelivery stops
//!    here.
//! 2. **State.** The notification row is the aggregate and this event creates it, so the
//!    insert is the lock: `INSERT … ON CONFLICT (order_id) DO NOTHING` makes a concurrent
//!    transaction for the same order wait on the primary key, then insert nothing. Zero
//!    rows: this customer was already told about this order; stop.
//! 3. Enqueue `notification.sent` with id `<outcome event id>:notification`.

use deadpool_postgres::Pool;
use saga::events::{self, NotificationSent, OrderOutcome};
use saga::inbox;
use saga::outbox::{self, NewEvent};
use saga::{Envelope, Handler, HandlerError, Outcome, Step, Topics, Transaction};

pub struct NotifyCustomer {
    topics: Topics,
}

impl NotifyCustomer {
    pub fn new(topics: Topics) -> Self {
        Self { topics }
    }
}

impl Handler for NotifyCustomer {
    /// The decided outcome, and whether it is a confirmation.
    type Command = (OrderOutcome, bool);
    type Prepared = Self::Command;

    fn decode(&self, event: &Envelope) -> Result<Option<Self::Command>, HandlerError> {
        let confirmed = match event.event_type.as_str() {
            events::ORDER_CONFIRMED => true,
            events::ORDER_CANCELLED => false,
            // The saga's start shares the topic; it is payment-service's.
            events::ORDER_CREATED => return Ok(None),
            other => {
                return Err(HandlerError::rejected(format!(
                    "unknown event type `{other}` on the orders topic"
                )));
            }
        };
        let outcome: OrderOutcome = event.payload()?;
        event.check_aggregate(outcome.order_id)?;
        Ok(Some((outcome, confirmed)))
    }

    /// Nothing leaves the database: the message is an outbox row.
    async fn prepare(
        &self,
        _: &Pool,
        _: &Envelope,
        command: Self::Command,
    ) -> Result<Step<Self::Command>, HandlerError> {
        Ok(Step::Apply(command))
    }

    async fn apply(
        &self,
        tx: &Transaction<'_>,
        event: &Envelope,
        (outcome, confirmed): Self::Command,
    ) -> Result<Outcome, HandlerError> {
        notify_customer(tx, &self.topics, event, &outcome, confirmed).await
    }
}

/// What the customer reads.
pub fn message(outcome: &OrderOutcome, confirmed: bool) -> String {
    let amount = format!(
        "{}.{:02}",
        outcome.amount_cents / 100,
        outcome.amount_cents % 100
    );
    if confirmed {
        format!(
            "Your order {} is confirmed: {amount} has been charged.",
            outcome.order_id
        )
    } else {
        let reason = outcome.reason.as_deref().unwrap_or("payment failed");
        format!(
            "Your order {} was cancelled ({reason}); you have not been charged.",
            outcome.order_id
        )
    }
}

/// Guard 2, and the state change: the notification row is the lock.
pub const INSERT_NOTIFICATION: &str = "
    INSERT INTO notifications (order_id, event_id, customer_id, outcome, message)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (order_id) DO NOTHING";

/// Tells the customer about `outcome` in `tx`, which the consumer opened and commits when
/// this returns `Ok`, whatever the outcome.
///
/// Its statements are named constants ([`inbox::CLAIM_EVENT`], [`INSERT_NOTIFICATION`],
/// the outbox's), each prepared once per pooled connection: the benchmark's `notify`
/// script runs the same constants, in this order, as the ceiling it measures the service
/// against (`crates/bench/src/sql/transactions.rs`).
#[tracing::instrument(skip_all, fields(order_id = %outcome.order_id, event_id = %event.id))]
pub async fn notify_customer(
    tx: &Transaction<'_>,
    topics: &Topics,
    event: &Envelope,
    outcome: &OrderOutcome,
    confirmed: bool,
) -> Result<Outcome, HandlerError> {
    let text = message(outcome, confirmed);
    // Guard 1: have we handled this very event before?
    if !inbox::claim(tx, event).await? {
        return Ok(Outcome::Duplicate);
    }

    // Guard 2: has this customer been told about this order already?
    let inserted = tx
        .execute(
            &tx.prepare_cached(INSERT_NOTIFICATION).await?,
            &[
                &outcome.order_id,
                &event.id,
                &outcome.customer_id,
                &if confirmed { "confirmed" } else { "cancelled" },
                &text,
            ],
        )
        .await?;
    if inserted == 0 {
        return Ok(Outcome::Guarded);
    }

    let notification_id = events::notification_id(&event.id);
    let order_key = outcome.order_id.to_string();
    outbox::enqueue(
        tx,
        &NewEvent {
            event_id: &notification_id,
            topic: &topics.notifications,
            key: &order_key,
            event_type: events::NOTIFICATION_SENT,
            payload: &NotificationSent {
                order_id: outcome.order_id,
                customer_id: outcome.customer_id.clone(),
                message: text,
            },
            caused_by: Some(&event.id),
        },
    )
    .await?;
    Ok(Outcome::Applied)
}
