//! The services the compose file runs: the workspace's binaries, the native scripts'
//! services, given only settings their binaries read, started in order, and built by
//! the image.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use regex::Regex;
use saga_e2e::workspace_root;

use crate::binaries::{prefixes_read_by, variables_read_by, workspace_binaries};
use crate::lib_sh::LibSh;
use crate::yaml::{Compose, Node, environment, text};
use crate::{DOCKERFILE, read};

#[test]
fn the_compose_services_are_the_workspace_binaries_and_the_native_scripts_services() {
    let compose = Compose::load();
    let mut built = Vec::new();
    for (name, service) in compose.built_services() {
        let binary = compose.binary(name);
        assert_eq!(
            binary, name,
            "compose service {name} runs {binary}: name it after its binary, as scripts/lib.sh does"
        );
        let context = text(service.at(&["build", "context"]));
        assert_eq!(context, ".", "{name}: build context");
        built.push(name.to_owned());
    }
    built.sort();

    let mut binaries = workspace_binaries();
    binaries.sort();
    assert_eq!(
        built, binaries,
        "the services built from {DOCKERFILE} must be the workspace's binary crates"
    );

    let mut native = LibSh::load().array("SERVICES");
    native.sort();
    assert_eq!(
        built, native,
        "the services built from {DOCKERFILE} must be SERVICES in scripts/lib.sh"
    );
}

#[test]
fn every_environment_variable_a_service_sets_is_one_its_binary_reads() {
    let compose = Compose::load();
    for (name, service) in compose.built_services() {
        let binary = compose.binary(name);
        let read = variables_read_by(binary);
        let prefixes = prefixes_read_by(binary);
        for variable in environment(service).keys() {
            assert!(
                read.contains(variable) || prefixes.iter().any(|p| variable.starts_with(p)),
                "{name} sets {variable}, which {binary} does not read; it reads {read:?} \
                 and every variable starting with one of {prefixes:?}"
            );
        }
    }
}

#[test]
fn every_service_starts_after_healthy_infrastructure_and_created_topics_and_all_but_kafka_init_are_restarted()
 {
    let compose = Compose::load();
    let wanted = [
        ("postgres", "service_healthy"),
        ("kafka", "service_healthy"),
        ("kafka-init", "service_completed_successfully"),
    ];
    let kafka_clients: BTreeSet<&str> = compose.kafka_clients().map(|(name, _)| name).collect();
    for (name, service) in compose.built_services() {
        for (dependency, condition) in wanted {
            if dependency != "postgres" && !kafka_clients.contains(name) {
                continue;
            }
            assert_eq!(
                text(service.at(&["depends_on", dependency, "condition"])),
                condition,
                "{name}: depends_on {dependency}"
            );
        }
    }
    // All but the one-shot kafka-init come back after a crash or a reboot.
    for (name, service) in compose.services().filter(|(name, _)| *name != "kafka-init") {
        assert_eq!(
            text(service.at(&["restart"])),
            "unless-stopped",
            "{name}: restart"
        );
    }
    assert_eq!(
        text(
            compose
                .service("kafka-init")
                .at(&["depends_on", "kafka", "condition"])
        ),
        "service_healthy",
        "kafka-init: depends_on kafka"
    );
}

/// A service that reads no Kafka setting (the provider) sets none and waits for no broker.
#[test]
fn only_the_services_that_read_kafka_settings_are_given_them() {
    let compose = Compose::load();
    for (name, service) in compose.built_services() {
        let reads = variables_read_by(compose.binary(name)).contains("KAFKA_BROKERS");
        let sets = environment(service).contains_key("KAFKA_BROKERS");
        assert_eq!(
            reads, sets,
            "{name}: reads KAFKA_BROKERS {reads}, is given it {sets}"
        );
    }
}

/// Every binary that talks to Kafka lists the `KAFKA_CLIENT_` prefix in its `--help` (the
/// TLS and SASL settings a compose file or a chart may set), and no other does.
#[test]
fn the_binaries_that_read_kafka_settings_take_client_properties_under_one_prefix() {
    for binary in workspace_binaries() {
        let reads = variables_read_by(&binary).contains("KAFKA_BROKERS");
        let prefixes = prefixes_read_by(&binary);
        assert_eq!(
            prefixes.contains("KAFKA_CLIENT_"),
            reads,
            "{binary}: reads KAFKA_BROKERS {reads}, lists the prefixes {prefixes:?}"
        );
    }
}

/// The image builds what its containers run and the operator's tools, not the benchmark's
/// or the tests' binaries.
#[test]
fn the_image_builds_the_services_the_compose_file_runs_and_the_operator_tools() {
    static BIN: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"--bin ([a-z-]+)").unwrap());
    static COPY: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"(?m)^\s*&& cp ([a-z -]+) /out/$").unwrap());
    let dockerfile = read(&workspace_root().join(DOCKERFILE));
    let built: BTreeSet<String> = BIN
        .captures_iter(&dockerfile)
        .map(|c| c[1].to_owned())
        .collect();
    let copied: BTreeSet<String> = COPY
        .captures(&dockerfile)
        .unwrap_or_else(|| panic!("{DOCKERFILE}: no `&& cp <binaries> /out/` line"))[1]
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        copied, built,
        "{DOCKERFILE}: the binaries copied into the image vs built"
    );
    let compose = Compose::load();
    let mut wanted: BTreeSet<String> = compose
        .built_services()
        .map(|(name, _)| compose.binary(name).to_owned())
        .collect();
    wanted.insert("redrive-dlq".to_owned());
    assert_eq!(built, wanted, "{DOCKERFILE}: the `--bin`s built");
}
