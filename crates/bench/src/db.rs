//! The benchmark's databases: four per set (orders, payments, notifications, and the card
//! provider's), made fresh for every run under their own names, so the demo stack's
//! databases (which the walkthrough and the tests reset) are never touched.

use anyhow::Context as _;
use tokio_postgres::Client;

use crate::sql::Database;

/// One set of the saga's three databases and the provider's, named `<prefix>orders` and
/// so on.
#[derive(Debug, Clone)]
pub struct Databases {
    /// `postgres://user:password@host:port`, without a database.
    server: String,
    prefix: String,
}

impl Databases {
    pub fn new(server: &str, prefix: &str) -> Self {
        Self {
            server: server.trim_end_matches('/').to_owned(),
            prefix: prefix.to_owned(),
        }
    }

    pub fn name(&self, database: Database) -> String {
        let base = match database {
            Database::Orders => "orders",
            Database::Payments => "payments",
            Database::Notifications => "notifications",
            Database::Provider => "provider",
        };
        format!("{}{base}", self.prefix)
    }

    pub fn url(&self, database: Database) -> String {
        format!("{}/{}", self.server, self.name(database))
    }

    pub async fn connect(&self, database: Database) -> anyhow::Result<Client> {
        connect(&self.url(database)).await
    }

    /// Drops and recreates the four databases, empty.
    pub async fn recreate(&self) -> anyhow::Result<()> {
        let admin = connect(&format!("{}/postgres", self.server)).await?;
        for database in Database::ALL {
            let name = self.name(database);
            // Not `DROP DATABASE … WITH (FORCE)`: it refuses to end an autovacuum worker for
            // a role that is not a superuser, and the last run's deletes can leave one at
            // work in its databases. A plain DROP ends autovacuum by itself and waits a few
            // seconds for the sessions ended here (a run killed with its services running).
            admin
                .execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                      WHERE datname = $1 AND usename = current_user AND pid <> pg_backend_pid()",
                    &[&name],
                )
                .await
                .with_context(|| format!("ending the sessions on database {name}"))?;
            // Two calls: a multi-statement string is one transaction, which DROP DATABASE refuses.
            for statement in [
                format!("DROP DATABASE IF EXISTS \"{name}\""),
                format!("CREATE DATABASE \"{name}\""),
            ] {
                admin
                    .batch_execute(&statement)
                    .await
                    .with_context(|| format!("recreating database {name}"))?;
            }
        }
        Ok(())
    }

    /// Applies each service's migrations, as the service itself does at start.
    pub async fn migrate(&self) -> anyhow::Result<()> {
        saga::db::migrate(
            &self.url(Database::Orders),
            order_service::migrations,
            order_service::HISTORY_TABLE,
        )
        .await?;
        saga::db::migrate(
            &self.url(Database::Payments),
            payment_service::migrations,
            payment_service::HISTORY_TABLE,
        )
        .await?;
        saga::db::migrate(
            &self.url(Database::Notifications),
            notification_service::migrations,
            notification_service::HISTORY_TABLE,
        )
        .await?;
        saga::db::migrate_alone(
            &self.url(Database::Provider),
            payment_provider::migrations,
            payment_provider::HISTORY_TABLE,
        )
        .await?;
        Ok(())
    }
}

pub async fn connect(url: &str) -> anyhow::Result<Client> {
    let config = saga::db::parse_url(url)?;
    saga::db::connect(&config)
        .await
        .with_context(|| format!("connecting to {url}"))
}
