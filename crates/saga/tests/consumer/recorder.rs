//! The handler these tests run: it records every event it prepares and applies, and
//! misbehaves on cue.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use deadpool_postgres::Pool;
use futures::future::BoxFuture;
use saga::{Envelope, Handler, HandlerError, Outcome, Step, Transaction};
use tokio::sync::{Semaphore, watch};

pub type Behaviour =
    dyn Fn(Envelope, u32) -> BoxFuture<'static, Result<Outcome, HandlerError>> + Send + Sync;

/// Records every event it applies, in order, after `behaviour` lets it through: in
/// memory as it applies it, and in the `applied` table inside the transaction it is
/// handed, so that table holds what was committed.
#[derive(Clone)]
pub struct Recorder(Arc<RecorderState>);

pub struct RecorderState {
    /// Every event prepared, in the order their prepares began.
    prepared: watch::Sender<Vec<String>>,
    applied: Mutex<Vec<String>>,
    attempts: Mutex<BTreeMap<String, u32>>,
    behaviour: Box<Behaviour>,
}

impl Recorder {
    pub fn new(
        behaviour: impl Fn(Envelope, u32) -> BoxFuture<'static, Result<Outcome, HandlerError>>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        Self::watching(behaviour, watch::Sender::default())
    }

    /// Like [`Recorder::new`], and every prepare is told to `prepared`'s receivers.
    pub fn watching(
        behaviour: impl Fn(Envelope, u32) -> BoxFuture<'static, Result<Outcome, HandlerError>>
        + Send
        + Sync
        + 'static,
        prepared: watch::Sender<Vec<String>>,
    ) -> Self {
        Self(Arc::new(RecorderState {
            prepared,
            applied: Mutex::default(),
            attempts: Mutex::default(),
            behaviour: Box::new(behaviour),
        }))
    }

    pub fn obedient() -> Self {
        Self::new(|_, _| Box::pin(async { Ok(Outcome::Applied) }))
    }

    /// Holds event `id` inside its transaction: `entered` gets a permit when it gets
    /// there, and it goes on once `release` has one.
    pub fn holding(id: &'static str) -> (Self, Arc<Semaphore>, Arc<Semaphore>) {
        let entered = Arc::new(Semaphore::new(0));
        let release = Arc::new(Semaphore::new(0));
        let (entered_tx, release_rx) = (entered.clone(), release.clone());
        let handler = Self::new(move |event, _| {
            let (entered, release) = (entered_tx.clone(), release_rx.clone());
            Box::pin(async move {
                if event.id == id {
                    entered.add_permits(1);
                    let _permit = release.acquire().await.unwrap();
                }
                Ok(Outcome::Applied)
            })
        });
        (handler, entered, release)
    }

    pub fn prepared(&self) -> Vec<String> {
        self.0.prepared.borrow().clone()
    }

    pub fn applied(&self) -> Vec<String> {
        self.0.applied.lock().unwrap().clone()
    }

    pub fn attempts(&self, id: &str) -> u32 {
        self.0
            .attempts
            .lock()
            .unwrap()
            .get(id)
            .copied()
            .unwrap_or(0)
    }
}

impl Handler for Recorder {
    type Command = ();
    type Prepared = ();

    fn decode(&self, _: &Envelope) -> Result<Option<()>, HandlerError> {
        Ok(Some(()))
    }

    async fn prepare(&self, _: &Pool, event: &Envelope, (): ()) -> Result<Step<()>, HandlerError> {
        self.0
            .prepared
            .send_modify(|prepared| prepared.push(event.id.clone()));
        Ok(Step::Apply(()))
    }

    async fn apply(
        &self,
        tx: &Transaction<'_>,
        event: &Envelope,
        (): (),
    ) -> Result<Outcome, HandlerError> {
        let attempt = {
            let mut attempts = self.0.attempts.lock().unwrap();
            let n = attempts.entry(event.id.clone()).or_default();
            *n += 1;
            *n
        };
        let outcome = (self.0.behaviour)(event.clone(), attempt).await?;
        tx.execute(
            "INSERT INTO applied (event_id, txid) VALUES ($1, txid_current())",
            &[&event.id],
        )
        .await?;
        self.0.applied.lock().unwrap().push(event.id.clone());
        Ok(outcome)
    }
}
