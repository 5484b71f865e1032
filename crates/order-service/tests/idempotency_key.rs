//! `POST /v1/orders` with an `Idempotency-Key`: a client's retry gets the first answer and
//! places nothing, whatever the timing. Served in-process against a fresh database.

mod app;

use std::time::Duration;

use app::{Answer, KEYBOARD, defaults, order, spawn_app, spawn_app_with};
use saga::config::IdempotencyConfig;
use saga::idempotency::Fingerprint;
use serde_json::json;
use uuid::Uuid;

fn assert_placed(answer: &Answer) -> String {
    assert_eq!(answer.status, 201, "{}", answer.text);
    assert!(!answer.replayed(), "a first answer is no replay");
    answer.json()["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_retry_with_the_same_key_gets_the_first_answer_and_places_nothing() {
    let app = spawn_app().await;

    let first = app.post_keyed("order-7f3a", &order(2)).await;
    let id = assert_placed(&first);
    // The same request again, as a client library might re-encode it: other whitespace,
    // other key order, the draft's quoted form of the key.
    let retry = app
        .post(
            "application/json",
            &["\"order-7f3a\""],
            &format!(
                r#"{{ "items": [ {{ "quantity": 2, "product_id": "{KEYBOARD}" }} ], "customer_id": "cust-1" }}"#
            ),
        )
        .await;

    assert_eq!(retry.status, 201, "{}", retry.text);
    assert!(retry.replayed(), "{:?}", retry.headers);
    assert_eq!(
        retry.text, first.text,
        "a replay sends the first body, byte for byte"
    );
    assert_eq!(retry.header("location"), Some(&*format!("/v1/orders/{id}")));
    assert_eq!(retry.header("location"), first.header("location"));
    assert_eq!(app.orders().await, 1);
    assert_eq!(
        app.orders_created().await,
        1,
        "one order.created in the outbox"
    );
    let stored_order: Uuid = app
        .db
        .client()
        .await
        .query_one(
            "SELECT order_id FROM idempotency_keys WHERE key = 'order-7f3a'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored_order.to_string(), id);
}

#[tokio::test]
async fn without_a_key_the_same_post_twice_places_two_orders() {
    let app = spawn_app().await;

    let (first, _) = app.post_order(order(1)).await;
    let (second, _) = app.post_order(order(1)).await;

    assert_eq!((first, second), (201, 201));
    assert_eq!(app.orders().await, 2);
    assert_eq!(app.keys().await, 0);
}

#[tokio::test]
async fn the_same_key_with_a_different_request_is_422_and_changes_nothing() {
    let app = spawn_app().await;
    let first = app.post_keyed("k-1", &order(2)).await;
    let id = assert_placed(&first);

    let other = app.post_keyed("k-1", &order(3)).await;

    assert_eq!(other.status, 422, "{}", other.text);
    assert_eq!(other.json()["error"]["code"], "idempotency_key_reused");
    assert!(!other.replayed());
    assert_eq!(app.orders().await, 1);
    // The key still stands for its first request.
    let retry = app.post_keyed("k-1", &order(2)).await;
    assert!(retry.replayed());
    assert_eq!(retry.json()["id"], id.as_str());
}

#[tokio::test]
async fn an_unusable_key_is_400_naming_the_rule_and_stores_nothing() {
    let app = spawn_app().await;
    let body = order(1).to_string();
    let too_long = "k".repeat(256);
    let cases: [(&str, Vec<&str>, &str); 5] = [
        ("empty", vec![""], "must not be empty"),
        ("empty quoted", vec!["\"\""], "must not be empty"),
        ("too long", vec![&too_long], "at most 255 characters"),
        ("sent twice", vec!["a", "b"], "more than once"),
        ("malformed", vec!["two words"], "quoted string"),
    ];
    for (case, keys, rule) in cases {
        let answer = app.post("application/json", &keys, &body).await;
        assert_eq!(answer.status, 400, "{case}: {}", answer.text);
        let error = answer.json();
        assert_eq!(error["error"]["code"], "invalid_idempotency_key", "{case}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(rule), "{case}: {message}");
    }
    assert_eq!(app.orders().await, 0);
    assert_eq!(app.keys().await, 0);
}

/// Refused before the claim (the body's shape) or after it, inside the transaction (a
/// product the catalog lacks): either way the key is not kept, and the fixed request
/// places the order under it.
#[tokio::test]
async fn a_request_refused_by_validation_keeps_no_key_so_the_fixed_one_may_use_it() {
    let app = spawn_app().await;
    let unknown_product = json!({ "customer_id": "cust-1",
        "items": [{ "product_id": "00000000-0000-4000-8000-000000000000", "quantity": 1 }] });
    for (case, content_type, body, status) in [
        ("malformed JSON", "application/json", "{".to_owned(), 400),
        ("not JSON", "text/plain", order(1).to_string(), 415),
        ("quantity 0", "application/json", order(0).to_string(), 422),
        (
            "unknown product",
            "application/json",
            unknown_product.to_string(),
            422,
        ),
    ] {
        let answer = app.post(content_type, &["fix-me"], &body).await;
        assert_eq!(answer.status, status, "{case}: {}", answer.text);
        assert_eq!(app.keys().await, 0, "{case}: the key was kept");
    }

    let fixed = app.post_keyed("fix-me", &order(1)).await;

    assert_placed(&fixed);
    assert_eq!(app.orders().await, 1);
}

/// Eight clients send one key at once, forty times over: each time exactly one order, and
/// every answer either that order (first or replayed) or 409.
#[tokio::test]
async fn many_concurrent_requests_with_one_key_place_exactly_one_order() {
    let app = spawn_app().await;
    let rounds = 40;
    let body = order(1);
    for round in 0..rounds {
        let key = format!("storm-{round}");
        let answers = futures::future::join_all((0..8).map(|_| app.post_keyed(&key, &body))).await;
        let placed: Vec<&Answer> = answers.iter().filter(|a| a.status == 201).collect();
        for answer in &answers {
            assert!(
                matches!(answer.status, 201 | 409),
                "round {round}: {} {}",
                answer.status,
                answer.text
            );
        }
        assert_eq!(
            placed.iter().filter(|a| !a.replayed()).count(),
            1,
            "round {round}: one request placed the order, the others replayed it"
        );
        let ids: std::collections::BTreeSet<_> =
            placed.iter().map(|a| a.json()["id"].to_string()).collect();
        assert_eq!(ids.len(), 1, "round {round}: {ids:?}");
    }
    assert_eq!(app.orders().await, rounds);
    assert_eq!(app.orders_created().await, rounds);
}

/// The test plays the first request: its own transaction claims the key and stores an
/// answer; the API's request with the key waits on that row, then replays what committed.
#[tokio::test]
async fn a_request_waits_for_the_first_with_its_key_and_replays_its_answer() {
    let app = spawn_app().await;
    let body = order(1);
    let mut client = app.db.client().await;
    let first = client.transaction().await.unwrap();
    let order_id = Uuid::new_v4();
    first
        .execute(
            "INSERT INTO orders (id, customer_id, status, amount_cents)
             VALUES ($1, 'cust-1', 'pending', 1299)",
            &[&order_id],
        )
        .await
        .unwrap();
    let stored = format!(r#"{{"id":"{order_id}","stored":"by the first request"}}"#);
    first
        .execute(
            "INSERT INTO idempotency_keys
                 (key, fingerprint, order_id, response_status, response_body)
             VALUES ('held', $1, $2, 201, $3)",
            &[
                &Fingerprint::of("POST", "/v1/orders", &body).as_bytes(),
                &order_id,
                &stored,
            ],
        )
        .await
        .unwrap();

    let retry = tokio::spawn({
        let (http, url) = (app.http.clone(), format!("{}/v1/orders", app.base));
        async move {
            http.post(url)
                .header("idempotency-key", "held")
                .json(&body)
                .send()
                .await
                .unwrap()
        }
    });
    app.db.a_session_waits_on_a_lock().await;
    first.commit().await.unwrap();
    let retry = retry.await.unwrap();

    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(
        retry.headers()["location"],
        format!("/v1/orders/{order_id}").as_str()
    );
    assert_eq!(retry.text().await.unwrap(), stored);
    assert_eq!(app.orders().await, 1, "the waiting request placed nothing");
}

#[tokio::test]
async fn a_key_held_longer_than_the_wait_is_409_with_retry_after_and_nothing_placed() {
    let mut idempotency = defaults();
    idempotency.keys.idempotency_key_wait = Duration::from_millis(200);
    let app = spawn_app_with(idempotency).await;
    let mut client = app.db.client().await;
    let first = client.transaction().await.unwrap();
    // An order that will never exist: the key's foreign key is checked at commit only.
    first
        .execute(
            "INSERT INTO idempotency_keys
                 (key, fingerprint, order_id, response_status, response_body)
             VALUES ('busy', '\\x00', gen_random_uuid(), 201, '{}')",
            &[],
        )
        .await
        .unwrap();

    let answer = app.post_keyed("busy", &order(1)).await;

    assert_eq!(answer.status, 409, "{}", answer.text);
    assert_eq!(answer.json()["error"]["code"], "idempotency_key_in_use");
    assert_eq!(answer.header("retry-after"), Some("1"));
    assert_eq!(app.orders().await, 0);
    // The holder gives up (a crash, a rollback): the retry places the order.
    first.rollback().await.unwrap();
    assert_placed(&app.post_keyed("busy", &order(1)).await);
    assert_eq!(app.orders().await, 1);
}

#[tokio::test]
async fn an_expired_key_is_a_new_request() {
    let app = spawn_app().await;
    let first = assert_placed(&app.post_keyed("old", &order(1)).await);
    // 25 hours ago, past the default TTL of 24 h.
    app.db
        .client()
        .await
        .execute(
            "UPDATE idempotency_keys SET created_at = now() - interval '25 hours'",
            &[],
        )
        .await
        .unwrap();

    let again = app.post_keyed("old", &order(1)).await;

    let second = assert_placed(&again);
    assert_ne!(first, second);
    assert_eq!(app.orders().await, 2);
    // The key now stands for the second order.
    let retry = app.post_keyed("old", &order(1)).await;
    assert!(retry.replayed());
    assert_eq!(retry.json()["id"], second.as_str());
}

#[tokio::test]
async fn a_missing_key_is_400_when_keys_are_required() {
    let app = spawn_app_with(IdempotencyConfig {
        require_idempotency_key: true,
        ..defaults()
    })
    .await;

    let (status, error) = app.post_order(order(1)).await;

    assert_eq!(status, 400, "{error}");
    assert_eq!(error["error"]["code"], "idempotency_key_missing");
    assert_eq!(app.orders().await, 0);
    assert_placed(&app.post_keyed("k", &order(1)).await);
}
