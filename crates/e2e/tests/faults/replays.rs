//! Replays: every group rewound to its topic's first offset, a duplicate storm, with the
//! inboxes whole and after they were pruned to empty.

use std::collections::BTreeMap;

use saga_e2e::chaos;
use saga_e2e::invariants::{self, Findings};
use saga_e2e::load::Load;
use saga_e2e::{SERVICES, Stack, infra};
use saga_testkit::eventually;

use crate::{conclude, drain_and_check, drain_timeout, orders, rate};

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
        // Records, not offsets: each of a relay's Kafka transactions leaves a marker.
        replayed += stack.kafka.read_all(&topic).await.len() as i64;
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
