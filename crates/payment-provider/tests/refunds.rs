//! Refunds against a real PostgreSQL, over real HTTP: each charge is refunded once,
//! whatever is repeated, raced or lost, and under whichever key.

mod common;

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use common::{Provider, provider, provider_with, request};

/// A charge of `amount_cents` for `reference`: its id.
async fn charged(provider: &Provider, reference: &str, amount_cents: i64) -> String {
    let answer = provider
        .charge(
            Some(&format!("{reference}:charge:{amount_cents}")),
            &request(reference, amount_cents),
        )
        .await
        .unwrap();
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    answer.body["id"].as_str().unwrap().to_owned()
}

fn refund_of(charge_id: &str, amount_cents: i64) -> Value {
    json!({ "charge_id": charge_id, "amount_cents": amount_cents })
}

/// The refund rows of `charge_id`, counted in the provider's database.
async fn refund_rows(provider: &Provider, charge_id: &str) -> i64 {
    provider
        .db
        .count(
            "SELECT count(*) FROM refunds WHERE charge_id = $1",
            &[&charge_id],
        )
        .await
}

#[tokio::test]
async fn a_refund_is_made_once_and_every_retry_with_its_key_gets_the_first_answer() {
    let provider = provider().await;
    let charge_id = charged(&provider, "order-r1", 1299).await;
    let body = refund_of(&charge_id, 1299);

    let first = provider
        .refund(Some("order-r1:refund"), &body)
        .await
        .unwrap();
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    assert!(!first.replayed);
    let id = first.body["id"].as_str().unwrap();
    assert!(id.starts_with("re_") && id.len() == 35, "{id}");
    assert_eq!(first.body["charge_id"], charge_id.as_str());
    assert_eq!(first.body["amount_cents"], 1299);
    assert_eq!(first.body["currency"], "usd");
    assert_eq!(first.body["status"], "succeeded");
    for _ in 0..3 {
        let again = provider
            .refund(Some("order-r1:refund"), &body)
            .await
            .unwrap();
        assert_eq!(again.status, StatusCode::CREATED);
        assert!(again.replayed);
        assert_eq!(again.body, first.body);
    }

    assert_eq!(refund_rows(&provider, &charge_id).await, 1);
    let shown: Value = provider
        .http
        .get(format!("{}/v1/refunds/{id}", provider.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(shown, first.body);
    let stats = provider.admin.stats().await;
    assert_eq!(
        stats["refunds"],
        json!({"calls": 4, "refunded": 1, "replayed": 3, "unavailable": 0, "slowed": 0, "lost_responses": 0, "committed_late": 0, "refused": 0})
    );
    assert_eq!(
        stats["calls"], 1,
        "the charge's count holds the charge alone"
    );
}

#[tokio::test]
async fn a_lost_refund_answer_leaves_the_refund_made_and_the_retry_gets_it() {
    let provider = provider().await;
    let charge_id = charged(&provider, "order-r2", 900).await;
    let body = refund_of(&charge_id, 900);
    provider
        .admin
        .arm(json!({"kind": "lose-response", "next": 1, "endpoint": "refunds"}))
        .await;

    let lost = provider.refund(Some("order-r2:refund"), &body).await;
    let error = lost.err().expect("the answer is lost, not sent");
    assert!(!error.is_status() && !error.is_timeout(), "{error:?}");
    assert_eq!(
        refund_rows(&provider, &charge_id).await,
        1,
        "the refund was committed before the answer was dropped"
    );

    let retry = provider
        .refund(Some("order-r2:refund"), &body)
        .await
        .unwrap();
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed);
    let listed = provider.admin.charges_for("order-r2").await;
    assert_eq!(listed[0]["refunds"][0]["id"], retry.body["id"]);
    assert_eq!(refund_rows(&provider, &charge_id).await, 1);
    let stats = provider.admin.stats().await;
    assert_eq!(stats["refunds"]["lost_responses"], 1);
    assert_eq!(stats["lost_responses"], 0);
}

#[tokio::test]
async fn a_second_key_for_a_refunded_charge_is_refused_and_makes_no_second_refund() {
    let provider = provider().await;
    let charge_id = charged(&provider, "order-r3", 500).await;
    let first = provider
        .refund(Some("order-r3:refund"), &refund_of(&charge_id, 500))
        .await
        .unwrap();
    assert_eq!(first.status, StatusCode::CREATED);

    for amount_cents in [500, 100] {
        let again = provider
            .refund(Some("another-key"), &refund_of(&charge_id, amount_cents))
            .await
            .unwrap();
        assert_eq!(again.status, StatusCode::BAD_REQUEST, "{}", again.body);
        assert_eq!(again.body["error"]["code"], "charge_already_refunded");
        assert!(!again.replayed);
    }
    assert_eq!(refund_rows(&provider, &charge_id).await, 1);
}

#[tokio::test]
async fn an_unknown_charge_is_not_found_and_keeps_no_key() {
    let provider = provider().await;
    let unknown = provider
        .refund(Some("k-unknown"), &refund_of("ch_unknown", 100))
        .await
        .unwrap();
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.body["error"]["code"], "charge_not_found");
    let keys = provider
        .db
        .count(
            "SELECT count(*) FROM idempotency_keys WHERE key = 'k-unknown'",
            &[],
        )
        .await;
    assert_eq!(keys, 0);
}

#[tokio::test]
async fn a_declined_charge_is_not_refundable() {
    let provider = provider_with(|config| config.payment_limit_cents = 1000).await;
    let declined = provider
        .charge(Some("order-r5:charge"), &request("order-r5", 1001))
        .await
        .unwrap();
    assert_eq!(declined.status, StatusCode::PAYMENT_REQUIRED);
    let charge_id = declined.body["error"]["charge"].as_str().unwrap();

    let refused = provider
        .refund(Some("order-r5:refund"), &refund_of(charge_id, 1001))
        .await
        .unwrap();
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert_eq!(refused.body["error"]["code"], "charge_not_refundable");
    assert_eq!(refund_rows(&provider, charge_id).await, 0);
}

/// A refused request stores nothing with its key: the same key with the body put right
/// makes the refund.
#[tokio::test]
async fn more_than_was_charged_is_refused_naming_the_amount_and_the_key_stays_free() {
    let provider = provider().await;
    let charge_id = charged(&provider, "order-r6", 700).await;

    let refused = provider
        .refund(Some("order-r6:refund"), &refund_of(&charge_id, 701))
        .await
        .unwrap();
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert_eq!(refused.body["error"]["code"], "invalid_field");
    assert_eq!(refused.body["error"]["field"], "amount_cents");
    assert_eq!(refund_rows(&provider, &charge_id).await, 0);

    let partial = provider
        .refund(Some("order-r6:refund"), &refund_of(&charge_id, 300))
        .await
        .unwrap();
    assert_eq!(partial.status, StatusCode::CREATED, "{}", partial.body);
    assert!(!partial.replayed);
    assert_eq!(partial.body["amount_cents"], 300);
}

#[tokio::test]
async fn a_refund_without_a_key_or_with_a_bad_field_is_refused_naming_what_is_wrong() {
    let provider = provider().await;
    let charge_id = charged(&provider, "order-r7", 700).await;
    let missing = provider
        .refund(None, &refund_of(&charge_id, 700))
        .await
        .unwrap();
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.body["error"]["code"], "idempotency_key_missing");

    for (body, field) in [
        (json!({"amount_cents": 5}), "charge_id"),
        (json!({"charge_id": 7, "amount_cents": 5}), "charge_id"),
        (json!({"charge_id": &charge_id}), "amount_cents"),
        (
            json!({"charge_id": &charge_id, "amount_cents": 0}),
            "amount_cents",
        ),
        (
            json!({"charge_id": &charge_id, "amount_cents": 5, "reason": "x"}),
            "reason",
        ),
        (json!("refund"), "body"),
    ] {
        let refused = provider.refund(Some("k-7"), &body).await.unwrap();
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(refused.body["error"]["code"], "invalid_field", "{body}");
        assert_eq!(refused.body["error"]["field"], field, "{body}");
    }

    let made = provider
        .refund(Some("k-7"), &refund_of(&charge_id, 700))
        .await
        .unwrap();
    assert_eq!(made.status, StatusCode::CREATED);
    let reused = provider
        .refund(Some("k-7"), &refund_of(&charge_id, 600))
        .await
        .unwrap();
    assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(reused.body["error"]["code"], "idempotency_key_reused");
    let charge_key = provider
        .charge(Some("k-7"), &request("order-r7", 700))
        .await
        .unwrap();
    assert_eq!(
        charge_key.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "a refund's key is no charge's"
    );
}

#[tokio::test]
async fn the_charges_list_and_the_charge_show_its_refund() {
    let provider = provider().await;
    let charge_id = charged(&provider, "order-r8", 1500).await;
    charged(&provider, "order-r8", 200).await;
    let refund = provider
        .refund(Some("order-r8:refund"), &refund_of(&charge_id, 1000))
        .await
        .unwrap()
        .body;
    let shown = json!([{
        "id": refund["id"],
        "amount_cents": 1000,
        "created_at": refund["created_at"],
    }]);

    let listed = provider.admin.charges_for("order-r8").await;
    let refunds: Vec<&Value> = listed.iter().map(|charge| &charge["refunds"]).collect();
    assert_eq!(refunds, [&shown, &json!([])], "{listed:?}");
    let charge: Value = provider
        .http
        .get(format!("{}/v1/charges/{charge_id}", provider.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(charge["refunds"], shown);
    let unknown = provider
        .http
        .get(format!("{}/v1/refunds/re_unknown", provider.url))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
    let error: Value = unknown.json().await.unwrap();
    assert_eq!(error["error"]["code"], "refund_not_found");
}

#[tokio::test]
async fn a_fault_armed_on_one_endpoint_leaves_the_other_untouched() {
    let provider = provider().await;
    let charge_id = charged(&provider, "order-r9", 900).await;
    let refund = refund_of(&charge_id, 900);
    provider
        .admin
        .arm(json!({"kind": "unavailable", "endpoint": "refunds"}))
        .await;
    let refused = provider
        .refund(Some("order-r9:refund"), &refund)
        .await
        .unwrap();
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    let charge = provider
        .charge(Some("c-9"), &request("order-r9b", 900))
        .await
        .unwrap();
    assert_eq!(
        charge.status,
        StatusCode::CREATED,
        "charges draw no refunds' fault"
    );

    provider.admin.arm(json!({"kind": "unavailable"})).await;
    let faults: Value = provider
        .http
        .get(format!("{}/admin/fault", provider.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let unavailable = json!({"kind": "unavailable", "rate": 1.0});
    assert_eq!(
        faults,
        json!({"fault": unavailable, "faults": {"charges": unavailable, "refunds": unavailable, "list": null}})
    );
    let disarmed = provider
        .http
        .delete(format!("{}/admin/fault?endpoint=refunds", provider.url))
        .send()
        .await
        .unwrap();
    assert_eq!(disarmed.status(), StatusCode::OK);
    let made = provider
        .refund(Some("order-r9:refund"), &refund)
        .await
        .unwrap();
    assert_eq!(
        made.status,
        StatusCode::CREATED,
        "refunds draw no charges' fault"
    );
    let refused = provider
        .charge(Some("c-9b"), &request("order-r9c", 900))
        .await
        .unwrap();
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    let stats = provider.admin.stats().await;
    assert_eq!(
        (
            stats["unavailable"].as_u64(),
            stats["refunds"]["unavailable"].as_u64()
        ),
        (Some(1), Some(1))
    );

    provider.admin.disarm().await;
    let charged = provider
        .charge(Some("c-9b"), &request("order-r9c", 900))
        .await
        .unwrap();
    assert_eq!(charged.status, StatusCode::CREATED);
}

/// Calls racing with one key: every one gets the same refund, and one is made.
#[tokio::test]
async fn refunds_racing_with_one_key_make_one_refund() {
    let provider = provider().await;
    for round in 0..20 {
        let reference = format!("order-race-{round}");
        let charge_id = charged(&provider, &reference, 700).await;
        let body = refund_of(&charge_id, 700);
        let key = format!("{reference}:refund");
        let answers =
            futures::future::join_all((0..6).map(|_| provider.refund(Some(&key), &body))).await;
        let ids: Vec<Value> = answers
            .into_iter()
            .map(|answer| {
                let answer = answer.unwrap();
                assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
                answer.body["id"].clone()
            })
            .collect();
        assert!(ids.iter().all(|id| *id == ids[0]), "round {round}: {ids:?}");
        assert_eq!(refund_rows(&provider, &charge_id).await, 1, "round {round}");
    }
}

/// The charges' claim, which knows nothing of refunds, takes over an expired refund's key
/// like any other, and the key forgets the refund it made.
#[tokio::test]
async fn a_refunds_key_taken_over_by_a_charge_forgets_the_refund() {
    // Every key is expired by the next call.
    let provider = provider_with(|config| config.keys.idempotency_key_ttl = Duration::ZERO).await;
    let charge_id = charged(&provider, "order-r10", 800).await;
    let made = provider
        .refund(Some("k-10"), &refund_of(&charge_id, 800))
        .await
        .unwrap();
    assert_eq!(made.status, StatusCode::CREATED);
    let refund_key =
        "SELECT count(*) FROM idempotency_keys WHERE key = 'k-10' AND refund_id IS NOT NULL";
    assert_eq!(provider.db.count(refund_key, &[]).await, 1);

    let again = provider
        .refund(Some("k-10"), &refund_of(&charge_id, 800))
        .await
        .unwrap();
    assert_eq!(
        again.body["error"]["code"], "charge_already_refunded",
        "an expired key is a new request, and the charge has its refund"
    );
    let charge = provider
        .charge(Some("k-10"), &request("order-r10b", 800))
        .await
        .unwrap();
    assert_eq!(charge.status, StatusCode::CREATED, "{}", charge.body);
    assert!(!charge.replayed);
    assert_eq!(provider.db.count(refund_key, &[]).await, 0);
    assert_eq!(refund_rows(&provider, &charge_id).await, 1);
}

/// A refund the provider refuses is not made, and the refusal is the key's answer: a
/// replay gets the same refusal, never `charge_already_refunded`, and only a new key
/// tries again.
#[tokio::test]
async fn a_refused_refund_is_not_made_and_its_key_keeps_the_refusal() {
    let provider = provider().await;
    let charge_id = charged(&provider, "order-r11", 900).await;
    let body = refund_of(&charge_id, 900);
    provider
        .admin
        .arm(json!({"kind": "refuse", "endpoint": "refunds", "next": 1}))
        .await;

    let refused = provider
        .refund(Some("order-r11:refund"), &body)
        .await
        .unwrap();
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.body);
    assert_eq!(refused.body["error"]["code"], "charge_disputed");
    assert_eq!(refused.body["error"]["charge"], charge_id.as_str());
    assert!(!refused.replayed);
    assert_eq!(refund_rows(&provider, &charge_id).await, 0);

    // The fault is spent: what answers now is the key.
    let replay = provider
        .http
        .post(format!("{}/v1/refunds", provider.url))
        .header("Idempotency-Key", "order-r11:refund")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), StatusCode::BAD_REQUEST);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(
        replay.headers().get("location"),
        None,
        "a refusal points at no refund"
    );
    assert_eq!(replay.json::<Value>().await.unwrap(), refused.body);
    assert_eq!(refund_rows(&provider, &charge_id).await, 0);

    let made = provider
        .refund(Some("order-r11:refund:2"), &body)
        .await
        .unwrap();
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    assert_eq!(refund_rows(&provider, &charge_id).await, 1);
    let stats = provider.admin.stats().await;
    assert_eq!(
        (
            stats["refunds"]["refused"].as_u64(),
            stats["refunds"]["replayed"].as_u64(),
            stats["refunds"]["refunded"].as_u64()
        ),
        (Some(1), Some(1), Some(1))
    );
}
