//! The report's markdown: its tables and paragraphs, in the order a reader meets them.

use std::fmt::Write as _;

use super::{Report, Step};

/// POST → `confirmed` p99 at half the highest sustained rate: a transaction per event,
/// and in batches (ms).
pub const HALF_LOAD_P99_TARGET_MS: f64 = 50.0;
pub const HALF_LOAD_P99_BATCHED_TARGET_MS: f64 = 100.0;
/// POST → `confirmed` p99 under closed loops of 8 and 32 clients, the excess refused (ms).
pub const OVERLOAD_P99_TARGET_MS: f64 = 2_000.0;

impl Report {
    pub(super) fn batched(&self) -> bool {
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

pub(super) fn fmt(value: f64) -> String {
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
        md.push_str(&self.machine_and_settings());
        md.push_str(&self.steps_table());
        md.push_str(&self.latency_targets());
        md.push_str(&self.hops_table());
        md.push_str(&self.capacity_table());
        md.push_str(&self.ratios_table());
        md.push_str(&self.provider_call.markdown());
        md.push_str(&self.ceilings_table());
        md.push_str(&self.pruning_and_ceiling());
        md.push_str(&self.cancellations());
        md.push_str(&self.traces());
        if self.machine.same_box {
            md.push_str(&self.cpu_per_order());
        }
        md.push_str(&self.services_table());
        md.push_str(&self.effects());
        md
    }

    /// The machine, the command and its settings.
    fn machine_and_settings(&self) -> String {
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
        md
    }

    /// Each load step: what was offered, placed and refused, and how fast and how soon the saga settled it.
    fn steps_table(&self) -> String {
        let mut md = String::new();
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
        md
    }

    /// Where the time goes at half load, hop by hop; nothing if the run had no such step.
    fn hops_table(&self) -> String {
        let mut md = String::new();
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
        md
    }

    /// Each transaction alone on its backlog.
    fn capacity_table(&self) -> String {
        let mut md = String::new();
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
        md
    }

    /// Each measured rate against its pgbench ceiling, and its target.
    fn ratios_table(&self) -> String {
        let mut md = String::new();
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
        md
    }

    /// Each pgbench run.
    fn ceilings_table(&self) -> String {
        let mut md = String::new();
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
        md
    }

    /// What the pruner cost, then the ceiling and the highest sustained rate.
    fn pruning_and_ceiling(&self) -> String {
        let mut md = String::new();
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
        md
    }

    /// What cancelling one order in ten cost the saga, and the refund path's rate against
    /// ChargeOrder's.
    fn cancellations(&self) -> String {
        let c = &self.cancellations;
        format!(
            "\nCancellations: {} orders settled at {} orders/s with none cancelled, {} orders/s with one in ten cancelled as soon as placed ({} cancelled, {} refunded): {}% of the rate. payment-service answered a backlog of {} cancellations, each refunded at the provider, at {}/s (ChargeOrder charged its backlog at {}/s).\n",
            c.none.orders,
            fmt(c.none.per_second),
            fmt(c.tenth.per_second),
            c.tenth.cancelled,
            c.tenth.refunded,
            fmt(100.0 * c.tenth.per_second / c.none.per_second),
            c.refund_path.rows,
            fmt(c.refund_path.per_second),
            fmt(self.capacity.charge.per_second),
        )
    }

    /// What exporting every span cost end to end, each step's rate given.
    fn traces(&self) -> String {
        let t = &self.traces;
        let rates = |steps: &[crate::report::Settled]| {
            let each: Vec<String> = steps.iter().map(|step| fmt(step.per_second)).collect();
            each.join(", ")
        };
        format!(
            "\nTraces: the same backlog settled at {} orders/s exporting no span ({}), {} orders/s with every service exporting its spans with OTLP to a receiver that drops them ({}; steps off, on, on, off, twice): {}% of the rate, {} spans, {:.1} per order.\n",
            fmt(t.off_per_second),
            rates(&t.off),
            fmt(t.on_per_second),
            rates(&t.on),
            fmt(100.0 * t.on_per_second / t.off_per_second),
            t.spans,
            t.spans_per_order,
        ) + &self.traces_cpu()
    }

    /// Where exporting's cost went: CPU per order by part, off against on.
    fn traces_cpu(&self) -> String {
        let (off, on) = (&self.traces.cpu_off, &self.traces.cpu_on);
        let change = |off: f64, on: f64| format!("{off:.3} → {on:.3} ({:+.3})", on - off);
        let services: Vec<String> = off
            .services
            .iter()
            .map(|(name, &before)| {
                let after = on.services.get(name).copied().unwrap_or(f64::NAN);
                format!("{name} {}", change(before, after))
            })
            .collect();
        format!(
            "CPU per order (ms), exporting nothing → exporting: the machine {}, {}% more; {}; PostgreSQL {}; Kafka {}; the load generator and the receiver {}. PostgreSQL's write-ahead log per order: {:.0} → {:.0} bytes.\n",
            change(off.machine, on.machine),
            fmt(100.0 * (on.machine / off.machine - 1.0)),
            services.join(", "),
            change(off.postgres, on.postgres),
            change(off.kafka, on.kafka),
            change(off.load_generator, on.load_generator),
            self.traces.wal_off,
            self.traces.wal_on,
        )
    }

    /// Each service over the whole run: CPU, peak memory against its target, and its outcomes.
    fn services_table(&self) -> String {
        let mut md = String::new();
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
        md
    }

    /// The exactly-once count, and the load average at the end.
    fn effects(&self) -> String {
        let mut md = String::new();
        let e = &self.effects;
        let _ = writeln!(
            md,
            "\nExactly once: {} orders, {} charges at the provider, {} payments, {} outcomes, {} notifications of them; {} cancelled, {} refunds, {} answered; extra effects {}, missing {}, still pending {}, unsettled {}, unpublished outbox rows {}, dead letters {}.",
            e.orders,
            e.charges,
            e.payments,
            e.outcome_events,
            e.notifications,
            e.cancellations,
            e.refunds,
            e.answers,
            e.extra_effects,
            e.missing_effects,
            e.still_pending,
            e.unsettled,
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
}
