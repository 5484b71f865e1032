//! payment-service: charges each new order once and announces the result.
//!
//! - [`charge_order`]: consumes `order.created` from `orders`, decides, records the
//!   payment and enqueues `payment.succeeded` / `payment.failed`, in one transaction.

pub mod charge_order;

use std::net::SocketAddr;

use clap::Parser;
use saga::config::{DatabaseConfig, KafkaConfig, RetentionConfig};
use saga::service::{Service, Subscription};
use tokio_util::sync::CancellationToken;

pub use charge_order::{ChargeOrder, PaymentPolicy};

pub const SERVICE: &str = "payment-service";

mod embedded {
    refinery::embed_migrations!("../../migrations/payments");
}

/// This service's own migrations (`migrations/payments`), applied after the saga's.
pub fn migrations() -> refinery::Runner {
    embedded::migrations::runner()
}

/// Where [`migrations`] records what it applied.
pub const HISTORY_TABLE: &str = "payment_schema_history";

/// payment-service: charges orders.
#[derive(Debug, Clone, Parser)]
#[command(version, about)]
pub struct Config {
    #[command(flatten)]
    pub database: DatabaseConfig,
    #[command(flatten)]
    pub kafka: KafkaConfig,
    #[command(flatten)]
    pub retention: RetentionConfig,
    /// Where `/health` listens; port 0 picks a free port.
    #[arg(long, env = "HTTP_ADDR", default_value = "127.0.0.1:8081")]
    pub http_addr: SocketAddr,
    /// Orders above this amount (in cents) fail with reason `amount exceeds limit`.
    #[arg(long, env = "PAYMENT_LIMIT_CENTS", default_value_t = 100_000)]
    pub payment_limit_cents: i64,
}

pub struct Application {
    service: Service,
    policy: PaymentPolicy,
}

impl Application {
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let service = Service::start(
            SERVICE,
            &config.database,
            &config.kafka,
            &config.retention,
            config.http_addr,
            migrations,
            HISTORY_TABLE,
        )
        .await?;
        let policy = PaymentPolicy {
            limit_cents: config.payment_limit_cents,
        };
        Ok(Self { service, policy })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.service.local_addr()
    }

    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let topics = self.service.topics();
        let handler = ChargeOrder::new(topics.clone(), self.policy);
        let subscription = Subscription {
            topic: topics.orders.clone(),
            handler,
        };
        self.service
            .run(axum::Router::new(), subscription, shutdown)
            .await
    }
}
