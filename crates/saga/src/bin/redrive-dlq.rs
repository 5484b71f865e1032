//! `redrive-dlq <dead-letter topic>`: sends its records back to the topics they came
//! from, once the cause is fixed. See `saga::redrive` for what it guarantees.

use clap::Parser;

/// Sends the records of a dead-letter topic back to the topics they came from.
///
/// Each goes back to its `dlq.original.topic`, with its original key, bytes and headers
/// (the dead letter's but the `dlq.*` ones) and a `dlq.redriven.from` header. Safe to
/// run again: it commits each record once the broker acknowledged its copy, and a record
/// sent back twice is stopped by the consumer's inbox.
#[derive(Debug, Parser)]
#[command(version, after_help = saga::kafka::client::HELP)]
struct Args {
    /// The dead-letter topic, e.g. `payments.order-service.dlq`.
    dead_letter_topic: String,

    /// Kafka bootstrap servers, comma separated.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    kafka_brokers: String,

    /// The consumer group that remembers how far redrives of this topic got
    /// [default: DEAD_LETTER_TOPIC.redrive]. Another group sends everything again.
    #[arg(long)]
    group: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    saga::kafka::client::init_from_env()?;
    saga::telemetry::init();
    let group = args
        .group
        .unwrap_or_else(|| saga::redrive::default_group(&args.dead_letter_topic));
    let redriven =
        saga::redrive::redrive(&args.kafka_brokers, &args.dead_letter_topic, &group).await?;
    println!(
        "redriven {} records from {} (group {group})",
        redriven.total(),
        args.dead_letter_topic
    );
    for (topic, n) in &redriven.by_topic {
        println!("  {n} to {topic}");
    }
    Ok(())
}
