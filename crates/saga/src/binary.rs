//! What each service's binary does, start to end: read its settings, start logging and
//! traces, build the service, then run it until SIGINT or SIGTERM.

use std::future::Future;

use clap::Parser;
use tokio_util::sync::CancellationToken;

/// Runs a service's binary with its `build` and `run_until_stopped`. The settings are
/// read before logging starts, so `--help` and a bad flag print nothing else; `--help`
/// ends with the shutdown and OpenTelemetry variables every service reads.
pub async fn run<C, A, Built, Stopped>(
    build: impl FnOnce(C) -> Built,
    run_until_stopped: impl FnOnce(A, CancellationToken) -> Stopped,
) -> anyhow::Result<()>
where
    C: Parser,
    Built: Future<Output = anyhow::Result<A>>,
    Stopped: Future<Output = anyhow::Result<()>>,
{
    let help = format!(
        "{}\n\n{}",
        crate::shutdown::HELP,
        crate::telemetry::OTEL_HELP
    );
    let command = C::command().after_help(help);
    let service = command.get_name().to_owned();
    let config = C::from_arg_matches(&command.get_matches()).unwrap_or_else(|error| error.exit());
    let delay = crate::shutdown::delay_from_env()?;
    let telemetry = crate::telemetry::init_service(&service)?;
    let shutdown = crate::shutdown::on_signal(delay);
    let ran = async { run_until_stopped(build(config).await?, shutdown).await };
    let ran = ran.await;
    telemetry.shutdown();
    ran
}
