//! Dead letters: a record that can never be applied goes to the group's dead-letter
//! topic, its key, value and own headers as they were, with why in `dlq.*` headers, and
//! its partition moves on.

use super::LOG_TARGET;
use std::time::Duration;

use ::metrics::counter;
use rdkafka::ClientConfig;
use rdkafka::error::KafkaResult;
use rdkafka::message::{Header, Message, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::dispatch::{Done, PartitionWorker};
use crate::backoff;
use crate::handler::Handler;
use crate::metrics;
use crate::redrive::own_headers;
use crate::retry::Retry;

/// Why a record is dead-lettered: the reason goes into its headers, the cause (one of a
/// few words) labels the metric.
pub(super) struct Failure {
    reason: String,
    cause: &'static str,
    attempts: u32,
    first: OffsetDateTime,
    last: OffsetDateTime,
}

impl Failure {
    /// A record that is no event at all: it is dead-lettered at once.
    pub(super) fn malformed(reason: String) -> Self {
        let now = OffsetDateTime::now_utc();
        Self {
            reason,
            cause: "malformed",
            attempts: 1,
            first: now,
            last: now,
        }
    }

    /// A handler's failure after `attempts`, the first at `first`, that is not retried
    /// again: never retried, or retried as often as its class allows.
    pub(super) fn given_up(
        reason: String,
        retry: Retry,
        attempts: u32,
        first: OffsetDateTime,
    ) -> Self {
        Self {
            reason,
            cause: if retry == Retry::Never {
                "rejected"
            } else {
                "retries_exhausted"
            },
            attempts,
            first,
            last: OffsetDateTime::now_utc(),
        }
    }
}

impl<H: Handler> PartitionWorker<H> {
    /// Produces the original record to the dead-letter topic with why it is there, and
    /// waits for the broker's acknowledgement: only then may the partition move past it.
    /// `event_type` is `None` for a record that is no event at all.
    ///
    /// The dead letter has the record's key and value, and first every header of the
    /// record, in order and byte for byte (its causation id, its trace context, whatever
    /// its producer put there), then this failure's `dlq.*` headers. A `dlq.*` header the
    /// record brought is left out, so that each is there once and about this failure: it
    /// told of an earlier trip (a record redriven, then dead-lettered again) whose dead
    /// letter is still in its topic, and a reader taking the first header of a name would
    /// read it instead of this one's.
    pub(super) async fn dead_letter(
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
            let mut headers = own_headers(message.headers());
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
            let producer = match self.dead_letters.producer() {
                Ok(producer) => producer,
                Err(error) => {
                    let delay = backoff::next_delay(&mut delays);
                    tracing::warn!(target: LOG_TARGET, %error, retry_in = ?delay, "cannot make the dead-letter producer; retrying");
                    if !self.pause(delay).await {
                        return Done::Abandoned;
                    }
                    continue;
                }
            };
            match producer.send(record, Duration::from_secs(5)).await {
                Ok(_) => {
                    tracing::warn!(target: LOG_TARGET, reason, dead_letter_topic = %self.settings.dead_letter_topic, "record dead-lettered");
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
                    tracing::warn!(target: LOG_TARGET, %error, retry_in = ?delay, "cannot dead-letter record; retrying");
                    if !self.pause(delay).await {
                        return Done::Abandoned;
                    }
                }
            }
        }
    }
}

/// The producer a consumer sends its dead letters with: one given, or one made at the first
/// dead letter. A service's relay is transactional and cannot lend its producer, and a
/// producer made at start costs each service about 1% of a core at rest (librdkafka's
/// polling thread) for records that are rare.
pub enum DeadLetters {
    Given(FutureProducer),
    Lazy {
        config: ClientConfig,
        made: std::sync::OnceLock<FutureProducer>,
    },
}

impl DeadLetters {
    /// A producer of `config`, made when the first dead letter is sent.
    pub fn lazy(config: ClientConfig) -> Self {
        Self::Lazy {
            config,
            made: std::sync::OnceLock::new(),
        }
    }

    fn producer(&self) -> KafkaResult<&FutureProducer> {
        match self {
            Self::Given(producer) => Ok(producer),
            Self::Lazy { config, made } => {
                if let Some(producer) = made.get() {
                    return Ok(producer);
                }
                let producer: FutureProducer = config.create()?;
                // Two made at once: one is kept, the other dropped.
                Ok(made.get_or_init(|| producer))
            }
        }
    }
}

impl From<FutureProducer> for DeadLetters {
    fn from(producer: FutureProducer) -> Self {
        Self::Given(producer)
    }
}
