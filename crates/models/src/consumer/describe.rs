//! The consumer model's steps in the course's words, as `scripts/model` prints them.

use super::{
    Action, EVENTS, EventInfo, Guard, NAMES, Outcome, PARTITIONS, Step, Transaction, World,
};

impl Transaction {
    /// One step in the course's words, from the world before and after it.
    pub(super) fn describe(&self, before: &World, after: &World, action: Action) -> String {
        let w = match action {
            Action::Rebalance => {
                return format!(
                    "a rebalance moves payments-0 from consumer A to consumer C, which starts at the committed offset {}",
                    after.committed_offsets[0]
                );
            }
            Action::Poll(w)
            | Action::Claim(w)
            | Action::ReadStatus(w)
            | Action::Write(w)
            | Action::InsertOutbox(w)
            | Action::Commit(w)
            | Action::CommitOffset(w)
            | Action::Crash(w) => w,
        };
        let who = format!("consumer {}", NAMES[w]);
        let worker = before.workers[w];
        let event = &EVENTS[PARTITIONS[worker.partition]
            .get(worker.position)
            .copied()
            .unwrap_or(0)];
        let text = match action {
            Action::Poll(_) => {
                let offset = if self.has(Guard::OffsetAfterCommit) {
                    String::new()
                } else {
                    format!(", and commits offset {} at once", worker.position + 1)
                };
                format!(
                    "polls payments-{}@{}: {} {}{offset}",
                    worker.partition, worker.position, event.event_type, event.id
                )
            }
            Action::Claim(_) => match after.workers[w].step {
                Step::Claimed => format!("inserts {} into processed_events: 1 row", event.id),
                _ => format!(
                    "inserts {} into processed_events: 0 rows, a duplicate",
                    event.id
                ),
            },
            Action::ReadStatus(_) => self.describe_read(before, after, w),
            Action::Write(_) => format!("writes {} (uncommitted)", event.decides.as_str()),
            Action::InsertOutbox(_) => self.describe_outbox(after, w, event),
            Action::Commit(_) => describe_commit(before, after, w),
            Action::CommitOffset(_) if worker.owner => {
                format!(
                    "commits offset {} of payments-{}",
                    worker.position + 1,
                    worker.partition
                )
            }
            Action::CommitOffset(_) => {
                "commits its offset: refused, the partition is no longer its own".to_owned()
            }
            Action::Crash(_) => {
                let restarts = if worker.owner {
                    format!(
                        ", and restarts at the committed offset {}",
                        after.committed_offsets[worker.partition]
                    )
                } else {
                    String::new()
                };
                format!("crashes: its transaction rolls back{restarts}")
            }
            Action::Rebalance => unreachable!("described above"),
        };
        format!("{who} {text}")
    }

    fn describe_read(&self, before: &World, after: &World, w: usize) -> String {
        let how = if self.has(Guard::ForUpdate) {
            "locks the order and reads"
        } else {
            "reads (no lock)"
        };
        let stops = match after.workers[w].step {
            Step::Staged(Outcome::Guarded) => ": guard 2 stops it",
            _ if before.status.is_terminal() => ", and goes on: no guard 2",
            _ => "",
        };
        format!("{how} status {}{stops}", before.status.as_str())
    }

    fn describe_outbox(&self, after: &World, w: usize, event: &EventInfo) -> String {
        let id = if self.has(Guard::OutcomeId) {
            "order:outcome"
        } else {
            "a fresh id"
        };
        let inserted = format!("inserts {} {id} into the outbox", event.outcome_type);
        let worker = after.workers[w];
        match worker.step {
            Step::Staged(_) => inserted,
            Step::Polled => format!("{inserted}: duplicate key, it rolls back to try again"),
            _ => format!("{inserted}: duplicate key, it rolls back and dead-letters the record"),
        }
    }
}

fn describe_commit(before: &World, after: &World, w: usize) -> String {
    match before.workers[w].step {
        Step::Staged(Outcome::Duplicate) => "commits the no-op".to_owned(),
        Step::Staged(Outcome::Guarded) => {
            "commits: the id stays recorded, the order unchanged".to_owned()
        }
        _ if after.flipped && !before.flipped => format!(
            "commits: the {} order flipped to {}",
            before.status.as_str(),
            after.status.as_str()
        ),
        _ => format!("commits: the order is {}", after.status.as_str()),
    }
}
