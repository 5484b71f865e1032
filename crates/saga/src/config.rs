//! Settings every service shares, as `clap` argument groups: each is a `--flag` and an
//! environment variable of the same meaning, and its doc comment is the `--help` text.
//! Services `#[command(flatten)]` them into their own `Config`.

use std::time::Duration;

use clap::Args;
use clap::builder::TypedValueParser;

use crate::retention::{Pace, Pruner, Target, Window};

/// A count of connections or requests: zero would be a pool that never hands out a
/// connection, or a limit that refuses every request, so it is refused at start-up.
pub fn at_least_one() -> impl TypedValueParser<Value = usize> {
    clap::value_parser!(u32).range(1..).map(|n| n as usize)
}

fn read_secret(path: &str) -> Result<String, String> {
    crate::secrets::read(path).map_err(|error| format!("cannot read {path}: {error}"))
}

/// The service's database: `DATABASE_URL`, or `DATABASE_URL_FILE` naming a file that
/// holds it.
#[derive(Clone, Args)]
pub struct DatabaseUrl {
    /// PostgreSQL URL of this service's own database, as the service's own role.
    // Its password must not show in `--help`, which prints the variables' values.
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        required_unless_present = "database_url_file"
    )]
    database_url: Option<String>,

    /// The same, read from this file (a final newline dropped), as Docker and Kubernetes
    /// mount secrets.
    // Holds the file's content, the URL itself: the parser reads it once, at start-up.
    #[arg(long, env = "DATABASE_URL_FILE", value_parser = read_secret,
          conflicts_with = "database_url")]
    database_url_file: Option<String>,
}

impl DatabaseUrl {
    pub fn new(url: &str) -> Self {
        Self {
            database_url: Some(url.to_owned()),
            database_url_file: None,
        }
    }

    pub fn as_str(&self) -> &str {
        self.database_url
            .as_deref()
            .or(self.database_url_file.as_deref())
            .expect("clap requires one of the two")
    }
}

/// By hand, so that no debug print of a service's settings shows the password.
impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::db::redacted(self.as_str()))
    }
}

#[derive(Clone, Debug, Args)]
pub struct DatabaseConfig {
    #[command(flatten)]
    pub database_url: DatabaseUrl,

    /// Connections for the HTTP handlers.
    #[arg(long, env = "DATABASE_POOL_SIZE", default_value_t = 8, value_parser = at_least_one())]
    pub database_pool_size: usize,

    /// Connections for the consumer's partitions, apart from the HTTP handlers' so a
    /// burst of requests cannot starve the saga's progress (and the other way round).
    #[arg(long, env = "CONSUMER_POOL_SIZE", default_value_t = 4, value_parser = at_least_one())]
    pub consumer_pool_size: usize,

    /// How long the outbox relay, the pruner and the deadline sweeper stay with a copy of
    /// the service that froze or vanished before another copy takes them over (see
    /// `saga::lease`); a live holder renews it every third of it. A transaction such a
    /// copy left open is ended after as long, releasing its locks. At least 1s.
    #[arg(long, env = "SINGLETON_LEASE", default_value = "10s",
          value_parser = lease_duration)]
    pub singleton_lease: Duration,
}

fn lease_duration(value: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(value).map_err(|e| e.to_string())?;
    if duration < Duration::from_secs(1) {
        return Err("a lease is at least 1s: its holder renews it every third".to_owned());
    }
    Ok(duration)
}

/// What a service lets one HTTP request do. The body's size and the headers' have fixed
/// limits ([`crate::http::BODY_LIMIT`], [`crate::http::HEADER_LIMIT`]).
#[derive(Debug, Clone, Args)]
pub struct HttpLimits {
    /// The longest a request may take, its body's upload included: past it the request
    /// is cut off with `408 request_timeout`, so a client that sends slowly cannot hold
    /// a connection and a slot. Longer than any wait a request may have (an
    /// `Idempotency-Key` in use, a slow provider on purpose).
    #[arg(long, env = "HTTP_REQUEST_TIMEOUT", default_value = DEFAULT_REQUEST_TIMEOUT,
          value_parser = humantime::parse_duration)]
    pub http_request_timeout: Duration,

    /// Requests in progress at once; one more is refused at once with `503 overloaded`
    /// and `Retry-After`, rather than queued behind the others.
    #[arg(long, env = "HTTP_MAX_CONCURRENT_REQUESTS", default_value_t = DEFAULT_MAX_CONCURRENT_REQUESTS,
          value_parser = at_least_one())]
    pub http_max_concurrent_requests: usize,
}

const DEFAULT_REQUEST_TIMEOUT: &str = "30s";
const DEFAULT_MAX_CONCURRENT_REQUESTS: usize = 256;

/// The flags' defaults, for code that builds a service without parsing them.
impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            http_request_timeout: humantime::parse_duration(DEFAULT_REQUEST_TIMEOUT)
                .expect("the default parses"),
            http_max_concurrent_requests: DEFAULT_MAX_CONCURRENT_REQUESTS,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct KafkaConfig {
    /// Kafka bootstrap servers, comma separated.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,

    /// Prepended to every topic and consumer group name, so several copies of the saga
    /// (one per test, say) can share a broker without seeing each other's events.
    #[arg(long, env = "KAFKA_NAMESPACE", default_value = "")]
    pub kafka_namespace: String,

    /// Most records of one partition the consumer applies in one transaction. 1 (the
    /// default) is one transaction per record; more trades a little latency under load
    /// for throughput, and changes no guarantee.
    #[arg(long, env = "CONSUMER_BATCH_SIZE", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1000).map(|n| n as usize))]
    pub consumer_batch_size: usize,

    /// How often the outbox relay looks for unpublished rows when nothing woke it (a
    /// NOTIFY, or a transaction of this service that wrote the outbox).
    #[arg(long, env = "OUTBOX_POLL_INTERVAL_MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(10..))]
    pub outbox_poll_interval_ms: u64,

    /// Under load, the least time between the starts of two of the relay's looks (see
    /// `OutboxRelay::linger`): each row waits at most this long, each look carries the
    /// rows that committed meanwhile. 0 looks again as soon as a batch is acknowledged.
    #[arg(long, env = "OUTBOX_LINGER_MS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(0..=1000))]
    pub outbox_linger_ms: u64,

    /// How long one attempt of the consumer (a record, or a batch) or one round of the
    /// outbox relay may run before `/livez` answers 503 naming it: each has timeouts of
    /// its own far below this, so one still running awaits something that will not come,
    /// and a restart frees its partition. Waiting between attempts, through an outage,
    /// is not counted.
    #[arg(long, env = "LIVENESS_STALL_AFTER", default_value = "10m",
          value_parser = humantime::parse_duration)]
    pub liveness_stall_after: Duration,
}

impl KafkaConfig {
    pub fn topics(&self) -> crate::Topics {
        crate::Topics::new(&self.kafka_namespace)
    }

    pub fn outbox_poll_interval(&self) -> Duration {
        Duration::from_millis(self.outbox_poll_interval_ms)
    }

    pub fn outbox_linger(&self) -> Duration {
        Duration::from_millis(self.outbox_linger_ms)
    }
}

/// How an endpoint that honours `Idempotency-Key` treats keys (see [`crate::idempotency`]).
#[derive(Debug, Clone, Args)]
pub struct IdempotencyConfig {
    /// Refuse a POST without an `Idempotency-Key` header (400 `idempotency_key_missing`)
    /// instead of placing it unguarded.
    #[arg(long, env = "REQUIRE_IDEMPOTENCY_KEY", default_value_t = false,
          action = clap::ArgAction::Set)]
    pub require_idempotency_key: bool,

    #[command(flatten)]
    pub keys: KeyConfig,
}

/// How long keys live, and how long a request waits for another holding its key: for
/// any endpoint that stores keys (order-service's, the card provider's).
#[derive(Debug, Clone, Args)]
pub struct KeyConfig {
    /// How long a key is remembered: a retry within it gets the first response, after it
    /// the same key is a new request. `24h`, `90m`, `7days`.
    #[arg(long, env = "IDEMPOTENCY_KEY_TTL", default_value = "24h",
          value_parser = humantime::parse_duration)]
    pub idempotency_key_ttl: Duration,

    /// How long a request waits for an earlier one with the same key to finish before it
    /// is answered 409 `idempotency_key_in_use` (with `Retry-After`).
    #[arg(long, env = "IDEMPOTENCY_KEY_WAIT", default_value = "2s",
          value_parser = humantime::parse_duration)]
    pub idempotency_key_wait: Duration,
}

/// What a service's database keeps, and the pruner that deletes the rest (see
/// [`crate::retention`]).
#[derive(Debug, Clone, Args)]
pub struct RetentionConfig {
    /// How long an applied event's id stays in `processed_events`: at least as long as a
    /// copy of the event can still arrive. The service refuses to start when this is
    /// shorter than the `retention.ms` of the topic it consumes or of its dead-letter
    /// topic. `off` keeps every id.
    #[arg(long, env = "INBOX_RETENTION", default_value = "14days")]
    pub inbox_retention: Window,

    /// How long a published outbox row is kept, to read what was sent. An unpublished row
    /// is never deleted. `off` keeps every row.
    #[arg(long, env = "OUTBOX_RETENTION", default_value = "1day")]
    pub outbox_retention: Window,

    #[command(flatten)]
    pub pruning: PruneConfig,
}

/// How often, and how hard, the pruner works.
#[derive(Debug, Clone, Args)]
pub struct PruneConfig {
    /// How often the pruner deletes what the windows no longer keep. `off`: never.
    #[arg(long, env = "PRUNE_INTERVAL", default_value = "1m")]
    pub prune_interval: Window,

    /// Rows deleted per transaction: the longest a prune holds any row lock.
    #[arg(long, env = "PRUNE_BATCH", default_value_t = 5000,
          value_parser = clap::value_parser!(i64).range(1..=1_000_000))]
    pub prune_batch: i64,

    /// The most of its time the pruner spends deleting, in percent; it rests between
    /// batches for the rest, leaving the database to the consumers.
    #[arg(long, env = "PRUNE_DUTY_CYCLE", default_value_t = 20,
          value_parser = clap::value_parser!(u8).range(1..=100))]
    pub prune_duty_cycle: u8,
}

impl PruneConfig {
    /// The pruner of `targets` in `database_url`'s database at this pace, or `None` when
    /// pruning is off.
    pub fn pruner(
        &self,
        database_url: &str,
        targets: Vec<Target>,
    ) -> anyhow::Result<Option<Pruner>> {
        let Window::Of(interval) = self.prune_interval else {
            return Ok(None);
        };
        let pace = Pace {
            interval,
            batch: self.prune_batch,
            duty_cycle: self.prune_duty_cycle,
        };
        Pruner::new(database_url, targets, pace).map(Some)
    }
}

impl RetentionConfig {
    /// Nothing pruned, nothing checked: for tests that are about something else.
    pub fn off() -> Self {
        Self {
            inbox_retention: Window::Off,
            outbox_retention: Window::Off,
            pruning: PruneConfig {
                prune_interval: Window::Off,
                prune_batch: 5000,
                prune_duty_cycle: 20,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::DatabaseUrl;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        database: DatabaseUrl,
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("service").chain(args.iter().copied()))
    }

    /// A secret file with its final newline, as `echo url > file` writes it.
    fn secret(content: &str) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("database-url-{}", uuid::Uuid::new_v4()));
        std::fs::write(&path, content).unwrap();
        path
    }

    #[test]
    fn the_url_is_read_from_the_file_without_its_final_newline() {
        let path = secret("postgres://saga:pw@db/orders\n");
        let cli = parse(&["--database-url-file", path.to_str().unwrap()]).unwrap();
        assert_eq!(cli.database.as_str(), "postgres://saga:pw@db/orders");
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn the_url_given_both_ways_is_refused() {
        let path = secret("postgres://saga:pw@db/orders");
        let error = parse(&[
            "--database-url-file",
            path.to_str().unwrap(),
            "--database-url",
            "postgres://saga:pw@db/orders",
        ])
        .err()
        .expect("refused");
        assert_eq!(error.kind(), clap::error::ErrorKind::ArgumentConflict);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn a_missing_file_is_named_in_the_error() {
        let error = parse(&["--database-url-file", "/nowhere/database-url"])
            .err()
            .expect("refused");
        assert_eq!(error.kind(), clap::error::ErrorKind::ValueValidation);
        assert!(
            error
                .to_string()
                .contains("cannot read /nowhere/database-url: "),
            "{error}"
        );
    }

    #[test]
    fn neither_way_is_refused_as_missing() {
        let error = parse(&[]).err().expect("refused");
        assert_eq!(
            error.kind(),
            clap::error::ErrorKind::MissingRequiredArgument
        );
    }

    #[test]
    fn a_debug_print_hides_the_password() {
        let url = DatabaseUrl::new("postgres://saga:hunter2@db/orders");
        assert!(!format!("{url:?}").contains("hunter2"), "{url:?}");
    }
}
