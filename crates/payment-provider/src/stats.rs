//! What the provider did since it started, for a person (and a test) to read at
//! `GET /admin/stats`; each count of charges and refunds is also a Prometheus counter at
//! `/metrics` (the list's are counted here alone).

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

use crate::faults::Endpoint;

/// One endpoint's counts.
#[derive(Debug, Default)]
pub struct Counters {
    /// Calls received (the `POST`s; the list's `GET`s), whatever became of them.
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
    /// Lists a `list-lag` fault made lag.
    pub lagged: AtomicU64,
}

#[derive(Debug, Default)]
pub struct Stats {
    pub charges: Counters,
    pub refunds: Counters,
    /// `GET /v1/charges`: its `calls` and `lagged` alone.
    pub list: Counters,
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
    Lagged,
}

impl Stats {
    pub fn count(&self, endpoint: Endpoint, what: Counted) {
        use saga::metrics::{
            CHARGE_FAULTS, CHARGE_REQUESTS, CHARGES, REFUND_FAULTS, REFUND_REQUESTS, REFUNDS,
        };
        let (counters, names) = match endpoint {
            Endpoint::Charges => (
                &self.charges,
                Some((CHARGE_REQUESTS, CHARGES, CHARGE_FAULTS)),
            ),
            Endpoint::Refunds => (
                &self.refunds,
                Some((REFUND_REQUESTS, REFUNDS, REFUND_FAULTS)),
            ),
            // No metric of its own: its calls and lags are counted here alone.
            Endpoint::List => (&self.list, None),
        };
        let counter = match what {
            Counted::Call => &counters.calls,
            Counted::Made => &counters.made,
            Counted::Declined => &counters.declined,
            Counted::Replayed => &counters.replayed,
            Counted::Unavailable => &counters.unavailable,
            Counted::Slowed => &counters.slowed,
            Counted::LostResponse => &counters.lost_responses,
            Counted::CommittedLate => &counters.committed_late,
            Counted::Refused => &counters.refused,
            Counted::Lagged => &counters.lagged,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let Some((requests, made, faults)) = names else {
            return;
        };
        let metric = match what {
            Counted::Call => metrics::counter!(requests),
            Counted::Made => metrics::counter!(made, "result" => "succeeded"),
            Counted::Declined => metrics::counter!(made, "result" => "declined"),
            // Counted at /metrics by the reply itself (saga::idempotency).
            Counted::Replayed => return,
            Counted::Unavailable => metrics::counter!(faults, "kind" => "unavailable"),
            Counted::Slowed => metrics::counter!(faults, "kind" => "slow"),
            Counted::LostResponse => metrics::counter!(faults, "kind" => "lose_response"),
            Counted::CommittedLate => metrics::counter!(faults, "kind" => "commit_late"),
            Counted::Refused => metrics::counter!(faults, "kind" => "refuse"),
            Counted::Lagged => metrics::counter!(faults, "kind" => "list_lag"),
        };
        metric.increment(1);
    }

    /// The charges' counts at the top, where they were before refunds were counted, the
    /// refunds' under `refunds`, and the list's under `list`.
    pub fn to_json(&self) -> Value {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let (charges, refunds, list) = (&self.charges, &self.refunds, &self.list);
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
            "list": {
                "calls": read(&list.calls),
                "lagged": read(&list.lagged),
            },
        })
    }
}
