//! Fetching from the broker: the client and its settings, what librdkafka reports, and
//! the queue of each partition's worker, its partition paused while the queue is full and
//! resumed once it has room.

use super::LOG_TARGET;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::metrics::gauge;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::consumer::{Consumer as _, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::statistics::Statistics;
use rdkafka::topic_partition_list::TopicPartitionList;
use tokio::sync::mpsc;

use super::ownership::{Owned, Ownership, REVOKE_BOUND};
use super::{ConsumerSettings, PARTITION_QUEUE};
use crate::metrics;

/// Room a paused partition's queue must have before it is resumed. Not the first free
/// slot, which would pause and resume it once per record while a backlog drains; and
/// with half the queue still to apply, its worker stays busy while librdkafka fetches
/// again after the resume (within [`FETCH_WAIT_MS`]: see [`Lanes::wake_fetcher`]).
const RESUME_ROOM: usize = PARTITION_QUEUE / 2;

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

/// Takes partitions on and lets them go ([`Ownership`]), logs rebalances and failed
/// commits, which librdkafka otherwise reports to no one, turns its statistics into the
/// consumer-lag gauges, and says when the consumer first joined its group (for the
/// readiness probe, [`crate::probes`]).
pub(super) struct SagaConsumerContext {
    joined: Arc<std::sync::atomic::AtomicBool>,
    topic: String,
    ownership: Arc<Ownership>,
}

impl SagaConsumerContext {
    /// The partitions of the consumer's topic in `tpl`.
    fn of_topic(&self, tpl: &TopicPartitionList) -> Vec<i32> {
        tpl.elements_for_topic(&self.topic)
            .iter()
            .map(|element| element.partition())
            .collect()
    }
}

impl ClientContext for SagaConsumerContext {
    // A partition's end, which this consumer asks to be told of ([`Item::End`]), also
    // reaches the client's main queue as an error: not one, and not for the log.
    fn error(&self, error: KafkaError, reason: &str) {
        if let KafkaError::Global(RDKafkaErrorCode::PartitionEOF) = error {
            return;
        }
        DefaultClientContext.error(error, reason);
    }

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
    fn post_rebalance(
        &self,
        consumer: &rdkafka::consumer::BaseConsumer<Self>,
        rebalance: &Rebalance<'_>,
    ) {
        if let Rebalance::Assign(tpl) = rebalance {
            // A partition paused for a full queue when it was revoked must not stay paused
            // once assigned back: its new queue is empty, and nothing else would resume it.
            if let Err(error) = consumer.resume(tpl) {
                tracing::debug!(target: LOG_TARGET, %error, "resuming the assigned partitions refused");
            }
            crate::probes::joined(&self.joined);
        }
    }

    /// On a revoke, the partitions' work is stopped before librdkafka unassigns them and
    /// commits what they stored ([`Ownership::revoke`]).
    fn pre_rebalance(
        &self,
        consumer: &rdkafka::consumer::BaseConsumer<Self>,
        rebalance: &Rebalance<'_>,
    ) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                self.ownership.assign(&self.of_topic(tpl));
                tracing::info!(target: LOG_TARGET, partitions = %partitions(tpl), "partitions assigned")
            }
            Rebalance::Revoke(tpl) => {
                let revoked = self.of_topic(tpl);
                let started = Instant::now();
                let stopped = self.ownership.revoke(&revoked, REVOKE_BOUND);
                for partition in &revoked {
                    metrics::record_in_hand(&self.topic, *partition, None);
                }
                // Lost: the group went on without this member, and another may hold the
                // partitions already; librdkafka commits nothing of them.
                let lost = consumer.assignment_lost();
                if stopped {
                    tracing::info!(target: LOG_TARGET, partitions = %partitions(tpl), lost,
                        stopped_in = ?started.elapsed(), "partitions revoked; their work stopped")
                } else {
                    tracing::warn!(target: LOG_TARGET, partitions = %partitions(tpl), lost, bound = ?REVOKE_BOUND,
                        "partitions revoked; some of their work had not stopped within the bound")
                }
            }
            Rebalance::Error(error) => {
                // rust-rdkafka unassigns what it was handed after this: stop it all first,
                // as for a revoke; the group assigns partitions again.
                let stopped = self.ownership.revoke(&self.ownership.all(), REVOKE_BOUND);
                tracing::warn!(target: LOG_TARGET, %error, stopped, "rebalance error; the partitions' work stopped")
            }
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
                tracing::warn!(target: LOG_TARGET, %error, "offset commit failed; records since the last commit will be redelivered")
            }
        }
    }
}

/// The room of `lane`'s queue for `partition`, once it has enough to resume.
fn room_in(partition: i32, lane: &Lane) -> BoxFuture<'static, Room> {
    let (queue, generation) = (lane.queue.clone(), lane.generation);
    Box::pin(async move {
        Room {
            partition,
            generation,
            open: queue.reserve_many(RESUME_ROOM).await.is_ok(),
        }
    })
}

/// Consumer errors are logged at most this often; the rest are counted.
const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// Keeps an outage from flooding the log with one line per failed reconnect.
#[derive(Default)]
pub(super) struct ErrorLog {
    last_logged: Option<Instant>,
    not_logged: u64,
}

impl ErrorLog {
    pub(super) fn report(&mut self, error: &rdkafka::error::KafkaError) {
        if self
            .last_logged
            .is_some_and(|at| at.elapsed() < ERROR_LOG_INTERVAL)
        {
            self.not_logged += 1;
            return;
        }
        tracing::warn!(target: LOG_TARGET, %error, similar_not_logged = self.not_logged, "kafka consumer error; librdkafka reconnects by itself");
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

pub(super) type SagaConsumer = StreamConsumer<SagaConsumerContext>;

/// The client for `settings`, not yet subscribed, taking partitions on and letting them go
/// through `ownership`.
pub(super) fn connect(
    settings: &ConsumerSettings,
    ownership: Arc<Ownership>,
) -> KafkaResult<Arc<SagaConsumer>> {
    Ok(Arc::new(
        crate::kafka::client_config(&settings.brokers)
            .set("group.id", &settings.group_id)
            .set("enable.auto.commit", "true")
            .set("auto.commit.interval.ms", "1000")
            // The loop stores an offset only once its record is fully handled.
            .set("enable.auto.offset.store", "false")
            // Each partition's end reported, for the offset past the last transaction
            // marker ([`Item::End`]).
            .set("enable.partition.eof", "true")
            // A new group starts at the beginning: no event written before it existed is lost.
            .set("auto.offset.reset", "earliest")
            // librdkafka's default, stated: a relay's transaction aborted when its holder
            // was fenced is never seen.
            .set("isolation.level", "read_committed")
            .set("session.timeout.ms", "10000")
            .set("max.partition.fetch.bytes", PARTITION_FETCH_BYTES)
            .set("fetch.wait.max.ms", FETCH_WAIT_MS)
            // For the consumer-lag gauges; a few microseconds' work each time.
            .set("statistics.interval.ms", "5000")
            // A rebalance moves only the partitions that change owner; the others' work
            // goes on. Every member of a group must use it (the eager and cooperative
            // protocols do not mix).
            .set("partition.assignment.strategy", "cooperative-sticky")
            .create_with_context(SagaConsumerContext {
                joined: settings.joined.clone(),
                topic: settings.topic.clone(),
                ownership,
            })?,
    ))
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
pub(super) struct Lanes {
    consumer: Arc<SagaConsumer>,
    topic: String,
    ownership: Arc<Ownership>,
    /// [`Ownership::changes`] when the lanes were last matched against it.
    seen_changes: u64,
    lanes: HashMap<i32, Lane>,
    /// One future per paused partition: its queue has room (false: its worker is gone),
    /// for the ownership (its generation) the queue was made for.
    pub(super) room: FuturesUnordered<BoxFuture<'static, Room>>,
}

/// A paused partition's queue has room, or its worker is gone.
pub(super) struct Room {
    pub(super) partition: i32,
    pub(super) generation: u64,
    pub(super) open: bool,
}

struct Lane {
    /// The ownership its worker works for.
    generation: u64,
    queue: mpsc::Sender<Item>,
    /// Received for this partition but not yet in its queue, in offset order; not empty
    /// exactly while the partition is paused.
    held: VecDeque<Item>,
}

/// What a partition's worker is handed, in the partition's order.
pub(super) enum Item {
    Record(OwnedMessage),
    /// librdkafka reached the partition's end: the next offset to read is `offset`,
    /// past the markers the relays' Kafka transactions leave, which are offsets but not
    /// records. Once every record before it is finished, the worker stores it, so that
    /// the group's committed offset reaches the end (a lag of 0) instead of stopping at
    /// the last marker.
    End {
        partition: i32,
        offset: i64,
    },
}

impl Item {
    fn partition(&self) -> i32 {
        match self {
            Item::Record(message) => message.partition(),
            Item::End { partition, .. } => *partition,
        }
    }
}

impl Lanes {
    pub(super) fn new(consumer: Arc<SagaConsumer>, topic: &str, ownership: Arc<Ownership>) -> Self {
        Self {
            consumer,
            topic: topic.to_owned(),
            seen_changes: ownership.changes(),
            ownership,
            lanes: HashMap::new(),
            room: FuturesUnordered::new(),
        }
    }

    /// Puts `message` in its partition's queue (made with `spawn` for the partition's
    /// ownership on its first record), or holds it back; false if the partition's worker
    /// is gone while the partition is still owned. A record of a partition no longer
    /// owned is dropped: its new owner reads it from the committed offset.
    pub(super) fn hand(
        &mut self,
        message: Item,
        spawn: impl FnOnce(&Owned) -> mpsc::Sender<Item>,
    ) -> bool {
        self.forget_the_revoked();
        let partition = message.partition();
        let Some(owned) = self.ownership.owned(partition) else {
            tracing::debug!(target: LOG_TARGET, partition,
                "a record of a partition no longer owned: left to its owner");
            return true;
        };
        let lane = self.lanes.entry(partition).or_insert_with(|| Lane {
            generation: owned.generation,
            queue: spawn(&owned),
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
                self.room.push(room_in(partition, lane));
                self.set_paused(partition, true);
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => self.ownership.owned(partition).is_none(),
        }
    }

    /// Moves the records held back for a paused partition into its queue, which has room
    /// now, and resumes it; false if its worker is gone while the partition is still
    /// owned. A room for an ownership revoked meanwhile is nothing to act on.
    pub(super) fn refill(&mut self, room: &Room) -> bool {
        self.forget_the_revoked();
        let partition = room.partition;
        let Some(lane) = self
            .lanes
            .get_mut(&partition)
            .filter(|lane| lane.generation == room.generation)
        else {
            return true;
        };
        if !room.open {
            return self.ownership.owned(partition).is_none();
        }
        while let Some(message) = lane.held.pop_front() {
            match lane.queue.try_send(message) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(message)) => {
                    lane.held.push_front(message);
                    self.room.push(room_in(partition, lane));
                    return true;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    return self.ownership.owned(partition).is_none();
                }
            }
        }
        self.set_paused(partition, false);
        self.wake_fetcher(partition);
        true
    }

    /// Drops the queues (and the records held back) of partitions revoked since last
    /// looked: their workers are gone, and a partition assigned back gets a new queue.
    fn forget_the_revoked(&mut self) {
        let changes = self.ownership.changes();
        if changes == self.seen_changes {
            return;
        }
        self.seen_changes = changes;
        let ownership = &self.ownership;
        self.lanes.retain(|partition, lane| {
            ownership
                .owned(*partition)
                .is_some_and(|owned| owned.generation == lane.generation)
        });
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
                tracing::debug!(target: LOG_TARGET, partition, %error, "watermarks after a resume not answered");
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
            Ok(()) => {
                tracing::debug!(target: LOG_TARGET, partition, paused, "partition queue full or drained")
            }
            // Revoked meanwhile: its new owner fetches it from the committed offset.
            Err(error) => {
                tracing::debug!(target: LOG_TARGET, partition, paused, %error, "pause or resume refused")
            }
        }
    }
}
