//! Charges whose `order.created` was dead-lettered after the provider made them, their
//! orders cancelled, the dead letters redriven: the cancellation meets an undecided charge
//! while the provider's list lags. With the charge's own key it is resolved and refunded;
//! with the failpoint that brings back the list-based decision, the refunds are lost, and
//! the checker must say so.

use saga::failpoint;
use saga_e2e::invariants::{self, Expected, Findings, Poison};
use saga_e2e::{PAYMENT_SERVICE, SETTLE, Stack};
use saga_testkit::eventually;
use serde_json::json;
use uuid::Uuid;

use crate::{conclude, drain_timeout};

/// Orders whose charge's answer cannot be recorded: enough for every partition to hold
/// some.
const DEAD: usize = 6;

/// Places [`DEAD`] orders while payment-service may write its intents and not record a
/// charge's answer (its `UPDATE` on `payments` taken away): each is charged, then its
/// `order.created` dead-lettered. Then the grant is back, the orders are cancelled while
/// the provider's list leaves every charge out, and the dead letters are redriven.
/// Returns what the checker found.
async fn dead_charges_cancelled_then_redriven(failpoints: &[(&'static str, String)]) -> Findings {
    let stack = Stack::start_with(failpoints).await;
    stack
        .provider()
        .arm(json!({"kind": "list-lag", "lag_ms": 600_000, "endpoint": "list"}))
        .await;
    stack.payments_privilege("UPDATE", false).await;
    let mut orders: Vec<Uuid> = Vec::new();
    for _ in 0..DEAD {
        orders.push(stack.place_order(1).await);
    }
    let (_, _, dead_letters) = stack.subscription(PAYMENT_SERVICE);
    let dead = eventually(
        SETTLE,
        "every order.created to be dead-lettered",
        || async {
            let dead = stack.kafka.read_all(&dead_letters).await;
            (dead.len() == DEAD).then_some(dead)
        },
    )
    .await;
    stack.payments_privilege("UPDATE", true).await;
    for order_id in &orders {
        assert_eq!(stack.cancel(*order_id, None).await.status, 202);
    }
    for order_id in &orders {
        stack.answered_cancellation(*order_id).await;
    }
    let printed = stack.redrive(&dead_letters, None).await;
    assert!(
        printed.contains(&format!("redriven {DEAD} records")),
        "{printed}"
    );

    let poison = dead
        .iter()
        .map(|record| {
            let header = |name| saga::kafka::header(record, name).expect(name);
            Poison {
                topic: stack.kafka.topics.orders.clone(),
                partition: header("dlq.original.partition").parse().unwrap(),
                offset: header("dlq.original.offset").parse().unwrap(),
                rejected_by: vec![PAYMENT_SERVICE],
                reason: "permission denied".into(),
            }
        })
        .collect();
    let expected = Expected {
        accepted: orders.clone(),
        offered: None,
        inbox_pruned: false,
        poison,
        cancelled: Some(orders),
    };
    invariants::check(&stack, &expected, drain_timeout()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults runs it on its own"]
async fn charges_dead_lettered_after_the_call_then_cancelled_and_redriven_are_refunded_under_their_keys()
 {
    let findings = dead_charges_cancelled_then_redriven(&[]).await;
    assert_eq!(findings.refunded, DEAD, "{:?}", findings.violations);
    conclude(
        "charges dead-lettered after the call, cancelled, redriven",
        &format!(
            "{DEAD} orders charged while payment-service could not record the answer (UPDATE on payments revoked), each order.created dead-lettered; \
             cancelled with the provider's list leaving every charge out; the dead letters redriven"
        ),
        &findings,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults runs it on its own"]
async fn with_the_list_deciding_the_cancelled_charges_are_never_refunded_and_the_checker_says_so() {
    let armed = [(
        PAYMENT_SERVICE,
        format!("{}=return", failpoint::LIST_DECIDES),
    )];
    let findings = dead_charges_cancelled_then_redriven(&armed).await;
    findings.report(
        "the list deciding what a cancellation refunds (a bug on purpose)",
        &format!(
            "failpoint {} armed; {DEAD} orders charged, their order.created dead-lettered, cancelled, redriven",
            failpoint::LIST_DECIDES
        ),
    );
    let lost: Vec<&String> = findings
        .violations
        .iter()
        .filter(|v| v.contains("charged 1299 minus refunded 0 should be 0"))
        .collect();
    assert_eq!(
        lost.len(),
        DEAD,
        "each cancelled order's charge stands unrefunded, and the checker must say so: {:?}",
        findings.violations
    );
}
