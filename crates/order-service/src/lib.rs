//! order-service: the saga's start and its end.
//!
//! - [`api`]: `POST /v1/orders` places a `pending` order and, in the same transaction,
//!   the `order.created` event and the request's `Idempotency-Key`, so a client's retry
//!   gets the first answer back; `GET /v1/orders/{id}` shows where it stands;
//!   `POST /v1/orders/{id}/cancel` cancels one ([`cancel`]).
//! - [`apply_payment_result`]: consumes the payment's result from `payments` and moves
//!   the order to `confirmed` or `cancelled`, exactly once, whatever the delivery layer
//!   repeats or reorders.
//! - [`cancel`]: a cancellation by the customer or the deadline, one transaction with its
//!   `order.cancelled`; [`deadline`] sweeps for the orders that never settle.
//! - [`settle_cancellation`]: consumes payment-service's answer to a cancellation from
//!   `payments`: the order has settled, and a refund is announced as `order.refunded`.
//! - [`orders`]: the order aggregate's SQL.
//! - [`admission`]: while the saga has too many orders in flight, new ones are refused
//!   (`503 saga_behind`) rather than accepted to wait.

pub mod admission;
pub mod api;
pub mod apply_payment_result;
pub mod cancel;
pub mod deadline;
pub mod orders;
pub mod settle_cancellation;

use std::net::SocketAddr;

use clap::Parser;
use saga::config::{DatabaseConfig, HttpLimits, IdempotencyConfig, KafkaConfig, RetentionConfig};
use saga::handler::Pair;
use saga::retention::Target;
use saga::service::{Service, Subscription};
use tokio_util::sync::CancellationToken;

pub use apply_payment_result::ApplyPaymentResult;
pub use settle_cancellation::SettleCancellation;

use crate::admission::{Admission, AdmissionConfig};
use crate::deadline::DeadlineConfig;

pub const SERVICE: &str = "order-service";

mod embedded {
    refinery::embed_migrations!("../../migrations/orders");
}

/// This service's own migrations (`migrations/orders`), applied after the saga's.
pub fn migrations() -> refinery::Runner {
    embedded::migrations::runner()
}

/// Where [`migrations`] records what it applied.
pub const HISTORY_TABLE: &str = "order_schema_history";

/// order-service: order API and payment-result consumer.
#[derive(Debug, Clone, Parser)]
#[command(version, about)]
pub struct Config {
    #[command(flatten)]
    pub database: DatabaseConfig,
    #[command(flatten)]
    pub kafka: KafkaConfig,
    #[command(flatten)]
    pub retention: RetentionConfig,
    #[command(flatten)]
    pub idempotency: IdempotencyConfig,
    #[command(flatten)]
    pub http: HttpLimits,
    #[command(flatten)]
    pub admission: AdmissionConfig,
    #[command(flatten)]
    pub deadline: DeadlineConfig,
    /// Where the order API and `/health` listen; port 0 picks a free port.
    #[arg(long, env = "HTTP_ADDR", default_value = "127.0.0.1:8080")]
    pub http_addr: SocketAddr,
}

pub struct Application {
    service: Service,
    idempotency: IdempotencyConfig,
    admission: AdmissionConfig,
    deadline: DeadlineConfig,
}

impl Application {
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let mut service = Service::start(
            SERVICE,
            &config.database,
            &config.kafka,
            &config.retention,
            (config.http_addr, &config.http),
            (migrations, HISTORY_TABLE),
        )
        .await?;
        // An expired key is a new request already; the pruner deletes its row.
        service.prune_also(Target::idempotency_keys(
            config.idempotency.keys.idempotency_key_ttl,
        ));
        Ok(Self {
            service,
            idempotency: config.idempotency,
            admission: config.admission,
            deadline: config.deadline,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.service.local_addr()
    }

    pub async fn run_until_stopped(mut self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let topics = self.service.topics();
        let (admission, watcher) = Admission::new(
            self.service.pool.clone(),
            self.service.relay.clone(),
            &self.admission,
            shutdown.clone(),
        );
        self.service.run_also("admission", watcher);
        self.service.run_also(
            "deadline",
            deadline::sweep(
                self.service.pool.clone(),
                self.service.relay.clone(),
                topics.clone(),
                self.deadline,
                self.service
                    .lease(deadline::DEADLINE_LOCK, "deadline sweeper")?,
                shutdown.clone(),
            ),
        );
        let router = api::router(
            self.service.pool.clone(),
            self.service.relay.clone(),
            topics.clone(),
            self.idempotency,
            admission,
        );
        let handler = Pair(
            ApplyPaymentResult::new(topics.clone()),
            SettleCancellation::new(topics.clone()),
        );
        let subscription = Subscription {
            topic: topics.payments.clone(),
            handler,
            publishes: topics.orders.clone(),
        };
        self.service.run(router, subscription, shutdown).await
    }
}
