//! The card provider misbehaving: answers lost after it charged (with the idempotency key
//! kept, and with a fresh key on each call, the bug the key prevents), and an outage.

use std::time::Duration;

use saga::failpoint;
use saga_e2e::invariants::Findings;
use saga_e2e::load::Load;
use saga_e2e::{PAYMENT_SERVICE, Stack};
use serde_json::json;

use crate::{
    assert_under_load, at, conclude, cycles, drain_and_check, orders, rate, rate_spanning,
    retries_seen,
};

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
