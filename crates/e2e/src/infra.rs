//! The shared infrastructure, handled the way an operator would: the Kafka broker and the
//! PostgreSQL cluster stopped and started again, and the stock `kafka-consumer-groups`
//! tool. Stopping either server affects everything on this machine, so only the fault
//! suite, run on its own (`scripts/faults`), may use [`Outage`].

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use saga_testkit::eventually;

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The run folder of `scripts/infra-up` (pid files), as `scripts/lib.sh` derives it.
fn run_dir() -> PathBuf {
    std::env::var_os("SAGA_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".run"))
}

/// One server taken down on purpose. While it is down, dropping this (a failed
/// assertion, say) brings everything back with `scripts/infra-up`, so whatever runs next
/// finds the infrastructure up.
pub struct Outage {
    what: &'static str,
    down_since: Instant,
    restored: bool,
}

impl Outage {
    /// Kills the Kafka broker that `scripts/infra-up` started (SIGKILL: a crash, not a
    /// clean shutdown) and waits until the process is gone.
    pub async fn kill_broker() -> Self {
        let pid_file = run_dir().join("kafka.pid");
        let pid = std::fs::read_to_string(&pid_file)
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {e}; the broker must be one scripts/infra-up started",
                    pid_file.display()
                )
            })
            .trim()
            .to_owned();
        let outage = Self {
            what: "the Kafka broker",
            down_since: Instant::now(),
            restored: false,
        };
        run("kill", &["-KILL", &pid]);
        let proc = PathBuf::from(format!("/proc/{pid}"));
        eventually(
            Duration::from_secs(30),
            "the broker process to be gone",
            || {
                let gone = !proc.exists();
                async move { gone.then_some(()) }
            },
        )
        .await;
        outage
    }

    /// Stops the PostgreSQL cluster serving the tests (`pg_ctlcluster … stop`, fast
    /// mode: sessions are cut, as in a failover) and waits until it no longer answers.
    pub async fn stop_postgres() -> Self {
        let (version, cluster) = postgres_cluster();
        let outage = Self {
            what: "PostgreSQL",
            down_since: Instant::now(),
            restored: false,
        };
        run(
            "pg_ctlcluster",
            &["--mode", "fast", &version, &cluster, "stop"],
        );
        eventually(
            Duration::from_secs(30),
            "PostgreSQL to stop answering",
            || {
                let down = !postgres_ready();
                async move { down.then_some(()) }
            },
        )
        .await;
        outage
    }

    /// Brings the server back with `scripts/infra-up`, which returns once the broker
    /// serves metadata and PostgreSQL accepts logins; returns how long it was down.
    ///
    /// A killed broker first recovers the log of every partition it holds, which can
    /// outlast `infra-up`'s own 90 s budget when many topics lie around; the broker
    /// keeps starting meanwhile, so a failed `infra-up` is given a few more tries.
    pub async fn restore(mut self) -> Duration {
        let mut tries = 0;
        while !tokio::task::spawn_blocking(try_infra_up).await.unwrap() {
            tries += 1;
            assert!(
                tries < 4,
                "scripts/infra-up could not bring {} back",
                self.what
            );
        }
        self.restored = true;
        self.down_since.elapsed()
    }
}

impl Drop for Outage {
    fn drop(&mut self) {
        if !self.restored {
            eprintln!("bringing {} back after a failure", self.what);
            for _ in 0..4 {
                if try_infra_up() {
                    return;
                }
            }
        }
    }
}

/// Runs `scripts/infra-up`, which starts whatever of PostgreSQL and Kafka is not running.
pub fn infra_up() {
    assert!(try_infra_up(), "scripts/infra-up failed");
}

fn try_infra_up() -> bool {
    Command::new(root().join("scripts/infra-up"))
        .stdout(std::process::Stdio::null())
        .status()
        .expect("scripts/infra-up runs")
        .success()
}

/// The Debian cluster (version, name) listening on the tests' PostgreSQL port, from
/// `pg_lsclusters`.
fn postgres_cluster() -> (String, String) {
    let port = postgres_port();
    let listing = output("pg_lsclusters", &["--no-header"]);
    listing
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .find(|fields| fields.get(2) == Some(&port.as_str()))
        .map(|fields| (fields[0].to_owned(), fields[1].to_owned()))
        .unwrap_or_else(|| panic!("no PostgreSQL cluster on port {port} in:\n{listing}"))
}

fn postgres_port() -> String {
    saga::db::parse_url(&saga_testkit::postgres_admin_url())
        .expect("a PostgreSQL URL")
        .get_ports()
        .first()
        .copied()
        .unwrap_or(5432)
        .to_string()
}

fn postgres_ready() -> bool {
    Command::new("pg_isready")
        .args(["-q", "-h", "127.0.0.1", "-p", &postgres_port()])
        .status()
        .is_ok_and(|s| s.success())
}

/// Resets `group`'s offsets on `topic` to the earliest with the stock tool, exactly as
/// an operator would: `scripts/kafka-consumer-groups --bootstrap-server … --group …
/// --topic … --reset-offsets --to-earliest --execute`. The group must have no members;
/// the broker may need a moment to notice the last one left, so this retries until the
/// tool succeeds.
pub async fn reset_offsets_to_earliest(brokers: &str, group: &str, topic: &str) {
    let tool = root().join("scripts/kafka-consumer-groups");
    eventually(
        Duration::from_secs(60),
        &format!("kafka-consumer-groups to reset {group} on {topic}"),
        || {
            let tool = tool.clone();
            let args = [
                "--bootstrap-server",
                brokers,
                "--group",
                group,
                "--topic",
                topic,
                "--reset-offsets",
                "--to-earliest",
                "--execute",
            ]
            .map(str::to_owned);
            async move {
                let result = tokio::process::Command::new(tool)
                    .args(&args)
                    .output()
                    .await
                    .expect("scripts/kafka-consumer-groups runs");
                let stdout = String::from_utf8_lossy(&result.stdout);
                // On success the tool prints the new offsets, one line per partition.
                (result.status.success() && stdout.contains("NEW-OFFSET")).then_some(())
            }
        },
    )
    .await;
}

fn run(program: &str, args: &[&str]) {
    let status = Command::new(program)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(status.success(), "{program} {args:?}: {status}");
}

fn output(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(out.status.success(), "{program} {args:?}: {}", out.status);
    String::from_utf8_lossy(&out.stdout).into_owned()
}
