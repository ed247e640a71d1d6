//! The `auth` section: where a request's API key is read (`api_key_from`:
//! `bearer`, `basic` — the key as the Basic user name, Stripe's style — and
//! `header:<Name>`, tried in order) and whether a key postguard does not know
//! is verified once against the origin (`verify_unknown_keys`). Operator,
//! origin and portal tokens are always `Authorization: Bearer`.

use serde::Deserialize;

use super::check::{range, ConfigError};
pub use crate::credential::KeySource;

/// `auth.verify_unknown_keys`: the origin's endpoint that says whether a key
/// it issued is valid (`POST <ORIGIN_URL><path>`), and how long a key it
/// refused is not asked about again.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyConfig {
    pub path: String,
    #[serde(default = "default_negative_cache_s")]
    pub negative_cache_s: u32,
}

fn default_negative_cache_s() -> u32 {
    60
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// As written; [`AuthConfig::sources`] reads them.
    pub api_key_from: Vec<String>,
    pub verify_unknown_keys: Option<VerifyConfig>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            api_key_from: vec!["bearer".into()],
            verify_unknown_keys: None,
        }
    }
}

impl AuthConfig {
    /// The sources in order (the validated ones: an invalid entry is a
    /// configuration error, so none is skipped at run time).
    pub fn sources(&self) -> Vec<KeySource> {
        self.api_key_from
            .iter()
            .filter_map(|s| KeySource::parse(s).ok())
            .collect()
    }

    /// The header names a key may come in, other than `Authorization`:
    /// removed from every forwarded request, wherever the key was found.
    pub fn key_headers(&self) -> Vec<String> {
        self.sources()
            .into_iter()
            .filter_map(|s| match s {
                KeySource::Header(n) => Some(n),
                _ => None,
            })
            .collect()
    }
}

/// Most sources a list may name.
const MAX_SOURCES: usize = 8;

pub(super) fn validate(a: &AuthConfig) -> Result<(), ConfigError> {
    if a.api_key_from.is_empty() || a.api_key_from.len() > MAX_SOURCES {
        return Err(ConfigError::new(
            "auth.api_key_from",
            format!("must list 1 to {MAX_SOURCES} sources"),
        ));
    }
    let mut seen = Vec::new();
    for (i, s) in a.api_key_from.iter().enumerate() {
        let field = format!("auth.api_key_from[{i}]");
        let source = KeySource::parse(s).map_err(|why| ConfigError::new(&field, why))?;
        if seen.contains(&source) {
            return Err(ConfigError::new(field, "is listed twice"));
        }
        seen.push(source);
    }
    if let Some(v) = &a.verify_unknown_keys {
        let ok = v.path.starts_with('/')
            && v.path.len() <= 256
            && !v.path.contains(['?', '#'])
            && v.path.bytes().all(|b| b.is_ascii_graphic());
        if !ok {
            return Err(ConfigError::new(
                "auth.verify_unknown_keys.path",
                "must be a path on the default origin: starting with '/', at most 256 visible characters, no query",
            ));
        }
        range(
            "auth.verify_unknown_keys.negative_cache_s",
            v.negative_cache_s,
            1,
            86_400,
        )?;
    }
    Ok(())
}
