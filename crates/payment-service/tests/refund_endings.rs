//! Every cancellation's money ends where everyone sees it, whatever the provider does: a
//! refund refused is `failed` with its reason, and an operator's retry refunds it once; a
//! payment no refund can be asked for is `manual` at once; a charge that commits after its
//! caller gave up is resolved under its own key, never read as "nothing charged" from a
//! list that cannot see it. Against a real PostgreSQL and a real provider.

mod common;

use std::time::Duration;

use common::on_orders::{Fixture, apply_until_done, cancelled, created, fixture};
use payment_service::retry_refund::{Retried, retry_refund};
use saga::{HandlerError, Outcome, Topics};
use serde_json::json;
use uuid::Uuid;

impl Fixture {
    async fn retry(&self, order_id: Uuid) -> Result<Retried, HandlerError> {
        let provider = self.provider.client(Duration::from_millis(500));
        retry_refund(&self.db.pool, &Topics::new(""), &provider, order_id).await
    }

    /// `n` operators retrying at once, each again while the key is still running for
    /// another (`Unavailable`): what each was answered.
    async fn retries_at_once(&self, order_id: Uuid, n: usize) -> Vec<Retried> {
        let retries = (0..n).map(|_| async {
            loop {
                match self.retry(order_id).await {
                    Ok(retried) => return retried,
                    Err(HandlerError::Unavailable(_)) => {}
                    Err(error) => panic!("{order_id}: {error}"),
                }
            }
        });
        futures::future::join_all(retries).await
    }

    /// The refunds the provider made of the order's charges.
    async fn provider_refunds(&self, order_id: Uuid) -> Vec<serde_json::Value> {
        self.charges(order_id)
            .await
            .iter()
            .flat_map(|charge| charge["refunds"].as_array().cloned().unwrap_or_default())
            .collect()
    }
}

/// Refused twice (a disputed charge, say), then made: each refusal is recorded at once
/// with the provider's code and announced, the cancellation is answered on its first
/// attempt (no retry loop, no dead letter), each retry asks under a key of its own, and a
/// retry after the refund answers with it and asks nothing.
#[tokio::test]
async fn a_refused_refund_is_failed_with_its_reason_and_an_operators_retry_refunds_it_once() {
    let f = fixture().await;
    let handler = f.handler();
    let order_id = Uuid::new_v4();
    handler.apply(&created(order_id, 2598)).await.unwrap();
    f.provider
        .admin
        .arm(json!({ "kind": "refuse", "next": 2, "endpoint": "refunds" }))
        .await;

    let answered = handler.apply(&cancelled(order_id, 2598)).await;
    assert_eq!(answered.unwrap(), Outcome::Applied, "answered at once");
    let (status, reason, attempt) = f.refund(order_id).await;
    assert_eq!((status.as_deref(), attempt), (Some("failed"), 1));
    assert!(reason.unwrap().contains("charge_disputed"));
    let failed = f.payload(&format!("{order_id}:refund_failed:1")).await;
    assert_eq!(
        (failed["manual"].clone(), failed["amount_cents"].clone()),
        (json!(false), json!(2598))
    );
    assert!(f.provider_refunds(order_id).await.is_empty());

    match f.retry(order_id).await.unwrap() {
        Retried::Refused { reason, attempt: 2 } => assert!(reason.contains("charge_disputed")),
        other => panic!("{other:?}"),
    }
    assert_eq!(f.refund(order_id).await.0.as_deref(), Some("failed"));
    f.payload(&format!("{order_id}:refund_failed:2")).await;

    let Retried::Refunded {
        refund_id,
        attempt: 3,
    } = f.retry(order_id).await.unwrap()
    else {
        panic!("the third attempt refunds");
    };
    assert_eq!(
        f.retry(order_id).await.unwrap(),
        Retried::Refunded {
            refund_id: refund_id.clone(),
            attempt: 3
        },
        "a retry of a refunded order answers with its refund"
    );
    f.refunded_once(order_id, 2598).await;
    assert_eq!(
        f.event_types(order_id).await,
        [
            "payment.succeeded",
            "payment.refund_failed",
            "payment.refund_failed",
            "payment.refunded"
        ]
    );
    let keys = f.provider.admin.stats().await;
    assert_eq!(keys["refunds"]["refused"], 2, "{keys}");
}

/// Operators pressing retry at once: one moves the refund to its next attempt, every
/// other asks under that same key or answers with the refund made. One refund.
#[tokio::test]
async fn concurrent_retries_of_a_failed_refund_refund_it_once() {
    let f = fixture().await;
    let handler = f.handler();
    for round in 0..10 {
        let order_id = Uuid::new_v4();
        handler.apply(&created(order_id, 2598)).await.unwrap();
        f.provider
            .admin
            .arm(json!({ "kind": "refuse", "next": 1, "endpoint": "refunds" }))
            .await;
        handler.apply(&cancelled(order_id, 2598)).await.unwrap();

        let retried = f.retries_at_once(order_id, 4).await;

        let Retried::Refunded {
            refund_id,
            attempt: 2,
        } = &retried[0]
        else {
            panic!("round {round}: {retried:?}");
        };
        assert!(
            retried.iter().all(
                |r| matches!(r, Retried::Refunded { refund_id: id, attempt: 2 } if id == refund_id)
            ),
            "round {round}: {retried:?}"
        );
        f.refunded_once(order_id, 2598).await;
    }
}

/// Operators pressing retry at once while the provider still refuses: each is answered
/// with the refusal, none fails, and the attempt's failure is recorded and announced once.
#[tokio::test]
async fn concurrent_retries_refused_again_record_the_refusal_once() {
    let f = fixture().await;
    let handler = f.handler();
    let order_id = Uuid::new_v4();
    handler.apply(&created(order_id, 2598)).await.unwrap();
    let refuse = json!({ "kind": "refuse", "endpoint": "refunds" });
    f.provider.admin.arm(refuse).await;
    handler.apply(&cancelled(order_id, 2598)).await.unwrap();

    let retried = f.retries_at_once(order_id, 4).await;

    for answer in &retried {
        assert!(
            matches!(answer, Retried::Refused { attempt, .. } if *attempt >= 2),
            "{retried:?}"
        );
    }
    let attempt = f.refund(order_id).await.2;
    let failures: Vec<String> = f
        .events(order_id)
        .await
        .into_iter()
        .filter(|(_, event_type)| event_type == "payment.refund_failed")
        .map(|(id, _)| id)
        .collect();
    let each_once: Vec<String> = (1..=attempt)
        .map(|n| format!("{order_id}:refund_failed:{n}"))
        .collect();
    assert_eq!(failures, each_once, "one failure announced per attempt");
    assert!(f.provider_refunds(order_id).await.is_empty());
}

/// A payment recorded with no charge id (before there was a provider): no refund can be
/// asked for. It is `manual` on the cancellation's first attempt, with why, announced; not
/// `Stale` for ever with its partition stuck behind it. A retry cannot move it.
#[tokio::test]
async fn a_payment_without_a_charge_id_is_manual_at_once_and_its_cancellation_answered() {
    let f = fixture().await;
    let handler = f.handler();
    let order_id = Uuid::new_v4();
    f.db.client()
        .await
        .execute(
            "INSERT INTO payments (order_id, event_id, status, amount_cents)
             VALUES ($1, $2, 'succeeded', 2598)",
            &[&order_id, &order_id.to_string()],
        )
        .await
        .unwrap();

    let answered = handler.apply(&cancelled(order_id, 2598)).await;

    assert_eq!(answered.unwrap(), Outcome::Applied, "answered at once");
    let (status, reason, _) = f.refund(order_id).await;
    assert_eq!(status.as_deref(), Some("manual"));
    assert!(reason.unwrap().contains("no charge id"));
    let failed = f.payload(&format!("{order_id}:refund_failed:1")).await;
    assert_eq!(failed["manual"], true);
    assert_eq!(
        f.retry(order_id).await.unwrap(),
        Retried::NotRetryable {
            status: "manual".into()
        }
    );
    assert_eq!(
        f.provider.admin.stats().await["calls"],
        0,
        "nothing was asked"
    );
}

/// The charge commits after its caller gave up (`commit-late`), and the provider's list
/// does not show it yet (`list-lag`): the payment is `unknown`, the cancellation asks
/// under the charge's own key until the provider answers with the charge, records it and
/// refunds it. Charged once, refunded once; never "nothing charged".
#[tokio::test]
async fn a_charge_that_commits_after_its_caller_gave_up_is_resolved_by_its_key_and_refunded() {
    let f = fixture().await;
    let handler = f.handler();
    let admin = &f.provider.admin;
    for round in 0..3 {
        let order_id = Uuid::new_v4();
        f.charge_committing_late(&handler, order_id).await;

        let cancel = cancelled(order_id, 2598);
        let outcome = saga_testkit::eventually(
            Duration::from_secs(15),
            "the charge's key to answer",
            || async {
                match handler.apply(&cancel).await {
                    Ok(outcome) => Some(outcome),
                    Err(HandlerError::Unavailable(_) | HandlerError::Stale(_)) => None,
                    Err(error) => panic!("round {round}: {error}"),
                }
            },
        )
        .await;
        assert_eq!(outcome, Outcome::Applied);
        assert!(
            f.charges(order_id).await.is_empty(),
            "round {round}: the list lags, and decided nothing"
        );
        admin.disarm().await;

        assert_eq!(
            apply_until_done(&handler, &created(order_id, 2598)).await,
            Outcome::Guarded
        );
        f.refunded_once(order_id, 2598).await;
        assert_eq!(f.payment(order_id).await.unwrap().0, "succeeded");
        assert_eq!(
            f.event_types(order_id).await,
            ["payment.succeeded", "payment.refunded"],
            "round {round}"
        );
    }
}

/// A charge whose answer was never learnt, and whose intent is older than the provider's
/// key lifetime: asked again, the provider might have forgotten the key and charge a
/// second time. Neither its redelivered `order.created` nor its cancellation asks; the
/// cancellation leaves it to a person, with why.
#[tokio::test]
async fn a_charge_unknown_past_the_key_lifetime_is_never_asked_again_and_is_left_to_a_person() {
    let f = fixture().await;
    let handler = f.handler();
    let order_id = Uuid::new_v4();
    f.db.client()
        .await
        .execute(
            "INSERT INTO payments (order_id, event_id, status, amount_cents, charge_key, created_at)
             VALUES ($1, $2, 'unknown', 2598, $3, now() - interval '2 days')",
            &[&order_id, &order_id.to_string(), &format!("{order_id}:charge")],
        )
        .await
        .unwrap();

    let refused = handler.apply(&created(order_id, 2598)).await.unwrap_err();
    assert!(matches!(refused, HandlerError::Rejected(_)), "{refused}");
    assert!(
        refused.to_string().contains("PROVIDER_KEY_TTL"),
        "{refused}"
    );
    let answered = handler.apply(&cancelled(order_id, 2598)).await;

    assert_eq!(answered.unwrap(), Outcome::Applied);
    let (status, reason, _) = f.refund(order_id).await;
    assert_eq!(status.as_deref(), Some("manual"));
    assert!(reason.unwrap().contains("key lifetime"));
    assert_eq!(
        f.payment(order_id).await.unwrap().0,
        "unknown",
        "still undecided"
    );
    assert_eq!(
        f.provider.admin.stats().await["calls"],
        0,
        "nothing was asked"
    );
}
