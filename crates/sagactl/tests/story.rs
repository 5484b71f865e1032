//! An order's story, told from the real binaries' databases and topics: every copy of an
//! event is there, and what each met is exactly what the consumer counted.

use saga::metrics::EVENTS;
use saga_e2e::{
    NOTIFICATION_SERVICE, ORDER_SERVICE, PAYMENT_PROVIDER, PAYMENT_SERVICE, SETTLE, Stack,
};
use saga_testkit::eventually;
use sagactl::story::{self, Databases, Kind, Step};
use serde_json::json;
use uuid::Uuid;

mod common;

use common::{steps, tell};

/// For each of `orders`: its payment result again on every partition, a late failure
/// with an id of its own, a poison record keyed by the order, and its `order.created`
/// again.
async fn deliver_copies_late_and_poison(stack: &Stack, orders: &[Uuid]) {
    let topics = &stack.kafka.topics;
    for order_id in orders {
        let payment = saga_testkit::envelope(
            &format!("{order_id}:payment"),
            "payment.succeeded",
            *order_id,
            json!({ "order_id": order_id, "amount_cents": 2598 }),
        );
        for partition in 0..3 {
            stack
                .kafka
                .produce_to(&topics.payments, Some(partition), None, &payment)
                .await;
        }
        let late = saga_testkit::envelope(
            &format!("late-{order_id}"),
            "payment.failed",
            *order_id,
            json!({ "order_id": order_id, "amount_cents": 2598, "reason": "card declined" }),
        );
        stack.kafka.produce(&topics.payments, None, &late).await;
        let key = order_id.to_string();
        stack
            .kafka
            .produce(&topics.payments, Some(&key), b"{not an event")
            .await;
        stack.replay_order_created(*order_id).await;
    }
}

/// Where the original payment result of `order_id` is: the record the relay published,
/// keyed by the order.
async fn original_place(stack: &Stack, order_id: Uuid) -> String {
    let topics = &stack.kafka.topics;
    let original = stack
        .kafka
        .read_all(&topics.payments)
        .await
        .into_iter()
        .find(|m| {
            saga::kafka::header(m, "event_id").as_deref()
                == Some(format!("{order_id}:payment").as_str())
        })
        .unwrap();
    format!(
        "{}[{}]@{}",
        topics.payments,
        rdkafka::Message::partition(&original),
        rdkafka::Message::offset(&original)
    )
}

/// Copies of a payment result on every partition (the one the original is on and the
/// others, as a console producer without a key may put them), a late failure, a poison
/// record keyed by the order and a copy of its `order.created`: the story names the one
/// record that took effect and says of every other what stopped it. For three orders, so
/// that originals sit on different partitions.
#[tokio::test]
async fn every_copy_of_an_event_is_told_with_what_stopped_it_and_the_one_that_took_effect_is_named()
{
    let stack = Stack::start().await;
    let mut orders = Vec::new();
    for _ in 0..3 {
        let order_id = stack.place_order(2).await;
        stack.notified(order_id).await;
        orders.push(order_id);
    }
    deliver_copies_late_and_poison(&stack, &orders).await;
    for service in [ORDER_SERVICE, PAYMENT_SERVICE] {
        let (_, topic, _) = stack.subscription(service);
        stack.caught_up(service, &topic).await;
    }

    let mut guard_1 = 0;
    for order_id in &orders {
        let story = tell(&stack, *order_id).await;
        assert!(!story.open, "{order_id}: nothing left to happen");
        assert!(
            story.steps.windows(2).all(|w| w[0].at <= w[1].at),
            "in time order"
        );

        let results: Vec<&Step> = story
            .steps
            .iter()
            .filter(|s| s.kind == Kind::Record && s.text.starts_with("payment.succeeded"))
            .collect();
        assert_eq!(results.len(), 4, "the original and three copies");
        let applied = steps(&story, ORDER_SERVICE, Kind::Applied);
        let applied: Vec<&&Step> = applied
            .iter()
            .filter(|s| s.text.starts_with("applied payment.succeeded"))
            .collect();
        assert_eq!(applied.len(), 1, "{:#?}", story.steps);
        let original_place = original_place(&stack, *order_id).await;
        let bounced = steps(&story, ORDER_SERVICE, Kind::Guard1);
        assert_eq!(bounced.len(), 3, "{:#?}", story.steps);
        for step in &bounced {
            let detail = step.detail.as_deref().unwrap();
            assert!(
                detail.starts_with(&format!("claimed by {original_place} at")),
                "each copy names the record that took effect: {detail}"
            );
        }
        guard_1 += bounced.len() as u64;

        let guarded = steps(&story, ORDER_SERVICE, Kind::Guard2);
        assert_eq!(guarded.len(), 1);
        assert!(guarded[0].text.contains("payment.failed"), "{guarded:?}");
        let dead = steps(&story, ORDER_SERVICE, Kind::DeadLettered);
        assert_eq!(dead.len(), 1);
        assert!(
            dead[0]
                .detail
                .as_deref()
                .unwrap()
                .contains("not UTF-8 JSON"),
            "{dead:?}"
        );

        assert_eq!(steps(&story, PAYMENT_SERVICE, Kind::Applied).len(), 1);
        assert_eq!(steps(&story, PAYMENT_SERVICE, Kind::Guard1).len(), 1);
        assert_eq!(steps(&story, PAYMENT_PROVIDER, Kind::Charged).len(), 1);
        assert_eq!(steps(&story, NOTIFICATION_SERVICE, Kind::Applied).len(), 1);
        assert_eq!(steps(&story, NOTIFICATION_SERVICE, Kind::Notified).len(), 1);
    }
    // What the story says met guard 1 is what order-service counted as duplicates.
    let counted = stack
        .metrics(ORDER_SERVICE)
        .await
        .count(EVENTS, &[("outcome", "duplicate")]);
    assert_eq!(guard_1, counted);
    assert_eq!(counted, 9);
}

/// With payment-service down, an order's story is open and says who it waits for; once
/// the service is back it closes on its own.
#[tokio::test]
async fn a_story_stays_open_while_its_order_waits_for_a_service_and_closes_when_it_is_done() {
    let mut stack = Stack::start().await;
    assert!(stack.terminate_service(PAYMENT_SERVICE).await);
    let order_id = stack.place_order(2).await;

    let waiting = eventually(SETTLE, "order.created to reach its topic", || async {
        let story = tell(&stack, order_id).await;
        let waiting = steps(&story, PAYMENT_SERVICE, Kind::Waiting).len();
        (waiting == 1).then_some(story)
    })
    .await;
    assert!(waiting.open);
    assert_eq!(waiting.order.status, "pending");

    stack.start_service(PAYMENT_SERVICE).await;
    stack.notified(order_id).await;
    let done = eventually(SETTLE, "the story to close", || async {
        let story = tell(&stack, order_id).await;
        (!story.open).then_some(story)
    })
    .await;
    assert_eq!(done.order.status, "confirmed");
    assert!(steps(&done, PAYMENT_SERVICE, Kind::Waiting).is_empty());
    assert_eq!(steps(&done, PAYMENT_SERVICE, Kind::Applied).len(), 1);
}

/// The inbox forgets (the pruner, or a person deleting the row): a copy of the event
/// arriving after that claims the id anew and meets guard 2. The story still names the
/// copy that applied it, by the effect its transaction wrote.
#[tokio::test]
async fn a_copy_arriving_after_the_inbox_forgot_is_told_as_guard_2_and_the_original_as_applied() {
    let stack = Stack::start().await;
    let topics = &stack.kafka.topics;
    let order_id = stack.place_order(2).await;
    stack.notified(order_id).await;
    let key = order_id.to_string();
    let payments = stack.database(PAYMENT_SERVICE);
    let forgotten = payments
        .client()
        .await
        .execute("DELETE FROM processed_events WHERE event_id = $1", &[&key])
        .await
        .unwrap();
    assert_eq!(forgotten, 1);
    stack.replay_order_created(order_id).await;
    stack.caught_up(PAYMENT_SERVICE, &topics.orders).await;

    let story = tell(&stack, order_id).await;
    let applied = steps(&story, PAYMENT_SERVICE, Kind::Applied);
    assert_eq!(applied.len(), 1, "{:#?}", story.steps);
    assert!(
        applied[0]
            .detail
            .as_deref()
            .unwrap()
            .ends_with("its claim is no longer in the inbox"),
        "{applied:?}"
    );
    let late = steps(&story, PAYMENT_SERVICE, Kind::Guard2);
    assert_eq!(late.len(), 1, "{:#?}", story.steps);
    assert!(late[0].at > applied[0].at);
    assert!(steps(&story, PAYMENT_SERVICE, Kind::Guard1).is_empty());
    assert_eq!(steps(&story, PAYMENT_PROVIDER, Kind::Charged).len(), 1);
}

/// A story told while its order moves is a consistent one: with no copies, no step may
/// be a guard or a forgotten claim, wherever a service's commit falls between the
/// story's reads. Five orders wait for notification-service; once each has been told
/// open, the service starts and works through them while each is told over and over.
#[tokio::test]
async fn a_story_told_while_its_order_moves_never_shows_a_guard_it_did_not_meet() {
    let mut stack = Stack::start().await;
    assert!(stack.terminate_service(NOTIFICATION_SERVICE).await);
    let mut orders = Vec::new();
    for _ in 0..5 {
        let order_id = stack.place_order(1).await;
        assert_eq!(stack.settled_order(order_id).await["status"], "confirmed");
        orders.push(order_id);
    }
    let (told_open, mut each_told_open) = tokio::sync::mpsc::channel(orders.len());
    let tellers: Vec<_> = orders
        .iter()
        .map(|&order_id| {
            let sources = common::sources(&stack);
            let told_open = told_open.clone();
            tokio::spawn(async move {
                let databases = Databases::connect(&sources).await.unwrap();
                let mut first = true;
                loop {
                    let story = story::tell(&sources, &databases, order_id)
                        .await
                        .unwrap()
                        .expect("the order exists");
                    let wrong: Vec<&Step> = story
                        .steps
                        .iter()
                        .filter(|s| matches!(s.kind, Kind::Guard1 | Kind::Guard2 | Kind::Forgotten))
                        .collect();
                    assert!(wrong.is_empty(), "{wrong:#?} in {:#?}", story.steps);
                    if first {
                        assert!(story.open, "notification-service is down: {story:#?}");
                        told_open.send(()).await.unwrap();
                        first = false;
                    }
                    let notified = story.steps.iter().any(|s| s.kind == Kind::Notified);
                    if !story.open && notified {
                        return;
                    }
                }
            })
        })
        .collect();
    for _ in &orders {
        each_told_open.recv().await.unwrap();
    }
    stack.start_service(NOTIFICATION_SERVICE).await;
    for teller in tellers {
        teller.await.unwrap();
    }
}
