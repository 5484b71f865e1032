//! How a failure is retried, and which PostgreSQL errors heal by themselves.
//!
//! The consumer loop, the relay, the pools' start-up and the order API all ask the same
//! question of an error: wait and try again, or give up? The answer lives here, apart
//! from any of them, so that each can ask it.

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

impl Retry {
    pub fn as_str(self) -> &'static str {
        match self {
            Retry::UntilItWorks => "until_it_works",
            Retry::AFewTimes => "a_few_times",
            Retry::Never => "never",
        }
    }
}

/// Sorts PostgreSQL errors by SQLSTATE class: connection loss, conflicts and a server
/// that is shutting down or out of resources heal by themselves; anything else is a
/// surprise. The order API uses it too, to answer 503 rather than 500. A refused TLS
/// handshake has no SQLSTATE either: waited out like an outage once running (it is the
/// server's or the settings' doing, never the event's), refused at start-up by
/// [`crate::db::migrate_when_reachable`].
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
