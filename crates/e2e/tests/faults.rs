//! The fault suite: the three real binaries (and the card provider payment-service
//! calls) under a steady load of orders while the delivery layer, or the provider,
//! misbehaves in every way the saga claims to survive. After each
//! scenario, `saga_e2e::invariants::check` proves from the databases, the topics and the
//! logs that every order took effect exactly once and that no record was skipped, and
//! the scenario prints what it injected and what was absorbed.
//!
//! Some scenarios stop the shared broker and PostgreSQL, so the suite is `#[ignore]`d and
//! run on its own, one test at a time, by `scripts/faults` (which `scripts/test` calls):
//!
//! ```sh
//! cargo test -p saga-e2e --test faults -- --ignored --test-threads=1 --nocapture
//! ```
//!
//! Settings: `SAGA_FAULT_ORDERS` (orders per scenario, default 300), `SAGA_FAULT_RATE`
//! (orders offered per second, default 40), `SAGA_FAULT_KILLS` (aborts per service in
//! the failpoint scenarios, default 2), `SAGA_FAULT_CYCLES` (outages and scale-outs per
//! scenario, and five rounds of poison per cycle; default 1). `scripts/faults --long`
//! raises them for release checks. `CONSUMER_BATCH_SIZE`, which the services inherit,
//! runs every scenario with the consumers in batches (`scripts/faults --batch N`).

use std::time::Duration;

use saga_e2e::cancellations::{Cancellations, Cancelled};
use saga_e2e::chaos::{self, Crashes};
use saga_e2e::invariants::{self, Expected, Findings, Poison};
use saga_e2e::load::Load;
use saga_e2e::{SERVICES, Stack};

// The scenarios, one family a file under faults/ (a test target's root takes its
// modules from tests/ itself, hence the paths); what they share is below.
#[path = "faults/card_provider.rs"]
mod card_provider;
#[path = "faults/cluster.rs"]
mod cluster;
#[path = "faults/conflicting.rs"]
mod conflicting;
#[path = "faults/crashes.rs"]
mod crashes;
#[path = "faults/dead_charges.rs"]
mod dead_charges;
#[path = "faults/outages.rs"]
mod outages;
#[path = "faults/pivot.rs"]
mod pivot;
#[path = "faults/poison.rs"]
mod poison;
#[path = "faults/replays.rs"]
mod replays;
#[path = "faults/replicas.rs"]
mod replicas;
#[path = "faults/scale_out.rs"]
mod scale_out;

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
        })
        .unwrap_or(default)
}

fn orders() -> usize {
    setting("SAGA_FAULT_ORDERS", 300)
}

fn rate() -> u32 {
    setting("SAGA_FAULT_RATE", 40) as u32
}

fn kills() -> usize {
    setting("SAGA_FAULT_KILLS", 2)
}

fn cycles() -> usize {
    setting("SAGA_FAULT_CYCLES", 1)
}

/// How long the saga may take to drain after the faults: generous, as a backlog built
/// during an outage drains at the pace of a loaded 2-core machine.
fn drain_timeout() -> Duration {
    Duration::from_secs(180 + orders() as u64 / 5)
}

/// The point of the load (a number of accepted orders) at which step `step` of `steps`
/// happens, evenly spread over the run.
fn at(step: usize, steps: usize) -> usize {
    orders() * step / (steps + 1)
}

/// A rate at which the load lasts through `cycles()` outages of about `outage` each, so
/// that every one of them hits the saga under load.
fn rate_spanning(outage: Duration) -> u32 {
    let seconds = (cycles() as u64 * outage.as_secs()).max(1);
    (orders() as u64 / seconds).clamp(1, rate() as u64) as u32
}

/// Fails unless the load is still running: a fault injected after it proves less.
fn assert_under_load(load: &Load, fault: &str) {
    assert!(
        !load.is_finished(),
        "the load ended before {fault}: raise SAGA_FAULT_ORDERS or lower SAGA_FAULT_RATE"
    );
}

/// Waits for the load to be placed and the saga to go quiet, restarting what `crashes`
/// kills meanwhile, then checks every invariant.
async fn drain_and_check(
    stack: &mut Stack,
    load: Load,
    crashes: Option<&mut Crashes>,
    poison: Vec<Poison>,
) -> (Findings, Expected) {
    let (findings, expected, _) = drain_and_check_with(stack, load, None, crashes, poison).await;
    (findings, expected)
}

/// [`drain_and_check`] for a scenario that also cancels orders: waits for its last
/// cancellation too, and checks that exactly the orders the API cancelled are cancelled.
async fn drain_and_check_with(
    stack: &mut Stack,
    load: Load,
    cancellations: Option<Cancellations>,
    crashes: Option<&mut Crashes>,
    poison: Vec<Poison>,
) -> (Findings, Expected, Cancelled) {
    let busy = || !load.is_finished() || cancellations.as_ref().is_some_and(|c| !c.is_finished());
    chaos::settle_after(stack, busy, crashes, drain_timeout()).await;
    let offered = load.orders;
    let cancelled = match cancellations {
        Some(cancellations) => cancellations.finish().await,
        None => Cancelled::default(),
    };
    let expected = Expected {
        accepted: load.finish().await,
        offered: Some(offered),
        inbox_pruned: stack.prunes_inboxes(),
        poison,
        cancelled: Some(cancelled.accepted.clone()),
    };
    let findings = invariants::check(stack, &expected, drain_timeout()).await;
    (findings, expected, cancelled)
}

/// Prints the scenario's report, then fails on any violation.
fn conclude(scenario: &str, injected: &str, findings: &Findings) {
    findings.report(scenario, injected);
    findings.assert_holds();
}

/// The signs, in the logs, that services waited the outage out rather than died.
fn retries_seen(stack: &Stack) -> String {
    let count = |needle| -> usize {
        SERVICES
            .iter()
            .map(|s| invariants::count_in_logs(stack, s, needle))
            .sum()
    };
    format!(
        "{} handler retries, {} relay reconnects, {} consumer errors waited out",
        count("handler failed; retrying"),
        count("outbox relay interrupted"),
        count("kafka consumer error"),
    )
}

fn seconds(durations: &[Duration]) -> String {
    durations
        .iter()
        .map(|d| format!("{:.0} s", d.as_secs_f64()))
        .collect::<Vec<_>>()
        .join(", ")
}
