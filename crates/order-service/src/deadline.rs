//! The deadline for orders that never settle: an order still `pending`
//! `ORDER_PAYMENT_TIMEOUT` after it was placed is cancelled, reason `timeout`, through
//! the same path as the customer's cancellation ([`crate::cancel`]), and payment-service
//! refunds whatever was charged for it.
//!
//! An order waits that long only when its payment is stuck: its `order.created`
//! dead-lettered and waiting for a redrive, or the provider down for good. The default,
//! 30 minutes, is far beyond anything the saga takes while it runs, even through the
//! fault suite's outages (a minute or two), the benchmark's backlog at overload, or a
//! course section that keeps the provider slow: it cancels what is stuck, never what is
//! only late. A charge that lands after the deadline's cancellation is refunded all the
//! same.
//!
//! Correctness comes from the rows' locks: the sweep's update changes an order only if
//! it is still pending under the lock, and skips one another sweep holds. More than one
//! sweep at a time would only be wasted work, so one copy of the service sweeps, holding
//! the sweeper's [`saga::lease`], and the others wait as standbys; a sweep that finds
//! the lease lost stops before its next batch.

use std::time::Duration;

use clap::Args;
use deadpool_postgres::Pool;
use saga::lease::{Held, Lease};
use saga::{LocalRelay, Topics};
use tokio_util::sync::CancellationToken;

use crate::cancel;

#[derive(Debug, Clone, Args)]
pub struct DeadlineConfig {
    /// An order still pending this long after it was placed is cancelled (reason
    /// `timeout`), and whatever was charged for it refunded; 0 turns the deadline off.
    #[arg(long, env = "ORDER_PAYMENT_TIMEOUT", default_value = "30m",
          value_parser = humantime::parse_duration)]
    pub order_payment_timeout: Duration,
}

/// The default: 30 minutes.
impl Default for DeadlineConfig {
    fn default() -> Self {
        Self {
            order_payment_timeout: Duration::from_secs(30 * 60),
        }
    }
}

/// Orders cancelled per transaction: a backlog of overdue orders goes out in batches of
/// this many, none holding its locks long.
const BATCH: i64 = 100;

/// How often overdue orders are looked for: often enough that an order is cancelled soon
/// after its deadline, a tenth of the timeout, and at least every 30 seconds.
fn interval(timeout: Duration) -> Duration {
    (timeout / 10).clamp(Duration::from_millis(100), Duration::from_secs(30))
}

/// The deadline sweeper's lease.
pub const DEADLINE_LOCK: i64 = 0x6465_6164_6c69_6e65; // "deadline"

/// Sweeps for overdue orders while holding `lease`, until `shutdown`; does nothing when
/// the deadline is off.
pub async fn sweep(
    pool: Pool,
    relay: LocalRelay,
    topics: Topics,
    config: DeadlineConfig,
    lease: Lease,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let timeout = config.order_payment_timeout;
    if timeout.is_zero() {
        return Ok(());
    }
    while let Some(held) = lease.hold(&shutdown).await {
        sweep_while_held(&pool, &relay, &topics, timeout, &held, &shutdown).await;
    }
    Ok(())
}

async fn sweep_while_held(
    pool: &Pool,
    relay: &LocalRelay,
    topics: &Topics,
    timeout: Duration,
    held: &Held,
    shutdown: &CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = held.lost() => return,
            () = tokio::time::sleep(interval(timeout)) => {}
        }
        while held.is_held() {
            match cancel::cancel_overdue(pool, Some(relay), topics, timeout, BATCH).await {
                Ok(cancelled) => {
                    if !cancelled.is_empty() {
                        tracing::info!(
                            orders = cancelled.len(),
                            ?timeout,
                            ?cancelled,
                            "orders still pending past their deadline cancelled"
                        );
                    }
                    if (cancelled.len() as i64) < BATCH {
                        break;
                    }
                }
                // The database may be down; the next sweep tries again.
                Err(error) => {
                    tracing::warn!(%error, "deadline sweep failed; trying again at the next");
                    break;
                }
            }
        }
    }
}
