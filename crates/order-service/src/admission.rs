//! Admission control: `POST /v1/orders` refuses new orders, `503 saga_behind` with
//! `Retry-After`, while more orders are in flight than the saga settles in the time a
//! customer should wait, and accepts again once they have drained.
//!
//! The measure is the count of unsettled orders: every order placed and not yet
//! confirmed or cancelled, or cancelled and its cancellation not yet answered by
//! payment-service, wherever it waits (the outbox, a topic, payment-service, the card
//! provider, the way back). By Little's law the time an order takes is that count
//! over the rate the saga settles them, so a cap on the count is a cap on the wait at a
//! given rate; and it needs nothing but order-service's own database. It drains by
//! itself as the saga catches up, unlike the age of the oldest unsettled order, which one
//! order stuck for good (its event dead-lettered, waiting for a redrive) would hold up
//! for ever: such an order counts one, until it settles.
//!
//! The cap is what the saga settles in `ADMISSION_MAX_WAIT` at the rate it has been
//! settling them, and never under `ADMISSION_MAX_IN_FLIGHT`. A fixed count would be a
//! different wait on every machine, and where the saga is fast it would be shorter than
//! the second a refused client waits (`Retry-After: 1`): the backlog drains, the saga
//! idles while its clients wait, and it settles only part of what it could. A cap worth
//! more than that second keeps orders waiting for the saga, not the saga for orders. The
//! rate is the orders settled in the last [`RATE_WINDOW`] by the database's clock
//! (`settled_at`), counted in the same statement as those in flight: the whole saga's
//! rate, so every copy of order-service finds the same cap. (Counting its own
//! placements instead, each of N copies would see about 1/N of the rate, and the cap
//! would sink to its floor.) The floor is the cap while the saga has stopped: then no
//! rate would allow anything.
//!
//! A watcher counts the unsettled orders every `ADMISSION_POLL_INTERVAL`; every order
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
use saga::LocalRelay;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Args)]
pub struct AdmissionConfig {
    /// Orders in flight (placed, not yet settled: confirmed, or cancelled and the
    /// cancellation answered) past which `POST
    /// /v1/orders` answers `503 saga_behind` with `Retry-After` instead of placing one
    /// more, unless the saga settles more than that in `ADMISSION_MAX_WAIT`; 0 turns
    /// admission control off.
    #[arg(long, env = "ADMISSION_MAX_IN_FLIGHT", default_value_t = DEFAULT_MAX_IN_FLIGHT)]
    pub admission_max_in_flight: u64,

    /// The wait admission control allows: orders in flight up to what the saga settles
    /// in this time, at the rate it has been settling them; 0 keeps the cap at
    /// `ADMISSION_MAX_IN_FLIGHT`.
    #[arg(long, env = "ADMISSION_MAX_WAIT", default_value = DEFAULT_MAX_WAIT,
          value_parser = humantime::parse_duration)]
    pub admission_max_wait: Duration,

    /// How often the orders in flight are counted.
    #[arg(long, env = "ADMISSION_POLL_INTERVAL", default_value = DEFAULT_POLL_INTERVAL,
          value_parser = humantime::parse_duration)]
    pub admission_poll_interval: Duration,
}

const DEFAULT_MAX_IN_FLIGHT: u64 = 200;
const DEFAULT_MAX_WAIT: &str = "1500ms";
const DEFAULT_POLL_INTERVAL: &str = "200ms";

/// How far back the settle rate looks: long enough to smooth a batch's jitter, short
/// enough that the cap follows the saga within a few seconds, and that the count reads
/// few rows.
const RATE_WINDOW: Duration = Duration::from_secs(2);

/// The flags' defaults, for code that builds the service without parsing them.
impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            admission_max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            admission_max_wait: humantime::parse_duration(DEFAULT_MAX_WAIT)
                .expect("the default parses"),
            admission_poll_interval: humantime::parse_duration(DEFAULT_POLL_INTERVAL)
                .expect("the default parses"),
        }
    }
}

/// Whether an order may be placed now; cheap to clone, shared by the handlers.
#[derive(Clone)]
pub struct Admission {
    /// `ADMISSION_MAX_IN_FLIGHT`: the cap whatever the rate; 0 is off.
    floor: u64,
    max_wait: Duration,
    counts: Arc<Counts>,
}

struct Counts {
    /// Orders placed here since start.
    placed: AtomicU64,
    /// The last count of the database's unsettled orders, `placed` as it was just before
    /// that count began, and the cap made with it: read together, under one lock.
    last: Mutex<(u64, u64, u64)>,
}

impl Counts {
    /// The orders in flight now, and the cap.
    fn in_flight(&self) -> (u64, u64) {
        let (counted, placed_then, limit) = *self.last.lock().expect("never poisoned");
        let placed_since = self
            .placed
            .load(Ordering::Relaxed)
            .saturating_sub(placed_then);
        (counted + placed_since, limit)
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
        relay: LocalRelay,
        config: &AdmissionConfig,
        shutdown: CancellationToken,
    ) -> (
        Self,
        impl Future<Output = anyhow::Result<()>> + Send + 'static,
    ) {
        let admission = Self::with_cap(config.admission_max_in_flight, config.admission_max_wait);
        let watcher = watch(
            pool,
            relay,
            admission.clone(),
            config.admission_poll_interval,
            shutdown,
        );
        (admission, watcher)
    }

    fn with_cap(floor: u64, max_wait: Duration) -> Self {
        Self {
            floor,
            max_wait,
            counts: Arc::new(Counts {
                placed: AtomicU64::new(0),
                last: Mutex::new((0, 0, floor)),
            }),
        }
    }

    /// `Ok` if an order may be placed now.
    pub fn admit(&self) -> Result<(), Behind> {
        if self.floor == 0 {
            return Ok(());
        }
        let (in_flight, limit) = self.counts.in_flight();
        if in_flight < limit {
            Ok(())
        } else {
            Err(Behind { in_flight, limit })
        }
    }

    /// The cap at a settle rate of `per_second` orders.
    fn limit_at(&self, per_second: f64) -> u64 {
        // `as` saturates: a rate of NaN or infinity cannot wrap the cap around.
        let at_rate = (per_second * self.max_wait.as_secs_f64()) as u64;
        self.floor.max(at_rate)
    }

    /// Takes a count of the database's unsettled orders, begun when `placed_then` orders
    /// had been placed here, and the cap it makes at a settle rate of `per_second`.
    fn counted(&self, pending: u64, placed_then: u64, per_second: f64) -> u64 {
        let limit = self.limit_at(per_second);
        *self.counts.last.lock().expect("never poisoned") = (pending, placed_then, limit);
        limit
    }

    /// An order was placed here (its transaction committed): one more in flight until
    /// a count that began after it.
    pub fn placed(&self) {
        self.counts.placed.fetch_add(1, Ordering::Relaxed);
    }
}

async fn watch(
    pool: Pool,
    relay: LocalRelay,
    admission: Admission,
    interval: Duration,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    if admission.floor == 0 {
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
        match count(&pool).await {
            Ok(Counted { in_flight, settled }) => {
                let per_second = settled as f64 / RATE_WINDOW.as_secs_f64();
                let limit = admission.counted(in_flight, placed_then, per_second);
                let in_flight_f64 = in_flight as f64;
                metrics::gauge!(saga::metrics::ADMISSION_COUNTED).set(in_flight_f64);
                metrics::gauge!(saga::metrics::ORDERS_IN_FLIGHT)
                    .set(saga::metrics::shared_gauge(&relay, in_flight_f64));
                metrics::gauge!(saga::metrics::ADMISSION_LIMIT).set(limit as f64);
            }
            // The database down refuses orders by itself (503 `unavailable`); the last
            // count stands until it is back.
            Err(error) => tracing::debug!(%error, "orders in flight not counted"),
        }
    }
}

/// One count of the saga's orders, whichever copy placed them.
struct Counted {
    /// Unsettled now.
    in_flight: u64,
    /// Settled in the last [`RATE_WINDOW`].
    settled: u64,
}

async fn count(pool: &Pool) -> anyhow::Result<Counted> {
    let client = pool.get().await?;
    // Index-only scans of `orders_unsettled`, as small as the backlog, and of
    // `orders_settled_at`, as small as the window's settled orders.
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM orders WHERE settled_at IS NULL),
                    (SELECT count(*) FROM orders
                      WHERE settled_at > now() - make_interval(secs => $1))",
            &[&RATE_WINDOW.as_secs_f64()],
        )
        .await?;
    let count = |column: usize| row.get::<_, i64>(column).max(0) as u64;
    Ok(Counted {
        in_flight: count(0),
        settled: count(1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cap of `limit` whatever the rate.
    fn admission(limit: u64) -> Admission {
        Admission::with_cap(limit, Duration::ZERO)
    }

    fn counted(admission: &Admission, n: u64, placed_then: u64) {
        admission.counted(n, placed_then, 0.0);
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

    #[test]
    fn the_cap_is_what_the_saga_settles_in_the_wait_and_never_under_the_floor() {
        let admission = Admission::with_cap(200, Duration::from_millis(1500));
        // 400 orders a second settle 600 in 1.5 s: past the floor, the cap.
        assert_eq!(admission.counted(0, 0, 400.0), 600);
        for _ in 0..599 {
            admission.placed();
        }
        assert!(admission.admit().is_ok(), "599 in flight, under 600");
        admission.placed();
        let behind = admission.admit().unwrap_err();
        assert_eq!((behind.in_flight, behind.limit), (600, 600));
        // The saga stopped: no rate allows anything, the floor still does.
        assert_eq!(admission.counted(600, 600, 0.0), 200);
        assert_eq!(admission.limit_at(f64::NAN), 200);
    }
}
