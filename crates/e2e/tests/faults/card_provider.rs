//! The card provider misbehaving: answers lost after it charged or refunded (with the
//! idempotency keys kept while a fifth of the orders are cancelled and payment-service
//! aborts, and with a fresh key on each call, the bug the key prevents), and an outage.

use std::time::Duration;

use saga::failpoint;
use saga_e2e::cancellations::{Cancellations, Cancelled};
use saga_e2e::chaos::Crashes;
use saga_e2e::invariants::Findings;
use saga_e2e::load::Load;
use saga_e2e::{PAYMENT_SERVICE, Stack};
use serde_json::json;

use crate::{
    assert_under_load, at, conclude, cycles, drain_and_check, drain_and_check_with, kills, orders,
    rate, rate_spanning, retries_seen,
};

/// The share of charge and of refund calls whose answer the provider loses after
/// committing the charge or the refund.
const LOST_ANSWERS: f64 = 1.0 / 3.0;

/// How long each charge takes in the second half of a lost-answer run.
const SLOW_CHARGE_MS: u64 = 300;

/// One order in this many is cancelled through the API, at a moment of its own.
const CANCELLED_ONE_IN: u128 = 5;

/// A lost-answer run: the provider loses a third of its refunds' answers
/// (deterministically: every third call) for the whole load, and a third of its charges'
/// for the first half, then takes [`SLOW_CHARGE_MS`] over each, while a fifth of the
/// orders are cancelled. `failpoints` are armed in payment-service for the
/// whole run (a fresh key on each call, the bug the key exists to prevent); `crashes`
/// aborts it and restarts it meanwhile.
async fn lost_answers_run(
    orders: usize,
    failpoints: &[&str],
    mut crashes: Option<Crashes>,
) -> (Stack, Findings, Cancelled) {
    let armed: Vec<(&'static str, String)> = match &crashes {
        Some(crashes) => crashes.armed(),
        None if failpoints.is_empty() => Vec::new(),
        None => vec![(PAYMENT_SERVICE, failpoints.join(";"))],
    };
    let mut stack = Stack::start_with(&armed).await;
    for endpoint in ["charges", "refunds"] {
        stack
            .provider()
            .arm(json!({"kind": "lose-response", "rate": LOST_ANSWERS, "endpoint": endpoint}))
            .await;
    }
    let load = Load::start(&stack, orders, rate());
    let cancellations = Cancellations::start(&stack, &load, CANCELLED_ONE_IN);
    // From half-way, the charges are slow instead of lost: a cancellation then often
    // reaches payment-service while its order's charge is still at the provider, and is
    // prepared before the charge exists.
    load.reached(orders / 2).await;
    stack
        .provider()
        .arm(json!({"kind": "slow", "delay_ms": SLOW_CHARGE_MS}))
        .await;
    let (findings, _, cancelled) = drain_and_check_with(
        &mut stack,
        load,
        Some(cancellations),
        crashes.as_mut(),
        Vec::new(),
    )
    .await;
    let lost = findings.provider["lost_responses"].as_u64().unwrap_or(0);
    let lost_refunds = findings.provider["refunds"]["lost_responses"]
        .as_u64()
        .unwrap_or(0);
    let slowed = findings.provider["slowed"].as_u64().unwrap_or(0);
    assert!(
        lost > 0 && lost_refunds > 0 && slowed > 0,
        "the provider lost no charge's or no refund's answer, or slowed no charge: {}",
        findings.provider
    );
    if let Some(crashes) = &crashes {
        crashes.assert_all_fired();
    }
    (stack, findings, cancelled)
}

/// The cancellations, in words.
fn describe(cancelled: &Cancelled) -> String {
    format!(
        "{} orders cancelled through the API at random moments ({} pending when asked, {} confirmed), {} found cancelled by their declined payment, {} requests sent again",
        cancelled.accepted.len(),
        cancelled.pending,
        cancelled.confirmed,
        cancelled.already,
        cancelled.retried
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults runs it on its own"]
async fn a_third_of_the_providers_answers_lost_while_a_fifth_of_the_orders_are_cancelled_and_payment_service_aborts_are_absorbed_by_asking_again_with_the_same_key()
 {
    // payment-service aborts inside its transaction, after the provider's charge or
    // refund and before recording it: spread over its records (an order.created per
    // order, a cancellation per declined or cancelled one).
    let crashes = Crashes::new(
        failpoint::HANDLER_BEFORE_COMMIT,
        (orders() / (kills() + 1)).max(3),
        kills(),
        &[PAYMENT_SERVICE],
    );
    let injected_crashes = format!(
        "payment-service aborted {} times at {}",
        kills(),
        crashes.failpoint
    );
    let (stack, findings, cancelled) = lost_answers_run(orders(), &[], Some(crashes)).await;
    let stat = |name: &str| findings.provider[name].as_u64().unwrap_or(0);
    let refund_stat = |name: &str| findings.provider["refunds"][name].as_u64().unwrap_or(0);
    let injected = format!(
        "the provider committed every third charge call (in the first half; then took {SLOW_CHARGE_MS} ms over each) and every third refund call and closed the connection without answering: {} charge answers lost of {} calls ({} replayed to the retry, {} slowed), {} refund answers lost of {} calls ({} replayed); {}; {injected_crashes}; {}",
        stat("lost_responses"),
        stat("calls"),
        stat("replayed"),
        stat("slowed"),
        refund_stat("lost_responses"),
        refund_stat("calls"),
        refund_stat("replayed"),
        describe(&cancelled),
        retries_seen(&stack),
    );
    conclude(
        "card provider's answers lost, a fifth of the orders cancelled, payment-service aborted",
        &injected,
        &findings,
    );
    assert!(
        stat("replayed") >= stat("lost_responses")
            && refund_stat("replayed") >= refund_stat("lost_responses"),
        "every lost answer was asked for again and replayed: {}",
        findings.provider
    );
    assert_eq!(
        findings.refunds_refused(),
        0,
        "with the order's key, no refund is asked for twice under two keys: {}",
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
    assert!(
        cancelled.pending > 0 && cancelled.confirmed > 0 && findings.refunded > 0,
        "the cancellations met pending and confirmed orders, and refunds: {}",
        describe(&cancelled)
    );
}

/// The same lost answers and cancellations, with payment-service sending a new key on
/// each call, charge and refund: the retry after a lost charge's answer is a new charge,
/// and the checker must see every one of them. The retry after a lost refund's answer is
/// refused by the provider, which refunds a charge once whatever the key, and
/// payment-service takes the refund the charge lists: no charge is refunded twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults runs it on its own"]
async fn with_a_fresh_key_on_each_call_a_lost_answer_charges_twice_and_the_checker_says_so_while_the_provider_refuses_a_second_refund()
 {
    let fresh_keys = [
        format!("{}=return", failpoint::FRESH_CHARGE_KEY),
        format!("{}=return", failpoint::FRESH_REFUND_KEY),
    ];
    let fresh_keys: Vec<&str> = fresh_keys.iter().map(String::as_str).collect();
    let (_stack, findings, cancelled) =
        lost_answers_run(orders().min(120), &fresh_keys, None).await;
    findings.report(
        "card provider's answers lost, payment-service sending a fresh key on each call (a bug on purpose)",
        &format!(
            "failpoints {} and {} armed; every third refund call's answer lost, every third charge call's in the first half, then each charge slowed; {}",
            failpoint::FRESH_CHARGE_KEY,
            failpoint::FRESH_REFUND_KEY,
            describe(&cancelled)
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
    let refunds = &findings.provider["refunds"];
    assert!(
        findings.refunded_twice == 0
            && !findings
                .violations
                .iter()
                .any(|v| v.contains("refunded 2 times")),
        "the provider refunds a charge once, whatever the key: refunded twice {}",
        findings.refunded_twice
    );
    assert!(
        findings.refunds_refused() > 0 && refunds["replayed"] == 0,
        "each lost refund's retry, under a new key, was refused, not replayed: {refunds}"
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
