//! sagactl: what the saga did, read from where it is recorded (the services' databases
//! and the topics), for an operator finding a stuck order and a student watching a
//! replay bounce off a guard.
//!
//! - [`story`]: one order's steps across the services, the provider and the topics, with
//!   what every delivery of its events met.
//! - [`render`]: the story, stuck orders and dead letters as text.
//!
//! It reads only, but for `refund retry`, which asks payment-service to try a refused
//! refund again ([`retry_refund`]).

mod refund;
pub mod render;
pub mod story;
pub mod web;

pub use refund::{render_retry, retry_refund};

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Args;
use saga::Topics;
use time::OffsetDateTime;
use uuid::Uuid;

/// Where the saga keeps what sagactl reads: the four databases and the broker. The
/// defaults are those of `scripts/up` and of the compose stack's published ports, and
/// log in as each database's read-only role (`<database>_reader`), never a service's.
#[derive(Debug, Clone, Args)]
pub struct Sources {
    /// The orders database; by default as `orders_reader` on 127.0.0.1:5432, with the
    /// password `PG_PASSWORD_ORDERS_READER` or the demo's.
    #[arg(
        long,
        env = "ORDERS_DATABASE_URL",
        hide_env_values = true,
        hide_default_value = true,
        default_value_t = reader_url("orders")
    )]
    pub orders_database_url: String,
    /// The payments database; by default as `payments_reader` on 127.0.0.1:5432, with the
    /// password `PG_PASSWORD_PAYMENTS_READER` or the demo's.
    #[arg(
        long,
        env = "PAYMENTS_DATABASE_URL",
        hide_env_values = true,
        hide_default_value = true,
        default_value_t = reader_url("payments")
    )]
    pub payments_database_url: String,
    /// The notifications database; by default as `notifications_reader` on 127.0.0.1:5432, with the
    /// password `PG_PASSWORD_NOTIFICATIONS_READER` or the demo's.
    #[arg(
        long,
        env = "NOTIFICATIONS_DATABASE_URL",
        hide_env_values = true,
        hide_default_value = true,
        default_value_t = reader_url("notifications")
    )]
    pub notifications_database_url: String,
    /// The provider database; by default as `provider_reader` on 127.0.0.1:5432, with the
    /// password `PG_PASSWORD_PROVIDER_READER` or the demo's.
    #[arg(
        long,
        env = "PROVIDER_DATABASE_URL",
        hide_env_values = true,
        hide_default_value = true,
        default_value_t = reader_url("provider")
    )]
    pub provider_database_url: String,
    /// Kafka bootstrap servers, comma separated.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,
    /// The services' KAFKA_NAMESPACE, if they were given one.
    #[arg(long, env = "KAFKA_NAMESPACE", default_value = "",
          value_parser = |s: &str| Ok::<_, String>(Topics::new(s)))]
    pub topics: Topics,
}

/// `database` on this machine as its read-only role, with the password `scripts/lib.sh`
/// gives that role (`PG_PASSWORD_<ROLE>`, or the demo's `<role>-pw`).
fn reader_url(database: &str) -> String {
    let role = format!("{database}_reader");
    let password = saga::db::role_password(&role);
    format!("postgres://{role}:{password}@127.0.0.1:5432/{database}")
}

/// `15:12:06.014`: a time of day to the millisecond, in UTC.
pub fn clock(at: OffsetDateTime) -> String {
    at.format(time::macros::format_description!(
        "[hour]:[minute]:[second].[subsecond digits:3]"
    ))
    .unwrap_or_default()
}

/// An order, for `sagactl orders`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Listed {
    pub id: Uuid,
    pub status: String,
    pub amount_cents: i64,
    /// Its outcome decided and its cancellation, if any, answered by payment-service.
    pub settled: bool,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

/// Which orders `sagactl orders` lists.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only those with this status.
    pub status: Option<String>,
    /// Only those not settled: pending, or cancelled with the cancellation not answered
    /// yet (a refund on its way), which `status` alone cannot tell.
    pub unsettled: bool,
    /// Only those placed more than this long ago.
    pub older_than: Duration,
}

/// The newest `limit` orders that pass `filter`.
pub async fn orders(
    databases: &story::Databases,
    filter: &Filter,
    limit: i64,
) -> anyhow::Result<Vec<Listed>> {
    let rows = databases
        .orders()
        .query(
            "SELECT id, status, amount_cents, settled_at IS NOT NULL AS settled, created_at,
                    updated_at
               FROM orders
              WHERE ($1::text IS NULL OR status = $1)
                AND (NOT $2 OR settled_at IS NULL)
                AND created_at < now() - make_interval(secs => $3)
              ORDER BY created_at DESC LIMIT $4",
            &[
                &filter.status,
                &filter.unsettled,
                &filter.older_than.as_secs_f64(),
                &limit,
            ],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| Listed {
            id: row.get("id"),
            status: row.get("status"),
            amount_cents: row.get("amount_cents"),
            settled: row.get("settled"),
            created_at: row.get("created_at"),
            updated_at: row.get("updated_at"),
        })
        .collect())
}

/// One dead-letter topic, summarised.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeadLetters {
    pub topic: String,
    pub count: usize,
    /// How many records each reason holds, most frequent first.
    pub reasons: Vec<(String, usize)>,
    #[serde(with = "time::serde::rfc3339::option")]
    pub newest: Option<OffsetDateTime>,
}

/// Every dead-letter topic of the saga: how many records, for which reasons.
pub async fn dead_letters(sources: &Sources) -> anyhow::Result<Vec<DeadLetters>> {
    let topics = &sources.topics;
    let mut summaries = Vec::new();
    for (topic, service, _) in story::consumers(topics) {
        let dead_letter_topic = topics.dead_letter(&topic, service);
        let records = story::records(&sources.kafka_brokers, &dead_letter_topic).await?;
        let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
        for record in &records {
            let reason = saga::kafka::header(record, "dlq.reason")
                .unwrap_or_else(|| "(no dlq.reason header)".into());
            *reasons.entry(reason).or_default() += 1;
        }
        let mut reasons: Vec<(String, usize)> = reasons.into_iter().collect();
        reasons.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        summaries.push(DeadLetters {
            topic: dead_letter_topic,
            count: records.len(),
            reasons,
            newest: records.iter().map(story::timestamp).max(),
        });
    }
    Ok(summaries)
}
