//! Guard 1, the inbox: a consumer's handler claims the id of the event it handles in
//! `processed_events`, in the transaction that applies the event.
//!
//! The claim and the state change commit together or not at all. So an id in the inbox
//! means the event's effects are committed, and a redelivery finds it there and stops
//! before touching anything; a crash before the commit leaves neither, and the redelivery
//! applies the event as if for the first time. The row keeps where the event was read
//! (topic, partition, offset), for a person tracing a duplicate back to its copies.
//! [`crate::retention`] prunes the rows once no copy of their event can still arrive.

use crate::{Envelope, Transaction};

/// Guard 1's statement: zero rows inserted means the id was claimed before, by this
/// event's first delivery. Every consumer's handler runs it first, through [`claim`], and
/// so do the benchmark's scripts of their transactions.
pub const CLAIM_EVENT: &str = "
    INSERT INTO processed_events (event_id, topic, partition, kafka_offset)
    VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING";

/// Claims `event`'s id in `tx`: `false` when the event was applied before, a
/// redelivery, whose handler must then commit the no-op and touch nothing else.
///
/// The statement is prepared once per pooled connection (`prepare_cached`), not on every
/// call: parsing and planning it again, and the extra round trip that takes, cost more
/// than running it.
pub async fn claim(tx: &Transaction<'_>, event: &Envelope) -> Result<bool, tokio_postgres::Error> {
    let claimed = tx
        .execute(
            &tx.prepare_cached(CLAIM_EVENT).await?,
            &[
                &event.id,
                &event.delivery.topic,
                &event.delivery.partition,
                &event.delivery.offset,
            ],
        )
        .await?;
    Ok(claimed == 1)
}
