//! The trace viewer: every service sends its spans to the collector, the collector is given
//! only the addresses its configuration reads and sends on to Zipkin, both on the native
//! ports, and the versions built are the native scripts' and the tests'.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use regex::Regex;
use saga_e2e::{viewer, workspace_root};

use crate::lib_sh::LibSh;
use crate::read;
use crate::yaml::{Compose, Node, env_var, environment, published_ports, strings, text};

const COLLECTOR_CONFIG: &str = "deploy/otelcol/config.yaml";

#[test]
fn every_service_sends_its_spans_to_the_collector_on_the_native_otlp_port() {
    let compose = Compose::load();
    let port = LibSh::load().scalar("OTELCOL_PORT");
    for (name, service) in compose.built_services() {
        assert_eq!(
            env_var(&environment(service), name, "OTEL_EXPORTER_OTLP_ENDPOINT"),
            format!("http://otel-collector:{port}"),
            "{name}: where its spans go (OTELCOL_PORT in scripts/lib.sh)"
        );
    }
}

#[test]
fn the_collector_listens_on_the_native_port_and_sends_to_zipkin_with_settings_its_config_reads() {
    static ENV: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"\$\{env:([A-Z][A-Z0-9_]*)(?::-[^}]*)?\}").unwrap());
    let compose = Compose::load();
    let lib = LibSh::load();
    let (otlp_port, zipkin_port) = (lib.scalar("OTELCOL_PORT"), lib.scalar("ZIPKIN_PORT"));
    let collector = compose.service("otel-collector");
    assert_eq!(text(collector.at(&["build", "context"])), "deploy/otelcol");

    let config = read(&workspace_root().join(COLLECTOR_CONFIG));
    let read_by_config: BTreeSet<String> = ENV
        .captures_iter(&config)
        .map(|c| c[1].to_owned())
        .collect();
    let env = environment(collector);
    let given: BTreeSet<String> = env.keys().cloned().collect();
    assert_eq!(
        given, read_by_config,
        "otel-collector's environment vs the variables {COLLECTOR_CONFIG} reads"
    );
    assert_eq!(
        env_var(&env, "otel-collector", "OTELCOL_HTTP_ADDR"),
        format!("0.0.0.0:{otlp_port}")
    );
    assert_eq!(
        env_var(&env, "otel-collector", "OTELCOL_ZIPKIN_URL"),
        format!("http://zipkin:{zipkin_port}/api/v2/spans")
    );
    assert_eq!(
        published_ports(collector),
        vec![(otlp_port.clone(), otlp_port)],
        "otel-collector: published ports (host, container) vs OTELCOL_PORT in scripts/lib.sh"
    );
    assert_eq!(
        text(collector.at(&["depends_on", "zipkin", "condition"])),
        "service_healthy",
        "otel-collector: depends_on zipkin"
    );
}

#[test]
fn zipkin_is_published_and_health_checked_on_the_native_port() {
    let compose = Compose::load();
    let port = LibSh::load().scalar("ZIPKIN_PORT");
    let zipkin = compose.service("zipkin");
    assert_eq!(text(zipkin.at(&["build", "context"])), "deploy/zipkin");
    assert_eq!(
        published_ports(zipkin),
        vec![(port.clone(), port.clone())],
        "zipkin: published ports (host, container) vs ZIPKIN_PORT in scripts/lib.sh"
    );
    let check = strings(zipkin.at(&["healthcheck", "test"])).join(" ");
    assert!(
        check.contains(&format!("http://127.0.0.1:{port}/health")),
        "zipkin: the healthcheck does not ask /health on port {port}: {check}"
    );
}

/// The images, the native scripts' `.cache` and the tests' viewer run the same releases.
#[test]
fn the_images_the_native_scripts_and_the_tests_run_the_same_collector_and_zipkin() {
    let lib = LibSh::load();
    let otelcol = lib.scalar("OTELCOL_VERSION");
    let zipkin = lib.scalar("ZIPKIN_VERSION");
    assert_eq!(
        viewer::OTELCOL_VERSION,
        otelcol,
        "saga_e2e::viewer vs scripts/lib.sh"
    );
    assert_eq!(
        viewer::ZIPKIN_VERSION,
        zipkin,
        "saga_e2e::viewer vs scripts/lib.sh"
    );

    let main_go = read(&workspace_root().join("deploy/otelcol/main.go"));
    assert!(
        main_go.contains(&format!("const version = \"{otelcol}\"")),
        "deploy/otelcol/main.go: its version is not OTELCOL_VERSION {otelcol}"
    );
    let go_mod = read(&workspace_root().join("deploy/otelcol/go.mod"));
    assert!(
        go_mod.contains(&format!(
            "go.opentelemetry.io/collector/otelcol v{otelcol}\n"
        )),
        "deploy/otelcol/go.mod: otelcol is not at OTELCOL_VERSION {otelcol}"
    );
    let dockerfile = read(&workspace_root().join("deploy/zipkin/Dockerfile"));
    assert!(
        dockerfile.contains(&format!(
            "-Dartifact=io.zipkin:zipkin-server:{zipkin}:jar:exec "
        )),
        "deploy/zipkin/Dockerfile: the jar it fetches is not ZIPKIN_VERSION {zipkin}'s"
    );
}
