//! What the keyed `POST`s, charges and refunds, share: the key read from the request,
//! the faults drawn around the call, and the key's wait, claim and replay in the call's
//! transaction. Each statement stays a constant beside the endpoint that runs it, which
//! prepares it and hands it here: the benchmark reads the charge's statements in
//! `charges.rs`, in the order `charge` runs them.

use std::time::Duration;

use axum::http::header::LOCATION;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use saga::Transaction;
use saga::idempotency::{self, Fingerprint, IdempotencyKey};
use time::OffsetDateTime;
use tokio_postgres::Statement;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use crate::error::ProviderError;
use crate::faults::{Endpoint, Faults, Kind};
use crate::sever::Connection;
use crate::stats::{Counted, Stats};

/// The answer a key's first call decided, or its replay.
pub struct Decided {
    pub status: StatusCode,
    /// The charge or the refund the answer is about: its `Location`. None for a refund
    /// refused by a `refuse` fault, which made nothing to point at.
    pub id: Option<String>,
    pub body: String,
    pub replayed: bool,
}

/// The request's key, which every keyed `POST` must carry.
pub fn key(headers: &HeaderMap) -> Result<IdempotencyKey, ProviderError> {
    IdempotencyKey::from_headers(headers)
        .map_err(ProviderError::InvalidIdempotencyKey)?
        .ok_or(ProviderError::IdempotencyKeyMissing)
}

/// Counts the call and draws `endpoint`'s fault for it: `unavailable` refuses it here,
/// `slow` delays it here; `commit-late` is returned, for the work to [`hold`] its
/// commit, `refuse`, for a refund to refuse, and `lose-response`, for [`answer`] to
/// apply once the work is committed.
pub async fn draw_fault(
    faults: &Faults,
    stats: &Stats,
    endpoint: Endpoint,
) -> Result<Option<Kind>, ProviderError> {
    stats.count(endpoint, Counted::Call);
    let fault = faults.draw(endpoint);
    match &fault {
        Some(Kind::Unavailable) => {
            stats.count(endpoint, Counted::Unavailable);
            tracing::info!(
                endpoint = endpoint.name(),
                "call refused: unavailable fault armed"
            );
            return Err(ProviderError::Unavailable("a fault is armed".into()));
        }
        Some(Kind::Slow(delay)) => {
            stats.count(endpoint, Counted::Slowed);
            tracing::info!(
                endpoint = endpoint.name(),
                ?delay,
                "call slowed: slow fault armed"
            );
            tokio::time::sleep(*delay).await;
        }
        // `list-lag` is armed on the list alone, which draws its own.
        Some(Kind::LoseResponse | Kind::CommitLate(_) | Kind::Refuse(_) | Kind::ListLag(_))
        | None => {}
    }
    Ok(fault)
}

/// How long a drawn `commit-late` fault holds the commit, if one was drawn.
pub fn commit_late(fault: Option<&Kind>) -> Option<Duration> {
    match fault {
        Some(Kind::CommitLate(delay)) => Some(*delay),
        _ => None,
    }
}

/// What a `commit-late` fault does between the work and its commit: sends the writes
/// queued on `tx` and waits for them, so the transaction holds its rows and its locks
/// (the key's claim, a refund's charge) and any error of theirs is known now; then keeps
/// the transaction open, uncommitted, for `delay`. Meanwhile no read sees what it wrote,
/// and a call with the same key queues on the claim.
pub async fn hold(tx: &Transaction<'_>, delay: Duration) -> Result<(), tokio_postgres::Error> {
    // A statement waited for sends the queued writes ahead of it. It also lets this
    // transaction stay idle past the pool's bound (`saga::db::pool`), for this once:
    // the server would otherwise end it, and the late commit would never come.
    let idle = format!("{}ms", (delay + saga::lease::DEFAULT_LEASE).as_millis());
    tx.query_one(
        "SELECT set_config('idle_in_transaction_session_timeout', $1, true)",
        &[&idle],
    )
    .await?;
    tokio::time::sleep(delay).await;
    Ok(())
}

/// The answer to `decided`, at `{path}/{id}` (nowhere for a refusal, which made nothing):
/// the first one, or its replay; under a `lose-response` fault, none at all, the
/// connection cut after the commit.
pub fn answer(
    stats: &Stats,
    endpoint: Endpoint,
    path: &str,
    decided: Decided,
    fault: Option<Kind>,
    connection: &Connection,
    key: &IdempotencyKey,
) -> Response {
    let id = decided.id.as_deref().unwrap_or_default();
    let location = format!("{path}/{id}");
    if matches!(fault, Some(Kind::LoseResponse)) {
        stats.count(endpoint, Counted::LostResponse);
        tracing::info!(
            endpoint = endpoint.name(),
            idempotency_key = key.as_str(),
            id,
            "answer dropped: lose-response fault armed; the connection is cut"
        );
        connection.sever();
    }
    let mut response = if decided.replayed {
        idempotency::replay(decided.status, &location, decided.body)
    } else {
        idempotency::response(decided.status, &location, decided.body)
    };
    if decided.id.is_none() {
        response.headers_mut().remove(LOCATION);
    }
    response
}

/// Runs `statement`, the key's wait (`charges::KEY_WAIT`): the call's time, the
/// transaction's start, known before anything is written; and how long the call waits
/// for another holding its key.
pub async fn wait(
    tx: &Transaction<'_>,
    statement: &Statement,
    key_wait: Duration,
) -> Result<OffsetDateTime, ProviderError> {
    // Zero would mean no bound, so the shortest wait is a millisecond.
    let wait = format!("{}ms", key_wait.as_millis().max(1));
    Ok(tx.query_one(statement, &[&wait]).await?.get(0))
}

/// Runs `statement`, a claim of the key with the answer the call is about to give: true
/// if this call now holds the key, false if a call now committed claimed it first (the
/// answer is then [`replay`]ed). A second call with the key blocks on the claim until
/// the first commits or rolls back; past the wait it is answered 409.
pub async fn claim(
    tx: &Transaction<'_>,
    statement: &Statement,
    params: &[&(dyn ToSql + Sync)],
) -> Result<bool, ProviderError> {
    let claimed = tx
        .query_opt(statement, params)
        .await
        .map_err(|error| match error.code() {
            Some(&SqlState::LOCK_NOT_AVAILABLE) => ProviderError::IdempotencyKeyInUse,
            _ => error.into(),
        })?;
    Ok(claimed.is_some())
}

/// Runs `statement`, the read of the answer stored with `key` (its columns: the
/// fingerprint, the id of what the answer is about or NULL for a refusal, the status,
/// the body), claimed by an earlier call: replayed if that call was this one, refused if
/// it was another.
pub async fn replay(
    tx: &Transaction<'_>,
    statement: &Statement,
    key: &IdempotencyKey,
    fingerprint: Fingerprint,
) -> Result<Decided, ProviderError> {
    let stored = tx
        .query_opt(statement, &[&key.as_str()])
        .await?
        // Deleted since the claim saw it: expired and pruned; the caller retries.
        .ok_or(ProviderError::IdempotencyKeyInUse)?;
    if stored.get::<_, &[u8]>(0) != fingerprint.as_bytes() {
        return Err(ProviderError::IdempotencyKeyReused);
    }
    let status = stored.get::<_, i16>(2) as u16;
    Ok(Decided {
        status: StatusCode::from_u16(status).map_err(|error| {
            ProviderError::Internal(anyhow::anyhow!("stored status {status}: {error}"))
        })?,
        id: stored.get(1),
        body: stored.get(3),
        replayed: true,
    })
}
