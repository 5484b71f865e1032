//! payment-service: charges each new order once and announces the result; refunds a
//! cancelled order's charge once, and answers every cancellation.
//!
//! - [`payment`]: the order's payment, the intent committed before every call to the
//!   provider and the ending recorded after it; what an unanswered call leaves.
//! - [`charge_order`]: consumes `order.created` from `orders`, commits the charge's
//!   intent, asks the card provider to charge it (outside any transaction, with a key
//!   that makes the call safe to repeat), then records the payment and enqueues
//!   `payment.succeeded` / `payment.failed`, in one transaction.
//! - [`refund_order`]: consumes `order.cancelled` from `orders`, resolves an undecided
//!   charge first, refunds the charge that stands (the same way: intent, then the call
//!   with a key), then records the refund, its failure, or a tombstone where nothing was
//!   charged, and enqueues `payment.refunded` / `payment.refund_failed` /
//!   `payment.voided`, in one transaction.
//! - [`refund`]: a refund's intent, call and recording, shared by the cancellation and
//!   [`retry_refund`], an operator's retry of a refused refund (`POST
//!   /admin/refunds/{order_id}/retry`).
//! - [`settlement`]: the payments not at rest, counted for the metrics and escalated
//!   before the provider forgets an undecided charge's key.
//! - [`provider`]: the HTTP client of the provider (payment-provider, or any service
//!   with its API), and what each of its answers means.

pub mod charge_order;
pub mod payment;
pub mod provider;
pub mod refund;
pub mod refund_order;
pub mod retry_refund;
pub mod settlement;

use std::net::SocketAddr;

use clap::Parser;
use saga::config::{DatabaseConfig, HttpLimits, KafkaConfig, RetentionConfig};
use saga::handler::Pair;
use saga::service::{Service, Subscription};
use tokio_util::sync::CancellationToken;

pub use charge_order::ChargeOrder;
pub use provider::{Provider, ProviderConfig};
pub use refund_order::RefundOrder;

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
    #[command(flatten)]
    pub http: HttpLimits,
    /// Where `/health` listens; port 0 picks a free port.
    #[arg(long, env = "HTTP_ADDR", default_value = "127.0.0.1:8081")]
    pub http_addr: SocketAddr,
    #[command(flatten)]
    pub provider: ProviderConfig,
}

pub struct Application {
    service: Service,
    provider: Provider,
}

impl Application {
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let service = Service::start(
            SERVICE,
            &config.database,
            &config.kafka,
            &config.retention,
            (config.http_addr, &config.http),
            (migrations, HISTORY_TABLE),
        )
        .await?;
        let provider = Provider::new(&config.provider)?;
        provider.check_tls().await?;
        Ok(Self { service, provider })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.service.local_addr()
    }

    pub async fn run_until_stopped(mut self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let topics = self.service.topics();
        self.service.run_also(
            "settlement watch",
            settlement::watch(
                self.service.pool.clone(),
                self.service.relay.clone(),
                self.provider.key_ttl,
                shutdown.clone(),
            ),
        );
        let retry = retry_refund::router(
            self.service.pool.clone(),
            topics.clone(),
            self.provider.clone(),
        );
        let handler = Pair(
            ChargeOrder::new(topics.clone(), self.provider.clone()),
            RefundOrder::new(topics.clone(), self.provider),
        );
        let subscription = Subscription {
            topic: topics.orders.clone(),
            handler,
            publishes: topics.payments.clone(),
        };
        self.service.run(retry, subscription, shutdown).await
    }
}
