//! The card provider, as payment-service calls it: `POST /v1/charges` with an
//! `Idempotency-Key`, over HTTP, outside any transaction; `POST /v1/refunds` and
//! `GET /v1/charges?reference=` for a cancelled order ([`refunds`]).
//!
//! What an answer means for the event that asked for it:
//! - `201`: charged; `402`: declined, a decided failure with the provider's reason.
//! - A timeout, a connection error (refused, or cut before the answer: the charge may
//!   have been made), `408`, `409` (the same key still running), `425`, `429` and `5xx`:
//!   the provider is briefly unavailable. The call is made again, with the same key, for
//!   as long as it takes: a charge made by a lost call is then answered by its replay.
//! - Any other `4xx`: the request itself is wrong, and asking again cannot help: the
//!   event is dead-lettered with the provider's answer as the reason.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use metrics::{counter, histogram};
use reqwest::StatusCode;
use saga::HandlerError;
use saga::{idempotency, trace};
use serde::Serialize;
use serde_json::Value;

mod refunds;
pub use refunds::{ProviderCharge, Refund, RefundRequest};

#[derive(Debug, Clone, Args)]
pub struct ProviderConfig {
    /// Base URL of the card provider (payment-provider): `https://` for a real one.
    #[arg(long, env = "PROVIDER_URL", default_value = "http://127.0.0.1:8083")]
    pub provider_url: String,

    /// A PEM file of the CA (or CAs) to trust for an `https://` provider, beside the
    /// system's own: one whose certificate a private CA signed. A provider whose
    /// certificate is not trusted stops the service at start.
    #[arg(long, env = "PROVIDER_CA_FILE")]
    pub provider_ca_file: Option<std::path::PathBuf>,

    /// How long to wait for the provider to accept a connection.
    #[arg(long, env = "PROVIDER_CONNECT_TIMEOUT", default_value = "1s",
          value_parser = humantime::parse_duration)]
    pub provider_connect_timeout: Duration,

    /// The longest a charge call may take, answer included. Past it the call counts as
    /// lost, and is made again with the same key.
    #[arg(long, env = "PROVIDER_TIMEOUT", default_value = "5s",
          value_parser = humantime::parse_duration)]
    pub provider_timeout: Duration,

    /// How long the provider keeps an idempotency key and its answer (Stripe: 24 h). A
    /// charge whose answer is still unknown is asked again under its key only within it
    /// (past it, asking could charge again: the charge is left to a person), and one
    /// unknown for half of it is escalated.
    #[arg(long, env = "PROVIDER_KEY_TTL", default_value = "24h",
          value_parser = humantime::parse_duration)]
    pub provider_key_ttl: Duration,
}

/// What the merchant asks for.
#[derive(Debug, Serialize)]
pub struct ChargeRequest<'a> {
    pub amount_cents: i64,
    pub currency: &'a str,
    /// The order id: the provider lists an order's charges by it.
    pub reference: String,
}

/// The provider's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Charged {
        charge_id: String,
        /// The provider answered with the stored answer of the key: an earlier call was
        /// made and its answer lost.
        replayed: bool,
    },
    Declined {
        charge_id: Option<String>,
        reason: String,
        replayed: bool,
    },
}

/// Cheap to clone: the clones share one connection pool.
#[derive(Clone)]
pub struct Provider {
    http: reqwest::Client,
    base: String,
    charges_url: String,
    refunds_url: String,
    /// `PROVIDER_KEY_TTL`.
    pub key_ttl: Duration,
}

impl Provider {
    pub fn new(config: &ProviderConfig) -> anyhow::Result<Self> {
        let mut http = reqwest::Client::builder()
            .connect_timeout(config.provider_connect_timeout)
            .timeout(config.provider_timeout);
        if let Some(file) = &config.provider_ca_file {
            for certificate in saga::https::ca_certificates(file).context("PROVIDER_CA_FILE")? {
                http = http.add_root_certificate(certificate);
            }
        }
        let base = config.provider_url.trim_end_matches('/');
        Ok(Self {
            base: base.to_owned(),
            http: http.build()?,
            charges_url: format!("{base}/v1/charges"),
            refunds_url: format!("{base}/v1/refunds"),
            key_ttl: config.provider_key_ttl,
        })
    }

    /// For an `https://` provider, whether it presents a certificate this client trusts:
    /// asked once at start, so that a wrong CA stops the service with what OpenSSL said,
    /// rather than every charge failing later as if the provider were away. A provider
    /// that does not answer is not waited for: calls wait for it.
    pub async fn check_tls(&self) -> anyhow::Result<()> {
        if !self.base.starts_with("https://") {
            return Ok(());
        }
        if let Err(error) = self.http.get(&self.base).send().await
            && let Some(refusal) = saga::https::refusal(&error)
        {
            anyhow::bail!(
                "the card provider at {} refused TLS: {refusal} (the CA to trust: PROVIDER_CA_FILE)",
                self.base
            );
        }
        Ok(())
    }

    /// Asks for a charge under `key`; every call for one order must send the same key.
    pub async fn charge(
        &self,
        key: &str,
        request: &ChargeRequest<'_>,
    ) -> Result<Answer, HandlerError> {
        let started = Instant::now();
        let answer = self.call(key, request).await;
        histogram!(saga::metrics::PROVIDER_CALL_DURATION).record(started.elapsed().as_secs_f64());
        let (outcome, replayed) = match &answer {
            Ok(Answer::Charged { replayed, .. }) => ("charged", *replayed),
            Ok(Answer::Declined { replayed, .. }) => ("declined", *replayed),
            Err(call) => (call.outcome(), false),
        };
        counter!(saga::metrics::PROVIDER_CALLS, "outcome" => outcome, "replayed" => replayed.to_string())
            .increment(1);
        answer.map_err(Call::into_error)
    }

    async fn call(&self, key: &str, request: &ChargeRequest<'_>) -> Result<Answer, Call> {
        let Reply {
            status,
            replayed,
            body,
            json,
        } = self
            .send(
                self.http
                    .post(&self.charges_url)
                    .header(idempotency::HEADER, key)
                    .json(request),
            )
            .await?;
        let answer = match status {
            StatusCode::CREATED => match json["id"].as_str() {
                Some(id) => Ok(Answer::Charged {
                    charge_id: id.to_owned(),
                    replayed,
                }),
                None => Err(HandlerError::rejected(format!(
                    "provider answered 201 without a charge id: {body}"
                ))),
            },
            StatusCode::PAYMENT_REQUIRED => Ok(Answer::Declined {
                charge_id: json["error"]["charge"].as_str().map(str::to_owned),
                reason: json["error"]["message"]
                    .as_str()
                    .unwrap_or("declined by the provider")
                    .to_owned(),
                replayed,
            }),
            status if transient(status) => Err(unavailable(format!("{status}: {body}"))),
            status => Err(HandlerError::rejected(format!(
                "provider refused the charge request: {status}: {body}"
            ))),
        };
        answer.map_err(Call::Failed)
    }

    /// Sends `request` and reads its answer to the end, in a client span whose trace
    /// context the request carries to the provider.
    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Reply, Call> {
        let no_answer =
            |what: String| Call::NoAnswer(HandlerError::Unavailable(format!("provider: {what}")));
        let mut request = request
            .build()
            .map_err(|error| no_answer(describe(error)))?;
        let (method, url) = (request.method().as_str(), request.url());
        let hop = trace::Hop::client(method, url.path(), url.as_str());
        hop.inject(request.headers_mut());
        let response = self.http.execute(request).await.map_err(|error| {
            hop.failed(&error);
            no_answer(describe(error))
        })?;
        let status = response.status();
        hop.set("http.response.status_code", i64::from(status.as_u16()));
        let replayed = response.headers().contains_key(idempotency::REPLAYED);
        let body = response.text().await.map_err(|error| {
            no_answer(format!("{status}, answer cut short: {}", describe(error)))
        })?;
        let json: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        Ok(Reply {
            status,
            replayed,
            body,
            json,
        })
    }
}

/// An answer read to the end, and its body as JSON (`null` if it is not).
struct Reply {
    status: StatusCode,
    replayed: bool,
    body: String,
    json: Value,
}

/// A `408`, `409` (the same key still running), `425`, `429` or `5xx`: the provider is
/// briefly unavailable, and the call is made again, with the same key.
fn transient(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::REQUEST_TIMEOUT
            | StatusCode::CONFLICT
            | StatusCode::TOO_EARLY
            | StatusCode::TOO_MANY_REQUESTS
    ) || status.is_server_error()
}

fn unavailable(what: String) -> HandlerError {
    HandlerError::Unavailable(format!("provider: {what}"))
}

/// A call that did not decide the charge (or the refund): no answer at all, or an answer
/// that is an error.
enum Call {
    NoAnswer(HandlerError),
    Failed(HandlerError),
}

impl Call {
    /// As `saga_provider_calls_total`'s `outcome` counts it.
    fn outcome(&self) -> &'static str {
        match self {
            Call::NoAnswer(_) => "no_answer",
            Call::Failed(HandlerError::Unavailable(_)) => "unavailable",
            Call::Failed(_) => "rejected",
        }
    }

    fn into_error(self) -> HandlerError {
        match self {
            Call::NoAnswer(error) | Call::Failed(error) => error,
        }
    }
}

/// reqwest's `Display` names only the URL; the causes (timed out, refused, closed before
/// the answer) are what tell an operator what happened, and anyhow's alternate form
/// prints them all.
fn describe(error: reqwest::Error) -> String {
    format!("{:#}", anyhow::Error::new(error))
}
