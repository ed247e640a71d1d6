//! The `cors` section's validation (its type, [`CorsConfig`], and the
//! preflight decisions live in `crate::cors`).

use url::Url;

use super::check::{range, valid_method, ConfigError};
use crate::cors::CorsConfig;
// The host rule `ORIGIN_URL` shares (see `origin.rs`).
use crate::url_host::host_refusal;

/// 1 to 100 origins (or `*`), methods, header names and the preflight's
/// lifetime.
pub(super) fn validate(c: &CorsConfig) -> Result<(), ConfigError> {
    if c.allowed_origins.is_empty() || c.allowed_origins.len() > 100 {
        return Err(ConfigError::new(
            "cors.allowed_origins",
            "must list 1 to 100 origins (or \"*\")",
        ));
    }
    if let Some(bad) = c.allowed_origins.iter().find(|o| {
        o.as_str() != "*"
            && (host_refusal(o).is_some()
                || Url::parse(o).map_or(true, |u| u.origin().ascii_serialization() != **o))
    }) {
        let shown: String = bad.chars().take(64).collect();
        return Err(ConfigError::new(
            "cors.allowed_origins",
            format!("{shown} is not an origin (scheme://host[:port])"),
        ));
    }
    if let Some(m) = c.allowed_methods.iter().find(|m| !valid_method(m, false)) {
        let shown: String = m.chars().take(16).collect();
        return Err(ConfigError::new(
            "cors.allowed_methods",
            format!("{shown} is not a method"),
        ));
    }
    if c.allowed_headers
        .iter()
        .any(|h| h.is_empty() || !h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    {
        return Err(ConfigError::new(
            "cors.allowed_headers",
            "header names are letters, digits and '-'",
        ));
    }
    range("cors.max_age_s", c.max_age_s, 0, 86_400)
}
