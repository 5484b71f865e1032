//! The API's errors, each a JSON body: `{"error": {"code": …, "message": …}}`, with
//! `field` when one field of the request is wrong. A code names the case for a program;
//! the message says what to do about it for a person.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use saga::Retry;
use saga::http::BodyError;
use saga::idempotency::KeyError;
use serde_json::json;

/// The code of a refund asked of a charge refunded already: a caller reads it as the
/// refund made, and takes the refund from the charge.
pub const CHARGE_ALREADY_REFUNDED: &str = "charge_already_refunded";

#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// 415 or 400.
    #[error(transparent)]
    Body(BodyError),
    /// 400: a field is missing, of the wrong type, or out of range.
    #[error("{field}: {message}")]
    InvalidField { field: String, message: String },
    /// 400: every charge and every refund must carry a key.
    #[error("this POST requires an Idempotency-Key header")]
    IdempotencyKeyMissing,
    /// 400.
    #[error(transparent)]
    InvalidIdempotencyKey(KeyError),
    /// 422: the key was first used with a different request.
    #[error(
        "this Idempotency-Key was used with a different request; use a new key for a new request"
    )]
    IdempotencyKeyReused,
    /// 409: a call with this key is still running.
    #[error("a call with this Idempotency-Key is still being processed; retry shortly")]
    IdempotencyKeyInUse,
    /// 404.
    #[error("no charge {0}")]
    NotFound(String),
    /// 404.
    #[error("no refund {0}")]
    RefundNotFound(String),
    /// 400: a declined charge moved no money, so there is nothing to give back.
    #[error("charge {0} was declined; there is nothing to refund")]
    ChargeNotRefundable(String),
    /// 400, not 409: the refund exists and asking again cannot change that; a caller
    /// that retries on 409 would ask for ever. The charge lists the refund.
    #[error("charge {0} is refunded already; GET /v1/charges/{0} shows its refund")]
    ChargeAlreadyRefunded(String),
    /// 409: another refund of the charge held it longer than `IDEMPOTENCY_KEY_WAIT`.
    #[error("another refund of this charge is still being processed; retry shortly")]
    ChargeInUse,
    /// 503: a fault is armed, or the database is away.
    #[error("the provider is unavailable: {0}")]
    Unavailable(String),
    /// 500.
    #[error(transparent)]
    Internal(anyhow::Error),
}

impl ProviderError {
    pub fn field(field: impl Into<String>, message: impl Into<String>) -> Self {
        ProviderError::InvalidField {
            field: field.into(),
            message: message.into(),
        }
    }

    /// The status and the code a program tells the case by.
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ProviderError::Body(BodyError::NotJson) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            ProviderError::Body(BodyError::Malformed(_)) => {
                (StatusCode::BAD_REQUEST, "malformed_json")
            }
            ProviderError::InvalidField { .. } => (StatusCode::BAD_REQUEST, "invalid_field"),
            ProviderError::IdempotencyKeyMissing => {
                (StatusCode::BAD_REQUEST, "idempotency_key_missing")
            }
            ProviderError::InvalidIdempotencyKey(_) => {
                (StatusCode::BAD_REQUEST, "invalid_idempotency_key")
            }
            ProviderError::IdempotencyKeyReused => {
                (StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reused")
            }
            ProviderError::IdempotencyKeyInUse => (StatusCode::CONFLICT, "idempotency_key_in_use"),
            ProviderError::NotFound(_) => (StatusCode::NOT_FOUND, "charge_not_found"),
            ProviderError::RefundNotFound(_) => (StatusCode::NOT_FOUND, "refund_not_found"),
            ProviderError::ChargeNotRefundable(_) => {
                (StatusCode::BAD_REQUEST, "charge_not_refundable")
            }
            ProviderError::ChargeAlreadyRefunded(_) => {
                (StatusCode::BAD_REQUEST, CHARGE_ALREADY_REFUNDED)
            }
            ProviderError::ChargeInUse => (StatusCode::CONFLICT, "charge_in_use"),
            ProviderError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            ProviderError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl From<tokio_postgres::Error> for ProviderError {
    fn from(error: tokio_postgres::Error) -> Self {
        match saga::retry::classify_postgres(&error) {
            Retry::UntilItWorks => ProviderError::Unavailable(error.to_string()),
            Retry::AFewTimes | Retry::Never => ProviderError::Internal(error.into()),
        }
    }
}

impl From<deadpool_postgres::PoolError> for ProviderError {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        ProviderError::Unavailable(error.to_string())
    }
}

impl IntoResponse for ProviderError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        // What went wrong inside is logged, not sent: the caller can do nothing with it.
        let message = match &self {
            ProviderError::Unavailable(error) => {
                tracing::warn!(%error, "call refused: unavailable");
                "the provider is unavailable; retry later".to_owned()
            }
            ProviderError::Internal(error) => {
                tracing::error!(error = format!("{error:#}"), "call failed");
                "internal error".to_owned()
            }
            ProviderError::InvalidField { message, .. } => message.clone(),
            other => other.to_string(),
        };
        let mut body = json!({ "code": code, "message": message });
        if let ProviderError::InvalidField { field, .. } = &self {
            body["field"] = field.as_str().into();
        }
        let mut response = (status, axum::Json(json!({ "error": body }))).into_response();
        if matches!(
            self,
            ProviderError::IdempotencyKeyInUse
                | ProviderError::ChargeInUse
                | ProviderError::Unavailable(_)
        ) {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}
