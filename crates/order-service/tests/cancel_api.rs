//! `POST /v1/orders/{id}/cancel` over HTTP: its answers, and its `Idempotency-Key`.

mod app;

use app::{order, spawn_app};

#[tokio::test]
async fn a_cancellation_answers_202_then_200_and_changes_the_order_once() {
    let app = spawn_app().await;
    let (_, placed) = app.post_order(order(2)).await;
    let id = placed["id"].as_str().unwrap();

    let first = app.cancel(id, &[]).await;
    let second = app.cancel(id, &[]).await;

    assert_eq!(first.status, 202, "{}", first.text);
    let cancelled = first.json();
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(cancelled["cancel_reason"], "customer");
    assert_eq!(
        cancelled["refund"], "pending",
        "a refund follows if the card was charged"
    );
    assert_eq!(second.status, 200, "{}", second.text);
    assert_eq!(
        second.json()["updated_at"],
        cancelled["updated_at"],
        "nothing changed"
    );
    let (_, shown) = app.get(&format!("/v1/orders/{id}")).await;
    assert_eq!(shown, cancelled);
    let events = "SELECT count(*) FROM outbox WHERE type = 'order.cancelled'";
    assert_eq!(app.db.count(events, &[]).await, 1);
}

#[tokio::test]
async fn one_key_twice_replays_the_first_answer_and_another_key_gets_200() {
    let app = spawn_app().await;
    let (_, placed) = app.post_order(order(1)).await;
    let id = placed["id"].as_str().unwrap();

    let first = app.cancel(id, &["\"cancel-1\""]).await;
    let again = app.cancel(id, &["\"cancel-1\""]).await;
    let other = app.cancel(id, &["\"cancel-2\""]).await;

    assert_eq!(first.status, 202);
    assert!(!first.replayed());
    assert_eq!((again.status, again.replayed()), (202, true));
    assert_eq!(again.text, first.text, "the first answer, byte for byte");
    assert_eq!((other.status, other.replayed()), (200, false));
    let events = "SELECT count(*) FROM outbox WHERE type = 'order.cancelled'";
    assert_eq!(app.db.count(events, &[]).await, 1);
}

#[tokio::test]
async fn a_key_of_a_placed_order_cannot_cancel_it() {
    let app = spawn_app().await;
    let placed = app.post_keyed("\"checkout-7\"", &order(1)).await;
    let id = placed.json()["id"].as_str().unwrap().to_owned();

    let reused = app.cancel(&id, &["\"checkout-7\""]).await;

    assert_eq!(reused.status, 422, "{}", reused.text);
    assert_eq!(reused.json()["error"]["code"], "idempotency_key_reused");
    let (_, shown) = app.get(&format!("/v1/orders/{id}")).await;
    assert_eq!(shown["status"], "pending");
}

#[tokio::test]
async fn an_unknown_or_malformed_id_is_refused_naming_it() {
    let app = spawn_app().await;

    let unknown = app
        .cancel("0b4f3e2a-5c6d-4e7f-8a9b-0c1d2e3f4a5b", &[])
        .await;
    let malformed = app.cancel("not-an-id", &[]).await;

    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.json()["error"]["code"], "order_not_found");
    assert_eq!(malformed.status, 422);
    assert_eq!(malformed.json()["error"]["field"], "id");
    assert_eq!(app.keys().await, 0);
}
