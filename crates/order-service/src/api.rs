//! The order API. Every error is a JSON body naming what is wrong:
//!
//! ```json
//! {"error": {"code": "invalid_field", "field": "items[0].quantity", "message": "must be at least 1"}}
//! ```
//!
//! `POST /v1/orders` honours an `Idempotency-Key` header ([`saga::idempotency`]): a retry
//! with the key of a placed order gets that order's `201` again, byte for byte, with
//! `Idempotent-Replayed: true`, and places nothing. So does `POST
//! /v1/orders/{id}/cancel` ([`cancel`]).

mod cancel;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use deadpool_postgres::Pool;
use saga::LocalRelay;
use saga::config::IdempotencyConfig;
use saga::http::BodyError;
use saga::idempotency::{self, Fingerprint, IdempotencyKey, KeyError};
use saga::{Retry, Topics};
use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use saga::events::OrderItem;
use utoipa::{OpenApi, ToSchema};

use crate::admission::{Admission, Behind};
use crate::orders::{
    self, Keyed, NewLine, Order, OrderStatus, PlaceOrderError, Placed, RefundState,
};

/// More than this many units of one product is a typo, not an order.
const MAX_QUANTITY: i32 = 1000;
const MAX_ITEMS: usize = 100;
const MAX_CUSTOMER_ID: usize = 200;

const ORDERS: &str = "/v1/orders";

#[derive(Clone)]
struct AppState {
    pool: Pool,
    relay: LocalRelay,
    topics: Topics,
    idempotency: IdempotencyConfig,
    admission: Admission,
}

pub fn router(
    pool: Pool,
    relay: LocalRelay,
    topics: Topics,
    idempotency: IdempotencyConfig,
    admission: Admission,
) -> Router {
    Router::new()
        .route(ORDERS, post(place_order))
        .route("/v1/orders/{id}", get(get_order))
        .route("/v1/orders/{id}/cancel", post(cancel::cancel_order))
        .route(
            "/openapi.json",
            get(|| async { axum::Json(ApiDoc::openapi()) }),
        )
        .with_state(AppState {
            pool,
            relay,
            topics,
            idempotency,
            admission,
        })
}

/// The order API's contract, served at `/openapi.json`: generated from the handlers'
/// annotations and the types below, so it describes what the code does.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "order-saga order API",
        description = "Places orders, which the saga charges and settles; reads them back. \
                       Every error is the JSON error, `{\"error\": {\"code\", \"message\"}}`."
    ),
    paths(place_order, get_order, cancel::cancel_order),
    components(schemas(
        PlaceOrder,
        LineItem,
        Order,
        OrderItem,
        OrderStatus,
        RefundState,
        ErrorBody,
        ErrorDetail
    ))
)]
pub struct ApiDoc;

/// The body of `POST /v1/orders`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "customer_id": "cust-1",
    "items": [{ "product_id": "8f14e45f-ceea-4c9d-b2a5-0c1e3f4a9b21", "quantity": 2 }]
}))]
struct PlaceOrder {
    /// Who orders; surrounding whitespace is ignored, control characters are refused.
    #[schema(min_length = 1, max_length = 200, example = "cust-1")]
    customer_id: String,
    /// One line per product.
    #[schema(min_items = 1, max_items = 100)]
    items: Vec<LineItem>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct LineItem {
    /// A product of the catalog: the examples are those seeded (1299, 64900 and 119900
    /// cents).
    #[schema(examples(
        "8f14e45f-ceea-4c9d-b2a5-0c1e3f4a9b21",
        "c9f0f895-fb98-4b91-9f3a-2b7c5e1d0a44",
        "45c48cce-2e2d-4fbd-8a1e-7d3b9c6f5e12"
    ))]
    product_id: Uuid,
    #[schema(minimum = 1, maximum = 1000)]
    quantity: i32,
}

/// Every error answer of the API (and of the HTTP layer in front of it).
#[derive(Debug, serde::Serialize, ToSchema)]
pub struct ErrorBody {
    error: ErrorDetail,
}

impl ErrorDetail {
    fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_owned(),
            message: message.into(),
            field: None,
        }
    }

    fn at(field: &str, message: &str) -> Self {
        Self {
            field: Some(field.to_owned()),
            ..Self::new("invalid_field", message)
        }
    }
}

#[derive(Debug, serde::Serialize, ToSchema)]
pub struct ErrorDetail {
    /// What went wrong, for code: `invalid_field`, `malformed_json`, `order_not_found`, …
    code: String,
    /// What went wrong, for people.
    message: String,
    /// With `invalid_field`: the field, as a path (`items[0].quantity`).
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<String>,
}

/// Places an order: priced from the catalog, stored `pending` with its `order.created`
/// event in one transaction; the saga then charges it and settles it.
#[utoipa::path(
    post,
    path = "/v1/orders",
    tag = "orders",
    request_body(content = PlaceOrder, content_type = "application/json"),
    params(
        ("Idempotency-Key" = Option<String>, Header, nullable = false,
         description = "A structured-field string (`\"…\"`, or a bare token) of 1 to 255 \
                        characters: a retry with the same key and body gets the first \
                        answer again and places nothing.")
    ),
    responses(
        (status = 201, description = "Placed (or, with `Idempotent-Replayed: true`, placed before under this key)",
         body = Order,
         headers(("Location" = String, description = "The order's URL"),
                 ("Idempotent-Replayed" = String, description = "`true` on a replay"))),
        (status = 400, description = "`malformed_json`, `invalid_idempotency_key`, `idempotency_key_missing`", body = ErrorBody),
        (status = 408, description = "`request_timeout`: the request took longer than allowed", body = ErrorBody),
        (status = 409, description = "`idempotency_key_in_use`: a request with this key is in progress; retry after `Retry-After`", body = ErrorBody,
         headers(("Retry-After" = String, description = "Seconds"))),
        (status = 413, description = "`payload_too_large`: a body over 2 MiB", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: not declared `application/json`", body = ErrorBody),
        (status = 422, description = "`invalid_field` (with `field`), `idempotency_key_reused`", body = ErrorBody),
        (status = 431, description = "`request_header_fields_too_large`", body = ErrorBody),
        (status = 500, description = "`internal`: a fault of the service, logged", body = ErrorBody),
        (status = 503, description = "`unavailable` (the database is down), `overloaded` (too many requests at once) or `saga_behind` (too many orders in flight: nothing placed); retry later", body = ErrorBody,
         headers(("Retry-After" = String, description = "Seconds, with `overloaded` and `saga_behind`"))),
    )
)]
async fn place_order(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let key = request_key(&state, &headers)?;
    let body = parse_json(&headers, &body)?;
    let keyed = key
        .as_ref()
        .map(|key| state.keyed(key, Fingerprint::of("POST", ORDERS, &body)));
    let request: PlaceOrder = decode(body)?;
    let lines = validate(&request)?;
    // After the request's own checks, so that a wrong one is told what is wrong with it;
    // before its transaction, so that a refused one stores nothing.
    state.admission.admit().map_err(ApiError::SagaBehind)?;
    let placed = orders::place_order(
        &state.pool,
        Some(&state.relay),
        &state.topics,
        request.customer_id.trim(),
        &lines,
        keyed,
    )
    .await
    .map_err(key_error)?;
    let key = key.as_ref().map(IdempotencyKey::as_str);
    Ok(match placed {
        Placed::New { order, body } => {
            state.admission.placed();
            tracing::info!(order_id = %order.id, amount_cents = order.amount_cents, idempotency_key = key, "order placed");
            idempotency::response(orders::CREATED, &location(order.id), body)
        }
        Placed::Replayed {
            order_id,
            status,
            body,
        } => {
            tracing::info!(%order_id, idempotency_key = key, "order replayed for its idempotency key");
            replayed(order_id, status, body)?
        }
    })
}

/// The request's `Idempotency-Key`, if it is allowed to come without one.
fn request_key(state: &AppState, headers: &HeaderMap) -> Result<Option<IdempotencyKey>, ApiError> {
    let key = IdempotencyKey::from_headers(headers).map_err(ApiError::InvalidIdempotencyKey)?;
    if key.is_none() && state.idempotency.require_idempotency_key {
        return Err(ApiError::IdempotencyKeyMissing);
    }
    Ok(key)
}

impl AppState {
    /// `key`, for a request that `fingerprint` tells from any other, kept and waited on
    /// as configured.
    fn keyed<'k>(&self, key: &'k IdempotencyKey, fingerprint: Fingerprint) -> Keyed<'k> {
        Keyed {
            key,
            fingerprint,
            ttl: self.idempotency.keys.idempotency_key_ttl,
            wait: self.idempotency.keys.idempotency_key_wait,
        }
    }
}

/// The answer stored with a key, sent again: its status and body as first sent.
fn replayed(order_id: Uuid, status: u16, body: String) -> Result<Response, ApiError> {
    let status = StatusCode::from_u16(status)
        .map_err(|error| ApiError::Internal(anyhow::anyhow!("stored status {status}: {error}")))?;
    Ok(idempotency::replay(status, &location(order_id), body))
}

/// What placing or cancelling an order failed with, as the API answers it.
fn key_error(error: PlaceOrderError) -> ApiError {
    match error {
        PlaceOrderError::UnknownProduct { index, product_id } => ApiError::field(
            format!("items[{index}].product_id"),
            format!("unknown product {product_id}"),
        ),
        PlaceOrderError::KeyReused => ApiError::IdempotencyKeyReused,
        PlaceOrderError::KeyInUse => ApiError::IdempotencyKeyInUse,
        PlaceOrderError::Pool(error) => ApiError::Unavailable(error.to_string()),
        PlaceOrderError::Database(error) => database_error(error),
    }
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
    if customer_id.chars().count() > MAX_CUSTOMER_ID {
        return Err(ApiError::field(
            "customer_id",
            format!("must be at most {MAX_CUSTOMER_ID} characters"),
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

/// An order, with its status.
#[utoipa::path(
    get,
    path = "/v1/orders/{id}",
    tag = "orders",
    params(("id" = Uuid, Path, description = "The order's id")),
    responses(
        (status = 200, description = "The order", body = Order),
        (status = 404, description = "`order_not_found`", body = ErrorBody),
        (status = 408, description = "`request_timeout`", body = ErrorBody),
        (status = 422, description = "`invalid_field`: the id is not a UUID", body = ErrorBody),
        (status = 431, description = "`request_header_fields_too_large`", body = ErrorBody),
        (status = 500, description = "`internal`: a fault of the service, logged", body = ErrorBody),
        (status = 503, description = "`unavailable` or `overloaded`; retry later", body = ErrorBody),
    )
)]
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
    /// 503: more orders are in flight than the saga settles in time (see
    /// [`crate::admission`]); nothing is stored, and a retry after `Retry-After` may be
    /// placed.
    #[error(
        "the saga is behind: {} orders in flight, past the limit of {}; nothing was placed, retry later",
        .0.in_flight,
        .0.limit
    )]
    SagaBehind(Behind),
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
    match saga::retry::classify_postgres(&error) {
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
                ErrorDetail::new(
                    "malformed_json",
                    format!("body is not valid JSON: {message}"),
                ),
            ),
            ApiError::UnsupportedMediaType => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ErrorDetail::new("unsupported_media_type", self.to_string()),
            ),
            ApiError::InvalidField { field, message } => (
                StatusCode::UNPROCESSABLE_ENTITY,
                ErrorDetail::at(field, message),
            ),
            ApiError::InvalidIdempotencyKey(_) => (
                StatusCode::BAD_REQUEST,
                ErrorDetail::new("invalid_idempotency_key", self.to_string()),
            ),
            ApiError::IdempotencyKeyMissing => (
                StatusCode::BAD_REQUEST,
                ErrorDetail::new("idempotency_key_missing", self.to_string()),
            ),
            ApiError::IdempotencyKeyReused => (
                StatusCode::UNPROCESSABLE_ENTITY,
                ErrorDetail::new("idempotency_key_reused", self.to_string()),
            ),
            ApiError::IdempotencyKeyInUse => (
                StatusCode::CONFLICT,
                ErrorDetail::new("idempotency_key_in_use", self.to_string()),
            ),
            ApiError::NotFound(_) => (
                StatusCode::NOT_FOUND,
                ErrorDetail::new("order_not_found", self.to_string()),
            ),
            ApiError::SagaBehind(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorDetail::new("saga_behind", self.to_string()),
            ),
            ApiError::Unavailable(error) => {
                tracing::warn!(%error, "request failed: database unavailable");
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    ErrorDetail::new("unavailable", "the database is unavailable; retry later"),
                )
            }
            ApiError::Internal(error) => {
                tracing::error!(error = format!("{error:#}"), "request failed");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    ErrorDetail::new("internal", "internal error"),
                )
            }
        };
        let mut response = (status, axum::Json(ErrorBody { error: body })).into_response();
        if matches!(
            self,
            ApiError::IdempotencyKeyInUse | ApiError::SagaBehind(_)
        ) {
            // In use: the first request has been running for the whole wait already; a
            // second more is about as long as any request takes. Behind: the saga
            // settles hundreds of orders a second, so a second frees room, and clients
            // that all come back at once are refused again at no cost but a request.
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn document() -> Value {
        serde_json::to_value(ApiDoc::openapi()).unwrap()
    }

    #[test]
    fn the_contract_is_openapi_3_1_and_states_the_limits_the_code_enforces() {
        let doc = document();
        assert!(
            doc["openapi"].as_str().unwrap().starts_with("3.1"),
            "{}",
            doc["openapi"]
        );
        let schemas = &doc["components"]["schemas"];
        let order = &schemas["PlaceOrder"];
        assert_eq!(order["additionalProperties"], false, "{order}");
        assert_eq!(
            order["properties"]["customer_id"]["maxLength"],
            MAX_CUSTOMER_ID
        );
        assert_eq!(order["properties"]["items"]["minItems"], 1);
        assert_eq!(order["properties"]["items"]["maxItems"], MAX_ITEMS);
        let line = &schemas["LineItem"]["properties"]["quantity"];
        assert_eq!(line["minimum"], 1);
        assert_eq!(line["maximum"], MAX_QUANTITY);
    }

    #[test]
    fn every_route_documents_the_refusals_every_request_can_meet() {
        let doc = document();
        for (path, method) in [(ORDERS, "post"), ("/v1/orders/{id}", "get")] {
            let responses = &doc["paths"][path][method]["responses"];
            for status in ["408", "422", "431", "500", "503"] {
                let response = &responses[status];
                assert_eq!(
                    response["content"]["application/json"]["schema"]["$ref"],
                    "#/components/schemas/ErrorBody",
                    "{method} {path}: {status}"
                );
            }
        }
    }
}
