//! `loadgen`: places orders against a running saga and measures what it did with them;
//! `loadgen bench` is the whole benchmark `scripts/bench` runs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use saga_bench::db::Databases;
use saga_bench::load::{LoadGenerator, Shape};
use saga_bench::measure::{self, Percentiles};
use saga_bench::run::{self, Plan, Settings};

#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// A fixed number of clients, each placing its next order when the last is answered.
    Closed {
        #[arg(long, default_value_t = 8)]
        concurrency: u32,
        #[command(flatten)]
        target: Target,
    },
    /// Orders started at a fixed rate (per second), whatever the answers.
    Open {
        #[arg(long)]
        rate: f64,
        #[command(flatten)]
        target: Target,
    },
    /// Writes the pgbench script of each handler transaction, made from the handlers'
    /// own SQL, into a folder.
    PgbenchScripts {
        #[arg(long, default_value = "pgbench-scripts")]
        out: PathBuf,
    },
    /// The whole benchmark: load steps, capacity, pgbench ceiling, report.
    Bench(BenchArgs),
}

#[derive(Debug, clap::Args)]
struct Target {
    /// The order API.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// PostgreSQL server of the saga's databases, to follow the orders to their outcome.
    #[arg(long, default_value = "postgres://saga:saga@127.0.0.1:5432")]
    postgres: String,
    /// Prefix of the saga's database names (`bench_` for the benchmark's stack; empty for
    /// the demo stack's `orders`, `payments`, `notifications`).
    #[arg(long, default_value = "")]
    database_prefix: String,
}

#[derive(Debug, clap::Args)]
struct BenchArgs {
    /// Development run of about a minute of load, instead of the full run.
    #[arg(long)]
    quick: bool,
    /// Where the service binaries are (release builds).
    #[arg(long)]
    bin_dir: PathBuf,
    #[arg(long, default_value = "postgres://saga:saga@127.0.0.1:5432")]
    postgres: String,
    #[arg(long, default_value = "127.0.0.1:9092")]
    brokers: String,
    /// Partitions per topic, as scripts/lib.sh creates them.
    #[arg(long, default_value_t = 3)]
    partitions: i32,
    /// DATABASE_POOL_SIZE given to every service (the services' default is 8).
    #[arg(long, default_value_t = 8)]
    pool_size: u32,
    /// CONSUMER_BATCH_SIZE given to every service: records of a partition applied per
    /// transaction. 1 (the services' default) is one transaction per event, which is
    /// what the pgbench ceiling runs; more shows how far past it batches go.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    consumer_batch: u32,
    /// HTTP ports: order-service on this one, payment-service and notification-service on
    /// the next two, the card provider (payment-provider) on the one after.
    #[arg(long, default_value_t = 18080)]
    first_port: u16,
    /// The run's folder: service logs, pgbench scripts, result.json, table.md, chart.png.
    #[arg(long)]
    out: PathBuf,
    #[arg(
        long,
        default_value = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
    )]
    font: PathBuf,
    #[arg(long, default_value = "unknown")]
    kafka_version: String,
    /// How this run was started, for the report.
    #[arg(long, default_value = "scripts/bench")]
    command: String,
    /// The services' RUST_LOG, as scripts/up gives it.
    #[arg(long, default_value = "info")]
    rust_log: String,
    /// Only offer this many orders per second, open-loop, a few times over and report
    /// the latency: for comparing two builds under the same load.
    #[arg(long)]
    probe: Option<f64>,
    /// Steps of a probe.
    #[arg(long, default_value_t = 3)]
    probe_steps: u32,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Closed {
            concurrency,
            target,
        } => standalone(Shape::Closed { concurrency }, target).await,
        Command::Open { rate, target } => standalone(Shape::Open { rate }, target).await,
        Command::PgbenchScripts { out } => {
            for (transaction, path) in saga_bench::pgbench::write_scripts(&out)? {
                println!("{}: {}", transaction.name, path.display());
            }
            Ok(())
        }
        Command::Bench(args) => {
            let plan = if args.quick {
                Plan::quick()
            } else {
                Plan::full()
            };
            let settings = Settings {
                bin_dir: args.bin_dir,
                postgres: args.postgres,
                brokers: args.brokers,
                partitions: args.partitions,
                pool_size: args.pool_size,
                consumer_batch: args.consumer_batch,
                first_port: args.first_port,
                out: args.out,
                font: args.font,
                kafka_version: args.kafka_version,
                command: args.command,
                rust_log: args.rust_log,
            };
            if let Some(rate) = args.probe {
                for step in run::probe(settings, rate, args.probe_steps, plan.step).await? {
                    let o = &step.outcome;
                    println!(
                        "{}: POST→confirmed p50 {:.1} p95 {:.1} p99 {:.1} ms, →notified p50 {:.1} p99 {:.1} ms, load average {:.2}",
                        step.name,
                        o.to_confirmed_ms.p50,
                        o.to_confirmed_ms.p95,
                        o.to_confirmed_ms.p99,
                        o.to_notified_ms.p50,
                        o.to_notified_ms.p99,
                        step.load_average[0]
                    );
                    for (hop, ms) in &o.hops_ms {
                        println!("    {hop}: p50 {:.1} ms, p99 {:.1} ms", ms.p50, ms.p99);
                    }
                }
                return Ok(());
            }
            let report = run::run(settings.clone(), plan).await?;
            let table = run::write(&report, &settings)?;
            println!("{table}");
            eprintln!(
                "[bench] wrote {0}/result.json, {0}/table.md, {0}/chart.png",
                settings.out.display()
            );
            Ok(())
        }
    }
}

async fn standalone(shape: Shape, target: Target) -> anyhow::Result<()> {
    let generator = Arc::new(LoadGenerator::new(&target.url)?);
    let tag = format!("loadgen-{}", uuid::Uuid::new_v4().simple());
    let result = generator
        .run(shape, Duration::from_secs(target.seconds), &tag)
        .await;
    let post = Percentiles::of_sorted_us(&result.post_latencies_us);
    println!(
        "{shape}: placed {} ({:.1}/s), failed {}, skipped {}; POST p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; customer_id {tag}",
        result.placed,
        result.placed_per_second(),
        result.failed,
        result.skipped,
        post.p50,
        post.p99,
        post.max
    );
    let databases = Databases::new(&target.postgres, &target.database_prefix);
    let outcome = measure::step_outcome(
        &databases,
        &tag,
        Duration::from_secs(target.seconds / 5),
        Duration::from_secs(60),
    )
    .await?;
    println!(
        "confirmed {:.1}/s, notified {:.1}/s; POST→confirmed p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms, max {:.1} ms; unfinished {}",
        outcome.confirmed.per_second,
        outcome.notified.per_second,
        outcome.to_confirmed_ms.p50,
        outcome.to_confirmed_ms.p95,
        outcome.to_confirmed_ms.p99,
        outcome.to_confirmed_ms.max,
        outcome.unfinished
    );
    Ok(())
}
