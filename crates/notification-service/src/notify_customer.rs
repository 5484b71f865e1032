//! NotifyCustomer: one notification per order and kind of news: its confirmation, its
//! payment declined, its cancellation (by the customer, or for taking too long), its
//! refund.
//!
//! In one transaction:
//! 1. **Dedupe.** The order event's id goes into `processed_events`; a redelivery stops
//!    here.
//! 2. **State.** The notification row is the aggregate and this event creates it, so the
//!    insert is the lock: `INSERT … ON CONFLICT (order_id, news) DO NOTHING` makes a
//!    concurrent transaction for the same order and news wait on the primary key, then
//!    insert nothing. The kinds are three pieces of news: the outcome (confirmed or
//!    declined), the cancellation (by the customer or the deadline), the refund. Zero
//!    rows: this customer had this news of this order already (a contradicting outcome is
//!    no news either); stop.
//! 3. Enqueue `notification.sent` with id `<order event id>:notification`.
//!
//! A cancellation is news only with an id order-service gives one
//! ([`events::is_order_services_cancellation`]): any other `order.cancelled` on the topic
//! is not the order's state, and telling the customer their order was cancelled when
//! order-service says it was not would be the one message they should never get.

use deadpool_postgres::Pool;
use saga::events::{self, NotificationSent, OrderOutcome, OrderRefunded};
use saga::inbox;
use saga::outbox::{self, NewEvent};
use saga::{Envelope, Handler, HandlerError, Outcome, Step, Topics, Transaction};
use uuid::Uuid;

pub struct NotifyCustomer {
    topics: Topics,
}

impl NotifyCustomer {
    pub fn new(topics: Topics) -> Self {
        Self { topics }
    }
}

/// What the customer is told: one of each per order at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Confirmed,
    /// Cancelled because the payment failed.
    Declined,
    CancelledByCustomer,
    CancelledForTimeout,
    Refunded,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Confirmed => "confirmed",
            Kind::Declined => "declined",
            Kind::CancelledByCustomer => "cancelled_by_customer",
            Kind::CancelledForTimeout => "cancelled_for_timeout",
            Kind::Refunded => "refunded",
        }
    }
}

/// A notification to record: whom, about which order, what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub order_id: Uuid,
    pub customer_id: String,
    pub kind: Kind,
    pub message: String,
}

impl Handler for NotifyCustomer {
    type Command = Notice;
    type Prepared = Notice;

    fn ignores(&self, event_type: &str) -> bool {
        // The saga's start shares the topic; it is payment-service's.
        event_type == events::ORDER_CREATED
    }

    fn decode(&self, event: &Envelope) -> Result<Option<Notice>, HandlerError> {
        let notice = match event.event_type.as_str() {
            events::ORDER_CONFIRMED | events::ORDER_CANCELLED => {
                let outcome: OrderOutcome = event.payload()?;
                event.check_aggregate(outcome.order_id)?;
                if event.event_type == events::ORDER_CANCELLED
                    && !events::is_order_services_cancellation(&event.id, outcome.order_id)
                {
                    return Ok(None);
                }
                outcome_notice(&event.event_type, outcome)
            }
            events::ORDER_REFUNDED => {
                let refunded: OrderRefunded = event.payload()?;
                event.check_aggregate(refunded.order_id)?;
                Notice {
                    order_id: refunded.order_id,
                    message: message(
                        refunded.order_id,
                        refunded.amount_cents,
                        None,
                        Kind::Refunded,
                    ),
                    customer_id: refunded.customer_id,
                    kind: Kind::Refunded,
                }
            }
            other if self.ignores(other) => return Ok(None),
            other => {
                return Err(HandlerError::rejected(format!(
                    "unknown event type `{other}` on the orders topic"
                )));
            }
        };
        Ok(Some(notice))
    }

    /// Nothing leaves the database: the message is an outbox row.
    async fn prepare(
        &self,
        _: &Pool,
        _: &Envelope,
        notice: Notice,
    ) -> Result<Step<Notice>, HandlerError> {
        Ok(Step::Apply(notice))
    }

    async fn apply(
        &self,
        tx: &Transaction<'_>,
        event: &Envelope,
        notice: Notice,
    ) -> Result<Outcome, HandlerError> {
        notify_customer(tx, &self.topics, event, &notice).await
    }
}

/// The notice an `order.confirmed` or `order.cancelled` gives, by its reason.
fn outcome_notice(event_type: &str, outcome: OrderOutcome) -> Notice {
    let kind = match (event_type, outcome.reason.as_deref()) {
        (events::ORDER_CONFIRMED, _) => Kind::Confirmed,
        (_, Some(events::CANCELLED_BY_CUSTOMER)) => Kind::CancelledByCustomer,
        (_, Some(events::CANCELLED_FOR_TIMEOUT)) => Kind::CancelledForTimeout,
        _ => Kind::Declined,
    };
    Notice {
        order_id: outcome.order_id,
        message: message(
            outcome.order_id,
            outcome.amount_cents,
            outcome.reason.as_deref(),
            kind,
        ),
        customer_id: outcome.customer_id,
        kind,
    }
}

/// What the customer reads about `order`, of `amount_cents`: news of `kind`, cancelled
/// for `reason` when its payment was declined.
pub fn message(order: Uuid, amount_cents: i64, reason: Option<&str>, kind: Kind) -> String {
    let amount = format!("{}.{:02}", amount_cents / 100, amount_cents % 100);
    let refund = format!("If your card was charged, the {amount} will be refunded.");
    match kind {
        Kind::Confirmed => format!("Your order {order} is confirmed: {amount} has been charged."),
        Kind::Declined => {
            let reason = reason.unwrap_or("payment failed");
            format!("Your order {order} was cancelled ({reason}); you have not been charged.")
        }
        Kind::CancelledByCustomer => {
            format!("Your order {order} is cancelled, as you asked. {refund}")
        }
        Kind::CancelledForTimeout => {
            format!("Your order {order} was cancelled: its payment took too long. {refund}")
        }
        Kind::Refunded => format!("The {amount} charged for your order {order} has been refunded."),
    }
}

/// Guard 2, and the state change: the notification row is the lock. One per order and
/// piece of news (`news`, from the kind: the outcome, the cancellation, the refund).
pub const INSERT_NOTIFICATION: &str = "
    INSERT INTO notifications (order_id, event_id, customer_id, kind, message)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (order_id, news) DO NOTHING";

/// Tells the customer `notice` in `tx`, which the consumer opened and commits when this
/// returns `Ok`, whatever the outcome.
///
/// Its statements are named constants ([`inbox::CLAIM_EVENT`], [`INSERT_NOTIFICATION`],
/// the outbox's), each prepared once per pooled connection: the benchmark's `notify`
/// script runs the same constants, in this order, as the ceiling it measures the service
/// against (`crates/bench/src/sql/transactions.rs`).
#[tracing::instrument(skip_all, fields(order_id = %notice.order_id, event_id = %event.id))]
pub async fn notify_customer(
    tx: &Transaction<'_>,
    topics: &Topics,
    event: &Envelope,
    notice: &Notice,
) -> Result<Outcome, HandlerError> {
    // Guard 1: have we handled this very event before?
    if !inbox::claim(tx, event).await? {
        return Ok(Outcome::Duplicate);
    }

    // Guard 2: has this customer had this news of this order already?
    let inserted = tx
        .execute(
            &tx.prepare_cached(INSERT_NOTIFICATION).await?,
            &[
                &notice.order_id,
                &event.id,
                &notice.customer_id,
                &notice.kind.as_str(),
                &notice.message,
            ],
        )
        .await?;
    if inserted == 0 {
        return Ok(Outcome::Guarded);
    }

    let notification_id = events::notification_id(&event.id);
    let order_key = notice.order_id.to_string();
    outbox::enqueue(
        tx,
        &NewEvent {
            event_id: &notification_id,
            topic: &topics.notifications,
            key: &order_key,
            event_type: events::NOTIFICATION_SENT,
            payload: &NotificationSent {
                order_id: notice.order_id,
                customer_id: notice.customer_id.clone(),
                message: notice.message.clone(),
            },
            caused_by: Some(&event.id),
        },
    )
    .await?;
    Ok(Outcome::Applied)
}
