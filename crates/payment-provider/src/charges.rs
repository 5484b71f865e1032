//! The charges API, in the shape of Stripe's, and the idempotency that makes it safe to
//! call again: every `POST /v1/charges` must carry an `Idempotency-Key`; the first call
//! with a key decides the charge and stores its answer in the same transaction, and every
//! later call with that key gets that answer back (`Idempotent-Replayed: true`) and
//! charges nothing. That is the whole defence a caller has against the charge it cannot
//! roll back: whatever it loses (the answer, its own process), it asks again with the
//! same key.
//!
//! Every error is a JSON body ([`crate::error`]). What the key's wait, claim and replay
//! share with refunds is in [`crate::keyed`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use deadpool_postgres::Pool;
use saga::Transaction;
use saga::idempotency::{Fingerprint, IdempotencyKey};
use saga::transaction::Param;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use time::OffsetDateTime;
use uuid::Uuid;

pub use crate::error::ProviderError;
use crate::faults::{Endpoint, Faults, Kind};
use crate::keyed::{self, Decided};
use crate::sever::Connection;
use crate::stats::{Counted, Stats};

pub const CHARGES: &str = "/v1/charges";
/// The decline code and message of a charge above the limit.
pub const CARD_DECLINED: &str = "card_declined";
pub const AMOUNT_EXCEEDS_LIMIT: &str = "amount exceeds limit";

/// How charges are decided and keys kept.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// Charges above this many cents are declined.
    pub limit_cents: i64,
    /// How long a key is remembered.
    pub key_ttl: Duration,
    /// How long a call waits for an earlier one with the same key before it is answered
    /// 409.
    pub key_wait: Duration,
}

#[derive(Clone)]
pub struct AppState {
    pub pool: Pool,
    pub rules: Rules,
    pub faults: Arc<Faults>,
    pub stats: Arc<Stats>,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route(CHARGES, get(list_charges).post(create_charge))
        .route("/v1/charges/{id}", get(get_charge))
        .with_state(state)
}

/// A charge as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Charge {
    pub id: String,
    pub amount_cents: i64,
    pub currency: String,
    pub reference: String,
    /// `succeeded` or `failed`.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Shown by the reads, not by the charge's own answer: that answer is stored with its
    /// key and replayed as it was, when the charge had no refund.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refunds: Option<Vec<ChargeRefund>>,
}

/// A refund as the charge lists it.
#[derive(Debug, Clone, Serialize)]
pub struct ChargeRefund {
    pub id: String,
    pub amount_cents: i64,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

/// A `POST /v1/charges` body, checked.
#[derive(Debug)]
struct NewCharge {
    amount_cents: i64,
    currency: String,
    reference: String,
}

async fn create_charge(
    State(state): State<AppState>,
    ConnectInfo(connection): ConnectInfo<Connection>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ProviderError> {
    let fault = keyed::draw_fault(&state.faults, &state.stats, Endpoint::Charges).await?;
    let key = keyed::key(&headers)?;
    let body = saga::http::json_body(&headers, &body).map_err(ProviderError::Body)?;
    let fingerprint = Fingerprint::of("POST", CHARGES, &body);
    let request = validate(&body)?;
    let late = keyed::commit_late(fault.as_ref());

    // A card processor finishes what it started when its caller hangs up: hyper drops
    // this handler when the connection closes, so the charge runs in a task of its own,
    // and a charge committed for a caller who left is counted and logged like any other.
    let work = tokio::spawn({
        let (state, key) = (state.clone(), key.clone());
        async move {
            let decided =
                charge(&state.pool, state.rules, &key, fingerprint, &request, late).await?;
            let count = |what| state.stats.count(Endpoint::Charges, what);
            if late.is_some() && !decided.replayed {
                count(Counted::CommittedLate);
            }
            if decided.replayed {
                count(Counted::Replayed);
                tracing::info!(idempotency_key = key.as_str(), charge_id = decided.id.as_deref(), reference = %request.reference, "charge replayed for its idempotency key");
            } else {
                if decided.status == StatusCode::CREATED {
                    count(Counted::Made);
                } else {
                    count(Counted::Declined);
                }
                tracing::info!(idempotency_key = key.as_str(), charge_id = decided.id.as_deref(), reference = %request.reference, amount_cents = request.amount_cents, status = decided.status.as_u16(), "charge decided");
            }
            Ok::<_, ProviderError>(decided)
        }
    });
    let decided = work
        .await
        .map_err(|error| ProviderError::Internal(error.into()))??;
    Ok(keyed::answer(
        &state.stats,
        Endpoint::Charges,
        CHARGES,
        decided,
        fault,
        &connection,
        &key,
    ))
}

// `charge`'s statements, in the order it runs them. The benchmark's `provider` script
// runs these same constants as the provider's part of every order's cost
// (`crates/bench/src/sql/transactions.rs`).

/// The charge's time (the transaction's start), and how long a call waits for another
/// holding its key.
pub const KEY_WAIT: &str = "SELECT now(), set_config('lock_timeout', $1, true)";

/// Claims the key with the answer this call is about to give; takes over an expired one.
/// No row back: the key was claimed before, by a call now committed.
pub const CLAIM_KEY: &str = "
    INSERT INTO idempotency_keys (key, fingerprint, charge_id, response_status, response_body)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (key) DO UPDATE
       SET fingerprint = EXCLUDED.fingerprint, charge_id = EXCLUDED.charge_id,
           response_status = EXCLUDED.response_status,
           response_body = EXCLUDED.response_body, created_at = now()
     WHERE idempotency_keys.created_at <= now() - make_interval(secs => $6)
    RETURNING key";

/// The answer stored with a key claimed before: a replay reads it back.
pub const STORED_ANSWER: &str = "
    SELECT fingerprint, charge_id, response_status, response_body
      FROM idempotency_keys WHERE key = $1";

pub const INSERT_CHARGE: &str = "
    INSERT INTO charges (id, reference, amount_cents, currency, status,
                         failure_code, failure_message, created_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";

/// Decides a charge and stores it with the key and the answer, in one transaction; or
/// finds the answer the key already has. A second call with the same key blocks on the
/// key's insert until the first commits (it then replays its answer) or rolls back (it
/// then decides the charge itself); `key_wait` bounds that wait. `late`, a `commit-late`
/// fault's delay, holds the commit of a charge made ([`keyed::hold`]).
async fn charge(
    pool: &Pool,
    rules: Rules,
    key: &IdempotencyKey,
    fingerprint: Fingerprint,
    request: &NewCharge,
    late: Option<Duration>,
) -> Result<Decided, ProviderError> {
    let client = pool.get().await?;
    // Pipelined, like the saga's handlers: BEGIN goes out with the first statement, and
    // the charge's insert, whose result nothing reads, with COMMIT. Three waits, not five.
    let tx = Transaction::begin(&client);
    let created_at = keyed::wait(&tx, &tx.prepare_cached(KEY_WAIT).await?, rules.key_wait).await?;
    let (charge, status, body) = decide(request, rules.limit_cents, created_at);

    // An expired key is a new request: its row is taken over, not replayed.
    let claimed = keyed::claim(
        &tx,
        &tx.prepare_cached(CLAIM_KEY).await?,
        &[
            &key.as_str(),
            &fingerprint.as_bytes(),
            &charge.id,
            &(status.as_u16() as i16),
            &body,
            &rules.key_ttl.as_secs_f64(),
        ],
    )
    .await?;
    if !claimed {
        let stored = tx.prepare_cached(STORED_ANSWER).await?;
        return keyed::replay(&tx, &stored, key, fingerprint).await;
    }
    tx.pipeline(tx.prepare_cached(INSERT_CHARGE).await?, charge_row(&charge));
    if let Some(delay) = late {
        tracing::info!(idempotency_key = key.as_str(), charge_id = %charge.id, ?delay, "commit held: commit-late fault armed");
        keyed::hold(&tx, delay).await?;
    }
    tx.commit().await?;
    Ok(Decided {
        status,
        id: Some(charge.id),
        body,
        replayed: false,
    })
}

/// The charge `request` makes if its key is new, created at `created_at`: declined over
/// `limit_cents`, and the answer to give for it.
fn decide(
    request: &NewCharge,
    limit_cents: i64,
    created_at: OffsetDateTime,
) -> (Charge, StatusCode, String) {
    let declined = request.amount_cents > limit_cents;
    let charge = Charge {
        id: format!("ch_{}", Uuid::new_v4().simple()),
        amount_cents: request.amount_cents,
        currency: request.currency.clone(),
        reference: request.reference.clone(),
        status: if declined { "failed" } else { "succeeded" }.to_owned(),
        failure_code: declined.then(|| CARD_DECLINED.to_owned()),
        failure_message: declined.then(|| AMOUNT_EXCEEDS_LIMIT.to_owned()),
        created_at,
        refunds: None,
    };
    let (status, body) = if declined {
        (
            StatusCode::PAYMENT_REQUIRED,
            json!({ "error": {
                "code": CARD_DECLINED,
                "message": AMOUNT_EXCEEDS_LIMIT,
                "charge": charge.id,
            }})
            .to_string(),
        )
    } else {
        (
            StatusCode::CREATED,
            serde_json::to_string(&charge).expect("a charge serializes"),
        )
    };
    (charge, status, body)
}

/// The parameters of `charge`'s row.
fn charge_row(charge: &Charge) -> Vec<Param> {
    vec![
        Box::new(charge.id.clone()),
        Box::new(charge.reference.clone()),
        Box::new(charge.amount_cents),
        Box::new(charge.currency.clone()),
        Box::new(charge.status.clone()),
        Box::new(charge.failure_code.clone()),
        Box::new(charge.failure_message.clone()),
        Box::new(charge.created_at),
    ]
}

/// Checks a body field by field, naming the first that is wrong.
fn validate(body: &Value) -> Result<NewCharge, ProviderError> {
    let Some(fields) = body.as_object() else {
        return Err(ProviderError::field("body", "must be a JSON object"));
    };
    if let Some(unknown) = fields
        .keys()
        .find(|k| !["amount_cents", "currency", "reference"].contains(&k.as_str()))
    {
        return Err(ProviderError::field(unknown, "is not a field of a charge"));
    }
    let amount_cents = match fields.get("amount_cents") {
        None => return Err(ProviderError::field("amount_cents", "is required")),
        Some(value) => value.as_i64().filter(|cents| *cents >= 1).ok_or_else(|| {
            ProviderError::field("amount_cents", "must be an integer of at least 1")
        })?,
    };
    let text = |name: &str| -> Result<String, ProviderError> {
        match fields.get(name) {
            None => Err(ProviderError::field(name, "is required")),
            Some(Value::String(text)) => Ok(text.clone()),
            Some(_) => Err(ProviderError::field(name, "must be a string")),
        }
    };
    let currency = text("currency")?;
    if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_lowercase()) {
        return Err(ProviderError::field(
            "currency",
            "must be a three-letter ISO code in lower case, such as \"usd\"",
        ));
    }
    let reference = text("reference")?;
    if reference.is_empty() || reference.len() > 255 {
        return Err(ProviderError::field(
            "reference",
            "must be 1 to 255 characters",
        ));
    }
    Ok(NewCharge {
        amount_cents,
        currency,
        reference,
    })
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    reference: Option<String>,
}

/// The most charges one list answers with, newest last.
const LIST_LIMIT: i64 = 100;

/// The charges made for one reference (or the latest ones), oldest first.
pub const LIST_CHARGES: &str = "
    SELECT * FROM (
        SELECT * FROM charges WHERE $1::text IS NULL OR reference = $1
         ORDER BY created_at DESC, id LIMIT $2
    ) latest ORDER BY created_at, id";

/// `LIST_CHARGES` under a `list-lag` fault: without the charges younger than `$3`
/// seconds, by the database's clock, which stamped them.
pub const LIST_CHARGES_LAGGING: &str = "
    SELECT * FROM (
        SELECT * FROM charges WHERE ($1::text IS NULL OR reference = $1)
           AND created_at <= now() - make_interval(secs => $3)
         ORDER BY created_at DESC, id LIMIT $2
    ) latest ORDER BY created_at, id";

/// `GET /v1/charges?reference=<order id>`: the charges made for one reference (or the
/// latest ones), oldest first, so a person can count them, each with its refunds. Under
/// a `list-lag` fault, the charges younger than its lag are left out.
async fn list_charges(
    State(state): State<AppState>,
    Query(query): Query<ListQuery>,
) -> Result<axum::Json<Value>, ProviderError> {
    state.stats.count(Endpoint::List, Counted::Call);
    let lag = match state.faults.draw(Endpoint::List) {
        Some(Kind::ListLag(lag)) => Some(lag),
        _ => None,
    };
    let client = state.pool.get().await?;
    let rows = match lag {
        None => {
            client
                .query(LIST_CHARGES, &[&query.reference, &LIST_LIMIT])
                .await?
        }
        Some(lag) => {
            state.stats.count(Endpoint::List, Counted::Lagged);
            tracing::info!(
                reference = query.reference.as_deref(),
                ?lag,
                "list lagged: list-lag fault armed"
            );
            client
                .query(
                    LIST_CHARGES_LAGGING,
                    &[&query.reference, &LIST_LIMIT, &lag.as_secs_f64()],
                )
                .await?
        }
    };
    let data = with_refunds(&client, rows.iter().map(charge_from_row).collect()).await?;
    Ok(axum::Json(json!({ "object": "list", "data": data })))
}

pub const FIND_CHARGE: &str = "SELECT * FROM charges WHERE id = $1";

async fn get_charge(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<axum::Json<Charge>, ProviderError> {
    let client = state.pool.get().await?;
    let row = client
        .query_opt(FIND_CHARGE, &[&id])
        .await?
        .ok_or(ProviderError::NotFound(id))?;
    let mut shown = with_refunds(&client, vec![charge_from_row(&row)]).await?;
    Ok(axum::Json(shown.remove(0)))
}

/// The refunds of any of the charges, oldest first.
pub const REFUNDS_OF: &str = "
    SELECT id, charge_id, amount_cents, created_at FROM refunds
     WHERE charge_id = ANY ($1) ORDER BY created_at, id";

/// `charges` with their refunds, read in one statement for the whole list.
async fn with_refunds(
    client: &deadpool_postgres::Client,
    mut charges: Vec<Charge>,
) -> Result<Vec<Charge>, ProviderError> {
    let ids: Vec<&str> = charges.iter().map(|charge| charge.id.as_str()).collect();
    let mut refunds: HashMap<String, Vec<ChargeRefund>> = HashMap::new();
    for row in client.query(REFUNDS_OF, &[&ids]).await? {
        refunds
            .entry(row.get("charge_id"))
            .or_default()
            .push(ChargeRefund {
                id: row.get("id"),
                amount_cents: row.get("amount_cents"),
                created_at: row.get("created_at"),
            });
    }
    for charge in &mut charges {
        charge.refunds = Some(refunds.remove(&charge.id).unwrap_or_default());
    }
    Ok(charges)
}

fn charge_from_row(row: &tokio_postgres::Row) -> Charge {
    Charge {
        id: row.get("id"),
        amount_cents: row.get("amount_cents"),
        currency: row.get("currency"),
        reference: row.get("reference"),
        status: row.get("status"),
        failure_code: row.get("failure_code"),
        failure_message: row.get("failure_message"),
        created_at: row.get("created_at"),
        refunds: None,
    }
}
