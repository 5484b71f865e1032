//! The services as processes: started from the release binaries with the environment
//! `scripts/up` gives them, stopped with SIGTERM as `scripts/stop-services` does, and
//! measured from `/proc` (CPU time, peak resident memory).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::Serialize;
use tokio::process::{Child, Command};

/// One service of the saga, or the card provider, as the benchmark runs it.
#[derive(Debug, Clone)]
pub struct ServiceSpec {
    pub name: &'static str,
    pub database_url: String,
    pub port: u16,
    /// Variables of this service alone, such as where payment-service finds the provider.
    pub env: Vec<(String, String)>,
}

/// Settings every service gets, as in `scripts/up`.
#[derive(Debug, Clone)]
pub struct StackEnv {
    pub bin_dir: PathBuf,
    pub brokers: String,
    pub namespace: String,
    pub log_dir: PathBuf,
    pub rust_log: String,
    /// Extra variables for every service (e.g. `DATABASE_POOL_SIZE`), passed through.
    pub extra: Vec<(String, String)>,
}

/// A service the benchmark started, with what it has used so far.
pub struct Running {
    pub spec: ServiceSpec,
    child: Child,
    pub pid: u32,
    /// CPU ticks at the last [`Running::mark`].
    mark: u64,
}

/// CPU seconds and memory of one service over one phase.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Usage {
    pub cpu_seconds: f64,
    /// Peak resident set since the process started (VmHWM), in KiB.
    pub peak_rss_kib: u64,
}

impl Usage {
    /// Adds `other`'s CPU time; keeps the higher peak.
    pub fn add(&mut self, other: &Usage) {
        self.cpu_seconds += other.cpu_seconds;
        self.peak_rss_kib = self.peak_rss_kib.max(other.peak_rss_kib);
    }
}

impl Running {
    pub async fn start(spec: &ServiceSpec, env: &StackEnv) -> anyhow::Result<Self> {
        let log_path = env.log_dir.join(format!("{}.log", spec.name));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let binary = env.bin_dir.join(spec.name);
        let mut command = Command::new(&binary);
        command
            .env("DATABASE_URL", &spec.database_url)
            .env("KAFKA_BROKERS", &env.brokers)
            .env("KAFKA_NAMESPACE", &env.namespace)
            .env("HTTP_ADDR", format!("127.0.0.1:{}", spec.port))
            .env("RUST_LOG", &env.rust_log)
            .envs(env.extra.iter().map(|(k, v)| (k, v)))
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let pid = child.id().context("a just-started child has a pid")?;
        let mut running = Self {
            spec: spec.clone(),
            child,
            pid,
            mark: 0,
        };
        running.wait_healthy(Duration::from_secs(60)).await?;
        running.mark = cpu_ticks(pid).unwrap_or(0);
        Ok(running)
    }

    async fn wait_healthy(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let url = format!("http://127.0.0.1:{}/health", self.spec.port);
        let client = reqwest::Client::new();
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("{} exited during start-up ({status})", self.spec.name);
            }
            let healthy = client
                .get(&url)
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if healthy {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{} not healthy after {timeout:?} at {url}", self.spec.name);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// CPU used since the last mark, and the peak memory so far; starts a new mark.
    pub fn usage_since_mark(&mut self, tick_hz: f64) -> Usage {
        let now = cpu_ticks(self.pid).unwrap_or(self.mark);
        let used = now.saturating_sub(self.mark);
        self.mark = now;
        Usage {
            cpu_seconds: used as f64 / tick_hz,
            peak_rss_kib: status_kib(self.pid, "VmHWM").unwrap_or(0),
        }
    }

    /// SIGTERM, as an operator would: the service finishes the record in hand, commits
    /// its offsets and exits. Killed if it has not exited in 30 s.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        // No signal API without unsafe code. bash's own `kill` sends it: bash runs every
        // script here, while a minimal system may have no kill(1).
        let status = Command::new("bash")
            .args(["-c", r#"kill -TERM "$1""#, "bash", &self.pid.to_string()])
            .status()
            .await?;
        if !status.success() {
            bail!("kill -TERM {} failed", self.pid);
        }
        match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            Ok(exit) => {
                let exit = exit?;
                if !exit.success() {
                    bail!("{} exited with {exit} after SIGTERM", self.spec.name);
                }
                Ok(())
            }
            Err(_) => {
                self.child.kill().await?;
                bail!("{} ignored SIGTERM for 30 s; killed", self.spec.name)
            }
        }
    }
}

/// utime + stime of a process, in clock ticks.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_ticks(&stat, false)
}

/// utime + stime from a `/proc/<pid>/stat` line and, with `children`, cutime + cstime:
/// the CPU of children it has reaped.
fn stat_ticks(stat: &str, children: bool) -> Option<u64> {
    // The command name may hold spaces and parentheses; the fields follow the last `)`.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // Fields 14 to 17 of stat(5); the first after `)` is field 3.
    let field = |index: usize| fields.get(index)?.parse::<u64>().ok();
    let own = field(11)? + field(12)?;
    Some(if children {
        own + field(13)? + field(14)?
    } else {
        own
    })
}

/// A `kB` line of `/proc/<pid>/status`, such as VmHWM or VmRSS.
pub fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(key)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on every Linux in practice).
pub fn tick_hz() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// The whole machine's busy and total jiffies (first line of /proc/stat).
fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let values: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: u64 = values.iter().take(8).sum();
    // idle + iowait
    let idle = values.get(3)? + values.get(4).unwrap_or(&0);
    Some((total - idle, total))
}

/// CPU ticks so far of the parts the services share the machine with, and of the
/// machine, so that a phase can say where its CPU went.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ticks {
    busy: u64,
    total: u64,
    /// Every `postgres` process, the postmaster's reaped backends included: pools and
    /// pgbench open and close connections during a phase.
    postgres: u64,
    /// Every `java … kafka.Kafka` process: one broker, or the three nodes.
    kafka: u64,
    /// This process and its reaped children (pgbench).
    load: u64,
}

impl Ticks {
    pub fn now() -> Self {
        let (busy, total) = machine_ticks().unwrap_or_default();
        let mut ticks = Self {
            busy,
            total,
            load: std::fs::read_to_string("/proc/self/stat")
                .ok()
                .and_then(|stat| stat_ticks(&stat, true))
                .unwrap_or(0),
            ..Self::default()
        };
        let pids = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok());
        for pid in pids {
            // A process may end between the listing and the read: it is skipped.
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let comm = stat
                .split_once('(')
                .and_then(|(_, rest)| rest.rsplit_once(')'))
                .map_or("", |(comm, _)| comm);
            let is_kafka = || {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                    cmdline.split(|&b| b == 0).any(|arg| arg == b"kafka.Kafka")
                })
            };
            match comm {
                "postgres" => ticks.postgres += stat_ticks(&stat, true).unwrap_or(0),
                "java" if is_kafka() => ticks.kafka += stat_ticks(&stat, false).unwrap_or(0),
                _ => {}
            }
        }
        ticks
    }

    /// What was used from `before` to these ticks.
    pub fn since(&self, before: &Ticks, tick_hz: f64) -> CpuSplit {
        let seconds = |now: u64, then: u64| now.saturating_sub(then) as f64 / tick_hz;
        let total = self.total.saturating_sub(before.total);
        let busy = self.busy.saturating_sub(before.busy);
        CpuSplit {
            machine: seconds(self.busy, before.busy),
            machine_percent: if total > 0 {
                busy as f64 * 100.0 / total as f64
            } else {
                f64::NAN
            },
            postgres: seconds(self.postgres, before.postgres),
            kafka: seconds(self.kafka, before.kafka),
            load_generator: seconds(self.load, before.load),
        }
    }
}

/// CPU seconds one phase used, by part of the machine. The services' own are counted
/// per process (see [`Usage`]); what no part accounts for is the kernel's work for no
/// process in particular and whatever else runs on the machine.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CpuSplit {
    /// All cores' busy time.
    pub machine: f64,
    /// The share of all the cores that was busy, in percent.
    pub machine_percent: f64,
    pub postgres: f64,
    pub kafka: f64,
    /// The load generator, or pgbench.
    pub load_generator: f64,
}

impl CpuSplit {
    /// A phase not measured, so that every figure made from it shows as such.
    pub const UNMEASURED: Self = Self {
        machine: f64::NAN,
        machine_percent: f64::NAN,
        postgres: f64::NAN,
        kafka: f64::NAN,
        load_generator: f64::NAN,
    };
}

/// `/proc/loadavg`'s three averages.
pub fn load_average() -> [f64; 3] {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut values = text
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(f64::NAN));
    [
        values.next().unwrap_or(f64::NAN),
        values.next().unwrap_or(f64::NAN),
        values.next().unwrap_or(f64::NAN),
    ]
}

/// How the saga's log lines say each event went, counted per outcome
/// (`applied`, `duplicate`, `guarded`, `ignored`).
pub fn outcomes_in_log(path: &Path) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    let Ok(text) = std::fs::read_to_string(path) else {
        return counts;
    };
    for line in text.lines() {
        if let Some(rest) = line.split("outcome=\"").nth(1)
            && let Some(outcome) = rest.split('"').next()
        {
            *counts.entry(outcome.to_owned()).or_default() += 1;
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cpu_time_and_memory() {
        let pid = std::process::id();
        assert!(cpu_ticks(pid).is_some());
        assert!(status_kib(pid, "VmHWM").unwrap() > 0);
        assert!(status_kib(pid, "NoSuchKey").is_none());
    }

    #[test]
    fn the_machine_split_counts_this_process_and_the_busy_cores() {
        let before = Ticks::now();
        // Enough work for several clock ticks (10 ms each at the usual 100 Hz).
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < Duration::from_millis(300) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let split = Ticks::now().since(&before, tick_hz());
        assert!(split.load_generator >= 0.1, "{split:?}");
        assert!(split.machine >= split.load_generator * 0.5, "{split:?}");
        assert!(
            split.machine_percent > 0.0 && split.machine_percent <= 100.0,
            "{split:?}"
        );
    }

    #[test]
    fn reaped_children_count_only_when_asked() {
        // Fields after the command: state, ppid … utime (14) stime (15) cutime (16) cstime (17).
        let stat = "42 (post gres)) S 1 42 42 0 -1 4194560 0 0 0 0 7 3 20 10 20 0";
        assert_eq!(stat_ticks(stat, false), Some(10));
        assert_eq!(stat_ticks(stat, true), Some(40));
    }

    #[test]
    fn outcomes_are_counted_from_log_lines() {
        let path = std::env::temp_dir().join(format!("bench-log-{}", std::process::id()));
        std::fs::write(
            &path,
            "… event handled event_type=order.created outcome=\"applied\"\n\
             … event handled event_type=order.created outcome=\"duplicate\"\n\
             … event handled event_type=order.created outcome=\"applied\"\n\
             … consumer started\n",
        )
        .unwrap();
        let counts = outcomes_in_log(&path);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(counts.get("applied"), Some(&2));
        assert_eq!(counts.get("duplicate"), Some(&1));
    }
}
