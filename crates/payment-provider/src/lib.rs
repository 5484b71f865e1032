//! payment-provider: a stand-in card processor for payment-service to call, in the shape
//! of Stripe's API, with what public mocks leave out: it **honours `Idempotency-Key`**
//! (the first answer per key is stored with the charge and replayed to every later call
//! with the key), and it **fails on demand** (down, slow, charging and then losing its
//! answer, committing late, refusing a refund, listing behind), so the saga can be shown
//! charging each order once whatever is lost.
//!
//! - [`charges`]: `POST /v1/charges`, `GET /v1/charges?reference=…`, `GET
//!   /v1/charges/{id}`, each charge shown with its refunds.
//! - [`refunds`]: `POST /v1/refunds`, `GET /v1/refunds/{id}`: a charge's money given
//!   back, once, as a cancelled order asks.
//! - [`keyed`]: what those two `POST`s share: the key's wait, claim and replay, and the
//!   faults drawn around the call.
//! - [`error`]: the API's errors and their JSON.
//! - [`faults`]: what can be armed, per endpoint (`PROVIDER_FAULT`, `PUT /admin/fault`).
//! - [`stats`]: what the provider counted (`GET /admin/stats`).
//! - [`sever`]: the listener that lets a handler cut its connection after its commit.
//!
//! It takes no part in the saga: no Kafka, no inbox, no outbox; its own database
//! (`provider`) holds charges, refunds and keys.

pub mod charges;
pub mod error;
pub mod faults;
pub mod keyed;
pub mod refunds;
pub mod sever;
pub mod stats;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use clap::Parser;
use deadpool_postgres::Pool;
use saga::config::{KeyConfig, PruneConfig, at_least_one};
use saga::retention::Target;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::charges::{AppState, Rules};
use crate::faults::{Endpoint, Fault, Faults};
use crate::sever::{Connection, SeverableListener};

pub const SERVICE: &str = "payment-provider";

mod embedded {
    refinery::embed_migrations!("../../migrations/provider");
}

/// The provider's migrations (`migrations/provider`), its database's only ones.
pub fn migrations() -> refinery::Runner {
    embedded::migrations::runner()
}

/// Where the provider's migrations record what they applied.
pub const HISTORY_TABLE: &str = "provider_schema_history";

/// payment-provider: a stand-in card processor.
#[derive(Clone, Parser)]
#[command(version, about)]
pub struct Config {
    #[command(flatten)]
    pub database_url: saga::config::DatabaseUrl,

    /// Connections for the HTTP handlers.
    #[arg(long, env = "DATABASE_POOL_SIZE", default_value_t = 8, value_parser = at_least_one())]
    pub database_pool_size: usize,

    /// Where the API listens; port 0 picks a free port.
    #[arg(long, env = "HTTP_ADDR", default_value = "127.0.0.1:8083")]
    pub http_addr: SocketAddr,

    /// Serve HTTPS with this certificate chain (PEM), as a real card processor does;
    /// plain HTTP without it.
    #[arg(long, env = "TLS_CERT_FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<std::path::PathBuf>,

    /// The certificate's private key (PEM).
    #[arg(long, env = "TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<std::path::PathBuf>,

    #[command(flatten)]
    pub http: saga::config::HttpLimits,

    /// Charges above this amount (in cents) are declined: 402 `card_declined`, "amount
    /// exceeds limit".
    #[arg(long, env = "PAYMENT_LIMIT_CENTS", default_value_t = 100_000)]
    pub payment_limit_cents: i64,

    #[command(flatten)]
    pub keys: KeyConfig,

    /// A fault armed from the start, as `PUT /admin/fault` takes it:
    /// `{"kind": "lose-response", "rate": 0.33}`, for the `next` N calls or at a `rate`
    /// of them. On charges, or on refunds with `"endpoint": "refunds"`: `unavailable`,
    /// `slow` (`delay_ms`, waits before the work), `lose-response` (cuts the connection
    /// after the commit), `commit-late` (`delay_ms`, holds the commit). On refunds only:
    /// `refuse` (`code`, default `charge_disputed`; 400, stored with the key). On the
    /// list (`GET /v1/charges`) only: `list-lag` (`lag_ms`, leaves out younger charges).
    #[arg(long, env = "PROVIDER_FAULT", value_parser = Fault::parse)]
    pub provider_fault: Option<Fault>,

    #[command(flatten)]
    pub pruning: PruneConfig,
}

impl Config {
    /// The defaults, on a free loopback port, with no pruner: for tests.
    pub fn local(database_url: &str) -> Self {
        Self::parse_from([
            SERVICE,
            "--database-url",
            database_url,
            "--http-addr",
            "127.0.0.1:0",
            "--prune-interval",
            "off",
        ])
    }
}

/// Starts a provider in this process on a free loopback port, with `configure`'s changes to
/// the defaults; returns its base URL and the token that stops it. For tests.
pub async fn start_local(
    database_url: &str,
    configure: impl FnOnce(&mut Config),
) -> anyhow::Result<(String, CancellationToken)> {
    let mut config = Config::local(database_url);
    configure(&mut config);
    let app = Application::build(config).await?;
    let url = app.url();
    let shutdown = CancellationToken::new();
    tokio::spawn(app.run_until_stopped(shutdown.clone()));
    Ok((url, shutdown))
}

pub struct Application {
    config: Config,
    listener: SeverableListener,
    pool: Pool,
}

impl Application {
    /// Binds the listener and migrates the database, waiting for one that is not up yet.
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let tcp = TcpListener::bind(config.http_addr)
            .await
            .with_context(|| format!("cannot listen on {}", config.http_addr))?;
        let listener = match (&config.tls_cert_file, &config.tls_key_file) {
            (Some(cert), Some(key)) => saga::https::Listener::tls(tcp, cert, key)?,
            _ => saga::https::Listener::plain(tcp),
        };
        saga::db::migrate_when_reachable(|| {
            saga::db::migrate_alone(config.database_url.as_str(), migrations, HISTORY_TABLE)
        })
        .await
        .context("cannot migrate the database")?;
        let pool = saga::db::pool(
            config.database_url.as_str(),
            config.database_pool_size,
            saga::lease::DEFAULT_LEASE,
        )?;
        Ok(Self {
            config,
            listener: SeverableListener(listener),
            pool,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        axum::serve::Listener::local_addr(&self.listener.0)
            .expect("a bound listener has an address")
    }

    /// Its base URL: `https://` when it serves TLS.
    pub fn url(&self) -> String {
        format!("{}://{}", self.listener.0.scheme(), self.local_addr())
    }

    /// Serves the API, the admin endpoints and `/health`, and prunes expired keys, until
    /// `shutdown`.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let faults = Arc::new(Faults::new(self.config.provider_fault.clone()));
        if let Some(fault) = &self.config.provider_fault {
            tracing::warn!(endpoint = fault.endpoint.name(), fault = %fault.to_json(), "fault armed from PROVIDER_FAULT");
        }
        let state = AppState {
            pool: self.pool.clone(),
            rules: Rules {
                limit_cents: self.config.payment_limit_cents,
                key_ttl: self.config.keys.idempotency_key_ttl,
                key_wait: self.config.keys.idempotency_key_wait,
            },
            faults: faults.clone(),
            stats: Arc::default(),
        };
        let router = saga::http::edge(
            charges::router(state.clone())
                .merge(refunds::router(state.clone()))
                .merge(admin(state))
                .merge(saga::http::health(self.pool.clone()))
                .merge(saga::probes::router(saga::probes::Probes::database(
                    self.pool.clone(),
                )))
                .merge(saga::metrics::router(None)),
            &self.config.http,
        )
        .layer(axum::middleware::from_fn(saga::metrics::track_http));
        let pruner = self.config.pruning.pruner(
            self.config.database_url.as_str(),
            vec![Target::idempotency_keys(
                self.config.keys.idempotency_key_ttl,
            )],
        )?;
        tracing::info!(service = SERVICE, addr = %self.local_addr(), "service started");
        let pruning = pruner.map(|pruner| tokio::spawn(pruner.run(shutdown.clone())));
        axum::serve(
            self.listener,
            router.into_make_service_with_connect_info::<Connection>(),
        )
        .with_graceful_shutdown(shutdown.clone().cancelled_owned())
        .await?;
        shutdown.cancel();
        if let Some(pruning) = pruning {
            pruning.await?;
        }
        Ok(())
    }
}

/// `PUT /admin/fault` arms a fault on its endpoint, `DELETE /admin/fault` disarms every
/// one (`?endpoint=refunds` one), `GET /admin/fault` shows them; `GET /admin/stats` counts
/// what the provider did. On the API's own port: the provider is a stand-in that listens
/// on loopback.
fn admin(state: AppState) -> Router {
    Router::new()
        .route(
            "/admin/fault",
            get(show_fault).put(arm_fault).delete(disarm_fault),
        )
        .route("/admin/stats", get(stats))
        .with_state(state)
}

async fn show_fault(State(state): State<AppState>) -> Json<Value> {
    Json(state.faults.to_json())
}

fn invalid_fault(message: String) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({ "error": { "code": "invalid_fault", "message": message } })),
    )
        .into_response()
}

async fn arm_fault(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let armed = saga::http::json_body(&headers, &body)
        .map_err(|error| error.to_string())
        .and_then(Fault::from_json);
    match armed {
        Ok(fault) => {
            tracing::warn!(endpoint = fault.endpoint.name(), fault = %fault.to_json(), "fault armed");
            state.faults.arm(fault);
            Json(state.faults.to_json()).into_response()
        }
        Err(message) => invalid_fault(message),
    }
}

#[derive(serde::Deserialize)]
struct DisarmQuery {
    endpoint: Option<String>,
}

async fn disarm_fault(State(state): State<AppState>, Query(query): Query<DisarmQuery>) -> Response {
    let endpoints = match query.endpoint.as_deref().map(Endpoint::parse) {
        None => Endpoint::ALL.to_vec(),
        Some(Ok(endpoint)) => vec![endpoint],
        Some(Err(message)) => return invalid_fault(message),
    };
    for endpoint in endpoints {
        state.faults.disarm(endpoint);
        tracing::info!(endpoint = endpoint.name(), "fault disarmed");
    }
    Json(state.faults.to_json()).into_response()
}

async fn stats(State(state): State<AppState>) -> Json<Value> {
    Json(state.stats.to_json())
}
