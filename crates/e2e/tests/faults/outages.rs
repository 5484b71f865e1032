//! Infrastructure outages under load: the broker killed or frozen, PostgreSQL stopped,
//! each waited out by the services and restored by the scenario.

use std::time::{Duration, Instant};

use saga_e2e::chaos;
use saga_e2e::infra::Outage;
use saga_e2e::load::Load;
use saga_e2e::{SERVICES, SETTLE, Stack};
use saga_testkit::eventually;

use crate::{
    assert_under_load, at, conclude, cycles, drain_and_check, orders, rate, rate_spanning,
    retries_seen, seconds,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults runs it on its own"]
async fn the_broker_killed_and_restarted_mid_run_is_waited_out_and_nothing_is_lost() {
    let mut stack = Stack::start().await;
    // A killed broker takes about half a minute to serve again on a 2-core machine.
    let load = Load::start(&stack, orders(), rate_spanning(Duration::from_secs(50)));
    let mut downtimes = Vec::new();
    let mut placed_meanwhile = 0;

    for cycle in 1..=cycles() {
        load.reached(at(2 * cycle - 1, 2 * cycles())).await;
        let before = load.accepted();
        assert_under_load(&load, "the broker was killed");
        let outage = Outage::kill_broker().await;
        // The API needs only the database, so orders keep coming and pile up in the
        // outbox; the outage lasts until a good number have.
        load.reached(before + orders() / (5 * cycles())).await;
        placed_meanwhile += load.accepted() - before;
        downtimes.push(outage.restore().await);
        chaos::tend(&mut stack, None).await;
    }

    let load_rate = load.rate;
    let (findings, _) = drain_and_check(&mut stack, load, None, Vec::new()).await;
    let injected = format!(
        "broker SIGKILLed and restarted {} time(s), down {}; {placed_meanwhile} orders placed while it was down (load at {}/s); {}",
        cycles(),
        seconds(&downtimes),
        load_rate,
        retries_seen(&stack),
    );
    conclude(
        "Kafka broker killed and restarted mid-run",
        &injected,
        &findings,
    );
}

/// How long the broker stays frozen: a blink of a managed cluster, which readiness must
/// not turn into an outage of the API.
const FREEZE: Duration = Duration::from_secs(10);

/// How often every service's `/readyz` is asked while the broker is frozen: as often as
/// an orchestrator's probe would, and more.
const PROBE_EVERY: Duration = Duration::from_millis(250);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults runs it on its own"]
async fn the_broker_frozen_for_ten_seconds_leaves_every_service_ready_and_every_order_taken() {
    let mut stack = Stack::start().await;
    let load = Load::start(&stack, orders(), rate_spanning(Duration::from_secs(30)));
    load.reached(at(1, 3)).await;
    assert_under_load(&load, "the broker was frozen");
    let (accepted, retried) = (load.accepted(), load.retried());
    let outage = Outage::freeze_broker();
    let frozen = Instant::now();
    let (mut looks, mut not_ready) = (0, Vec::new());
    while frozen.elapsed() < FREEZE {
        for service in SERVICES {
            looks += 1;
            let (status, body) = stack.ready(service).await;
            if status != 200 {
                not_ready.push(format!("{service}: {status} {body:?}"));
            }
        }
        tokio::time::sleep(PROBE_EVERY).await;
    }
    let placed = load.accepted() - accepted;
    let refused = load.retried() - retried;
    let down = outage.restore().await;
    assert!(
        not_ready.is_empty(),
        "not ready while the broker was frozen: {not_ready:?}"
    );
    assert_eq!(refused, 0, "orders refused while the broker was frozen");
    assert!(
        placed > 0,
        "no order was placed while the broker was frozen"
    );

    let load_rate = load.rate;
    let (findings, _) = drain_and_check(&mut stack, load, None, Vec::new()).await;
    let injected = format!(
        "broker frozen (SIGSTOP) for {:.1} s; {placed} orders placed meanwhile, none refused (load at {load_rate}/s); every service ready at each of {looks} looks at /readyz",
        down.as_secs_f64(),
    );
    conclude("Kafka broker frozen for ten seconds", &injected, &findings);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults runs it on its own"]
async fn postgres_stopped_and_restarted_mid_run_is_waited_out_and_nothing_is_lost() {
    let mut stack = Stack::start().await;
    let load = Load::start(&stack, orders(), rate_spanning(Duration::from_secs(20)));
    let mut downtimes = Vec::new();
    let mut refused = 0;

    for cycle in 1..=cycles() {
        load.reached(at(cycle, cycles())).await;
        let retried = load.retried();
        assert_under_load(&load, "PostgreSQL was stopped");
        let outage = Outage::stop_postgres().await;
        // Down until every service has noticed, and the API has refused a few seconds'
        // worth of orders (503, nothing stored).
        for service in SERVICES {
            eventually(
                SETTLE,
                &format!("{service} to report its database unreachable"),
                || async { (!stack.healthy(service).await).then_some(()) },
            )
            .await;
        }
        let enough = retried + 3 * rate() as usize;
        eventually(SETTLE, "the API to refuse orders for a while", || async {
            (load.retried() >= enough).then_some(())
        })
        .await;
        refused += load.retried() - retried;
        downtimes.push(outage.restore().await);
        chaos::tend(&mut stack, None).await;
    }

    let load_rate = load.rate;
    let (findings, _) = drain_and_check(&mut stack, load, None, Vec::new()).await;
    let injected = format!(
        "PostgreSQL stopped (fast) and restarted {} time(s), down {}; {refused} order attempts refused with 503 meanwhile (load at {load_rate}/s); {}",
        cycles(),
        seconds(&downtimes),
        retries_seen(&stack),
    );
    conclude(
        "PostgreSQL stopped and restarted mid-run",
        &injected,
        &findings,
    );
}
