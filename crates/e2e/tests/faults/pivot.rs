//! The payment pivot under the faults real card providers produce, with its partitions
//! moving: three copies of payment-service, one SIGKILLed and one added mid-run; a third
//! of the charges commit after payment-service gave up on them (`commit-late`), the
//! provider's list lags behind its charges (`list-lag`), a refund in four is refused; and
//! a fifth of the orders cancelled at random moments, before, during and after their
//! charge. The checker's money invariant at rest: every order charged minus refunded is
//! its amount if confirmed, 0 if cancelled, or the amount with its refund's failure
//! visible; no charge without its payment; no payment left undecided.

use saga_e2e::cancellations::Cancellations;
use saga_e2e::load::Load;
use saga_e2e::{PAYMENT_SERVICE, Stack, invariants};
use serde_json::json;

use crate::{assert_under_load, at, conclude, drain_and_check_with, orders, rate};

/// payment-service's `PROVIDER_TIMEOUT` here: short, so that a late commit outlasts it
/// without holding a partition for long.
const PROVIDER_TIMEOUT: &str = "1s";
/// How long the provider holds a late charge's commit: past [`PROVIDER_TIMEOUT`].
const COMMIT_LATE_MS: u64 = 1500;
/// The share of charges committed late, and of refunds refused.
const LATE_CHARGES: f64 = 1.0 / 3.0;
const REFUSED_REFUNDS: f64 = 1.0 / 4.0;
/// One order in this many is cancelled through the API, at a moment of its own.
const CANCELLED_ONE_IN: u128 = 5;

/// PostgreSQL here accepts 100 connections: each copy of a service with pools of 2.
const POOLS: [(&str, &str); 3] = [
    ("DATABASE_POOL_SIZE", "2"),
    ("CONSUMER_POOL_SIZE", "2"),
    ("PROVIDER_TIMEOUT", PROVIDER_TIMEOUT),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults runs it on its own"]
async fn the_payment_pivot_with_late_commits_refused_refunds_and_moving_partitions_ends_every_order_visibly()
 {
    let mut stack = Stack::start_with_env(&POOLS).await;
    for copy in ["payment-service-2", "payment-service-3"] {
        let exited = stack.start_instance(PAYMENT_SERVICE, copy, None).await;
        assert!(exited.is_none(), "{copy} exited: {exited:?}");
    }
    let provider = stack.provider();
    provider
        .arm(json!({"kind": "commit-late", "delay_ms": COMMIT_LATE_MS, "rate": LATE_CHARGES}))
        .await;
    provider
        .arm(json!({"kind": "refuse", "rate": REFUSED_REFUNDS, "endpoint": "refunds"}))
        .await;
    provider
        .arm(json!({"kind": "list-lag", "lag_ms": 600_000, "endpoint": "list"}))
        .await;
    let load = Load::start(&stack, orders(), rate());
    let cancellations = Cancellations::start(&stack, &load, CANCELLED_ONE_IN);

    load.reached(at(1, 3)).await;
    assert_under_load(&load, "a copy of payment-service was killed");
    stack.kill_instance("payment-service-2").await;
    load.reached(at(2, 3)).await;
    assert_under_load(&load, "a copy of payment-service was added");
    let exited = stack
        .start_instance(PAYMENT_SERVICE, "payment-service-4", None)
        .await;
    assert!(exited.is_none(), "payment-service-4 exited: {exited:?}");

    let (findings, _, cancelled) =
        drain_and_check_with(&mut stack, load, Some(cancellations), None, Vec::new()).await;
    let stat = |path: &[&str]| {
        path.iter()
            .fold(&findings.provider, |value, key| &value[*key])
            .as_u64()
            .unwrap_or(0)
    };
    let (late, refused) = (stat(&["committed_late"]), stat(&["refunds", "refused"]));
    assert!(
        late > 0 && refused > 0,
        "no charge committed late, or no refund refused: {}",
        findings.provider
    );
    let revokes = invariants::count_in_logs(&stack, PAYMENT_SERVICE, "partitions revoked");
    let injected = format!(
        "3 copies of payment-service, one SIGKILLed and one added under load ({revokes} revokes logged); \
         {late} charges committed {COMMIT_LATE_MS} ms late, past its {PROVIDER_TIMEOUT} timeout; \
         {refused} refunds refused; the provider's list a minute behind, and asked {} times (nothing decides by it); \
         {} orders cancelled through the API ({} pending when asked, {} confirmed)",
        stat(&["list", "calls"]),
        cancelled.accepted.len(),
        cancelled.pending,
        cancelled.confirmed,
    );
    assert!(
        invariants::count_in_logs(&stack, PAYMENT_SERVICE, "could not be refunded") > 0,
        "no refund failure was recorded: {injected}"
    );
    conclude(
        "the payment pivot: late commits, refused refunds, moving partitions",
        &injected,
        &findings,
    );
}
