//! `POST /v1/orders/{id}/cancel`: the customer cancels an order ([`crate::cancel`]).

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use saga::idempotency::{self, Fingerprint, IdempotencyKey};
use serde_json::Value;
use uuid::Uuid;

use super::{ApiError, AppState, ErrorBody, key_error, location, replayed, request_key};
use crate::cancel::{self, CancelError, Cancelled};
use crate::orders::Order;

/// Cancels an order, pending or confirmed: `cancelled`, reason `customer`, with its
/// `order.cancelled` in one transaction. The saga moves forward from there: if the card
/// was charged, payment-service refunds the charge (the order's `refund` says
/// `pending` until it has answered, then `refunded` or `not_charged`). An order cancelled
/// already, for any reason, answers `200` as it is and changes nothing. Takes no body.
#[utoipa::path(
    post,
    path = "/v1/orders/{id}/cancel",
    tag = "orders",
    params(
        ("id" = Uuid, Path, description = "The order's id"),
        ("Idempotency-Key" = Option<String>, Header, nullable = false,
         description = "As for `POST /v1/orders`: a retry with the same key gets the first \
                        answer again and changes nothing.")
    ),
    responses(
        (status = 202, description = "Cancelled now; with `refund: pending`, a refund follows if the card was charged (or, with `Idempotent-Replayed: true`, cancelled before under this key)",
         body = Order,
         headers(("Location" = String, description = "The order's URL"),
                 ("Idempotent-Replayed" = String, description = "`true` on a replay"))),
        (status = 200, description = "Cancelled before, for any reason: the order as it is; nothing changed", body = Order),
        (status = 400, description = "`invalid_idempotency_key`, `idempotency_key_missing`", body = ErrorBody),
        (status = 404, description = "`order_not_found`", body = ErrorBody),
        (status = 408, description = "`request_timeout`: the request took longer than allowed", body = ErrorBody),
        (status = 409, description = "`idempotency_key_in_use`: a request with this key is in progress; retry after `Retry-After`", body = ErrorBody,
         headers(("Retry-After" = String, description = "Seconds"))),
        (status = 413, description = "`payload_too_large`: a body over 2 MiB", body = ErrorBody),
        (status = 422, description = "`invalid_field`: the id is not a UUID; `idempotency_key_reused`", body = ErrorBody),
        (status = 431, description = "`request_header_fields_too_large`", body = ErrorBody),
        (status = 500, description = "`internal`: a fault of the service, logged", body = ErrorBody),
        (status = 503, description = "`unavailable` or `overloaded`; retry later", body = ErrorBody),
    )
)]
pub(super) async fn cancel_order(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let key = request_key(&state, &headers)?;
    let order_id: Uuid = id
        .parse()
        .map_err(|_| ApiError::field("id", format!("`{id}` is not an order id (a UUID)")))?;
    let path = format!("{}/cancel", location(order_id));
    let keyed = key
        .as_ref()
        .map(|key| state.keyed(key, Fingerprint::of("POST", &path, &Value::Null)));
    let cancelled = cancel::cancel_order(
        &state.pool,
        Some(&state.relay),
        &state.topics,
        order_id,
        keyed,
    )
    .await
    .map_err(|error| match error {
        CancelError::NotFound(order_id) => ApiError::NotFound(order_id),
        CancelError::Key(error) => key_error(error),
    })?;
    let key = key.as_ref().map(IdempotencyKey::as_str);
    Ok(match cancelled {
        Cancelled::Now { order, body } => {
            tracing::info!(order_id = %order.id, idempotency_key = key, "order cancelled by the customer");
            idempotency::response(cancel::ACCEPTED, &location(order.id), body)
        }
        Cancelled::Already { order, body } => {
            tracing::info!(order_id = %order.id, idempotency_key = key, reason = order.cancel_reason, "order cancelled before; nothing changed");
            idempotency::response(cancel::ALREADY, &location(order.id), body)
        }
        Cancelled::Replayed {
            order_id,
            status,
            body,
        } => {
            tracing::info!(%order_id, idempotency_key = key, "cancellation replayed for its idempotency key");
            replayed(order_id, status, body)?
        }
    })
}
