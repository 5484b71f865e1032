//! docker-compose.yml against the code and the native scripts (scripts/lib.sh): both
//! setups must run the same binaries with settings the binaries understand, on the same
//! ports, with the same topics and databases; and docker-compose.cluster.yml against the
//! native three-node cluster (scripts/infra-up --brokers 3). Nothing here needs Docker or the
//! infrastructure: the files are parsed, and each binary's `--help` says what it reads.
//!
//! The binaries must be built first (`cargo build --bins`; `scripts/test` does it).

use saga_e2e::workspace_root;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::LazyLock;

use regex::Regex;
use saphyr::{LoadableYamlNode, Scalar, YamlOwned};

const DOCKERFILE: &str = "deploy/Dockerfile";
const POSTGRES_INIT_FOLDER: &str = "deploy/postgres";
const POSTGRES_INIT_MOUNT: &str = "/docker-entrypoint-initdb.d";
const SERVICE_DATABASE_SQL: &str = "service-database.psql";
const PROMETHEUS_CONFIG: &str = "deploy/prometheus/prometheus.yml";
const DASHBOARDS: &str = "deploy/grafana/dashboards";

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
        for variable in environment(service).keys() {
            assert!(
                read.contains(variable),
                "{name} sets {variable}, which {binary} does not read; it reads {read:?}"
            );
        }
    }
}

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

    assert_eq!(
        env_var(&env, "kafka-init", "PARTITIONS"),
        lib.scalar("KAFKA_TOPIC_PARTITIONS"),
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
fn postgres_makes_each_service_its_own_role_and_database_as_the_native_scripts_do() {
    let compose = Compose::load();
    let postgres = compose.service("postgres");
    let mounted = strings(postgres.at(&["volumes"])).iter().any(|volume| {
        volume.starts_with(&format!("./{POSTGRES_INIT_FOLDER}:{POSTGRES_INIT_MOUNT}"))
    });
    assert!(
        mounted,
        "postgres does not mount ./{POSTGRES_INIT_FOLDER} on {POSTGRES_INIT_MOUNT}"
    );

    // The same SQL as natively: scripts/infra-up feeds it to psql too.
    let init = read(
        &workspace_root()
            .join(POSTGRES_INIT_FOLDER)
            .join("init-databases.sh"),
    );
    assert!(
        init.contains(&format!("-f {POSTGRES_INIT_MOUNT}/{SERVICE_DATABASE_SQL}")),
        "init-databases.sh does not run {SERVICE_DATABASE_SQL}"
    );
    assert!(
        read(&workspace_root().join("scripts/infra-up")).contains(&format!(
            "$ROOT/{POSTGRES_INIT_FOLDER}/{SERVICE_DATABASE_SQL}"
        )),
        "scripts/infra-up does not run {POSTGRES_INIT_FOLDER}/{SERVICE_DATABASE_SQL}"
    );

    let lib = LibSh::load();
    let mut created = created_databases(&init);
    created.sort();
    let mut native: Vec<(String, String)> = lib
        .array("SERVICES")
        .iter()
        .map(|service| {
            (
                lib.case("service_role", service),
                lib.case("service_database", service),
            )
        })
        .collect();
    native.sort();
    assert_eq!(
        created, native,
        "(role, database) made by init-databases.sh vs service_role and service_database \
         in scripts/lib.sh"
    );
    let mut databases: Vec<String> = created.iter().map(|(_, db)| db.clone()).collect();
    let mut listed = lib.array("PG_DATABASES");
    databases.sort();
    listed.sort();
    assert_eq!(databases, listed, "init-databases.sh vs PG_DATABASES");

    let mut used: Vec<String> = compose
        .built_services()
        .map(|(name, service)| database_url(service, name).database)
        .collect();
    used.sort();
    assert_eq!(
        databases, used,
        "databases created by init-databases.sh vs those in the services' DATABASE_URL"
    );
}

#[test]
fn each_service_logs_in_as_its_own_role_with_the_native_setups_password() {
    let compose = Compose::load();
    let lib = LibSh::load();
    let postgres = environment(compose.service("postgres"));
    assert_eq!(
        env_var(&postgres, "postgres", "POSTGRES_USER"),
        lib.scalar("PG_USER"),
        "POSTGRES_USER (the administrator) vs PG_USER"
    );
    assert_eq!(
        env_var(&postgres, "postgres", "POSTGRES_PASSWORD"),
        lib.scalar("PG_PASSWORD"),
        "POSTGRES_PASSWORD vs PG_PASSWORD"
    );

    let mut roles = Vec::new();
    for (name, service) in compose.built_services() {
        let url = database_url(service, name);
        let role = lib.case("service_role", name);
        assert_eq!(
            url.database,
            lib.case("service_database", name),
            "{name}: DATABASE_URL's database vs service_database in scripts/lib.sh"
        );
        assert_eq!(
            url.user, role,
            "{name}: DATABASE_URL logs in as another role than service_role in scripts/lib.sh"
        );
        assert_eq!(
            url.host_port, "postgres:5432",
            "{name}: DATABASE_URL does not point at the postgres container"
        );
        assert_eq!(
            url.password,
            password_setting(&role),
            "{name}: DATABASE_URL's password is not its role's setting"
        );
        roles.push(role);
    }
    // postgres is given every role's password, readers' included, under the same setting.
    roles.extend(
        lib.array("PG_DATABASES")
            .iter()
            .map(|db| format!("{db}_reader")),
    );
    for role in roles {
        let variable = format!("PG_PASSWORD_{}", role.to_uppercase());
        assert_eq!(
            env_var(&postgres, "postgres", &variable),
            password_setting(&role),
            "postgres: {variable}"
        );
    }
}

/// `${PG_PASSWORD_<ROLE>:-<the native default>}`: overridable as natively, the same
/// password when not.
fn password_setting(role: &str) -> String {
    format!(
        "${{PG_PASSWORD_{}:-{}}}",
        role.to_uppercase(),
        saga_testkit::role_password(role)
    )
}

#[test]
fn each_service_listens_is_published_and_is_health_checked_on_its_native_port() {
    let compose = Compose::load();
    let lib = LibSh::load();
    for (name, service) in compose.built_services() {
        let port = lib.case("service_port", name);

        let http_addr = env_var(&environment(service), name, "HTTP_ADDR");
        assert_eq!(
            http_addr,
            format!("0.0.0.0:{port}"),
            "{name}: HTTP_ADDR must listen on all interfaces (to be reachable through the \
             published port) on service_port from scripts/lib.sh"
        );

        let published = published_ports(service);
        assert_eq!(
            published,
            vec![(port.clone(), port.clone())],
            "{name}: published ports (host, container) vs service_port in scripts/lib.sh"
        );

        let check = strings(service.at(&["healthcheck", "test"])).join(" ");
        assert!(
            check.contains(&format!("http://127.0.0.1:{port}/health")),
            "{name}: the healthcheck does not ask /health on port {port}: {check}"
        );

        let default = help_default(compose.binary(name), "HTTP_ADDR");
        assert!(
            default.ends_with(&format!(":{port}")),
            "{name}: the binary's own default HTTP_ADDR {default} is not on service_port {port}"
        );
    }
}

#[test]
fn postgres_and_kafka_are_published_on_the_native_ports() {
    let compose = Compose::load();
    let lib = LibSh::load();
    for (service, variable) in [("postgres", "PG_PORT"), ("kafka", "KAFKA_PORT")] {
        let port = lib.scalar(variable);
        assert_eq!(
            published_ports(compose.service(service)),
            vec![(port.clone(), port.clone())],
            "{service}: published ports (host, container) vs {variable} in scripts/lib.sh"
        );
    }
    let kafka = environment(compose.service("kafka"));
    let host_address = format!("{}:{}", lib.scalar("KAFKA_HOST"), lib.scalar("KAFKA_PORT"));
    let advertised = env_var(&kafka, "kafka", "KAFKA_ADVERTISED_LISTENERS");
    assert!(
        listener_addresses(&advertised)
            .iter()
            .any(|(_, address)| *address == host_address),
        "kafka does not advertise {host_address}, where the host's clients (scripts/lib.sh \
         KAFKA_BOOTSTRAP) reach it: {advertised}"
    );
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

#[test]
fn the_broker_is_configured_like_the_native_one() {
    let compose = Compose::load();
    let env = environment(compose.service("kafka"));
    assert_configured_like("kafka", &env, "deploy/kafka/server.properties");
}

/// Every setting of the native properties file `file` but the place-specific ones is
/// the container's `KAFKA_<NAME>` variable, and the other way round.
fn assert_configured_like(service: &str, env: &BTreeMap<String, String>, file: &str) {
    let properties = read(&workspace_root().join(file));
    let mut native = BTreeMap::new();
    for line in properties.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("{file}: not key=value: {line}"));
        if !PLACE_SPECIFIC.contains(&key) {
            // The image's convention: KAFKA_ and the property in upper case, `.` as `_`.
            let variable = format!("KAFKA_{}", key.to_uppercase().replace('.', "_"));
            native.insert(variable, value.to_owned());
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

#[test]
fn payment_service_calls_the_provider_container_on_its_native_port() {
    let compose = Compose::load();
    let lib = LibSh::load();
    let url = env_var(
        &environment(compose.service("payment-service")),
        "payment-service",
        "PROVIDER_URL",
    );
    let port = lib.case("service_port", "payment-provider");
    assert_eq!(url, format!("http://payment-provider:{port}"));
    assert_eq!(
        help_default("payment-service", "PROVIDER_URL"),
        format!("http://127.0.0.1:{port}"),
        "payment-service's own default PROVIDER_URL is not the native provider"
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

#[test]
fn prometheus_scrapes_every_service_on_its_native_port_labelled_by_name() {
    let compose = Compose::load();
    let lib = LibSh::load();
    let prometheus = compose.service("prometheus");
    assert!(
        strings(prometheus.at(&["volumes"])).contains(&format!(
            "./{PROMETHEUS_CONFIG}:/etc/prometheus/prometheus.yml:ro"
        )),
        "prometheus must read {PROMETHEUS_CONFIG} where the image looks for its configuration"
    );
    let config = load_yaml(PROMETHEUS_CONFIG);
    let jobs = config
        .at(&["scrape_configs"])
        .as_sequence()
        .expect("a list");
    let mut targets: Vec<String> = jobs
        .iter()
        .flat_map(|job| job.at(&["static_configs"]).as_sequence().expect("a list"))
        .flat_map(|targets| strings(targets.at(&["targets"])))
        .collect();
    targets.sort();
    let mut wanted: Vec<String> = compose
        .built_services()
        .map(|(name, _)| format!("{name}:{}", lib.case("service_port", name)))
        .collect();
    wanted.sort();
    assert_eq!(
        targets, wanted,
        "{PROMETHEUS_CONFIG}: every built service, at service_port in scripts/lib.sh"
    );
    let relabel = read(&workspace_root().join(PROMETHEUS_CONFIG));
    assert!(
        relabel.contains("target_label: service"),
        "the dashboard groups by a `service` label"
    );
    assert_eq!(
        published_ports(prometheus),
        vec![("9090".to_owned(), "9090".to_owned())]
    );
}

#[test]
fn grafana_reads_the_compose_prometheus_and_opens_on_the_saga_dashboard() {
    let compose = Compose::load();
    let grafana = compose.service("grafana");
    let volumes = strings(grafana.at(&["volumes"]));
    for mount in [
        "./deploy/grafana/provisioning:/etc/grafana/provisioning:ro",
        &format!("./{DASHBOARDS}:/var/lib/grafana/dashboards:ro"),
    ] {
        assert!(
            volumes.iter().any(|v| v == mount),
            "grafana: no volume {mount}"
        );
    }
    let datasource = load_yaml("deploy/grafana/provisioning/datasources/prometheus.yml");
    let url = text(datasource.at(&["datasources"]).as_sequence().unwrap()[0].at(&["url"]));
    let port = &published_ports(compose.service("prometheus"))[0].1;
    assert_eq!(url, format!("http://prometheus:{port}"));
    let provider = load_yaml("deploy/grafana/provisioning/dashboards/order-saga.yml");
    let path = text(provider.at(&["providers"]).as_sequence().unwrap()[0].at(&["options", "path"]));
    assert_eq!(path, "/var/lib/grafana/dashboards");
    let home = env_var(
        &environment(grafana),
        "grafana",
        "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH",
    );
    let file = home
        .strip_prefix("/var/lib/grafana/dashboards/")
        .unwrap_or_else(|| panic!("{home} is not in the mounted dashboards"));
    assert!(
        workspace_root().join(DASHBOARDS).join(file).is_file(),
        "{home}"
    );
    assert_eq!(
        published_ports(grafana),
        vec![("3000".to_owned(), "3000".to_owned())]
    );
}

/// A metric renamed in the code and not on the dashboard would leave a panel empty
/// without a word; one added and not shown would go unseen.
#[test]
fn the_dashboard_queries_every_metric_the_services_export_and_no_other() {
    let exported: BTreeSet<String> = Regex::new(r#"pub const [A-Z_]+: &str = "(saga_[a-z_]+)""#)
        .unwrap()
        .captures_iter(&read(&workspace_root().join("crates/saga/src/metrics.rs")))
        .map(|c| c[1].to_owned())
        .collect();
    assert!(exported.len() > 10, "{exported:?}");
    let dashboard: serde_json::Value = serde_json::from_str(&read(
        &workspace_root().join(DASHBOARDS).join("order-saga.json"),
    ))
    .unwrap();
    let name = Regex::new(r"saga_[a-z_]+").unwrap();
    let mut queried = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            for found in name.find_iter(expr) {
                let series = found.as_str();
                let metric = ["_bucket", "_count", "_sum"]
                    .iter()
                    .find_map(|suffix| series.strip_suffix(suffix))
                    .filter(|base| exported.contains(*base))
                    .unwrap_or(series);
                queried.insert(metric.to_owned());
            }
        }
    }
    assert_eq!(queried, exported, "queried on the dashboard vs exported");
}

// ------------------------------------------------------ docker-compose.cluster.yml

/// The cluster's nodes in docker-compose.cluster.yml, in the order of
/// `KAFKA_CLUSTER_NODES` in scripts/lib.sh: the main file's broker is node 1.
const CLUSTER_NODES: [&str; 3] = ["kafka", "kafka-2", "kafka-3"];

/// docker-compose.yml with docker-compose.cluster.yml laid over it, as
/// `docker compose -f docker-compose.yml -f docker-compose.cluster.yml` merges them:
/// environments key by key.
struct ClusterCompose {
    base: Compose,
    overlay: Compose,
}

impl ClusterCompose {
    fn load() -> Self {
        Self {
            base: Compose::load(),
            overlay: Compose::load_file("docker-compose.cluster.yml"),
        }
    }

    fn environment(&self, name: &str) -> BTreeMap<String, String> {
        let mut env = self.base.find(name).map(environment).unwrap_or_default();
        env.extend(self.overlay.find(name).map(environment).unwrap_or_default());
        env
    }

    /// A setting of the overlay's, or else the main file's.
    fn at(&self, name: &str, path: &[&str]) -> &YamlOwned {
        self.overlay
            .find(name)
            .and_then(|s| s.get(path))
            .or_else(|| self.base.find(name).and_then(|s| s.get(path)))
            .unwrap_or_else(|| panic!("{name}: no {} in either compose file", path.join(".")))
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

// ------------------------------------------------------------------- compose file

struct Compose {
    root: YamlOwned,
}

impl Compose {
    fn load() -> Self {
        Self::load_file("docker-compose.yml")
    }

    fn load_file(name: &str) -> Self {
        let path = workspace_root().join(name);
        let mut documents = YamlOwned::load_from_str(&read(&path))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(documents.len(), 1, "{}: one YAML document", path.display());
        Self {
            root: documents.remove(0),
        }
    }

    fn services(&self) -> impl Iterator<Item = (&str, &YamlOwned)> {
        self.root
            .at(&["services"])
            .as_mapping()
            .expect("`services` is a mapping")
            .iter()
            .map(|(name, service)| (name.as_str().expect("service names are strings"), service))
    }

    fn service(&self, name: &str) -> &YamlOwned {
        self.find(name)
            .unwrap_or_else(|| panic!("the compose file has no service {name}"))
    }

    fn find(&self, name: &str) -> Option<&YamlOwned> {
        self.services()
            .find(|(n, _)| *n == name)
            .map(|(_, service)| service)
    }

    /// The services whose image is built from the project's Dockerfile.
    fn built_services(&self) -> impl Iterator<Item = (&str, &YamlOwned)> {
        self.services().filter(|(_, service)| {
            service
                .get(&["build", "dockerfile"])
                .is_some_and(|dockerfile| text(dockerfile) == DOCKERFILE)
        })
    }

    /// The binary a built service runs: the first word of its command (the image has no
    /// entrypoint).
    /// The built services whose binaries read Kafka settings.
    fn kafka_clients(&self) -> impl Iterator<Item = (&str, &YamlOwned)> {
        self.built_services()
            .filter(|(name, _)| variables_read_by(self.binary(name)).contains("KAFKA_BROKERS"))
    }

    fn binary(&self, name: &str) -> &str {
        let service = self.service(name);
        assert!(
            service.get(&["entrypoint"]).is_none(),
            "{name}: an entrypoint would run instead of the binary named by `command`"
        );
        match service.at(&["command"]) {
            YamlOwned::Sequence(words) => words
                .first()
                .and_then(YamlOwned::as_str)
                .unwrap_or_else(|| panic!("{name}: empty command")),
            other => panic!("{name}: write `command` as a list (exec form), not {other:?}"),
        }
    }
}

trait Node {
    fn get(&self, path: &[&str]) -> Option<&YamlOwned>;
    fn at(&self, path: &[&str]) -> &YamlOwned;
}

impl Node for YamlOwned {
    fn get(&self, path: &[&str]) -> Option<&YamlOwned> {
        path.iter()
            .try_fold(self, |node, key| node.as_mapping_get(key))
    }

    fn at(&self, path: &[&str]) -> &YamlOwned {
        self.get(path)
            .unwrap_or_else(|| panic!("docker-compose.yml: no {} here", path.join(".")))
    }
}

/// A scalar as compose reads it: environment values and ports may be written unquoted.
fn text(node: &YamlOwned) -> String {
    match node {
        YamlOwned::Value(scalar) => match scalar.as_scalar() {
            Scalar::String(s) => s.into_owned(),
            Scalar::Integer(i) => i.to_string(),
            Scalar::Boolean(b) => b.to_string(),
            Scalar::FloatingPoint(f) => f.to_string(),
            Scalar::Null => String::new(),
        },
        other => panic!("docker-compose.yml: expected a scalar, found {other:?}"),
    }
}

fn strings(node: &YamlOwned) -> Vec<String> {
    match node {
        YamlOwned::Sequence(items) => items.iter().map(text).collect(),
        // `!override`, `!reset`: what the value replaces is the overlay's business.
        YamlOwned::Tagged(_, inner) => strings(inner),
        other => vec![text(other)],
    }
}

/// A service's `environment`, in either of compose's two forms.
fn environment(service: &YamlOwned) -> BTreeMap<String, String> {
    match service.get(&["environment"]) {
        None => BTreeMap::new(),
        Some(YamlOwned::Mapping(map)) => map.iter().map(|(k, v)| (text(k), text(v))).collect(),
        Some(YamlOwned::Sequence(items)) => items
            .iter()
            .map(|item| {
                let item = text(item);
                let (k, v) = item.split_once('=').unwrap_or((&item, ""));
                (k.to_owned(), v.to_owned())
            })
            .collect(),
        Some(other) => panic!("environment is neither a mapping nor a list: {other:?}"),
    }
}

fn env_var(env: &BTreeMap<String, String>, service: &str, name: &str) -> String {
    env.get(name)
        .unwrap_or_else(|| panic!("{service} does not set {name}"))
        .clone()
}

/// (host port, container port) of each `ports` entry, e.g. "127.0.0.1:8080:8080".
fn published_ports(service: &YamlOwned) -> Vec<(String, String)> {
    port_pairs(service.at(&["ports"]))
}

/// (host port, container port) of each entry of a `ports` list.
fn port_pairs(ports: &YamlOwned) -> Vec<(String, String)> {
    strings(ports)
        .iter()
        .map(|spec| {
            let parts: Vec<&str> = spec.split(':').collect();
            match parts[..] {
                [.., host, container] => (host.to_owned(), container.to_owned()),
                _ => panic!("port {spec}: write it as [ip:]host:container"),
            }
        })
        .collect()
}

/// `NAME://host:port,...` as (NAME, host:port) pairs.
fn listener_addresses(listeners: &str) -> Vec<(String, String)> {
    listeners
        .split(',')
        .map(|listener| {
            let (name, address) = listener
                .split_once("://")
                .unwrap_or_else(|| panic!("not NAME://host:port: {listener}"));
            (name.to_owned(), address.to_owned())
        })
        .collect()
}

struct DatabaseUrl {
    user: String,
    password: String,
    host_port: String,
    database: String,
}

fn database_url(service: &YamlOwned, name: &str) -> DatabaseUrl {
    static URL: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"^postgres(?:ql)?://([^:@/]+):([^@/]*)@([^/]+)/([^/?]+)$").unwrap()
    });
    let url = env_var(&environment(service), name, "DATABASE_URL");
    let parts = URL.captures(&url).unwrap_or_else(|| {
        panic!("{name}: DATABASE_URL {url} is not postgres://user:password@host:port/database")
    });
    DatabaseUrl {
        user: parts[1].to_owned(),
        password: parts[2].to_owned(),
        host_port: parts[3].to_owned(),
        database: parts[4].to_owned(),
    }
}

/// The (role, database) pairs init-databases.sh makes: `for pair in role:database ...; do`.
fn created_databases(init: &str) -> Vec<(String, String)> {
    static PAIR: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\b(\w+):(\w+)\b").unwrap());
    let list = init
        .split_once("for pair in ")
        .and_then(|(_, rest)| rest.split_once("; do"))
        .map(|(list, _)| list)
        .expect("init-databases.sh: `for pair in role:database ...; do`");
    PAIR.captures_iter(list)
        .map(|c| (c[1].to_owned(), c[2].to_owned()))
        .collect()
}

// ------------------------------------------------------------------ scripts/lib.sh

/// scripts/lib.sh read as text, not run: only the simple shapes it uses for its
/// settings are understood, and any other shape fails the test naming what to update.
struct LibSh {
    text: String,
}

impl LibSh {
    fn load() -> Self {
        Self {
            text: read(&workspace_root().join("scripts/lib.sh")),
        }
    }

    fn changed(&self, what: &str) -> ! {
        panic!(
            "scripts/lib.sh: cannot find {what} in the shape this test parses; \
             if lib.sh changed, update crates/e2e/tests/compose.rs to match"
        )
    }

    /// `NAME=(a b c)`, on one line or several, with comments.
    fn array(&self, name: &str) -> Vec<String> {
        let start = Regex::new(&format!(r"(?m)^{name}=\(")).unwrap();
        let found = start
            .find(&self.text)
            .unwrap_or_else(|| self.changed(&format!("the array {name}=(...)")));
        let body = &self.text[found.end()..];
        let body = &body[..body
            .find(')')
            .unwrap_or_else(|| self.changed(&format!("the end of {name}=(...)")))];
        let words: Vec<String> = body
            .lines()
            .map(|line| line.split('#').next().unwrap())
            .flat_map(str::split_whitespace)
            .map(str::to_owned)
            .collect();
        if words.is_empty() {
            self.changed(&format!("elements in {name}=(...)"));
        }
        words
    }

    /// `NAME=value`, `NAME="value"` or `NAME="${OVERRIDE:-value}"`: the value (the
    /// default, when the environment may override it).
    fn scalar(&self, name: &str) -> String {
        let line = Regex::new(&format!(
            r#"(?m)^{name}=(?:"\$\{{[A-Z_]+:-([^}}"]*)\}}"|"([^"$]*)"|([^\s"$]+))\s*$"#
        ))
        .unwrap();
        let captures = line
            .captures(&self.text)
            .unwrap_or_else(|| self.changed(&format!("the setting {name}=value")));
        (1..=3)
            .find_map(|i| captures.get(i))
            .map(|m| m.as_str().to_owned())
            .unwrap()
    }

    /// The `echo` of `function`'s case branch for `key`:
    /// `function() { case "$1" in key) echo value ;; ... esac }`.
    fn case(&self, function: &str, key: &str) -> String {
        let header = format!("{function}() {{");
        let start = self
            .text
            .find(&header)
            .unwrap_or_else(|| self.changed(&format!("the function {function}")));
        let body = &self.text[start..];
        let body = &body[..body
            .find("esac")
            .unwrap_or_else(|| self.changed(&format!("the case statement of {function}")))];
        let branch = Regex::new(&format!(
            r"(?m)^\s*{}\)\s*echo\s+(\S+)\s*;;",
            regex::escape(key)
        ))
        .unwrap();
        branch
            .captures(body)
            .map(|c| c[1].to_owned())
            .unwrap_or_else(|| self.changed(&format!("`{key}) echo ...` in {function}")))
    }
}

// ----------------------------------------------------------------------- binaries

/// Every environment variable `binary` reads: its settings, as its `--help` lists them
/// (clap prints `[env: NAME=]`, or `[env: NAME]` where it hides the value), and those the logging setup reads itself.
fn variables_read_by(binary: &str) -> BTreeSet<String> {
    static ENV: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"\[env: ([A-Z][A-Z0-9_]*)[=\]]").unwrap());
    let help = help(binary);
    let mut read: BTreeSet<String> = ENV.captures_iter(&help).map(|c| c[1].to_owned()).collect();
    assert!(
        !read.is_empty(),
        "{binary} --help names no variable:\n{help}"
    );
    read.extend(logging_variables());
    read
}

/// The variables that `saga::telemetry` reads outside clap: `std::env::var("NAME")`, and
/// `RUST_LOG` when it builds its filter from tracing-subscriber's default variable.
fn logging_variables() -> Vec<String> {
    static VAR: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r#"env::var\("([A-Z][A-Z0-9_]*)"\)"#).unwrap());
    let source = read(&workspace_root().join("crates/saga/src/telemetry.rs"));
    let mut variables: Vec<String> = VAR
        .captures_iter(&source)
        .map(|c| c[1].to_owned())
        .collect();
    if source.contains("from_default_env") {
        variables.push("RUST_LOG".to_owned());
    }
    variables
}

/// The `[default: ...]` that `binary --help` shows for the setting read from `variable`.
fn help_default(binary: &str, variable: &str) -> String {
    let help = help(binary);
    let pattern = Regex::new(&format!(
        r"\[env: {}=[^\]]*\]\s*\[default: ([^\]]*)\]",
        regex::escape(variable)
    ))
    .unwrap();
    pattern
        .captures(&help)
        .map(|c| c[1].to_owned())
        .unwrap_or_else(|| panic!("{binary} --help shows no default for {variable}:\n{help}"))
}

fn help(binary: &str) -> String {
    let path = binary_path(binary);
    // A clean environment: clap would print the values of any variables set here.
    let output = Command::new(&path)
        .arg("--help")
        .env_clear()
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
    assert!(
        output.status.success(),
        "{} --help failed: {}",
        path.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("--help prints UTF-8")
}

/// The built binary next to this test's own target folder.
fn binary_path(binary: &str) -> PathBuf {
    let test_exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/<test> -> target/<profile>/<binary>
    let path = test_exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lives in target/<profile>/deps")
        .join(binary);
    assert!(
        path.exists(),
        "{} not found: build the services first (`cargo build --bins`, as scripts/test does)",
        path.display()
    );
    path
}

/// The workspace's binary crates: `crates/<name>` with a `src/main.rs`, whose package
/// (and so binary) name is the folder's.
fn workspace_binaries() -> Vec<String> {
    let crates = workspace_root().join("crates");
    let mut binaries = Vec::new();
    for entry in std::fs::read_dir(&crates).unwrap() {
        let folder = entry.unwrap().path();
        if !folder.join("src/main.rs").exists() {
            continue;
        }
        let name = folder.file_name().unwrap().to_str().unwrap().to_owned();
        let manifest = read(&folder.join("Cargo.toml"));
        assert!(
            manifest.contains(&format!("\nname = \"{name}\"\n")),
            "{}: the package is not named after its folder {name}",
            folder.display()
        );
        binaries.push(name);
    }
    binaries
}

// ------------------------------------------------------------------------ helpers

/// A YAML file of the project's, parsed.
fn load_yaml(path: &str) -> YamlOwned {
    let mut documents = YamlOwned::load_from_str(&read(&workspace_root().join(path)))
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(documents.len(), 1, "{path}: one YAML document");
    documents.remove(0)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
