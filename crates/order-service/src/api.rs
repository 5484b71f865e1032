//! The order API. Every error is a JSON body naming what is wrong:
//!
//! ```json
//! {"error": {"code": "invalid_field", "field": "items[0].quantity", "message": "must be at least 1"}}
//! ```
//!
//! `POST /v1/orders` honours an `Idempotency-Key` header ([`saga::idempotency`]): a retry
//! with the key of a placed order gets that order's `201` again, byte for byte, with
//! `Idempotent-Replayed: true`, and places nothing.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use deadpool_postgres::Pool;
use saga::config::IdempotencyConfig;
use saga::http::BodyError;
use saga::idempotency::{self, Fingerprint, IdempotencyKey, KeyError};
use saga::{Retry, Topics};
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::orders::{self, Keyed, NewLine, Order, PlaceOrderError, Placed};

/// More than this many units of one product is a typo, not an order.
const MAX_QUANTITY: i32 = 1000;
const MAX_ITEMS: usize = 100;

const ORDERS: &str = "/v1/orders";

#[derive(Clone)]
struct AppState {
    pool: Pool,
    topics: Topics,
    idempotency: IdempotencyConfig,
}

pub fn router(pool: Pool, topics: Topics, idempotency: IdempotencyConfig) -> Router {
    Router::new()
        .route(ORDERS, post(place_order))
        .route("/v1/orders/{id}", get(get_order))
        .with_state(AppState {
            pool,
            topics,
            idempotency,
        })
}

/// The body of `POST /v1/orders`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlaceOrder {
    customer_id: String,
    items: Vec<LineItem>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LineItem {
    product_id: Uuid,
    quantity: i32,
}

async fn place_order(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let key = IdempotencyKey::from_headers(&headers).map_err(ApiError::InvalidIdempotencyKey)?;
    if key.is_none() && state.idempotency.require_idempotency_key {
        return Err(ApiError::IdempotencyKeyMissing);
    }
    let body = parse_json(&headers, &body)?;
    let keyed = key.as_ref().map(|key| Keyed {
        key,
        fingerprint: Fingerprint::of("POST", ORDERS, &body),
        ttl: state.idempotency.keys.idempotency_key_ttl,
        wait: state.idempotency.keys.idempotency_key_wait,
    });
    let request: PlaceOrder = decode(body)?;
    let lines = validate(&request)?;
    let placed = orders::place_order(
        &state.pool,
        &state.topics,
        request.customer_id.trim(),
        &lines,
        keyed,
    )
    .await
    .map_err(|error| match error {
        PlaceOrderError::UnknownProduct { index, product_id } => ApiError::field(
            format!("items[{index}].product_id"),
            format!("unknown product {product_id}"),
        ),
        PlaceOrderError::KeyReused => ApiError::IdempotencyKeyReused,
        PlaceOrderError::KeyInUse => ApiError::IdempotencyKeyInUse,
        PlaceOrderError::Pool(error) => ApiError::Unavailable(error.to_string()),
        PlaceOrderError::Database(error) => database_error(error),
    })?;
    let key = key.as_ref().map(IdempotencyKey::as_str);
    Ok(match placed {
        Placed::New { order, body } => {
            tracing::info!(order_id = %order.id, amount_cents = order.amount_cents, idempotency_key = key, "order placed");
            idempotency::response(orders::CREATED, &location(order.id), body)
        }
        Placed::Replayed {
            order_id,
            status,
            body,
        } => {
            tracing::info!(%order_id, idempotency_key = key, "order replayed for its idempotency key");
            let status = StatusCode::from_u16(status).map_err(|error| {
                ApiError::Internal(anyhow::anyhow!("stored status {status}: {error}"))
            })?;
            idempotency::replay(status, &location(order_id), body)
        }
    })
}

fn location(order_id: Uuid) -> String {
    format!("{ORDERS}/{order_id}")
}

fn validate(request: &PlaceOrder) -> Result<Vec<NewLine>, ApiError> {
    let customer_id = request.customer_id.trim();
    if customer_id.is_empty() {
        return Err(ApiError::field("customer_id", "must not be empty"));
    }
    // PostgreSQL's text holds no NUL, and no other control character belongs in an id.
    if customer_id.chars().any(char::is_control) {
        return Err(ApiError::field(
            "customer_id",
            "must not contain control characters",
        ));
    }
    if customer_id.chars().count() > 200 {
        return Err(ApiError::field(
            "customer_id",
            "must be at most 200 characters",
        ));
    }
    if request.items.is_empty() {
        return Err(ApiError::field("items", "must contain at least one item"));
    }
    if request.items.len() > MAX_ITEMS {
        return Err(ApiError::field(
            "items",
            format!("must contain at most {MAX_ITEMS} items"),
        ));
    }
    let mut lines: Vec<NewLine> = Vec::with_capacity(request.items.len());
    for (index, item) in request.items.iter().enumerate() {
        if item.quantity < 1 {
            return Err(ApiError::field(
                format!("items[{index}].quantity"),
                "must be at least 1",
            ));
        }
        if item.quantity > MAX_QUANTITY {
            return Err(ApiError::field(
                format!("items[{index}].quantity"),
                format!("must be at most {MAX_QUANTITY}"),
            ));
        }
        if lines.iter().any(|l| l.product_id == item.product_id) {
            return Err(ApiError::field(
                format!("items[{index}].product_id"),
                "appears twice; give one item with the total quantity",
            ));
        }
        lines.push(NewLine {
            product_id: item.product_id,
            quantity: item.quantity,
        });
    }
    Ok(lines)
}

async fn get_order(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<axum::Json<Order>, ApiError> {
    let order_id: Uuid = id
        .parse()
        .map_err(|_| ApiError::field("id", format!("`{id}` is not an order id (a UUID)")))?;
    let client = state
        .pool
        .get()
        .await
        .map_err(|error| ApiError::Unavailable(error.to_string()))?;
    orders::find_order(&client, order_id)
        .await
        .map_err(database_error)?
        .map(axum::Json)
        .ok_or(ApiError::NotFound(order_id))
}

fn parse_json(headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    saga::http::json_body(headers, body).map_err(|error| match error {
        BodyError::NotJson => ApiError::UnsupportedMediaType,
        BodyError::Malformed(message) => ApiError::MalformedJson(message),
    })
}

/// Decodes a parsed body, naming the field that does not fit.
fn decode<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|error| {
        let path = error.path().to_string();
        let message = error.into_inner().to_string();
        // serde reports a missing field at its parent; name the field itself.
        match message
            .strip_prefix("missing field `")
            .and_then(|m| m.strip_suffix('`'))
        {
            Some(field) if path == "." => ApiError::field(field.to_owned(), "is required"),
            Some(field) => ApiError::field(format!("{path}.{field}"), "is required"),
            // A wrong shape or an unknown key at the top: the body as a whole.
            None if path == "." => ApiError::field("body", message),
            None => ApiError::field(path, message),
        }
    })
}

/// Every way a request can fail, and the status each one answers with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: the body is not JSON at all.
    #[error("body is not valid JSON: {0}")]
    MalformedJson(String),
    /// 415: the body is not declared as JSON.
    #[error("Content-Type must be application/json")]
    UnsupportedMediaType,
    /// 422: the JSON is well-formed but a field is missing, of the wrong type, or out of range.
    #[error("{field}: {message}")]
    InvalidField { field: String, message: String },
    /// 400: the `Idempotency-Key` header breaks a rule of its syntax. Nothing is stored.
    #[error(transparent)]
    InvalidIdempotencyKey(KeyError),
    /// 400: `REQUIRE_IDEMPOTENCY_KEY` is on and the request has no key.
    #[error("this API requires an Idempotency-Key header on POST")]
    IdempotencyKeyMissing,
    /// 422: the key was first used with a different request (method, path or body).
    /// Nothing is stored. Stripe answers 400 here; the IETF draft says 422, and so do we.
    #[error(
        "this Idempotency-Key was used with a different request; use a new key for a new request"
    )]
    IdempotencyKeyReused,
    /// 409: a request with this key is still being processed; retry after `Retry-After`.
    #[error("a request with this Idempotency-Key is still being processed; retry shortly")]
    IdempotencyKeyInUse,
    /// 404: no order with this id.
    #[error("no order {0}")]
    NotFound(Uuid),
    /// 503: the database cannot be reached; retrying later will work.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// 500: a bug or a surprise. Logged in full; the client sees no details.
    #[error(transparent)]
    Internal(anyhow::Error),
}

/// A database error that goes away by itself (the server stopping or restarting cuts
/// the pooled sessions: "connection closed", SQLSTATE 57P01) is a 503, like a pool that
/// cannot connect: the same classes the consumer retries for as long as it takes.
fn database_error(error: tokio_postgres::Error) -> ApiError {
    match saga::handler::classify_postgres(&error) {
        Retry::UntilItWorks => ApiError::Unavailable(error.to_string()),
        Retry::AFewTimes | Retry::Never => ApiError::Internal(error.into()),
    }
}

impl ApiError {
    fn field(field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::InvalidField {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, body) = match &self {
            ApiError::MalformedJson(message) => (
                StatusCode::BAD_REQUEST,
                json!({ "code": "malformed_json", "message": format!("body is not valid JSON: {message}") }),
            ),
            ApiError::UnsupportedMediaType => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                json!({ "code": "unsupported_media_type", "message": self.to_string() }),
            ),
            ApiError::InvalidField { field, message } => (
                StatusCode::UNPROCESSABLE_ENTITY,
                json!({ "code": "invalid_field", "field": field, "message": message }),
            ),
            ApiError::InvalidIdempotencyKey(_) => (
                StatusCode::BAD_REQUEST,
                json!({ "code": "invalid_idempotency_key", "message": self.to_string() }),
            ),
            ApiError::IdempotencyKeyMissing => (
                StatusCode::BAD_REQUEST,
                json!({ "code": "idempotency_key_missing", "message": self.to_string() }),
            ),
            ApiError::IdempotencyKeyReused => (
                StatusCode::UNPROCESSABLE_ENTITY,
                json!({ "code": "idempotency_key_reused", "message": self.to_string() }),
            ),
            ApiError::IdempotencyKeyInUse => (
                StatusCode::CONFLICT,
                json!({ "code": "idempotency_key_in_use", "message": self.to_string() }),
            ),
            ApiError::NotFound(_) => (
                StatusCode::NOT_FOUND,
                json!({ "code": "order_not_found", "message": self.to_string() }),
            ),
            ApiError::Unavailable(error) => {
                tracing::warn!(%error, "request failed: database unavailable");
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    json!({ "code": "unavailable", "message": "the database is unavailable; retry later" }),
                )
            }
            ApiError::Internal(error) => {
                tracing::error!(error = format!("{error:#}"), "request failed");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    json!({ "code": "internal", "message": "internal error" }),
                )
            }
        };
        let mut response = (status, axum::Json(json!({ "error": body }))).into_response();
        if matches!(self, ApiError::IdempotencyKeyInUse) {
            // The first request has been running for the whole wait already; a second
            // more is about as long as any request takes.
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}
