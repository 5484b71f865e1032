//! What happened to the orders, read from the services' own databases.
//!
//! All timestamps come from one PostgreSQL server, so they share a clock:
//! `orders.created_at` is when the order's transaction began, `orders.updated_at` when
//! ApplyPaymentResult's began, `notifications.created_at` when NotifyCustomer's began,
//! `processed_events.processed_at` when a consumer applied an event and
//! `outbox.published_at` when the relay marked a batch (one value per batch). POST →
//! `confirmed` is therefore measured between the two transactions' starts: it leaves
//! out the HTTP request's parsing and the last commit, a millisecond or two.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde::Serialize;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::db::Databases;
use crate::load::quantile;
use crate::sql::Database;

mod effects;

pub use effects::{Effects, effects};

/// Percentiles of a latency, in milliseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Percentiles {
    pub count: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    /// From latencies in microseconds, sorted.
    pub fn of_sorted_us(sorted: &[u64]) -> Self {
        let ms = |q| quantile(sorted, q).map_or(f64::NAN, |us| us as f64 / 1000.0);
        Self {
            count: sorted.len(),
            p50: ms(0.50),
            p95: ms(0.95),
            p99: ms(0.99),
            max: ms(1.0),
        }
    }
}

/// A rate measured over a window of database time.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Rate {
    pub events: i64,
    pub seconds: f64,
    pub per_second: f64,
}

impl Rate {
    fn new(events: i64, seconds: f64) -> Self {
        Self {
            events,
            seconds,
            per_second: if seconds > 0.0 {
                events as f64 / seconds
            } else {
                f64::NAN
            },
        }
    }
}

/// The saga's view of one load step's orders.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StepOutcome {
    pub orders: usize,
    /// Orders still `pending` or not notified when the wait gave up.
    pub unfinished: usize,
    /// Orders that reached `confirmed` (or `cancelled`) per second, in the steady window.
    pub confirmed: Rate,
    /// Customers notified per second, in the steady window.
    pub notified: Rate,
    /// POST → `confirmed`.
    pub to_confirmed_ms: Percentiles,
    /// POST → notification.
    pub to_notified_ms: Percentiles,
    /// How long after the last order was placed the last one was confirmed: near the
    /// latency when the saga keeps up, growing with the backlog when it does not.
    pub confirmed_drain_seconds: f64,
    /// Events each consumer applied per second in the window (orders, payments,
    /// notifications databases).
    pub applied_per_second: HashMap<Database, f64>,
    /// Outbox rows each relay published per second in the window.
    pub published_per_second: HashMap<Database, f64>,
    /// Where the time between POST and notification goes, hop by hop ([`hops`]).
    pub hops_ms: Vec<(String, Percentiles)>,
}

impl StepOutcome {
    /// Orders per second both confirmed and notified: the saga's rate in the step.
    pub fn settled_per_second(&self) -> f64 {
        self.confirmed.per_second.min(self.notified.per_second)
    }
}

fn seconds_between(from: OffsetDateTime, to: OffsetDateTime) -> f64 {
    (to - from).as_seconds_f64()
}

/// Waits (up to `timeout`) until every order tagged `tag` is decided and notified, then
/// measures the step. The steady window starts `warmup` after the first order and ends
/// with the last one placed.
pub async fn step_outcome(
    databases: &Databases,
    tag: &str,
    warmup: Duration,
    timeout: Duration,
) -> anyhow::Result<StepOutcome> {
    let orders_db = databases.connect(Database::Orders).await?;
    let notifications_db = databases.connect(Database::Notifications).await?;
    wait_until_settled(&orders_db, &notifications_db, tag, timeout).await?;

    let rows = orders_db
        .query(
            "SELECT id, status, created_at, updated_at FROM orders WHERE customer_id = $1",
            &[&tag],
        )
        .await?;
    if rows.is_empty() {
        bail!("no order tagged {tag} reached the database");
    }
    let notified_at: HashMap<Uuid, OffsetDateTime> = notifications_db
        .query(
            "SELECT order_id, created_at FROM notifications WHERE customer_id = $1",
            &[&tag],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();

    let created: Vec<OffsetDateTime> = rows.iter().map(|r| r.get("created_at")).collect();
    let first = *created.iter().min().expect("rows is not empty");
    let last = *created.iter().max().expect("rows is not empty");
    let window_start = (first + warmup).min(last);
    let window = seconds_between(window_start, last);
    let in_window = |at: &OffsetDateTime| *at >= window_start && *at <= last;

    let mut to_confirmed = Vec::new();
    let mut to_notified = Vec::new();
    let mut confirmed_in_window = 0;
    let mut notified_in_window = 0;
    let mut unfinished = 0;
    let mut last_confirmed = last;
    for row in &rows {
        let id: Uuid = row.get("id");
        let status: &str = row.get("status");
        let created_at: OffsetDateTime = row.get("created_at");
        let updated_at: OffsetDateTime = row.get("updated_at");
        if status == "pending" {
            unfinished += 1;
            continue;
        }
        to_confirmed.push(((updated_at - created_at).as_seconds_f64() * 1e6) as u64);
        confirmed_in_window += i64::from(in_window(&updated_at));
        last_confirmed = last_confirmed.max(updated_at);
        match notified_at.get(&id) {
            Some(at) => {
                to_notified.push(((*at - created_at).as_seconds_f64() * 1e6) as u64);
                notified_in_window += i64::from(in_window(at));
            }
            None => unfinished += 1,
        }
    }
    to_confirmed.sort_unstable();
    to_notified.sort_unstable();

    let (applied_per_second, published_per_second) =
        rates_in_window(databases, window_start, last, window).await?;

    Ok(StepOutcome {
        orders: rows.len(),
        unfinished,
        confirmed: Rate::new(confirmed_in_window, window),
        notified: Rate::new(notified_in_window, window),
        to_confirmed_ms: Percentiles::of_sorted_us(&to_confirmed),
        to_notified_ms: Percentiles::of_sorted_us(&to_notified),
        confirmed_drain_seconds: seconds_between(last, last_confirmed),
        applied_per_second,
        published_per_second,
        hops_ms: hops(databases, tag).await?,
    })
}

/// Waits (up to `timeout`) until every order tagged `tag` is decided and notified.
async fn wait_until_settled(
    orders_db: &tokio_postgres::Client,
    notifications_db: &tokio_postgres::Client,
    tag: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let counts = orders_db
            .query_one(
                "SELECT count(*) FILTER (WHERE status = 'pending'), count(*)
                   FROM orders WHERE customer_id = $1",
                &[&tag],
            )
            .await?;
        let (pending, placed): (i64, i64) = (counts.get(0), counts.get(1));
        let notified: i64 = notifications_db
            .query_one(
                "SELECT count(*) FROM notifications WHERE customer_id = $1",
                &[&tag],
            )
            .await?
            .get(0);
        if (pending == 0 && notified >= placed) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// Events each consumer applied, and outbox rows each relay published, per second
/// between `window_start` and `last` (`window` seconds).
async fn rates_in_window(
    databases: &Databases,
    window_start: OffsetDateTime,
    last: OffsetDateTime,
    window: f64,
) -> anyhow::Result<(HashMap<Database, f64>, HashMap<Database, f64>)> {
    let mut applied_per_second = HashMap::new();
    let mut published_per_second = HashMap::new();
    for database in [
        Database::Orders,
        Database::Payments,
        Database::Notifications,
    ] {
        let client = databases.connect(database).await?;
        let applied: i64 = client
            .query_one(
                "SELECT count(*) FROM processed_events WHERE processed_at BETWEEN $1 AND $2",
                &[&window_start, &last],
            )
            .await?
            .get(0);
        let published: i64 = client
            .query_one(
                "SELECT count(*) FROM outbox WHERE published_at BETWEEN $1 AND $2",
                &[&window_start, &last],
            )
            .await?
            .get(0);
        applied_per_second.insert(database, Rate::new(applied, window).per_second);
        published_per_second.insert(database, Rate::new(published, window).per_second);
    }
    Ok((applied_per_second, published_per_second))
}

/// An outbox row's `occurred_at`, by (key, type).
async fn outbox_times(
    client: &tokio_postgres::Client,
    keys: &[String],
) -> anyhow::Result<HashMap<(String, String), OffsetDateTime>> {
    Ok(client
        .query(
            "SELECT key, type, occurred_at FROM outbox WHERE key = ANY($1)",
            &[&keys],
        )
        .await?
        .iter()
        .map(|row| ((row.get(0), row.get(1)), row.get(2)))
        .collect())
}

/// The time each hop of the saga took for the orders tagged `tag`: from the transaction
/// that wrote an event to the one that applied it in the next service.
pub async fn hops(databases: &Databases, tag: &str) -> anyhow::Result<Vec<(String, Percentiles)>> {
    let orders_db = databases.connect(Database::Orders).await?;
    let payments_db = databases.connect(Database::Payments).await?;
    let notifications_db = databases.connect(Database::Notifications).await?;
    let orders: Vec<(Uuid, OffsetDateTime)> = orders_db
        .query(
            "SELECT id, updated_at FROM orders WHERE customer_id = $1 AND status <> 'pending'",
            &[&tag],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let ids: Vec<Uuid> = orders.iter().map(|(id, _)| *id).collect();
    let keys: Vec<String> = ids.iter().map(Uuid::to_string).collect();
    let order_events = outbox_times(&orders_db, &keys).await?;
    let payment_events = outbox_times(&payments_db, &keys).await?;
    let charged: HashMap<Uuid, OffsetDateTime> = payments_db
        .query(
            "SELECT order_id, created_at FROM payments WHERE order_id = ANY($1)",
            &[&ids],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let notified: HashMap<Uuid, OffsetDateTime> = notifications_db
        .query(
            "SELECT order_id, created_at FROM notifications WHERE order_id = ANY($1)",
            &[&ids],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();

    // "written": the row's transaction began (outbox.occurred_at); "applied": the next
    // service's transaction that applied it began. Between them: the commit, the relay's
    // look (up to OUTBOX_LINGER_MS after the one before), the broker, the fetch, the
    // consumer's queue, and for ChargeOrder the provider's call. The relay's mark is no
    // end point: it comes with the relay's next look, after the consumer may have applied
    // the event.
    const NAMES: [&str; 3] = [
        "order.created written → payment-service applied it (the provider's call included)",
        "payment result written → order-service applied it (confirmed)",
        "outcome written → notification-service applied it",
    ];
    let mut samples: Vec<Vec<u64>> = vec![Vec::new(); NAMES.len()];
    let us = |from: OffsetDateTime, to: OffsetDateTime| {
        ((to - from).as_seconds_f64() * 1e6).max(0.0) as u64
    };
    for (id, confirmed_at) in &orders {
        let key = id.to_string();
        let created = order_events.get(&(key.clone(), saga::events::ORDER_CREATED.to_owned()));
        let result = payment_events
            .get(&(key.clone(), saga::events::PAYMENT_SUCCEEDED.to_owned()))
            .or_else(|| {
                payment_events.get(&(key.clone(), saga::events::PAYMENT_FAILED.to_owned()))
            });
        let outcome = order_events
            .get(&(key.clone(), saga::events::ORDER_CONFIRMED.to_owned()))
            .or_else(|| order_events.get(&(key.clone(), saga::events::ORDER_CANCELLED.to_owned())));
        if let (Some(written), Some(charged)) = (created, charged.get(id)) {
            samples[0].push(us(*written, *charged));
        }
        if let Some(written) = result {
            samples[1].push(us(*written, *confirmed_at));
        }
        if let (Some(written), Some(notified)) = (outcome, notified.get(id)) {
            samples[2].push(us(*written, *notified));
        }
    }
    Ok(NAMES
        .iter()
        .zip(samples)
        .map(|(name, mut values)| {
            values.sort_unstable();
            ((*name).to_owned(), Percentiles::of_sorted_us(&values))
        })
        .collect())
}

/// How fast one table filled with a backlog to work through: rows since `since`, from
/// the first to the last (so start-up before the first row does not count).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Drain {
    pub rows: i64,
    pub seconds: f64,
    pub per_second: f64,
    /// The relay only: how many batches (distinct `published_at`) it took.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batches: Option<i64>,
}

/// Which table and timestamp a [`Drain`] is read from.
#[derive(Debug, Clone, Copy)]
pub enum Work {
    /// A consumer: `processed_events.processed_at`.
    Applied,
    /// A relay: `outbox.published_at`.
    Published,
    /// The card provider: `charges.created_at` (its transaction's start).
    Charged,
}

/// Waits until `expected` rows of `work` exist since `since` (or `timeout` passes), then
/// measures their rate.
pub async fn drain(
    databases: &Databases,
    database: Database,
    work: Work,
    since: OffsetDateTime,
    expected: i64,
    timeout: Duration,
) -> anyhow::Result<Drain> {
    let client = databases.connect(database).await?;
    let query = match work {
        Work::Applied => {
            "SELECT count(*), min(processed_at), max(processed_at), NULL::bigint
               FROM processed_events WHERE processed_at >= $1"
        }
        Work::Published => {
            "SELECT count(*), min(published_at), max(published_at), count(DISTINCT published_at)
               FROM outbox WHERE published_at >= $1"
        }
        Work::Charged => {
            "SELECT count(*), min(created_at), max(created_at), NULL::bigint
               FROM charges WHERE created_at >= $1"
        }
    };
    let deadline = Instant::now() + timeout;
    loop {
        let row = client.query_one(query, &[&since]).await?;
        let rows: i64 = row.get(0);
        if rows >= expected || Instant::now() > deadline {
            let first: Option<OffsetDateTime> = row.get(1);
            let last: Option<OffsetDateTime> = row.get(2);
            let seconds = match (first, last) {
                (Some(first), Some(last)) => seconds_between(first, last),
                _ => 0.0,
            };
            // n rows span n - 1 intervals; for the relay, n batches span n - 1.
            let batches: Option<i64> = row.get(3);
            let done = match batches {
                Some(b) if b > 1 => rows as f64 * (b - 1) as f64 / b as f64,
                _ => (rows - 1).max(0) as f64,
            };
            return Ok(Drain {
                rows,
                seconds,
                per_second: if seconds > 0.0 {
                    done / seconds
                } else {
                    f64::NAN
                },
                batches,
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The database server's clock, which every timestamp above is read against.
pub async fn server_now(databases: &Databases) -> anyhow::Result<OffsetDateTime> {
    let client = databases.connect(Database::Orders).await?;
    Ok(client.query_one("SELECT now()", &[]).await?.get(0))
}
