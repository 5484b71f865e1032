//! Phase 4, pruning: payment-service charging a backlog while its pruner deletes old
//! ids, against the same backlog with the pruner off.

use std::sync::Arc;
use std::time::Duration;

use crate::db::Databases;
use crate::load::{Keys, LoadGenerator, Shape};
use crate::measure::{self, Work};
use crate::report::Pruning;
use crate::sql::Database;

use super::stack::Stack;
use super::{Plan, log};

/// Phase 4: payment-service draining a backlog while its pruner deletes `plan.old_ids`
/// ids past their window, against the same drain with the pruner off, in the same run.
/// The other services keep running, so these orders go through the whole saga too.
pub(super) async fn pruning(
    stack: &mut Stack,
    generator: &Arc<LoadGenerator>,
    databases: &Databases,
    plan: &Plan,
    pool_size: u32,
    run_id: u64,
) -> anyhow::Result<Pruning> {
    // Generous: the pruner rests between batches by design, and a slow disk slows each.
    let timeout = Duration::from_secs(900);
    let mut charge = ChargeBacklog {
        stack,
        generator,
        databases,
        orders: plan.backlog,
        concurrency: pool_size,
        timeout,
    };
    let (without, _) = charge
        .drain(&format!("bench{run_id}-prune0"), "off")
        .await?;
    log(format!(
        "pruning: charge {:.0}/s with the pruner off",
        without.per_second
    ));

    log(format!(
        "pruning: {} ids applied 20 days ago into payment-service's inbox",
        plan.old_ids
    ));
    let payments = databases.connect(Database::Payments).await?;
    payments
        .execute(
            "INSERT INTO processed_events (event_id, processed_at)
             SELECT 'old-' || i, now() - interval '20 days' + make_interval(secs => i / 1000.0)
               FROM generate_series(1, $1::int) i",
            &[&(plan.old_ids as i32)],
        )
        .await?;
    payments
        .batch_execute("VACUUM ANALYZE processed_events")
        .await?;
    let (with, started) = charge.drain(&format!("bench{run_id}-prune1"), "1s").await?;
    let old_left = "SELECT EXISTS (SELECT 1 FROM processed_events
                      WHERE processed_at < now() - interval '14 days')";
    while payments.query_one(old_left, &[]).await?.get::<_, bool>(0) {
        anyhow::ensure!(
            started.elapsed() < timeout,
            "the pruner did not finish in {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let prune_seconds = started.elapsed().as_secs_f64();
    let result = Pruning {
        old_ids: plan.old_ids,
        prune_seconds,
        pruned_per_second: f64::from(plan.old_ids) / prune_seconds,
        without,
        with,
    };
    log(format!(
        "pruning: charge {:.0}/s while the pruner deleted {} ids in {:.1} s ({:.0} rows/s)",
        result.with.per_second, result.old_ids, prune_seconds, result.pruned_per_second
    ));
    Ok(result)
}

/// Phase 4's backlogs: orders placed with payment-service stopped, then charged by it.
struct ChargeBacklog<'a> {
    stack: &'a mut Stack,
    generator: &'a Arc<LoadGenerator>,
    databases: &'a Databases,
    orders: u32,
    concurrency: u32,
    timeout: Duration,
}

impl ChargeBacklog<'_> {
    /// Places the backlog under `tag`, waits until all of it is on the topic, then starts
    /// payment-service with `PRUNE_INTERVAL=prune_interval` and times its charges. Returns
    /// them, and when the service (and with it the pruner's first pass) started.
    async fn drain(
        &mut self,
        tag: &str,
        prune_interval: &str,
    ) -> anyhow::Result<(measure::Drain, std::time::Instant)> {
        self.stack.stop("payment-service").await?;
        let n = self.orders;
        self.generator
            .run_count(
                Shape::Closed {
                    concurrency: self.concurrency,
                },
                u64::from(n),
                tag,
                Keys::None,
            )
            .await;
        let orders = self.databases.connect(Database::Orders).await?;
        let published = "SELECT count(*) FROM outbox o JOIN orders r ON o.key = r.id::text
                          WHERE r.customer_id = $1 AND o.type = 'order.created'
                            AND o.published_at IS NOT NULL";
        while orders.query_one(published, &[&tag]).await?.get::<_, i64>(0) < i64::from(n) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let since = measure::server_now(self.databases).await?;
        let started = std::time::Instant::now();
        self.stack
            .start_with("payment-service", &[("PRUNE_INTERVAL", prune_interval)])
            .await?;
        let drained = measure::drain(
            self.databases,
            Database::Payments,
            Work::Applied,
            since,
            i64::from(n),
            self.timeout,
        )
        .await?;
        Ok((drained, started))
    }
}
