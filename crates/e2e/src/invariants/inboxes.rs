//! The inboxes and the dedupe guard: each event passed guard 1 at most once, and
//! `processed_events` holds exactly what was handled past it.

use std::collections::{HashMap, HashSet};

use super::Findings;
use super::databases::Databases;
use super::log::HandledLog;
use crate::SERVICES;

/// The inbox against the logs: each event passed guard 1 at most once, and
/// `processed_events` holds exactly what was handled past it. With the inbox pruned, an
/// event may pass guard 1 again once its id is gone, but be applied only once, and an id
/// may be missing.
pub(super) fn check_inboxes(
    db: &Databases,
    handled: &HandledLog,
    pruned: bool,
    findings: &mut Findings,
) {
    let passes = if pruned {
        &["applied"][..]
    } else {
        &["applied", "guarded"][..]
    };
    for service in SERVICES {
        let inbox = &db.inboxes[service];
        let mut passed: HashMap<&str, usize> = HashMap::new();
        let mut seen: HashSet<&str> = HashSet::new();
        for line in &handled.by_service[service] {
            let Some(id) = line.event_id.as_deref() else {
                continue;
            };
            seen.insert(id);
            if passes.contains(&line.outcome.as_str()) {
                *passed.entry(id).or_default() += 1;
            }
        }
        for (id, n) in &passed {
            if *n > 1 {
                findings.violate(format!(
                    "{service}: event {id} passed the dedupe guard {n} times"
                ));
                findings.applied_twice += 1;
            }
            if !pruned && !inbox.contains(*id) {
                findings.violate(format!(
                    "{service}: event {id} was logged as taking effect but is not in processed_events"
                ));
            }
        }
        for id in inbox {
            if !seen.contains(id.as_str()) {
                findings.violate(format!(
                    "{service}: processed_events holds {id}, which was never logged as handled"
                ));
            }
        }
    }
}
