//! Faults on demand, for the tests and the walkthrough: what the provider can be told to
//! do wrong. Each endpoint has a fault of its own, armed by `PROVIDER_FAULT` at start or
//! `PUT /admin/fault` at run time, both in the same JSON:
//!
//! ```json
//! {"kind": "lose-response", "rate": 0.33}
//! {"kind": "unavailable", "next": 5}
//! {"kind": "slow", "delay_ms": 3000, "endpoint": "refunds"}
//! {"kind": "commit-late", "delay_ms": 3000}
//! {"kind": "refuse", "endpoint": "refunds", "code": "charge_disputed"}
//! {"kind": "list-lag", "lag_ms": 2000}
//! ```
//!
//! What each kind models, and where in the call it strikes:
//!
//! - `unavailable`: the provider is down. The call is answered `503` before anything is
//!   done.
//! - `slow` (`delay_ms`): a provider slow to take the call up. It waits *before* doing
//!   anything, then answers as usual: a caller with a shorter timeout gives up with
//!   nothing made yet, and its retry may overtake the first call.
//! - `lose-response`: the answer lost on its way back. The work is committed, then the
//!   connection is cut *after* the commit without a byte of answer.
//! - `commit-late` (`delay_ms`): a provider whose write is slow to become durable (a
//!   lock, a slow disk, a replica it waits for). The work is done in the call's
//!   transaction (the key claimed, the charge or the refund written), then the
//!   transaction is held open `delay_ms` *before its commit*, then committed and
//!   answered. A caller with a shorter timeout gives up with no answer, and the charge or
//!   the refund appears a moment later all the same. Until the commit, a read (`GET
//!   /v1/charges?reference=`) does not show it, and a call with the same key queues on
//!   the key's claim, as behind any call still running: it is answered the stored answer
//!   (replayed) if the commit comes within `IDEMPOTENCY_KEY_WAIT`, and `409
//!   idempotency_key_in_use` (`Retry-After: 1`) if not.
//! - `refuse` (refunds only; `code`, `charge_disputed` unless given): a provider that
//!   declines to give the money back (the charge is disputed, the balance too low). No
//!   refund is made; the call is answered `400` with `{"error": {"code": <code>,
//!   "message": …}}`, as Stripe answers a refund it refuses (an `invalid_request_error`;
//!   its `402` is a card's decline). The refusal is decided like a refund made: stored
//!   with the key in the call's transaction, as Stripe keeps any answer of a call it
//!   began, so a replay with the key gets the same refusal and only a new key tries
//!   again. The request is checked first: an unknown charge, a declined one or too
//!   large an amount is answered as ever, and stores nothing. The code may not be
//!   `charge_already_refunded`, which a caller reads as refunded.
//! - `list-lag` (the list only; `lag_ms`): a provider whose list or search is not
//!   read-after-write (an index, a replica behind its primary). `GET
//!   /v1/charges?reference=` leaves out the charges younger than `lag_ms` (by their
//!   `created_at`), so a charge answered `201` is not listed until it is that old; the
//!   charges it does list show their refunds as they are.
//!
//! A fault applies to the calls of its `endpoint`, `charges` (`POST /v1/charges`, the
//! default, which every fault meant before refunds existed), `refunds` (`POST
//! /v1/refunds`) or `list` (`GET /v1/charges`, with a `reference` or without), and only
//! those draw it: a refund's answer can be lost while every charge is answered. A kind
//! that goes on one endpoint alone (`refuse`: refunds; `list-lag`: list) is armed there
//! without naming it, and naming another is refused; the list takes `list-lag` alone. It hits at a `rate` of the calls (deterministic, so a rate of
//! 0.25 is every fourth call), or the `next` N calls (then it disarms), or, with neither,
//! every call until it is disarmed.

use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What goes wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// Answer `503` before doing anything: the provider is down.
    Unavailable,
    /// Wait this long before doing anything, then answer as usual: a caller with a
    /// shorter timeout gives up and retries while the first call is still running.
    Slow(Duration),
    /// Do the work and commit it, then close the connection without a byte of answer:
    /// the charge is made and the caller never hears of it.
    LoseResponse,
    /// Do the work in the call's transaction, then hold it open this long before the
    /// commit, then commit and answer: a caller with a shorter timeout gives up, and the
    /// charge or the refund commits a moment later; until then no read shows it.
    CommitLate(Duration),
    /// Refunds only: make no refund, and answer `400` with this code, stored with the key
    /// as a refund made would be.
    Refuse(String),
    /// The list only: leave out the charges younger than this, as a list that is not
    /// read-after-write does.
    ListLag(Duration),
}

/// A `refuse` fault's code unless it gives one: Stripe's for a refund of a charge the
/// cardholder disputed.
pub const CHARGE_DISPUTED: &str = "charge_disputed";

impl Kind {
    /// The one endpoint this kind can be armed on, if it cannot go on every one.
    fn only_on(&self) -> Option<Endpoint> {
        match self {
            Kind::Refuse(_) => Some(Endpoint::Refunds),
            Kind::ListLag(_) => Some(Endpoint::List),
            Kind::Unavailable | Kind::Slow(_) | Kind::LoseResponse | Kind::CommitLate(_) => None,
        }
    }
}

/// Which calls it hits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum When {
    /// This share of the calls, spread evenly: the n-th call is hit when
    /// `floor(n × rate)` grows.
    Rate(f64),
    /// The next calls, this many; then the fault disarms.
    Next(u32),
}

/// The endpoint a fault is armed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Endpoint {
    /// `POST /v1/charges`.
    #[default]
    Charges,
    /// `POST /v1/refunds`.
    Refunds,
    /// `GET /v1/charges`, the list (`?reference=…`).
    List,
}

impl Endpoint {
    pub const ALL: [Endpoint; 3] = [Endpoint::Charges, Endpoint::Refunds, Endpoint::List];

    /// As the JSON and the logs name it.
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Charges => "charges",
            Endpoint::Refunds => "refunds",
            Endpoint::List => "list",
        }
    }

    pub fn parse(name: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|endpoint| endpoint.name() == name)
            .ok_or_else(|| format!("no endpoint {name:?}; charges, refunds or list"))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub kind: Kind,
    pub when: When,
    pub endpoint: Endpoint,
}

/// The JSON form, before its combination of fields is checked.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    kind: KindName,
    delay_ms: Option<u64>,
    lag_ms: Option<u64>,
    code: Option<String>,
    rate: Option<f64>,
    next: Option<u32>,
    /// Charges unless the kind goes on one endpoint alone ([`Kind::only_on`]).
    endpoint: Option<Endpoint>,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
enum KindName {
    Unavailable,
    Slow,
    LoseResponse,
    CommitLate,
    Refuse,
    ListLag,
}

impl KindName {
    fn as_str(self) -> &'static str {
        match self {
            KindName::Unavailable => "unavailable",
            KindName::Slow => "slow",
            KindName::LoseResponse => "lose-response",
            KindName::CommitLate => "commit-late",
            KindName::Refuse => "refuse",
            KindName::ListLag => "list-lag",
        }
    }
}

/// A `refuse` fault's `code`, checked: shaped like the provider's own codes, and never
/// the one a caller reads as a refund made.
fn refusal_code(code: Option<String>) -> Result<String, String> {
    let code = code.unwrap_or_else(|| CHARGE_DISPUTED.to_owned());
    let shaped = (1..=64).contains(&code.len())
        && code
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !shaped {
        return Err(format!(
            "code must be 1 to 64 lower-case letters, digits or underscores, not {code:?}"
        ));
    }
    if code == crate::error::CHARGE_ALREADY_REFUNDED {
        return Err(format!(
            "code {code} means the refund was made, and a refuse fault makes none; \
             e.g. {CHARGE_DISPUTED}"
        ));
    }
    Ok(code)
}

impl Fault {
    /// Reads the JSON form, saying which field is wrong.
    pub fn from_json(value: Value) -> Result<Self, String> {
        let spec: Spec = serde_json::from_value(value).map_err(|error| error.to_string())?;
        let name = spec.kind;
        if spec.code.is_some() && !matches!(name, KindName::Refuse) {
            return Err("code is for a refuse fault only".into());
        }
        if spec.lag_ms.is_some() && !matches!(name, KindName::ListLag) {
            return Err("lag_ms is for a list-lag fault only".into());
        }
        let kind = match (name, spec.delay_ms.map(Duration::from_millis)) {
            (KindName::Slow, Some(delay)) => Kind::Slow(delay),
            (KindName::CommitLate, Some(delay)) => Kind::CommitLate(delay),
            (KindName::Slow, None) => return Err("a slow fault needs delay_ms".into()),
            (KindName::CommitLate, None) => {
                return Err("a commit-late fault needs delay_ms".into());
            }
            (_, Some(_)) => return Err("delay_ms is for a slow or commit-late fault only".into()),
            (KindName::Unavailable, None) => Kind::Unavailable,
            (KindName::LoseResponse, None) => Kind::LoseResponse,
            (KindName::Refuse, None) => Kind::Refuse(refusal_code(spec.code)?),
            (KindName::ListLag, None) => match spec.lag_ms {
                Some(ms) => Kind::ListLag(Duration::from_millis(ms)),
                None => return Err("a list-lag fault needs lag_ms".into()),
            },
        };
        let endpoint = spec
            .endpoint
            .or(kind.only_on())
            .unwrap_or(Endpoint::Charges);
        if let Some(only) = kind.only_on()
            && endpoint != only
        {
            return Err(format!(
                "endpoint {:?}: a {} fault is for {} only",
                endpoint.name(),
                name.as_str(),
                only.name()
            ));
        }
        if endpoint == Endpoint::List && kind.only_on() != Some(Endpoint::List) {
            return Err(format!(
                "endpoint \"list\" takes a list-lag fault only, not {}",
                name.as_str()
            ));
        }
        let when = match (spec.rate, spec.next) {
            (Some(_), Some(_)) => return Err("give rate or next, not both".into()),
            (Some(rate), None) if rate > 0.0 && rate <= 1.0 => When::Rate(rate),
            (Some(rate), None) => return Err(format!("rate must be in (0, 1], not {rate}")),
            (None, Some(0)) => return Err("next must be at least 1".into()),
            (None, Some(n)) => When::Next(n),
            (None, None) => When::Rate(1.0),
        };
        Ok(Self {
            kind,
            when,
            endpoint,
        })
    }

    /// `PROVIDER_FAULT`'s parser.
    pub fn parse(text: &str) -> Result<Self, String> {
        let value = serde_json::from_str(text).map_err(|error| {
            format!("not JSON ({error}); e.g. {{\"kind\": \"lose-response\", \"rate\": 0.33}}")
        })?;
        Self::from_json(value)
    }

    /// What the fault does and when; where it applies is said by where it is shown
    /// (`GET /admin/fault`'s `faults`), so `fault`, the charges' own, reads as before.
    /// Read back by [`Fault::from_json`] with `endpoint` added, unless it is the kind's
    /// default (`charges`, or the one endpoint the kind goes on).
    pub fn to_json(&self) -> Value {
        let millis = |delay: &Duration| delay.as_millis() as u64;
        let (kind, delay_ms) = match &self.kind {
            Kind::Unavailable => (KindName::Unavailable, None),
            Kind::Slow(delay) => (KindName::Slow, Some(millis(delay))),
            Kind::LoseResponse => (KindName::LoseResponse, None),
            Kind::CommitLate(delay) => (KindName::CommitLate, Some(millis(delay))),
            Kind::Refuse(_) => (KindName::Refuse, None),
            Kind::ListLag(_) => (KindName::ListLag, None),
        };
        let mut json = serde_json::json!({ "kind": kind });
        if let Some(ms) = delay_ms {
            json["delay_ms"] = ms.into();
        }
        match &self.kind {
            Kind::Refuse(code) => json["code"] = code.as_str().into(),
            Kind::ListLag(lag) => json["lag_ms"] = millis(lag).into(),
            _ => {}
        }
        match self.when {
            When::Rate(rate) => json["rate"] = rate.into(),
            When::Next(n) => json["next"] = n.into(),
        }
        json
    }
}

/// The armed fault, and how far along it is.
#[derive(Debug)]
struct Armed {
    fault: Fault,
    /// Calls seen since it was armed.
    calls: u64,
}

/// The fault armed on each endpoint, drawn by that endpoint's calls alone.
#[derive(Debug, Default)]
pub struct Faults {
    charges: Mutex<Option<Armed>>,
    refunds: Mutex<Option<Armed>>,
    list: Mutex<Option<Armed>>,
}

impl Faults {
    pub fn new(fault: Option<Fault>) -> Self {
        let faults = Self::default();
        if let Some(fault) = fault {
            faults.arm(fault);
        }
        faults
    }

    fn slot(&self, endpoint: Endpoint) -> std::sync::MutexGuard<'_, Option<Armed>> {
        match endpoint {
            Endpoint::Charges => &self.charges,
            Endpoint::Refunds => &self.refunds,
            Endpoint::List => &self.list,
        }
        .lock()
        .expect("never poisoned")
    }

    /// Arms `fault` on its endpoint in place of any other there; the other endpoints'
    /// stay as they are.
    pub fn arm(&self, fault: Fault) {
        let endpoint = fault.endpoint;
        *self.slot(endpoint) = Some(Armed { fault, calls: 0 });
    }

    pub fn disarm(&self, endpoint: Endpoint) {
        *self.slot(endpoint) = None;
    }

    /// The fault armed on `endpoint`, with what is left of a `next` count.
    pub fn armed(&self, endpoint: Endpoint) -> Option<Fault> {
        self.slot(endpoint)
            .as_ref()
            .map(|armed| armed.fault.clone())
    }

    /// Whether this call to `endpoint` is hit, and by what.
    pub fn draw(&self, endpoint: Endpoint) -> Option<Kind> {
        let mut armed = self.slot(endpoint);
        let current = armed.as_mut()?;
        current.calls += 1;
        let kind = current.fault.kind.clone();
        match &mut current.fault.when {
            When::Rate(rate) => {
                let n = current.calls as f64;
                ((n * *rate).floor() > ((n - 1.0) * *rate).floor()).then_some(kind)
            }
            When::Next(left) => {
                *left -= 1;
                if *left == 0 {
                    *armed = None;
                }
                Some(kind)
            }
        }
    }

    /// `GET /admin/fault`'s answer: `fault` the charges' (as it was before refunds had
    /// faults of their own), `faults` each endpoint's.
    pub fn to_json(&self) -> Value {
        let armed = |endpoint| self.armed(endpoint).as_ref().map(Fault::to_json);
        serde_json::json!({
            "fault": armed(Endpoint::Charges),
            "faults": {
                "charges": armed(Endpoint::Charges),
                "refunds": armed(Endpoint::Refunds),
                "list": armed(Endpoint::List),
            },
        })
    }
}

#[cfg(test)]
mod tests;
