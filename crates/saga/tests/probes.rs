//! `/readyz` names each reason a service is not ready (`saga::probes`); `/livez` does not
//! look at any of them, only at attempts that never end (`consumer/liveness.rs`).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use axum::http::StatusCode;
use saga::probes::{Probes, router};
use saga_testkit::TestDatabase;
use serde_json::Value;

async fn probe(readiness: Probes, path: &str) -> (StatusCode, Value) {
    saga_testkit::get_json(router(readiness), path).await
}

#[tokio::test]
async fn ready_when_database_and_group_answer() {
    let db = TestDatabase::empty().await;
    let readiness = Probes::database(db.pool.clone()).consumer(Arc::new(AtomicBool::new(true)));
    let (status, body) = probe(readiness, "/readyz").await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::OK, Some("ready"))
    );
}

#[tokio::test]
async fn not_ready_names_a_consumer_not_yet_in_its_group_and_liveness_does_not_mind() {
    let db = TestDatabase::empty().await;
    let readiness = Probes::database(db.pool.clone()).consumer(Arc::new(AtomicBool::new(false)));
    let (status, body) = probe(readiness.clone(), "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        body["reasons"],
        serde_json::json!(["consumer not yet in its group"])
    );
    let (status, _) = probe(readiness, "/livez").await;
    assert_eq!(status, StatusCode::OK, "liveness does not depend on it");
}

#[tokio::test]
async fn not_ready_names_an_unreachable_database() {
    let db = TestDatabase::empty().await;
    db.refuse_connections().await;
    let (status, body) = probe(Probes::database(db.pool.clone()), "/readyz").await;
    db.accept_connections().await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["reasons"], serde_json::json!(["database unreachable"]));
}
