//! What the provider did since it started, for a person (and a test) to read at
//! `GET /admin/stats`; each count is also a Prometheus counter at `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

use crate::faults::Endpoint;

/// One endpoint's counts.
#[derive(Debug, Default)]
pub struct Counters {
    /// `POST`s received, whatever became of them.
    pub calls: AtomicU64,
    /// New charges that succeeded, or new refunds.
    pub made: AtomicU64,
    /// New charges that were declined (refunds are never declined: a refund that cannot
    /// be made is an error, and stores nothing, unless a `refuse` fault refused it).
    pub declined: AtomicU64,
    /// Calls answered with the stored answer of their key.
    pub replayed: AtomicU64,
    /// Calls answered 503 by an `unavailable` fault.
    pub unavailable: AtomicU64,
    /// Calls slowed by a `slow` fault.
    pub slowed: AtomicU64,
    /// Calls whose work was committed and whose answer was dropped on purpose.
    pub lost_responses: AtomicU64,
    /// Calls whose commit a `commit-late` fault held (a replay has none to hold).
    pub committed_late: AtomicU64,
    /// Refunds a `refuse` fault refused, the refusal stored with the key (its replays
    /// are counted as replays).
    pub refused: AtomicU64,
}

#[derive(Debug, Default)]
pub struct Stats {
    pub charges: Counters,
    pub refunds: Counters,
}

/// One thing [`Stats`] counts.
#[derive(Debug, Clone, Copy)]
pub enum Counted {
    Call,
    Made,
    Declined,
    Replayed,
    Unavailable,
    Slowed,
    LostResponse,
    CommittedLate,
    Refused,
}

impl Stats {
    pub fn count(&self, endpoint: Endpoint, what: Counted) {
        use saga::metrics::{
            CHARGE_FAULTS, CHARGE_REQUESTS, CHARGES, REFUND_FAULTS, REFUND_REQUESTS, REFUNDS,
        };
        let (counters, requests, made, faults) = match endpoint {
            Endpoint::Charges => (&self.charges, CHARGE_REQUESTS, CHARGES, CHARGE_FAULTS),
            Endpoint::Refunds => (&self.refunds, REFUND_REQUESTS, REFUNDS, REFUND_FAULTS),
        };
        // Replays are counted at /metrics by the reply itself (saga::idempotency).
        let (counter, metric) = match what {
            Counted::Call => (&counters.calls, Some(metrics::counter!(requests))),
            Counted::Made => (
                &counters.made,
                Some(metrics::counter!(made, "result" => "succeeded")),
            ),
            Counted::Declined => (
                &counters.declined,
                Some(metrics::counter!(made, "result" => "declined")),
            ),
            Counted::Replayed => (&counters.replayed, None),
            Counted::Unavailable => (
                &counters.unavailable,
                Some(metrics::counter!(faults, "kind" => "unavailable")),
            ),
            Counted::Slowed => (
                &counters.slowed,
                Some(metrics::counter!(faults, "kind" => "slow")),
            ),
            Counted::LostResponse => (
                &counters.lost_responses,
                Some(metrics::counter!(faults, "kind" => "lose_response")),
            ),
            Counted::CommittedLate => (
                &counters.committed_late,
                Some(metrics::counter!(faults, "kind" => "commit_late")),
            ),
            Counted::Refused => (
                &counters.refused,
                Some(metrics::counter!(faults, "kind" => "refuse")),
            ),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if let Some(metric) = metric {
            metric.increment(1);
        }
    }

    /// The charges' counts at the top, where they were before refunds were counted, and
    /// the refunds' under `refunds`.
    pub fn to_json(&self) -> Value {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let (charges, refunds) = (&self.charges, &self.refunds);
        serde_json::json!({
            "calls": read(&charges.calls),
            "charged": read(&charges.made),
            "declined": read(&charges.declined),
            "replayed": read(&charges.replayed),
            "unavailable": read(&charges.unavailable),
            "slowed": read(&charges.slowed),
            "lost_responses": read(&charges.lost_responses),
            "committed_late": read(&charges.committed_late),
            "refunds": {
                "calls": read(&refunds.calls),
                "refunded": read(&refunds.made),
                "replayed": read(&refunds.replayed),
                "unavailable": read(&refunds.unavailable),
                "slowed": read(&refunds.slowed),
                "lost_responses": read(&refunds.lost_responses),
                "committed_late": read(&refunds.committed_late),
                "refused": read(&refunds.refused),
            },
        })
    }
}
