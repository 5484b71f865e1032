//! A cancelled order's story, told from the real binaries' databases and topics: who
//! cancelled it, the refund the provider made under the order's refund key, or the
//! tombstone that stops any charge; each answer on the topics and each notification.

use std::time::Duration;

use saga_e2e::{
    NOTIFICATION_SERVICE, ORDER_SERVICE, PAYMENT_PROVIDER, PAYMENT_SERVICE, SETTLE, Stack,
    workspace_root,
};
use saga_testkit::eventually;
use sagactl::render;
use sagactl::story::{Databases, Kind, Step, Story};
use uuid::Uuid;

mod common;

use common::{steps, tell};

/// The story once nothing is left to happen and the customer has `notifications`.
async fn told_when_settled(stack: &Stack, order_id: Uuid, notifications: i64) -> Story {
    eventually(SETTLE, "the story to close", || async {
        let story = tell(stack, order_id).await;
        (!story.open && stack.notifications(order_id).await == notifications).then_some(story)
    })
    .await
}

fn texts(steps: &[&Step]) -> Vec<String> {
    steps.iter().map(|s| s.text.clone()).collect()
}

/// The records of `event_type` on the topics.
fn records<'a>(story: &'a Story, event_type: &str) -> Vec<&'a Step> {
    story
        .steps
        .iter()
        .filter(|s| s.kind == Kind::Record && s.text.starts_with(&format!("{event_type} on ")))
        .collect()
}

fn notification_kinds(story: &Story) -> Vec<String> {
    let mut kinds: Vec<String> = steps(story, NOTIFICATION_SERVICE, Kind::Notified)
        .iter()
        .map(|s| s.detail.clone().unwrap_or_default())
        .collect();
    kinds.sort();
    kinds
}

/// The order's page as `sagactl serve` renders it.
async fn page(stack: &Stack, order_id: Uuid) -> String {
    let web = sagactl::web::Web::connect(common::sources(stack))
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let site = format!("http://{}", listener.local_addr().unwrap());
    let server =
        tokio::spawn(async move { axum::serve(listener, sagactl::web::router(web)).await });
    let (http, _) = stack.api();
    let html = http
        .get(format!("{site}/orders/{order_id}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    server.abort();
    html
}

async fn cancel(stack: &Stack, order_id: Uuid) {
    let (http, base) = stack.api();
    let response = http
        .post(format!("{base}/v1/orders/{order_id}/cancel"))
        .send()
        .await
        .expect("order-service answers");
    assert_eq!(response.status().as_u16(), 202, "cancelled now");
}

/// A confirmed order the customer cancels: its card was charged, so the provider refunds
/// the charge under `<order id>:refund`, and the story tells the cancellation, the
/// refund with its key, each answer on the topics and each of the three notifications.
/// The charge is told once, though the refund's key names it too.
#[tokio::test]
async fn a_charged_order_cancelled_by_its_customer_is_told_with_its_refund_and_the_refunds_key() {
    let stack = Stack::start().await;
    let order_id = stack.place_order(2).await;
    assert_eq!(stack.settled_order(order_id).await["status"], "confirmed");
    cancel(&stack, order_id).await;
    let story = told_when_settled(&stack, order_id, 3).await;

    assert_eq!(story.order.status, "cancelled");
    assert_eq!(story.order.cancel_reason.as_deref(), Some("customer"));
    assert_eq!(story.order.refund, Some("refunded"));
    let refund_id = story.order.refund_id.clone().expect("the refund recorded");

    let cancelled = steps(&story, ORDER_SERVICE, Kind::Cancelled);
    assert_eq!(cancelled.len(), 1, "{:#?}", story.steps);
    assert!(
        cancelled[0].text.contains("by the customer"),
        "{cancelled:?}"
    );

    let charged = steps(&story, PAYMENT_PROVIDER, Kind::Charged);
    assert_eq!(charged.len(), 1, "the charge once: {charged:#?}");
    assert_eq!(
        charged[0].detail.as_deref(),
        Some(format!("Idempotency-Key {order_id}:charge").as_str()),
        "the charge's own key, not the refund's"
    );
    let refunded = steps(&story, PAYMENT_PROVIDER, Kind::Refunded);
    assert_eq!(refunded.len(), 1, "{:#?}", story.steps);
    assert!(
        refunded[0].text.starts_with("refunded 25.98 of ch_")
            && refunded[0].text.ends_with(&format!(" as {refund_id}")),
        "{refunded:?}"
    );
    assert_eq!(
        refunded[0].detail.as_deref(),
        Some(format!("Idempotency-Key {order_id}:refund").as_str())
    );
    assert!(refunded[0].at > charged[0].at && refunded[0].at >= cancelled[0].at);
    assert!(steps(&story, PAYMENT_SERVICE, Kind::Tombstone).is_empty());

    for event_type in ["order.cancelled", "payment.refunded", "order.refunded"] {
        assert_eq!(records(&story, event_type).len(), 1, "{event_type}");
    }
    assert!(records(&story, "payment.voided").is_empty());
    let applied = |actor, event_type: &str| {
        steps(&story, actor, Kind::Applied)
            .iter()
            .filter(|s| s.text.starts_with(&format!("applied {event_type}:")))
            .count()
    };
    for (actor, event_type) in [
        (PAYMENT_SERVICE, "order.cancelled"),
        (ORDER_SERVICE, "payment.refunded"),
        (NOTIFICATION_SERVICE, "order.cancelled"),
        (NOTIFICATION_SERVICE, "order.refunded"),
    ] {
        assert_eq!(
            applied(actor, event_type),
            1,
            "{actor} applied {event_type}: {:#?}",
            story.steps
        );
    }
    assert_eq!(
        notification_kinds(&story),
        [
            "kind cancelled_by_customer",
            "kind confirmed",
            "kind refunded"
        ]
    );

    let html = page(&stack, order_id).await;
    for card in ["card cancel", "card refund"] {
        assert_eq!(html.matches(card).count(), 1, "{card} in\n{html}");
    }
    assert!(html.contains("refund: refunded"), "{html}");

    let text = render::story(&story, false);
    assert!(
        text.contains(&format!(
            "cancelled: customer · refund: refunded ({refund_id})"
        )),
        "{text}"
    );
}

/// An order cancelled before payment-service charged it (its `order.created` skipped, as
/// if lost): payment-service finds no charge at the provider and leaves a tombstone, and
/// `order.created` replayed by hand afterwards meets it and charges nothing.
#[tokio::test]
async fn an_order_cancelled_before_any_charge_is_told_with_its_tombstone_and_no_charge_follows() {
    let mut stack = Stack::start().await;
    assert!(stack.terminate_service(PAYMENT_SERVICE).await);
    let order_id = stack.place_order(2).await;
    skip_order_created(&stack, order_id).await;
    cancel(&stack, order_id).await;
    assert_eq!(
        unsettled(&stack).await,
        [order_id],
        "cancelled, its answer not back"
    );
    stack.start_service(PAYMENT_SERVICE).await;
    told_when_settled(&stack, order_id, 1).await;
    assert!(unsettled(&stack).await.is_empty());
    stack.replay_order_created(order_id).await;
    stack
        .caught_up(PAYMENT_SERVICE, &stack.kafka.topics.orders)
        .await;
    let story = told_when_settled(&stack, order_id, 1).await;

    assert_eq!(story.order.refund, Some("not_charged"));
    assert_eq!(story.order.refund_id, None);
    let tombstone = steps(&story, PAYMENT_SERVICE, Kind::Tombstone);
    assert_eq!(tombstone.len(), 1, "{:#?}", story.steps);
    assert_eq!(
        tombstone[0].text,
        "cancelled before any charge: no charge will be made"
    );
    assert_eq!(
        tombstone[0].detail.as_deref(),
        Some(format!("a voided payment, left by {order_id}:cancel").as_str())
    );
    for kind in [Kind::Charged, Kind::Declined, Kind::Refunded] {
        assert!(
            steps(&story, PAYMENT_PROVIDER, kind).is_empty(),
            "{kind:?}: {:#?}",
            story.steps
        );
    }
    assert_eq!(records(&story, "payment.voided").len(), 1);
    assert!(records(&story, "payment.refunded").is_empty());
    assert_eq!(
        texts(&steps(&story, PAYMENT_SERVICE, Kind::Guard2)),
        ["guard 2: order.created came too late, the order had moved on; id recorded"],
        "the replayed order.created met the tombstone"
    );
    assert_eq!(notification_kinds(&story), ["kind cancelled_by_customer"]);

    let html = page(&stack, order_id).await;
    assert_eq!(html.matches("card tombstone").count(), 1, "{html}");
    assert!(
        html.contains("cancelled before any charge: no charge will be made"),
        "{html}"
    );
}

/// What `sagactl orders --unsettled` lists.
async fn unsettled(stack: &Stack) -> Vec<Uuid> {
    let databases = Databases::connect(&common::sources(stack)).await.unwrap();
    let filter = sagactl::Filter {
        unsettled: true,
        ..sagactl::Filter::default()
    };
    sagactl::orders(&databases, &filter, 10)
        .await
        .unwrap()
        .iter()
        .map(|order| order.id)
        .collect()
}

/// Moves payment-service's group past the order's `order.created` on its partition, as
/// an operator would with the stock tool (`--reset-offsets --to-offset`), so that the
/// service, started again, reads the cancellation without the order.
async fn skip_order_created(stack: &Stack, order_id: Uuid) {
    let topics = &stack.kafka.topics;
    let id = order_id.to_string();
    let created = eventually(SETTLE, "order.created to reach its topic", || async {
        stack
            .kafka
            .read_all(&topics.orders)
            .await
            .into_iter()
            .find(|m| saga::kafka::header(m, "event_id").as_deref() == Some(id.as_str()))
    })
    .await;
    let partition = rdkafka::Message::partition(&created);
    let next = rdkafka::Message::offset(&created) + 1;
    let tool = workspace_root().join("scripts/kafka-consumer-groups");
    let args = [
        "--bootstrap-server".to_owned(),
        stack.kafka.brokers.clone(),
        "--group".to_owned(),
        topics.group(PAYMENT_SERVICE),
        "--topic".to_owned(),
        format!("{}:{partition}", topics.orders),
        "--reset-offsets".to_owned(),
        "--to-offset".to_owned(),
        next.to_string(),
        "--execute".to_owned(),
    ];
    // The broker may take a moment to notice the stopped service left the group.
    eventually(Duration::from_secs(60), "the offset to be reset", || {
        let (tool, args) = (tool.clone(), args.clone());
        async move {
            let result = tokio::process::Command::new(tool)
                .args(&args)
                .output()
                .await
                .expect("scripts/kafka-consumer-groups runs");
            let stdout = String::from_utf8_lossy(&result.stdout);
            (result.status.success() && stdout.contains("NEW-OFFSET")).then_some(())
        }
    })
    .await;
}
