//! The HTTP edge every service has: `/health` for supervisors, a server that stops
//! accepting on shutdown and lets in-flight requests finish, and the reading of a JSON
//! body.

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Json};
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
