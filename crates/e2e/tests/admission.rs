//! Admission control through the real binaries: with payment-service held back, the
//! order API accepts orders up to its cap of orders in flight, then refuses them (`503
//! saga_behind`, `Retry-After`) without storing anything; once payment-service is back
//! and the backlog drains, it accepts again, and every order accepted settles. Two copies
//! of order-service keep the one cap, and each measures the whole saga's settle rate.

use std::sync::atomic::{AtomicUsize, Ordering};

use saga::metrics::{ADMISSION_COUNTED, ADMISSION_LIMIT, ORDERS_IN_FLIGHT};
use saga_e2e::{KEYBOARD, ORDER_SERVICE, PAYMENT_SERVICE, SETTLE, Stack};
use saga_testkit::eventually;
use serde_json::{Value, json};
use uuid::Uuid;

/// The cap this test runs order-service with, small so that a held-back consumer reaches
/// it in moments. `ADMISSION_MAX_WAIT=0` keeps it at that: the cap that follows the
/// saga's rate is the unit tests' (`order_service::admission`), and the orders settled
/// between rounds would raise it here by as many as the rate allows.
const CAP: usize = 12;

/// Rounds of holding payment-service back and letting it go.
const ROUNDS: usize = 3;

struct Answer {
    status: u16,
    retry_after: Option<String>,
    body: Value,
}

async fn post(stack: &Stack, key: &str) -> Answer {
    post_to(stack, ORDER_SERVICE, key).await
}

/// A POST to one copy of order-service.
async fn post_to(stack: &Stack, copy: &str, key: &str) -> Answer {
    let (http, _) = stack.api();
    let response = http
        .post(format!("{}/v1/orders", stack.url_of(copy)))
        .header("idempotency-key", format!("\"{key}\""))
        .json(&json!({ "customer_id": "cust-1", "items": [{ "product_id": KEYBOARD, "quantity": 1 }] }))
        .send()
        .await
        .expect("order-service answers");
    Answer {
        status: response.status().as_u16(),
        retry_after: response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned()),
        body: response.json().await.expect("a JSON body"),
    }
}

async fn orders_stored(stack: &Stack) -> i64 {
    stack
        .database(ORDER_SERVICE)
        .client()
        .await
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_payment_service_held_back_orders_past_the_cap_are_refused_and_accepted_again_once_it_catches_up()
 {
    let mut stack = held_back_stack().await;
    held_back_rounds(&mut stack, &[ORDER_SERVICE]).await;
}

/// Two copies of order-service taking turns: refused at the one cap, as one copy is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_copies_taking_turns_refuse_orders_past_the_one_cap_with_payment_service_held_back() {
    let mut stack = held_back_stack().await;
    let started = stack.start_instance(ORDER_SERVICE, SECOND_COPY, None).await;
    assert!(started.is_none(), "the second copy exited: {started:?}");
    held_back_rounds(&mut stack, &[ORDER_SERVICE, SECOND_COPY]).await;
}

async fn held_back_stack() -> Stack {
    let cap = CAP.to_string();
    Stack::start_with_env(&[
        ("ADMISSION_MAX_IN_FLIGHT", &cap),
        ("ADMISSION_MAX_WAIT", "0s"),
        ("ADMISSION_POLL_INTERVAL", "250ms"),
    ])
    .await
}

/// [`ROUNDS`] rounds of holding payment-service back, placing orders at `copies` in turn
/// until one is refused, and letting it go; then every order accepted settles.
async fn held_back_rounds(stack: &mut Stack, copies: &[&str]) {
    let mut accepted: Vec<Uuid> = Vec::new();
    for round in 0..ROUNDS {
        wait_for_an_empty_saga(stack, copies, &accepted).await;
        assert!(
            stack.terminate_service(PAYMENT_SERVICE).await,
            "payment-service stops"
        );
        let (placed, refused) =
            place_orders_until_refused(stack, copies, round, &mut accepted).await;
        assert_refused_for_being_behind(stack, round, placed, &refused, &accepted).await;
        in_flight_summed_over(stack, copies, placed).await;

        stack.start_service(PAYMENT_SERVICE).await;
        let retried = accepted_again(stack, round, placed).await;
        assert!(
            retried.body["status"] == "pending",
            "a new order: {}",
            retried.body
        );
        accepted.push(retried.body["id"].as_str().unwrap().parse().unwrap());
    }

    for id in &accepted {
        assert_eq!(
            stack.settled_order(*id).await["status"],
            "confirmed",
            "order {id}"
        );
    }
    assert_eq!(
        orders_stored(stack).await,
        accepted.len() as i64,
        "every order accepted, and no other, is stored"
    );
}

/// Each round from an empty saga, as every copy counts it.
async fn wait_for_an_empty_saga(stack: &Stack, copies: &[&str], accepted: &[Uuid]) {
    for id in accepted {
        stack.settled_order(*id).await;
    }
    counted_by(stack, copies, 0).await;
}

/// The orders in flight, a gauge of the one database: one copy reports them, so that a
/// dashboard's sum over the copies is `n`, not `n` times the copies.
async fn in_flight_summed_over(stack: &Stack, copies: &[&str], n: usize) {
    eventually(
        SETTLE,
        &format!("the copies' sum to be {n} in flight"),
        || async {
            let mut sum = 0.0;
            for copy in copies {
                sum += stack.metrics(copy).await.sum(ORDERS_IN_FLIGHT, &[]);
            }
            (sum == n as f64).then_some(())
        },
    )
    .await;
}

/// Until each of `copies` has counted `n` orders in flight.
async fn counted_by(stack: &Stack, copies: &[&str], n: usize) {
    eventually(
        SETTLE,
        &format!("every copy to count {n} orders in flight"),
        || async {
            for copy in copies {
                if stack.metrics(copy).await.sum(ADMISSION_COUNTED, &[]) != n as f64 {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
}

/// Places orders one after the other, keeping those accepted, until one is refused;
/// returns how many were placed, and the refusal.
async fn place_orders_until_refused(
    stack: &Stack,
    copies: &[&str],
    round: usize,
    accepted: &mut Vec<Uuid>,
) -> (usize, Answer) {
    // The orders in flight from here on: none of them can move past payment-service.
    // Placed one after the other until the first refusal: at the cap, or one early
    // if a count ran while an order committed (counted twice until the next count;
    // the poll interval is long enough that at most one count falls in the burst).
    let mut placed = 0;
    let refused = loop {
        let copy = copies[placed % copies.len()];
        if copies.len() > 1 {
            // A copy learns of another's orders at its next count, as one copy knows its
            // own at once: each waits for that count, or a burst over several copies
            // would pass the cap by what the others placed since (see admission.rs).
            counted_by(stack, copies, placed).await;
        }
        let answer = post_to(stack, copy, &format!("r{round}-{placed}")).await;
        if answer.status != 201 {
            break answer;
        }
        accepted.push(answer.body["id"].as_str().unwrap().parse().unwrap());
        placed += 1;
        assert!(
            placed <= CAP,
            "round {round}: {placed} orders accepted with the saga held back, past the cap of {CAP}"
        );
    };
    (placed, refused)
}

/// Refused at the cap, `503 saga_behind` saying how far behind, with `Retry-After`, and
/// nothing of it stored.
async fn assert_refused_for_being_behind(
    stack: &Stack,
    round: usize,
    placed: usize,
    refused: &Answer,
    accepted: &[Uuid],
) {
    assert!(
        placed >= CAP - 1,
        "round {round}: refused after {placed} orders, before the cap of {CAP}: {}",
        refused.body
    );
    assert_eq!(refused.status, 503, "past the cap: {}", refused.body);
    assert_eq!(
        refused.body["error"]["code"], "saga_behind",
        "{}",
        refused.body
    );
    let message = refused.body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(" orders in flight") && message.contains(&format!("limit of {CAP}")),
        "the refusal says how far behind: {message}"
    );
    assert_eq!(refused.retry_after.as_deref(), Some("1"), "Retry-After");
    assert_eq!(
        orders_stored(stack).await,
        accepted.len() as i64,
        "the orders accepted are stored, and the refused one is not"
    );
}

/// The same key again: refused before, so nothing of it was kept, and once the
/// backlog drains it places its order (201, not a replay).
async fn accepted_again(stack: &Stack, round: usize, placed: usize) -> Answer {
    eventually(SETTLE, "the order API to accept again", || async {
        let answer = post(stack, &format!("r{round}-{placed}")).await;
        (answer.status == 201).then_some(answer)
    })
    .await
}

/// A second copy of order-service, which places no order in this test.
const SECOND_COPY: &str = "order-service-2";

/// Every copy measures the whole saga's settle rate: the copy that places none of the
/// orders finds the same cap as the one that places them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_copys_cap_rises_past_its_floor_while_the_saga_settles_orders_and_falls_back_when_it_stops()
 {
    let floor = CAP.to_string();
    let mut stack = Stack::start_with_env(&[
        ("ADMISSION_MAX_IN_FLIGHT", &floor),
        // The tens of orders a second this test settles are worth more than the floor in
        // this wait; what a copy would make up from its own placements alone, the ups
        // and downs of the count from one second to the next, is not.
        ("ADMISSION_MAX_WAIT", "2s"),
        ("ADMISSION_POLL_INTERVAL", "1s"),
    ])
    .await;
    let started = stack.start_instance(ORDER_SERVICE, SECOND_COPY, None).await;
    assert!(started.is_none(), "the second copy exited: {started:?}");
    let limits = async |stack: &Stack| {
        let mut limits = Vec::new();
        for copy in [ORDER_SERVICE, SECOND_COPY] {
            limits.push(stack.metrics(copy).await.sum(ADMISSION_LIMIT, &[]));
        }
        limits
    };
    let floors = vec![CAP as f64; 2];
    // The first count sets it: the floor, as nothing has settled yet.
    eventually(
        SETTLE,
        "each copy's cap to be its floor before any order",
        || async { (limits(&stack).await == floors).then_some(()) },
    )
    .await;

    let next = AtomicUsize::new(0);
    eventually(SETTLE, "each copy's cap to rise past its floor", || {
        let (stack, next) = (&stack, &next);
        async move {
            for _ in 0..5 {
                let key = format!("rise-{}", next.fetch_add(1, Ordering::Relaxed));
                let answer = post(stack, &key).await;
                assert!(
                    answer.status == 201 || answer.body["error"]["code"] == "saga_behind",
                    "{}",
                    answer.body
                );
            }
            let limits = limits(stack).await;
            limits.iter().all(|&limit| limit > CAP as f64).then_some(())
        }
    })
    .await;

    // Nothing settles past a stopped payment-service: the window empties, and the caps
    // fall down to the floor and no further.
    assert!(
        stack.terminate_service(PAYMENT_SERVICE).await,
        "payment-service stops"
    );
    eventually(
        SETTLE,
        "each copy's cap to fall back to its floor",
        || async { (limits(&stack).await == floors).then_some(()) },
    )
    .await;
}
