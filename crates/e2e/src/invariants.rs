//! What must hold after any fault, checked from the outside: the databases (the three
//! services' and the card provider's), the topics, and the services' own logs. [`check`] waits until the saga is quiet, then
//! collects every violation rather than stopping at the first, and counts what it saw
//! for the scenario's report.
//!
//! The invariants:
//! - **Every order reached exactly one terminal status**, the right one for its amount,
//!   and none is `pending` once the saga is quiet; no order the API accepted is missing,
//!   and none is there twice: every order offered was placed once, its retries (each
//!   with the order's `Idempotency-Key`) given it back.
//! - **One payment, one outcome event, one notification per order**, each matching the
//!   order's status, each announced by exactly one outbox row, every outbox row published.
//! - **One charge per order at the provider**, for the order's amount, succeeded for a
//!   confirmed order and declined for a cancelled one, its id the one the payment holds;
//!   and no charge for an order the saga never saw. The provider's charges are the one
//!   effect no rollback of ours can undo: a second one is a customer charged twice.
//! - **The inbox agrees with the logs**: every event logged as applied or guarded is in
//!   its service's `processed_events`, every id there was logged as handled, and no event
//!   passed guard 1 twice (a redelivery must be stopped as a duplicate).
//! - **No record skipped**: for each consumer group and each partition of its topic,
//!   every offset in `[0, end)` was handled (logged `event handled` in its
//!   `record{topic partition offset}` span) or dead-lettered (a record in the group's
//!   dead-letter topic with that `dlq.original.partition`/`dlq.original.offset`).
//! - **Dead letters are exactly the poison**: every poison record is in the dead-letter
//!   topic of every group it is poison for, with its reason; nothing else is.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use saga_testkit::{eventually, header};
use uuid::Uuid;

use crate::{PAYMENT_PROVIDER, SERVICES, Stack};

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
    pub cancelled: usize,
    pub pending: usize,
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

    /// Prints the scenario's report: what was injected, what was checked, what was
    /// absorbed. With `SAGA_FAULT_REPORT` set, also appends a row to that Markdown file.
    pub fn report(&self, scenario: &str, injected: &str) {
        let mut out = String::new();
        out.push_str(&format!("\n=== {scenario}\n"));
        out.push_str(&format!("injected   {injected}\n"));
        out.push_str(&format!(
            "checked    {} orders ({} confirmed, {} cancelled, {} pending) for: each offered order \
             placed once; one terminal status each, the right one; one payment, one outcome event, one notification each, matching; \
             every outbox row published; inboxes agree with the logs; no record skipped; dead \
             letters exactly the poison\n",
            self.orders, self.confirmed, self.cancelled, self.pending
        ));
        for g in &self.groups {
            out.push_str(&format!(
                "records    {} <- {}: {} records, {} handled ({} redelivered), {} dead-lettered, \
                 {} skipped; applied {}, duplicate {}, guarded {}, ignored {}\n",
                g.service,
                g.topic,
                g.records,
                g.handled,
                g.deliveries - g.handled,
                g.dead_lettered,
                g.skipped.len(),
                g.outcome("applied"),
                g.outcome("duplicate"),
                g.outcome("guarded"),
                g.outcome("ignored"),
            ));
        }
        out.push_str(&format!(
            "absorbed   {} duplicates (guard 1), {} guarded (guard 2); {} dead letters, each of a poison record\n",
            self.duplicates(),
            self.guarded(),
            self.poison_dead_lettered
        ));
        let stat = |name: &str| self.provider[name].as_u64().unwrap_or(0);
        out.push_str(&format!(
            "provider   {} calls: {} charged, {} declined, {} replayed to a retry; {} answers lost on purpose, {} calls refused while unavailable\n",
            stat("calls"),
            stat("charged"),
            stat("declined"),
            stat("replayed"),
            stat("lost_responses"),
            stat("unavailable"),
        ));
        out.push_str(&format!(
            "violations {}\nlost: {}, applied twice: {}, charged twice: {}\n",
            self.violations.len(),
            self.lost,
            self.applied_twice,
            self.charged_twice
        ));
        println!("{out}");
        if let Ok(path) = std::env::var("SAGA_FAULT_REPORT") {
            use std::io::Write as _;
            let row = format!(
                "| {scenario} | {} | {injected} | {} ({} duplicate, {} guarded) | {} | {} | {} |\n",
                self.orders,
                self.duplicates() + self.guarded(),
                self.duplicates(),
                self.guarded(),
                self.lost,
                self.applied_twice,
                self.charged_twice
            );
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .and_then(|mut f| f.write_all(row.as_bytes()))
                .unwrap_or_else(|e| panic!("{path}: {e}"));
        }
    }

    /// Fails the test listing every violation.
    pub fn assert_holds(&self) {
        assert!(
            self.violations.is_empty()
                && self.lost == 0
                && self.applied_twice == 0
                && self.charged_twice == 0,
            "{} violations (lost: {}, applied twice: {}, charged twice: {}):\n{}",
            self.violations.len(),
            self.lost,
            self.applied_twice,
            self.charged_twice,
            self.violations
                .iter()
                .take(40)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
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

/// Effects that are only half there, which no moment may show (so it is checked while a
/// killed service is still down, too): a status, payment or notification without its
/// outbox row or its inbox row, an outbox row without its effect, an inbox row without
/// its effect. Only for runs without hand-made conflicting events, whose ids are in the
/// inbox with no effect of their own.
pub async fn half_applied(stack: &Stack) -> Vec<String> {
    const CHECKS: [(&str, &str, &str); 10] = [
        (
            crate::ORDER_SERVICE,
            "status and outcome event disagree",
            "SELECT o.id::text FROM orders o
              WHERE (o.status <> 'pending') <> EXISTS (SELECT 1 FROM outbox x
                     WHERE x.key = o.id::text AND x.type IN ('order.confirmed', 'order.cancelled'))",
        ),
        (
            crate::ORDER_SERVICE,
            "order without its order.created outbox row",
            "SELECT o.id::text FROM orders o WHERE NOT EXISTS (SELECT 1 FROM outbox x
              WHERE x.key = o.id::text AND x.type = 'order.created')",
        ),
        (
            crate::ORDER_SERVICE,
            "inbox row without its decided order",
            "SELECT p.event_id FROM processed_events p WHERE NOT EXISTS (SELECT 1 FROM orders o
              WHERE p.event_id = o.id::text || ':payment' AND o.status <> 'pending')",
        ),
        (
            crate::ORDER_SERVICE,
            "decided order without its payment result in the inbox",
            "SELECT o.id::text FROM orders o WHERE o.status <> 'pending' AND NOT EXISTS
              (SELECT 1 FROM processed_events p WHERE p.event_id = o.id::text || ':payment')",
        ),
        (
            crate::PAYMENT_SERVICE,
            "payment without its result outbox row",
            "SELECT p.event_id FROM payments p WHERE NOT EXISTS (SELECT 1 FROM outbox x
              WHERE x.event_id = p.event_id || ':payment')",
        ),
        (
            crate::PAYMENT_SERVICE,
            "inbox row and payment disagree",
            "SELECT coalesce(e.event_id, p.event_id) FROM processed_events e
               FULL JOIN payments p ON p.event_id = e.event_id
              WHERE e.event_id IS NULL OR p.event_id IS NULL",
        ),
        (
            crate::PAYMENT_SERVICE,
            "result outbox row without its payment",
            "SELECT x.event_id FROM outbox x WHERE NOT EXISTS (SELECT 1 FROM payments p
              WHERE x.event_id = p.event_id || ':payment')",
        ),
        (
            crate::NOTIFICATION_SERVICE,
            "notification without its outbox row",
            "SELECT n.event_id FROM notifications n WHERE NOT EXISTS (SELECT 1 FROM outbox x
              WHERE x.event_id = n.event_id || ':notification')",
        ),
        (
            crate::NOTIFICATION_SERVICE,
            "inbox row and notification disagree",
            "SELECT coalesce(e.event_id, n.event_id) FROM processed_events e
               FULL JOIN notifications n ON n.event_id = e.event_id
              WHERE e.event_id IS NULL OR n.event_id IS NULL",
        ),
        (
            crate::NOTIFICATION_SERVICE,
            "notification.sent outbox row without its notification",
            "SELECT x.event_id FROM outbox x WHERE NOT EXISTS (SELECT 1 FROM notifications n
              WHERE x.event_id = n.event_id || ':notification')",
        ),
    ];
    let mut violations = Vec::new();
    for (service, what, sql) in CHECKS {
        for row in rows(stack, service, sql).await {
            let id: String = row.get(0);
            violations.push(format!("{service}: {what}: {id}"));
        }
    }
    violations
}

/// Every effect the saga has had, counted: orders by status, payments by status,
/// notifications, and each service's outbox and inbox rows. Equal before and after a
/// replay means the replay had no effect.
pub async fn effects(stack: &Stack) -> BTreeMap<String, i64> {
    const COUNTS: [(&str, &str); 5] = [
        (
            crate::ORDER_SERVICE,
            "SELECT 'orders ' || status, count(*) FROM orders GROUP BY status",
        ),
        (
            crate::PAYMENT_SERVICE,
            "SELECT 'payments ' || status, count(*) FROM payments GROUP BY status",
        ),
        (
            crate::NOTIFICATION_SERVICE,
            "SELECT 'notifications ' || outcome, count(*) FROM notifications GROUP BY outcome",
        ),
        (
            crate::ORDER_SERVICE,
            "SELECT 'order-service outbox ' || type, count(*) FROM outbox GROUP BY type",
        ),
        (
            crate::PAYMENT_SERVICE,
            "SELECT 'payment-service outbox ' || type, count(*) FROM outbox GROUP BY type",
        ),
    ];
    let mut effects = BTreeMap::new();
    for (service, sql) in COUNTS {
        for row in rows(stack, service, sql).await {
            effects.insert(row.get(0), row.get(1));
        }
    }
    for service in SERVICES {
        for (table, sql) in [
            ("outbox", "SELECT count(*) FROM outbox"),
            ("processed_events", "SELECT count(*) FROM processed_events"),
        ] {
            let n: i64 = rows(stack, service, sql).await[0].get(0);
            effects.insert(format!("{service} {table}"), n);
        }
    }
    effects
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

struct Order {
    status: String,
    amount_cents: i64,
}

struct OutboxRow {
    key: String,
    event_type: String,
    event_id: String,
}

struct Effect {
    event_id: String,
    status: String,
    amount_cents: Option<i64>,
    /// A payment's charge at the provider.
    charge_id: Option<String>,
}

/// A charge the provider made.
struct ProviderCharge {
    id: String,
    status: String,
    amount_cents: i64,
}

/// The three databases' rows, read once.
struct Databases {
    orders: HashMap<Uuid, Order>,
    payments: HashMap<Uuid, Vec<Effect>>,
    notifications: HashMap<Uuid, Vec<Effect>>,
    /// The provider's charges by reference (the order id, as payment-service sends it).
    charges: HashMap<String, Vec<ProviderCharge>>,
    outboxes: HashMap<&'static str, Vec<OutboxRow>>,
    inboxes: HashMap<&'static str, HashSet<String>>,
    unpublished: HashMap<&'static str, i64>,
}

impl Databases {
    async fn read(stack: &Stack) -> Self {
        let orders = rows(
            stack,
            crate::ORDER_SERVICE,
            "SELECT id, status, amount_cents FROM orders",
        )
        .await
        .into_iter()
        .map(|r| {
            (
                r.get::<_, Uuid>(0),
                Order {
                    status: r.get(1),
                    amount_cents: r.get(2),
                },
            )
        })
        .collect();
        let mut payments: HashMap<Uuid, Vec<Effect>> = HashMap::new();
        for r in rows(
            stack,
            crate::PAYMENT_SERVICE,
            "SELECT order_id, event_id, status, amount_cents, charge_id FROM payments",
        )
        .await
        {
            payments.entry(r.get(0)).or_default().push(Effect {
                event_id: r.get(1),
                status: r.get(2),
                amount_cents: Some(r.get(3)),
                charge_id: r.get(4),
            });
        }
        let mut charges: HashMap<String, Vec<ProviderCharge>> = HashMap::new();
        for r in rows(
            stack,
            PAYMENT_PROVIDER,
            "SELECT reference, id, status, amount_cents FROM charges",
        )
        .await
        {
            charges.entry(r.get(0)).or_default().push(ProviderCharge {
                id: r.get(1),
                status: r.get(2),
                amount_cents: r.get(3),
            });
        }
        let mut notifications: HashMap<Uuid, Vec<Effect>> = HashMap::new();
        for r in rows(
            stack,
            crate::NOTIFICATION_SERVICE,
            "SELECT order_id, event_id, outcome FROM notifications",
        )
        .await
        {
            notifications.entry(r.get(0)).or_default().push(Effect {
                event_id: r.get(1),
                status: r.get(2),
                amount_cents: None,
                charge_id: None,
            });
        }
        let mut outboxes = HashMap::new();
        let mut inboxes = HashMap::new();
        let mut unpublished = HashMap::new();
        for service in SERVICES {
            let outbox = rows(
                stack,
                service,
                "SELECT key, type, event_id, published_at IS NULL FROM outbox",
            )
            .await;
            unpublished.insert(
                service,
                outbox.iter().filter(|r| r.get::<_, bool>(3)).count() as i64,
            );
            outboxes.insert(
                service,
                outbox
                    .into_iter()
                    .map(|r| OutboxRow {
                        key: r.get(0),
                        event_type: r.get(1),
                        event_id: r.get(2),
                    })
                    .collect(),
            );
            let inbox = rows(stack, service, "SELECT event_id FROM processed_events").await;
            inboxes.insert(service, inbox.into_iter().map(|r| r.get(0)).collect());
        }
        Self {
            orders,
            payments,
            notifications,
            charges,
            outboxes,
            inboxes,
            unpublished,
        }
    }

    /// `service`'s outbox rows per key, restricted to `types`.
    fn outbox_by_key(&self, service: &str, types: &[&str]) -> HashMap<String, Vec<&OutboxRow>> {
        let mut by_key: HashMap<String, Vec<&OutboxRow>> = HashMap::new();
        for row in &self.outboxes[service] {
            if types.contains(&row.event_type.as_str()) {
                by_key.entry(row.key.clone()).or_default().push(row);
            }
        }
        by_key
    }
}

async fn rows(stack: &Stack, service: &str, sql: &str) -> Vec<tokio_postgres::Row> {
    stack
        .database(service)
        .client()
        .await
        .query(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{service}: {sql}: {e}"))
}

/// Orders, payments, outcome events and notifications: one each per order, consistent.
fn check_orders(db: &Databases, expected: &Expected, findings: &mut Findings) {
    use saga::events::*;
    findings.orders = db.orders.len();
    let mut lost: BTreeSet<Uuid> = BTreeSet::new();
    let mut twice: BTreeSet<Uuid> = BTreeSet::new();
    let mut charged_twice: BTreeSet<String> = BTreeSet::new();
    for id in &expected.accepted {
        if !db.orders.contains_key(id) {
            findings.violate(format!(
                "order {id} was accepted but is not in the database"
            ));
            lost.insert(*id);
        }
    }
    if let Some(offered) = expected.offered {
        // A retry placed its order again instead of getting the first one back.
        let accepted: HashSet<&Uuid> = expected.accepted.iter().collect();
        for id in db.orders.keys().filter(|id| !accepted.contains(id)) {
            findings.violate(format!(
                "order {id} is in the database but no POST got it back: of {offered} orders \
                 offered, each with its own Idempotency-Key, one was placed twice"
            ));
            twice.insert(*id);
        }
    }
    let created = db.outbox_by_key(crate::ORDER_SERVICE, &[ORDER_CREATED]);
    let outcomes = db.outbox_by_key(crate::ORDER_SERVICE, &[ORDER_CONFIRMED, ORDER_CANCELLED]);
    let results = db.outbox_by_key(crate::PAYMENT_SERVICE, &[PAYMENT_SUCCEEDED, PAYMENT_FAILED]);
    let sent = db.outbox_by_key(crate::NOTIFICATION_SERVICE, &[NOTIFICATION_SENT]);
    let none = Vec::new();
    let no_effects: Vec<Effect> = Vec::new();
    for (id, order) in &db.orders {
        let key = id.to_string();
        let (confirmed, wanted_payment, wanted_event) = match order.status.as_str() {
            "confirmed" => {
                findings.confirmed += 1;
                (true, "succeeded", ORDER_CONFIRMED)
            }
            "cancelled" => {
                findings.cancelled += 1;
                (false, "failed", ORDER_CANCELLED)
            }
            _ => {
                findings.pending += 1;
                findings.violate(format!("order {id} is still {}", order.status));
                lost.insert(*id);
                continue;
            }
        };
        let should_confirm = order.amount_cents <= PAYMENT_LIMIT_CENTS;
        if confirmed != should_confirm {
            findings.violate(format!(
                "order {id} of {} cents is {}",
                order.amount_cents, order.status
            ));
        }

        let mut one = |what: &str, n: usize, findings: &mut Findings| match n {
            1 => {}
            0 => {
                findings.violate(format!("order {id} has no {what}"));
                lost.insert(*id);
            }
            n => {
                findings.violate(format!("order {id} has {n} {what}s"));
                twice.insert(*id);
            }
        };
        let created_rows = created.get(&key).unwrap_or(&none);
        one("order.created outbox row", created_rows.len(), findings);
        let outcome_rows = outcomes.get(&key).unwrap_or(&none);
        one("outcome outbox row", outcome_rows.len(), findings);
        for row in outcome_rows {
            if row.event_type != wanted_event || row.event_id != order_outcome_id(*id) {
                findings.violate(format!(
                    "order {id} is {} but its outcome event is {} {}",
                    order.status, row.event_type, row.event_id
                ));
            }
        }

        let payments = db.payments.get(id).unwrap_or(&no_effects);
        one("payment", payments.len(), findings);
        for payment in payments {
            if payment.status != wanted_payment || payment.amount_cents != Some(order.amount_cents)
            {
                findings.violate(format!(
                    "order {id} is {} for {} cents but its payment {} for {:?}",
                    order.status, order.amount_cents, payment.status, payment.amount_cents
                ));
            }
        }
        let result_rows = results.get(&key).unwrap_or(&none);
        one("payment result outbox row", result_rows.len(), findings);
        for row in result_rows {
            let matches_payment = payments
                .iter()
                .any(|p| row.event_id == payment_result_id(&p.event_id));
            let wanted_type = if confirmed {
                PAYMENT_SUCCEEDED
            } else {
                PAYMENT_FAILED
            };
            if !matches_payment || row.event_type != wanted_type {
                findings.violate(format!(
                    "order {id}: payment result {} {} does not match its payment",
                    row.event_type, row.event_id
                ));
            }
        }

        let notifications = db.notifications.get(id).unwrap_or(&no_effects);
        one("notification", notifications.len(), findings);
        for notification in notifications {
            if notification.status != order.status || notification.event_id != order_outcome_id(*id)
            {
                findings.violate(format!(
                    "order {id} is {} but the customer was told {} (by {})",
                    order.status, notification.status, notification.event_id
                ));
            }
        }
        one(
            "notification.sent outbox row",
            sent.get(&key).unwrap_or(&none).len(),
            findings,
        );

        let charges = db.charges.get(&key).map(Vec::as_slice).unwrap_or(&[]);
        match charges.len() {
            1 => {}
            0 => {
                findings.violate(format!("order {id} has no charge at the provider"));
                lost.insert(*id);
            }
            n => {
                findings.violate(format!(
                    "order {id} was charged {n} times at the provider: {}",
                    charges
                        .iter()
                        .map(|c| c.id.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
                charged_twice.insert(key.clone());
            }
        }
        let wanted_charge = if confirmed { "succeeded" } else { "failed" };
        for charge in charges {
            if charge.status != wanted_charge || charge.amount_cents != order.amount_cents {
                findings.violate(format!(
                    "order {id} is {} for {} cents but its charge {} {} for {}",
                    order.status, order.amount_cents, charge.id, charge.status, charge.amount_cents
                ));
            }
        }
        for payment in payments {
            if !charges
                .iter()
                .any(|c| payment.charge_id.as_deref() == Some(c.id.as_str()))
            {
                findings.violate(format!(
                    "order {id}: its payment records charge {:?}, which the provider did not make for it",
                    payment.charge_id
                ));
            }
        }
    }
    for (what, effects) in [
        ("payment", &db.payments),
        ("notification", &db.notifications),
    ] {
        for id in effects.keys() {
            if !db.orders.contains_key(id) {
                findings.violate(format!("a {what} exists for order {id}, which does not"));
                twice.insert(*id);
            }
        }
    }
    let known: HashSet<String> = db.orders.keys().map(Uuid::to_string).collect();
    for (reference, charges) in &db.charges {
        if !known.contains(reference) {
            findings.violate(format!(
                "{} charge(s) at the provider for {reference}, an order the saga never saw",
                charges.len()
            ));
            charged_twice.insert(reference.clone());
        }
    }
    for (service, n) in &db.unpublished {
        if *n > 0 {
            findings.violate(format!("{service}: {n} outbox rows never published"));
        }
    }
    findings.lost += lost.len();
    findings.applied_twice += twice.len();
    findings.charged_twice += charged_twice.len();
}

/// One `event handled` line of a service's log.
struct Handled {
    topic: String,
    partition: i32,
    offset: i64,
    event_id: Option<String>,
    outcome: String,
}

/// Every `event handled` line of every instance of every service.
struct HandledLog {
    by_service: HashMap<&'static str, Vec<Handled>>,
}

impl HandledLog {
    fn read(stack: &Stack) -> Self {
        let mut by_service = HashMap::new();
        for service in SERVICES {
            let lines: Vec<Handled> = stack
                .logs_of(service)
                .iter()
                .flat_map(|log| log.lines().filter_map(parse_handled).collect::<Vec<_>>())
                .collect();
            by_service.insert(service, lines);
        }
        Self { by_service }
    }
}

/// The outcomes `service` logged for each event id, in the order it logged them.
pub fn outcomes_by_event(stack: &Stack, service: &str) -> HashMap<String, Vec<String>> {
    let mut outcomes: HashMap<String, Vec<String>> = HashMap::new();
    for log in stack.logs_of(service) {
        for line in log.lines().filter_map(parse_handled) {
            if let Some(id) = line.event_id {
                outcomes.entry(id).or_default().push(line.outcome);
            }
        }
    }
    outcomes
}

/// How many lines of `service`'s logs (every instance) contain `needle`.
pub fn count_in_logs(stack: &Stack, service: &str, needle: &str) -> usize {
    stack
        .logs_of(service)
        .iter()
        .map(|log| log.matches(needle).count())
        .sum()
}

/// Parses a line such as
/// `… INFO record{topic="t1.orders" partition=0 offset=5 event_id="…"}: saga::consumer:
/// event handled event_type=order.created outcome="applied"`.
fn parse_handled(line: &str) -> Option<Handled> {
    let marker = "}: saga::consumer: event handled ";
    let end = line.find(marker)?;
    let start = line[..end].rfind("record{")? + "record{".len();
    let fields = &line[start..end];
    let (topic, rest) = quoted_field(fields, "topic=")?;
    let (partition, rest) = plain_field(rest, "partition=")?;
    let (offset, rest) = plain_field(rest, "offset=")?;
    let event_id = quoted_field(rest, "event_id=").map(|(id, _)| id);
    let (outcome, _) = quoted_field(&line[end + marker.len()..], "outcome=")?;
    Some(Handled {
        topic,
        partition: partition.parse().ok()?,
        offset: offset.parse().ok()?,
        event_id,
        outcome,
    })
}

/// `key="value"` (with `\"` and `\\` escapes, as the log writes `&str` fields); returns
/// the value and the text after it.
fn quoted_field<'a>(text: &'a str, key: &str) -> Option<(String, &'a str)> {
    let at = text.find(key)? + key.len();
    let mut chars = text[at..].char_indices();
    if chars.next()?.1 != '"' {
        return None;
    }
    let mut value = String::new();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => value.push(chars.next()?.1),
            '"' => return Some((value, &text[at + i + 1..])),
            c => value.push(c),
        }
    }
    None
}

/// `key=value` up to the next space; returns the value and the text after it.
fn plain_field<'a>(text: &'a str, key: &str) -> Option<(&'a str, &'a str)> {
    let at = text.find(key)? + key.len();
    let len = text[at..].find([' ', '}']).unwrap_or(text.len() - at);
    Some((&text[at..at + len], &text[at + len..]))
}

/// The inbox against the logs: each event passed guard 1 at most once, and
/// `processed_events` holds exactly what was handled past it. With the inbox pruned, an
/// event may pass guard 1 again once its id is gone, but be applied only once, and an id
/// may be missing.
fn check_inboxes(db: &Databases, handled: &HandledLog, pruned: bool, findings: &mut Findings) {
    let passes = if pruned {
        &["applied"][..]
    } else {
        &["applied", "guarded"][..]
    };
    for service in SERVICES {
        let inbox = &db.inboxes[service];
        let mut passed: HashMap<&str, usize> = HashMap::new();
        let mut seen: HashSet<&str> = HashSet::new();
        for line in &handled.by_service[service] {
            let Some(id) = line.event_id.as_deref() else {
                continue;
            };
            seen.insert(id);
            if passes.contains(&line.outcome.as_str()) {
                *passed.entry(id).or_default() += 1;
            }
        }
        for (id, n) in &passed {
            if *n > 1 {
                findings.violate(format!(
                    "{service}: event {id} passed the dedupe guard {n} times"
                ));
                findings.applied_twice += 1;
            }
            if !pruned && !inbox.contains(*id) {
                findings.violate(format!(
                    "{service}: event {id} was logged as taking effect but is not in processed_events"
                ));
            }
        }
        for id in inbox {
            if !seen.contains(id.as_str()) {
                findings.violate(format!(
                    "{service}: processed_events holds {id}, which was never logged as handled"
                ));
            }
        }
    }
}

/// No record skipped, and dead letters exactly the poison.
async fn check_records(
    stack: &Stack,
    expected: &Expected,
    handled: &HandledLog,
    findings: &mut Findings,
) {
    for service in SERVICES {
        let (group, topic, dead_letter_topic) = stack.subscription(service);
        let ends = end_offsets(&stack.kafka.brokers, &topic).await;
        let mut tally = GroupTally {
            service,
            topic: topic.clone(),
            records: ends.iter().sum(),
            ..Default::default()
        };
        let mut done: HashSet<(i32, i64)> = HashSet::new();
        for line in &handled.by_service[service] {
            if line.topic != topic {
                findings.violate(format!("{service} handled a record of {}", line.topic));
                continue;
            }
            tally.deliveries += 1;
            *tally.outcomes.entry(line.outcome.clone()).or_default() += 1;
            done.insert((line.partition, line.offset));
        }
        tally.handled = done.len();

        let mut dead: HashMap<(i32, i64), String> = HashMap::new();
        for message in stack.kafka.read_all(&dead_letter_topic).await {
            let at = (
                header(&message, "dlq.original.partition").and_then(|p| p.parse().ok()),
                header(&message, "dlq.original.offset").and_then(|o| o.parse().ok()),
            );
            let (Some(partition), Some(offset)) = at else {
                findings.violate(format!(
                    "{dead_letter_topic}: a dead letter without its original partition and offset"
                ));
                continue;
            };
            if header(&message, "dlq.original.topic").as_deref() != Some(topic.as_str())
                || header(&message, "dlq.group").as_deref() != Some(group.as_str())
            {
                findings.violate(format!(
                    "{dead_letter_topic}: dead letter of {partition}/{offset} names another topic or group"
                ));
            }
            let reason = header(&message, "dlq.reason").unwrap_or_default();
            dead.insert((partition, offset), reason);
        }
        tally.dead_lettered = dead.len();

        let poison: HashMap<(i32, i64), &Poison> = expected
            .poison
            .iter()
            .filter(|p| p.topic == topic && p.rejected_by.contains(&service))
            .map(|p| ((p.partition, p.offset), p))
            .collect();
        for (at, p) in &poison {
            match dead.get(at) {
                Some(reason) if reason.contains(&p.reason) => findings.poison_dead_lettered += 1,
                Some(reason) => findings.violate(format!(
                    "{service}: poison {}/{} dead-lettered for `{reason}`, expected `{}`",
                    at.0, at.1, p.reason
                )),
                None => findings.violate(format!(
                    "{service}: poison {}/{} ({}) is not in {dead_letter_topic}",
                    at.0, at.1, p.reason
                )),
            }
            if done.contains(at) {
                findings.violate(format!(
                    "{service}: poison {}/{} ({}) was handled as if it were fine",
                    at.0, at.1, p.reason
                ));
            }
        }
        for (at, reason) in &dead {
            if !poison.contains_key(at) {
                findings.violate(format!(
                    "{service}: {}/{} was dead-lettered though it is no poison: {reason}",
                    at.0, at.1
                ));
            }
        }

        for (partition, end) in ends.iter().enumerate() {
            let partition = partition as i32;
            for offset in 0..*end {
                let at = (partition, offset);
                if !done.contains(&at) && !dead.contains_key(&at) {
                    tally.skipped.push(at);
                }
            }
        }
        if !tally.skipped.is_empty() {
            findings.violate(format!(
                "{service}: {} records of {topic} neither handled nor dead-lettered, e.g. {:?}",
                tally.skipped.len(),
                &tally.skipped[..tally.skipped.len().min(5)]
            ));
            findings.lost += tally.skipped.len();
        }
        findings.groups.push(tally);
    }
}

/// The end offset of each partition of `topic`, partition 0 first.
pub async fn end_offsets(brokers: &str, topic: &str) -> Vec<i64> {
    let brokers = brokers.to_owned();
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()
            .expect("a Kafka client");
        let timeout = Duration::from_secs(10);
        let metadata = consumer
            .fetch_metadata(Some(&topic), timeout)
            .expect("the broker serves metadata");
        let partitions = metadata.topics()[0].partitions().len() as i32;
        (0..partitions)
            .map(|p| {
                consumer
                    .fetch_watermarks(&topic, p, timeout)
                    .expect("the broker serves watermarks")
                    .1
            })
            .collect()
    })
    .await
    .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_record_span_and_outcome_of_an_event_handled_line() {
        let line = r#"2026-11-30T08:55:10.971781Z  INFO record{topic="t1.payments" partition=2 offset=17 event_id="cb1c:pay\"x"}: saga::consumer: event handled event_type=payment.succeeded outcome="duplicate""#;
        let handled = parse_handled(line).unwrap();
        assert_eq!(handled.topic, "t1.payments");
        assert_eq!(handled.partition, 2);
        assert_eq!(handled.offset, 17);
        assert_eq!(handled.event_id.as_deref(), Some("cb1c:pay\"x"));
        assert_eq!(handled.outcome, "duplicate");
    }

    #[test]
    fn ignores_every_other_line() {
        assert!(
            parse_handled("2026-11-30T08:55:10Z  INFO saga::service: service started").is_none()
        );
        assert!(
            parse_handled(r#"… WARN record{topic="t1.orders" partition=0 offset=3}: saga::consumer: record dead-lettered reason="x""#)
                .is_none()
        );
    }
}
