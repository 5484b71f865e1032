//! A card provider of a test's own: payment-provider in this process, on a database of
//! its own, stopped when the test ends; and payment-service's client of it.

#![allow(dead_code)] // Each test crate uses its own part of this.

pub mod charging;
pub mod on_orders;

use std::time::Duration;

use payment_service::{Provider, ProviderConfig};
use saga_testkit::TestDatabase;
use saga_testkit::provider::ProviderAdmin;
use tokio_util::sync::CancellationToken;

/// The provider's limit in these tests: above it a charge is declined.
pub const LIMIT_CENTS: i64 = 100_000;

pub struct LocalProvider {
    /// Arms its faults, reads its counts and lists its charges, over HTTP.
    pub admin: ProviderAdmin,
    _db: TestDatabase,
    stop: CancellationToken,
}

impl Drop for LocalProvider {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl LocalProvider {
    pub async fn start() -> Self {
        let db = TestDatabase::empty().await;
        let (url, stop) = payment_provider::start_local(&db.url, |config| {
            config.payment_limit_cents = LIMIT_CENTS;
        })
        .await
        .unwrap();
        Self {
            admin: ProviderAdmin::new(url),
            _db: db,
            stop,
        }
    }

    /// payment-service's client of this provider, giving up on a call after `timeout`.
    pub fn client(&self, timeout: Duration) -> Provider {
        client_of(&self.admin.url, timeout)
    }
}

/// payment-service's client of the provider at `url`.
pub fn client_of(url: &str, timeout: Duration) -> Provider {
    Provider::new(&ProviderConfig {
        provider_url: url.to_owned(),
        provider_connect_timeout: Duration::from_secs(1),
        provider_timeout: timeout,
        provider_key_ttl: std::time::Duration::from_secs(24 * 3600),
        provider_ca_file: None,
    })
    .unwrap()
}

/// The outbox's events for `order_id` in `db`: id and type, in the order written.
pub async fn outbox_events(db: &TestDatabase, order_id: uuid::Uuid) -> Vec<(String, String)> {
    db.client()
        .await
        .query(
            "SELECT event_id, type FROM outbox WHERE key = $1 ORDER BY id",
            &[&order_id.to_string()],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}
