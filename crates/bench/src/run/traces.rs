//! Phase 6, traces: what exporting spans costs the saga end to end.
//!
//! The same backlog settled with the services exporting nothing, then with every service
//! exporting its spans with OTLP to a receiver in this process that counts them, without
//! decoding them, and drops them: the cost measured is the services', not a viewer's,
//! which would compete for the same cores. The steps run off, on, on, off, so that a
//! drift of the machine over the phase weighs on both alike, each from the same quiet
//! database ([`QuietStart`]); each mode's rate is the mean of its steps'.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use saga_testkit::otlp::OtlpSink;

use crate::db::Databases;
use crate::load::{Keys, LoadGenerator, Shape};
use crate::procs::{self, CpuSplit};
use crate::report::{CpuPerOrder, Settled, Traces};
use crate::sql::Database;

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
    // Any database of the server reads its one WAL position.
    let server = databases.connect(Database::Orders).await?;
    let exporting = [("OTEL_EXPORTER_OTLP_ENDPOINT", sink.endpoint())];
    let step = |tag: String, stack: &mut Stack| {
        // The marks are taken after the restart: a service's start is not an order's cost.
        stack.usage();
        let before = procs::Ticks::now();
        let server = &server;
        async move {
            let wal = wal_position(server).await?;
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
            let wal = wal_position(server).await? - wal;
            anyhow::Ok((settled, Mark { ticks: before, wal }))
        }
    };
    let (mut off, mut on) = (Mode::default(), Mode::default());
    let mut exporting_now = false;
    let mut quiet = QuietStart::connect(databases).await?;
    for round in 1..=ROUNDS {
        for (name, export) in [
            ("off1", false),
            ("on1", true),
            ("on2", true),
            ("off2", false),
        ] {
            if export != exporting_now {
                restart(stack, if export { &exporting[..] } else { &[] }).await?;
                exporting_now = export;
            }
            quiet.before_step(&server).await?;
            let tag = format!("bench{run_id}-traces{round}-{name}");
            let (settled, mark) = step(tag, stack).await?;
            let mode = if export { &mut on } else { &mut off };
            mode.add(settled, mark, stack);
        }
    }
    let spans = sink.count();
    let traces = Traces::new(off, on, spans);
    log(format!(
        "traces: {:.0} orders/s exporting nothing, {:.0} orders/s exporting every span ({} spans, {:.1} per order); CPU per order {:.2} ms against {:.2} ms; WAL per order {:.0} bytes against {:.0}",
        traces.off_per_second,
        traces.on_per_second,
        traces.spans,
        traces.spans_per_order,
        traces.cpu_on.machine,
        traces.cpu_off.machine,
        traces.wal_on,
        traces.wal_off,
    ));
    Ok(traces)
}

/// What each step starts from: every table of the saga's databases vacuumed and
/// analysed, and then a checkpoint. A step therefore pays for its own writes only: not
/// for an autovacuum or an autoanalyze that the step before it made due (each runs when a
/// table has changed by a share of its rows, and under load fell on whichever step crossed
/// the line), nor for a checkpoint begun midway by the WAL's size, after which every page
/// is written whole to the WAL once more. Without the right to checkpoint
/// (`pg_checkpoint`, which `scripts/infra-up` grants), the steps go on without one, as
/// said once in the log.
struct QuietStart {
    /// A session in each of the run's databases, for its `VACUUM`.
    sessions: Vec<tokio_postgres::Client>,
    checkpoint_refused: bool,
}

impl QuietStart {
    async fn connect(databases: &Databases) -> anyhow::Result<Self> {
        let mut sessions = Vec::with_capacity(Database::ALL.len());
        for database in Database::ALL {
            sessions.push(databases.connect(database).await?);
        }
        Ok(Self {
            sessions,
            checkpoint_refused: false,
        })
    }

    async fn before_step(&mut self, server: &tokio_postgres::Client) -> anyhow::Result<()> {
        for session in &self.sessions {
            session.batch_execute("VACUUM (ANALYZE)").await?;
        }
        if self.checkpoint_refused {
            return Ok(());
        }
        if let Err(error) = server.batch_execute("CHECKPOINT").await {
            log(format!(
                "traces: steps not started from a checkpoint: {}",
                saga::db::describe(&error)
            ));
            self.checkpoint_refused = true;
        }
        Ok(())
    }
}

/// The server's position in its write-ahead log, in bytes.
async fn wal_position(server: &tokio_postgres::Client) -> anyhow::Result<f64> {
    let row = server
        .query_one(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// What a step is measured from: the machine's CPU ticks when it began, and the WAL it
/// wrote.
struct Mark {
    ticks: procs::Ticks,
    wal: f64,
}

/// One mode's steps: their rates, and the CPU each part spent on them.
#[derive(Default)]
struct Mode {
    steps: Vec<Settled>,
    services: BTreeMap<String, f64>,
    cpu: CpuSplit,
    /// Bytes of write-ahead log, the whole server's.
    wal: f64,
}

impl Mode {
    /// Adds a step, marked when it began, that has just settled.
    fn add(&mut self, settled: Settled, mark: Mark, stack: &mut Stack) {
        let cpu = procs::Ticks::now().since(&mark.ticks, stack.tick_hz);
        self.wal += mark.wal;
        for (name, usage) in stack.usage() {
            *self.services.entry(name).or_default() += usage.cpu_seconds;
        }
        self.cpu.machine += cpu.machine;
        self.cpu.postgres += cpu.postgres;
        self.cpu.kafka += cpu.kafka;
        self.cpu.load_generator += cpu.load_generator;
        self.steps.push(settled);
    }

    fn orders(&self) -> f64 {
        self.steps.iter().map(|step| step.orders as f64).sum()
    }

    fn per_order(&self) -> CpuPerOrder {
        let orders = self.orders();
        let ms = |seconds: f64| 1000.0 * seconds / orders;
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
        Self {
            off_per_second: mean(&off.steps),
            on_per_second: mean(&on.steps),
            spans,
            spans_per_order: spans as f64 / on.orders(),
            cpu_off: off.per_order(),
            cpu_on: on.per_order(),
            wal_off: off.wal / off.orders(),
            wal_on: on.wal / on.orders(),
            off: off.steps,
            on: on.steps,
        }
    }
}
