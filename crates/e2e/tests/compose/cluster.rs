//! docker-compose.cluster.yml against the native three-node cluster
//! (`scripts/infra-up --brokers 3`): each node's settings and ports, and every client
//! given the three nodes.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use regex::Regex;

use crate::kafka::assert_configured_like;
use crate::lib_sh::LibSh;
use crate::yaml::port_pairs;
use crate::yaml::{Overlaid, env_var, listener_addresses, text};

/// The cluster's nodes in docker-compose.cluster.yml, in the order of
/// `KAFKA_CLUSTER_NODES` in scripts/lib.sh: the main file's broker is node 1.
const CLUSTER_NODES: [&str; 3] = ["kafka", "kafka-2", "kafka-3"];

/// docker-compose.yml with docker-compose.cluster.yml laid over it.
struct ClusterCompose(Overlaid);

impl std::ops::Deref for ClusterCompose {
    type Target = Overlaid;

    fn deref(&self) -> &Overlaid {
        &self.0
    }
}

impl ClusterCompose {
    fn load() -> Self {
        Self(Overlaid::load("docker-compose.cluster.yml"))
    }

    /// (listener, host:port) of `node`'s advertised listeners.
    fn advertised(&self, node: &str) -> Vec<(String, String)> {
        listener_addresses(&env_var(
            &self.environment(node),
            node,
            "KAFKA_ADVERTISED_LISTENERS",
        ))
    }

    /// The port `node` listens on for `listener`.
    fn listening_port(&self, node: &str, listener: &str) -> String {
        let listeners = env_var(&self.environment(node), node, "KAFKA_LISTENERS");
        listener_addresses(&listeners)
            .into_iter()
            .find(|(name, _)| name == listener)
            .and_then(|(_, address)| address.rsplit(':').next().map(str::to_owned))
            .unwrap_or_else(|| panic!("{node}: no {listener} listener in {listeners}"))
    }
}

#[test]
fn the_cluster_files_three_nodes_are_configured_like_the_native_cluster() {
    let cluster = ClusterCompose::load();
    let lib = LibSh::load();
    let ids = lib.array("KAFKA_CLUSTER_NODES");
    assert_eq!(
        ids.len(),
        CLUSTER_NODES.len(),
        "KAFKA_CLUSTER_NODES vs the compose nodes"
    );
    let voters: Vec<String> = CLUSTER_NODES
        .iter()
        .zip(&ids)
        .map(|(node, id)| format!("{id}@{node}:{}", cluster.listening_port(node, "CONTROLLER")))
        .collect();
    let version = lib.scalar("KAFKA_VERSION");
    let mut cluster_ids = BTreeSet::new();
    for (node, id) in CLUSTER_NODES.iter().zip(&ids) {
        let env = cluster.environment(node);
        assert_eq!(env_var(&env, node, "KAFKA_NODE_ID"), *id, "{node}: node id");
        assert_eq!(
            env_var(&env, node, "KAFKA_CONTROLLER_QUORUM_VOTERS"),
            voters.join(","),
            "{node}: every node a voter, at its controller listener"
        );
        cluster_ids.insert(env_var(&env, node, "CLUSTER_ID"));
        assert_configured_like(node, &env, "deploy/kafka/cluster.properties");
        assert_eq!(
            text(cluster.at(node, &["image"])),
            format!("apache/kafka:{version}"),
            "{node}: image vs KAFKA_VERSION in scripts/lib.sh"
        );
        assert_eq!(
            text(cluster.at(node, &["restart"])),
            "unless-stopped",
            "{node}: restart"
        );
    }
    assert_eq!(
        cluster_ids.len(),
        1,
        "one CLUSTER_ID for the three nodes: {cluster_ids:?}"
    );
}

#[test]
fn the_cluster_files_nodes_are_published_on_the_native_clusters_ports() {
    static PORT: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"kafka_node_port\(\) \{\s*echo \$\(\((\d+) \+ (\d+) \* \$1\)\)").unwrap()
    });
    let cluster = ClusterCompose::load();
    let lib = LibSh::load();
    let formula = PORT
        .captures(&lib.text)
        .unwrap_or_else(|| lib.changed("kafka_node_port() { echo $((BASE + STEP * $1)) }"));
    let (base, step): (u32, u32) = (formula[1].parse().unwrap(), formula[2].parse().unwrap());
    for (node, id) in CLUSTER_NODES.iter().zip(lib.array("KAFKA_CLUSTER_NODES")) {
        let native = (base + step * id.parse::<u32>().unwrap()).to_string();
        let host = cluster.listening_port(node, "HOST");
        assert_eq!(
            port_pairs(cluster.at(node, &["ports"])),
            vec![(native.clone(), host)],
            "{node}: published ports (host, container) vs kafka_node_port {id} in scripts/lib.sh"
        );
        let address = format!("{}:{native}", lib.scalar("KAFKA_HOST"));
        assert!(
            cluster
                .advertised(node)
                .iter()
                .any(|(l, a)| l == "HOST" && *a == address),
            "{node} does not advertise {address} to the host's clients: {:?}",
            cluster.advertised(node)
        );
    }
}

#[test]
fn on_the_cluster_every_kafka_client_reaches_all_three_nodes_and_kafka_init_waits_for_them() {
    let cluster = ClusterCompose::load();
    let internal: BTreeSet<String> = CLUSTER_NODES
        .iter()
        .flat_map(|node| {
            cluster
                .advertised(node)
                .into_iter()
                .filter(|(listener, _)| listener == "INTERNAL")
                .map(|(_, address)| address)
        })
        .collect();
    assert_eq!(
        internal.len(),
        3,
        "an internal listener per node: {internal:?}"
    );
    let mut clients = vec![("kafka-init".to_owned(), "BOOTSTRAP")];
    clients.extend(
        cluster
            .base
            .kafka_clients()
            .map(|(name, _)| (name.to_owned(), "KAFKA_BROKERS")),
    );
    for (name, variable) in clients {
        let brokers: BTreeSet<String> = env_var(&cluster.environment(&name), &name, variable)
            .split(',')
            .map(str::to_owned)
            .collect();
        assert_eq!(
            brokers, internal,
            "{name}: {variable} vs the nodes' internal listeners"
        );
    }
    for node in CLUSTER_NODES {
        assert_eq!(
            env_var(&cluster.environment("kafka-init"), "kafka-init", "REPLICAS"),
            env_var(
                &cluster.environment(node),
                node,
                "KAFKA_DEFAULT_REPLICATION_FACTOR"
            ),
            "kafka-init REPLICAS on the cluster vs {node}'s default replication factor"
        );
        assert_eq!(
            text(cluster.at("kafka-init", &["depends_on", node, "condition"])),
            "service_healthy",
            "kafka-init: depends_on {node} (a topic of three replicas needs three brokers)"
        );
    }
    for (name, _) in cluster.overlay.services() {
        assert!(
            cluster.base.find(name).is_some() || CLUSTER_NODES.contains(&name),
            "docker-compose.cluster.yml adds {name}, which is neither a node nor a service of docker-compose.yml"
        );
    }
}
