//! payment-service's client of the card provider, refunding, against a real provider
//! (in this process, on a database of its own): a refund comes back once made, whatever
//! was lost, and under whichever key it was made.

mod common;

use std::time::Duration;

use common::LocalProvider;
use payment_service::Provider;
use payment_service::provider::{ChargeRequest, ProviderCharge, RefundRequest};
use saga::HandlerError;
use saga_testkit::provider::ProviderAdmin;
use serde_json::json;

struct Fixture {
    provider: Provider,
    admin: ProviderAdmin,
    _local: LocalProvider,
}

async fn fixture() -> Fixture {
    let local = LocalProvider::start().await;
    Fixture {
        provider: local.client(Duration::from_secs(5)),
        admin: local.admin.clone(),
        _local: local,
    }
}

impl Fixture {
    /// A charge of `amount_cents` for `order`, as ChargeOrder asks for it: its id.
    async fn charged(&self, order: &str, amount_cents: i64) -> String {
        let answer = self
            .provider
            .charge(
                &format!("{order}:charge"),
                &ChargeRequest {
                    amount_cents,
                    currency: "usd",
                    reference: order.to_owned(),
                },
            )
            .await
            .unwrap();
        match answer {
            payment_service::provider::Answer::Charged { charge_id, .. } => charge_id,
            declined => panic!("{declined:?}"),
        }
    }
}

fn refund_of(charge_id: &str, amount_cents: i64) -> RefundRequest {
    RefundRequest {
        charge_id: charge_id.to_owned(),
        amount_cents,
    }
}

#[tokio::test]
async fn a_refund_is_made_and_asked_again_with_its_key_is_the_same_refund_replayed() {
    let fixture = fixture().await;
    let charge_id = fixture.charged("order-1", 1299).await;

    let made = fixture
        .provider
        .refund("order-1:refund", &refund_of(&charge_id, 1299))
        .await
        .unwrap();
    assert!(made.refund_id.starts_with("re_"), "{made:?}");
    assert_eq!(made.amount_cents, 1299);
    assert!(!made.replayed);
    let again = fixture
        .provider
        .refund("order-1:refund", &refund_of(&charge_id, 1299))
        .await
        .unwrap();
    assert_eq!(again.refund_id, made.refund_id);
    assert!(again.replayed);
}

#[tokio::test]
async fn a_refund_whose_answer_is_lost_is_unavailable_and_the_retry_gets_it_replayed() {
    let fixture = fixture().await;
    let charge_id = fixture.charged("order-2", 900).await;
    fixture
        .admin
        .arm(json!({"kind": "lose-response", "next": 1, "endpoint": "refunds"}))
        .await;

    let lost = fixture
        .provider
        .refund("order-2:refund", &refund_of(&charge_id, 900))
        .await;
    assert!(
        matches!(lost, Err(HandlerError::Unavailable(_))),
        "{lost:?}"
    );
    let retry = fixture
        .provider
        .refund("order-2:refund", &refund_of(&charge_id, 900))
        .await
        .unwrap();
    assert!(retry.replayed);
    let charges = fixture.provider.charges_for("order-2").await.unwrap();
    assert_eq!(charges[0].refund.as_deref(), Some(retry.refund_id.as_str()));
}

#[tokio::test]
async fn a_charge_refunded_under_another_key_answers_with_its_refund() {
    let fixture = fixture().await;
    let charge_id = fixture.charged("order-3", 700).await;
    let first = fixture
        .provider
        .refund("an-expired-key", &refund_of(&charge_id, 500))
        .await
        .unwrap();

    let found = fixture
        .provider
        .refund("order-3:refund", &refund_of(&charge_id, 700))
        .await
        .unwrap();
    assert_eq!(found.refund_id, first.refund_id);
    assert_eq!(
        found.amount_cents, 500,
        "the refund made, not the one asked for"
    );
    assert!(found.replayed);
}

#[tokio::test]
async fn the_charges_for_an_order_list_each_charge_with_its_refund() {
    let fixture = fixture().await;
    let charge_id = fixture.charged("order-4", 1500).await;
    assert_eq!(
        fixture.provider.charges_for("order-4").await.unwrap(),
        [ProviderCharge {
            charge_id: charge_id.clone(),
            amount_cents: 1500,
            succeeded: true,
            refund: None,
        }]
    );
    let refund = fixture
        .provider
        .refund("order-4:refund", &refund_of(&charge_id, 1500))
        .await
        .unwrap();

    let charges = fixture.provider.charges_for("order-4").await.unwrap();
    assert_eq!(
        charges,
        [ProviderCharge {
            charge_id,
            amount_cents: 1500,
            succeeded: true,
            refund: Some(refund.refund_id),
        }]
    );
    assert!(
        fixture
            .provider
            .charges_for("no-such-order")
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn a_refund_the_provider_cannot_make_is_rejected_with_its_answer() {
    let fixture = fixture().await;
    let charge_id = fixture.charged("order-5", 300).await;
    for (request, code) in [
        (refund_of("ch_unknown", 100), "charge_not_found"),
        (refund_of(&charge_id, 301), "invalid_field"),
    ] {
        let refused = fixture.provider.refund("order-5:refund", &request).await;
        match refused {
            Err(HandlerError::Rejected(reason)) => assert!(reason.contains(code), "{reason}"),
            other => panic!("{code}: {other:?}"),
        }
    }
}
