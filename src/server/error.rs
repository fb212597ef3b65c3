//! The OpenAI error body, `{"error": {"message", "type", "param", "code"}}`, with its status.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds to wait before retrying (503 when the queue is full).
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: u16, kind: &'static str, message: impl Into<String>) -> Self {
        // Messages quote the client's values: a 10 000-character string is shown by its start.
        let message = deltascope_model::brief(&message.into());
        ApiError { status, message, kind, param: None, code: None, retry_after: None }
    }

    /// 400: a field's type or value.
    pub fn bad(param: Option<&str>, message: impl Into<String>) -> Self {
        ApiError { param: param.map(str::to_string), ..Self::new(400, "invalid_request_error", message) }
    }

    /// Names another field than the one the message was built for.
    pub fn param(mut self, name: &str) -> Self {
        self.param = Some(name.into());
        self
    }

    pub fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(401, "invalid_request_error", message).code("invalid_api_key")
    }

    pub fn not_found(message: impl Into<String>, code: &'static str) -> Self {
        Self::new(404, "invalid_request_error", message).code(code)
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(413, "invalid_request_error", format!("the request body is over the limit of {limit} bytes"))
    }

    pub fn busy(queue: usize) -> Self {
        ApiError {
            retry_after: Some(1),
            ..Self::new(
                503,
                "server_error",
                format!("the queue is full ({queue} requests wait for the engine); retry later"),
            )
        }
        .code("queue_full")
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "server_error", message)
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() && self.status != 503 {
            tracing::error!(status = self.status, "{}", self.message);
        }
        let mut r = (status, [(header::CONTENT_TYPE, "application/json")], self.body().to_string()).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}
