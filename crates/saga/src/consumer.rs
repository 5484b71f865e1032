//! The consumer loop: at-least-once delivery in, one handler transaction per event.
//!
//! Guarantees, and what they rest on:
//! - **Commit after the handler.** Auto-commit is on but only commits offsets this loop
//!   *stored*, and it stores a record's offset only after the handler's transaction
//!   committed (or the record was dead-lettered and the broker acknowledged that). A crash
//!   anywhere before redelivers the record; the handler's inbox absorbs the repeat.
//! - **Per-partition order, partitions in parallel.** Each partition has one worker task
//!   fed through a channel, so its records are applied one at a time in offset order,
//!   while other partitions proceed. This is what makes storing "offset N done" safe:
//!   every record before N in that partition is done too. A partition whose channel is
//!   full is paused, never waited for, so a backlog on one does not hold up the others.
//! - **Rebalances lose nothing.** librdkafka commits the stored offsets of revoked
//!   partitions; a record still in a worker's hands when its partition moves is
//!   redelivered to the new owner (and deduplicated there).
//! - **Nothing is skipped.** A transient failure (database down) is retried with backoff
//!   for as long as it lasts. A record that can never be processed goes to the group's
//!   dead-letter topic with the reason in its headers, and the partition moves on.
//! - **The next records prepared ahead.** While a transaction runs, its worker prepares
//!   the records behind it ([`Applier::prepare`]: a handler's call to another system),
//!   up to [`LOOK_AHEAD`] of them a transaction per record, or the next batch, so a
//!   partition waits for the calls and the transaction side by side rather than one after
//!   the other.
//! - **Batches, if asked for.** With `batch_size` > 1 a worker takes the records already
//!   waiting for it (never waiting for more) and applies them in one transaction
//!   ([`Applier::apply_prepared_batch`]), each still deduplicated and guarded on its own;
//!   the last offset is stored after the commit. If the batch fails, nothing of it was
//!   committed, and its records are applied one at a time with the usual retries and dead
//!   letters, so a poison record costs one rolled-back batch, not a stuck partition.
//! - **Graceful stop.** On shutdown, workers stop *between* records, never inside a
//!   handler, and records prepared ahead are left unapplied once their prepares have ended;
//!   stored offsets are committed once more before the consumer closes.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::metrics::{counter, gauge, histogram};
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer as _, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaResult;
use rdkafka::message::{Header, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::statistics::Statistics;
use rdkafka::topic_partition_list::TopicPartitionList;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::backoff;
use crate::envelope::Envelope;
use crate::failpoint;
use crate::handler::{Applier, Handler, HandlerError, Step};
use crate::metrics;
use crate::retry::Retry;

/// Records buffered per partition ahead of its worker (about 1 KiB each).
const PARTITION_QUEUE: usize = 1024;
/// Room a paused partition's queue must have before it is resumed. Not the first free
/// slot, which would pause and resume it once per record while a backlog drains; and
/// with half the queue still to apply, its worker stays busy while librdkafka fetches
/// again after the resume (within [`FETCH_WAIT_MS`]: see [`Lanes::wake_fetcher`]).
const RESUME_ROOM: usize = PARTITION_QUEUE / 2;
/// Records of a partition prepared ahead of the one being applied, a transaction per
/// record ([`Applier::prepare`]: for ChargeOrder, the read-ahead and the provider's
/// charge). With one, a partition runs at the pace of the slower of prepare and
/// transaction, and ChargeOrder's prepare (a read, an HTTP call, the provider's commit)
/// took about twice its transaction on a busy machine. Each prepare may hold one of the
/// consumer pool's connections for its read-ahead, and a record prepared but not applied
/// when the service stops is prepared again on redelivery: a few calls again, not a
/// queue's worth. In batches the next batch is prepared instead, however many that is.
pub const LOOK_AHEAD: usize = 4;

/// The most the broker sends for one partition in one fetch (librdkafka's
/// `max.partition.fetch.bytes`, default 1 MiB). Pausing a partition throws away what was
/// fetched ahead for it, to be fetched again on resuming: small answers keep that waste
/// to about a queue's worth. (Not `queued.min.messages`: a partition past that many is
/// not fetched again for `fetch.queue.backoff.ms`, a second by default, and a paused one
/// waited that long after every resume.)
const PARTITION_FETCH_BYTES: &str = "65536";
/// How long the broker may hold a fetch that finds nothing new (librdkafka's
/// `fetch.wait.max.ms`, default 500 ms). A consumer has one fetch in flight per broker,
/// so a partition resumed while a fetch for the others waits at the end of their logs is
/// fetched when that fetch returns. Partitions pause while a backlog drains, and when
/// nothing new arrives meanwhile the others' fetch returns only at this timeout: with
/// the default, a drain's partitions stood idle for up to half a second after a resume.
/// A tenth of a second is less than the half queue a resumed partition still has to
/// apply; the price is an idle consumer asking ten times a second instead of twice.
const FETCH_WAIT_MS: &str = "100";
/// How long the request that wakes a resumed partition's fetcher may take; only a
/// blocking-pool thread waits for it.
const WAKE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct ConsumerSettings {
    pub brokers: String,
    pub group_id: String,
    pub topic: String,
    /// Where records that can never be processed go, with the reason in headers.
    pub dead_letter_topic: String,
    /// Attempts for a failure of class [`Retry::AFewTimes`] before dead-lettering.
    pub max_attempts: u32,
    /// Most records of one partition applied in one transaction; 1 is a transaction per
    /// record.
    pub batch_size: usize,
}

impl ConsumerSettings {
    pub fn new(brokers: &str, group_id: String, topic: String, dead_letter_topic: String) -> Self {
        Self {
            brokers: brokers.to_owned(),
            group_id,
            topic,
            dead_letter_topic,
            max_attempts: 5,
            batch_size: 1,
        }
    }
}

/// Logs rebalances and failed commits, which librdkafka otherwise reports to no one, and
/// turns its statistics into the consumer-lag gauges.
struct SagaConsumerContext;

impl ClientContext for SagaConsumerContext {
    fn stats(&self, statistics: Statistics) {
        for (topic, stats) in &statistics.topics {
            // Partition -1 is librdkafka's own queue for records not yet assigned one.
            for partition in stats.partitions.values().filter(|p| p.partition >= 0) {
                // -1 until the partition is held and its high watermark known; a
                // partition held elsewhere reads 0 here, so lag sums across instances.
                let lag = if partition.fetch_state == "none" {
                    0
                } else {
                    partition.consumer_lag.max(0)
                };
                gauge!(metrics::CONSUMER_LAG, "topic" => topic.clone(), "partition" => partition.partition.to_string())
                    .set(lag as f64);
            }
        }
    }
}

impl ConsumerContext for SagaConsumerContext {
    fn pre_rebalance(&self, _: &rdkafka::consumer::BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                tracing::info!(partitions = %partitions(tpl), "partitions assigned")
            }
            Rebalance::Revoke(tpl) => {
                tracing::info!(partitions = %partitions(tpl), "partitions revoked")
            }
            Rebalance::Error(error) => tracing::warn!(%error, "rebalance error"),
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, _offsets: &TopicPartitionList) {
        match result {
            Ok(()) => {}
            // Nothing new was stored since the last commit.
            Err(rdkafka::error::KafkaError::ConsumerCommit(
                rdkafka::types::RDKafkaErrorCode::NoOffset,
            )) => {}
            Err(error) => {
                tracing::warn!(%error, "offset commit failed; records since the last commit will be redelivered")
            }
        }
    }
}

/// Consumer errors are logged at most this often; the rest are counted.
const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// Keeps an outage from flooding the log with one line per failed reconnect.
#[derive(Default)]
struct ErrorLog {
    last_logged: Option<Instant>,
    not_logged: u64,
}

impl ErrorLog {
    fn report(&mut self, error: &rdkafka::error::KafkaError) {
        if self
            .last_logged
            .is_some_and(|at| at.elapsed() < ERROR_LOG_INTERVAL)
        {
            self.not_logged += 1;
            return;
        }
        tracing::warn!(%error, similar_not_logged = self.not_logged, "kafka consumer error; librdkafka reconnects by itself");
        self.last_logged = Some(Instant::now());
        self.not_logged = 0;
    }
}

fn partitions(tpl: &TopicPartitionList) -> String {
    tpl.elements()
        .iter()
        .map(|e| format!("{}[{}]", e.topic(), e.partition()))
        .collect::<Vec<_>>()
        .join(",")
}

type SagaConsumer = StreamConsumer<SagaConsumerContext>;

/// Consumes `settings.topic` with `applier` until `shutdown` is cancelled, sending the
/// records it can never apply to `settings.dead_letter_topic` with `dead_letters` (an
/// idempotent producer, [`crate::kafka::idempotent_producer`]; a service's relay lends
/// it its own).
pub async fn run<H: Handler>(
    settings: ConsumerSettings,
    applier: Arc<Applier<H>>,
    dead_letters: FutureProducer,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let consumer: Arc<SagaConsumer> = Arc::new(
        ClientConfig::new()
            .set("bootstrap.servers", &settings.brokers)
            .set("group.id", &settings.group_id)
            .set("enable.auto.commit", "true")
            .set("auto.commit.interval.ms", "1000")
            // The loop stores an offset only once its record is fully handled.
            .set("enable.auto.offset.store", "false")
            // A new group starts at the beginning: no event written before it existed is lost.
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "10000")
            .set("max.partition.fetch.bytes", PARTITION_FETCH_BYTES)
            .set("fetch.wait.max.ms", FETCH_WAIT_MS)
            // For the consumer-lag gauges; a few microseconds' work each time.
            .set("statistics.interval.ms", "5000")
            .create_with_context(SagaConsumerContext)?,
    );
    consumer.subscribe(&[&settings.topic])?;
    let workers = TaskTracker::new();
    let worker = Arc::new(PartitionWorker {
        consumer: consumer.clone(),
        applier,
        dead_letters,
        settings: settings.clone(),
        shutdown: shutdown.clone(),
        tasks: workers.clone(),
    });
    tracing::info!(topic = %settings.topic, group = %settings.group_id, "consumer started");

    let mut lanes = Lanes::new(consumer.clone(), &settings.topic);
    let mut errors = ErrorLog::default();
    loop {
        let received = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            Some((partition, open)) = lanes.room.next(), if !lanes.room.is_empty() => {
                if !open || !lanes.refill(partition) {
                    break;
                }
                continue;
            }
            received = consumer.recv() => received.map(|m| m.detach()),
        };
        let message = match received {
            Ok(message) => {
                counter!(metrics::RECORDS_RECEIVED, "topic" => settings.topic.clone()).increment(1);
                message
            }
            Err(error) => {
                // Broker unreachable and the like: librdkafka reconnects by itself and
                // queues a report of each failed attempt. Keep polling: pausing per report
                // would leave the reports queued during an outage to be drained one pause
                // at a time after it, with every partition stalled meanwhile (for minutes
                // after a broker restart, before this was changed). Only the log is thinned.
                if let Some((code, reason)) = consumer.client().fatal_error() {
                    anyhow::bail!("kafka consumer failed for good: {code:?}: {reason}");
                }
                errors.report(&error);
                continue;
            }
        };
        let handed = lanes.hand(message, || {
            let (tx, rx) = mpsc::channel(PARTITION_QUEUE);
            workers.spawn(worker.clone().run(rx));
            tx
        });
        if !handed {
            break;
        }
    }

    // Closing the queues lets each worker finish the record it holds and stop; records
    // held back are dropped unapplied, their offsets unstored: they are redelivered.
    drop(lanes);
    workers.close();
    workers.wait().await;
    let final_commit = consumer.clone();
    match tokio::task::spawn_blocking(move || final_commit.commit_consumer_state(CommitMode::Sync))
        .await?
    {
        Ok(()) => {}
        Err(rdkafka::error::KafkaError::ConsumerCommit(
            rdkafka::types::RDKafkaErrorCode::NoOffset,
        )) => {}
        Err(error) => tracing::warn!(%error, "final offset commit failed"),
    }
    tracing::info!(topic = %settings.topic, "consumer stopped");
    Ok(())
}

/// The queue of each partition's worker, and the records held back for a partition
/// whose queue is full.
///
/// The loop must never wait for one partition's queue: records arrive in the broker's
/// answers, a partition's at a time, and while the loop waited for room in one queue no
/// other partition got anything (a consumer draining a backlog applied its partitions one
/// after another). So a record that finds its queue full is held back and its partition
/// paused: librdkafka stops fetching it, drops what it had fetched ahead for it, and on
/// resuming fetches again from the record after the last it delivered, which is the one
/// held back here. The partition is resumed once its queue has room again.
struct Lanes {
    consumer: Arc<SagaConsumer>,
    topic: String,
    lanes: HashMap<i32, Lane>,
    /// One future per paused partition: its queue has room (false: its worker is gone).
    room: FuturesUnordered<BoxFuture<'static, (i32, bool)>>,
}

struct Lane {
    queue: mpsc::Sender<OwnedMessage>,
    /// Received for this partition but not yet in its queue, in offset order; not empty
    /// exactly while the partition is paused.
    held: VecDeque<OwnedMessage>,
}

impl Lanes {
    fn new(consumer: Arc<SagaConsumer>, topic: &str) -> Self {
        Self {
            consumer,
            topic: topic.to_owned(),
            lanes: HashMap::new(),
            room: FuturesUnordered::new(),
        }
    }

    /// Puts `message` in its partition's queue (made with `spawn` on its partition's first
    /// record), or holds it back; false if the partition's worker is gone.
    fn hand(
        &mut self,
        message: OwnedMessage,
        spawn: impl FnOnce() -> mpsc::Sender<OwnedMessage>,
    ) -> bool {
        let partition = message.partition();
        let lane = self.lanes.entry(partition).or_insert_with(|| Lane {
            queue: spawn(),
            held: VecDeque::new(),
        });
        if !lane.held.is_empty() {
            // Fetched before the pause took effect: it queues up behind the others.
            lane.held.push_back(message);
            return true;
        }
        match lane.queue.try_send(message) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(message)) => {
                lane.held.push_back(message);
                let queue = lane.queue.clone();
                self.room.push(Box::pin(async move {
                    (partition, queue.reserve_many(RESUME_ROOM).await.is_ok())
                }));
                self.set_paused(partition, true);
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// Moves the records held back for `partition` into its queue, which has room now, and
    /// resumes it; false if its worker is gone.
    fn refill(&mut self, partition: i32) -> bool {
        let Some(lane) = self.lanes.get_mut(&partition) else {
            return true;
        };
        while let Some(message) = lane.held.pop_front() {
            match lane.queue.try_send(message) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(message)) => {
                    lane.held.push_front(message);
                    let queue = lane.queue.clone();
                    self.room.push(Box::pin(async move {
                        (partition, queue.reserve_many(RESUME_ROOM).await.is_ok())
                    }));
                    return true;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => return false,
            }
        }
        self.set_paused(partition, false);
        self.wake_fetcher(partition);
        true
    }

    /// Makes librdkafka fetch `partition` now that it is resumed, not up to a second later;
    /// with a fetch for the other partitions in flight, as soon as that one returns (within
    /// [`FETCH_WAIT_MS`]).
    ///
    /// A resume only clears the partition's pause flag (librdkafka 2.12,
    /// `rd_kafka_toppar_pause_resume`); its broker's thread decides what to fetch when it
    /// next wakes up, and with every partition paused it has no fetch in flight to wake it:
    /// it sleeps out its one-second timeout. Draining a backlog, a consumer's partitions
    /// filled their queues together and then stood idle for up to a second, once or twice
    /// a backlog. Any request to the partition's leader wakes that thread; asking for the
    /// partition's watermarks is one small request, once per resume.
    fn wake_fetcher(&self, partition: i32) {
        let consumer = self.consumer.clone();
        let topic = self.topic.clone();
        // A blocking call, off the runtime's workers; its answer is not needed.
        tokio::task::spawn_blocking(move || {
            if let Err(error) = consumer.fetch_watermarks(&topic, partition, WAKE_TIMEOUT) {
                tracing::debug!(partition, %error, "watermarks after a resume not answered");
            }
        });
    }

    fn set_paused(&self, partition: i32, paused: bool) {
        let mut partitions = TopicPartitionList::new();
        partitions.add_partition(&self.topic, partition);
        let done = if paused {
            self.consumer.pause(&partitions)
        } else {
            self.consumer.resume(&partitions)
        };
        match done {
            Ok(()) => tracing::debug!(partition, paused, "partition queue full or drained"),
            // Revoked meanwhile: its new owner fetches it from the committed offset.
            Err(error) => tracing::debug!(partition, paused, %error, "pause or resume refused"),
        }
    }
}

/// The span every line about one record is logged in; the fault suite finds each
/// offset's fate by it.
fn record_span(message: &OwnedMessage) -> tracing::Span {
    tracing::info_span!(
        "record",
        topic = message.topic(),
        partition = message.partition(),
        offset = message.offset(),
        event_id = tracing::field::Empty,
    )
}

/// Applies the records of one partition, in order.
struct PartitionWorker<H> {
    consumer: Arc<SagaConsumer>,
    applier: Arc<Applier<H>>,
    dead_letters: FutureProducer,
    settings: ConsumerSettings,
    shutdown: CancellationToken,
    /// The workers and what they prepare ahead: the consumer stops once all are done, so
    /// that no call to another system is cut off half way by the process ending.
    tasks: TaskTracker,
}

/// A record of a partition, prepared ([`Applier::prepare`]) in a task of its own while a
/// record before it is applied. `None` when nothing was prepared: the record was not
/// looked at ahead, or is no event at all (dead-lettered when its turn comes).
type Ahead<P> = Option<Prepare<P>>;

/// The task preparing a record ahead: the record as an event, and what its prepare gave.
type Prepare<P> = tokio::task::JoinHandle<(Envelope, Result<Step<P>, HandlerError>)>;

/// A record taken from its partition's queue, and its prepare if begun.
type Taken<P> = (OwnedMessage, Ahead<P>);

/// What a prepare begun ahead came to; `None` if the runtime is going down. A panic in
/// it goes on as if it had happened here, in the worker.
async fn joined<P>(task: Prepare<P>) -> Option<(Envelope, Result<Step<P>, HandlerError>)> {
    match task.await {
        Ok(prepared) => Some(prepared),
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(_) => None,
    }
}

/// Why a record is dead-lettered: the reason goes into its headers, the cause (one of a
/// few words) labels the metric.
struct Failure {
    reason: String,
    cause: &'static str,
    attempts: u32,
    first: OffsetDateTime,
    last: OffsetDateTime,
}

/// Whether a record is finished with (its offset may be stored) or was abandoned
/// because the service is stopping (it will be redelivered).
enum Done {
    Finished,
    Abandoned,
}

/// What became of a batch's one transaction.
enum Batch {
    Committed,
    /// Nothing of it was committed: its records are applied one at a time.
    RolledBack,
    Abandoned,
}

impl<H: Handler> PartitionWorker<H> {
    /// The partition's records in offset order, a transaction per record or per batch,
    /// and the records behind the transaction in hand prepared while it runs, each as
    /// soon as it is in the queue: the [`LOOK_AHEAD`] records behind it, or in batches the
    /// next batch. A handler whose prepare calls another system (ChargeOrder's charge)
    /// would otherwise hold its partition for the calls and the transaction one after the
    /// other; now the next calls wait beside this transaction. Only a shortcut's reads see
    /// less: a record's prepare reads what was committed before the transactions ahead of
    /// it, and its own transaction checks both guards again, with locks. A prepared record
    /// abandoned on stopping is redelivered and prepared again, which a prepare must bear
    /// anyway.
    async fn run(self: Arc<Self>, mut queue: mpsc::Receiver<OwnedMessage>) {
        let batch_size = self.settings.batch_size.max(1);
        let look_ahead = if batch_size > 1 {
            batch_size
        } else {
            LOOK_AHEAD
        };
        let mut ahead: VecDeque<Taken<H::Prepared>> = VecDeque::with_capacity(look_ahead);
        let mut batch: Vec<Taken<H::Prepared>> = Vec::with_capacity(batch_size);
        loop {
            // What was prepared ahead first, then what waits in the queue (never waiting
            // for more than one record).
            batch.extend(ahead.drain(..ahead.len().min(batch_size)));
            if batch.is_empty() {
                match queue.recv().await {
                    // A record on its own is prepared in its turn, not ahead of it.
                    Some(message) if batch_size == 1 => batch.push((message, None)),
                    Some(message) => {
                        let prepared = self.prepare_ahead(&message);
                        batch.push((message, prepared));
                    }
                    None => return,
                }
            }
            while batch.len() < batch_size {
                match queue.try_recv() {
                    Ok(message) => {
                        let prepared = self.prepare_ahead(&message);
                        batch.push((message, prepared));
                    }
                    Err(_) => break,
                }
            }
            if self.shutdown.is_cancelled() {
                return;
            }
            self.record_transaction_size(batch.len());
            let done = {
                let applying = self.apply_taken(&mut batch);
                tokio::pin!(applying);
                loop {
                    let room = ahead.len() < look_ahead && !self.shutdown.is_cancelled();
                    tokio::select! {
                        biased;
                        done = &mut applying => break done,
                        Some(following) = queue.recv(), if room => {
                            let prepared = self.prepare_ahead(&following);
                            ahead.push_back((following, prepared));
                        }
                    }
                }
            };
            match done {
                Done::Finished => batch.clear(),
                Done::Abandoned => return,
            }
        }
    }

    fn prepare_ahead(&self, message: &OwnedMessage) -> Ahead<H::Prepared> {
        let envelope = Envelope::from_message(message).ok()?;
        let span = record_span(message);
        span.record("event_id", envelope.id.as_str());
        let applier = self.applier.clone();
        Some(
            self.tasks.spawn(
                async move {
                    let step = applier.prepare(&envelope).await;
                    (envelope, step)
                }
                .instrument(span),
            ),
        )
    }

    /// Applies `batch`: in one transaction if it holds more than one record, and if that
    /// does not commit (nothing of it did), one record at a time. Its offsets are stored.
    async fn apply_taken(&self, batch: &mut [Taken<H::Prepared>]) -> Done {
        if batch.len() > 1 {
            match self.process_batch(batch).await {
                Batch::Committed => {
                    failpoint::crash_point_for(failpoint::CONSUMER_AFTER_HANDLER, batch.len());
                    self.store_offset(&batch.last().expect("a batch is never empty").0);
                    return Done::Finished;
                }
                Batch::RolledBack => {}
                Batch::Abandoned => return Done::Abandoned,
            }
        }
        for (message, prepared) in batch.iter_mut() {
            if self.shutdown.is_cancelled() {
                return Done::Abandoned;
            }
            match self
                .process(message, prepared.take())
                .instrument(record_span(message))
                .await
            {
                Done::Finished => self.finished(message),
                Done::Abandoned => return Done::Abandoned,
            }
        }
        Done::Finished
    }

    /// Applies `batch` in one transaction, with what its records' prepares learnt. If it
    /// rolls back, those whose prepares this took are prepared again when applied alone.
    async fn process_batch(&self, batch: &mut [Taken<H::Prepared>]) -> Batch {
        // A record that is no event at all: the batch goes one record at a time, each
        // with the prepare it has, and that one is dead-lettered.
        if batch.iter().any(|(_, prepared)| prepared.is_none()) {
            return Batch::RolledBack;
        }
        let started = Instant::now();
        let mut events = Vec::with_capacity(batch.len());
        let mut steps = Vec::with_capacity(batch.len());
        let mut failed = None;
        // Every prepare is awaited, a failed one or not, so that none is left running
        // while the batch's records are prepared again.
        for (_, prepared) in batch.iter_mut() {
            let task = prepared.take().expect("checked above");
            match joined(task).await {
                Some((envelope, Ok(step))) => {
                    events.push(envelope);
                    steps.push(step);
                }
                Some((_, Err(error))) => failed = failed.or(Some(error)),
                None => return Batch::Abandoned,
            }
        }
        let applied = match failed {
            Some(error) => Err(error),
            None => self.applier.apply_prepared_batch(&events, steps).await,
        };
        self.time_handler(started);
        match applied {
            Ok(outcomes) => {
                for ((message, _), (event, outcome)) in
                    batch.iter().zip(events.iter().zip(outcomes))
                {
                    self.count(&event.event_type, outcome.as_str());
                    let span = record_span(message);
                    span.record("event_id", event.id.as_str());
                    span.in_scope(|| {
                        tracing::info!(
                            event_type = %event.event_type,
                            outcome = outcome.as_str(),
                            batch = batch.len(),
                            "event handled"
                        )
                    });
                }
                Batch::Committed
            }
            Err(error) => {
                let first = &batch[0].0;
                tracing::info!(
                    topic = first.topic(),
                    partition = first.partition(),
                    first_offset = first.offset(),
                    records = batch.len(),
                    %error,
                    "batch rolled back; applying its records one at a time"
                );
                Batch::RolledBack
            }
        }
    }
    /// Applies one record, retrying as its failure asks; `ahead` is its first attempt's
    /// prepare, if started already.
    async fn process(&self, message: &OwnedMessage, ahead: Ahead<H::Prepared>) -> Done {
        let (envelope, mut prepared) = match ahead {
            Some(task) => match joined(task).await {
                Some((envelope, step)) => (envelope, Some(step)),
                None => return Done::Abandoned,
            },
            None => match Envelope::from_message(message) {
                Ok(envelope) => (envelope, None),
                Err(error) => {
                    let now = OffsetDateTime::now_utc();
                    let failure = Failure {
                        reason: error.to_string(),
                        cause: "malformed",
                        attempts: 1,
                        first: now,
                        last: now,
                    };
                    return self.dead_letter(message, None, failure).await;
                }
            },
        };
        tracing::Span::current().record("event_id", envelope.id.as_str());
        let first_failure = OffsetDateTime::now_utc();
        let mut delays = backoff::backoff();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let started = Instant::now();
            let applied = match prepared.take() {
                Some(Ok(step)) => self.applier.apply_prepared(&envelope, step).await,
                Some(Err(error)) => Err(error),
                None => self.applier.apply(&envelope).await,
            };
            self.time_handler(started);
            let error = match applied {
                Ok(outcome) => {
                    self.count(&envelope.event_type, outcome.as_str());
                    tracing::info!(
                        event_type = %envelope.event_type,
                        outcome = outcome.as_str(),
                        "event handled"
                    );
                    return Done::Finished;
                }
                Err(error) => error,
            };
            let retry = error.retry();
            let give_up = match retry {
                Retry::Never => true,
                Retry::AFewTimes => attempt >= self.settings.max_attempts,
                Retry::UntilItWorks => false,
            };
            if give_up {
                let failure = Failure {
                    reason: error.to_string(),
                    cause: if retry == Retry::Never {
                        "rejected"
                    } else {
                        "retries_exhausted"
                    },
                    attempts: attempt,
                    first: first_failure,
                    last: OffsetDateTime::now_utc(),
                };
                return self
                    .dead_letter(message, Some(&envelope.event_type), failure)
                    .await;
            }
            counter!(
                metrics::RETRIES,
                "topic" => self.settings.topic.clone(),
                "class" => retry.as_str(),
                "error" => error.kind(),
            )
            .increment(1);
            let delay = backoff::next_delay(&mut delays);
            tracing::warn!(attempt, %error, retry_in = ?delay, "handler failed; retrying");
            if !self.pause(delay).await {
                return Done::Abandoned;
            }
        }
    }

    /// Counts what became of one record.
    fn count(&self, event_type: &str, outcome: &'static str) {
        counter!(
            metrics::EVENTS,
            "topic" => self.settings.topic.clone(),
            "type" => metrics::event_type_label(event_type),
            "outcome" => outcome,
        )
        .increment(1);
    }

    fn record_transaction_size(&self, records: usize) {
        histogram!(metrics::BATCH_SIZE, "topic" => self.settings.topic.clone())
            .record(records as f64);
    }

    fn time_handler(&self, started: Instant) {
        histogram!(metrics::HANDLER_DURATION, "topic" => self.settings.topic.clone())
            .record(started.elapsed().as_secs_f64());
    }

    /// Produces the original record, untouched, to the dead-letter topic with why it is
    /// there, and waits for the broker's acknowledgement: only then may the partition
    /// move past it. `event_type` is `None` for a record that is no event at all.
    async fn dead_letter(
        &self,
        message: &OwnedMessage,
        event_type: Option<&str>,
        failure: Failure,
    ) -> Done {
        let reason = failure.reason.as_str();
        let partition = message.partition().to_string();
        let offset = message.offset().to_string();
        let attempts = failure.attempts.to_string();
        let first = failure.first.format(&Rfc3339).unwrap_or_default();
        let last = failure.last.format(&Rfc3339).unwrap_or_default();
        let mut delays = backoff::backoff();
        loop {
            let mut headers = OwnedHeaders::new();
            for (key, value) in [
                ("dlq.reason", reason),
                ("dlq.original.topic", message.topic()),
                ("dlq.original.partition", &partition),
                ("dlq.original.offset", &offset),
                ("dlq.group", &self.settings.group_id),
                ("dlq.attempts", &attempts),
                ("dlq.first.failure", &first),
                ("dlq.last.failure", &last),
            ] {
                headers = headers.insert(Header {
                    key,
                    value: Some(value),
                });
            }
            let mut record: FutureRecord<'_, [u8], [u8]> =
                FutureRecord::to(&self.settings.dead_letter_topic).headers(headers);
            if let Some(key) = message.key() {
                record = record.key(key);
            }
            if let Some(payload) = message.payload() {
                record = record.payload(payload);
            }
            match self.dead_letters.send(record, Duration::from_secs(5)).await {
                Ok(_) => {
                    tracing::warn!(reason, dead_letter_topic = %self.settings.dead_letter_topic, "record dead-lettered");
                    self.count(event_type.unwrap_or("other"), "dead_lettered");
                    counter!(
                        metrics::DEAD_LETTERS,
                        "topic" => self.settings.topic.clone(),
                        "cause" => failure.cause,
                    )
                    .increment(1);
                    return Done::Finished;
                }
                Err((error, _)) => {
                    let delay = backoff::next_delay(&mut delays);
                    tracing::warn!(%error, retry_in = ?delay, "cannot dead-letter record; retrying");
                    if !self.pause(delay).await {
                        return Done::Abandoned;
                    }
                }
            }
        }
    }

    /// Sleeps for `delay`; false if the service began stopping meanwhile.
    async fn pause(&self, delay: Duration) -> bool {
        tokio::select! {
            _ = self.shutdown.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }

    /// `message` was applied (or dead-lettered) on its own: its offset may be stored.
    fn finished(&self, message: &OwnedMessage) {
        // A crash here redelivers a record whose effects are committed.
        failpoint::crash_point(failpoint::CONSUMER_AFTER_HANDLER);
        self.store_offset(message)
    }

    fn store_offset(&self, message: &OwnedMessage) {
        // librdkafka stores offset + 1: the next record to read.
        if let Err(error) =
            self.consumer
                .store_offset(message.topic(), message.partition(), message.offset())
        {
            // The partition was revoked meanwhile; its new owner redelivers this record.
            tracing::debug!(%error, "offset not stored");
        }
    }
}
