//! Topics and Kafka settings: the topics `kafka-init` creates, the listeners the clients
//! reach, the image's release and the broker's every setting, each as the native
//! scripts have them.

use std::collections::BTreeMap;

use saga_e2e::workspace_root;

use crate::lib_sh::LibSh;
use crate::read;
use crate::yaml::{Compose, Node, env_var, environment, listener_addresses, strings, text};

#[test]
fn the_topics_kafka_init_creates_are_those_of_the_native_scripts_and_the_code() {
    let compose = Compose::load();
    let lib = LibSh::load();
    let init = compose.service("kafka-init");
    let env = environment(init);

    let mut created: Vec<String> = env_var(&env, "kafka-init", "TOPICS")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    created.sort();
    let mut native = lib.array("KAFKA_TOPICS");
    native.sort();
    let mut code = saga::Topics::new("").all();
    code.sort();
    assert_eq!(
        created, native,
        "kafka-init TOPICS vs KAFKA_TOPICS in scripts/lib.sh"
    );
    assert_eq!(created, code, "kafka-init TOPICS vs saga::Topics::all()");

    // The same setting, under the same name and with the same default, as natively.
    assert_eq!(
        env_var(&env, "kafka-init", "PARTITIONS"),
        format!(
            "${{KAFKA_TOPIC_PARTITIONS:-{}}}",
            lib.scalar("KAFKA_TOPIC_PARTITIONS")
        ),
        "kafka-init PARTITIONS vs KAFKA_TOPIC_PARTITIONS in scripts/lib.sh"
    );

    assert_eq!(
        env_var(&env, "kafka-init", "REPLICAS"),
        env_var(
            &environment(compose.service("kafka")),
            "kafka",
            "KAFKA_DEFAULT_REPLICATION_FACTOR"
        ),
        "kafka-init REPLICAS vs the broker's default replication factor"
    );

    // The variables above count only if the command uses them.
    let command = strings(init.at(&["command"])).join(" ");
    for needed in [
        "$$TOPICS",
        "$$PARTITIONS",
        "$$BOOTSTRAP",
        "$$REPLICAS",
        "--if-not-exists",
    ] {
        assert!(
            command.contains(needed),
            "kafka-init's command does not use {needed}: {command}"
        );
    }
}

#[test]
fn kafka_init_and_every_service_reach_the_broker_on_its_internal_listener() {
    let compose = Compose::load();
    let kafka = environment(compose.service("kafka"));
    let advertised = env_var(&kafka, "kafka", "KAFKA_ADVERTISED_LISTENERS");
    let listeners = env_var(&kafka, "kafka", "KAFKA_LISTENERS");
    let internal: Vec<String> = listener_addresses(&advertised)
        .into_iter()
        .filter(|(_, address)| address.starts_with("kafka:"))
        .map(|(listener, address)| {
            let port = address.rsplit(':').next().unwrap();
            assert!(
                listener_addresses(&listeners)
                    .iter()
                    .any(|(l, a)| *l == listener && a.ends_with(&format!(":{port}"))),
                "advertised listener {listener}://{address} is not in KAFKA_LISTENERS {listeners}"
            );
            address
        })
        .collect();
    assert!(
        !internal.is_empty(),
        "no advertised listener on host `kafka` for the other containers: {advertised}"
    );

    let mut clients = vec![(
        "kafka-init".to_owned(),
        env_var(
            &environment(compose.service("kafka-init")),
            "kafka-init",
            "BOOTSTRAP",
        ),
    )];
    for (name, service) in compose.kafka_clients() {
        clients.push((
            name.to_owned(),
            env_var(&environment(service), name, "KAFKA_BROKERS"),
        ));
    }
    for (name, brokers) in clients {
        for broker in brokers.split(',') {
            assert!(
                internal.iter().any(|address| address == broker),
                "{name} connects to {broker}, not to an internal listener of kafka {internal:?}"
            );
        }
    }
}

#[test]
fn the_kafka_image_is_the_release_the_native_scripts_run() {
    let compose = Compose::load();
    let version = LibSh::load().scalar("KAFKA_VERSION");
    for service in ["kafka", "kafka-init"] {
        assert_eq!(
            text(compose.service(service).at(&["image"])),
            format!("apache/kafka:{version}"),
            "{service}: image vs KAFKA_VERSION in scripts/lib.sh"
        );
    }
}

/// Where a container's broker and a native one necessarily differ: addresses, the data
/// folder, and (on the cluster) the node's own id.
const PLACE_SPECIFIC: [&str; 8] = [
    "listeners",
    "advertised.listeners",
    "listener.security.protocol.map",
    "inter.broker.listener.name",
    "controller.quorum.bootstrap.servers",
    "controller.quorum.voters",
    "log.dirs",
    "node.id",
];

/// The native broker's SASL_SSL listener (port 9094, for trying the services over TLS
/// with a login), and the ACLs it has the authorizer for, which concern its users alone:
/// the main file's broker has neither, docker-compose.sasl.yml adds both (held to the
/// native ones by compose/sasl.rs).
fn native_only(key: &str) -> bool {
    key.starts_with("listener.name.sasl_ssl.")
        || [
            "sasl.enabled.mechanisms",
            "authorizer.class.name",
            "super.users",
        ]
        .contains(&key)
}

#[test]
fn the_broker_is_configured_like_the_native_one() {
    let compose = Compose::load();
    let env = environment(compose.service("kafka"));
    assert_configured_like("kafka", &env, "deploy/kafka/server.properties");
}

/// The settings of the native broker's properties file `file` (under deploy/kafka), as
/// written: placeholders are scripts/infra-up's to fill.
pub(crate) fn native_properties(file: &str) -> BTreeMap<String, String> {
    read(&workspace_root().join(file))
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (key, value) = line
                .split_once('=')
                .unwrap_or_else(|| panic!("{file}: not key=value: {line}"));
            (key.to_owned(), value.to_owned())
        })
        .collect()
}

/// Every setting of the native properties file `file` but the place-specific ones is
/// the container's `KAFKA_<NAME>` variable, and the other way round.
pub(crate) fn assert_configured_like(service: &str, env: &BTreeMap<String, String>, file: &str) {
    let mut native = BTreeMap::new();
    for (key, value) in native_properties(file) {
        if !PLACE_SPECIFIC.contains(&key.as_str()) && !native_only(&key) {
            // The image's convention: KAFKA_ and the property in upper case, `.` as `_`.
            let variable = format!("KAFKA_{}", key.to_uppercase().replace('.', "_"));
            native.insert(variable, value);
        }
    }
    assert!(!native.is_empty(), "nothing compared: has {file} moved?");
    let place_specific: Vec<String> = PLACE_SPECIFIC
        .iter()
        .map(|key| format!("KAFKA_{}", key.to_uppercase().replace('.', "_")))
        .collect();
    let container: BTreeMap<String, String> = env
        .iter()
        .filter(|(k, _)| k.starts_with("KAFKA_") && !place_specific.contains(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(
        container, native,
        "{service}'s KAFKA_* settings vs {file} (less addresses and folders)"
    );
}
