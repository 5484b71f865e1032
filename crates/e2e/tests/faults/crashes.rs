//! Crashes at failpoints: a consumer, a relay or a handler aborted at the worst moment,
//! again and again under load, and restarted each time.

use saga::failpoint;
use saga_e2e::chaos::Crashes;
use saga_e2e::invariants::Findings;
use saga_e2e::load::Load;
use saga_e2e::{SERVICES, Stack};

use crate::{conclude, drain_and_check, kills, orders, rate};

/// A failpoint scenario: every service armed with `failpoint`, aborted `kills()` times
/// each while the load runs, restarted by the harness each time.
async fn crash_scenario(
    scenario: &str,
    failpoint: &'static str,
    every: usize,
    check_while_down: bool,
) -> Findings {
    let mut crashes = Crashes::new(failpoint, every.max(3), kills(), &SERVICES);
    crashes.check_while_down = check_while_down;
    let mut stack = Stack::start_with(&crashes.armed()).await;
    let load = Load::start(&stack, orders(), rate());

    let (findings, _) = drain_and_check(&mut stack, load, Some(&mut crashes), Vec::new()).await;

    let injected = format!(
        "{}; {} records redelivered",
        crashes.describe(),
        findings.redelivered()
    );
    conclude(scenario, &injected, &findings);
    assert!(
        crashes.violations.is_empty(),
        "half-applied effects seen while a killed service was down:\n{}",
        crashes.violations.join("\n")
    );
    crashes.assert_all_fired();
    findings
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults runs it on its own"]
async fn a_service_killed_after_its_commit_and_before_its_offset_commit_loses_nothing_and_applies_nothing_twice()
 {
    // order-service sees one record per order, the others two: aborts spaced over the
    // first half of the smallest count all fire while the load still runs.
    let findings = crash_scenario(
        "consumer killed after its commit, before its offset commit",
        failpoint::CONSUMER_AFTER_HANDLER,
        orders() / (2 * (kills() + 1)),
        false,
    )
    .await;

    assert!(
        findings.redelivered() > 0 && findings.duplicates() > 0,
        "the records handled just before each abort came back and were stopped as duplicates"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults runs it on its own"]
async fn a_relay_killed_after_the_broker_acknowledged_and_before_marking_rows_published_has_its_republished_events_absorbed()
 {
    // The relay hits the failpoint once per row it publishes, however many rows a batch
    // holds: at least one per order in every service (notification-service's).
    let findings = crash_scenario(
        "relay killed after the broker's ack, before marking rows published",
        failpoint::RELAY_AFTER_ACK,
        orders() / (2 * (kills() + 1)),
        false,
    )
    .await;

    assert!(
        findings.duplicates() > 0,
        "the batch acknowledged before each abort went out again and was stopped as duplicates"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults runs it on its own"]
async fn a_handler_killed_inside_its_transaction_leaves_nothing_half_applied() {
    // Each service applies one event per order.
    crash_scenario(
        "handler killed inside its transaction, before COMMIT",
        failpoint::HANDLER_BEFORE_COMMIT,
        orders() / (2 * (kills() + 1)),
        true,
    )
    .await;
}
