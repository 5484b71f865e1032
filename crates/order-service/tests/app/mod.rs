//! The order API served in-process on port 0 against a fresh database and namespace,
//! driven over HTTP: what the API tests share.

#![allow(dead_code)] // Each test crate uses its own part of this.

use std::time::Duration;

use order_service::admission::AdmissionConfig;
use order_service::deadline::DeadlineConfig;
use order_service::{Application, Config};
use reqwest::header::HeaderMap;
use saga::config::{
    DatabaseConfig, HttpLimits, IdempotencyConfig, KafkaConfig, KeyConfig, RetentionConfig,
};
use saga_testkit::{TestDatabase, TestKafka};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub const KEYBOARD: &str = "8f14e45f-ceea-4c9d-b2a5-0c1e3f4a9b21";

pub struct TestApp {
    pub base: String,
    pub db: TestDatabase,
    pub http: reqwest::Client,
    shutdown: CancellationToken,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The service's defaults: keys optional, kept 24 h, a 2 s wait for a key in use.
pub fn defaults() -> IdempotencyConfig {
    IdempotencyConfig {
        require_idempotency_key: false,
        keys: KeyConfig {
            idempotency_key_ttl: Duration::from_secs(24 * 3600),
            idempotency_key_wait: Duration::from_secs(2),
        },
    }
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(defaults()).await
}

/// The service's configuration for a fresh database and namespace: pruning off, keys as
/// given.
pub fn config(db: &TestDatabase, kafka: &TestKafka, idempotency: IdempotencyConfig) -> Config {
    Config {
        database: DatabaseConfig {
            database_url: saga::config::DatabaseUrl::new(&db.url),
            database_pool_size: 4,
            consumer_pool_size: 2,
            singleton_lease: saga::lease::DEFAULT_LEASE,
        },
        kafka: KafkaConfig {
            kafka_brokers: kafka.brokers.clone(),
            kafka_namespace: kafka.namespace.clone(),
            consumer_batch_size: 1,
            outbox_poll_interval_ms: 200,
            outbox_linger_ms: 10,
            liveness_stall_after: std::time::Duration::from_secs(600),
        },
        idempotency,
        retention: RetentionConfig::off(),
        http_addr: "127.0.0.1:0".parse().unwrap(),
        http: HttpLimits::default(),
        admission: AdmissionConfig::default(),
        deadline: DeadlineConfig::default(),
    }
}

pub async fn spawn_app_with(idempotency: IdempotencyConfig) -> TestApp {
    spawn_configured(idempotency, HttpLimits::default()).await
}

/// The service with `http` limits instead of the defaults.
pub async fn spawn_app_limited(http: HttpLimits) -> TestApp {
    spawn_configured(defaults(), http).await
}

async fn spawn_configured(idempotency: IdempotencyConfig, http: HttpLimits) -> TestApp {
    let (db, kafka) = tokio::join!(TestDatabase::empty(), TestKafka::new());
    let app = Application::build(Config {
        http,
        ..config(&db, &kafka, idempotency)
    })
    .await
    .expect("order-service builds");
    let base = format!("http://{}", app.local_addr());
    let shutdown = CancellationToken::new();
    tokio::spawn(app.run_until_stopped(shutdown.clone()));
    TestApp {
        base,
        db,
        http: reqwest::Client::new(),
        shutdown,
    }
}

/// An answer as the client sees it.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    /// The body's bytes, as text: a replay must send the very same.
    pub text: String,
}

impl Answer {
    /// Sends `request`, and reads the whole answer.
    async fn of(request: reqwest::RequestBuilder) -> Self {
        let response = request.send().await.unwrap();
        Self {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            text: response.text().await.unwrap(),
        }
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("{e}: {}", self.text))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }
}

impl TestApp {
    /// `POST /v1/orders` with `body` as is, declared as `content_type`, with each of
    /// `keys` as an `Idempotency-Key` header line of its own.
    pub async fn post(&self, content_type: &str, keys: &[&str], body: &str) -> Answer {
        let mut request = self
            .http
            .post(format!("{}/v1/orders", self.base))
            .header("content-type", content_type)
            .body(body.to_owned());
        for key in keys {
            request = request.header("idempotency-key", *key);
        }
        Answer::of(request).await
    }

    /// `POST /v1/orders/{order_id}/cancel`, with each of `keys` as an `Idempotency-Key`.
    pub async fn cancel(&self, order_id: &str, keys: &[&str]) -> Answer {
        let mut request = self
            .http
            .post(format!("{}/v1/orders/{order_id}/cancel", self.base));
        for key in keys {
            request = request.header("idempotency-key", *key);
        }
        Answer::of(request).await
    }

    pub async fn post_raw(&self, content_type: &str, body: &str) -> (u16, Value) {
        let answer = self.post(content_type, &[], body).await;
        (answer.status, answer.json())
    }

    pub async fn post_order(&self, body: Value) -> (u16, Value) {
        self.post_raw("application/json", &body.to_string()).await
    }

    /// `POST /v1/orders` of `body` (JSON) with `key`.
    pub async fn post_keyed(&self, key: &str, body: &Value) -> Answer {
        self.post("application/json", &[key], &body.to_string())
            .await
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.json().await.unwrap())
    }

    pub async fn orders(&self) -> i64 {
        self.db.count("SELECT count(*) FROM orders", &[]).await
    }

    pub async fn keys(&self) -> i64 {
        self.db
            .count("SELECT count(*) FROM idempotency_keys", &[])
            .await
    }

    /// `order.created` rows in the outbox.
    pub async fn orders_created(&self) -> i64 {
        self.db
            .count(
                "SELECT count(*) FROM outbox WHERE type = 'order.created'",
                &[],
            )
            .await
    }
}

/// `quantity` keyboards for `cust-1`.
pub fn order(quantity: i64) -> Value {
    serde_json::json!({ "customer_id": "cust-1", "items": [{ "product_id": KEYBOARD, "quantity": quantity }] })
}

/// A `pending` order of two keyboards for `cust-1`, placed as `POST /v1/orders` places it,
/// without a key: its id.
pub async fn pending_order(pool: &deadpool_postgres::Pool, topics: &saga::Topics) -> uuid::Uuid {
    let lines = [order_service::orders::NewLine {
        product_id: KEYBOARD.parse().unwrap(),
        quantity: 2,
    }];
    match order_service::orders::place_order(pool, None, topics, "cust-1", &lines, None).await {
        Ok(order_service::orders::Placed::New { order, .. }) => order.id,
        other => panic!("an order without a key is placed, not {other:?}"),
    }
}
