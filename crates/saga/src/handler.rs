//! What a consumer asks of the code that applies an event, and what it gets back.
//!
//! A handler applies an event in three steps: it decodes the event (no database), prepares
//! what must happen outside any transaction (a call to another system, which no rollback
//! could undo), and applies it inside a database transaction it is handed. It says how it
//! went ([`Outcome`]), or fails with a [`HandlerError`] whose [`Retry`] class decides what
//! the consumer does next: retry with backoff, retry a few times, or dead-letter at once.
//! [`Applier`] owns the transactions: one per event, or one per batch of a partition's
//! events.

use std::future::Future;

use deadpool_postgres::Pool;
use futures::future::join_all;
use tracing::Instrument;

use crate::envelope::{Envelope, EnvelopeError};
use crate::failpoint;
use crate::local_relay::LocalRelay;
use crate::retry::{Retry, classify_postgres};
use crate::transaction::Transaction;

/// What applying one event did. Every variant means "done": the offset may be committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The event changed state (and usually wrote an outbox row).
    Applied,
    /// Guard 1: the event id was already in `processed_events`; nothing was touched.
    Duplicate,
    /// Guard 2: the aggregate was already past the point this event could change; the
    /// event id was recorded, nothing else.
    Guarded,
    /// A known event type this consumer has no business with (e.g. `order.created` seen
    /// by notification-service on the shared `orders` topic).
    Ignored,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Applied => "applied",
            Outcome::Duplicate => "duplicate",
            Outcome::Guarded => "guarded",
            Outcome::Ignored => "ignored",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// The event can never be applied, however often it is retried: unknown type, a
    /// payload that does not decode, an order that does not exist.
    #[error("{0}")]
    Rejected(String),
    #[error("database: {}", crate::db::describe(.0))]
    Database(#[from] tokio_postgres::Error),
    #[error("database pool: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    /// Another system the handler calls is down, slow or overloaded, or its answer was
    /// lost: it is asked again, the same way, until it answers.
    #[error("{0}")]
    Unavailable(String),
    /// What [`Handler::prepare`] learnt is out of date by the time the transaction looked
    /// (a charge committed since, say): nothing is committed, and the event is prepared
    /// again, from what is committed now.
    #[error("{0}")]
    Stale(String),
}

impl From<EnvelopeError> for HandlerError {
    fn from(error: EnvelopeError) -> Self {
        HandlerError::Rejected(error.to_string())
    }
}

impl HandlerError {
    pub fn rejected(reason: impl Into<String>) -> Self {
        HandlerError::Rejected(reason.into())
    }

    /// What failed, as a metric's label.
    pub fn kind(&self) -> &'static str {
        match self {
            HandlerError::Rejected(_) => "rejected",
            HandlerError::Database(_) => "database",
            HandlerError::Pool(_) => "pool",
            HandlerError::Unavailable(_) => "unavailable",
            HandlerError::Stale(_) => "stale",
        }
    }

    pub fn retry(&self) -> Retry {
        match self {
            HandlerError::Rejected(_) => Retry::Never,
            HandlerError::Pool(_) | HandlerError::Unavailable(_) | HandlerError::Stale(_) => {
                Retry::UntilItWorks
            }
            HandlerError::Database(error) => classify_postgres(error),
        }
    }
}

/// What [`Handler::prepare`] decided.
#[derive(Debug)]
pub enum Step<T> {
    /// Apply this in the transaction.
    Apply(T),
    /// The event is done without a transaction (a duplicate known before any call).
    Done(Outcome),
}

/// Applies events of one topic. A handler is split in three so the caller owns the
/// transaction: [`decode`](Handler::decode) reads the event alone (no database),
/// [`prepare`](Handler::prepare) does what must happen before the transaction and outside
/// it, and [`apply`](Handler::apply) runs the guards and the state change inside a
/// transaction it is handed. That lets [`Applier`] run one event per transaction, or
/// several events of a partition in one, with the same handler code.
pub trait Handler: Send + Sync + 'static {
    /// What an event asks of this consumer, once read and checked.
    type Command: Send + Sync;
    /// What [`apply`](Handler::apply) is handed: the command, and whatever
    /// [`prepare`](Handler::prepare) learnt. The command itself when nothing leaves the
    /// database.
    type Prepared: Send + Sync;

    /// Whether events of `event_type` are of this consumer's topic but another
    /// consumer's: [`decode`](Handler::decode) answers `Ok(None)` for them whatever they
    /// hold, and the consumer makes them no process span ([`crate::trace`] says why),
    /// reading the type from the record's `event_type` header. `false` by default.
    fn ignores(&self, _event_type: &str) -> bool {
        false
    }

    /// `Ok(None)` for an event this consumer has no business with; [`HandlerError::Rejected`]
    /// for one it can never apply (unknown type, a payload that does not decode).
    fn decode(&self, event: &Envelope) -> Result<Option<Self::Command>, HandlerError>;

    /// Runs before the transaction opens, holding no connection while it waits on anything
    /// else: the place for a call to another system, whose effect no rollback undoes. Such
    /// a call may therefore happen more than once for one event (a crash or a failed
    /// commit after it, a redelivery, a retry), so it must be one the other side makes
    /// idempotent, with a key derived from the event. It may read `pool` first, so that a
    /// known duplicate makes no call at all; as a shortcut only, since the consumer runs
    /// it while the event before it in the partition may still be applied. An error is
    /// retried like any other: the whole event again, `prepare` included.
    fn prepare(
        &self,
        pool: &Pool,
        event: &Envelope,
        command: Self::Command,
    ) -> impl Future<Output = Result<Step<Self::Prepared>, HandlerError>> + Send;

    /// Guard 1 (the event id into `processed_events`), guard 2 (the aggregate's state,
    /// locked), then the state change and its outbox row. The caller commits when this
    /// returns `Ok`, whatever the outcome (a duplicate or guarded event's id stays
    /// recorded), and rolls back on `Err`.
    fn apply(
        &self,
        tx: &Transaction<'_>,
        event: &Envelope,
        prepared: Self::Prepared,
    ) -> impl Future<Output = Result<Outcome, HandlerError>> + Send;
}

/// A handler and the pool its transactions run on.
pub struct Applier<H> {
    pool: Pool,
    handler: H,
    /// The outbox relay the transactions run beside ([`Transaction::waking`]).
    relay: Option<LocalRelay>,
}

impl<H: Handler> Applier<H> {
    pub fn new(pool: Pool, handler: H) -> Self {
        Self {
            pool,
            handler,
            relay: None,
        }
    }

    /// Whether its handler [ignores](Handler::ignores) events of `event_type`.
    pub fn ignores(&self, event_type: &str) -> bool {
        self.handler.ignores(event_type)
    }

    /// Runs the transactions beside `relay`, this process's outbox relay.
    pub fn waking(mut self, relay: LocalRelay) -> Self {
        self.relay = Some(relay);
        self
    }

    /// Applies `event` in a transaction of its own.
    pub async fn apply(&self, event: &Envelope) -> Result<Outcome, HandlerError> {
        let step = self.prepare(event).await?;
        self.apply_prepared(event, step).await
    }

    /// What of [`apply`](Self::apply) happens before the transaction: the event decoded
    /// and [prepared](Handler::prepare). The consumer runs it for a partition's next event
    /// while this one's transaction is under way.
    pub async fn prepare(&self, event: &Envelope) -> Result<Step<H::Prepared>, HandlerError> {
        match self.handler.decode(event)? {
            Some(command) => self.handler.prepare(&self.pool, event, command).await,
            None => Ok(Step::Done(Outcome::Ignored)),
        }
    }

    /// The rest of [`apply`](Self::apply): `step`, from [`prepare`](Self::prepare) of the
    /// same event, applied in a transaction of its own.
    pub async fn apply_prepared(
        &self,
        event: &Envelope,
        step: Step<H::Prepared>,
    ) -> Result<Outcome, HandlerError> {
        let prepared = match step {
            Step::Apply(prepared) => prepared,
            Step::Done(outcome) => return Ok(outcome),
        };
        let client = self.pool.get().await?;
        let tx = Transaction::begin(&client).waking(self.relay.as_ref());
        let outcome = self.handler.apply(&tx, event, prepared).await?;
        failpoint::crash_point(failpoint::HANDLER_BEFORE_COMMIT);
        tx.commit().await?;
        Ok(outcome)
    }

    /// Applies `events` (one partition's, in offset order) in one transaction: one
    /// commit, so one WAL flush, for all of them. Each is still deduplicated and guarded
    /// on its own, in order, so a later event sees what an earlier one of the batch did.
    /// All or nothing: an error, from any event, rolls the whole batch back and names no
    /// event; the caller applies them one at a time to find it.
    ///
    /// The events are prepared together before the transaction opens, each seeing only
    /// what was committed before the batch: a remote call per event need not wait for the
    /// one before it. Each runs to its end even when another fails, so that no call is
    /// cut off half way (its answer lost to us, its effect perhaps made) for nothing.
    pub async fn apply_batch(&self, events: &[Envelope]) -> Result<Vec<Outcome>, HandlerError> {
        let steps = join_all(events.iter().map(|event| self.prepare(event)))
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        self.apply_prepared_batch(events, steps).await
    }

    /// The rest of [`apply_batch`](Self::apply_batch): `steps`, from
    /// [`prepare`](Self::prepare) of each of `events` in turn, applied in one transaction.
    pub async fn apply_prepared_batch(
        &self,
        events: &[Envelope],
        steps: Vec<Step<H::Prepared>>,
    ) -> Result<Vec<Outcome>, HandlerError> {
        assert_eq!(events.len(), steps.len(), "a step for every event");
        // Nothing to apply (every event ignored, or done before its call): no transaction.
        let done = steps
            .iter()
            .map(|step| match step {
                Step::Done(outcome) => Some(*outcome),
                Step::Apply(_) => None,
            })
            .collect::<Option<Vec<_>>>();
        if let Some(outcomes) = done {
            return Ok(outcomes);
        }
        let to_apply = steps
            .iter()
            .filter(|step| matches!(step, Step::Apply(_)))
            .count();
        let mut outcomes = Vec::with_capacity(events.len());
        let client = self.pool.get().await?;
        let tx = Transaction::begin(&client).waking(self.relay.as_ref());
        for (event, step) in events.iter().zip(steps) {
            outcomes.push(match step {
                // In its own record's span, so that what it writes to the outbox continues
                // its own trace, not the batch's first.
                Step::Apply(prepared) => {
                    let applied = self.handler.apply(&tx, event, prepared);
                    let delivery = &event.delivery;
                    let applied = applied.instrument(delivery.span.clone());
                    delivery.hop.scope(applied).await?
                }
                Step::Done(outcome) => outcome,
            });
        }
        failpoint::crash_point_for(failpoint::HANDLER_BEFORE_COMMIT, to_apply);
        tx.commit().await?;
        Ok(outcomes)
    }
}

/// Two handlers of one topic, each applying its own event types: an event goes to the
/// first whose [`decode`](Handler::decode) takes it. Each must know every type of the
/// topic, answering `Ok(None)` for the other's and rejecting any type the topic does not
/// carry, so that an unknown type is dead-lettered whichever decodes first.
pub struct Pair<A, B>(pub A, pub B);

/// What [`Pair`] hands on: the first handler's, or the second's.
#[derive(Debug)]
pub enum Either<L, R> {
    First(L),
    Second(R),
}

impl<A: Handler, B: Handler> Handler for Pair<A, B> {
    type Command = Either<A::Command, B::Command>;
    type Prepared = Either<A::Prepared, B::Prepared>;

    fn ignores(&self, event_type: &str) -> bool {
        self.0.ignores(event_type) && self.1.ignores(event_type)
    }

    fn decode(&self, event: &Envelope) -> Result<Option<Self::Command>, HandlerError> {
        if let Some(command) = self.0.decode(event)? {
            return Ok(Some(Either::First(command)));
        }
        Ok(self.1.decode(event)?.map(Either::Second))
    }

    async fn prepare(
        &self,
        pool: &Pool,
        event: &Envelope,
        command: Self::Command,
    ) -> Result<Step<Self::Prepared>, HandlerError> {
        Ok(match command {
            Either::First(command) => match self.0.prepare(pool, event, command).await? {
                Step::Apply(prepared) => Step::Apply(Either::First(prepared)),
                Step::Done(outcome) => Step::Done(outcome),
            },
            Either::Second(command) => match self.1.prepare(pool, event, command).await? {
                Step::Apply(prepared) => Step::Apply(Either::Second(prepared)),
                Step::Done(outcome) => Step::Done(outcome),
            },
        })
    }

    async fn apply(
        &self,
        tx: &Transaction<'_>,
        event: &Envelope,
        prepared: Self::Prepared,
    ) -> Result<Outcome, HandlerError> {
        match prepared {
            Either::First(prepared) => self.0.apply(tx, event, prepared).await,
            Either::Second(prepared) => self.1.apply(tx, event, prepared).await,
        }
    }
}
