//! The compose files and the project's other YAML, parsed, and read the way compose
//! reads them.

use std::collections::BTreeMap;

use saga_e2e::workspace_root;
use saphyr::{LoadableYamlNode, Scalar, YamlOwned};

use crate::binaries::variables_read_by;
use crate::{DOCKERFILE, read};

pub(crate) struct Compose {
    root: YamlOwned,
}

impl Compose {
    pub(crate) fn load() -> Self {
        Self::load_file("docker-compose.yml")
    }

    pub(crate) fn load_file(name: &str) -> Self {
        let path = workspace_root().join(name);
        let mut documents = YamlOwned::load_from_str(&read(&path))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(documents.len(), 1, "{}: one YAML document", path.display());
        Self {
            root: documents.remove(0),
        }
    }

    pub(crate) fn services(&self) -> impl Iterator<Item = (&str, &YamlOwned)> {
        self.root
            .at(&["services"])
            .as_mapping()
            .expect("`services` is a mapping")
            .iter()
            .map(|(name, service)| (name.as_str().expect("service names are strings"), service))
    }

    pub(crate) fn service(&self, name: &str) -> &YamlOwned {
        self.find(name)
            .unwrap_or_else(|| panic!("the compose file has no service {name}"))
    }

    pub(crate) fn find(&self, name: &str) -> Option<&YamlOwned> {
        self.services()
            .find(|(n, _)| *n == name)
            .map(|(_, service)| service)
    }

    /// The services whose image is built from the project's Dockerfile.
    pub(crate) fn built_services(&self) -> impl Iterator<Item = (&str, &YamlOwned)> {
        self.services().filter(|(_, service)| {
            service
                .get(&["build", "dockerfile"])
                .is_some_and(|dockerfile| text(dockerfile) == DOCKERFILE)
        })
    }

    /// The built services whose binaries read Kafka settings.
    pub(crate) fn kafka_clients(&self) -> impl Iterator<Item = (&str, &YamlOwned)> {
        self.built_services()
            .filter(|(name, _)| variables_read_by(self.binary(name)).contains("KAFKA_BROKERS"))
    }

    /// The binary a built service runs: the first word of its command (the image has no
    /// entrypoint).
    pub(crate) fn binary(&self, name: &str) -> &str {
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

pub(crate) trait Node {
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

/// docker-compose.yml with an overlay file laid over it, as `docker compose -f
/// docker-compose.yml -f <overlay>` merges them: environments key by key, any other
/// setting the overlay's if it has one.
pub(crate) struct Overlaid {
    pub(crate) base: Compose,
    pub(crate) overlay: Compose,
}

impl Overlaid {
    pub(crate) fn load(overlay: &str) -> Self {
        Self {
            base: Compose::load(),
            overlay: Compose::load_file(overlay),
        }
    }

    pub(crate) fn environment(&self, name: &str) -> BTreeMap<String, String> {
        let mut env = self.base.find(name).map(environment).unwrap_or_default();
        env.extend(self.overlay.find(name).map(environment).unwrap_or_default());
        env
    }

    /// A setting of the overlay's, or else the main file's.
    pub(crate) fn at(&self, name: &str, path: &[&str]) -> &YamlOwned {
        self.overlay
            .find(name)
            .and_then(|s| s.get(path))
            .or_else(|| self.base.find(name).and_then(|s| s.get(path)))
            .unwrap_or_else(|| panic!("{name}: no {} in either compose file", path.join(".")))
    }
}

/// A scalar as compose reads it: environment values and ports may be written unquoted.
pub(crate) fn text(node: &YamlOwned) -> String {
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

pub(crate) fn strings(node: &YamlOwned) -> Vec<String> {
    match node {
        YamlOwned::Sequence(items) => items.iter().map(text).collect(),
        // `!override`, `!reset`: what the value replaces is the overlay's business.
        YamlOwned::Tagged(_, inner) => strings(inner),
        other => vec![text(other)],
    }
}

/// A service's `environment`, in either of compose's two forms.
pub(crate) fn environment(service: &YamlOwned) -> BTreeMap<String, String> {
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

pub(crate) fn env_var(env: &BTreeMap<String, String>, service: &str, name: &str) -> String {
    env.get(name)
        .unwrap_or_else(|| panic!("{service} does not set {name}"))
        .clone()
}

/// (host port, container port) of each `ports` entry, e.g. "127.0.0.1:8080:8080".
pub(crate) fn published_ports(service: &YamlOwned) -> Vec<(String, String)> {
    port_pairs(service.at(&["ports"]))
}

/// (host port, container port) of each entry of a `ports` list.
pub(crate) fn port_pairs(ports: &YamlOwned) -> Vec<(String, String)> {
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
pub(crate) fn listener_addresses(listeners: &str) -> Vec<(String, String)> {
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

/// A YAML file of the project's, parsed.
pub(crate) fn load_yaml(path: &str) -> YamlOwned {
    let mut documents = load_yaml_documents(path);
    assert_eq!(documents.len(), 1, "{path}: one YAML document");
    documents.remove(0)
}

/// A YAML file of the project's that holds several documents, parsed.
pub(crate) fn load_yaml_documents(path: &str) -> Vec<YamlOwned> {
    YamlOwned::load_from_str(&read(&workspace_root().join(path)))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}
