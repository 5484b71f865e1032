//! The consumer's transaction: order-service's ApplyPaymentResult, run by
//! `saga::Applier` for each record of `payments`
//! (`crates/order-service/src/apply_payment_result.rs`, `crates/saga/src/consumer.rs`).
//!
//! The world: one `pending` order; on partition `payments-0` its `payment.succeeded`
//! (id `order:payment`) and a copy of it, as the course's hand replay makes; on
//! `payments-1` a late `payment.failed` with an id of its own (`late-failure-001`),
//! produced without a key as the console producer does, so that another consumer reads it
//! at the same time. Consumer A reads `payments-0`, consumer B `payments-1`. Once, a
//! rebalance may move `payments-0` to a new consumer C while A still has its record in
//! hand (A may finish that transaction, but its offset commit is refused); twice, a
//! consumer may crash at any step and start again from its partition's committed offset.
//!
//! A record is handled in one transaction, step by step as the code runs it:
//! 1. guard 1: `INSERT INTO processed_events`; no row inserted is a duplicate;
//! 2. guard 2: `SELECT status … FOR UPDATE`; a terminal order is guarded;
//! 3. `UPDATE orders SET status`, then `INSERT INTO outbox` the outcome, whose id is the
//!    order's `<order id>:outcome`;
//! 4. `COMMIT`, and only then the record's offset.
//!
//! PostgreSQL's part is modelled as it behaves at READ COMMITTED: an insert waits for
//! another transaction's uncommitted row with the same key, then inserts nothing (or
//! fails, for the outbox's unique `event_id`); a row lock, taken by `FOR UPDATE` or by
//! the `UPDATE` itself, waits for the other's commit. A failed transaction rolls back
//! and is tried again; the consumer tries twice (the code: five times, of which the rest
//! fail alike) before it dead-letters the record.

use stateright::{Model, Property};

use crate::{Guarded, Kept};

mod describe;

/// The guards, each of which [`Guarded::without`] can take away.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Guard {
    /// Guard 1: the event's id claimed in `processed_events`.
    Dedupe,
    /// Guard 2: a terminal order stops the handler.
    Terminal,
    /// Guard 2 reads with `FOR UPDATE`; without it, a plain read, then the write.
    ForUpdate,
    /// The outcome's id is the order's `<order id>:outcome`; without it, a fresh one.
    OutcomeId,
    /// The offset is committed after the transaction; without it, when the record is polled.
    OffsetAfterCommit,
}

const ALL: [Guard; 5] = [
    Guard::Dedupe,
    Guard::Terminal,
    Guard::ForUpdate,
    Guard::OutcomeId,
    Guard::OffsetAfterCommit,
];

/// The model, with the guards it keeps.
#[derive(Clone, Debug)]
pub struct Transaction {
    guards: Kept<Guard>,
}

impl Default for Transaction {
    fn default() -> Self {
        Self {
            guards: Kept::all(&ALL),
        }
    }
}

impl Transaction {
    fn has(&self, guard: Guard) -> bool {
        self.guards.has(guard)
    }
}

impl Guarded for Transaction {
    type Guard = Guard;
    const ALL: &'static [Guard] = &ALL;

    fn kept(&mut self) -> &mut Kept<Guard> {
        &mut self.guards
    }

    const GUARDS: &'static [(&'static str, &'static str)] = &[
        (
            "guard-1",
            "guard 1: the event's id claimed in processed_events",
        ),
        (
            "guard-2",
            "guard 2: a confirmed or cancelled order stops the handler",
        ),
        (
            "for-update",
            "guard 2 reads the status with FOR UPDATE, not a plain SELECT",
        ),
        (
            "outcome-id",
            "the outcome's id is the order's <order id>:outcome, not a fresh one",
        ),
        (
            "offset-after-commit",
            "the offset is committed after the transaction, not at poll",
        ),
    ];
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    Pending,
    Confirmed,
    Cancelled,
}

impl Status {
    fn is_terminal(self) -> bool {
        self != Status::Pending
    }

    fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Confirmed => "confirmed",
            Status::Cancelled => "cancelled",
        }
    }
}

/// An event: which one, by its index in [`EVENTS`].
type Event = usize;

struct EventInfo {
    id: &'static str,
    event_type: &'static str,
    decides: Status,
    outcome_type: &'static str,
}

const EVENTS: [EventInfo; 2] = [
    EventInfo {
        id: "order:payment",
        event_type: "payment.succeeded",
        decides: Status::Confirmed,
        outcome_type: "order.confirmed",
    },
    EventInfo {
        id: "late-failure-001",
        event_type: "payment.failed",
        decides: Status::Cancelled,
        outcome_type: "order.cancelled",
    },
];

/// Each partition's records, by event.
const PARTITIONS: [&[Event]; 2] = [&[0, 0], &[1]];

/// Attempts at a record before it is dead-lettered.
const ATTEMPTS: u8 = 2;

/// An outbox row's `event_id`: the order's outcome id, or (without [`Guard::OutcomeId`])
/// a fresh one per transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OutboxId {
    Outcome,
    Fresh(u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// Not (yet, or any longer) a consumer of its partition.
    Gone,
    /// Between records.
    Idle,
    /// A record in hand; its transaction not begun, or rolled back to be tried again.
    Polled,
    /// Guard 1 passed.
    Claimed,
    /// Guard 2 passed, having read this status.
    Read(Status),
    /// The order's status written, uncommitted.
    Written,
    /// Ready to commit, with what the transaction amounts to.
    Staged(Outcome),
    /// Committed (or dead-lettered); the offset not yet.
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Applied,
    Duplicate,
    Guarded,
}

/// What a transaction holds until it ends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Tx {
    claimed: bool,
    locked: bool,
    write: Option<Status>,
    outbox: Option<OutboxId>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Worker {
    partition: usize,
    /// The offset of the record in hand, or of the next to poll.
    position: usize,
    step: Step,
    /// Its partition is still assigned to it.
    owner: bool,
    attempts: u8,
    tx: Tx,
}

const NAMES: [&str; 3] = ["A", "B", "C"];

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct World {
    workers: [Worker; 3],
    committed_offsets: [usize; 2],
    // The database, as committed.
    processed: [bool; 2],
    status: Status,
    outbox: Vec<(OutboxId, Event)>,
    row_lock: Option<usize>,
    fresh_ids: u8,
    // What happened, for the properties.
    handled: [[bool; 2]; 2],
    dead_lettered: [[bool; 2]; 2],
    flipped: bool,
    crashes_left: u8,
    rebalanced: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Poll(usize),
    Claim(usize),
    ReadStatus(usize),
    Write(usize),
    InsertOutbox(usize),
    Commit(usize),
    CommitOffset(usize),
    Crash(usize),
    Rebalance,
}

impl World {
    fn event(&self, w: usize) -> Event {
        let worker = &self.workers[w];
        PARTITIONS[worker.partition][worker.position]
    }

    fn others(&self, w: usize) -> impl Iterator<Item = &Worker> {
        self.workers
            .iter()
            .enumerate()
            .filter(move |(i, _)| *i != w)
            .map(|(_, worker)| worker)
    }

    /// Another transaction's uncommitted claim of `event` makes this insert wait.
    fn claim_waits(&self, w: usize, event: Event) -> bool {
        self.others(w).any(|o| {
            o.tx.claimed && o.step != Step::Gone && PARTITIONS[o.partition][o.position] == event
        })
    }

    fn outbox_waits(&self, w: usize, id: OutboxId) -> bool {
        self.others(w).any(|o| o.tx.outbox == Some(id))
    }

    fn lock_waits(&self, w: usize) -> bool {
        self.row_lock.is_some_and(|holder| holder != w)
    }

    fn rollback(&mut self, w: usize) {
        if self.row_lock == Some(w) {
            self.row_lock = None;
        }
        self.workers[w].tx = Tx::default();
    }

    fn in_hand(&self, partition: usize, offset: usize) -> bool {
        self.workers.iter().any(|w| {
            w.partition == partition
                && w.position == offset
                && !matches!(w.step, Step::Gone | Step::Idle)
        })
    }

    /// A record behind its partition's committed offset that no consumer handled, has in
    /// hand, or dead-lettered: nobody will ever read it again.
    fn skipped(&self) -> bool {
        (0..2).any(|p| {
            (0..self.committed_offsets[p]).any(|offset| {
                !self.handled[p][offset]
                    && !self.dead_lettered[p][offset]
                    && !self.in_hand(p, offset)
            })
        })
    }

    fn effects_of(&self, event: Event) -> usize {
        self.outbox.iter().filter(|(_, e)| *e == event).count()
    }
}

impl Model for Transaction {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        let worker = |partition, step| Worker {
            partition,
            position: 0,
            step,
            owner: step != Step::Gone,
            attempts: 0,
            tx: Tx::default(),
        };
        vec![World {
            workers: [
                worker(0, Step::Idle),
                worker(1, Step::Idle),
                worker(0, Step::Gone),
            ],
            committed_offsets: [0, 0],
            processed: [false; 2],
            status: Status::Pending,
            outbox: Vec::new(),
            row_lock: None,
            fresh_ids: 0,
            handled: [[false; 2]; 2],
            dead_lettered: [[false; 2]; 2],
            flipped: false,
            crashes_left: 2,
            rebalanced: false,
        }]
    }

    fn actions(&self, world: &World, actions: &mut Vec<Action>) {
        for (w, worker) in world.workers.iter().enumerate() {
            let action = match worker.step {
                Step::Gone => continue,
                Step::Idle
                    if worker.owner && worker.position < PARTITIONS[worker.partition].len() =>
                {
                    Action::Poll(w)
                }
                Step::Idle => continue,
                Step::Polled if self.has(Guard::Dedupe) => Action::Claim(w),
                Step::Polled | Step::Claimed => Action::ReadStatus(w),
                Step::Read(_) => Action::Write(w),
                Step::Written => Action::InsertOutbox(w),
                Step::Staged(_) => Action::Commit(w),
                Step::Done => Action::CommitOffset(w),
            };
            actions.push(action);
            if world.crashes_left > 0 && worker.step != Step::Idle {
                actions.push(Action::Crash(w));
            }
        }
        if !world.rebalanced {
            actions.push(Action::Rebalance);
        }
    }

    fn next_state(&self, world: &World, action: Action) -> Option<World> {
        let mut next = world.clone();
        match action {
            Action::Poll(w) => self.poll(&mut next, w),
            Action::Claim(w) => claim(&mut next, w)?,
            Action::ReadStatus(w) => self.read_status(&mut next, w)?,
            Action::Write(w) => write(&mut next, w)?,
            Action::InsertOutbox(w) => self.insert_outbox(&mut next, w)?,
            Action::Commit(w) => commit(&mut next, w),
            Action::CommitOffset(w) => commit_offset(&mut next, w),
            Action::Crash(w) => crash(&mut next, w),
            Action::Rebalance => rebalance(&mut next),
        }
        Some(next)
    }

    fn format_step(&self, world: &World, action: Action) -> Option<String> {
        let next = self.next_state(world, action)?;
        Some(self.describe(world, &next, action))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("a terminal order never changes", |_, world: &World| {
                !world.flipped
            }),
            Property::always("each event's effect happens once", |_, world: &World| {
                (0..EVENTS.len()).all(|e| world.effects_of(e) <= 1)
            }),
            Property::always("no record ends in a dead letter", |_, world: &World| {
                !world.dead_lettered.iter().flatten().any(|d| *d)
            }),
            Property::always("no record is skipped", |_, world: &World| !world.skipped()),
            Property::always(
                "every record ends applied, a duplicate or guarded",
                |model: &Transaction, world: &World| {
                    !model.next_states(world).is_empty()
                        || (0..2).all(|p| (0..PARTITIONS[p].len()).all(|o| world.handled[p][o]))
                },
            ),
        ]
    }
}

impl Transaction {
    fn poll(&self, world: &mut World, w: usize) {
        let worker = &mut world.workers[w];
        worker.step = Step::Polled;
        worker.attempts = 0;
        if !self.has(Guard::OffsetAfterCommit) {
            world.committed_offsets[worker.partition] = worker.position + 1;
        }
    }

    fn read_status(&self, world: &mut World, w: usize) -> Option<()> {
        if self.has(Guard::ForUpdate) {
            if world.lock_waits(w) {
                return None;
            }
            world.row_lock = Some(w);
            world.workers[w].tx.locked = true;
        }
        let status = world.status;
        world.workers[w].step = if self.has(Guard::Terminal) && status.is_terminal() {
            Step::Staged(Outcome::Guarded)
        } else {
            Step::Read(status)
        };
        Some(())
    }

    fn insert_outbox(&self, world: &mut World, w: usize) -> Option<()> {
        let id = if self.has(Guard::OutcomeId) {
            OutboxId::Outcome
        } else {
            world.fresh_ids += 1;
            OutboxId::Fresh(world.fresh_ids)
        };
        if world.outbox_waits(w, id) {
            return None;
        }
        if world.outbox.iter().any(|(committed, _)| *committed == id) {
            // duplicate key value violates unique constraint "outbox_event_id_key"
            world.rollback(w);
            let worker = &mut world.workers[w];
            worker.attempts += 1;
            if worker.attempts < ATTEMPTS {
                worker.step = Step::Polled;
            } else {
                world.dead_lettered[worker.partition][worker.position] = true;
                worker.step = Step::Done;
            }
        } else {
            world.workers[w].tx.outbox = Some(id);
            world.workers[w].step = Step::Staged(Outcome::Applied);
        }
        Some(())
    }
}

fn claim(world: &mut World, w: usize) -> Option<()> {
    let event = world.event(w);
    if world.processed[event] {
        world.workers[w].step = Step::Staged(Outcome::Duplicate);
    } else if world.claim_waits(w, event) {
        return None;
    } else {
        world.workers[w].tx.claimed = true;
        world.workers[w].step = Step::Claimed;
    }
    Some(())
}

fn write(world: &mut World, w: usize) -> Option<()> {
    if world.lock_waits(w) {
        return None;
    }
    world.row_lock = Some(w);
    let decides = EVENTS[world.event(w)].decides;
    let worker = &mut world.workers[w];
    worker.tx.locked = true;
    worker.tx.write = Some(decides);
    worker.step = Step::Written;
    Some(())
}

fn commit(world: &mut World, w: usize) {
    let event = world.event(w);
    let worker = world.workers[w];
    if worker.tx.claimed {
        world.processed[event] = true;
    }
    if let Some(status) = worker.tx.write {
        if world.status.is_terminal() && world.status != status {
            world.flipped = true;
        }
        world.status = status;
    }
    if let Some(id) = worker.tx.outbox {
        world.outbox.push((id, event));
    }
    world.rollback(w);
    world.handled[worker.partition][worker.position] = true;
    world.workers[w].step = Step::Done;
}

fn commit_offset(world: &mut World, w: usize) {
    let worker = &mut world.workers[w];
    if worker.owner {
        let committed = &mut world.committed_offsets[worker.partition];
        *committed = (*committed).max(worker.position + 1);
        worker.position += 1;
        worker.step = Step::Idle;
    } else {
        // A revoked consumer's commit is refused: its generation is over.
        worker.step = Step::Gone;
    }
}

fn crash(world: &mut World, w: usize) {
    world.rollback(w);
    world.crashes_left -= 1;
    let worker = &mut world.workers[w];
    worker.attempts = 0;
    if worker.owner {
        worker.position = world.committed_offsets[worker.partition];
        worker.step = Step::Idle;
    } else {
        worker.step = Step::Gone;
    }
}

fn rebalance(world: &mut World) {
    world.rebalanced = true;
    let old = &mut world.workers[0];
    old.owner = false;
    if old.step == Step::Idle {
        old.step = Step::Gone;
    }
    let new = &mut world.workers[2];
    new.owner = true;
    new.step = Step::Idle;
    new.position = world.committed_offsets[0];
}
