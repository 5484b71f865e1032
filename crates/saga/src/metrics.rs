//! What every service counts, and `GET /metrics`, where Prometheus reads it.
//!
//! The code records through the `metrics` facade; one Prometheus recorder per process
//! renders it as text. Names carry one prefix (`saga_`), base units (seconds, records)
//! and `_total` on counters; labels take only values from small, fixed sets (an event
//! type outside the catalog is `other`), so that a hand-made record cannot mint a series.
//!
//! What reconciles, per service and topic, once nothing is in hand:
//!
//! ```text
//! saga_consumer_records_received_total
//!     = Σ over outcome saga_consumer_events_total      (applied, duplicate, guarded,
//!                                                        ignored, dead_lettered)
//! saga_consumer_events_total{outcome="dead_lettered"} = Σ saga_dead_letters_total
//! ```
//!
//! A record still queued or being retried is received and not yet counted in an outcome;
//! one abandoned by a stopping service is redelivered, and counted again, by the next.
//! Counters start at zero with each process, as Prometheus expects.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ::metrics::{counter, gauge, histogram};
use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use deadpool_postgres::Pool;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::{LocalRelay, events};

/// Records a consumer took from the broker, by topic.
pub const RECORDS_RECEIVED: &str = "saga_consumer_records_received_total";
/// What became of each record, by topic, event type and [`outcome`](crate::Outcome)
/// (or `dead_lettered`).
///
/// It also counts the cancellations' answers, as order-service applies them:
/// `{topic="payments", type="payment.refunded" | "payment.voided", outcome="applied"}`
/// is one per refund and one per void payment-service committed. payment-service counts
/// no refunds of its own: its handler runs inside a transaction that may still roll back
/// (a stale decision, a failed commit, a batch undone), so a count there would count
/// answers that never were; the consumer counts after the commit, and guard 1 makes each
/// answer `applied` once.
pub const EVENTS: &str = "saga_consumer_events_total";
/// Time to apply one event (prepare and transaction) or one batch, by topic.
pub const HANDLER_DURATION: &str = "saga_handler_duration_seconds";
/// Records per application of the handler: 1 for a transaction per event.
pub const BATCH_SIZE: &str = "saga_handler_batch_size_records";
/// Failed attempts that are tried again, by topic, retry class and error kind.
pub const RETRIES: &str = "saga_handler_retries_total";
/// Records put on a dead-letter topic (acknowledged by the broker), by topic and cause.
pub const DEAD_LETTERS: &str = "saga_dead_letters_total";
/// Records the broker has not yet given this consumer group, per partition the service
/// holds (0 for one it does not), from librdkafka's statistics.
pub const CONSUMER_LAG: &str = "saga_consumer_lag_records";
/// When the record a partition's worker has in hand (the partition's oldest unfinished
/// one) came to it, in seconds since the epoch, per partition; 0 while it has none.
/// `time() - x` is how long it has waited: a record retried for ever, with its partition
/// stuck behind it, grows it without bound (an alert rule watches it), while the lag may
/// stand still.
pub const RECORD_IN_HAND_SINCE: &str = "saga_consumer_record_in_hand_since_seconds";
/// Outbox rows acknowledged by the broker, by topic.
pub const OUTBOX_PUBLISHED: &str = "saga_outbox_published_total";
/// Times the relay's session broke (database or broker trouble) and was started again.
pub const OUTBOX_INTERRUPTIONS: &str = "saga_outbox_relay_interruptions_total";
/// Outbox rows not yet published, read at scrape time.
pub const OUTBOX_UNPUBLISHED: &str = "saga_outbox_unpublished_rows";
/// Age of the oldest unpublished outbox row (0 when none): the outbox's lag.
pub const OUTBOX_OLDEST_AGE: &str = "saga_outbox_oldest_unpublished_age_seconds";
/// HTTP requests answered, by method, route (the pattern, not the path) and status.
pub const HTTP_REQUESTS: &str = "saga_http_requests_total";
/// Time to answer an HTTP request, by method and route.
pub const HTTP_DURATION: &str = "saga_http_request_duration_seconds";
/// Requests answered with the stored answer of their `Idempotency-Key`.
pub const IDEMPOTENCY_REPLAYS: &str = "saga_idempotency_replays_total";

/// payment-service's calls to the card provider, by what came back: `charged`,
/// `declined`, `unavailable` (a 5xx, 408, 409, 425 or 429), `no_answer` (refused, timed
/// out, or cut before the answer: a lost response looks like this), `rejected`; and
/// `replayed` (`true` when the provider answered from its key's stored answer).
/// A refund's calls and an order's list of charges carry `call` (`refund`,
/// `charges_for`), and their own outcomes: `refunded`, `already_refunded` (the charge's
/// refund made under another key, found on the charge), `listed`.
pub const PROVIDER_CALLS: &str = "saga_provider_calls_total";
/// Time from sending a call to its answer (or to giving up on it), by `call` as
/// [`PROVIDER_CALLS`] (none for a charge).
pub const PROVIDER_CALL_DURATION: &str = "saga_provider_call_duration_seconds";
/// The provider's side: `POST /v1/charges` received, whatever became of them.
pub const CHARGE_REQUESTS: &str = "saga_charge_requests_total";
/// New charges the provider decided, by `result` (`succeeded`, `declined`); a replay
/// decides nothing and is counted in [`IDEMPOTENCY_REPLAYS`].
pub const CHARGES: &str = "saga_charges_total";
/// Calls a fault was applied to, by `kind` (`unavailable`, `slow`, `lose_response`).
pub const CHARGE_FAULTS: &str = "saga_charge_faults_total";
/// The provider's side: `POST /v1/refunds` received, whatever became of them.
pub const REFUND_REQUESTS: &str = "saga_refund_requests_total";
/// New refunds the provider made, by `result` (`succeeded`: a refund that cannot be made
/// is refused, and makes nothing); a replay makes none.
pub const REFUNDS: &str = "saga_refunds_total";
/// Refund calls a fault was applied to, by `kind` (`unavailable`, `slow`,
/// `lose_response`).
pub const REFUND_FAULTS: &str = "saga_refund_faults_total";
/// payment-service's payments not at rest, by `state`: `charge_unknown` (a charge asked
/// for whose answer is not known: its intent, or a call with no answer), `refund_unknown`
/// (the same, for a refund), `refund_failed` (the provider refused it; an operator's retry
/// is next), `refund_manual` (no refund can be asked for: a person must settle it). A
/// gauge of the whole database: see [`shared_gauge`].
pub const PAYMENTS_UNSETTLED: &str = "saga_payments_unsettled";
/// How long the oldest payment in each of [`PAYMENTS_UNSETTLED`]'s states has been in it,
/// in seconds (0 when none is). An unknown charge must be resolved well before the
/// provider forgets its key ([`PROVIDER_KEY_TTL`]); an alert rule compares the two.
pub const PAYMENTS_UNSETTLED_OLDEST_AGE: &str = "saga_payments_unsettled_oldest_age_seconds";
/// How long the card provider keeps an idempotency key, as payment-service is told
/// (`PROVIDER_KEY_TTL`): past it, a charge's replay could charge again.
pub const PROVIDER_KEY_TTL: &str = "saga_provider_key_ttl_seconds";
/// order-service's orders not settled (pending, or cancelled and not yet answered by
/// payment-service), as admission control last counted them. A gauge of the whole
/// database, like the outbox's: see [`shared_gauge`].
pub const ORDERS_IN_FLIGHT: &str = "saga_orders_in_flight";
/// This copy of order-service's last count of [`ORDERS_IN_FLIGHT`], which its admission
/// control decides on: the same in every copy, give or take a count.
pub const ADMISSION_COUNTED: &str = "saga_admission_counted";
/// order-service's cap on [`ORDERS_IN_FLIGHT`] as of its last count: what the saga
/// settles in `ADMISSION_MAX_WAIT` at its recent rate, or `ADMISSION_MAX_IN_FLIGHT`.
pub const ADMISSION_LIMIT: &str = "saga_admission_limit";

/// What a copy reports of a gauge read from the database every copy shares (the outbox's
/// backlog, the orders in flight): `value` in the copy whose relay holds the database's
/// lease, 0 in the others. A dashboard's sum over copies is then the database's figure
/// (not N times it), and one series per copy stays, so none goes missing on a takeover.
pub fn shared_gauge(relay: &LocalRelay, value: f64) -> f64 {
    if relay.is_active() { value } else { 0.0 }
}

/// Seconds: from a fraction of a millisecond (an answer from memory) to the 30 s a
/// transient failure may last before the caller gives up.
const SECONDS: &[f64] = &[
    0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
const RECORDS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

/// How often histograms are folded and idle data dropped.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// The process's recorder, installed on first use. Several services started in one
/// process (the tests do) share it.
pub fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let handle = PrometheusBuilder::new()
            // Without buckets the exporter renders summaries, which cannot be summed
            // across instances.
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS)
            .and_then(|b| b.set_buckets_for_metric(Matcher::Suffix("_records".into()), RECORDS))
            .expect("bucket lists are not empty")
            .install_recorder()
            .expect("no other metrics recorder is installed");
        describe();
        let upkeep = handle.clone();
        // A thread, not a task: the recorder outlives any one runtime (each test has its
        // own), and upkeep is a few microseconds every few seconds.
        std::thread::Builder::new()
            .name("metrics-upkeep".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(UPKEEP_INTERVAL);
                    upkeep.run_upkeep();
                }
            })
            .expect("a thread can be spawned at start-up");
        handle
    })
}

/// The `# HELP` line of each metric: what a person reading `/metrics` cold needs.
fn describe() {
    use ::metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(RECORDS_RECEIVED, "Records taken from the broker");
    describe_counter!(
        EVENTS,
        "What each record met: applied, duplicate (guard 1), guarded (guard 2), ignored, dead_lettered"
    );
    describe_histogram!(
        HANDLER_DURATION,
        Unit::Seconds,
        "Time to apply one event or one batch, its provider call included"
    );
    describe_histogram!(BATCH_SIZE, Unit::Count, "Records applied per transaction");
    describe_counter!(RETRIES, "Failed attempts that are tried again");
    describe_counter!(DEAD_LETTERS, "Records put on the dead-letter topic");
    describe_gauge!(
        CONSUMER_LAG,
        Unit::Count,
        "Records on a partition the group has not committed (0 where another instance holds it)"
    );
    describe_gauge!(
        RECORD_IN_HAND_SINCE,
        Unit::Seconds,
        "When the record a partition's worker has in hand came to it (epoch seconds; 0: none)"
    );
    describe_counter!(OUTBOX_PUBLISHED, "Outbox rows the broker acknowledged");
    describe_counter!(
        OUTBOX_INTERRUPTIONS,
        "Relay sessions broken and started again"
    );
    describe_gauge!(
        OUTBOX_UNPUBLISHED,
        Unit::Count,
        "Outbox rows not yet published; reported by the copy publishing them, 0 in the others"
    );
    describe_gauge!(
        OUTBOX_OLDEST_AGE,
        Unit::Seconds,
        "Age of the oldest unpublished outbox row; reported by the copy publishing them, 0 in the others"
    );
    describe_http_and_provider();
    describe_orders();
}

fn describe_http_and_provider() {
    use ::metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(HTTP_REQUESTS, "HTTP requests answered");
    describe_histogram!(
        HTTP_DURATION,
        Unit::Seconds,
        "Time to answer an HTTP request"
    );
    describe_counter!(
        IDEMPOTENCY_REPLAYS,
        "Requests answered with their Idempotency-Key's stored answer"
    );
    describe_counter!(
        PROVIDER_CALLS,
        "Calls to the card provider (charges; refunds and lists by call), by answer"
    );
    describe_histogram!(
        PROVIDER_CALL_DURATION,
        Unit::Seconds,
        "Time from sending a call to the card provider to its answer"
    );
    describe_counter!(CHARGE_REQUESTS, "Charge requests the provider received");
    describe_counter!(
        CHARGES,
        "Charges the provider decided (replays decide none)"
    );
    describe_counter!(CHARGE_FAULTS, "Charge requests a fault was applied to");
    describe_counter!(REFUND_REQUESTS, "Refund requests the provider received");
    describe_counter!(REFUNDS, "Refunds the provider made (replays make none)");
    describe_counter!(REFUND_FAULTS, "Refund requests a fault was applied to");
    describe_gauge!(
        PAYMENTS_UNSETTLED,
        Unit::Count,
        "Payments not at rest, by state: charge_unknown, refund_unknown, refund_failed, refund_manual; reported by the copy publishing the outbox, 0 in the others"
    );
    describe_gauge!(
        PAYMENTS_UNSETTLED_OLDEST_AGE,
        Unit::Seconds,
        "How long the oldest payment in each unsettled state has been so; as the count"
    );
    describe_gauge!(
        PROVIDER_KEY_TTL,
        Unit::Seconds,
        "How long the card provider keeps an idempotency key (PROVIDER_KEY_TTL)"
    );
}

fn describe_orders() {
    use ::metrics::{Unit, describe_gauge};
    describe_gauge!(
        ORDERS_IN_FLIGHT,
        Unit::Count,
        "Orders not settled (pending, or a cancellation not answered), which admission control caps; reported by the copy publishing the outbox, 0 in the others"
    );
    describe_gauge!(
        ADMISSION_COUNTED,
        Unit::Count,
        "Orders in flight as this copy's admission control last counted them"
    );
    describe_gauge!(
        ADMISSION_LIMIT,
        Unit::Count,
        "Orders in flight past which admission control refuses new ones"
    );
}

/// `GET /metrics`: everything recorded so far, with the outbox gauges read just before
/// from the database of `outbox`, if the service has one, by the copy whose relay
/// publishes it ([`shared_gauge`]).
pub fn router(outbox: Option<(Pool, LocalRelay)>) -> Router {
    handle();
    Router::new()
        .route("/metrics", get(render))
        .with_state(outbox)
}

async fn render(State(outbox): State<Option<(Pool, LocalRelay)>>) -> Response {
    if let Some((pool, relay)) = outbox
        && let Err(error) = read_outbox(&pool, &relay).await
    {
        // The other figures still help most when the database is what is wrong.
        tracing::debug!(%error, "outbox gauges not refreshed");
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle().render(),
    )
        .into_response()
}

async fn read_outbox(pool: &Pool, relay: &LocalRelay) -> anyhow::Result<()> {
    if !relay.is_active() {
        gauge!(OUTBOX_UNPUBLISHED).set(0.0);
        gauge!(OUTBOX_OLDEST_AGE).set(0.0);
        return Ok(());
    }
    let client = pool.get().await?;
    // The relay's partial index holds exactly these rows: cheap however long the
    // published history is.
    let row = client
        .query_one(
            "SELECT count(*),
                    COALESCE(EXTRACT(EPOCH FROM now() - min(occurred_at)), 0)::float8
               FROM outbox
              WHERE published_at IS NULL",
            &[],
        )
        .await?;
    gauge!(OUTBOX_UNPUBLISHED).set(row.get::<_, i64>(0) as f64);
    gauge!(OUTBOX_OLDEST_AGE).set(row.get::<_, f64>(1));
    Ok(())
}

/// Sets [`RECORD_IN_HAND_SINCE`] for `partition` of `topic`: `since` the record in hand
/// came to its worker, or `None` when it has none.
pub fn record_in_hand(topic: &str, partition: i32, since: Option<std::time::SystemTime>) {
    let seconds = since
        .and_then(|since| since.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0.0, |since| since.as_secs_f64());
    gauge!(RECORD_IN_HAND_SINCE, "topic" => topic.to_owned(), "partition" => partition.to_string())
        .set(seconds);
}

/// Middleware counting and timing every request by its route's pattern (`/v1/orders/{id}`),
/// so that ids do not become series; a path no route matches is `unmatched`.
pub async fn track_http(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |path| path.as_str().to_owned());
    let method = request.method().as_str().to_owned();
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    counter!(HTTP_REQUESTS, "method" => method.clone(), "route" => route.clone(), "status" => status)
        .increment(1);
    histogram!(HTTP_DURATION, "method" => method, "route" => route)
        .record(started.elapsed().as_secs_f64());
    response
}

/// An event type as a label: one of the catalog's, or `other`. Read from the topics'
/// lists of types, so that a type added to the catalog is its own series at once: the
/// cancellations' answers (`payment.refunded`, `payment.voided`) are counted by it.
pub fn event_type_label(event_type: &str) -> &'static str {
    events::ORDERS_TYPES
        .into_iter()
        .chain(events::PAYMENTS_TYPES)
        .chain([events::NOTIFICATION_SENT])
        .find(|known| *known == event_type)
        .unwrap_or("other")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_type_outside_the_catalog_is_one_label() {
        assert_eq!(event_type_label("payment.failed"), "payment.failed");
        assert_eq!(event_type_label("payment.refunded"), "payment.refunded");
        assert_eq!(event_type_label("order.refunded"), "order.refunded");
        assert_eq!(event_type_label("payment.reversed"), "other");
        assert_eq!(event_type_label(&"x".repeat(10_000)), "other");
    }
}
