//! Records skipped and dead letters: every record of every group's topic handled or
//! dead-lettered, and the dead letters exactly the poison. The records are what a reader
//! of committed records finds: not every offset, as each Kafka transaction of a relay
//! leaves a marker at an offset of its own.

use rdkafka::Message as _;
use saga_testkit::header;
use std::collections::{HashMap, HashSet};

use super::log::HandledLog;
use super::{Expected, Findings, GroupTally, Poison};
use crate::{SERVICES, Stack};

/// A consumer group, the topic it reads and its dead-letter topic.
struct Group {
    service: &'static str,
    name: String,
    topic: String,
    dead_letter_topic: String,
}

/// Partition and offset of a record.
type At = (i32, i64);

/// No record skipped, and dead letters exactly the poison.
pub(super) async fn check_records(
    stack: &Stack,
    expected: &Expected,
    handled: &HandledLog,
    findings: &mut Findings,
) {
    for service in SERVICES {
        let (name, topic, dead_letter_topic) = stack.subscription(service);
        let group = Group {
            service,
            name,
            topic,
            dead_letter_topic,
        };
        let records: Vec<At> = (stack.kafka.read_all(&group.topic).await.iter())
            .map(|record| (record.partition(), record.offset()))
            .collect();
        let mut tally = GroupTally {
            service,
            topic: group.topic.clone(),
            records: records.len() as i64,
            ..Default::default()
        };
        let done = count_handled(&group, handled, &mut tally, findings);
        let dead = read_dead_letters(stack, &group, findings).await;
        tally.dead_lettered = dead.len();
        check_dead_letters_are_the_poison(&group, expected, &dead, &done, findings);
        check_no_record_skipped(&group, &records, &done, &dead, &mut tally, findings);
        findings.groups.push(tally);
    }
}

/// Counts `group`'s deliveries and outcomes into `tally`; returns the records handled.
fn count_handled(
    group: &Group,
    handled: &HandledLog,
    tally: &mut GroupTally,
    findings: &mut Findings,
) -> HashSet<At> {
    let Group { service, topic, .. } = group;
    let mut done: HashSet<At> = HashSet::new();
    for line in &handled.by_service[service] {
        if line.topic != *topic {
            findings.violate(format!("{service} handled a record of {}", line.topic));
            continue;
        }
        tally.deliveries += 1;
        *tally.outcomes.entry(line.outcome.clone()).or_default() += 1;
        done.insert((line.partition, line.offset));
    }
    tally.handled = done.len();
    done
}

/// `group`'s dead letters: the record each stands for, and its reason.
async fn read_dead_letters(
    stack: &Stack,
    group: &Group,
    findings: &mut Findings,
) -> HashMap<At, String> {
    let Group {
        name,
        topic,
        dead_letter_topic,
        ..
    } = group;
    let mut dead: HashMap<At, String> = HashMap::new();
    for message in stack.kafka.read_all(dead_letter_topic).await {
        let at = (
            header(&message, "dlq.original.partition").and_then(|p| p.parse().ok()),
            header(&message, "dlq.original.offset").and_then(|o| o.parse().ok()),
        );
        let (Some(partition), Some(offset)) = at else {
            findings.violate(format!(
                "{dead_letter_topic}: a dead letter without its original partition and offset"
            ));
            continue;
        };
        if header(&message, "dlq.original.topic").as_deref() != Some(topic.as_str())
            || header(&message, "dlq.group").as_deref() != Some(name.as_str())
        {
            findings.violate(format!(
                "{dead_letter_topic}: dead letter of {partition}/{offset} names another topic or group"
            ));
        }
        let reason = header(&message, "dlq.reason").unwrap_or_default();
        dead.insert((partition, offset), reason);
    }
    dead
}

/// Every poison record of `group`'s dead-lettered with its reason and not handled, and
/// no other record dead-lettered.
fn check_dead_letters_are_the_poison(
    group: &Group,
    expected: &Expected,
    dead: &HashMap<At, String>,
    done: &HashSet<At>,
    findings: &mut Findings,
) {
    let Group {
        service,
        topic,
        dead_letter_topic,
        ..
    } = group;
    let poison: HashMap<At, &Poison> = expected
        .poison
        .iter()
        .filter(|p| p.topic == *topic && p.rejected_by.contains(service))
        .map(|p| ((p.partition, p.offset), p))
        .collect();
    for (at, p) in &poison {
        match dead.get(at) {
            Some(reason) if reason.contains(&p.reason) => findings.poison_dead_lettered += 1,
            Some(reason) => findings.violate(format!(
                "{service}: poison {}/{} dead-lettered for `{reason}`, expected `{}`",
                at.0, at.1, p.reason
            )),
            None => findings.violate(format!(
                "{service}: poison {}/{} ({}) is not in {dead_letter_topic}",
                at.0, at.1, p.reason
            )),
        }
        if done.contains(at) {
            findings.violate(format!(
                "{service}: poison {}/{} ({}) was handled as if it were fine",
                at.0, at.1, p.reason
            ));
        }
    }
    for (at, reason) in dead {
        if !poison.contains_key(at) {
            findings.violate(format!(
                "{service}: {}/{} was dead-lettered though it is no poison: {reason}",
                at.0, at.1
            ));
        }
    }
}

/// Every record on the topic handled or dead-lettered; the others counted lost.
fn check_no_record_skipped(
    group: &Group,
    records: &[At],
    done: &HashSet<At>,
    dead: &HashMap<At, String>,
    tally: &mut GroupTally,
    findings: &mut Findings,
) {
    let Group { service, topic, .. } = group;
    for at in records {
        if !done.contains(at) && !dead.contains_key(at) {
            tally.skipped.push(*at);
        }
    }
    if !tally.skipped.is_empty() {
        findings.violate(format!(
            "{service}: {} records of {topic} neither handled nor dead-lettered, e.g. {:?}",
            tally.skipped.len(),
            &tally.skipped[..tally.skipped.len().min(5)]
        ));
        findings.lost += tally.skipped.len();
    }
}
