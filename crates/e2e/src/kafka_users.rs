//! The Kafka users of the chart's example (`deploy/helm/examples/kafka-users.yaml`, one
//! per service, each with the ACLs its code needs), granted on a test's namespace through
//! `scripts/kafka-tool users`, so that a test logs in with exactly the rights a deployment
//! gives. The single broker of `scripts/infra-up` has their logins (SCRAM and PLAIN).

use std::process::Command;

use crate::workspace_root;

/// The example's file, relative to the checkout.
pub const KAFKA_USERS_FILE: &str = "deploy/helm/examples/kafka-users.yaml";

/// ACLs granted on one namespace; revoked when dropped.
pub struct Granted {
    brokers: String,
    namespace: String,
}

impl Granted {
    /// Grants every ACL of the example on `namespace` through `brokers` (a listener whose
    /// user may, the PLAINTEXT one), but those of `without`, each
    /// `USER:TYPE:NAME:OPERATION` as the file names it
    /// (`order-service:topic:payments:Read`).
    pub async fn grant(brokers: &str, namespace: &str, without: &[&str]) -> Self {
        let granted = Self {
            brokers: brokers.to_owned(),
            namespace: namespace.to_owned(),
        };
        let (brokers, namespace) = (granted.brokers.clone(), granted.namespace.clone());
        let without: Vec<String> = without.iter().map(|w| (*w).to_owned()).collect();
        // A JVM's start: off the test's runtime, which may have one thread.
        tokio::task::spawn_blocking(move || run(&brokers, "grant", &namespace, &without))
            .await
            .expect("the grant ran");
        granted
    }
}

impl Drop for Granted {
    fn drop(&mut self) {
        run::<&str>(&self.brokers, "revoke", &self.namespace, &[]);
    }
}

fn run<W: AsRef<std::ffi::OsStr>>(brokers: &str, what: &str, namespace: &str, without: &[W]) {
    let root = workspace_root();
    let output = Command::new(root.join("scripts/kafka-tool"))
        .args(["users", brokers, what, namespace])
        .arg(root.join(KAFKA_USERS_FILE))
        .args(without)
        .output()
        .expect("scripts/kafka-tool runs");
    assert!(
        output.status.success() || std::thread::panicking(),
        "kafka-tool users {what} {namespace}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}
