//! Prometheus and Grafana: every service scraped, the dashboard provisioned and opened,
//! and every metric the services export on it.

use std::collections::BTreeSet;

use regex::Regex;
use saga_e2e::workspace_root;

use crate::lib_sh::LibSh;
use crate::read;
use crate::yaml::load_yaml;
use crate::yaml::{Compose, Node, env_var, environment, published_ports, strings, text};

const PROMETHEUS_CONFIG: &str = "deploy/prometheus/prometheus.yml";
const DASHBOARDS: &str = "deploy/grafana/dashboards";

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
    // The alert rules beside it, where its `rule_files` looks (relative to the file).
    let rules = strings(config.at(&["rule_files"]));
    for rule_file in &rules {
        assert!(
            strings(prometheus.at(&["volumes"])).contains(&format!(
                "./deploy/prometheus/{rule_file}:/etc/prometheus/{rule_file}:ro"
            )),
            "prometheus must read deploy/prometheus/{rule_file} beside its configuration"
        );
    }
    assert_eq!(rules, ["rules.yml"], "the shipped alert rules are loaded");
    let jobs = config
        .at(&["scrape_configs"])
        .as_sequence()
        .expect("a list");
    // Found by name, so that every copy of a scaled service is scraped.
    let mut targets: Vec<String> = jobs
        .iter()
        .flat_map(|job| job.at(&["dns_sd_configs"]).as_sequence().expect("a list"))
        .flat_map(|lookup| {
            assert_eq!(
                text(lookup.at(&["type"])),
                "A",
                "compose's DNS has A records"
            );
            let port = text(lookup.at(&["port"]));
            strings(lookup.at(&["names"]))
                .into_iter()
                .map(move |name| format!("{name}:{port}"))
        })
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
        relabel.contains("source_labels: [__meta_dns_name]")
            && relabel.contains("target_label: service"),
        "the dashboard groups by a `service` label, the name the copies share"
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
