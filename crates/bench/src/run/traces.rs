//! Phase 6, traces: what exporting spans costs the saga end to end.
//!
//! The same backlog settled with the services exporting nothing, then with every service
//! exporting its spans with OTLP to a receiver in this process that counts them, without
//! decoding them, and drops them: the cost measured is the services', not a viewer's,
//! which would compete for the same cores. The steps run off, on, on, off, so that a drift of the
//! machine over the phase weighs on both alike; each mode's rate is the mean of its two.

use std::sync::Arc;
use std::time::Duration;

use saga_testkit::otlp::OtlpSink;

use crate::db::Databases;
use crate::load::{Keys, LoadGenerator, Shape};
use crate::report::{Settled, Traces};

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
    let settle = |tag: String| async move {
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
        settled(databases, &tag, Duration::from_secs(300)).await
    };
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for round in 1..=ROUNDS {
        off.push(settle(format!("bench{run_id}-traces{round}-off1")).await?);
        restart(stack, &exporting).await?;
        on.push(settle(format!("bench{run_id}-traces{round}-on1")).await?);
        on.push(settle(format!("bench{run_id}-traces{round}-on2")).await?);
        restart(stack, &[]).await?;
        off.push(settle(format!("bench{run_id}-traces{round}-off2")).await?);
    }
    let spans = sink.count();
    let traces = Traces::new(off, on, spans);
    log(format!(
        "traces: {:.0} orders/s exporting nothing, {:.0} orders/s exporting every span ({} spans, {:.1} per order)",
        traces.off_per_second, traces.on_per_second, traces.spans, traces.spans_per_order
    ));
    Ok(traces)
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
    fn new(off: Vec<Settled>, on: Vec<Settled>, spans: u64) -> Self {
        let mean = |steps: &[Settled]| {
            steps.iter().map(|step| step.per_second).sum::<f64>() / steps.len() as f64
        };
        let orders_on: i64 = on.iter().map(|step| step.orders).sum();
        Self {
            off_per_second: mean(&off),
            on_per_second: mean(&on),
            spans,
            spans_per_order: spans as f64 / orders_on as f64,
            off,
            on,
        }
    }
}
