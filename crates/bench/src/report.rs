//! The result of a run: one JSON document, a markdown table and a PNG chart.
//!
//! This file holds what the JSON document holds; under `report/`: `markdown` writes the
//! tables, `cpu` the section on where the CPU went, `provider_call` the paragraph on the
//! card provider's call, and `chart` the chart.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context as _;
use serde::Serialize;

use crate::load::LoadResult;
use crate::measure::{Drain, Effects, Percentiles, StepOutcome};
use crate::pgbench::Ceiling;
use crate::procs::{CpuSplit, Usage};

mod chart;
mod cpu;
mod markdown;
mod provider_call;
#[cfg(test)]
mod tests;

pub use cpu::UNMERGED_TRANSACTIONS;
pub use markdown::{
    HALF_LOAD_P99_BATCHED_TARGET_MS, HALF_LOAD_P99_TARGET_MS, OVERLOAD_P99_TARGET_MS,
};
pub use provider_call::{ProviderCall, Recorded, WITHOUT_CALL};

/// Where the run happened.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub memory_gib: f64,
    pub kernel: String,
    pub postgres: String,
    pub kafka: String,
    /// PostgreSQL and Kafka run on this machine, next to the services and the load.
    pub same_box: bool,
}

impl Machine {
    pub fn describe(postgres: String, kafka: String, same_box: bool) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map_or_else(|| "unknown".to_owned(), |(_, m)| m.trim().to_owned());
        let memory_kib: f64 = std::fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .unwrap_or(f64::NAN);
        Self {
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model,
            memory_gib: memory_kib / 1024.0 / 1024.0,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            postgres,
            kafka,
            same_box,
        }
    }
}

/// One load step: what was offered, what the client saw, what the saga did.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub name: String,
    /// Orders per second offered: the open loop's rate, or what the closed loop placed.
    pub offered_per_second: f64,
    pub load: LoadResult,
    pub post_ms: Percentiles,
    pub outcome: StepOutcome,
    /// The saga kept up: it confirmed and notified at least 95% of the rate orders were
    /// placed at, and the last order was confirmed within 2 s of the last POST.
    pub sustained: bool,
    pub usage: BTreeMap<String, Usage>,
    /// From the first POST until every order of the step was notified (or the wait for
    /// them ended).
    pub cpu: CpuSplit,
    pub load_average: [f64; 3],
}

impl Step {
    /// `seconds` of CPU over the step, in ms per order placed in it.
    fn cpu_ms_per_order(&self, seconds: f64) -> f64 {
        seconds * 1000.0 / self.load.placed as f64
    }
}

/// Each transaction at full speed with a backlog waiting for it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Capacity {
    pub orders: u32,
    /// `POST /v1/orders` alone (no consumer or relay working), orders per second.
    pub create: Drain,
    /// The same, each request with an `Idempotency-Key` of its own.
    pub create_keyed: Drain,
    /// ChargeOrder: the read-ahead, the provider's call and the transaction, per event.
    pub charge: Drain,
    /// The provider alone, asked for a charge per order of the backlog as payment-service
    /// asks, one call per partition in flight: charges per second from its database.
    pub provider_alone: Drain,
    /// Those calls' time from the caller's side.
    pub provider_alone_ms: Percentiles,
    pub provider_alone_failed: u64,
    pub apply: Drain,
    pub notify: Drain,
    /// Relay publishing a backlog, per database.
    pub relay_orders_created: Drain,
    pub relay_payments: Drain,
    pub relay_outcomes: Drain,
    pub relay_notifications: Drain,
    pub usage: BTreeMap<String, BTreeMap<String, Usage>>,
    pub load_average: [f64; 3],
}

impl Capacity {
    /// CPU milliseconds `service` spent per event during `phase`: a figure that, unlike
    /// the rates, hardly moves with what else the machine is doing.
    pub fn cpu_ms_per_event(&self, phase: &str, service: &str) -> f64 {
        let drain = match phase {
            "create" => &self.create,
            "create keyed" => &self.create_keyed,
            "relay order.created" => &self.relay_orders_created,
            "charge" => &self.charge,
            "provider alone" => &self.provider_alone,
            "relay payments" => &self.relay_payments,
            "apply" => &self.apply,
            "relay outcomes" => &self.relay_outcomes,
            "notify" => &self.notify,
            "relay notifications" => &self.relay_notifications,
            _ => return f64::NAN,
        };
        self.usage
            .get(phase)
            .and_then(|usage| usage.get(service))
            .map_or(f64::NAN, |u| u.cpu_seconds * 1000.0 / drain.rows as f64)
    }
}

/// Phase 4: payment-service's consumer with its pruner deleting a backlog of old ids, and
/// without.
#[derive(Debug, Clone, Serialize)]
pub struct Pruning {
    pub old_ids: u32,
    /// From the service's start until no id past the window was left.
    pub prune_seconds: f64,
    pub pruned_per_second: f64,
    /// The same backlog's drain with the pruner off, then on.
    pub without: Drain,
    pub with: Drain,
}

/// Phase 5: what cancellations cost end to end, and the refund path's own rate.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Cancellations {
    /// The same backlog settled with none of its orders cancelled, and with one in ten.
    pub none: Settled,
    pub tenth: Settled,
    /// payment-service through a backlog of cancellations of charged orders, each refunded:
    /// answers per second.
    pub refund_path: Drain,
}

/// Phase 6: the same backlog settled with spans exported and without.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Traces {
    /// The steps exporting nothing, and those exporting every span (to a receiver that
    /// drops them), in the order off, on, on, off, twice.
    pub off: Vec<Settled>,
    pub on: Vec<Settled>,
    pub off_per_second: f64,
    pub on_per_second: f64,
    /// Spans the receiver got in the steps exporting.
    pub spans: u64,
    pub spans_per_order: f64,
    /// Milliseconds of CPU per order, by part of the machine, over each mode's steps:
    /// who pays for the traces.
    pub cpu_off: CpuPerOrder,
    pub cpu_on: CpuPerOrder,
    /// Bytes of PostgreSQL's write-ahead log per order, over each mode's steps. The two
    /// modes write the same rows (but for the trace context's few bytes), so a gap between
    /// them says that their steps did not start from a database in the same state.
    pub wal_off: f64,
    pub wal_on: f64,
}

/// Milliseconds of CPU time per order settled, by part of the machine.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CpuPerOrder {
    /// Each service, and the card provider, by name.
    pub services: BTreeMap<String, f64>,
    pub postgres: f64,
    pub kafka: f64,
    pub load_generator: f64,
    /// All cores' busy time.
    pub machine: f64,
}

/// A backlog of orders until every one settled.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Settled {
    pub orders: i64,
    pub cancelled: i64,
    pub refunded: i64,
    /// From the first order placed to the last settled.
    pub seconds: f64,
    pub per_second: f64,
}

/// The pgbench transactions an order costs the server, and how many of each: one create,
/// charge (its read-ahead included), the provider's charge, apply and notify, and four
/// outbox rows published (order.created, payment result, outcome, notification.sent).
pub const ORDER_TRANSACTIONS: [(&str, f64); 6] = [
    ("create", 1.0),
    ("charge", 1.0),
    ("provider", 1.0),
    ("apply", 1.0),
    ("notify", 1.0),
    ("relay", 4.0),
];

/// A measured rate against its ceiling, and the target if the issue sets one.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    pub what: String,
    pub measured: f64,
    pub ceiling: f64,
    pub ratio: f64,
    pub target: Option<f64>,
    pub met: Option<bool>,
}

impl Ratio {
    pub fn new(what: impl Into<String>, measured: f64, ceiling: f64, target: Option<f64>) -> Self {
        let ratio = measured / ceiling;
        Self {
            what: what.into(),
            measured,
            ceiling,
            ratio,
            target,
            met: target.map(|t| ratio >= t),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ServiceSummary {
    pub cpu_seconds: f64,
    pub peak_rss_mib: f64,
    pub rss_target_mib: f64,
    pub rss_met: bool,
    /// Events the log says were applied, duplicates absorbed, late events guarded.
    pub outcomes: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub mode: String,
    pub command: String,
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: time::OffsetDateTime,
    pub machine: Machine,
    pub settings: BTreeMap<String, String>,
    pub steps: Vec<Step>,
    /// Highest rate orders were confirmed and notified at in a step that kept up.
    pub max_sustained_per_second: f64,
    pub half_load_step: Option<String>,
    pub capacity: Capacity,
    pub provider_call: ProviderCall,
    pub pruning: Pruning,
    pub cancellations: Cancellations,
    pub traces: Traces,
    pub ceilings: Vec<Ceiling>,
    /// Orders per second pgbench's rates allow, all transactions of an order sharing one
    /// server: 1 / Σ (transactions of that kind per order / its tps), the provider's
    /// charge among them.
    pub ceiling_orders_per_second: f64,
    /// The end-to-end ratio's target: the share of the ceiling the saga should settle.
    pub end_to_end_target: f64,
    pub ratios: Vec<Ratio>,
    pub services: BTreeMap<String, ServiceSummary>,
    pub effects: Effects,
    pub dead_letters: i64,
    pub load_average_at_end: [f64; 3],
}

impl Report {
    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(path, serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("writing {}", path.display()))
    }
}
