//! ChargeOrder against a real PostgreSQL and a real card provider (payment-provider, its
//! own database, over HTTP): one charge and one payment per order, whatever is
//! redelivered, raced or batched. What the provider's own faults do to a charge:
//! `charge_provider.rs`.

mod common;

use common::charging::{created_by_order_service, fixture, order_created};
use saga::events::ORDER_CREATED;
use saga::{Envelope, Outcome};
use saga_testkit::race;
use serde_json::json;
use uuid::Uuid;

#[tokio::test]
async fn an_order_within_the_limit_is_charged_and_the_result_id_derives_from_the_event() {
    let f = fixture().await;
    let handler = f.handler();
    let (order_id, event) = created_by_order_service(2598);

    let outcome = handler.apply(&event).await.unwrap();

    assert_eq!(outcome, Outcome::Applied);
    assert_eq!(
        f.results(order_id).await,
        [(
            format!("{order_id}:payment"),
            "payment.succeeded".to_owned()
        )]
    );
    f.charged_once(order_id, 2598).await;
}

#[tokio::test]
async fn an_order_the_provider_declines_fails_with_the_providers_reason() {
    let f = fixture().await;
    let handler = f.handler();
    let order_id = Uuid::new_v4();

    handler
        .apply(&order_created("big", order_id, 129_900))
        .await
        .unwrap();

    let client = f.db.client().await;
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
    let charges = f.charges(order_id).await;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0]["status"], "failed");
    assert_eq!(
        f.charge_id(order_id).await.as_deref(),
        charges[0]["id"].as_str()
    );
}

#[tokio::test]
async fn the_same_event_twice_charges_once() {
    let f = fixture().await;
    let handler = f.handler();
    let order_id = Uuid::new_v4();
    let event = order_created("created-1", order_id, 2598);

    assert_eq!(handler.apply(&event).await.unwrap(), Outcome::Applied);
    assert_eq!(handler.apply(&event).await.unwrap(), Outcome::Duplicate);

    f.charged_once(order_id, 2598).await;
    assert_eq!(
        f.provider.stats().await["calls"],
        1,
        "a known duplicate makes no call"
    );
    assert_eq!(f.payments(order_id).await, 1);
    assert_eq!(f.results(order_id).await.len(), 1);
    assert_eq!(
        f.db.count(
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
    let f = fixture().await;
    let handler = f.handler();
    let order_id = Uuid::new_v4();
    let event = order_created("created-pruned", order_id, 2598);
    assert_eq!(handler.apply(&event).await.unwrap(), Outcome::Applied);

    assert_eq!(f.db.prune_inbox().await, 1);
    let outcome = handler.apply(&event).await.unwrap();

    assert_eq!(outcome, Outcome::Guarded);
    f.guarded_after_one_charge(order_id, 2598).await;
}

#[tokio::test]
async fn a_second_order_created_with_a_new_id_does_not_charge_again() {
    let f = fixture().await;
    let handler = f.handler();
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
    f.guarded_after_one_charge(order_id, 2598).await;
}

#[tokio::test]
async fn two_events_for_one_order_applied_concurrently_charge_exactly_once() {
    let f = fixture().await;
    let (a, b) = (f.handler(), f.handler());
    for round in 0..60 {
        let order_id = Uuid::new_v4();
        let first = order_created(&format!("a-{round}"), order_id, 2598);
        let second = order_created(&format!("b-{round}"), order_id, 2598);

        let outcomes = race::outcomes((&a, &first), (&b, &second)).await;

        assert_eq!(outcomes, ["applied", "guarded"], "round {round}");
        assert_eq!(f.results(order_id).await.len(), 1, "round {round}");
        f.charged_once(order_id, 2598).await;
    }
}

#[tokio::test]
async fn outcome_events_on_the_shared_topic_are_ignored() {
    let f = fixture().await;
    let handler = f.handler();
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
    assert_eq!(f.payments(order_id).await, 0);
}

#[tokio::test]
async fn a_payload_missing_a_field_is_rejected_naming_it() {
    let f = fixture().await;
    let handler = f.handler();
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
    let f = fixture().await;
    let handler = f.handler();
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
    let batch = [
        order_created("a-1", a, 2598),
        order_created("a-1", a, 2598),
        order_created("a-2", a, 2598),
        order_created("b-1", b, 129_900),
    ];

    let outcomes = handler.apply_batch(&batch).await.unwrap();

    // The batch's events are prepared side by side, so either of the order's two events
    // may write its intent first; the other is guarded, and the copy is a duplicate.
    let winner = match outcomes[..3] {
        [Outcome::Applied, Outcome::Duplicate, Outcome::Guarded] => "a-1",
        [Outcome::Guarded, Outcome::Duplicate, Outcome::Applied] => "a-2",
        _ => panic!("{outcomes:?}"),
    };
    assert_eq!(outcomes[3], Outcome::Applied);
    assert_eq!(f.payments(a).await, 1);
    assert_eq!(
        f.results(a).await,
        [(format!("{winner}:payment"), "payment.succeeded".to_owned())]
    );
    assert_eq!(
        f.results(b).await,
        [("b-1:payment".to_owned(), "payment.failed".to_owned())]
    );
    // The batch's repeats are absorbed again when it is redelivered whole.
    assert_eq!(
        handler.apply_batch(&batch).await.unwrap(),
        [Outcome::Duplicate; 4]
    );
    f.charged_once(a, 2598).await;
    f.charged_once(b, 129_900).await;
}

#[tokio::test]
async fn a_batch_that_fails_part_way_commits_none_of_its_events() {
    let f = fixture().await;
    let handler = f.handler();
    let (a, c) = (Uuid::new_v4(), Uuid::new_v4());
    // An outbox row already holds the id the second event's result would take: its
    // insert fails inside the batch's transaction, after the first event was applied.
    f.db.client()
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
        f.status(a).await.as_deref(),
        Some("charging"),
        "the first event's payment is its intent still, undecided"
    );
    assert_eq!(f.results(a).await, []);
    assert_eq!(
        f.db.count(
            "SELECT count(*) FROM processed_events WHERE event_id = 'a'",
            &[]
        )
        .await,
        0,
        "the first event's id stayed recorded: its redelivery would be skipped"
    );
    // The provider charged before the transaction; the rollback could not undo that. The
    // event applied again asks with the same key and records that very charge.
    assert_eq!(f.charges(a).await.len(), 1);
    assert_eq!(
        handler.apply(&order_created("a", a, 2598)).await.unwrap(),
        Outcome::Applied
    );
    f.charged_once(a, 2598).await;
}

#[tokio::test]
async fn two_batches_for_the_same_orders_applied_concurrently_charge_each_once() {
    let f = fixture().await;
    let (a, b) = (f.handler(), f.handler());
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
            assert_eq!(f.results(*order_id).await.len(), 1, "round {round}");
            f.charged_once(*order_id, 2598).await;
        }
    }
}
