//! The services on Kafka's SASL_SSL listener (`scripts/infra-up` gives the single broker
//! one, port 9094, with SCRAM and PLAIN logins and a test CA), each logging in as a user
//! of its own with the ACLs of the chart's example (`deploy/helm/examples/kafka-users.yaml`)
//! and no more: the saga end to end over it, and the start-up errors a user sees when the
//! login, the certificate or one ACL is wrong, each naming what to fix.
//!
//! Settings, with their defaults as `scripts/lib.sh` has them: `SAGA_TEST_KAFKA_SASL_SSL`
//! (`127.0.0.1:9094`), `KAFKA_SASL_PASSWORD` (`saga-kafka-pw`), and the CA from
//! `$SAGA_RUN_DIR/kafka-tls/ca.pem` (`.run` in the checkout by default).

use std::process::ExitStatus;
use std::time::Duration;

use saga_e2e::kafka_users::Granted;
use saga_e2e::{
    ORDER_SERVICE, SERVICES, Stack, as_a_user, database_name, reader, role, workspace_root,
};
use saga_testkit::{TestDatabase, TestKafka, eventually, kafka_brokers, topic_partitions};

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

/// What a service is given to log in as `user` with `mechanism`, and the CA.
fn sasl_ssl(user: &str, password: &str, mechanism: &str) -> Vec<(String, String)> {
    [
        ("KAFKA_BROKERS", secure_brokers()),
        ("KAFKA_CLIENT_SECURITY_PROTOCOL", "SASL_SSL".into()),
        ("KAFKA_CLIENT_SASL_MECHANISM", mechanism.into()),
        ("KAFKA_CLIENT_SASL_USERNAME", user.into()),
        ("KAFKA_CLIENT_SASL_PASSWORD", password.into()),
        ("KAFKA_CLIENT_SSL_CA_LOCATION", ca()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// The saga with each service logged in with `mechanism` as the user of its name, which
/// may do on this stack's namespace what the chart's example user may.
async fn confirms_an_order_as_least_privileged_users(mechanism: &str) {
    let mut stack = Stack::prepare(&[], topic_partitions()).await;
    let _granted = Granted::grant(&stack.kafka.brokers, &stack.kafka.namespace, &[]).await;
    for service in SERVICES {
        stack.set_service_env(service, sasl_ssl(service, &password(), mechanism));
    }
    stack.start_all(&[]).await;

    let order_id = stack.place_order(2).await;

    assert_eq!(stack.settled_order(order_id).await["status"], "confirmed");
    assert_eq!(stack.notified(order_id).await, 1);
}

#[tokio::test]
async fn each_service_as_its_least_privileged_user_confirms_an_order_over_scram_sha_512() {
    confirms_an_order_as_least_privileged_users("SCRAM-SHA-512").await;
}

/// PLAIN is Confluent Cloud's mechanism (over TLS, as here).
#[tokio::test]
async fn each_service_as_its_least_privileged_user_confirms_an_order_over_plain() {
    confirms_an_order_as_least_privileged_users("PLAIN").await;
}

/// Where order-service alone runs: a namespace with the chart's example users' ACLs
/// granted and no topic (yet), or its topics made, with those ACLs granted but those of
/// `without`, or none.
enum Topics<'a> {
    NotYet,
    Made,
    Granted { without: &'a [&'a str] },
}

/// order-service alone, on a database and a namespace of its own, with `env`.
struct Alone {
    namespace: String,
    // Revoked before the topics go.
    _granted: Option<Granted>,
    _kafka: Option<TestKafka>,
    _database: TestDatabase,
    child: tokio::process::Child,
    log: std::path::PathBuf,
}

impl Alone {
    async fn start(env: &[(String, String)], topics: Topics<'_>) -> Self {
        let database =
            TestDatabase::owned_by(&role(ORDER_SERVICE), &reader(database_name(ORDER_SERVICE)))
                .await;
        let kafka = match topics {
            Topics::NotYet => None,
            Topics::Made | Topics::Granted { .. } => Some(TestKafka::new().await),
        };
        let namespace = kafka.as_ref().map_or_else(
            || format!("t{}.", &uuid::Uuid::new_v4().simple().to_string()[..12]),
            |k| k.namespace.clone(),
        );
        let granted = match topics {
            Topics::NotYet => Some(Granted::grant(&kafka_brokers(), &namespace, &[]).await),
            Topics::Granted { without } => {
                Some(Granted::grant(&kafka_brokers(), &namespace, without).await)
            }
            Topics::Made => None,
        };
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
            namespace,
            _granted: granted,
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
    async fn exit(self) -> (ExitStatus, String) {
        let (status, error, _) = self.exit_with_log().await;
        (status, error)
    }

    /// How it exited (within 30 s), its error line, and its whole log.
    async fn exit_with_log(mut self) -> (ExitStatus, String, String) {
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
        (status, error, log)
    }
}

/// order-service's login as the user of its name with SCRAM-SHA-512.
fn as_order_service() -> Vec<(String, String)> {
    sasl_ssl(ORDER_SERVICE, &password(), "SCRAM-SHA-512")
}

#[tokio::test]
async fn a_wrong_password_stops_a_service_at_start_naming_the_settings() {
    let alone = Alone::start(
        &sasl_ssl(ORDER_SERVICE, "not-the-password", "SCRAM-SHA-512"),
        Topics::Made,
    )
    .await;

    let (status, error) = alone.exit().await;

    assert_eq!(status.code(), Some(1));
    assert_eq!(
        error,
        "Error: Kafka refused the login of order-service with SCRAM-SHA-512: check \
         KAFKA_CLIENT_SASL_PASSWORD, KAFKA_CLIENT_SASL_USERNAME and KAFKA_CLIENT_SASL_MECHANISM"
    );
}

#[tokio::test]
async fn an_untrusted_broker_certificate_stops_a_service_at_start_naming_the_ca_setting() {
    // Without a CA of its own the client trusts the system's, which never signed the
    // test broker's certificate.
    let mut env = as_order_service();
    env.retain(|(k, _)| k != "KAFKA_CLIENT_SSL_CA_LOCATION");
    let alone = Alone::start(&env, Topics::Granted { without: &[] }).await;

    let (status, error) = alone.exit().await;

    assert_eq!(status.code(), Some(1));
    assert_eq!(
        error,
        "Error: Kafka's certificate is not trusted: set KAFKA_CLIENT_SSL_CA_LOCATION to the \
         certificate of the CA that signed the broker's"
    );
}

#[tokio::test]
async fn a_user_denied_everything_stops_a_service_at_start_naming_every_acl_it_needs() {
    let alone = Alone::start(
        &sasl_ssl("saga-denied", &password(), "SCRAM-SHA-512"),
        Topics::Made,
    )
    .await;
    let namespace = alone.namespace.clone();

    let (status, error) = alone.exit().await;

    assert_eq!(status.code(), Some(1));
    assert_eq!(
        error,
        format!(
            "Error: Kafka denies User:saga-denied (KAFKA_CLIENT_SASL_USERNAME) Read on topic \
             {namespace}payments, DescribeConfigs on topic {namespace}payments, Read on group \
             {namespace}order-service, Write on topic {namespace}orders, Write on topic \
             {namespace}payments.order-service.dlq, DescribeConfigs on topic \
             {namespace}payments.order-service.dlq: {GRANT}"
        )
    );
}

/// How every start-up refusal for a missing ACL ends.
const GRANT: &str = "grant the user these ACLs (each service's are in docs/cluster.md), or log in as one who \
     has them";

/// Each ACL of order-service's example user that no other implies (Read and Write imply
/// Describe), the example's name for it, and the resource as the refusal names it.
const ONE_ACL_SHORT: [(&str, &str); 7] = [
    (
        "order-service:topic:payments:Read",
        "Read on topic {}payments",
    ),
    (
        "order-service:topic:payments:DescribeConfigs",
        "DescribeConfigs on topic {}payments",
    ),
    (
        "order-service:group:order-service:Read",
        "Read on group {}order-service",
    ),
    (
        "order-service:topic:orders:Write",
        "Write on topic {}orders",
    ),
    (
        "order-service:topic:payments.order-service.dlq:Write",
        "Write on topic {}payments.order-service.dlq",
    ),
    (
        "order-service:topic:payments.order-service.dlq:DescribeConfigs",
        "DescribeConfigs on topic {}payments.order-service.dlq",
    ),
    (
        "order-service:transactionalId:order-service.outbox-relay:Write",
        "Write on transactionalId {}order-service.outbox-relay",
    ),
];

/// The chart's example user less any one of its ACLs is refused at start, and told which:
/// none of them is one the service could do without, and none is found missing only at
/// the first publish or the first dead letter. The relay's transactional id is checked by
/// its `init_transactions`, which fails the service a moment after it started.
// Threads of their own: each run's revoke, when it is dropped, blocks on a JVM.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_user_one_acl_short_stops_a_service_at_start_naming_that_acl() {
    let mut runs = tokio::task::JoinSet::new();
    for (without, named) in ONE_ACL_SHORT {
        runs.spawn(async move {
            let alone = Alone::start(
                &as_order_service(),
                Topics::Granted {
                    without: &[without],
                },
            )
            .await;
            let namespace = alone.namespace.clone();
            let (status, _, log) = alone.exit_with_log().await;
            let named = named.replace("{}", &namespace);
            (without, status, log, named)
        });
    }

    while let Some(run) = runs.join_next().await {
        let (without, status, log, named) = run.unwrap();
        assert_eq!(status.code(), Some(1), "without {without}:\n{log}");
        let refusal = format!(
            "Kafka denies User:order-service (KAFKA_CLIENT_SASL_USERNAME) {named}: {GRANT}"
        );
        assert!(
            log.lines()
                .any(|line| line.trim_start().trim_start_matches("Error: ") == refusal),
            "without {without}, no line {refusal:?} in:\n{log}"
        );
    }
}

#[tokio::test]
async fn sigterm_stops_a_service_waiting_for_its_topics_at_once_and_cleanly() {
    let alone = Alone::start(&as_order_service(), Topics::NotYet).await;
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
