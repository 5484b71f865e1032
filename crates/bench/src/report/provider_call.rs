//! What the call to the card provider costs ChargeOrder: this run's rates against the
//! recorded runs from before the call, and its paragraph of the report.

use std::fmt::Write as _;

use serde::Serialize;

use crate::measure::{Drain, Percentiles};

use super::Capacity;
use super::markdown::fmt;

/// A run of ChargeOrder from before it called the provider, as its full run recorded it.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Recorded {
    pub date: &'static str,
    pub command: &'static str,
    pub mode: &'static str,
    pub consumer_batch: u32,
    /// ChargeOrder's events/s on its backlog then.
    pub per_second: f64,
    /// pgbench's rate for its transaction then, at the same connections.
    pub ceiling: f64,
    /// ApplyPaymentResult's and NotifyCustomer's events/s then: consumers the call did
    /// not change, and so the yardstick of how this run's machine compares with that one.
    pub apply_per_second: f64,
    pub notify_per_second: f64,
}

/// The last full runs without the call (docs/bench-history.md, "The provider call"), a
/// transaction per event and batches of 16.
pub const WITHOUT_CALL: [Recorded; 2] = [
    Recorded {
        date: "2026-12-01",
        command: "scripts/bench --save",
        mode: "full",
        consumer_batch: 1,
        per_second: 744.0,
        ceiling: 1434.0,
        apply_per_second: 699.0,
        notify_per_second: 1006.0,
    },
    Recorded {
        date: "2026-12-01",
        command: "scripts/bench --batch 16 --save",
        mode: "full",
        consumer_batch: 16,
        per_second: 1409.0,
        ceiling: 1183.0,
        apply_per_second: 1228.0,
        notify_per_second: 1832.0,
    },
];

/// What calling the provider costs ChargeOrder. payment-service cannot charge without the
/// call, so "without" is, in this run, pgbench's rate for the transaction alone and the
/// provider's own rate, and, across runs, the last recorded run without the call.
#[derive(Debug, Clone, Serialize)]
pub struct ProviderCall {
    pub partitions: u32,
    /// ChargeOrder's events/s on its backlog, the call included.
    pub with_call: f64,
    /// pgbench's for everything an event costs the server, one after the other per
    /// partition as the consumer runs them: ChargeOrder's SQL in its database
    /// (read-ahead, then the transaction) and the provider's charge in the provider's,
    /// 1 / (1 / charge + 1 / provider).
    pub ceiling_with_call: f64,
    /// pgbench's for ChargeOrder's transaction alone, this run: what the ceiling was
    /// before the call.
    pub ceiling_without_call: f64,
    /// A partition's time per event, the call included (ms).
    pub ms_per_event: f64,
    /// The provider alone, called as payment-service calls it (see [`Capacity`]).
    pub alone: Drain,
    pub alone_ms: Percentiles,
    pub alone_failed: u64,
    /// The last run without the call at this run's CONSUMER_BATCH_SIZE, if there is one.
    pub recorded_without: Option<Recorded>,
    /// `with_call` against the recorded run's rate.
    pub vs_recorded: Option<f64>,
    /// A partition's time per event in the recorded run (ms).
    pub recorded_ms_per_event: Option<f64>,
    /// This run's ApplyPaymentResult and NotifyCustomer against the recorded run's: near
    /// 100%, the machine did as much for a consumer as then, and the difference in
    /// ChargeOrder's rate is the call's.
    pub apply_vs_recorded: Option<f64>,
    pub notify_vs_recorded: Option<f64>,
    /// This run's ceiling for the transaction alone against the recorded run's. The
    /// consumers are bound by CPU more than by commits, so this says less about them
    /// than the two above.
    pub ceiling_vs_recorded: Option<f64>,
}

impl ProviderCall {
    pub fn new(
        capacity: &Capacity,
        partitions: u32,
        consumer_batch: u32,
        rate: impl Fn(&str) -> f64,
    ) -> Self {
        let with_call = capacity.charge.per_second;
        let ceiling_without_call = rate("charge without call");
        let recorded_without = WITHOUT_CALL
            .iter()
            .find(|r| r.consumer_batch == consumer_batch)
            .copied();
        Self {
            partitions,
            with_call,
            ceiling_with_call: 1.0 / (1.0 / rate("charge") + 1.0 / rate("provider")),
            ceiling_without_call,
            ms_per_event: 1000.0 * f64::from(partitions) / with_call,
            alone: capacity.provider_alone.clone(),
            alone_ms: capacity.provider_alone_ms.clone(),
            alone_failed: capacity.provider_alone_failed,
            recorded_without,
            vs_recorded: recorded_without.map(|r| with_call / r.per_second),
            recorded_ms_per_event: recorded_without
                .map(|r| 1000.0 * f64::from(partitions) / r.per_second),
            apply_vs_recorded: recorded_without
                .map(|r| capacity.apply.per_second / r.apply_per_second),
            notify_vs_recorded: recorded_without
                .map(|r| capacity.notify.per_second / r.notify_per_second),
            ceiling_vs_recorded: recorded_without.map(|r| ceiling_without_call / r.ceiling),
        }
    }
}

impl ProviderCall {
    pub(super) fn markdown(&self) -> String {
        let mut md = String::new();
        let ratio = |measured: f64, ceiling: f64| format!("{:.0}%", measured / ceiling * 100.0);
        let _ = writeln!(
            md,
            "\nThe provider call: ChargeOrder asks payment-provider for a charge for every order, between its read-ahead and its transaction ({} partitions):\n",
            self.partitions
        );
        md.push_str("| ChargeOrder | events/s | pgbench/s | ratio |\n|---|---:|---:|---:|\n");
        let _ = writeln!(
            md,
            "| with the call, this run (pgbench: read-ahead + transaction, and the provider's charge) | {} | {} | {} |",
            fmt(self.with_call),
            fmt(self.ceiling_with_call),
            ratio(self.with_call, self.ceiling_with_call)
        );
        if let Some(r) = &self.recorded_without {
            let _ = writeln!(
                md,
                "| without the call, recorded: `{}`, {} mode, {} (pgbench: the transaction) | {} | {} | {} |",
                r.command,
                r.mode,
                r.date,
                fmt(r.per_second),
                fmt(r.ceiling),
                ratio(r.per_second, r.ceiling)
            );
        }
        let _ = writeln!(
            md,
            "| pgbench this run, the transaction alone (no read-ahead, no provider) | | {} | |",
            fmt(self.ceiling_without_call)
        );
        let failed = match self.alone_failed {
            0 => String::new(),
            n => format!("; {n} calls failed"),
        };
        let alone = format!(
            "The provider alone, called as payment-service calls it ({} at a time, a key each): {} charges at {}/s, each call p50 {} ms, p99 {} ms{failed}.",
            self.partitions,
            self.alone.rows,
            fmt(self.alone.per_second),
            fmt(self.alone_ms.p50),
            fmt(self.alone_ms.p99),
        );
        match (
            &self.recorded_without,
            self.vs_recorded,
            self.recorded_ms_per_event,
            self.apply_vs_recorded,
            self.notify_vs_recorded,
            self.ceiling_vs_recorded,
        ) {
            (Some(r), Some(vs), Some(then_ms), Some(apply), Some(notify), Some(machine)) => {
                let _ = writeln!(
                    md,
                    "\nWith the call against the recorded run without it: {}/s vs {}/s, {:.0}%. A partition spends {} ms per event, {} ms then: {} ms more. {alone}",
                    fmt(self.with_call),
                    fmt(r.per_second),
                    vs * 100.0,
                    fmt(self.ms_per_event),
                    fmt(then_ms),
                    fmt(self.ms_per_event - then_ms),
                );
                let _ = writeln!(
                    md,
                    "The consumers the call did not change, the yardstick between the two runs, ran at {:.0}% (ApplyPaymentResult) and {:.0}% (NotifyCustomer) of their rates in that run; pgbench ran the transaction alone at {:.0}% of that run's rate.",
                    apply * 100.0,
                    notify * 100.0,
                    machine * 100.0,
                );
            }
            _ => {
                let _ = writeln!(
                    md,
                    "\nNo run without the call is recorded at this CONSUMER_BATCH_SIZE. A partition spends {} ms per event, the call included. {alone}",
                    fmt(self.ms_per_event),
                );
            }
        }
        md
    }
}
