//! The order aggregate: placing an order (with its `order.created` event, and its
//! idempotency key if the client sent one) and reading one.

use std::time::Duration;

use axum::http::StatusCode;
use deadpool_postgres::Pool;
use saga::events::{self, OrderCreated, OrderItem};
use saga::idempotency::{Fingerprint, IdempotencyKey};
use saga::outbox::{self, NewEvent};
use saga::transaction::Param;
use saga::{LocalRelay, Topics, Transaction};
use serde::Serialize;
use time::OffsetDateTime;
use tokio_postgres::error::SqlState;
use uuid::Uuid;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OrderStatus {
    Pending,
    Confirmed,
    Cancelled,
}

impl OrderStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Pending => "pending",
            OrderStatus::Confirmed => "confirmed",
            OrderStatus::Cancelled => "cancelled",
        }
    }

    /// The status column holds only these three (a CHECK constraint says so).
    pub fn from_db(status: &str) -> Self {
        match status {
            "pending" => OrderStatus::Pending,
            "confirmed" => OrderStatus::Confirmed,
            "cancelled" => OrderStatus::Cancelled,
            other => unreachable!("orders.status is constrained, found {other:?}"),
        }
    }

    /// Confirmed and cancelled are final: the saga never moves an order out of them.
    pub fn is_terminal(self) -> bool {
        self != OrderStatus::Pending
    }
}

/// An order as the API shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Order {
    pub id: Uuid,
    pub customer_id: String,
    pub status: OrderStatus,
    pub amount_cents: i64,
    pub items: Vec<OrderItem>,
    /// Why it was cancelled; only on a cancelled order: the payment's decline reason,
    /// `customer` (`POST /v1/orders/{id}/cancel`), or `timeout` (still pending past the
    /// deadline).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancel_reason: Option<String>,
    /// What became of the charge; only on a cancelled order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refund: Option<RefundState>,
    /// Why the refund failed; only while `refund` is `failed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refund_failure: Option<String>,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: OffsetDateTime,
}

/// What became of a cancelled order's charge, as payment-service reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RefundState {
    /// payment-service has not answered the cancellation yet: if the card was charged, a
    /// refund follows.
    Pending,
    /// The charge was refunded.
    Refunded,
    /// Nothing was charged, and nothing will be.
    NotCharged,
    /// The charge stands and could not be refunded: the provider refused the refund, or
    /// no refund could be asked for. `refund_failure` says why; an operator's retry or a
    /// person settles it.
    Failed,
}

impl RefundState {
    /// The state of an order with these columns (`failed`: its `refund_failure` is set).
    pub fn of(
        status: OrderStatus,
        refund_id: Option<&str>,
        failed: bool,
        settled: bool,
    ) -> Option<Self> {
        match (status, refund_id, failed, settled) {
            (OrderStatus::Cancelled, Some(_), _, _) => Some(RefundState::Refunded),
            (OrderStatus::Cancelled, None, true, _) => Some(RefundState::Failed),
            (OrderStatus::Cancelled, None, false, true) => Some(RefundState::NotCharged),
            (OrderStatus::Cancelled, None, false, false) => Some(RefundState::Pending),
            _ => None,
        }
    }
}

/// A line of a new order, already validated for shape.
#[derive(Debug, Clone)]
pub struct NewLine {
    pub product_id: Uuid,
    pub quantity: i32,
}

/// The `Idempotency-Key` a request came with, what a retry must match, and how long the
/// key lives.
#[derive(Debug, Clone, Copy)]
pub struct Keyed<'a> {
    pub key: &'a IdempotencyKey,
    pub fingerprint: Fingerprint,
    /// Older keys are forgotten: the same key is then a new request.
    pub ttl: Duration,
    /// How long to wait for a request holding the same key before giving up on it.
    pub wait: Duration,
}

/// What [`place_order`] did.
#[derive(Debug)]
pub enum Placed {
    /// A new order, and the body of its `201 Created` as it is sent (and stored with the
    /// key, if there was one).
    New { order: Order, body: String },
    /// The key's first request placed `order_id`; this is its answer, as first sent.
    Replayed {
        order_id: Uuid,
        status: u16,
        body: String,
    },
}

/// The status every placed order answers with, stored with its key for the replays.
pub const CREATED: StatusCode = StatusCode::CREATED;

#[derive(Debug, thiserror::Error)]
pub enum PlaceOrderError {
    /// `lines[index]` names a product the catalog does not have.
    #[error("unknown product {product_id}")]
    UnknownProduct { index: usize, product_id: Uuid },
    /// The key was first used with a different request.
    #[error("idempotency key reused with a different request")]
    KeyReused,
    /// A request with the key is still running after [`Keyed::wait`].
    #[error("idempotency key in use by a request still running")]
    KeyInUse,
    #[error(transparent)]
    Database(#[from] tokio_postgres::Error),
    #[error(transparent)]
    Pool(#[from] deadpool_postgres::PoolError),
}

// `place_order`'s statements, in the order it runs them. The benchmark's `create` and
// `create keyed` scripts run these same constants, and the outbox's, as the ceiling it
// measures the endpoint against (`crates/bench/src/sql/transactions.rs`).

/// The catalog's prices of the order's products, and the transaction's start, which is
/// the order's time.
pub const PRICES: &str =
    "SELECT id, price_cents, now() AS placed_at FROM products WHERE id = ANY($1)";

/// How long a request waits for another holding its `Idempotency-Key`.
pub const KEY_WAIT: &str = "SELECT set_config('lock_timeout', $1, true)";

/// Claims the key with the answer this request is about to give; takes over an expired
/// one. No row back: the key was claimed before, by a request now committed.
pub const CLAIM_KEY: &str = "
    INSERT INTO idempotency_keys (key, fingerprint, order_id, response_status, response_body)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (key) DO UPDATE
       SET fingerprint = EXCLUDED.fingerprint, order_id = EXCLUDED.order_id,
           response_status = EXCLUDED.response_status,
           response_body = EXCLUDED.response_body, created_at = now()
     WHERE idempotency_keys.created_at <= now() - make_interval(secs => $6)
    RETURNING key";

/// The answer stored with a key claimed before: a replay reads it back.
pub const STORED_ANSWER: &str = "
    SELECT fingerprint, order_id, response_status, response_body
      FROM idempotency_keys WHERE key = $1";

pub const INSERT_ORDER: &str = "
    INSERT INTO orders (id, customer_id, status, amount_cents, created_at, updated_at)
    VALUES ($1, $2, 'pending', $3, $4, $4)";

/// Every line of the order in one statement: a column of values per field.
pub const INSERT_ITEMS: &str = "
    INSERT INTO order_items (order_id, product_id, quantity, unit_price_cents)
    SELECT $1, * FROM UNNEST($2::uuid[], $3::int[], $4::bigint[])";

/// Places a `pending` order priced from the catalog and, in the same transaction, its
/// `order.created` event, whose id is the order's id.
///
/// With a key, that transaction claims it before writing anything else, the way a
/// consumer's guard 1 claims an event id, and stores with it the answer it is about to
/// give: a key already stored (and not expired) means this request was answered before,
/// and that answer is replayed without placing anything. The key, the order and its event
/// are committed together or not at all: a crash before the commit leaves no key, and
/// the retry places the order.
pub async fn place_order(
    pool: &Pool,
    relay: Option<&LocalRelay>,
    topics: &Topics,
    customer_id: &str,
    lines: &[NewLine],
    keyed: Option<Keyed<'_>>,
) -> Result<Placed, PlaceOrderError> {
    let client = pool.get().await?;
    // Each statement is prepared once per pooled connection, not parsed and planned on
    // every call. The BEGIN goes out with the first statement, and the writes whose
    // result nothing reads with the COMMIT (`Transaction::pipeline`).
    let tx = Transaction::begin(&client).waking(relay);

    let order = price(&tx, customer_id, lines).await?;
    let body = serde_json::to_string(&order).expect("an order serializes");

    if let Some(keyed) = &keyed
        && let Some(replayed) = claim_key(&tx, keyed, order.id, CREATED, &body).await?
    {
        return Ok(replayed);
    }

    tx.pipeline(tx.prepare_cached(INSERT_ORDER).await?, order_row(&order));
    tx.pipeline(tx.prepare_cached(INSERT_ITEMS).await?, item_rows(&order));
    let order_key = order.id.to_string();
    outbox::enqueue(
        &tx,
        &NewEvent {
            event_id: &order_key,
            topic: &topics.orders,
            key: &order_key,
            event_type: events::ORDER_CREATED,
            payload: &order_created(&order),
            caused_by: None,
        },
    )
    .await?;
    saga::failpoint::crash_point(saga::failpoint::API_BEFORE_COMMIT);
    tx.commit().await?;
    Ok(Placed::New { order, body })
}

/// The order `lines` make for `customer_id`, each line priced from the catalog, placed at
/// the transaction's start.
async fn price(
    tx: &Transaction<'_>,
    customer_id: &str,
    lines: &[NewLine],
) -> Result<Order, PlaceOrderError> {
    // `now()` is the transaction's start: the order's time, known before anything is
    // written, so that the answer stored with the key is the one the commit makes true.
    let product_ids: Vec<Uuid> = lines.iter().map(|l| l.product_id).collect();
    let prices = tx
        .query(&tx.prepare_cached(PRICES).await?, &[&product_ids])
        .await?;
    let mut items = Vec::with_capacity(lines.len());
    for (index, line) in lines.iter().enumerate() {
        let price = prices
            .iter()
            .find(|row| row.get::<_, Uuid>("id") == line.product_id)
            .ok_or(PlaceOrderError::UnknownProduct {
                index,
                product_id: line.product_id,
            })?;
        items.push(OrderItem {
            product_id: line.product_id,
            quantity: line.quantity,
            unit_price_cents: price.get("price_cents"),
        });
    }
    let amount_cents: i64 = items
        .iter()
        .map(|i| i.unit_price_cents * i64::from(i.quantity))
        .sum();
    let placed_at: OffsetDateTime = prices[0].get("placed_at");
    Ok(Order {
        id: Uuid::new_v4(),
        customer_id: customer_id.to_owned(),
        status: OrderStatus::Pending,
        amount_cents,
        items,
        cancel_reason: None,
        refund: None,
        refund_failure: None,
        created_at: placed_at,
        updated_at: placed_at,
    })
}

/// Claims `keyed`'s key in `tx` with the answer this request is about to give about
/// `order_id`; `Some` with the stored answer when an earlier request claimed it.
///
/// A second request with the same key blocks on the claim until the first commits (it
/// then sees the key and replays) or rolls back (it then claims the key and does the
/// work itself); lock_timeout bounds that wait.
pub async fn claim_key(
    tx: &Transaction<'_>,
    keyed: &Keyed<'_>,
    order_id: Uuid,
    status: StatusCode,
    body: &str,
) -> Result<Option<Placed>, PlaceOrderError> {
    // Zero would mean no bound, so the shortest wait is a millisecond.
    let wait = format!("{}ms", keyed.wait.as_millis().max(1));
    tx.pipeline(tx.prepare_cached(KEY_WAIT).await?, vec![Box::new(wait)]);
    // An expired key is a new request: its row is taken over, not replayed.
    let claimed = tx
        .query_opt(
            &tx.prepare_cached(CLAIM_KEY).await?,
            &[
                &keyed.key.as_str(),
                &keyed.fingerprint.as_bytes(),
                &order_id,
                &(status.as_u16() as i16),
                &body,
                &keyed.ttl.as_secs_f64(),
            ],
        )
        .await
        .map_err(|error| match error.code() {
            Some(&SqlState::LOCK_NOT_AVAILABLE) => PlaceOrderError::KeyInUse,
            _ => error.into(),
        })?;
    match claimed {
        Some(_) => Ok(None),
        None => replay(tx, keyed).await.map(Some),
    }
}

/// The answer stored with `keyed`'s key, claimed by an earlier request: replayed if that
/// request was this one, refused if it was another.
async fn replay(tx: &Transaction<'_>, keyed: &Keyed<'_>) -> Result<Placed, PlaceOrderError> {
    let stored = tx
        .query_opt(
            &tx.prepare_cached(STORED_ANSWER).await?,
            &[&keyed.key.as_str()],
        )
        .await?
        // Deleted since the insert saw it: expired and pruned; the client retries.
        .ok_or(PlaceOrderError::KeyInUse)?;
    if stored.get::<_, &[u8]>("fingerprint") != keyed.fingerprint.as_bytes() {
        return Err(PlaceOrderError::KeyReused);
    }
    Ok(Placed::Replayed {
        order_id: stored.get("order_id"),
        status: stored.get::<_, i16>("response_status") as u16,
        body: stored.get("response_body"),
    })
}

/// The parameters of `order`'s row.
fn order_row(order: &Order) -> Vec<Param> {
    vec![
        Box::new(order.id),
        Box::new(order.customer_id.clone()),
        Box::new(order.amount_cents),
        Box::new(order.created_at),
    ]
}

/// The parameters of `order`'s item rows: the order, and a column of each item's values.
fn item_rows(order: &Order) -> Vec<Param> {
    let product_ids: Vec<Uuid> = order.items.iter().map(|i| i.product_id).collect();
    let quantities: Vec<i32> = order.items.iter().map(|i| i.quantity).collect();
    let unit_prices: Vec<i64> = order.items.iter().map(|i| i.unit_price_cents).collect();
    vec![
        Box::new(order.id),
        Box::new(product_ids),
        Box::new(quantities),
        Box::new(unit_prices),
    ]
}

/// The payload of `order`'s `order.created` event.
fn order_created(order: &Order) -> OrderCreated {
    OrderCreated {
        order_id: order.id,
        customer_id: order.customer_id.clone(),
        amount_cents: order.amount_cents,
        items: order.items.clone(),
    }
}

pub async fn find_order(
    client: &deadpool_postgres::Client,
    order_id: Uuid,
) -> Result<Option<Order>, tokio_postgres::Error> {
    let Some(row) = client
        .query_opt(
            "SELECT customer_id, status, amount_cents, cancel_reason, refund_id,
                    refund_failure, settled_at IS NOT NULL AS settled, created_at, updated_at
               FROM orders WHERE id = $1",
            &[&order_id],
        )
        .await?
    else {
        return Ok(None);
    };
    let items = client.query(ITEMS, &[&order_id]).await?;
    Ok(Some(order_from_rows(order_id, &row, &items)))
}

/// An order's items, as [`order_from_rows`] reads them.
pub const ITEMS: &str = "
    SELECT product_id, quantity, unit_price_cents
      FROM order_items WHERE order_id = $1 ORDER BY product_id";

/// The order `order_id`, from its row (the columns [`find_order`] reads) and its
/// [`ITEMS`].
pub fn order_from_rows(
    order_id: Uuid,
    row: &tokio_postgres::Row,
    items: &[tokio_postgres::Row],
) -> Order {
    let items = items
        .iter()
        .map(|item| OrderItem {
            product_id: item.get("product_id"),
            quantity: item.get("quantity"),
            unit_price_cents: item.get("unit_price_cents"),
        })
        .collect();
    let status = OrderStatus::from_db(row.get("status"));
    let failure: Option<String> = row.get("refund_failure");
    let refund = RefundState::of(
        status,
        row.get("refund_id"),
        failure.is_some(),
        row.get("settled"),
    );
    Order {
        id: order_id,
        customer_id: row.get("customer_id"),
        status,
        amount_cents: row.get("amount_cents"),
        items,
        cancel_reason: row.get("cancel_reason"),
        refund,
        refund_failure: failure.filter(|_| refund == Some(RefundState::Failed)),
        created_at: row.get("created_at"),
        updated_at: row.get("updated_at"),
    }
}
