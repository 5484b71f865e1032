//! What must hold after any fault, checked from the outside: the databases (the three
//! services' and the card provider's), the topics, and the services' own logs. [`check`]
//! waits until the saga is quiet, then collects every violation rather than stopping at
//! the first, and counts what it saw for the scenario's report.
//!
//! Each order has one of three stories: confirmed; declined (its payment failed, and
//! order-service cancelled it); or cancelled by the customer or the deadline, before or
//! after its payment's outcome. The invariants:
//! - **Every order settled, as its story wants**: none is `pending` or unsettled
//!   (`settled_at` unset) once the saga is quiet; confirmed within the payment limit,
//!   declined past it; no order the API accepted is missing, none is there twice (every
//!   order offered was placed once, its retries, each with the order's
//!   `Idempotency-Key`, given it back), and the orders cancelled by the customer are
//!   exactly those whose cancellation the API accepted.
//! - **Exactly the events of its story, each once**: order-service's `order.created`, the
//!   payment's outcome (none for an order cancelled before its payment came), the
//!   cancellation, `order.refunded` for a refunded order; payment-service's one payment
//!   row (a tombstone, `voided`, for an order cancelled before its charge was asked for),
//!   its result, and one answer per cancellation, `payment.refunded`, `payment.voided`
//!   or `payment.refund_failed` (one per failed attempt); every outbox row published.
//! - **The money** (the one effect no rollback of ours can undo): per order, charged at
//!   most once at the provider, for its amount; each charge refunded at most once, in
//!   full, and only one that succeeded; charged minus refunded is the amount for a confirmed order
//!   and 0 for every cancelled one, or the amount with the refund's failure visible (the
//!   payment `failed` or `manual`, the order showing why); no payment undecided at rest
//!   (`charging`, `unknown`, `refunding`); the payment holds the provider's charge and
//!   refund, the order the same refund; no charge made after a tombstone that was not
//!   refunded; and no charge for an order the saga never saw.
//! - **Notifications match the story**: one per order and kind, each from the event
//!   that tells it (`confirmed`/`declined` from the outcome, `cancelled_by_customer`/
//!   `cancelled_for_timeout` from the cancellation, `refunded` from `order.refunded`),
//!   nothing else, and one `notification.sent` each.
//! - **The inbox agrees with the logs**: every event logged as applied or guarded is in
//!   its service's `processed_events`, every id there was logged as handled, and no event
//!   passed guard 1 twice (a redelivery must be stopped as a duplicate).
//! - **No record skipped**: for each consumer group, every record of its topic (as a
//!   reader of committed records finds them: a relay's transaction markers are offsets,
//!   not records) was handled (logged `event handled` in its
//!   `record{topic partition offset}` span) or dead-lettered (a record in the group's
//!   dead-letter topic with that `dlq.original.partition`/`dlq.original.offset`).
//! - **Dead letters are exactly the poison**: every poison record is in the dead-letter
//!   topic of every group it is poison for, with its reason; nothing else is.

mod cancellations;
mod charges;
mod databases;
mod effects;
mod inboxes;
mod log;
mod notifications;
mod orders;
mod records;
mod report;

use std::collections::BTreeMap;
use std::time::Duration;

use saga_testkit::eventually;
use uuid::Uuid;

use crate::{SERVICES, Stack};
use databases::Databases;
use inboxes::check_inboxes;
use log::HandledLog;
use orders::check_orders;
use records::check_records;

pub use effects::{effects, half_applied};
pub use log::{count_in_logs, outcomes_by_event};

/// The provider's default limit: above it, a charge is declined and the order cancelled.
pub const PAYMENT_LIMIT_CENTS: i64 = 100_000;

/// What a scenario expects beyond the invariants every scenario shares.
#[derive(Debug, Default)]
pub struct Expected {
    /// The orders the API accepted: none may be lost.
    pub accepted: Vec<Uuid>,
    /// How many orders were offered, each under an `Idempotency-Key` kept across its
    /// retries: the database must hold exactly that many.
    pub offered: Option<usize>,
    /// The services pruned their inboxes as they went (a window of seconds): an id may be
    /// gone from `processed_events`, and a copy of an event may pass guard 1 again once
    /// its id is gone, to be stopped by guard 2. Once applied, still, and only once.
    pub inbox_pruned: bool,
    /// Records produced on purpose that can never be applied.
    pub poison: Vec<Poison>,
    /// The orders whose cancellation the API accepted: exactly these are cancelled by
    /// the customer. `None` when the scenario does not say.
    pub cancelled: Option<Vec<Uuid>>,
}

/// A record that can never be applied, and where it must end up.
#[derive(Debug, Clone)]
pub struct Poison {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// The services that must dead-letter it: a record can be poison to one consumer of
    /// a topic and none of another's business (an `order.created` with a bad payload
    /// means nothing to notification-service, which ignores that type).
    pub rejected_by: Vec<&'static str>,
    /// What its `dlq.reason` header must contain.
    pub reason: String,
}

/// What one consumer group did with its topic.
#[derive(Debug, Default)]
pub struct GroupTally {
    pub service: &'static str,
    pub topic: String,
    /// Records in the topic: the sum of its partitions' end offsets.
    pub records: i64,
    /// Distinct offsets logged as handled.
    pub handled: usize,
    /// `event handled` lines: more than `handled` when records were redelivered.
    pub deliveries: usize,
    /// Distinct offsets in the dead-letter topic.
    pub dead_lettered: usize,
    /// `(partition, offset)` neither handled nor dead-lettered.
    pub skipped: Vec<(i32, i64)>,
    /// `outcome` of the `event handled` lines: applied, duplicate, guarded, ignored.
    pub outcomes: BTreeMap<String, usize>,
}

impl GroupTally {
    pub fn outcome(&self, name: &str) -> usize {
        self.outcomes.get(name).copied().unwrap_or(0)
    }
}

/// Everything [`check`] found.
#[derive(Debug, Default)]
pub struct Findings {
    pub orders: usize,
    pub confirmed: usize,
    /// Declined, or cancelled by the customer or the deadline.
    pub cancelled: usize,
    pub pending: usize,
    /// Orders cancelled by the customer or the deadline.
    pub cancellations: usize,
    /// Of those, answered with a refund.
    pub refunded: usize,
    /// Of those, answered with a refund that failed, visibly (`payment.refund_failed`,
    /// the order showing why): charged still, waiting for a person.
    pub refund_failed: usize,
    /// Of those, answered with a void: nothing was charged, or the charge declined.
    pub voided: usize,
    /// Charges and refunds at the provider, for the saga's orders.
    pub charges: usize,
    pub refunds: usize,
    pub groups: Vec<GroupTally>,
    /// Accepted orders missing, orders without their payment, outcome or notification,
    /// and records skipped.
    pub lost: usize,
    /// Orders with a second payment, outcome or notification, and events that passed the
    /// dedupe guard twice.
    pub applied_twice: usize,
    /// Orders charged more than once at the provider, and charges for orders the saga
    /// never saw.
    pub charged_twice: usize,
    /// Orders with a charge refunded more than once at the provider.
    pub refunded_twice: usize,
    /// What the provider counted (`GET /admin/stats`): calls, replays, lost responses.
    pub provider: serde_json::Value,
    pub poison_dead_lettered: usize,
    pub violations: Vec<String>,
}

impl Findings {
    /// Redeliveries stopped by guard 1 across the three services.
    pub fn duplicates(&self) -> usize {
        self.groups.iter().map(|g| g.outcome("duplicate")).sum()
    }

    /// Different events for decided aggregates stopped by guard 2.
    pub fn guarded(&self) -> usize {
        self.groups.iter().map(|g| g.outcome("guarded")).sum()
    }

    pub fn redelivered(&self) -> usize {
        self.groups.iter().map(|g| g.deliveries - g.handled).sum()
    }

    fn violate(&mut self, violation: String) {
        self.violations.push(violation);
    }
}

/// True once nothing is in flight: every outbox row is published, every group has
/// committed the end of its topic, and no outbox row appeared meanwhile (a handler that
/// ran between the two looks would have added one).
pub async fn quiet(stack: &Stack) -> bool {
    let before = outbox_counts(stack).await;
    if before.iter().any(|(_, unpublished)| *unpublished > 0) {
        return false;
    }
    for service in SERVICES {
        let (group, topic, _) = stack.subscription(service);
        if !stack.kafka.group_caught_up(&group, &topic).await {
            return false;
        }
    }
    outbox_counts(stack).await == before
}

/// Waits up to `timeout` for [`quiet`]; false if it never was.
pub async fn wait_until_quiet(stack: &Stack, timeout: Duration) -> bool {
    tokio::time::timeout(
        timeout,
        // The outer timeout ends the wait first: here it is a finding, not a panic.
        eventually(timeout * 2, "the saga to go quiet", || async {
            quiet(stack).await.then_some(())
        }),
    )
    .await
    .is_ok()
}

/// Each service's outbox rows: (all, not yet published).
pub async fn outbox_counts(stack: &Stack) -> Vec<(i64, i64)> {
    let mut counts = Vec::new();
    for service in SERVICES {
        let row = stack
            .database(service)
            .client()
            .await
            .query_one(
                "SELECT count(*), count(*) FILTER (WHERE published_at IS NULL) FROM outbox",
                &[],
            )
            .await
            .expect("the outbox can be read");
        counts.push((row.get(0), row.get(1)));
    }
    counts
}

/// Waits (up to `timeout`) for the saga to go quiet, then checks every invariant.
pub async fn check(stack: &Stack, expected: &Expected, timeout: Duration) -> Findings {
    let mut findings = Findings::default();
    if !wait_until_quiet(stack, timeout).await {
        findings.violate(format!(
            "the saga did not go quiet within {timeout:?}: a record is stuck or an outbox row unpublished"
        ));
    }
    let db = Databases::read(stack).await;
    check_orders(&db, expected, &mut findings);
    let handled = HandledLog::read(stack);
    check_inboxes(&db, &handled, expected.inbox_pruned, &mut findings);
    check_records(stack, expected, &handled, &mut findings).await;
    findings.provider = stack.provider().stats().await;
    findings
}
