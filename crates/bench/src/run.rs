//! One benchmark run, start to finish:
//!
//! 1. **Load steps**, the whole saga running: closed loops overload it for a first
//!    estimate of its rate; open loops ramp from there until one falls behind, which
//!    finds the highest sustained rate; open loops at fractions of that give latency
//!    against offered load (half of it is the latency point).
//! 2. **Capacity**, each transaction with a backlog waiting: orders are placed while
//!    every consumer is stopped and the relay held back (the bench holds the relay's
//!    advisory lock, as a standby relay would find it held), then each relay and each
//!    consumer is let go in turn, so each one's rate is its own, not its input's.
//!    ChargeOrder's includes its call to the card provider, which stays up throughout;
//!    right after it the provider is called alone, as payment-service calls it.
//! 3. **Ceiling**: pgbench runs each handler's SQL ([`crate::sql`]) on fresh databases
//!    of the same schema at the services' connection counts, each transaction right
//!    after the service ran it in phase 2, so other work on the machine weighs on both
//!    alike.
//! 4. **Pruning**: payment-service's pruner deleting old ids while it charges a backlog,
//!    against the same backlog with the pruner off.
//! 5. **Cancellations**: a backlog settled with none of its orders cancelled and with
//!    one in ten, and payment-service through a backlog of refunds.
//! 6. **Traces**: a backlog settled with the services exporting their spans with OTLP
//!    (to a receiver that drops them) and without.
//!
//! The saga's databases, topics and ports are the benchmark's own, fresh each run, and so
//! are the card provider's database and port: the demo stack, the walkthrough and the
//! tests never see them.
//!
//! Each phase has a file of its own under `run/`: `load`, `capacity`, `ceiling`,
//! `pruning`, `cancellations`, `traces`, then `exactly_once` (the effects and dead letters
//! counted at the end) and
//! `assemble` (the report made of it all); `stack` holds the services as processes.

mod assemble;
mod cancellations;
mod capacity;
mod ceiling;
mod exactly_once;
mod load;
mod pruning;
mod stack;
mod traces;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use time::OffsetDateTime;

use crate::db::Databases;
use crate::load::{LoadGenerator, Shape};
use crate::pgbench;
use crate::procs;
use crate::report::{Cancellations, Capacity, Machine, Pruning, Report, Step, Traces};
use crate::sql::{Database, Transaction};

use ceiling::Ceilings;
use stack::Stack;

/// How long and how hard a run goes.
#[derive(Debug, Clone)]
pub struct Plan {
    pub mode: &'static str,
    /// Closed-loop concurrencies, one step each. They overload the saga (the API takes
    /// orders faster than the consumers finish them), which gives a first estimate of
    /// its rate: what it confirms meanwhile.
    pub closed: Vec<u32>,
    /// Open-loop rates as multiples of that estimate, tried in turn until one falls
    /// behind (past the last, `RAMP_ONWARD` faster each time); the highest that kept up
    /// is the highest sustained rate.
    pub ramp: Vec<f64>,
    /// Steps halving the gap between the highest rate that kept up and the lowest that
    /// did not, once the ramp has found both.
    pub bisect: u32,
    /// Open-loop rates as fractions of the highest sustained rate, for latency.
    pub latency: Vec<f64>,
    pub step: Duration,
    /// Orders placed for the capacity phase.
    pub backlog: u32,
    /// Orders settled in each of phase 6's four steps: more than a backlog, since the
    /// difference it looks for (a few percent) is smaller than a short step's noise.
    pub traced: u32,
    pub pgbench: Duration,
    /// Outbox rows made for pgbench's relay script.
    pub relay_rows: u32,
    /// Old ids in payment-service's inbox for its pruner to delete in phase 4.
    pub old_ids: u32,
}

impl Plan {
    /// About a minute of load, for working on the code.
    pub fn quick() -> Self {
        Self {
            mode: "quick",
            closed: vec![8],
            ramp: vec![1.0, 1.5],
            bisect: 1,
            latency: vec![0.5],
            step: Duration::from_secs(10),
            backlog: 1_500,
            traced: 6_000,
            pgbench: Duration::from_secs(5),
            relay_rows: 60_000,
            old_ids: 200_000,
        }
    }

    /// The figures for the benchmark's page: more steps, longer ones, a bigger backlog.
    pub fn full() -> Self {
        Self {
            mode: "full",
            closed: vec![2, 8, 32],
            ramp: vec![0.75, 1.0, 1.25, 1.5, 2.0],
            bisect: 2,
            latency: vec![0.25, 0.5],
            step: Duration::from_secs(30),
            backlog: 6_000,
            traced: 15_000,
            pgbench: Duration::from_secs(15),
            relay_rows: 200_000,
            old_ids: 1_000_000,
        }
    }
}

/// Where things are and what the services are given.
#[derive(Debug, Clone)]
pub struct Settings {
    pub bin_dir: PathBuf,
    /// `postgres://user:password@host:port`
    pub postgres: String,
    pub brokers: String,
    pub partitions: i32,
    pub pool_size: u32,
    /// CONSUMER_BATCH_SIZE: 1 is a transaction per event.
    pub consumer_batch: u32,
    pub first_port: u16,
    pub out: PathBuf,
    pub font: PathBuf,
    pub kafka_version: String,
    pub command: String,
    pub rust_log: String,
}

fn log(message: impl std::fmt::Display) {
    let [one, five, fifteen] = procs::load_average();
    eprintln!("[bench] {message}  (load average {one:.2} {five:.2} {fifteen:.2})");
}

async fn postgres_version(databases: &Databases) -> anyhow::Result<String> {
    let client = databases.connect(Database::Orders).await?;
    let version: String = client.query_one("SHOW server_version", &[]).await?.get(0);
    Ok(format!(
        "PostgreSQL {}",
        version.split_whitespace().next().unwrap_or(&version)
    ))
}

/// Latency at one fixed rate, `steps` times, with nothing else measured: for comparing
/// two builds (`--bin-dir`) under the same offered load.
pub async fn probe(
    settings: Settings,
    rate: f64,
    steps: u32,
    step: Duration,
) -> anyhow::Result<Vec<Step>> {
    let (databases, mut stack, _, run_id) = stack::fresh_stack(&settings).await?;
    let plan = Plan {
        step,
        ..Plan::quick()
    };
    let result = async {
        stack.start_all().await?;
        let generator = Arc::new(LoadGenerator::new(&format!(
            "http://127.0.0.1:{}",
            settings.first_port
        ))?);
        load::warm_up(&generator, &databases, run_id).await?;
        let mut done = Vec::new();
        for i in 0..steps {
            let name = format!("probe {rate:.0}/s #{}", i + 1);
            let tag = format!("bench{run_id}-probe{i}");
            let shape = Shape::Open { rate };
            done.push(
                load::load_step(&mut stack, &generator, &databases, shape, &plan, name, tag)
                    .await?,
            );
        }
        anyhow::Ok(done)
    }
    .await;
    let stopped = stack.stop_all().await;
    let steps = result?;
    stopped?;
    std::fs::write(
        settings.out.join("probe.json"),
        serde_json::to_vec_pretty(&steps)?,
    )?;
    Ok(steps)
}

pub async fn run(settings: Settings, plan: Plan) -> anyhow::Result<Report> {
    let started_at = OffsetDateTime::now_utc();
    // Fail before any load if the handlers' SQL and the benchmark have drifted apart.
    for transaction in Transaction::all() {
        transaction.pgbench_script()?;
    }
    pgbench::find_pgbench()?;
    let (databases, mut stack, namespace, run_id) = stack::fresh_stack(&settings).await?;
    let mut ceilings = Ceilings::prepare(&settings, &plan).await?;
    let result = run_phases(
        &settings,
        &plan,
        &mut stack,
        &databases,
        &mut ceilings,
        run_id,
    )
    .await;
    // Whatever happened, leave no service of ours running.
    let stopped = stack.stop_all().await;
    let (steps, capacity, pruning, cancellations, traces) = result?;
    stopped?;

    let (effects, dead_letters) = exactly_once::count(&databases, &settings, &namespace).await?;
    let machine = Machine::describe(
        postgres_version(&databases).await?,
        settings.kafka_version.clone(),
        is_local(&settings.postgres) && is_local(&settings.brokers),
    );
    Ok(assemble::assemble(
        &settings,
        &plan,
        started_at,
        machine,
        steps,
        capacity,
        pruning,
        cancellations,
        traces,
        ceilings.measured,
        &stack,
        effects,
        dead_letters,
    ))
}

fn is_local(address: &str) -> bool {
    address.contains("127.0.0.1") || address.contains("localhost") || address.contains("[::1]")
}

async fn run_phases(
    settings: &Settings,
    plan: &Plan,
    stack: &mut Stack,
    databases: &Databases,
    ceilings: &mut Ceilings,
    run_id: u64,
) -> anyhow::Result<(Vec<Step>, Capacity, Pruning, Cancellations, Traces)> {
    log("starting the services (release builds)");
    stack.start_all().await?;
    let generator = Arc::new(LoadGenerator::new(&format!(
        "http://127.0.0.1:{}",
        settings.first_port
    ))?);

    load::warm_up(&generator, databases, run_id).await?;
    let steps = load::steps(stack, &generator, databases, plan, run_id).await?;

    let capacity = capacity::capacity(
        stack,
        &generator,
        databases,
        ceilings,
        plan,
        settings.pool_size,
        run_id,
    )
    .await?;
    let pruning = pruning::pruning(
        stack,
        &generator,
        databases,
        plan,
        settings.pool_size,
        run_id,
    )
    .await?;
    let cancellations = cancellations::cancellations(
        stack,
        &generator,
        databases,
        plan,
        settings.pool_size,
        run_id,
    )
    .await?;
    let traces = traces::traces(
        stack,
        &generator,
        databases,
        plan,
        settings.pool_size,
        run_id,
    )
    .await?;
    Ok((steps, capacity, pruning, cancellations, traces))
}

/// Writes `result.json`, `table.md` and `chart.png` into the run's folder.
pub fn write(report: &Report, settings: &Settings) -> anyhow::Result<String> {
    report.write_json(&settings.out.join("result.json"))?;
    let table = report.markdown();
    std::fs::write(settings.out.join("table.md"), &table)?;
    report
        .chart(&settings.out.join("chart.png"), &settings.font)
        .context("drawing the chart")?;
    Ok(table)
}
