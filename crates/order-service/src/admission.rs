//! Admission control: `POST /v1/orders` refuses new orders, `503 saga_behind` with
//! `Retry-After`, while more orders are in flight than the saga settles in the time a
//! customer should wait, and accepts again once they have drained.
//!
//! The measure is the count of `pending` orders: every order placed and not yet
//! confirmed or cancelled, wherever it waits (the outbox, a topic, payment-service, the
//! card provider, the way back). By Little's law the time an order takes is that count
//! over the rate the saga settles them, so a cap on the count is a cap on the wait at a
//! given rate; and it needs nothing but order-service's own database. It drains by
//! itself as the saga catches up, unlike the age of the oldest pending order, which one
//! order stuck for good (its event dead-lettered, waiting for a redrive) would hold up
//! for ever: such an order counts one, until it settles.
//!
//! A watcher counts the pending orders every `ADMISSION_POLL_INTERVAL`; every order
//! placed here since the count began counts one more, so a burst cannot overshoot the
//! cap by an interval's worth, and a count that raced with a placement cannot forget it:
//! an order committed while the count ran is counted twice until the next count (early
//! by one refusal at worst), never not at all. Requests checked at the same moment may
//! each take the last place (over by at most the requests in progress), and another
//! instance's orders are seen at the next count. An order accepted is never dropped: the
//! check comes before the order's transaction, and a refused request stores nothing, its
//! `Idempotency-Key` included.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
use deadpool_postgres::Pool;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Args)]
pub struct AdmissionConfig {
    /// Orders in flight (placed, not yet confirmed or cancelled) past which `POST
    /// /v1/orders` answers `503 saga_behind` with `Retry-After` instead of placing one
    /// more; 0 turns admission control off.
    #[arg(long, env = "ADMISSION_MAX_IN_FLIGHT", default_value_t = DEFAULT_MAX_IN_FLIGHT)]
    pub admission_max_in_flight: u64,

    /// How often the orders in flight are counted.
    #[arg(long, env = "ADMISSION_POLL_INTERVAL", default_value = DEFAULT_POLL_INTERVAL,
          value_parser = humantime::parse_duration)]
    pub admission_poll_interval: Duration,
}

const DEFAULT_MAX_IN_FLIGHT: u64 = 200;
const DEFAULT_POLL_INTERVAL: &str = "200ms";

/// The flags' defaults, for code that builds the service without parsing them.
impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            admission_max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            admission_poll_interval: humantime::parse_duration(DEFAULT_POLL_INTERVAL)
                .expect("the default parses"),
        }
    }
}

/// Whether an order may be placed now; cheap to clone, shared by the handlers.
#[derive(Clone)]
pub struct Admission {
    limit: u64,
    counts: Arc<Counts>,
}

#[derive(Default)]
struct Counts {
    /// Orders placed here since start.
    placed: AtomicU64,
    /// The last count of the database's pending orders, and `placed` as it was just
    /// before that count began.
    last: Mutex<(u64, u64)>,
}

impl Counts {
    fn in_flight(&self) -> u64 {
        let (counted, placed_then) = *self.last.lock().expect("never poisoned");
        counted
            + self
                .placed
                .load(Ordering::Relaxed)
                .saturating_sub(placed_then)
    }
}

/// The saga has more orders in flight than the cap.
#[derive(Debug, Clone, Copy)]
pub struct Behind {
    pub in_flight: u64,
    pub limit: u64,
}

impl Admission {
    /// Admission per `config`, and the watcher that keeps it current, which runs until
    /// `shutdown`. Off (`ADMISSION_MAX_IN_FLIGHT=0`): every order is admitted and nothing
    /// is counted.
    pub fn new(
        pool: Pool,
        config: &AdmissionConfig,
        shutdown: CancellationToken,
    ) -> (
        Self,
        impl Future<Output = anyhow::Result<()>> + Send + 'static,
    ) {
        let admission = Self {
            limit: config.admission_max_in_flight,
            counts: Arc::default(),
        };
        let watcher = watch(
            pool,
            admission.clone(),
            config.admission_poll_interval,
            shutdown,
        );
        (admission, watcher)
    }

    /// `Ok` if an order may be placed now.
    pub fn admit(&self) -> Result<(), Behind> {
        if self.limit == 0 {
            return Ok(());
        }
        let in_flight = self.counts.in_flight();
        if in_flight < self.limit {
            Ok(())
        } else {
            Err(Behind {
                in_flight,
                limit: self.limit,
            })
        }
    }

    /// An order was placed here (its transaction committed): one more in flight until
    /// a count that began after it.
    pub fn placed(&self) {
        self.counts.placed.fetch_add(1, Ordering::Relaxed);
    }
}

async fn watch(
    pool: Pool,
    admission: Admission,
    interval: Duration,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    if admission.limit == 0 {
        return Ok(());
    }
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            _ = ticks.tick() => {}
        }
        // Read before the count's snapshot is taken: an order placed after this may be
        // in the count or not, and is added either way.
        let placed_then = admission.counts.placed.load(Ordering::Relaxed);
        match count_in_flight(&pool).await {
            Ok(n) => {
                *admission.counts.last.lock().expect("never poisoned") = (n, placed_then);
                metrics::gauge!(saga::metrics::ORDERS_IN_FLIGHT).set(n as f64);
            }
            // The database down refuses orders by itself (503 `unavailable`); the last
            // count stands until it is back.
            Err(error) => tracing::debug!(%error, "orders in flight not counted"),
        }
    }
}

async fn count_in_flight(pool: &Pool) -> anyhow::Result<u64> {
    let client = pool.get().await?;
    // An index-only scan of the partial index `orders_pending`, as small as the count.
    let row = client
        .query_one("SELECT count(*) FROM orders WHERE status = 'pending'", &[])
        .await?;
    Ok(row.get::<_, i64>(0).max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(limit: u64) -> Admission {
        Admission {
            limit,
            counts: Arc::default(),
        }
    }

    fn counted(admission: &Admission, n: u64, placed_then: u64) {
        *admission.counts.last.lock().unwrap() = (n, placed_then);
    }

    #[test]
    fn orders_placed_between_two_counts_count_toward_the_cap() {
        let admission = admission(3);
        for _ in 0..3 {
            assert!(admission.admit().is_ok());
            admission.placed();
        }
        let behind = admission.admit().unwrap_err();
        assert_eq!((behind.in_flight, behind.limit), (3, 3));
        // A count begun after all three finds two: one settled meanwhile.
        counted(&admission, 2, 3);
        assert!(admission.admit().is_ok());
    }

    #[test]
    fn a_count_that_raced_with_a_placement_does_not_forget_it() {
        let admission = admission(3);
        admission.placed();
        admission.placed();
        // The count began after two placements; a third committed while it ran, after
        // its snapshot: the count says 2, the third is still counted.
        let placed_then = admission.counts.placed.load(Ordering::Relaxed);
        admission.placed();
        counted(&admission, 2, placed_then);
        assert_eq!(admission.admit().unwrap_err().in_flight, 3);
    }

    #[test]
    fn a_cap_of_zero_admits_every_order() {
        let admission = admission(0);
        counted(&admission, u64::MAX, 0);
        assert!(admission.admit().is_ok());
    }
}
