//! Helpers for tests that talk to the real PostgreSQL and the real Kafka broker
//! (`scripts/test` starts both).
//!
//! Each test gets its own database ([`TestDatabase`]) and its own topics and consumer
//! groups ([`TestKafka`], a namespace prefix), so tests run in parallel without seeing
//! each other. Waiting is always for a condition ([`eventually`]), never for a time.
//!
//! Settings, with their defaults: `SAGA_TEST_POSTGRES_URL`
//! (`postgres://saga:saga@127.0.0.1:5432/postgres`, a role that may create databases and
//! is a member of the services' roles), `KAFKA_BROKERS` (`127.0.0.1:9092`), and the
//! services' and readers' passwords `PG_PASSWORD_<ROLE>` (`<role>-pw`), as
//! `scripts/infra-up` sets them.

use std::future::Future;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::message::OwnedMessage;
use rdkafka::producer::{FutureProducer, FutureRecord};
use saga::Topics;
use uuid::Uuid;

pub use saga::kafka::header;

pub mod browser;
pub mod otlp;
pub mod provider;
pub mod race;
pub mod tls;

/// Test databases are named with this prefix; `scripts/test` drops leftovers.
pub const DATABASE_PREFIX: &str = "saga_test_";

pub fn postgres_admin_url() -> String {
    std::env::var("SAGA_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://saga:saga@127.0.0.1:5432/postgres".into())
}

/// Partitions per topic: `KAFKA_TOPIC_PARTITIONS`, the scripts' setting, or 3.
pub fn topic_partitions() -> i32 {
    std::env::var("KAFKA_TOPIC_PARTITIONS")
        .ok()
        .and_then(|partitions| partitions.parse().ok())
        .unwrap_or(3)
}

pub fn kafka_brokers() -> String {
    std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

pub use saga::db::role_password;

/// `database` of the cluster the tests use, as `role` (one `scripts/infra-up` made).
pub fn native_url(role: &str, database: &str) -> String {
    url_of(
        &postgres_admin_url(),
        Some((role, &role_password(role))),
        database,
    )
}

/// A database of its own for one test.
pub struct TestDatabase {
    pub name: String,
    /// The administrator's URL; [`url_as`](Self::url_as) gives another role's.
    pub url: String,
    /// The administrator's pool.
    pub pool: Pool,
}

impl TestDatabase {
    /// An empty database: for services that migrate it themselves on start.
    pub async fn empty() -> Self {
        Self::create("").await
    }

    /// An empty database set up as a service's own is (`deploy/postgres/
    /// service-database.psql`): owned by the service's `role`, and no other role may
    /// connect but `reader`, the read-only one. The service, started with
    /// [`url_as`](Self::url_as)`(role)`, migrates it as that role.
    pub async fn owned_by(role: &str, reader: &str) -> Self {
        let db = Self::create(&format!(" OWNER {role}")).await;
        admin()
            .await
            .batch_execute(&format!(
                "REVOKE ALL ON DATABASE {name} FROM PUBLIC; \
                 GRANT CONNECT ON DATABASE {name} TO {reader}",
                name = db.name
            ))
            .await
            .expect("the test role may grant on a database of a service's role");
        db
    }

    async fn create(owner: &str) -> Self {
        let name = format!("{DATABASE_PREFIX}{}", Uuid::new_v4().simple());
        admin()
            .await
            .batch_execute(&format!("CREATE DATABASE {name}{owner}"))
            .await
            .expect("the test role may create databases (for the services' roles)");
        let url = url_of(&postgres_admin_url(), None, &name);
        let pool = saga::db::pool(&url, 8, saga::lease::DEFAULT_LEASE).unwrap();
        Self { name, url, pool }
    }

    /// This database's URL as `role`.
    pub fn url_as(&self, role: &str) -> String {
        url_of(&self.url, Some((role, &role_password(role))), &self.name)
    }

    /// A database with the saga's tables and the service's (`migrations`, the runner of
    /// its embedded set, recorded in `history_table`).
    pub async fn migrated(migrations: fn() -> refinery::Runner, history_table: &str) -> Self {
        let db = Self::empty().await;
        saga::db::migrate(&db.url, migrations, history_table)
            .await
            .expect("migrations apply to a fresh database");
        db
    }

    /// A database with only the saga's own tables (`processed_events`, `outbox`).
    pub async fn saga_tables_only() -> Self {
        Self::migrated(|| refinery::Runner::new(&[]), "no_service_schema_history").await
    }

    pub async fn client(&self) -> deadpool_postgres::Client {
        self.pool.get().await.expect("a pooled connection")
    }

    /// Makes the database unreachable for everyone, as if its server were down: new
    /// connections are refused and open ones are cut.
    pub async fn refuse_connections(&self) {
        let admin = admin().await;
        admin
            .batch_execute(&format!(
                "ALTER DATABASE {} ALLOW_CONNECTIONS false",
                self.name
            ))
            .await
            .unwrap();
        admin
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
                &[&self.name],
            )
            .await
            .unwrap();
    }

    pub async fn accept_connections(&self) {
        admin()
            .await
            .batch_execute(&format!(
                "ALTER DATABASE {} ALLOW_CONNECTIONS true",
                self.name
            ))
            .await
            .unwrap();
    }

    /// Runs the real pruner over the inbox with a window every applied id is past, as if
    /// `INBOX_RETENTION` had gone by; returns how many ids it deleted.
    pub async fn prune_inbox(&self) -> u64 {
        let pace = saga::retention::Pace {
            interval: Duration::from_secs(60),
            batch: 1000,
            duty_cycle: 100,
        };
        let pruner = saga::retention::Pruner::new(
            &self.url,
            vec![saga::retention::Target::inbox(Duration::ZERO)],
            pace,
        )
        .unwrap();
        pruner
            .pass(&Default::default())
            .await
            .unwrap()
            .deleted("processed_events")
    }

    /// Waits until a session of this database is blocked on a lock: the statement a test
    /// holds up with a row of its own locked has got as far as that row.
    pub async fn a_session_waits_on_a_lock(&self) {
        eventually(
            Duration::from_secs(30),
            "a session to wait on a lock",
            || async {
                let waiting = self
                    .count(
                        "SELECT count(*) FROM pg_stat_activity
                      WHERE datname = current_database() AND wait_event_type = 'Lock'",
                        &[],
                    )
                    .await;
                (waiting > 0).then_some(())
            },
        )
        .await;
    }

    /// The single `i64` (a count, usually) that `sql` returns.
    pub async fn count(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> i64 {
        self.client()
            .await
            .query_one(sql, params)
            .await
            .unwrap()
            .get(0)
    }
}

/// `url` naming `database`, and logging in as `login` if given.
fn url_of(url: &str, login: Option<(&str, &str)>, database: &str) -> String {
    let mut url = url.to_owned();
    let slash = url.rfind('/').expect("the URL names a database");
    url.replace_range(slash + 1.., database);
    if let Some((role, password)) = login {
        let start = url.find("://").expect("a URL") + 3;
        let end = url.rfind('@').expect("the URL has a user");
        url.replace_range(start..end, &format!("{role}:{password}"));
    }
    url
}

async fn admin() -> tokio_postgres::Client {
    saga::db::connect(&saga::db::parse_url(&postgres_admin_url()).unwrap())
        .await
        .expect("PostgreSQL is reachable (scripts/test starts it)")
}

/// A namespace of topics and consumer groups of its own for one test.
pub struct TestKafka {
    pub brokers: String,
    pub namespace: String,
    pub topics: Topics,
    producer: FutureProducer,
}

impl TestKafka {
    /// Creates every saga topic, dead-letter topics included, under a fresh namespace,
    /// with [`topic_partitions`] partitions each, as `scripts/infra-up` makes the saga's
    /// own.
    pub async fn new() -> Self {
        Self::with_partitions(topic_partitions()).await
    }

    /// [`TestKafka::new`] with `partitions` partitions per topic.
    pub async fn with_partitions(partitions: i32) -> Self {
        let brokers = kafka_brokers();
        let namespace = format!("t{}.", &Uuid::new_v4().simple().to_string()[..12]);
        let topics = Topics::new(&namespace);
        saga::kafka::create_topics(&brokers, &topics.all(), partitions)
            .await
            .expect("Kafka is reachable (scripts/test starts it)");
        let producer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()
            .unwrap();
        Self {
            brokers,
            namespace,
            topics,
            producer,
        }
    }

    /// Sets `key` to `value` on every topic of the namespace, as `kafka-configs --alter`
    /// would.
    pub async fn set_topic_config(&self, key: &str, value: &str) {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .create()
            .unwrap();
        let topics = self.topics.all();
        let changes: Vec<AlterConfig<'_>> = topics
            .iter()
            .map(|t| AlterConfig::new(ResourceSpecifier::Topic(t)).set(key, value))
            .collect();
        for result in admin
            .alter_configs(&changes, &AdminOptions::new())
            .await
            .expect("Kafka is reachable")
        {
            result.unwrap_or_else(|(resource, code)| panic!("{resource:?}: {key}={value}: {code}"));
        }
    }

    /// Produces raw bytes, as a person with `kafka-console-producer` would: no key
    /// unless one is given.
    pub async fn produce(&self, topic: &str, key: Option<&str>, value: &[u8]) {
        self.produce_to(topic, None, key, value).await;
    }

    pub async fn produce_to(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&str>,
        value: &[u8],
    ) {
        let mut record: FutureRecord<'_, str, [u8]> = FutureRecord::to(topic).payload(value);
        if let Some(key) = key {
            record = record.key(key);
        }
        if let Some(partition) = partition {
            record = record.partition(partition);
        }
        self.producer
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)
            .expect("the broker acknowledges");
    }

    /// Produces `value` to `topic` with `headers`, as a hand-made record.
    pub async fn produce_with_headers(
        &self,
        topic: &str,
        key: &str,
        value: &[u8],
        headers: &[(&str, &str)],
    ) {
        let mut owned = rdkafka::message::OwnedHeaders::new();
        for (key, value) in headers {
            owned = owned.insert(rdkafka::message::Header {
                key,
                value: Some(*value),
            });
        }
        let record: FutureRecord<'_, str, [u8]> = FutureRecord::to(topic)
            .key(key)
            .payload(value)
            .headers(owned);
        self.producer
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)
            .expect("the broker acknowledges");
    }

    /// Produces a copy of `record` to its topic: its key, value and headers, as a person
    /// replays one with the console producer (`parse.headers=true`).
    pub async fn replay(&self, record: &OwnedMessage) {
        use rdkafka::Message as _;
        let mut copy: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(record.topic());
        if let Some(key) = record.key() {
            copy = copy.key(key);
        }
        if let Some(value) = record.payload() {
            copy = copy.payload(value);
        }
        if let Some(headers) = record.headers() {
            copy = copy.headers(headers.clone());
        }
        self.producer
            .send(copy, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)
            .expect("the broker acknowledges");
    }

    /// Every record currently in `topic`, read from the beginning by a throwaway
    /// consumer that commits nothing.
    pub async fn read_all(&self, topic: &str) -> Vec<OwnedMessage> {
        let brokers = self.brokers.clone();
        let topic = topic.to_owned();
        tokio::task::spawn_blocking(move || saga::kafka::read_topic(&brokers, &topic))
            .await
            .unwrap()
            .expect("the topic can be read to its end")
    }

    /// True once `group` has committed, on every partition of `topic`, past every record
    /// produced so far: each has been handled (`saga::kafka::group_caught_up`).
    pub async fn group_caught_up(&self, group: &str, topic: &str) -> bool {
        let brokers = self.brokers.clone();
        let group = group.to_owned();
        let topic = topic.to_owned();
        tokio::task::spawn_blocking(move || saga::kafka::group_caught_up(&brokers, &group, &topic))
            .await
            .unwrap()
            .unwrap_or(false)
    }
}

impl TestKafka {
    /// The offset `group` has committed on one partition of `topic` (0 when none).
    pub async fn committed_offset(&self, group: &str, topic: &str, partition: i32) -> i64 {
        let (brokers, group, topic) = (self.brokers.clone(), group.to_owned(), topic.to_owned());
        let offsets = tokio::task::spawn_blocking(move || {
            saga::kafka::committed_and_end(&brokers, &group, &topic)
        })
        .await
        .unwrap()
        .expect("the group coordinator answers");
        offsets.get(&partition).map_or(0, |(done, _)| *done)
    }
}

/// Polls `check` until it returns `Some`, or fails the test naming `what` after
/// `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A JSON envelope as a person would type it for `kafka-console-producer`.
pub fn envelope(id: &str, event_type: &str, order_id: Uuid, payload: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "id": id,
        "type": event_type,
        "aggregate_id": order_id,
        "payload": payload,
        "occurred_at": "2026-07-14T09:15:40Z",
    }))
    .unwrap()
}

/// The certificate of the test CA that signs PostgreSQL's, for `sslrootcert`:
/// `SAGA_TEST_PG_CA`, or the copy `scripts/infra-up` keeps in the run folder
/// (`SAGA_RUN_DIR`, or the checkout's `.run`).
pub fn postgres_ca_file() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os("SAGA_TEST_PG_CA") {
        return path.into();
    }
    let run_dir = std::env::var_os("SAGA_RUN_DIR").map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.run"),
        std::path::PathBuf::from,
    );
    let path = run_dir.join("postgres-ca.crt");
    assert!(
        path.exists(),
        "{} not found: scripts/infra-up makes it",
        path.display()
    );
    path
}

/// What `router` answers a `GET` of `path`, in this process: its status and its JSON body.
pub async fn get_json(
    router: axum::Router,
    path: &str,
) -> (axum::http::StatusCode, serde_json::Value) {
    use tower::ServiceExt as _;
    let request = axum::http::Request::get(path)
        .body(axum::body::Body::empty())
        .expect("a request to a path");
    let response = router
        .oneshot(request)
        .await
        .expect("a router always answers");
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 1 << 16)
        .await
        .expect("a body that fits");
    (status, serde_json::from_slice(&body).expect("a JSON body"))
}
