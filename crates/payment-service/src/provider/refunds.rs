//! A cancelled order's calls: the refund of its charge, `POST /v1/refunds` under the key
//! `<order id>:refund`, and the charges the provider made for it, `GET
//! /v1/charges?reference=<order id>`.
//!
//! What a refund's answer means for the event that asked for it:
//! - `201`: refunded (`replayed`: an earlier call with the key made it, and its answer
//!   was lost).
//! - `400 charge_already_refunded`: refunded too. The charge's one refund was made under
//!   another key (this key expired, or the refund was asked for some other way); the
//!   charge shows it, and it is the answer, replayed. Asking again could never change
//!   that answer, so the provider does not send it as a `409`, which is retried.
//! - A timeout, a connection error, `408`, `409`, `425`, `429` and `5xx`: unavailable, as
//!   for a charge; the call is made again with the same key, and a refund made by a lost
//!   call is answered by its replay.
//! - Any other `4xx` (no such charge, a declined one, more than was charged, a refusal
//!   such as `charge_disputed`): an answer, not an outage. It is `Rejected`, which the
//!   refund's caller records as the refund `failed`, with the provider's answer as the
//!   reason ([`crate::refund`]); asking again under the same key would get it again.

use std::time::Instant;

use metrics::{counter, histogram};
use reqwest::StatusCode;
use saga::HandlerError;
use saga::idempotency;
use serde::Serialize;
use serde_json::Value;

use super::{Call, Provider, Reply, transient, unavailable};

/// What the merchant asks to give back.
#[derive(Debug, Clone, Serialize)]
pub struct RefundRequest {
    /// The provider's id of the charge, as the payment recorded it.
    pub charge_id: String,
    /// At most what the charge took.
    pub amount_cents: i64,
}

/// A refund the provider made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refund {
    pub refund_id: String,
    pub amount_cents: i64,
    /// Made by an earlier call: the key's stored answer, or the charge's refund made under
    /// another key.
    pub replayed: bool,
}

/// A charge as the provider lists it for an order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderCharge {
    pub charge_id: String,
    pub amount_cents: i64,
    /// `false`: declined, and nothing was taken.
    pub succeeded: bool,
    /// The id of its refund, if it has one (a charge has at most one).
    pub refund: Option<String>,
}

/// The provider's code for a refund of a charge that has its refund already.
pub const CHARGE_ALREADY_REFUNDED: &str = "charge_already_refunded";

/// How a refund call found its refund.
enum Found {
    /// In the answer to the call.
    Answered(Refund),
    /// On the charge, after a `400 charge_already_refunded`.
    OnTheCharge(Refund),
}

impl Provider {
    /// Asks for the refund of a charge under `key`; every call for one order must send the
    /// same key. A charge refunded already, under whichever key, is answered with its
    /// refund: the refund is made once, and every call that asks for it gets it.
    pub async fn refund(&self, key: &str, request: &RefundRequest) -> Result<Refund, HandlerError> {
        let started = Instant::now();
        let found = self.call_refund(key, request).await;
        let (outcome, replayed) = match &found {
            Ok(Found::Answered(refund)) => ("refunded", refund.replayed),
            Ok(Found::OnTheCharge(_)) => ("already_refunded", true),
            Err(call) => (call.outcome(), false),
        };
        record("refund", started, outcome, replayed);
        match found {
            Ok(Found::Answered(refund) | Found::OnTheCharge(refund)) => Ok(refund),
            Err(call) => Err(call.into_error()),
        }
    }

    /// The charges the provider made for `reference` (an order id), oldest first, each
    /// with its refund if it has one. An unavailable provider is `Unavailable`, as for a
    /// charge: a read is as safe to repeat as a keyed call.
    pub async fn charges_for(&self, reference: &str) -> Result<Vec<ProviderCharge>, HandlerError> {
        let started = Instant::now();
        let listed = self.list(reference).await;
        let outcome = match &listed {
            Ok(_) => "listed",
            Err(call) => call.outcome(),
        };
        record("charges_for", started, outcome, false);
        listed.map_err(Call::into_error)
    }

    async fn call_refund(&self, key: &str, request: &RefundRequest) -> Result<Found, Call> {
        let Reply {
            status,
            replayed,
            body,
            json,
        } = self
            .send(
                self.http
                    .post(&self.refunds_url)
                    .header(idempotency::HEADER, key)
                    .json(request),
            )
            .await?;
        match status {
            StatusCode::CREATED => match (json["id"].as_str(), json["amount_cents"].as_i64()) {
                (Some(id), Some(amount_cents)) => Ok(Found::Answered(Refund {
                    refund_id: id.to_owned(),
                    amount_cents,
                    replayed,
                })),
                _ => Err(rejected(format!(
                    "provider answered 201 without a refund: {body}"
                ))),
            },
            StatusCode::BAD_REQUEST if json["error"]["code"] == CHARGE_ALREADY_REFUNDED => self
                .refund_of(&request.charge_id)
                .await
                .map(Found::OnTheCharge),
            status if transient(status) => {
                Err(Call::Failed(unavailable(format!("{status}: {body}"))))
            }
            status => Err(rejected(format!(
                "provider refused the refund request: {status}: {body}"
            ))),
        }
    }

    /// The refund `GET /v1/charges/{id}` shows on the charge.
    async fn refund_of(&self, charge_id: &str) -> Result<Refund, Call> {
        let mut url = reqwest::Url::parse(&self.charges_url)
            .map_err(|error| rejected(format!("{}: {error}", self.charges_url)))?;
        url.path_segments_mut()
            .map_err(|()| rejected(format!("{} cannot take a path", self.charges_url)))?
            .push(charge_id);
        let Reply {
            status, body, json, ..
        } = self.send(self.http.get(url)).await?;
        match status {
            StatusCode::OK => {
                let refund = &json["refunds"][0];
                match (refund["id"].as_str(), refund["amount_cents"].as_i64()) {
                    (Some(id), Some(amount_cents)) => Ok(Refund {
                        refund_id: id.to_owned(),
                        amount_cents,
                        replayed: true,
                    }),
                    _ => Err(rejected(format!(
                        "provider answered charge_already_refunded, and its charge shows no refund: {body}"
                    ))),
                }
            }
            status if transient(status) => {
                Err(Call::Failed(unavailable(format!("{status}: {body}"))))
            }
            status => Err(rejected(format!(
                "provider refused to show charge {charge_id}: {status}: {body}"
            ))),
        }
    }

    async fn list(&self, reference: &str) -> Result<Vec<ProviderCharge>, Call> {
        let Reply {
            status, body, json, ..
        } = self
            .send(
                self.http
                    .get(&self.charges_url)
                    .query(&[("reference", reference)]),
            )
            .await?;
        match status {
            StatusCode::OK => json["data"]
                .as_array()
                .and_then(|data| data.iter().map(charge_from).collect::<Option<Vec<_>>>())
                .ok_or_else(|| rejected(format!("provider answered no list of charges: {body}"))),
            status if transient(status) => {
                Err(Call::Failed(unavailable(format!("{status}: {body}"))))
            }
            status => Err(rejected(format!(
                "provider refused to list the charges of {reference}: {status}: {body}"
            ))),
        }
    }
}

fn charge_from(json: &Value) -> Option<ProviderCharge> {
    Some(ProviderCharge {
        charge_id: json["id"].as_str()?.to_owned(),
        amount_cents: json["amount_cents"].as_i64()?,
        succeeded: json["status"] == "succeeded",
        refund: json["refunds"][0]["id"].as_str().map(str::to_owned),
    })
}

fn rejected(reason: String) -> Call {
    Call::Failed(HandlerError::rejected(reason))
}

/// Counted beside the charges' calls, told apart by `call`.
fn record(call: &'static str, started: Instant, outcome: &'static str, replayed: bool) {
    histogram!(saga::metrics::PROVIDER_CALL_DURATION, "call" => call)
        .record(started.elapsed().as_secs_f64());
    counter!(saga::metrics::PROVIDER_CALLS, "call" => call, "outcome" => outcome, "replayed" => replayed.to_string())
        .increment(1);
}
