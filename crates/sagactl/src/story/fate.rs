//! What one consumer made of one record: dead-lettered, waiting, ignored, forgotten,
//! applied, or stopped by a guard, told from its dead-letter topic, its group's committed
//! offsets, its inbox's claim of the event id and what its outbox holds.

use std::collections::{BTreeMap, HashMap};

use rdkafka::Message as _;
use rdkafka::message::OwnedMessage;
use saga::{Envelope, events};
use time::OffsetDateTime;
use tokio_postgres::{Client, Row};

use super::{Kind, Step, place, timestamp};

/// What a service wrote, in one transaction, because of one event.
pub(super) struct Effect {
    pub(super) types: Vec<String>,
    /// The transaction's time (`now()`), which its claim of the event id shares.
    pub(super) at: OffsetDateTime,
}

/// Where a claim says its record was: topic, partition and offset (all `None` for a
/// claim made before claims recorded them).
type Claimer = (Option<String>, Option<i32>, Option<i64>);

/// What `service` made of one record, one of the `copies` (in the order they were
/// written) of its event.
#[allow(clippy::too_many_arguments)]
pub(super) async fn fate(
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
    let partition = message.partition().to_string();
    let offset = message.offset().to_string();
    if let Some(dead) = dead_letters.iter().find(|d| {
        saga::kafka::header(*d, "dlq.original.partition").as_deref() == Some(&partition)
            && saga::kafka::header(*d, "dlq.original.offset").as_deref() == Some(&offset)
    }) {
        return Ok(step(
            service,
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
        return Ok(step(
            service,
            at,
            Kind::Waiting,
            "not handled yet".into(),
            None,
        ));
    }
    let Some(event) = event else {
        // Handled, yet not dead-lettered: its dead letter is past the topic's retention.
        return Ok(step(
            service,
            at,
            Kind::Forgotten,
            "handled; its dead letter is no longer on the topic".into(),
            None,
        ));
    };
    if !handles.contains(&event.event_type.as_str()) {
        return Ok(step(
            service,
            at,
            Kind::Ignored,
            format!("ignored {}: not an event it acts on", event.event_type),
            None,
        ));
    }
    if !moves_anything(event) {
        return Ok(step(
            service,
            at,
            Kind::Ignored,
            format!(
                "ignored {} {}: not a cancellation order-service wrote",
                event.event_type, event.id
            ),
            None,
        ));
    }
    let effect = caused.get(&(service, event.id.clone()));
    claimed(service, message, event, copies, inbox, effect).await
}

/// False for an `order.cancelled` whose id is not one order-service gives its own
/// cancellations: its consumers ignore it, claiming nothing.
fn moves_anything(event: &Envelope) -> bool {
    event.event_type != events::ORDER_CANCELLED
        || event
            .aggregate_id
            .parse()
            .is_ok_and(|order_id| events::is_order_services_cancellation(&event.id, order_id))
}

/// What `service` made of a record of an event it acts on and has handled: which of the
/// event's `copies` claimed its id, and whether `effect` was written with that claim.
async fn claimed(
    service: &str,
    message: &OwnedMessage,
    event: &Envelope,
    copies: &[&OwnedMessage],
    inbox: &Client,
    effect: Option<&Effect>,
) -> anyhow::Result<Step> {
    let at = timestamp(message);
    let claim = inbox
        .query_opt(
            "SELECT processed_at, topic, partition, kafka_offset
               FROM processed_events WHERE event_id = $1",
            &[&event.id],
        )
        .await?;
    let claimed_at: Option<OffsetDateTime> = claim.as_ref().map(|c| c.get("processed_at"));
    let claimed_by = claim.as_ref().map(claimer);
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
            let mut step = applied(service, event, Some(effect), effect.at);
            step.detail = Some(format!(
                "id {}; its claim is no longer in the inbox",
                event.id
            ));
            return Ok(step);
        }
        if !is_claimer && claimed_at.is_none_or(|claimed| at < claimed) {
            return Ok(guard_1(
                service,
                event,
                at,
                "claimed by an earlier copy, whose claim is no longer in the inbox".into(),
            ));
        }
    }
    let Some(claim) = claim else {
        return Ok(step(
            service,
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
        return Ok(guard_1(
            service,
            event,
            at,
            format!("claimed by {by} at {}", crate::clock(claimed_at)),
        ));
    }
    // The claim is this record's: applied if the effect was written in its transaction.
    Ok(match effect.filter(|e| e.at == claimed_at) {
        Some(_) => applied(service, event, effect, claimed_at),
        None => step(
            service,
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

fn claimer(claim: &Row) -> Claimer {
    (
        claim.get::<_, Option<String>>("topic"),
        claim.get::<_, Option<i32>>("partition"),
        claim.get::<_, Option<i64>>("kafka_offset"),
    )
}

fn step(
    service: &str,
    at: OffsetDateTime,
    kind: Kind,
    text: String,
    detail: Option<String>,
) -> Step {
    Step {
        at,
        actor: service.to_owned(),
        kind,
        text,
        detail,
    }
}

/// `event` applied at `at`, writing `effect`.
fn applied(service: &str, event: &Envelope, effect: Option<&Effect>, at: OffsetDateTime) -> Step {
    step(
        service,
        at,
        Kind::Applied,
        format!(
            "applied {}: wrote {}",
            event.event_type,
            effect.map(|e| e.types.join(", ")).unwrap_or_default()
        ),
        Some(format!("id {}", event.id)),
    )
}

/// A copy of `event` whose id was claimed already, by what `detail` says.
fn guard_1(service: &str, event: &Envelope, at: OffsetDateTime, detail: String) -> Step {
    step(
        service,
        at,
        Kind::Guard1,
        format!(
            "guard 1: {} {} already claimed, nothing touched",
            event.event_type, event.id
        ),
        Some(detail),
    )
}
