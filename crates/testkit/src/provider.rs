//! A card provider (payment-provider) as a test drives it: arming its faults, reading what
//! it counted, listing the charges it made for an order. Over its HTTP API only, the way
//! a person does it with `curl`.

use serde_json::Value;

#[derive(Debug, Clone)]
pub struct ProviderAdmin {
    pub url: String,
    http: reqwest::Client,
}

impl ProviderAdmin {
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            http: reqwest::Client::new(),
        }
    }

    /// Arms `fault` (`{"kind": "lose-response", "rate": 0.33}` and the like).
    pub async fn arm(&self, fault: Value) {
        let response = self
            .http
            .put(format!("{}/admin/fault", self.url))
            .json(&fault)
            .send()
            .await
            .expect("the provider answers");
        assert!(
            response.status().is_success(),
            "arming {fault}: {response:?}"
        );
    }

    pub async fn disarm(&self) {
        let response = self
            .http
            .delete(format!("{}/admin/fault", self.url))
            .send()
            .await
            .expect("the provider answers");
        assert!(response.status().is_success(), "disarming: {response:?}");
    }

    /// `POST /v1/charges` with `key`: the status and the body.
    pub async fn charge(&self, key: &str, body: &Value) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}/v1/charges", self.url))
            .header("Idempotency-Key", key)
            .json(body)
            .send()
            .await
            .expect("the provider answers");
        let status = response.status().as_u16();
        (
            status,
            response.json().await.expect("the provider answers JSON"),
        )
    }

    /// What it counted: `calls`, `charged`, `declined`, `replayed`, `lost_responses`, …
    pub async fn stats(&self) -> Value {
        self.get_json(&format!("{}/admin/stats", self.url)).await
    }

    /// The charges made for `reference` (an order id), oldest first.
    pub async fn charges_for(&self, reference: &str) -> Vec<Value> {
        let list = self
            .get_json(&format!("{}/v1/charges?reference={reference}", self.url))
            .await;
        list["data"].as_array().expect("a list of charges").clone()
    }

    async fn get_json(&self, url: &str) -> Value {
        self.http
            .get(url)
            .send()
            .await
            .expect("the provider answers")
            .json()
            .await
            .expect("the provider answers JSON")
    }
}
