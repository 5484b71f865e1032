//! Offsets: a record's is stored once it is finished with, every record before it in its
//! partition being finished too; librdkafka commits what was stored, and the consumer
//! commits it once more when it stops.

use super::LOG_TARGET;
use std::sync::Arc;

use rdkafka::consumer::{CommitMode, Consumer as _};
use rdkafka::message::{Message, OwnedMessage};

use super::dispatch::PartitionWorker;
use super::fetch::SagaConsumer;
use crate::failpoint;
use crate::handler::Handler;

impl<H: Handler> PartitionWorker<H> {
    /// `message` was applied (or dead-lettered) on its own: its offset may be stored.
    pub(super) fn finished(&self, message: &OwnedMessage) {
        // A crash here redelivers a record whose effects are committed.
        failpoint::crash_point(failpoint::CONSUMER_AFTER_HANDLER);
        self.store_offset(message)
    }

    pub(super) fn store_offset(&self, message: &OwnedMessage) {
        // librdkafka stores offset + 1: the next record to read.
        if let Err(error) =
            self.consumer
                .store_offset(message.topic(), message.partition(), message.offset())
        {
            // The partition was revoked meanwhile; its new owner redelivers this record.
            tracing::debug!(target: LOG_TARGET, %error, "offset not stored");
        }
    }
}

impl<H: Handler> PartitionWorker<H> {
    /// Stores `offset`, the partition's end, as the next to read: past the transaction
    /// markers after its last record.
    pub(super) fn store_end(&self, partition: i32, offset: i64) {
        if offset < 1 {
            return;
        }
        // librdkafka stores offset + 1.
        if let Err(error) = self
            .consumer
            .store_offset(&self.settings.topic, partition, offset - 1)
        {
            tracing::debug!(target: LOG_TARGET, %error, "end offset not stored");
        }
    }
}

/// Commits the offsets stored, once the workers are done, so that the next owner of a
/// partition starts after the last record finished here.
pub(super) async fn commit_stored(consumer: &Arc<SagaConsumer>) -> anyhow::Result<()> {
    let final_commit = consumer.clone();
    match tokio::task::spawn_blocking(move || final_commit.commit_consumer_state(CommitMode::Sync))
        .await?
    {
        Ok(()) => {}
        Err(rdkafka::error::KafkaError::ConsumerCommit(
            rdkafka::types::RDKafkaErrorCode::NoOffset,
        )) => {}
        Err(error) => tracing::warn!(target: LOG_TARGET, %error, "final offset commit failed"),
    }
    Ok(())
}
