//! TLS to PostgreSQL as an operator would set it: the saga with every service's
//! database URL, read from a file as a mounted secret is, on `sslmode=verify-full` against the test CA `scripts/infra-up` made,
//! the server seeing each session encrypted; a server certificate from a CA the service
//! does not trust stopping it at start-up with the setting to fix; and `verify-ca`
//! taking a certificate that does not name the host, which `verify-full` refuses.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use saga_e2e::{
    NOTIFICATION_SERVICE, ORDER_SERVICE, PAYMENT_PROVIDER, PAYMENT_SERVICE, SETTLE, Stack,
    as_a_user, binary, describe_exit, role, workspace_root,
};
use saga_testkit::{eventually, native_url, postgres_admin_url, postgres_ca_file};
use tokio::process::{Child, Command};

/// The provider first: payment-service calls it.
const ALL: [&str; 4] = [
    PAYMENT_PROVIDER,
    ORDER_SERVICE,
    PAYMENT_SERVICE,
    NOTIFICATION_SERVICE,
];

fn with_tls(url: &str, mode: &str, root: &Path) -> String {
    format!("{url}?sslmode={mode}&sslrootcert={}", root.display())
}

/// `service` on the stack's database, Kafka namespace and port, with `database_url` in
/// the file `DATABASE_URL_FILE` names.
fn spawn(stack: &Stack, service: &'static str, database_url: &str) -> Child {
    let addr = stack
        .url_of(service)
        .trim_start_matches("http://")
        .to_owned();
    let logs = workspace_root().join("target/e2e-logs");
    std::fs::create_dir_all(&logs).unwrap();
    let log =
        std::fs::File::create(logs.join(format!("{}{service}-tls.log", stack.kafka.namespace)))
            .unwrap();
    // From a file, as a mounted secret gives it.
    let secret = logs.join(format!("{}{service}-database-url", stack.kafka.namespace));
    std::fs::write(&secret, format!("{database_url}\n")).unwrap();
    let mut command = Command::new(binary(service));
    if service == PAYMENT_SERVICE {
        command.env("PROVIDER_URL", stack.provider_url());
    }
    command
        .env("DATABASE_URL_FILE", &secret)
        .env("KAFKA_BROKERS", &stack.kafka.brokers)
        .env("KAFKA_NAMESPACE", &stack.kafka.namespace)
        .env("HTTP_ADDR", addr)
        .env("OUTBOX_POLL_INTERVAL_MS", "200")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {service}: {e}"))
}

async fn healthy(stack: &Stack, service: &str, child: &mut Child) {
    let url = format!("{}/health", stack.url_of(service));
    let http = reqwest::Client::new();
    eventually(SETTLE, &format!("{service} on TLS to be healthy"), || {
        let exited = child.try_wait().expect("the child can be waited on");
        assert!(exited.is_none(), "{service} exited: {exited:?}");
        let (http, url) = (http.clone(), url.clone());
        async move {
            let response = http.get(&url).send().await.ok()?;
            response.status().is_success().then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn the_saga_runs_with_every_service_on_verify_full_and_every_session_encrypted() {
    let ca = postgres_ca_file();
    let mut stack = Stack::start().await;
    // The same ports, databases and topics, each service now on TLS.
    for service in ALL {
        assert!(stack.terminate_service(service).await, "{service} stops");
    }
    let mut running = Vec::new();
    for service in ALL {
        let url = stack.database(service).url_as(&role(service));
        let mut child = spawn(&stack, service, &with_tls(&url, "verify-full", &ca));
        healthy(&stack, service, &mut child).await;
        running.push(child);
    }

    let order_id = stack.place_order(1).await;
    assert_eq!(stack.settled_order(order_id).await["status"], "confirmed");
    assert_eq!(stack.notified(order_id).await, 1);

    for service in ALL {
        let db = stack.database(service);
        let sessions = "FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) \
                        WHERE usename = $1 AND datname = current_database()";
        let role = role(service);
        let all = db
            .count(&format!("SELECT count(*) {sessions}"), &[&role])
            .await;
        let encrypted = db
            .count(&format!("SELECT count(*) {sessions} AND ssl"), &[&role])
            .await;
        assert!(all > 0, "{service} has sessions open");
        assert_eq!(encrypted, all, "{service}'s sessions encrypted");
    }
}

/// A CA of the test's own, which signed nothing the server holds.
fn untrusted_ca(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let cert = dir.join("untrusted-ca.crt");
    let made = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
        .args(["-subj", "/CN=untrusted test CA", "-keyout"])
        .arg(dir.join("untrusted-ca.key"))
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl runs");
    assert!(made.status.success(), "{made:?}");
    cert
}

#[tokio::test]
async fn a_server_certificate_from_an_untrusted_ca_stops_a_service_at_start_up() {
    let dir = std::env::temp_dir().join(format!("saga-tls-{}", uuid::Uuid::new_v4()));
    let ca = untrusted_ca(&dir);
    let url = with_tls(
        &native_url(&role(ORDER_SERVICE), "orders"),
        "verify-full",
        &ca,
    );
    let child = as_a_user(ORDER_SERVICE)
        .env("DATABASE_URL", &url)
        .env("KAFKA_BROKERS", saga_testkit::kafka_brokers())
        .env("HTTP_ADDR", "127.0.0.1:0")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Classed as transient, the refusal would have it wait for the database forever.
    let exited = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("order-service stops instead of waiting")
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    let stderr = String::from_utf8_lossy(&exited.stderr);
    assert_eq!(
        describe_exit(exited.status),
        "exit status: 1",
        "stderr:\n{stderr}"
    );
    let expected = format!(
        "Error: cannot migrate the database\n\nCaused by:\n    cannot connect to PostgreSQL: \
         TLS handshake refused: certificate verify failed (unable to get local issuer \
         certificate) (DATABASE_URL's sslmode=verify-full, sslrootcert={})",
        ca.display()
    );
    assert!(
        stderr.trim_end().ends_with(&expected),
        "expected it to end with:\n{expected}\n\nstderr:\n{stderr}"
    );
}

#[tokio::test]
async fn verify_ca_takes_a_certificate_for_another_host_name_that_verify_full_refuses() {
    // Connected to 127.0.0.1 as `hostaddr`, the name checked is `host`'s, which the
    // server's certificate (localhost, 127.0.0.1) does not hold.
    let admin = saga::db::parse_url(&postgres_admin_url()).unwrap();
    let url = |mode| {
        format!(
            "postgres://{}:{}@db.invalid:{}/postgres?hostaddr=127.0.0.1&sslmode={mode}&sslrootcert={}",
            admin.get_user().unwrap(),
            String::from_utf8_lossy(admin.get_password().unwrap()),
            admin.get_ports().first().copied().unwrap_or(5432),
            postgres_ca_file().display()
        )
    };

    let config = saga::db::parse_url(&url("verify-ca")).unwrap();
    let client = saga::db::connect(&config)
        .await
        .expect("verify-ca connects");
    let ssl: bool = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(ssl, "the session is encrypted");

    let config = saga::db::parse_url(&url("verify-full")).unwrap();
    let Err(refused) = saga::db::connect(&config).await else {
        panic!("verify-full refuses a certificate that does not name the host");
    };
    assert_eq!(
        refused.to_string(),
        format!(
            "cannot connect to PostgreSQL: TLS handshake refused: certificate verify failed \
             (hostname mismatch) (DATABASE_URL's sslmode=verify-full, sslrootcert={})",
            postgres_ca_file().display()
        )
    );
}
