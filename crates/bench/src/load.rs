//! The load generator: places orders through `POST /v1/orders`, closed-loop (a fixed
//! number of clients, each placing its next order when the last one answered) or
//! open-loop (orders started at a fixed rate whatever the answers, as real customers do).
//!
//! Every order of a run carries the run's tag as its `customer_id`, so what happened to
//! those orders afterwards can be read back from the databases by tag. Open-loop latency
//! is measured from when a request was *due*, not when it went out, so a stalled server
//! is not hidden by the generator waiting for it (coordinated omission).
//!
//! [`charge_directly`] calls the card provider the way payment-service does, for the
//! provider's own rate beside ChargeOrder's.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use time::OffsetDateTime;
use tokio::sync::Mutex;

/// How orders are offered.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Shape {
    /// `concurrency` clients, each with one order in flight.
    Closed { concurrency: u32 },
    /// `rate` orders per second started on schedule.
    Open { rate: f64 },
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Shape::Closed { concurrency } => write!(f, "closed c={concurrency}"),
            Shape::Open { rate } => write!(f, "open {rate:.0}/s"),
        }
    }
}

/// Whether each request carries an `Idempotency-Key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Keys {
    None,
    /// A key of its own per request (`<tag>-<n>`): what a client that keys every order
    /// sends when nothing is retried.
    Unique,
}

/// What one run of the generator saw from the client side.
#[derive(Debug, Clone, Serialize)]
pub struct LoadResult {
    pub shape: Shape,
    pub tag: String,
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    pub seconds: f64,
    /// Orders answered `201 Created`.
    pub placed: u64,
    /// Requests refused with `503` and `Retry-After` (admission control's `saga_behind`,
    /// or the HTTP edge's `overloaded`): nothing placed, come back later.
    pub refused: u64,
    /// Requests answered otherwise, or not at all.
    pub failed: u64,
    /// Open loop: requests not started because too many were still in flight.
    pub skipped: u64,
    /// `POST` latency of the placed orders, in microseconds, sorted.
    #[serde(skip)]
    pub post_latencies_us: Vec<u64>,
}

impl LoadResult {
    pub fn placed_per_second(&self) -> f64 {
        self.placed as f64 / self.seconds
    }

    /// The share of answered requests that were refused, in percent.
    pub fn refused_percent(&self) -> f64 {
        match self.placed + self.refused {
            0 => 0.0,
            answered => self.refused as f64 * 100.0 / answered as f64,
        }
    }
}

/// How one request ended.
enum Offer {
    Placed,
    /// Refused for now: come back after this.
    Refused(Duration),
    Failed,
}

/// The longest a client waits on a `Retry-After`, so that a step ends on time.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(5);

/// Requests one open-loop run keeps in flight at most; past it the server is not
/// keeping up and more requests would only measure the generator's own queue.
const MAX_IN_FLIGHT: u64 = 2_000;

pub struct LoadGenerator {
    client: reqwest::Client,
    url: String,
    /// Numbers the keys of [`Keys::Unique`], unique across the generator's runs.
    keys_sent: AtomicU64,
}

/// The demo's order: two keyboards, 25.98, under the payment limit, so it is confirmed.
pub fn order_body(tag: &str) -> String {
    serde_json::json!({
        "customer_id": tag,
        "items": [{"product_id": "8f14e45f-ceea-4c9d-b2a5-0c1e3f4a9b21", "quantity": 2}],
    })
    .to_string()
}

impl LoadGenerator {
    /// `base` is the order API, e.g. `http://127.0.0.1:8080`.
    pub fn new(base: &str) -> anyhow::Result<Self> {
        Ok(Self {
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .pool_max_idle_per_host(usize::MAX)
                .tcp_nodelay(true)
                .build()?,
            url: format!("{}/v1/orders", base.trim_end_matches('/')),
            keys_sent: AtomicU64::new(0),
        })
    }

    async fn place(&self, body: &str, keys: Keys, tag: &str) -> Offer {
        let mut request = self
            .client
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_owned());
        if keys == Keys::Unique {
            let n = self.keys_sent.fetch_add(1, Ordering::Relaxed);
            request = request.header("idempotency-key", format!("{tag}-{n}"));
        }
        let Ok(response) = request.send().await else {
            return Offer::Failed;
        };
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .map(|seconds| Duration::from_secs(seconds).min(MAX_RETRY_AFTER));
        match (response.status(), retry_after) {
            (reqwest::StatusCode::CREATED, _) => Offer::Placed,
            (reqwest::StatusCode::SERVICE_UNAVAILABLE, Some(after)) => Offer::Refused(after),
            _ => Offer::Failed,
        }
    }

    /// `POST /v1/orders/{order_id}/cancel`: whether the order is cancelled (now, or
    /// before).
    pub async fn cancel(&self, order_id: uuid::Uuid) -> bool {
        let response = self
            .client
            .post(format!("{}/{order_id}/cancel", self.url))
            .send()
            .await;
        response.is_ok_and(|r| r.status().is_success())
    }

    /// Offers orders shaped `shape` for `duration`, then waits for the answers still due.
    pub async fn run(self: &Arc<Self>, shape: Shape, duration: Duration, tag: &str) -> LoadResult {
        self.offer(shape, duration, None, tag, Keys::None).await
    }

    /// Places `count` orders as fast as `shape` (closed) allows, each with a key or not;
    /// the rate is over the time it took.
    pub async fn run_count(
        self: &Arc<Self>,
        shape: Shape,
        count: u64,
        tag: &str,
        keys: Keys,
    ) -> LoadResult {
        self.offer(shape, Duration::from_secs(600), Some(count), tag, keys)
            .await
    }

    async fn offer(
        self: &Arc<Self>,
        shape: Shape,
        duration: Duration,
        limit: Option<u64>,
        tag: &str,
        keys: Keys,
    ) -> LoadResult {
        let offered = Offered {
            body: order_body(tag).into(),
            tag: tag.into(),
            keys,
            latencies: Arc::new(Mutex::new(Vec::<u64>::new())),
            failed: Arc::new(AtomicU64::new(0)),
            refused: Arc::new(AtomicU64::new(0)),
        };
        let remaining = Arc::new(AtomicU64::new(limit.unwrap_or(u64::MAX)));
        let started_at = OffsetDateTime::now_utc();
        let start = Instant::now();
        let deadline = start + duration;
        let mut skipped = 0;
        match shape {
            Shape::Closed { concurrency } => {
                self.closed(&offered, concurrency, deadline, &remaining)
                    .await;
            }
            Shape::Open { rate } => skipped = self.open(&offered, rate, start, deadline).await,
        }
        // The offered window, not the tail of answers after it.
        let seconds = duration
            .as_secs_f64()
            .min(start.elapsed().as_secs_f64())
            .max(0.001);
        let mut post_latencies_us = std::mem::take(&mut *offered.latencies.lock().await);
        post_latencies_us.sort_unstable();
        LoadResult {
            shape,
            tag: offered.tag.to_string(),
            started_at,
            seconds,
            placed: post_latencies_us.len() as u64,
            refused: offered.refused.load(Ordering::Relaxed),
            failed: offered.failed.load(Ordering::Relaxed),
            skipped,
            post_latencies_us,
        }
    }

    /// `concurrency` clients, each placing its next order as soon as the last is answered,
    /// until `deadline` or until `remaining` orders are placed.
    async fn closed(
        self: &Arc<Self>,
        offered: &Offered,
        concurrency: u32,
        deadline: Instant,
        remaining: &Arc<AtomicU64>,
    ) {
        let mut clients = tokio::task::JoinSet::new();
        for _ in 0..concurrency {
            let generator = self.clone();
            let Offered {
                body,
                tag,
                keys,
                latencies,
                failed,
                refused,
            } = offered.clone();
            let remaining = remaining.clone();
            clients.spawn(async move {
                let mut mine = Vec::new();
                while Instant::now() < deadline
                    && remaining
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                        .is_ok()
                {
                    let sent = Instant::now();
                    let pause = match generator.place(&body, keys, &tag).await {
                        Offer::Placed => {
                            mine.push(sent.elapsed().as_micros() as u64);
                            continue;
                        }
                        // As a client that honours the server: back when it says.
                        Offer::Refused(after) => {
                            refused.fetch_add(1, Ordering::Relaxed);
                            after
                        }
                        // A failed order comes back fast; do not spin on it.
                        Offer::Failed => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            Duration::from_millis(10)
                        }
                    };
                    // Not placed: another try is owed.
                    remaining.fetch_add(1, Ordering::Relaxed);
                    let until = (Instant::now() + pause).min(deadline);
                    tokio::time::sleep_until(until.into()).await;
                }
                latencies.lock().await.extend(mine);
            });
        }
        while clients.join_next().await.is_some() {}
    }

    /// Orders at `rate` a second from `start` until `deadline`, whether or not the ones
    /// before were answered; returns how many were skipped, too many being in flight.
    async fn open(
        self: &Arc<Self>,
        offered: &Offered,
        rate: f64,
        start: Instant,
        deadline: Instant,
    ) -> u64 {
        let mut skipped = 0;
        let in_flight = Arc::new(AtomicU64::new(0));
        let mut requests = tokio::task::JoinSet::new();
        let interval = Duration::from_secs_f64(1.0 / rate);
        let mut due = start;
        while due < deadline {
            tokio::time::sleep_until(due.into()).await;
            if in_flight.load(Ordering::Relaxed) >= MAX_IN_FLIGHT {
                skipped += 1;
            } else {
                in_flight.fetch_add(1, Ordering::Relaxed);
                let generator = self.clone();
                let Offered {
                    body,
                    tag,
                    keys,
                    latencies,
                    failed,
                    refused,
                } = offered.clone();
                let in_flight = in_flight.clone();
                requests.spawn(async move {
                    // An open loop's customers do not come back: a refusal is
                    // counted, not retried.
                    match generator.place(&body, keys, &tag).await {
                        Offer::Placed => {
                            let latency = due.elapsed().as_micros() as u64;
                            latencies.lock().await.push(latency);
                        }
                        Offer::Refused(_) => {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        Offer::Failed => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    in_flight.fetch_sub(1, Ordering::Relaxed);
                });
            }
            // Reap finished requests as we go, so the set stays small.
            while requests.try_join_next().is_some() {}
            due += interval;
        }
        while requests.join_next().await.is_some() {}
        skipped
    }
}

/// What the clients of one offer share: the order they place, and what they count.
#[derive(Clone)]
struct Offered {
    body: Arc<str>,
    tag: Arc<str>,
    keys: Keys,
    latencies: Arc<Mutex<Vec<u64>>>,
    failed: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
}

/// The reference, and the start of the key, of every charge the benchmark asks of the
/// provider itself rather than for an order, so that the exactly-once count can leave
/// them out.
pub const DIRECT_CHARGE_PREFIX: &str = "bench-direct-";

/// What asking the provider directly saw from the caller's side.
#[derive(Debug, Clone, Serialize)]
pub struct CallResult {
    /// Charges made (201, not replayed).
    pub charged: u64,
    /// Calls answered otherwise, or not at all.
    pub failed: u64,
    pub seconds: f64,
    /// Each charge's call, in microseconds, sorted.
    #[serde(skip)]
    pub latencies_us: Vec<u64>,
}

/// payment-service's client of the provider at `url`, with its settings read as it reads
/// them: its defaults, or the variables it inherits from this process.
fn provider_client(url: &str) -> anyhow::Result<payment_service::Provider> {
    use clap::Parser as _;
    #[derive(clap::Parser)]
    struct Settings {
        #[command(flatten)]
        provider: payment_service::ProviderConfig,
    }
    let settings = Settings::try_parse_from(["loadgen", "--provider-url", url])?;
    payment_service::Provider::new(&settings.provider)
}

/// Asks the provider at `provider_url` for `count` charges of an order's amount,
/// `concurrency` at a time, each under a key of its own, with payment-service's own
/// client and timeouts: the call ChargeOrder makes for every order, without the rest of
/// ChargeOrder. A failed call is not made again: its key might have charged.
pub async fn charge_directly(
    provider_url: &str,
    count: u64,
    concurrency: u32,
) -> anyhow::Result<CallResult> {
    use payment_service::provider::{Answer, ChargeRequest};
    let provider = Arc::new(provider_client(provider_url)?);
    let next = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (provider, next, failed) = (provider.clone(), next.clone(), failed.clone());
        callers.spawn(async move {
            let mut mine = Vec::new();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= count {
                    break;
                }
                let reference = format!("{DIRECT_CHARGE_PREFIX}{n}");
                let request = ChargeRequest {
                    // The demo's order: two keyboards at 12.99.
                    amount_cents: 2598,
                    currency: payment_service::payment::CURRENCY,
                    reference: reference.clone(),
                };
                let sent = Instant::now();
                match provider
                    .charge(&format!("{reference}:charge"), &request)
                    .await
                {
                    Ok(Answer::Charged {
                        replayed: false, ..
                    }) => mine.push(sent.elapsed().as_micros() as u64),
                    _ => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            mine
        });
    }
    let mut latencies_us = Vec::new();
    while let Some(mine) = callers.join_next().await {
        latencies_us.extend(mine?);
    }
    latencies_us.sort_unstable();
    Ok(CallResult {
        charged: latencies_us.len() as u64,
        failed: failed.load(Ordering::Relaxed),
        seconds: start.elapsed().as_secs_f64(),
        latencies_us,
    })
}

/// The `q`-quantile (0..=1) of sorted `values`, nearest rank.
pub fn quantile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let values: Vec<u64> = (1..=100).collect();
        assert_eq!(quantile(&values, 0.5), Some(50));
        assert_eq!(quantile(&values, 0.99), Some(99));
        assert_eq!(quantile(&values, 1.0), Some(100));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn the_provider_is_called_with_payment_services_own_client() {
        provider_client("http://127.0.0.1:18083").unwrap();
    }

    #[test]
    fn the_order_body_is_what_the_api_takes() {
        let body: serde_json::Value = serde_json::from_str(&order_body("bench-x")).unwrap();
        assert_eq!(body["customer_id"], "bench-x");
        assert_eq!(body["items"][0]["quantity"], 2);
    }
}
