//! RefundOrder and ChargeOrder together, as payment-service runs them on `orders`, against
//! a real PostgreSQL and a real card provider: every cancellation answered once; a charge
//! that stood refunded once, whatever is redelivered, lost or committed meanwhile; no
//! charge after a cancellation was recorded.

mod common;

use common::LIMIT_CENTS;
use common::on_orders::{apply_until_done, cancellation, cancelled, created, fixture};
use saga::{HandlerError, Outcome, Step};
use serde_json::json;
use uuid::Uuid;

#[tokio::test]
async fn cancelling_a_charged_order_refunds_its_charge_once() {
    let f = fixture().await;
    let handler = f.handler();
    let order_id = Uuid::new_v4();
    assert_eq!(
        handler.apply(&created(order_id, 2598)).await.unwrap(),
        Outcome::Applied
    );

    let cancel = cancelled(order_id, 2598);
    assert_eq!(handler.apply(&cancel).await.unwrap(), Outcome::Applied);
    assert_eq!(handler.apply(&cancel).await.unwrap(), Outcome::Duplicate);
    let another = cancellation(&format!("{order_id}:outcome"), order_id, 2598);
    assert_eq!(handler.apply(&another).await.unwrap(), Outcome::Guarded);

    f.refunded_once(order_id, 2598).await;
}

#[tokio::test]
async fn a_cancellation_before_any_charge_leaves_a_tombstone_that_stops_the_charge() {
    let f = fixture().await;
    let handler = f.handler();
    let order_id = Uuid::new_v4();

    assert_eq!(
        handler.apply(&cancelled(order_id, 2598)).await.unwrap(),
        Outcome::Applied
    );
    // Its order.created, dead-lettered before the cancellation, redriven after it.
    assert_eq!(
        handler.apply(&created(order_id, 2598)).await.unwrap(),
        Outcome::Guarded
    );

    assert_eq!(f.payment(order_id).await.unwrap().0, "voided");
    assert!(f.charges(order_id).await.is_empty(), "nothing charged");
    assert_eq!(
        f.events(order_id).await,
        [(
            format!("{order_id}:cancel:voided"),
            "payment.voided".to_owned()
        )]
    );
}

/// The charge was asked for and made, and its `order.created` never reached its
/// transaction (dead-lettered, or its consumer gone, after the call): its intent is the
/// payment, undecided. The cancellation resolves the charge under its own key, records it
/// with its `payment.succeeded`, and refunds it.
#[tokio::test]
async fn a_charge_whose_event_never_reached_its_transaction_is_resolved_by_its_key_and_refunded() {
    let f = fixture().await;
    let handler = f.handler();
    let order_id = Uuid::new_v4();
    let create = created(order_id, 2598);
    let charged = handler.prepare(&create).await.unwrap();
    assert!(
        matches!(charged, Step::Apply(_)),
        "the charge was asked for"
    );
    drop(charged);
    assert_eq!(f.payment(order_id).await.unwrap().0, "charging");

    assert_eq!(
        apply_until_done(&handler, &cancelled(order_id, 2598)).await,
        Outcome::Applied
    );
    assert_eq!(handler.apply(&create).await.unwrap(), Outcome::Guarded);

    f.refunded_once(order_id, 2598).await;
    assert_eq!(f.payment(order_id).await.unwrap().0, "succeeded");
    assert_eq!(
        f.event_types(order_id).await,
        ["payment.succeeded", "payment.refunded"]
    );
}

#[tokio::test]
async fn a_lost_refund_answer_and_the_retry_record_the_first_refund_once() {
    let f = fixture().await;
    let handler = f.handler();
    let order_id = Uuid::new_v4();
    handler.apply(&created(order_id, 2598)).await.unwrap();
    f.provider
        .admin
        .arm(json!({ "kind": "lose-response", "next": 1, "endpoint": "refunds" }))
        .await;
    let cancel = cancelled(order_id, 2598);

    let lost = handler.apply(&cancel).await.unwrap_err();
    assert!(matches!(lost, HandlerError::Unavailable(_)), "{lost}");
    assert_eq!(handler.apply(&cancel).await.unwrap(), Outcome::Applied);

    f.refunded_once(order_id, 2598).await;
    // The retry was answered by the key's first answer, not refused as a second refund
    // of the charge: the order's one key is what made the retry harmless.
    let refunds = &f.provider.admin.stats().await["refunds"];
    assert_eq!(
        (refunds["refunded"].as_u64(), refunds["replayed"].as_u64()),
        (Some(1), Some(1)),
        "{refunds}"
    );
}

#[tokio::test]
async fn a_declined_orders_cancellation_is_answered_with_nothing_to_refund() {
    let f = fixture().await;
    let handler = f.handler();
    let order_id = Uuid::new_v4();
    let amount = LIMIT_CENTS + 1;
    handler.apply(&created(order_id, amount)).await.unwrap();

    let outcome = handler
        .apply(&cancellation(
            &format!("{order_id}:outcome"),
            order_id,
            amount,
        ))
        .await
        .unwrap();

    assert_eq!(outcome, Outcome::Applied);
    assert_eq!(f.payment(order_id).await.unwrap().0, "failed");
    let answer = (
        format!("{order_id}:outcome:voided"),
        "payment.voided".to_owned(),
    );
    assert!(f.events(order_id).await.contains(&answer));
}

#[tokio::test]
async fn a_cancellation_order_service_did_not_write_moves_no_money() {
    let f = fixture().await;
    let handler = f.handler();
    let order_id = Uuid::new_v4();
    handler.apply(&created(order_id, 2598)).await.unwrap();

    let outcome = handler
        .apply(&cancellation(
            &format!("typed-by-hand:{order_id}"),
            order_id,
            2598,
        ))
        .await
        .unwrap();

    assert_eq!(outcome, Outcome::Ignored);
    assert_eq!(f.charges(order_id).await[0]["refunds"], json!([]));
    assert_eq!(f.payment(order_id).await.unwrap().2, None);
}

/// The cancellation was prepared while its order had no payment and no charge, and the
/// charge committed before the cancellation's transaction: the transaction finds the
/// charge standing, commits nothing, and the cancellation prepared again refunds it.
#[tokio::test]
async fn a_charge_committed_after_the_cancellation_was_prepared_is_refunded_not_voided() {
    let f = fixture().await;
    let handler = f.handler();
    let order_id = Uuid::new_v4();
    let cancel = cancelled(order_id, 2598);
    let prepared = handler.prepare(&cancel).await.unwrap();
    assert!(matches!(prepared, Step::Apply(_)));

    handler.apply(&created(order_id, 2598)).await.unwrap();
    let stale = handler.apply_prepared(&cancel, prepared).await.unwrap_err();
    assert!(matches!(stale, HandlerError::Stale(_)), "{stale}");
    assert_eq!(apply_until_done(&handler, &cancel).await, Outcome::Applied);

    f.refunded_once(order_id, 2598).await;
    assert_eq!(f.payment(order_id).await.unwrap().0, "succeeded");
}

/// The cancellation was prepared while its order had no payment, and the `order.created`
/// then wrote its intent and was charged: the cancellation's tombstone finds the intent
/// and commits nothing; prepared again, the cancellation resolves the charge under its key
/// and refunds it, and the charge's own transaction, last, finds it decided.
#[tokio::test]
async fn a_cancellation_that_meets_a_charges_intent_resolves_the_charge_and_refunds_it() {
    let f = fixture().await;
    let handler = f.handler();
    let order_id = Uuid::new_v4();
    let cancel = cancelled(order_id, 2598);
    let cancel_prepared = handler.prepare(&cancel).await.unwrap();
    let create = created(order_id, 2598);
    let charged = handler.prepare(&create).await.unwrap();

    let stale = handler
        .apply_prepared(&cancel, cancel_prepared)
        .await
        .unwrap_err();
    assert!(matches!(stale, HandlerError::Stale(_)), "{stale}");
    assert_eq!(apply_until_done(&handler, &cancel).await, Outcome::Applied);
    assert_eq!(
        handler.apply_prepared(&create, charged).await.unwrap(),
        Outcome::Guarded
    );

    f.refunded_once(order_id, 2598).await;
    let answers = f.event_types(order_id).await;
    assert_eq!(answers, ["payment.succeeded", "payment.refunded"]);
}

#[tokio::test]
async fn a_cancellation_racing_its_charge_leaves_either_nothing_charged_or_one_refund() {
    let f = fixture().await;
    let (a, b) = (f.handler(), f.handler());
    for round in 0..15 {
        let order_id = Uuid::new_v4();
        let (create, cancel) = (created(order_id, 2598), cancelled(order_id, 2598));

        tokio::join!(apply_until_done(&a, &create), apply_until_done(&b, &cancel));

        let charges = f.charges(order_id).await;
        match charges.as_slice() {
            [] => assert_eq!(
                f.payment(order_id).await.unwrap().0,
                "voided",
                "round {round}"
            ),
            [_] => f.refunded_once(order_id, 2598).await,
            more => panic!("round {round}: charged {} times: {more:?}", more.len()),
        }
    }
}

/// The inbox forgot the cancellations' ids: each copy passes guard 1, and the payment's
/// mark that its cancellation was answered stops it, refunded or declined alike.
#[tokio::test]
async fn a_cancellation_delivered_again_after_its_id_was_pruned_answers_nothing() {
    let f = fixture().await;
    let handler = f.handler();
    let (charged, declined) = (Uuid::new_v4(), Uuid::new_v4());
    let over_the_limit = LIMIT_CENTS + 1;
    handler.apply(&created(charged, 2598)).await.unwrap();
    handler
        .apply(&created(declined, over_the_limit))
        .await
        .unwrap();
    let cancellations = [
        cancelled(charged, 2598),
        cancellation(&format!("{declined}:outcome"), declined, over_the_limit),
    ];
    for cancel in &cancellations {
        assert_eq!(handler.apply(cancel).await.unwrap(), Outcome::Applied);
    }

    assert!(f.db.prune_inbox().await >= 4);
    for cancel in &cancellations {
        assert_eq!(
            handler.apply(cancel).await.unwrap(),
            Outcome::Guarded,
            "{}",
            cancel.id
        );
    }

    f.refunded_once(charged, 2598).await;
    let answers = f.event_types(declined).await;
    assert_eq!(answers, ["payment.failed", "payment.voided"]);
}
