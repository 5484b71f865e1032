//! ChargeOrder against a real PostgreSQL: one payment per order, whatever is redelivered.

use payment_service::{ChargeOrder, PaymentPolicy};
use saga::events::ORDER_CREATED;
use saga::{Applier, Envelope, Outcome, Topics};
use saga_testkit::TestDatabase;
use serde_json::json;
use uuid::Uuid;

const LIMIT: PaymentPolicy = PaymentPolicy {
    limit_cents: 100_000,
};

async fn database() -> TestDatabase {
    TestDatabase::migrated(payment_service::migrations, payment_service::HISTORY_TABLE).await
}

fn order_created(id: &str, order_id: Uuid, amount_cents: i64) -> Envelope {
    let raw = saga_testkit::envelope(
        id,
        ORDER_CREATED,
        order_id,
        json!({ "order_id": order_id, "customer_id": "cust-1", "amount_cents": amount_cents, "items": [] }),
    );
    Envelope::from_slice(&raw).unwrap()
}

async fn payments(db: &TestDatabase, order_id: Uuid) -> i64 {
    db.count(
        "SELECT count(*) FROM payments WHERE order_id = $1",
        &[&order_id],
    )
    .await
}

async fn results(db: &TestDatabase, order_id: Uuid) -> Vec<(String, String)> {
    db.client()
        .await
        .query(
            "SELECT event_id, type FROM outbox WHERE key = $1",
            &[&order_id.to_string()],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

#[tokio::test]
async fn an_order_within_the_limit_is_charged_and_the_result_id_derives_from_the_event() {
    let db = database().await;
    let handler = Applier::new(db.pool.clone(), ChargeOrder::new(Topics::new(""), LIMIT));
    let order_id = Uuid::new_v4();

    let outcome = handler
        .apply(&order_created(&order_id.to_string(), order_id, 2598))
        .await
        .unwrap();

    assert_eq!(outcome, Outcome::Applied);
    assert_eq!(
        results(&db, order_id).await,
        [(
            format!("{order_id}:payment"),
            "payment.succeeded".to_owned()
        )]
    );
}

#[tokio::test]
async fn an_order_over_the_limit_fails_with_the_reason() {
    let db = database().await;
    let handler = Applier::new(db.pool.clone(), ChargeOrder::new(Topics::new(""), LIMIT));
    let order_id = Uuid::new_v4();

    handler
        .apply(&order_created("big", order_id, 129_900))
        .await
        .unwrap();

    let client = db.client().await;
    let row = client
        .query_one(
            "SELECT status, reason FROM payments WHERE order_id = $1",
            &[&order_id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>("status"), "failed");
    assert_eq!(
        row.get::<_, Option<String>>("reason").as_deref(),
        Some("amount exceeds limit")
    );
    let payload: serde_json::Value = client
        .query_one(
            "SELECT payload FROM outbox WHERE event_id = 'big:payment'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(payload["reason"], "amount exceeds limit");
}

#[tokio::test]
async fn the_same_event_twice_charges_once() {
    let db = database().await;
    let handler = Applier::new(db.pool.clone(), ChargeOrder::new(Topics::new(""), LIMIT));
    let order_id = Uuid::new_v4();
    let event = order_created("created-1", order_id, 2598);

    assert_eq!(handler.apply(&event).await.unwrap(), Outcome::Applied);
    assert_eq!(handler.apply(&event).await.unwrap(), Outcome::Duplicate);

    assert_eq!(payments(&db, order_id).await, 1);
    assert_eq!(results(&db, order_id).await.len(), 1);
    assert_eq!(
        db.count(
            "SELECT count(*) FROM processed_events WHERE event_id = 'created-1'",
            &[]
        )
        .await,
        1
    );
}

/// The pruner forgot the event's id: guard 1 lets the copy through, guard 2 (one payment
/// row per order) stops it.
#[tokio::test]
async fn a_redelivery_after_its_id_was_pruned_charges_nothing() {
    let db = database().await;
    let handler = Applier::new(db.pool.clone(), ChargeOrder::new(Topics::new(""), LIMIT));
    let order_id = Uuid::new_v4();
    let event = order_created("created-pruned", order_id, 2598);
    assert_eq!(handler.apply(&event).await.unwrap(), Outcome::Applied);

    assert_eq!(db.prune_inbox().await, 1);
    let outcome = handler.apply(&event).await.unwrap();

    assert_eq!(outcome, Outcome::Guarded);
    assert_eq!(payments(&db, order_id).await, 1);
    assert_eq!(results(&db, order_id).await.len(), 1);
}

#[tokio::test]
async fn a_second_order_created_with_a_new_id_does_not_charge_again() {
    let db = database().await;
    let handler = Applier::new(db.pool.clone(), ChargeOrder::new(Topics::new(""), LIMIT));
    let order_id = Uuid::new_v4();
    handler
        .apply(&order_created("first", order_id, 2598))
        .await
        .unwrap();

    let outcome = handler
        .apply(&order_created("second", order_id, 2598))
        .await
        .unwrap();

    assert_eq!(outcome, Outcome::Guarded);
    assert_eq!(payments(&db, order_id).await, 1);
    assert_eq!(results(&db, order_id).await.len(), 1);
}

#[tokio::test]
async fn two_events_for_one_order_applied_concurrently_charge_exactly_once() {
    let db = database().await;
    let topics = Topics::new("");
    let a = Applier::new(db.pool.clone(), ChargeOrder::new(topics.clone(), LIMIT));
    let b = Applier::new(db.pool.clone(), ChargeOrder::new(topics, LIMIT));
    for round in 0..60 {
        let order_id = Uuid::new_v4();
        let first = order_created(&format!("a-{round}"), order_id, 2598);
        let second = order_created(&format!("b-{round}"), order_id, 2598);

        let (x, y) = tokio::join!(a.apply(&first), b.apply(&second));
        let mut outcomes = [x.unwrap().as_str(), y.unwrap().as_str()];
        outcomes.sort();

        assert_eq!(outcomes, ["applied", "guarded"], "round {round}");
        assert_eq!(payments(&db, order_id).await, 1, "round {round}");
        assert_eq!(results(&db, order_id).await.len(), 1, "round {round}");
    }
}

#[tokio::test]
async fn outcome_events_on_the_shared_topic_are_ignored() {
    let db = database().await;
    let handler = Applier::new(db.pool.clone(), ChargeOrder::new(Topics::new(""), LIMIT));
    let order_id = Uuid::new_v4();
    let raw = saga_testkit::envelope(
        "o:outcome",
        "order.confirmed",
        order_id,
        json!({ "order_id": order_id, "customer_id": "c", "amount_cents": 1 }),
    );

    let outcome = handler
        .apply(&Envelope::from_slice(&raw).unwrap())
        .await
        .unwrap();

    assert_eq!(outcome, Outcome::Ignored);
    assert_eq!(payments(&db, order_id).await, 0);
}

#[tokio::test]
async fn a_payload_missing_a_field_is_rejected_naming_it() {
    let db = database().await;
    let handler = Applier::new(db.pool.clone(), ChargeOrder::new(Topics::new(""), LIMIT));
    let order_id = Uuid::new_v4();
    let raw = saga_testkit::envelope(
        "x",
        ORDER_CREATED,
        order_id,
        json!({ "order_id": order_id }),
    );

    let error = handler
        .apply(&Envelope::from_slice(&raw).unwrap())
        .await
        .unwrap_err();

    assert!(error.to_string().contains("customer_id"), "{error}");
    assert_eq!(error.retry(), saga::Retry::Never);
}

#[tokio::test]
async fn a_batch_dedupes_and_guards_each_event_on_its_own() {
    let db = database().await;
    let handler = Applier::new(db.pool.clone(), ChargeOrder::new(Topics::new(""), LIMIT));
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
    let batch = [
        order_created("a-1", a, 2598),
        order_created("a-1", a, 2598),
        order_created("a-2", a, 2598),
        order_created("b-1", b, 129_900),
    ];

    let outcomes = handler.apply_batch(&batch).await.unwrap();

    assert_eq!(
        outcomes,
        [
            Outcome::Applied,
            Outcome::Duplicate,
            Outcome::Guarded,
            Outcome::Applied
        ]
    );
    assert_eq!(payments(&db, a).await, 1);
    assert_eq!(
        results(&db, a).await,
        [("a-1:payment".to_owned(), "payment.succeeded".to_owned())]
    );
    assert_eq!(
        results(&db, b).await,
        [("b-1:payment".to_owned(), "payment.failed".to_owned())]
    );
    // The batch's repeats are absorbed again when it is redelivered whole.
    assert_eq!(
        handler.apply_batch(&batch).await.unwrap(),
        [Outcome::Duplicate; 4]
    );
    assert_eq!(payments(&db, a).await, 1);
}

#[tokio::test]
async fn a_batch_that_fails_part_way_commits_none_of_its_events() {
    let db = database().await;
    let handler = Applier::new(db.pool.clone(), ChargeOrder::new(Topics::new(""), LIMIT));
    let (a, c) = (Uuid::new_v4(), Uuid::new_v4());
    // An outbox row already holds the id the second event's result would take: its
    // insert fails inside the batch's transaction, after the first event was applied.
    db.client()
        .await
        .execute(
            "INSERT INTO outbox (event_id, topic, key, type, payload)
             VALUES ('taken:payment', 'payments', 'k', 'payment.succeeded', '{}')",
            &[],
        )
        .await
        .unwrap();

    let error = handler
        .apply_batch(&[order_created("a", a, 2598), order_created("taken", c, 2598)])
        .await
        .unwrap_err();

    assert!(error.to_string().contains("outbox"), "{error}");
    assert_eq!(
        payments(&db, a).await,
        0,
        "the first event's payment stayed"
    );
    assert_eq!(results(&db, a).await, []);
    assert_eq!(
        db.count(
            "SELECT count(*) FROM processed_events WHERE event_id = 'a'",
            &[]
        )
        .await,
        0,
        "the first event's id stayed recorded: its redelivery would be skipped"
    );
}

#[tokio::test]
async fn two_batches_for_the_same_orders_applied_concurrently_charge_each_once() {
    let db = database().await;
    let topics = Topics::new("");
    let a = Applier::new(db.pool.clone(), ChargeOrder::new(topics.clone(), LIMIT));
    let b = Applier::new(db.pool.clone(), ChargeOrder::new(topics, LIMIT));
    for round in 0..20 {
        let orders: Vec<Uuid> = (0..8).map(|_| Uuid::new_v4()).collect();
        let first: Vec<Envelope> = orders
            .iter()
            .map(|id| order_created(&format!("a-{id}"), *id, 2598))
            .collect();
        let second: Vec<Envelope> = orders
            .iter()
            .map(|id| order_created(&format!("b-{id}"), *id, 2598))
            .collect();

        let (x, y) = tokio::join!(a.apply_batch(&first), b.apply_batch(&second));
        let (x, y) = (x.unwrap(), y.unwrap());

        for (n, order_id) in orders.iter().enumerate() {
            let mut outcomes = [x[n].as_str(), y[n].as_str()];
            outcomes.sort();
            assert_eq!(outcomes, ["applied", "guarded"], "round {round}, order {n}");
            assert_eq!(payments(&db, *order_id).await, 1, "round {round}");
            assert_eq!(results(&db, *order_id).await.len(), 1, "round {round}");
        }
    }
}
