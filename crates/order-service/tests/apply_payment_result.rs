//! ApplyPaymentResult against a real PostgreSQL: each guard, and what happens without it.

mod app;

use order_service::apply_payment_result::ApplyPaymentResult;
use order_service::orders;
use saga::events::{self, PAYMENT_FAILED, PAYMENT_SUCCEEDED};
use saga::{Applier, Envelope, HandlerError, Outcome, Topics};
use saga_testkit::TestDatabase;
use serde_json::json;
use uuid::Uuid;

struct Fixture {
    db: TestDatabase,
    handler: Applier<ApplyPaymentResult>,
    topics: Topics,
}

async fn fixture() -> Fixture {
    let db = TestDatabase::migrated(order_service::migrations, order_service::HISTORY_TABLE).await;
    let topics = Topics::new("");
    let handler = Applier::new(db.pool.clone(), ApplyPaymentResult::new(topics.clone()));
    Fixture {
        db,
        handler,
        topics,
    }
}

impl Fixture {
    async fn pending_order(&self) -> Uuid {
        app::pending_order(&self.db.pool, &self.topics).await
    }

    async fn status(&self, order_id: Uuid) -> String {
        let client = self.db.client().await;
        let row = client
            .query_one("SELECT status FROM orders WHERE id = $1", &[&order_id])
            .await
            .unwrap();
        row.get(0)
    }

    async fn outcome_events(&self, order_id: Uuid) -> i64 {
        self.db
            .count(
                "SELECT count(*) FROM outbox WHERE key = $1 AND type IN ('order.confirmed', 'order.cancelled')",
                &[&order_id.to_string()],
            )
            .await
    }

    async fn processed(&self, event_id: &str) -> i64 {
        self.db
            .count(
                "SELECT count(*) FROM processed_events WHERE event_id = $1",
                &[&event_id],
            )
            .await
    }
}

fn payment_result(id: &str, event_type: &str, order_id: Uuid) -> Envelope {
    let raw = saga_testkit::envelope(
        id,
        event_type,
        order_id,
        json!({ "order_id": order_id, "amount_cents": 2598, "reason": "card declined" }),
    );
    Envelope::from_slice(&raw).unwrap()
}

#[tokio::test]
async fn a_payment_success_confirms_the_order_and_announces_it() {
    let f = fixture().await;
    let order_id = f.pending_order().await;
    let event = payment_result(
        &events::payment_result_id(&order_id.to_string()),
        PAYMENT_SUCCEEDED,
        order_id,
    );

    assert_eq!(f.handler.apply(&event).await.unwrap(), Outcome::Applied);

    assert_eq!(f.status(order_id).await, "confirmed");
    let client = f.db.client().await;
    let row = client
        .query_one(
            "SELECT event_id, type FROM outbox WHERE key = $1 AND type <> 'order.created'",
            &[&order_id.to_string()],
        )
        .await
        .unwrap();
    assert_eq!(
        row.get::<_, String>("event_id"),
        format!("{order_id}:outcome")
    );
    assert_eq!(row.get::<_, String>("type"), "order.confirmed");
}

#[tokio::test]
async fn a_payment_failure_cancels_the_order_with_its_reason() {
    let f = fixture().await;
    let order_id = f.pending_order().await;
    let event = payment_result("p-1", PAYMENT_FAILED, order_id);

    assert_eq!(f.handler.apply(&event).await.unwrap(), Outcome::Applied);

    let client = f.db.client().await;
    let order = orders::find_order(&client, order_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(order.status.as_str(), "cancelled");
    assert_eq!(order.cancel_reason.as_deref(), Some("card declined"));
    assert_eq!(f.outcome_events(order_id).await, 1);
}

#[tokio::test]
async fn the_same_event_twice_changes_state_once() {
    let f = fixture().await;
    let order_id = f.pending_order().await;
    let event = payment_result("same-1", PAYMENT_SUCCEEDED, order_id);

    assert_eq!(f.handler.apply(&event).await.unwrap(), Outcome::Applied);
    let updated_at_first: time::OffsetDateTime =
        f.db.client()
            .await
            .query_one("SELECT updated_at FROM orders WHERE id = $1", &[&order_id])
            .await
            .unwrap()
            .get(0);
    assert_eq!(f.handler.apply(&event).await.unwrap(), Outcome::Duplicate);

    assert_eq!(f.status(order_id).await, "confirmed");
    assert_eq!(f.processed("same-1").await, 1);
    assert_eq!(f.outcome_events(order_id).await, 1);
    let updated_at_second: time::OffsetDateTime =
        f.db.client()
            .await
            .query_one("SELECT updated_at FROM orders WHERE id = $1", &[&order_id])
            .await
            .unwrap()
            .get(0);
    assert_eq!(
        updated_at_first, updated_at_second,
        "the duplicate touched the order"
    );
}

/// The pruner forgot the event's id: guard 1 lets the copy through, guard 2 (the order is
/// no longer pending) stops it.
#[tokio::test]
async fn a_redelivery_after_its_id_was_pruned_changes_nothing() {
    let f = fixture().await;
    let order_id = f.pending_order().await;
    let event = payment_result("pruned-1", PAYMENT_SUCCEEDED, order_id);
    assert_eq!(f.handler.apply(&event).await.unwrap(), Outcome::Applied);

    assert_eq!(f.db.prune_inbox().await, 1);
    let outcome = f.handler.apply(&event).await.unwrap();

    assert_eq!(outcome, Outcome::Guarded);
    assert_eq!(f.status(order_id).await, "confirmed");
    assert_eq!(f.outcome_events(order_id).await, 1);
}

#[tokio::test]
async fn a_late_failure_with_a_new_id_leaves_a_confirmed_order_confirmed() {
    let f = fixture().await;
    let order_id = f.pending_order().await;
    f.handler
        .apply(&payment_result("first", PAYMENT_SUCCEEDED, order_id))
        .await
        .unwrap();

    let late = payment_result("late-failure-001", PAYMENT_FAILED, order_id);
    assert_eq!(f.handler.apply(&late).await.unwrap(), Outcome::Guarded);

    assert_eq!(f.status(order_id).await, "confirmed");
    assert_eq!(f.outcome_events(order_id).await, 1);
    // The guarded event is recorded, so its own redelivery stops at guard 1.
    assert_eq!(f.processed("late-failure-001").await, 1);
    assert_eq!(f.handler.apply(&late).await.unwrap(), Outcome::Duplicate);
}

#[tokio::test]
async fn two_results_applied_concurrently_make_exactly_one_transition() {
    let f = fixture().await;
    // Enough rounds for the two transactions to meet at the lock in every order.
    for round in 0..60 {
        let order_id = f.pending_order().await;
        let success = payment_result(&format!("ok-{round}"), PAYMENT_SUCCEEDED, order_id);
        let failure = payment_result(&format!("ko-{round}"), PAYMENT_FAILED, order_id);
        let other = Applier::new(f.db.pool.clone(), ApplyPaymentResult::new(f.topics.clone()));

        let (a, b) = tokio::join!(f.handler.apply(&success), other.apply(&failure));
        let mut outcomes = [a, b].map(|applied| raced(round, order_id, applied));
        outcomes.sort_by_key(|o| o.as_str());
        assert_eq!(
            outcomes,
            [Outcome::Applied, Outcome::Guarded],
            "round {round}"
        );

        let status = f.status(order_id).await;
        assert_eq!(f.outcome_events(order_id).await, 1, "round {round}");
        // Both ids are recorded: the loser's too, so its redelivery stops at guard 1.
        assert_eq!(
            f.processed(&format!("ok-{round}")).await,
            1,
            "round {round}"
        );
        assert_eq!(
            f.processed(&format!("ko-{round}")).await,
            1,
            "round {round}"
        );
        let expected_type = if status == "confirmed" {
            "order.confirmed"
        } else {
            "order.cancelled"
        };
        let announced: String =
            f.db.client()
                .await
                .query_one(
                    "SELECT type FROM outbox WHERE event_id = $1",
                    &[&format!("{order_id}:outcome")],
                )
                .await
                .unwrap()
                .get(0);
        assert_eq!(
            announced, expected_type,
            "round {round}: state and event disagree"
        );
    }
}

/// What one of two results applied at once did. Had both passed guard 2, the loser would
/// have changed the order too, and only the outbox's unique event id would stop its commit:
/// a failure says so rather than just showing the unique violation.
fn raced(round: usize, order_id: Uuid, applied: Result<Outcome, HandlerError>) -> Outcome {
    match applied {
        Ok(outcome) => outcome,
        Err(HandlerError::Database(error))
            if error.as_db_error().and_then(|db| db.constraint())
                == Some("outbox_event_id_key") =>
        {
            panic!(
                "round {round}: both results passed guard 2: the loser read a stale `pending`, \
                 got past the status check and changed the order too, and only the outbox's \
                 unique event id `{order_id}:outcome` stopped it: {}",
                saga::db::describe(&error)
            )
        }
        Err(error) => panic!("round {round}: {error}"),
    }
}

#[tokio::test]
async fn a_result_for_an_unknown_order_is_rejected_and_not_recorded() {
    let f = fixture().await;
    let event = payment_result("ghost", PAYMENT_SUCCEEDED, Uuid::new_v4());

    let error = f.handler.apply(&event).await.unwrap_err();

    assert!(
        matches!(&error, HandlerError::Rejected(reason) if reason.contains("does not exist")),
        "{error}"
    );
    assert_eq!(f.processed("ghost").await, 0);
}

#[tokio::test]
async fn an_unknown_event_type_is_rejected() {
    let f = fixture().await;
    let order_id = f.pending_order().await;
    let event = payment_result("x", "payment.disputed", order_id);

    let error = f.handler.apply(&event).await.unwrap_err();

    assert!(error.to_string().contains("payment.disputed"), "{error}");
    assert_eq!(f.status(order_id).await, "pending");
}
