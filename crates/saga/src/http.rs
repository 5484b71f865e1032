//! The HTTP edge every service has: `/health` for supervisors, a server that stops
//! accepting on shutdown and lets in-flight requests finish, the reading of a JSON body,
//! and [`json_errors`], which makes every error answer the JSON one, axum's own included.

use axum::Router;
use axum::body::Body;
use axum::error_handling::HandleErrorLayer;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use deadpool_postgres::Pool;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::limit::GlobalConcurrencyLimitLayer;
use tower::{BoxError, ServiceBuilder};
use tower_http::timeout::TimeoutLayer;

use crate::config::HttpLimits;

/// `GET /health`: 200 when the service can reach its database, 503 otherwise.
pub fn health(pool: Pool) -> Router {
    Router::new().route("/health", get(check)).with_state(pool)
}

async fn check(State(pool): State<Pool>) -> impl IntoResponse {
    let reachable = match pool.get().await {
        Ok(client) => client.simple_query("SELECT 1").await.is_ok(),
        Err(_) => false,
    };
    if reachable {
        (StatusCode::OK, Json(json!({ "status": "ok" })))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "unavailable", "reason": "database unreachable" })),
        )
    }
}

pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await?;
    Ok(())
}

/// Why a request body is not the JSON it must be.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// 415: the body is not declared as JSON.
    #[error("Content-Type must be application/json")]
    NotJson,
    /// 400: it is declared as JSON and is not.
    #[error("body is not valid JSON: {0}")]
    Malformed(String),
}

/// Parses a body declared as JSON (`application/json`, parameters allowed).
pub fn json_body(headers: &HeaderMap, body: &[u8]) -> Result<Value, BodyError> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !is_json {
        return Err(BodyError::NotJson);
    }
    serde_json::from_slice(body).map_err(|error| BodyError::Malformed(error.to_string()))
}

/// The largest request body a service reads; a larger one is `413 payload_too_large`.
/// Axum's default, stated here so the error can name it.
pub const BODY_LIMIT: usize = 2 * 1024 * 1024;

/// The most header bytes (names and values) a request may carry; more is
/// `431 request_header_fields_too_large`. Far more than any client of these APIs sends;
/// hyper's own, larger, limits (100 headers, about 400 KiB) answer before any of this code
/// runs, with an empty 431.
pub const HEADER_LIMIT: usize = 16 * 1024;

/// A service's whole router, behind the limits every request meets (outermost first):
/// `limits.http_max_concurrent_requests` in progress, or `503 overloaded`; headers within
/// [`HEADER_LIMIT`]; [`json_errors`] over all that follows; a request done within
/// `limits.http_request_timeout`, or `408`; a body within [`BODY_LIMIT`], or `413`.
pub fn edge(router: Router, limits: &HttpLimits) -> Router {
    // Innermost: a route's pattern is known only inside the router's own layers. On
    // whether spans are exported or not: a caller's context is carried on either way.
    router
        .layer(axum::middleware::from_fn(trace_request))
        // Set, so that the layers below surely cover a path no route matches.
        .fallback(|| async { StatusCode::NOT_FOUND })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            limits.http_request_timeout,
        ))
        .layer(axum::middleware::from_fn(json_errors))
        .layer(axum::middleware::from_fn(header_limit))
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(|_: BoxError| async { overloaded() }))
                .load_shed()
                // Global: `Router::layer` makes a service per route, and the limit is
                // the service's, not a route's.
                .layer(GlobalConcurrencyLimitLayer::new(
                    limits.http_max_concurrent_requests,
                )),
        )
}

/// A server span per request, continuing the caller's trace context if it sent one: the
/// first span of an order's trace (`POST /v1/orders`), or the provider's side of a charge.
/// Where spans are not exported, the caller's context alone, carried on.
async fn trace_request(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(
            || request.uri().path().to_owned(),
            |path| path.as_str().to_owned(),
        );
    let hop = crate::trace::Hop::server(
        request.method().as_str(),
        &route,
        request.uri().path(),
        &crate::trace::HttpHeaders(request.headers()),
    );
    let response = hop.scope(next.run(request)).await;
    let status = response.status();
    hop.set("http.response.status_code", i64::from(status.as_u16()));
    if status.is_server_error() {
        hop.failed(status);
    }
    response
}

/// What the concurrency limit answers past its number: refused at once, so a client
/// backs off instead of queueing behind requests that would time out anyway.
fn overloaded() -> Response {
    let mut response = error(
        StatusCode::SERVICE_UNAVAILABLE,
        "overloaded",
        "too many requests in progress; retry after Retry-After seconds".to_owned(),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

async fn header_limit(request: Request, next: Next) -> Response {
    let size: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if size > HEADER_LIMIT {
        return error(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "request_header_fields_too_large",
            format!(
                "request headers of {size} bytes, over the limit of {} KiB",
                HEADER_LIMIT >> 10
            ),
        );
    }
    next.run(request).await
}

/// `{"error": {"code", "message"}}` with `status`.
fn error(status: StatusCode, code: &str, message: String) -> Response {
    (
        status,
        Json(json!({ "error": { "code": code, "message": message } })),
    )
        .into_response()
}

/// Middleware: an error answer that is not JSON becomes the JSON error every handler
/// answers with, `{"error": {"code", "message"}}`, its status and headers kept (`Allow` on a
/// 405 too). Axum answers an unknown path `404` and a wrong method `405` with no body, and a
/// body over the limit `413` in plain text; a client should not have to parse three
/// formats of error.
pub async fn json_errors(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let code = status
        .canonical_reason()
        .unwrap_or("error")
        .to_lowercase()
        .replace([' ', '-'], "_");
    let message = match status {
        StatusCode::NOT_FOUND => "no such route".to_owned(),
        // Axum adds the `Allow` header after this layer has run: point to it.
        StatusCode::METHOD_NOT_ALLOWED => {
            "method not allowed here; the Allow header lists those that are".to_owned()
        }
        StatusCode::PAYLOAD_TOO_LARGE => {
            format!("request body over the limit of {} MiB", BODY_LIMIT >> 20)
        }
        StatusCode::REQUEST_TIMEOUT => {
            "the request (its body included) took longer than the server allows".to_owned()
        }
        _ if !text.is_empty() => text,
        _ => code.replace('_', " "),
    };
    let body = json!({ "error": { "code": code, "message": message } }).to_string();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, Body::from(body))
}
