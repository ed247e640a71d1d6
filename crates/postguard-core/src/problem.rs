//! The stable error codes and their RFC 9457 `application/problem+json` bodies.
//!
//! Every error postguard produces is mapped here, once. The list is published
//! in docs/errors.md; codes are never renamed.

use serde::Serialize;

/// Media type of every error body.
pub const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";

/// The problem type of draft-ietf-httpapi-ratelimit-headers for a request
/// refused by a quota.
pub const QUOTA_EXCEEDED_TYPE: &str =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// A stable, published error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    InvalidApiKey,
    RateLimitExceeded,
    IdempotencyKeyRequired,
    IdempotencyKeyInvalid,
    IdempotencyKeyInProgress,
    IdempotencyKeyReuseConflict,
    PayloadTooLarge,
    ReplayUnavailable,
    OriginUnreachable,
    OriginTimeout,
    ValidationError,
    NotFound,
    MethodNotAllowed,
    ConfigInvalid,
    Unauthorized,
    Forbidden,
    AuditProjectRequired,
    Internal,
    EventQuotaExceeded,
    StorageFull,
    StorageUnavailable,
    RetryLimitReached,
    TaskInProgress,
    ApiKeyExpired,
    ConcurrencyLimitExceeded,
    OperationNotDone,
    OperationAbandoned,
}

impl ErrorCode {
    /// Every code, in the order docs/errors.md lists them.
    pub const ALL: [ErrorCode; 27] = [
        ErrorCode::InvalidApiKey,
        ErrorCode::RateLimitExceeded,
        ErrorCode::IdempotencyKeyRequired,
        ErrorCode::IdempotencyKeyInvalid,
        ErrorCode::IdempotencyKeyInProgress,
        ErrorCode::IdempotencyKeyReuseConflict,
        ErrorCode::PayloadTooLarge,
        ErrorCode::ReplayUnavailable,
        ErrorCode::OriginUnreachable,
        ErrorCode::OriginTimeout,
        ErrorCode::ValidationError,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::ConfigInvalid,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::AuditProjectRequired,
        ErrorCode::Internal,
        ErrorCode::EventQuotaExceeded,
        ErrorCode::StorageFull,
        ErrorCode::StorageUnavailable,
        ErrorCode::RetryLimitReached,
        ErrorCode::TaskInProgress,
        ErrorCode::ApiKeyExpired,
        ErrorCode::ConcurrencyLimitExceeded,
        ErrorCode::OperationNotDone,
        ErrorCode::OperationAbandoned,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidApiKey => "INVALID_API_KEY",
            ErrorCode::RateLimitExceeded => "RATE_LIMIT_EXCEEDED",
            ErrorCode::IdempotencyKeyRequired => "IDEMPOTENCY_KEY_REQUIRED",
            ErrorCode::IdempotencyKeyInvalid => "IDEMPOTENCY_KEY_INVALID",
            ErrorCode::IdempotencyKeyInProgress => "IDEMPOTENCY_KEY_IN_PROGRESS",
            ErrorCode::IdempotencyKeyReuseConflict => "IDEMPOTENCY_KEY_REUSE_CONFLICT",
            ErrorCode::PayloadTooLarge => "PAYLOAD_TOO_LARGE",
            ErrorCode::ReplayUnavailable => "IDEMPOTENT_REPLAY_UNAVAILABLE",
            ErrorCode::OriginUnreachable => "ORIGIN_UNREACHABLE",
            ErrorCode::OriginTimeout => "ORIGIN_TIMEOUT",
            ErrorCode::ValidationError => "VALIDATION_ERROR",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::MethodNotAllowed => "METHOD_NOT_ALLOWED",
            ErrorCode::ConfigInvalid => "CONFIG_INVALID",
            ErrorCode::Unauthorized => "UNAUTHORIZED",
            ErrorCode::Forbidden => "FORBIDDEN",
            ErrorCode::AuditProjectRequired => "AUDIT_PROJECT_REQUIRED",
            ErrorCode::Internal => "INTERNAL_ERROR",
            ErrorCode::EventQuotaExceeded => "EVENT_QUOTA_EXCEEDED",
            ErrorCode::StorageFull => "STORAGE_FULL",
            ErrorCode::StorageUnavailable => "STORAGE_UNAVAILABLE",
            ErrorCode::RetryLimitReached => "RETRY_LIMIT_REACHED",
            ErrorCode::TaskInProgress => "TASK_IN_PROGRESS",
            ErrorCode::ApiKeyExpired => "API_KEY_EXPIRED",
            ErrorCode::ConcurrencyLimitExceeded => "CONCURRENCY_LIMIT_EXCEEDED",
            ErrorCode::OperationNotDone => "OPERATION_NOT_DONE",
            ErrorCode::OperationAbandoned => "OPERATION_ABANDONED",
        }
    }

    pub fn status(self) -> u16 {
        match self {
            ErrorCode::InvalidApiKey | ErrorCode::Unauthorized | ErrorCode::ApiKeyExpired => 401,
            ErrorCode::RateLimitExceeded
            | ErrorCode::EventQuotaExceeded
            | ErrorCode::ConcurrencyLimitExceeded => 429,
            ErrorCode::StorageFull | ErrorCode::StorageUnavailable => 503,
            ErrorCode::RetryLimitReached
            | ErrorCode::TaskInProgress
            | ErrorCode::OperationNotDone => 409,
            ErrorCode::IdempotencyKeyRequired
            | ErrorCode::IdempotencyKeyInvalid
            | ErrorCode::ValidationError
            | ErrorCode::AuditProjectRequired => 400,
            ErrorCode::IdempotencyKeyInProgress => 409,
            ErrorCode::IdempotencyKeyReuseConflict => 422,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::ReplayUnavailable | ErrorCode::OperationAbandoned => 410,
            ErrorCode::OriginUnreachable => 502,
            ErrorCode::OriginTimeout => 504,
            ErrorCode::NotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::ConfigInvalid | ErrorCode::Internal => 500,
            ErrorCode::Forbidden => 403,
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            ErrorCode::InvalidApiKey => "Invalid API key",
            ErrorCode::RateLimitExceeded => "Rate limit exceeded",
            ErrorCode::IdempotencyKeyRequired => "Idempotency-Key required",
            ErrorCode::IdempotencyKeyInvalid => "Idempotency-Key invalid",
            ErrorCode::IdempotencyKeyInProgress => "Request with this Idempotency-Key in progress",
            ErrorCode::IdempotencyKeyReuseConflict => {
                "Idempotency-Key reused with a different request"
            }
            ErrorCode::PayloadTooLarge => "Payload too large",
            ErrorCode::ReplayUnavailable => "Stored response unavailable",
            ErrorCode::OriginUnreachable => "Origin unreachable",
            ErrorCode::OriginTimeout => "Origin timeout",
            ErrorCode::ValidationError => "Validation error",
            ErrorCode::NotFound => "Not found",
            ErrorCode::MethodNotAllowed => "Method not allowed",
            ErrorCode::ConfigInvalid => "Gateway configuration invalid",
            ErrorCode::Unauthorized => "Unauthorized",
            ErrorCode::Forbidden => "Forbidden",
            ErrorCode::AuditProjectRequired => "Audit query needs a project",
            ErrorCode::Internal => "Internal gateway error",
            ErrorCode::EventQuotaExceeded => "Daily event quota exceeded",
            ErrorCode::StorageFull => "Webhook storage full",
            ErrorCode::StorageUnavailable => "Webhook storage unavailable",
            ErrorCode::RetryLimitReached => "Manual attempt limit reached",
            ErrorCode::TaskInProgress => "A task for this subscription is running",
            ErrorCode::ApiKeyExpired => "API key expired",
            ErrorCode::ConcurrencyLimitExceeded => "Too many requests in flight",
            ErrorCode::OperationNotDone => "Operation not done",
            ErrorCode::OperationAbandoned => "Operation ended without an answer",
        }
    }

    /// The RFC 9457 `type` URI: a stable identifier, documented in docs/errors.md.
    /// A refusal by a quota is the ratelimit-headers draft's problem type
    /// (with its `violated-policies` member); every other code is
    /// `urn:postguard:problem:<code in lower case>`.
    pub fn type_uri(self) -> String {
        if matches!(
            self,
            ErrorCode::RateLimitExceeded | ErrorCode::ConcurrencyLimitExceeded
        ) {
            return QUOTA_EXCEEDED_TYPE.to_string();
        }
        // One allocation, lower-cased in place (every problem answer renders it).
        const PREFIX: &str = "urn:postguard:problem:";
        let mut uri = String::with_capacity(PREFIX.len() + self.as_str().len());
        uri.push_str(PREFIX);
        uri.push_str(self.as_str());
        uri[PREFIX.len()..].make_ascii_lowercase();
        uri
    }
}

/// Client input that failed validation; the message is the client-facing
/// detail (`field: why`) of a 400 `VALIDATION_ERROR`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

impl Invalid {
    /// `field: why`.
    pub fn field(field: &str, why: &str) -> Self {
        Invalid(format!("{field}: {why}"))
    }

    /// Parses a request body that must be one JSON object of `shape`
    /// (`{project, plan, …}`). serde would also read a struct from a JSON
    /// array (`[]` fills every optional field), so the object is checked
    /// first: a body the document calls an object is refused otherwise.
    pub fn json_object<T: serde::de::DeserializeOwned>(
        body: &[u8],
        shape: &str,
    ) -> Result<T, Invalid> {
        let first = body.iter().find(|b| !b.is_ascii_whitespace());
        if first != Some(&b'{') {
            return Err(Invalid(format!("body must be a JSON object {shape}")));
        }
        serde_json::from_slice(body)
            .map_err(|e| Invalid(format!("body must be a JSON object {shape}: {e}")))
    }

    /// A query parameter the endpoint does not take (echoed bounded).
    pub fn unknown_parameter(name: &str) -> Self {
        let shown: String = name.chars().take(64).collect();
        Invalid(format!("{shown}: unknown parameter"))
    }
}

/// The detail, as text (for tests and logs).
impl std::ops::Deref for Invalid {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<&str> for Invalid {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl From<String> for Invalid {
    fn from(s: String) -> Self {
        Invalid(s)
    }
}

impl From<&str> for Invalid {
    fn from(s: &str) -> Self {
        Invalid(s.to_string())
    }
}

impl From<Invalid> for String {
    fn from(e: Invalid) -> Self {
        e.0
    }
}

impl From<Invalid> for Problem {
    fn from(e: Invalid) -> Self {
        Problem::new(ErrorCode::ValidationError, e.0)
    }
}

/// An error answer before it is rendered: a code and a human detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub code: ErrorCode,
    pub detail: String,
    /// `Retry-After` seconds, for 409, 429 and 503.
    pub retry_after_s: Option<u64>,
    /// `Allow` header value, for 405.
    pub allow: Option<&'static str>,
    /// RFC 9457 extension members, rarely present (boxed: every handler
    /// returns a `Problem` in its error path).
    pub ext: Option<Box<Extensions>>,
}

/// The extension members some problems carry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extensions {
    /// The running task a `TASK_IN_PROGRESS` answer names (`task_id`).
    pub task_id: Option<String>,
    /// The policies a quota refusal names (`violated-policies`).
    pub violated_policies: Vec<String>,
}

#[derive(Serialize)]
struct ProblemBody<'a> {
    #[serde(rename = "type")]
    type_: String,
    title: &'a str,
    status: u16,
    detail: &'a str,
    code: &'a str,
    request_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    task_id: Option<&'a str>,
    #[serde(
        rename = "violated-policies",
        skip_serializing_if = "<[String]>::is_empty"
    )]
    violated_policies: &'a [String],
}

impl Problem {
    pub fn new(code: ErrorCode, detail: impl Into<String>) -> Self {
        Problem {
            code,
            detail: detail.into(),
            retry_after_s: None,
            allow: None,
            ext: None,
        }
    }

    /// 404 for a gateway resource `what` (e.g. "API key") with this id; the
    /// id is echoed bounded.
    pub fn not_found(what: &str, id: &str) -> Self {
        let shown: String = id.chars().take(64).collect();
        Problem::new(ErrorCode::NotFound, format!("no {what} with id {shown}"))
    }

    /// 410 for a retry whose original response cannot be replayed byte for
    /// byte (over `idempotency.max_replay_bytes`, or its body storage
    /// failed): the request ran once and is not run again.
    pub fn replay_unavailable(status: u16, body_len: u64) -> Self {
        Problem::new(
            ErrorCode::ReplayUnavailable,
            format!("this Idempotency-Key's request already ran (status {status}, {body_len}-byte body), but its response body cannot be replayed; it is not executed again"),
        )
    }

    /// 401 for a revoked API key (found so in KV or by its object).
    pub fn revoked_key() -> Self {
        Problem::new(ErrorCode::InvalidApiKey, "the API key has been revoked")
    }

    /// 500 `CONFIG_INVALID`, naming the field. Never echoes a secret's value.
    pub fn config_invalid(e: &crate::config::ConfigError) -> Self {
        Problem::new(
            ErrorCode::ConfigInvalid,
            format!(
                "the deployed configuration is invalid: {}: {}",
                e.field, e.reason
            ),
        )
    }

    /// 413 for a body over `max_body_bytes`.
    pub fn payload_too_large(max: u64) -> Self {
        Problem::new(
            ErrorCode::PayloadTooLarge,
            format!("the request body exceeds the limit of {max} bytes"),
        )
    }

    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after_s = Some(seconds);
        self
    }

    /// 409: a task for the same subscription is still queued or running.
    pub fn task_in_progress(task_id: &str) -> Self {
        let mut p = Problem::new(
            ErrorCode::TaskInProgress,
            format!("task {task_id} is still working on this subscription; follow it at /_postguard/v1/tasks/{task_id}, then retry"),
        );
        p.ext = Some(Box::new(Extensions {
            task_id: Some(task_id.to_string()),
            ..Extensions::default()
        }));
        p
    }

    /// The policies that refused a request (`violated-policies`).
    pub fn with_violated(mut self, policies: Vec<String>) -> Self {
        self.ext.get_or_insert_with(Box::default).violated_policies = policies;
        self
    }

    /// 401 for an API key past its expiry (or a rerolled key's secret past
    /// its grace).
    pub fn expired_key() -> Self {
        Problem::new(
            ErrorCode::ApiKeyExpired,
            "the API key has expired: ask the operator for a new one",
        )
    }

    pub fn with_allow(mut self, allow: &'static str) -> Self {
        self.allow = Some(allow);
        self
    }

    pub fn status(&self) -> u16 {
        self.code.status()
    }

    /// The JSON body. Serialising plain strings and numbers cannot fail; the
    /// fallback keeps this total without a panic path.
    pub fn to_json(&self, request_id: &str) -> String {
        let body = ProblemBody {
            type_: self.code.type_uri(),
            title: self.code.title(),
            status: self.status(),
            detail: &self.detail,
            code: self.code.as_str(),
            request_id,
            task_id: self.ext.as_ref().and_then(|e| e.task_id.as_deref()),
            violated_policies: self.ext.as_ref().map_or(&[], |e| &e.violated_policies),
        };
        serde_json::to_string(&body).unwrap_or_else(|_| {
            format!(
                "{{\"status\":{},\"code\":\"{}\",\"request_id\":\"{}\"}}",
                self.status(),
                self.code.as_str(),
                request_id
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_and_screaming_snake() {
        let mut seen = std::collections::HashSet::new();
        for c in ErrorCode::ALL {
            assert!(seen.insert(c.as_str()), "duplicate {}", c.as_str());
            assert!(c
                .as_str()
                .chars()
                .all(|ch| ch.is_ascii_uppercase() || ch == '_'));
            assert!((400..600).contains(&c.status()));
        }
    }

    #[test]
    fn contract_statuses() {
        assert_eq!(ErrorCode::InvalidApiKey.status(), 401);
        assert_eq!(ErrorCode::RateLimitExceeded.status(), 429);
        assert_eq!(ErrorCode::IdempotencyKeyRequired.status(), 400);
        assert_eq!(ErrorCode::IdempotencyKeyInvalid.status(), 400);
        assert_eq!(ErrorCode::IdempotencyKeyInProgress.status(), 409);
        assert_eq!(ErrorCode::IdempotencyKeyReuseConflict.status(), 422);
        assert_eq!(ErrorCode::PayloadTooLarge.status(), 413);
        assert_eq!(ErrorCode::OriginUnreachable.status(), 502);
        assert_eq!(ErrorCode::OriginTimeout.status(), 504);
        assert_eq!(ErrorCode::NotFound.status(), 404);
        assert_eq!(ErrorCode::ConfigInvalid.status(), 500);
        assert_eq!(ErrorCode::Unauthorized.status(), 401);
        assert_eq!(ErrorCode::Forbidden.status(), 403);
        assert_eq!(ErrorCode::EventQuotaExceeded.status(), 429);
        assert_eq!(ErrorCode::StorageFull.status(), 503);
        assert_eq!(ErrorCode::StorageUnavailable.status(), 503);
        assert_eq!(ErrorCode::RetryLimitReached.status(), 409);
    }

    #[test]
    fn body_has_rfc9457_members_and_request_id() {
        let p = Problem::new(
            ErrorCode::IdempotencyKeyRequired,
            "POST needs a key \"quoted\"",
        );
        let v: serde_json::Value = serde_json::from_str(&p.to_json("req_1")).unwrap();
        assert_eq!(v["status"], 400);
        assert_eq!(v["code"], "IDEMPOTENCY_KEY_REQUIRED");
        assert_eq!(v["request_id"], "req_1");
        assert_eq!(v["detail"], "POST needs a key \"quoted\"");
        assert_eq!(v["type"], "urn:postguard:problem:idempotency_key_required");
        assert!(v["title"].is_string());
    }
}
