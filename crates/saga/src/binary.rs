//! What each service's binary does, start to end: read its settings, start logging,
//! build the service, then run it until SIGINT or SIGTERM.

use std::future::Future;

use clap::Parser;
use tokio_util::sync::CancellationToken;

/// Runs a service's binary with its `build` and `run_until_stopped`. The settings are
/// read before logging starts, so `--help` and a bad flag print nothing else.
pub async fn run<C, A, Built, Stopped>(
    build: impl FnOnce(C) -> Built,
    run_until_stopped: impl FnOnce(A, CancellationToken) -> Stopped,
) -> anyhow::Result<()>
where
    C: Parser,
    Built: Future<Output = anyhow::Result<A>>,
    Stopped: Future<Output = anyhow::Result<()>>,
{
    let config = C::parse();
    crate::telemetry::init();
    let app = build(config).await?;
    run_until_stopped(app, crate::shutdown::on_signal()).await
}
