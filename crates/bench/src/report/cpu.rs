//! The CPU section of the report: where the machine's time went per order, at the
//! ceiling and at each step, against the budget the end-to-end target leaves.

use std::fmt::Write as _;

use crate::pgbench::Ceiling;
use crate::procs::CpuSplit;

use super::markdown::fmt;
use super::{ORDER_TRANSACTIONS, Report, Step};

/// Those of [`ORDER_TRANSACTIONS`] that no consumer batch merges: each POST and each
/// charge at the provider is a request of its own, answered from a transaction of its
/// own, and the relay reads and marks its rows in batches already.
pub const UNMERGED_TRANSACTIONS: [(&str, f64); 3] =
    [("create", 1.0), ("provider", 1.0), ("relay", 4.0)];

impl Report {
    /// Where the machine's CPU went per order, at the ceiling and at each step, and what
    /// the end-to-end target leaves for everything but PostgreSQL.
    pub(super) fn cpu_per_order(&self) -> String {
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
        md.push_str(&self.cpu_budget(&ceiling));
        md
    }

    /// The budget the end-to-end target leaves an order, against what the fastest step
    /// that kept up spent; nothing if no step kept up.
    fn cpu_budget(&self, ceiling: &CpuSplit) -> String {
        let cores = self.machine.cpus as f64;
        let mut md = String::new();
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
            md.push_str(&self.batched_floor(budget));
        }
        md
    }

    /// In batches, the floor under an order's CPU that merging the consumers' transactions
    /// leaves; nothing a transaction per event.
    fn batched_floor(&self, budget: f64) -> String {
        let mut md = String::new();
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
pub(super) fn ceiling_cpu_ms(ceilings: &[Ceiling], transactions: &[(&str, f64)]) -> CpuSplit {
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
