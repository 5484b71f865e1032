//! The event catalog: every event type of the saga, its topic, its payload, and how its
//! deterministic id derives from the order or the event that caused it.
//!
//! | type | topic | id | written by |
//! |---|---|---|---|
//! | `order.created` | orders | `<order id>` | order-service |
//! | `payment.succeeded` / `payment.failed` | payments | `<order.created id>:payment` | payment-service |
//! | `order.confirmed` / `order.cancelled` (the payment's outcome) | orders | `<order id>:outcome` | order-service |
//! | `order.cancelled` (by the customer, or the deadline) | orders | `<order id>:cancel` | order-service |
//! | `payment.refunded` | payments | `<order id>:refund` | payment-service |
//! | `payment.voided` | payments | `<order.cancelled id>:voided` | payment-service |
//! | `payment.refund_failed` | payments | `<order id>:refund_failed:<attempt>` | payment-service |
//! | `order.refunded` | orders | `<order id>:refunded` | order-service |
//! | `notification.sent` | notifications | `<order event id>:notification` | notification-service |
//!
//! The payment's outcome has one id whichever it is, so the outbox's unique `event_id`
//! refuses a second outcome for an order even if every other guard were gone. A later
//! cancellation is a different fact with an id of its own: at most one per order, as
//! order-service cancels an order once. payment-service answers every cancellation:
//! `payment.refunded` when a charge stood (one refund per order, whatever asked for it:
//! its id and its key at the provider are both `<order id>:refund`), `payment.voided`
//! when nothing was charged and nothing will be, `payment.refund_failed` when a charge stood
//! and no refund could be made (the provider refused it, or nothing here can ask for it):
//! the order's money then waits for a person, visibly, and a refund made later on an
//! operator's retry is `payment.refunded` as ever. An order has *settled* when its outcome
//! is decided and its cancellation, if any, answered.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub const ORDER_CREATED: &str = "order.created";
pub const ORDER_CONFIRMED: &str = "order.confirmed";
pub const ORDER_CANCELLED: &str = "order.cancelled";
pub const PAYMENT_SUCCEEDED: &str = "payment.succeeded";
pub const PAYMENT_FAILED: &str = "payment.failed";
pub const NOTIFICATION_SENT: &str = "notification.sent";
pub const PAYMENT_REFUNDED: &str = "payment.refunded";
pub const PAYMENT_VOIDED: &str = "payment.voided";
pub const ORDER_REFUNDED: &str = "order.refunded";
pub const PAYMENT_REFUND_FAILED: &str = "payment.refund_failed";

/// Every type on the `orders` topic: each of its consumers knows them all, and
/// dead-letters any other, so a consumer learns a new type before anything emits it.
pub const ORDERS_TYPES: [&str; 4] = [
    ORDER_CREATED,
    ORDER_CONFIRMED,
    ORDER_CANCELLED,
    ORDER_REFUNDED,
];
/// Every type on the `payments` topic.
pub const PAYMENTS_TYPES: [&str; 5] = [
    PAYMENT_SUCCEEDED,
    PAYMENT_FAILED,
    PAYMENT_REFUNDED,
    PAYMENT_VOIDED,
    PAYMENT_REFUND_FAILED,
];

/// Why order-service cancelled an order that its payment did not: the customer asked
/// (`POST /v1/orders/{id}/cancel`).
pub const CANCELLED_BY_CUSTOMER: &str = "customer";
/// Why order-service cancelled an order that its payment did not: it was still
/// `pending` past `ORDER_PAYMENT_TIMEOUT`.
pub const CANCELLED_FOR_TIMEOUT: &str = "timeout";

/// The id of the payment result answering the `order.created` event `order_created_id`.
pub fn payment_result_id(order_created_id: &str) -> String {
    format!("{order_created_id}:payment")
}

/// The id of the payment's outcome for an order: `order.confirmed`, or `order.cancelled`
/// for a declined payment.
pub fn order_outcome_id(order_id: Uuid) -> String {
    format!("{order_id}:outcome")
}

/// The id of the `order.cancelled` that order-service writes when the customer or the
/// deadline cancels an order.
pub fn cancellation_id(order_id: Uuid) -> String {
    format!("{order_id}:cancel")
}

/// Whether `event_id` is one of the ids order-service gives an order's `order.cancelled`:
/// only those are the order's state. A cancellation with any other id was not written by
/// order-service (a replay typed by hand with a new id, say), and moves no money.
pub fn is_order_services_cancellation(event_id: &str, order_id: Uuid) -> bool {
    event_id == order_outcome_id(order_id) || event_id == cancellation_id(order_id)
}

/// The id of an order's `payment.refunded`; also the refund's idempotency key at the
/// provider. One per order: an order is charged once, and refunded at most once.
pub fn refund_id(order_id: Uuid) -> String {
    format!("{order_id}:refund")
}

/// The id of the `payment.voided` answering the cancellation `cancellation_event_id`.
pub fn voided_id(cancellation_event_id: &str) -> String {
    format!("{cancellation_event_id}:voided")
}

/// The id of the `payment.refund_failed` for an order's refund attempt `attempt` (the
/// first is 1; an operator's retry makes the next): one per attempt, as each is a fact.
pub fn refund_failed_id(order_id: Uuid, attempt: i32) -> String {
    format!("{order_id}:refund_failed:{attempt}")
}

/// The id of the `order.refunded` order-service announces for an order.
pub fn order_refunded_id(order_id: Uuid) -> String {
    format!("{order_id}:refunded")
}

/// The id of the notification sent for the order event `order_event_id`.
pub fn notification_id(order_event_id: &str) -> String {
    format!("{order_event_id}:notification")
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

/// `order.confirmed` / `order.cancelled`: the saga's decided outcome for an order, or a
/// later cancellation of it (`reason`: [`CANCELLED_BY_CUSTOMER`], [`CANCELLED_FOR_TIMEOUT`]).
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

/// `payment.refunded`: the order's charge was refunded at the provider, a new transaction
/// there that leaves the charge standing and pays its amount back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PaymentRefunded {
    pub order_id: Uuid,
    pub amount_cents: i64,
    /// The provider's ids: the charge refunded, and the refund.
    pub charge_id: String,
    pub refund_id: String,
}

/// `payment.voided`: the order's cancellation found nothing charged, and payment-service
/// recorded that nothing ever will be.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PaymentVoided {
    pub order_id: Uuid,
    /// Why there was nothing to refund: `declined` (the charge failed) or `not_charged`.
    pub reason: String,
}

/// `payment.refund_failed`: the order's charge stands and could not be refunded. It stays
/// so, visibly, until an operator's retry refunds it (`payment.refunded`) or a person
/// settles it with the card holder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PaymentRefundFailed {
    pub order_id: Uuid,
    pub amount_cents: i64,
    /// The provider's id of the charge standing; absent when none was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charge_id: Option<String>,
    /// The provider's refusal (`code: message`), or why no refund could be asked for.
    pub reason: String,
    /// `true` when no retry can help and a person must settle the charge: no charge id
    /// was recorded, or the charge could not be resolved.
    pub manual: bool,
    /// Which attempt failed: 1 for the cancellation's own, then one more per retry.
    pub attempt: i32,
}

/// `order.refunded`: order-service's record that a cancelled order's charge was paid
/// back, for the customer to be told.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrderRefunded {
    pub order_id: Uuid,
    pub customer_id: String,
    pub amount_cents: i64,
}
