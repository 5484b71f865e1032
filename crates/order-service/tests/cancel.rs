//! Cancellations against a real PostgreSQL: the customer's and the deadline's, and
//! payment-service's answer settling them, each once whatever repeats or races.

mod app;

use std::time::Duration;

use order_service::apply_payment_result::ApplyPaymentResult;
use order_service::cancel::{self, Cancelled};
use order_service::settle_cancellation::SettleCancellation;
use saga::{Applier, Envelope, Outcome, Topics};
use saga_testkit::TestDatabase;
use serde_json::json;
use uuid::Uuid;

struct Fixture {
    db: TestDatabase,
    topics: Topics,
    results: Applier<ApplyPaymentResult>,
    answers: Applier<SettleCancellation>,
}

async fn fixture() -> Fixture {
    let db = TestDatabase::migrated(order_service::migrations, order_service::HISTORY_TABLE).await;
    let topics = Topics::new("");
    Fixture {
        results: Applier::new(db.pool.clone(), ApplyPaymentResult::new(topics.clone())),
        answers: Applier::new(db.pool.clone(), SettleCancellation::new(topics.clone())),
        db,
        topics,
    }
}

fn event(id: &str, event_type: &str, order_id: Uuid, payload: serde_json::Value) -> Envelope {
    Envelope::from_slice(&saga_testkit::envelope(id, event_type, order_id, payload)).unwrap()
}

/// The order's status, cancel reason, whether it has settled, and its refund.
type Row = (String, Option<String>, bool, Option<String>);

impl Fixture {
    async fn pending_order(&self) -> Uuid {
        app::pending_order(&self.db.pool, &self.topics).await
    }

    async fn confirmed_order(&self) -> Uuid {
        let order_id = self.pending_order().await;
        let succeeded = event(
            &format!("{order_id}:payment"),
            "payment.succeeded",
            order_id,
            json!({ "order_id": order_id, "amount_cents": 2598 }),
        );
        assert_eq!(
            self.results.apply(&succeeded).await.unwrap(),
            Outcome::Applied
        );
        order_id
    }

    async fn cancel(&self, order_id: Uuid) -> Cancelled {
        cancel::cancel_order(&self.db.pool, None, &self.topics, order_id, None)
            .await
            .unwrap()
    }

    async fn row(&self, order_id: Uuid) -> Row {
        let row = self
            .db
            .client()
            .await
            .query_one(
                "SELECT status, cancel_reason, settled_at IS NOT NULL, refund_id FROM orders WHERE id = $1",
                &[&order_id],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1), row.get(2), row.get(3))
    }

    /// The ids of the outbox's events of `event_type` for the order.
    async fn events(&self, order_id: Uuid, event_type: &str) -> Vec<String> {
        self.db
            .client()
            .await
            .query(
                "SELECT event_id FROM outbox WHERE key = $1 AND type = $2 ORDER BY id",
                &[&order_id.to_string(), &event_type],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
    }

    fn refunded(&self, id: &str, order_id: Uuid) -> Envelope {
        event(
            id,
            "payment.refunded",
            order_id,
            json!({ "order_id": order_id, "amount_cents": 2598, "charge_id": "ch_1", "refund_id": "re_1" }),
        )
    }

    fn refund_failed(&self, order_id: Uuid, attempt: i32) -> Envelope {
        event(
            &format!("{order_id}:refund_failed:{attempt}"),
            "payment.refund_failed",
            order_id,
            json!({ "order_id": order_id, "amount_cents": 2598, "charge_id": "ch_1",
                    "reason": format!("charge_disputed ({attempt})"), "manual": false, "attempt": attempt }),
        )
    }

    /// The order as `GET /v1/orders/{id}` shows it.
    async fn shown(&self, order_id: Uuid) -> serde_json::Value {
        let client = self.db.pool.get().await.unwrap();
        let order = order_service::orders::find_order(&client, order_id)
            .await
            .unwrap()
            .unwrap();
        serde_json::to_value(order).unwrap()
    }

    fn voided(&self, id: &str, order_id: Uuid) -> Envelope {
        event(
            id,
            "payment.voided",
            order_id,
            json!({ "order_id": order_id, "reason": "not_charged" }),
        )
    }
}

#[tokio::test]
async fn a_pending_order_is_cancelled_once_with_one_cancellation_event() {
    let f = fixture().await;
    let order_id = f.pending_order().await;

    let first = f.cancel(order_id).await;
    let second = f.cancel(order_id).await;

    assert!(matches!(first, Cancelled::Now { .. }), "{first:?}");
    assert!(matches!(second, Cancelled::Already { .. }), "{second:?}");
    let cancelled = (
        "cancelled".to_owned(),
        Some("customer".to_owned()),
        false,
        None,
    );
    assert_eq!(f.row(order_id).await, cancelled);
    assert_eq!(
        f.events(order_id, "order.cancelled").await,
        [format!("{order_id}:cancel")]
    );
}

#[tokio::test]
async fn a_confirmed_order_cancelled_is_in_flight_until_its_refund_is_recorded_once() {
    let f = fixture().await;
    let order_id = f.confirmed_order().await;
    assert!(f.row(order_id).await.2, "a confirmed order has settled");

    f.cancel(order_id).await;
    assert!(
        !f.row(order_id).await.2,
        "cancelled, it waits for payment-service's answer"
    );
    let refunded = f.refunded(&format!("{order_id}:refund"), order_id);
    assert_eq!(f.answers.apply(&refunded).await.unwrap(), Outcome::Applied);
    assert_eq!(
        f.answers.apply(&refunded).await.unwrap(),
        Outcome::Duplicate
    );
    let again = f.refunded("another-id", order_id);
    assert_eq!(f.answers.apply(&again).await.unwrap(), Outcome::Guarded);

    let settled = f.row(order_id).await;
    assert_eq!((settled.2, settled.3.as_deref()), (true, Some("re_1")));
    assert_eq!(
        f.events(order_id, "order.refunded").await,
        [format!("{order_id}:refunded")]
    );
}

#[tokio::test]
async fn nothing_to_refund_settles_a_cancelled_order_once_and_announces_nothing() {
    let f = fixture().await;
    let order_id = f.pending_order().await;
    f.cancel(order_id).await;
    let voided = f.voided(&format!("{order_id}:cancel:voided"), order_id);

    assert_eq!(f.answers.apply(&voided).await.unwrap(), Outcome::Applied);
    assert_eq!(
        f.answers
            .apply(&f.voided("another-id", order_id))
            .await
            .unwrap(),
        Outcome::Guarded
    );

    assert!(f.row(order_id).await.2, "settled");
    assert!(f.events(order_id, "order.refunded").await.is_empty());
}

/// The provider refused the refund: the order settles (nothing of it is in flight) and
/// shows its refund `failed` with the reason, each attempt's failure its own news; an
/// operator's retry that refunds it later is applied as any refund, and announced.
#[tokio::test]
async fn a_refund_that_failed_settles_the_order_visibly_and_a_later_refund_still_applies() {
    let f = fixture().await;
    let order_id = f.confirmed_order().await;
    f.cancel(order_id).await;

    let first = f.refund_failed(order_id, 1);
    assert_eq!(f.answers.apply(&first).await.unwrap(), Outcome::Applied);
    assert_eq!(f.answers.apply(&first).await.unwrap(), Outcome::Duplicate);
    assert!(
        f.row(order_id).await.2,
        "settled: nothing of it is in flight"
    );
    let shown = f.shown(order_id).await;
    assert_eq!(
        (&shown["refund"], &shown["refund_failure"]),
        (&json!("failed"), &json!("charge_disputed (1)"))
    );
    let second = f.refund_failed(order_id, 2);
    assert_eq!(f.answers.apply(&second).await.unwrap(), Outcome::Applied);
    assert_eq!(
        f.shown(order_id).await["refund_failure"],
        "charge_disputed (2)"
    );

    let refunded = f.refunded(&format!("{order_id}:refund"), order_id);
    assert_eq!(f.answers.apply(&refunded).await.unwrap(), Outcome::Applied);
    let shown = f.shown(order_id).await;
    assert_eq!(shown["refund"], "refunded");
    assert_eq!(shown.get("refund_failure"), None, "{shown}");
    assert_eq!(
        f.events(order_id, "order.refunded").await,
        [format!("{order_id}:refunded")]
    );
    let late = f.refund_failed(order_id, 3);
    assert_eq!(f.answers.apply(&late).await.unwrap(), Outcome::Guarded);
}

/// The charge landed after the cancellation: guard 2 stops its result, and the order
/// stays cancelled (payment-service refunds the charge on the cancellation).
#[tokio::test]
async fn a_payment_result_after_the_cancellation_is_guarded() {
    let f = fixture().await;
    let order_id = f.pending_order().await;
    f.cancel(order_id).await;
    let late = event(
        &format!("{order_id}:payment"),
        "payment.succeeded",
        order_id,
        json!({ "order_id": order_id, "amount_cents": 2598 }),
    );

    assert_eq!(f.results.apply(&late).await.unwrap(), Outcome::Guarded);

    assert_eq!(f.row(order_id).await.0, "cancelled");
    assert!(f.events(order_id, "order.confirmed").await.is_empty());
}

#[tokio::test]
async fn two_cancellations_at_once_cancel_the_order_once() {
    let f = fixture().await;
    for round in 0..30 {
        let order_id = f.pending_order().await;

        let (a, b) = tokio::join!(f.cancel(order_id), f.cancel(order_id));

        let now = [&a, &b]
            .iter()
            .filter(|c| matches!(c, Cancelled::Now { .. }))
            .count();
        assert_eq!(now, 1, "round {round}: {a:?} {b:?}");
        assert_eq!(
            f.events(order_id, "order.cancelled").await.len(),
            1,
            "round {round}"
        );
    }
}

#[tokio::test]
async fn an_unknown_order_cannot_be_cancelled() {
    let f = fixture().await;

    let error = cancel::cancel_order(&f.db.pool, None, &f.topics, Uuid::new_v4(), None)
        .await
        .unwrap_err();

    assert!(matches!(error, cancel::CancelError::NotFound(_)), "{error}");
}

/// Places an order `age` ago.
async fn placed_ago(f: &Fixture, age: Duration) -> Uuid {
    let order_id = f.pending_order().await;
    f.db.client()
        .await
        .execute(
            "UPDATE orders SET created_at = now() - make_interval(secs => $2) WHERE id = $1",
            &[&order_id, &age.as_secs_f64()],
        )
        .await
        .unwrap();
    order_id
}

#[tokio::test]
async fn the_deadline_cancels_only_the_orders_still_pending_past_it() {
    let f = fixture().await;
    let overdue = placed_ago(&f, Duration::from_secs(120)).await;
    let recent = placed_ago(&f, Duration::from_secs(10)).await;
    let decided = f.confirmed_order().await;
    f.db.client()
        .await
        .execute(
            "UPDATE orders SET created_at = now() - interval '1 hour' WHERE id = $1",
            &[&decided],
        )
        .await
        .unwrap();

    let cancelled =
        cancel::cancel_overdue(&f.db.pool, None, &f.topics, Duration::from_secs(60), 100)
            .await
            .unwrap();

    assert_eq!(cancelled, [overdue]);
    assert_eq!(
        f.row(overdue).await,
        (
            "cancelled".to_owned(),
            Some("timeout".to_owned()),
            false,
            None
        )
    );
    assert_eq!(f.row(recent).await.0, "pending");
    assert_eq!(f.row(decided).await.0, "confirmed");
    assert_eq!(
        f.events(overdue, "order.cancelled").await,
        [format!("{overdue}:cancel")]
    );
}

#[tokio::test]
async fn sweeps_at_once_cancel_each_overdue_order_once() {
    let f = fixture().await;
    for round in 0..10 {
        let mut overdue = Vec::new();
        for _ in 0..5 {
            overdue.push(placed_ago(&f, Duration::from_secs(120)).await);
        }
        let sweep =
            || cancel::cancel_overdue(&f.db.pool, None, &f.topics, Duration::from_secs(60), 2);

        let (a, b, c) = tokio::join!(sweep(), sweep(), sweep());

        let mut cancelled: Vec<Uuid> = [a, b, c].into_iter().flat_map(Result::unwrap).collect();
        let late =
            cancel::cancel_overdue(&f.db.pool, None, &f.topics, Duration::from_secs(60), 100)
                .await
                .unwrap();
        cancelled.extend(late);
        cancelled.sort();
        overdue.sort();
        assert_eq!(cancelled, overdue, "round {round}: each once");
        for order_id in &overdue {
            assert_eq!(
                f.events(*order_id, "order.cancelled").await.len(),
                1,
                "round {round}"
            );
        }
    }
}
