//! Each instance of a service as a process: started with its settings and watched until
//! healthy or dead, signalled, and its log kept under the target folder.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use saga_testkit::eventually;
use tokio::process::Command;

use crate::{ORDER_SERVICE, PAYMENT_SERVICE, SETTLE, Stack, role};

impl Stack {
    /// Starts (or restarts) `service` and waits until `/health` answers 200.
    pub async fn start_service(&mut self, service: &'static str) {
        if let Some(status) = self.start_instance(service, service, None).await {
            panic!("{service} exited before it was healthy: {status}");
        }
    }

    /// Starts (or restarts) one instance of `service` named `instance` (the service's
    /// name for its first instance), with `failpoints` armed if given (see
    /// `saga::failpoint`). Waits until it is healthy, or until it dies first (an armed
    /// failpoint may fire early): then returns how it exited.
    pub async fn start_instance(
        &mut self,
        service: &'static str,
        instance: &str,
        failpoints: Option<&str>,
    ) -> Option<ExitStatus> {
        let database_url = self.database(service).url_as(&role(service));
        let port = *self
            .ports
            .entry(instance.to_owned())
            .or_insert_with(free_port);
        let log = log_file(&self.kafka.namespace, instance);
        let mut command = Command::new(binary(service));
        if let Some(failpoints) = failpoints {
            command.env("FAILPOINTS", failpoints);
        }
        if service == PAYMENT_SERVICE {
            command.env("PROVIDER_URL", self.provider_url());
        }
        let child = command
            .env("DATABASE_URL", &database_url)
            .env("KAFKA_BROKERS", &self.kafka.brokers)
            .env("KAFKA_NAMESPACE", &self.kafka.namespace)
            .env("HTTP_ADDR", format!("127.0.0.1:{port}"))
            // Tests should not wait out the relay's idle poll when a NOTIFY is missed.
            .env("OUTBOX_POLL_INTERVAL_MS", "200")
            .env("RUST_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .envs(
                self.service_env
                    .get(service)
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k, v)),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {instance}: {e}"));
        self.instances.insert(instance.to_owned(), service);
        let url = format!("http://127.0.0.1:{port}/health");
        let http = self.http.clone();
        let child = RefCell::new(child);
        let exited = eventually(SETTLE, &format!("{instance} to be healthy"), || {
            let (http, url) = (http.clone(), url.clone());
            let exited = child
                .borrow_mut()
                .try_wait()
                .expect("the child can be waited on");
            async move {
                if let Some(status) = exited {
                    return Some(Some(status));
                }
                let response = http.get(&url).send().await.ok()?;
                response.status().is_success().then_some(None)
            }
        })
        .await;
        if exited.is_none() {
            self.processes
                .insert(instance.to_owned(), child.into_inner());
        }
        exited
    }

    /// Sends SIGTERM to `service` and waits for it to exit; returns whether it exited
    /// successfully.
    pub async fn terminate_service(&mut self, service: &'static str) -> bool {
        self.terminate_instance(service).await.success()
    }

    /// Sends SIGTERM to `instance` and waits for it to exit; returns how it exited.
    pub async fn terminate_instance(&mut self, instance: &str) -> ExitStatus {
        self.signal_and_wait(instance, "TERM").await
    }

    /// Sends SIGKILL to `instance` and waits for it to be gone.
    pub async fn kill_instance(&mut self, instance: &str) -> ExitStatus {
        self.signal_and_wait(instance, "KILL").await
    }

    /// Sends SIGSTOP to `instance`: it stays connected to everything, and answers
    /// nothing, until [`Stack::thaw_instance`].
    pub async fn freeze_instance(&mut self, instance: &str) {
        self.signal(instance, "STOP").await;
    }

    /// Sends SIGCONT to a frozen `instance`.
    pub async fn thaw_instance(&mut self, instance: &str) {
        self.signal(instance, "CONT").await;
    }

    async fn signal(&mut self, instance: &str, signal: &str) {
        let pid = self
            .processes
            .get(instance)
            .unwrap_or_else(|| panic!("{instance} is not running"))
            .id()
            .expect("the process has not been reaped")
            .to_string();
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .await
            .unwrap();
        assert!(sent.success(), "kill -{signal} {pid}");
    }

    async fn signal_and_wait(&mut self, instance: &str, signal: &str) -> ExitStatus {
        self.signal(instance, signal).await;
        let mut child = self
            .processes
            .remove(instance)
            .expect("signalled, so running");
        tokio::time::timeout(SETTLE, child.wait())
            .await
            .unwrap_or_else(|_| panic!("{instance} did not stop within {SETTLE:?} of SIG{signal}"))
            .unwrap()
    }

    /// How `instance` exited, if it has since it was started (it is then no longer
    /// running); `None` while it runs.
    pub fn exited(&mut self, instance: &str) -> Option<ExitStatus> {
        let status = self
            .processes
            .get_mut(instance)?
            .try_wait()
            .expect("the child can be waited on")?;
        self.processes.remove(instance);
        Some(status)
    }

    /// Whether `instance` answers `/health` with 200 (it reaches its database).
    pub async fn healthy(&self, instance: &str) -> bool {
        let url = format!("http://127.0.0.1:{}/health", self.ports[instance]);
        match self
            .http
            .get(url)
            .timeout(Duration::from_secs(10))
            .send()
            .await
        {
            Ok(response) => response.status().is_success(),
            Err(_) => false,
        }
    }

    /// What `instance` answers at `/readyz`: its status, and its reasons if it is not
    /// ready (none if it did not answer within a second, as a probe would give up).
    pub async fn ready(&self, instance: &str) -> (u16, Option<serde_json::Value>) {
        let url = format!("http://127.0.0.1:{}/readyz", self.ports[instance]);
        match self
            .http
            .get(url)
            .timeout(Duration::from_secs(1))
            .send()
            .await
        {
            Ok(response) => {
                let status = response.status().as_u16();
                (status, response.json().await.ok())
            }
            Err(_) => (0, None),
        }
    }

    /// The instances running now.
    pub fn running(&self) -> Vec<String> {
        let mut running: Vec<String> = self.processes.keys().cloned().collect();
        running.sort();
        running
    }

    /// Every instance ever started, with its service.
    pub fn instances(&self) -> &BTreeMap<String, &'static str> {
        &self.instances
    }

    /// What `instance` (a service's name, for its first instance) has logged so far.
    pub fn log(&self, instance: &str) -> String {
        std::fs::read_to_string(log_path(&self.kafka.namespace, instance)).unwrap_or_default()
    }

    /// Everything every instance of `service` has logged so far.
    pub fn logs_of(&self, service: &str) -> Vec<String> {
        self.instances
            .iter()
            .filter(|(_, s)| **s == service)
            .map(|(instance, _)| self.log(instance))
            .collect()
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// How a process ended, in words: `signal 6 (SIGABRT)` or `exit status 1`.
pub fn describe_exit(status: ExitStatus) -> String {
    match status.signal() {
        Some(6) => "signal 6 (SIGABRT)".to_owned(),
        Some(9) => "signal 9 (SIGKILL)".to_owned(),
        Some(signal) => format!("signal {signal}"),
        None => status.to_string(),
    }
}

/// `service`'s binary, to run alone as a user would and read what it says when it stops
/// at start: no backtrace after its error, whatever the test's shell asks for, and gone
/// with the test.
pub fn as_a_user(service: &str) -> Command {
    let mut command = Command::new(binary(service));
    command
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .stdout(Stdio::null())
        .kill_on_drop(true);
    command
}

/// The service binary next to this test's own target folder.
pub fn binary(service: &str) -> PathBuf {
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

/// Each instance's log goes to `target/e2e-logs/<namespace><instance>.log`, kept for
/// reading after a failure. A restarted instance appends to its log.
fn log_file(namespace: &str, instance: &str) -> std::fs::File {
    let path = log_path(namespace, instance);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap()
}

fn log_path(namespace: &str, instance: &str) -> PathBuf {
    let target = binary(ORDER_SERVICE)
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_owned();
    target
        .join("e2e-logs")
        .join(format!("{namespace}{instance}.log"))
}
