//! The shared infrastructure, handled the way an operator would: the Kafka broker, the
//! nodes of the three-node cluster and the PostgreSQL cluster stopped and started again,
//! and the stock `kafka-consumer-groups` tool. Stopping any of them affects everything on
//! this machine, so only the fault suite, run on its own (`scripts/faults`), may use
//! [`Outage`] and [`Cluster`].

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
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
    /// The process stopped with SIGSTOP, which a SIGCONT brings back.
    frozen: Option<String>,
}

impl Outage {
    /// Kills the Kafka broker that `scripts/infra-up` started (SIGKILL: a crash, not a
    /// clean shutdown) and waits until the process is gone.
    pub async fn kill_broker() -> Self {
        let pid = broker_pid();
        let outage = Self {
            what: "the Kafka broker",
            down_since: Instant::now(),
            restored: false,
            frozen: None,
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

    /// Freezes the Kafka broker that `scripts/infra-up` started (SIGSTOP): its connections
    /// stay open and nothing answers on them, as a managed cluster's broker looks in a
    /// long pause or behind a network that drops packets. [`Outage::restore`] thaws it.
    pub fn freeze_broker() -> Self {
        let pid = broker_pid();
        run("kill", &["-STOP", &pid]);
        Self {
            what: "the Kafka broker",
            down_since: Instant::now(),
            restored: false,
            frozen: Some(pid),
        }
    }

    /// Stops the PostgreSQL cluster serving the tests (`pg_ctlcluster … stop`, fast
    /// mode: sessions are cut, as in a failover) and waits until it no longer answers.
    pub async fn stop_postgres() -> Self {
        let (version, cluster) = postgres_cluster();
        let outage = Self {
            what: "PostgreSQL",
            down_since: Instant::now(),
            restored: false,
            frozen: None,
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
        if let Some(pid) = &self.frozen {
            run("kill", &["-CONT", pid]);
            self.restored = true;
            return self.down_since.elapsed();
        }
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
            if let Some(pid) = &self.frozen {
                run("kill", &["-CONT", pid]);
                return;
            }
            for _ in 0..4 {
                if try_infra_up() {
                    return;
                }
            }
        }
    }
}

/// The pid of the broker `scripts/infra-up` started.
fn broker_pid() -> String {
    let pid_file = run_dir().join("kafka.pid");
    std::fs::read_to_string(&pid_file)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}; the broker must be one scripts/infra-up started",
                pid_file.display()
            )
        })
        .trim()
        .to_owned()
}

/// Runs `scripts/infra-up`, which starts whatever of PostgreSQL and Kafka is not running.
pub fn infra_up() {
    assert!(try_infra_up(), "scripts/infra-up failed");
}

fn try_infra_up() -> bool {
    try_infra_up_with(&[])
}

/// `scripts/infra-up` in the mode of `SAGA_KAFKA_BROKERS`, which the scripts set and pass
/// on (`scripts/faults --brokers 3`).
fn try_infra_up_with(args: &[&str]) -> bool {
    Command::new(root().join("scripts/infra-up"))
        .args(args)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("scripts/infra-up runs")
        .success()
}

/// The three-node cluster of `scripts/infra-up --brokers 3`, its nodes killed, stopped,
/// frozen and started again one by one. Whatever a scenario leaves down or frozen (a
/// failed assertion, say) is brought back when this is dropped.
pub struct Cluster {
    metadata: BaseConsumer,
    down: BTreeSet<i32>,
    frozen: BTreeSet<i32>,
}

/// The cluster's node ids, as `KAFKA_CLUSTER_NODES` in `scripts/lib.sh`.
pub const NODES: [i32; 3] = [1, 2, 3];

impl Cluster {
    /// The cluster the fault suite runs on; fails the test unless it runs on one
    /// (`scripts/faults --brokers 3` sets `SAGA_KAFKA_BROKERS=3` and `KAFKA_BROKERS`).
    pub fn expect(brokers: &str) -> Self {
        assert_eq!(
            std::env::var("SAGA_KAFKA_BROKERS").as_deref(),
            Ok("3"),
            "a cluster scenario: run it with scripts/faults --brokers 3"
        );
        let metadata = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .create()
            .expect("a metadata client");
        Self {
            metadata,
            down: BTreeSet::new(),
            frozen: BTreeSet::new(),
        }
    }

    fn pid_file(node: i32) -> PathBuf {
        run_dir().join(format!("kafka-node-{node}.pid"))
    }

    fn pid(node: i32) -> String {
        let pid_file = Self::pid_file(node);
        std::fs::read_to_string(&pid_file)
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {e}; the cluster must be one scripts/infra-up --brokers 3 started",
                    pid_file.display()
                )
            })
            .trim()
            .to_owned()
    }

    /// SIGKILLs `node` (a crash: no controlled shutdown, no leadership handed over) and
    /// waits until the process is gone.
    pub async fn kill(&mut self, node: i32) {
        self.end(node, "-KILL").await;
    }

    /// SIGTERMs `node`, which hands its partitions' leadership over and closes its logs
    /// cleanly (a rolling restart's stop), and waits until it has exited.
    pub async fn terminate(&mut self, node: i32) {
        self.end(node, "-TERM").await;
    }

    async fn end(&mut self, node: i32, signal: &str) {
        let pid = Self::pid(node);
        self.down.insert(node);
        run("kill", &[signal, &pid]);
        let proc = PathBuf::from(format!("/proc/{pid}"));
        eventually(
            Duration::from_secs(60),
            &format!("Kafka node {node} (pid {pid}) to be gone"),
            || {
                let gone = !proc.exists();
                async move { gone.then_some(()) }
            },
        )
        .await;
    }

    /// SIGSTOPs `node`: it stops fetching from the leaders and answering anyone, yet
    /// stays in every in-sync replica set until the controller fences it (after
    /// `broker.session.timeout.ms`, 9 s), as a replica behind a long pause would.
    pub fn freeze(&mut self, node: i32) {
        self.frozen.insert(node);
        run("kill", &["-STOP", &Self::pid(node)]);
    }

    pub fn thaw(&mut self, node: i32) {
        run("kill", &["-CONT", &Self::pid(node)]);
        self.frozen.remove(&node);
    }

    /// Starts `node` again (`scripts/infra-up --brokers 3 --node N`), which returns once
    /// the cluster counts it among its brokers. A killed node first recovers its logs, so
    /// a failed start is given a few more tries.
    pub async fn start(&mut self, node: i32) {
        let arg = node.to_string();
        for _ in 0..4 {
            let arg = arg.clone();
            let started = tokio::task::spawn_blocking(move || {
                try_infra_up_with(&["--brokers", "3", "--node", &arg])
            })
            .await
            .unwrap();
            if started {
                self.down.remove(&node);
                return;
            }
        }
        panic!("scripts/infra-up could not start Kafka node {node}");
    }

    /// The leader of each partition of `topic` (-1 for none), as the cluster's metadata says.
    pub async fn leaders(&self, topic: &str) -> Vec<i32> {
        self.partitions(topic)
            .await
            .into_iter()
            .map(|p| p.leader)
            .collect()
    }

    /// Waits until every partition of every one of `topics` has a leader and all its
    /// replicas in sync; returns how long that took.
    pub async fn wait_in_sync(&self, topics: &[String], timeout: Duration) -> Duration {
        let since = Instant::now();
        eventually(
            timeout,
            &format!("every replica of {topics:?} to be back in sync"),
            || async {
                for topic in topics {
                    let partitions = self.partitions(topic).await;
                    if partitions.is_empty()
                        || partitions
                            .iter()
                            .any(|p| p.leader < 0 || p.isr.len() < p.replicas)
                    {
                        return None;
                    }
                }
                Some(())
            },
        )
        .await;
        since.elapsed()
    }

    /// Waits until no partition of `topic` is led by `node` or is without a leader;
    /// returns how long that took.
    pub async fn wait_led_without(&self, topic: &str, node: i32, timeout: Duration) -> Duration {
        let since = Instant::now();
        eventually(
            timeout,
            &format!("every partition of {topic} to be led by a node other than {node}"),
            || async {
                let leaders = self.leaders(topic).await;
                (!leaders.is_empty() && leaders.iter().all(|l| *l >= 0 && *l != node)).then_some(())
            },
        )
        .await;
        since.elapsed()
    }

    async fn partitions(&self, topic: &str) -> Vec<PartitionState> {
        // fetch_metadata blocks; a node that is down only makes it ask another.
        let metadata = tokio::task::block_in_place(|| {
            self.metadata
                .fetch_metadata(Some(topic), Duration::from_secs(5))
        });
        let Ok(metadata) = metadata else {
            return Vec::new();
        };
        metadata
            .topics()
            .iter()
            .flat_map(|t| t.partitions())
            .map(|p| PartitionState {
                leader: p.leader(),
                isr: p.isr().to_vec(),
                replicas: p.replicas().len(),
            })
            .collect()
    }
}

struct PartitionState {
    leader: i32,
    isr: Vec<i32>,
    replicas: usize,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // No panic here: this may run while a failed assertion unwinds.
        for node in std::mem::take(&mut self.frozen) {
            if let Ok(pid) = std::fs::read_to_string(Self::pid_file(node)) {
                let _ = Command::new("kill").args(["-CONT", pid.trim()]).status();
            }
        }
        if !self.down.is_empty() {
            eprintln!("bringing Kafka nodes {:?} back after a failure", self.down);
            for _ in 0..4 {
                if try_infra_up_with(&["--brokers", "3"]) {
                    return;
                }
            }
        }
    }
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
