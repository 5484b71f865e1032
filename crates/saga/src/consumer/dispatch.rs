//! Dispatch: one worker per partition applies its records in offset order, a transaction
//! per record or per batch, and prepares the records behind the one in hand meanwhile.

use super::LOG_TARGET;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use ::metrics::{counter, histogram};
use rdkafka::message::{Message, OwnedMessage};
use time::OffsetDateTime;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, Span};

use super::dead_letters::Failure;
use super::fetch::Item;
use super::fetch::SagaConsumer;
use super::ownership::Owned;
use super::{ConsumerSettings, LOOK_AHEAD};
use crate::backoff;
use crate::envelope::Envelope;
use crate::failpoint;
use crate::handler::{Applier, Handler, HandlerError, Step};
use crate::metrics;
use crate::retry::Retry;
use crate::trace;

/// The record as an event, carrying its spans (its `event_id` goes into the log's).
fn event_of(message: &OwnedMessage, spans: &Spans) -> Result<Envelope, crate::EnvelopeError> {
    let mut envelope = Envelope::from_message(message)?;
    spans.log.record("event_id", envelope.id.as_str());
    envelope.delivery.span = spans.log.clone();
    envelope.delivery.hop = spans.hop.clone();
    Ok(envelope)
}

/// Whether the record's type, as the relay's `event_type` header gives it (the record is
/// not parsed for it), is one `applier`'s handler ignores. A record without the header,
/// or whose header belies its body, only has a span more or fewer than its type asks.
fn ignored<H: Handler>(message: &OwnedMessage, applier: &Applier<H>) -> bool {
    crate::kafka::header_str(message, "event_type")
        .is_some_and(|event_type| applier.ignores(event_type))
}

/// A record's two spans: the log's, in which every line about the record is written (the
/// fault suite finds each offset's fate by its `topic`, `partition` and `offset`), and its
/// process span in the order's trace ([`trace::Hop::process`]), which a record of a type
/// its handler [ignores](crate::Handler::ignores) goes without.
#[derive(Clone)]
struct Spans {
    log: Span,
    hop: trace::Hop,
}

impl Spans {
    fn of<H: Handler>(message: &OwnedMessage, group: &str, applier: &Applier<H>) -> Self {
        Self {
            log: tracing::info_span!(
                "record",
                topic = message.topic(),
                partition = message.partition(),
                offset = message.offset(),
                event_id = tracing::field::Empty,
            ),
            hop: if trace::enabled() && ignored(message, applier) {
                trace::Hop::default()
            } else {
                trace::Hop::process(message, group)
            },
        }
    }

    /// Runs `future` in both spans.
    fn around<F: Future>(&self, future: F) -> impl Future<Output = F::Output> + use<F> {
        self.hop.scope(future.instrument(self.log.clone()))
    }
}

/// Applies the records of one partition, in order.
pub(super) struct PartitionWorker<H> {
    pub(super) consumer: Arc<SagaConsumer>,
    pub(super) applier: Arc<Applier<H>>,
    pub(super) dead_letters: super::DeadLetters,
    pub(super) settings: ConsumerSettings,
    pub(super) shutdown: CancellationToken,
    /// The workers and what they prepare ahead: the consumer stops once all are done, so
    /// that no call to another system is cut off half way by the process ending.
    pub(super) tasks: TaskTracker,
}

/// A record of a partition, prepared ([`Applier::prepare`]) in a task of its own while a
/// record before it is applied. `None` when nothing was prepared: the record was not
/// looked at ahead, or is no event at all (dead-lettered when its turn comes).
type Ahead<P> = Option<Prepare<P>>;

/// The task preparing a record ahead: the record as an event, and what its prepare gave
/// (`None` if its partition was revoked first).
type Prepare<P> = tokio::task::JoinHandle<Option<(Envelope, Result<Step<P>, HandlerError>)>>;

/// The partition's end ([`Item::End`]) last met, stored once every record before it is
/// finished and no record after it came; and the offset stored last.
#[derive(Default)]
struct End {
    seen: Option<(i32, i64)>,
    stored: i64,
}

/// A record taken from its partition's queue: its spans, and its prepare if begun.
struct Taken<P> {
    message: OwnedMessage,
    spans: Spans,
    ahead: Ahead<P>,
}

/// What a prepare begun ahead came to; `None` if the runtime is going down or the
/// partition was revoked. A panic in it goes on as if it had happened here, in the worker.
async fn joined<P>(task: Prepare<P>) -> Option<(Envelope, Result<Step<P>, HandlerError>)> {
    match task.await {
        Ok(prepared) => prepared,
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(_) => None,
    }
}

/// Whether a record is finished with (its offset may be stored) or was abandoned
/// because the service is stopping (it will be redelivered).
pub(super) enum Done {
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
    ///
    /// It runs as one of `owned`'s tasks, as do its prepares: a revoke of the partition
    /// drops them all at their next `.await` ([`super::ownership`]).
    pub(super) async fn run(self: Arc<Self>, mut queue: mpsc::Receiver<Item>, owned: Owned) {
        let batch_size = self.settings.batch_size.max(1);
        let look_ahead = if batch_size > 1 {
            batch_size
        } else {
            LOOK_AHEAD
        };
        let mut ahead: VecDeque<Taken<H::Prepared>> = VecDeque::with_capacity(look_ahead);
        let mut batch: Vec<Taken<H::Prepared>> = Vec::with_capacity(batch_size);
        // The partition's oldest unfinished record is the first of the batch in hand.
        let mut partition = None;
        let mut end = End::default();
        loop {
            // What was prepared ahead first, then what waits in the queue (never waiting
            // for more than one record).
            batch.extend(ahead.drain(..ahead.len().min(batch_size)));
            if batch.is_empty() {
                if let Some(partition) = partition {
                    metrics::record_in_hand(&self.settings.topic, partition, None);
                }
                let Some(message) = self.next_record(&mut queue, &mut end).await else {
                    return;
                };
                // A record on its own is prepared in its turn, not ahead of it.
                batch.push(self.take(message, batch_size > 1, &owned));
            }
            while batch.len() < batch_size {
                match queue.try_recv() {
                    Ok(Item::Record(message)) => batch.push(self.take(message, true, &owned)),
                    Ok(Item::End { partition, offset }) => end.seen = Some((partition, offset)),
                    Err(_) => break,
                }
            }
            if self.shutdown.is_cancelled() {
                return;
            }
            let head = batch[0].message.partition();
            partition = Some(head);
            metrics::record_in_hand(&self.settings.topic, head, Some(SystemTime::now()));
            self.record_transaction_size(batch.len());
            let done = {
                let applying = self.apply_taken(&mut batch);
                tokio::pin!(applying);
                loop {
                    let room = ahead.len() < look_ahead && !self.shutdown.is_cancelled();
                    tokio::select! {
                        biased;
                        done = &mut applying => break done,
                        Some(following) = queue.recv(), if room => match following {
                            Item::Record(following) => ahead.push_back(self.take(following, true, &owned)),
                            Item::End { partition, offset } => end.seen = Some((partition, offset)),
                        },
                    }
                }
            };
            match done {
                Done::Finished => {
                    let last = batch
                        .last()
                        .expect("a batch is never empty")
                        .message
                        .offset();
                    end.stored = end.stored.max(last + 1);
                    batch.clear();
                }
                Done::Abandoned => return,
            }
        }
    }

    /// The next record, waited for with every record before it finished: an end of the
    /// partition met meanwhile is stored then, as nothing before it is unfinished.
    async fn next_record(
        &self,
        queue: &mut mpsc::Receiver<Item>,
        end: &mut End,
    ) -> Option<OwnedMessage> {
        loop {
            if let Some((partition, offset)) = end.seen.take()
                && offset > end.stored
            {
                self.store_end(partition, offset);
                end.stored = offset;
            }
            match queue.recv().await? {
                Item::Record(message) => return Some(message),
                Item::End { partition, offset } => end.seen = Some((partition, offset)),
            }
        }
    }

    /// Takes `message` in hand: its process span, and its prepare begun now if `ahead`,
    /// as one of `owned`'s tasks.
    fn take(&self, message: OwnedMessage, ahead: bool, owned: &Owned) -> Taken<H::Prepared> {
        let spans = Spans::of(&message, &self.settings.group_id, &self.applier);
        let ahead = if ahead {
            self.prepare_ahead(&message, &spans, owned)
        } else {
            None
        };
        Taken {
            message,
            spans,
            ahead,
        }
    }

    fn prepare_ahead(
        &self,
        message: &OwnedMessage,
        spans: &Spans,
        owned: &Owned,
    ) -> Ahead<H::Prepared> {
        let envelope = event_of(message, spans).ok()?;
        let applier = self.applier.clone();
        Some(self.tasks.spawn(owned.task(spans.around(async move {
            let step = applier.prepare(&envelope).await;
            (envelope, step)
        }))))
    }

    /// Applies `batch`: in one transaction if it holds more than one record, and if that
    /// does not commit (nothing of it did), one record at a time. Its offsets are stored.
    async fn apply_taken(&self, batch: &mut [Taken<H::Prepared>]) -> Done {
        if batch.len() > 1 {
            match self.process_batch(batch).await {
                Batch::Committed => {
                    failpoint::crash_point_for(failpoint::CONSUMER_AFTER_HANDLER, batch.len());
                    self.store_offset(&batch.last().expect("a batch is never empty").message);
                    return Done::Finished;
                }
                Batch::RolledBack => {}
                Batch::Abandoned => return Done::Abandoned,
            }
        }
        for taken in batch.iter_mut() {
            if self.shutdown.is_cancelled() {
                return Done::Abandoned;
            }
            let processed = self.process(&taken.message, &taken.spans, taken.ahead.take());
            match taken.spans.around(processed).await {
                Done::Finished => self.finished(&taken.message),
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
        if batch.iter().any(|taken| taken.ahead.is_none()) {
            return Batch::RolledBack;
        }
        let started = Instant::now();
        let _running = self.attempt_at(&batch[0].message);
        let mut events = Vec::with_capacity(batch.len());
        let mut steps = Vec::with_capacity(batch.len());
        let mut failed = None;
        // Every prepare is awaited, a failed one or not, so that none is left running
        // while the batch's records are prepared again.
        for taken in batch.iter_mut() {
            let task = taken.ahead.take().expect("checked above");
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
                for (taken, (event, outcome)) in batch.iter().zip(events.iter().zip(outcomes)) {
                    self.count(&event.event_type, outcome.as_str());
                    let hop = &taken.spans.hop;
                    hop.outcome(outcome.as_str());
                    hop.set("messaging.batch.message_count", batch.len() as i64);
                    taken.spans.log.in_scope(|| {
                        tracing::info!(target: LOG_TARGET,
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
                let first = &batch[0].message;
                tracing::info!(target: LOG_TARGET,
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
    async fn process(
        &self,
        message: &OwnedMessage,
        spans: &Spans,
        ahead: Ahead<H::Prepared>,
    ) -> Done {
        let (envelope, mut prepared) = match ahead {
            // Awaiting what was prepared ahead is part of the first attempt.
            Some(task) => {
                let _running = self.attempt_at(message);
                match joined(task).await {
                    Some((envelope, step)) => (envelope, Some(step)),
                    None => return Done::Abandoned,
                }
            }
            None => match event_of(message, spans) {
                Ok(envelope) => (envelope, None),
                Err(error) => {
                    let failure = Failure::malformed(error.to_string());
                    spans.hop.outcome("dead_lettered");
                    return self.dead_letter(message, None, failure).await;
                }
            },
        };
        let first_failure = OffsetDateTime::now_utc();
        let mut delays = backoff::backoff();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let started = Instant::now();
            let running = self.attempt_at(message);
            let applied = match prepared.take() {
                Some(Ok(step)) => self.applier.apply_prepared(&envelope, step).await,
                Some(Err(error)) => Err(error),
                None => self.applier.apply(&envelope).await,
            };
            self.time_handler(started);
            drop(running);
            let error = match applied {
                Ok(outcome) => {
                    self.count(&envelope.event_type, outcome.as_str());
                    spans.hop.outcome(outcome.as_str());
                    tracing::info!(target: LOG_TARGET,
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
                let failure = Failure::given_up(error.to_string(), retry, attempt, first_failure);
                spans.hop.outcome("dead_lettered");
                spans.hop.failed(&error);
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
            tracing::warn!(target: LOG_TARGET, attempt, %error, retry_in = ?delay, "handler failed; retrying");
            if !self.pause(delay).await {
                return Done::Abandoned;
            }
        }
    }

    /// An attempt at `message` (or the batch it begins) under way, for `/livez`.
    fn attempt_at(&self, message: &OwnedMessage) -> crate::probes::Attempt {
        (self.settings.progress).attempt(format!(
            "consumer {}[{}]",
            message.topic(),
            message.partition()
        ))
    }

    /// Counts what became of one record.
    pub(super) fn count(&self, event_type: &str, outcome: &'static str) {
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

    /// Sleeps for `delay`; false if the service began stopping meanwhile.
    pub(super) async fn pause(&self, delay: Duration) -> bool {
        tokio::select! {
            _ = self.shutdown.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }
}
