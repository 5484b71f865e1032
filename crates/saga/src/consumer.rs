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
//! - **A revoked partition is let go.** Partitions move with the cooperative-sticky
//!   assignor, only those that change owner. Before librdkafka unassigns one, its work
//!   stops ([`ownership`]): no record of it is dispatched again, the record in hand and
//!   the calls prepared ahead are abandoned at their next `.await`, so this consumer
//!   starts no call and no write for the partition after the revoke (a `COMMIT` sent
//!   before it may still land, its offset unstored); then librdkafka commits the
//!   offsets its finished records stored (nothing for an assignment lost). A record
//!   abandoned is redelivered to the new owner, whose guards and keyed calls make the
//!   repeat harmless.
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

mod dead_letters;
pub use dead_letters::DeadLetters;
mod dispatch;
mod fetch;
mod offsets;
mod ownership;

use std::sync::Arc;

use ::metrics::counter;
use futures::StreamExt;
use rdkafka::consumer::Consumer as _;
use rdkafka::error::KafkaError;
use rdkafka::topic_partition_list::Offset;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::handler::{Applier, Handler};
use crate::metrics;
use dispatch::PartitionWorker;
use fetch::{ErrorLog, Item, Lanes};
use ownership::Ownership;

/// Records buffered per partition ahead of its worker (about 1 KiB each).
const PARTITION_QUEUE: usize = 1024;
/// Records of a partition prepared ahead of the one being applied, a transaction per
/// record ([`Applier::prepare`]: for ChargeOrder, the read-ahead and the provider's
/// charge). With one, a partition runs at the pace of the slower of prepare and
/// transaction, and ChargeOrder's prepare (a read, an HTTP call, the provider's commit)
/// took about twice its transaction on a busy machine. Each prepare may hold one of the
/// consumer pool's connections for its read-ahead, and a record prepared but not applied
/// when the service stops is prepared again on redelivery: a few calls again, not a
/// queue's worth. In batches the next batch is prepared instead, however many that is.
pub const LOOK_AHEAD: usize = 4;

/// Every line the consumer logs carries this target, whichever of its files writes it:
/// the fault suite's checker reads `event handled` and `record dead-lettered` lines by
/// it, and an operator filters the consumer's lines by it (`RUST_LOG=saga::consumer=…`).
const LOG_TARGET: &str = "saga::consumer";

#[derive(Debug, Clone)]
pub struct ConsumerSettings {
    pub brokers: String,
    pub group_id: String,
    pub topic: String,
    /// Where records that can never be processed go, with the reason in headers.
    pub dead_letter_topic: String,
    /// Attempts for a failure of class [`crate::Retry::AFewTimes`] before dead-lettering.
    pub max_attempts: u32,
    /// Most records of one partition applied in one transaction; 1 is a transaction per
    /// record.
    pub batch_size: usize,
    /// Set once the consumer is first assigned partitions ([`crate::probes`]).
    pub joined: Arc<std::sync::atomic::AtomicBool>,
    /// Where each attempt at a record or a batch is recorded while it runs, for `/livez`.
    pub progress: crate::probes::Progress,
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
            joined: Arc::default(),
            progress: crate::probes::Progress::default(),
        }
    }
}

/// Where librdkafka will read `partition` next: at its end, past any transaction marker.
fn end_of(consumer: &fetch::SagaConsumer, topic: &str, partition: i32) -> Option<i64> {
    let positions = consumer.position().ok()?;
    match positions.find_partition(topic, partition)?.offset() {
        Offset::Offset(offset) => Some(offset),
        _ => None,
    }
}

/// Consumes `settings.topic` with `applier` until `shutdown` is cancelled, sending the
/// records it can never apply to `settings.dead_letter_topic` with `dead_letters` (an
/// idempotent producer, [`crate::kafka::idempotent_producer`], given or made at the first
/// dead letter: [`DeadLetters`]).
pub async fn run<H: Handler>(
    settings: ConsumerSettings,
    applier: Arc<Applier<H>>,
    dead_letters: impl Into<DeadLetters>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let ownership = Arc::new(Ownership::default());
    let consumer = fetch::connect(&settings, ownership.clone())?;
    consumer.subscribe(&[&settings.topic])?;
    let workers = TaskTracker::new();
    let worker = Arc::new(PartitionWorker {
        consumer: consumer.clone(),
        applier,
        dead_letters: dead_letters.into(),
        settings: settings.clone(),
        shutdown: shutdown.clone(),
        tasks: workers.clone(),
    });
    tracing::info!(topic = %settings.topic, group = %settings.group_id, "consumer started");

    let mut lanes = Lanes::new(consumer.clone(), &settings.topic, ownership);
    let mut errors = ErrorLog::default();
    loop {
        let received = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            Some(room) = lanes.room.next(), if !lanes.room.is_empty() => {
                if !lanes.refill(&room) {
                    break;
                }
                continue;
            }
            received = consumer.recv() => received.map(|m| m.detach()),
        };
        let item = match received {
            Ok(message) => {
                counter!(metrics::RECORDS_RECEIVED, "topic" => settings.topic.clone()).increment(1);
                Item::Record(message)
            }
            Err(KafkaError::PartitionEOF(partition)) => {
                match end_of(&consumer, &settings.topic, partition) {
                    Some(offset) => Item::End { partition, offset },
                    None => continue,
                }
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
        let handed = lanes.hand(item, |owned| {
            let (tx, rx) = mpsc::channel(PARTITION_QUEUE);
            workers.spawn(owned.task(worker.clone().run(rx, owned.clone())));
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
    offsets::commit_stored(&consumer).await?;
    tracing::info!(topic = %settings.topic, "consumer stopped");
    Ok(())
}
