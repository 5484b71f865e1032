//! Failpoints: the exact places where the fault suite (`crates/e2e/tests/faults.rs`) and the
//! end-to-end tests make a service die, to prove that a crash there loses nothing and
//! applies nothing twice.
//!
//! - [`CONSUMER_AFTER_HANDLER`]: the handler's transaction committed, the offset is not
//!   stored yet. The record is redelivered; the inbox absorbs it.
//! - [`RELAY_AFTER_ACK`]: the broker acknowledged a batch, the rows are not marked
//!   published yet. The batch is published again; the consumers' inboxes absorb it.
//! - [`HANDLER_BEFORE_COMMIT`]: inside the transaction of an event (or of a batch), once
//!   the handler has written the state change and the outbox row, before `COMMIT`. The
//!   transaction dies with the process: nothing of it is applied, and the redelivered
//!   records apply it whole.
//! - [`API_BEFORE_COMMIT`]: inside the transaction of `POST /v1/orders`, once the order,
//!   its `order.created` row and its idempotency key are written, before `COMMIT`. The
//!   client gets no answer and retries; with the same key it places the order once.
//! - [`RELAY_BEFORE_SEND`]: not a crash but a freeze (SIGSTOP, sent by the process to
//!   itself) of the relay between its check that it still holds the lease and its send:
//!   the window in which a holder that stopped, and was thawed after a standby took
//!   over, would publish a stale batch. Kafka fences it: the standby's
//!   `init_transactions` made its producer's epoch stale.
//!
//! Four are not crashes but bugs on purpose, to show what a guard is for:
//! [`FRESH_CHARGE_KEY`] makes payment-service send a new idempotency key on every call to
//! the card provider, so that a lost answer followed by the retry charges twice,
//! [`FRESH_REFUND_KEY`] does the same to its refunds, so that a lost refund's retry
//! refunds twice, [`LIST_DECIDES`] brings back a cancellation that trusts the provider's
//! list of charges, so that a charge still committing is never refunded, and
//! [`RELAY_ACKS_ONE`] makes a relay trust a partition's leader alone (its transactions,
//! which need every in-sync replica, turned off with it), so that on a cluster a leader's
//! death loses a published event; the fault suite's checker must say so.
//!
//! They are off unless the `FAILPOINTS` environment variable arms them when the service
//! starts, in the syntax of the `fail` crate: `name=actions;name=actions`. The action
//! that matters is `return`, which **aborts the process** (SIGABRT: no destructors, no
//! flush, no offset commit, as abrupt as SIGKILL). A `panic` would not do: in a tokio task
//! it ends the task, not the process. A count picks the hit:
//! `FAILPOINTS='consumer.after-handler=40*off->return'` lets 40 hits pass and aborts the
//! process at the 41st. A batch (a consumer's records, a relay's rows) counts one hit per
//! record ([`crash_point_for`]), so a count means the same whatever the batch sizes.
//!
//! An unarmed failpoint costs a read lock and a hash lookup, next to the database round
//! trips each one sits beside.

/// The handler's transaction committed; the record's offset is not stored yet.
pub const CONSUMER_AFTER_HANDLER: &str = "consumer.after-handler";
/// The broker acknowledged an outbox batch; its rows are not marked published yet.
pub const RELAY_AFTER_ACK: &str = "relay.after-ack";
/// In an event's (or a batch's) transaction, after the handler's writes, before commit.
pub const HANDLER_BEFORE_COMMIT: &str = "handler.before-commit";

/// In the transaction of an order placed over HTTP, after its writes, before commit.
pub const API_BEFORE_COMMIT: &str = "api.before-commit";

/// The relay has checked its lease and read a batch; it has not sent it yet. Armed
/// (`return`), the process freezes itself here ([`freeze_point`]).
pub const RELAY_BEFORE_SEND: &str = "relay.before-send";

/// Not a crash: while armed (`return`), payment-service sends a fresh idempotency key on
/// each call to the provider instead of the order's one.
pub const FRESH_CHARGE_KEY: &str = "charge.fresh-key";

/// Not a crash: while armed (`return`), payment-service sends a fresh idempotency key on
/// each refund it asks the provider for instead of the order's one.
pub const FRESH_REFUND_KEY: &str = "refund.fresh-key";

/// Not a crash: while armed (`return`), a cancellation that meets an undecided charge
/// lists the order's charges at the provider and reads an empty list as "nothing
/// charged", instead of asking for the charge again under its key. The list does not show
/// a charge still committing, so a refund is lost; the fault suite's checker must say so.
pub const LIST_DECIDES: &str = "refund.list-decides";

/// Not a crash: armed (`return`) when a relay starts, its producer takes a write as
/// acknowledged once the partition's leader has it (`acks=1`, idempotence off) instead of
/// once the in-sync replicas do, so that a leader dying before its followers copied a
/// record loses it after the relay marked its row published.
pub const RELAY_ACKS_ONE: &str = "relay.acks-one";

const ALL: [&str; 9] = [
    CONSUMER_AFTER_HANDLER,
    RELAY_AFTER_ACK,
    RELAY_BEFORE_SEND,
    HANDLER_BEFORE_COMMIT,
    API_BEFORE_COMMIT,
    FRESH_CHARGE_KEY,
    FRESH_REFUND_KEY,
    LIST_DECIDES,
    RELAY_ACKS_ONE,
];

/// Arms the failpoints that `FAILPOINTS` names. An unknown name or a malformed action is
/// an error, so a typo cannot silently leave a fault test without its fault.
pub fn arm_from_env() -> anyhow::Result<()> {
    let Ok(spec) = std::env::var("FAILPOINTS") else {
        return Ok(());
    };
    arm(&spec)
}

/// Arms the failpoints of `spec` (`name=actions;name=actions`).
pub fn arm(spec: &str) -> anyhow::Result<()> {
    for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((name, actions)) = entry.split_once('=') else {
            anyhow::bail!("FAILPOINTS entry `{entry}` is not name=actions");
        };
        let name = name.trim();
        if !ALL.contains(&name) {
            anyhow::bail!("FAILPOINTS names `{name}`, which is none of {ALL:?}");
        }
        fail::cfg(name, actions.trim())
            .map_err(|error| anyhow::anyhow!("FAILPOINTS `{entry}`: {error}"))?;
        tracing::warn!(
            failpoint = name,
            actions,
            "failpoint armed: this process misbehaves on purpose"
        );
    }
    Ok(())
}

/// Aborts the process here if the failpoint `name` is armed and its actions say `return`
/// for this hit.
pub fn crash_point(name: &str) {
    fail::fail_point!(name, |_| {
        tracing::error!(failpoint = name, "failpoint reached: aborting the process");
        std::process::abort()
    });
}

/// Stops the process here (SIGSTOP to itself) if the failpoint `name` is armed and its
/// actions say `return` for this hit: a freeze at an exact place, which whoever armed it
/// ends with SIGCONT.
pub fn freeze_point(name: &str) {
    if fires(name) {
        tracing::error!(failpoint = name, "failpoint reached: freezing the process");
        let pid = std::process::id().to_string();
        if let Err(error) = std::process::Command::new("kill")
            .args(["-STOP", &pid])
            .status()
        {
            tracing::error!(failpoint = name, %error, "could not freeze the process");
        }
    }
}

/// Whether the failpoint `name` is armed and its actions say `return` for this hit: for
/// the failpoints that change behaviour instead of crashing.
pub fn fires(name: &str) -> bool {
    fail::eval(name, |_| ()).is_some()
}

/// [`crash_point`] for `records` records passing `name` together (a consumer's batch,
/// a relay's acknowledged rows): one hit each.
pub fn crash_point_for(name: &str, records: usize) {
    for _ in 0..records {
        crash_point(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelt_failpoint_is_refused_naming_the_known_ones() {
        let error = arm("consumer.after-handlr=return").unwrap_err().to_string();
        assert!(error.contains("consumer.after-handlr"), "{error}");
        assert!(error.contains(CONSUMER_AFTER_HANDLER), "{error}");
    }

    #[test]
    fn a_malformed_entry_or_action_is_refused() {
        assert!(arm("relay.after-ack").is_err());
        assert!(arm("relay.after-ack=explode").is_err());
    }

    #[test]
    fn an_empty_spec_arms_nothing() {
        arm(" ; ").unwrap();
        crash_point(CONSUMER_AFTER_HANDLER);
    }
}
