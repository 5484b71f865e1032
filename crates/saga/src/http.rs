//! The HTTP edge every service has: `/health` for supervisors, and a server that stops
//! accepting on shutdown and lets in-flight requests finish.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use deadpool_postgres::Pool;
use serde_json::json;
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
