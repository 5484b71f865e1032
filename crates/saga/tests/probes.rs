//! `/readyz` names each reason a service is not ready (`saga::probes`); `/livez` does not
//! look at any of them.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use saga::probes::{Readiness, router};
use saga_testkit::TestDatabase;
use serde_json::Value;
use tower::ServiceExt as _;

async fn probe(readiness: Readiness, path: &str) -> (StatusCode, Value) {
    let request = Request::get(path).body(Body::empty()).unwrap();
    let response = router(readiness).oneshot(request).await.unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 1 << 16)
        .await
        .unwrap();
    (status, serde_json::from_slice(&body).unwrap())
}

fn producer_at(brokers: &str) -> rdkafka::producer::FutureProducer {
    saga::kafka::idempotent_producer(brokers)
        .create()
        .expect("a producer is made without connecting")
}

#[tokio::test]
async fn ready_when_database_broker_and_group_all_answer() {
    let db = TestDatabase::empty().await;
    let readiness = Readiness::database(db.pool.clone())
        .broker(producer_at(&saga_testkit::kafka_brokers()))
        .consumer(Arc::new(AtomicBool::new(true)));
    let (status, body) = probe(readiness, "/readyz").await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::OK, Some("ready"))
    );
}

#[tokio::test]
async fn not_ready_names_an_unreachable_broker_and_a_consumer_not_yet_in_its_group() {
    let db = TestDatabase::empty().await;
    // Nothing listens on port 1.
    let readiness = Readiness::database(db.pool.clone())
        .broker(producer_at("127.0.0.1:1"))
        .consumer(Arc::new(AtomicBool::new(false)));
    let (status, body) = probe(readiness.clone(), "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        body["reasons"],
        serde_json::json!(["broker unreachable", "consumer not yet in its group"])
    );
    let (status, _) = probe(readiness, "/livez").await;
    assert_eq!(status, StatusCode::OK, "liveness does not depend on either");
}

#[tokio::test]
async fn not_ready_names_an_unreachable_database() {
    let db = TestDatabase::empty().await;
    db.refuse_connections().await;
    let (status, body) = probe(Readiness::database(db.pool.clone()), "/readyz").await;
    db.accept_connections().await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["reasons"], serde_json::json!(["database unreachable"]));
}
