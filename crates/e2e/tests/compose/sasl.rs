//! docker-compose.sasl.yml against the native broker's SASL_SSL listener
//! (`scripts/infra-up`, deploy/kafka/server.properties): the same port, mechanisms,
//! users, password and ACLs (the chart's example users'), and every Kafka client of the
//! main file logging in on it as the user of its name.

use std::collections::BTreeSet;

use saga_e2e::kafka_users::KAFKA_USERS_FILE;
use saphyr::YamlOwned;

use crate::kafka::native_properties;
use crate::lib_sh::LibSh;
use crate::yaml::{
    Node, Overlaid, env_var, environment, listener_addresses, load_yaml_documents, published_ports,
    strings, text,
};

const OVERLAY: &str = "docker-compose.sasl.yml";
/// Where the overlay mounts the volume kafka-tls fills.
const SECRETS: &str = "/etc/kafka/secrets";

const SERVER_PROPERTIES: &str = "deploy/kafka/server.properties";

/// `key` of the native broker's properties, its placeholders filled as scripts/infra-up
/// fills them.
fn native(lib: &LibSh, key: &str) -> String {
    let value = native_properties(SERVER_PROPERTIES)
        .remove(key)
        .unwrap_or_else(|| panic!("{SERVER_PROPERTIES}: no {key}"));
    ["KAFKA_SASL_DENIED_USER", "KAFKA_SASL_PASSWORD"]
        .iter()
        .fold(value, |value, name| {
            value.replace(&format!("@{name}@"), &lib.scalar(name))
        })
}

/// The password as compose fills it in when the environment gives none.
fn compose_default(value: &str) -> String {
    value.replace("${KAFKA_SASL_PASSWORD:-saga-kafka-pw}", "saga-kafka-pw")
}

#[test]
fn the_overlays_listener_is_the_native_ones_port_mechanisms_users_and_acls() {
    let (compose, lib) = (Overlaid::load(OVERLAY), LibSh::load());
    let env = compose.environment("kafka");
    let port = lib.scalar("KAFKA_SASL_PORT");
    assert_eq!(
        published_ports(compose.overlay.service("kafka")),
        vec![(port.clone(), port.clone())],
        "the host's SASL_SSL port, KAFKA_SASL_PORT in scripts/lib.sh"
    );
    let advertised = listener_addresses(&env_var(&env, "kafka", "KAFKA_ADVERTISED_LISTENERS"));
    assert!(
        advertised.contains(&("AUTH_HOST".into(), format!("127.0.0.1:{port}"))),
        "{advertised:?}"
    );
    let protocols = env_var(&env, "kafka", "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP");
    let sasl_listeners: Vec<&str> = protocols
        .split(',')
        .filter_map(|pair| pair.strip_suffix(":SASL_SSL"))
        .collect();
    assert_eq!(
        sasl_listeners,
        ["AUTH_INTERNAL", "AUTH_HOST"],
        "{protocols}"
    );

    for (variable, key) in [
        ("KAFKA_SASL_ENABLED_MECHANISMS", "sasl.enabled.mechanisms"),
        ("KAFKA_AUTHORIZER_CLASS_NAME", "authorizer.class.name"),
        ("KAFKA_SUPER_USERS", "super.users"),
    ] {
        assert_eq!(
            env_var(&env, "kafka", variable),
            native(&lib, key),
            "{variable}"
        );
    }
    let mechanisms = native(&lib, "sasl.enabled.mechanisms");
    for listener in &sasl_listeners {
        for mechanism in mechanisms.split(',') {
            let key = format!(
                "listener.name.sasl_ssl.{}.sasl.jaas.config",
                mechanism.to_lowercase()
            );
            // The image's convention: `_` in a name is `__`, `-` is `___`.
            let variable = format!(
                "KAFKA_LISTENER_NAME_{}_{}_SASL_JAAS_CONFIG",
                listener.replace('_', "__"),
                mechanism.replace('-', "___")
            );
            assert_eq!(
                compose_default(&env_var(&env, "kafka", &variable)),
                native(&lib, &key),
                "{variable}"
            );
        }
    }

    let users = compose.environment("kafka-users");
    assert_eq!(
        env_var(&users, "kafka-users", "USERS"),
        format!(
            "{} {}",
            example_users().join(" "),
            lib.scalar("KAFKA_SASL_DENIED_USER")
        )
    );
    // PLAIN's users are listed in the native broker's JAAS line, which the overlay's
    // copies: each of the example's must be there.
    let plain = native(&lib, "listener.name.sasl_ssl.plain.sasl.jaas.config");
    for user in example_users() {
        assert!(
            plain.contains(&format!(" user_{user}=")),
            "{SERVER_PROPERTIES}: no PLAIN login for {user}"
        );
    }
    assert_eq!(
        compose_default(&env_var(&users, "kafka-users", "PASSWORD")),
        lib.scalar("KAFKA_SASL_PASSWORD")
    );
}

#[test]
fn every_kafka_client_logs_in_on_the_overlays_listener_trusting_its_ca() {
    let (compose, lib) = (Overlaid::load(OVERLAY), LibSh::load());
    let env = compose.environment("kafka");
    let internal = listener_addresses(&env_var(&env, "kafka", "KAFKA_ADVERTISED_LISTENERS"))
        .into_iter()
        .find(|(name, _)| name == "AUTH_INTERNAL")
        .expect("an AUTH_INTERNAL listener")
        .1;
    let mechanisms: BTreeSet<String> = native(&lib, "sasl.enabled.mechanisms")
        .split(',')
        .map(str::to_owned)
        .collect();
    let clients: Vec<&str> = compose.base.kafka_clients().map(|(name, _)| name).collect();
    assert!(!clients.is_empty());
    for name in clients {
        let service = compose
            .overlay
            .find(name)
            .unwrap_or_else(|| panic!("{OVERLAY}: {name} is a Kafka client and not on SASL_SSL"));
        let env = environment(service);
        assert_eq!(env_var(&env, name, "KAFKA_BROKERS"), internal, "{name}");
        assert_eq!(
            env_var(&env, name, "KAFKA_CLIENT_SECURITY_PROTOCOL"),
            "SASL_SSL"
        );
        let mechanism = env_var(&env, name, "KAFKA_CLIENT_SASL_MECHANISM");
        assert!(mechanisms.contains(&mechanism), "{name}: {mechanism}");
        assert_eq!(env_var(&env, name, "KAFKA_CLIENT_SASL_USERNAME"), name);
        assert!(
            example_users().iter().any(|user| user == name),
            "{name}: not a user of {KAFKA_USERS_FILE}"
        );
        assert_eq!(
            compose_default(&env_var(&env, name, "KAFKA_CLIENT_SASL_PASSWORD")),
            lib.scalar("KAFKA_SASL_PASSWORD")
        );
        assert_eq!(
            env_var(&env, name, "KAFKA_CLIENT_SSL_CA_LOCATION"),
            format!("{SECRETS}/ca.pem")
        );
        assert!(
            strings(service.at(&["volumes"])).contains(&format!("kafka-secrets:{SECRETS}:ro")),
            "{name}: the CA's volume"
        );
    }
}

/// One ACL: user, resource type, resource name, operation.
type Acl = (String, String, String, String);

/// The chart's example users, which the native broker and the overlay make, in order.
fn example_user_documents() -> Vec<YamlOwned> {
    load_yaml_documents(KAFKA_USERS_FILE)
        .into_iter()
        .filter(|d| text(d.at(&["kind"])) == "KafkaUser")
        .collect()
}

fn example_users() -> Vec<String> {
    example_user_documents()
        .iter()
        .map(|user| text(user.at(&["metadata", "name"])))
        .collect()
}

/// The ACLs of the chart's example users, with Strimzi's resource types spelled as
/// kafka-acls.sh spells its options (`transactionalId` is `transactional-id`).
fn example_acls() -> BTreeSet<Acl> {
    let mut acls = BTreeSet::new();
    for user in &example_user_documents() {
        let name = text(user.at(&["metadata", "name"]));
        let entries = user.at(&["spec", "authorization", "acls"]);
        for acl in entries.as_sequence().expect("acls is a list") {
            let kind = match text(acl.at(&["resource", "type"])).as_str() {
                "transactionalId" => "transactional-id".to_owned(),
                other => other.to_owned(),
            };
            let resource = acl.get(&["resource", "name"]).map(text).unwrap_or_default();
            // The overlay grants literal names only.
            let pattern = acl.get(&["resource", "patternType"]).map(text);
            assert!(
                matches!(pattern.as_deref(), None | Some("literal")),
                "{KAFKA_USERS_FILE}: {name}'s ACL on {resource} is {pattern:?}, which the \
                 overlay's lines cannot say"
            );
            for operation in strings(acl.at(&["operations"])) {
                acls.insert((name.clone(), kind.clone(), resource.clone(), operation));
            }
        }
    }
    acls
}

#[test]
fn the_overlay_grants_each_service_the_chart_examples_acls_and_nothing_more() {
    let compose = Overlaid::load(OVERLAY);
    let env = compose.environment("kafka-users");
    let mut granted = BTreeSet::new();
    for line in env_var(&env, "kafka-users", "ACLS").lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let [user, kind, name, operations] = words[..] else {
            panic!("ACLS: {line:?} is not `user type name operations`");
        };
        for operation in operations.split(',') {
            granted.insert((user.into(), kind.into(), name.into(), operation.into()));
        }
    }
    let example = example_acls();
    assert!(!example.is_empty(), "{KAFKA_USERS_FILE}: no ACL");
    assert_eq!(
        granted.difference(&example).collect::<Vec<_>>(),
        Vec::<&Acl>::new(),
        "granted by {OVERLAY}, not in {KAFKA_USERS_FILE}"
    );
    assert_eq!(
        example.difference(&granted).collect::<Vec<_>>(),
        Vec::<&Acl>::new(),
        "in {KAFKA_USERS_FILE}, not granted by {OVERLAY}"
    );
}
