//! An order's payment, the one row that says what was asked of the provider for the order
//! and what came of it: the **intent** before each call, and its ending after.
//!
//! Every call that can move money (a charge, a refund) is preceded by a committed write
//! that names it and its idempotency key: the charge's intent is the payment row itself,
//! inserted `charging`; the refund's is `refund_status = 'refunding'`. So whatever stops
//! a caller after its call (a crash, a lost answer, a revoked partition, a record that
//! never reaches its transaction), a row here knows of every charge and refund that may
//! stand at the provider, with the key that finds it again.
//!
//! A call that got no answer (a timeout, a cut connection, a `5xx`, the key still running)
//! leaves its attempt `unknown` ([`MARK_CHARGE_UNKNOWN`], [`MARK_REFUND_UNKNOWN`]): the
//! money may or may not have moved. It leaves that state only through an answer to the
//! same request under the same key, which the provider gives from the key's stored
//! answer, never because a list of the order's charges came back without it: such a list
//! is not read-after-write, and a charge still committing at the provider is not in it.

use std::time::Duration;

use deadpool_postgres::{Client, Pool};
use saga::events::{self, PaymentResult};
use saga::outbox::{self, NewEvent};
use saga::{HandlerError, Topics, Transaction};
use uuid::Uuid;

use crate::provider::Answer;

/// The orders' prices are in US cents.
pub const CURRENCY: &str = "usd";

/// The idempotency key of an order's charge. Derived from the order, which is also the id
/// of every `order.created` order-service writes (`<order.created id>:charge`): so the
/// same key for every call about the order, and a hand-made `order.created` with another
/// id for it, racing the first, gets the first charge back instead of a second one.
pub fn charge_key(order_id: Uuid) -> String {
    format!("{order_id}:charge")
}

/// The idempotency key of an order's refund attempt `attempt`: `<order id>:refund` for
/// the cancellation's own, which is also the id of its `payment.refunded` (one per
/// order); `<order id>:refund:<n>` for an operator's n-th. A refused refund's key keeps
/// its refusal at the provider, so a retry needs a key of its own.
pub fn refund_key(order_id: Uuid, attempt: i32) -> String {
    if attempt <= 1 {
        events::refund_id(order_id)
    } else {
        format!("{}:{attempt}", events::refund_id(order_id))
    }
}

/// Where an order's charge stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChargeState {
    /// Its intent is committed and its call about to be made, or under way.
    Charging,
    /// Its call got no answer: it may or may not have been made.
    Unknown,
    Succeeded,
    Failed,
    /// The tombstone of an order cancelled before any charge was asked for.
    Voided,
}

impl ChargeState {
    pub fn parse(status: &str) -> Self {
        match status {
            "charging" => ChargeState::Charging,
            "unknown" => ChargeState::Unknown,
            "succeeded" => ChargeState::Succeeded,
            "failed" => ChargeState::Failed,
            "voided" => ChargeState::Voided,
            other => unreachable!("payments_status_check allows no status {other:?}"),
        }
    }

    /// Whether the charge is not decided yet: asked for, or about to be, with no answer.
    pub fn undecided(self) -> bool {
        matches!(self, ChargeState::Charging | ChargeState::Unknown)
    }
}

/// An order's payment, as a cancellation or an operator's retry reads it.
#[derive(Debug, Clone)]
pub struct Payment {
    pub order_id: Uuid,
    /// The `order.created` whose intent it is: its result's id derives from it.
    pub event_id: String,
    pub state: ChargeState,
    pub amount_cents: i64,
    pub charge_id: Option<String>,
    /// `None` on payments recorded before intents were.
    pub charge_key: Option<String>,
    /// `refunding`, `unknown`, `refunded`, `failed` or `manual`; `None` before any.
    pub refund_status: Option<String>,
    pub refund_key: Option<String>,
    pub refund_attempt: i32,
    pub refund_id: Option<String>,
    /// Why its refund failed, while it is `failed` or `manual`.
    pub refund_reason: Option<String>,
    /// Whether its order's cancellation was answered.
    pub answered: bool,
    /// How long ago the payment was written: for an undecided charge, how long ago its
    /// intent named its key.
    pub age: Duration,
}

/// The columns [`Payment::from_row`] reads.
pub const PAYMENT_COLUMNS: &str = "order_id, event_id, status, amount_cents, charge_id, \
     charge_key, refund_status, refund_key, refund_attempt, refund_id, refund_reason, \
     answered_at IS NOT NULL AS answered, \
     greatest(extract(epoch FROM now() - created_at), 0)::float8 AS age";

fn select_payment(lock: &str) -> String {
    format!("SELECT {PAYMENT_COLUMNS} FROM payments WHERE order_id = $1{lock}")
}

impl Payment {
    pub fn from_row(row: &tokio_postgres::Row) -> Self {
        Self {
            order_id: row.get("order_id"),
            event_id: row.get("event_id"),
            state: ChargeState::parse(row.get("status")),
            amount_cents: row.get("amount_cents"),
            charge_id: row.get("charge_id"),
            charge_key: row.get("charge_key"),
            refund_status: row.get("refund_status"),
            refund_key: row.get("refund_key"),
            refund_attempt: row.get("refund_attempt"),
            refund_id: row.get("refund_id"),
            refund_reason: row.get("refund_reason"),
            answered: row.get("answered"),
            age: Duration::from_secs_f64(row.get("age")),
        }
    }

    /// The order's payment, if it has one, as committed.
    pub async fn find(client: &Client, order_id: Uuid) -> Result<Option<Self>, HandlerError> {
        let row = client
            .query_opt(
                &client.prepare_cached(&select_payment("")).await?,
                &[&order_id],
            )
            .await?;
        Ok(row.as_ref().map(Self::from_row))
    }

    /// Guard 2: the order's payment, locked (`FOR UPDATE`) in `tx` as it decides on it.
    pub async fn lock(tx: &Transaction<'_>, order_id: Uuid) -> Result<Option<Self>, HandlerError> {
        let row = tx
            .query_opt(
                &tx.prepare_cached(&select_payment(" FOR UPDATE")).await?,
                &[&order_id],
            )
            .await?;
        Ok(row.as_ref().map(Self::from_row))
    }

    /// Whether its undecided charge may still be asked for again under its key: the
    /// provider keeps a key `key_ttl`, and past it the same request could charge again.
    pub fn key_alive(&self, key_ttl: Duration) -> bool {
        self.age < key_ttl
    }

    /// The key its charge was asked for under, or is to be asked again under.
    pub fn charge_key(&self) -> String {
        self.charge_key
            .clone()
            .unwrap_or_else(|| charge_key(self.order_id))
    }
}

/// A charge asked for, and no answer came: the attempt is `unknown` until the same key
/// answers. Autocommitted, outside any transaction, as the intent was. `updated_at`
/// stays when the intent was written: how long the attempt has gone undecided, however
/// often it is asked again, is what the key's lifetime is measured against.
pub const MARK_CHARGE_UNKNOWN: &str = "
    UPDATE payments SET status = 'unknown'
     WHERE order_id = $1 AND status IN ('charging', 'unknown')";

/// A refund asked for, and no answer came; `updated_at` stays its intent's.
pub const MARK_REFUND_UNKNOWN: &str = "
    UPDATE payments SET refund_status = 'unknown'
     WHERE order_id = $1 AND refund_status IN ('refunding', 'unknown')";

/// Marks the order's charge (or refund, by `sql`) `unknown` after a call that got no
/// answer, and hands the call's error back to be retried. A failure to mark it is logged,
/// not raised: the intent already says the call may have happened. The connection is
/// taken only now: none is held while the provider is waited for.
pub async fn unanswered(
    pool: &Pool,
    order_id: Uuid,
    sql: &str,
    error: HandlerError,
) -> HandlerError {
    let marked = async {
        let client = pool.get().await?;
        client
            .execute(&client.prepare_cached(sql).await?, &[&order_id])
            .await?;
        Ok::<_, HandlerError>(())
    };
    if let Err(mark) = marked.await {
        tracing::warn!(%order_id, error = %mark, "could not mark the attempt unknown");
    }
    error
}

/// The charge's answer, recorded over its intent: guard 2 and the state change in one
/// statement. The update locks the row and, if another transaction decided it meanwhile,
/// reads it again and updates nothing.
pub const RECORD_CHARGE: &str = "
    UPDATE payments SET status = $2, charge_id = $3, reason = $4, updated_at = now()
     WHERE order_id = $1 AND status IN ('charging', 'unknown')";

/// Records the provider's `answer` for the charge of `order_id` (`amount_cents`), whose
/// intent the `order.created` `event_id` wrote, and enqueues its `payment.succeeded` /
/// `payment.failed` with id `<event_id>:payment`, whoever learnt the answer: ChargeOrder,
/// or a cancellation that resolved the charge first. `false` if the charge was decided
/// already (by another transaction that learnt the same answer under the same key).
pub async fn record_charge(
    tx: &Transaction<'_>,
    topics: &Topics,
    event_id: &str,
    (order_id, amount_cents): (Uuid, i64),
    answer: &Answer,
) -> Result<bool, HandlerError> {
    let (status, charge_id, reason) = match answer {
        Answer::Charged { charge_id, .. } => ("succeeded", Some(charge_id), None),
        Answer::Declined {
            charge_id, reason, ..
        } => ("failed", charge_id.as_ref(), Some(reason)),
    };
    let updated = tx
        .execute(
            &tx.prepare_cached(RECORD_CHARGE).await?,
            &[&order_id, &status, &charge_id, &reason],
        )
        .await?;
    if updated == 0 {
        return Ok(false);
    }
    outbox::enqueue(
        tx,
        &NewEvent {
            event_id: &events::payment_result_id(event_id),
            topic: &topics.payments,
            key: &order_id.to_string(),
            event_type: if reason.is_some() {
                events::PAYMENT_FAILED
            } else {
                events::PAYMENT_SUCCEEDED
            },
            payload: &PaymentResult {
                order_id,
                amount_cents,
                reason: reason.cloned(),
            },
            caused_by: Some(event_id),
        },
    )
    .await?;
    Ok(true)
}
