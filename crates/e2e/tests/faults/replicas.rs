//! Replicas: three copies of every service under load. The copy of order-service that
//! holds its outbox relay, pruner and deadline sweeper freezes (SIGSTOP) between its
//! relay's check of the lease and its send (the failpoint `relay.before-send`), until
//! other copies have taken the three over; thawed, it must publish nothing, not even the
//! batch it held when it froze; then
//! the relay's holder of every service is SIGKILLed while standbys wait, and restarted.
//! The figures: each takeover, the orders placed meanwhile, and how long each service's
//! partitions went unread after its kill.

use std::time::{Duration, Instant};

use saga_e2e::load::Load;
use saga_e2e::{ORDER_SERVICE, SERVICES, SETTLE, Stack, invariants};
use saga_testkit::eventually;

use crate::{assert_under_load, at, conclude, drain_and_check, orders, rate_spanning};

const COPIES: usize = 3;
/// The scenario's `SINGLETON_LEASE`: short, so that the freeze is short too, yet three
/// times what a heartbeat may take on a loaded 2-core machine.
const LEASE: &str = "5s";
/// The lease plus a standby's retry interval (a quarter of the lease, at most 1 s).
const BOUND: Duration = Duration::from_secs(6);
/// What a loaded 2-core machine and the log's polling may add to the bound.
const SLACK: Duration = Duration::from_secs(3);

/// Each singleton, as its lease names it in the logs (`<name> active`).
const RELAY: &str = "outbox relay";
const SINGLETONS: [&str; 3] = [RELAY, "pruner", "deadline sweeper"];

/// PostgreSQL here accepts 100 connections (`max_connections`). A copy holds its HTTP
/// pool (2), its consumer's (2) and a session per singleton, standbys' included (relay
/// and pruner; order-service's deadline sweeper too): 7 for a copy of order-service, 6
/// for the others, 3 × (7 + 6 + 6) = 57, and the provider's 2 + 2 + 1 = 5: 62, leaving
/// room for a restarted copy's migration, the checker's sessions and the server's other
/// clients.
const POOLS: [(&str, &str); 3] = [
    ("DATABASE_POOL_SIZE", "2"),
    ("CONSUMER_POOL_SIZE", "2"),
    ("SINGLETON_LEASE", LEASE),
];

fn copy(service: &str, n: usize) -> String {
    match n {
        1 => service.to_owned(),
        n => format!("{service}-{n}"),
    }
}

/// Whether the log of a copy says it holds `singleton` now: since its last start, its
/// last line about the lease says it took it.
fn holds(log: &str, singleton: &str) -> bool {
    let log = &log[log.rfind("service started").unwrap_or(0)..];
    let took = log.rfind(&format!("{singleton} active"));
    let lost = [
        format!("{singleton} lease lost"),
        format!("{singleton} interrupted"),
    ]
    .iter()
    .filter_map(|line| log.rfind(line.as_str()))
    .max();
    took.is_some() && took > lost
}

/// The running copy of `service`, other than `except` (a frozen copy still believes it
/// holds), that holds `singleton`.
fn holder(stack: &Stack, service: &str, singleton: &str, except: &str) -> Option<String> {
    stack
        .running()
        .into_iter()
        .filter(|copy| stack.instances()[copy] == service && copy != except)
        .find(|copy| holds(&stack.log(copy), singleton))
}

/// Waits for a copy other than `from` to hold `singleton`; returns it and how long after
/// `since` it was seen holding it.
async fn taken_over(
    stack: &Stack,
    service: &str,
    singleton: &str,
    (from, since): (&str, Instant),
) -> (String, Duration) {
    let copy = eventually(
        BOUND + SLACK,
        &format!("a copy of {service} other than {from} to take the {singleton} over"),
        || async { holder(stack, service, singleton, from) },
    )
    .await;
    (copy, since.elapsed())
}

/// Waits for copies other than `frozen` to hold each of order-service's singletons;
/// returns who took each over and how long after `frozen_at` it was first seen holding it.
async fn all_taken_over(stack: &Stack, frozen: &str, frozen_at: Instant) -> Vec<String> {
    let mut seen: Vec<Option<String>> = vec![None; SINGLETONS.len()];
    let seen = std::sync::Mutex::new(&mut seen);
    eventually(
        BOUND + SLACK,
        &format!("copies other than {frozen} to take over its singletons"),
        || async {
            let mut seen = seen.lock().unwrap();
            for (singleton, seen) in SINGLETONS.iter().zip(seen.iter_mut()) {
                if seen.is_none() {
                    *seen = holder(stack, ORDER_SERVICE, singleton, frozen).map(|copy| {
                        let after = frozen_at.elapsed().as_secs_f64();
                        format!("{singleton} by {copy} in {after:.1} s")
                    });
                }
            }
            seen.iter().all(Option::is_some).then_some(())
        },
    )
    .await;
    let seen = seen.into_inner().unwrap();
    seen.iter().flatten().cloned().collect()
}

/// The event ids found more than once on order-service's topic: before any copy is
/// killed, only a stale batch published after its successor's could put one there.
async fn events_twice(stack: &Stack) -> Vec<String> {
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    for record in stack.kafka.read_all(&stack.kafka.topics.orders).await {
        if let Some(id) = saga::kafka::header(&record, "event_id") {
            *seen.entry(id).or_default() += 1;
        }
    }
    seen.into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(id, _)| id)
        .collect()
}

async fn published(stack: &Stack) -> i64 {
    stack
        .orders_db
        .count(
            "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL",
            &[],
        )
        .await
}

/// Starts the other copies once the first of each holds its singletons, so that the
/// first copy of order-service holds all three.
async fn start_copies(stack: &mut Stack) {
    for service in SERVICES {
        let singletons = if service == ORDER_SERVICE {
            &SINGLETONS[..]
        } else {
            &SINGLETONS[..2]
        };
        eventually(SETTLE, &format!("{service} to hold its singletons"), || {
            let log = stack.log(service);
            async move { singletons.iter().all(|s| holds(&log, s)).then_some(()) }
        })
        .await;
    }
    for service in SERVICES {
        for n in 2..=COPIES {
            let exited = stack.start_instance(service, &copy(service, n), None).await;
            assert!(exited.is_none(), "{} exited: {exited:?}", copy(service, n));
        }
    }
}

/// The holder's relay freezes itself between its lease check and its send after this
/// many sends have gone through: a third or so into the load.
const SENDS_BEFORE_THE_FREEZE: usize = 150;

/// What a frozen copy logs as it freezes itself (`saga::failpoint::freeze_point`).
const FREEZING: &str = "failpoint reached: freezing the process";

/// Waits until order-service's singletons' holder freezes itself with a batch in hand,
/// until others hold all three and rows are published again; thaws it, and checks that
/// it publishes nothing: no record of its stale batch reaches the topic (no event twice
/// on it), and its count of records published stays put. Returns the figures.
async fn freeze_the_holder(stack: &mut Stack, load: &Load) -> String {
    let frozen = holder(stack, ORDER_SERVICE, RELAY, "").expect("a copy holds the relay");
    for singleton in SINGLETONS {
        assert!(
            holds(&stack.log(&frozen), singleton),
            "{frozen} holds the relay but not the {singleton}"
        );
    }
    let accepted = load.accepted();
    eventually(
        SETTLE,
        &format!("{frozen} to freeze with a batch in hand"),
        || {
            let log = stack.log(&frozen);
            async move { log.contains(FREEZING).then_some(()) }
        },
    )
    .await;
    let frozen_at = Instant::now();
    let takeovers = all_taken_over(stack, &frozen, frozen_at).await;
    let before = published(stack).await;
    eventually(SETTLE, "the new relay to publish", || async {
        (published(stack).await > before).then_some(())
    })
    .await;
    assert_under_load(load, "the frozen copy was thawed");
    let placed = load.accepted() - accepted;
    stack.thaw_instance(&frozen).await;
    let thawed_at = Instant::now();
    eventually(
        SETTLE,
        &format!("{frozen}, thawed, to give the relay up"),
        || {
            let log = stack.log(&frozen);
            async move { (!holds(&log, RELAY)).then_some(()) }
        },
    )
    .await;
    let gave_up = thawed_at.elapsed();
    let twice = events_twice(stack).await;
    assert!(
        twice.is_empty(),
        "{frozen}, thawed, published its stale batch: {} events twice on {}: {twice:?}",
        twice.len(),
        stack.kafka.topics.orders
    );
    let sent = |m: saga_e2e::metrics::Metrics| m.count("saga_outbox_published_total", &[]);
    let sent_then = sent(stack.metrics(&frozen).await);
    let before = published(stack).await;
    eventually(SETTLE, "more rows published by the new relay", || async {
        (published(stack).await >= before + 20).then_some(())
    })
    .await;
    let sent_since = sent(stack.metrics(&frozen).await) - sent_then;
    assert_eq!(
        sent_since, 0,
        "{frozen}, thawed, published {sent_since} records after giving the relay up"
    );
    format!(
        "{frozen} frozen (SIGSTOP) between its lease check and its send, holding all three \
         singletons: {} (bound {} s); {placed} orders placed meanwhile; thawed, it gave the \
         relay up in {:.1} s, its stale batch fenced (no event twice on the topic), and \
         published nothing since",
        takeovers.join(", "),
        BOUND.as_secs(),
        gave_up.as_secs_f64()
    )
}

/// The database's clock now, in milliseconds since the epoch: when a claim's
/// `processed_at` is compared with it, both come from the one clock.
async fn clock_ms(stack: &Stack, service: &str) -> i64 {
    stack
        .database(service)
        .count(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
            &[],
        )
        .await
}

/// How long the consumers of `service` left a partition unread after one of them was
/// SIGKILLed at `killed_ms`: the longest any partition waited for its next claim. The
/// group gives the dead member's partitions away only once its session times out, and a
/// rebalance takes every partition from every member meanwhile.
async fn rebalance_pause(stack: &Stack, service: &str, killed_ms: i64) -> Duration {
    let waited = stack
        .database(service)
        .count(
            "SELECT coalesce(max(first - $1::bigint), 0) FROM (
                 SELECT (extract(epoch FROM min(processed_at)) * 1000)::bigint AS first
                   FROM processed_events
                  WHERE processed_at > to_timestamp($1::bigint / 1000.0)
                  GROUP BY topic, partition) AS after",
            &[&killed_ms],
        )
        .await;
    Duration::from_millis(u64::try_from(waited).expect("after the kill"))
}

/// SIGKILLs the relay's holder of every service while standbys wait, then restarts it.
/// Returns the figures, and when (the database's clock) each service's copy was killed.
async fn kill_the_holders(stack: &mut Stack, load: &Load) -> (String, Vec<(&'static str, i64)>) {
    let accepted = load.accepted();
    let mut takeovers = Vec::new();
    let mut kills = Vec::new();
    for service in SERVICES {
        let killed = holder(stack, service, RELAY, "").expect("a copy holds the relay");
        assert_under_load(load, &format!("{killed} was killed"));
        stack.kill_instance(&killed).await;
        let killed_at = Instant::now();
        kills.push((service, clock_ms(stack, service).await));
        // The killed copy's sessions close with it: a standby's next try takes the lease.
        let (copy, after) = taken_over(stack, service, RELAY, (&killed, killed_at)).await;
        takeovers.push(format!("{killed} → {copy} in {:.1} s", after.as_secs_f64()));
        let exited = stack.start_instance(service, &killed, None).await;
        assert!(exited.is_none(), "{killed} exited: {exited:?}");
    }
    let figures = format!(
        "relay holders SIGKILLed and restarted: {}; {} orders placed meanwhile",
        takeovers.join(", "),
        load.accepted() - accepted
    );
    (figures, kills)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault suite: scripts/faults runs it on its own"]
async fn replicas_three_copies_each_with_singleton_holders_frozen_and_killed_lose_nothing() {
    let freeze = format!("relay.before-send={SENDS_BEFORE_THE_FREEZE}*off->1*return->off");
    let mut stack = Stack::start_configured(
        &[(ORDER_SERVICE, freeze)],
        &POOLS,
        saga_testkit::topic_partitions(),
    )
    .await;
    start_copies(&mut stack).await;
    let copies: Vec<String> = (1..=COPIES).map(|n| copy(ORDER_SERVICE, n)).collect();
    let copies: Vec<&str> = copies.iter().map(String::as_str).collect();
    // Long enough for a freeze of a lease or so and three kills and restarts.
    let load = Load::spread(
        &stack,
        &copies,
        orders(),
        rate_spanning(Duration::from_secs(30)),
    );

    load.reached(at(1, 3)).await;
    let freeze = freeze_the_holder(&mut stack, &load).await;
    load.reached(at(2, 3)).await;
    let (kills, killed_at) = kill_the_holders(&mut stack, &load).await;

    let (findings, _) = drain_and_check(&mut stack, load, None, Vec::new()).await;
    let mut pauses = Vec::new();
    for (service, killed_ms) in killed_at {
        let pause = rebalance_pause(&stack, service, killed_ms).await;
        pauses.push(format!("{service} {:.1} s", pause.as_secs_f64()));
    }
    let assignments: Vec<String> = SERVICES
        .iter()
        .map(|s| {
            format!(
                "{s} {}",
                invariants::count_in_logs(&stack, s, "partitions assigned")
            )
        })
        .collect();
    let injected = format!(
        "{COPIES} copies of each service, SINGLETON_LEASE {LEASE}; {freeze}; {kills}; \
         longest a partition went unread after the kill (the rebalance): {}; partition \
         assignments logged: {}",
        pauses.join(", "),
        assignments.join(", ")
    );
    conclude(
        "three copies of each service, holders frozen and killed",
        &injected,
        &findings,
    );
}
