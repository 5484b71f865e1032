//! What the charges and the refunds tests share: a provider in the test's process, on a
//! database of its own, and its keyed `POST`s as a caller sends them.

use std::time::Duration;

use payment_provider::Config;
use reqwest::StatusCode;
use saga_testkit::TestDatabase;
use saga_testkit::provider::ProviderAdmin;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub struct Provider {
    pub url: String,
    pub http: reqwest::Client,
    pub admin: ProviderAdmin,
    #[allow(dead_code, reason = "the charges' tests count through the API")]
    pub db: TestDatabase,
    shutdown: CancellationToken,
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub async fn provider() -> Provider {
    provider_with(|_| {}).await
}

pub async fn provider_with(configure: impl FnOnce(&mut Config)) -> Provider {
    let db = TestDatabase::empty().await;
    let (url, shutdown) = payment_provider::start_local(&db.url, configure)
        .await
        .unwrap();
    Provider {
        admin: ProviderAdmin::new(url.clone()),
        url,
        http: reqwest::Client::new(),
        db,
        shutdown,
    }
}

pub struct Answer {
    pub status: StatusCode,
    pub replayed: bool,
    pub body: Value,
}

impl Provider {
    pub async fn charge(&self, key: Option<&str>, body: &Value) -> reqwest::Result<Answer> {
        self.charge_within(key, body, Duration::from_secs(30)).await
    }

    pub async fn charge_within(
        &self,
        key: Option<&str>,
        body: &Value,
        timeout: Duration,
    ) -> reqwest::Result<Answer> {
        self.post("/v1/charges", key, body, timeout).await
    }

    #[allow(dead_code, reason = "the charges' tests make no refund")]
    pub async fn refund(&self, key: Option<&str>, body: &Value) -> reqwest::Result<Answer> {
        self.post("/v1/refunds", key, body, Duration::from_secs(30))
            .await
    }

    async fn post(
        &self,
        path: &str,
        key: Option<&str>,
        body: &Value,
        timeout: Duration,
    ) -> reqwest::Result<Answer> {
        let mut request = self
            .http
            .post(format!("{}{path}", self.url))
            .timeout(timeout)
            .json(body);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        let response = request.send().await?;
        let status = response.status();
        let replayed = response.headers().get("idempotent-replayed").is_some();
        let body = response.json().await?;
        Ok(Answer {
            status,
            replayed,
            body,
        })
    }
}

pub fn request(reference: &str, amount_cents: i64) -> Value {
    json!({ "amount_cents": amount_cents, "currency": "usd", "reference": reference })
}
