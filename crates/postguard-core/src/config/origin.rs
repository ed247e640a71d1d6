//! The origin: `ORIGIN_URL` (where requests are forwarded), the `origin`
//! section (how long it may take) and `public_url`, the gateway's own
//! public origin.

use serde::Deserialize;
use url::Url;

use super::check::{range, ConfigError};
// The one host rule every URL the gateway is given shares (ASCII, never
// percent-encoded; ADR 0019): a leaf of `webhooks/` that imports no config.
use crate::url_host::host_refusal;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OriginConfig {
    pub timeout_ms: u32,
}

impl Default for OriginConfig {
    fn default() -> Self {
        OriginConfig { timeout_ms: 30_000 }
    }
}

/// How long the origin may take to answer: 100 ms to 10 minutes.
pub(super) fn validate(o: &OriginConfig) -> Result<(), ConfigError> {
    range("origin.timeout_ms", o.timeout_ms, 100, 600_000)
}

/// `ORIGIN_URL`: an http(s) URL with a host, an ASCII host never
/// percent-encoded, no credentials, query or fragment (its path is the base
/// every request's path is appended to).
pub(super) fn parse_origin_url(value: Option<&str>) -> Result<Url, ConfigError> {
    const F: &str = "ORIGIN_URL";
    let raw = value
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| ConfigError::new(F, "is required"))?;
    if let Some(why) = host_refusal(raw) {
        return Err(ConfigError::new(F, why));
    }
    let url =
        Url::parse(raw).map_err(|e| ConfigError::new(F, format!("is not a valid URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ConfigError::new(F, "must use http or https"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(ConfigError::new(F, "must name a host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ConfigError::new(F, "must not contain credentials"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(ConfigError::new(F, "must not contain a query or fragment"));
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
