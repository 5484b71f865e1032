//! Orders placed in the background at a steady rate through the real API, while a
//! scenario injects its faults.
//!
//! Each order is offered with an `Idempotency-Key` of its own, and offered again with
//! the same key until it is accepted: when the service is down or restarting (connection
//! refused, 503 while the database is down, 409 while a killed request's transaction is
//! not rolled back yet), and when a request is cut off mid-flight (the service killed
//! while answering). The first attempt of a cut-off request may have been committed; its
//! retry then gets that order back instead of placing a second one. So the database must
//! hold exactly the orders offered, and [`Load::finish`]'s list is every one of them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::{KEYBOARD, Stack};

/// Every `CANCELLED_EVERY`th order is for 100 keyboards, over the payment limit: the saga
/// cancels it. The others are confirmed.
pub const CANCELLED_EVERY: usize = 8;

pub struct Load {
    accepted: Arc<Mutex<Vec<Uuid>>>,
    /// Attempts refused or cut off, then offered again.
    retried: Arc<AtomicUsize>,
    task: JoinHandle<()>,
    /// How many orders the load places in all.
    pub orders: usize,
    /// Orders offered per second.
    pub rate: u32,
}

impl Load {
    /// Starts placing `orders` orders at `rate` per second.
    pub fn start(stack: &Stack, orders: usize, rate: u32) -> Self {
        let (http, base) = stack.api();
        Self::placing(http, Target::one(base), orders, rate)
    }

    /// [`Load::start`] over several copies of order-service (`instances`), as a load
    /// balancer would: each attempt goes to the next copy in turn, a retry included, and
    /// an attempt that gets no answer within [`SPREAD_TIMEOUT`] is offered to the next
    /// copy, so that a frozen copy holds up one attempt, not the load.
    pub fn spread(stack: &Stack, instances: &[&str], orders: usize, rate: u32) -> Self {
        let (http, _) = stack.api();
        let target = Target {
            bases: instances.iter().map(|i| stack.url_of(i)).collect(),
            timeout: SPREAD_TIMEOUT,
        };
        Self::placing(http, target, orders, rate)
    }

    fn placing(http: reqwest::Client, target: Target, orders: usize, rate: u32) -> Self {
        let accepted = Arc::new(Mutex::new(Vec::with_capacity(orders)));
        let retried = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(place(
            http,
            target,
            orders,
            rate,
            accepted.clone(),
            retried.clone(),
        ));
        Self {
            accepted,
            retried,
            task,
            orders,
            rate,
        }
    }

    /// The list of accepted orders, as it grows: for work that follows the load.
    pub(crate) fn accepted_so_far(&self) -> Arc<Mutex<Vec<Uuid>>> {
        self.accepted.clone()
    }

    /// Orders accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.lock().unwrap().len()
    }

    pub fn retried(&self) -> usize {
        self.retried.load(Ordering::Relaxed)
    }

    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits until `n` orders have been accepted.
    pub async fn reached(&self, n: usize) {
        saga_testkit::eventually(
            Duration::from_secs(600),
            &format!("{n} orders to be accepted"),
            || async move { (self.accepted() >= n || self.is_finished()).then_some(()) },
        )
        .await;
    }

    /// Waits for the last order to be accepted; returns every accepted order's id.
    pub async fn finish(self) -> Vec<Uuid> {
        self.task.await.expect("the load does not panic");
        let accepted = self.accepted.lock().unwrap();
        accepted.clone()
    }
}

/// How long an attempt of [`Load::spread`] waits for its answer before the next copy is
/// offered the order: far beyond a loaded copy's answer, far below a frozen copy's.
pub const SPREAD_TIMEOUT: Duration = Duration::from_secs(2);

/// Where the orders go.
struct Target {
    /// order-service's copies, taken in turn.
    bases: Vec<String>,
    /// How long an attempt waits for its answer.
    timeout: Duration,
}

impl Target {
    fn one(base: String) -> Self {
        Self {
            bases: vec![base],
            timeout: Duration::from_secs(30),
        }
    }
}

async fn place(
    http: reqwest::Client,
    target: Target,
    orders: usize,
    rate: u32,
    accepted: Arc<Mutex<Vec<Uuid>>>,
    retried: Arc<AtomicUsize>,
) {
    let urls: Vec<String> = target
        .bases
        .iter()
        .map(|base| format!("{base}/v1/orders"))
        .collect();
    let mut attempts = 0;
    let mut ticks = tokio::time::interval(Duration::from_secs(1) / rate.max(1));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for i in 0..orders {
        let quantity = if i % CANCELLED_EVERY == CANCELLED_EVERY - 1 {
            100
        } else {
            1 + (i % 3) as i32
        };
        let body = json!({
            "customer_id": format!("cust-{}", i % 50),
            "items": [{ "product_id": KEYBOARD, "quantity": quantity }],
        });
        let key = format!("load-{i}");
        loop {
            ticks.tick().await;
            let url = &urls[attempts % urls.len()];
            attempts += 1;
            match offer(&http, url, &key, &body, target.timeout).await {
                Offer::Accepted(id) => {
                    accepted.lock().unwrap().push(id);
                    break;
                }
                Offer::Refused => {
                    retried.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

enum Offer {
    Accepted(Uuid),
    Refused,
}

async fn offer(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    body: &Value,
    timeout: Duration,
) -> Offer {
    let response = match http
        .post(url)
        .header("idempotency-key", key)
        .json(body)
        .timeout(timeout)
        .send()
        .await
    {
        Ok(response) => response,
        // Down, restarting, frozen, or killed while answering.
        Err(_) => return Offer::Refused,
    };
    let status = response.status().as_u16();
    match status {
        201 => match response.json::<Value>().await {
            Ok(body) => Offer::Accepted(body["id"].as_str().unwrap().parse().unwrap()),
            // Cut off while answering: stored, but its id never arrived.
            Err(_) => Offer::Refused,
        },
        // The database is down, or the key's first request (killed) still holds it;
        // nothing was stored by this one.
        409 | 503 => Offer::Refused,
        other => panic!(
            "POST /v1/orders answered {other}: {}",
            response.text().await.unwrap_or_default()
        ),
    }
}
