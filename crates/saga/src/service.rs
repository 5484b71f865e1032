//! The wiring every service shares: database pool and migrations, the HTTP listener, the
//! outbox relay, the pruner, and a consumer, run together until shutdown.
//!
//! A service is `Service::start` (fails fast on bad configuration; waits for the
//! database) followed by `Service::run` with its own router and handler.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use axum::Router;
use deadpool_postgres::Pool;
use futures::future::BoxFuture;
use kafka_rights::{Operation, Rights};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{DatabaseConfig, HttpLimits, KafkaConfig, RetentionConfig};
use crate::consumer::{self, ConsumerSettings};
use crate::db;
use crate::lease::Lease;
use crate::probes::Probes;
use crate::retention::{self, Target, Window};
use crate::{Applier, Handler, LocalRelay, OutboxRelay, Topics, backoff};

/// A service between start-up and shutdown.
pub struct Service {
    /// Names the consumer group and the dead-letter topic, and labels the logs.
    pub name: &'static str,
    /// The HTTP handlers'.
    pub pool: Pool,
    /// This service's outbox relay, for transactions that write the outbox
    /// ([`crate::Transaction::waking`]); the consumer's already run beside it.
    pub relay: LocalRelay,
    /// The consumer's partitions'.
    consumer_pool: Pool,
    listener: TcpListener,
    database_url: String,
    /// `SINGLETON_LEASE`: the relay's, the pruner's and the service's own singletons'.
    singleton_lease: std::time::Duration,
    kafka: KafkaConfig,
    retention: RetentionConfig,
    http_limits: HttpLimits,
    /// Tables of the service's own that the pruner keeps short, beside the inbox and the
    /// outbox.
    also_pruned: Vec<Target>,
    /// Tasks of the service's own, run with the others. In a mutex only so that the
    /// service is `Sync` (a future is `Send` alone), as `run` holds it across awaits.
    also_run: std::sync::Mutex<Vec<(&'static str, Task)>>,
}

/// A task of the service's own ([`Service::run_also`]).
type Task = BoxFuture<'static, anyhow::Result<()>>;

/// One topic this service consumes, and what applies its events.
pub struct Subscription<H> {
    pub topic: String,
    pub handler: H,
    /// The topic its outbox relay writes, which it must be allowed to.
    pub publishes: String,
}

impl Service {
    /// Arms the failpoints `FAILPOINTS` names (none, normally), binds the HTTP listener
    /// and migrates the database, waiting (with backoff) for a database that is not up
    /// yet rather than crash-looping.
    pub async fn start(
        name: &'static str,
        database: &DatabaseConfig,
        kafka: &KafkaConfig,
        retention: &RetentionConfig,
        (http_addr, http_limits): (SocketAddr, &HttpLimits),
        (migrations, history_table): db::MigrationSet<'_>,
    ) -> anyhow::Result<Self> {
        crate::failpoint::arm_from_env()?;
        let listener = TcpListener::bind(http_addr)
            .await
            .with_context(|| format!("cannot listen on {http_addr}"))?;
        // Before the migrations, whose lock a shared session would not hold.
        db::migrate_when_reachable(|| async {
            db::refuse_shared_sessions(database.database_url.as_str()).await?;
            db::migrate(database.database_url.as_str(), migrations, history_table).await
        })
        .await
        .map_err(|error| match error {
            refused @ db::DbError::SharedSession { .. } => anyhow::Error::new(refused),
            other => anyhow::Error::new(other).context("cannot migrate the database"),
        })?;
        Ok(Self {
            name,
            pool: db::pool(
                database.database_url.as_str(),
                database.database_pool_size,
                database.singleton_lease,
            )?,
            relay: LocalRelay::default(),
            consumer_pool: db::pool(
                database.database_url.as_str(),
                database.consumer_pool_size,
                database.singleton_lease,
            )?,
            listener,
            database_url: database.database_url.as_str().to_owned(),
            singleton_lease: database.singleton_lease,
            kafka: kafka.clone(),
            retention: retention.clone(),
            http_limits: http_limits.clone(),
            also_pruned: Vec::new(),
            also_run: std::sync::Mutex::default(),
        })
    }

    /// Has the pruner keep `target` short too.
    pub fn prune_also(&mut self, target: Target) {
        self.also_pruned.push(target);
    }

    /// Runs `task` beside the HTTP server, the relay, the pruner and the consumer: it
    /// should end at the shutdown they end at, and if it fails they are stopped too.
    pub fn run_also(
        &mut self,
        name: &'static str,
        task: impl Future<Output = anyhow::Result<()>> + Send + 'static,
    ) {
        self.also_run
            .get_mut()
            .expect("never poisoned: nothing panics holding it")
            .push((name, Box::pin(task)));
    }

    /// The lease on advisory lock `key` of the service's database, for a task of its own
    /// that must run in one copy of the service at a time ([`crate::lease`]).
    pub fn lease(&self, key: i64, name: &'static str) -> anyhow::Result<Lease> {
        let database = db::parse_url(&self.database_url)?;
        Ok(Lease::new(&database, key, name, self.singleton_lease))
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    pub fn topics(&self) -> Topics {
        self.kafka.topics()
    }

    /// Waits for the broker to serve the topics the consumer reads and writes (stopping at
    /// once on a refused login or certificate, or a right it lacks: the Kafka ACLs, named,
    /// [`crate::kafka::await_broker`]), checks the
    /// inbox's window against their retention, then runs the HTTP server (`router` plus
    /// the routes every service serves), the outbox relay, the pruner and the consumer until
    /// `shutdown`. If any of them fails, the others are stopped too
    /// and the error is returned, so a supervisor sees the service die rather than limp.
    pub async fn run<H: Handler>(
        mut self,
        router: Router,
        subscription: Subscription<H>,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        let topics = self.topics();
        let dead_letters = topics.dead_letter(&subscription.topic, self.name);
        let read = [subscription.topic.clone(), dead_letters.clone()];
        let rights = self.rights(&subscription, &dead_letters);
        if !crate::kafka::await_broker(&self.kafka.kafka_brokers, &rights, &shutdown).await? {
            return Ok(());
        }
        let Some(inbox) = self.inbox_window(&read, &shutdown).await? else {
            return Ok(());
        };
        let settings = ConsumerSettings {
            batch_size: self.kafka.consumer_batch_size,
            ..ConsumerSettings::new(
                &self.kafka.kafka_brokers,
                topics.group(self.name),
                subscription.topic.clone(),
                dead_letters,
            )
        };
        let mut pruned = Target::saga_tables(inbox, self.retention.outbox_retention);
        pruned.extend(std::mem::take(&mut self.also_pruned));
        let pruner = self
            .retention
            .pruning
            .pruner(&self.database_url, pruned)?
            .map(|pruner| pruner.leased_for(self.singleton_lease));
        let relay = self.outbox_relay()?.watched_by(settings.progress.clone());
        tracing::info!(service = self.name, addr = %self.local_addr(), "service started");

        let tasks = Tasks::new(shutdown.clone());
        let probes = Probes::database(self.pool.clone())
            .consumer(settings.joined.clone())
            .progress(settings.progress.clone(), self.kafka.liveness_stall_after);
        let router = self.edge(router, probes);
        tasks.spawn(
            "http",
            crate::http::serve(self.listener, router, shutdown.clone()),
        );
        let applier = Arc::new(
            Applier::new(self.consumer_pool, subscription.handler).waking(self.relay.clone()),
        );
        // The relay's producer is transactional and cannot lend itself to a dead letter,
        // sent alone: the consumer makes one of its own at its first.
        let dead_letters = consumer::DeadLetters::lazy(crate::kafka::idempotent_producer(
            &self.kafka.kafka_brokers,
        ));
        tasks.spawn(
            "consumer",
            consumer::run(settings, applier, dead_letters, shutdown.clone()),
        );
        let relay_shutdown = shutdown.clone();
        tasks.spawn("outbox relay", relay.run(relay_shutdown));
        let also_run = std::mem::take(
            self.also_run
                .get_mut()
                .expect("never poisoned: nothing panics holding it"),
        );
        for (name, task) in also_run {
            tasks.spawn(name, task);
        }
        if let Some(pruner) = pruner {
            let pruner_shutdown = shutdown.clone();
            tasks.spawn("pruner", async move {
                pruner.run(pruner_shutdown).await;
                Ok(())
            });
        }
        tasks.wait().await
    }

    /// The Kafka rights the consumer, its dead letters and the relay need (the relay's
    /// transactional id aside, which its `init_transactions` checks), and those the check
    /// of the inbox's window against the topics' retention needs if it is made.
    fn rights<H>(&self, subscription: &Subscription<H>, dead_letters: &str) -> Rights {
        let checked = if self.retention.pruning.prune_interval == Window::Off {
            &[][..]
        } else {
            &[Operation::DescribeConfigs][..]
        };
        Rights::default()
            .topic(&subscription.topic, &[&[Operation::Read], checked].concat())
            .group(&self.topics().group(self.name), &[Operation::Read])
            .topic(&subscription.publishes, &[Operation::Write])
            .topic(dead_letters, &[&[Operation::Write], checked].concat())
    }

    /// `router` with the routes every service serves (`/health`, the probes, `/metrics`),
    /// behind the HTTP edge's limits.
    fn edge(&self, router: Router, probes: Probes) -> Router {
        let metrics = crate::metrics::router(Some((self.pool.clone(), self.relay.clone())));
        crate::http::edge(
            router
                .merge(crate::http::health(self.pool.clone()))
                .merge(crate::probes::router(probes))
                .merge(metrics),
            &self.http_limits,
        )
        .layer(axum::middleware::from_fn(crate::metrics::track_http))
    }

    fn outbox_relay(&self) -> anyhow::Result<OutboxRelay> {
        Ok(OutboxRelay::new(
            &self.database_url,
            &self.kafka.kafka_brokers,
            self.kafka.outbox_poll_interval(),
        )?
        .linger(self.kafka.outbox_linger())
        .transactional_id(format!(
            "{}{}.outbox-relay",
            self.kafka.kafka_namespace, self.name
        ))
        .leased_for(self.singleton_lease)
        .woken_by(self.relay.clone()))
    }

    /// The inbox's window, checked against the retention of `topics` (waiting, with
    /// backoff, for a broker that cannot be reached for a moment); `None` if `shutdown`
    /// came first.
    async fn inbox_window(
        &self,
        topics: &[String],
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Option<Window>> {
        if self.retention.pruning.prune_interval == Window::Off {
            return Ok(Some(Window::Off));
        }
        let mut delays = backoff::backoff();
        loop {
            match retention::check_inbox_window(
                &self.kafka.kafka_brokers,
                topics,
                self.retention.inbox_retention,
            )
            .await
            {
                // The broker served these topics a moment ago (await_broker): one whose
                // configuration comes back empty is one this client may describe but not
                // DescribeConfigs, which no wait will change.
                Err(retention::CheckError::UnknownTopic(topic)) => {
                    anyhow::bail!(crate::kafka::denied(
                        &topic,
                        crate::kafka::client::properties()
                    ))
                }
                Err(error @ retention::CheckError::Unreachable(_)) => {
                    let delay = backoff::next_delay(&mut delays);
                    tracing::warn!(%error, retry_in = ?delay, "waiting to check the inbox's window against the topics' retention");
                    tokio::select! {
                        _ = shutdown.cancelled() => return Ok(None),
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
                other => return Ok(Some(other?)),
            }
        }
    }
}

/// Tasks that live and die together.
struct Tasks {
    tracker: TaskTracker,
    shutdown: CancellationToken,
    failure: Arc<std::sync::Mutex<Option<anyhow::Error>>>,
}

impl Tasks {
    fn new(shutdown: CancellationToken) -> Self {
        Self {
            tracker: TaskTracker::new(),
            shutdown,
            failure: Arc::default(),
        }
    }

    fn spawn(
        &self,
        name: &'static str,
        task: impl Future<Output = anyhow::Result<()>> + Send + 'static,
    ) {
        let shutdown = self.shutdown.clone();
        let failure = self.failure.clone();
        self.tracker.spawn(async move {
            if let Err(error) = task.await {
                tracing::error!(
                    task = name,
                    error = format!("{error:#}"),
                    "task failed; stopping"
                );
                failure
                    .lock()
                    .expect("no task panics while holding it")
                    .get_or_insert(error.context(format!("{name} failed")));
                shutdown.cancel();
            }
        });
    }

    async fn wait(self) -> anyhow::Result<()> {
        self.tracker.close();
        self.tracker.wait().await;
        match self.failure.lock().expect("tasks have ended").take() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}
