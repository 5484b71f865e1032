//! RefundOrder and ChargeOrder together, as payment-service runs them on `orders`, against
//! a real PostgreSQL and a real card provider: every cancellation answered once; a charge
//! that stood refunded once, whatever is redelivered, lost or committed meanwhile; no
//! charge after a cancellation was recorded.

mod common;

use std::time::Duration;

use common::{LIMIT_CENTS, LocalProvider};
use payment_service::{ChargeOrder, RefundOrder};
use saga::handler::Pair;
use saga::{Applier, Envelope, HandlerError, Outcome, Step, Topics};
use saga_testkit::TestDatabase;
use serde_json::{Value, json};
use uuid::Uuid;

type OnOrders = Applier<Pair<ChargeOrder, RefundOrder>>;

struct Fixture {
    db: TestDatabase,
    provider: LocalProvider,
}

async fn fixture() -> Fixture {
    let (db, provider) = tokio::join!(
        TestDatabase::migrated(payment_service::migrations, payment_service::HISTORY_TABLE),
        LocalProvider::start()
    );
    Fixture { db, provider }
}

fn event(id: &str, event_type: &str, order_id: Uuid, payload: Value) -> Envelope {
    Envelope::from_slice(&saga_testkit::envelope(id, event_type, order_id, payload)).unwrap()
}

fn created(order_id: Uuid, amount_cents: i64) -> Envelope {
    event(
        &order_id.to_string(),
        "order.created",
        order_id,
        json!({ "order_id": order_id, "customer_id": "cust-1", "amount_cents": amount_cents, "items": [] }),
    )
}

/// The customer's cancellation, as order-service writes it.
fn cancelled(order_id: Uuid, amount_cents: i64) -> Envelope {
    cancellation(&format!("{order_id}:cancel"), order_id, amount_cents)
}

fn cancellation(id: &str, order_id: Uuid, amount_cents: i64) -> Envelope {
    event(
        id,
        "order.cancelled",
        order_id,
        json!({ "order_id": order_id, "customer_id": "cust-1", "amount_cents": amount_cents, "reason": "customer" }),
    )
}

impl Fixture {
    fn handler(&self) -> OnOrders {
        let provider = self.provider.client(Duration::from_millis(500));
        let topics = Topics::new("");
        Applier::new(
            self.db.pool.clone(),
            Pair(
                ChargeOrder::new(topics.clone(), provider.clone()),
                RefundOrder::new(topics, provider),
            ),
        )
    }

    /// The payment's status, charge and refund.
    async fn payment(&self, order_id: Uuid) -> Option<(String, Option<String>, Option<String>)> {
        self.db
            .client()
            .await
            .query_opt(
                "SELECT status, charge_id, refund_id FROM payments WHERE order_id = $1",
                &[&order_id],
            )
            .await
            .unwrap()
            .map(|row| (row.get(0), row.get(1), row.get(2)))
    }

    /// The outbox's events for the order: id and type, in order.
    /// The types of the outbox's events for the order, in order.
    async fn event_types(&self, order_id: Uuid) -> Vec<String> {
        self.events(order_id)
            .await
            .into_iter()
            .map(|(_, t)| t)
            .collect()
    }

    async fn events(&self, order_id: Uuid) -> Vec<(String, String)> {
        self.db
            .client()
            .await
            .query(
                "SELECT event_id, type FROM outbox WHERE key = $1 ORDER BY id",
                &[&order_id.to_string()],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect()
    }

    /// The provider's charges for the order, each with its refunds.
    async fn charges(&self, order_id: Uuid) -> Vec<Value> {
        self.provider.admin.charges_for(&order_id.to_string()).await
    }

    /// One charge for `amount_cents` at the provider, refunded once, and the payment
    /// here holds both ids.
    async fn refunded_once(&self, order_id: Uuid, amount_cents: i64) {
        let charges = self.charges(order_id).await;
        assert_eq!(charges.len(), 1, "one charge: {charges:?}");
        let refunds = charges[0]["refunds"]
            .as_array()
            .expect("a charge lists its refunds");
        assert_eq!(refunds.len(), 1, "one refund: {charges:?}");
        assert_eq!(refunds[0]["amount_cents"], amount_cents);
        let (_, charge_id, refund_id) = self.payment(order_id).await.expect("a payment");
        assert_eq!(charge_id.as_deref(), charges[0]["id"].as_str());
        assert_eq!(refund_id.as_deref(), refunds[0]["id"].as_str());
        let refunded = (format!("{order_id}:refund"), "payment.refunded".to_owned());
        let announced = self.events(order_id).await;
        assert_eq!(
            announced.iter().filter(|e| **e == refunded).count(),
            1,
            "{announced:?}"
        );
    }
}

/// Applies `event` as the consumer would: again, prepared afresh, while it fails with an
/// error that heals by itself (a lost answer, a prepare out of date).
async fn apply_until_done(handler: &OnOrders, event: &Envelope) -> Outcome {
    for _ in 0..5 {
        match handler.apply(event).await {
            Ok(outcome) => return outcome,
            Err(error @ (HandlerError::Unavailable(_) | HandlerError::Stale(_))) => {
                tracing::info!(%error, "retrying");
            }
            Err(error) => panic!("{}: {error}", event.id),
        }
    }
    panic!("{} did not apply in 5 attempts", event.id)
}

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

/// The provider charged, and the answer never made it into a payment here (its
/// `order.created` dead-lettered after the call): the cancellation finds the charge at
/// the provider, and refunds it.
#[tokio::test]
async fn a_charge_made_at_the_provider_without_a_payment_here_is_refunded() {
    let f = fixture().await;
    let handler = f.handler();
    let order_id = Uuid::new_v4();
    let body =
        json!({ "amount_cents": 2598, "currency": "usd", "reference": order_id.to_string() });
    let (status, _) = f
        .provider
        .admin
        .charge(&format!("{order_id}:charge"), &body)
        .await;
    assert_eq!(status, 201);

    assert_eq!(
        handler.apply(&cancelled(order_id, 2598)).await.unwrap(),
        Outcome::Applied
    );
    assert_eq!(
        handler.apply(&created(order_id, 2598)).await.unwrap(),
        Outcome::Guarded
    );

    f.refunded_once(order_id, 2598).await;
    assert_eq!(f.payment(order_id).await.unwrap().0, "voided");
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

/// The `order.created` was prepared (and charged) while its cancellation committed a
/// tombstone: its transaction meets the tombstone, and prepared again it refunds the
/// charge it made instead of dropping it.
#[tokio::test]
async fn a_charge_that_meets_its_orders_tombstone_is_refunded() {
    let f = fixture().await;
    let handler = f.handler();
    let order_id = Uuid::new_v4();
    let cancel = cancelled(order_id, 2598);
    let cancel_prepared = handler.prepare(&cancel).await.unwrap();
    let create = created(order_id, 2598);
    let charged = handler.prepare(&create).await.unwrap();

    assert_eq!(
        handler
            .apply_prepared(&cancel, cancel_prepared)
            .await
            .unwrap(),
        Outcome::Applied
    );
    let stale = handler.apply_prepared(&create, charged).await.unwrap_err();
    assert!(matches!(stale, HandlerError::Stale(_)), "{stale}");
    assert_eq!(apply_until_done(&handler, &create).await, Outcome::Applied);

    f.refunded_once(order_id, 2598).await;
    let answers = f.event_types(order_id).await;
    assert_eq!(answers, ["payment.voided", "payment.refunded"]);
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
