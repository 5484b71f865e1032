//! The payments not at rest, watched: how many charges and refunds are undecided, refused
//! or left to a person, and how long the oldest of each has been so
//! ([`saga::metrics::PAYMENTS_UNSETTLED`]). An undecided charge is resolved by its own
//! key's answer, and the provider forgets a key after `PROVIDER_KEY_TTL`: one still
//! undecided at half that is escalated, in the log here and by the shipped alert rule
//! (`deploy/prometheus/rules.yml`), while its key can still answer.

use std::time::Duration;

use ::metrics::gauge;
use deadpool_postgres::Pool;
use saga::LocalRelay;
use saga::metrics::{self, PAYMENTS_UNSETTLED, PAYMENTS_UNSETTLED_OLDEST_AGE, shared_gauge};
use tokio_util::sync::CancellationToken;

/// How often the payments not at rest are counted: an index-only look at a handful of
/// rows (`payments_unsettled`), a few times a minute.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(15);

/// Every state [`UNSETTLED`] names, so that each has a series from the start, at 0.
pub const STATES: [&str; 4] = [
    "charge_unknown",
    "refund_unknown",
    "refund_failed",
    "refund_manual",
];

/// The payments not at rest by state: how many, and the oldest's age in seconds.
pub const UNSETTLED: &str = "
    SELECT state, count(*), extract(epoch FROM now() - min(updated_at))::float8
      FROM (SELECT CASE
                     -- A charge left to a person is decided as far as the saga can.
                     WHEN refund_status = 'manual' THEN 'refund_manual'
                     WHEN refund_status = 'failed' THEN 'refund_failed'
                     WHEN status IN ('charging', 'unknown') THEN 'charge_unknown'
                     ELSE 'refund_unknown'
                   END AS state, updated_at
              FROM payments
             WHERE status IN ('charging', 'unknown')
                OR refund_status IN ('refunding', 'unknown', 'failed', 'manual')) unsettled
     GROUP BY state";

/// Counts the payments not at rest every [`WATCH_INTERVAL`] until `shutdown`, reported by
/// the copy whose relay publishes the outbox; warns of an undecided one past half of
/// `key_ttl`.
pub async fn watch(
    pool: Pool,
    relay: LocalRelay,
    key_ttl: Duration,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    gauge!(metrics::PROVIDER_KEY_TTL).set(key_ttl.as_secs_f64());
    let mut ticks = tokio::time::interval(WATCH_INTERVAL);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            _ = ticks.tick() => {}
        }
        if let Err(error) = count(&pool, &relay, key_ttl).await {
            tracing::warn!(error = %format!("{error:#}"), "counting the payments not at rest failed; next time");
        }
    }
}

async fn count(pool: &Pool, relay: &LocalRelay, key_ttl: Duration) -> anyhow::Result<()> {
    let client = pool.get().await?;
    let rows = client
        .query(&client.prepare_cached(UNSETTLED).await?, &[])
        .await?;
    for state in STATES {
        let row = rows.iter().find(|row| row.get::<_, &str>(0) == state);
        let (n, oldest) = row.map_or((0, 0.0), |row| (row.get::<_, i64>(1), row.get::<_, f64>(2)));
        gauge!(PAYMENTS_UNSETTLED, "state" => state).set(shared_gauge(relay, n as f64));
        gauge!(PAYMENTS_UNSETTLED_OLDEST_AGE, "state" => state).set(shared_gauge(relay, oldest));
        let escalated = state.ends_with("unknown") && oldest > key_ttl.as_secs_f64() / 2.0;
        if escalated && relay.is_active() {
            tracing::warn!(state, payments = n, oldest_seconds = oldest, key_ttl = ?key_ttl,
                "a charge or refund has had no answer for half the provider's key lifetime: a person should look (sagactl orders --unsettled)");
        }
    }
    Ok(())
}
