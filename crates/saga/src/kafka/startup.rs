//! The wait for the broker at start-up, and the errors that end it: a service waits (with
//! backoff, until SIGTERM) for a broker that is down or topics not created yet, but a
//! refused login, an untrusted certificate or a denied topic will not heal by waiting,
//! so each stops the service at once, naming the `KAFKA_CLIENT_*` setting to fix.

use std::sync::Mutex;
use std::time::Duration;

use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer as _, ProducerContext};
use tokio_util::sync::CancellationToken;

use kafka_rights::{Missing, Rights};

use super::client::{self, ClientProperties};

/// Remembers the last error librdkafka reported about its connections, which a failed
/// request does not carry (a metadata request just times out when the login is refused).
#[derive(Default)]
struct LastError(Mutex<Option<(RDKafkaErrorCode, String)>>);

impl ClientContext for LastError {
    fn error(&self, error: KafkaError, reason: &str) {
        if let Some(code) = error.rdkafka_error_code() {
            self.remember(code, reason);
        }
        DefaultClientContext.error(error, reason);
    }

    // A connection's failure is logged at once, but reported as an error only after a
    // few of the same (a certificate that fails verification, never): read from the log.
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        if facility == "FAIL" {
            if message.contains(UNTRUSTED) {
                self.remember(RDKafkaErrorCode::SSL, message);
            } else if message.contains("SASL authentication error") {
                self.remember(RDKafkaErrorCode::Authentication, message);
            }
        }
        DefaultClientContext.log(level, facility, message);
    }
}

impl LastError {
    fn remember(&self, code: RDKafkaErrorCode, reason: &str) {
        *self.0.lock().expect("never poisoned") = Some((code, reason.to_owned()));
    }
}

/// What OpenSSL says of a certificate no trusted CA signed.
const UNTRUSTED: &str = "certificate verify failed";

/// A producer only for its connections: it sends nothing.
impl ProducerContext for LastError {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &DeliveryResult<'_>, _: ()) {}
}

/// What one look at the broker found.
enum Look {
    Ready,
    /// A topic the broker will not describe to this client.
    Denied(String),
    /// Worth waiting for: why not yet.
    NotYet(String),
}

/// Returns `Ok(true)` once the broker answers this process's client settings, serves
/// every topic of `rights`, and gives this client every one of them; `Ok(false)` if
/// `shutdown` came first; an error, at once, for what waiting cannot fix.
pub async fn await_broker(
    brokers: &str,
    rights: &Rights,
    shutdown: &CancellationToken,
) -> anyhow::Result<bool> {
    let producer: BaseProducer<LastError> =
        client::config(brokers).create_with_context(LastError::default())?;
    let producer = std::sync::Arc::new(producer);
    let mut delays = crate::backoff::backoff();
    loop {
        let (producer, rights) = (producer.clone(), rights.clone());
        // fetch_metadata and the rights' questions block: off the runtime's workers.
        let look = tokio::task::spawn_blocking(move || {
            let look = look(&producer, &rights.topics())?;
            if let Look::Ready | Look::Denied(_) = look {
                match rights.missing(producer.client()) {
                    Ok(missing) if missing.is_empty() => {}
                    Ok(missing) => anyhow::bail!(lacking(&missing)),
                    // The check is an aid: a broker that cannot answer it (older than
                    // Kafka 2.3) still refuses a missing right when it is used.
                    Err(error) => tracing::warn!(
                        error = format!("{error:#}"),
                        "Kafka did not say which rights this client has: not checked"
                    ),
                }
            }
            Ok(look)
        });
        let why = tokio::select! {
            _ = shutdown.cancelled() => return Ok(false),
            look = look => match look?? {
                Look::Ready => return Ok(true),
                // Denied, yet no right is missing: a broker that names no operations.
                Look::Denied(topic) => anyhow::bail!(denied(&topic, client::properties())),
                Look::NotYet(why) => why,
            },
        };
        let delay = crate::backoff::next_delay(&mut delays);
        tracing::warn!(%brokers, why, retry_in = ?delay, "waiting for the broker");
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(false),
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

fn look(producer: &BaseProducer<LastError>, topics: &[String]) -> anyhow::Result<Look> {
    let properties = client::properties();
    for topic in topics {
        let metadata = producer
            .client()
            // Short: a refused connection is only known once this returns. The
            // connection outlives it, so a slow first login is not begun again.
            .fetch_metadata(Some(topic), Duration::from_secs(2));
        // Hands the connections' errors reported meanwhile to the context.
        producer.poll(Duration::ZERO);
        let last = producer.context().0.lock().expect("never poisoned").take();
        if let Some((code, reason)) = last
            && let Some(error) = refused(code, &reason, properties)
        {
            return Err(anyhow::Error::msg(reason).context(error));
        }
        let metadata = match metadata {
            Ok(metadata) => metadata,
            Err(error) => return Ok(Look::NotYet(error.to_string())),
        };
        let Some(served) = metadata.topics().first() else {
            return Ok(Look::NotYet(format!("no metadata for topic {topic}")));
        };
        match served.error().map(RDKafkaErrorCode::from) {
            Some(RDKafkaErrorCode::TopicAuthorizationFailed) => {
                return Ok(Look::Denied(topic.clone()));
            }
            Some(code) => return Ok(Look::NotYet(format!("topic {topic}: {code}"))),
            None if served.partitions().iter().any(|p| p.leader() < 0) => {
                return Ok(Look::NotYet(format!(
                    "topic {topic} has a partition with no leader"
                )));
            }
            None => {}
        }
    }
    Ok(Look::Ready)
}

/// The error for a connection error that waiting will not fix, if it is one.
fn refused(code: RDKafkaErrorCode, reason: &str, properties: &ClientProperties) -> Option<String> {
    match code {
        RDKafkaErrorCode::Authentication => Some(format!(
            "Kafka refused the login of {user} with {mechanism}: check {password}, {username} \
             and {mechanism_variable}",
            user = properties.get("sasl.username").unwrap_or("(no user)"),
            mechanism = properties.get("sasl.mechanism").unwrap_or("GSSAPI"),
            password = properties.variable("sasl.password"),
            username = properties.variable("sasl.username"),
            mechanism_variable = properties.variable("sasl.mechanism"),
        )),
        RDKafkaErrorCode::SSL if reason.contains(UNTRUSTED) => Some(format!(
            "Kafka's certificate is not trusted: set {} to the certificate of the CA that \
             signed the broker's",
            properties.variable("ssl.ca.location"),
        )),
        RDKafkaErrorCode::SSL => Some(format!(
            "the TLS handshake with Kafka failed: check the {}SSL_* settings",
            client::PREFIX,
        )),
        _ => None,
    }
}

/// The error for rights the broker does not give this process's Kafka clients.
pub fn lacking(missing: &[Missing]) -> String {
    let properties = client::properties();
    let missing: Vec<String> = missing.iter().map(ToString::to_string).collect();
    format!(
        "Kafka denies {} {}: grant the user these ACLs (each service's are in \
         docs/cluster.md), or log in as one who has them",
        who(properties),
        missing.join(", ")
    )
}

/// The user this client logs in as, and the setting that names it.
fn who(properties: &ClientProperties) -> String {
    match properties.get("sasl.username") {
        Some(user) => format!("User:{user} ({})", properties.variable("sasl.username")),
        None => "this client".to_owned(),
    }
}

/// The error for a topic the broker will not describe to this client.
pub fn denied(topic: &str, properties: &ClientProperties) -> String {
    format!(
        "Kafka denies {} access to topic {topic}: grant it Describe, DescribeConfigs, \
         Read and Write on the saga's topics and Read on its consumer groups, or log in \
         as a user who has them",
        who(properties)
    )
}
