//! Phase 5, cancellations: what cancelling orders costs the saga, and the refund path's
//! own rate.
//!
//! End to end, in the same run: a backlog of orders placed with none cancelled, against
//! the same backlog with every tenth order cancelled as soon as it is seen placed (a
//! customer changing their mind: the order is usually still pending, so it is charged,
//! then refunded). Each is measured by the orders it settled per second, from its first
//! placement to its last order settled: confirmed, or cancelled and the cancellation
//! answered by payment-service.
//!
//! The refund path alone: orders placed and settled, payment-service stopped while every
//! one is cancelled, then let go on the backlog of cancellations, as phase 2 lets
//! ChargeOrder go on a backlog of orders. Its rate is RefundOrder's: a read ahead, a
//! refund at the provider and a transaction, per order.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt as _};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::db::Databases;
use crate::load::{Keys, LoadGenerator, Shape};
use crate::measure::{self, Work};
use crate::report::{Cancellations, Settled};
use crate::sql::Database;

use super::stack::Stack;
use super::{Plan, log};

/// One order in this many is cancelled in the second end-to-end step.
const CANCEL_ONE_IN: usize = 10;

pub(super) async fn cancellations(
    stack: &mut Stack,
    generator: &Arc<LoadGenerator>,
    databases: &Databases,
    plan: &Plan,
    pool_size: u32,
    run_id: u64,
) -> anyhow::Result<Cancellations> {
    let timeout = Duration::from_secs(300);
    let orders = plan.backlog;
    let mut steps = Steps {
        generator,
        databases,
        orders,
        pool_size,
        timeout,
    };
    let none = steps
        .settle(&format!("bench{run_id}-cancel0"), false)
        .await?;
    log(format!(
        "cancellations: none cancelled, {} orders settled at {:.0}/s",
        none.orders, none.per_second
    ));
    let tenth = steps
        .settle(&format!("bench{run_id}-cancel10"), true)
        .await?;
    log(format!(
        "cancellations: one in {CANCEL_ONE_IN} cancelled ({} of them, {} refunded), {} orders settled at {:.0}/s",
        tenth.cancelled, tenth.refunded, tenth.orders, tenth.per_second
    ));
    let refund_path = steps
        .refund_backlog(stack, &format!("bench{run_id}-refunds"))
        .await?;
    log(format!(
        "cancellations: payment-service answered a backlog of {} cancellations at {:.0}/s",
        refund_path.rows, refund_path.per_second
    ));
    Ok(Cancellations {
        none,
        tenth,
        refund_path,
    })
}

struct Steps<'a> {
    generator: &'a Arc<LoadGenerator>,
    databases: &'a Databases,
    orders: u32,
    pool_size: u32,
    timeout: Duration,
}

impl Steps<'_> {
    /// Places the backlog under `tag`, cancelling one order in ten meanwhile if `cancel`,
    /// and measures how fast the saga settles it.
    async fn settle(&mut self, tag: &str, cancel: bool) -> anyhow::Result<Settled> {
        let placing = self.generator.run_count(
            Shape::Closed {
                concurrency: self.pool_size,
            },
            u64::from(self.orders),
            tag,
            Keys::None,
        );
        if cancel {
            let (placed, cancelled) = tokio::join!(placing, self.cancel_as_placed(tag));
            anyhow::ensure!(placed.placed > 0, "no order placed under {tag}");
            cancelled?;
        } else {
            placing.await;
        }
        settled(self.databases, tag, self.timeout).await
    }

    /// Cancels every tenth order of `tag` as soon as it is seen placed, until all of
    /// them have been seen.
    async fn cancel_as_placed(&self, tag: &str) -> anyhow::Result<()> {
        let orders_db = self.databases.connect(Database::Orders).await?;
        let deadline = Instant::now() + self.timeout;
        let mut seen = 0;
        while seen < self.orders as usize && Instant::now() < deadline {
            let placed: Vec<Uuid> = orders_db
                .query(
                    "SELECT id FROM orders WHERE customer_id = $1 ORDER BY created_at, id OFFSET $2",
                    &[&tag, &(seen as i64)],
                )
                .await?
                .iter()
                .map(|row| row.get(0))
                .collect();
            let first = seen;
            seen += placed.len();
            let chosen = placed
                .into_iter()
                .enumerate()
                .filter(|(i, _)| (first + i) % CANCEL_ONE_IN == CANCEL_ONE_IN - 1)
                .map(|(_, id)| id);
            self.cancel_all(chosen).await;
            if seen < self.orders as usize {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    /// Cancels `orders`, `pool_size` requests at a time.
    async fn cancel_all(&self, orders: impl Iterator<Item = Uuid>) -> usize {
        stream::iter(orders)
            .map(|id| self.generator.cancel(id))
            .buffer_unordered(self.pool_size as usize)
            .filter(|cancelled| std::future::ready(*cancelled))
            .count()
            .await
    }

    /// A backlog of orders, settled, then all cancelled while payment-service is
    /// stopped; payment-service's rate through the cancellations once started.
    async fn refund_backlog(
        &mut self,
        stack: &mut Stack,
        tag: &str,
    ) -> anyhow::Result<measure::Drain> {
        let n = self.orders / 2;
        self.generator
            .run_count(
                Shape::Closed {
                    concurrency: self.pool_size,
                },
                u64::from(n),
                tag,
                Keys::None,
            )
            .await;
        settled(self.databases, tag, self.timeout).await?;
        stack.stop("payment-service").await?;
        let orders_db = self.databases.connect(Database::Orders).await?;
        let ids: Vec<Uuid> = orders_db
            .query("SELECT id FROM orders WHERE customer_id = $1", &[&tag])
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let cancelled = self.cancel_all(ids.into_iter()).await;
        log(format!(
            "cancellations: {cancelled} orders cancelled with payment-service stopped"
        ));
        let since = measure::server_now(self.databases).await?;
        stack.start("payment-service").await?;
        let drained = measure::drain(
            self.databases,
            Database::Payments,
            Work::Applied,
            since,
            cancelled as i64,
            self.timeout,
        )
        .await?;
        settled(self.databases, tag, self.timeout).await?;
        Ok(drained)
    }
}

/// Waits (up to `timeout`) until every order of `tag` has settled, then measures: orders
/// per second from the first placed to the last settled.
pub(super) async fn settled(
    databases: &Databases,
    tag: &str,
    timeout: Duration,
) -> anyhow::Result<Settled> {
    let orders_db = databases.connect(Database::Orders).await?;
    let deadline = Instant::now() + timeout;
    loop {
        let row = orders_db
            .query_one(
                "SELECT count(*), count(*) FILTER (WHERE settled_at IS NULL),
                        count(*) FILTER (WHERE cancel_reason = 'customer'),
                        count(refund_id), min(created_at), max(settled_at)
                   FROM orders WHERE customer_id = $1",
                &[&tag],
            )
            .await?;
        let unsettled: i64 = row.get(1);
        if unsettled == 0 || Instant::now() > deadline {
            anyhow::ensure!(unsettled == 0, "{unsettled} orders of {tag} never settled");
            let first: Option<OffsetDateTime> = row.get(4);
            let last: Option<OffsetDateTime> = row.get(5);
            let seconds = match (first, last) {
                (Some(first), Some(last)) => (last - first).as_seconds_f64(),
                _ => f64::NAN,
            };
            let orders: i64 = row.get(0);
            return Ok(Settled {
                orders,
                cancelled: row.get(2),
                refunded: row.get(3),
                seconds,
                per_second: orders as f64 / seconds,
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
