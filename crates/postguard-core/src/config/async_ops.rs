//! The `async` section (`async_ops` in Rust, a keyword): the routes where
//! `Prefer: respond-async` is honoured and how long an operation's attempt
//! may run (docs/async-operations.md, ADR 0037).

use serde::Deserialize;

use super::check::{range, validate_rule_route, ConfigError};

/// A route whose requests may run asynchronously (`Prefer: respond-async`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AsyncRoute {
    pub method: String,
    pub path: String,
}

/// Asynchronous operations (docs/async-operations.md, ADR 0037).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AsyncConfig {
    /// The routes where `Prefer: respond-async` is honoured (none by default).
    pub routes: Vec<AsyncRoute>,
    /// How long one attempt of an operation may wait for the origin (ms).
    pub timeout_ms: u32,
    /// An operation queued this long without starting is handed to the
    /// queue again by its key's object (s): the outbox of a lost message.
    pub requeue_after_s: u32,
}

impl Default for AsyncConfig {
    fn default() -> Self {
        AsyncConfig {
            routes: Vec::new(),
            timeout_ms: 300_000,
            requeue_after_s: 60,
        }
    }
}

/// The longest `async.timeout_ms`: a queue consumer's invocation may run 15
/// minutes; one is kept for reading the request and storing the answer.
pub const MAX_ASYNC_TIMEOUT_MS: u32 = 840_000;

pub(super) fn validate(a: &AsyncConfig) -> Result<(), ConfigError> {
    if a.routes.len() > 100 {
        return Err(ConfigError::new(
            "async.routes",
            "must list at most 100 routes",
        ));
    }
    for (i, r) in a.routes.iter().enumerate() {
        validate_rule_route(&format!("async.routes[{i}]"), &r.method, &r.path)?;
    }
    range(
        "async.timeout_ms",
        a.timeout_ms,
        1_000,
        MAX_ASYNC_TIMEOUT_MS,
    )?;
    range("async.requeue_after_s", a.requeue_after_s, 1, 3_600)
}
