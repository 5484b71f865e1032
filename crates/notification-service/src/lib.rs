//! notification-service: tells each customer what became of their order, once per kind
//! of news.
//!
//! - [`notify_customer`]: consumes `order.confirmed`, `order.cancelled` and
//!   `order.refunded` from `orders`, records the notification and enqueues
//!   `notification.sent`, in one transaction.
//!
//! It listens to the order's *decided* state, never to payment results: a payment result
//! that the saga rejected (a late `payment.failed` for a confirmed order) never reaches
//! the customer, and a refund reaches them as order-service recorded it.

pub mod notify_customer;

use std::net::SocketAddr;

use clap::Parser;
use saga::config::{DatabaseConfig, HttpLimits, KafkaConfig, RetentionConfig};
use saga::service::{Service, Subscription};
use tokio_util::sync::CancellationToken;

pub use notify_customer::NotifyCustomer;

pub const SERVICE: &str = "notification-service";

mod embedded {
    refinery::embed_migrations!("../../migrations/notifications");
}

/// This service's own migrations (`migrations/notifications`), applied after the saga's.
pub fn migrations() -> refinery::Runner {
    embedded::migrations::runner()
}

/// Where [`migrations`] records what it applied.
pub const HISTORY_TABLE: &str = "notification_schema_history";

/// notification-service: notifies customers of their order's outcome.
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
    #[arg(long, env = "HTTP_ADDR", default_value = "127.0.0.1:8082")]
    pub http_addr: SocketAddr,
}

pub struct Application {
    service: Service,
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
        Ok(Self { service })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.service.local_addr()
    }

    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let topics = self.service.topics();
        let handler = NotifyCustomer::new(topics.clone());
        let subscription = Subscription {
            topic: topics.orders.clone(),
            handler,
            publishes: topics.notifications.clone(),
        };
        self.service
            .run(axum::Router::new(), subscription, shutdown)
            .await
    }
}
