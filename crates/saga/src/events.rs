//! The event catalog: every event type of the saga, its topic, its payload, and how its
//! deterministic id derives from the event that caused it.
//!
//! | type | topic | id | written by |
//! |---|---|---|---|
//! | `order.created` | orders | `<order id>` | order-service |
//! | `payment.succeeded` / `payment.failed` | payments | `<order.created id>:payment` | payment-service |
//! | `order.confirmed` / `order.cancelled` | orders | `<order id>:outcome` | order-service |
//! | `notification.sent` | notifications | `<outcome event id>:notification` | notification-service |
//!
//! Both terminal order events share one id, so the outbox's unique `event_id` refuses a
//! second outcome for an order even if every other guard were gone.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub const ORDER_CREATED: &str = "order.created";
pub const ORDER_CONFIRMED: &str = "order.confirmed";
pub const ORDER_CANCELLED: &str = "order.cancelled";
pub const PAYMENT_SUCCEEDED: &str = "payment.succeeded";
pub const PAYMENT_FAILED: &str = "payment.failed";
pub const NOTIFICATION_SENT: &str = "notification.sent";

/// The id of the payment result answering the `order.created` event `order_created_id`.
pub fn payment_result_id(order_created_id: &str) -> String {
    format!("{order_created_id}:payment")
}

/// The id of the one terminal event (`order.confirmed` or `order.cancelled`) of an order.
pub fn order_outcome_id(order_id: Uuid) -> String {
    format!("{order_id}:outcome")
}

/// The id of the notification sent for the terminal event `outcome_event_id`.
pub fn notification_id(outcome_event_id: &str) -> String {
    format!("{outcome_event_id}:notification")
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OrderItem {
    pub product_id: Uuid,
    pub quantity: i32,
    pub unit_price_cents: i64,
}

/// `order.created`: a customer placed an order; payment-service is to charge it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrderCreated {
    pub order_id: Uuid,
    pub customer_id: String,
    pub amount_cents: i64,
    pub items: Vec<OrderItem>,
}

/// `payment.succeeded` / `payment.failed`: payment-service's answer to an `order.created`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PaymentResult {
    pub order_id: Uuid,
    pub amount_cents: i64,
    /// Why the payment failed; absent on success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `order.confirmed` / `order.cancelled`: the saga's decided outcome for an order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrderOutcome {
    pub order_id: Uuid,
    pub customer_id: String,
    pub amount_cents: i64,
    /// Why the order was cancelled; absent when confirmed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `notification.sent`: the customer was told the outcome. Nobody consumes it yet; it is
/// the audit trail's last entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NotificationSent {
    pub order_id: Uuid,
    pub customer_id: String,
    pub message: String,
}
