//! Retention: how long the inbox, the outbox and the idempotency keys keep their rows, and
//! the [`Pruner`] that deletes the rest, so that none of them grows without bound.
//!
//! Guarantees:
//! - **Bounded work.** Rows go in batches of at most `PRUNE_BATCH`, each one statement in
//!   its own transaction, oldest first, until none is left, then the pruner sleeps
//!   `PRUNE_INTERVAL`. A batch's row locks last as long as that batch: a consumer whose
//!   dedupe insert meets a row being deleted waits for one batch, never for the whole
//!   prune, and a large backlog never becomes one long `DELETE`. Between batches the
//!   pruner rests, so that it works at most `PRUNE_DUTY_CYCLE` of the time: a backlog of
//!   a million rows is worked off in 200 batches (of the default 5 000) with rests between
//!   them, not at the consumers' expense in one go.
//! - **One pruner per database at a time.** The pruner runs while it holds a
//!   [`crate::lease`]; the other copies of the service wait as standbys, and one takes
//!   over within the lease's bound if the holder dies, freezes or vanishes. Its deletes run
//!   on the lease's session, so a holder that lost the lease deletes nothing more.
//! - **Never what is still needed.** An unpublished outbox row is never deleted, however
//!   old. The inbox keeps an id at least as long as a copy of its event can still arrive:
//!   [`check_inbox_window`] refuses, at start-up, a window shorter than the retention of
//!   the topic a service consumes or of its dead-letter topic, as the broker reports them.
//!
//! What a duplicate meets after its id is gone is guard 2: the order is no longer
//! `pending`, the payment and the notification rows are unique per order. The state guard
//! is what makes a bounded inbox safe; the window only keeps guard 1 the one that answers.

use std::str::FromStr;
use std::time::Duration;

use anyhow::Context as _;
use rdkafka::admin::{AdminClient, AdminOptions, OwnedResourceSpecifier, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;
use tokio_util::sync::CancellationToken;

use crate::lease::{DEFAULT_LEASE, Held, Lease};

/// A span of time, or none (`0` or `off`): how long rows are kept (`Off`: for ever), how
/// often the pruner runs (`Off`: never).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    Of(Duration),
    Off,
}

impl FromStr for Window {
    type Err = String;

    /// `14days`, `36h`, `90s`; `0` or `off` for none.
    fn from_str(value: &str) -> Result<Self, String> {
        match value.trim() {
            "0" | "off" => Ok(Window::Off),
            other => match humantime::parse_duration(other) {
                Ok(duration) if duration.is_zero() => Ok(Window::Off),
                Ok(duration) => Ok(Window::Of(duration)),
                Err(error) => Err(format!(
                    "{error}: give a duration such as 14days or 36h, or off"
                )),
            },
        }
    }
}

impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Window::Of(duration) => write!(f, "{}", humantime::format_duration(*duration)),
            Window::Off => f.write_str("off"),
        }
    }
}

/// One table the pruner keeps short.
#[derive(Debug, Clone)]
pub struct Target {
    /// The table, for the logs.
    pub table: &'static str,
    /// Deletes at most `$2` rows older than `$1` seconds, oldest first.
    ///
    /// The batch is chosen through the age's index and deleted by the rows' addresses
    /// (`ctid`, a TID scan), not by key: with the key (`WHERE event_id IN (…)`), when most
    /// of the table is past its window (a backlog, the first start on an old database)
    /// the planner joins the batch against a scan of the whole table, for every batch.
    ///
    /// A row that changes while the batch waits for it (an expired idempotency key taken
    /// over by a new request) is kept twice over: its new version has an address the
    /// batch did not pick (PostgreSQL 15 checks it again; the test of a key taken over
    /// still passes without the age's second test), and the age, tested in the batch's
    /// selection and again on each row deleted, is young again. The second test of the
    /// age is what keeps it should a server not check the address again.
    delete: &'static str,
    window: Duration,
}

impl Target {
    /// `processed_events`: ids applied longer ago than `window`.
    pub fn inbox(window: Duration) -> Self {
        Self {
            table: "processed_events",
            delete: "DELETE FROM processed_events
                      WHERE ctid = ANY (ARRAY(SELECT ctid FROM processed_events
                                               WHERE processed_at < now() - make_interval(secs => $1)
                                               ORDER BY processed_at LIMIT $2))
                        AND processed_at < now() - make_interval(secs => $1)",
            window,
        }
    }

    /// `outbox`: rows published longer ago than `window`. An unpublished row has no
    /// `published_at`, so no age: it stays until the relay has published it.
    pub fn outbox(window: Duration) -> Self {
        Self {
            table: "outbox",
            delete: "DELETE FROM outbox
                      WHERE ctid = ANY (ARRAY(SELECT ctid FROM outbox
                                               WHERE published_at < now() - make_interval(secs => $1)
                                               ORDER BY published_at LIMIT $2))
                        AND published_at < now() - make_interval(secs => $1)",
            window,
        }
    }

    /// `idempotency_keys` (an API's, see [`crate::idempotency`]): keys older than their
    /// time to live, which the API already treats as new requests.
    pub fn idempotency_keys(ttl: Duration) -> Self {
        Self {
            table: "idempotency_keys",
            delete: "DELETE FROM idempotency_keys
                      WHERE ctid = ANY (ARRAY(SELECT ctid FROM idempotency_keys
                                               WHERE created_at < now() - make_interval(secs => $1)
                                               ORDER BY created_at LIMIT $2))
                        AND created_at < now() - make_interval(secs => $1)",
            window: ttl,
        }
    }

    /// The targets for `inbox` and `outbox`, leaving out a table whose window is off.
    pub fn saga_tables(inbox: Window, outbox: Window) -> Vec<Self> {
        let mut targets = Vec::new();
        if let Window::Of(window) = inbox {
            targets.push(Self::inbox(window));
        }
        if let Window::Of(window) = outbox {
            targets.push(Self::outbox(window));
        }
        targets
    }
}

/// The active pruner's lease.
pub const PRUNER_LOCK: i64 = 0x7072_756e_6572; // "pruner"

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    /// Another instance held the lock: this one deleted nothing.
    pub skipped: bool,
    /// The service is stopping: the pass ended after a batch, with rows left.
    pub interrupted: bool,
    /// Rows deleted per batch, per table, in the order the batches ran.
    pub batches: Vec<(&'static str, u64)>,
}

impl Pass {
    pub fn deleted(&self, table: &str) -> u64 {
        self.batches
            .iter()
            .filter(|(t, _)| *t == table)
            .map(|(_, n)| n)
            .sum()
    }
}

/// How hard a pruner works.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// From the end of one pass to the start of the next.
    pub interval: Duration,
    /// Rows per batch, and so per transaction.
    pub batch: i64,
    /// The most of its time a pass spends deleting, in percent: after a batch that took
    /// `t` it rests `t × (100 / duty_cycle − 1)`.
    pub duty_cycle: u8,
}

/// Deletes what [`Target`]s no longer keep, every [`Pace::interval`].
pub struct Pruner {
    lease: Lease,
    targets: Vec<Target>,
    pace: Pace,
}

impl Pruner {
    pub fn new(database_url: &str, targets: Vec<Target>, pace: Pace) -> anyhow::Result<Self> {
        anyhow::ensure!(
            (1..=100).contains(&pace.duty_cycle),
            "a duty cycle is 1 to 100 percent"
        );
        let database = crate::db::parse_url(database_url)?;
        Ok(Self {
            lease: Lease::new(&database, PRUNER_LOCK, "pruner", DEFAULT_LEASE),
            targets,
            pace,
        })
    }

    /// Holds the pruner's lease for `duration` (`SINGLETON_LEASE`) rather than the default.
    pub fn leased_for(mut self, duration: Duration) -> Self {
        self.lease = self.lease.lasting(duration);
        self
    }

    /// Waits for the lease, then runs a pass every `interval` until `shutdown` or until
    /// the lease is lost (then waits for it again). A failed pass (the database away) is
    /// logged and tried again at the next turn: what was not deleted is still there.
    pub async fn run(self, shutdown: CancellationToken) {
        if self.targets.is_empty() {
            return;
        }
        while let Some(held) = self.lease.hold(&shutdown).await {
            self.prune_while_held(&held, &shutdown).await;
        }
    }

    async fn prune_while_held(&self, held: &Held, shutdown: &CancellationToken) {
        loop {
            match self.pass_on(held, shutdown).await {
                Ok(pass) if pass.batches.iter().any(|(_, n)| *n > 0) => {
                    for target in &self.targets {
                        tracing::info!(
                            table = target.table,
                            deleted = pass.deleted(target.table),
                            "pruned"
                        );
                    }
                }
                Ok(_) => {}
                Err(error) => tracing::warn!(error = format!("{error:#}"), "prune failed"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                () = held.lost() => return,
                _ = tokio::time::sleep(self.pace.interval) => {}
            }
        }
    }

    /// One pass over every target, if no other instance holds the pruner's lease; cut
    /// short, between two batches, by `shutdown`.
    pub async fn pass(&self, shutdown: &CancellationToken) -> anyhow::Result<Pass> {
        let Some(held) = self.lease.try_acquire().await.context("cannot connect")? else {
            return Ok(Pass {
                skipped: true,
                ..Pass::default()
            });
        };
        let pass = self.pass_on(&held, shutdown).await?;
        held.release().await?;
        Ok(pass)
    }

    async fn pass_on(&self, held: &Held, shutdown: &CancellationToken) -> anyhow::Result<Pass> {
        let client = held.client();
        let mut pass = Pass::default();
        for target in &self.targets {
            let delete = client.prepare(target.delete).await?;
            let window = target.window.as_secs_f64();
            loop {
                anyhow::ensure!(held.is_held(), "pruner lease lost");
                let started = std::time::Instant::now();
                // Autocommitted: each batch is a transaction of its own.
                let deleted = client
                    .execute(&delete, &[&window, &self.pace.batch])
                    .await?;
                pass.batches.push((target.table, deleted));
                if deleted < self.pace.batch as u64 {
                    break;
                }
                let rest = started
                    .elapsed()
                    .mul_f64(100.0 / f64::from(self.pace.duty_cycle) - 1.0);
                tokio::select! {
                    _ = shutdown.cancelled() => {
                        pass.interrupted = true;
                        return Ok(pass);
                    }
                    _ = tokio::time::sleep(rest) => {}
                }
            }
        }
        Ok(pass)
    }
}

/// Why the topics' retention could not be checked against the inbox's window.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The broker did not answer: worth waiting for.
    #[error("cannot ask the broker for the topics' retention: {0}")]
    Unreachable(#[from] KafkaError),
    /// The broker does not serve this topic (yet): worth waiting for, as whatever
    /// creates the topics may still be at work.
    #[error("the broker does not know topic {0} (yet): cannot read its retention")]
    UnknownTopic(String),
    /// The window is too short, or a topic reports no usable retention: a setting to change.
    #[error(transparent)]
    Refused(anyhow::Error),
}

/// The longest time a record stays on any of `topics`, as the broker reports their
/// `retention.ms`; `None` if any keeps its records for ever (`-1`).
pub async fn longest_topic_retention(
    brokers: &str,
    topics: &[String],
) -> Result<Option<Duration>, CheckError> {
    let admin: AdminClient<DefaultClientContext> = crate::kafka::client_config(brokers).create()?;
    let resources: Vec<ResourceSpecifier<'_>> = topics
        .iter()
        .map(|t| ResourceSpecifier::Topic(t.as_str()))
        .collect();
    let options = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let described = admin.describe_configs(&resources, &options).await?;
    let mut longest = Duration::ZERO;
    for topic in topics {
        // The answers come in the broker's order, each naming its topic; an unknown
        // topic's comes back with no entries (the client drops its error code).
        let resource = described
            .iter()
            .filter_map(|result| result.as_ref().ok())
            .find(|r| matches!(&r.specifier, OwnedResourceSpecifier::Topic(t) if t == topic))
            .filter(|r| !r.entries.is_empty())
            .ok_or_else(|| CheckError::UnknownTopic(topic.clone()))?;
        let ms = resource
            .get("retention.ms")
            .and_then(|entry| entry.value.as_deref())
            .with_context(|| format!("topic {topic} reports no retention.ms"))
            .and_then(|value| {
                value
                    .parse::<i64>()
                    .with_context(|| format!("topic {topic}: retention.ms is not a number"))
            })
            .map_err(CheckError::Refused)?;
        if ms < 0 {
            return Ok(None);
        }
        longest = longest.max(Duration::from_millis(ms as u64));
    }
    Ok(Some(longest))
}

/// What the inbox may forget, given the topics a service reads: `inbox` unchanged when it
/// covers their longest retention; [`Window::Off`], with a warning, when a topic keeps
/// its records for ever (no window is long enough); refused, naming both figures and the
/// setting, when it is shorter.
pub async fn check_inbox_window(
    brokers: &str,
    topics: &[String],
    inbox: Window,
) -> Result<Window, CheckError> {
    let Window::Of(window) = inbox else {
        return Ok(Window::Off);
    };
    match longest_topic_retention(brokers, topics).await? {
        None => {
            tracing::warn!(
                ?topics,
                "a topic keeps its records for ever (retention.ms -1), so any of them may be \
                 delivered again at any time: the inbox keeps every id (set a finite \
                 retention.ms to prune it)"
            );
            Ok(Window::Off)
        }
        Some(longest) if window < longest => Err(CheckError::Refused(anyhow::anyhow!(
            "INBOX_RETENTION is {} but {} keep records for up to {} (retention.ms {}): a copy \
             of an event could arrive after its id was pruned. Set INBOX_RETENTION to at \
             least {}, or lower the topics' retention.ms",
            Window::Of(window),
            topics.join(" and "),
            Window::Of(longest),
            longest.as_millis(),
            Window::Of(longest),
        ))),
        Some(_) => Ok(inbox),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_is_a_duration_or_off() {
        assert_eq!(
            "14days".parse::<Window>(),
            Ok(Window::Of(Duration::from_secs(14 * 86_400)))
        );
        assert_eq!(
            "36h".parse::<Window>(),
            Ok(Window::Of(Duration::from_secs(36 * 3600)))
        );
        assert_eq!("off".parse::<Window>(), Ok(Window::Off));
        assert_eq!("0".parse::<Window>(), Ok(Window::Off));
        assert_eq!("0s".parse::<Window>(), Ok(Window::Off));
        assert!("a fortnight".parse::<Window>().is_err());
    }
}
