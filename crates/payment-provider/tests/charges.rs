//! The provider against a real PostgreSQL, over real HTTP: each key charges once, whatever
//! is repeated, raced or lost.

mod common;

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use common::{provider, provider_with, request};
use saga_testkit::eventually;

#[tokio::test]
async fn a_key_charges_once_and_every_retry_gets_the_first_answer() {
    let provider = provider().await;
    let body = request("order-1", 1299);

    let first = provider.charge(Some("k-1"), &body).await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed);
    assert!(first.body["id"].as_str().unwrap().starts_with("ch_"));
    assert_eq!(first.body["status"], "succeeded");
    assert_eq!(first.body["amount_cents"], 1299);
    for _ in 0..3 {
        let again = provider.charge(Some("k-1"), &body).await.unwrap();
        assert_eq!(again.status, StatusCode::CREATED);
        assert!(again.replayed);
        assert_eq!(again.body, first.body);
    }

    let mut charges = provider.admin.charges_for("order-1").await;
    assert_eq!(charges.len(), 1, "{charges:?}");
    let refunds = charges[0].as_object_mut().unwrap().remove("refunds");
    assert_eq!(
        refunds,
        Some(json!([])),
        "the list shows each charge's refunds"
    );
    assert_eq!(charges[0], first.body);
    let stats = provider.admin.stats().await;
    assert_eq!(
        (
            stats["calls"].as_u64(),
            stats["charged"].as_u64(),
            stats["replayed"].as_u64()
        ),
        (Some(4), Some(1), Some(3))
    );
}

#[tokio::test]
async fn above_the_limit_is_declined_with_its_reason_and_the_decline_is_replayed() {
    let provider = provider_with(|config| config.payment_limit_cents = 1000).await;
    let body = request("order-2", 1001);

    let declined = provider.charge(Some("k-2"), &body).await.unwrap();
    assert_eq!(declined.status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(declined.body["error"]["code"], "card_declined");
    assert_eq!(declined.body["error"]["message"], "amount exceeds limit");
    let again = provider.charge(Some("k-2"), &body).await.unwrap();
    assert_eq!(again.status, StatusCode::PAYMENT_REQUIRED);
    assert!(again.replayed);
    assert_eq!(again.body, declined.body);

    let charges = provider.admin.charges_for("order-2").await;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0]["status"], "failed");
    assert_eq!(charges[0]["id"], declined.body["error"]["charge"]);
}

#[tokio::test]
async fn a_used_key_with_another_request_is_refused_and_charges_nothing() {
    let provider = provider().await;
    provider
        .charge(Some("k-3"), &request("order-3", 500))
        .await
        .unwrap();

    let other = provider
        .charge(Some("k-3"), &request("order-3", 501))
        .await
        .unwrap();
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other.body["error"]["code"], "idempotency_key_reused");
    assert_eq!(provider.admin.charges_for("order-3").await.len(), 1);
}

#[tokio::test]
async fn a_charge_without_a_key_or_with_a_bad_field_is_refused_naming_what_is_wrong() {
    let provider = provider().await;
    let missing = provider
        .charge(None, &request("order-4", 500))
        .await
        .unwrap();
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(missing.body["error"]["code"], "idempotency_key_missing");

    for (body, field) in [
        (
            json!({"currency": "usd", "reference": "order-4"}),
            "amount_cents",
        ),
        (
            json!({"amount_cents": 0, "currency": "usd", "reference": "order-4"}),
            "amount_cents",
        ),
        (
            json!({"amount_cents": 5, "currency": "USD", "reference": "order-4"}),
            "currency",
        ),
        (
            json!({"amount_cents": 5, "currency": "usd", "reference": ""}),
            "reference",
        ),
        (
            json!({"amount_cents": 5, "currency": "usd", "reference": 7}),
            "reference",
        ),
        (
            json!({"amount_cents": 5, "currency": "usd", "reference": "order-4", "tip": 1}),
            "tip",
        ),
        (json!([1, 2]), "body"),
    ] {
        let refused = provider.charge(Some("k-4"), &body).await.unwrap();
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(refused.body["error"]["code"], "invalid_field", "{body}");
        assert_eq!(refused.body["error"]["field"], field, "{body}");
    }
    assert!(provider.admin.charges_for("order-4").await.is_empty());
}

/// Calls racing with one key: every one gets the same charge, and one is made.
#[tokio::test]
async fn calls_racing_with_one_key_make_one_charge() {
    let provider = provider().await;
    for round in 0..20 {
        let reference = format!("order-race-{round}");
        let body = request(&reference, 700);
        let key = format!("k-race-{round}");
        let answers =
            futures::future::join_all((0..6).map(|_| provider.charge(Some(&key), &body))).await;
        let ids: Vec<Value> = answers
            .into_iter()
            .map(|answer| {
                let answer = answer.unwrap();
                assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
                answer.body["id"].clone()
            })
            .collect();
        assert!(ids.iter().all(|id| *id == ids[0]), "round {round}: {ids:?}");
        assert_eq!(
            provider.admin.charges_for(&reference).await.len(),
            1,
            "round {round}"
        );
    }
}

#[tokio::test]
async fn a_lost_answer_leaves_the_charge_made_and_the_retry_gets_it() {
    let provider = provider().await;
    let body = request("order-5", 900);
    provider
        .admin
        .arm(json!({"kind": "lose-response", "next": 1}))
        .await;

    let lost = provider.charge(Some("k-5"), &body).await;
    let error = lost.err().expect("the answer is lost, not sent");
    assert!(!error.is_status() && !error.is_timeout(), "{error:?}");
    let made = provider.admin.charges_for("order-5").await;
    assert_eq!(
        made.len(),
        1,
        "the charge was committed before the answer was dropped"
    );

    let retry = provider.charge(Some("k-5"), &body).await.unwrap();
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed);
    assert_eq!(retry.body["id"], made[0]["id"]);
    assert_eq!(provider.admin.charges_for("order-5").await.len(), 1);
    assert_eq!(provider.admin.stats().await["lost_responses"], 1);
}

#[tokio::test]
async fn an_unavailable_provider_charges_nothing_until_it_is_back() {
    let provider = provider().await;
    let body = request("order-6", 900);
    provider
        .admin
        .arm(json!({"kind": "unavailable", "next": 2}))
        .await;

    for _ in 0..2 {
        let refused = provider.charge(Some("k-6"), &body).await.unwrap();
        assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.body["error"]["code"], "unavailable");
        assert!(provider.admin.charges_for("order-6").await.is_empty());
    }
    let charged = provider.charge(Some("k-6"), &body).await.unwrap();
    assert_eq!(charged.status, StatusCode::CREATED);
    assert!(!charged.replayed);
}

/// A caller that gives up on a slow call and retries with the key gets one charge,
/// whether the first call finished before the retry or not.
#[tokio::test]
async fn a_slow_call_given_up_on_and_retried_with_its_key_charges_once() {
    let provider = provider().await;
    let body = request("order-7", 900);
    provider
        .admin
        .arm(json!({"kind": "slow", "delay_ms": 400, "next": 1}))
        .await;

    let gave_up = provider
        .charge_within(Some("k-7"), &body, Duration::from_millis(100))
        .await;
    assert!(gave_up.err().is_some_and(|e| e.is_timeout()));
    let retry = provider.charge(Some("k-7"), &body).await.unwrap();
    assert_eq!(retry.status, StatusCode::CREATED);
    let charges = provider.admin.charges_for("order-7").await;
    assert_eq!(charges.len(), 1, "{charges:?}");
    assert_eq!(charges[0]["id"], retry.body["id"]);
}

/// A commit held past its caller's timeout: the caller hears nothing, the charge is
/// written but no read shows it until the commit, and it is made all the same; a call
/// with the key meanwhile queues on the key's claim and gets the charge once committed.
#[tokio::test]
async fn a_late_commit_is_unseen_until_it_comes_and_then_is_the_one_charge() {
    let provider =
        provider_with(|config| config.keys.idempotency_key_wait = Duration::from_secs(30)).await;
    let body = request("order-8", 900);
    provider
        .admin
        .arm(json!({"kind": "commit-late", "delay_ms": 3000, "next": 1}))
        .await;

    let gave_up = provider
        .charge_within(Some("k-8"), &body, Duration::from_millis(200))
        .await;
    assert!(gave_up.err().is_some_and(|e| e.is_timeout()));
    // An insert into `charges` not yet committed: the held charge.
    let held = "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
                 WHERE l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                   AND c.relname = 'charges' AND l.mode = 'RowExclusiveLock'";
    eventually(
        Duration::from_secs(30),
        "the charge written and its commit held",
        || async { (provider.db.count(held, &[]).await > 0).then_some(()) },
    )
    .await;
    let listed = provider.admin.charges_for("order-8").await;
    assert!(
        provider.db.count(held, &[]).await > 0,
        "the list was read while the commit was held"
    );
    assert!(
        listed.is_empty(),
        "an uncommitted charge is listed: {listed:?}"
    );

    let retry = provider.charge(Some("k-8"), &body).await.unwrap();
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.body);
    assert!(retry.replayed, "the retry waited for the held charge");
    let made = provider.admin.charges_for("order-8").await;
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(made[0]["id"], retry.body["id"]);
    let stats = provider.admin.stats().await;
    assert_eq!(
        (stats["committed_late"].as_u64(), stats["charged"].as_u64()),
        (Some(1), Some(1))
    );
}

/// A list that is not read-after-write: a charge just made is left out until it is older
/// than the lag, and listed from then on; disarmed, the list is current again.
#[tokio::test]
async fn a_lagging_list_leaves_out_a_fresh_charge_until_it_is_older_than_the_lag() {
    let provider = provider().await;
    let lag = Duration::from_millis(2000);
    provider
        .admin
        .arm(json!({"kind": "list-lag", "lag_ms": 2000}))
        .await;
    let faults: Value = provider
        .http
        .get(format!("{}/admin/fault", provider.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        faults["faults"],
        json!({"charges": null, "refunds": null, "list": {"kind": "list-lag", "lag_ms": 2000, "rate": 1.0}})
    );

    let started = Instant::now();
    let made = provider
        .charge(Some("k-9"), &request("order-9", 900))
        .await
        .unwrap();
    assert_eq!(made.status, StatusCode::CREATED);
    let fresh = provider.admin.charges_for("order-9").await;
    let listed_after = started.elapsed();
    assert!(
        listed_after < lag,
        "the list came {listed_after:?} after the charge: not fresh"
    );
    assert!(
        fresh.is_empty(),
        "a charge younger than the lag is listed: {fresh:?}"
    );

    let listed = eventually(Duration::from_secs(30), "the charge listed", || async {
        let listed = provider.admin.charges_for("order-9").await;
        (!listed.is_empty()).then_some(listed)
    })
    .await;
    assert!(
        started.elapsed() >= lag,
        "listed {:?} after it was made",
        started.elapsed()
    );
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["id"], made.body["id"]);
    let stats = provider.admin.stats().await;
    assert!(stats["list"]["lagged"].as_u64() >= Some(2), "{stats}");
    assert_eq!(stats["list"]["lagged"], stats["list"]["calls"]);

    let disarmed = provider
        .http
        .delete(format!("{}/admin/fault?endpoint=list", provider.url))
        .send()
        .await
        .unwrap();
    assert_eq!(disarmed.status(), StatusCode::OK);
    let again = provider
        .charge(Some("k-9b"), &request("order-9", 900))
        .await
        .unwrap();
    let current = provider.admin.charges_for("order-9").await;
    assert_eq!(current.len(), 2, "{current:?}");
    assert_eq!(current[1]["id"], again.body["id"]);
}

#[tokio::test]
async fn a_fault_that_makes_no_sense_is_refused_naming_the_field() {
    let provider = provider().await;
    let response = provider
        .http
        .put(format!("{}/admin/fault", provider.url))
        .json(&json!({"kind": "slow"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("delay_ms"),
        "{body}"
    );
}

#[tokio::test]
async fn a_path_or_method_it_does_not_serve_is_the_same_json_error() {
    let provider = provider().await;
    for (request, status, code) in [
        (
            provider.http.get(format!("{}/v1/payouts", provider.url)),
            404,
            "not_found",
        ),
        (
            provider.http.delete(format!("{}/v1/charges", provider.url)),
            405,
            "method_not_allowed",
        ),
    ] {
        let answer = request.send().await.unwrap();
        assert_eq!(answer.status(), status);
        let error: Value = answer.json().await.unwrap();
        assert_eq!(error["error"]["code"], code, "{error}");
    }
}
