//! Nobody reaches what is not theirs: each service's role against the databases
//! `scripts/infra-up` made (`deploy/postgres/service-database.psql`), each database's
//! read-only role, passwords kept out of logs, errors and `--help`, and everything that
//! listens natively doing so on loopback alone.

use std::time::Duration;

use regex::Regex;
use saga_e2e::{
    NOTIFICATION_SERVICE, ORDER_SERVICE, PAYMENT_PROVIDER, PAYMENT_SERVICE, SERVICES, Stack,
    as_a_user, binary, database_name, reader, role,
};
use saga_testkit::{native_url, role_password};
use tokio_postgres::error::SqlState;

const ALL: [&str; 4] = [
    ORDER_SERVICE,
    PAYMENT_SERVICE,
    NOTIFICATION_SERVICE,
    PAYMENT_PROVIDER,
];

async fn connect(
    role: &str,
    database: &str,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    saga::db::connect(&saga::db::parse_url(&native_url(role, database)).unwrap())
        .await
        .map_err(|error| match error {
            saga::db::DbError::Connect(error) => error,
            other => panic!("{role} on {database}: {other}"),
        })
}

#[tokio::test]
async fn each_service_role_reaches_its_own_database_alone_and_can_create_no_database() {
    for service in ALL {
        let role = role(service);
        for other in ALL {
            let database = database_name(other);
            let connected = connect(&role, database).await;
            if other == service {
                let client = connected.unwrap_or_else(|e| panic!("{role} on {database}: {e}"));
                let owner: String = client
                    .query_one(
                        "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = $1",
                        &[&database],
                    )
                    .await
                    .unwrap()
                    .get(0);
                assert_eq!(owner, role, "{database} is owned by another role");
                let privileges = client
                    .query_one(
                        "SELECT rolsuper, rolcreatedb, rolcreaterole FROM pg_roles WHERE rolname = $1",
                        &[&role],
                    )
                    .await
                    .unwrap();
                assert_eq!(
                    (privileges.get(0), privileges.get(1), privileges.get(2)),
                    (false, false, false),
                    "{role}: superuser, CREATEDB, CREATEROLE"
                );
                for statement in [
                    "CREATE DATABASE saga_test_not_allowed".to_owned(),
                    "CREATE ROLE saga_test_not_allowed".to_owned(),
                    format!(
                        "GRANT CONNECT ON DATABASE {} TO {role}",
                        database_name(if service == ORDER_SERVICE {
                            PAYMENT_SERVICE
                        } else {
                            ORDER_SERVICE
                        })
                    ),
                ] {
                    let refused = client.batch_execute(&statement).await.unwrap_err();
                    assert_eq!(
                        refused.code(),
                        Some(&SqlState::INSUFFICIENT_PRIVILEGE),
                        "{role}: {statement}: {refused:?}"
                    );
                }
            } else {
                let refused = connected.err().unwrap_or_else(|| {
                    panic!("{role} connected to {database}, another service's database")
                });
                assert_eq!(
                    refused.code(),
                    Some(&SqlState::INSUFFICIENT_PRIVILEGE),
                    "{role} on {database}: {refused:?}"
                );
            }
        }
    }
}

#[tokio::test]
async fn each_reader_reads_its_own_database_alone_and_writes_nothing() {
    for service in ALL {
        let database = database_name(service);
        let reader = reader(database);
        for other in ALL {
            let connected = connect(&reader, database_name(other)).await;
            if other != service {
                let refused = connected
                    .err()
                    .unwrap_or_else(|| panic!("{reader} connected to {}", database_name(other)));
                assert_eq!(refused.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE));
                continue;
            }
            let client = connected.unwrap_or_else(|e| panic!("{reader} on {database}: {e}"));
            // A table the service makes, as its migrations do: the reader reads it.
            let owner = connect(&role(service), database).await.unwrap();
            owner
                .batch_execute(&format!(
                    "DROP TABLE IF EXISTS {PROBE}; CREATE TABLE {PROBE} (x int); \
                     INSERT INTO {PROBE} VALUES (1), (2)"
                ))
                .await
                .unwrap_or_else(|e| {
                    panic!("{} cannot make a table in {database}: {e}", role(service))
                });
            let rows: i64 = client
                .query_one(&format!("SELECT count(*) FROM {PROBE}"), &[])
                .await
                .unwrap_or_else(|e| panic!("{reader} cannot read {database}: {e}"))
                .get(0);
            assert_eq!(rows, 2);
            // Read-only by default; and by privilege once a session turns that off.
            let refused = client
                .batch_execute(&format!("DELETE FROM {PROBE}"))
                .await
                .unwrap_err();
            assert_eq!(refused.code(), Some(&SqlState::READ_ONLY_SQL_TRANSACTION));
            client
                .batch_execute("SET default_transaction_read_only = off")
                .await
                .unwrap();
            for statement in [
                format!("DELETE FROM {PROBE}"),
                format!("INSERT INTO {PROBE} VALUES (3)"),
                "CREATE TABLE saga_test_not_allowed (x int)".to_owned(),
                "CREATE TEMPORARY TABLE saga_test_not_allowed (x int)".to_owned(),
            ] {
                let refused = client.batch_execute(&statement).await.unwrap_err();
                assert_eq!(
                    refused.code(),
                    Some(&SqlState::INSUFFICIENT_PRIVILEGE),
                    "{reader}: {statement}: {refused:?}"
                );
            }
            owner
                .batch_execute(&format!("DROP TABLE {PROBE}"))
                .await
                .unwrap();
        }
    }
}

/// The table the reader test makes in each service's database, and drops.
const PROBE: &str = "saga_test_privileges_probe";

#[tokio::test]
async fn no_password_shows_in_a_log_an_error_or_the_help() {
    let stack = Stack::start().await;
    let order_id = stack.place_order(2).await;
    assert_eq!(stack.settled_order(order_id).await["status"], "confirmed");
    stack.notified(order_id).await;
    for service in ALL {
        let password = role_password(&role(service));
        let log = stack.log(service);
        assert!(!log.is_empty(), "{service} logged nothing");
        assert!(
            !log.contains(&password),
            "{service}'s log shows its database password"
        );
    }

    let password = "not-the-password-5f0c2a";
    let wrong = stack
        .database(ORDER_SERVICE)
        .url_as(&role(ORDER_SERVICE))
        .replace(&role_password(&role(ORDER_SERVICE)), password);

    let help = std::process::Command::new(binary(ORDER_SERVICE))
        .arg("--help")
        .env("DATABASE_URL", &wrong)
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("DATABASE_URL"), "{help}");
    assert!(
        !help.contains(password),
        "--help shows DATABASE_URL's value:\n{help}"
    );

    // sagactl's defaults are the readers' URLs: --help names the roles, not passwords.
    let help = std::process::Command::new(binary("sagactl"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("orders_reader"), "{help}");
    for service in ALL {
        let reader = reader(database_name(service));
        assert!(
            !help.contains(&role_password(&reader)),
            "sagactl --help shows {reader}'s password:\n{help}"
        );
    }

    // A service refused by its database says so, and names no password.
    let log = std::env::temp_dir().join(format!("{}-wrong-password.log", stack.kafka.namespace));
    let mut service = as_a_user(ORDER_SERVICE)
        .env("DATABASE_URL", &wrong)
        .env("KAFKA_BROKERS", &stack.kafka.brokers)
        .env("KAFKA_NAMESPACE", &stack.kafka.namespace)
        .env("HTTP_ADDR", "127.0.0.1:0")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // It is a setting to fix, not an outage to wait out: the service stops at once.
    let exited = tokio::time::timeout(Duration::from_secs(60), service.wait())
        .await
        .expect("a service refused by its database exits")
        .unwrap();
    assert!(!exited.success());
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("password authentication failed"), "{said}");
    assert!(said.contains(&role(ORDER_SERVICE)), "{said}");
    assert!(
        !said.contains(password),
        "the error shows the password:\n{said}"
    );
}

#[test]
fn everything_listening_natively_does_so_on_loopback() {
    // PostgreSQL's listener and the brokers' of the mode the tests run on (the single
    // broker's, deploy/kafka/server.properties, or with SAGA_KAFKA_BROKERS=3 the three
    // nodes' of cluster.properties), as scripts/infra-up started them; the services'
    // defaults, from their own --help.
    let kafka: &[u16] = if std::env::var("SAGA_KAFKA_BROKERS").as_deref() == Ok("3") {
        &[9192, 9193, 9292, 9293, 9392, 9393]
    } else {
        &[9092, 9093]
    };
    let ports: Vec<u16> = std::iter::once(5432).chain(kafka.iter().copied()).collect();
    let mut seen = Vec::new();
    for (table, loopback) in [
        ("/proc/net/tcp", &["0100007F"][..]),
        // ::1, and ::ffff:127.0.0.1 (Java's IPv4 listeners on a dual-stack socket).
        (
            "/proc/net/tcp6",
            &[
                "00000000000000000000000001000000",
                "0000000000000000FFFF00000100007F",
            ][..],
        ),
    ] {
        for line in std::fs::read_to_string(table).unwrap().lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (address, port) = fields[1].split_once(':').unwrap();
            let port = u16::from_str_radix(port, 16).unwrap();
            // 0A: LISTEN.
            if fields[3] == "0A" && ports.contains(&port) {
                assert!(
                    loopback.contains(&address),
                    "port {port} listens on {address} in {table}, not loopback alone"
                );
                seen.push(port);
            }
        }
    }
    for port in ports {
        assert!(
            seen.contains(&port),
            "nothing listens on {port}: is scripts/infra-up's setup running?"
        );
    }

    let binaries = SERVICES
        .into_iter()
        .chain([PAYMENT_PROVIDER])
        .map(|service| (service, vec!["--help"], "HTTP_ADDR"))
        .chain([("sagactl", vec!["serve", "--help"], "SAGACTL_ADDR")]);
    for (binary_name, args, variable) in binaries {
        let help = std::process::Command::new(binary(binary_name))
            .args(args)
            .env_clear()
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&help.stdout);
        let pattern = Regex::new(&format!(
            r"\[env: {variable}=?[^\]]*\]\s*\[default: ([^\]]*)\]"
        ))
        .unwrap();
        let default = pattern
            .captures(&help)
            .map(|c| c[1].to_owned())
            .unwrap_or_else(|| panic!("{binary_name} --help shows no {variable} default:\n{help}"));
        assert!(
            default.starts_with("127.0.0.1:"),
            "{binary_name} listens on {default} by default"
        );
    }
}
