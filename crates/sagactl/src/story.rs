//! One order's story: every step it took across the services, the provider and the
//! topics, in time order, and what each delivery of each of its events met.
//!
//! Where each step comes from:
//! - **placed**: the order row (`orders.created_at`).
//! - **written / published**: each service's outbox rows keyed by the order
//!   (`occurred_at`, `published_at`), each naming the event that caused it.
//! - **charged / declined**: the provider's charges whose reference is the order.
//! - **cancelled**: the order row, when the customer or the deadline cancelled it
//!   (`cancel_reason`, at `updated_at`, which nothing after the cancellation moves).
//! - **refunded**: the provider's refund of the order's charge, with the key it was made
//!   under.
//! - **tombstone**: payment-service's `voided` payment, left by a cancellation that came
//!   before any charge was asked for.
//! - **unknown**: payment-service's charge or refund asked for, with no answer yet (its
//!   intent, or a call whose answer was lost): only the same key's answer decides it.
//! - **refund failed**: the provider refused the refund, or no refund could be asked
//!   for; the payment holds why, and `sagactl refund retry` tries again.
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
//!
//! The topics and offsets are read before any table. A consumer commits its transaction
//! before its offset, so a record the offsets call handled always finds its claim and its
//! effect; read the other way round, an event applied between the two reads would look
//! like guard 2.

mod fate;
mod records;
mod rows;

use anyhow::Context as _;
use rdkafka::Message as _;
use rdkafka::message::OwnedMessage;
use saga::{Topics, events};
use serde::Serialize;
use time::OffsetDateTime;
use tokio_postgres::Client;
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
    /// What became of a cancelled order's charge, as the API says it: `pending` until
    /// payment-service answered the cancellation, then `refunded`, `failed` or `not_charged`.
    pub refund: Option<&'static str>,
    /// The provider's id of the order's refund, once order-service recorded it.
    pub refund_id: Option<String>,
    /// Why its refund failed, while it is `failed`.
    pub refund_failure: Option<String>,
    /// When the outcome was decided and a cancellation answered; `None` while in flight.
    #[serde(with = "time::serde::rfc3339::option")]
    pub settled_at: Option<OffsetDateTime>,
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
    Cancelled,
    Refunded,
    Tombstone,
    Unknown,
    RefundFailed,
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
            Kind::Cancelled => "cancelled",
            Kind::Refunded => "refunded",
            Kind::Tombstone => "tombstone",
            Kind::Unknown => "unknown",
            Kind::RefundFailed => "refund failed",
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
    /// Something may still happen: the order has not settled (pending, or its
    /// cancellation not answered yet), a row is unpublished or a record not yet handled.
    pub open: bool,
}

/// Who consumes each topic, and the event types each of them acts on.
pub(crate) fn consumers(topics: &Topics) -> Vec<(String, &'static str, &'static [&'static str])> {
    vec![
        (
            topics.orders.clone(),
            "payment-service",
            &[events::ORDER_CREATED, events::ORDER_CANCELLED][..],
        ),
        (
            topics.orders.clone(),
            "notification-service",
            &[
                events::ORDER_CONFIRMED,
                events::ORDER_CANCELLED,
                events::ORDER_REFUNDED,
            ][..],
        ),
        (
            topics.payments.clone(),
            "order-service",
            &[
                events::PAYMENT_SUCCEEDED,
                events::PAYMENT_FAILED,
                events::PAYMENT_REFUNDED,
                events::PAYMENT_VOIDED,
            ][..],
        ),
    ]
}

async fn connect(url: &str) -> anyhow::Result<Client> {
    let connected = match saga::db::parse_url(url) {
        Ok(config) => saga::db::connect(&config).await,
        Err(error) => Err(error),
    };
    connected.with_context(|| format!("cannot connect to {}", saga::db::redacted(url)))
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
    if rows::order(databases, order_id).await?.is_none() {
        return Ok(None);
    }
    let key = order_id.to_string();
    // The topics first, then every row: see `records::read`.
    let on_topics = records::read(sources, &key).await?;
    let order = rows::order(databases, order_id)
        .await?
        .context("the order was deleted while its story was read")?;
    let mut open = order.settled_at.is_none();
    let mut steps = vec![rows::placed(&order)];
    steps.extend(rows::cancellation(&order));
    let caused = rows::outbox(databases, &key, &mut steps, &mut open).await?;
    steps.extend(rows::charges(databases, &key).await?);
    steps.extend(rows::refunds(databases, &key).await?);
    steps.extend(rows::payment(databases, order_id).await?);
    steps.extend(rows::notifications(databases, order_id).await?);
    open |= records::tell(&sources.topics, &on_topics, databases, &caused, &mut steps).await?;

    steps.sort_by_key(|step| step.at);
    Ok(Some(Story { order, steps, open }))
}

/// Cents as the customer reads them: `25.98`.
pub fn money(cents: i64) -> String {
    format!("{}.{:02}", cents / 100, cents % 100)
}
