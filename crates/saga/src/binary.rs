//! What each service's binary does, start to end: read its settings, start logging and
//! traces, build the service, then run it until SIGINT or SIGTERM.

use std::future::Future;

use clap::Parser;
use tokio_util::sync::CancellationToken;

/// Runs a service's binary with its `build` and `run_until_stopped`. The settings are
/// read before logging starts, so `--help` and a bad flag print nothing else; `--help`
/// ends with the Kafka client, shutdown and OpenTelemetry variables every service reads.
pub async fn run<C, A, Built, Stopped>(
    build: impl FnOnce(C) -> Built,
    run_until_stopped: impl FnOnce(A, CancellationToken) -> Stopped,
) -> anyhow::Result<()>
where
    C: Parser,
    Built: Future<Output = anyhow::Result<A>>,
    Stopped: Future<Output = anyhow::Result<()>>,
{
    let command = C::command();
    // A binary that talks to Kafka (has KAFKA_BROKERS) reads the client properties too.
    let kafka = command
        .get_arguments()
        .any(|arg| arg.get_id() == "kafka_brokers");
    let mut help = Vec::new();
    if kafka {
        help.push(crate::kafka::client::HELP);
    }
    help.extend([crate::shutdown::HELP, crate::telemetry::OTEL_HELP]);
    let command = command.after_help(help.join("\n\n"));
    let service = command.get_name().to_owned();
    let config = C::from_arg_matches(&command.get_matches()).unwrap_or_else(|error| error.exit());
    if kafka {
        crate::kafka::client::init_from_env()?;
    }
    let delay = crate::shutdown::delay_from_env()?;
    let telemetry = crate::telemetry::init_service(&service)?;
    let shutdown = crate::shutdown::on_signal(delay);
    let ran = async { run_until_stopped(build(config).await?, shutdown).await };
    let ran = ran.await;
    telemetry.shutdown();
    ran
}
