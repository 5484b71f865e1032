//! Probes for an orchestrator, on two paths, as Kubernetes asks of them:
//!
//! - `GET /livez`: the process serves HTTP. Nothing else: a restart cures none of what
//!   readiness checks (a database or broker away comes back by itself, and the service
//!   waits for it), so a liveness probe that checked them would only restart healthy
//!   services during an outage.
//! - `GET /readyz`: 200 when the service can do its work: its database answers, a broker
//!   answers (the relay's producer asks for metadata), its consumer has joined its group,
//!   and it is not stopping. 503 otherwise, naming each reason. On SIGTERM it turns 503
//!   first, and the drain begins `SHUTDOWN_DELAY` later ([`crate::shutdown`]), so that a
//!   load balancer stops sending requests before the listener closes.
//!
//! "Joined its group" means it was assigned partitions once since it started, even none
//! (a copy beyond the topic's partitions gets none): a rebalance later does not make it
//! unready, or every rebalance would take order-service's API out of its load balancer.
//! `GET /health` (the database only) stays for the scripts and compose files that use it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use deadpool_postgres::Pool;
use rdkafka::producer::{FutureProducer, Producer as _};
use serde_json::json;

/// How long each check may take: a probe's own timeout is usually a second or more.
const CHECK_TIMEOUT: Duration = Duration::from_millis(900);

/// What `/readyz` checks.
#[derive(Clone)]
pub struct Readiness {
    pool: Pool,
    broker: Option<FutureProducer>,
    joined: Option<Arc<AtomicBool>>,
}

impl Readiness {
    /// Ready when `pool` reaches the database (and not stopping): the card provider's.
    pub fn database(pool: Pool) -> Self {
        Self {
            pool,
            broker: None,
            joined: None,
        }
    }

    /// Also ready only while `producer` reaches a broker.
    pub fn broker(mut self, producer: FutureProducer) -> Self {
        self.broker = Some(producer);
        self
    }

    /// Also ready only once `joined` is set: by the consumer, on its first assignment.
    pub fn consumer(mut self, joined: Arc<AtomicBool>) -> Self {
        self.joined = Some(joined);
        self
    }

    /// Why the service is not ready; empty when it is.
    async fn reasons(&self) -> Vec<&'static str> {
        let mut reasons = Vec::new();
        if crate::shutdown::stopping() {
            reasons.push("stopping");
        }
        let (database, broker) = tokio::join!(self.database_answers(), self.broker_answers());
        if !database {
            reasons.push("database unreachable");
        }
        if !broker {
            reasons.push("broker unreachable");
        }
        if self
            .joined
            .as_ref()
            .is_some_and(|joined| !joined.load(Ordering::Relaxed))
        {
            reasons.push("consumer not yet in its group");
        }
        reasons
    }

    async fn database_answers(&self) -> bool {
        let check = async {
            let client = self.pool.get().await.ok()?;
            client.simple_query("SELECT 1").await.ok()
        };
        matches!(
            tokio::time::timeout(CHECK_TIMEOUT, check).await,
            Ok(Some(_))
        )
    }

    async fn broker_answers(&self) -> bool {
        let Some(producer) = self.broker.clone() else {
            return true;
        };
        // librdkafka's metadata call blocks its thread until an answer or the timeout.
        let asked = tokio::task::spawn_blocking(move || {
            producer
                .client()
                .fetch_metadata(None, CHECK_TIMEOUT)
                .is_ok_and(|metadata| !metadata.brokers().is_empty())
        });
        asked.await.unwrap_or(false)
    }
}

/// `/livez` and `/readyz`.
pub fn router(readiness: Readiness) -> Router {
    Router::new()
        .route(
            "/livez",
            get(|| async { Json(json!({ "status": "live" })) }),
        )
        .route("/readyz", get(ready))
        .with_state(readiness)
}

async fn ready(State(readiness): State<Readiness>) -> impl IntoResponse {
    let reasons = readiness.reasons().await;
    if reasons.is_empty() {
        (StatusCode::OK, Json(json!({ "status": "ready" })))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "not_ready", "reasons": reasons })),
        )
    }
}

/// Set once the consumer was first assigned partitions (any number, none included).
pub(crate) fn joined(flag: &AtomicBool) {
    flag.store(true, Ordering::Relaxed);
}
