//! A client's retry after a crash, through the real binaries: the `Idempotency-Key` is
//! committed with the order or not at all.

use saga::failpoint::API_BEFORE_COMMIT;
use saga_e2e::{KEYBOARD, ORDER_SERVICE, SETTLE, Stack, describe_exit};
use saga_testkit::eventually;
use serde_json::json;

/// order-service dies inside the order's transaction, after the order, its
/// `order.created` row and its key were written, before `COMMIT`. The client gets no
/// answer and retries with the same key: one order, one payment, one notification.
#[tokio::test]
async fn a_post_cut_off_by_a_crash_before_its_commit_is_placed_once_by_its_retry() {
    let mut stack =
        Stack::start_with(&[(ORDER_SERVICE, format!("{API_BEFORE_COMMIT}=return"))]).await;
    let (http, base) = stack.api();
    let body =
        json!({ "customer_id": "cust-1", "items": [{ "product_id": KEYBOARD, "quantity": 2 }] });
    let post = || {
        http.post(format!("{base}/v1/orders"))
            .header("idempotency-key", "\"checkout-42\"")
            .json(&body)
            .send()
    };

    let cut_off = post().await;
    assert!(
        cut_off.is_err(),
        "the aborted service answered: {cut_off:?}"
    );
    let status = eventually(SETTLE, "order-service to die at its failpoint", || {
        let exited = stack.exited(ORDER_SERVICE);
        async move { exited }
    })
    .await;
    assert_eq!(describe_exit(status), "signal 6 (SIGABRT)");
    let orders = "SELECT count(*) FROM orders";
    assert_eq!(stack.orders_db.count(orders, &[]).await, 0);
    let keys = "SELECT count(*) FROM idempotency_keys";
    assert_eq!(stack.orders_db.count(keys, &[]).await, 0);

    stack.start_service(ORDER_SERVICE).await;
    let retry = post().await.expect("order-service answers");
    assert_eq!(retry.status(), 201);
    assert!(
        retry.headers().get("idempotent-replayed").is_none(),
        "nothing was committed to replay"
    );
    let placed: serde_json::Value = retry.json().await.unwrap();
    let again = post().await.expect("order-service answers");
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let replayed: serde_json::Value = again.json().await.unwrap();
    assert_eq!(replayed, placed);

    let order_id = placed["id"].as_str().unwrap().parse().unwrap();
    assert_eq!(stack.settled_order(order_id).await["status"], "confirmed");
    assert_eq!(stack.notified(order_id).await, 1);
    assert_eq!(stack.orders_db.count(orders, &[]).await, 1);
    assert_eq!(
        stack
            .payments_db
            .count("SELECT count(*) FROM payments", &[])
            .await,
        1
    );
}
