//! The result of a run: one JSON document, a markdown table and a PNG chart.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;
use serde::Serialize;

use crate::load::LoadResult;
use crate::measure::{Drain, Effects, Percentiles, StepOutcome};
use crate::pgbench::Ceiling;
use crate::procs::{CpuSplit, Usage};

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

/// Those of [`ORDER_TRANSACTIONS`] that no consumer batch merges: each POST and each
/// charge at the provider is a request of its own, answered from a transaction of its
/// own, and the relay reads and marks its rows in batches already.
pub const UNMERGED_TRANSACTIONS: [(&str, f64); 3] =
    [("create", 1.0), ("provider", 1.0), ("relay", 4.0)];

/// POST → `confirmed` p99 at half the highest sustained rate: a transaction per event,
/// and in batches (ms).
pub const HALF_LOAD_P99_TARGET_MS: f64 = 50.0;
pub const HALF_LOAD_P99_BATCHED_TARGET_MS: f64 = 100.0;
/// POST → `confirmed` p99 under closed loops of 8 and 32 clients, the excess refused (ms).
pub const OVERLOAD_P99_TARGET_MS: f64 = 2_000.0;

impl Report {
    fn batched(&self) -> bool {
        self.settings
            .get("CONSUMER_BATCH_SIZE")
            .is_some_and(|size| size != "1")
    }

    /// The latency figures that have targets, each against its own.
    fn latency_targets(&self) -> String {
        let mut md = String::from(
            "\n| latency target | step | POST→confirmed p99 (ms) | refused | target |\n|---|---|---:|---:|---|\n",
        );
        let mut row = |label: &str, step: &Step, target: f64| {
            let p99 = step.outcome.to_confirmed_ms.p99;
            let verdict = if p99 <= target { "met" } else { "**missed**" };
            let _ = writeln!(
                md,
                "| {label} | {} | {} | {:.0}% | ≤ {} ms {verdict} |",
                step.name,
                fmt(p99),
                step.load.refused_percent(),
                fmt(target)
            );
        };
        let half = self
            .half_load_step
            .as_ref()
            .and_then(|name| self.steps.iter().find(|s| &s.name == name));
        if let Some(step) = half {
            let target = if self.batched() {
                HALF_LOAD_P99_BATCHED_TARGET_MS
            } else {
                HALF_LOAD_P99_TARGET_MS
            };
            row("half load", step, target);
        }
        // The overload: 8 and 32 clients, each placing its next order as soon as
        // the last is answered, more than the saga settles on this machine.
        let overloading = |step: &&Step| {
            step.name
                .strip_prefix("closed c=")
                .and_then(|clients| clients.parse::<u32>().ok())
                .is_some_and(|clients| clients >= 8)
        };
        for step in self.steps.iter().filter(overloading) {
            row("overload, nothing lost", step, OVERLOAD_P99_TARGET_MS);
        }
        md
    }
}

impl Report {
    /// Where the machine's CPU went per order, at the ceiling and at each step, and what
    /// the end-to-end target leaves for everything but PostgreSQL.
    fn cpu_per_order(&self) -> String {
        let cores = self.machine.cpus as f64;
        let mut md = format!(
            "\nWhere the CPU goes, in ms of CPU time per order (the {} cores give {} ms a second). \"rest\" is busy time no part accounts for: the kernel's own work and anything else on the machine. The bound is the rate these cores allow at that CPU per order, if CPU were all an order needs:\n\n",
            self.machine.cpus,
            fmt(cores * 1000.0)
        );
        md.push_str("| phase | orders/s | PostgreSQL | Kafka | the four services | load generator | rest | machine busy | bound (orders/s) |\n");
        md.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        let mut row = |label: &str, rate: f64, ms: [f64; 5]| {
            let [postgres, kafka, services, load, busy] = ms;
            // A part the phase did not have (NaN: the ceiling's broker and services) takes
            // nothing from the rest.
            let rest = busy - postgres - kafka.max(0.0) - services.max(0.0) - load;
            let _ = writeln!(
                md,
                "| {label} | {} | {} | {} | {} | {} | {} | {} | {} |",
                fmt(rate),
                fmt(postgres),
                fmt(kafka),
                fmt(services),
                fmt(load),
                fmt(rest),
                fmt(busy),
                fmt(cores * 1000.0 / busy)
            );
        };
        let ceiling = self.ceiling_cpu_ms_per_order();
        row(
            "pgbench: each transaction of an order on its own, the ceiling (load generator: pgbench)",
            self.ceiling_orders_per_second,
            [
                ceiling.postgres,
                f64::NAN,
                f64::NAN,
                ceiling.load_generator,
                ceiling.machine,
            ],
        );
        for step in &self.steps {
            let per_order = |seconds: f64| step.cpu_ms_per_order(seconds);
            let services: f64 = step.usage.values().map(|u| u.cpu_seconds).sum();
            row(
                &format!(
                    "{}{}",
                    step.name,
                    if step.sustained { "" } else { " (behind)" }
                ),
                step.load.placed_per_second(),
                [
                    per_order(step.cpu.postgres),
                    per_order(step.cpu.kafka),
                    per_order(services),
                    per_order(step.cpu.load_generator),
                    per_order(step.cpu.machine),
                ],
            );
        }
        // The step the end-to-end ratio takes its rate from.
        let highest = self.steps.iter().filter(|s| s.sustained).max_by(|a, b| {
            a.outcome
                .settled_per_second()
                .total_cmp(&b.outcome.settled_per_second())
        });
        if let Some(step) = highest {
            let goal = self.end_to_end_target * self.ceiling_orders_per_second;
            let budget = cores * 1000.0 / goal;
            let postgres = step.cpu_ms_per_order(step.cpu.postgres);
            let busy = step.cpu_ms_per_order(step.cpu.machine);
            let _ = writeln!(
                md,
                "\nThe end-to-end target, {:.0}% of the ceiling ({}/s), leaves an order {} ms of these cores' time. At the fastest step that kept up ({}), PostgreSQL alone took {} ms per order ({} ms at the ceiling), and the machine {} ms in all: {:.1} times the budget.",
                self.end_to_end_target * 100.0,
                fmt(goal),
                fmt(budget),
                step.name,
                fmt(postgres),
                fmt(ceiling.postgres),
                fmt(busy),
                busy / budget,
            );
            if self.batched()
                && let Some((step, others)) = self.cheapest_but_postgres()
            {
                let unmerged = ceiling_cpu_ms(&self.ceilings, &UNMERGED_TRANSACTIONS).postgres;
                let _ = write!(
                    md,
                    "\nBatches merge only the consumers' transactions. The rest of an order's SQL (its POST's transaction, the provider's charge, and relaying its four rows) took PostgreSQL {} ms at the ceiling, and everything but PostgreSQL (the broker, the services, the load generator, the rest) took {} ms an order at its cheapest step ({}): {} ms were the consumers' transactions free, {:.1} times the budget.",
                    fmt(unmerged),
                    fmt(others),
                    step.name,
                    fmt(unmerged + others),
                    (unmerged + others) / budget,
                );
                // Each consumer's batched run, once an order: ChargeOrder's with its
                // read-ahead.
                let batched = crate::pgbench::BATCHED.map(|(_, name)| (name, 1.0));
                let consumers = ceiling_cpu_ms(&self.ceilings, &batched).postgres;
                if consumers.is_finite() {
                    let floor = unmerged + consumers + others;
                    let _ = write!(
                        md,
                        " The consumers' three transactions, as they run in batches (pgbench's `… batched` runs), took PostgreSQL {} ms an order more: {} ms at the least, {:.1} times the budget.",
                        fmt(consumers),
                        fmt(floor),
                        floor / budget,
                    );
                }
                md.push('\n');
            }
        }
        md
    }

    /// The step where everything but PostgreSQL cost an order least, and that cost (ms):
    /// a floor built on it is a floor only if no step did better.
    fn cheapest_but_postgres(&self) -> Option<(&Step, f64)> {
        self.steps
            .iter()
            .map(|s| (s, s.cpu_ms_per_order(s.cpu.machine - s.cpu.postgres)))
            .filter(|(_, others)| others.is_finite())
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// The ceiling's CPU per order ([`ORDER_TRANSACTIONS`]).
    fn ceiling_cpu_ms_per_order(&self) -> CpuSplit {
        ceiling_cpu_ms(&self.ceilings, &ORDER_TRANSACTIONS)
    }
}

/// The CPU per order of `transactions` (each a pgbench run's name, and how many of its
/// events an order has), from the pgbench runs in `ceilings`: each run's CPU per event,
/// times the events of its kind in an order.
fn ceiling_cpu_ms(ceilings: &[Ceiling], transactions: &[(&str, f64)]) -> CpuSplit {
    let mut split = CpuSplit::default();
    for &(name, per_order) in transactions {
        let Some(c) = ceilings.iter().find(|c| c.name == name) else {
            return CpuSplit::UNMEASURED;
        };
        let ms = |seconds: f64| seconds * 1000.0 / c.events * per_order;
        split.machine += ms(c.cpu.machine);
        split.postgres += ms(c.cpu.postgres);
        split.load_generator += ms(c.cpu.load_generator);
    }
    // pgbench's runs have no broker, and their share of the machine is per run.
    CpuSplit {
        machine_percent: f64::NAN,
        kafka: f64::NAN,
        ..split
    }
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

impl ProviderCall {
    fn markdown(&self) -> String {
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

/// A line of the chart: its label, colour, and value for a step.
type Series = (&'static str, plotters::style::RGBColor, fn(&Step) -> f64);

fn fmt(value: f64) -> String {
    if value.is_nan() {
        "–".into()
    } else if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

fn loads(load: &[f64; 3]) -> String {
    format!("{:.2} {:.2} {:.2}", load[0], load[1], load[2])
}

impl Report {
    pub fn markdown(&self) -> String {
        let mut md = String::new();
        let m = &self.machine;
        let _ = writeln!(
            md,
            "Machine: {} CPUs ({}), {:.0} GiB, Linux {}; {}; {}; PostgreSQL and Kafka {} as the services and the load generator.\n",
            m.cpus,
            m.cpu_model,
            m.memory_gib,
            m.kernel,
            m.postgres,
            m.kafka,
            if m.same_box {
                "on the same machine"
            } else {
                "not on the same machine"
            }
        );
        let _ = writeln!(md, "`{}` ({} mode)\n", self.command, self.mode);
        let settings: Vec<String> = self
            .settings
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect();
        let _ = writeln!(md, "Settings: {}.\n", settings.join(", "));

        md.push_str("| step | offered/s | placed/s | refused | confirmed/s | notified/s | POST→confirmed p50 / p95 / p99 / max (ms) | →notified p50 / p99 (ms) | drain (s) | machine busy | load avg |\n");
        md.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
        for step in &self.steps {
            let o = &step.outcome;
            let _ = writeln!(
                md,
                "| {}{} | {} | {} | {:.0}% | {} | {} | {} / {} / {} / {} | {} / {} | {} | {:.0}% | {} |",
                step.name,
                if step.sustained { "" } else { " (behind)" },
                fmt(step.offered_per_second),
                fmt(step.load.placed_per_second()),
                step.load.refused_percent(),
                fmt(o.confirmed.per_second),
                fmt(o.notified.per_second),
                fmt(o.to_confirmed_ms.p50),
                fmt(o.to_confirmed_ms.p95),
                fmt(o.to_confirmed_ms.p99),
                fmt(o.to_confirmed_ms.max),
                fmt(o.to_notified_ms.p50),
                fmt(o.to_notified_ms.p99),
                fmt(o.confirmed_drain_seconds),
                step.cpu.machine_percent,
                loads(&step.load_average),
            );
        }

        md.push_str(&self.latency_targets());

        if let Some(step) = self
            .half_load_step
            .as_ref()
            .and_then(|name| self.steps.iter().find(|s| &s.name == name))
        {
            let _ = writeln!(
                md,
                "\nWhere the time goes at half the highest sustained load ({}); each hop from the transaction that wrote the event to the one that applied it in the next service: the relay's look, the broker, the fetch, the consumer's queue:\n",
                step.name
            );
            md.push_str("| hop | p50 (ms) | p99 (ms) | max (ms) |\n|---|---:|---:|---:|\n");
            for (hop, ms) in &step.outcome.hops_ms {
                let _ = writeln!(
                    md,
                    "| {hop} | {} | {} | {} |",
                    fmt(ms.p50),
                    fmt(ms.p99),
                    fmt(ms.max)
                );
            }
        }

        let c = &self.capacity;
        let _ = writeln!(
            md,
            "\nEach transaction alone on a backlog of {} orders (load average {}):\n",
            c.orders,
            loads(&c.load_average)
        );
        md.push_str("| work | service | events | events/s | service CPU per event (ms) |\n");
        md.push_str("|---|---|---:|---:|---:|\n");
        for (phase, service, drain) in [
            ("create", "order-service", &c.create),
            ("create keyed", "order-service", &c.create_keyed),
            (
                "relay order.created",
                "order-service",
                &c.relay_orders_created,
            ),
            ("charge", "payment-service", &c.charge),
            ("charge", "payment-provider", &c.charge),
            ("provider alone", "payment-provider", &c.provider_alone),
            ("relay payments", "payment-service", &c.relay_payments),
            ("apply", "order-service", &c.apply),
            ("relay outcomes", "order-service", &c.relay_outcomes),
            ("notify", "notification-service", &c.notify),
            (
                "relay notifications",
                "notification-service",
                &c.relay_notifications,
            ),
        ] {
            let _ = writeln!(
                md,
                "| {phase} | {service} | {} | {} | {} |",
                drain.rows,
                fmt(drain.per_second),
                fmt(c.cpu_ms_per_event(phase, service))
            );
        }

        md.push_str("\n| measured against pgbench | measured/s | pgbench/s | ratio | target |\n");
        md.push_str("|---|---:|---:|---:|---|\n");
        for ratio in &self.ratios {
            let target = match (ratio.target, ratio.met) {
                (Some(t), Some(true)) => format!("≥ {:.0}% met", t * 100.0),
                (Some(t), _) => format!("≥ {:.0}% **missed**", t * 100.0),
                _ => String::new(),
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.0}% | {} |",
                ratio.what,
                fmt(ratio.measured),
                fmt(ratio.ceiling),
                ratio.ratio * 100.0,
                target
            );
        }

        md.push_str(&self.provider_call.markdown());

        md.push_str("\n| pgbench transaction | connections | tps | events/s | avg latency (ms) | load avg |\n");
        md.push_str("|---|---:|---:|---:|---:|---|\n");
        for c in &self.ceilings {
            let _ = writeln!(
                md,
                "| {} ({}) | {} | {} | {} | {} | {} |",
                c.name,
                c.what,
                c.connections,
                fmt(c.tps),
                fmt(c.events_per_second),
                fmt(c.average_latency_ms),
                loads(&c.load_average)
            );
        }
        let p = &self.pruning;
        let _ = writeln!(
            md,
            "\nPruning: payment-service's pruner deleted {} ids past their window in {} s ({} rows/s), while its consumer charged {} orders at {}/s (with the pruner off: {}/s).",
            p.old_ids,
            fmt(p.prune_seconds),
            fmt(p.pruned_per_second),
            p.with.rows,
            fmt(p.with.per_second),
            fmt(p.without.per_second)
        );
        let _ = writeln!(
            md,
            "\nCeiling: {} orders/s. Max sustained end to end: {} orders/s.",
            fmt(self.ceiling_orders_per_second),
            fmt(self.max_sustained_per_second)
        );
        if self.machine.same_box {
            md.push_str(&self.cpu_per_order());
        }

        let rss_target = self
            .services
            .values()
            .next()
            .map_or(0.0, |s| s.rss_target_mib);
        let _ = writeln!(
            md,
            "\n| service | CPU (s, whole run) | peak RSS (MiB) | ≤ {rss_target:.0} MiB | applied | duplicates absorbed | guarded |"
        );
        md.push_str("|---|---:|---:|---|---:|---:|---:|\n");
        for (name, s) in &self.services {
            let count = |k: &str| s.outcomes.get(k).copied().unwrap_or(0);
            let _ = writeln!(
                md,
                "| {name} | {:.1} | {:.1} | {} | {} | {} | {} |",
                s.cpu_seconds,
                s.peak_rss_mib,
                if s.rss_met { "met" } else { "**missed**" },
                count("applied"),
                count("duplicate"),
                count("guarded"),
            );
        }
        let e = &self.effects;
        let _ = writeln!(
            md,
            "\nExactly once: {} orders, {} charges at the provider, {} payments, {} outcomes, {} notifications; extra effects {}, missing {}, still pending {}, unpublished outbox rows {}, dead letters {}.",
            e.orders,
            e.charges,
            e.payments,
            e.outcome_events,
            e.notifications,
            e.extra_effects,
            e.missing_effects,
            e.still_pending,
            e.unpublished,
            self.dead_letters
        );
        let _ = writeln!(
            md,
            "Load average at the end: {}.",
            loads(&self.load_average_at_end)
        );
        md
    }

    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(path, serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("writing {}", path.display()))
    }

    /// Throughput and latency percentiles against offered load, side by side.
    pub fn chart(&self, path: &Path, font: &Path) -> anyhow::Result<()> {
        use plotters::prelude::*;

        let bytes = std::fs::read(font).with_context(|| {
            format!(
                "reading the chart's font {} (apt-get install fonts-dejavu-core)",
                font.display()
            )
        })?;
        // Registered once per process; plotters keeps a 'static reference.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| anyhow::anyhow!("{} is not a usable font", font.display()))?;

        let mut steps: Vec<&Step> = self.steps.iter().collect();
        steps.sort_by(|a, b| a.offered_per_second.total_cmp(&b.offered_per_second));
        let max_x = steps
            .iter()
            .map(|s| s.offered_per_second)
            .fold(1.0, f64::max)
            * 1.1;
        let max_y = steps
            .iter()
            .flat_map(|s| {
                [
                    s.outcome.confirmed.per_second,
                    s.outcome.notified.per_second,
                    s.load.placed_per_second(),
                ]
            })
            .filter(|v| v.is_finite())
            .fold(self.ceiling_orders_per_second.max(1.0), f64::max)
            * 1.1;

        let root = BitMapBackend::new(path, (1400, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let title = format!(
            "order-saga, {} mode: {} CPUs, PostgreSQL + Kafka on the same machine",
            self.mode, self.machine.cpus
        );
        let root = root.titled(&title, ("sans-serif", 22))?;
        let (left, right) = root.split_horizontally(700);

        let mut throughput = ChartBuilder::on(&left)
            .caption("Throughput (orders/s)", ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..max_x, 0.0..max_y)?;
        throughput
            .configure_mesh()
            .x_desc("offered load (orders/s)")
            .y_desc("orders/s")
            .draw()?;
        let series: [Series; 3] = [
            ("placed (POST 201)", RGBColor(120, 120, 120), |s| {
                s.load.placed_per_second()
            }),
            ("confirmed", RGBColor(31, 119, 180), |s| {
                s.outcome.confirmed.per_second
            }),
            ("notified", RGBColor(44, 160, 44), |s| {
                s.outcome.notified.per_second
            }),
        ];
        for (label, color, value) in series {
            let points: Vec<(f64, f64)> = steps
                .iter()
                .map(|s| (s.offered_per_second, value(s)))
                .filter(|(_, y)| y.is_finite())
                .collect();
            throughput
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            throughput.draw_series(points.iter().map(|p| Circle::new(*p, 4, color.filled())))?;
        }
        let ceiling = self.ceiling_orders_per_second;
        if ceiling.is_finite() {
            let red = RGBColor(214, 39, 40);
            throughput
                .draw_series(LineSeries::new(
                    vec![(0.0, ceiling), (max_x, ceiling)],
                    red.stroke_width(1),
                ))?
                .label("pgbench ceiling")
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], red));
        }
        throughput
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()?;

        let max_latency = steps
            .iter()
            .map(|s| s.outcome.to_confirmed_ms.max)
            .filter(|v| v.is_finite())
            .fold(10.0, f64::max)
            * 1.5;
        let min_latency = steps
            .iter()
            .map(|s| s.outcome.to_confirmed_ms.p50)
            .filter(|v| v.is_finite() && *v > 0.0)
            .fold(max_latency, f64::min)
            / 1.5;
        let mut latency = ChartBuilder::on(&right)
            .caption("POST → confirmed latency (ms)", ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..max_x, (min_latency..max_latency).log_scale())?;
        latency
            .configure_mesh()
            .x_desc("offered load (orders/s)")
            .y_desc("ms (log)")
            .draw()?;
        let percentiles: [Series; 4] = [
            ("p50", RGBColor(31, 119, 180), |s| {
                s.outcome.to_confirmed_ms.p50
            }),
            ("p95", RGBColor(255, 127, 14), |s| {
                s.outcome.to_confirmed_ms.p95
            }),
            ("p99", RGBColor(214, 39, 40), |s| {
                s.outcome.to_confirmed_ms.p99
            }),
            ("max", RGBColor(120, 120, 120), |s| {
                s.outcome.to_confirmed_ms.max
            }),
        ];
        for (label, color, value) in percentiles {
            let points: Vec<(f64, f64)> = steps
                .iter()
                .map(|s| (s.offered_per_second, value(s)))
                .filter(|(_, y)| y.is_finite() && *y > 0.0)
                .collect();
            latency
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            latency.draw_series(points.iter().map(|p| Circle::new(*p, 4, color.filled())))?;
        }
        latency
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()?;
        root.present()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_order_costs_each_of_its_transactions_times_its_events_of_that_kind() {
        let ceiling = |name: &'static str, events: f64, postgres: f64| Ceiling {
            name,
            what: "",
            database: crate::sql::Database::Orders,
            connections: 1,
            tps: f64::NAN,
            events_per_second: f64::NAN,
            events,
            cpu: CpuSplit {
                machine: 2.0 * postgres,
                postgres,
                load_generator: 0.1 * postgres,
                ..CpuSplit::default()
            },
            average_latency_ms: f64::NAN,
            script: Default::default(),
            load_average: [0.0; 3],
        };
        let ceilings = [
            ceiling("create", 1000.0, 0.4),
            ceiling("provider", 2000.0, 0.6),
            ceiling("charge", 1000.0, 0.5),
            ceiling("relay", 100_000.0, 2.0),
        ];
        // 0.4 + 0.3 + 4 × 0.02 ms: the relay's pgbench run stands for rows, four an order.
        let unmerged = ceiling_cpu_ms(&ceilings, &UNMERGED_TRANSACTIONS);
        assert!((unmerged.postgres - 0.78).abs() < 1e-9, "{unmerged:?}");
        assert!((unmerged.machine - 1.56).abs() < 1e-9, "{unmerged:?}");
        assert!(
            (unmerged.load_generator - 0.078).abs() < 1e-9,
            "{unmerged:?}"
        );
        // A transaction with no pgbench run leaves the sum unknown, not short.
        assert!(
            ceiling_cpu_ms(&ceilings, &ORDER_TRANSACTIONS)
                .postgres
                .is_nan()
        );
    }

    #[test]
    fn the_call_is_compared_with_the_recorded_run_without_it() {
        let drain = |per_second| Drain {
            rows: 1500,
            per_second,
            ..Drain::default()
        };
        let capacity = Capacity {
            charge: drain(482.0),
            provider_alone: drain(1844.0),
            apply: drain(712.0),
            notify: drain(1014.0),
            ..Capacity::default()
        };
        let rate = |name: &str| match name {
            "charge" => 1709.0,
            "provider" => 2003.0,
            "charge without call" => 2227.0,
            _ => f64::NAN,
        };
        let call = ProviderCall::new(&capacity, 3, 1, rate);
        assert!((call.ceiling_with_call - 922.0).abs() < 1.0);
        let md = call.markdown();
        println!("{md}");
        assert!(md.contains("482/s vs 744/s, 65%"), "{md}");
        assert!(md.contains("ran at 102% (ApplyPaymentResult) and 101% (NotifyCustomer)"));
        let unrecorded = ProviderCall::new(&capacity, 3, 4, rate).markdown();
        assert!(
            unrecorded.contains("No run without the call"),
            "{unrecorded}"
        );
    }
}
