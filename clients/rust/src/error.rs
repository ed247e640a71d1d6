//! Errors. Every error from an HTTP answer carries the status and, when the body was
//! `application/problem+json`, the problem's `code`, `detail` and `request_id`.

use std::time::Duration;

use serde::Deserialize;

/// The problem+json body of an error answer (RFC 9457), and what the client knows about
/// the call that got it.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub status: u16,
    /// The stable error code (`RATE_LIMIT_EXCEEDED`, …); `None` if the answer was not
    /// problem+json (e.g. an error of the origin's own).
    pub code: Option<String>,
    pub title: Option<String>,
    pub detail: Option<String>,
    /// From the body, else from `X-Request-Id`.
    pub request_id: Option<String>,
    pub retry_after: Option<Duration>,
    /// The Idempotency-Key the call was sent with.
    pub idempotency_key: Option<String>,
    /// Attempts made, the first included.
    pub attempts: u32,
    /// The start of the body when it was not problem+json (at most 1 KiB).
    pub body_excerpt: Option<String>,
    /// A 429's `violated-policies`: every policy that refused the request (`inflight` for
    /// the concurrency quota). Empty for other answers.
    pub violated_policies: Vec<String>,
    /// A 429's binding policy: the first member of its `RateLimit` field (the gateway lists
    /// the one that refused first), else the first violated policy.
    pub policy: Option<String>,
}

#[derive(Deserialize)]
struct ProblemBody {
    code: Option<String>,
    title: Option<String>,
    detail: Option<String>,
    request_id: Option<String>,
    /// Read leniently: a member of another shape must not hide the rest of the problem.
    #[serde(default, rename = "violated-policies")]
    violated_policies: Option<serde_json::Value>,
}

fn names(value: Option<serde_json::Value>) -> Vec<String> {
    match value {
        Some(serde_json::Value::Array(items)) => items
            .into_iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

const EXCERPT: usize = 1024;

impl Problem {
    /// Builds the problem of an error answer.
    pub(crate) fn from_answer(
        status: u16,
        content_type: Option<&str>,
        request_id_header: Option<&str>,
        body: &[u8],
    ) -> Self {
        let is_problem = content_type.is_some_and(|ct| {
            let ct = ct.to_ascii_lowercase();
            ct.starts_with("application/problem+json") || ct.starts_with("application/json")
        });
        let parsed = is_problem
            .then(|| serde_json::from_slice::<ProblemBody>(body).ok())
            .flatten();
        let excerpt = || {
            let end = body.len().min(EXCERPT);
            String::from_utf8_lossy(&body[..end]).into_owned()
        };
        let (code, title, detail, request_id, violated, body_excerpt) = match parsed {
            Some(p) => (
                p.code,
                p.title,
                p.detail,
                p.request_id,
                names(p.violated_policies),
                None,
            ),
            None => (None, None, None, None, Vec::new(), Some(excerpt())),
        };
        Problem {
            status,
            code,
            title,
            detail,
            request_id: request_id.or_else(|| request_id_header.map(str::to_owned)),
            retry_after: None,
            idempotency_key: None,
            attempts: 1,
            body_excerpt,
            violated_policies: violated,
            policy: None,
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HTTP {}", self.status)?;
        if let Some(code) = &self.code {
            write!(f, " {code}")?;
        }
        if let Some(detail) = &self.detail {
            write!(f, ": {detail}")?;
        }
        if let Some(id) = &self.request_id {
            write!(f, " (request_id {id})")?;
        }
        write!(f, " after {} attempt(s)", self.attempts)
    }
}

/// Everything a call can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An error answer (4xx/5xx), after the retries the rule allows.
    #[error("{0}")]
    Api(Box<Problem>),
    /// 422 `IDEMPOTENCY_KEY_REUSE_CONFLICT`: the Idempotency-Key was used before for a
    /// different request (method, path or body). Use a new key for a new operation.
    #[error("Idempotency-Key reused for a different request: {0}")]
    IdempotencyKeyReuseConflict(Box<Problem>),
    /// 401 `API_KEY_EXPIRED`: the API key passed its `expires_at` (or a rerolled key's old
    /// secret its grace). Never retried.
    #[error("API key expired: {0}")]
    ApiKeyExpired(Box<Problem>),
    /// 429 after the retries the rule allows: a quota refused the request —
    /// `RATE_LIMIT_EXCEEDED` (a window policy) or `CONCURRENCY_LIMIT_EXCEEDED` (too many of
    /// the key's requests in flight). [`Problem::violated_policies`] and
    /// [`Problem::policy`] name the policies.
    #[error("rate limited: {0}")]
    RateLimited(Box<Problem>),
    /// No answer: connection refused or reset, timeout, a response cut short.
    #[error("transport error after {attempts} attempt(s): {source}")]
    Transport {
        #[source]
        source: reqwest::Error,
        attempts: u32,
        idempotency_key: Option<String>,
    },
    /// An answer larger than the client's `max_response_bytes`.
    #[error("response body over {limit} bytes")]
    ResponseTooLarge { limit: usize },
    /// A success answer whose body is not the expected JSON.
    #[error("unexpected response body: {0}")]
    Decode(#[from] serde_json::Error),
    /// A bad argument or configuration (URL, header, secret…).
    #[error("invalid input: {0}")]
    Invalid(String),
    /// A `failed` asynchronous operation: the origin could not be reached, or answered 5xx,
    /// through the whole retry schedule. The problem is its last answer (or the gateway's
    /// 502 `ORIGIN_UNREACHABLE` when no attempt got one).
    #[error("operation failed: {0}")]
    OperationFailed(Box<Problem>),
    /// [`crate::Operation::wait`]'s timeout ran out while the operation was still queued
    /// or running.
    #[error("operation {id} is not done yet")]
    OperationWaitTimeout { id: String },
}

impl Error {
    /// The problem of an error answer, whatever its kind.
    pub fn problem(&self) -> Option<&Problem> {
        match self {
            Error::Api(p)
            | Error::IdempotencyKeyReuseConflict(p)
            | Error::ApiKeyExpired(p)
            | Error::RateLimited(p)
            | Error::OperationFailed(p) => Some(p),
            _ => None,
        }
    }

    /// The error's stable `code`: the problem's (postguard's published list), else the
    /// kind's own — `HTTP_ERROR` (an answer that is not problem+json), `NETWORK_ERROR`,
    /// `RESPONSE_TOO_LARGE`, `DECODE_ERROR`, `CLIENT_CONFIGURATION`,
    /// `OPERATION_WAIT_TIMEOUT` (the codes the TypeScript and Python SDKs use). Every
    /// error has one.
    pub fn code(&self) -> &str {
        match self {
            Error::Transport { .. } => "NETWORK_ERROR",
            Error::ResponseTooLarge { .. } => "RESPONSE_TOO_LARGE",
            Error::Decode(_) => "DECODE_ERROR",
            Error::Invalid(_) => "CLIENT_CONFIGURATION",
            Error::OperationWaitTimeout { .. } => "OPERATION_WAIT_TIMEOUT",
            _ => self
                .problem()
                .and_then(|p| p.code.as_deref())
                .unwrap_or("HTTP_ERROR"),
        }
    }

    /// The HTTP status of an error answer.
    pub fn status(&self) -> Option<u16> {
        self.problem().map(|p| p.status)
    }

    /// The `request_id` to quote to the API's operator.
    pub fn request_id(&self) -> Option<&str> {
        self.problem().and_then(|p| p.request_id.as_deref())
    }

    pub(crate) fn from_problem(p: Problem) -> Self {
        match (p.status, p.code.as_deref()) {
            (422, Some("IDEMPOTENCY_KEY_REUSE_CONFLICT")) => {
                Error::IdempotencyKeyReuseConflict(Box::new(p))
            }
            (401, Some("API_KEY_EXPIRED")) => Error::ApiKeyExpired(Box::new(p)),
            (429, _) => Error::RateLimited(Box::new(p)),
            _ => Error::Api(Box::new(p)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(code: Option<&str>) -> Problem {
        Problem {
            status: 404,
            code: code.map(str::to_string),
            title: None,
            detail: None,
            request_id: None,
            retry_after: None,
            idempotency_key: None,
            attempts: 1,
            body_excerpt: Some("no such thing".into()),
            violated_policies: Vec::new(),
            policy: None,
        }
    }

    /// Every error carries a code: the problem's, else its kind's.
    #[test]
    fn every_error_has_a_code() {
        assert_eq!(
            Error::from_problem(problem(Some("NOT_FOUND"))).code(),
            "NOT_FOUND"
        );
        assert_eq!(Error::from_problem(problem(None)).code(), "HTTP_ERROR");
        assert_eq!(
            Error::Invalid("no api key".into()).code(),
            "CLIENT_CONFIGURATION"
        );
        assert_eq!(
            Error::ResponseTooLarge { limit: 1 }.code(),
            "RESPONSE_TOO_LARGE"
        );
        let decode = serde_json::from_str::<u8>("x").unwrap_err();
        assert_eq!(Error::Decode(decode).code(), "DECODE_ERROR");
        assert_eq!(
            Error::OperationWaitTimeout { id: "op_1".into() }.code(),
            "OPERATION_WAIT_TIMEOUT"
        );
    }
}
