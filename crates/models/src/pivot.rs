//! The payment pivot: payment-service's ChargeOrder and RefundOrder for one order, against
//! a card provider that commits a charge after its caller gave up, loses answers, refuses
//! a refund and lists its charges behind (`crates/payment-service/src/charge_order.rs`,
//! `refund_order.rs`, `refund.rs`; the stand-in's faults `commit-late`, `refuse`,
//! `list-lag`).
//!
//! The payment row goes as `payment.rs` says: `charging` (the intent, committed before
//! the call), then `succeeded`, or `unknown` when the call had no answer, which only the
//! same request under the same key decides; `voided` is the tombstone a cancellation
//! leaves where nothing was charged. Its refund: `refunding` (the intent), `refunded`,
//! `unknown`, `failed` (refused, with the provider's reason), or `manual`.
//!
//! The provider keeps each key's answer until the key's lifetime (`PROVIDER_KEY_TTL`)
//! has passed, when it forgets it, and refunds a charge once whatever the key. Bounds:
//! three answers lost, two refunds refused, one cancellation at any moment; the provider
//! always accepts the charge (a decline decides the order before any money moves, which
//! the consumer model covers), and an operator's retry of a failed refund is left out.

use stateright::{Model, Property};

use crate::{Guarded, Kept};

mod describe;
use describe::describe;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Guard {
    /// The payment row `charging` is committed before the charge is asked for.
    Intent,
    /// An unanswered request is asked again under its own key; without it, a fresh one.
    SameKey,
    /// A cancellation meeting an undecided charge resolves it by its key; without it, it
    /// reads the provider's list of charges (the failpoint `refund.list-decides`).
    ResolveByKey,
    /// Past the key's lifetime the charge is never asked again, and is left to a person.
    KeyLifetime,
    /// A refused refund is an answer: `failed`, sent as `payment.refund_failed`; without
    /// it, an error, retried and dead-lettered.
    RefusalAnswers,
}

const ALL: [Guard; 5] = [
    Guard::Intent,
    Guard::SameKey,
    Guard::ResolveByKey,
    Guard::KeyLifetime,
    Guard::RefusalAnswers,
];

#[derive(Clone, Debug)]
pub struct Pivot {
    guards: Kept<Guard>,
}

impl Default for Pivot {
    fn default() -> Self {
        Self {
            guards: Kept::all(&ALL),
        }
    }
}

impl Pivot {
    fn has(&self, guard: Guard) -> bool {
        self.guards.has(guard)
    }
}

impl Guarded for Pivot {
    type Guard = Guard;
    const ALL: &'static [Guard] = &ALL;

    fn kept(&mut self) -> &mut Kept<Guard> {
        &mut self.guards
    }

    const GUARDS: &'static [(&'static str, &'static str)] = &[
        (
            "intent",
            "the payment row charging is committed before the charge is asked for",
        ),
        (
            "same-key",
            "a request without an answer is asked again under its own key, not a fresh one",
        ),
        (
            "resolve-by-key",
            "a cancellation resolves an undecided charge by its key, not by the provider's list",
        ),
        (
            "key-lifetime",
            "past the key's lifetime a charge is never asked again: a person decides",
        ),
        (
            "refusal-answers",
            "a refused refund is recorded failed and answered, not retried into a dead letter",
        ),
    ];
}

/// The payment row's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Payment {
    None,
    Charging,
    Unknown,
    Succeeded,
    Voided,
}

/// The payment row's `refund_status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refund {
    None,
    Refunding,
    Unknown,
    Refunded,
    Failed,
    Manual,
    /// Without [`Guard::RefusalAnswers`]: the cancellation's record dead-lettered.
    DeadLettered,
}

/// What payment-service answered the cancellation with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Answer {
    Voided,
    Refunded,
    RefundFailed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cancellation {
    NotAsked,
    Asked,
    Answered(Answer),
}

/// A key's request at the provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Request {
    Unseen,
    /// Received, not yet committed.
    Running,
    Charged,
    Refunded,
    Refused,
}

/// Keys: a charge's `order:charge` and a fresh one, a refund's `order:refund` and a
/// fresh one.
const KEYS: [&str; 4] = [
    "order:charge",
    "order:charge:2",
    "order:refund",
    "order:refund:2",
];
const CHARGE: usize = 0;
const REFUND: usize = 2;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct World {
    /// ChargeOrder has its `order.created` in hand.
    charging: bool,
    payment: Payment,
    refund: Refund,
    cancellation: Cancellation,
    /// The request each handler awaits an answer to, by key.
    charge_call: Option<usize>,
    refund_call: Option<usize>,
    /// The key the next request is made under.
    charge_key: usize,
    refund_key: usize,
    // The provider.
    requests: [Request; 4],
    charges: u8,
    refunds: u8,
    listed: bool,
    keys_expired: bool,
    // The world's faults still to come.
    answers_to_lose: u8,
    refusals: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// ChargeOrder's prepare commits its intent (or meets the tombstone).
    IntendCharge,
    /// A charge request under the current key; an unanswered one asked again.
    AskCharge,
    /// ChargeOrder gives up on an `unknown` charge past its key's lifetime.
    LeaveToPerson,
    ChargeAnswered,
    ChargeAnswerLost,
    /// The provider commits a request it has received.
    ProviderCommits(usize),
    ProviderRefuses(usize),
    ProviderListsCharge,
    KeysExpire,
    /// The customer cancels the order: `order.cancelled`.
    Cancel,
    /// RefundOrder's transaction decides what the cancellation meets.
    DecideCancellation,
    AskRefund,
    RefundAnswered,
    RefundAnswerLost,
}

impl World {
    fn held(&self) -> i16 {
        i16::from(self.charges) - i16::from(self.refunds)
    }

    /// A person has been told: the refund failed or needs deciding, or the charge is
    /// unknown past its key's lifetime.
    fn left_to_a_person(&self) -> bool {
        matches!(self.refund, Refund::Failed | Refund::Manual)
            || (self.payment == Payment::Unknown && self.keys_expired && !self.charging)
    }

    /// What the provider should hold once everything has settled.
    fn money_matches(&self) -> bool {
        let expected = match self.cancellation {
            Cancellation::Answered(Answer::RefundFailed) => return self.left_to_a_person(),
            Cancellation::Answered(_) => 0,
            _ if self.left_to_a_person() => return self.held() <= 1,
            _ if self.payment == Payment::Succeeded => 1,
            _ => 0,
        };
        self.held() == expected
    }
}

impl Model for Pivot {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        vec![World {
            charging: true,
            payment: Payment::None,
            refund: Refund::None,
            cancellation: Cancellation::NotAsked,
            charge_call: None,
            refund_call: None,
            charge_key: CHARGE,
            refund_key: REFUND,
            requests: [Request::Unseen; 4],
            charges: 0,
            refunds: 0,
            listed: false,
            keys_expired: false,
            answers_to_lose: 3,
            refusals: 2,
        }]
    }

    fn actions(&self, world: &World, actions: &mut Vec<Action>) {
        self.service_actions(world, actions);
        world_actions(world, actions);
    }

    fn next_state(&self, world: &World, action: Action) -> Option<World> {
        let mut next = world.clone();
        match action {
            Action::IntendCharge => self.intend_charge(&mut next),
            Action::AskCharge => self.ask_charge(&mut next),
            Action::LeaveToPerson => next.charging = false,
            Action::ChargeAnswered => charge_answered(&mut next),
            Action::ChargeAnswerLost => {
                next.charge_call = None;
                next.answers_to_lose -= 1;
                if next.payment == Payment::Charging {
                    next.payment = Payment::Unknown;
                }
            }
            Action::ProviderCommits(key) => provider_commits(&mut next, key),
            Action::ProviderRefuses(key) => {
                next.requests[key] = Request::Refused;
                next.refusals -= 1;
            }
            Action::ProviderListsCharge => next.listed = true,
            Action::KeysExpire => keys_expire(&mut next),
            Action::Cancel => next.cancellation = Cancellation::Asked,
            Action::DecideCancellation => self.decide_cancellation(&mut next),
            Action::AskRefund => self.ask_refund(&mut next),
            Action::RefundAnswered => self.refund_answered(&mut next),
            Action::RefundAnswerLost => {
                next.refund_call = None;
                next.answers_to_lose -= 1;
                next.refund = Refund::Unknown;
            }
        }
        Some(next)
    }

    fn format_step(&self, world: &World, action: Action) -> Option<String> {
        let next = self.next_state(world, action)?;
        Some(describe(world, &next, action))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("nothing is charged without its row", |_, world: &World| {
                world.charges == 0 || world.payment != Payment::None
            }),
            Property::always("the card is charged at most once", |_, world: &World| {
                world.charges <= 1
            }),
            Property::always(
                "at rest, the money matches the order",
                |model: &Pivot, world: &World| !model.at_rest(world) || world.money_matches(),
            ),
            Property::always(
                "every cancellation is answered",
                |model: &Pivot, world: &World| {
                    !model.at_rest(world) || world.cancellation != Cancellation::Asked
                },
            ),
        ]
    }
}

/// What the world may do at any moment: the provider works, lists, forgets, and loses
/// answers; the customer cancels.
fn world_actions(world: &World, actions: &mut Vec<Action>) {
    for (key, request) in world.requests.iter().enumerate() {
        if *request == Request::Running {
            actions.push(Action::ProviderCommits(key));
            if key >= REFUND && world.refusals > 0 {
                actions.push(Action::ProviderRefuses(key));
            }
        }
    }
    if world.charges > 0 && !world.listed {
        actions.push(Action::ProviderListsCharge);
    }
    // A day passes while nobody waits on an answer: calls end in seconds.
    if world.payment == Payment::Unknown && !world.keys_expired && world.charge_call.is_none() {
        actions.push(Action::KeysExpire);
    }
    if world.cancellation == Cancellation::NotAsked {
        actions.push(Action::Cancel);
    }
    if world.answers_to_lose > 0 {
        if world.charge_call.is_some() {
            actions.push(Action::ChargeAnswerLost);
        }
        if world.refund_call.is_some() {
            actions.push(Action::RefundAnswerLost);
        }
    }
}

impl Pivot {
    /// What payment-service can do next.
    fn service_actions(&self, world: &World, actions: &mut Vec<Action>) {
        let undecided = matches!(world.payment, Payment::Charging | Payment::Unknown)
            || (world.payment == Payment::None && !self.has(Guard::Intent));
        let expired = world.keys_expired && world.payment == Payment::Unknown;
        if world.charging
            && world.payment == Payment::None
            && world.charge_call.is_none()
            && self.has(Guard::Intent)
        {
            actions.push(Action::IntendCharge);
        }
        let asks = world.charging || world.cancellation == Cancellation::Asked;
        if asks && undecided && world.charge_call.is_none() {
            if expired && self.has(Guard::KeyLifetime) {
                if world.charging {
                    actions.push(Action::LeaveToPerson);
                }
            } else if world.charging || self.has(Guard::ResolveByKey) {
                actions.push(Action::AskCharge);
            }
        }
        if world
            .charge_call
            .is_some_and(|key| world.requests[key] == Request::Charged)
        {
            actions.push(Action::ChargeAnswered);
        }
        if world.cancellation == Cancellation::Asked
            && world.refund == Refund::None
            && self.decides(world)
        {
            actions.push(Action::DecideCancellation);
        }
        if matches!(world.refund, Refund::Refunding | Refund::Unknown)
            && world.refund_call.is_none()
        {
            actions.push(Action::AskRefund);
        }
        if world
            .refund_call
            .is_some_and(|key| matches!(world.requests[key], Request::Refunded | Request::Refused))
        {
            actions.push(Action::RefundAnswered);
        }
    }

    /// RefundOrder's transaction can decide now: a definite payment, or one no call will
    /// decide. Otherwise the cancellation waits while the charge is resolved.
    fn decides(&self, world: &World) -> bool {
        match world.payment {
            Payment::Charging | Payment::Unknown => {
                !self.has(Guard::ResolveByKey)
                    || (world.payment == Payment::Unknown
                        && world.keys_expired
                        && self.has(Guard::KeyLifetime))
            }
            _ => true,
        }
    }

    /// Nothing left for payment-service or the provider to do but wait on the world.
    fn at_rest(&self, world: &World) -> bool {
        let mut actions = Vec::new();
        self.service_actions(world, &mut actions);
        actions.is_empty()
            && !world.requests.contains(&Request::Running)
            && world.charge_call.is_none()
            && world.refund_call.is_none()
    }

    fn intend_charge(&self, world: &mut World) {
        match world.payment {
            Payment::None => world.payment = Payment::Charging,
            // The tombstone: a cancellation came first; nothing is asked.
            _ => world.charging = false,
        }
    }

    fn ask_charge(&self, world: &mut World) {
        if world.payment == Payment::Unknown && !self.has(Guard::SameKey) {
            world.charge_key = CHARGE + 1;
        }
        let key = world.charge_key;
        if world.requests[key] == Request::Unseen {
            world.requests[key] = Request::Running;
        }
        world.charge_call = Some(key);
    }

    /// RefundOrder's transaction, under the payment's lock.
    fn decide_cancellation(&self, world: &mut World) {
        match world.payment {
            Payment::None | Payment::Voided => {
                world.payment = Payment::Voided;
                world.cancellation = Cancellation::Answered(Answer::Voided);
            }
            Payment::Succeeded => world.refund = Refund::Refunding,
            Payment::Charging | Payment::Unknown => self.decide_undecided(world),
        }
    }

    fn decide_undecided(&self, world: &mut World) {
        if !self.has(Guard::ResolveByKey) {
            // The list decides: a charge it does not show was never made.
            if world.listed {
                world.payment = Payment::Succeeded;
                world.refund = Refund::Refunding;
            } else {
                world.payment = Payment::Voided;
                world.cancellation = Cancellation::Answered(Answer::Voided);
            }
        } else if world.payment == Payment::Unknown
            && world.keys_expired
            && self.has(Guard::KeyLifetime)
        {
            world.refund = Refund::Manual;
            world.cancellation = Cancellation::Answered(Answer::RefundFailed);
        }
    }

    fn ask_refund(&self, world: &mut World) {
        if world.refund == Refund::Unknown && !self.has(Guard::SameKey) {
            world.refund_key = REFUND + 1;
        }
        let key = world.refund_key;
        if world.requests[key] == Request::Unseen {
            world.requests[key] = Request::Running;
        }
        world.refund_call = Some(key);
    }

    fn refund_answered(&self, world: &mut World) {
        let key = world.refund_call.take().expect("an answer to a call");
        match world.requests[key] {
            Request::Refunded => {
                world.refund = Refund::Refunded;
                world.cancellation = Cancellation::Answered(Answer::Refunded);
            }
            _ if self.has(Guard::RefusalAnswers) => {
                world.refund = Refund::Failed;
                world.cancellation = Cancellation::Answered(Answer::RefundFailed);
            }
            _ => world.refund = Refund::DeadLettered,
        }
    }
}

fn charge_answered(world: &mut World) {
    world.charge_call = None;
    world.charging = false;
    if matches!(
        world.payment,
        Payment::None | Payment::Charging | Payment::Unknown
    ) {
        world.payment = Payment::Succeeded;
    }
}

fn provider_commits(world: &mut World, key: usize) {
    if key < REFUND {
        world.requests[key] = Request::Charged;
        world.charges += 1;
    } else {
        world.requests[key] = Request::Refunded;
        // One refund per charge, whatever the key: a second is answered as the first.
        if world.refunds < world.charges {
            world.refunds += 1;
        }
    }
}

fn keys_expire(world: &mut World) {
    world.keys_expired = true;
    for request in &mut world.requests[..REFUND] {
        if *request == Request::Charged {
            *request = Request::Unseen;
        }
    }
}
