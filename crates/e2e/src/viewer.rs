//! A trace viewer for one test: Zipkin, and in front of it the OpenTelemetry Collector
//! built from `deploy/otelcol`, each on a free port, run from what `scripts/lib.sh`'s
//! `ensure_tracing` installed in `.cache` (scripts/test and `scripts/up --with-tracing`
//! run it). Give the services [`Viewer::otlp_endpoint`] as `OTEL_EXPORTER_OTLP_ENDPOINT`
//! (`Stack::start_with_env`), then read what arrived through Zipkin's API, waiting until
//! the spans a test expects are there: the collector batches them and Zipkin indexes
//! them a little after the services send them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use saga_testkit::eventually;
use serde_json::Value;
use tokio::process::{Child, Command};

use crate::workspace_root;

/// As `OTELCOL_VERSION` and `ZIPKIN_VERSION` in scripts/lib.sh, which name the folders
/// under `.cache` (tests/compose.rs holds the two to the same values).
pub const OTELCOL_VERSION: &str = "0.148.0";
pub const ZIPKIN_VERSION: &str = "3.5.1";

/// How long Zipkin may take to start (a JVM: about 6 s on two idle cores, far more
/// beside a build) and spans to show up in it.
const START: Duration = Duration::from_secs(120);
const ARRIVE: Duration = Duration::from_secs(30);

/// A span as Zipkin's API v2 returns it (JSON): `traceId`, `id`, `name`,
/// `localEndpoint.serviceName`, `tags`, ...
pub type Span = Value;

pub struct Viewer {
    zipkin_port: u16,
    otlp_port: u16,
    // Both are killed when the viewer is dropped.
    _zipkin: Child,
    _collector: Child,
    http: reqwest::Client,
}

impl Viewer {
    /// Starts Zipkin, then the collector sending to it, and waits until Zipkin reports
    /// healthy and the collector accepts connections.
    pub async fn start() -> Self {
        let (collector_bin, zipkin_jar) = installed();
        let (zipkin_port, otlp_port) = (free_port(), free_port());
        let logs = log_dir();
        let zipkin = spawn(
            Command::new("java")
                .args([
                    "-Xmx512m",
                    "-XX:+UseSerialGC",
                    "-XX:TieredStopAtLevel=1",
                    "-jar",
                ])
                .arg(&zipkin_jar)
                .args([
                    "--armeria.ports[0].ip=127.0.0.1".to_owned(),
                    format!("--armeria.ports[0].port={zipkin_port}"),
                    "--armeria.ports[0].protocols=http".to_owned(),
                ]),
            &logs.join(format!("zipkin-{zipkin_port}.log")),
        );
        let collector = spawn(
            Command::new(&collector_bin)
                .arg("--config")
                .arg(workspace_root().join("deploy/otelcol/config.yaml"))
                .env("OTELCOL_HTTP_ADDR", format!("127.0.0.1:{otlp_port}"))
                .env(
                    "OTELCOL_ZIPKIN_URL",
                    format!("http://127.0.0.1:{zipkin_port}/api/v2/spans"),
                ),
            &logs.join(format!("otelcol-{otlp_port}.log")),
        );
        let viewer = Self {
            zipkin_port,
            otlp_port,
            _zipkin: zipkin,
            _collector: collector,
            http: reqwest::Client::new(),
        };
        let health = viewer.url("/health");
        eventually(
            START,
            &format!("Zipkin to be healthy (log in {})", logs.display()),
            || {
                let request = viewer.http.get(&health).send();
                async move { request.await.ok()?.status().is_success().then_some(()) }
            },
        )
        .await;
        eventually(
            START,
            "the collector to accept connections",
            || async move {
                tokio::net::TcpStream::connect(("127.0.0.1", otlp_port))
                    .await
                    .ok()
                    .map(drop)
            },
        )
        .await;
        viewer
    }

    /// What the services are given as `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn otlp_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.otlp_port)
    }

    /// Zipkin's own address, its UI under `/zipkin/`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.zipkin_port)
    }

    /// The UI's page for one trace.
    pub fn trace_page(&self, trace_id: &str) -> String {
        self.url(&format!("/zipkin/traces/{trace_id}"))
    }

    /// The spans of trace `trace_id` that Zipkin holds now; none if it knows no such trace.
    pub async fn trace(&self, trace_id: &str) -> Vec<Span> {
        let response = self
            .http
            .get(self.url(&format!("/api/v2/trace/{trace_id}")))
            .send()
            .await
            .expect("Zipkin answers");
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return Vec::new();
        }
        assert!(
            response.status().is_success(),
            "Zipkin: {}",
            response.status()
        );
        response.json().await.expect("a JSON list of spans")
    }

    /// The traces Zipkin holds now with a span of `service` tagged `key=value`, each as
    /// its spans.
    pub async fn traces_tagged(&self, service: &str, key: &str, value: &str) -> Vec<Vec<Span>> {
        let response = self
            .http
            .get(self.url("/api/v2/traces"))
            .query(&[
                ("serviceName", service),
                ("annotationQuery", &format!("{key}={value}")),
                ("limit", "100"),
            ])
            .send()
            .await
            .expect("Zipkin answers");
        assert!(
            response.status().is_success(),
            "Zipkin: {}",
            response.status()
        );
        response.json().await.expect("a JSON list of traces")
    }

    /// Waits until trace `trace_id` has spans from each of `services`; returns its spans.
    pub async fn await_trace(&self, trace_id: &str, services: &[&str]) -> Vec<Span> {
        eventually(
            ARRIVE,
            &format!("trace {trace_id} to hold spans of {services:?}"),
            || async move {
                let spans = self.trace(trace_id).await;
                covers(&spans, services).then_some(spans)
            },
        )
        .await
    }

    /// Waits until a trace with a span of `service` tagged `key=value` has spans from
    /// each of `services`; returns that trace's spans.
    pub async fn await_tagged(
        &self,
        service: &str,
        key: &str,
        value: &str,
        services: &[&str],
    ) -> Vec<Span> {
        eventually(
            ARRIVE,
            &format!("a trace of {service} tagged {key}={value} with spans of {services:?}"),
            || async move {
                let traces = self.traces_tagged(service, key, value).await;
                traces.into_iter().find(|spans| covers(spans, services))
            },
        )
        .await
    }
}

/// The services whose spans are among `spans` (each span's `localEndpoint.serviceName`).
pub fn services_of(spans: &[Span]) -> BTreeSet<String> {
    spans
        .iter()
        .filter_map(|span| span["localEndpoint"]["serviceName"].as_str())
        .map(str::to_owned)
        .collect()
}

fn covers(spans: &[Span], services: &[&str]) -> bool {
    let present = services_of(spans);
    services.iter().all(|service| present.contains(*service))
}

/// The collector's binary and Zipkin's jar in `.cache`, complete (their markers
/// written), or a failure saying how to install them.
fn installed() -> (PathBuf, PathBuf) {
    let cache = workspace_root().join(".cache");
    let collector = cache.join(format!("otelcol-{OTELCOL_VERSION}"));
    let zipkin = cache.join(format!("zipkin-{ZIPKIN_VERSION}"));
    for dir in [&collector, &zipkin] {
        assert!(
            dir.join(".installed").exists(),
            "{} is missing: the trace viewer is installed by scripts/test and by \
             `scripts/up --with-tracing` (ensure_tracing in scripts/lib.sh)",
            dir.display()
        );
    }
    (
        collector.join("otelcol-saga"),
        zipkin.join("zipkin-server.jar"),
    )
}

fn spawn(command: &mut Command, log: &Path) -> Child {
    let file = std::fs::File::create(log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    command
        .stdout(file.try_clone().expect("the log file"))
        .stderr(file)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"))
}

/// Beside the services' logs: target/e2e-logs.
fn log_dir() -> PathBuf {
    let test_exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/<test> -> target/e2e-logs
    let dir = test_exe
        .ancestors()
        .nth(3)
        .expect("the test binary lives in target/<profile>/deps")
        .join("e2e-logs");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}
