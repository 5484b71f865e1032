//! The refunds API, in the shape of Stripe's: `POST /v1/refunds` gives a charge's money
//! back, in full or in part, once. Keyed as charges are (the same rules, the same
//! errors, [`crate::keyed`]): the first call with a key makes the refund and stores its
//! answer in the same transaction; every later call with the key gets that answer back.
//!
//! The key guards one caller's retries; the charge guards everyone's: a charge has at
//! most one refund (`refunds.charge_id` is UNIQUE), so a refund asked for under a second
//! key (the first one expired, or lost) is refused with `400 charge_already_refunded`,
//! and the charge lists the refund that was made.
//!
//! Under a `refuse` fault ([`crate::faults`]) a refund is refused, `400` with the fault's
//! code: no refund is made, and the refusal is stored with the key as a refund made would
//! be (the key's row names the charge and no refund), so the key's replays refuse too.

use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use deadpool_postgres::Pool;
use saga::Transaction;
use saga::idempotency::{Fingerprint, IdempotencyKey};
use serde::Serialize;
use serde_json::{Value, json};
use time::OffsetDateTime;
use tokio_postgres::error::SqlState;
use uuid::Uuid;

use crate::charges::{AppState, KEY_WAIT, Rules};
use crate::error::ProviderError;
use crate::faults::{Endpoint, Kind};
use crate::keyed::{self, Decided};
use crate::sever::Connection;
use crate::stats::Counted;

pub const REFUNDS: &str = "/v1/refunds";

pub fn router(state: AppState) -> Router {
    Router::new()
        .route(REFUNDS, post(create_refund))
        .route("/v1/refunds/{id}", get(get_refund))
        .with_state(state)
}

/// A refund as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Refund {
    pub id: String,
    pub charge_id: String,
    pub amount_cents: i64,
    /// The charge's: a refund gives back what was taken, in the money it was taken in.
    pub currency: String,
    /// Always `succeeded`: a refund that cannot be made is an error, and no refund is kept
    /// of it.
    pub status: String,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

/// A `POST /v1/refunds` body, checked.
#[derive(Debug)]
struct NewRefund {
    charge_id: String,
    amount_cents: i64,
}

async fn create_refund(
    State(state): State<AppState>,
    ConnectInfo(connection): ConnectInfo<Connection>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ProviderError> {
    let fault = keyed::draw_fault(&state.faults, &state.stats, Endpoint::Refunds).await?;
    let key = keyed::key(&headers)?;
    let body = saga::http::json_body(&headers, &body).map_err(ProviderError::Body)?;
    let fingerprint = Fingerprint::of("POST", REFUNDS, &body);
    let request = validate(&body)?;

    // Finished when the caller hangs up, as a charge is (`charges::create_charge`).
    let work = tokio::spawn({
        let (state, key, drawn) = (state.clone(), key.clone(), fault.clone());
        async move {
            let decided = refund(
                &state.pool,
                state.rules,
                &key,
                fingerprint,
                &request,
                drawn.as_ref(),
            )
            .await?;
            let count = |what| state.stats.count(Endpoint::Refunds, what);
            if keyed::commit_late(drawn.as_ref()).is_some() && !decided.replayed {
                count(Counted::CommittedLate);
            }
            if decided.replayed {
                count(Counted::Replayed);
                tracing::info!(idempotency_key = key.as_str(), refund_id = decided.id.as_deref(), charge_id = %request.charge_id, status = decided.status.as_u16(), "refund replayed for its idempotency key");
            } else if decided.status == StatusCode::CREATED {
                count(Counted::Made);
                tracing::info!(idempotency_key = key.as_str(), refund_id = decided.id.as_deref(), charge_id = %request.charge_id, amount_cents = request.amount_cents, "refund made");
            } else {
                count(Counted::Refused);
                tracing::info!(idempotency_key = key.as_str(), charge_id = %request.charge_id, body = %decided.body, "refund refused: refuse fault armed");
            }
            Ok::<_, ProviderError>(decided)
        }
    });
    let decided = work
        .await
        .map_err(|error| ProviderError::Internal(error.into()))??;
    Ok(keyed::answer(
        &state.stats,
        Endpoint::Refunds,
        REFUNDS,
        decided,
        fault,
        &connection,
        &key,
    ))
}

// `refund`'s statements, in the order it runs them, after `charges::KEY_WAIT`.

/// What the refund's answer and checks need of the charge. Read before the key is
/// claimed, without a lock: a charge row is never changed, so this is what the lock
/// below will find, and the answer stored with the claim can carry the charge's
/// currency.
pub const CHARGE_TO_REFUND: &str = "
    SELECT amount_cents, currency, status FROM charges WHERE id = $1";

/// Claims the key with the answer this call is about to give, naming the charge and the
/// refund (none, for a refusal); takes over an expired one. No row back: the key was claimed before, by a call
/// now committed.
pub const CLAIM_REFUND_KEY: &str = "
    INSERT INTO idempotency_keys
           (key, fingerprint, charge_id, refund_id, response_status, response_body)
    VALUES ($1, $2, $3, $4, $5, $6)
    ON CONFLICT (key) DO UPDATE
       SET fingerprint = EXCLUDED.fingerprint, charge_id = EXCLUDED.charge_id,
           refund_id = EXCLUDED.refund_id, response_status = EXCLUDED.response_status,
           response_body = EXCLUDED.response_body, created_at = now()
     WHERE idempotency_keys.created_at <= now() - make_interval(secs => $7)
    RETURNING key";

/// The answer stored with a key claimed before: a replay reads it back.
pub const STORED_REFUND_ANSWER: &str = "
    SELECT fingerprint, refund_id, response_status, response_body
      FROM idempotency_keys WHERE key = $1";

/// The charge's lock: refunds of one charge take turns. A refund under another key
/// waits here for the first to commit, then its insert meets the refund made.
pub const LOCK_CHARGE: &str = "SELECT id FROM charges WHERE id = $1 FOR UPDATE";

/// Refused by `refunds_charge_id_key` when the charge has its refund already.
pub const INSERT_REFUND: &str = "
    INSERT INTO refunds (id, charge_id, amount_cents, created_at) VALUES ($1, $2, $3, $4)";

/// The constraint that keeps a charge to one refund.
const ONE_REFUND_PER_CHARGE: &str = "refunds_charge_id_key";

/// Makes a refund and stores it with the key and the answer, in one transaction; or
/// finds the answer the key already has. The key is the first lock taken, so two calls
/// with one key queue on it (the second replays the first's answer), and the charge's
/// lock the second, so refunds of one charge under two keys queue on it (the second is
/// refused). The `fault` drawn for the call: `commit-late` holds the commit of a refund
/// made ([`commit_refund`]); `refuse` makes the answer a refusal, stored with the key in
/// place of a refund, and the charge is neither locked nor refunded.
async fn refund(
    pool: &Pool,
    rules: Rules,
    key: &IdempotencyKey,
    fingerprint: Fingerprint,
    request: &NewRefund,
    fault: Option<&Kind>,
) -> Result<Decided, ProviderError> {
    let client = pool.get().await?;
    let tx = Transaction::begin(&client);
    let created_at = keyed::wait(&tx, &tx.prepare_cached(KEY_WAIT).await?, rules.key_wait).await?;
    let charge = tx
        .query_opt(
            &tx.prepare_cached(CHARGE_TO_REFUND).await?,
            &[&request.charge_id],
        )
        .await?
        .ok_or_else(|| ProviderError::NotFound(request.charge_id.clone()))?;
    let refund = decide(request, &charge, created_at)?;
    let (status, body, refund_id) = match fault {
        Some(Kind::Refuse(code)) => (
            StatusCode::BAD_REQUEST,
            refusal(code, &refund.charge_id),
            None,
        ),
        _ => (
            StatusCode::CREATED,
            serde_json::to_string(&refund).expect("a refund serializes"),
            Some(refund.id.as_str()),
        ),
    };

    let claimed = keyed::claim(
        &tx,
        &tx.prepare_cached(CLAIM_REFUND_KEY).await?,
        &[
            &key.as_str(),
            &fingerprint.as_bytes(),
            &refund.charge_id,
            &refund_id,
            &(status.as_u16() as i16),
            &body,
            &rules.key_ttl.as_secs_f64(),
        ],
    )
    .await?;
    if !claimed {
        let stored = tx.prepare_cached(STORED_REFUND_ANSWER).await?;
        return keyed::replay(&tx, &stored, key, fingerprint).await;
    }
    if refund_id.is_none() {
        // Refused: the key and its answer are all there is to commit.
        tx.commit().await?;
        return Ok(Decided {
            status,
            id: None,
            body,
            replayed: false,
        });
    }
    commit_refund(tx, &refund, key, keyed::commit_late(fault)).await?;
    Ok(Decided {
        status,
        id: Some(refund.id),
        body,
        replayed: false,
    })
}

/// Locks the charge, inserts `refund` and commits; `late`, a `commit-late` fault's delay,
/// holds the commit with both locks taken ([`keyed::hold`]).
async fn commit_refund(
    tx: Transaction<'_>,
    refund: &Refund,
    key: &IdempotencyKey,
    late: Option<Duration>,
) -> Result<(), ProviderError> {
    // Neither answer is read: both go out with COMMIT, and their errors come back there.
    tx.pipeline(
        tx.prepare_cached(LOCK_CHARGE).await?,
        vec![Box::new(refund.charge_id.clone())],
    );
    tx.pipeline(
        tx.prepare_cached(INSERT_REFUND).await?,
        vec![
            Box::new(refund.id.clone()),
            Box::new(refund.charge_id.clone()),
            Box::new(refund.amount_cents),
            Box::new(refund.created_at),
        ],
    );
    let failed = |error: tokio_postgres::Error| {
        let constraint = error.as_db_error().and_then(|db| db.constraint());
        match error.code() {
            Some(&SqlState::UNIQUE_VIOLATION) if constraint == Some(ONE_REFUND_PER_CHARGE) => {
                ProviderError::ChargeAlreadyRefunded(refund.charge_id.clone())
            }
            Some(&SqlState::LOCK_NOT_AVAILABLE) => ProviderError::ChargeInUse,
            _ => error.into(),
        }
    };
    if let Some(delay) = late {
        tracing::info!(idempotency_key = key.as_str(), refund_id = %refund.id, ?delay, "commit held: commit-late fault armed");
        // The writes' errors come back here rather than at the commit.
        keyed::hold(&tx, delay).await.map_err(failed)?;
    }
    tx.commit().await.map_err(failed)
}

/// The refund `request` makes of `charge` (its `CHARGE_TO_REFUND` row) if its key is
/// new, or why it cannot be made.
fn decide(
    request: &NewRefund,
    charge: &tokio_postgres::Row,
    created_at: OffsetDateTime,
) -> Result<Refund, ProviderError> {
    if charge.get::<_, &str>("status") != "succeeded" {
        return Err(ProviderError::ChargeNotRefundable(
            request.charge_id.clone(),
        ));
    }
    let charged: i64 = charge.get("amount_cents");
    if request.amount_cents > charged {
        return Err(ProviderError::field(
            "amount_cents",
            format!("must not exceed the charge's amount, {charged}"),
        ));
    }
    Ok(Refund {
        id: format!("re_{}", Uuid::new_v4().simple()),
        charge_id: request.charge_id.clone(),
        amount_cents: request.amount_cents,
        currency: charge.get("currency"),
        status: "succeeded".to_owned(),
        created_at,
    })
}

/// The body of a refund refused with `code` by a `refuse` fault: the API's error, with
/// the charge it was asked of.
fn refusal(code: &str, charge_id: &str) -> String {
    json!({ "error": {
        "code": code,
        "message": format!(
            "the refund of charge {charge_id} was refused; this Idempotency-Key keeps \
             the refusal, so another attempt needs a new key"
        ),
        "charge": charge_id,
    }})
    .to_string()
}

/// Checks a body field by field, naming the first that is wrong, as a charge's is.
fn validate(body: &Value) -> Result<NewRefund, ProviderError> {
    let Some(fields) = body.as_object() else {
        return Err(ProviderError::field("body", "must be a JSON object"));
    };
    if let Some(unknown) = fields
        .keys()
        .find(|k| !["charge_id", "amount_cents"].contains(&k.as_str()))
    {
        return Err(ProviderError::field(unknown, "is not a field of a refund"));
    }
    let charge_id = match fields.get("charge_id") {
        None => return Err(ProviderError::field("charge_id", "is required")),
        Some(Value::String(id)) if !id.is_empty() && id.len() <= 255 => id.clone(),
        Some(_) => {
            return Err(ProviderError::field(
                "charge_id",
                "must be a charge's id, such as \"ch_…\"",
            ));
        }
    };
    let amount_cents = match fields.get("amount_cents") {
        None => return Err(ProviderError::field("amount_cents", "is required")),
        Some(value) => value.as_i64().filter(|cents| *cents >= 1).ok_or_else(|| {
            ProviderError::field("amount_cents", "must be an integer of at least 1")
        })?,
    };
    Ok(NewRefund {
        charge_id,
        amount_cents,
    })
}

pub const FIND_REFUND: &str = "
    SELECT r.id, r.charge_id, r.amount_cents, c.currency, r.created_at
      FROM refunds r JOIN charges c ON c.id = r.charge_id
     WHERE r.id = $1";

async fn get_refund(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<axum::Json<Refund>, ProviderError> {
    let client = state.pool.get().await?;
    let row = client
        .query_opt(FIND_REFUND, &[&id])
        .await?
        .ok_or(ProviderError::RefundNotFound(id))?;
    Ok(axum::Json(Refund {
        id: row.get("id"),
        charge_id: row.get("charge_id"),
        amount_cents: row.get("amount_cents"),
        currency: row.get("currency"),
        status: "succeeded".to_owned(),
        created_at: row.get("created_at"),
    }))
}
