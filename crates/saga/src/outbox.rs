//! The transactional outbox: [`enqueue`] writes an event in the same transaction as the
//! state change it announces; [`OutboxRelay`] publishes committed rows to Kafka.
//!
//! Guarantees:
//! - An event is published if and only if its transaction committed.
//! - A row is marked published only after the broker acknowledged it, so a crash in
//!   between publishes it again: at-least-once, absorbed by the consumers' inbox.
//! - One relay per database publishes at a time (a [`crate::lease`]); others wait as
//!   standbys and take over within the lease's bound when its holder dies, freezes or
//!   vanishes. A relay that lost the lease publishes nothing it read after losing it.
//! - A holder frozen *between* its check of the lease and its send, and thawed after a
//!   standby took over, publishes nothing either: each look's rows go out in one Kafka
//!   transaction, under a `transactional.id` that every copy of the relay shares, and the
//!   standby's `init_transactions` on taking over fenced the old holder's producer. Its
//!   sends and its commit are refused by the brokers; a transaction it had open is
//!   aborted, and consumers reading committed records (librdkafka's default) never see it.
//!   Without the fence the thawed holder's batch would reach the topic a second time: the
//!   consumers' inbox would absorb it, but the topic is a published contract that other
//!   readers see.
//! - Rows go out in `id` order, keyed by order id; with the idempotent producer, one
//!   order's events reach its partition in the order they were written. (Ids are assigned
//!   at insert, not commit, so two unrelated orders' rows may be published in either
//!   order; one order's events are causally ordered, each written after the previous one
//!   was consumed.)

use std::time::{Duration, Instant};

use ::metrics::counter;
use kafka_rights::{Missing, Operation, Resource};
use rdkafka::ClientConfig;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use serde::Serialize;
use time::OffsetDateTime;
use tokio_postgres::types::Json;
use tokio_postgres::{Client, Row, Statement};
use tokio_util::sync::CancellationToken;

use crate::backoff;
use crate::envelope::{Delivery, Envelope};
use crate::failpoint;
use crate::lease::{DEFAULT_LEASE, Lease};
pub use crate::local_relay::LocalRelay;
use crate::metrics;
use crate::probes::Progress;
use crate::trace;
use crate::transaction::Transaction;

/// An event to publish once the surrounding transaction commits.
#[derive(Debug)]
pub struct NewEvent<'a, P: Serialize> {
    /// Deterministic id (see [`crate::events`]); unique in the outbox.
    pub event_id: &'a str,
    pub topic: &'a str,
    /// The order id: the Kafka key, so an order's events share a partition.
    pub key: &'a str,
    pub event_type: &'a str,
    pub payload: &'a P,
    /// The id of the event whose handling writes this one (its causation id); `None`
    /// when no event caused it (an HTTP request did).
    pub caused_by: Option<&'a str>,
}

/// Tells the outbox's trigger not to NOTIFY for the rest of the transaction: its relay
/// is woken in memory instead. The benchmark's scripts run it once per transaction, as
/// [`enqueue`] does.
pub const SKIP_NOTIFY: &str = "SELECT set_config('saga.outbox_notify', 'off', true)";

/// An event into the outbox, in the transaction that changes the state it announces.
/// Every handler's last statement, and every benchmark script's.
pub const INSERT_EVENT: &str = "
    INSERT INTO outbox (event_id, topic, key, type, payload, caused_by, traceparent, tracestate)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";

/// Inserts `event` into the outbox inside `tx`. A second event with the same id violates
/// the `event_id` unique constraint: the database itself refuses to announce a
/// deterministic event twice.
///
/// Nothing reads the insert's result, so it is pipelined: it goes to the server with the
/// transaction's next statement or its `COMMIT`, and its error, if any, comes back from
/// there. The statement is prepared once per pooled connection, like the handlers' own:
/// it runs in every transaction that changes state, so parsing it each time would cost a
/// round trip per event.
///
/// When the transaction runs beside the active relay ([`Transaction::waking`]), it tells
/// the outbox's trigger not to NOTIFY, and wakes the relay in memory once it has
/// committed (see [`LocalRelay`]).
///
/// The row keeps the trace context of the span it is written in (a consumer's process
/// span, a request's server span), which the relay's send span continues
/// ([`crate::trace`]).
pub async fn enqueue<P: Serialize>(
    tx: &Transaction<'_>,
    event: &NewEvent<'_, P>,
) -> Result<(), tokio_postgres::Error> {
    if tx.first_row_without_notify() {
        // Transaction-local, once per transaction (a batch writes many rows): the pooled
        // session NOTIFYs again in its next transaction unless that one says otherwise.
        tx.pipeline(tx.prepare_cached(SKIP_NOTIFY).await?, Vec::new());
    }
    let insert = tx.prepare_cached(INSERT_EVENT).await?;
    let payload = serde_json::to_value(event.payload)
        .expect("event payloads are plain structs and serialize");
    let trace = trace::current_carrier();
    tx.pipeline(
        insert,
        vec![
            Box::new(event.event_id.to_owned()),
            Box::new(event.topic.to_owned()),
            Box::new(event.key.to_owned()),
            Box::new(event.event_type.to_owned()),
            Box::new(Json(payload)),
            Box::new(event.caused_by.map(str::to_owned)),
            Box::new(trace.traceparent),
            Box::new(trace.tracestate),
        ],
    );
    Ok(())
}

/// The active relay's lease: held for its whole database session.
const RELAY_LOCK: i64 = 0x6f75_7462_6f78; // "outbox"

/// The relay's session commits its marks without waiting for the WAL to reach the disk.
/// A mark lost with a crash of the server means only that its rows are published again,
/// which the consumers' inbox absorbs, the same as a relay crash between the broker's
/// acknowledgement and the mark; in exchange the relay does not wait for a flush per look,
/// nor make the handlers' commits wait behind one. The state changes and the outbox rows
/// themselves are written by the handlers' transactions, which keep the server's setting.
const RELAY_SYNCHRONOUS_COMMIT: &str = "off";

/// The relay's statements are prepared once per session, and a prepared statement's
/// plan is kept after its first few runs. A relay starts on a new database's outbox while
/// it is nearly empty, where reading the whole table beats an index, and the table grows
/// by every event while that plan stays until autovacuum's first analyze, minutes later:
/// until then each mark scanned the outbox, which under load cost the server more than
/// everything else an order does. Planned for each run, the mark always finds its few ids
/// through the primary key, for a few tens of microseconds of planning.
const RELAY_PLAN_CACHE_MODE: &str = "force_custom_plan";

/// How long a Kafka transaction of the relay may stay open before the brokers abort it:
/// well above a look's send and commit (seconds), and the longest a relay that died in
/// the middle of one, with no successor to fence it, holds back the consumers of its
/// partitions (reading committed records, they wait at an open transaction).
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

/// How long `init_transactions`, a commit or an abort may wait for the brokers.
const TRANSACTION_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A right the broker refuses the relay.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Denied(String);

/// Publishes committed outbox rows to Kafka.
pub struct OutboxRelay {
    lease: Lease,
    /// Each session makes its producer from this: a producer fenced once stays fenced.
    producer: ClientConfig,
    /// `None` when the failpoint `relay.acks-one` has turned the transactions off: they
    /// need `acks=all`.
    transactional_id: Option<String>,
    /// How long to wait for a NOTIFY or a wake-up before looking anyway.
    poll_interval: Duration,
    /// Rows read, sent and acknowledged together per round trip.
    batch_size: i64,
    /// After a look that found rows but not a whole batch, how long from its start until
    /// the next look (see [`OutboxRelay::linger`]).
    linger: Duration,
    /// Writers in this process, which wake the relay without a NOTIFY while it is active.
    local: LocalRelay,
    /// Where each round (a look and its sends) is recorded while it runs, for `/livez`.
    progress: Progress,
}

impl OutboxRelay {
    /// A relay of the outbox of the database at `database_url`. Its `transactional.id` is
    /// `outbox-relay.<database name>` unless [`OutboxRelay::transactional_id`] names one.
    pub fn new(database_url: &str, brokers: &str, poll_interval: Duration) -> anyhow::Result<Self> {
        let mut producer = crate::kafka::idempotent_producer(brokers);
        let acks_one = crate::failpoint::fires(crate::failpoint::RELAY_ACKS_ONE);
        if acks_one {
            producer.set("acks", "1").set("enable.idempotence", "false");
        } else {
            producer.set(
                "transaction.timeout.ms",
                TRANSACTION_TIMEOUT.as_millis().to_string(),
            );
        }
        let database = crate::db::parse_url(database_url)?;
        let name = database.get_dbname().unwrap_or("postgres").to_owned();
        Ok(Self {
            lease: Lease::new(&database, RELAY_LOCK, "outbox relay", DEFAULT_LEASE),
            producer,
            transactional_id: (!acks_one).then(|| format!("outbox-relay.{name}")),
            poll_interval,
            batch_size: 100,
            linger: Duration::ZERO,
            local: LocalRelay::default(),
            progress: Progress::default(),
        })
    }

    /// Holds the relay's lease for `duration` (`SINGLETON_LEASE`) rather than the
    /// default: how long a frozen or vanished relay keeps its standbys waiting.
    pub fn leased_for(mut self, duration: Duration) -> Self {
        self.lease = self.lease.lasting(duration);
        self
    }

    /// Lets the writers holding `local` wake this relay in memory rather than by NOTIFY
    /// ([`LocalRelay`]); without it, every writer NOTIFYs.
    pub fn woken_by(mut self, local: LocalRelay) -> Self {
        self.local = local;
        self
    }

    /// The `transactional.id` every copy of this relay shares, and no other relay on the
    /// same brokers: a service's sets `<namespace><service>.outbox-relay`. A successor
    /// fences its predecessor by it.
    pub fn transactional_id(mut self, id: String) -> Self {
        if self.transactional_id.is_some() {
            self.transactional_id = Some(id);
        }
        self
    }

    /// A producer for this session: transactional, its `init_transactions` done, which
    /// fences every earlier producer of the same `transactional.id` and aborts a
    /// transaction one left open.
    async fn session_producer(&self) -> anyhow::Result<FutureProducer> {
        let mut config = self.producer.clone();
        let Some(id) = &self.transactional_id else {
            return Ok(config.create()?);
        };
        config.set("transactional.id", id);
        let producer: FutureProducer = config.create()?;
        let initialising = producer.clone();
        tokio::task::spawn_blocking(move || {
            initialising.init_transactions(TRANSACTION_CALL_TIMEOUT)
        })
        .await?
        .map_err(|error| {
            if error.rdkafka_error_code()
                == Some(RDKafkaErrorCode::TransactionalIdAuthorizationFailed)
            {
                let missing = Missing {
                    operation: Operation::Write,
                    resource: Resource::TransactionalId(id.clone()),
                };
                anyhow::Error::new(Denied(crate::kafka::lacking(&[missing])))
            } else {
                anyhow::anyhow!("outbox relay's init_transactions as {id}: {error}")
            }
        })?;
        Ok(producer)
    }

    /// Records each round in `progress`, which the service's `/livez` watches.
    pub fn watched_by(mut self, progress: Progress) -> Self {
        self.progress = progress;
        self
    }

    /// Under load, makes the relay look at most once per `linger`, so that each look (a
    /// transaction, a produce request, a fetch for each consumer) carries the rows that
    /// committed meanwhile. A row committed after a look that found nothing goes out at
    /// once, so only rows that arrive in a stream wait, each at most `linger`.
    pub fn linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// Runs until `shutdown`. Database or broker trouble ends the current session; the
    /// relay then starts a new one after a backoff, so it never gives up, but for a
    /// transactional id the broker will not let it use, which no wait heals: that ends
    /// the relay with an error naming the ACL.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let mut delays = backoff::backoff();
        loop {
            match self.session(&shutdown, &mut delays).await {
                Ok(()) => return Ok(()),
                Err(error) if error.is::<Denied>() => return Err(error),
                Err(error) => {
                    counter!(metrics::OUTBOX_INTERRUPTIONS).increment(1);
                    let delay = backoff::next_delay(&mut delays);
                    tracing::warn!(error = format!("{error:#}"), retry_in = ?delay, "outbox relay interrupted");
                    tokio::select! {
                        _ = shutdown.cancelled() => return Ok(()),
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    async fn session(
        &self,
        shutdown: &CancellationToken,
        delays: &mut backon::ExponentialBackoff,
    ) -> anyhow::Result<()> {
        let Some(mut held) = self.lease.acquire(shutdown).await? else {
            return Ok(());
        };
        let mut notifications = held.take_notifications();
        let client = held.client();
        client
            .batch_execute(&format!(
                "SET synchronous_commit = {RELAY_SYNCHRONOUS_COMMIT};
                 SET plan_cache_mode = {RELAY_PLAN_CACHE_MODE};
                 LISTEN outbox"
            ))
            .await?;
        let statements = RelayStatements::prepare(client).await?;
        let producer = self.session_producer().await?;
        // Before the first look: a writer that skips the NOTIFY from now on either
        // committed before that look, which sees its row, or wakes the relay after it.
        let active = self.local.activate();
        // Made once: a round is recorded at every look, hundreds a second under load.
        let work: std::sync::Arc<str> = std::sync::Arc::from("outbox relay");
        let mut healthy = false;
        // Rows the broker has acknowledged and the outbox does not say yet are published:
        // the next look marks them, in the statement that reads the rows after them.
        let mut acknowledged: Vec<i64> = Vec::new();
        loop {
            // Every NOTIFY or wake-up received so far is of a commit the look below will
            // see.
            while notifications.try_recv().is_ok() {}
            active.consume_wake();
            let round = self.progress.attempt(work.clone());
            let look = Instant::now();
            let rows = client
                .query(
                    &statements.mark_and_read,
                    &[&acknowledged, &self.batch_size],
                )
                .await?;
            if !healthy {
                // Healthy again: the next interruption starts from the shortest delay.
                // Only once a look at the outbox has worked: resetting on connecting
                // alone retried an error every query hits (a missing table, a revoked
                // grant) at the shortest delay forever.
                *delays = backoff::backoff();
                healthy = true;
            }
            let found = rows.len();
            // Frozen between the look and here for long enough, another relay may hold
            // the lease and publish these rows: send nothing, and become a standby.
            if !held.is_held() {
                anyhow::bail!("outbox relay lease lost: publishing nothing it read");
            }
            if found > 0 {
                failpoint::freeze_point(failpoint::RELAY_BEFORE_SEND);
            }
            let failure;
            (acknowledged, failure) = self.publish(&producer, rows).await;
            drop(round);
            // A crash here publishes the acknowledged rows once more after the restart.
            failpoint::crash_point_for(failpoint::RELAY_AFTER_ACK, acknowledged.len());
            if let Some(error) = failure {
                // Unacknowledged rows stay unpublished and go out in the next session.
                Self::mark(client, &statements, &acknowledged).await?;
                return Err(error);
            }
            if found == self.batch_size as usize {
                continue;
            }
            if found > 0 {
                // Under load a look finds a few rows, each look costing the server a
                // transaction: wait for more to commit, so that each look carries more.
                // After a quiet spell the first row still goes out at once.
                tokio::select! {
                    _ = shutdown.cancelled() => {
                        Self::mark(client, &statements, &acknowledged).await?;
                        return Ok(());
                    }
                    _ = tokio::time::sleep_until((look + self.linger).into()) => continue,
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                notification = notifications.recv() => {
                    if notification.is_none() {
                        anyhow::bail!("database connection closed");
                    }
                }
                _ = active.woken() => {}
                _ = held.lost() => anyhow::bail!("outbox relay lease lost"),
                _ = tokio::time::sleep(self.poll_interval) => {}
            }
        }
    }

    async fn mark(
        client: &Client,
        statements: &RelayStatements,
        acknowledged: &[i64],
    ) -> anyhow::Result<()> {
        if !acknowledged.is_empty() {
            client
                .execute(&statements.mark_published, &[&acknowledged])
                .await?;
        }
        Ok(())
    }

    /// Sends `rows` to the brokers in one transaction; returns the ids of those published
    /// (all of them once the transaction committed, none otherwise) and, should any not
    /// be, why.
    async fn publish(
        &self,
        producer: &FutureProducer,
        rows: Vec<Row>,
    ) -> (Vec<i64>, Option<anyhow::Error>) {
        if rows.is_empty() {
            return (Vec::new(), None);
        }
        let transactional = self.transactional_id.is_some();
        if transactional && let Err(error) = producer.begin_transaction() {
            return (
                Vec::new(),
                Some(anyhow::anyhow!("begin_transaction: {error}")),
            );
        }
        let (sent, failure) = self.send(producer, rows).await;
        if !transactional {
            let published = sent.iter().map(|(id, _)| *id).collect();
            count_published(sent);
            return (published, failure);
        }
        let ending = producer.clone();
        let ended = tokio::task::spawn_blocking(move || match failure {
            None => ending
                .commit_transaction(TRANSACTION_CALL_TIMEOUT)
                .map_err(|error| anyhow::anyhow!("commit_transaction: {error}")),
            Some(failure) => {
                // Fenced, or the brokers away: the abort may fail too, and the next
                // session's producer begins afresh either way.
                let _ = ending.abort_transaction(TRANSACTION_CALL_TIMEOUT);
                Err(failure)
            }
        })
        .await
        .unwrap_or_else(|error| Err(anyhow::anyhow!("the transaction's end panicked: {error}")));
        match ended {
            Ok(()) => {
                let published = sent.iter().map(|(id, _)| *id).collect();
                count_published(sent);
                (published, None)
            }
            Err(error) => (Vec::new(), Some(error)),
        }
    }

    /// Sends `rows` and awaits each acknowledgement; returns the ids and topics of those
    /// acknowledged and, should any not be, why.
    async fn send(
        &self,
        producer: &FutureProducer,
        rows: Vec<Row>,
    ) -> (Vec<(i64, String)>, Option<anyhow::Error>) {
        // Send the whole batch, then await the acknowledgements together: one round trip
        // to the broker per batch rather than per row.
        let mut deliveries = Vec::with_capacity(rows.len());
        let mut failure = None;
        for row in &rows {
            let id: i64 = row.get("id");
            let topic: String = row.get("topic");
            let envelope = Envelope {
                id: row.get("event_id"),
                event_type: row.get("type"),
                aggregate_id: row.get("key"),
                payload: row.get::<_, Json<serde_json::Value>>("payload").0,
                occurred_at: row.get::<_, OffsetDateTime>("occurred_at"),
                delivery: Delivery::default(),
            };
            let value = envelope.to_json();
            let caused_by: Option<String> = row.get("caused_by");
            let hop = trace::Hop::send(&topic, &envelope.aggregate_id, &envelope.id, || {
                trace::Carrier {
                    traceparent: row.get("traceparent"),
                    tracestate: row.get("tracestate"),
                }
            });
            let mut headers = OwnedHeaders::new()
                .insert(Header {
                    key: "event_id",
                    value: Some(envelope.id.as_str()),
                })
                .insert(Header {
                    key: "event_type",
                    value: Some(envelope.event_type.as_str()),
                });
            if let Some(cause) = &caused_by {
                headers = headers.insert(Header {
                    key: "causation_id",
                    value: Some(cause.as_str()),
                });
            }
            let headers = hop.record_headers(headers);
            let record = FutureRecord::to(&topic)
                .key(&envelope.aggregate_id)
                .payload(&value)
                .headers(headers);
            match producer.send_result(record) {
                Ok(delivery) => deliveries.push((id, topic, delivery, hop)),
                Err((error, _)) => {
                    hop.failed(&error);
                    // The rows after it must not overtake it: stop here.
                    failure = Some(anyhow::anyhow!("cannot enqueue {}: {error}", envelope.id));
                    break;
                }
            }
        }
        let mut acknowledged = Vec::with_capacity(deliveries.len());
        for (id, topic, delivery, hop) in deliveries {
            match delivery.await {
                Ok(Ok(delivered)) => {
                    hop.sent(delivered.partition, delivered.offset);
                    acknowledged.push((id, topic));
                }
                Ok(Err((error, _))) => {
                    hop.failed(&error);
                    failure = Some(anyhow::anyhow!("outbox row {id}: {error}"));
                }
                Err(_) => failure = Some(anyhow::anyhow!("outbox row {id}: producer dropped")),
            }
        }
        (acknowledged, failure)
    }
}

/// Counts rows once the brokers have them as the consumers will see them (committed); a
/// crash before the rows are marked publishes them, and counts them, again.
fn count_published(published: Vec<(i64, String)>) {
    if !published.is_empty() {
        tracing::debug!(published = published.len(), "outbox batch published");
    }
    for (_, topic) in published {
        counter!(metrics::OUTBOX_PUBLISHED, "topic" => topic).increment(1);
    }
}

/// Marks the rows the broker acknowledged since the last look (`$1`) and reads up to a
/// batch of unpublished rows after them, oldest first: one round trip and one transaction
/// per look. The read does not see the marks made by its own statement, hence
/// `id <> ALL($1)`; the partial index on `published_at IS NULL` holds exactly the rows it
/// wants. The benchmark's `relay` script runs it against a backlog.
pub const MARK_AND_READ: &str = "
    WITH marked AS (
        UPDATE outbox SET published_at = now() WHERE id = ANY($1)
    )
    SELECT id, event_id, topic, key, type, payload, occurred_at, caused_by, traceparent,
           tracestate
      FROM outbox
     WHERE published_at IS NULL AND id <> ALL($1)
     ORDER BY id
     LIMIT $2";

/// Marks acknowledged rows alone: before a session ends.
pub const MARK_PUBLISHED: &str = "UPDATE outbox SET published_at = now() WHERE id = ANY($1)";

/// The relay's two statements, prepared once per session. Under load the relay looks at
/// the outbox hundreds of times a second, and a statement given as text is parsed and
/// planned again on every call, in a round trip of its own before the one that runs it.
struct RelayStatements {
    /// [`MARK_AND_READ`]
    mark_and_read: Statement,
    /// [`MARK_PUBLISHED`]
    mark_published: Statement,
}

impl RelayStatements {
    async fn prepare(client: &Client) -> Result<Self, tokio_postgres::Error> {
        Ok(Self {
            mark_and_read: client.prepare(MARK_AND_READ).await?,
            mark_published: client.prepare(MARK_PUBLISHED).await?,
        })
    }
}
