//! Cancelling an order after its card was charged, against the real binaries: the money at
//! the provider (each charge and the refunds it lists) and the saga's rows must tell one
//! story, whatever order the charge, the cancellation and the answers arrive in.

use saga::events::{ORDER_REFUNDED, PAYMENT_REFUNDED, PAYMENT_SUCCEEDED, PAYMENT_VOIDED};
use saga::failpoint;
use saga_e2e::invariants::outcomes_by_event;
use saga_e2e::{ORDER_SERVICE, PAYMENT_SERVICE, SETTLE, Stack};
use saga_testkit::eventually;
use serde_json::{Value, json};
use uuid::Uuid;

/// How long the provider takes over a slowed charge: long enough for a cancellation to
/// arrive first, short of payment-service's 5 s `PROVIDER_TIMEOUT`.
const SLOW_CHARGE_MS: u64 = 3000;

/// Orders cancelled while their charge is in flight, per consumer mode: each one more
/// chance for the cancellation to be prepared while its charge commits.
const SLOW_ROUNDS: usize = 4;

/// The order was charged once and that charge refunded once, in full, and every row of
/// the saga says so: the payment holds the provider's refund, one `payment.refunded`
/// and one `order.refunded` announced it, the order shows it, and the customer was told
/// once. Returns the provider's charge.
async fn assert_refunded_once(stack: &Stack, order_id: Uuid, amount_cents: i64) -> Value {
    let order = stack.answered_cancellation(order_id).await;
    assert_eq!(order["refund"], "refunded", "{order}");
    let money = stack.money(order_id).await;
    let charge = money.the_charge().clone();
    assert_eq!(charge["status"], "succeeded", "{charge}");
    assert_eq!(charge["amount_cents"], amount_cents, "{charge}");
    let refund = money.the_refund();
    assert_eq!(
        refund["amount_cents"], amount_cents,
        "refunded in full: {refund}"
    );
    let payment = stack.payment(order_id).await.expect("a payment row");
    assert_eq!(payment.charge_id.as_deref(), charge["id"].as_str());
    assert_eq!(
        payment.refund_id.as_deref(),
        refund["id"].as_str(),
        "the payment holds the provider's refund"
    );
    let recorded: Option<String> = stack
        .orders_db
        .client()
        .await
        .query_one("SELECT refund_id FROM orders WHERE id = $1", &[&order_id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(recorded.as_deref(), refund["id"].as_str());
    assert_eq!(
        stack
            .announced(PAYMENT_SERVICE, order_id, PAYMENT_REFUNDED)
            .await,
        1
    );
    if payment.status != "voided" {
        // A tombstone may have answered `voided` before a late charge was refunded on it.
        assert_eq!(
            stack
                .announced(PAYMENT_SERVICE, order_id, PAYMENT_VOIDED)
                .await,
            0
        );
    }
    assert_eq!(
        stack
            .announced(ORDER_SERVICE, order_id, ORDER_REFUNDED)
            .await,
        1
    );
    charge
}

/// The customer's notifications about the order are `kinds`, each once.
async fn assert_told(stack: &Stack, order_id: Uuid, kinds: &[&str]) {
    let told = stack.told(order_id, kinds).await;
    assert_eq!(told, kinds, "order {order_id}'s notifications");
}

#[tokio::test]
async fn a_confirmed_order_cancelled_is_refunded_once_for_what_was_charged() {
    let stack = Stack::start().await;
    let order_id = stack.place_order(2).await;
    assert_eq!(stack.settled_order(order_id).await["status"], "confirmed");

    let answer = stack.cancel(order_id, None).await;

    assert_eq!(answer.status, 202, "{}", answer.order);
    assert_eq!(answer.order["status"], "cancelled");
    assert_eq!(answer.order["cancel_reason"], "customer");
    assert_eq!(answer.order["refund"], "pending");
    assert_refunded_once(&stack, order_id, 2598).await;
    assert_told(
        &stack,
        order_id,
        &["cancelled_by_customer", "confirmed", "refunded"],
    )
    .await;
    let stats = stack.provider().stats().await;
    assert_eq!(stats["refunds"]["calls"], 1, "one refund call: {stats}");
}

/// Orders cancelled while the provider takes [`SLOW_CHARGE_MS`] over each charge: the
/// charge lands after the cancellation, and is refunded once.
async fn cancelled_while_the_charge_is_in_flight(stack: &Stack) {
    stack
        .provider()
        .arm(json!({"kind": "slow", "delay_ms": SLOW_CHARGE_MS}))
        .await;
    let mut orders = Vec::new();
    for round in 1..=SLOW_ROUNDS {
        let order_id = stack.place_order(1).await;
        // Its charge call is under way: the provider holds it.
        stack
            .provider_counted("charges", "slowed", round as u64)
            .await;
        let answer = stack.cancel(order_id, None).await;
        assert_eq!(answer.status, 202, "{}", answer.order);
        assert_eq!(answer.order["refund"], "pending");
        orders.push(order_id);
    }
    for order_id in orders {
        assert_refunded_once(stack, order_id, 1299).await;
        let cancelled = stack
            .moment(
                ORDER_SERVICE,
                "SELECT updated_at FROM orders WHERE id::text = $1",
                order_id,
            )
            .await;
        let charged = stack
            .moment(
                saga_e2e::PAYMENT_PROVIDER,
                "SELECT created_at FROM charges WHERE reference = $1",
                order_id,
            )
            .await;
        assert!(
            charged > cancelled,
            "order {order_id}'s charge landed after its cancellation"
        );
        // The late result changed nothing at order-service: the order stays cancelled.
        let outcomes = outcomes_by_event(stack, ORDER_SERVICE);
        assert_eq!(
            outcomes
                .get(&format!("{order_id}:payment"))
                .map(Vec::as_slice),
            Some(&["guarded".to_owned()][..])
        );
        assert_told(stack, order_id, &["cancelled_by_customer", "refunded"]).await;
    }
}

#[tokio::test]
async fn a_pending_order_cancelled_while_the_provider_is_slow_is_charged_once_and_refunded_once() {
    let stack = Stack::start().await;
    cancelled_while_the_charge_is_in_flight(&stack).await;
}

#[tokio::test]
async fn a_pending_order_cancelled_while_the_provider_is_slow_is_charged_once_and_refunded_once_in_batches()
 {
    let stack = Stack::start_with_env(&[("CONSUMER_BATCH_SIZE", "16")]).await;
    cancelled_while_the_charge_is_in_flight(&stack).await;
}

#[tokio::test]
async fn a_cancellation_sent_twice_with_one_key_is_replayed_and_refunds_once() {
    let stack = Stack::start().await;
    let order_id = stack.place_order(1).await;
    assert_eq!(stack.settled_order(order_id).await["status"], "confirmed");

    let first = stack.cancel(order_id, Some("cancel-once")).await;
    let again = stack.cancel(order_id, Some("cancel-once")).await;

    assert_eq!((first.status, first.replayed), (202, false));
    assert_eq!((again.status, again.replayed), (202, true));
    assert_eq!(again.order, first.order, "the first answer, given again");
    assert_refunded_once(&stack, order_id, 1299).await;
    assert_eq!(
        stack
            .orders_db
            .count(
                "SELECT count(*) FROM outbox WHERE key = $1 AND type = 'order.cancelled'",
                &[&order_id.to_string()]
            )
            .await,
        1,
        "one cancellation"
    );
}

#[tokio::test]
async fn a_cancellation_sent_twice_with_two_keys_finds_the_order_cancelled_and_refunds_once() {
    let stack = Stack::start().await;
    let order_id = stack.place_order(1).await;
    assert_eq!(stack.settled_order(order_id).await["status"], "confirmed");

    let first = stack.cancel(order_id, Some("cancel-a")).await;
    let second = stack.cancel(order_id, Some("cancel-b")).await;

    assert_eq!(first.status, 202);
    assert_eq!((second.status, second.replayed), (200, false));
    assert_eq!(second.order["status"], "cancelled");
    assert_refunded_once(&stack, order_id, 1299).await;
    let stats = stack.provider().stats().await;
    assert_eq!(stats["refunds"]["calls"], 1, "{stats}");
}

/// Waits until payment-service has dead-lettered one record; returns its dead-letter
/// topic.
async fn dead_lettered(stack: &Stack) -> String {
    let (_, _, dead_letters) = stack.subscription(PAYMENT_SERVICE);
    eventually(SETTLE, "order.created to be dead-lettered", || async {
        (stack.kafka.read_all(&dead_letters).await.len() == 1).then_some(())
    })
    .await;
    dead_letters
}

/// Sends payment-service's dead letter back and waits until its handling is logged;
/// returns the outcome.
async fn redrive_order_created(stack: &Stack, dead_letters: &str, order_id: Uuid) -> String {
    let printed = stack.redrive(dead_letters, None).await;
    assert!(printed.contains("redriven 1 records"), "{printed}");
    eventually(
        SETTLE,
        "the redriven order.created to be handled",
        || async {
            outcomes_by_event(stack, PAYMENT_SERVICE)
                .remove(&order_id.to_string())
                .and_then(|outcomes| outcomes.last().cloned())
        },
    )
    .await
}

#[tokio::test]
async fn a_cancellation_met_before_its_order_created_leaves_a_tombstone_and_the_redriven_order_created_charges_nothing()
 {
    let stack = Stack::start().await;
    // payment-service cannot read its payments: order.created fails before any call.
    stack.payments_privilege("SELECT", false).await;
    let order_id = stack.place_order(1).await;
    let dead_letters = dead_lettered(&stack).await;
    stack.payments_privilege("SELECT", true).await;

    let answer = stack.cancel(order_id, None).await;

    assert_eq!(answer.status, 202, "{}", answer.order);
    let order = stack.answered_cancellation(order_id).await;
    assert_eq!(order["refund"], "not_charged", "{order}");
    let tombstone = stack.payment(order_id).await.expect("a tombstone");
    assert_eq!(tombstone.status, "voided");
    assert_eq!((tombstone.charge_id, tombstone.refund_id), (None, None));

    let outcome = redrive_order_created(&stack, &dead_letters, order_id).await;

    assert_eq!(outcome, "guarded", "the tombstone stops the charge");
    assert!(stack.money(order_id).await.charges.is_empty());
    assert_eq!(stack.provider().stats().await["calls"], 0, "no charge call");
    assert_eq!(
        stack.payment(order_id).await.map(|p| p.status).as_deref(),
        Some("voided")
    );
    assert_eq!(
        stack
            .announced(PAYMENT_SERVICE, order_id, PAYMENT_SUCCEEDED)
            .await,
        0
    );
    assert_eq!(
        stack
            .announced(PAYMENT_SERVICE, order_id, PAYMENT_VOIDED)
            .await,
        1
    );
    assert_eq!(stack.get_order(order_id).await["refund"], "not_charged");
    assert_told(&stack, order_id, &["cancelled_by_customer"]).await;
}

#[tokio::test]
async fn a_charge_made_for_an_order_created_that_was_dead_lettered_is_refunded_when_the_order_is_cancelled()
 {
    let stack = Stack::start().await;
    // payment-service cannot record the charge's answer: its intent is committed, the
    // charge made, then order.created fails in the transaction, is retried (the charge
    // replayed) and dead-lettered. The intent stays, undecided.
    stack.payments_privilege("UPDATE", false).await;
    let order_id = stack.place_order(1).await;
    let dead_letters = dead_lettered(&stack).await;
    stack.payments_privilege("UPDATE", true).await;
    assert_eq!(
        stack.money(order_id).await.the_charge()["status"],
        "succeeded"
    );
    assert_eq!(stack.payment(order_id).await.unwrap().status, "charging");

    let answer = stack.cancel(order_id, None).await;

    assert_eq!(answer.status, 202, "{}", answer.order);
    let charge = assert_refunded_once(&stack, order_id, 1299).await;
    let payment = stack.payment(order_id).await.unwrap();
    assert_eq!(payment.status, "succeeded", "resolved under its key");
    assert_eq!(payment.charge_id.as_deref(), charge["id"].as_str());
    assert_told(&stack, order_id, &["cancelled_by_customer", "refunded"]).await;

    // Its order.created sent back changes nothing: charged once, refunded once.
    let outcome = redrive_order_created(&stack, &dead_letters, order_id).await;
    assert_eq!(outcome, "guarded");
    let money = stack.money(order_id).await;
    money.the_charge();
    money.the_refund();
    assert_eq!(
        stack
            .announced(PAYMENT_SERVICE, order_id, PAYMENT_REFUNDED)
            .await,
        1
    );
}

/// A confirmed order cancelled while the provider loses the answer to the next refund
/// call, payment-service started with `failpoints`; returns the provider's refund counts.
async fn refund_answer_lost(failpoints: &[(&'static str, String)]) -> Value {
    let stack = Stack::start_with(failpoints).await;
    let order_id = stack.place_order(1).await;
    assert_eq!(stack.settled_order(order_id).await["status"], "confirmed");
    stack
        .provider()
        .arm(json!({"kind": "lose-response", "next": 1, "endpoint": "refunds"}))
        .await;

    assert_eq!(stack.cancel(order_id, None).await.status, 202);

    assert_refunded_once(&stack, order_id, 1299).await;
    let refunds = stack.provider().stats().await["refunds"].clone();
    assert_eq!(refunds["lost_responses"], 1, "{refunds}");
    assert_eq!(refunds["refunded"], 1, "one refund made: {refunds}");
    refunds
}

#[tokio::test]
async fn a_refunds_answer_lost_is_asked_for_again_with_the_same_key_and_gets_the_first_refund_back()
{
    let refunds = refund_answer_lost(&[]).await;

    assert_eq!(
        refunds["replayed"], 1,
        "the retry was the replay: {refunds}"
    );
}

/// A bug on purpose: a fresh refund key on every call. The provider's one refund per
/// charge refuses the retry (`400 charge_already_refunded`), and payment-service answers
/// that with the refund the charge lists: still one refund.
#[tokio::test]
async fn with_a_fresh_refund_key_the_retry_after_a_lost_answer_is_refused_and_gets_the_first_refund()
 {
    let refunds = refund_answer_lost(&[(
        PAYMENT_SERVICE,
        format!("{}=return", failpoint::FRESH_REFUND_KEY),
    )])
    .await;

    assert_eq!(refunds["replayed"], 0, "no key was sent twice: {refunds}");
    let calls = refunds["calls"].as_u64().unwrap();
    assert!(calls >= 2, "the retry was refused, not replayed: {refunds}");
}

#[tokio::test]
async fn an_order_cancelled_for_its_deadline_whose_payment_arrives_late_is_refunded() {
    let stack = Stack::start_with_env(&[("ORDER_PAYMENT_TIMEOUT", "2s")]).await;
    // The charge takes longer than the deadline, and less than payment-service's timeout.
    stack
        .provider()
        .arm(json!({"kind": "slow", "delay_ms": 4000}))
        .await;

    let order_id = stack.place_order(1).await;

    let cancelled = eventually(SETTLE, "the deadline to cancel the order", || async {
        let order = stack.get_order(order_id).await;
        (order["status"] != "pending").then_some(order)
    })
    .await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert_eq!(cancelled["cancel_reason"], "timeout");
    assert_refunded_once(&stack, order_id, 1299).await;
    assert_eq!(
        outcomes_by_event(&stack, ORDER_SERVICE)
            .get(&format!("{order_id}:payment"))
            .map(Vec::as_slice),
        Some(&["guarded".to_owned()][..]),
        "the late payment left the order cancelled"
    );
    assert_told(&stack, order_id, &["cancelled_for_timeout", "refunded"]).await;
}

/// Orders whose `order.created` is redriven right behind their cancellation.
const RACING_ORDERS: usize = 3;

/// The race the intent and the tombstone share a primary key for: payment-service, back
/// after a stop, finds each order's cancellation and, right behind it, the order's
/// redriven `order.created`, which it prepares ahead while the cancellation is applied.
/// Whichever commits first holds the order's payment: the tombstone (then no charge is
/// asked for), or the charge's intent (then the charge is made, slowly, and the
/// cancellation, finding the intent, resolves the charge under its key and refunds it).
#[tokio::test]
async fn an_order_created_redriven_right_behind_its_cancellation_has_the_charge_it_made_meanwhile_refunded()
 {
    let mut stack = Stack::start().await;
    stack.payments_privilege("SELECT", false).await;
    let mut orders = Vec::new();
    for _ in 0..RACING_ORDERS {
        orders.push(stack.place_order(1).await);
    }
    let (_, _, dead_letters) = stack.subscription(PAYMENT_SERVICE);
    eventually(
        SETTLE,
        "every order.created to be dead-lettered",
        || async {
            (stack.kafka.read_all(&dead_letters).await.len() == RACING_ORDERS).then_some(())
        },
    )
    .await;
    stack.payments_privilege("SELECT", true).await;
    assert!(stack.terminate_service(PAYMENT_SERVICE).await);
    for order_id in &orders {
        assert_eq!(stack.cancel(*order_id, None).await.status, 202);
    }
    let printed = stack.redrive(&dead_letters, None).await;
    assert!(
        printed.contains(&format!("redriven {RACING_ORDERS} records")),
        "{printed}"
    );
    stack
        .provider()
        .arm(json!({"kind": "slow", "delay_ms": 2000}))
        .await;

    stack.start_service(PAYMENT_SERVICE).await;

    let mut charged = 0;
    for order_id in orders {
        stack.answered_cancellation(order_id).await;
        stack
            .caught_up(PAYMENT_SERVICE, &stack.kafka.topics.orders)
            .await;
        let payment = stack.payment(order_id).await.expect("a payment");
        let money = stack.money(order_id).await;
        if money.charges.is_empty() {
            assert_eq!(payment.status, "voided", "nothing charged: the tombstone");
            continue;
        }
        charged += 1;
        let charge = assert_refunded_once(&stack, order_id, 1299).await;
        assert_eq!(
            payment.status, "succeeded",
            "the intent won, and was resolved"
        );
        assert_eq!(payment.charge_id.as_deref(), charge["id"].as_str());
    }
    assert!(
        charged > 0,
        "no redriven order.created wrote its intent before its cancellation's tombstone: the race was not met"
    );
}
