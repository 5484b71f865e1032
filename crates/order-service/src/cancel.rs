//! Cancelling an order that its payment did not: the customer's `POST
//! /v1/orders/{id}/cancel`, and the deadline's sweep of orders that never settle. Both go
//! the same way: in one transaction, the order locked, moved to `cancelled`, and its
//! `order.cancelled` enqueued with the id `<order id>:cancel`.
//!
//! A cancellation moves the saga forward, never back: a confirmed order's charge stays
//! made, and payment-service answers the cancellation with a refund, a new transaction
//! at the provider. Until it answers, the order is in flight again (`settled_at` is
//! cleared), so admission control counts it. An order cancelled already, for any reason,
//! stays as it is: there is one cancellation per order.
//!
//! A payment result that arrives after the cancellation (the charge landed late) is
//! stopped at guard 2 in ApplyPaymentResult, as any result for a decided order is. That
//! is safe now, where it would once have lost a charge: payment-service reads the same
//! cancellation, and refunds whatever charge it finds standing for the order.

use axum::http::StatusCode;
use deadpool_postgres::Pool;
use saga::events::{self, OrderOutcome};
use saga::outbox::{self, NewEvent};
use saga::{LocalRelay, Topics, Transaction};
use std::time::Duration;
use uuid::Uuid;

use crate::orders::{self, Keyed, Order, OrderStatus, PlaceOrderError, Placed, RefundState};

/// What [`cancel_order`] did.
#[derive(Debug)]
pub enum Cancelled {
    /// Cancelled now (`202`): the order as it is now, and the body sent.
    Now { order: Order, body: String },
    /// Cancelled before, for any reason (`200`): nothing changed.
    Already { order: Order, body: String },
    /// The key's first request answered this, as first sent.
    Replayed {
        order_id: Uuid,
        status: u16,
        body: String,
    },
}

/// The status of an order cancelled by the request.
pub const ACCEPTED: StatusCode = StatusCode::ACCEPTED;
/// The status of an order found cancelled already.
pub const ALREADY: StatusCode = StatusCode::OK;

#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    #[error("no order {0}")]
    NotFound(Uuid),
    /// What claiming the request's key can fail with (never an unknown product).
    #[error(transparent)]
    Key(PlaceOrderError),
}

impl From<tokio_postgres::Error> for CancelError {
    fn from(error: tokio_postgres::Error) -> Self {
        CancelError::Key(error.into())
    }
}

impl From<deadpool_postgres::PoolError> for CancelError {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        CancelError::Key(error.into())
    }
}

/// Locks the order a cancellation is for, and reads what its answer shows.
pub const LOCK_ORDER: &str = "
    SELECT customer_id, status, amount_cents, cancel_reason, refund_id, refund_failure,
           settled_at IS NOT NULL AS settled, created_at, updated_at
      FROM orders WHERE id = $1 FOR UPDATE";

/// The cancellation itself: in flight again until payment-service answers it.
pub const CANCEL: &str = "
    UPDATE orders
       SET status = 'cancelled', cancel_reason = $2, settled_at = NULL, updated_at = now()
     WHERE id = $1
    RETURNING now() AS updated_at";

/// Cancels `order_id` at the customer's request (`keyed`: the request's key, if it came
/// with one), in one transaction with its `order.cancelled` and the key.
///
/// The order is locked first: its state decides the answer, and the answer is what the
/// key stores. Two requests with one key queue on the order's lock; the second finds
/// the order cancelled and the key claimed, and replays the first one's answer.
pub async fn cancel_order(
    pool: &Pool,
    relay: Option<&LocalRelay>,
    topics: &Topics,
    order_id: Uuid,
    keyed: Option<Keyed<'_>>,
) -> Result<Cancelled, CancelError> {
    let client = pool.get().await?;
    let tx = Transaction::begin(&client).waking(relay);
    let Some(row) = tx
        .query_opt(&tx.prepare_cached(LOCK_ORDER).await?, &[&order_id])
        .await?
    else {
        return Err(CancelError::NotFound(order_id));
    };
    let items = tx
        .query(&tx.prepare_cached(orders::ITEMS).await?, &[&order_id])
        .await?;
    let mut order = orders::order_from_rows(order_id, &row, &items);
    let already = order.status == OrderStatus::Cancelled;
    if !already {
        let reason = events::CANCELLED_BY_CUSTOMER;
        order.updated_at = tx
            .query_one(&tx.prepare_cached(CANCEL).await?, &[&order_id, &reason])
            .await?
            .get("updated_at");
        order.status = OrderStatus::Cancelled;
        order.cancel_reason = Some(reason.to_owned());
        order.refund = RefundState::of(OrderStatus::Cancelled, None, false, false);
        let (customer, amount) = (&order.customer_id, order.amount_cents);
        enqueue(&tx, topics, order_id, customer, amount, reason).await?;
    }
    let (status, body) = (
        if already { ALREADY } else { ACCEPTED },
        serde_json::to_string(&order).expect("an order serializes"),
    );
    if let Some(keyed) = &keyed
        && let Some(Placed::Replayed {
            order_id,
            status,
            body,
        }) = orders::claim_key(&tx, keyed, order_id, status, &body)
            .await
            .map_err(CancelError::Key)?
    {
        // Dropped, so rolled back: the first request's cancellation is the one.
        return Ok(Cancelled::Replayed {
            order_id,
            status,
            body,
        });
    }
    tx.commit().await?;
    Ok(if already {
        Cancelled::Already { order, body }
    } else {
        Cancelled::Now { order, body }
    })
}

/// The `order.cancelled` of a cancellation by the customer or the deadline.
async fn enqueue(
    tx: &Transaction<'_>,
    topics: &Topics,
    order_id: Uuid,
    customer_id: &str,
    amount_cents: i64,
    reason: &str,
) -> Result<(), tokio_postgres::Error> {
    outbox::enqueue(
        tx,
        &NewEvent {
            event_id: &events::cancellation_id(order_id),
            topic: &topics.orders,
            key: &order_id.to_string(),
            event_type: events::ORDER_CANCELLED,
            payload: &OrderOutcome {
                order_id,
                customer_id: customer_id.to_owned(),
                amount_cents,
                reason: Some(reason.to_owned()),
            },
            caused_by: None,
        },
    )
    .await
}

/// Cancels, for taking too long, up to `limit` orders still `pending` `timeout` after they
/// were placed, oldest first. Each row is locked by the update and changed only if still
/// pending then: an order confirmed meanwhile is left as it is, and an order another
/// sweep holds is skipped (`SKIP LOCKED`), so sweeps at once never wait on each other nor
/// cancel an order twice.
pub const CANCEL_OVERDUE: &str = "
    UPDATE orders
       SET status = 'cancelled', cancel_reason = $3, settled_at = NULL, updated_at = now()
     WHERE id IN (SELECT id FROM orders
                   WHERE status = 'pending' AND created_at < now() - make_interval(secs => $1)
                   ORDER BY created_at LIMIT $2
                   FOR UPDATE SKIP LOCKED)
       AND status = 'pending'
    RETURNING id, customer_id, amount_cents";

/// One sweep of the deadline: the overdue orders it cancelled, in one transaction with
/// their `order.cancelled`.
pub async fn cancel_overdue(
    pool: &Pool,
    relay: Option<&LocalRelay>,
    topics: &Topics,
    timeout: Duration,
    limit: i64,
) -> Result<Vec<Uuid>, CancelError> {
    let client = pool.get().await?;
    let tx = Transaction::begin(&client).waking(relay);
    let rows = tx
        .query(
            &tx.prepare_cached(CANCEL_OVERDUE).await?,
            &[
                &timeout.as_secs_f64(),
                &limit,
                &events::CANCELLED_FOR_TIMEOUT,
            ],
        )
        .await?;
    let mut cancelled = Vec::with_capacity(rows.len());
    for row in &rows {
        let order_id: Uuid = row.get("id");
        enqueue(
            &tx,
            topics,
            order_id,
            row.get("customer_id"),
            row.get("amount_cents"),
            events::CANCELLED_FOR_TIMEOUT,
        )
        .await?;
        cancelled.push(order_id);
    }
    tx.commit().await?;
    Ok(cancelled)
}
