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

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use saga::events;
use saga::failpoint;
use saga_e2e::chaos::{self, Crashes};
use saga_e2e::hand::{HandProducer, envelope};
use saga_e2e::infra::{self, Cluster, NODES, Outage};
use saga_e2e::invariants::{self, Expected, Findings, Poison};
use saga_e2e::load::Load;
use saga_e2e::{NOTIFICATION_SERVICE, ORDER_SERVICE, PAYMENT_SERVICE, SERVICES, SETTLE, Stack};
use saga_testkit::eventually;
use serde_json::{Value, json};
use uuid::Uuid;

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
    chaos::settle(stack, Some(&load), crashes, drain_timeout()).await;
    let offered = load.orders;
    let expected = Expected {
        accepted: load.finish().await,
        offered: Some(offered),
        inbox_pruned: stack.prunes_inboxes(),
        poison,
    };
    let findings = invariants::check(stack, &expected, drain_timeout()).await;
    (findings, expected)
}

/// What an operator would do to replay a topic: stop the consumers, rewind their groups
/// with the stock tool, start them again; then waits for the saga to go quiet. Returns how
/// many records were delivered again.
async fn replay_every_record(stack: &mut Stack) -> i64 {
    for service in SERVICES {
        assert!(stack.terminate_service(service).await, "{service} stops");
    }
    let mut replayed = 0;
    for service in SERVICES {
        let (group, topic, _) = stack.subscription(service);
        infra::reset_offsets_to_earliest(&stack.kafka.brokers, &group, &topic).await;
        replayed += invariants::end_offsets(&stack.kafka.brokers, &topic)
            .await
            .iter()
            .sum::<i64>();
    }
    for service in SERVICES {
        stack.start_service(service).await;
    }
    chaos::settle(stack, None, None, drain_timeout()).await;
    replayed
}

/// What every replay of every record must show, group by group: none was applied again.
fn assert_no_replayed_record_applied(before: &Findings, after: &Findings) {
    for (b, a) in before.groups.iter().zip(&after.groups) {
        assert_eq!(
            a.outcome("applied"),
            b.outcome("applied"),
            "{}: no replayed record applied",
            a.service
        );
    }
}

/// Prints the scenario's report, then fails on any violation.
fn conclude(scenario: &str, injected: &str, findings: &Findings) {
    findings.report(scenario, injected);
    findings.assert_holds();
}

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

/// The share of charge calls whose answer the provider loses after committing the charge.
const LOST_ANSWERS: f64 = 1.0 / 3.0;

/// A lost-answer run: the provider loses a third of its answers (deterministically: every
/// third call) for the whole load. With `fresh_keys`, payment-service sends a new key on
/// every call, the bug the key exists to prevent.
async fn lost_answers_run(orders: usize, fresh_keys: bool) -> (Stack, Findings) {
    let failpoints = if fresh_keys {
        vec![(
            PAYMENT_SERVICE,
            format!("{}=return", failpoint::FRESH_CHARGE_KEY),
        )]
    } else {
        Vec::new()
    };
    let mut stack = Stack::start_with(&failpoints).await;
    stack
        .provider()
        .arm(json!({"kind": "lose-response", "rate": LOST_ANSWERS}))
        .await;
    let load = Load::start(&stack, orders, rate());
    let (findings, _) = drain_and_check(&mut stack, load, None, Vec::new()).await;
    let lost = findings.provider["lost_responses"].as_u64().unwrap_or(0);
    assert!(
        lost > 0,
        "the provider lost no answer: {}",
        findings.provider
    );
    (stack, findings)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults runs it on its own"]
async fn a_third_of_the_providers_answers_lost_after_it_charged_are_absorbed_by_asking_again_with_the_same_key()
 {
    let (stack, findings) = lost_answers_run(orders(), false).await;
    let stat = |name: &str| findings.provider[name].as_u64().unwrap_or(0);
    let injected = format!(
        "the provider committed every third charge call and closed the connection without answering: {} answers lost of {} calls, {} replayed to the retry; {}",
        stat("lost_responses"),
        stat("calls"),
        stat("replayed"),
        retries_seen(&stack),
    );
    conclude(
        "card provider's answer lost after it charged",
        &injected,
        &findings,
    );
    assert!(
        stat("replayed") >= stat("lost_responses"),
        "every lost answer was asked for again and replayed: {}",
        findings.provider
    );
    // One charge per order in the provider's database (the checker's); its own count
    // must agree, calls whose caller hung up included.
    assert_eq!(
        stat("charged") + stat("declined"),
        findings.orders as u64,
        "charges the provider counted vs orders: {}",
        findings.provider
    );
}

/// The same lost answers, with payment-service sending a new key on each call: the retry
/// after a lost answer is a new charge. The checker must see every one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults runs it on its own"]
async fn with_a_fresh_key_on_each_call_a_lost_answer_charges_twice_and_the_checker_says_so() {
    let (_stack, findings) = lost_answers_run(orders().min(120), true).await;
    findings.report(
        "card provider's answer lost, payment-service sending a fresh key on each call (a bug on purpose)",
        &format!(
            "failpoint {} armed; every third charge call's answer lost",
            failpoint::FRESH_CHARGE_KEY
        ),
    );
    // Every call made again is a new charge: after a lost answer, and in batches also for
    // the other orders of a batch rolled back by it. Each extra charge took an extra call.
    let calls = findings.provider["calls"].as_u64().unwrap_or(0) as usize;
    let extra_calls = calls.saturating_sub(findings.orders);
    assert!(
        findings.charged_twice > 0 && findings.charged_twice <= extra_calls,
        "the orders asked for again with a fresh key are charged again, and the checker must count them: charged twice {}, calls beyond one per order {extra_calls}",
        findings.charged_twice
    );
    assert!(
        findings
            .violations
            .iter()
            .any(|v| v.contains("charged 2 times at the provider")),
        "{:?}",
        findings.violations.iter().take(5).collect::<Vec<_>>()
    );
}

/// How long the provider is down: the outage is defined by its length, as a provider's
/// incident is; no condition of the saga's ends it.
const PROVIDER_OUTAGE: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults runs it on its own"]
async fn the_provider_down_for_20_s_mid_run_is_waited_out_and_no_order_fails_for_it() {
    let mut stack = Stack::start().await;
    let provider = stack.provider();
    let load = Load::start(&stack, orders(), rate_spanning(PROVIDER_OUTAGE));
    let mut placed_meanwhile = 0;

    for cycle in 1..=cycles() {
        load.reached(at(cycle, cycles())).await;
        assert_under_load(&load, "the provider went down");
        let before = load.accepted();
        provider.arm(json!({"kind": "unavailable"})).await;
        tokio::time::sleep(PROVIDER_OUTAGE).await;
        provider.disarm().await;
        placed_meanwhile += load.accepted() - before;
    }

    let load_rate = load.rate;
    let (findings, _) = drain_and_check(&mut stack, load, None, Vec::new()).await;
    let refused = findings.provider["unavailable"].as_u64().unwrap_or(0);
    let injected = format!(
        "the provider answered 503 to every call for {} s, {} time(s): {refused} calls refused; {placed_meanwhile} orders placed meanwhile (load at {load_rate}/s); {}",
        PROVIDER_OUTAGE.as_secs(),
        cycles(),
        retries_seen(&stack),
    );
    conclude("card provider down (503) mid-run", &injected, &findings);
    assert!(refused > 0, "no call met the outage: {}", findings.provider);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults runs it on its own"]
async fn a_consumer_group_scaled_from_one_instance_to_two_and_back_mid_run_loses_nothing() {
    let mut stack = Stack::start().await;
    // A scale-out takes a start and a rebalance: a few seconds.
    let load = Load::start(&stack, orders(), rate_spanning(Duration::from_secs(15)));
    let second = format!("{PAYMENT_SERVICE}-2");
    let mut handled_by_second = 0;

    for cycle in 1..=cycles() {
        load.reached(at(2 * cycle - 1, 2 * cycles())).await;
        let handled_before = stack.log(&second).matches("event handled").count();
        assert_under_load(&load, "the group was scaled out");
        let exited = stack.start_instance(PAYMENT_SERVICE, &second, None).await;
        assert!(exited.is_none(), "{second} exited: {exited:?}");
        // The group rebalances: the new instance takes partitions and handles records.
        eventually(
            SETTLE,
            &format!("{second} to take partitions and handle records"),
            || async {
                let handled = stack.log(&second).matches("event handled").count();
                (handled > handled_before).then_some(())
            },
        )
        .await;
        load.reached(at(2 * cycle, 2 * cycles())).await;
        assert_under_load(&load, "the group was scaled in");
        let status = stack.terminate_instance(&second).await;
        assert!(status.success(), "{second} stopped cleanly: {status}");
        handled_by_second += stack.log(&second).matches("event handled").count() - handled_before;
        chaos::tend(&mut stack, None).await;
    }

    let (findings, _) = drain_and_check(&mut stack, load, None, Vec::new()).await;
    let rebalances = invariants::count_in_logs(&stack, PAYMENT_SERVICE, "partitions assigned");
    let injected = format!(
        "{PAYMENT_SERVICE} scaled 1→2→1 {} time(s) (SIGTERM to scale in); {rebalances} assignments \
         logged; {handled_by_second} records handled by the second instance",
        cycles()
    );
    conclude("consumer group scaled 1→2→1 mid-run", &injected, &findings);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults runs it on its own"]
async fn a_duplicate_storm_of_every_record_replayed_from_the_earliest_offset_has_no_new_effect() {
    let mut stack = Stack::start().await;
    let load = Load::start(&stack, orders(), rate());
    let (before, expected) = drain_and_check(&mut stack, load, None, Vec::new()).await;
    before.assert_holds();
    let effects = invariants::effects(&stack).await;

    let replayed = replay_every_record(&mut stack).await;

    let after = invariants::check(&stack, &expected, drain_timeout()).await;
    let absorbed = after.duplicates() - before.duplicates();
    let injected = format!(
        "3 services stopped, their groups reset to earliest with kafka-consumer-groups, restarted: \
         {replayed} records replayed, {absorbed} stopped as duplicates"
    );
    conclude(
        "duplicate storm: every group rewound to the earliest offset",
        &injected,
        &after,
    );
    assert_eq!(
        invariants::effects(&stack).await,
        effects,
        "the replay changed nothing"
    );
    assert_no_replayed_record_applied(&before, &after);
    for (b, a) in before.groups.iter().zip(&after.groups) {
        assert!(
            a.deliveries - b.deliveries >= b.records as usize,
            "{}: every record of {} was replayed",
            a.service,
            a.topic
        );
    }
}

/// The services prune their inboxes to a window of seconds as they go (the topics'
/// retention.ms set to match while they start), until every id is gone; then every group is
/// rewound and every record delivered again: each copy passes guard 1, whose id is gone,
/// and is stopped by guard 2. Bounded inboxes, no second effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults runs it on its own"]
async fn every_record_replayed_after_the_inboxes_were_pruned_has_no_new_effect() {
    let mut stack = Stack::start_pruning().await;
    let load = Load::start(&stack, orders(), rate());
    let (before, expected) = drain_and_check(&mut stack, load, None, Vec::new()).await;
    before.assert_holds();
    // Effects, not the inboxes: the pruner keeps changing those.
    let effects = |all: BTreeMap<String, i64>| -> BTreeMap<String, i64> {
        all.into_iter()
            .filter(|(what, _)| !what.ends_with("processed_events"))
            .collect()
    };
    let effects_before = effects(invariants::effects(&stack).await);
    for service in SERVICES {
        let db = stack.database(service);
        eventually(
            drain_timeout(),
            &format!("{service}'s inbox to be pruned"),
            || async {
                let left = db.count("SELECT count(*) FROM processed_events", &[]).await;
                (left == 0).then_some(())
            },
        )
        .await;
    }

    let replayed = replay_every_record(&mut stack).await;

    let after = invariants::check(&stack, &expected, drain_timeout()).await;
    let guarded = after.guarded() - before.guarded();
    let injected = format!(
        "inboxes pruned to empty ({} window), every group reset to earliest: {replayed} records \
         replayed, {guarded} stopped by guard 2 with their ids gone",
        saga_e2e::PRUNING_WINDOW
    );
    conclude(
        "every record replayed after the inboxes were pruned",
        &injected,
        &after,
    );
    assert_eq!(
        effects(invariants::effects(&stack).await),
        effects_before,
        "the replay changed nothing"
    );
    assert_no_replayed_record_applied(&before, &after);
    for (b, a) in before.groups.iter().zip(&after.groups) {
        assert!(
            a.outcome("guarded") > b.outcome("guarded"),
            "{}: replayed records whose ids were pruned met guard 2",
            a.service
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults runs it on its own"]
async fn conflicting_and_out_of_order_events_for_decided_orders_change_nothing() {
    let mut stack = Stack::start().await;
    let load = Load::start(&stack, orders(), rate());
    let producer = HandProducer::new(&stack.kafka.brokers);
    let topics = stack.kafka.topics.clone();
    let target = (orders() / 5).max(20);
    // Orders fully decided (the customer was notified) when targeted, with their status.
    let mut targeted: HashMap<Uuid, String> = HashMap::new();
    // (service, event id) → the outcome its handling must log.
    let mut wanted: Vec<(&str, String, &str)> = Vec::new();

    while targeted.len() < target {
        let batch = eventually(SETTLE, "more orders to be decided and notified", || {
            let (stack, targeted) = (&stack, &targeted);
            async move {
                let decided = decided_orders(stack, targeted).await;
                (!decided.is_empty()).then_some(decided)
            }
        })
        .await;
        for order in batch.into_iter().take(target - targeted.len()) {
            let id = order.id;
            let key = id.to_string();
            let confirmed = order.status == "confirmed";
            let (flipped_result, flipped_outcome) = if confirmed {
                (events::PAYMENT_FAILED, events::ORDER_CANCELLED)
            } else {
                (events::PAYMENT_SUCCEEDED, events::ORDER_CONFIRMED)
            };
            let result_payload = json!({
                "order_id": id, "amount_cents": order.amount_cents, "reason": "card declined"
            });
            let outcome_payload = json!({
                "order_id": id, "customer_id": order.customer_id, "amount_cents": order.amount_cents
            });
            let mut created_again = order.created.clone();
            created_again["amount_cents"] = json!(1);
            let genuine_outcome = if confirmed {
                events::ORDER_CONFIRMED
            } else {
                events::ORDER_CANCELLED
            };
            let records = [
                // A late result contradicting the decision, with an id of its own: guard 2.
                (
                    &topics.payments,
                    format!("conflict-late-result:{id}"),
                    flipped_result,
                    result_payload.clone(),
                    vec![(ORDER_SERVICE, "guarded")],
                ),
                // The decided result's own id with the opposite content: guard 1.
                (
                    &topics.payments,
                    events::payment_result_id(&key),
                    flipped_result,
                    result_payload,
                    vec![(ORDER_SERVICE, "duplicate")],
                ),
                // A second order.created for the order, for another amount: guard 2.
                (
                    &topics.orders,
                    format!("conflict-created-again:{id}"),
                    events::ORDER_CREATED,
                    created_again,
                    vec![
                        (PAYMENT_SERVICE, "guarded"),
                        (NOTIFICATION_SERVICE, "ignored"),
                    ],
                ),
                // The saga's first event again, after its last: guard 1.
                (
                    &topics.orders,
                    key.clone(),
                    events::ORDER_CREATED,
                    order.created.clone(),
                    vec![
                        (PAYMENT_SERVICE, "duplicate"),
                        (NOTIFICATION_SERVICE, "ignored"),
                    ],
                ),
                // The opposite outcome, with an id of its own: guard 2.
                (
                    &topics.orders,
                    format!("conflict-outcome-flip:{id}"),
                    flipped_outcome,
                    outcome_payload.clone(),
                    vec![
                        (PAYMENT_SERVICE, "ignored"),
                        (NOTIFICATION_SERVICE, "guarded"),
                    ],
                ),
                // The genuine outcome once more: guard 1.
                (
                    &topics.orders,
                    events::order_outcome_id(id),
                    genuine_outcome,
                    outcome_payload,
                    vec![
                        (PAYMENT_SERVICE, "ignored"),
                        (NOTIFICATION_SERVICE, "duplicate"),
                    ],
                ),
            ];
            for (topic, event_id, event_type, payload, outcomes) in records {
                producer
                    .send(
                        topic,
                        None,
                        Some(&key),
                        &envelope(&event_id, event_type, id, payload),
                    )
                    .await;
                for (service, outcome) in outcomes {
                    wanted.push((service, event_id.clone(), outcome));
                }
            }
            targeted.insert(id, order.status);
        }
    }

    let (findings, _) = drain_and_check(&mut stack, load, None, Vec::new()).await;
    let mut wrong = Vec::new();
    let logged: BTreeMap<&str, HashMap<String, Vec<String>>> = SERVICES
        .iter()
        .map(|s| (*s, invariants::outcomes_by_event(&stack, s)))
        .collect();
    for (service, event_id, outcome) in &wanted {
        let seen = logged[service].get(event_id).cloned().unwrap_or_default();
        // The hand-made record comes after the genuine one (same id) for guard-1 cases.
        let hand_made = seen.last();
        if hand_made.map(String::as_str) != Some(*outcome) {
            wrong.push(format!(
                "{service} {event_id}: {seen:?}, wanted {outcome} last"
            ));
        }
    }
    let statuses: HashMap<Uuid, String> = order_statuses(&stack).await;
    for (id, status) in &targeted {
        if statuses.get(id) != Some(status) {
            wrong.push(format!(
                "order {id} was {status}, is {:?}",
                statuses.get(id)
            ));
        }
    }
    let injected = format!(
        "{} hand-made events for {} decided and notified orders: late contradicting results, \
         results and outcomes flipped under their own ids, second order.created, the first \
         event replayed after the last",
        6 * targeted.len(),
        targeted.len()
    );
    conclude(
        "conflicting and out-of-order events for decided orders",
        &injected,
        &findings,
    );
    assert!(
        wrong.is_empty(),
        "hand-made events not stopped as expected:\n{}",
        wrong.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults runs it on its own"]
async fn poison_records_mixed_into_the_stream_are_dead_lettered_with_their_reason_and_hold_nothing_up()
 {
    let mut stack = Stack::start().await;
    let load = Load::start(&stack, orders(), rate());
    let producer = HandProducer::new(&stack.kafka.brokers);
    let topics = stack.kafka.topics.clone();
    let batches = 5 * cycles();
    let mut poison = Vec::new();

    for batch in 1..=batches {
        load.reached(at(batch, batches)).await;
        assert_under_load(&load, "the poison was produced");
        for (topic, kinds) in [
            (&topics.payments, payments_poison()),
            (&topics.orders, orders_poison()),
        ] {
            for (i, kind) in kinds.into_iter().enumerate() {
                // Spread over the partitions, each in front of live records.
                let partition = ((batch + i) % 3) as i32;
                let (partition, offset) = producer
                    .send_value(
                        topic,
                        Some(partition),
                        Some("poison"),
                        kind.bytes.as_deref(),
                    )
                    .await;
                poison.push(Poison {
                    topic: topic.clone(),
                    partition,
                    offset,
                    rejected_by: kind.rejected_by,
                    reason: kind.reason.to_owned(),
                });
            }
        }
    }

    let produced = poison.len();
    let (findings, _) = drain_and_check(&mut stack, load, None, poison).await;
    let injected = format!(
        "{produced} poison records ({} kinds on payments, {} on orders, {batches} batches) among live ones",
        payments_poison().len(),
        orders_poison().len()
    );
    conclude("poison records mixed into the stream", &injected, &findings);
}

struct PoisonKind {
    /// `None` is a tombstone.
    bytes: Option<Vec<u8>>,
    rejected_by: Vec<&'static str>,
    reason: &'static str,
}

/// Records on `payments` that order-service can never apply.
fn payments_poison() -> Vec<PoisonKind> {
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
    let by_order_service = || vec![ORDER_SERVICE];
    let mut kinds = unparseable(a, by_order_service);
    kinds.push(PoisonKind {
        bytes: Some(overflowing_amount(a, events::PAYMENT_SUCCEEDED)),
        rejected_by: by_order_service(),
        reason: "payload of payment.succeeded field `amount_cents`",
    });
    kinds.extend([
        PoisonKind {
            bytes: Some(b"this is not json".to_vec()),
            rejected_by: by_order_service(),
            reason: "not UTF-8 JSON",
        },
        PoisonKind {
            bytes: Some(envelope(&format!("poison-{a}"), "payment.refunded", a, json!({}))),
            rejected_by: by_order_service(),
            reason: "unknown event type `payment.refunded`",
        },
        PoisonKind {
            bytes: Some(format!(
                r#"{{"id":"poison-{a}","type":"payment.succeeded","aggregate_id":"{a}","payload":{{}}}}"#
            )
            .into_bytes()),
            rejected_by: by_order_service(),
            reason: "missing field `occurred_at`",
        },
        PoisonKind {
            bytes: Some(envelope(
                &format!("{a}:payment"),
                events::PAYMENT_SUCCEEDED,
                a,
                json!({ "order_id": a, "amount_cents": 1299 }),
            )),
            rejected_by: by_order_service(),
            reason: "does not exist",
        },
        PoisonKind {
            bytes: Some(envelope(
                &format!("{a}:payment"),
                events::PAYMENT_SUCCEEDED,
                a,
                json!({ "order_id": b, "amount_cents": 1299 }),
            )),
            rejected_by: by_order_service(),
            reason: "does not match payload order_id",
        },
    ]);
    kinds
}

/// Records on `orders` that payment-service, notification-service or both can never
/// apply.
fn orders_poison() -> Vec<PoisonKind> {
    let a = Uuid::new_v4();
    let both = || vec![PAYMENT_SERVICE, NOTIFICATION_SERVICE];
    let mut kinds = unparseable(a, both);
    // notification-service ignores order.created without reading its payload.
    kinds.push(PoisonKind {
        bytes: Some(overflowing_amount(a, events::ORDER_CREATED)),
        rejected_by: vec![PAYMENT_SERVICE],
        reason: "payload of order.created field `amount_cents`",
    });
    kinds.extend([
        PoisonKind {
            bytes: Some(b"{\"id\": truncated".to_vec()),
            rejected_by: both(),
            reason: "not UTF-8 JSON",
        },
        PoisonKind {
            bytes: Some(envelope(
                &format!("poison-{a}"),
                "order.shipped",
                a,
                json!({}),
            )),
            rejected_by: both(),
            reason: "unknown event type `order.shipped`",
        },
        PoisonKind {
            bytes: Some(
                format!(r#"{{"id":"poison-{a}","type":"order.created","aggregate_id":"{a}"}}"#)
                    .into_bytes(),
            ),
            rejected_by: both(),
            reason: "missing field",
        },
        // notification-service ignores order.created without reading its payload.
        PoisonKind {
            bytes: Some(envelope(
                &a.to_string(),
                events::ORDER_CREATED,
                a,
                json!({ "order_id": a, "customer_id": "c", "amount_cents": "lots", "items": [] }),
            )),
            rejected_by: vec![PAYMENT_SERVICE],
            reason: "payload of order.created field `amount_cents`",
        },
        // payment-service ignores outcomes without reading their payload.
        PoisonKind {
            bytes: Some(envelope(
                &events::order_outcome_id(a),
                events::ORDER_CONFIRMED,
                a,
                json!({ "order_id": a, "amount_cents": 1299 }),
            )),
            rejected_by: vec![NOTIFICATION_SERVICE],
            reason: "missing field `customer_id`",
        },
    ]);
    kinds
}

/// Records no consumer can parse, on whichever topic: what a careless or hostile producer
/// sends. The envelope refuses each at once, so none costs a retry or reaches PostgreSQL.
fn unparseable(a: Uuid, rejected_by: fn() -> Vec<&'static str>) -> Vec<PoisonKind> {
    let fine = |id: &str| envelope(id, events::ORDER_CONFIRMED, a, json!({ "order_id": a }));
    let long_id: String = std::iter::repeat_with(|| Uuid::new_v4().simple().to_string())
        .flat_map(|chunk| chunk.chars().collect::<Vec<_>>())
        .take(10_000)
        .collect();
    let mut invalid_utf8 = fine(&format!("poison-{a}"));
    let at = invalid_utf8
        .iter()
        .position(|&b| b == b'p')
        .expect("the id");
    invalid_utf8.splice(at..at, [0xff, 0xfe]);
    let mut undated: Value = serde_json::from_slice(&fine(&format!("poison-{a}"))).unwrap();
    undated["occurred_at"] = json!("the day before yesterday");
    let kind = |bytes: Option<Vec<u8>>, reason| PoisonKind {
        bytes,
        rejected_by: rejected_by(),
        reason,
    };
    vec![
        kind(
            Some(fine(&long_id)),
            "envelope field `id` is 10000 bytes long",
        ),
        kind(
            Some(envelope(
                &format!("poison-{a}"),
                events::ORDER_CONFIRMED,
                a,
                json!({ "order_id": a, "customer_id": "c\u{0}" }),
            )),
            "`payload.customer_id` contains a NUL character",
        ),
        kind(
            Some(format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)).into_bytes()),
            "recursion limit exceeded",
        ),
        kind(Some(invalid_utf8), "not UTF-8 JSON"),
        kind(Some(Vec::new()), "record has no value"),
        kind(None, "record is a tombstone"),
        kind(
            Some(serde_json::to_vec(&undated).unwrap()),
            "envelope field `occurred_at`",
        ),
    ]
}

/// An event of `event_type` whose `amount_cents` is past what an `i64` holds.
fn overflowing_amount(a: Uuid, event_type: &str) -> Vec<u8> {
    let event = envelope(
        &format!("poison-{a}"),
        event_type,
        a,
        json!({ "order_id": a, "customer_id": "c", "amount_cents": 1, "items": [] }),
    );
    String::from_utf8(event)
        .unwrap()
        .replace(
            "\"amount_cents\":1",
            "\"amount_cents\":99999999999999999999",
        )
        .into_bytes()
}

/// An order the saga has decided and told the customer about.
struct Decided {
    id: Uuid,
    status: String,
    amount_cents: i64,
    customer_id: String,
    /// Its `order.created` payload, as published.
    created: Value,
}

/// Up to 20 decided and notified orders not in `skip`.
async fn decided_orders(stack: &Stack, skip: &HashMap<Uuid, String>) -> Vec<Decided> {
    let notified: Vec<Uuid> = stack
        .notifications_db
        .client()
        .await
        .query("SELECT order_id FROM notifications", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .filter(|id| !skip.contains_key(id))
        .take(20)
        .collect();
    let rows = stack
        .orders_db
        .client()
        .await
        .query(
            "SELECT o.id, o.status, o.amount_cents, o.customer_id, x.payload
               FROM orders o JOIN outbox x ON x.key = o.id::text AND x.type = 'order.created'
              WHERE o.id = ANY($1) AND o.status <> 'pending'",
            &[&notified],
        )
        .await
        .unwrap();
    rows.iter()
        .map(|r| Decided {
            id: r.get(0),
            status: r.get(1),
            amount_cents: r.get(2),
            customer_id: r.get(3),
            created: r.get(4),
        })
        .collect()
}

async fn order_statuses(stack: &Stack) -> HashMap<Uuid, String> {
    stack
        .orders_db
        .client()
        .await
        .query("SELECT id, status FROM orders", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
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

// ------------------------------------------------------------------ the three-node cluster
//
// `scripts/faults --brokers 3` runs these (and every scenario above but the single
// broker's) on the cluster of `scripts/infra-up --brokers 3`: three replicas per
// partition, `min.insync.replicas=2`, the services' producers with `acks=all`.

/// The topics whose replicas a restarted node must be back in sync on: the stack's and
/// the consumer groups' offsets.
fn replicated_topics(stack: &Stack) -> Vec<String> {
    let mut topics = stack.kafka.topics.all();
    topics.push("__consumer_offsets".to_owned());
    topics
}

/// Rows every service's relay has marked published so far.
async fn published(stack: &Stack) -> i64 {
    invariants::outbox_counts(stack)
        .await
        .iter()
        .map(|(all, unpublished)| all - unpublished)
        .sum()
}

/// How long a node may take to start and catch up on a loaded 2-core machine.
const REJOIN: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults --brokers 3 runs it on the cluster"]
async fn cluster_the_leader_of_an_orders_partition_killed_mid_run_and_restarted_later_loses_nothing()
 {
    let mut stack = Stack::start().await;
    let mut cluster = Cluster::expect(&stack.kafka.brokers);
    let topics = replicated_topics(&stack);
    // A failover takes the controller's session timeout (9 s), a restart half a minute.
    let load = Load::start(&stack, orders(), rate_spanning(Duration::from_secs(50)));
    let (mut failovers, mut rejoins, mut victims) = (Vec::new(), Vec::new(), Vec::new());
    let mut placed_meanwhile = 0;

    for cycle in 1..=cycles() {
        load.reached(at(2 * cycle - 1, 2 * cycles())).await;
        assert_under_load(&load, "the leader was killed");
        let leader = cluster.leaders(&stack.kafka.topics.orders).await[0];
        assert!(leader > 0, "orders partition 0 has a leader");
        let before = load.accepted();
        cluster.kill(leader).await;
        victims.push(leader);
        failovers.push(
            cluster
                .wait_led_without(&stack.kafka.topics.orders, leader, SETTLE)
                .await,
        );
        // The saga runs on two nodes for a while before the third comes back.
        load.reached(before + orders() / (5 * cycles())).await;
        placed_meanwhile += load.accepted() - before;
        let restarted = std::time::Instant::now();
        cluster.start(leader).await;
        cluster.wait_in_sync(&topics, REJOIN).await;
        rejoins.push(restarted.elapsed());
        chaos::tend(&mut stack, None).await;
    }

    let load_rate = load.rate;
    let (findings, _) = drain_and_check(&mut stack, load, None, Vec::new()).await;
    let injected = format!(
        "leader of orders-0 SIGKILLed {} time(s) (node {}): partitions led elsewhere after {}, node started and back in sync after {}; {placed_meanwhile} orders placed meanwhile (load at {load_rate}/s); {}",
        cycles(),
        victims
            .iter()
            .map(i32::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        seconds(&failovers),
        seconds(&rejoins),
        retries_seen(&stack),
    );
    conclude(
        "cluster: a partition leader killed mid-run, restarted later",
        &injected,
        &findings,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults --brokers 3 runs it on the cluster"]
async fn cluster_a_rolling_restart_of_all_three_nodes_under_load_loses_nothing() {
    let mut stack = Stack::start().await;
    let mut cluster = Cluster::expect(&stack.kafka.brokers);
    let topics = replicated_topics(&stack);
    // Three stops, starts and catch-ups of about half a minute each.
    let load = Load::start(&stack, orders(), rate_spanning(Duration::from_secs(90)));
    let mut restarts = Vec::new();

    for cycle in 1..=cycles() {
        load.reached(at(cycle, cycles() + 1)).await;
        for node in NODES {
            assert_under_load(&load, &format!("node {node} was restarted"));
            let since = std::time::Instant::now();
            cluster.terminate(node).await;
            cluster.start(node).await;
            cluster.wait_in_sync(&topics, REJOIN).await;
            restarts.push(since.elapsed());
            chaos::tend(&mut stack, None).await;
        }
    }

    let load_rate = load.rate;
    let (findings, _) = drain_and_check(&mut stack, load, None, Vec::new()).await;
    let injected = format!(
        "{} rolling restart(s): each node in turn SIGTERMed, started and waited back in sync ({}); load at {load_rate}/s; {}",
        cycles(),
        seconds(&restarts),
        retries_seen(&stack),
    );
    conclude(
        "cluster: rolling restart of all three nodes",
        &injected,
        &findings,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults --brokers 3 runs it on the cluster"]
async fn cluster_two_of_three_nodes_down_stops_every_write_the_api_keeps_accepting_and_all_flows_once_one_is_back()
 {
    let mut stack = Stack::start().await;
    let mut cluster = Cluster::expect(&stack.kafka.brokers);
    let topics = replicated_topics(&stack);
    let load = Load::start(&stack, orders(), rate_spanning(Duration::from_secs(50)));
    let (mut held, mut resumed) = (Vec::new(), Vec::new());
    let mut placed_meanwhile = 0;

    for cycle in 1..=cycles() {
        load.reached(at(cycle, cycles() + 1)).await;
        assert_under_load(&load, "two nodes went down");
        let before = load.accepted();
        let (first, second) = (NODES[cycle % 3], NODES[(cycle + 1) % 3]);
        cluster.kill(first).await;
        cluster.kill(second).await;
        // What was acknowledged before the kills may still be marked published: from
        // the next stretch of orders on, nothing may be, as no write can reach two
        // replicas.
        let step = orders() / (10 * cycles());
        load.reached(load.accepted() + step).await;
        let published_before = published(&stack).await;
        load.reached(load.accepted() + step).await;
        let published_after = published(&stack).await;
        assert_eq!(
            published_after, published_before,
            "with one node of three up, nothing is acknowledged (min.insync.replicas=2), so no outbox row is marked published"
        );
        held.push(published_before);
        placed_meanwhile += load.accepted() - before;
        let back = std::time::Instant::now();
        cluster.start(first).await;
        eventually(SETTLE, "the relays to publish again", || async {
            (published(&stack).await > published_after).then_some(())
        })
        .await;
        resumed.push(back.elapsed());
        cluster.start(second).await;
        cluster.wait_in_sync(&topics, REJOIN).await;
        chaos::tend(&mut stack, None).await;
    }

    let load_rate = load.rate;
    let (findings, _) = drain_and_check(&mut stack, load, None, Vec::new()).await;
    let injected = format!(
        "two nodes of three SIGKILLed {} time(s): the API kept accepting ({placed_meanwhile} orders placed meanwhile, load at {load_rate}/s), no row published while one node was up; writes resumed {} after a second node was started; {}",
        cycles(),
        seconds(&resumed),
        retries_seen(&stack),
    );
    conclude(
        "cluster: two of three nodes down, then back one by one",
        &injected,
        &findings,
    );
}

/// A leader killed at the worst moment: its followers are frozen (SIGSTOP) while the load
/// goes on, so the leader alone holds what the relay sent meanwhile; the leader is then
/// SIGKILLed and the followers thawed, and one of them, still in the in-sync set, becomes
/// leader without those records. Topics of one partition, so that the order-service
/// relay's every write goes to the leader killed. With `acks=all` the relay was never
/// told those writes succeeded and sends them again; with `acks=1` (the failpoint
/// [`failpoint::RELAY_ACKS_ONE`] in order-service) it was, and marked their rows
/// published: those orders are lost.
/// Orders placed while the followers are frozen: what only the leader holds when it dies.
const FROZEN_FOR: usize = 20;

async fn leader_killed_behind_frozen_followers(acks_one: bool) -> (Stack, Findings, String) {
    let failpoints = if acks_one {
        vec![(
            ORDER_SERVICE,
            format!("{}=return", failpoint::RELAY_ACKS_ONE),
        )]
    } else {
        Vec::new()
    };
    let mut stack = Stack::start_with_partitions(&failpoints, 1).await;
    let mut cluster = Cluster::expect(&stack.kafka.brokers);
    let topics = replicated_topics(&stack);
    let orders = orders().min(150);
    let load = Load::start(&stack, orders, rate().min(20));

    load.reached(orders / 4).await;
    let leader = cluster.leaders(&stack.kafka.topics.orders).await[0];
    assert!(leader > 0, "the orders partition has a leader");
    let followers: Vec<i32> = NODES.into_iter().filter(|n| *n != leader).collect();
    for follower in &followers {
        cluster.freeze(*follower);
    }
    // Well within the 9 s after which the controller would fence a silent follower and
    // take it out of the in-sync set.
    let frozen_at = load.accepted();
    load.reached(frozen_at + FROZEN_FOR).await;
    cluster.kill(leader).await;
    for follower in &followers {
        cluster.thaw(*follower);
    }
    let failover = cluster
        .wait_led_without(&stack.kafka.topics.orders, leader, SETTLE)
        .await;
    let restarted = std::time::Instant::now();
    cluster.start(leader).await;
    cluster.wait_in_sync(&topics, REJOIN).await;
    let rejoin = restarted.elapsed();
    chaos::tend(&mut stack, None).await;

    let (findings, _) = drain_and_check(&mut stack, load, None, Vec::new()).await;
    let injected = format!(
        "relay acks={}: the two followers of node {leader} (leader of orders) frozen for {} orders, node {leader} SIGKILLed, followers thawed; led elsewhere after {}, started and back in sync after {}; {}",
        if acks_one { "1 (failpoint)" } else { "all" },
        FROZEN_FOR,
        seconds(&[failover]),
        seconds(&[rejoin]),
        retries_seen(&stack),
    );
    (stack, findings, injected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults --brokers 3 runs it on the cluster"]
async fn cluster_a_leader_killed_while_its_followers_lag_loses_nothing_acknowledged_with_acks_all()
{
    let (_stack, findings, injected) = leader_killed_behind_frozen_followers(false).await;
    conclude(
        "cluster: leader killed while its followers lag, acks=all",
        &injected,
        &findings,
    );
}

/// The same fault with the relay trusting the leader alone: the checker must see the
/// orders whose `order.created` the dead leader took with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults --brokers 3 runs it on the cluster"]
async fn cluster_with_acks_1_a_leader_killed_while_its_followers_lag_loses_acknowledged_events_and_the_checker_says_so()
 {
    let (_stack, findings, injected) = leader_killed_behind_frozen_followers(true).await;
    findings.report(
        "cluster: leader killed while its followers lag, acks=1 (a bug on purpose)",
        &injected,
    );
    assert!(
        findings.lost > 0,
        "with acks=1 the events only the dead leader held are gone, and the checker must count their orders lost"
    );
    assert!(
        findings
            .violations
            .iter()
            .any(|v| v.contains("is still pending")),
        "{:?}",
        findings.violations.iter().take(5).collect::<Vec<_>>()
    );
}
