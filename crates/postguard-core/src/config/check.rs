//! What every section's validation shares: the error naming a leaf field,
//! range checks, HTTP methods and the routes of rules.
//!
//! A leaf of `config/`: the sections (and the `webhooks` section beside
//! `webhooks/`) import it, it imports none of them, so no section has to
//! import `config/mod.rs`, which imports them all.

use crate::pattern;

/// A configuration value that failed validation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ConfigError {
    /// The offending field: an environment name or a dotted JSON path.
    pub field: String,
    pub reason: String,
}

impl ConfigError {
    pub(crate) fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// `v` within `lo..=hi`, or an error naming `field` with both bounds.
pub(crate) fn range<T: PartialOrd + std::fmt::Display>(
    field: impl Into<String>,
    v: T,
    lo: T,
    hi: T,
) -> Result<(), ConfigError> {
    if v < lo || v > hi {
        return Err(ConfigError::new(
            field,
            format!("must be between {lo} and {hi}, got {v}"),
        ));
    }
    Ok(())
}

const HTTP_METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/// An upper-case HTTP method, or `*` where a rule may match any.
pub(crate) fn valid_method(m: &str, allow_any: bool) -> bool {
    (allow_any && m == "*") || HTTP_METHODS.contains(&m)
}

/// The method of a rule that names a mutating request: an operation runs a
/// request under its Idempotency-Key, which GET, HEAD and OPTIONS never carry.
fn valid_mutating(m: &str) -> bool {
    m == "*" || matches!(m, "POST" | "PUT" | "PATCH" | "DELETE")
}

/// The route of a rule that keeps responses (`async.routes`,
/// `events_from_responses`): a mutating method and a path pattern.
pub(crate) fn validate_rule_route(f: &str, method: &str, path: &str) -> Result<(), ConfigError> {
    if !valid_mutating(method) {
        return Err(ConfigError::new(
            format!("{f}.method"),
            "must be POST, PUT, PATCH, DELETE or * (responses are kept only under an Idempotency-Key)",
        ));
    }
    validate_path(f, path)
}

/// A rule's path pattern, named `{f}.path`.
pub(crate) fn validate_path(f: &str, path: &str) -> Result<(), ConfigError> {
    if !pattern::is_valid(path) {
        return Err(ConfigError::new(
            format!("{f}.path"),
            "must start with / and contain only visible ASCII",
        ));
    }
    Ok(())
}

/// A rule's method (`*` allowed) and path pattern: `rate_limit.costs`,
/// `idempotency.routes`.
pub(crate) fn validate_route(f: &str, method: &str, path: &str) -> Result<(), ConfigError> {
    if !valid_method(method, true) {
        return Err(ConfigError::new(
            format!("{f}.method"),
            "must be an upper-case HTTP method or *",
        ));
    }
    validate_path(f, path)
}
