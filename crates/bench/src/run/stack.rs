//! The services of a run as processes on this run's own databases, topics and ports:
//! started, stopped and accounted for, and a relay held back.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use tokio_postgres::Client;

use crate::db::Databases;
use crate::procs::{self, Running, ServiceSpec, StackEnv, Usage};
use crate::sql::{self, Database};

use super::{Settings, log};

pub(super) const SERVICES: [&str; 3] = ["order-service", "payment-service", "notification-service"];
/// The stand-in card provider payment-service calls for every order. No step of the saga
/// (no Kafka, no inbox, no backlog of its own): it starts before the services, stops
/// after them, and stays up while the capacity phase holds their backlogs back.
pub(super) const PROVIDER: &str = payment_provider::SERVICE;

pub(super) struct Stack {
    pub(super) env: StackEnv,
    pub(super) specs: BTreeMap<&'static str, ServiceSpec>,
    running: BTreeMap<&'static str, Running>,
    pub(super) tick_hz: f64,
    /// CPU seconds and peak RSS per service over the whole run (restarts included).
    pub(super) totals: BTreeMap<&'static str, Usage>,
}

impl Stack {
    pub(super) async fn start(&mut self, name: &'static str) -> anyhow::Result<()> {
        self.start_with(name, &[]).await
    }

    /// Starts `name` with `extra` variables beside the run's own.
    pub(super) async fn start_with(
        &mut self,
        name: &'static str,
        extra: &[(&str, &str)],
    ) -> anyhow::Result<()> {
        let mut env = self.env.clone();
        env.extra.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        let running = Running::start(&self.specs[name], &env).await?;
        self.running.insert(name, running);
        Ok(())
    }

    pub(super) async fn start_all(&mut self) -> anyhow::Result<()> {
        for name in std::iter::once(PROVIDER).chain(SERVICES) {
            if !self.running.contains_key(name) {
                self.start(name).await?;
            }
        }
        Ok(())
    }

    pub(super) async fn stop(&mut self, name: &'static str) -> anyhow::Result<()> {
        if let Some(mut running) = self.running.remove(name) {
            self.account(name, running.usage_since_mark(self.tick_hz));
            running.stop().await?;
        }
        Ok(())
    }

    /// Stops the three services, the provider left running.
    pub(super) async fn stop_saga(&mut self) -> anyhow::Result<()> {
        for name in SERVICES {
            self.stop(name).await?;
        }
        Ok(())
    }

    pub(super) async fn stop_all(&mut self) -> anyhow::Result<()> {
        // The provider last, so that no charge is asked of a provider already gone.
        self.stop_saga().await?;
        self.stop(PROVIDER).await
    }

    fn account(&mut self, name: &'static str, usage: Usage) {
        self.totals.entry(name).or_default().add(&usage);
    }

    /// Each running service's usage since the last call, added to the run's totals.
    pub(super) fn usage(&mut self) -> BTreeMap<String, Usage> {
        let mut phase = BTreeMap::new();
        let names: Vec<&'static str> = self.running.keys().copied().collect();
        for name in names {
            let usage = self
                .running
                .get_mut(name)
                .expect("listed above")
                .usage_since_mark(self.tick_hz);
            self.account(name, usage.clone());
            phase.insert(name.to_owned(), usage);
        }
        phase
    }
}

/// Holds a relay back: while this session holds the relay's advisory lock, the service's
/// relay waits as a standby and committed outbox rows pile up.
pub(super) struct RelayHold(Client);

impl RelayHold {
    pub(super) async fn take(databases: &Databases, database: Database) -> anyhow::Result<Self> {
        let client = databases.connect(database).await?;
        client
            .execute("SELECT pg_advisory_lock($1)", &[&sql::relay_lock()?])
            .await?;
        Ok(Self(client))
    }

    /// Ends the session, which releases the lock; the standby relay takes over at its
    /// next look (`OUTBOX_POLL_INTERVAL_MS`).
    pub(super) fn release(self) {
        drop(self.0);
    }
}

fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Deletes the topics of earlier benchmark runs (`bench<digits>.…`), then creates this
/// run's.
async fn fresh_topics(settings: &Settings, namespace: &str) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &settings.brokers)
        .create()?;
    let metadata = admin
        .inner()
        .fetch_metadata(None, Duration::from_secs(10))?;
    let old: Vec<String> = metadata
        .topics()
        .iter()
        .map(|t| t.name().to_owned())
        .filter(|name| {
            name.strip_prefix("bench").is_some_and(|rest| {
                let digits = rest.chars().take_while(char::is_ascii_digit).count();
                digits > 0 && rest[digits..].starts_with('.')
            })
        })
        .collect();
    if !old.is_empty() {
        let names: Vec<&str> = old.iter().map(String::as_str).collect();
        admin.delete_topics(&names, &AdminOptions::new()).await?;
    }
    let topics = saga::Topics::new(namespace).all();
    saga::kafka::create_topics(&settings.brokers, &topics, settings.partitions).await
}

/// This run's databases and topics, fresh, and the services ready to start on them.
pub(super) async fn fresh_stack(
    settings: &Settings,
) -> anyhow::Result<(Databases, Stack, String, u64)> {
    std::fs::create_dir_all(&settings.out)?;
    let run_id = unix_seconds();
    let namespace = format!("bench{run_id}.");
    let databases = Databases::new(&settings.postgres, "bench_");
    log(format!(
        "fresh databases bench_* and topics {namespace}*; results in {}",
        settings.out.display()
    ));
    databases.recreate().await?;
    fresh_topics(settings, &namespace).await?;

    // The order API on the first port, then payment-service and notification-service,
    // then the provider, which payment-service is pointed at.
    let provider_port = settings.first_port + 3;
    let mut specs = BTreeMap::new();
    for (i, (name, database)) in SERVICES
        .into_iter()
        .chain([PROVIDER])
        .zip([
            Database::Orders,
            Database::Payments,
            Database::Notifications,
            Database::Provider,
        ])
        .enumerate()
    {
        let env = match name {
            "payment-service" => vec![(
                "PROVIDER_URL".to_owned(),
                format!("http://127.0.0.1:{provider_port}"),
            )],
            _ => Vec::new(),
        };
        specs.insert(
            name,
            ServiceSpec {
                name,
                // Plain TCP, as pgbench's ceiling is measured (`pgbench.rs`): the
                // default, `prefer`, takes the TLS the server offers, and the services
                // would pay for encryption the ceiling does not.
                database_url: format!("{}?sslmode=disable", databases.url(database)),
                port: settings.first_port + i as u16,
                env,
            },
        );
    }
    let stack = Stack {
        env: StackEnv {
            bin_dir: settings.bin_dir.clone(),
            brokers: settings.brokers.clone(),
            namespace: namespace.clone(),
            log_dir: settings.out.clone(),
            rust_log: settings.rust_log.clone(),
            extra: vec![
                (
                    "DATABASE_POOL_SIZE".to_owned(),
                    settings.pool_size.to_string(),
                ),
                (
                    "CONSUMER_BATCH_SIZE".to_owned(),
                    settings.consumer_batch.to_string(),
                ),
            ],
        },
        specs,
        running: BTreeMap::new(),
        tick_hz: procs::tick_hz(),
        totals: BTreeMap::new(),
    };
    Ok((databases, stack, namespace, run_id))
}
