//! The order aggregate: placing an order (with its `order.created` event) and reading one.

use deadpool_postgres::Pool;
use saga::Topics;
use saga::events::{self, OrderCreated, OrderItem};
use saga::outbox::{self, NewEvent};
use serde::Serialize;
use time::OffsetDateTime;
use uuid::Uuid;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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
#[derive(Debug, Clone, Serialize)]
pub struct Order {
    pub id: Uuid,
    pub customer_id: String,
    pub status: OrderStatus,
    pub amount_cents: i64,
    pub items: Vec<OrderItem>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancel_reason: Option<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

/// A line of a new order, already validated for shape.
#[derive(Debug, Clone)]
pub struct NewLine {
    pub product_id: Uuid,
    pub quantity: i32,
}

#[derive(Debug, thiserror::Error)]
pub enum PlaceOrderError {
    /// `lines[index]` names a product the catalog does not have.
    #[error("unknown product {product_id}")]
    UnknownProduct { index: usize, product_id: Uuid },
    #[error(transparent)]
    Database(#[from] tokio_postgres::Error),
    #[error(transparent)]
    Pool(#[from] deadpool_postgres::PoolError),
}

/// Places a `pending` order priced from the catalog and, in the same transaction, its
/// `order.created` event, whose id is the order's id.
pub async fn place_order(
    pool: &Pool,
    topics: &Topics,
    customer_id: &str,
    lines: &[NewLine],
) -> Result<Order, PlaceOrderError> {
    let mut client = pool.get().await?;
    // Each statement is prepared once per pooled connection (`prepare_cached`), not on
    // every call: parsing and planning it again, and the extra round trip that takes,
    // cost more than running it.
    let tx = client.transaction().await?;

    let product_ids: Vec<Uuid> = lines.iter().map(|l| l.product_id).collect();
    let prices = tx
        .query(
            &tx.prepare_cached("SELECT id, price_cents FROM products WHERE id = ANY($1)")
                .await?,
            &[&product_ids],
        )
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

    let order_id = Uuid::new_v4();
    let row = tx
        .query_one(
            &tx.prepare_cached(
                "INSERT INTO orders (id, customer_id, status, amount_cents)
                 VALUES ($1, $2, 'pending', $3)
                 RETURNING created_at, updated_at",
            )
            .await?,
            &[&order_id, &customer_id, &amount_cents],
        )
        .await?;
    let quantities: Vec<i32> = items.iter().map(|i| i.quantity).collect();
    let unit_prices: Vec<i64> = items.iter().map(|i| i.unit_price_cents).collect();
    tx.execute(
        &tx.prepare_cached(
            "INSERT INTO order_items (order_id, product_id, quantity, unit_price_cents)
             SELECT $1, * FROM UNNEST($2::uuid[], $3::int[], $4::bigint[])",
        )
        .await?,
        &[&order_id, &product_ids, &quantities, &unit_prices],
    )
    .await?;
    let order_key = order_id.to_string();
    outbox::enqueue(
        &tx,
        &NewEvent {
            event_id: &order_key,
            topic: &topics.orders,
            key: &order_key,
            event_type: events::ORDER_CREATED,
            payload: &OrderCreated {
                order_id,
                customer_id: customer_id.to_owned(),
                amount_cents,
                items: items.clone(),
            },
        },
    )
    .await?;
    tx.commit().await?;

    Ok(Order {
        id: order_id,
        customer_id: customer_id.to_owned(),
        status: OrderStatus::Pending,
        amount_cents,
        items,
        cancel_reason: None,
        created_at: row.get("created_at"),
        updated_at: row.get("updated_at"),
    })
}

pub async fn find_order(
    client: &deadpool_postgres::Client,
    order_id: Uuid,
) -> Result<Option<Order>, tokio_postgres::Error> {
    let Some(row) = client
        .query_opt(
            "SELECT customer_id, status, amount_cents, cancel_reason, created_at, updated_at
               FROM orders WHERE id = $1",
            &[&order_id],
        )
        .await?
    else {
        return Ok(None);
    };
    let items = client
        .query(
            "SELECT product_id, quantity, unit_price_cents
               FROM order_items WHERE order_id = $1 ORDER BY product_id",
            &[&order_id],
        )
        .await?
        .iter()
        .map(|item| OrderItem {
            product_id: item.get("product_id"),
            quantity: item.get("quantity"),
            unit_price_cents: item.get("unit_price_cents"),
        })
        .collect();
    Ok(Some(Order {
        id: order_id,
        customer_id: row.get("customer_id"),
        status: OrderStatus::from_db(row.get("status")),
        amount_cents: row.get("amount_cents"),
        items,
        cancel_reason: row.get("cancel_reason"),
        created_at: row.get("created_at"),
        updated_at: row.get("updated_at"),
    }))
}
