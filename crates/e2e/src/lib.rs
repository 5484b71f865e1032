//! A whole saga for one test: the three service binaries and the card provider
//! payment-service calls (payment-provider), each with a fresh database, the services
//! sharing a fresh Kafka namespace, started as real processes the way `scripts/up` starts
//! them. Tests drive it through the HTTP API and raw Kafka records, and read the
//! databases to check effects.
//!
//! The binaries must be built first (`cargo build --bins`; `scripts/test` does it).
//!
//! For the fault suite (`tests/faults.rs`): a service can run as several instances (its
//! first instance is named after it, more get their own port and log), be started with
//! failpoints armed, killed, and watched for dying ([`chaos`] restarts what a failpoint
//! killed); [`load`] places orders in the background and [`cancellations`] cancels some
//! of them (and reads where their money went), [`hand`] produces records as a
//! person would, [`infra`] stops and restarts the broker and PostgreSQL, and
//! [`invariants`] checks, after a scenario, that every effect happened exactly once.
//! [`kafka_users`] grants a test the chart's least-privileged Kafka users.

pub mod cancellations;
pub mod chaos;
pub mod hand;
pub mod infra;
pub mod invariants;
pub mod kafka_users;
pub mod load;
pub mod metrics;
pub mod viewer;

mod instances;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use saga_testkit::provider::ProviderAdmin;
use saga_testkit::{TestDatabase, TestKafka, eventually, topic_partitions};
use serde_json::{Value, json};
use tokio::process::{Child, Command};
use uuid::Uuid;

pub use instances::{as_a_user, binary, describe_exit};

pub const ORDER_SERVICE: &str = "order-service";
pub const PAYMENT_SERVICE: &str = "payment-service";
pub const NOTIFICATION_SERVICE: &str = "notification-service";
/// The saga's services: each consumes a topic, has an inbox and an outbox.
pub const SERVICES: [&str; 3] = [ORDER_SERVICE, PAYMENT_SERVICE, NOTIFICATION_SERVICE];
/// The stand-in card processor payment-service charges orders with; outside the saga.
pub const PAYMENT_PROVIDER: &str = "payment-provider";

/// The product of the README's example order: 1299 cents.
pub const KEYBOARD: &str = "8f14e45f-ceea-4c9d-b2a5-0c1e3f4a9b21";

/// How long the saga may take to settle in a test; generous for a loaded 2-core machine.
pub const SETTLE: Duration = Duration::from_secs(60);

pub struct Stack {
    pub kafka: TestKafka,
    pub orders_db: TestDatabase,
    pub payments_db: TestDatabase,
    pub notifications_db: TestDatabase,
    pub provider_db: TestDatabase,
    /// The running processes, by instance name.
    processes: HashMap<String, Child>,
    /// Each instance's HTTP port, kept across restarts so the API stays where it was.
    ports: HashMap<String, u16>,
    /// Every instance ever started, and its service: whose logs tell what a consumer
    /// group handled.
    instances: BTreeMap<String, &'static str>,
    /// Variables every instance is started with, restarts included.
    env: Vec<(String, String)>,
    /// Variables each instance of one service is started with, after `env`.
    service_env: HashMap<&'static str, Vec<(String, String)>>,
    http: reqwest::Client,
}

/// The checkout's root: the scripts, the compose file and `.cache` the tests read.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The role `service` logs in as, owner of its database alone (`service_role` in
/// `scripts/lib.sh`).
pub fn role(service: &str) -> String {
    service.replace('-', "_")
}

/// The read-only role of `database` (`reader_role` in `scripts/lib.sh`).
pub fn reader(database: &str) -> String {
    format!("{database}_reader")
}

/// What `service`'s database is called outside the tests (`service_database` in
/// `scripts/lib.sh`).
pub fn database_name(service: &str) -> &'static str {
    match service {
        ORDER_SERVICE => "orders",
        PAYMENT_SERVICE => "payments",
        NOTIFICATION_SERVICE => "notifications",
        PAYMENT_PROVIDER => "provider",
        other => panic!("no service {other}"),
    }
}

/// A test database set up as `service`'s own is.
async fn own_database(service: &str) -> TestDatabase {
    TestDatabase::owned_by(&role(service), &reader(database_name(service))).await
}

/// A window of seconds for the inbox, and the topics' `retention.ms` to match (so the
/// services' start-up check passes): the pruner empties the inboxes as the saga runs.
pub const PRUNING_INBOX: [(&str, &str); 2] = [
    ("INBOX_RETENTION", PRUNING_WINDOW),
    ("PRUNE_INTERVAL", "1s"),
];
/// The inbox's window in [`PRUNING_INBOX`], and the topics' `retention.ms` that matches it.
pub const PRUNING_WINDOW: &str = "3s";
const PRUNING_TOPIC_RETENTION_MS: &str = "3000";

impl Stack {
    /// Starts the provider and the three services and waits until each reports healthy.
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// Starts the provider and the three services, with `failpoints` (service,
    /// `FAILPOINTS` value) armed in some, and waits until each reports healthy.
    pub async fn start_with(failpoints: &[(&'static str, String)]) -> Self {
        Self::start_configured(failpoints, &[], topic_partitions()).await
    }

    /// [`Stack::start_with`] on topics of `partitions` partitions each (otherwise
    /// `KAFKA_TOPIC_PARTITIONS`, or three).
    pub async fn start_with_partitions(
        failpoints: &[(&'static str, String)],
        partitions: i32,
    ) -> Self {
        Self::start_configured(failpoints, &[], partitions).await
    }

    /// [`Stack::start`] with `env` set for every service (each reads what it knows).
    pub async fn start_with_env(env: &[(&str, &str)]) -> Self {
        Self::start_configured(&[], env, topic_partitions()).await
    }

    /// Starts all three services with their inboxes pruned to a window of seconds
    /// ([`PRUNING_INBOX`]), on topics whose retention matches it while they start. Then
    /// the topics keep every record: the services read the retention at start only, and
    /// at 3 s the broker's retention check (every 5 minutes) deletes a run's records
    /// whenever it falls within the scenario. A service started again on this stack
    /// finds that and stops pruning.
    pub async fn start_pruning() -> Self {
        let stack = Self::start_configured(&[], &PRUNING_INBOX, topic_partitions()).await;
        stack.kafka.set_topic_config("retention.ms", "-1").await;
        stack
    }

    /// Whether the services prune their inboxes as they go ([`Stack::start_pruning`]).
    pub fn prunes_inboxes(&self) -> bool {
        self.env.iter().any(|(k, _)| k == "INBOX_RETENTION")
    }

    /// Starts the provider and the three services with `failpoints` armed in some and
    /// `env` in all, on topics of `partitions` partitions each.
    pub async fn start_configured(
        failpoints: &[(&'static str, String)],
        env: &[(&str, &str)],
        partitions: i32,
    ) -> Self {
        let mut stack = Self::prepare(env, partitions).await;
        stack.start_all(failpoints).await;
        stack
    }

    /// The topics and the databases of a stack with `env` for every service, on topics
    /// of `partitions` partitions each, and nothing started yet ([`Stack::start_all`]).
    pub async fn prepare(env: &[(&str, &str)], partitions: i32) -> Self {
        let (kafka, orders_db, payments_db, notifications_db, provider_db) = tokio::join!(
            TestKafka::with_partitions(partitions),
            own_database(ORDER_SERVICE),
            own_database(PAYMENT_SERVICE),
            own_database(NOTIFICATION_SERVICE),
            own_database(PAYMENT_PROVIDER)
        );
        let stack = Self {
            kafka,
            orders_db,
            payments_db,
            notifications_db,
            provider_db,
            processes: HashMap::new(),
            ports: HashMap::new(),
            instances: BTreeMap::new(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            service_env: HashMap::new(),
            http: reqwest::Client::new(),
        };
        if stack.prunes_inboxes() {
            stack
                .kafka
                .set_topic_config("retention.ms", PRUNING_TOPIC_RETENTION_MS)
                .await;
        }
        stack
    }

    /// Sets `env` for every instance of `service` started from now on.
    pub fn set_service_env(&mut self, service: &'static str, env: Vec<(String, String)>) {
        self.service_env.insert(service, env);
    }

    /// Starts the provider and the three services of a prepared stack, with `failpoints`
    /// armed in some, and waits until each reports healthy.
    pub async fn start_all(&mut self, failpoints: &[(&'static str, String)]) {
        if let Some(status) = self
            .start_instance(PAYMENT_PROVIDER, PAYMENT_PROVIDER, None)
            .await
        {
            panic!("{PAYMENT_PROVIDER} exited before it was healthy: {status}");
        }
        for service in SERVICES {
            let armed = failpoints
                .iter()
                .find(|(s, _)| *s == service)
                .map(|(_, spec)| spec.as_str());
            if let Some(status) = self.start_instance(service, service, armed).await {
                panic!("{service} exited before it was healthy: {status}");
            }
        }
    }

    /// The database `service` owns.
    pub fn database(&self, service: &str) -> &TestDatabase {
        match service {
            ORDER_SERVICE => &self.orders_db,
            PAYMENT_SERVICE => &self.payments_db,
            NOTIFICATION_SERVICE => &self.notifications_db,
            PAYMENT_PROVIDER => &self.provider_db,
            other => panic!("no service {other}"),
        }
    }

    /// `service`'s database as its read-only role (`<database>_reader`), which sagactl
    /// logs in as.
    pub fn reader_url(&self, service: &str) -> String {
        self.database(service)
            .url_as(&reader(database_name(service)))
    }

    /// The provider's base URL.
    /// Where `instance` (a service's first instance is named after it) serves HTTP.
    pub fn url_of(&self, instance: &str) -> String {
        format!("http://127.0.0.1:{}", self.ports[instance])
    }

    pub fn provider_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports[PAYMENT_PROVIDER])
    }

    /// The provider, to arm its faults and read what it did.
    pub fn provider(&self) -> ProviderAdmin {
        ProviderAdmin::new(self.provider_url())
    }

    /// What `instance` (a service's name, for its first instance) reports at `/metrics`.
    pub async fn metrics(&self, instance: &str) -> metrics::Metrics {
        let url = format!("http://127.0.0.1:{}/metrics", self.ports[instance]);
        let response = self.http.get(url).send().await.expect("/metrics answers");
        assert_eq!(response.status(), 200, "{instance}'s /metrics");
        metrics::Metrics::parse(&response.text().await.expect("a text body"))
    }

    /// The HTTP client and the order API's base URL, for work in a task of its own.
    pub fn api(&self) -> (reqwest::Client, String) {
        (self.http.clone(), self.api_url(""))
    }

    pub fn api_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.ports[ORDER_SERVICE])
    }

    /// The consumer group of `service`, the topic it consumes, and its dead-letter topic.
    pub fn subscription(&self, service: &str) -> (String, String, String) {
        let topics = &self.kafka.topics;
        let topic = match service {
            ORDER_SERVICE => topics.payments.clone(),
            PAYMENT_SERVICE | NOTIFICATION_SERVICE => topics.orders.clone(),
            other => panic!("no service {other}"),
        };
        let dead_letters = topics.dead_letter(&topic, service);
        (topics.group(service), topic, dead_letters)
    }

    /// `POST /v1/orders` with `body` as JSON; returns status and JSON body.
    pub async fn post_order(&self, body: &Value) -> (u16, Value) {
        let response = self
            .http
            .post(self.api_url("/v1/orders"))
            .json(body)
            .send()
            .await
            .expect("order-service answers");
        let status = response.status().as_u16();
        (status, response.json().await.expect("a JSON body"))
    }

    /// Places an order for `quantity` keyboards (1299 cents each); returns its id.
    pub async fn place_order(&self, quantity: i32) -> Uuid {
        let (status, body) = self
            .post_order(&json!({
                "customer_id": "cust-1",
                "items": [{ "product_id": KEYBOARD, "quantity": quantity }],
            }))
            .await;
        assert_eq!(status, 201, "{body}");
        body["id"].as_str().unwrap().parse().unwrap()
    }

    pub async fn get_order(&self, order_id: Uuid) -> Value {
        self.http
            .get(self.api_url(&format!("/v1/orders/{order_id}")))
            .send()
            .await
            .expect("order-service answers")
            .json()
            .await
            .expect("a JSON body")
    }

    /// Waits until the order leaves `pending`; returns it.
    pub async fn settled_order(&self, order_id: Uuid) -> Value {
        eventually(
            SETTLE,
            &format!("order {order_id} to settle"),
            || async move {
                let order = self.get_order(order_id).await;
                (order["status"] != "pending").then_some(order)
            },
        )
        .await
    }

    /// Waits until the customer has been notified about `order_id`; returns how many
    /// notifications exist for it.
    pub async fn notified(&self, order_id: Uuid) -> i64 {
        eventually(
            SETTLE,
            &format!("a notification for {order_id}"),
            || async move {
                let n = self.notifications(order_id).await;
                (n > 0).then_some(n)
            },
        )
        .await
    }

    pub async fn notifications(&self, order_id: Uuid) -> i64 {
        self.notifications_db
            .count(
                "SELECT count(*) FROM notifications WHERE order_id = $1",
                &[&order_id],
            )
            .await
    }

    /// Runs `redrive-dlq` (the workspace binary) on `dead_letter_topic`, with `group`
    /// instead of its own if given; returns what it printed.
    pub async fn redrive(&self, dead_letter_topic: &str, group: Option<&str>) -> String {
        let mut command = Command::new(binary("redrive-dlq"));
        command
            .arg(dead_letter_topic)
            .env("KAFKA_BROKERS", &self.kafka.brokers);
        if let Some(group) = group {
            command.args(["--group", group]);
        }
        let output = command.output().await.expect("redrive-dlq runs");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "redrive-dlq {dead_letter_topic}: {}\n{stdout}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
    }

    /// Produces a copy of the `order.created` order-service published for `order_id`, as
    /// a person with the console producer would: the same bytes, no key.
    pub async fn replay_order_created(&self, order_id: Uuid) {
        let orders = &self.kafka.topics.orders;
        let id = order_id.to_string();
        let created = self
            .kafka
            .read_all(orders)
            .await
            .into_iter()
            .find(|m| saga::kafka::header(m, "event_id").as_deref() == Some(id.as_str()))
            .expect("order.created was published");
        let bytes = rdkafka::Message::payload(&created).expect("a record with a value");
        self.kafka.produce(orders, None, bytes).await;
    }

    /// Waits until `service`'s consumer group has committed everything on `topic`.
    pub async fn caught_up(&self, service: &str, topic: &str) {
        let group = self.kafka.topics.group(service);
        eventually(
            SETTLE,
            &format!("{group} to consume all of {topic}"),
            || async {
                self.kafka
                    .group_caught_up(&group, topic)
                    .await
                    .then_some(())
            },
        )
        .await;
    }
}
