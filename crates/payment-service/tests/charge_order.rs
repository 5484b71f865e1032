//! ChargeOrder against a real PostgreSQL and a real card provider (payment-provider, its
//! own database, over HTTP): one charge and one payment per order, whatever is
//! redelivered, raced, or lost on the way back from the provider.

mod common;

use std::time::Duration;

use common::{LocalProvider, client_of};
use payment_service::ChargeOrder;
use saga::events::ORDER_CREATED;
use saga::{Applier, Envelope, Outcome, Retry, Topics};
use saga_testkit::provider::ProviderAdmin;
use saga_testkit::{TestDatabase, race};
use serde_json::{Value, json};
use uuid::Uuid;

/// payment-service's database and a provider of its own.
struct Fixture {
    db: TestDatabase,
    /// The provider's admin; the provider runs while `_local` is held.
    provider: ProviderAdmin,
    _local: LocalProvider,
}

async fn fixture() -> Fixture {
    let (db, local) = tokio::join!(
        TestDatabase::migrated(payment_service::migrations, payment_service::HISTORY_TABLE),
        LocalProvider::start()
    );
    Fixture {
        db,
        provider: local.admin.clone(),
        _local: local,
    }
}

impl Fixture {
    fn handler(&self) -> Applier<ChargeOrder> {
        self.handler_at(&self.provider.url)
    }

    fn handler_at(&self, provider_url: &str) -> Applier<ChargeOrder> {
        let provider = client_of(provider_url, Duration::from_millis(500));
        Applier::new(
            self.db.pool.clone(),
            ChargeOrder::new(Topics::new(""), provider),
        )
    }

    async fn payments(&self, order_id: Uuid) -> i64 {
        self.db
            .count(
                "SELECT count(*) FROM payments WHERE order_id = $1",
                &[&order_id],
            )
            .await
    }

    /// The payment's status: `charging` is the intent, `unknown` a call with no answer.
    async fn status(&self, order_id: Uuid) -> Option<String> {
        self.db
            .client()
            .await
            .query_opt(
                "SELECT status FROM payments WHERE order_id = $1",
                &[&order_id],
            )
            .await
            .unwrap()
            .map(|row| row.get(0))
    }

    async fn charge_id(&self, order_id: Uuid) -> Option<String> {
        self.db
            .client()
            .await
            .query_one(
                "SELECT charge_id FROM payments WHERE order_id = $1",
                &[&order_id],
            )
            .await
            .unwrap()
            .get(0)
    }

    async fn results(&self, order_id: Uuid) -> Vec<(String, String)> {
        self.db
            .client()
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

    async fn charges(&self, order_id: Uuid) -> Vec<Value> {
        self.provider.charges_for(&order_id.to_string()).await
    }

    /// Exactly one charge at the provider, for the order's amount, and the payment row
    /// holds its id.
    async fn charged_once(&self, order_id: Uuid, amount_cents: i64) {
        let charges = self.charges(order_id).await;
        assert_eq!(charges.len(), 1, "{charges:?}");
        assert_eq!(charges[0]["amount_cents"], amount_cents);
        assert_eq!(self.payments(order_id).await, 1);
        assert_eq!(
            self.charge_id(order_id).await.as_deref(),
            charges[0]["id"].as_str()
        );
    }

    /// What a copy stopped by a guard leaves: the order paid, announced and charged once,
    /// and the provider called only by the first.
    async fn guarded_after_one_charge(&self, order_id: Uuid, amount_cents: i64) {
        assert_eq!(self.payments(order_id).await, 1);
        assert_eq!(self.results(order_id).await.len(), 1);
        self.charged_once(order_id, amount_cents).await;
        assert_eq!(
            self.provider.stats().await["calls"],
            1,
            "a charged order makes no call"
        );
    }
}

/// A new order's `order.created` as order-service writes it: its id is the order's.
fn created_by_order_service(amount_cents: i64) -> (Uuid, Envelope) {
    let order_id = Uuid::new_v4();
    (
        order_id,
        order_created(&order_id.to_string(), order_id, amount_cents),
    )
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
