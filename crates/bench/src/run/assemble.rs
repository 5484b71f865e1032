//! The run's figures assembled into its report: each measured rate as a ratio to its
//! ceiling, with its target, and each service's usage.

use std::collections::BTreeMap;

use time::OffsetDateTime;

use crate::measure;
use crate::pgbench;
use crate::procs;
use crate::report::{
    Cancellations, Capacity, Machine, ORDER_TRANSACTIONS, ProviderCall, Pruning, Ratio, Report,
    ServiceSummary, Step, Traces,
};

use super::load::max_sustained;
use super::stack::{PROVIDER, SERVICES, Stack};
use super::{Plan, Settings};

/// The peak resident memory each service is allowed, with every feature on.
const RSS_TARGET_MIB: f64 = 32.0;
/// Each consumer's rate, a transaction per event, against pgbench's on its transaction.
const CONSUMER_TARGET: f64 = 0.85;
/// The saga's highest sustained rate against the ceiling: a transaction per event, and
/// in batches (against the same per-event ceiling).
const END_TO_END_TARGET: f64 = 0.80;
const END_TO_END_BATCHED_TARGET: f64 = 1.50;

#[allow(clippy::too_many_arguments)]
pub(super) fn assemble(
    settings: &Settings,
    plan: &Plan,
    started_at: OffsetDateTime,
    machine: Machine,
    steps: Vec<Step>,
    capacity: Capacity,
    pruning: Pruning,
    cancellations: Cancellations,
    traces: Traces,
    ceilings: Vec<pgbench::Ceiling>,
    stack: &Stack,
    effects: measure::Effects,
    dead_letters: i64,
) -> Report {
    let rate = |name: &str| ceiling_rate(&ceilings, name);
    let ceiling_orders_per_second = 1.0
        / ORDER_TRANSACTIONS
            .iter()
            .map(|&(name, per_order)| per_order / rate(name))
            .sum::<f64>();
    let max_sustained_per_second = max_sustained(&steps);
    let end_to_end_target = if settings.consumer_batch > 1 {
        END_TO_END_BATCHED_TARGET
    } else {
        END_TO_END_TARGET
    };
    let provider_call = ProviderCall::new(
        &capacity,
        settings.partitions as u32,
        settings.consumer_batch,
        rate,
    );
    let end_to_end = Ratio::new(
        "end to end, orders confirmed and notified",
        max_sustained_per_second,
        ceiling_orders_per_second,
        Some(end_to_end_target),
    );
    let ratios = [
        service_ratios(&capacity, &ceilings, &provider_call),
        cost_ratios(&capacity, &pruning, &ceilings, end_to_end),
        vec![Ratio::new(
            "end to end, every span exported vs none",
            traces.on_per_second,
            traces.off_per_second,
            Some(0.95),
        )],
    ]
    .concat();

    let services = services(settings, stack);

    let half_load_step = steps
        .iter()
        .find(|s| s.name.starts_with("50% of max"))
        .map(|s| s.name.clone());
    let settings_map = settings_map(settings, plan);
    Report {
        mode: plan.mode.to_owned(),
        command: settings.command.clone(),
        started_at,
        machine,
        settings: settings_map,
        steps,
        max_sustained_per_second,
        half_load_step,
        capacity,
        provider_call,
        pruning,
        cancellations,
        traces,
        ceilings,
        ceiling_orders_per_second,
        end_to_end_target,
        ratios,
        services,
        effects,
        dead_letters,
        load_average_at_end: procs::load_average(),
    }
}

/// How each service's transaction compares with its ceiling, and the provider's with
/// its own, at the connections each had.
fn service_ratios(
    capacity: &Capacity,
    ceilings: &[pgbench::Ceiling],
    provider_call: &ProviderCall,
) -> Vec<Ratio> {
    let rate = |name: &str| ceiling_rate(ceilings, name);
    let connections = |name: &str| {
        ceilings
            .iter()
            .find(|c| c.name == name)
            .map_or(0, |c| c.connections)
    };
    vec![
        Ratio::new(
            format!(
                "payment-service consumer, ChargeOrder with the provider call ({} conns)",
                connections("charge")
            ),
            capacity.charge.per_second,
            provider_call.ceiling_with_call,
            Some(CONSUMER_TARGET),
        ),
        Ratio::new(
            format!(
                "payment-provider alone, POST /v1/charges ({} conns)",
                connections("provider")
            ),
            capacity.provider_alone.per_second,
            rate("provider"),
            None,
        ),
        Ratio::new(
            format!(
                "order-service consumer, ApplyPaymentResult ({} conns)",
                connections("apply")
            ),
            capacity.apply.per_second,
            rate("apply"),
            Some(CONSUMER_TARGET),
        ),
        Ratio::new(
            format!(
                "notification-service consumer, NotifyCustomer ({} conns)",
                connections("notify")
            ),
            capacity.notify.per_second,
            rate("notify"),
            Some(CONSUMER_TARGET),
        ),
        Ratio::new(
            format!("POST /v1/orders alone ({} conns)", connections("create")),
            capacity.create.per_second,
            rate("create"),
            None,
        ),
        Ratio::new(
            format!(
                "POST /v1/orders with an Idempotency-Key ({} conns)",
                connections("create keyed")
            ),
            capacity.create_keyed.per_second,
            rate("create keyed"),
            None,
        ),
    ]
}

/// What the Idempotency-Key and the pruner cost, the relay against its ceiling, and
/// `end_to_end` last.
fn cost_ratios(
    capacity: &Capacity,
    pruning: &Pruning,
    ceilings: &[pgbench::Ceiling],
    end_to_end: Ratio,
) -> Vec<Ratio> {
    let rate = |name: &str| ceiling_rate(ceilings, name);
    let relay_best = [
        &capacity.relay_orders_created,
        &capacity.relay_payments,
        &capacity.relay_outcomes,
        &capacity.relay_notifications,
    ]
    .iter()
    .map(|d| d.per_second)
    .filter(|v| v.is_finite())
    .fold(0.0, f64::max);
    vec![
        Ratio::new(
            "POST /v1/orders with an Idempotency-Key vs without",
            capacity.create_keyed.per_second,
            capacity.create.per_second,
            Some(0.90),
        ),
        Ratio::new(
            format!(
                "payment-service consumer while its pruner deletes {} old ids vs without",
                pruning.old_ids
            ),
            pruning.with.per_second,
            pruning.without.per_second,
            Some(0.90),
        ),
        Ratio::new(
            "outbox relay, rows published (best of four, 1 conn)",
            relay_best,
            rate("relay"),
            None,
        ),
        end_to_end,
    ]
}

/// The events per second of ceiling `name`; NaN if it was not measured.
fn ceiling_rate(ceilings: &[pgbench::Ceiling], name: &str) -> f64 {
    ceilings
        .iter()
        .find(|c| c.name == name)
        .map_or(f64::NAN, |c| c.events_per_second)
}

/// Each service's CPU time and peak memory over the run, against the memory target,
/// and the outcomes its log counted.
fn services(settings: &Settings, stack: &Stack) -> BTreeMap<String, ServiceSummary> {
    let mut services = BTreeMap::new();
    for name in SERVICES.into_iter().chain([PROVIDER]) {
        let usage = stack.totals.get(name).cloned().unwrap_or_default();
        let peak_rss_mib = usage.peak_rss_kib as f64 / 1024.0;
        services.insert(
            name.to_owned(),
            ServiceSummary {
                cpu_seconds: usage.cpu_seconds,
                peak_rss_mib,
                rss_target_mib: RSS_TARGET_MIB,
                rss_met: peak_rss_mib <= RSS_TARGET_MIB,
                outcomes: procs::outcomes_in_log(&settings.out.join(format!("{name}.log"))),
            },
        );
    }
    services
}

/// The settings the report records beside its figures.
fn settings_map(settings: &Settings, plan: &Plan) -> BTreeMap<String, String> {
    let mut settings_map = BTreeMap::new();
    settings_map.insert("partitions".into(), settings.partitions.to_string());
    settings_map.insert("DATABASE_POOL_SIZE".into(), settings.pool_size.to_string());
    settings_map.insert(
        "CONSUMER_BATCH_SIZE".into(),
        settings.consumer_batch.to_string(),
    );
    settings_map.insert("RUST_LOG".into(), settings.rust_log.clone());
    settings_map.insert("step_seconds".into(), plan.step.as_secs().to_string());
    settings_map.insert("backlog_orders".into(), plan.backlog.to_string());
    settings_map.insert("traced_orders".into(), plan.traced.to_string());
    settings_map.insert("pgbench_seconds".into(), plan.pgbench.as_secs().to_string());
    settings_map.insert("old_ids".into(), plan.old_ids.to_string());
    settings_map
}
