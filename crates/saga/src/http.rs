//! The HTTP edge every service has: `/health` for supervisors, a server that stops
//! accepting on shutdown and lets in-flight requests finish, the reading of a JSON body,
//! and [`json_errors`], which makes every error answer the JSON one, axum's own included.

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use deadpool_postgres::Pool;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

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

/// The body limit and [`json_errors`], for a service's whole router.
pub fn edge(router: Router) -> Router {
    router
        // Set, so that the layers below surely cover a path no route matches.
        .fallback(|| async { StatusCode::NOT_FOUND })
        .layer(axum::middleware::from_fn(json_errors))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
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
