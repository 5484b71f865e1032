//! The saga's protocols as models, small enough to read in one sitting, explored in every
//! order the world can deliver events by [stateright](https://docs.rs/stateright).
//!
//! - [`consumer`]: one handler's transaction (`saga::Applier` running order-service's
//!   ApplyPaymentResult) under redelivery, a late event, a rebalance and crashes.
//! - [`pivot`]: payment-service's charge and its compensation, against a card provider
//!   that answers late, loses answers, refuses refunds and lists its charges behind.
//!
//! Each model names its states, events and guards as the code does, and each guard can be
//! switched off. [`check`] explores every state breadth first, so the sequence it reports
//! for a broken property is a shortest one; `scripts/model` prints it in the course's
//! words. What the models leave out, and why the fault suite still runs the real
//! binaries, is in `docs/testing.md`.

pub mod consumer;
pub mod pivot;

use std::fmt::Debug;
use std::hash::Hash;

use std::sync::{Arc, Mutex};

use stateright::{Checker, HasDiscoveries, Model, Path};

/// What exploring a model found.
#[derive(Debug)]
pub struct Report {
    /// Distinct states reached.
    pub states: usize,
    pub counterexample: Option<Counterexample>,
}

/// A shortest sequence of steps that ends with a property broken.
#[derive(Debug)]
pub struct Counterexample {
    pub property: &'static str,
    pub steps: Vec<String>,
}

/// The guards a model keeps, of all it has.
#[derive(Clone, Debug)]
pub struct Kept<G: 'static>(Vec<G>);

impl<G: Copy + PartialEq> Kept<G> {
    pub fn all(all: &[G]) -> Self {
        Self(all.to_vec())
    }

    pub fn has(&self, guard: G) -> bool {
        self.0.contains(&guard)
    }
}

/// A model whose guards can be switched off, by value or by name.
pub trait Guarded: Model + Clone {
    type Guard: Copy + PartialEq + 'static;
    /// Every guard's name, as `scripts/model --without` takes it, with what it stands for.
    const GUARDS: &'static [(&'static str, &'static str)];
    /// Every guard, in the order of [`Guarded::GUARDS`].
    const ALL: &'static [Self::Guard];

    fn kept(&mut self) -> &mut Kept<Self::Guard>;

    /// The model with `guard` taken away.
    fn without(mut self, guard: Self::Guard) -> Self {
        self.kept().0.retain(|g| *g != guard);
        self
    }

    /// The model with the guard that `scripts/model --without` calls `name` taken away.
    fn without_named(self, name: &str) -> Option<Self> {
        let i = Self::GUARDS.iter().position(|(n, _)| *n == name)?;
        Some(self.without(Self::ALL[i]))
    }
}

/// A property's name, and the path to the state that broke it.
type Broken<M> = (
    &'static str,
    Path<<M as Model>::State, <M as Model>::Action>,
);

/// Explores every state of `model` breadth first, in one thread so that the run and the
/// sequence it reports are the same every time, and stops at the first state that breaks
/// a property: breadth first, no shorter sequence breaks any.
///
/// stateright keeps, for each property, the *last* path it found breaking it, and goes on
/// from broken states; so the first is taken here, by a visitor that sees every state in
/// the order the search reaches it.
pub fn check<M>(model: M) -> Report
where
    M: Model + Clone + Send + Sync + 'static,
    M::State: Clone + Debug + Hash + PartialEq + Send + Sync,
    M::Action: Clone + Debug + PartialEq + Send + Sync,
{
    let first: Arc<Mutex<Option<Broken<M>>>> = Arc::default();
    let found = Arc::clone(&first);
    let judge = model.clone();
    let checker = model
        .checker()
        .threads(1)
        .finish_when(HasDiscoveries::AnyFailures)
        .visitor(move |path: Path<M::State, M::Action>| {
            let mut found = found.lock().expect("not poisoned");
            if found.is_some() {
                return;
            }
            let broken = (judge.properties().into_iter())
                .find(|property| !(property.condition)(&judge, path.last_state()));
            if let Some(property) = broken {
                *found = Some((property.name, path));
            }
        })
        .spawn_bfs()
        .join();
    let model = checker.model();
    let counterexample = first
        .lock()
        .expect("not poisoned")
        .take()
        .map(|(property, path)| Counterexample {
            property,
            steps: (path.into_vec().into_iter())
                .filter_map(|(state, action)| {
                    let action = action?;
                    let fallback = model.format_action(&action);
                    Some(model.format_step(&state, action).unwrap_or(fallback))
                })
                .collect(),
        });
    Report {
        states: checker.unique_state_count(),
        counterexample,
    }
}

impl std::fmt::Display for Report {
    /// The numbered steps in the course's words, or that there were none to find.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.counterexample {
            None => write!(f, "{} states explored: no counterexample", self.states),
            Some(found) => {
                writeln!(
                    f,
                    "{} states explored: \"{}\" is broken in {} steps:",
                    self.states,
                    found.property,
                    found.steps.len()
                )?;
                let width = found.steps.len().to_string().len();
                let lines: Vec<String> = (found.steps.iter().enumerate())
                    .map(|(i, step)| format!("{:>width$}. {step}", i + 1))
                    .collect();
                write!(f, "{}", lines.join("\n"))
            }
        }
    }
}
