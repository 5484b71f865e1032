//! Phase 6, traces: what exporting spans costs the saga end to end.
//!
//! The same backlog settled with the services exporting nothing, then with every service
//! exporting its spans with OTLP to a receiver in this process that counts them, without
//! decoding them, and drops them: the cost measured is the services', not a viewer's,
//! which would compete for the same cores. The steps run off, on, on, off, so that a drift of the
//! machine over the phase weighs on both alike; each mode's rate is the mean of its two.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use saga_testkit::otlp::OtlpSink;

use crate::db::Databases;
use crate::load::{Keys, LoadGenerator, Shape};
use crate::procs::{self, CpuSplit};
use crate::report::{CpuPerOrder, Settled, Traces};

use super::cancellations::settled;
use super::stack::{PROVIDER, SERVICES, Stack};
use super::{Plan, log};

/// Rounds of off, on, on, off: one step's noise (several percent) is as large as the
/// difference looked for.
const ROUNDS: usize = 2;

pub(super) async fn traces(
    stack: &mut Stack,
    generator: &Arc<LoadGenerator>,
    databases: &Databases,
    plan: &Plan,
    pool_size: u32,
    run_id: u64,
) -> anyhow::Result<Traces> {
    let sink = OtlpSink::discarding().await;
    let exporting = [("OTEL_EXPORTER_OTLP_ENDPOINT", sink.endpoint())];
    let step = |tag: String, stack: &mut Stack| {
        // The marks are taken after the restart: a service's start is not an order's cost.
        stack.usage();
        let before = procs::Ticks::now();
        async move {
            generator
                .run_count(
                    Shape::Closed {
                        concurrency: pool_size,
                    },
                    u64::from(plan.traced),
                    &tag,
                    Keys::None,
                )
                .await;
            let settled = settled(databases, &tag, Duration::from_secs(300)).await?;
            anyhow::Ok((settled, before))
        }
    };
    let (mut off, mut on) = (Mode::default(), Mode::default());
    for round in 1..=ROUNDS {
        let tag = |step: &str| format!("bench{run_id}-traces{round}-{step}");
        let (settled, before) = step(tag("off1"), stack).await?;
        off.add(settled, before, stack);
        restart(stack, &exporting).await?;
        for name in ["on1", "on2"] {
            let (settled, before) = step(tag(name), stack).await?;
            on.add(settled, before, stack);
        }
        restart(stack, &[]).await?;
        let (settled, before) = step(tag("off2"), stack).await?;
        off.add(settled, before, stack);
    }
    let spans = sink.count();
    let traces = Traces::new(off, on, spans);
    log(format!(
        "traces: {:.0} orders/s exporting nothing, {:.0} orders/s exporting every span ({} spans, {:.1} per order); CPU per order {:.2} ms against {:.2} ms",
        traces.off_per_second,
        traces.on_per_second,
        traces.spans,
        traces.spans_per_order,
        traces.cpu_on.machine,
        traces.cpu_off.machine,
    ));
    Ok(traces)
}

/// One mode's steps: their rates, and the CPU each part spent on them.
#[derive(Default)]
struct Mode {
    steps: Vec<Settled>,
    services: BTreeMap<String, f64>,
    cpu: CpuSplit,
}

impl Mode {
    /// Adds a step that started at `before` and has just settled.
    fn add(&mut self, settled: Settled, before: procs::Ticks, stack: &mut Stack) {
        let cpu = procs::Ticks::now().since(&before, stack.tick_hz);
        for (name, usage) in stack.usage() {
            *self.services.entry(name).or_default() += usage.cpu_seconds;
        }
        self.cpu.machine += cpu.machine;
        self.cpu.postgres += cpu.postgres;
        self.cpu.kafka += cpu.kafka;
        self.cpu.load_generator += cpu.load_generator;
        self.steps.push(settled);
    }

    fn per_order(&self) -> CpuPerOrder {
        let orders: i64 = self.steps.iter().map(|step| step.orders).sum();
        let ms = |seconds: f64| 1000.0 * seconds / orders as f64;
        CpuPerOrder {
            services: self
                .services
                .iter()
                .map(|(name, &seconds)| (name.clone(), ms(seconds)))
                .collect(),
            postgres: ms(self.cpu.postgres),
            kafka: ms(self.cpu.kafka),
            load_generator: ms(self.cpu.load_generator),
            machine: ms(self.cpu.machine),
        }
    }
}

/// Restarts the provider and the services with `env`.
async fn restart(stack: &mut Stack, env: &[(&str, &str)]) -> anyhow::Result<()> {
    stack.stop_all().await?;
    for name in std::iter::once(PROVIDER).chain(SERVICES) {
        stack.start_with(name, env).await?;
    }
    Ok(())
}

impl Traces {
    fn new(off: Mode, on: Mode, spans: u64) -> Self {
        let mean = |steps: &[Settled]| {
            steps.iter().map(|step| step.per_second).sum::<f64>() / steps.len() as f64
        };
        let orders_on: i64 = on.steps.iter().map(|step| step.orders).sum();
        Self {
            off_per_second: mean(&off.steps),
            on_per_second: mean(&on.steps),
            spans,
            spans_per_order: spans as f64 / orders_on as f64,
            cpu_off: off.per_order(),
            cpu_on: on.per_order(),
            off: off.steps,
            on: on.steps,
        }
    }
}
