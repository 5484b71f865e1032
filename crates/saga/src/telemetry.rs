//! Logging and traces. Logs: structured `tracing` events to stderr, filtered by
//! `RUST_LOG` (default `info`); `LOG_FORMAT=json` switches to one JSON object per line for
//! machines. Traces: each hop of an order ([`crate::trace`]), exported with OTLP/HTTP when
//! an endpoint is set ([`OTEL_HELP`] lists the standard variables read). The two are
//! apart: no log line becomes a span's event, and no span a log line's prefix.

use std::io::IsTerminal;
use std::path::Path;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

/// The standard OpenTelemetry variables the services read, for their `--help`.
pub const OTEL_HELP: &str = "\
Traces (OpenTelemetry; off unless an endpoint is set):
  OTEL_EXPORTER_OTLP_ENDPOINT         OTLP/HTTP collector, e.g. http://127.0.0.1:4318
                                      (spans go to <endpoint>/v1/traces)
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT  the full URL for spans, instead of the above
  OTEL_EXPORTER_OTLP_HEADERS          key=value,… sent with each export (credentials)
  OTEL_EXPORTER_OTLP_TIMEOUT          milliseconds per export (10000)
  OTEL_EXPORTER_OTLP_CERTIFICATE      PEM file of the CA to trust for an https://
                                      collector, beside the system's; a collector whose
                                      certificate is not trusted stops the service at start
  OTEL_SERVICE_NAME                   service.name (default: the binary's name)
  OTEL_RESOURCE_ATTRIBUTES            key=value,… added to every span's resource
  OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG
                                      which traces to keep (parentbased_always_on)
  OTEL_BSP_SCHEDULE_DELAY, OTEL_BSP_MAX_QUEUE_SIZE, OTEL_BSP_MAX_EXPORT_BATCH_SIZE
                                      the batching exporter's pace and queue
  OTEL_SDK_DISABLED=true, OTEL_TRACES_EXPORTER=none
                                      export nothing, whatever the endpoint";

/// Exports spans until [`Telemetry::shutdown`], which sends what is still queued.
#[must_use = "spans still queued are lost unless it is shut down"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Sends the spans still queued; waits at most the exporter's timeout.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(error) = provider.shutdown()
        {
            tracing::warn!(%error, "traces: the last spans were not exported");
        }
    }
}

/// Starts logging alone: for the tools (`sagactl`, `redrive-dlq`), whose spans no trace
/// needs.
pub fn init() {
    let _ = install(None);
}

/// Starts logging, and exporting spans as `service` when the environment asks for it. A
/// second call (tests start several services in one process) keeps the first's setup.
pub fn init_service(service: &str) -> anyhow::Result<Telemetry> {
    install(Some(service))
}

fn install(service: Option<&str>) -> anyhow::Result<Telemetry> {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,rdkafka=warn,tokio_postgres=warn"));
    let fmt = tracing_subscriber::fmt::layer()
        // Colours only for a person at a terminal: a log file must stay greppable.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let fmt = if std::env::var("LOG_FORMAT").as_deref() == Ok("json") {
        fmt.json().boxed()
    } else {
        fmt.boxed()
    };
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .try_init()
        .is_ok();
    // The log's subscriber is the process's first; so is its exporter.
    let provider = match service {
        Some(service) if installed && exporting() => Some(provider(service)?),
        _ => None,
    };
    if let Some(provider) = &provider {
        crate::trace::enable(provider.tracer("saga"));
        tracing::info!(service, "traces: exporting spans with OTLP");
    }
    Ok(Telemetry { provider })
}

/// Whether an OTLP endpoint is set and nothing switches export off.
fn exporting() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|value| !value.trim().is_empty());
    let is = |name: &str, value: &str| {
        std::env::var(name).is_ok_and(|set| set.trim().eq_ignore_ascii_case(value))
    };
    (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
        && !is("OTEL_SDK_DISABLED", "true")
        && !is("OTEL_TRACES_EXPORTER", "none")
}

fn provider(service: &str) -> anyhow::Result<SdkTracerProvider> {
    // The exporter reads the OTEL_EXPORTER_OTLP_* variables; a bad value is refused here.
    let exporter = SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_http_client(exporter_client()?)
        .build()
        .map_err(|error| anyhow::anyhow!("traces: OTEL_EXPORTER_OTLP_*: {error}"))?;
    let mut resource = Resource::builder();
    // OTEL_SERVICE_NAME, read by the builder, names the service if it is set.
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(service.to_owned());
    }
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build())
}

/// The longest the check of an `https://` collector's certificate may hold the start up.
const COLLECTOR_CHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// The exporter's HTTP client: `OTEL_EXPORTER_OTLP_TIMEOUT` per export, and the CA of
/// `OTEL_EXPORTER_OTLP_CERTIFICATE` trusted beside the system's (each variable's
/// `_TRACES_` form first, as the specification orders). For an `https://` endpoint, the
/// collector's certificate is checked now: one not trusted stops the service with what
/// OpenSSL said, rather than every export failing in silence. A collector that does not
/// answer is not waited for: it may come later.
///
/// On a thread of its own: a blocking client must not be made or used on the runtime's.
fn exporter_client() -> anyhow::Result<reqwest::blocking::Client> {
    let var = |name: &str| {
        let traces = name.replace("OTEL_EXPORTER_OTLP_", "OTEL_EXPORTER_OTLP_TRACES_");
        [traces, name.to_owned()].into_iter().find_map(|name| {
            std::env::var(&name)
                .ok()
                .filter(|v| !v.trim().is_empty())
                .map(|v| (name, v))
        })
    };
    let timeout = match var("OTEL_EXPORTER_OTLP_TIMEOUT") {
        Some((name, ms)) => Duration::from_millis(
            ms.trim()
                .parse()
                .map_err(|e| anyhow::anyhow!("traces: {name} `{ms}`: {e}"))?,
        ),
        None => Duration::from_secs(10),
    };
    let ca = var("OTEL_EXPORTER_OTLP_CERTIFICATE");
    let endpoint = var("OTEL_EXPORTER_OTLP_ENDPOINT").map(|(_, url)| url);
    let built = std::thread::spawn(move || -> anyhow::Result<reqwest::blocking::Client> {
        let mut builder = reqwest::blocking::Client::builder().timeout(timeout);
        if let Some((name, file)) = &ca {
            for certificate in crate::https::ca_certificates(Path::new(file))
                .map_err(|e| anyhow::anyhow!("traces: {name}: {e:#}"))?
            {
                builder = builder.add_root_certificate(certificate);
            }
        }
        let client = builder.build()?;
        if let Some(url) = endpoint.filter(|url| url.starts_with("https://")) {
            let asked = client.get(&url).timeout(COLLECTOR_CHECK_TIMEOUT).send();
            if let Some(refusal) = asked.err().as_ref().and_then(|e| crate::https::refusal(e)) {
                anyhow::bail!(
                    "traces: the collector at {url} refused TLS: {refusal} (the CA to trust: OTEL_EXPORTER_OTLP_CERTIFICATE)"
                );
            }
        }
        Ok(client)
    });
    built
        .join()
        .map_err(|_| anyhow::anyhow!("traces: making the exporter's client panicked"))?
}
