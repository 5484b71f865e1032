//! Phase 3, the ceiling: pgbench running the handlers' SQL on databases of the same
//! schema, each transaction right after the service ran it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;

use crate::db::Databases;
use crate::pgbench;
use crate::sql::Transaction;

use super::{Plan, Settings, log};

/// Phase 3, run piecewise inside phase 2: pgbench on fresh databases of the same schema,
/// each transaction right after the service's own run at it, so both meet the machine
/// in about the same state (other work on it shifts both, not one).
pub(super) struct Ceilings {
    pgbench: PathBuf,
    databases: Databases,
    scripts: Vec<(Transaction, PathBuf)>,
    pool_size: u32,
    pub(super) partitions: u32,
    duration: Duration,
    relay_rows: u32,
    /// The consumers' transactions as they run in batches: the transaction each
    /// batches, its name and its script ([`pgbench::BATCHED`]); none a transaction per
    /// event.
    batched: Vec<(&'static str, &'static str, PathBuf)>,
    consumer_batch: u32,
    pub(super) measured: Vec<pgbench::Ceiling>,
}

impl Ceilings {
    pub(super) async fn prepare(settings: &Settings, plan: &Plan) -> anyhow::Result<Self> {
        let databases = Databases::new(&settings.postgres, "bench_ceiling_");
        databases.recreate().await?;
        databases.migrate().await?;
        pgbench::prepare(&databases, plan.relay_rows).await?;
        let folder = settings.out.join("pgbench");
        let scripts = pgbench::write_scripts(&folder)?;
        let batched = if settings.consumer_batch > 1 {
            pgbench::write_batched_scripts(&folder, &scripts, settings.consumer_batch)?
        } else {
            Vec::new()
        };
        Ok(Self {
            pgbench: pgbench::find_pgbench()?,
            scripts,
            batched,
            consumer_batch: settings.consumer_batch,
            databases,
            pool_size: settings.pool_size,
            partitions: settings.partitions as u32,
            duration: plan.pgbench,
            relay_rows: plan.relay_rows,
            measured: Vec::new(),
        })
    }

    /// Runs transaction `name`'s script, and in batches its batched script too if it is
    /// a consumer's; tried again if PostgreSQL went away meanwhile (another test suite on
    /// this machine stops the cluster now and then).
    pub(super) async fn measure(&mut self, name: &str) -> anyhow::Result<()> {
        let (transaction, script) = self
            .scripts
            .iter()
            .find(|(t, _)| t.name == name)
            .with_context(|| format!("no pgbench script {name}"))?;
        let ceiling = self.run(transaction, script).await?;
        self.measured.push(ceiling);
        if let Some((_, batched_name, script)) = self.batched.iter().find(|(of, ..)| *of == name) {
            let mut ceiling = self.run(transaction, script).await?;
            ceiling.name = batched_name;
            ceiling.what = pgbench::BATCHED_WHAT;
            ceiling.events_per_second *= f64::from(self.consumer_batch);
            ceiling.events *= f64::from(self.consumer_batch);
            self.measured.push(ceiling);
        }
        Ok(())
    }

    async fn run(
        &self,
        transaction: &Transaction,
        script: &std::path::Path,
    ) -> anyhow::Result<pgbench::Ceiling> {
        let name = transaction.name;
        // The script's own name: a consumer's batched script runs as its transaction.
        let label = script.file_stem().unwrap_or_default().to_string_lossy();
        // The connections each transaction has in the services: HTTP requests share the
        // pool; a consumer applies one event per partition at a time; one relay.
        let connections = match name {
            "create" | "create keyed" => self.pool_size,
            "relay" => 1,
            _ => self.partitions,
        };
        let mut tries = 0;
        let ceiling = loop {
            tries += 1;
            log(format!("pgbench {label} at {connections} connections"));
            match pgbench::run(
                &self.pgbench,
                &self.databases,
                transaction,
                script,
                connections,
                self.duration,
                self.relay_rows,
            )
            .await
            {
                Ok(ceiling) => break ceiling,
                Err(error) if tries < 3 => {
                    log(format!("pgbench {label} failed, trying again: {error:#}"));
                    tokio::time::sleep(Duration::from_secs(10)).await;
                }
                Err(error) => return Err(error),
            }
        };
        log(format!("pgbench {label}: {:.0} tps", ceiling.tps));
        Ok(ceiling)
    }
}
