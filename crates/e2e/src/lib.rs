//! A whole saga for one test: the three service binaries, each with a fresh database,
//! sharing a fresh Kafka namespace, started as real processes the way `scripts/up` starts
//! them. Tests drive it through the HTTP API and raw Kafka records, and read the
//! databases to check effects.
//!
//! The binaries must be built first (`cargo build --bins`; `scripts/test` does it).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use saga_testkit::{TestDatabase, TestKafka, eventually};
use serde_json::{Value, json};
use tokio::process::{Child, Command};
use uuid::Uuid;

pub const ORDER_SERVICE: &str = "order-service";
pub const PAYMENT_SERVICE: &str = "payment-service";
pub const NOTIFICATION_SERVICE: &str = "notification-service";

/// The product of the README's example order: 1299 cents.
pub const KEYBOARD: &str = "8f14e45f-ceea-4c9d-b2a5-0c1e3f4a9b21";

/// How long the saga may take to settle in a test; generous for a loaded 2-core machine.
pub const SETTLE: Duration = Duration::from_secs(60);

pub struct Stack {
    pub kafka: TestKafka,
    pub orders_db: TestDatabase,
    pub payments_db: TestDatabase,
    pub notifications_db: TestDatabase,
    processes: HashMap<&'static str, Child>,
    ports: HashMap<&'static str, u16>,
    http: reqwest::Client,
}

impl Stack {
    /// Starts all three services and waits until each reports healthy.
    pub async fn start() -> Self {
        let (kafka, orders_db, payments_db, notifications_db) = tokio::join!(
            TestKafka::new(),
            TestDatabase::empty(),
            TestDatabase::empty(),
            TestDatabase::empty()
        );
        let mut stack = Self {
            kafka,
            orders_db,
            payments_db,
            notifications_db,
            processes: HashMap::new(),
            ports: HashMap::new(),
            http: reqwest::Client::new(),
        };
        for service in [ORDER_SERVICE, PAYMENT_SERVICE, NOTIFICATION_SERVICE] {
            stack.start_service(service).await;
        }
        stack
    }

    /// Starts (or restarts) `service` and waits until `/health` answers 200.
    pub async fn start_service(&mut self, service: &'static str) {
        let database = match service {
            ORDER_SERVICE => &self.orders_db,
            PAYMENT_SERVICE => &self.payments_db,
            NOTIFICATION_SERVICE => &self.notifications_db,
            other => panic!("no service {other}"),
        };
        let port = *self.ports.entry(service).or_insert_with(free_port);
        let log = log_file(&self.kafka.namespace, service);
        let child = Command::new(binary(service))
            .env("DATABASE_URL", &database.url)
            .env("KAFKA_BROKERS", &self.kafka.brokers)
            .env("KAFKA_NAMESPACE", &self.kafka.namespace)
            .env("HTTP_ADDR", format!("127.0.0.1:{port}"))
            // Tests should not wait out the relay's idle poll when a NOTIFY is missed.
            .env("OUTBOX_POLL_INTERVAL_MS", "200")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {service}: {e}"));
        self.processes.insert(service, child);
        let url = format!("http://127.0.0.1:{port}/health");
        let http = self.http.clone();
        eventually(SETTLE, &format!("{service} to be healthy"), || {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let response = http.get(&url).send().await.ok()?;
                response.status().is_success().then_some(())
            }
        })
        .await;
    }

    /// Sends SIGTERM to `service` and waits for it to exit; returns whether it exited
    /// successfully.
    pub async fn terminate_service(&mut self, service: &'static str) -> bool {
        let mut child = self.processes.remove(service).expect("the service runs");
        let pid = child
            .id()
            .expect("the process has not been reaped")
            .to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await
            .unwrap();
        assert!(sent.success(), "kill -TERM {pid}");
        let status = tokio::time::timeout(SETTLE, child.wait())
            .await
            .unwrap_or_else(|_| panic!("{service} did not stop within {SETTLE:?} of SIGTERM"))
            .unwrap();
        status.success()
    }

    /// What `service` has logged so far.
    pub fn log(&self, service: &str) -> String {
        std::fs::read_to_string(log_path(&self.kafka.namespace, service)).unwrap_or_default()
    }

    pub fn api_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.ports[ORDER_SERVICE])
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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// The service binary next to this test's own target folder.
fn binary(service: &str) -> PathBuf {
    let test_exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/<test> -> target/<profile>/<service>
    let path = test_exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lives in target/<profile>/deps")
        .join(service);
    assert!(
        path.exists(),
        "{} not found: build the services first (`cargo build --bins`, as scripts/test does)",
        path.display()
    );
    path
}

/// Each service's log goes to `target/e2e-logs/<namespace><service>.log`, kept for
/// reading after a failure. A restarted service appends to its log.
fn log_file(namespace: &str, service: &str) -> std::fs::File {
    let path = log_path(namespace, service);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap()
}

fn log_path(namespace: &str, service: &str) -> PathBuf {
    let target = binary(service)
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_owned();
    target
        .join("e2e-logs")
        .join(format!("{namespace}{service}.log"))
}
