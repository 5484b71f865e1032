//! The order API, served in-process on port 0 against a fresh database and namespace.

mod app;

use std::time::Duration;

use app::{KEYBOARD, config, defaults, order, spawn_app};
use order_service::Application;
use saga::config::RetentionConfig;
use saga::retention::Window;
use saga_testkit::{TestDatabase, TestKafka};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn placing_an_order_prices_it_from_the_catalog_and_records_order_created() {
    let app = spawn_app().await;

    let (status, body) = app.post_order(order(2)).await;

    assert_eq!(status, 201, "{body}");
    assert_eq!(body["status"], "pending");
    assert_eq!(body["amount_cents"], 2598);
    assert_eq!(body["items"][0]["unit_price_cents"], 1299);
    let id = body["id"].as_str().unwrap();
    let event = app
        .db
        .client()
        .await
        .query_one(
            "SELECT type, key, payload FROM outbox WHERE event_id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(event.get::<_, String>("type"), "order.created");
    assert_eq!(event.get::<_, String>("key"), id);
    assert_eq!(event.get::<_, Value>("payload")["amount_cents"], 2598);
}

#[tokio::test]
async fn a_placed_order_can_be_read_back() {
    let app = spawn_app().await;
    let (_, placed) = app.post_order(order(1)).await;

    let (status, body) = app
        .get(&format!("/v1/orders/{}", placed["id"].as_str().unwrap()))
        .await;

    assert_eq!(status, 200);
    assert_eq!(body["id"], placed["id"]);
    assert_eq!(body["customer_id"], "cust-1");
    assert_eq!(body["items"][0]["quantity"], 1);
}

/// Each bad body is refused with the status and the field named, and nothing is stored.
#[tokio::test]
async fn bad_input_is_refused_with_a_json_error_naming_the_problem() {
    let app = spawn_app().await;
    let unknown = "00000000-0000-4000-8000-000000000000";
    let cases: Vec<(&str, String, u16, &str, Option<&str>)> = vec![
        ("malformed JSON", r#"{"customer_id": "c","#.into(), 400, "malformed_json", None),
        ("not an object", "[]".into(), 422, "invalid_field", Some("body")),
        ("missing customer_id", json!({ "items": [] }).to_string(), 422, "invalid_field", Some("customer_id")),
        ("missing items", json!({ "customer_id": "c" }).to_string(), 422, "invalid_field", Some("items")),
        ("empty customer_id", json!({ "customer_id": " ", "items": [] }).to_string(), 422, "invalid_field", Some("customer_id")),
        ("customer_id with a NUL", json!({ "customer_id": "c\u{0}", "items": [] }).to_string(), 422, "invalid_field", Some("customer_id")),
        ("customer_id too long", json!({ "customer_id": "c".repeat(201), "items": [] }).to_string(), 422, "invalid_field", Some("customer_id")),
        ("no items", json!({ "customer_id": "c", "items": [] }).to_string(), 422, "invalid_field", Some("items")),
        ("quantity 0", order(0).to_string(), 422, "invalid_field", Some("items[0].quantity")),
        ("negative quantity", order(-3).to_string(), 422, "invalid_field", Some("items[0].quantity")),
        ("quantity not a number", json!({ "customer_id": "c", "items": [{ "product_id": KEYBOARD, "quantity": "two" }] }).to_string(), 422, "invalid_field", Some("items[0].quantity")),
        ("missing quantity", json!({ "customer_id": "c", "items": [{ "product_id": KEYBOARD }] }).to_string(), 422, "invalid_field", Some("items[0].quantity")),
        ("product id not a UUID", json!({ "customer_id": "c", "items": [{ "product_id": "kb-1", "quantity": 1 }] }).to_string(), 422, "invalid_field", Some("items[0].product_id")),
        ("unknown product", json!({ "customer_id": "c", "items": [{ "product_id": KEYBOARD, "quantity": 1 }, { "product_id": unknown, "quantity": 1 }] }).to_string(), 422, "invalid_field", Some("items[1].product_id")),
        ("unknown field", json!({ "customer_id": "c", "items": [], "coupon": "X" }).to_string(), 422, "invalid_field", Some("coupon")),
    ];
    for (case, body, want_status, want_code, want_field) in cases {
        let (status, error) = app.post_raw("application/json", &body).await;
        assert_eq!(status, want_status, "{case}: {error}");
        assert_eq!(error["error"]["code"], want_code, "{case}: {error}");
        assert!(
            error["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{case}: {error}"
        );
        if let Some(field) = want_field {
            assert_eq!(error["error"]["field"], field, "{case}: {error}");
        }
    }
    assert_eq!(app.orders().await, 0, "a refused order was stored");
}

#[tokio::test]
async fn a_body_not_declared_as_json_is_415() {
    let app = spawn_app().await;

    let (status, error) = app.post_raw("text/plain", &order(1).to_string()).await;

    assert_eq!(status, 415);
    assert_eq!(error["error"]["code"], "unsupported_media_type");
}

#[tokio::test]
async fn an_unknown_order_is_404_and_a_malformed_id_names_the_id() {
    let app = spawn_app().await;

    let (status, error) = app
        .get("/v1/orders/00000000-0000-4000-8000-000000000000")
        .await;
    assert_eq!(status, 404);
    assert_eq!(error["error"]["code"], "order_not_found");

    let (status, error) = app.get("/v1/orders/not-a-uuid").await;
    assert_eq!(status, 422);
    assert_eq!(error["error"]["field"], "id");
}

/// Axum's own refusals (no route, a method a route does not take, a body over the limit)
/// are the same JSON error as the API's, and say what was wrong.
#[tokio::test]
async fn every_refusal_is_a_json_error_an_unknown_path_a_wrong_method_and_a_body_too_large() {
    let app = spawn_app().await;

    let (status, error) = app.get("/v2/nothing-here").await;
    assert_eq!(status, 404);
    assert_eq!(error["error"]["code"], "not_found");

    let deleted = app
        .http
        .delete(format!("{}/v1/orders/x", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 405);
    assert_eq!(deleted.headers()["allow"], "GET,HEAD");
    let error: Value = deleted.json().await.unwrap();
    assert_eq!(error["error"]["code"], "method_not_allowed");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the Allow header"),
        "{error}"
    );

    let big = format!(r#"{{"customer_id":"{}"}}"#, "x".repeat(3 << 20));
    let (status, error) = app.post_raw("application/json", &big).await;
    assert_eq!(status, 413);
    assert_eq!(error["error"]["code"], "payload_too_large");
    assert_eq!(
        error["error"]["message"],
        "request body over the limit of 2 MiB"
    );
    assert_eq!(app.orders().await, 0);
}

/// The test topics keep records for the broker's default 7 days; an inbox that forgets
/// ids after an hour could meet a copy of an event it no longer knows.
#[tokio::test]
async fn a_service_whose_inbox_forgets_sooner_than_its_topics_refuses_to_start() {
    let (db, kafka) = tokio::join!(TestDatabase::empty(), TestKafka::new());
    let mut config = config(&db, &kafka, defaults());
    let mut retention = RetentionConfig::off();
    retention.inbox_retention = Window::Of(Duration::from_secs(3600));
    retention.pruning.prune_interval = Window::Of(Duration::from_secs(60));
    config.retention = retention;
    let app = Application::build(config).await.unwrap();

    let error = app
        .run_until_stopped(CancellationToken::new())
        .await
        .unwrap_err();

    let message = format!("{error:#}");
    assert!(message.contains("INBOX_RETENTION is 1h"), "{message}");
    assert!(message.contains("retention.ms 604800000"), "{message}");
    assert!(
        message.contains(&format!("{}payments", kafka.namespace)),
        "{message}"
    );
}
