//! Cancelling orders through the API, and what a cancellation left where the money is:
//! the provider's charges with their refunds, payment-service's payment row, the events
//! announced and the customer's notifications.

use std::time::Duration;

use saga_testkit::eventually;
use serde_json::Value;
use uuid::Uuid;

use crate::{SETTLE, Stack};

/// What `POST /v1/orders/{id}/cancel` answered.
#[derive(Debug)]
pub struct CancelAnswer {
    pub status: u16,
    pub order: Value,
    /// `Idempotent-Replayed: true`: the key's first request's answer, given again.
    pub replayed: bool,
}

/// payment-service's payment row for an order.
#[derive(Debug, PartialEq, Eq)]
pub struct PaymentRow {
    pub status: String,
    pub charge_id: Option<String>,
    pub refund_id: Option<String>,
}

/// A charge at the provider and the refunds it lists.
#[derive(Debug)]
pub struct Money {
    pub charges: Vec<Value>,
}

impl Money {
    /// Every refund of every charge, in the order the charges list them.
    pub fn refunds(&self) -> Vec<&Value> {
        self.charges
            .iter()
            .flat_map(|c| c["refunds"].as_array().into_iter().flatten())
            .collect()
    }

    /// The one charge, which must be the only one.
    pub fn the_charge(&self) -> &Value {
        assert_eq!(self.charges.len(), 1, "one charge: {:?}", self.charges);
        &self.charges[0]
    }

    /// The one refund, which must be the only one.
    pub fn the_refund(&self) -> &Value {
        let refunds = self.refunds();
        assert_eq!(refunds.len(), 1, "one refund: {:?}", self.charges);
        refunds[0]
    }
}

impl Stack {
    /// `POST /v1/orders/{id}/cancel`, with `key` as its `Idempotency-Key` if given.
    pub async fn cancel(&self, order_id: Uuid, key: Option<&str>) -> CancelAnswer {
        let mut request = self
            .http
            .post(self.api_url(&format!("/v1/orders/{order_id}/cancel")));
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let response = request.send().await.expect("order-service answers");
        let status = response.status().as_u16();
        let replayed = response
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true");
        let order = response.json().await.expect("a JSON body");
        CancelAnswer {
            status,
            order,
            replayed,
        }
    }

    /// Waits until order-service has payment-service's answer to the order's
    /// cancellation (its `refund` is no longer `pending`); returns the order.
    pub async fn answered_cancellation(&self, order_id: Uuid) -> Value {
        eventually(
            SETTLE,
            &format!("the cancellation of {order_id} to be answered"),
            || async move {
                let order = self.get_order(order_id).await;
                (order["status"] == "cancelled" && order["refund"] != "pending").then_some(order)
            },
        )
        .await
    }

    /// What the provider holds for the order: its charges, each listing its refunds.
    pub async fn money(&self, order_id: Uuid) -> Money {
        Money {
            charges: self.provider().charges_for(&order_id.to_string()).await,
        }
    }

    /// payment-service's payment row for the order, if it has one.
    pub async fn payment(&self, order_id: Uuid) -> Option<PaymentRow> {
        self.payments_db
            .client()
            .await
            .query_opt(
                "SELECT status, charge_id, refund_id FROM payments WHERE order_id = $1",
                &[&order_id],
            )
            .await
            .expect("payments can be read")
            .map(|r| PaymentRow {
                status: r.get(0),
                charge_id: r.get(1),
                refund_id: r.get(2),
            })
    }

    /// How many rows of `event_type` `service`'s outbox holds for the order.
    pub async fn announced(&self, service: &str, order_id: Uuid, event_type: &str) -> i64 {
        self.database(service)
            .count(
                "SELECT count(*) FROM outbox WHERE key = $1 AND type = $2",
                &[&order_id.to_string(), &event_type],
            )
            .await
    }

    /// The kinds of notification the customer got about the order, sorted, one entry per
    /// notification.
    pub async fn notification_kinds(&self, order_id: Uuid) -> Vec<String> {
        self.notifications_db
            .client()
            .await
            .query(
                "SELECT kind FROM notifications WHERE order_id = $1 ORDER BY kind",
                &[&order_id],
            )
            .await
            .expect("notifications can be read")
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// Waits until the customer has had as many notifications about the order as `kinds`
    /// holds; returns their kinds, sorted, for the test to compare.
    pub async fn told(&self, order_id: Uuid, kinds: &[&str]) -> Vec<String> {
        eventually(
            SETTLE,
            &format!("the customer to be told {kinds:?} about {order_id}"),
            || async move {
                let told = self.notification_kinds(order_id).await;
                (told.len() >= kinds.len()).then_some(told)
            },
        )
        .await
    }

    /// Seconds since the epoch of `sql`'s one timestamp in `service`'s database, `$1`
    /// being the order id as text: the databases share a clock, so their moments compare.
    pub async fn moment(&self, service: &str, sql: &str, order_id: Uuid) -> f64 {
        let query = format!("SELECT extract(epoch FROM ({sql}))::float8");
        self.database(service)
            .client()
            .await
            .query_one(&query, &[&order_id.to_string()])
            .await
            .unwrap_or_else(|e| panic!("{service}: {query}: {e}"))
            .get(0)
    }

    /// Waits until the provider's `endpoint` (`charges` or `refunds`) counted `stat` at
    /// least `n` times.
    pub async fn provider_counted(&self, endpoint: &str, stat: &str, n: u64) {
        let provider = self.provider();
        eventually(
            Duration::from_secs(30),
            &format!("the provider to count {n} {endpoint} {stat}"),
            || {
                let provider = provider.clone();
                async move {
                    let stats = provider.stats().await;
                    let counted = if endpoint == "refunds" {
                        &stats["refunds"][stat]
                    } else {
                        &stats[stat]
                    };
                    (counted.as_u64().unwrap_or(0) >= n).then_some(())
                }
            },
        )
        .await
    }
}
