//! The probes an orchestrator uses, on the real binaries: `/livez` and `/readyz`
//! (`saga::probes`), and readiness turning 503 on SIGTERM while the service still serves.

use saga_e2e::{NOTIFICATION_SERVICE, ORDER_SERVICE, PAYMENT_PROVIDER, PAYMENT_SERVICE};
use saga_e2e::{SETTLE, Stack};
use saga_testkit::eventually;
use serde_json::Value;

async fn get(http: &reqwest::Client, url: &str) -> (u16, Value) {
    let response = http.get(url).send().await.expect("the service answers");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_service_is_live_and_ready_once_started() {
    let stack = Stack::start().await;
    let http = reqwest::Client::new();
    for service in [
        ORDER_SERVICE,
        PAYMENT_SERVICE,
        NOTIFICATION_SERVICE,
        PAYMENT_PROVIDER,
    ] {
        let base = stack.url_of(service);
        assert_eq!(
            get(&http, &format!("{base}/livez")).await.0,
            200,
            "{service} /livez"
        );
        // The consumer joins its group shortly after the service serves.
        let url = format!("{base}/readyz");
        let ready = eventually(SETTLE, &format!("{service} to be ready"), || async {
            let (status, body) = get(&http, &url).await;
            (status == 200).then_some(body)
        })
        .await;
        assert_eq!(ready["status"], "ready", "{service}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sigterm_readiness_turns_503_while_the_api_still_serves_then_it_drains() {
    let mut stack = Stack::start_with_env(&[("SHUTDOWN_DELAY", "3s")]).await;
    let order_id = stack.place_order(1).await;
    let http = reqwest::Client::new();
    let base = stack.url_of(ORDER_SERVICE);
    let order_url = stack.api_url(&format!("/v1/orders/{order_id}"));
    let watch = async {
        let reasons = eventually(SETTLE, "/readyz to turn 503", || async {
            let (status, body) = get(&http, &format!("{base}/readyz")).await;
            (status == 503).then_some(body["reasons"].clone())
        })
        .await;
        let live = get(&http, &format!("{base}/livez")).await.0;
        let served = get(&http, &order_url).await.0;
        (reasons, live, served)
    };
    let (exited, (reasons, live, served)) =
        tokio::join!(stack.terminate_instance(ORDER_SERVICE), watch);
    assert_eq!(reasons, serde_json::json!(["stopping"]));
    assert_eq!(
        (live, served),
        (200, 200),
        "still live and serving while not ready"
    );
    assert!(
        exited.success(),
        "then it drained and stopped cleanly: {exited}"
    );
}
