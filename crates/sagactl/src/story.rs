//! One order's story: every step it took across the services, the provider and the
//! topics, in time order, and what each delivery of each of its events met.
//!
//! Where each step comes from:
//! - **placed**: the order row (`orders.created_at`).
//! - **written / published**: each service's outbox rows keyed by the order
//!   (`occurred_at`, `published_at`), each naming the event that caused it.
//! - **charged / declined**: the provider's charges whose reference is the order.
//! - **record**: every record on the saga's topics about the order (its key, or its
//!   envelope's `aggregate_id`), originals and copies alike: a hand-replayed record is a
//!   second record.
//! - what each consumer made of each record:
//!   - **dead-lettered**: its dead-letter topic holds a record pointing at this one;
//!   - **waiting**: the group has not committed past it yet;
//!   - **ignored**: not an event type that consumer handles;
//!   - **applied** or **guard 2**: its inbox row names this very record as the one that
//!     claimed the id; applied if the consumer's outbox has a row caused by the event
//!     written in the claim's own transaction (the two share `now()`), guard 2 if not;
//!   - **guard 1**: the id was claimed by another record. Guard 1 touches nothing, so
//!     this is known from the claim, not from a trace of its own, and when it happened is
//!     known only as "after the record was written".
//!
//! If the inbox forgot a claim (pruned after `INBOX_RETENTION`, or deleted by hand) and a
//! later copy claimed the id anew, the effect is older than the claim: the copy that
//! applied the event is then the first one written before its effect, and the later one
//! met guard 2. A consumer's redelivery of one record (after a crash, before its offset
//! was committed) is not a second record, so the story shows it once; the claim still
//! says which delivery took effect. Outbox rows past `OUTBOX_RETENTION` and records past
//! the topics' retention are gone from the story too.

use std::collections::{BTreeMap, HashMap};

use anyhow::Context as _;
use rdkafka::Message as _;
use rdkafka::message::OwnedMessage;
use saga::{Envelope, Topics, events};
use serde::Serialize;
use time::OffsetDateTime;
use tokio_postgres::{Client, NoTls};
use uuid::Uuid;

use crate::Sources;

/// The order the story is about, as order-service has it now.
#[derive(Debug, Clone, Serialize)]
pub struct Order {
    pub id: Uuid,
    pub status: String,
    pub customer_id: String,
    pub amount_cents: i64,
    pub cancel_reason: Option<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

/// What a step was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Placed,
    Written,
    Published,
    Charged,
    Declined,
    Record,
    Applied,
    Guard1,
    Guard2,
    Ignored,
    DeadLettered,
    Waiting,
    Forgotten,
    Notified,
}

impl Kind {
    /// The word the CLI and the page show.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Placed => "placed",
            Kind::Written => "written",
            Kind::Published => "published",
            Kind::Charged => "charged",
            Kind::Declined => "declined",
            Kind::Record => "record",
            Kind::Applied => "applied",
            Kind::Guard1 => "guard 1",
            Kind::Guard2 => "guard 2",
            Kind::Ignored => "ignored",
            Kind::DeadLettered => "dead letter",
            Kind::Waiting => "waiting",
            Kind::Forgotten => "forgotten",
            Kind::Notified => "notified",
        }
    }
}

/// One step of the story.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// Who took the step: a service, the provider, or `kafka` for a record on a topic.
    pub actor: String,
    pub kind: Kind,
    pub text: String,
    pub detail: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Story {
    pub order: Order,
    pub steps: Vec<Step>,
    /// Something may still happen: the order is pending, a row is unpublished or a
    /// record not yet handled.
    pub open: bool,
}

/// Who consumes each topic, and the event types each of them acts on.
pub(crate) fn consumers(topics: &Topics) -> Vec<(String, &'static str, &'static [&'static str])> {
    vec![
        (
            topics.orders.clone(),
            "payment-service",
            &[events::ORDER_CREATED][..],
        ),
        (
            topics.orders.clone(),
            "notification-service",
            &[events::ORDER_CONFIRMED, events::ORDER_CANCELLED][..],
        ),
        (
            topics.payments.clone(),
            "order-service",
            &[events::PAYMENT_SUCCEEDED, events::PAYMENT_FAILED][..],
        ),
    ]
}

async fn connect(url: &str) -> anyhow::Result<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .with_context(|| format!("cannot connect to {}", saga::db::redacted(url)))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// The databases the story reads, one client each.
pub struct Databases {
    by_service: Vec<(&'static str, Client)>,
    provider: Client,
}

impl Databases {
    pub async fn connect(sources: &Sources) -> anyhow::Result<Self> {
        Ok(Self {
            by_service: vec![
                (
                    "order-service",
                    connect(&sources.orders_database_url).await?,
                ),
                (
                    "payment-service",
                    connect(&sources.payments_database_url).await?,
                ),
                (
                    "notification-service",
                    connect(&sources.notifications_database_url).await?,
                ),
            ],
            provider: connect(&sources.provider_database_url).await?,
        })
    }

    fn of(&self, service: &str) -> &Client {
        &self
            .by_service
            .iter()
            .find(|(name, _)| *name == service)
            .expect("a service of the saga")
            .1
    }

    pub fn orders(&self) -> &Client {
        self.of("order-service")
    }
}

/// Every record on `topic` now, read off the runtime's workers.
pub async fn records(brokers: &str, topic: &str) -> anyhow::Result<Vec<OwnedMessage>> {
    let (brokers, topic) = (brokers.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || saga::kafka::read_topic(&brokers, &topic)).await?
}

pub(crate) fn timestamp(message: &OwnedMessage) -> OffsetDateTime {
    message
        .timestamp()
        .to_millis()
        .and_then(|ms| OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).ok())
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

fn place(topic: &str, partition: i32, offset: i64) -> String {
    format!("{topic}[{partition}]@{offset}")
}

/// The story of `order_id`, or `None` if order-service has no such order.
pub async fn tell(
    sources: &Sources,
    databases: &Databases,
    order_id: Uuid,
) -> anyhow::Result<Option<Story>> {
    let Some(row) = databases
        .orders()
        .query_opt(
            "SELECT id, status, customer_id, amount_cents, cancel_reason, created_at, updated_at
               FROM orders WHERE id = $1",
            &[&order_id],
        )
        .await?
    else {
        return Ok(None);
    };
    let order = Order {
        id: row.get("id"),
        status: row.get("status"),
        customer_id: row.get("customer_id"),
        amount_cents: row.get("amount_cents"),
        cancel_reason: row.get("cancel_reason"),
        created_at: row.get("created_at"),
        updated_at: row.get("updated_at"),
    };
    let key = order_id.to_string();
    let mut open = order.status == "pending";
    let mut steps = vec![Step {
        at: order.created_at,
        actor: "order-service".into(),
        kind: Kind::Placed,
        text: format!(
            "order placed: {} for {} (POST /v1/orders)",
            money(order.amount_cents),
            order.customer_id
        ),
        detail: None,
    }];

    // What each service wrote to its outbox about the order, and what caused each row.
    let mut caused: HashMap<(&str, String), Effect> = HashMap::new();
    for (service, client) in &databases.by_service {
        let rows = client
            .query(
                "SELECT event_id, topic, type, occurred_at, published_at, caused_by
                   FROM outbox WHERE key = $1 ORDER BY id",
                &[&key],
            )
            .await?;
        for row in rows {
            let event_id: String = row.get("event_id");
            let event_type: String = row.get("type");
            let topic: String = row.get("topic");
            let cause: Option<String> = row.get("caused_by");
            if let Some(cause) = &cause {
                caused
                    .entry((service, cause.clone()))
                    .or_insert_with(|| Effect {
                        types: Vec::new(),
                        at: row.get("occurred_at"),
                    })
                    .types
                    .push(event_type.clone());
            }
            steps.push(Step {
                at: row.get("occurred_at"),
                actor: (*service).into(),
                kind: Kind::Written,
                text: format!("wrote {event_type} to its outbox"),
                detail: Some(match &cause {
                    Some(cause) => format!("id {event_id}, caused by {cause}"),
                    None => format!("id {event_id}, in the order's own transaction"),
                }),
            });
            match row.get::<_, Option<OffsetDateTime>>("published_at") {
                Some(at) => steps.push(Step {
                    at,
                    actor: (*service).into(),
                    kind: Kind::Published,
                    text: format!("relay published {event_type} to {topic}"),
                    detail: None,
                }),
                None => {
                    open = true;
                    steps.push(Step {
                        at: row.get("occurred_at"),
                        actor: (*service).into(),
                        kind: Kind::Waiting,
                        text: format!("{event_type} not published yet"),
                        detail: None,
                    });
                }
            }
        }
    }

    // The provider's charges for the order.
    for row in databases
        .provider
        .query(
            "SELECT c.id, c.status, c.amount_cents, c.failure_message, c.created_at, k.key
               FROM charges c LEFT JOIN idempotency_keys k ON k.charge_id = c.id
              WHERE c.reference = $1 ORDER BY c.created_at",
            &[&key],
        )
        .await?
    {
        let id: String = row.get("id");
        let amount: i64 = row.get("amount_cents");
        let idempotency_key: Option<String> = row.get("key");
        let succeeded = row.get::<_, String>("status") == "succeeded";
        steps.push(Step {
            at: row.get("created_at"),
            actor: "payment-provider".into(),
            kind: if succeeded {
                Kind::Charged
            } else {
                Kind::Declined
            },
            text: if succeeded {
                format!("charged {} as {id}", money(amount))
            } else {
                format!(
                    "declined {}: {}",
                    money(amount),
                    row.get::<_, Option<String>>("failure_message")
                        .unwrap_or_default()
                )
            },
            detail: idempotency_key.map(|k| format!("Idempotency-Key {k}")),
        });
    }

    // The customer's notification.
    for row in databases
        .of("notification-service")
        .query(
            "SELECT message, created_at FROM notifications WHERE order_id = $1",
            &[&order_id],
        )
        .await?
    {
        steps.push(Step {
            at: row.get("created_at"),
            actor: "notification-service".into(),
            kind: Kind::Notified,
            text: row.get("message"),
            detail: None,
        });
    }

    // Every record about the order, and what each consumer made of it.
    let topics = &sources.topics;
    let mut on_topic: BTreeMap<String, Vec<OwnedMessage>> = BTreeMap::new();
    for topic in [&topics.orders, &topics.payments, &topics.notifications] {
        let mine = records(&sources.kafka_brokers, topic)
            .await?
            .into_iter()
            .filter(|m| about(m, &key))
            .collect();
        on_topic.insert(topic.clone(), mine);
    }
    for (topic, messages) in &on_topic {
        let mut copies: HashMap<String, usize> = HashMap::new();
        // Copies are numbered in the order they were written, whatever their partition.
        let mut events: Vec<(&OwnedMessage, Option<Envelope>)> = messages
            .iter()
            .map(|m| (m, Envelope::from_message(m).ok()))
            .collect();
        events.sort_by_key(|(m, _)| (timestamp(m), m.partition(), m.offset()));
        let mut totals: HashMap<String, usize> = HashMap::new();
        for (_, event) in &events {
            if let Some(event) = event {
                *totals.entry(event.id.clone()).or_default() += 1;
            }
        }
        for (message, event) in &events {
            let at = timestamp(message);
            let here = place(topic, message.partition(), message.offset());
            let keyed = message.key().is_some();
            steps.push(Step {
                at,
                actor: "kafka".into(),
                kind: Kind::Record,
                text: match event {
                    Some(event) => format!("{} on {here}", event.event_type),
                    None => format!("a record that is no event, on {here}"),
                },
                detail: event.as_ref().map(|event| {
                    let n = copies.entry(event.id.clone()).or_default();
                    *n += 1;
                    let total = totals[&event.id];
                    let mut detail = format!("id {}", event.id);
                    if total > 1 {
                        detail.push_str(&format!(", copy {n} of {total}"));
                    }
                    if !keyed {
                        detail.push_str(", no key (produced by hand?)");
                    }
                    detail
                }),
            });
        }
        for (consumed, service, handles) in consumers(topics) {
            if &consumed != topic {
                continue;
            }
            let group = topics.group(service);
            let offsets = {
                let (brokers, group, topic) =
                    (sources.kafka_brokers.clone(), group.clone(), topic.clone());
                tokio::task::spawn_blocking(move || {
                    saga::kafka::committed_and_end(&brokers, &group, &topic)
                })
                .await??
            };
            let dead_letters =
                records(&sources.kafka_brokers, &topics.dead_letter(topic, service)).await?;
            for (message, event) in &events {
                let copies: Vec<&OwnedMessage> = events
                    .iter()
                    .filter(|(_, other)| {
                        other.as_ref().map(|o| &o.id) == event.as_ref().map(|e| &e.id)
                    })
                    .map(|(m, _)| *m)
                    .collect();
                let step = fate(
                    service,
                    handles,
                    message,
                    event.as_ref(),
                    &copies,
                    &offsets,
                    &dead_letters,
                    databases.of(service),
                    &caused,
                )
                .await?;
                open |= step.kind == Kind::Waiting;
                steps.push(step);
            }
        }
    }

    steps.sort_by_key(|step| step.at);
    Ok(Some(Story { order, steps, open }))
}

/// Whether `message` is about the order keyed `key`: by its Kafka key, or, for a record
/// produced without one, by its envelope.
fn about(message: &OwnedMessage, key: &str) -> bool {
    match message.key() {
        Some(k) if k == key.as_bytes() => true,
        _ => Envelope::from_message(message).is_ok_and(|e| e.aggregate_id == key),
    }
}

/// What a service wrote, in one transaction, because of one event.
struct Effect {
    types: Vec<String>,
    /// The transaction's time (`now()`), which its claim of the event id shares.
    at: OffsetDateTime,
}

/// What `service` made of one record, one of the `copies` (in the order they were
/// written) of its event.
#[allow(clippy::too_many_arguments)]
async fn fate(
    service: &str,
    handles: &[&str],
    message: &OwnedMessage,
    event: Option<&Envelope>,
    copies: &[&OwnedMessage],
    offsets: &BTreeMap<i32, (i64, i64)>,
    dead_letters: &[OwnedMessage],
    inbox: &Client,
    caused: &HashMap<(&str, String), Effect>,
) -> anyhow::Result<Step> {
    let at = timestamp(message);
    let step = |at, kind, text: String, detail: Option<String>| Step {
        at,
        actor: service.to_owned(),
        kind,
        text,
        detail,
    };
    let partition = message.partition().to_string();
    let offset = message.offset().to_string();
    if let Some(dead) = dead_letters.iter().find(|d| {
        saga::kafka::header(*d, "dlq.original.partition").as_deref() == Some(&partition)
            && saga::kafka::header(*d, "dlq.original.offset").as_deref() == Some(&offset)
    }) {
        return Ok(step(
            timestamp(dead),
            Kind::DeadLettered,
            format!("dead-lettered to {}", dead.topic()),
            saga::kafka::header(dead, "dlq.reason"),
        ));
    }
    let committed = offsets
        .get(&message.partition())
        .map_or(0, |(done, _)| *done);
    if message.offset() >= committed {
        return Ok(step(at, Kind::Waiting, "not handled yet".into(), None));
    }
    let Some(event) = event else {
        // Handled, yet not dead-lettered: its dead letter is past the topic's retention.
        return Ok(step(
            at,
            Kind::Forgotten,
            "handled; its dead letter is no longer on the topic".into(),
            None,
        ));
    };
    if !handles.contains(&event.event_type.as_str()) {
        return Ok(step(
            at,
            Kind::Ignored,
            format!("ignored {}: not an event it acts on", event.event_type),
            None,
        ));
    }
    let claim = inbox
        .query_opt(
            "SELECT processed_at, topic, partition, kafka_offset
               FROM processed_events WHERE event_id = $1",
            &[&event.id],
        )
        .await?;
    let effect = caused.get(&(service, event.id.clone()));
    let applied = |at| {
        step(
            at,
            Kind::Applied,
            format!(
                "applied {}: wrote {}",
                event.event_type,
                effect.map(|e| e.types.join(", ")).unwrap_or_default()
            ),
            Some(format!("id {}", event.id)),
        )
    };
    let guard_1 = |detail: String| {
        step(
            at,
            Kind::Guard1,
            format!(
                "guard 1: {} {} already claimed, nothing touched",
                event.event_type, event.id
            ),
            Some(detail),
        )
    };
    let claimed_at: Option<OffsetDateTime> = claim.as_ref().map(|c| c.get("processed_at"));
    let claimed_by = claim.as_ref().map(|claim| {
        (
            claim.get::<_, Option<String>>("topic"),
            claim.get::<_, Option<i32>>("partition"),
            claim.get::<_, Option<i64>>("kafka_offset"),
        )
    });
    let this = (
        Some(message.topic().to_owned()),
        Some(message.partition()),
        Some(message.offset()),
    );
    let is_claimer = claimed_by.as_ref() == Some(&this);
    // An effect written in another transaction than the claim now in the inbox: the claim
    // that went with it is gone (pruned, or deleted by hand), and a later copy claimed the
    // id anew. The copy that applied it is the first one written before the effect.
    if let Some(effect) = effect.filter(|e| Some(e.at) != claimed_at) {
        let first = copies.iter().find(|m| timestamp(m) <= effect.at);
        if first
            .is_some_and(|m| m.partition() == message.partition() && m.offset() == message.offset())
        {
            let mut step = applied(effect.at);
            step.detail = Some(format!(
                "id {}; its claim is no longer in the inbox",
                event.id
            ));
            return Ok(step);
        }
        if !is_claimer && claimed_at.is_none_or(|claimed| at < claimed) {
            return Ok(guard_1(
                "claimed by an earlier copy, whose claim is no longer in the inbox".into(),
            ));
        }
    }
    let Some(claim) = claim else {
        return Ok(step(
            at,
            Kind::Forgotten,
            format!(
                "handled {}; its id is no longer in the inbox",
                event.event_type
            ),
            Some("pruned after INBOX_RETENTION".into()),
        ));
    };
    let claimed_at: OffsetDateTime = claim.get("processed_at");
    if !is_claimer {
        let by = match claimed_by.expect("there is a claim") {
            (Some(t), Some(p), Some(o)) => place(&t, p, o),
            _ => "a record read before claims were recorded".into(),
        };
        return Ok(guard_1(format!(
            "claimed by {by} at {}",
            crate::clock(claimed_at)
        )));
    }
    // The claim is this record's: applied if the effect was written in its transaction.
    Ok(match effect.filter(|e| e.at == claimed_at) {
        Some(_) => applied(claimed_at),
        None => step(
            claimed_at,
            Kind::Guard2,
            format!(
                "guard 2: {} came too late, the order had moved on; id recorded",
                event.event_type
            ),
            Some(format!("id {}", event.id)),
        ),
    })
}

/// Cents as the customer reads them: `25.98`.
pub fn money(cents: i64) -> String {
    format!("{}.{:02}", cents / 100, cents % 100)
}
