//! The story's web page in a real browser (Debian's chromium, driven headless through
//! chromedriver): an order's timeline shows a payment replayed by hand stopped by guard
//! 1, live, without a reload.

use std::time::Duration;

use fantoccini::Locator;
use saga_e2e::Stack;
use serde_json::json;

mod common;

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_payment_replayed_by_hand_appears_stopped_by_guard_1_on_the_open_page_without_a_reload() {
    let stack = Stack::start().await;
    let order_id = stack.place_order(2).await;
    stack.notified(order_id).await;

    let web = sagactl::web::Web::connect(common::sources(&stack))
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let site = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, sagactl::web::router(web)).await });

    let (mut driver, browser) = saga_testkit::browser::open().await;

    browser
        .goto(&format!("{site}/orders/{order_id}"))
        .await
        .unwrap();
    // A mark a reload would wipe.
    browser
        .execute("window.loadedOnce = true; return true;", vec![])
        .await
        .unwrap();
    browser
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css(".live.on"))
        .await
        .expect("the page listens for updates");
    assert!(
        browser
            .find_all(Locator::Css(".card.guard1"))
            .await
            .unwrap()
            .is_empty(),
        "no copy yet"
    );

    let replay = saga_testkit::envelope(
        &format!("{order_id}:payment"),
        "payment.succeeded",
        order_id,
        json!({ "order_id": order_id, "amount_cents": 2598 }),
    );
    stack
        .kafka
        .produce(&stack.kafka.topics.payments, None, &replay)
        .await;

    let card = browser
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css(".card.guard1.new"))
        .await
        .expect("the replay appears, stopped by guard 1");
    let text = card.text().await.unwrap();
    assert!(text.contains("guard 1"), "{text}");
    assert!(text.contains("payment.succeeded"), "{text}");
    assert!(text.contains("already claimed, nothing touched"), "{text}");
    let lane = browser
        .execute(
            "const card = document.querySelector('.card.guard1');
             const cells = [...card.parentElement.children];
             const column = (cells.indexOf(card) % 6);
             return document.querySelectorAll('.lane-head')[column].textContent;",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(lane, json!("order-service"), "in order-service's lane");
    let same_page = browser
        .execute("return window.loadedOnce === true;", vec![])
        .await
        .unwrap();
    assert_eq!(same_page, json!(true), "updated in place, not reloaded");

    let png = browser.screenshot().await.unwrap();
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("sagactl-timeline.png");
    std::fs::write(&shot, png).unwrap();
    browser.close().await.unwrap();
    driver.kill().await.unwrap();
}
