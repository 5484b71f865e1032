//! The lease that makes a task a singleton per database: the outbox relay, the pruner and
//! order-service's deadline sweeper each run in one copy of a service at a time, and the
//! other copies wait as standbys.
//!
//! A lease is a session advisory lock (`pg_try_advisory_lock`) on a session of its own
//! that the server ends once it has heard nothing from the holder for the lease's
//! duration (`SINGLETON_LEASE`, default 10 s):
//!
//! - The session sets `idle_session_timeout` (and `idle_in_transaction_session_timeout`)
//!   to the lease. The holder's heartbeat, a `SELECT 1` every third of the lease, keeps a
//!   live holder's session busy enough never to idle out; a frozen holder (SIGSTOP, a
//!   stalled VM) sends nothing, and its session, with the lock, is ended by the server
//!   a lease after its last statement. TCP keepalives could not tell: a stopped
//!   process's kernel still answers them.
//! - A vanished holder (its host gone, the network cut) sends nothing either, so the same
//!   timeout ends its session. The session's TCP settings, on both ends
//!   (`tcp_user_timeout` and keepalives of about the lease), make each side give up a
//!   connection whose packets go unanswered instead of waiting for the kernel's default
//!   (minutes to hours).
//! - A standby tries `pg_try_advisory_lock` every [`Lease::retry_interval`] (a quarter
//!   of the lease, at most a second) on its own session, which those tries keep alive.
//!
//! **The takeover bound**: a standby holds the lease at most [`Lease::bound`] (lease +
//! retry interval, 11 s by default) after the holder froze or vanished; the relay's first
//! look follows at once.
//!
//! **Fencing.** A holder believes it holds the lease only while its last answered
//! heartbeat is younger than two thirds of the lease ([`Held::is_held`]): a heartbeat
//! that fails, or goes unanswered for a third of the lease, gives the lease up, and a
//! thawed holder finds its heartbeat stale before anything else. The server ends the
//! session only after a whole lease of silence, so a holder stops at least a third of a
//! lease before a standby can start. On top of that, whatever a holder does on the lease's
//! session (the relay's look at the outbox, its marks, the pruner's deletes) fails once
//! the server has ended that session. So a thawed relay publishes nothing it read after
//! losing the lease: its next look fails, and a batch it read before the freeze is dropped
//! when [`Held::is_held`] says no. Only records already handed to its producer before the
//! freeze can still go out after the thaw; they are copies of rows the new holder
//! publishes too, and the consumers' inboxes absorb them, as they absorb a relay's crash
//! between the broker's acknowledgement and the mark. The deadline sweeper's
//! correctness never depended on being alone (see `order_service::deadline`): for it the
//! lease only saves the other copies the work.
//!
//! A lease costs a connection per singleton per copy of a service (the standbys' sessions
//! included) and a heartbeat every few seconds.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Client};
use tokio_util::sync::CancellationToken;

use crate::backoff;

/// `SINGLETON_LEASE`'s default. A frozen or vanished holder stalls its singleton for
/// about this long; a live one must get a heartbeat through every third of it, which a
/// loaded server or a long garbage-collection pause elsewhere does not delay by 3 s.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);

/// A lease on one singleton of one database.
#[derive(Clone)]
pub struct Lease {
    database: crate::db::Config,
    key: i64,
    /// The singleton, in the logs: "outbox relay" logs `outbox relay active`.
    name: &'static str,
    duration: Duration,
}

impl Lease {
    /// The lease on advisory lock `key` of `database`, lasting `duration` (at least a
    /// second: the heartbeat must fit in a third of it).
    pub fn new(
        database: &crate::db::Config,
        key: i64,
        name: &'static str,
        duration: Duration,
    ) -> Self {
        let duration = duration.max(Duration::from_secs(1));
        let (idle, interval) = keepalives(duration);
        let mut database = database.clone();
        database
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(idle))
            .keepalives_interval(Duration::from_secs(interval))
            .keepalives_retries(3)
            .tcp_user_timeout(duration);
        Self {
            database,
            key,
            name,
            duration,
        }
    }

    /// The same lease, lasting `duration` instead.
    pub fn lasting(&self, duration: Duration) -> Self {
        Self::new(&self.database, self.key, self.name, duration)
    }

    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// How often a standby tries to take the lease.
    pub fn retry_interval(&self) -> Duration {
        (self.duration / 4).min(Duration::from_secs(1))
    }

    /// The longest a standby waits, once the holder froze or vanished, before it holds the
    /// lease.
    pub fn bound(&self) -> Duration {
        self.duration + self.retry_interval()
    }

    /// One try on a session of its own: the lease if no one holds it, `None` if another
    /// does.
    pub async fn try_acquire(&self) -> Result<Option<Held>, tokio_postgres::Error> {
        let session = self.connect().await?;
        if session.try_lock(self.key).await? {
            Ok(Some(self.held(session)))
        } else {
            Ok(None)
        }
    }

    /// Waits as a standby until the lease is this one's (logging `<name> active`), or
    /// `shutdown` (`None`). Fails if the database does.
    pub async fn acquire(
        &self,
        shutdown: &CancellationToken,
    ) -> Result<Option<Held>, tokio_postgres::Error> {
        let session = self.connect().await?;
        loop {
            // Stopping: not even a free lease is taken, or a singleton's loop that ends
            // its turn on shutdown would take it again at once, for ever.
            if shutdown.is_cancelled() {
                return Ok(None);
            }
            if session.try_lock(self.key).await? {
                tracing::info!("{} active", self.name);
                return Ok(Some(self.held(session)));
            }
            tokio::select! {
                () = shutdown.cancelled() => return Ok(None),
                () = tokio::time::sleep(self.retry_interval()) => {}
            }
        }
    }

    /// [`Lease::acquire`], waiting out a database that fails with backoff: for a singleton
    /// that has nothing else to do with the error.
    pub async fn hold(&self, shutdown: &CancellationToken) -> Option<Held> {
        let mut delays = backoff::backoff();
        loop {
            match self.acquire(shutdown).await {
                Ok(held) => return held,
                Err(error) => {
                    let delay = backoff::next_delay(&mut delays);
                    tracing::warn!(%error, retry_in = ?delay, "cannot take the {} lease", self.name);
                    tokio::select! {
                        () = shutdown.cancelled() => return None,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    async fn connect(&self) -> Result<Session, tokio_postgres::Error> {
        let (client, mut connection) = self.database.connect().await?;
        let (notify, notifications) = mpsc::unbounded_channel();
        let closed = CancellationToken::new();
        let driver_closed = closed.clone();
        tokio::spawn(async move {
            let _closed = driver_closed.drop_guard();
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = messages.next().await {
                match message {
                    // Nobody listening is fine: the session still has to be driven.
                    Ok(AsyncMessage::Notification(_)) => _ = notify.send(()),
                    Ok(_) => {}
                    Err(error) => {
                        tracing::debug!(%error, "lease session closed");
                        return;
                    }
                }
            }
        });
        let ms = self.duration.as_millis();
        let (idle, interval) = keepalives(self.duration);
        client
            .batch_execute(&format!(
                "SET idle_session_timeout = {ms};
                 SET idle_in_transaction_session_timeout = {ms};
                 SET tcp_user_timeout = {ms};
                 SET tcp_keepalives_idle = {idle};
                 SET tcp_keepalives_interval = {interval};
                 SET tcp_keepalives_count = 3"
            ))
            .await?;
        Ok(Session {
            client,
            notifications,
            closed,
        })
    }

    fn held(&self, session: Session) -> Held {
        let client = Arc::new(session.client);
        let answered = Arc::new(Mutex::new(Instant::now()));
        let lost = session.closed;
        let heartbeat = tokio::spawn(heartbeat(
            client.clone(),
            answered.clone(),
            lost.clone(),
            self.duration,
            self.name,
        ));
        Held {
            client,
            notifications: Some(session.notifications),
            answered,
            lost,
            duration: self.duration,
            heartbeat,
        }
    }
}

/// The keepalives' idle time and interval, in whole seconds (the sockets' unit, where
/// zero is refused): a silent peer is given up about a lease after the last packet.
fn keepalives(lease: Duration) -> (u64, u64) {
    ((lease / 3).as_secs().max(1), (lease / 9).as_secs().max(1))
}

/// A connected session, not (yet) holding the lock.
struct Session {
    client: Client,
    notifications: mpsc::UnboundedReceiver<()>,
    /// Cancelled when the connection ends.
    closed: CancellationToken,
}

impl Session {
    async fn try_lock(&self, key: i64) -> Result<bool, tokio_postgres::Error> {
        Ok(self
            .client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&key])
            .await?
            .get(0))
    }
}

/// Keeps the session from idling out; gives the lease up when a heartbeat fails or goes
/// unanswered for a third of the lease.
async fn heartbeat(
    client: Arc<Client>,
    answered: Arc<Mutex<Instant>>,
    lost: CancellationToken,
    duration: Duration,
    name: &'static str,
) {
    let period = duration / 3;
    loop {
        tokio::select! {
            () = lost.cancelled() => {
                tracing::warn!("{name} lease lost: its session ended");
                return;
            }
            () = tokio::time::sleep(period) => {}
        }
        let sent = Instant::now();
        match tokio::time::timeout(period, client.simple_query("SELECT 1")).await {
            Ok(Ok(_)) => *answered.lock().expect("never poisoned") = sent,
            Ok(Err(error)) => {
                tracing::warn!(%error, "{name} lease lost: its session ended");
                break;
            }
            Err(_) => {
                tracing::warn!(?period, "{name} lease lost: a heartbeat went unanswered");
                break;
            }
        }
    }
    lost.cancel();
}

/// The lease, held: the session that holds the lock, for the singleton's own statements.
/// Dropping it ends the session, which releases the lock.
pub struct Held {
    client: Arc<Client>,
    notifications: Option<mpsc::UnboundedReceiver<()>>,
    /// When the last answered heartbeat was sent.
    answered: Arc<Mutex<Instant>>,
    lost: CancellationToken,
    duration: Duration,
    heartbeat: JoinHandle<()>,
}

impl Held {
    /// The lease's session: what runs on it stops working once the lease is lost.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The session's notifications (after a `LISTEN` on it); the channel closes with the
    /// session. Once.
    pub fn take_notifications(&mut self) -> mpsc::UnboundedReceiver<()> {
        self.notifications
            .take()
            .expect("the notifications are taken once")
    }

    /// Whether the lease is still this one's: no heartbeat failed, and the last answered
    /// one is younger than two thirds of the lease (a third before the server could end
    /// the session). Checked before acting on what was read under the lease.
    pub fn is_held(&self) -> bool {
        let age = self.answered.lock().expect("never poisoned").elapsed();
        !self.lost.is_cancelled() && age < self.duration * 2 / 3
    }

    /// Resolves once a heartbeat failed or the session ended.
    pub async fn lost(&self) {
        self.lost.cancelled().await;
    }

    /// Releases the lock and ends the session.
    pub async fn release(self) -> Result<(), tokio_postgres::Error> {
        self.client
            .simple_query("SELECT pg_advisory_unlock_all()")
            .await?;
        Ok(())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.heartbeat.abort();
        self.lost.cancel();
    }
}
