//! Kafka client properties from the environment, under one prefix: `KAFKA_CLIENT_<NAME>`
//! is the librdkafka property `<name>` in lower case with `_` read as `.`
//! (`KAFKA_CLIENT_SECURITY_PROTOCOL` is `security.protocol`), and `KAFKA_CLIENT_<NAME>_FILE`
//! reads its value from a file, as Docker and Kubernetes mount secrets. Every client the
//! saga makes is given them ([`config`]): consumers, producers, admin clients, the tools'.
//!
//! A property the saga sets itself because its guarantees rest on it is refused at start
//! (see [`RESERVED`]) rather than overridden in silence either way: a user who sets one
//! expects it to take effect, and it must not.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use rdkafka::ClientConfig;

/// What every client property variable starts with.
pub const PREFIX: &str = "KAFKA_CLIENT_";

/// For every binary's `--help`.
pub const HELP: &str = "\
Kafka client (TLS, SASL, tuning), for every client the process makes:
  KAFKA_CLIENT_<PROPERTY>       the librdkafka property <property>, lower case, `_` as `.`:
                                KAFKA_CLIENT_SECURITY_PROTOCOL=SASL_SSL is security.protocol
  KAFKA_CLIENT_<PROPERTY>_FILE  the same, read from a file (trailing newline dropped), e.g.
                                KAFKA_CLIENT_SASL_PASSWORD_FILE=/run/secrets/kafka-password
  Refused: bootstrap.servers (KAFKA_BROKERS), group.id (KAFKA_NAMESPACE), and what the
  saga's guarantees rest on: acks, enable.idempotence, enable.auto.commit,
  enable.auto.offset.store, auto.offset.reset, isolation.level, transactional.id";

/// Properties the saga sets, and why a user may not: the error names the variable and
/// this reason.
pub const RESERVED: &[(&str, &str)] = &[
    ("bootstrap.servers", "set KAFKA_BROKERS instead"),
    (
        "group.id",
        "the group is the service's name under KAFKA_NAMESPACE",
    ),
    (
        "acks",
        "the relay marks a row published only once every in-sync replica holds it",
    ),
    (
        "enable.idempotence",
        "without it a retried send could duplicate or reorder an order's events",
    ),
    (
        "enable.auto.commit",
        "offsets are committed only after a record's transaction commits",
    ),
    (
        "enable.auto.offset.store",
        "offsets are committed only after a record's transaction commits",
    ),
    (
        "auto.offset.reset",
        "a new group starts from the earliest record, so none is skipped",
    ),
    (
        "isolation.level",
        "a relay's Kafka transaction that was aborted (its holder fenced) must stay unseen",
    ),
    (
        "transactional.id",
        "the relay's is the service's, shared by its every copy, so that one fences another",
    ),
];

/// The client properties the environment gives, by property name, with the variable each
/// came from (for errors that name the setting to fix).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientProperties {
    properties: BTreeMap<String, (String, String)>,
}

/// Why the environment's client properties were refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PropertyError {
    #[error("{variable}: {property} is set by the saga itself: {why}")]
    Reserved {
        variable: String,
        property: String,
        why: &'static str,
    },
    #[error("{0} and {0}_FILE are both set: give the value one way")]
    Both(String),
    #[error("{variable}: cannot read {path}: {error}")]
    File {
        variable: String,
        path: String,
        error: String,
    },
    #[error("{0}: names no property")]
    Empty(String),
}

impl ClientProperties {
    /// From this process's environment.
    pub fn from_env() -> Result<Self, PropertyError> {
        Self::from_vars(std::env::vars(), |path| std::fs::read_to_string(path))
    }

    /// From `vars` (name, value), reading `_FILE` values with `read`.
    pub fn from_vars(
        vars: impl IntoIterator<Item = (String, String)>,
        read: impl Fn(&str) -> std::io::Result<String>,
    ) -> Result<Self, PropertyError> {
        let mut properties = BTreeMap::new();
        for (variable, value) in vars {
            let Some(name) = variable.strip_prefix(PREFIX) else {
                continue;
            };
            let (name, from_file) = match name.strip_suffix("_FILE") {
                Some(name) => (name, true),
                None => (name, false),
            };
            if name.is_empty() {
                return Err(PropertyError::Empty(variable));
            }
            let property = name.to_lowercase().replace('_', ".");
            if let Some((_, why)) = RESERVED.iter().find(|(p, _)| *p == property) {
                return Err(PropertyError::Reserved {
                    variable,
                    property,
                    why,
                });
            }
            let value = if from_file {
                let read = read(&value).map_err(|error| PropertyError::File {
                    variable: variable.clone(),
                    path: value.clone(),
                    error: error.to_string(),
                })?;
                crate::secrets::without_final_newline(&read).to_owned()
            } else {
                value
            };
            if properties
                .insert(property, (value, variable.clone()))
                .is_some()
            {
                let plain = variable.strip_suffix("_FILE").unwrap_or(&variable);
                return Err(PropertyError::Both(plain.to_owned()));
            }
        }
        Ok(Self { properties })
    }

    /// The value given for `property`, if any.
    pub fn get(&self, property: &str) -> Option<&str> {
        self.properties.get(property).map(|(v, _)| v.as_str())
    }

    /// The variable `property` came from, or the one that would give it.
    pub fn variable(&self, property: &str) -> String {
        match self.properties.get(property) {
            Some((_, variable)) => variable.clone(),
            None => format!("{PREFIX}{}", property.to_uppercase().replace('.', "_")),
        }
    }

    /// Sets every property on `config`.
    pub fn apply(&self, config: &mut ClientConfig) {
        for (property, (value, _)) in &self.properties {
            config.set(property, value);
        }
    }
}

static PROPERTIES: OnceLock<ClientProperties> = OnceLock::new();

/// Reads the environment's client properties once for the whole process; a binary calls
/// it at start so that a bad one stops it there, naming the variable.
pub fn init_from_env() -> anyhow::Result<&'static ClientProperties> {
    if let Some(properties) = PROPERTIES.get() {
        return Ok(properties);
    }
    let properties = ClientProperties::from_env()?;
    Ok(PROPERTIES.get_or_init(|| properties))
}

/// The process's client properties ([`init_from_env`] unless already read).
pub fn properties() -> &'static ClientProperties {
    init_from_env().unwrap_or_else(|error| panic!("Kafka client settings: {error}"))
}

/// A client's settings: `brokers` and the environment's client properties. Every client
/// the saga makes starts from here.
pub fn config(brokers: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    properties().apply(&mut config);
    config.set("bootstrap.servers", brokers);
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn read(path: &str) -> std::io::Result<String> {
        match path {
            "/run/secrets/kafka-password" => Ok("s3cret\n".into()),
            _ => Err(std::io::Error::from(std::io::ErrorKind::NotFound)),
        }
    }

    #[test]
    fn a_variable_under_the_prefix_is_its_property_lower_case_with_dots() {
        let properties = ClientProperties::from_vars(
            vars(&[
                ("KAFKA_CLIENT_SECURITY_PROTOCOL", "SASL_SSL"),
                ("KAFKA_CLIENT_SASL_MECHANISM", "SCRAM-SHA-512"),
                ("KAFKA_CLIENT_SSL_CA_LOCATION", "/etc/kafka/ca.crt"),
                ("KAFKA_BROKERS", "broker:9093"),
                ("KAFKA_NAMESPACE", "t1."),
                ("PATH", "/bin"),
            ]),
            read,
        )
        .unwrap();
        assert_eq!(properties.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(properties.get("sasl.mechanism"), Some("SCRAM-SHA-512"));
        assert_eq!(properties.get("ssl.ca.location"), Some("/etc/kafka/ca.crt"));
        assert_eq!(properties.properties.len(), 3, "{properties:?}");
        assert_eq!(
            properties.variable("sasl.password"),
            "KAFKA_CLIENT_SASL_PASSWORD"
        );
    }

    #[test]
    fn a_file_variable_gives_the_files_content_without_its_trailing_newline() {
        let properties = ClientProperties::from_vars(
            vars(&[(
                "KAFKA_CLIENT_SASL_PASSWORD_FILE",
                "/run/secrets/kafka-password",
            )]),
            read,
        )
        .unwrap();
        assert_eq!(properties.get("sasl.password"), Some("s3cret"));
        assert_eq!(
            properties.variable("sasl.password"),
            "KAFKA_CLIENT_SASL_PASSWORD_FILE"
        );
    }

    #[test]
    fn a_value_given_both_ways_or_an_unreadable_file_is_refused() {
        let both = ClientProperties::from_vars(
            vars(&[
                ("KAFKA_CLIENT_SASL_PASSWORD", "a"),
                (
                    "KAFKA_CLIENT_SASL_PASSWORD_FILE",
                    "/run/secrets/kafka-password",
                ),
            ]),
            read,
        );
        assert_eq!(
            both.unwrap_err().to_string(),
            "KAFKA_CLIENT_SASL_PASSWORD and KAFKA_CLIENT_SASL_PASSWORD_FILE are both set: \
             give the value one way"
        );
        let missing = ClientProperties::from_vars(
            vars(&[("KAFKA_CLIENT_SSL_KEY_PASSWORD_FILE", "/nowhere")]),
            read,
        );
        assert!(
            matches!(missing, Err(PropertyError::File { ref variable, .. })
                if variable == "KAFKA_CLIENT_SSL_KEY_PASSWORD_FILE"),
            "{missing:?}"
        );
    }

    #[test]
    fn a_property_the_saga_sets_itself_is_refused_naming_the_variable() {
        for (variable, property) in [
            ("KAFKA_CLIENT_ENABLE_IDEMPOTENCE", "enable.idempotence"),
            (
                "KAFKA_CLIENT_ENABLE_AUTO_OFFSET_STORE",
                "enable.auto.offset.store",
            ),
            ("KAFKA_CLIENT_BOOTSTRAP_SERVERS", "bootstrap.servers"),
            ("KAFKA_CLIENT_GROUP_ID_FILE", "group.id"),
        ] {
            let refused = ClientProperties::from_vars(vars(&[(variable, "x")]), read);
            assert!(
                matches!(&refused, Err(PropertyError::Reserved { variable: v, property: p, .. })
                    if v == variable && p == property),
                "{refused:?}"
            );
        }
        let empty = ClientProperties::from_vars(vars(&[("KAFKA_CLIENT_", "x")]), read);
        assert_eq!(empty, Err(PropertyError::Empty("KAFKA_CLIENT_".into())));
    }
}
