//! CORS (issue 10 §7): browsers can call an API through the gateway.
//!
//! A preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`,
//! no `Authorization`) carries no credential: it is not authenticated, not
//! rate-limited and not charged to a key. By default it is forwarded to the
//! origin (the origin owns its CORS policy); with a `cors` block in the
//! configuration the gateway answers it itself. Either way the gateway's own
//! headers are allowed (`Idempotency-Key`) and exposed (`X-Request-Id`, the
//! rate-limit headers, `Retry-After`, `Idempotent-Replayed`) on every answer
//! to a cross-origin request, errors the gateway produces included.

use serde::Deserialize;

/// The gateway's response headers browser JavaScript may read.
pub const EXPOSED: &str = "X-Request-Id, X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset, RateLimit, RateLimit-Policy, Retry-After, Idempotent-Replayed, Postguard-Idempotency-Key-Required-From";
/// The gateway's request headers a browser may send.
pub const ALLOWED: &str = "Authorization, Content-Type, Idempotency-Key";

/// `cors` in `POSTGUARD_CONFIG`: the gateway answers preflights itself.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorsConfig {
    /// Exact origins (`https://app.example`), or `"*"` for any.
    pub allowed_origins: Vec<String>,
    #[serde(default = "default_methods")]
    pub allowed_methods: Vec<String>,
    /// Request headers allowed besides the gateway's own ([`ALLOWED`]).
    #[serde(default)]
    pub allowed_headers: Vec<String>,
    #[serde(default = "default_max_age")]
    pub max_age_s: u32,
}

fn default_methods() -> Vec<String> {
    ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]
        .map(String::from)
        .to_vec()
}

fn default_max_age() -> u32 {
    600
}

fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Whether this request is a CORS preflight.
pub fn is_preflight(method: &str, headers: &[(String, String)]) -> bool {
    method.eq_ignore_ascii_case("OPTIONS")
        && header(headers, "Origin").is_some()
        && header(headers, "Access-Control-Request-Method").is_some()
        && header(headers, "Authorization").is_none()
}

impl CorsConfig {
    /// Any origin, the default methods and max age: the gateway's own
    /// endpoints when no `cors` block is configured.
    pub fn permissive() -> Self {
        CorsConfig {
            allowed_origins: vec!["*".into()],
            allowed_methods: default_methods(),
            allowed_headers: Vec::new(),
            max_age_s: default_max_age(),
        }
    }

    fn allows(&self, origin: &str) -> bool {
        self.allowed_origins.iter().any(|o| o == "*" || o == origin)
    }
}

/// The headers of the gateway's own answer (204) to a preflight, or `None`
/// when the origin is not allowed (answered 204 without CORS headers, which
/// the browser treats as a refusal).
pub fn answer_preflight(
    cfg: &CorsConfig,
    headers: &[(String, String)],
) -> Option<Vec<(&'static str, String)>> {
    let origin = header(headers, "Origin")?;
    if !cfg.allows(origin) {
        return None;
    }
    let mut allow_headers = ALLOWED.to_string();
    for h in &cfg.allowed_headers {
        allow_headers.push_str(", ");
        allow_headers.push_str(h);
    }
    Some(vec![
        ("Access-Control-Allow-Origin", origin.to_string()),
        (
            "Access-Control-Allow-Methods",
            cfg.allowed_methods.join(", "),
        ),
        ("Access-Control-Allow-Headers", allow_headers),
        ("Access-Control-Max-Age", cfg.max_age_s.to_string()),
        ("Vary", "Origin".to_string()),
    ])
}

/// Headers added to every answer to a cross-origin (non-preflight) request:
/// the gateway's headers exposed, and the origin allowed — from the
/// configuration when there is one; otherwise echoed (no credentials mode:
/// the API authenticates with a bearer header, never cookies, so an echo
/// reveals nothing a non-browser client could not read).
/// `origin_allowed` is the origin's own `Access-Control-Allow-Origin`, if
/// the answer came from it: forwarded mode then keeps the origin's choice.
pub fn response_headers(
    cfg: Option<&CorsConfig>,
    request_origin: Option<&str>,
    origin_allowed: Option<&str>,
) -> Vec<(&'static str, String)> {
    let Some(origin) = request_origin else {
        return Vec::new();
    };
    let allow = match (cfg, origin_allowed) {
        (Some(c), _) => c.allows(origin).then(|| origin.to_string()),
        (None, Some(from_origin)) => Some(from_origin.to_string()),
        (None, None) => Some(origin.to_string()),
    };
    let mut out = vec![("Access-Control-Expose-Headers", EXPOSED.to_string())];
    if let Some(a) = allow {
        out.push(("Access-Control-Allow-Origin", a));
        out.push(("Vary", "Origin".to_string()));
    }
    out
}

/// A forwarded preflight's answer: the origin's headers, with the gateway's
/// `Idempotency-Key` added to `Access-Control-Allow-Headers` when the origin
/// allowed the request at all.
pub fn merge_forwarded_preflight(origin_headers: &mut Vec<(String, String)>) {
    let allowed = header(origin_headers, "Access-Control-Allow-Origin").is_some();
    if !allowed {
        return;
    }
    match origin_headers
        .iter_mut()
        .find(|(k, _)| k.eq_ignore_ascii_case("Access-Control-Allow-Headers"))
    {
        Some((_, v)) if v.trim() == "*" => {}
        Some((_, v)) if !v.to_ascii_lowercase().contains("idempotency-key") => {
            v.push_str(", Idempotency-Key");
        }
        Some(_) => {}
        None => origin_headers.push((
            "Access-Control-Allow-Headers".into(),
            "Idempotency-Key".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn preflight_needs_origin_and_method_and_no_credential() {
        let pre = h(&[
            ("Origin", "http://a"),
            ("Access-Control-Request-Method", "POST"),
        ]);
        assert!(is_preflight("OPTIONS", &pre));
        assert!(!is_preflight("POST", &pre));
        assert!(!is_preflight("OPTIONS", &h(&[("Origin", "http://a")])));
        let mut with_auth = pre.clone();
        with_auth.push(("Authorization".into(), "Bearer x".into()));
        assert!(!is_preflight("OPTIONS", &with_auth));
    }

    #[test]
    fn configured_answer_allows_gateway_headers() {
        let cfg = CorsConfig {
            allowed_origins: vec!["http://a".into()],
            allowed_methods: default_methods(),
            allowed_headers: vec!["X-Custom".into()],
            max_age_s: 60,
        };
        let pre = h(&[
            ("Origin", "http://a"),
            ("Access-Control-Request-Method", "POST"),
        ]);
        let out = answer_preflight(&cfg, &pre).unwrap_or_default();
        assert!(out.iter().any(|(k, v)| *k == "Access-Control-Allow-Headers"
            && v.contains("Idempotency-Key")
            && v.contains("X-Custom")));
        assert!(out
            .iter()
            .any(|(k, v)| *k == "Access-Control-Allow-Origin" && v == "http://a"));
        let other = h(&[
            ("Origin", "http://b"),
            ("Access-Control-Request-Method", "POST"),
        ]);
        assert!(answer_preflight(&cfg, &other).is_none());
        assert!(response_headers(Some(&cfg), Some("http://b"), None)
            .iter()
            .all(|(k, _)| *k != "Access-Control-Allow-Origin"));
    }

    #[test]
    fn forwarded_preflight_gains_idempotency_key() {
        let mut o = h(&[
            ("Access-Control-Allow-Origin", "*"),
            ("Access-Control-Allow-Headers", "Content-Type"),
        ]);
        merge_forwarded_preflight(&mut o);
        assert_eq!(o[1].1, "Content-Type, Idempotency-Key");
        let mut refused = h(&[("Allow", "GET")]);
        merge_forwarded_preflight(&mut refused);
        assert_eq!(refused.len(), 1);
    }

    #[test]
    fn exposes_gateway_headers_only_on_cross_origin_requests() {
        assert!(response_headers(None, None, None).is_empty());
        let out = response_headers(None, Some("http://a"), None);
        assert!(out[0].1.contains("X-RateLimit-Remaining"));
        assert_eq!(out[1].1, "http://a");
    }
}
