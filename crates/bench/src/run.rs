//! One benchmark run, start to finish:
//!
//! 1. **Load steps**, the whole saga running: closed loops overload it for a first
//!    estimate of its rate; open loops ramp from there until one falls behind, which
//!    finds the highest sustained rate; open loops at fractions of that give latency
//!    against offered load (half of it is the latency point).
//! 2. **Capacity**, each transaction with a backlog waiting: orders are placed while
//!    every consumer is stopped and the relay held back (the bench holds the relay's
//!    advisory lock, as a standby relay would find it held), then each relay and each
//!    consumer is let go in turn, so each one's rate is its own, not its input's.
//!    ChargeOrder's includes its call to the card provider, which stays up throughout;
//!    right after it the provider is called alone, as payment-service calls it.
//! 3. **Ceiling**: pgbench runs each handler's SQL ([`crate::sql`]) on fresh databases
//!    of the same schema at the services' connection counts, each transaction right
//!    after the service ran it in phase 2, so other work on the machine weighs on both
//!    alike.
//!
//! The saga's databases, topics and ports are the benchmark's own, fresh each run, and so
//! are the card provider's database and port: the demo stack, the walkthrough and the
//! tests never see them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use time::OffsetDateTime;
use tokio_postgres::Client;

use crate::db::Databases;
use crate::load::{self, Keys, LoadGenerator, LoadResult, Shape};
use crate::measure::{self, Percentiles, Work};
use crate::pgbench;
use crate::procs::{self, Running, ServiceSpec, StackEnv, Usage};
use crate::report::{
    Capacity, Machine, ORDER_TRANSACTIONS, ProviderCall, Pruning, Ratio, Report, ServiceSummary,
    Step,
};
use crate::sql::{self, Database, Transaction};

/// Past the plan's ramp, while its steps keep up: each step this much faster than the
/// one before, at most this many of them.
const RAMP_ONWARD: f64 = 1.25;
const RAMP_ONWARD_STEPS: i32 = 6;

/// The ramp's factors: the plan's, then on past its last. A ramp whose every step kept up
/// has found a lower bound, not the highest sustained rate (admission control may hold
/// the closed loops' estimate down), so it goes on until a step falls behind.
fn ramp_factors(ramp: &[f64]) -> impl Iterator<Item = f64> + '_ {
    let last = ramp.last().copied().unwrap_or(1.0);
    let onward = (1..=RAMP_ONWARD_STEPS).map(move |i| last * RAMP_ONWARD.powi(i));
    ramp.iter().copied().chain(onward)
}

/// How long and how hard a run goes.
#[derive(Debug, Clone)]
pub struct Plan {
    pub mode: &'static str,
    /// Closed-loop concurrencies, one step each. They overload the saga (the API takes
    /// orders faster than the consumers finish them), which gives a first estimate of
    /// its rate: what it confirms meanwhile.
    pub closed: Vec<u32>,
    /// Open-loop rates as multiples of that estimate, tried in turn until one falls
    /// behind (past the last, `RAMP_ONWARD` faster each time); the highest that kept up
    /// is the highest sustained rate.
    pub ramp: Vec<f64>,
    /// Steps halving the gap between the highest rate that kept up and the lowest that
    /// did not, once the ramp has found both.
    pub bisect: u32,
    /// Open-loop rates as fractions of the highest sustained rate, for latency.
    pub latency: Vec<f64>,
    pub step: Duration,
    /// Orders placed for the capacity phase.
    pub backlog: u32,
    pub pgbench: Duration,
    /// Outbox rows made for pgbench's relay script.
    pub relay_rows: u32,
    /// Old ids in payment-service's inbox for its pruner to delete in phase 4.
    pub old_ids: u32,
}

impl Plan {
    /// About a minute of load, for working on the code.
    pub fn quick() -> Self {
        Self {
            mode: "quick",
            closed: vec![8],
            ramp: vec![1.0, 1.5],
            bisect: 1,
            latency: vec![0.5],
            step: Duration::from_secs(10),
            backlog: 1_500,
            pgbench: Duration::from_secs(5),
            relay_rows: 60_000,
            old_ids: 200_000,
        }
    }

    /// The figures for the benchmark's page: more steps, longer ones, a bigger backlog.
    pub fn full() -> Self {
        Self {
            mode: "full",
            closed: vec![2, 8, 32],
            ramp: vec![0.75, 1.0, 1.25, 1.5, 2.0],
            bisect: 2,
            latency: vec![0.25, 0.5],
            step: Duration::from_secs(30),
            backlog: 6_000,
            pgbench: Duration::from_secs(15),
            relay_rows: 200_000,
            old_ids: 1_000_000,
        }
    }
}

/// Where things are and what the services are given.
#[derive(Debug, Clone)]
pub struct Settings {
    pub bin_dir: PathBuf,
    /// `postgres://user:password@host:port`
    pub postgres: String,
    pub brokers: String,
    pub partitions: i32,
    pub pool_size: u32,
    /// CONSUMER_BATCH_SIZE: 1 is a transaction per event.
    pub consumer_batch: u32,
    pub first_port: u16,
    pub out: PathBuf,
    pub font: PathBuf,
    pub kafka_version: String,
    pub command: String,
    pub rust_log: String,
}

const SERVICES: [&str; 3] = ["order-service", "payment-service", "notification-service"];
/// The stand-in card provider payment-service calls for every order. No step of the saga
/// (no Kafka, no inbox, no backlog of its own): it starts before the services, stops
/// after them, and stays up while the capacity phase holds their backlogs back.
const PROVIDER: &str = payment_provider::SERVICE;
/// The peak resident memory each service is allowed, with every feature on.
const RSS_TARGET_MIB: f64 = 32.0;
/// Each consumer's rate, a transaction per event, against pgbench's on its transaction.
const CONSUMER_TARGET: f64 = 0.85;
/// The saga's highest sustained rate against the ceiling: a transaction per event, and
/// in batches (against the same per-event ceiling).
const END_TO_END_TARGET: f64 = 0.80;
const END_TO_END_BATCHED_TARGET: f64 = 1.50;
/// A step whose last order is confirmed later than this after the last POST fell behind.
const SUSTAINED_DRAIN: f64 = 2.0;
/// A step that confirmed and notified less than this share of the orders placed per
/// second fell behind, however short the step was.
const KEPT_UP: f64 = 0.95;

struct Stack {
    env: StackEnv,
    specs: BTreeMap<&'static str, ServiceSpec>,
    running: BTreeMap<&'static str, Running>,
    tick_hz: f64,
    /// CPU seconds and peak RSS per service over the whole run (restarts included).
    totals: BTreeMap<&'static str, Usage>,
}

impl Stack {
    async fn start(&mut self, name: &'static str) -> anyhow::Result<()> {
        self.start_with(name, &[]).await
    }

    /// Starts `name` with `extra` variables beside the run's own.
    async fn start_with(
        &mut self,
        name: &'static str,
        extra: &[(&str, &str)],
    ) -> anyhow::Result<()> {
        let mut env = self.env.clone();
        env.extra.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        let running = Running::start(&self.specs[name], &env).await?;
        self.running.insert(name, running);
        Ok(())
    }

    async fn start_all(&mut self) -> anyhow::Result<()> {
        for name in std::iter::once(PROVIDER).chain(SERVICES) {
            if !self.running.contains_key(name) {
                self.start(name).await?;
            }
        }
        Ok(())
    }

    async fn stop(&mut self, name: &'static str) -> anyhow::Result<()> {
        if let Some(mut running) = self.running.remove(name) {
            self.account(name, running.usage_since_mark(self.tick_hz));
            running.stop().await?;
        }
        Ok(())
    }

    /// Stops the three services, the provider left running.
    async fn stop_saga(&mut self) -> anyhow::Result<()> {
        for name in SERVICES {
            self.stop(name).await?;
        }
        Ok(())
    }

    async fn stop_all(&mut self) -> anyhow::Result<()> {
        // The provider last, so that no charge is asked of a provider already gone.
        self.stop_saga().await?;
        self.stop(PROVIDER).await
    }

    fn account(&mut self, name: &'static str, usage: Usage) {
        self.totals.entry(name).or_default().add(&usage);
    }

    /// Each running service's usage since the last call, added to the run's totals.
    fn usage(&mut self) -> BTreeMap<String, Usage> {
        let mut phase = BTreeMap::new();
        let names: Vec<&'static str> = self.running.keys().copied().collect();
        for name in names {
            let usage = self
                .running
                .get_mut(name)
                .expect("listed above")
                .usage_since_mark(self.tick_hz);
            self.account(name, usage.clone());
            phase.insert(name.to_owned(), usage);
        }
        phase
    }
}

/// Holds a relay back: while this session holds the relay's advisory lock, the service's
/// relay waits as a standby and committed outbox rows pile up.
struct RelayHold(Client);

impl RelayHold {
    async fn take(databases: &Databases, database: Database) -> anyhow::Result<Self> {
        let client = databases.connect(database).await?;
        client
            .execute("SELECT pg_advisory_lock($1)", &[&sql::relay_lock()?])
            .await?;
        Ok(Self(client))
    }

    /// Ends the session, which releases the lock; the standby relay takes over at its
    /// next look (`OUTBOX_POLL_INTERVAL_MS`).
    fn release(self) {
        drop(self.0);
    }
}

fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn log(message: impl std::fmt::Display) {
    let [one, five, fifteen] = procs::load_average();
    eprintln!("[bench] {message}  (load average {one:.2} {five:.2} {fifteen:.2})");
}

/// Deletes the topics of earlier benchmark runs (`bench<digits>.…`), then creates this
/// run's.
async fn fresh_topics(settings: &Settings, namespace: &str) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &settings.brokers)
        .create()?;
    let metadata = admin
        .inner()
        .fetch_metadata(None, Duration::from_secs(10))?;
    let old: Vec<String> = metadata
        .topics()
        .iter()
        .map(|t| t.name().to_owned())
        .filter(|name| {
            name.strip_prefix("bench").is_some_and(|rest| {
                let digits = rest.chars().take_while(char::is_ascii_digit).count();
                digits > 0 && rest[digits..].starts_with('.')
            })
        })
        .collect();
    if !old.is_empty() {
        let names: Vec<&str> = old.iter().map(String::as_str).collect();
        admin.delete_topics(&names, &AdminOptions::new()).await?;
    }
    let topics = saga::Topics::new(namespace).all();
    saga::kafka::create_topics(&settings.brokers, &topics, settings.partitions).await
}

/// Records in this run's dead-letter topics: each one is an event the saga gave up on.
fn dead_letters(settings: &Settings, namespace: &str) -> anyhow::Result<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &settings.brokers)
        .set("group.id", format!("{namespace}bench-watermarks"))
        .create()?;
    let topics = saga::Topics::new(namespace);
    let mut total = 0;
    for (topic, service) in [
        (&topics.orders, "payment-service"),
        (&topics.payments, "order-service"),
        (&topics.orders, "notification-service"),
    ] {
        let dlq = topics.dead_letter(topic, service);
        for partition in 0..settings.partitions {
            let (low, high) =
                consumer.fetch_watermarks(&dlq, partition, Duration::from_secs(10))?;
            total += high - low;
        }
    }
    Ok(total)
}

async fn postgres_version(databases: &Databases) -> anyhow::Result<String> {
    let client = databases.connect(Database::Orders).await?;
    let version: String = client.query_one("SHOW server_version", &[]).await?.get(0);
    Ok(format!(
        "PostgreSQL {}",
        version.split_whitespace().next().unwrap_or(&version)
    ))
}

async fn load_step(
    stack: &mut Stack,
    generator: &Arc<LoadGenerator>,
    databases: &Databases,
    shape: Shape,
    plan: &Plan,
    name: String,
    tag: String,
) -> anyhow::Result<Step> {
    log(format!("{name}: {shape} for {:?}", plan.step));
    stack.usage();
    let before = procs::Ticks::now();
    let load = generator.run(shape, plan.step, &tag).await;
    let warmup = (plan.step / 5).min(Duration::from_secs(3));
    let outcome = measure::step_outcome(databases, &tag, warmup, Duration::from_secs(120)).await?;
    let cpu = procs::Ticks::now().since(&before, stack.tick_hz);
    let usage = stack.usage();
    let offered_per_second = match shape {
        Shape::Open { rate } => rate,
        Shape::Closed { .. } => load.placed_per_second(),
    };
    let step = Step {
        name,
        offered_per_second,
        post_ms: crate::measure::Percentiles::of_sorted_us(&load.post_latencies_us),
        sustained: outcome.unfinished == 0
            && load.failed == 0
            && load.refused == 0
            && outcome.confirmed_drain_seconds <= SUSTAINED_DRAIN
            && outcome.settled_per_second() >= KEPT_UP * load.placed_per_second(),
        load,
        outcome,
        usage,
        cpu,
        load_average: procs::load_average(),
    };
    log(format!(
        "{}: placed {:.0}/s ({:.0}% refused), confirmed {:.0}/s, notified {:.0}/s, POST→confirmed p50 {:.1} ms p99 {:.1} ms, drain {:.2} s{}",
        step.name,
        step.load.placed_per_second(),
        step.load.refused_percent(),
        step.outcome.confirmed.per_second,
        step.outcome.notified.per_second,
        step.outcome.to_confirmed_ms.p50,
        step.outcome.to_confirmed_ms.p99,
        step.outcome.confirmed_drain_seconds,
        if step.sustained { "" } else { " (fell behind)" },
    ));
    for (hop, ms) in &step.outcome.hops_ms {
        eprintln!(
            "[bench]     {hop}: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            ms.p50, ms.p99, ms.max
        );
    }
    Ok(step)
}

async fn ramp_step(
    stack: &mut Stack,
    generator: &Arc<LoadGenerator>,
    databases: &Databases,
    plan: &Plan,
    run_id: u64,
    rate: f64,
) -> anyhow::Result<Step> {
    let name = format!("ramp {rate:.0}/s");
    let tag = format!("bench{run_id}-ramp{rate:.0}");
    load_step(
        stack,
        generator,
        databases,
        Shape::Open { rate },
        plan,
        name,
        tag,
    )
    .await
}

/// Phase 2: each transaction working through a backlog on its own.
async fn capacity(
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
    let mut usage = BTreeMap::new();
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
                &tag,
                keys,
            )
            .await;
        placing.add(&placed, stack.usage());
    }
    let create = plain.drain();
    let create_keyed = keyed.drain();
    usage.insert("create".to_owned(), plain.usage);
    usage.insert("create keyed".to_owned(), keyed.usage);
    log(format!(
        "capacity: POST alone {:.0} orders/s, with an Idempotency-Key {:.0} orders/s",
        create.per_second, create_keyed.per_second
    ));
    ceilings.measure("create").await?;
    ceilings.measure("create keyed").await?;

    let mut backlog = Backlog {
        stack,
        databases,
        expected,
        timeout,
        usage,
    };
    let relay_orders_created = backlog
        .drain(
            "relay order.created",
            Go::Release(hold),
            Database::Orders,
            Work::Published,
        )
        .await?;
    ceilings.measure("relay").await?;

    let hold = RelayHold::take(databases, Database::Payments).await?;
    let charge = backlog
        .drain(
            "charge",
            Go::Start("payment-service"),
            Database::Payments,
            Work::Applied,
        )
        .await?;
    let (provider_alone, provider_alone_ms, provider_alone_failed) =
        backlog.provider_alone(ceilings.partitions).await?;
    ceilings.measure("charge").await?;
    ceilings.measure("provider").await?;
    ceilings.measure("charge without call").await?;

    // order-service would consume the payment results while they are published; stop it
    // so its consumer later meets the whole backlog at once.
    backlog.stack.stop("order-service").await?;
    let relay_payments = backlog
        .drain(
            "relay payments",
            Go::Release(hold),
            Database::Payments,
            Work::Published,
        )
        .await?;

    let hold = RelayHold::take(databases, Database::Orders).await?;
    let apply = backlog
        .drain(
            "apply",
            Go::Start("order-service"),
            Database::Orders,
            Work::Applied,
        )
        .await?;
    ceilings.measure("apply").await?;

    let notifications_hold = RelayHold::take(databases, Database::Notifications).await?;
    let relay_outcomes = backlog
        .drain(
            "relay outcomes",
            Go::Release(hold),
            Database::Orders,
            Work::Published,
        )
        .await?;

    let notify = backlog
        .drain(
            "notify",
            Go::Start("notification-service"),
            Database::Notifications,
            Work::Applied,
        )
        .await?;
    ceilings.measure("notify").await?;

    let relay_notifications = backlog
        .drain(
            "relay notifications",
            Go::Release(notifications_hold),
            Database::Notifications,
            Work::Published,
        )
        .await?;
    let usage = backlog.usage;

    Ok(Capacity {
        orders: n,
        create,
        create_keyed,
        charge,
        provider_alone,
        provider_alone_ms,
        provider_alone_failed,
        apply,
        notify,
        relay_orders_created,
        relay_payments,
        relay_outcomes,
        relay_notifications,
        usage,
        load_average: procs::load_average(),
    })
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

/// Phase 4: payment-service draining a backlog while its pruner deletes `plan.old_ids`
/// ids past their window, against the same drain with the pruner off, in the same run.
/// The other services keep running, so these orders go through the whole saga too.
async fn pruning(
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
}

/// Phase 3, run piecewise inside phase 2: pgbench on fresh databases of the same schema,
/// each transaction right after the service's own run at it, so both meet the machine
/// in about the same state (other work on it shifts both, not one).
struct Ceilings {
    pgbench: PathBuf,
    databases: Databases,
    scripts: Vec<(Transaction, PathBuf)>,
    pool_size: u32,
    partitions: u32,
    duration: Duration,
    relay_rows: u32,
    /// The consumers' transactions as they run in batches: the transaction each
    /// batches, its name and its script ([`pgbench::BATCHED`]); none a transaction per
    /// event.
    batched: Vec<(&'static str, &'static str, PathBuf)>,
    consumer_batch: u32,
    measured: Vec<pgbench::Ceiling>,
}

impl Ceilings {
    async fn prepare(settings: &Settings, plan: &Plan) -> anyhow::Result<Self> {
        let databases = Databases::new(&settings.postgres, "bench_ceiling_");
        databases.recreate().await?;
        databases.migrate().await?;
        pgbench::prepare(&databases, plan.relay_rows).await?;
        let folder = settings.out.join("pgbench");
        let scripts = pgbench::write_scripts(&folder)?;
        let batched = if settings.consumer_batch > 1 {
            pgbench::write_batched_scripts(&folder, &scripts, settings.consumer_batch)?
        } else {
            Vec::new()
        };
        Ok(Self {
            pgbench: pgbench::find_pgbench()?,
            scripts,
            batched,
            consumer_batch: settings.consumer_batch,
            databases,
            pool_size: settings.pool_size,
            partitions: settings.partitions as u32,
            duration: plan.pgbench,
            relay_rows: plan.relay_rows,
            measured: Vec::new(),
        })
    }

    /// Runs transaction `name`'s script, and in batches its batched script too if it is
    /// a consumer's; tried again if PostgreSQL went away meanwhile (another test suite on
    /// this machine stops the cluster now and then).
    async fn measure(&mut self, name: &str) -> anyhow::Result<()> {
        let (transaction, script) = self
            .scripts
            .iter()
            .find(|(t, _)| t.name == name)
            .with_context(|| format!("no pgbench script {name}"))?;
        let ceiling = self.run(transaction, script).await?;
        self.measured.push(ceiling);
        if let Some((_, batched_name, script)) = self.batched.iter().find(|(of, ..)| *of == name) {
            let mut ceiling = self.run(transaction, script).await?;
            ceiling.name = batched_name;
            ceiling.what = pgbench::BATCHED_WHAT;
            ceiling.events_per_second *= f64::from(self.consumer_batch);
            ceiling.events *= f64::from(self.consumer_batch);
            self.measured.push(ceiling);
        }
        Ok(())
    }

    async fn run(
        &self,
        transaction: &Transaction,
        script: &std::path::Path,
    ) -> anyhow::Result<pgbench::Ceiling> {
        let name = transaction.name;
        // The script's own name: a consumer's batched script runs as its transaction.
        let label = script.file_stem().unwrap_or_default().to_string_lossy();
        // The connections each transaction has in the services: HTTP requests share the
        // pool; a consumer applies one event per partition at a time; one relay.
        let connections = match name {
            "create" | "create keyed" => self.pool_size,
            "relay" => 1,
            _ => self.partitions,
        };
        let mut tries = 0;
        let ceiling = loop {
            tries += 1;
            log(format!("pgbench {label} at {connections} connections"));
            match pgbench::run(
                &self.pgbench,
                &self.databases,
                transaction,
                script,
                connections,
                self.duration,
                self.relay_rows,
            )
            .await
            {
                Ok(ceiling) => break ceiling,
                Err(error) if tries < 3 => {
                    log(format!("pgbench {label} failed, trying again: {error:#}"));
                    tokio::time::sleep(Duration::from_secs(10)).await;
                }
                Err(error) => return Err(error),
            }
        };
        log(format!("pgbench {label}: {:.0} tps", ceiling.tps));
        Ok(ceiling)
    }
}

/// This run's databases and topics, fresh, and the services ready to start on them.
async fn fresh_stack(settings: &Settings) -> anyhow::Result<(Databases, Stack, String, u64)> {
    std::fs::create_dir_all(&settings.out)?;
    let run_id = unix_seconds();
    let namespace = format!("bench{run_id}.");
    let databases = Databases::new(&settings.postgres, "bench_");
    log(format!(
        "fresh databases bench_* and topics {namespace}*; results in {}",
        settings.out.display()
    ));
    databases.recreate().await?;
    fresh_topics(settings, &namespace).await?;

    // The order API on the first port, then payment-service and notification-service,
    // then the provider, which payment-service is pointed at.
    let provider_port = settings.first_port + 3;
    let mut specs = BTreeMap::new();
    for (i, (name, database)) in SERVICES
        .into_iter()
        .chain([PROVIDER])
        .zip([
            Database::Orders,
            Database::Payments,
            Database::Notifications,
            Database::Provider,
        ])
        .enumerate()
    {
        let env = match name {
            "payment-service" => vec![(
                "PROVIDER_URL".to_owned(),
                format!("http://127.0.0.1:{provider_port}"),
            )],
            _ => Vec::new(),
        };
        specs.insert(
            name,
            ServiceSpec {
                name,
                database_url: databases.url(database),
                port: settings.first_port + i as u16,
                env,
            },
        );
    }
    let stack = Stack {
        env: StackEnv {
            bin_dir: settings.bin_dir.clone(),
            brokers: settings.brokers.clone(),
            namespace: namespace.clone(),
            log_dir: settings.out.clone(),
            rust_log: settings.rust_log.clone(),
            extra: vec![
                (
                    "DATABASE_POOL_SIZE".to_owned(),
                    settings.pool_size.to_string(),
                ),
                (
                    "CONSUMER_BATCH_SIZE".to_owned(),
                    settings.consumer_batch.to_string(),
                ),
            ],
        },
        specs,
        running: BTreeMap::new(),
        tick_hz: procs::tick_hz(),
        totals: BTreeMap::new(),
    };
    Ok((databases, stack, namespace, run_id))
}

/// Latency at one fixed rate, `steps` times, with nothing else measured: for comparing
/// two builds (`--bin-dir`) under the same offered load.
pub async fn probe(
    settings: Settings,
    rate: f64,
    steps: u32,
    step: Duration,
) -> anyhow::Result<Vec<Step>> {
    let (databases, mut stack, _, run_id) = fresh_stack(&settings).await?;
    let plan = Plan {
        step,
        ..Plan::quick()
    };
    let result = async {
        stack.start_all().await?;
        let generator = Arc::new(LoadGenerator::new(&format!(
            "http://127.0.0.1:{}",
            settings.first_port
        ))?);
        warm_up(&generator, &databases, run_id).await?;
        let mut done = Vec::new();
        for i in 0..steps {
            let name = format!("probe {rate:.0}/s #{}", i + 1);
            let tag = format!("bench{run_id}-probe{i}");
            let shape = Shape::Open { rate };
            done.push(
                load_step(&mut stack, &generator, &databases, shape, &plan, name, tag).await?,
            );
        }
        anyhow::Ok(done)
    }
    .await;
    let stopped = stack.stop_all().await;
    let steps = result?;
    stopped?;
    std::fs::write(
        settings.out.join("probe.json"),
        serde_json::to_vec_pretty(&steps)?,
    )?;
    Ok(steps)
}

/// A few orders first: connections, consumer groups and caches warm, not measured.
async fn warm_up(
    generator: &Arc<LoadGenerator>,
    databases: &Databases,
    run_id: u64,
) -> anyhow::Result<()> {
    let tag = format!("bench{run_id}-warmup");
    generator
        .run(
            Shape::Closed { concurrency: 2 },
            Duration::from_secs(2),
            &tag,
        )
        .await;
    measure::step_outcome(databases, &tag, Duration::ZERO, Duration::from_secs(60)).await?;
    Ok(())
}

pub async fn run(settings: Settings, plan: Plan) -> anyhow::Result<Report> {
    let started_at = OffsetDateTime::now_utc();
    // Fail before any load if the handlers' SQL and the benchmark have drifted apart.
    for transaction in Transaction::all() {
        transaction.pgbench_script()?;
    }
    pgbench::find_pgbench()?;
    let (databases, mut stack, namespace, run_id) = fresh_stack(&settings).await?;
    let mut ceilings = Ceilings::prepare(&settings, &plan).await?;
    let result = run_phases(
        &settings,
        &plan,
        &mut stack,
        &databases,
        &mut ceilings,
        run_id,
    )
    .await;
    // Whatever happened, leave no service of ours running.
    let stopped = stack.stop_all().await;
    let (steps, capacity, pruning) = result?;
    stopped?;

    let effects = measure::effects(&databases).await?;
    let dead_letters = dead_letters(&settings, &namespace)?;
    let machine = Machine::describe(
        postgres_version(&databases).await?,
        settings.kafka_version.clone(),
        is_local(&settings.postgres) && is_local(&settings.brokers),
    );
    Ok(assemble(
        &settings,
        &plan,
        started_at,
        machine,
        steps,
        capacity,
        pruning,
        ceilings.measured,
        &stack,
        effects,
        dead_letters,
    ))
}

fn is_local(address: &str) -> bool {
    address.contains("127.0.0.1") || address.contains("localhost") || address.contains("[::1]")
}

async fn run_phases(
    settings: &Settings,
    plan: &Plan,
    stack: &mut Stack,
    databases: &Databases,
    ceilings: &mut Ceilings,
    run_id: u64,
) -> anyhow::Result<(Vec<Step>, Capacity, Pruning)> {
    log("starting the services (release builds)");
    stack.start_all().await?;
    let generator = Arc::new(LoadGenerator::new(&format!(
        "http://127.0.0.1:{}",
        settings.first_port
    ))?);

    warm_up(&generator, databases, run_id).await?;

    let mut steps = Vec::new();
    for &concurrency in &plan.closed {
        let name = format!("closed c={concurrency}");
        let tag = format!("bench{run_id}-closed{concurrency}");
        let shape = Shape::Closed { concurrency };
        steps.push(load_step(stack, &generator, databases, shape, plan, name, tag).await?);
    }
    let estimate = max_confirmed(&steps, |_| true);
    log(format!(
        "closed loops confirmed and notified up to {estimate:.0} orders/s; ramping open loops from there"
    ));
    let mut kept_up: f64 = 0.0;
    let mut fell_behind = None;
    for factor in ramp_factors(&plan.ramp) {
        let rate = (estimate * factor).max(1.0).round();
        let step = ramp_step(stack, &generator, databases, plan, run_id, rate).await?;
        let sustained = step.sustained;
        steps.push(step);
        if sustained {
            kept_up = kept_up.max(rate);
        } else {
            fell_behind = Some(rate);
            break;
        }
    }
    if let Some(mut behind) = fell_behind {
        for _ in 0..plan.bisect {
            let low = if kept_up > 0.0 { kept_up } else { behind / 2.0 };
            let rate = ((low + behind) / 2.0).round();
            if behind - rate < 0.03 * behind {
                break;
            }
            let step = ramp_step(stack, &generator, databases, plan, run_id, rate).await?;
            if step.sustained {
                kept_up = rate;
            } else {
                behind = rate;
            }
            steps.push(step);
        }
    }
    let max_sustained = max_sustained(&steps);
    log(format!(
        "highest sustained rate: {max_sustained:.0} orders/s"
    ));
    for &fraction in &plan.latency {
        let rate = (max_sustained * fraction).max(1.0).round();
        let name = format!("{:.0}% of max ({rate:.0}/s)", fraction * 100.0);
        let tag = format!("bench{run_id}-latency{}", (fraction * 100.0) as u32);
        let shape = Shape::Open { rate };
        steps.push(load_step(stack, &generator, databases, shape, plan, name, tag).await?);
    }

    let capacity = capacity(
        stack,
        &generator,
        databases,
        ceilings,
        plan,
        settings.pool_size,
        run_id,
    )
    .await?;
    let pruning = pruning(
        stack,
        &generator,
        databases,
        plan,
        settings.pool_size,
        run_id,
    )
    .await?;
    Ok((steps, capacity, pruning))
}

/// The highest rate orders were both confirmed and notified at, over `steps` that pass
/// `filter`.
fn max_confirmed(steps: &[Step], filter: impl Fn(&Step) -> bool) -> f64 {
    steps
        .iter()
        .filter(|s| filter(s))
        .map(|s| s.outcome.settled_per_second())
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max)
}

/// The highest rate of a step that kept up; if none did, the best rate seen.
fn max_sustained(steps: &[Step]) -> f64 {
    let sustained = max_confirmed(steps, |s| s.sustained);
    if sustained > 0.0 {
        sustained
    } else {
        max_confirmed(steps, |_| true)
    }
}

#[allow(clippy::too_many_arguments)]
fn assemble(
    settings: &Settings,
    plan: &Plan,
    started_at: OffsetDateTime,
    machine: Machine,
    steps: Vec<Step>,
    capacity: Capacity,
    pruning: Pruning,
    ceilings: Vec<pgbench::Ceiling>,
    stack: &Stack,
    effects: measure::Effects,
    dead_letters: i64,
) -> Report {
    let rate = |name: &str| {
        ceilings
            .iter()
            .find(|c| c.name == name)
            .map_or(f64::NAN, |c| c.events_per_second)
    };
    let ceiling_orders_per_second = 1.0
        / ORDER_TRANSACTIONS
            .iter()
            .map(|&(name, per_order)| per_order / rate(name))
            .sum::<f64>();
    let max_sustained_per_second = max_sustained(&steps);
    let end_to_end_target = if settings.consumer_batch > 1 {
        END_TO_END_BATCHED_TARGET
    } else {
        END_TO_END_TARGET
    };
    let relay_best = [
        &capacity.relay_orders_created,
        &capacity.relay_payments,
        &capacity.relay_outcomes,
        &capacity.relay_notifications,
    ]
    .iter()
    .map(|d| d.per_second)
    .filter(|v| v.is_finite())
    .fold(0.0, f64::max);
    let connections = |name: &str| {
        ceilings
            .iter()
            .find(|c| c.name == name)
            .map_or(0, |c| c.connections)
    };
    let provider_call = ProviderCall::new(
        &capacity,
        settings.partitions as u32,
        settings.consumer_batch,
        rate,
    );
    let ratios = vec![
        Ratio::new(
            format!(
                "payment-service consumer, ChargeOrder with the provider call ({} conns)",
                connections("charge")
            ),
            capacity.charge.per_second,
            provider_call.ceiling_with_call,
            Some(CONSUMER_TARGET),
        ),
        Ratio::new(
            format!(
                "payment-provider alone, POST /v1/charges ({} conns)",
                connections("provider")
            ),
            capacity.provider_alone.per_second,
            rate("provider"),
            None,
        ),
        Ratio::new(
            format!(
                "order-service consumer, ApplyPaymentResult ({} conns)",
                connections("apply")
            ),
            capacity.apply.per_second,
            rate("apply"),
            Some(CONSUMER_TARGET),
        ),
        Ratio::new(
            format!(
                "notification-service consumer, NotifyCustomer ({} conns)",
                connections("notify")
            ),
            capacity.notify.per_second,
            rate("notify"),
            Some(CONSUMER_TARGET),
        ),
        Ratio::new(
            format!("POST /v1/orders alone ({} conns)", connections("create")),
            capacity.create.per_second,
            rate("create"),
            None,
        ),
        Ratio::new(
            format!(
                "POST /v1/orders with an Idempotency-Key ({} conns)",
                connections("create keyed")
            ),
            capacity.create_keyed.per_second,
            rate("create keyed"),
            None,
        ),
        Ratio::new(
            "POST /v1/orders with an Idempotency-Key vs without",
            capacity.create_keyed.per_second,
            capacity.create.per_second,
            Some(0.90),
        ),
        Ratio::new(
            format!(
                "payment-service consumer while its pruner deletes {} old ids vs without",
                pruning.old_ids
            ),
            pruning.with.per_second,
            pruning.without.per_second,
            Some(0.90),
        ),
        Ratio::new(
            "outbox relay, rows published (best of four, 1 conn)",
            relay_best,
            rate("relay"),
            None,
        ),
        Ratio::new(
            "end to end, orders confirmed and notified",
            max_sustained_per_second,
            ceiling_orders_per_second,
            Some(end_to_end_target),
        ),
    ];

    let mut services = BTreeMap::new();
    for name in SERVICES.into_iter().chain([PROVIDER]) {
        let usage = stack.totals.get(name).cloned().unwrap_or_default();
        let peak_rss_mib = usage.peak_rss_kib as f64 / 1024.0;
        services.insert(
            name.to_owned(),
            ServiceSummary {
                cpu_seconds: usage.cpu_seconds,
                peak_rss_mib,
                rss_target_mib: RSS_TARGET_MIB,
                rss_met: peak_rss_mib <= RSS_TARGET_MIB,
                outcomes: procs::outcomes_in_log(&settings.out.join(format!("{name}.log"))),
            },
        );
    }

    let half_load_step = steps
        .iter()
        .find(|s| s.name.starts_with("50% of max"))
        .map(|s| s.name.clone());
    let mut settings_map = BTreeMap::new();
    settings_map.insert("partitions".into(), settings.partitions.to_string());
    settings_map.insert("DATABASE_POOL_SIZE".into(), settings.pool_size.to_string());
    settings_map.insert(
        "CONSUMER_BATCH_SIZE".into(),
        settings.consumer_batch.to_string(),
    );
    settings_map.insert("RUST_LOG".into(), settings.rust_log.clone());
    settings_map.insert("step_seconds".into(), plan.step.as_secs().to_string());
    settings_map.insert("backlog_orders".into(), plan.backlog.to_string());
    settings_map.insert("pgbench_seconds".into(), plan.pgbench.as_secs().to_string());
    settings_map.insert("old_ids".into(), plan.old_ids.to_string());
    Report {
        mode: plan.mode.to_owned(),
        command: settings.command.clone(),
        started_at,
        machine,
        settings: settings_map,
        steps,
        max_sustained_per_second,
        half_load_step,
        capacity,
        provider_call,
        pruning,
        ceilings,
        ceiling_orders_per_second,
        end_to_end_target,
        ratios,
        services,
        effects,
        dead_letters,
        load_average_at_end: procs::load_average(),
    }
}

/// Writes `result.json`, `table.md` and `chart.png` into the run's folder.
pub fn write(report: &Report, settings: &Settings) -> anyhow::Result<String> {
    report.write_json(&settings.out.join("result.json"))?;
    let table = report.markdown();
    std::fs::write(settings.out.join("table.md"), &table)?;
    report
        .chart(&settings.out.join("chart.png"), &settings.font)
        .context("drawing the chart")?;
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ramp_that_keeps_up_goes_on_past_the_plans_last_step_a_quarter_faster_each_time() {
        let factors: Vec<f64> = ramp_factors(&Plan::quick().ramp).collect();
        assert_eq!(factors[..2], [1.0, 1.5]);
        assert_eq!(factors.len(), 2 + RAMP_ONWARD_STEPS as usize);
        for pair in factors[1..].windows(2) {
            assert!(
                (pair[1] / pair[0] - RAMP_ONWARD).abs() < 1e-9,
                "{factors:?}"
            );
        }
    }
}
