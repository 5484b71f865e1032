//! A charge whatever the card provider does: an answer lost, late or refused, the
//! provider down or slower than the timeout; the intent committed before every call, and
//! copies of one event asking under one key.

mod common;

use std::time::Duration;

use common::charging::{created_by_order_service, fixture};
use saga::{Outcome, Retry};
use serde_json::json;

/// The provider commits the charge and drops the connection before answering: the call
/// fails as transient, the payment's intent is left `unknown`, and the retry (same key)
/// gets the first charge back.
#[tokio::test]
async fn a_lost_answer_and_the_retry_record_the_first_charge_once() {
    let f = fixture().await;
    let handler = f.handler();
    for round in 0..5 {
        let (order_id, event) = created_by_order_service(2598);
        f.provider
            .arm(json!({"kind": "lose-response", "next": 1}))
            .await;

        let error = handler.apply(&event).await.unwrap_err();
        assert_eq!(error.retry(), Retry::UntilItWorks, "round {round}: {error}");
        assert_eq!(
            f.charges(order_id).await.len(),
            1,
            "round {round}: the charge is made"
        );
        assert_eq!(
            f.status(order_id).await.as_deref(),
            Some("unknown"),
            "round {round}: the charge may or may not be made"
        );

        assert_eq!(handler.apply(&event).await.unwrap(), Outcome::Applied);
        f.charged_once(order_id, 2598).await;
    }
    let stats = f.provider.stats().await;
    assert_eq!(
        (stats["lost_responses"].as_u64(), stats["replayed"].as_u64()),
        (Some(5), Some(5))
    );
}

/// Down (503) or not even listening: each attempt fails as transient (the consumer
/// retries those for as long as it takes, never dead-letters them), and none decides
/// anything: the payment stays `unknown`, with no result and no `payment.failed`.
#[tokio::test]
async fn a_provider_that_is_down_is_waited_out_and_decides_nothing_meanwhile() {
    let f = fixture().await;
    let (order_id, event) = created_by_order_service(2598);

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let error = f.handler_at(&nowhere).apply(&event).await.unwrap_err();
    assert_eq!(error.retry(), Retry::UntilItWorks, "{error}");

    f.provider
        .arm(json!({"kind": "unavailable", "next": 3}))
        .await;
    let handler = f.handler();
    for _ in 0..3 {
        let error = handler.apply(&event).await.unwrap_err();
        assert_eq!(error.retry(), Retry::UntilItWorks, "{error}");
        assert!(error.to_string().contains("503"), "{error}");
    }
    assert_eq!(f.status(order_id).await.as_deref(), Some("unknown"));
    assert!(f.results(order_id).await.is_empty());
    assert!(f.charges(order_id).await.is_empty());

    assert_eq!(handler.apply(&event).await.unwrap(), Outcome::Applied);
    f.charged_once(order_id, 2598).await;
}

/// Slower than payment-service's timeout: the call is given up on and made again with the
/// same key, and the order is charged once.
#[tokio::test]
async fn a_provider_slower_than_the_timeout_is_asked_again_and_charges_once() {
    let f = fixture().await;
    let handler = f.handler();
    let (order_id, event) = created_by_order_service(2598);
    f.provider
        .arm(json!({"kind": "slow", "delay_ms": 1500, "next": 1}))
        .await;

    let error = handler.apply(&event).await.unwrap_err();
    assert_eq!(error.retry(), Retry::UntilItWorks, "{error}");
    let outcome = saga_testkit::eventually(
        Duration::from_secs(10),
        "the retry to be answered",
        || async {
            match handler.apply(&event).await {
                Ok(outcome) => Some(outcome),
                // 409: the slow first call still holds the key.
                Err(error) if error.retry() == Retry::UntilItWorks => None,
                Err(error) => panic!("{error}"),
            }
        },
    )
    .await;
    assert_eq!(outcome, Outcome::Applied);
    f.charged_once(order_id, 2598).await;
}

/// A request the provider calls wrong cannot become right by asking again: rejected (the
/// consumer dead-letters it at once) with the provider's answer as the reason. Its intent
/// stays, undecided: the order's cancellation (its deadline's, if no one else's) meets
/// it, and leaves it to a person with the provider's answer.
#[tokio::test]
async fn a_request_the_provider_refuses_as_wrong_is_rejected_with_its_answer() {
    let f = fixture().await;
    let (order_id, event) = created_by_order_service(0);

    let error = f.handler().apply(&event).await.unwrap_err();

    assert_eq!(error.retry(), Retry::Never);
    let reason = error.to_string();
    assert!(
        reason.contains("400") && reason.contains("amount_cents"),
        "{reason}"
    );
    assert_eq!(f.status(order_id).await.as_deref(), Some("charging"));
}

/// The order's key already charged another amount (a hand-made `order.created` with
/// another id and amount, say): the provider refuses the key's reuse, and so the event.
#[tokio::test]
async fn an_order_whose_key_charged_another_amount_is_rejected_not_charged_again() {
    let f = fixture().await;
    let (order_id, event) = created_by_order_service(2598);
    let key = payment_service::payment::charge_key(order_id);
    let (status, _) = f
        .provider
        .charge(
            &key,
            &json!({"amount_cents": 1, "currency": "usd", "reference": order_id}),
        )
        .await;
    assert_eq!(status, 201);

    let error = f.handler().apply(&event).await.unwrap_err();

    assert_eq!(error.retry(), Retry::Never);
    assert!(
        error.to_string().contains("idempotency_key_reused"),
        "{error}"
    );
    assert_eq!(f.charges(order_id).await.len(), 1);
}

/// Intent before effect: while the provider is still working on the charge, the payment
/// that names it and its key is committed here already, so no charge can stand that no
/// row knows of, whatever stops this call.
#[tokio::test]
async fn every_charge_is_asked_for_only_after_its_intent_is_committed() {
    let f = fixture().await;
    let handler = f.handler();
    for round in 0..3 {
        let (order_id, event) = created_by_order_service(2598);
        f.provider
            .arm(json!({"kind": "slow", "delay_ms": 1500, "next": 1}))
            .await;
        let calls_before = f.provider.stats().await["calls"].as_u64().unwrap();

        let charging = handler.apply(&event);
        let watching = async {
            saga_testkit::eventually(Duration::from_secs(5), "the call to arrive", || async {
                let calls = f.provider.stats().await["calls"].as_u64().unwrap();
                (calls > calls_before).then_some(())
            })
            .await;
            let row =
                f.db.client()
                    .await
                    .query_one(
                        "SELECT status, charge_key FROM payments WHERE order_id = $1",
                        &[&order_id],
                    )
                    .await
                    .unwrap();
            (row.get::<_, String>(0), row.get::<_, String>(1))
        };
        let (gave_up, (status, key)) = tokio::join!(charging, watching);

        assert_eq!(status, "charging", "round {round}");
        assert_eq!(key, format!("{order_id}:charge"), "round {round}");
        assert!(
            gave_up.is_err(),
            "round {round}: the call outlived its timeout"
        );
        assert_eq!(f.status(order_id).await.as_deref(), Some("unknown"));
    }
}

/// Two copies of one `order.created` prepared at once (a batch holding both, or a copy
/// prepared ahead while the first is): whichever writes the intent, the other finds it
/// as its own and asks under the same key, so the copy applied first records the charge
/// and the other is a duplicate. Never a charge made and its answer dropped.
#[tokio::test]
async fn two_copies_of_an_order_created_prepared_at_once_record_its_one_charge() {
    let f = fixture().await;
    let handler = f.handler();
    for round in 0..30 {
        let (order_id, event) = created_by_order_service(2598);
        let (first, second) = tokio::join!(handler.prepare(&event), handler.prepare(&event));
        let first = handler.apply_prepared(&event, first.unwrap()).await;
        let second = handler.apply_prepared(&event, second.unwrap()).await;

        assert_eq!(
            (first.unwrap(), second.unwrap()),
            (Outcome::Applied, Outcome::Duplicate),
            "round {round}"
        );
        assert_eq!(f.status(order_id).await.as_deref(), Some("succeeded"));
        assert_eq!(f.results(order_id).await.len(), 1, "round {round}");
        f.charged_once(order_id, 2598).await;
    }
}
