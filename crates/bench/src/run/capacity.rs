//! Phase 2, capacity: a backlog placed with every consumer stopped and each relay held,
//! then each relay and each consumer let go on it in turn, so each one's rate is its own.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::db::Databases;
use crate::load::{self, Keys, LoadGenerator, LoadResult, Shape};
use crate::measure::{self, Drain, Percentiles, Work};
use crate::procs::{self, Usage};
use crate::report::Capacity;
use crate::sql::Database;

use super::ceiling::Ceilings;
use super::stack::{PROVIDER, RelayHold, Stack};
use super::{Plan, log};

/// Phase 2: each transaction working through a backlog on its own.
pub(super) async fn capacity(
    stack: &mut Stack,
    generator: &Arc<LoadGenerator>,
    databases: &Databases,
    ceilings: &mut Ceilings,
    plan: &Plan,
    pool_size: u32,
    run_id: u64,
) -> anyhow::Result<Capacity> {
    let n = plan.backlog;
    let expected = i64::from(n);
    let timeout = Duration::from_secs(300);
    stack.stop_saga().await?;
    // From here on the run builds backlogs on purpose, which admission control would
    // refuse past its cap: every service started from now on has it off.
    stack
        .env
        .extra
        .push(("ADMISSION_MAX_IN_FLIGHT".to_owned(), "0".to_owned()));

    log(format!(
        "capacity: placing {n} orders with every consumer stopped and the orders relay held"
    ));
    let hold = RelayHold::take(databases, Database::Orders).await?;
    stack.start("order-service").await?;
    stack.usage();
    let tag = format!("bench{run_id}-backlog");
    let (create, create_keyed, usage) = place(stack, generator, n, pool_size, &tag).await;
    log(format!(
        "capacity: POST alone {:.0} orders/s, with an Idempotency-Key {:.0} orders/s",
        create.per_second, create_keyed.per_second
    ));
    ceilings.measure("create").await?;
    ceilings.measure("create keyed").await?;

    let mut capacity = Capacity {
        orders: n,
        create,
        create_keyed,
        ..Capacity::default()
    };
    let mut backlog = Backlog {
        stack,
        databases,
        expected,
        timeout,
        usage,
    };
    let hold = backlog.charges(&mut capacity, ceilings, hold).await?;
    backlog.results(&mut capacity, ceilings, hold).await?;
    capacity.usage = backlog.usage;
    capacity.load_average = procs::load_average();
    Ok(capacity)
}

/// Places the backlog of `n` orders under `tag`; returns the rate of the orders placed
/// without and with an Idempotency-Key, and the services' usage while each were placed.
async fn place(
    stack: &mut Stack,
    generator: &Arc<LoadGenerator>,
    n: u32,
    pool_size: u32,
    tag: &str,
) -> (Drain, Drain, BTreeMap<String, BTreeMap<String, Usage>>) {
    let mut usage = BTreeMap::new();
    // The backlog is placed in four parts, without and with an Idempotency-Key on every
    // request in turn, so that the key's cost is measured side by side, on the same
    // machine state, with drift shared between the two.
    let mut plain = Placing::default();
    let mut keyed = Placing::default();
    for part in 0..4 {
        let (keys, placing) = if part % 2 == 0 {
            (Keys::None, &mut plain)
        } else {
            (Keys::Unique, &mut keyed)
        };
        let count = u64::from(n / 4 + u32::from(part == 3) * (n % 4));
        let placed = generator
            .run_count(
                Shape::Closed {
                    concurrency: pool_size,
                },
                count,
                tag,
                keys,
            )
            .await;
        placing.add(&placed, stack.usage());
    }
    let create = plain.drain();
    let create_keyed = keyed.drain();
    usage.insert("create".to_owned(), plain.usage);
    usage.insert("create keyed".to_owned(), keyed.usage);
    (create, create_keyed, usage)
}

/// Orders placed in several parts of one kind, summed.
#[derive(Default)]
struct Placing {
    placed: u64,
    seconds: f64,
    usage: BTreeMap<String, Usage>,
}

impl Placing {
    fn add(&mut self, placed: &LoadResult, usage: BTreeMap<String, Usage>) {
        self.placed += placed.placed;
        self.seconds += placed.seconds;
        for (service, part) in usage {
            self.usage.entry(service).or_default().add(&part);
        }
    }

    fn drain(&self) -> crate::measure::Drain {
        crate::measure::Drain {
            rows: self.placed as i64,
            seconds: self.seconds,
            per_second: self.placed as f64 / self.seconds,
            batches: None,
        }
    }
}

/// What lets a held-back backlog go: a consumer's service started, or a relay's lock
/// released.
enum Go {
    Start(&'static str),
    Release(RelayHold),
}

/// Phase 2's backlogs: each drained by one consumer or relay, timed from the database.
struct Backlog<'a> {
    stack: &'a mut Stack,
    databases: &'a Databases,
    expected: i64,
    timeout: Duration,
    /// The services' CPU and memory while each backlog drained, by its name.
    usage: BTreeMap<String, BTreeMap<String, Usage>>,
}

impl Backlog<'_> {
    /// Lets `go` loose on the backlog and waits until `expected` rows of `work` are done
    /// in `database`, timed from the server's clock at the start.
    async fn drain(
        &mut self,
        name: &str,
        go: Go,
        database: Database,
        work: Work,
    ) -> anyhow::Result<measure::Drain> {
        let since = measure::server_now(self.databases).await?;
        match go {
            Go::Start(service) => self.stack.start(service).await?,
            Go::Release(hold) => hold.release(),
        }
        let drained = measure::drain(
            self.databases,
            database,
            work,
            since,
            self.expected,
            self.timeout,
        )
        .await?;
        self.usage.insert(name.to_owned(), self.stack.usage());
        log(format!("capacity: {name} {:.0}/s", drained.per_second));
        Ok(drained)
    }

    /// The provider alone: a charge per order of the backlog asked of it directly, the
    /// way payment-service asks (its client, a key per order), `concurrency` calls in
    /// flight as the consumer has one per partition; timed from the provider's database.
    async fn provider_alone(
        &mut self,
        concurrency: u32,
    ) -> anyhow::Result<(measure::Drain, Percentiles, u64)> {
        let url = format!("http://127.0.0.1:{}", self.stack.specs[PROVIDER].port);
        let since = measure::server_now(self.databases).await?;
        self.stack.usage();
        let calls = load::charge_directly(&url, self.expected as u64, concurrency).await?;
        let drained = measure::drain(
            self.databases,
            Database::Provider,
            Work::Charged,
            since,
            calls.charged as i64,
            self.timeout,
        )
        .await?;
        self.usage
            .insert("provider alone".to_owned(), self.stack.usage());
        let ms = Percentiles::of_sorted_us(&calls.latencies_us);
        log(format!(
            "capacity: provider alone {:.0} charges/s, each call p50 {:.2} ms p99 {:.2} ms{}",
            drained.per_second,
            ms.p50,
            ms.p99,
            match calls.failed {
                0 => String::new(),
                n => format!(", {n} failed"),
            }
        ));
        Ok((drained, ms, calls.failed))
    }
    /// The orders' side: the relay publishes order.created, payment-service charges
    /// each order, then the provider is called alone. Returns the hold on payment-service's
    /// relay, taken before the charges so that the payment results wait.
    async fn charges(
        &mut self,
        capacity: &mut Capacity,
        ceilings: &mut Ceilings,
        hold: RelayHold,
    ) -> anyhow::Result<RelayHold> {
        capacity.relay_orders_created = self
            .drain(
                "relay order.created",
                Go::Release(hold),
                Database::Orders,
                Work::Published,
            )
            .await?;
        ceilings.measure("relay").await?;

        let hold = RelayHold::take(self.databases, Database::Payments).await?;
        capacity.charge = self
            .drain(
                "charge",
                Go::Start("payment-service"),
                Database::Payments,
                Work::Applied,
            )
            .await?;
        (
            capacity.provider_alone,
            capacity.provider_alone_ms,
            capacity.provider_alone_failed,
        ) = self.provider_alone(ceilings.partitions).await?;
        ceilings.measure("charge").await?;
        ceilings.measure("provider").await?;
        ceilings.measure("charge without call").await?;
        Ok(hold)
    }

    /// The results' side: the payment results published, applied by order-service, its
    /// outcomes published, notified, and the notifications published.
    async fn results(
        &mut self,
        capacity: &mut Capacity,
        ceilings: &mut Ceilings,
        hold: RelayHold,
    ) -> anyhow::Result<()> {
        // order-service would consume the payment results while they are published; stop it
        // so its consumer later meets the whole backlog at once.
        self.stack.stop("order-service").await?;
        capacity.relay_payments = self
            .drain(
                "relay payments",
                Go::Release(hold),
                Database::Payments,
                Work::Published,
            )
            .await?;

        let hold = RelayHold::take(self.databases, Database::Orders).await?;
        capacity.apply = self
            .drain(
                "apply",
                Go::Start("order-service"),
                Database::Orders,
                Work::Applied,
            )
            .await?;
        ceilings.measure("apply").await?;

        let notifications_hold = RelayHold::take(self.databases, Database::Notifications).await?;
        capacity.relay_outcomes = self
            .drain(
                "relay outcomes",
                Go::Release(hold),
                Database::Orders,
                Work::Published,
            )
            .await?;

        capacity.notify = self
            .drain(
                "notify",
                Go::Start("notification-service"),
                Database::Notifications,
                Work::Applied,
            )
            .await?;
        ceilings.measure("notify").await?;

        capacity.relay_notifications = self
            .drain(
                "relay notifications",
                Go::Release(notifications_hold),
                Database::Notifications,
                Work::Published,
            )
            .await?;
        Ok(())
    }
}
