//! The `idempotency` section: which requests take part (the method table,
//! route rules), how long a claim holds, what a record stores and how long
//! and how much is replayed.

use serde::Deserialize;

use super::check::{range, valid_method, validate_route, ConfigError};
use super::named::Named;
use crate::idempotency::Mode;
use crate::pattern;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteRule {
    pub method: String,
    pub path: String,
    pub mode: Mode,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdempotencyConfig {
    pub methods: Named<Mode>,
    pub routes: Vec<RouteRule>,
    pub lease_s: u32,
    pub max_stored_body_bytes: u64,
    /// Largest response replayed byte for byte (bodies over
    /// `max_stored_body_bytes` are kept in R2, streamed, never held whole).
    pub max_replay_bytes: u64,
    /// Whether `Set-Cookie` from the origin is stored and replayed.
    pub store_set_cookie: bool,
    /// How long an expired record is kept so `GET /idempotency/{key}` can
    /// answer `expired` (never replayed; 0 deletes records at expiry).
    pub lookup_grace_s: u32,
    /// RFC 3339: until then a required key that is missing is asked for
    /// (`Postguard-Idempotency-Key-Required-From`), not enforced.
    pub required_from: Option<String>,
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        let methods = [
            ("POST", Mode::Required),
            ("PATCH", Mode::Optional),
            ("PUT", Mode::Optional),
            ("DELETE", Mode::Optional),
        ]
        .into_iter()
        .map(|(m, mode)| (m.to_string(), mode))
        .collect();
        IdempotencyConfig {
            methods,
            routes: Vec::new(),
            lease_s: 60,
            max_stored_body_bytes: 1 << 20,
            max_replay_bytes: DEFAULT_REPLAY_BYTES,
            store_set_cookie: false,
            lookup_grace_s: 3_600,
            required_from: None,
        }
    }
}

/// Largest stored response body we accept in configuration (bodies are kept
/// in Durable Object storage, chunked).
pub const MAX_STORED_BODY_CAP: u64 = 16 << 20;
/// Default `idempotency.max_replay_bytes`: 100 MiB.
pub const DEFAULT_REPLAY_BYTES: u64 = 100 << 20;
/// Largest `idempotency.max_replay_bytes` accepted: 1 GiB (such bodies are
/// streamed to R2 and back, never held in the isolate).
pub const MAX_REPLAY_CAP: u64 = 1 << 30;

impl IdempotencyConfig {
    /// `required_from` in epoch milliseconds (checked at load, so `None`
    /// only when it is absent).
    pub fn required_from_ms(&self) -> Option<u64> {
        let at = self.required_from.as_deref()?;
        crate::times::parse_time("idempotency.required_from", at).ok()
    }

    /// The idempotency mode for a request: the first matching route rule,
    /// else the method table; methods not in the table are never idempotent.
    pub fn mode(&self, method: &str, path: &str) -> Mode {
        if let Some(rule) = self
            .routes
            .iter()
            .find(|r| (r.method == "*" || r.method == method) && pattern::matches(&r.path, path))
        {
            // GET/HEAD never take part, whatever a route says.
            if matches!(method, "GET" | "HEAD" | "OPTIONS") {
                return Mode::Off;
            }
            return rule.mode;
        }
        self.methods.get(method).copied().unwrap_or(Mode::Off)
    }
}

// The section is checked in three steps because `config::validate` checks
// `origin.timeout_ms` and `max_body_bytes` between them, as it did before
// the split: the first error named stays the same for every input.

/// Which requests take part: the method table and the route rules.
pub(super) fn validate_rules(idem: &IdempotencyConfig) -> Result<(), ConfigError> {
    for method in idem.methods.keys() {
        if !valid_method(method, false)
            || method == "GET"
            || method == "HEAD"
            || method == "OPTIONS"
        {
            return Err(ConfigError::new(
                format!("idempotency.methods.{method}"),
                "must be one of POST, PUT, PATCH, DELETE",
            ));
        }
    }
    if let Some(at) = &idem.required_from {
        let rfc3339 = &time::format_description::well_known::Rfc3339;
        if time::OffsetDateTime::parse(at, rfc3339).is_err() || idem.required_from_ms().is_none() {
            return Err(ConfigError::new(
                "idempotency.required_from",
                "must be an RFC 3339 timestamp (2027-03-01T00:00:00Z), at most 9999-12-31",
            ));
        }
    }
    for (i, rule) in idem.routes.iter().enumerate() {
        validate_route(
            &format!("idempotency.routes[{i}]"),
            &rule.method,
            &rule.path,
        )?;
    }
    Ok(())
}

/// How long a claim holds — longer than the origin may take to answer —
/// and how large a stored body may be.
pub(super) fn validate_records(
    idem: &IdempotencyConfig,
    origin_timeout_ms: u32,
) -> Result<(), ConfigError> {
    range("idempotency.lease_s", idem.lease_s, 1, 3_600)?;
    if u64::from(idem.lease_s) * 1000 <= u64::from(origin_timeout_ms) {
        return Err(ConfigError::new(
            "idempotency.lease_s",
            format!("must exceed origin.timeout_ms ({origin_timeout_ms} ms), or a claim could expire while its request still runs"),
        ));
    }
    range(
        "idempotency.max_stored_body_bytes",
        idem.max_stored_body_bytes,
        1 << 20,
        MAX_STORED_BODY_CAP,
    )
}

/// How long an expired record still answers a lookup, and how large an
/// answer is replayed (at least what is stored).
pub(super) fn validate_replay(idem: &IdempotencyConfig) -> Result<(), ConfigError> {
    range(
        "idempotency.lookup_grace_s",
        idem.lookup_grace_s,
        0,
        604_800,
    )?;
    range(
        "idempotency.max_replay_bytes",
        idem.max_replay_bytes,
        idem.max_stored_body_bytes,
        MAX_REPLAY_CAP,
    )
}

#[cfg(test)]
mod tests {
    use crate::config::tests::env;
    use crate::config::Config;
    use crate::idempotency::Mode;

    #[test]
    fn first_matching_route_wins_and_get_is_never_idempotent() {
        let c = Config::load(&env(Some(
            r#"{"idempotency":{"routes":[
                {"method":"POST","path":"/search","mode":"off"},
                {"method":"*","path":"/payments/*","mode":"optional"},
                {"method":"POST","path":"/payments/*","mode":"required"}]}}"#,
        )))
        .unwrap();
        let s = &c.settings;
        assert_eq!(s.idempotency_mode("POST", "/search"), Mode::Off);
        assert_eq!(s.idempotency_mode("POST", "/payments/1"), Mode::Optional);
        assert_eq!(s.idempotency_mode("DELETE", "/payments/1"), Mode::Optional);
        assert_eq!(s.idempotency_mode("GET", "/payments/1"), Mode::Off);
        assert_eq!(s.idempotency_mode("POST", "/other"), Mode::Required);
    }
}
