//! The moving parts of a choreography saga that gets exactly-once *effects* out of
//! at-least-once delivery.
//!
//! - [`envelope`]: the wire format, and parse errors that say what is wrong.
//! - [`events`]: the event catalog: types, payloads, deterministic ids.
//! - [`handler`]: the [`Handler`] a service writes (decode; prepare, outside any
//!   transaction, for a call to another system; then guards and state change inside a
//!   transaction it is handed), the [`Applier`] that owns those transactions (one
//!   per event, or one per batch), and what applying returns ([`Outcome`]).
//! - [`retry`]: how a failure is retried ([`Retry`]), and which PostgreSQL errors heal by
//!   themselves.
//! - [`consumer`]: the loop: per-partition order, offset stored after the handler,
//!   optional batches, backoff, dead letters, graceful stop.
//! - [`transaction`]: the handlers' [`Transaction`], pipelined: `BEGIN` goes out with the
//!   first statement, and writes whose result nobody reads with the next one or `COMMIT`.
//! - [`inbox`]: guard 1, [`inbox::claim`], each handler's first statement: a redelivered
//!   event's id is found there and the event goes no further.
//! - [`outbox`]: [`outbox::enqueue`] inside the handler's transaction, and the
//!   [`OutboxRelay`] that publishes committed rows.
//! - [`local_relay`]: how a transaction wakes its own process's relay ([`LocalRelay`]),
//!   without PostgreSQL's NOTIFY.
//! - [`idempotency`]: the `Idempotency-Key` header, the request fingerprint and the
//!   replayed response, for an HTTP endpoint that makes a client's retry harmless.
//! - [`retention`]: the [`retention::Pruner`] that keeps the inbox, the outbox and the
//!   idempotency keys bounded, and the start-up check of the inbox's window against the
//!   topics' retention.
//! - [`lease`]: what makes the relay, the pruner and the deadline sweeper one per
//!   database, and how soon a standby takes over from a holder that froze or vanished.
//! - [`failpoint`]: where the fault suite makes a service die on purpose; off unless
//!   `FAILPOINTS` arms them.
//! - [`redrive`]: sends dead letters back to their topics once the cause is fixed (the
//!   `redrive-dlq` binary).
//! - [`trace`]: one order's trace across every service, W3C trace context carried through
//!   the outbox, Kafka headers and HTTP calls; exported by [`telemetry`].
//! - [`probes`]: `/livez` and `/readyz` for an orchestrator.
//! - [`db`], [`kafka`], [`config`], [`secrets`], [`telemetry`], [`shutdown`], [`http`],
//!   [`service`], [`binary`]: plumbing shared by the three services.
//!
//! What the saga does **not** promise: exactly-once delivery (every event may arrive
//! more than once, and the handlers make that harmless), or automatic rollback (a failed
//! order is moved *forward* to `cancelled`, not undone).

pub mod backoff;
pub mod binary;
pub mod config;
pub mod consumer;
pub mod db;
pub mod envelope;
pub mod events;
pub mod failpoint;
pub mod handler;
pub mod http;
pub mod https;
pub mod idempotency;
pub mod inbox;
pub mod kafka;
pub mod lease;
pub mod local_relay;
pub mod metrics;
pub mod outbox;
pub mod probes;
pub mod redrive;
pub mod retention;
pub mod retry;
pub mod secrets;
pub mod service;
pub mod shutdown;
pub mod telemetry;
pub mod trace;
pub mod transaction;

pub use envelope::{Delivery, Envelope, EnvelopeError};
pub use handler::{Applier, Handler, HandlerError, Outcome, Step};
pub use kafka::Topics;
pub use local_relay::LocalRelay;
pub use outbox::OutboxRelay;
pub use retry::Retry;
pub use transaction::Transaction;
