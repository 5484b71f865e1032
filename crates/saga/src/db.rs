//! PostgreSQL plumbing: the connection pool, single dedicated connections, and migrations.
//! Every connection goes through [`Config`], and so through TLS as its URL's `sslmode`
//! says ([`tls`]).
//!
//! Every service owns one database. Its schema is two migration sets applied in order:
//! the saga's own (`migrations/saga`: `processed_events`, `outbox`) and the service's
//! (`migrations/<service>`), each with its own history table so the sets never collide.

pub mod tls;

use std::time::Duration;

use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use postgres_openssl::{MakeTlsConnector, TlsStream};
use tokio_postgres::{Client, Connection, Socket};

mod embedded {
    refinery::embed_migrations!("../../migrations/saga");
}

/// Serialises migrations of instances starting at once against one database.
const MIGRATION_LOCK: i64 = 0x006d_6967_7261_7465; // "migrate"

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("DATABASE_URL is not a valid PostgreSQL URL: {0}")]
    Url(tokio_postgres::Error),
    #[error("cannot build the connection pool: {0}")]
    Pool(#[from] deadpool_postgres::BuildError),
    #[error("cannot connect to PostgreSQL: {}", describe(.0))]
    Connect(tokio_postgres::Error),
    #[error(transparent)]
    TlsSettings(#[from] tls::TlsError),
    /// A handshake refused for a reason that recurs until a setting changes.
    #[error("cannot connect to PostgreSQL: TLS handshake refused: {reason} ({settings})")]
    TlsRefused { reason: String, settings: String },
    #[error("migration failed: {0}")]
    Migrate(#[from] refinery::Error),
    #[error("{}", describe(.0))]
    Query(#[from] tokio_postgres::Error),
    #[error(
        "DATABASE_URL reaches PostgreSQL through a pooler that lends one server session to \
         several clients (transaction or statement mode): of two connections open at once, \
         the second saw a setting the first made in its session (server process {pid}). The \
         relay's and the singletons' leases, the relay's LISTEN and the migrations' lock are \
         session state: point DATABASE_URL at PostgreSQL itself, or at a pooler in session \
         mode (docs/cluster.md, \"A connection pooler\")"
    )]
    SharedSession { pid: i32 },
}

/// The server's own message and SQLSTATE, or the I/O cause: tokio-postgres's `Display`
/// says only "db error", which tells an operator reading a log or a dead letter nothing.
pub fn describe(error: &tokio_postgres::Error) -> String {
    if let Some(db) = error.as_db_error() {
        return format!("{db} (SQLSTATE {})", db.code().code());
    }
    match std::error::Error::source(error) {
        Some(cause) => format!("{error}: {cause}"),
        None => error.to_string(),
    }
}

/// The password of `role` (a service's or a reader's) as the project's scripts set it:
/// `PG_PASSWORD_<ROLE>`, or the demo's `<role>-pw`.
pub fn role_password(role: &str) -> String {
    std::env::var(format!("PG_PASSWORD_{}", role.to_uppercase()))
        .unwrap_or_else(|_| format!("{role}-pw"))
}

/// `url` with its password cut out (`postgres://user@host/db`), fit for a log line or an
/// error message.
pub fn redacted(url: &str) -> String {
    match (url.split_once("://"), url.rsplit_once('@')) {
        (Some((scheme, rest)), Some((_, host))) => {
            let user = rest.split([':', '@']).next().unwrap_or_default();
            format!("{scheme}://{user}@{host}")
        }
        _ => url.to_owned(),
    }
}

/// A database URL read: tokio-postgres's settings, and the TLS ones it cannot read.
/// Derefs to the former for the host, port, database and user.
#[derive(Clone)]
pub struct Config {
    postgres: tokio_postgres::Config,
    tls: tls::Settings,
    connector: MakeTlsConnector,
}

impl Config {
    /// A session of its own, the connection to be polled by the caller.
    pub async fn connect(
        &self,
    ) -> Result<(Client, Connection<Socket, TlsStream<Socket>>), tokio_postgres::Error> {
        self.postgres.connect(self.connector.clone()).await
    }

    pub fn tls(&self) -> &tls::Settings {
        &self.tls
    }

    /// `error`, made [`DbError::TlsRefused`] if it is a refused handshake.
    fn connect_error(&self, error: tokio_postgres::Error) -> DbError {
        match tls::refusal(&error) {
            Some(reason) => DbError::TlsRefused {
                reason,
                settings: self.tls.describe(),
            },
            None => DbError::Connect(error),
        }
    }
}

impl std::ops::Deref for Config {
    type Target = tokio_postgres::Config;

    fn deref(&self) -> &tokio_postgres::Config {
        &self.postgres
    }
}

/// For a session with TCP settings of its own: a singleton's lease ([`crate::lease`]).
impl std::ops::DerefMut for Config {
    fn deref_mut(&mut self) -> &mut tokio_postgres::Config {
        &mut self.postgres
    }
}

/// Reads `url`, TLS settings included; a certificate file named in it is read now, so
/// that a missing one stops a service at start-up.
pub fn parse_url(url: &str) -> Result<Config, DbError> {
    let (rest, parameters) = tls::take_parameters(url);
    let mut postgres: tokio_postgres::Config = rest.parse().map_err(DbError::Url)?;
    let default_mode = match postgres.get_ssl_mode() {
        tokio_postgres::config::SslMode::Disable => tls::SslMode::Disable,
        tokio_postgres::config::SslMode::Require => tls::SslMode::Require,
        _ => tls::SslMode::Prefer,
    };
    let tls = tls::Settings::from_parameters(parameters, default_mode)?;
    postgres.ssl_mode(tls.wire_mode());
    // Without a timeout a connect to a stopped server can hang for minutes; the callers
    // retry with backoff instead.
    if postgres.get_connect_timeout().is_none() {
        postgres.connect_timeout(Duration::from_secs(5));
    }
    Ok(Config {
        connector: tls.connector()?,
        postgres,
        tls,
    })
}

/// A pool of at most `max_size` connections to the service's database. Connections are
/// made lazily, so a service starts even while the database is down and recovers when it
/// is back.
///
/// The server ends any of its transactions left idle for `abandoned_after`
/// (`idle_in_transaction_session_timeout`). A copy frozen in the middle of one (SIGSTOP,
/// a paused VM) would otherwise keep its row locks for as long as it stays frozen: the
/// order row a redelivered event needs, or the `Idempotency-Key` a client retries on
/// another copy. No transaction here waits on anything but its own statements.
pub fn pool(
    database_url: &str,
    max_size: usize,
    abandoned_after: Duration,
) -> Result<Pool, DbError> {
    let config = parse_url(database_url)?;
    let manager = Manager::from_config(
        config.postgres,
        config.connector,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let set = format!(
        "SET idle_in_transaction_session_timeout = {}",
        abandoned_after.as_millis().max(1)
    );
    Ok(Pool::builder(manager)
        .post_create(Hook::async_fn(move |client, _| {
            let set = set.clone();
            Box::pin(async move { client.batch_execute(&set).await.map_err(HookError::Backend) })
        }))
        .max_size(max_size)
        .wait_timeout(Some(Duration::from_secs(10)))
        .create_timeout(Some(Duration::from_secs(5)))
        .runtime(Runtime::Tokio1)
        .build()?)
}

/// One connection outside the pool, for work that needs a session of its own.
pub async fn connect(config: &Config) -> Result<Client, DbError> {
    let (client, connection) = config
        .connect()
        .await
        .map_err(|error| config.connect_error(error))?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "database connection closed");
        }
    });
    Ok(client)
}

/// Refuses a `database_url` whose connections share server sessions, as a pooler in
/// transaction or statement mode makes them: the leases (session advisory locks), the
/// relay's `LISTEN`, the migrations' lock and the relay's session settings would then
/// belong to whichever client the pooler hands that server connection next. The first of
/// two connections open at once sets a mark in its session; the second looks for it. Two
/// sessions of PostgreSQL itself (or behind a load balancer, or a pooler in session mode,
/// or one that pins a client to its server connection once it sets session state) never
/// see each other's; through a pooler in transaction mode, the second client is usually
/// handed the server connection the first just gave back, and finds the mark. A pooler
/// that happens to hand out another idle server connection gets through; nothing whose
/// sessions are their own is ever refused.
pub async fn refuse_shared_sessions(database_url: &str) -> Result<(), DbError> {
    let config = parse_url(database_url)?;
    let (first, second) = (connect(&config).await?, connect(&config).await?);
    let mark = uuid::Uuid::new_v4().to_string();
    first
        .batch_execute(&format!("SET saga.session_mark = '{mark}'"))
        .await?;
    let seen = second
        .simple_query("SELECT current_setting('saga.session_mark', true), pg_backend_pid()")
        .await?;
    let seen = seen.iter().find_map(|message| match message {
        tokio_postgres::SimpleQueryMessage::Row(row) => Some((row.get(0)?, row.get(1)?)),
        _ => None,
    });
    match seen {
        Some((found, pid)) if found == mark => Err(DbError::SharedSession {
            pid: pid.parse().unwrap_or_default(),
        }),
        _ => Ok(()),
    }
}

/// Applies the saga's migrations, then the service's own set (from `service`, the
/// `runner` of its `embed_migrations!` module) recorded in `history_table`. Safe to run
/// from several instances at once.
pub async fn migrate(
    database_url: &str,
    service: fn() -> refinery::Runner,
    history_table: &str,
) -> Result<(), DbError> {
    migrate_sets(
        database_url,
        &[
            (embedded::migrations::runner, "saga_schema_history"),
            (service, history_table),
        ],
    )
    .await
}

/// Applies one migration set alone, for a database that takes no part in the saga (no
/// inbox, no outbox): payment-provider's.
pub async fn migrate_alone(
    database_url: &str,
    migrations: fn() -> refinery::Runner,
    history_table: &str,
) -> Result<(), DbError> {
    migrate_sets(database_url, &[(migrations, history_table)]).await
}

/// A set's runner and the table that records what it applied.
pub type MigrationSet<'a> = (fn() -> refinery::Runner, &'a str);

async fn migrate_sets(database_url: &str, sets: &[MigrationSet<'_>]) -> Result<(), DbError> {
    let mut client = connect(&parse_url(database_url)?).await?;
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    for (runner, history_table) in sets {
        runner()
            .set_migration_table_name(history_table)
            .run_async(&mut client)
            .await?;
    }
    // Closing the session releases the advisory lock.
    Ok(())
}

/// Runs `migrate` until the database can be reached, waiting with backoff rather than
/// crash-looping while it starts; any other error is returned at once. A server that
/// answers and refuses (a wrong password, no such database, no CONNECT privilege) is a
/// setting to fix, not an outage to wait out: returned at once too.
pub async fn migrate_when_reachable<F, Fut>(migrate: F) -> Result<(), DbError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), DbError>>,
{
    let mut delays = crate::backoff::backoff();
    loop {
        match migrate().await {
            // A refused TLS handshake (an untrusted certificate, a wrong host name)
            // recurs until DATABASE_URL changes: said at once, not waited out.
            Err(DbError::Connect(error))
                if tls::refusal(&error).is_none()
                    && crate::retry::classify_postgres(&error)
                        == crate::retry::Retry::UntilItWorks =>
            {
                let delay = crate::backoff::next_delay(&mut delays);
                let error = describe(&error);
                tracing::warn!(%error, retry_in = ?delay, "database not reachable yet");
                tokio::time::sleep(delay).await;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_redacted_url_keeps_everything_but_the_password() {
        assert_eq!(
            super::redacted("postgres://order_service:s3cr@t@db:5432/orders"),
            "postgres://order_service@db:5432/orders"
        );
        assert_eq!(
            super::redacted("postgres://db:5432/orders"),
            "postgres://db:5432/orders"
        );
    }
}
