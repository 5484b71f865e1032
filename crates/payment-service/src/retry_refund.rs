//! An operator's retry of a refund the provider refused: `POST
//! /admin/refunds/{order_id}/retry` (`sagactl refund retry <order>` calls it).
//!
//! It lives in payment-service, beside the cancellation's refund, so that it asks and
//! records the same way ([`crate::refund`]): the next attempt's intent committed first,
//! under a key of its own (`<order id>:refund:<n>`, as the refused key keeps its refusal
//! at the provider), then the call, then the ending recorded with its event in one
//! transaction: `payment.refunded`, which settles the order as any refund does, or
//! another `payment.refund_failed`.
//!
//! It is idempotent. A refund refunded already is answered as it stands; one under way
//! (`refunding`, `unknown`: an earlier retry's answer lost) is asked again under the same
//! key, never a new one; only a `failed` refund moves to a new attempt, and only one
//! retry can move it (the update that does is the lock). A `manual` refund is answered
//! `409`: no call can settle it.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use deadpool_postgres::Pool;
use saga::events::PaymentRefundFailed;
use saga::{HandlerError, Topics, Transaction};
use serde_json::json;
use uuid::Uuid;

use crate::payment::{Payment, refund_key};
use crate::provider::Provider;
use crate::refund::{self, Ending, Standing};

/// What a retry came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Retried {
    /// Refunded, by this retry (`attempt`) or before it (`attempt` as recorded).
    Refunded { refund_id: String, attempt: i32 },
    /// Refused again; the refund stays `failed`, with the provider's reason.
    Refused { reason: String, attempt: i32 },
    /// Not a refund a retry can move: `status` is `manual`, `none`, or a refund not asked
    /// for yet (its cancellation not answered).
    NotRetryable { status: String },
    /// payment-service has no payment for the order.
    NoPayment,
}

#[derive(Clone)]
struct Retry {
    pool: Pool,
    topics: Topics,
    provider: Provider,
}

/// `POST /admin/refunds/{order_id}/retry`.
pub fn router(pool: Pool, topics: Topics, provider: Provider) -> axum::Router {
    axum::Router::new()
        .route("/admin/refunds/{order_id}/retry", post(retry))
        .with_state(Retry {
            pool,
            topics,
            provider,
        })
}

/// A failed refund's next attempt: `failed` → `refunding` under the next key. Nothing
/// back: the refund was not `failed` (another retry moved it first, or it is not one).
pub const NEXT_ATTEMPT: &str = "
    UPDATE payments
       SET refund_status = 'refunding', refund_attempt = refund_attempt + 1,
           refund_key = $2 || ':' || (refund_attempt + 1), refund_reason = NULL,
           updated_at = now()
     WHERE order_id = $1 AND refund_status = 'failed'";

async fn retry(State(state): State<Retry>, Path(order_id): Path<Uuid>) -> Response {
    let body = |refund: &str, extra: serde_json::Value| {
        let mut body = json!({ "order_id": order_id, "refund": refund });
        if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
            body.extend(extra.clone());
        }
        Json(body)
    };
    let retried = retry_refund(&state.pool, &state.topics, &state.provider, order_id).await;
    match retried {
        Ok(Retried::Refunded { refund_id, attempt }) => (
            StatusCode::OK,
            body("refunded", json!({ "refund_id": refund_id, "attempt": attempt })),
        ),
        Ok(Retried::Refused { reason, attempt }) => (
            StatusCode::OK,
            body("failed", json!({ "reason": reason, "attempt": attempt })),
        ),
        Ok(Retried::NotRetryable { status }) => (
            StatusCode::CONFLICT,
            body(&status, json!({ "reason": "only a refund the provider refused (failed) can be retried" })),
        ),
        Ok(Retried::NoPayment) => (
            StatusCode::NOT_FOUND,
            body("none", json!({ "reason": "payment-service has no payment for this order" })),
        ),
        Err(HandlerError::Unavailable(reason)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            body("unknown", json!({ "reason": reason,
                "hint": "the refund may or may not be made: retry again, it asks under the same key" })),
        ),
        Err(error) => {
            tracing::error!(%order_id, %error, "refund retry failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                body("error", json!({ "reason": error.to_string() })),
            )
        }
    }
    .into_response()
}

/// Retries `order_id`'s refused refund, as `POST /admin/refunds/{order_id}/retry` does.
pub async fn retry_refund(
    pool: &Pool,
    topics: &Topics,
    provider: &Provider,
    order_id: Uuid,
) -> Result<Retried, HandlerError> {
    let client = pool.get().await?;
    client
        .execute(
            &client.prepare_cached(NEXT_ATTEMPT).await?,
            &[&order_id, &refund_key(order_id, 1)],
        )
        .await?;
    // Another retry may decide the refund while this one asks: then look again.
    let (charge, attempt, ending) = loop {
        let Some(payment) = Payment::find(&client, order_id).await? else {
            return Ok(Retried::NoPayment);
        };
        let charge = match (payment.refund_status.as_deref(), &payment.charge_id) {
            (Some("refunded"), _) => {
                return Ok(Retried::Refunded {
                    refund_id: payment.refund_id.unwrap_or_default(),
                    attempt: payment.refund_attempt,
                });
            }
            // Moved on and refused again by a retry running beside this one (this one's
            // move found it under way): its refusal is the answer.
            (Some("failed"), _) => {
                return Ok(Retried::Refused {
                    reason: payment.refund_reason.unwrap_or_default(),
                    attempt: payment.refund_attempt,
                });
            }
            (Some("refunding" | "unknown"), Some(charge_id)) if payment.answered => Standing {
                charge_id: charge_id.clone(),
                amount_cents: payment.amount_cents,
            },
            (status, _) => {
                return Ok(Retried::NotRetryable {
                    status: status.unwrap_or("none").to_owned(),
                });
            }
        };
        match refund::ask(pool, provider, order_id, &charge).await {
            Ok((attempt, ending)) => break (charge, attempt, ending),
            Err(HandlerError::Stale(_)) => continue,
            Err(error) => return Err(error),
        }
    };
    let tx = Transaction::begin(&client);
    let retried = match ending {
        Ending::Refunded(refund) => {
            refund::record_refunded(&tx, topics, order_id, &charge, &refund, None).await?;
            Retried::Refunded {
                refund_id: refund.refund_id,
                attempt,
            }
        }
        Ending::Refused { reason } => {
            let failed = PaymentRefundFailed {
                order_id,
                amount_cents: charge.amount_cents,
                charge_id: Some(charge.charge_id.clone()),
                reason: reason.clone(),
                manual: false,
                attempt,
            };
            refund::record_not_refunded(&tx, topics, &failed, None).await?;
            Retried::Refused { reason, attempt }
        }
    };
    tx.commit().await?;
    Ok(retried)
}
