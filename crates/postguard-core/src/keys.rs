//! API-key resources and the validation of the operator's requests.

use serde::{Deserialize, Serialize};

use crate::config::{is_valid_name, Settings};
use crate::Invalid;

/// An API key as stored (by hash) and listed. Never holds the key itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    pub id: String,
    pub prefix: String,
    pub project: String,
    pub plan: String,
    pub name: Option<String>,
    pub created_at: u64,
    pub revoked_at: Option<u64>,
}

/// `POST /_postguard/v1/keys` body.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateKey {
    pub project: String,
    pub plan: String,
    #[serde(default)]
    pub name: Option<String>,
}

pub const MAX_NAME_LEN: usize = 200;

/// Parses and validates a create request; the error is a client-facing detail.
pub fn parse_create(body: &[u8], settings: &Settings) -> Result<CreateKey, Invalid> {
    let req: CreateKey = serde_json::from_slice(body)
        .map_err(|e| format!("body must be a JSON object {{project, plan, name?}}: {e}"))?;
    if !is_valid_name(&req.project) {
        return Err("project: must be 1-64 characters of [A-Za-z0-9._-]".into());
    }
    if !settings.plans.contains_key(&req.plan) {
        let known: Vec<&str> = settings.plans.keys().map(String::as_str).collect();
        return Err(format!(
            "plan: unknown plan '{}' (configured: {})",
            truncate(&req.plan, 64),
            known.join(", ")
        )
        .into());
    }
    if let Some(name) = &req.name {
        if name.chars().count() > MAX_NAME_LEN || name.chars().any(char::is_control) {
            return Err(
                format!("name: at most {MAX_NAME_LEN} characters, no control characters").into(),
            );
        }
    }
    Ok(req)
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// The list order key: newest first, then by id.
pub fn reverse_time(created_at_ms: u64) -> String {
    format!("{:016x}", u64::MAX - created_at_ms)
}

pub use crate::page::parse_limit;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_validation() {
        let s = Settings::default();
        assert!(parse_create(br#"{"project":"acme","plan":"trial"}"#, &s).is_ok());
        assert!(parse_create(br#"{"project":"acme","plan":"trial","name":"ci"}"#, &s).is_ok());
        assert!(parse_create(br#"{"project":"acme","plan":"gold"}"#, &s)
            .unwrap_err()
            .starts_with("plan:"));
        assert!(parse_create(br#"{"project":"a b","plan":"trial"}"#, &s)
            .unwrap_err()
            .starts_with("project:"));
        assert!(parse_create(br#"{"project":"","plan":"trial"}"#, &s).is_err());
        assert!(parse_create(br#"{"plan":"trial"}"#, &s).is_err());
        assert!(parse_create(br#"{"project":"a","plan":"trial","x":1}"#, &s).is_err());
        assert!(parse_create(b"not json", &s).is_err());
        assert!(parse_create(b"[]", &s).is_err());
        assert!(parse_create(br#"{"project":1,"plan":"trial"}"#, &s).is_err());
        let long = format!(
            r#"{{"project":"a","plan":"trial","name":"{}"}}"#,
            "n".repeat(201)
        );
        assert!(parse_create(long.as_bytes(), &s)
            .unwrap_err()
            .starts_with("name:"));
    }

    #[test]
    fn reverse_time_sorts_newest_first() {
        assert!(reverse_time(2) < reverse_time(1));
        assert_eq!(reverse_time(0).len(), 16);
    }
}
