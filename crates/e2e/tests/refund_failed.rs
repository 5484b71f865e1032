//! A cancelled order's refund that cannot be made ends where everyone sees it, against the
//! real binaries: never in a dead letter, never a record retried for ever with its
//! partition stuck behind it.

use saga::events::{PAYMENT_REFUND_FAILED, PAYMENT_REFUNDED};
use saga_e2e::binary;
use saga_e2e::{PAYMENT_SERVICE, SETTLE, Stack};
use saga_testkit::eventually;
use serde_json::{Value, json};
use uuid::Uuid;

/// The order once payment-service answered its cancellation with a failed refund.
async fn refund_failed(stack: &Stack, order_id: Uuid) -> Value {
    eventually(SETTLE, "the order to show its refund failed", || async {
        let order = stack.get_order(order_id).await;
        (order["refund"] == "failed").then_some(order)
    })
    .await
}

/// `sagactl refund retry <order>` against the stack's payment-service: its exit code and
/// what it printed.
async fn sagactl_retry(stack: &Stack, order_id: Uuid) -> (i32, String) {
    let out = tokio::process::Command::new(binary("sagactl"))
        .args(["refund", "retry", &order_id.to_string()])
        .env("PAYMENT_SERVICE_URL", stack.url_of(PAYMENT_SERVICE))
        .output()
        .await
        .expect("sagactl runs");
    let printed =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), printed)
}

/// The provider refuses the refund of a disputed charge: the cancellation is answered at
/// once with `payment.refund_failed`, the order shows `"refund": "failed"` and why, no
/// record is dead-lettered; `sagactl refund retry` then refunds it once, and asked again
/// answers with the same refund.
#[tokio::test]
async fn a_refund_the_provider_refuses_shows_failed_and_an_operators_retry_refunds_it_once() {
    let stack = Stack::start().await;
    let order_id = stack.place_order(1).await;
    assert_eq!(stack.settled_order(order_id).await["status"], "confirmed");
    stack
        .provider()
        .arm(json!({"kind": "refuse", "next": 1, "endpoint": "refunds"}))
        .await;

    assert_eq!(stack.cancel(order_id, None).await.status, 202);

    let order = refund_failed(&stack, order_id).await;
    let why = order["refund_failure"].as_str().unwrap_or_default();
    assert!(why.contains("charge_disputed"), "{order}");
    let (_, _, dead_letters) = stack.subscription(PAYMENT_SERVICE);
    assert!(stack.kafka.read_all(&dead_letters).await.is_empty());
    assert_eq!(
        stack
            .announced(PAYMENT_SERVICE, order_id, PAYMENT_REFUND_FAILED)
            .await,
        1
    );
    assert!(stack.money(order_id).await.refunds().is_empty());

    let (code, printed) = sagactl_retry(&stack, order_id).await;
    assert_eq!(code, 0, "{printed}");
    assert!(printed.contains("refunded as re_"), "{printed}");
    let order = eventually(SETTLE, "the order to show its refund", || async {
        let order = stack.get_order(order_id).await;
        (order["refund"] == "refunded").then_some(order)
    })
    .await;
    assert_eq!(order.get("refund_failure"), None, "{order}");
    let (code, again) = sagactl_retry(&stack, order_id).await;
    assert_eq!(
        (code, again),
        (0, printed),
        "a second retry answers the same"
    );

    let money = stack.money(order_id).await;
    money.the_charge();
    money.the_refund();
    assert_eq!(
        stack
            .announced(PAYMENT_SERVICE, order_id, PAYMENT_REFUNDED)
            .await,
        1
    );
    let told = stack
        .told(
            order_id,
            &["cancelled_by_customer", "confirmed", "refunded"],
        )
        .await;
    assert!(told.contains(&"refunded".to_owned()), "{told:?}");
}

/// Orders placed behind a cancellation whose refund cannot even be asked for.
const BEHIND: usize = 12;

/// A payment with no charge id (recorded before there was a provider) cannot be refunded
/// by any call: its cancellation is answered `manual` on its first attempt, the order
/// shows why, and the orders placed behind it, on its partition too, are all charged and
/// confirmed.
#[tokio::test]
async fn a_payment_without_a_charge_id_is_left_to_a_person_and_its_partition_moves_on() {
    let stack = Stack::start().await;
    let order_id = stack.place_order(1).await;
    assert_eq!(stack.settled_order(order_id).await["status"], "confirmed");
    stack
        .payments_db
        .client()
        .await
        .execute(
            "UPDATE payments SET charge_id = NULL WHERE order_id = $1",
            &[&order_id],
        )
        .await
        .unwrap();

    assert_eq!(stack.cancel(order_id, None).await.status, 202);
    let mut behind = Vec::new();
    for _ in 0..BEHIND {
        behind.push(stack.place_order(1).await);
    }

    let order = refund_failed(&stack, order_id).await;
    let why = order["refund_failure"].as_str().unwrap_or_default();
    assert!(why.contains("no charge id"), "{order}");
    for id in behind {
        assert_eq!(stack.settled_order(id).await["status"], "confirmed", "{id}");
    }
    let (code, printed) = sagactl_retry(&stack, order_id).await;
    assert_eq!(code, 2, "a retry cannot move it: {printed}");
    assert!(printed.contains("manual"), "{printed}");
}
