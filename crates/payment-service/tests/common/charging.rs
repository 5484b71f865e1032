//! ChargeOrder's fixture: payment-service's database, a provider of its own, and the
//! `order.created` events the tests apply.

use std::time::Duration;

use payment_service::ChargeOrder;
use saga::events::ORDER_CREATED;
use saga::{Applier, Envelope, Topics};
use saga_testkit::TestDatabase;
use saga_testkit::provider::ProviderAdmin;
use serde_json::{Value, json};
use uuid::Uuid;

use super::{LocalProvider, client_of};

/// payment-service's database and a provider of its own.
pub struct Fixture {
    pub db: TestDatabase,
    /// The provider's admin; the provider runs while `_local` is held.
    pub provider: ProviderAdmin,
    _local: LocalProvider,
}

pub async fn fixture() -> Fixture {
    let (db, local) = tokio::join!(
        TestDatabase::migrated(payment_service::migrations, payment_service::HISTORY_TABLE),
        LocalProvider::start()
    );
    Fixture {
        db,
        provider: local.admin.clone(),
        _local: local,
    }
}

impl Fixture {
    pub fn handler(&self) -> Applier<ChargeOrder> {
        self.handler_at(&self.provider.url)
    }

    pub fn handler_at(&self, provider_url: &str) -> Applier<ChargeOrder> {
        let provider = client_of(provider_url, Duration::from_millis(500));
        Applier::new(
            self.db.pool.clone(),
            ChargeOrder::new(Topics::new(""), provider),
        )
    }

    pub async fn payments(&self, order_id: Uuid) -> i64 {
        self.db
            .count(
                "SELECT count(*) FROM payments WHERE order_id = $1",
                &[&order_id],
            )
            .await
    }

    /// The payment's status: `charging` is the intent, `unknown` a call with no answer.
    pub async fn status(&self, order_id: Uuid) -> Option<String> {
        self.db
            .client()
            .await
            .query_opt(
                "SELECT status FROM payments WHERE order_id = $1",
                &[&order_id],
            )
            .await
            .unwrap()
            .map(|row| row.get(0))
    }

    pub async fn charge_id(&self, order_id: Uuid) -> Option<String> {
        self.db
            .client()
            .await
            .query_one(
                "SELECT charge_id FROM payments WHERE order_id = $1",
                &[&order_id],
            )
            .await
            .unwrap()
            .get(0)
    }

    pub async fn results(&self, order_id: Uuid) -> Vec<(String, String)> {
        super::outbox_events(&self.db, order_id).await
    }

    pub async fn charges(&self, order_id: Uuid) -> Vec<Value> {
        self.provider.charges_for(&order_id.to_string()).await
    }

    /// Exactly one charge at the provider, for the order's amount, and the payment row
    /// holds its id.
    pub async fn charged_once(&self, order_id: Uuid, amount_cents: i64) {
        let charges = self.charges(order_id).await;
        assert_eq!(charges.len(), 1, "{charges:?}");
        assert_eq!(charges[0]["amount_cents"], amount_cents);
        assert_eq!(self.payments(order_id).await, 1);
        assert_eq!(
            self.charge_id(order_id).await.as_deref(),
            charges[0]["id"].as_str()
        );
    }

    /// What a copy stopped by a guard leaves: the order paid, announced and charged once,
    /// and the provider called only by the first.
    pub async fn guarded_after_one_charge(&self, order_id: Uuid, amount_cents: i64) {
        assert_eq!(self.payments(order_id).await, 1);
        assert_eq!(self.results(order_id).await.len(), 1);
        self.charged_once(order_id, amount_cents).await;
        assert_eq!(
            self.provider.stats().await["calls"],
            1,
            "a charged order makes no call"
        );
    }
}

/// A new order's `order.created` as order-service writes it: its id is the order's.
pub fn created_by_order_service(amount_cents: i64) -> (Uuid, Envelope) {
    let order_id = Uuid::new_v4();
    (
        order_id,
        order_created(&order_id.to_string(), order_id, amount_cents),
    )
}

pub fn order_created(id: &str, order_id: Uuid, amount_cents: i64) -> Envelope {
    let raw = saga_testkit::envelope(
        id,
        ORDER_CREATED,
        order_id,
        json!({ "order_id": order_id, "customer_id": "cust-1", "amount_cents": amount_cents, "items": [] }),
    );
    Envelope::from_slice(&raw).unwrap()
}
