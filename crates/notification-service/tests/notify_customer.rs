//! NotifyCustomer against a real PostgreSQL: one notification per order and kind of news.

use notification_service::NotifyCustomer;
use saga::{Applier, Envelope, Outcome, Topics};
use saga_testkit::{TestDatabase, race};
use serde_json::json;
use uuid::Uuid;

async fn database() -> TestDatabase {
    TestDatabase::migrated(
        notification_service::migrations,
        notification_service::HISTORY_TABLE,
    )
    .await
}

/// NotifyCustomer as the consumer applies it, each event in a transaction of its own.
fn handler(db: &TestDatabase) -> Applier<NotifyCustomer> {
    Applier::new(db.pool.clone(), NotifyCustomer::new(Topics::new("")))
}

fn outcome_event(id: &str, event_type: &str, order_id: Uuid) -> Envelope {
    event_with_reason(id, event_type, order_id, "amount exceeds limit")
}

fn event_with_reason(id: &str, event_type: &str, order_id: Uuid, reason: &str) -> Envelope {
    let raw = saga_testkit::envelope(
        id,
        event_type,
        order_id,
        json!({ "order_id": order_id, "customer_id": "cust-1", "amount_cents": 2598, "reason": reason }),
    );
    Envelope::from_slice(&raw).unwrap()
}

/// The order's one notification's text.
async fn the_message(db: &TestDatabase, order_id: Uuid) -> String {
    db.client()
        .await
        .query_one(
            "SELECT message FROM notifications WHERE order_id = $1",
            &[&order_id],
        )
        .await
        .unwrap()
        .get(0)
}

/// The kinds of notification the order has, in the order they were made.
async fn kinds(db: &TestDatabase, order_id: Uuid) -> Vec<String> {
    db.client()
        .await
        .query(
            "SELECT kind FROM notifications WHERE order_id = $1 ORDER BY created_at, kind",
            &[&order_id],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

async fn notifications(db: &TestDatabase, order_id: Uuid) -> i64 {
    db.count(
        "SELECT count(*) FROM notifications WHERE order_id = $1",
        &[&order_id],
    )
    .await
}

async fn sent_events(db: &TestDatabase, order_id: Uuid) -> i64 {
    db.count(
        "SELECT count(*) FROM outbox WHERE key = $1 AND type = 'notification.sent'",
        &[&order_id.to_string()],
    )
    .await
}

/// One notification for the order, and one `notification.sent` announcing it.
async fn notified_once(db: &TestDatabase, order_id: Uuid) {
    assert_eq!(notifications(db, order_id).await, 1);
    assert_eq!(sent_events(db, order_id).await, 1);
}

#[tokio::test]
async fn a_confirmed_order_notifies_the_customer() {
    let db = database().await;
    let handler = handler(&db);
    let order_id = Uuid::new_v4();

    let outcome = handler
        .apply(&outcome_event(
            &format!("{order_id}:outcome"),
            "order.confirmed",
            order_id,
        ))
        .await
        .unwrap();

    assert_eq!(outcome, Outcome::Applied);
    let row = db
        .client()
        .await
        .query_one(
            "SELECT customer_id, kind, message FROM notifications WHERE order_id = $1",
            &[&order_id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>("customer_id"), "cust-1");
    assert_eq!(row.get::<_, String>("kind"), "confirmed");
    assert!(row.get::<_, String>("message").contains("25.98"));
    let id: String = db
        .client()
        .await
        .query_one(
            "SELECT event_id FROM outbox WHERE type = 'notification.sent'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(id, format!("{order_id}:outcome:notification"));
}

#[tokio::test]
async fn a_cancelled_order_tells_the_customer_why() {
    let db = database().await;
    let handler = handler(&db);
    let order_id = Uuid::new_v4();

    handler
        .apply(&outcome_event(
            &format!("{order_id}:outcome"),
            "order.cancelled",
            order_id,
        ))
        .await
        .unwrap();

    let message = the_message(&db, order_id).await;
    assert!(
        message.contains("cancelled (amount exceeds limit)"),
        "{message}"
    );
}

#[tokio::test]
async fn the_same_event_twice_notifies_once() {
    let db = database().await;
    let handler = handler(&db);
    let order_id = Uuid::new_v4();
    let event = outcome_event("same", "order.confirmed", order_id);

    assert_eq!(handler.apply(&event).await.unwrap(), Outcome::Applied);
    assert_eq!(handler.apply(&event).await.unwrap(), Outcome::Duplicate);

    notified_once(&db, order_id).await;
    assert_eq!(
        db.count(
            "SELECT count(*) FROM processed_events WHERE event_id = 'same'",
            &[]
        )
        .await,
        1
    );
}

/// The pruner forgot the event's id: guard 1 lets the copy through, guard 2 (one
/// notification per order) stops it.
#[tokio::test]
async fn a_redelivery_after_its_id_was_pruned_notifies_nothing() {
    let db = database().await;
    let handler = handler(&db);
    let order_id = Uuid::new_v4();
    let event = outcome_event("outcome-pruned", "order.confirmed", order_id);
    assert_eq!(handler.apply(&event).await.unwrap(), Outcome::Applied);

    assert_eq!(db.prune_inbox().await, 1);
    let outcome = handler.apply(&event).await.unwrap();

    assert_eq!(outcome, Outcome::Guarded);
    notified_once(&db, order_id).await;
}

#[tokio::test]
async fn a_second_confirmation_with_a_new_id_does_not_notify_again() {
    let db = database().await;
    let handler = handler(&db);
    let order_id = Uuid::new_v4();
    handler
        .apply(&outcome_event("first", "order.confirmed", order_id))
        .await
        .unwrap();

    let outcome = handler
        .apply(&outcome_event("other", "order.confirmed", order_id))
        .await
        .unwrap();

    assert_eq!(outcome, Outcome::Guarded);
    notified_once(&db, order_id).await;
}

#[tokio::test]
async fn two_confirmations_for_one_order_applied_concurrently_notify_exactly_once() {
    let db = database().await;
    let (a, b) = (handler(&db), handler(&db));
    for round in 0..60 {
        let order_id = Uuid::new_v4();
        let first = outcome_event(&format!("a-{round}"), "order.confirmed", order_id);
        let second = outcome_event(&format!("b-{round}"), "order.confirmed", order_id);

        let outcomes = race::outcomes((&a, &first), (&b, &second)).await;

        assert_eq!(outcomes, ["applied", "guarded"], "round {round}");
        assert_eq!(notifications(&db, order_id).await, 1, "round {round}");
        assert_eq!(sent_events(&db, order_id).await, 1, "round {round}");
    }
}

#[tokio::test]
async fn order_created_is_not_a_notification() {
    let db = database().await;
    let handler = handler(&db);
    let order_id = Uuid::new_v4();

    let outcome = handler
        .apply(&outcome_event("x", "order.created", order_id))
        .await
        .unwrap();

    assert_eq!(outcome, Outcome::Ignored);
    assert_eq!(notifications(&db, order_id).await, 0);
}

#[tokio::test]
async fn a_cancellation_after_the_confirmation_tells_the_customer_both_once() {
    let db = database().await;
    let handler = handler(&db);
    let order_id = Uuid::new_v4();
    let confirmed = outcome_event(&format!("{order_id}:outcome"), "order.confirmed", order_id);
    let cancelled = event_with_reason(
        &format!("{order_id}:cancel"),
        "order.cancelled",
        order_id,
        "customer",
    );

    for event in [&confirmed, &cancelled, &cancelled, &confirmed] {
        handler.apply(event).await.unwrap();
    }

    assert_eq!(
        kinds(&db, order_id).await,
        ["confirmed", "cancelled_by_customer"]
    );
    assert_eq!(sent_events(&db, order_id).await, 2);
}

#[tokio::test]
async fn each_cancellation_says_why_in_its_own_words() {
    let db = database().await;
    let handler = handler(&db);
    for (reason, kind, words) in [
        ("customer", "cancelled_by_customer", "as you asked"),
        ("timeout", "cancelled_for_timeout", "took too long"),
        ("card declined", "declined", "cancelled (card declined)"),
    ] {
        let order_id = Uuid::new_v4();
        let id = match reason {
            "card declined" => format!("{order_id}:outcome"),
            _ => format!("{order_id}:cancel"),
        };
        handler
            .apply(&event_with_reason(&id, "order.cancelled", order_id, reason))
            .await
            .unwrap();

        assert_eq!(kinds(&db, order_id).await, [kind], "{reason}");
        let message = the_message(&db, order_id).await;
        assert!(message.contains(words), "{reason}: {message}");
    }
}

/// A cancellation with an id order-service never gives one is not the order's state: the
/// customer is not told their order was cancelled.
#[tokio::test]
async fn a_cancellation_order_service_did_not_write_tells_nothing() {
    let db = database().await;
    let handler = handler(&db);
    let order_id = Uuid::new_v4();

    let outcome = handler
        .apply(&event_with_reason(
            &format!("typed-by-hand:{order_id}"),
            "order.cancelled",
            order_id,
            "customer",
        ))
        .await
        .unwrap();

    assert_eq!(outcome, Outcome::Ignored);
    assert_eq!(notifications(&db, order_id).await, 0);
}

#[tokio::test]
async fn a_refund_is_told_once_whatever_repeats_it() {
    let db = database().await;
    let handler = handler(&db);
    let order_id = Uuid::new_v4();
    let refunded = |id: &str| {
        let raw = saga_testkit::envelope(
            id,
            "order.refunded",
            order_id,
            json!({ "order_id": order_id, "customer_id": "cust-1", "amount_cents": 2598 }),
        );
        Envelope::from_slice(&raw).unwrap()
    };
    let first = refunded(&format!("{order_id}:refunded"));

    assert_eq!(handler.apply(&first).await.unwrap(), Outcome::Applied);
    assert_eq!(handler.apply(&first).await.unwrap(), Outcome::Duplicate);
    assert_eq!(
        handler.apply(&refunded("another")).await.unwrap(),
        Outcome::Guarded
    );

    assert_eq!(kinds(&db, order_id).await, ["refunded"]);
    let message = the_message(&db, order_id).await;
    assert!(
        message.contains("25.98") && message.contains("refunded"),
        "{message}"
    );
}

/// A hand-made contradicting outcome under an id of its own: the customer was told the
/// order's outcome once, and is not told the opposite.
#[tokio::test]
async fn a_contradicting_outcome_with_a_new_id_tells_nothing() {
    let db = database().await;
    let handler = handler(&db);
    let order_id = Uuid::new_v4();
    let declined = outcome_event(&format!("{order_id}:outcome"), "order.cancelled", order_id);
    handler.apply(&declined).await.unwrap();

    let flipped = outcome_event(
        &format!("conflict-outcome-flip:{order_id}"),
        "order.confirmed",
        order_id,
    );
    assert_eq!(handler.apply(&flipped).await.unwrap(), Outcome::Guarded);

    assert_eq!(kinds(&db, order_id).await, ["declined"]);
    assert_eq!(sent_events(&db, order_id).await, 1);
}
