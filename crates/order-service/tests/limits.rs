//! The HTTP edge's limits, met the way a careless or hostile client meets them: each
//! refusal is the JSON error, and a client that holds a connection open cannot hold the
//! service up for the others.

mod app;

use std::time::Duration;

use app::spawn_app_limited;
use saga::config::HttpLimits;
use saga_testkit::eventually;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A `POST /v1/orders` whose body never finishes arriving: the headers promise 1000
/// bytes, and a byte follows every 100 ms until the server answers.
struct SlowClient {
    reader: tokio::net::tcp::OwnedReadHalf,
    dribble: tokio::task::JoinHandle<()>,
}

impl SlowClient {
    async fn start(base: &str) -> Self {
        let addr = base.trim_start_matches("http://");
        let (reader, mut writer) = TcpStream::connect(addr).await.unwrap().into_split();
        writer
            .write_all(
                b"POST /v1/orders HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n\
                  content-length: 1000\r\n\r\n{",
            )
            .await
            .unwrap();
        let dribble = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            // Until the server closes the connection, the write fails, and this ends.
            while writer.write_all(b" ").await.is_ok() {
                tick.tick().await;
            }
        });
        Self { reader, dribble }
    }

    /// What the server answered, once it has: status line and JSON body.
    async fn answer(mut self) -> (String, Value) {
        let mut raw = Vec::new();
        // Bounded, so that a server that never cuts the client off fails the test.
        let _ = tokio::time::timeout(Duration::from_secs(30), self.reader.read_to_end(&mut raw))
            .await
            .expect("the server answers a slow client");
        self.dribble.abort();
        let raw = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = raw
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("no complete answer: {raw:?}"));
        let status = head.lines().next().unwrap_or_default().to_owned();
        let body = serde_json::from_str(body.trim())
            .unwrap_or_else(|e| panic!("the answer's body is not JSON ({e}): {raw}"));
        (status, body)
    }
}

fn limits(timeout_ms: u64, concurrent: usize) -> HttpLimits {
    HttpLimits {
        http_request_timeout: Duration::from_millis(timeout_ms),
        http_max_concurrent_requests: concurrent,
    }
}

#[tokio::test]
async fn headers_past_the_limit_are_a_431_json_error_and_nothing_is_placed() {
    let app = spawn_app_limited(HttpLimits::default()).await;
    let response = app
        .http
        .post(format!("{}/v1/orders", app.base))
        .header("content-type", "application/json")
        .header("x-padding", "x".repeat(saga::http::HEADER_LIMIT))
        .body(r#"{"customer_id":"c","items":[]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 431);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["error"]["code"], "request_header_fields_too_large");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("limit of 16 KiB"),
        "{error}"
    );
    assert_eq!(app.orders().await, 0);
}

#[tokio::test]
async fn clients_sending_their_bodies_slowly_are_cut_off_and_the_others_are_served_meanwhile() {
    // Long enough that ten orders are surely placed before it: the point is that they
    // are answered while the slow clients still hold their connections.
    let app = spawn_app_limited(limits(4000, 64)).await;
    for round in 0..3 {
        let slow: Vec<SlowClient> =
            futures::future::join_all((0..4).map(|_| SlowClient::start(&app.base))).await;
        let answers: Vec<_> = slow
            .into_iter()
            .map(|client| {
                tokio::spawn(async move {
                    let answer = client.answer().await;
                    (answer, std::time::Instant::now())
                })
            })
            .collect();
        for _ in 0..10 {
            let (status, body) = app.post_order(app::order(1)).await;
            assert_eq!(status, 201, "round {round}: {body}");
        }
        let served = std::time::Instant::now();
        for answer in answers {
            let ((status, error), cut_off) = answer.await.unwrap();
            assert!(status.contains(" 408 "), "round {round}: {status}");
            assert_eq!(error["error"]["code"], "request_timeout", "{error}");
            assert!(
                cut_off > served,
                "round {round}: a slow client was cut off before the others were served"
            );
        }
    }
    assert_eq!(
        app.orders().await,
        30,
        "only the complete requests placed orders"
    );
}

#[tokio::test]
async fn past_the_concurrency_limit_a_request_is_refused_with_503_and_retry_after_then_served() {
    let app = spawn_app_limited(limits(2000, 2)).await;
    for round in 0..3 {
        let holding = vec![
            SlowClient::start(&app.base).await,
            SlowClient::start(&app.base).await,
        ];
        // Once both slow requests are in progress, the next one is refused.
        let refused = eventually(Duration::from_secs(10), "a request to be refused", || {
            let request = app.http.get(format!("{}/health", app.base)).send();
            async move {
                let response = request.await.ok()?;
                (response.status() == 503).then_some(response)
            }
        })
        .await;
        assert_eq!(refused.headers()["retry-after"], "1");
        let error: Value = refused.json().await.unwrap();
        assert_eq!(
            error["error"]["code"], "overloaded",
            "round {round}: {error}"
        );

        for client in holding {
            let (status, _) = client.answer().await;
            assert!(status.contains(" 408 "), "round {round}: {status}");
        }
        let (status, body) = app.post_order(app::order(1)).await;
        assert_eq!(
            status, 201,
            "round {round}: once the slots are free: {body}"
        );
    }
}
