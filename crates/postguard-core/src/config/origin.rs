//! The origin: `ORIGIN_URL` (where requests are forwarded), the `origin`
//! section (how long it may take) and `public_url`, the gateway's own
//! public origin.

use serde::Deserialize;
use url::Url;

use super::check::{range, validate_route, ConfigError};
use super::named::Named;
pub use crate::routing::{OriginRoute, DEFAULT_ORIGIN};
// The one host rule every URL the gateway is given shares (ASCII, never
// percent-encoded; ADR 0019): a leaf of `webhooks/` that imports no config.
use crate::url_host::host_refusal;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OriginConfig {
    pub timeout_ms: u32,
    /// Which origin a request goes to by its path (the first match wins;
    /// no match: `default`, the `ORIGIN_URL`).
    pub routes: Vec<OriginRoute>,
}

impl Default for OriginConfig {
    fn default() -> Self {
        OriginConfig {
            timeout_ms: 30_000,
            routes: Vec::new(),
        }
    }
}

/// One named origin of `origins`: its base URL (the rules of `ORIGIN_URL`)
/// and its own timeout (`origin.timeout_ms` when absent).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedOrigin {
    pub url: String,
    #[serde(default)]
    pub timeout_ms: Option<u32>,
}

/// Most named origins, and most routes.
const MAX_ORIGINS: usize = 64;
const MAX_ROUTES: usize = 200;

/// How long the origin may take to answer: 100 ms to 10 minutes.
pub(super) fn validate(o: &OriginConfig) -> Result<(), ConfigError> {
    range("origin.timeout_ms", o.timeout_ms, 100, 600_000)
}

/// `origins` and `origin.routes`: names of `[a-z0-9_-]`, 1–32 characters
/// (`default` is `ORIGIN_URL`'s), each URL as `ORIGIN_URL`'s rules say,
/// each route's origin one of them.
pub(super) fn validate_routing(
    origins: &Named<NamedOrigin>,
    routes: &[OriginRoute],
) -> Result<(), ConfigError> {
    if origins.len() > MAX_ORIGINS {
        return Err(ConfigError::new(
            "origins",
            format!("at most {MAX_ORIGINS} origins"),
        ));
    }
    for (name, o) in origins {
        let valid = !name.is_empty()
            && name.len() <= 32
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if !valid {
            return Err(ConfigError::new(
                format!("origins.{name}"),
                "a name is 1-32 characters of [a-z0-9_-]",
            ));
        }
        if name == DEFAULT_ORIGIN {
            return Err(ConfigError::new(
                "origins.default",
                "is ORIGIN_URL: set that variable instead",
            ));
        }
        parse_base_url(&format!("origins.{name}.url"), Some(&o.url))?;
        if let Some(t) = o.timeout_ms {
            range(format!("origins.{name}.timeout_ms"), t, 100, 600_000)?;
        }
    }
    if routes.len() > MAX_ROUTES {
        return Err(ConfigError::new(
            "origin.routes",
            format!("at most {MAX_ROUTES} routes"),
        ));
    }
    for (i, r) in routes.iter().enumerate() {
        let at = format!("origin.routes[{i}]");
        validate_route(&at, r.method.as_deref().unwrap_or("*"), &r.path)?;
        if r.origin != DEFAULT_ORIGIN && origins.get(&r.origin).is_none() {
            return Err(ConfigError::new(
                format!("{at}.origin"),
                format!(
                    "names no origin: '{}' is neither default nor in origins",
                    truncate(&r.origin)
                ),
            ));
        }
        if let Some(p) = &r.strip_prefix {
            if !p.starts_with('/') || p.len() > 256 || !p.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(ConfigError::new(
                    format!("{at}.strip_prefix"),
                    "must be a path prefix: starting with '/', at most 256 visible characters",
                ));
            }
        }
    }
    Ok(())
}

fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
}

/// `ORIGIN_URL`: an http(s) URL with a host, an ASCII host never
/// percent-encoded, no credentials, query or fragment (its path is the base
/// every request's path is appended to).
pub(super) fn parse_origin_url(value: Option<&str>) -> Result<Url, ConfigError> {
    parse_base_url("ORIGIN_URL", value)
}

/// An origin's base URL (`ORIGIN_URL`, `origins.<name>.url`) under the
/// rules of `ORIGIN_URL`, the error naming `field`.
pub(super) fn parse_base_url(field: &str, value: Option<&str>) -> Result<Url, ConfigError> {
    let f = field;
    let raw = value
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| ConfigError::new(f, "is required"))?;
    if let Some(why) = host_refusal(raw) {
        return Err(ConfigError::new(f, why));
    }
    let url =
        Url::parse(raw).map_err(|e| ConfigError::new(f, format!("is not a valid URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ConfigError::new(f, "must use http or https"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(ConfigError::new(f, "must name a host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ConfigError::new(f, "must not contain credentials"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(ConfigError::new(f, "must not contain a query or fragment"));
    }
    Ok(url)
}

/// `public_url` is an origin: http(s), a host, no credentials, path, query
/// or fragment (the gateway's routes start at its root).
pub(super) fn validate_public_url(raw: &str) -> Result<(), ConfigError> {
    const F: &str = "public_url";
    let url =
        Url::parse(raw).map_err(|e| ConfigError::new(F, format!("is not a valid URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(ConfigError::new(F, "must be an http(s) origin with a host"));
    }
    if url.origin().ascii_serialization() != raw.trim_end_matches('/') {
        return Err(ConfigError::new(
            F,
            "must be an origin only (scheme://host[:port]): no credentials, path, query or fragment",
        ));
    }
    Ok(())
}
