//! How a transaction wakes its own process's outbox relay, without PostgreSQL's NOTIFY.
//!
//! Both sides of the wake-up use it: the handlers' [`crate::Transaction`], which writes
//! outbox rows, and the [`crate::OutboxRelay`], which publishes them. It depends on
//! neither.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::FutureExt;
use tokio::sync::Notify;

/// This process's relay, as the writers beside it see it: whether it is the active relay
/// of its database, and a way to wake it.
///
/// The outbox's trigger NOTIFYs the relay of every commit that wrote a row, and a
/// NOTIFYing transaction holds one lock for the whole cluster from just before its commit
/// until the commit is flushed: every such transaction, in every database of the server,
/// commits one after another. A writer in the process whose relay holds the relay's lock
/// has no need of the server to reach it, so it skips the NOTIFY and wakes the relay after
/// its commit, here, and commits beside the others. Writers anywhere else (another
/// instance, `psql`) keep the NOTIFY. One relay per handle.
///
/// A writer decides when it writes its row. Should the relay's session end before the
/// commit, the relay that takes over looks at the outbox when it starts, and a row
/// committed after that look, unannounced, waits for its next poll at most.
#[derive(Clone, Debug, Default)]
pub struct LocalRelay(Arc<LocalRelayState>);

#[derive(Debug, Default)]
struct LocalRelayState {
    /// Set while the relay holds the relay's lock and listens.
    active: AtomicBool,
    /// A wake-up sent with no relay waiting is kept for its next wait, so none is lost
    /// between a look and the wait after it.
    wake: Notify,
}

impl LocalRelay {
    /// Whether this process's relay is the one publishing its database's outbox.
    pub fn is_active(&self) -> bool {
        self.0.active.load(Ordering::Acquire)
    }

    /// Wakes the relay: a transaction that skipped the NOTIFY has committed.
    pub fn wake(&self) {
        self.0.wake.notify_one();
    }

    /// Marks the relay active until the returned guard is dropped: however its session
    /// ends, writers NOTIFY again from then on.
    pub(crate) fn activate(&self) -> Active {
        self.0.active.store(true, Ordering::Release);
        Active(self.clone())
    }
}

/// The relay's session holds the lock: see [`LocalRelay::activate`].
pub(crate) struct Active(LocalRelay);

impl Active {
    /// Consumes a wake-up already sent: the look about to run sees its commit.
    pub(crate) fn consume_wake(&self) {
        let _ = self.0.0.wake.notified().now_or_never();
    }

    /// A writer beside the relay has committed a row.
    pub(crate) async fn woken(&self) {
        self.0.0.wake.notified().await
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.0.active.store(false, Ordering::Release);
    }
}
