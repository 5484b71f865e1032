//! What a consumer asks of the code that applies an event, and what it gets back.
//!
//! A handler applies one event in one database transaction and says how it went
//! ([`Outcome`]), or fails with a [`HandlerError`] whose [`Retry`] class decides what the
//! consumer does next: retry with backoff, retry a few times, or dead-letter at once.

use std::future::Future;

use crate::envelope::{Envelope, EnvelopeError};

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
    #[error("database: {}", describe(.0))]
    Database(#[from] tokio_postgres::Error),
    #[error("database pool: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
}

impl From<EnvelopeError> for HandlerError {
    fn from(error: EnvelopeError) -> Self {
        HandlerError::Rejected(error.to_string())
    }
}

/// How a failure is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// The world is briefly broken (database down, serialization conflict): retry with
    /// backoff for as long as it takes; never skip the event.
    UntilItWorks,
    /// Unexpected, possibly permanent (a constraint the code did not foresee): retry a
    /// few times in case it is not, then dead-letter.
    AFewTimes,
    /// Dead-letter at once.
    Never,
}

impl HandlerError {
    pub fn rejected(reason: impl Into<String>) -> Self {
        HandlerError::Rejected(reason.into())
    }

    pub fn retry(&self) -> Retry {
        match self {
            HandlerError::Rejected(_) => Retry::Never,
            HandlerError::Pool(_) => Retry::UntilItWorks,
            HandlerError::Database(error) => classify_postgres(error),
        }
    }
}

/// The server's own message and SQLSTATE, or the I/O cause: tokio-postgres's `Display`
/// says only "db error", which tells an operator reading a dead letter nothing.
fn describe(error: &tokio_postgres::Error) -> String {
    if let Some(db) = error.as_db_error() {
        return format!("{db} (SQLSTATE {})", db.code().code());
    }
    match std::error::Error::source(error) {
        Some(cause) => format!("{error}: {cause}"),
        None => error.to_string(),
    }
}

/// Sorts PostgreSQL errors by SQLSTATE class: connection loss, conflicts and a server
/// that is shutting down or out of resources heal by themselves; anything else is a
/// surprise. The order API uses it too, to answer 503 rather than 500.
pub fn classify_postgres(error: &tokio_postgres::Error) -> Retry {
    let Some(state) = error.code() else {
        // No SQLSTATE: the connection broke or closed under us.
        return Retry::UntilItWorks;
    };
    match &state.code()[..2] {
        // connection exception, transaction rollback (serialization, deadlock),
        // insufficient resources, operator intervention (admin shutdown), system error
        "08" | "40" | "53" | "57" | "58" => Retry::UntilItWorks,
        _ if state == &tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE => Retry::UntilItWorks,
        _ => Retry::AFewTimes,
    }
}

/// Applies events of one topic. Implementations run each event in one transaction:
/// dedupe insert into `processed_events`, `SELECT … FOR UPDATE` on the aggregate, state
/// change plus outbox row, commit.
pub trait Handler: Send + Sync + 'static {
    fn handle(
        &self,
        event: &Envelope,
    ) -> impl Future<Output = Result<Outcome, HandlerError>> + Send;
}
