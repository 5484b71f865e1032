//! The services on Kafka's SASL_SSL listener (`scripts/infra-up` gives the single broker
//! one, port 9094, with SCRAM users and a test CA): the saga end to end over it, and the
//! start-up errors a user sees when the login, the certificate or the ACLs are wrong,
//! each naming the `KAFKA_CLIENT_*` setting to fix.
//!
//! Settings, with their defaults as `scripts/lib.sh` has them: `SAGA_TEST_KAFKA_SASL_SSL`
//! (`127.0.0.1:9094`), `KAFKA_SASL_PASSWORD` (`saga-kafka-pw`), and the CA from
//! `$SAGA_RUN_DIR/kafka-tls/ca.pem` (`.run` in the checkout by default).

use std::process::ExitStatus;
use std::time::Duration;

use saga_e2e::{ORDER_SERVICE, Stack, as_a_user, database_name, reader, role, workspace_root};
use saga_testkit::{TestDatabase, TestKafka, eventually};

fn secure_brokers() -> String {
    std::env::var("SAGA_TEST_KAFKA_SASL_SSL").unwrap_or_else(|_| "127.0.0.1:9094".into())
}

fn password() -> String {
    std::env::var("KAFKA_SASL_PASSWORD").unwrap_or_else(|_| "saga-kafka-pw".into())
}

fn ca() -> String {
    let run_dir = std::env::var("SAGA_RUN_DIR")
        .map(Into::into)
        .unwrap_or_else(|_| workspace_root().join(".run"));
    let ca = run_dir.join("kafka-tls/ca.pem");
    assert!(
        ca.exists(),
        "no {} : run scripts/infra-up (and restart a broker it started before the \
         SASL_SSL listener existed)",
        ca.display()
    );
    ca.display().to_string()
}

/// What every service is given to log in as `user` with SCRAM-SHA-512, and the CA.
fn sasl_ssl(user: &str, password: &str) -> Vec<(String, String)> {
    [
        ("KAFKA_BROKERS", secure_brokers()),
        ("KAFKA_CLIENT_SECURITY_PROTOCOL", "SASL_SSL".into()),
        ("KAFKA_CLIENT_SASL_MECHANISM", "SCRAM-SHA-512".into()),
        ("KAFKA_CLIENT_SASL_USERNAME", user.into()),
        ("KAFKA_CLIENT_SASL_PASSWORD", password.into()),
        ("KAFKA_CLIENT_SSL_CA_LOCATION", ca()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

#[tokio::test]
async fn the_saga_confirms_an_order_with_every_service_on_sasl_ssl_scram_sha_512() {
    let env = sasl_ssl("saga", &password());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let stack = Stack::start_with_env(&env).await;

    let order_id = stack.place_order(2).await;

    assert_eq!(stack.settled_order(order_id).await["status"], "confirmed");
    assert_eq!(stack.notified(order_id).await, 1);
}

/// order-service alone, on a database and a namespace of its own (its topics made or
/// not), with `env`.
struct Alone {
    _kafka: Option<TestKafka>,
    _database: TestDatabase,
    child: tokio::process::Child,
    log: std::path::PathBuf,
}

impl Alone {
    async fn start(env: &[(String, String)], topics: bool) -> Self {
        let database =
            TestDatabase::owned_by(&role(ORDER_SERVICE), &reader(database_name(ORDER_SERVICE)))
                .await;
        // Without topics: a namespace no topic has (yet).
        let kafka = if topics {
            Some(TestKafka::new().await)
        } else {
            None
        };
        let namespace = kafka.as_ref().map_or_else(
            || format!("t{}.", &uuid::Uuid::new_v4().simple().to_string()[..12]),
            |k| k.namespace.clone(),
        );
        let log = std::env::temp_dir().join(format!("{namespace}order-service.log"));
        let child = as_a_user(ORDER_SERVICE)
            .env("DATABASE_URL", database.url_as(&role(ORDER_SERVICE)))
            .env("KAFKA_NAMESPACE", &namespace)
            .env("HTTP_ADDR", "127.0.0.1:0")
            .env("RUST_LOG", "info")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("order-service starts (cargo build --bins first)");
        Self {
            _kafka: kafka,
            _database: database,
            child,
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How it exited (within 30 s), and its error line.
    async fn exit(mut self) -> (ExitStatus, String) {
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("still running after 30 s:\n{}", self.log()))
            .unwrap();
        let log = self.log();
        let error = log
            .lines()
            .find(|l| l.starts_with("Error: "))
            .unwrap_or_else(|| panic!("no error line in:\n{log}"))
            .to_owned();
        (status, error)
    }
}

#[tokio::test]
async fn a_wrong_password_stops_a_service_at_start_naming_the_settings() {
    let alone = Alone::start(&sasl_ssl("saga", "not-the-password"), true).await;

    let (status, error) = alone.exit().await;

    assert_eq!(status.code(), Some(1));
    assert_eq!(
        error,
        "Error: Kafka refused the login of saga with SCRAM-SHA-512: check \
         KAFKA_CLIENT_SASL_PASSWORD, KAFKA_CLIENT_SASL_USERNAME and KAFKA_CLIENT_SASL_MECHANISM"
    );
}

#[tokio::test]
async fn an_untrusted_broker_certificate_stops_a_service_at_start_naming_the_ca_setting() {
    // Without a CA of its own the client trusts the system's, which never signed the
    // test broker's certificate.
    let mut env = sasl_ssl("saga", &password());
    env.retain(|(k, _)| k != "KAFKA_CLIENT_SSL_CA_LOCATION");
    let alone = Alone::start(&env, true).await;

    let (status, error) = alone.exit().await;

    assert_eq!(status.code(), Some(1));
    assert_eq!(
        error,
        "Error: Kafka's certificate is not trusted: set KAFKA_CLIENT_SSL_CA_LOCATION to the \
         certificate of the CA that signed the broker's"
    );
}

#[tokio::test]
async fn a_user_denied_by_the_acls_stops_a_service_at_start_naming_the_user_setting() {
    let alone = Alone::start(&sasl_ssl("saga-denied", &password()), true).await;

    let (status, error) = alone.exit().await;

    assert_eq!(status.code(), Some(1));
    assert!(
        error.starts_with(
            "Error: Kafka denies User:saga-denied (KAFKA_CLIENT_SASL_USERNAME) access to topic t"
        ),
        "{error}"
    );
    assert!(
        error.ends_with(
            "payments: grant it Describe, DescribeConfigs, Read and Write on the saga's topics \
             and Read on its consumer groups, or log in as a user who has them"
        ),
        "{error}"
    );
}

#[tokio::test]
async fn sigterm_stops_a_service_waiting_for_its_topics_at_once_and_cleanly() {
    let alone = Alone::start(&sasl_ssl("saga", &password()), false).await;
    eventually(
        Duration::from_secs(30),
        "the wait for the topics",
        || async { alone.log().contains("waiting for the broker").then_some(()) },
    )
    .await;
    let pid = alone.child.id().expect("running");
    let started = std::time::Instant::now();

    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let mut alone = alone;
    let status = tokio::time::timeout(Duration::from_secs(10), alone.child.wait())
        .await
        .expect("exits within 10 s of SIGTERM")
        .unwrap();

    assert!(status.success(), "{status}\n{}", alone.log());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}
