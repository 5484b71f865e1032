//! Faults on demand, for the tests and the walkthrough: what the provider can be told to
//! do wrong. One fault is armed at a time, by `PROVIDER_FAULT` at start or `PUT
//! /admin/fault` at run time, both in the same JSON:
//!
//! ```json
//! {"kind": "lose-response", "rate": 0.33}
//! {"kind": "unavailable", "next": 5}
//! {"kind": "slow", "delay_ms": 3000}
//! ```
//!
//! A fault applies to `POST /v1/charges` alone: at a `rate` of the calls (deterministic,
//! so a rate of 0.25 is every fourth call), or to the `next` N calls (then it disarms),
//! or, with neither, to every call until it is disarmed.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What goes wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Answer `503` before doing anything: the provider is down.
    Unavailable,
    /// Wait this long before doing anything, then answer as usual: a caller with a
    /// shorter timeout gives up and retries while the first call is still running.
    Slow(Duration),
    /// Do the work and commit it, then close the connection without a byte of answer:
    /// the charge is made and the caller never hears of it.
    LoseResponse,
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

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fault {
    pub kind: Kind,
    pub when: When,
}

/// The JSON form, before its combination of fields is checked.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    kind: KindName,
    delay_ms: Option<u64>,
    rate: Option<f64>,
    next: Option<u32>,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
enum KindName {
    Unavailable,
    Slow,
    LoseResponse,
}

impl Fault {
    /// Reads the JSON form, saying which field is wrong.
    pub fn from_json(value: Value) -> Result<Self, String> {
        let spec: Spec = serde_json::from_value(value).map_err(|error| error.to_string())?;
        let kind = match (spec.kind, spec.delay_ms) {
            (KindName::Slow, Some(ms)) => Kind::Slow(Duration::from_millis(ms)),
            (KindName::Slow, None) => return Err("a slow fault needs delay_ms".into()),
            (_, Some(_)) => return Err("delay_ms is for a slow fault only".into()),
            (KindName::Unavailable, None) => Kind::Unavailable,
            (KindName::LoseResponse, None) => Kind::LoseResponse,
        };
        let when = match (spec.rate, spec.next) {
            (Some(_), Some(_)) => return Err("give rate or next, not both".into()),
            (Some(rate), None) if rate > 0.0 && rate <= 1.0 => When::Rate(rate),
            (Some(rate), None) => return Err(format!("rate must be in (0, 1], not {rate}")),
            (None, Some(0)) => return Err("next must be at least 1".into()),
            (None, Some(n)) => When::Next(n),
            (None, None) => When::Rate(1.0),
        };
        Ok(Self { kind, when })
    }

    /// `PROVIDER_FAULT`'s parser.
    pub fn parse(text: &str) -> Result<Self, String> {
        let value = serde_json::from_str(text).map_err(|error| {
            format!("not JSON ({error}); e.g. {{\"kind\": \"lose-response\", \"rate\": 0.33}}")
        })?;
        Self::from_json(value)
    }

    pub fn to_json(self) -> Value {
        let (kind, delay_ms) = match self.kind {
            Kind::Unavailable => (KindName::Unavailable, None),
            Kind::Slow(delay) => (KindName::Slow, Some(delay.as_millis() as u64)),
            Kind::LoseResponse => (KindName::LoseResponse, None),
        };
        let mut json = serde_json::json!({ "kind": kind });
        if let Some(ms) = delay_ms {
            json["delay_ms"] = ms.into();
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

#[derive(Debug, Default)]
pub struct Faults {
    armed: Mutex<Option<Armed>>,
}

impl Faults {
    pub fn new(fault: Option<Fault>) -> Self {
        let faults = Self::default();
        faults.arm(fault);
        faults
    }

    /// Arms `fault` in place of any other, or disarms with `None`.
    pub fn arm(&self, fault: Option<Fault>) {
        *self.armed.lock().expect("never poisoned") = fault.map(|fault| Armed { fault, calls: 0 });
    }

    /// The armed fault, with what is left of a `next` count.
    pub fn armed(&self) -> Option<Fault> {
        self.armed
            .lock()
            .expect("never poisoned")
            .as_ref()
            .map(|armed| armed.fault)
    }

    /// Whether this call is hit, and by what.
    pub fn draw(&self) -> Option<Kind> {
        let mut armed = self.armed.lock().expect("never poisoned");
        let current = armed.as_mut()?;
        current.calls += 1;
        let kind = current.fault.kind;
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
}

/// What the provider did since it started, for a person (and a test) to read at
/// `GET /admin/stats`; each count is also a Prometheus counter at `/metrics`.
#[derive(Debug, Default)]
pub struct Stats {
    /// `POST /v1/charges` received, whatever became of them.
    pub calls: AtomicU64,
    /// New charges that succeeded.
    pub charged: AtomicU64,
    /// New charges that were declined.
    pub declined: AtomicU64,
    /// Calls answered with the stored answer of their key.
    pub replayed: AtomicU64,
    /// Calls answered 503 by an `unavailable` fault.
    pub unavailable: AtomicU64,
    /// Calls slowed by a `slow` fault.
    pub slowed: AtomicU64,
    /// Calls whose work was committed and whose answer was dropped on purpose.
    pub lost_responses: AtomicU64,
}

/// One thing [`Stats`] counts.
#[derive(Debug, Clone, Copy)]
pub enum Counted {
    Call,
    Charged,
    Declined,
    Replayed,
    Unavailable,
    Slowed,
    LostResponse,
}

impl Stats {
    pub fn count(&self, what: Counted) {
        use saga::metrics::{CHARGE_FAULTS, CHARGE_REQUESTS, CHARGES};
        // Replays are counted at /metrics by the reply itself (saga::idempotency).
        let (counter, metric) = match what {
            Counted::Call => (&self.calls, Some(metrics::counter!(CHARGE_REQUESTS))),
            Counted::Charged => (
                &self.charged,
                Some(metrics::counter!(CHARGES, "result" => "succeeded")),
            ),
            Counted::Declined => (
                &self.declined,
                Some(metrics::counter!(CHARGES, "result" => "declined")),
            ),
            Counted::Replayed => (&self.replayed, None),
            Counted::Unavailable => (
                &self.unavailable,
                Some(metrics::counter!(CHARGE_FAULTS, "kind" => "unavailable")),
            ),
            Counted::Slowed => (
                &self.slowed,
                Some(metrics::counter!(CHARGE_FAULTS, "kind" => "slow")),
            ),
            Counted::LostResponse => (
                &self.lost_responses,
                Some(metrics::counter!(CHARGE_FAULTS, "kind" => "lose_response")),
            ),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if let Some(metric) = metric {
            metric.increment(1);
        }
    }

    pub fn to_json(&self) -> Value {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        serde_json::json!({
            "calls": read(&self.calls),
            "charged": read(&self.charged),
            "declined": read(&self.declined),
            "replayed": read(&self.replayed),
            "unavailable": read(&self.unavailable),
            "slowed": read(&self.slowed),
            "lost_responses": read(&self.lost_responses),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_rate_hits_that_share_of_the_calls_evenly() {
        let faults = Faults::new(Some(Fault {
            kind: Kind::LoseResponse,
            when: When::Rate(0.25),
        }));
        let hits: Vec<bool> = (0..12).map(|_| faults.draw().is_some()).collect();
        let expected = [false, false, false, true].repeat(3);
        assert_eq!(hits, expected);
    }

    #[test]
    fn a_count_hits_the_next_calls_then_disarms() {
        let faults = Faults::new(Some(
            Fault::parse(r#"{"kind": "unavailable", "next": 2}"#).unwrap(),
        ));
        assert_eq!(faults.draw(), Some(Kind::Unavailable));
        assert_eq!(faults.draw(), Some(Kind::Unavailable));
        assert_eq!(faults.draw(), None);
        assert_eq!(faults.armed(), None);
    }

    #[test]
    fn the_json_form_round_trips_and_its_mistakes_are_named() {
        for text in [
            r#"{"kind":"slow","delay_ms":3000,"next":2}"#,
            r#"{"kind":"lose-response","rate":0.33}"#,
            r#"{"kind":"unavailable","rate":1.0}"#,
        ] {
            let fault = Fault::parse(text).unwrap();
            assert_eq!(Fault::from_json(fault.to_json()).unwrap(), fault, "{text}");
        }
        for (text, says) in [
            (r#"{"kind":"slow"}"#, "delay_ms"),
            (r#"{"kind":"unavailable","delay_ms":5}"#, "delay_ms"),
            (r#"{"kind":"unavailable","rate":0.5,"next":1}"#, "not both"),
            (r#"{"kind":"unavailable","rate":1.5}"#, "rate"),
            (r#"{"kind":"unavailable","next":0}"#, "next"),
            (r#"{"kind":"explode"}"#, "explode"),
            (r#"{"kind":"unavailable","often":1}"#, "often"),
            ("lose-response", "not JSON"),
        ] {
            let error = Fault::parse(text).unwrap_err();
            assert!(error.contains(says), "{text}: {error}");
        }
        assert_eq!(
            Fault::from_json(json!({"kind": "lose-response"}))
                .unwrap()
                .when,
            When::Rate(1.0)
        );
    }
}
