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
use saga::outbox::{self, NewEvent};
use saga::{Envelope, Handler, HandlerError, Outcome, Topics};

pub struct NotifyCustomer {
    pool: Pool,
    topics: Topics,
}

impl NotifyCustomer {
    pub fn new(pool: Pool, topics: Topics) -> Self {
        Self { pool, topics }
    }
}

impl Handler for NotifyCustomer {
    async fn handle(&self, event: &Envelope) -> Result<Outcome, HandlerError> {
        let confirmed = match event.event_type.as_str() {
            events::ORDER_CONFIRMED => true,
            events::ORDER_CANCELLED => false,
            // The saga's start shares the topic; it is payment-service's.
            events::ORDER_CREATED => return Ok(Outcome::Ignored),
            other => {
                return Err(HandlerError::rejected(format!(
                    "unknown event type `{other}` on the orders topic"
                )));
            }
        };
        let outcome: OrderOutcome = event.payload()?;
        event.check_aggregate(outcome.order_id)?;
        notify_customer(&self.pool, &self.topics, event, &outcome, confirmed).await
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

#[tracing::instrument(skip_all, fields(order_id = %outcome.order_id, event_id = %event.id))]
pub async fn notify_customer(
    pool: &Pool,
    topics: &Topics,
    event: &Envelope,
    outcome: &OrderOutcome,
    confirmed: bool,
) -> Result<Outcome, HandlerError> {
    let text = message(outcome, confirmed);
    let mut client = pool.get().await?;
    // Each statement is prepared once per pooled connection (`prepare_cached`), not on
    // every call: parsing and planning it again, and the extra round trip that takes,
    // cost more than running it.
    let tx = client.transaction().await?;

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
        tx.commit().await?;
        return Ok(Outcome::Duplicate);
    }

    // Guard 2: has this customer been told about this order already?
    let inserted = tx
        .execute(
            &tx.prepare_cached(
                "INSERT INTO notifications (order_id, event_id, customer_id, outcome, message)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (order_id) DO NOTHING",
            )
            .await?,
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
        tx.commit().await?;
        return Ok(Outcome::Guarded);
    }

    let notification_id = events::notification_id(&event.id);
    let order_key = outcome.order_id.to_string();
    outbox::enqueue(
        &tx,
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
        },
    )
    .await?;
    saga::failpoint::crash_point(saga::failpoint::HANDLER_BEFORE_COMMIT);
    tx.commit().await?;
    Ok(Outcome::Applied)
}
