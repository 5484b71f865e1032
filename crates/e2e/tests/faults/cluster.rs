//! The three-node cluster: `scripts/faults --brokers 3` runs these (and every other
//! family's scenarios but the single broker's) on the cluster of
//! `scripts/infra-up --brokers 3`: three replicas per partition, `min.insync.replicas=2`,
//! the services' producers with `acks=all`.

use std::time::Duration;

use saga::failpoint;
use saga_e2e::chaos;
use saga_e2e::infra::{Cluster, NODES};
use saga_e2e::invariants::{self, Findings};
use saga_e2e::load::Load;
use saga_e2e::{ORDER_SERVICE, SETTLE, Stack};
use saga_testkit::eventually;

use crate::{
    assert_under_load, at, conclude, cycles, drain_and_check, orders, rate, rate_spanning,
    retries_seen, seconds,
};

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

/// Orders placed while the followers are frozen: what only the leader holds when it dies.
const FROZEN_FOR: usize = 20;

/// A leader killed at the worst moment: its followers are frozen (SIGSTOP) while the load
/// goes on, so the leader alone holds what the relay sent meanwhile; the leader is then
/// SIGKILLed and the followers thawed, and one of them, still in the in-sync set, becomes
/// leader without those records. Topics of one partition, so that the order-service
/// relay's every write goes to the leader killed. With `acks=all` the relay was never
/// told those writes succeeded and sends them again; with `acks=1` (the failpoint
/// [`failpoint::RELAY_ACKS_ONE`] in order-service) it was, and marked their rows
/// published: those orders are lost.
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
