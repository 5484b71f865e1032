//! The ceiling: pgbench running each handler's transaction ([`crate::sql`]) against fresh
//! databases with the services' own schema, at the connection counts the services use.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde::Serialize;
use tokio::process::Command;

use crate::db::Databases;
use crate::sql::{self, Database, Transaction};

/// One pgbench measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Ceiling {
    pub name: &'static str,
    pub what: &'static str,
    pub database: Database,
    pub connections: u32,
    /// Transactions per second (for the relay: batches of [`sql::RELAY_BATCH`] rows).
    pub tps: f64,
    /// Events per second the transaction stands for: `tps`, or rows per second for the relay.
    pub events_per_second: f64,
    /// Events the run stood for.
    pub events: f64,
    /// From pgbench's start to its end, its connections' set-up included.
    pub cpu: crate::procs::CpuSplit,
    pub average_latency_ms: f64,
    pub script: PathBuf,
    pub load_average: [f64; 3],
}

/// Finds pgbench: on PATH, or where Debian's PostgreSQL server package puts it.
pub fn find_pgbench() -> anyhow::Result<PathBuf> {
    if let Ok(output) = std::process::Command::new("pgbench")
        .arg("--version")
        .output()
        && output.status.success()
    {
        return Ok("pgbench".into());
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("bin/pgbench"))
        .filter(|path| path.exists())
        .collect();
    found.sort();
    found
        .pop()
        .context("pgbench not found on PATH nor in /usr/lib/postgresql/*/bin (it comes with Debian's postgresql package)")
}

/// Writes every transaction's pgbench script into `folder`.
pub fn write_scripts(folder: &Path) -> anyhow::Result<Vec<(Transaction, PathBuf)>> {
    std::fs::create_dir_all(folder)?;
    let mut written = Vec::new();
    for transaction in Transaction::all() {
        let path = folder.join(format!("{}.sql", transaction.name));
        std::fs::write(&path, transaction.pgbench_script()?)?;
        written.push((transaction, path));
    }
    Ok(written)
}

/// The consumers' transactions, each with the name of its pgbench run in batches.
pub const BATCHED: [(&str, &str); 3] = [
    ("charge", "charge batched"),
    ("apply", "apply batched"),
    ("notify", "notify batched"),
];

/// What a batched run ([`BATCHED`]) measures.
pub const BATCHED_WHAT: &str = "the same, CONSUMER_BATCH_SIZE events to a transaction";

/// Writes the consumers' scripts in `scripts` as they run in batches of `batch` events
/// ([`sql::batched`]) into `folder`; returns, for each, the transaction it batches, its
/// own name ([`BATCHED`]) and its path.
pub fn write_batched_scripts(
    folder: &Path,
    scripts: &[(Transaction, PathBuf)],
    batch: u32,
) -> anyhow::Result<Vec<(&'static str, &'static str, PathBuf)>> {
    let mut written = Vec::new();
    for (of, name) in BATCHED {
        let (_, script) = scripts
            .iter()
            .find(|(t, _)| t.name == of)
            .with_context(|| format!("no pgbench script {of}"))?;
        let path = folder.join(format!("{name}.sql"));
        std::fs::write(
            &path,
            sql::batched(&std::fs::read_to_string(script)?, batch)?,
        )?;
        written.push((of, name, path));
    }
    Ok(written)
}

/// Readies the ceiling databases for the scripts: pending orders for `apply`, and a
/// backlog of unpublished outbox rows for `relay` (`relay_rows` of them).
pub async fn prepare(databases: &Databases, relay_rows: u32) -> anyhow::Result<()> {
    let orders = databases.connect(Database::Orders).await?;
    orders
        .batch_execute(&format!(
            "INSERT INTO orders (id, customer_id, status, amount_cents)
             SELECT md5('pending-' || i::text)::uuid, 'bench-ceiling', 'pending', 2598
               FROM generate_series(1, {}) AS i",
            sql::PENDING_ORDERS
        ))
        .await
        .context("making the pending orders for the apply script")?;
    orders
        .batch_execute(&format!(
            "INSERT INTO outbox (event_id, topic, key, type, payload)
             SELECT 'backlog-' || i, 'orders', md5(i::text)::uuid::text, 'order.created',
                    jsonb_build_object('order_id', md5(i::text)::uuid, 'customer_id', 'bench-ceiling',
                                       'amount_cents', 2598, 'items', jsonb_build_array(
                                         jsonb_build_object('product_id', '8f14e45f-ceea-4c9d-b2a5-0c1e3f4a9b21',
                                                            'quantity', 2, 'unit_price_cents', 1299)))
               FROM generate_series(1, {relay_rows}) AS i"
        ))
        .await
        .context("making the outbox backlog for the relay script")?;
    // A statement of its own: VACUUM refuses to run inside a multi-statement string.
    orders.batch_execute("VACUUM ANALYZE").await?;
    Ok(())
}

/// Runs one script: for `duration` at `connections` clients, or for the relay (one
/// connection, as one relay is active per database) until its backlog is published.
pub async fn run(
    pgbench: &Path,
    databases: &Databases,
    transaction: &Transaction,
    script: &Path,
    connections: u32,
    duration: Duration,
    relay_rows: u32,
) -> anyhow::Result<Ceiling> {
    let url = databases.url(transaction.database);
    let before = crate::procs::Ticks::now();
    let mut command = Command::new(pgbench);
    command
        .arg("--no-vacuum")
        // The services' statements are prepared per call by tokio-postgres, but the
        // ceiling is what the server can do at best: parse once, bind and execute.
        .args(["--protocol", "prepared"])
        .args(["--client", &connections.to_string()])
        .args(["--jobs", &connections.clamp(1, 2).to_string()])
        .arg("--file")
        .arg(script)
        // The benchmark's services talk to PostgreSQL in plain TCP (`stack.rs`). libpq's
        // default (`prefer`) would give pgbench TLS wherever the server offers it
        // (Debian's does, and `scripts/infra-up`'s), and the ceiling would pay for
        // encryption the services do not.
        .env("PGSSLMODE", "disable");
    if transaction.name == "relay" {
        // The relay's session settings, for every connection pgbench opens.
        command.env(
            "PGOPTIONS",
            format!(
                "-c synchronous_commit={} -c plan_cache_mode={}",
                sql::relay_synchronous_commit()?,
                sql::relay_plan_cache_mode()?
            ),
        );
        // Stop with a row still left, so every batch is a full one.
        let batches = (relay_rows / sql::RELAY_BATCH).saturating_sub(1).max(1);
        command.args(["--transactions", &batches.to_string()]);
    } else {
        command.args(["--time", &duration.as_secs().max(1).to_string()]);
    }
    command.arg(&url);
    let output = command
        .output()
        .await
        .with_context(|| format!("running {}", pgbench.display()))?;
    let cpu = crate::procs::Ticks::now().since(&before, crate::procs::tick_hz());
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() || stderr.contains("error") {
        bail!(
            "pgbench {} failed ({}):\n{stdout}\n{stderr}",
            transaction.name,
            output.status
        );
    }
    let tps = parse_number(&stdout, "tps = ")
        .with_context(|| format!("no `tps = ` in pgbench's output:\n{stdout}"))?;
    let average_latency_ms = parse_number(&stdout, "latency average = ").unwrap_or(f64::NAN);
    let events_per_transaction = if transaction.name == "relay" {
        f64::from(sql::RELAY_BATCH)
    } else {
        1.0
    };
    let transactions =
        parse_number(&stdout, "number of transactions actually processed: ").unwrap_or(f64::NAN);
    Ok(Ceiling {
        name: transaction.name,
        what: transaction.what,
        database: transaction.database,
        connections,
        tps,
        events_per_second: tps * events_per_transaction,
        events: transactions * events_per_transaction,
        cpu,
        average_latency_ms,
        script: script.to_owned(),
        load_average: crate::procs::load_average(),
    })
}

/// The number after `prefix` on the first line that has it; of `done/planned`, the first.
fn parse_number(text: &str, prefix: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.trim().strip_prefix(prefix)?;
        rest.split_whitespace()
            .next()?
            .split('/')
            .next()?
            .parse()
            .ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgbench_figures_are_read_from_its_report() {
        let report = "number of transactions actually processed: 59/59\n\
                      number of failed transactions: 0 (0.000%)\n\
                      latency average = 2.717 ms\n\
                      initial connection time = 12.050 ms\n\
                      tps = 1104.137297 (without initial connection time)\n";
        assert_eq!(parse_number(report, "tps = "), Some(1104.137297));
        assert_eq!(parse_number(report, "latency average = "), Some(2.717));
        let prefix = "number of transactions actually processed: ";
        assert_eq!(parse_number(report, prefix), Some(59.0));
        assert_eq!(
            parse_number(&format!("{prefix}41234\n"), prefix),
            Some(41234.0)
        );
    }
}
