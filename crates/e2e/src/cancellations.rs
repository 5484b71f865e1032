//! Cancelling orders through the API, one at a time or a share of a load's in the
//! background ([`Cancellations`]), and what a cancellation left where the money is: the
//! provider's charges with their refunds, payment-service's payment row, the events
//! announced and the customer's notifications.

use std::time::{Duration, Instant};

use saga_testkit::eventually;
use serde_json::Value;
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::load::Load;
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
    /// Takes `privilege` on `payments` from payment-service's role, or gives it back: a
    /// grant lost in a deploy, say, which fails payment-service's handling of an
    /// `order.created` until it is given back, so that the record is dead-lettered.
    pub async fn payments_privilege(&self, privilege: &str, granted: bool) {
        let role = crate::role(crate::PAYMENT_SERVICE);
        let change = if granted {
            format!("GRANT {privilege} ON payments TO {role}")
        } else {
            format!("REVOKE {privilege} ON payments FROM {role}")
        };
        self.payments_db
            .client()
            .await
            .batch_execute(&format!("SET ROLE {role}; {change}; RESET ROLE"))
            .await
            .unwrap_or_else(|e| panic!("{change}: {e}"));
    }

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

/// A share of a [`Load`]'s orders cancelled through the API in the background, each at a
/// moment of its own after it was accepted: some still pending, some confirmed, some
/// already cancelled by their payment. The moment and the choice derive from the order's
/// random id, so they are spread without a random source of their own.
pub struct Cancellations {
    task: JoinHandle<Cancelled>,
}

/// What the cancellations did.
#[derive(Debug, Default)]
pub struct Cancelled {
    /// Orders the API cancelled (`202`): exactly these must end cancelled by the customer.
    pub accepted: Vec<Uuid>,
    /// Orders found cancelled already (`200`): their payment was declined.
    pub already: usize,
    /// Of the cancellations asked for, the orders still `pending` or `confirmed` just
    /// before.
    pub pending: usize,
    pub confirmed: usize,
    /// Requests refused or cut off, then sent again with the same key.
    pub retried: usize,
}

/// The latest moment after its acceptance at which an order is cancelled.
const LATEST_CANCEL_MS: u128 = 1500;

impl Cancellations {
    /// Cancels one order in `share` of `load`'s (by its id), until the load is placed.
    pub fn start(stack: &Stack, load: &Load, share: u128) -> Self {
        let (http, base) = stack.api();
        let accepted = load.accepted_so_far();
        let orders = load.orders;
        let task = tokio::spawn(async move {
            let mut cancelled = Cancelled::default();
            let mut seen = 0;
            // (when, order), in the order they come due.
            let mut due: Vec<(Instant, Uuid)> = Vec::new();
            while seen < orders || !due.is_empty() {
                let now = Instant::now();
                let new: Vec<Uuid> = accepted.lock().unwrap()[seen..].to_vec();
                seen += new.len();
                for id in new.into_iter().filter(|id| id.as_u128() % share == 0) {
                    let after = (id.as_u128() >> 64) % LATEST_CANCEL_MS;
                    due.push((now + Duration::from_millis(after as u64), id));
                }
                due.sort();
                let ready = due.partition_point(|(when, _)| *when <= now);
                for (_, id) in due.drain(..ready).collect::<Vec<_>>() {
                    cancel_until_answered(&http, &base, id, &mut cancelled).await;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            cancelled
        });
        Self { task }
    }

    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits for the last cancellation; returns what they did.
    pub async fn finish(self) -> Cancelled {
        self.task.await.expect("the cancellations do not panic")
    }
}

/// Cancels `id` with a key of its own, again with that key while order-service is down
/// or the key's first request is in flight, and tallies the answer.
async fn cancel_until_answered(
    http: &reqwest::Client,
    base: &str,
    id: Uuid,
    cancelled: &mut Cancelled,
) {
    let order = format!("{base}/v1/orders/{id}");
    if let Ok(response) = http.get(&order).send().await
        && let Ok(before) = response.json::<Value>().await
    {
        match before["status"].as_str() {
            Some("pending") => cancelled.pending += 1,
            Some("confirmed") => cancelled.confirmed += 1,
            _ => {}
        }
    }
    let key = format!("cancel-{id}");
    loop {
        let answer = http
            .post(format!("{order}/cancel"))
            .header("idempotency-key", &key)
            .timeout(Duration::from_secs(30))
            .send()
            .await;
        match answer.map(|r| r.status().as_u16()) {
            Ok(202) => return cancelled.accepted.push(id),
            Ok(200) => {
                cancelled.already += 1;
                return;
            }
            Ok(409 | 503) | Err(_) => cancelled.retried += 1,
            Ok(other) => panic!("POST /v1/orders/{id}/cancel answered {other}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
