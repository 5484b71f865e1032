//! `sagactl refund retry`: asks payment-service to try a refused refund again
//! (`POST /admin/refunds/{order_id}/retry`), where the refund's intent, call and ending
//! are recorded as the cancellation's own were.

use serde_json::Value;
use uuid::Uuid;

/// payment-service's answer to a retry of `order_id`'s refund, and whether the refund is
/// now made (or was already).
pub async fn retry_refund(
    payment_service_url: &str,
    order_id: Uuid,
) -> anyhow::Result<(bool, Value)> {
    let url = format!(
        "{}/admin/refunds/{order_id}/retry",
        payment_service_url.trim_end_matches('/')
    );
    let response = reqwest::Client::new()
        .post(&url)
        .send()
        .await
        .map_err(|error| anyhow::anyhow!("payment-service at {url}: {error}"))?;
    let status = response.status();
    let answer: Value = response.json().await.map_err(|error| {
        anyhow::anyhow!("payment-service answered {status} without JSON: {error}")
    })?;
    Ok((
        status.is_success() && answer["refund"] == "refunded",
        answer,
    ))
}

/// The answer as a line a person reads.
pub fn render_retry(answer: &Value) -> String {
    let order = answer["order_id"].as_str().unwrap_or_default();
    let text = |key: &str| answer[key].as_str().unwrap_or_default().to_owned();
    match answer["refund"].as_str().unwrap_or_default() {
        "refunded" => format!(
            "order {order}: refunded as {} (attempt {})\n",
            text("refund_id"),
            answer["attempt"]
        ),
        "failed" => format!(
            "order {order}: refused again (attempt {}): {}\n",
            answer["attempt"],
            text("reason")
        ),
        "unknown" => format!(
            "order {order}: no answer from the provider; run it again, it asks under the same key: {}\n",
            text("reason")
        ),
        state => format!("order {order}: {state}: {}\n", text("reason")),
    }
}
