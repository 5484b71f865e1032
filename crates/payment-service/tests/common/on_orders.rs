//! payment-service's two handlers of `orders` together, as it runs them, against a real
//! PostgreSQL and a provider of the test's own: the events order-service writes, and what
//! the payment and the provider show after.

use std::time::Duration;

use payment_service::{ChargeOrder, RefundOrder};
use saga::handler::Pair;
use saga::{Applier, Envelope, HandlerError, Outcome, Topics};
use saga_testkit::TestDatabase;
use serde_json::{Value, json};
use uuid::Uuid;

use super::LocalProvider;

pub type OnOrders = Applier<Pair<ChargeOrder, RefundOrder>>;

pub struct Fixture {
    pub db: TestDatabase,
    pub provider: LocalProvider,
}

pub async fn fixture() -> Fixture {
    let (db, provider) = tokio::join!(
        TestDatabase::migrated(payment_service::migrations, payment_service::HISTORY_TABLE),
        LocalProvider::start()
    );
    Fixture { db, provider }
}

pub fn event(id: &str, event_type: &str, order_id: Uuid, payload: Value) -> Envelope {
    Envelope::from_slice(&saga_testkit::envelope(id, event_type, order_id, payload)).unwrap()
}

pub fn created(order_id: Uuid, amount_cents: i64) -> Envelope {
    event(
        &order_id.to_string(),
        "order.created",
        order_id,
        json!({ "order_id": order_id, "customer_id": "cust-1", "amount_cents": amount_cents, "items": [] }),
    )
}

/// The customer's cancellation, as order-service writes it.
pub fn cancelled(order_id: Uuid, amount_cents: i64) -> Envelope {
    cancellation(&format!("{order_id}:cancel"), order_id, amount_cents)
}

pub fn cancellation(id: &str, order_id: Uuid, amount_cents: i64) -> Envelope {
    event(
        id,
        "order.cancelled",
        order_id,
        json!({ "order_id": order_id, "customer_id": "cust-1", "amount_cents": amount_cents, "reason": "customer" }),
    )
}

impl Fixture {
    pub fn handler(&self) -> OnOrders {
        let provider = self.provider.client(Duration::from_millis(500));
        let topics = Topics::new("");
        Applier::new(
            self.db.pool.clone(),
            Pair(
                ChargeOrder::new(topics.clone(), provider.clone()),
                RefundOrder::new(topics, provider),
            ),
        )
    }

    /// The payment's status, charge and refund.
    pub async fn payment(
        &self,
        order_id: Uuid,
    ) -> Option<(String, Option<String>, Option<String>)> {
        self.db
            .client()
            .await
            .query_opt(
                "SELECT status, charge_id, refund_id FROM payments WHERE order_id = $1",
                &[&order_id],
            )
            .await
            .unwrap()
            .map(|row| (row.get(0), row.get(1), row.get(2)))
    }

    /// Charges `order_id` with its commit held past the handler's timeout while the
    /// provider's list leaves every charge out: the call gives up, and the payment is
    /// `unknown`, its charge committing a moment later.
    pub async fn charge_committing_late(&self, handler: &OnOrders, order_id: Uuid) {
        let admin = &self.provider.admin;
        admin
            .arm(json!({ "kind": "commit-late", "delay_ms": 1500, "next": 1 }))
            .await;
        admin
            .arm(json!({ "kind": "list-lag", "lag_ms": 600_000, "endpoint": "list" }))
            .await;
        let gave_up = handler.apply(&created(order_id, 2598)).await.unwrap_err();
        assert!(matches!(gave_up, HandlerError::Unavailable(_)), "{gave_up}");
        assert_eq!(self.payment(order_id).await.unwrap().0, "unknown");
    }

    /// The refund's status, reason and attempt.
    pub async fn refund(&self, order_id: Uuid) -> (Option<String>, Option<String>, i32) {
        let row = self
            .db
            .client()
            .await
            .query_one(
                "SELECT refund_status, refund_reason, refund_attempt FROM payments WHERE order_id = $1",
                &[&order_id],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1), row.get(2))
    }

    /// The payload of the outbox's event `event_id`.
    pub async fn payload(&self, event_id: &str) -> Value {
        self.db
            .client()
            .await
            .query_one(
                "SELECT payload FROM outbox WHERE event_id = $1",
                &[&event_id],
            )
            .await
            .unwrap()
            .get::<_, serde_json::Value>(0)
    }

    /// The types of the outbox's events for the order, in order.
    pub async fn event_types(&self, order_id: Uuid) -> Vec<String> {
        self.events(order_id)
            .await
            .into_iter()
            .map(|(_, t)| t)
            .collect()
    }

    pub async fn events(&self, order_id: Uuid) -> Vec<(String, String)> {
        super::outbox_events(&self.db, order_id).await
    }

    /// The provider's charges for the order, each with its refunds.
    pub async fn charges(&self, order_id: Uuid) -> Vec<Value> {
        self.provider.admin.charges_for(&order_id.to_string()).await
    }

    /// One charge for `amount_cents` at the provider, refunded once, and the payment
    /// here holds both ids.
    pub async fn refunded_once(&self, order_id: Uuid, amount_cents: i64) {
        let charges = self.charges(order_id).await;
        assert_eq!(charges.len(), 1, "one charge: {charges:?}");
        let refunds = charges[0]["refunds"]
            .as_array()
            .expect("a charge lists its refunds");
        assert_eq!(refunds.len(), 1, "one refund: {charges:?}");
        assert_eq!(refunds[0]["amount_cents"], amount_cents);
        let (_, charge_id, refund_id) = self.payment(order_id).await.expect("a payment");
        assert_eq!(charge_id.as_deref(), charges[0]["id"].as_str());
        assert_eq!(refund_id.as_deref(), refunds[0]["id"].as_str());
        let refunded = (format!("{order_id}:refund"), "payment.refunded".to_owned());
        let announced = self.events(order_id).await;
        assert_eq!(
            announced.iter().filter(|e| **e == refunded).count(),
            1,
            "{announced:?}"
        );
    }
}

/// Applies `event` as the consumer would: again, prepared afresh, while it fails with an
/// error that heals by itself (a lost answer, a prepare out of date).
pub async fn apply_until_done(handler: &OnOrders, event: &Envelope) -> Outcome {
    for _ in 0..5 {
        match handler.apply(event).await {
            Ok(outcome) => return outcome,
            Err(error @ (HandlerError::Unavailable(_) | HandlerError::Stale(_))) => {
                tracing::info!(%error, "retrying");
            }
            Err(error) => panic!("{}: {error}", event.id),
        }
    }
    panic!("{} did not apply in 5 attempts", event.id)
}
