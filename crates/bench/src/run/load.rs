//! Phase 1, the load steps: closed loops for a first estimate, an open-loop ramp to the
//! highest sustained rate, then latency at fractions of it.

use std::sync::Arc;
use std::time::Duration;

use crate::db::Databases;
use crate::load::{LoadGenerator, Shape};
use crate::measure;
use crate::procs;
use crate::report::Step;

use super::stack::Stack;
use super::{Plan, log};

/// Past the plan's ramp, while its steps keep up: each step this much faster than the
/// one before, at most this many of them.
const RAMP_ONWARD: f64 = 1.25;
const RAMP_ONWARD_STEPS: i32 = 6;

/// The ramp's factors: the plan's, then on past its last. A ramp whose every step kept up
/// has found a lower bound, not the highest sustained rate (admission control may hold
/// the closed loops' estimate down), so it goes on until a step falls behind.
fn ramp_factors(ramp: &[f64]) -> impl Iterator<Item = f64> + '_ {
    let last = ramp.last().copied().unwrap_or(1.0);
    let onward = (1..=RAMP_ONWARD_STEPS).map(move |i| last * RAMP_ONWARD.powi(i));
    ramp.iter().copied().chain(onward)
}

/// A step whose last order is confirmed later than this after the last POST fell behind.
const SUSTAINED_DRAIN: f64 = 2.0;
/// A step that confirmed and notified less than this share of the orders placed per
/// second fell behind, however short the step was.
const KEPT_UP: f64 = 0.95;

pub(super) async fn load_step(
    stack: &mut Stack,
    generator: &Arc<LoadGenerator>,
    databases: &Databases,
    shape: Shape,
    plan: &Plan,
    name: String,
    tag: String,
) -> anyhow::Result<Step> {
    log(format!("{name}: {shape} for {:?}", plan.step));
    stack.usage();
    let before = procs::Ticks::now();
    let load = generator.run(shape, plan.step, &tag).await;
    let warmup = (plan.step / 5).min(Duration::from_secs(3));
    let outcome = measure::step_outcome(databases, &tag, warmup, Duration::from_secs(120)).await?;
    let cpu = procs::Ticks::now().since(&before, stack.tick_hz);
    let usage = stack.usage();
    let offered_per_second = match shape {
        Shape::Open { rate } => rate,
        Shape::Closed { .. } => load.placed_per_second(),
    };
    let step = Step {
        name,
        offered_per_second,
        post_ms: crate::measure::Percentiles::of_sorted_us(&load.post_latencies_us),
        sustained: outcome.unfinished == 0
            && load.failed == 0
            && load.refused == 0
            && outcome.confirmed_drain_seconds <= SUSTAINED_DRAIN
            && outcome.settled_per_second() >= KEPT_UP * load.placed_per_second(),
        load,
        outcome,
        usage,
        cpu,
        load_average: procs::load_average(),
    };
    log(format!(
        "{}: placed {:.0}/s ({:.0}% refused), confirmed {:.0}/s, notified {:.0}/s, POST→confirmed p50 {:.1} ms p99 {:.1} ms, drain {:.2} s{}",
        step.name,
        step.load.placed_per_second(),
        step.load.refused_percent(),
        step.outcome.confirmed.per_second,
        step.outcome.notified.per_second,
        step.outcome.to_confirmed_ms.p50,
        step.outcome.to_confirmed_ms.p99,
        step.outcome.confirmed_drain_seconds,
        if step.sustained { "" } else { " (fell behind)" },
    ));
    for (hop, ms) in &step.outcome.hops_ms {
        eprintln!(
            "[bench]     {hop}: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            ms.p50, ms.p99, ms.max
        );
    }
    Ok(step)
}

async fn ramp_step(
    stack: &mut Stack,
    generator: &Arc<LoadGenerator>,
    databases: &Databases,
    plan: &Plan,
    run_id: u64,
    rate: f64,
) -> anyhow::Result<Step> {
    let name = format!("ramp {rate:.0}/s");
    let tag = format!("bench{run_id}-ramp{rate:.0}");
    load_step(
        stack,
        generator,
        databases,
        Shape::Open { rate },
        plan,
        name,
        tag,
    )
    .await
}

/// Every load step of the run, in order: the closed loops, the ramp and its bisection,
/// then latency at fractions of the highest sustained rate.
pub(super) async fn steps(
    stack: &mut Stack,
    generator: &Arc<LoadGenerator>,
    databases: &Databases,
    plan: &Plan,
    run_id: u64,
) -> anyhow::Result<Vec<Step>> {
    let mut steps = Vec::new();
    for &concurrency in &plan.closed {
        let name = format!("closed c={concurrency}");
        let tag = format!("bench{run_id}-closed{concurrency}");
        let shape = Shape::Closed { concurrency };
        steps.push(load_step(stack, generator, databases, shape, plan, name, tag).await?);
    }
    let estimate = max_confirmed(&steps, |_| true);
    log(format!(
        "closed loops confirmed and notified up to {estimate:.0} orders/s; ramping open loops from there"
    ));
    let mut kept_up: f64 = 0.0;
    let mut fell_behind = None;
    for factor in ramp_factors(&plan.ramp) {
        let rate = (estimate * factor).max(1.0).round();
        let step = ramp_step(stack, generator, databases, plan, run_id, rate).await?;
        let sustained = step.sustained;
        steps.push(step);
        if sustained {
            kept_up = kept_up.max(rate);
        } else {
            fell_behind = Some(rate);
            break;
        }
    }
    if let Some(mut behind) = fell_behind {
        for _ in 0..plan.bisect {
            let low = if kept_up > 0.0 { kept_up } else { behind / 2.0 };
            let rate = ((low + behind) / 2.0).round();
            if behind - rate < 0.03 * behind {
                break;
            }
            let step = ramp_step(stack, generator, databases, plan, run_id, rate).await?;
            if step.sustained {
                kept_up = rate;
            } else {
                behind = rate;
            }
            steps.push(step);
        }
    }
    let max_sustained = max_sustained(&steps);
    log(format!(
        "highest sustained rate: {max_sustained:.0} orders/s"
    ));
    for &fraction in &plan.latency {
        let rate = (max_sustained * fraction).max(1.0).round();
        let name = format!("{:.0}% of max ({rate:.0}/s)", fraction * 100.0);
        let tag = format!("bench{run_id}-latency{}", (fraction * 100.0) as u32);
        let shape = Shape::Open { rate };
        steps.push(load_step(stack, generator, databases, shape, plan, name, tag).await?);
    }
    Ok(steps)
}

/// A few orders first: connections, consumer groups and caches warm, not measured.
pub(super) async fn warm_up(
    generator: &Arc<LoadGenerator>,
    databases: &Databases,
    run_id: u64,
) -> anyhow::Result<()> {
    let tag = format!("bench{run_id}-warmup");
    generator
        .run(
            Shape::Closed { concurrency: 2 },
            Duration::from_secs(2),
            &tag,
        )
        .await;
    measure::step_outcome(databases, &tag, Duration::ZERO, Duration::from_secs(60)).await?;
    Ok(())
}

/// The highest rate orders were both confirmed and notified at, over `steps` that pass
/// `filter`.
fn max_confirmed(steps: &[Step], filter: impl Fn(&Step) -> bool) -> f64 {
    steps
        .iter()
        .filter(|s| filter(s))
        .map(|s| s.outcome.settled_per_second())
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max)
}

/// The highest rate of a step that kept up; if none did, the best rate seen.
pub(super) fn max_sustained(steps: &[Step]) -> f64 {
    let sustained = max_confirmed(steps, |s| s.sustained);
    if sustained > 0.0 {
        sustained
    } else {
        max_confirmed(steps, |_| true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ramp_that_keeps_up_goes_on_past_the_plans_last_step_a_quarter_faster_each_time() {
        let factors: Vec<f64> = ramp_factors(&Plan::quick().ramp).collect();
        assert_eq!(factors[..2], [1.0, 1.5]);
        assert_eq!(factors.len(), 2 + RAMP_ONWARD_STEPS as usize);
        for pair in factors[1..].windows(2) {
            assert!(
                (pair[1] / pair[0] - RAMP_ONWARD).abs() < 1e-9,
                "{factors:?}"
            );
        }
    }
}
