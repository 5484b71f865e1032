//! One cancellation token for the whole process, cancelled by SIGINT or SIGTERM. Every
//! long-running task watches it and stops at a safe point of its own.
//!
//! Before it is cancelled, the process says it is [`stopping`] (its readiness probe turns
//! 503, [`crate::probes`]) and waits `SHUTDOWN_DELAY` (none by default): under an
//! orchestrator, long enough for the load balancer to stop sending it requests, which it
//! still serves meanwhile. A second signal cuts the wait short.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// For every service's `--help`.
pub const HELP: &str = "\
Shutdown:
  SHUTDOWN_DELAY  how long to keep serving, /readyz answering 503, between SIGTERM and
                  the drain (e.g. 5s under Kubernetes; default 0s)";

/// `SHUTDOWN_DELAY`, a duration such as `5s`; none if unset.
pub fn delay_from_env() -> anyhow::Result<Duration> {
    match std::env::var("SHUTDOWN_DELAY") {
        Ok(value) => humantime::parse_duration(value.trim())
            .map_err(|error| anyhow::anyhow!("SHUTDOWN_DELAY `{value}`: {error}")),
        Err(_) => Ok(Duration::ZERO),
    }
}

static STOPPING: AtomicBool = AtomicBool::new(false);

/// Whether a signal to stop has arrived (the drain may not have begun yet).
pub fn stopping() -> bool {
    STOPPING.load(Ordering::Relaxed)
}

/// Returns a token that is cancelled `delay` after the process receives SIGINT or
/// SIGTERM, or at a second one.
pub fn on_signal(delay: Duration) -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler installs");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received, shutting down"),
            _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
        }
        STOPPING.store(true, Ordering::Relaxed);
        if !delay.is_zero() {
            tracing::info!(?delay, "not ready any more; draining after SHUTDOWN_DELAY");
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        cancel.cancel();
    });
    token
}
