//! Keys an API already issued (docs/live-api.md): `POST /keys/import`,
//! validated as one call — one invalid entry refuses the call, naming it —
//! and the record each entry becomes. A key verified once against the
//! origin becomes the same record ([`record`]).
//!
//! An imported key's id is derived from its hash (`ids::imported_key_id`):
//! a re-run import, or two first requests with one key, name one key.

use serde::{Deserialize, Serialize};

use crate::config::{Plan, Settings};
use crate::ids;
use crate::keys::{validate_create, CreateKey, KeyRecord, NewKey};
use crate::Invalid;

/// Most entries one call imports.
pub const MAX_KEYS: usize = 1_000;
/// Keys one writer call stores: each costs at most five KV operations (a
/// read and four writes), well under the 1,000 an invocation may make
/// (ADR 0041).
pub const CHUNK: usize = 100;
/// Longest `prefix` (what logs and dashboards show of a key).
pub const MAX_PREFIX_LEN: usize = 12;

/// One entry of `{keys: [...]}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    sha256: Option<String>,
    #[serde(default)]
    prefix: Option<String>,
    project: String,
    plan: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    meta: Option<serde_json::Value>,
    #[serde(default)]
    expires_at: Option<serde_json::Value>,
    #[serde(default)]
    overrides: Option<Plan>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    keys: Vec<serde_json::Value>,
}

/// A key to store: its record and the SHA-256 it is looked up by.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportedKey {
    pub hash: String,
    pub record: KeyRecord,
}

/// What became of one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Created,
    /// A key with this hash was known: left as it was.
    Exists,
}

/// One entry of the answer, in the order given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Imported {
    pub id: String,
    pub prefix: String,
    pub status: Status,
}

/// The record a key the API issued becomes, created at `now_ms`.
pub fn record(
    hash: String,
    prefix: String,
    key: NewKey,
    id_secret: &[u8],
    now_ms: u64,
) -> ImportedKey {
    ImportedKey {
        record: KeyRecord {
            id: ids::imported_key_id(id_secret, &hash),
            prefix,
            project: key.project,
            plan: key.plan,
            name: key.name,
            created_at: now_ms,
            revoked_at: None,
            expires_at: key.expires_at,
            meta: key.meta,
            overrides: key.overrides,
            updated_at: now_ms,
            secret_expires_at: None,
        },
        hash,
    }
}

/// Whether `s` may be shown as a key's prefix.
fn is_prefix(s: &str) -> bool {
    (1..=MAX_PREFIX_LEN).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_graphic())
}

fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The hash and prefix of an entry (`key`, or `sha256` with `prefix`).
fn identity(e: &Entry) -> Result<(String, String), Invalid> {
    if e.prefix.as_deref().is_some_and(|p| !is_prefix(p)) {
        return Err(Invalid::field(
            "prefix",
            &format!("must be 1-{MAX_PREFIX_LEN} visible ASCII characters"),
        ));
    }
    match (&e.key, &e.sha256) {
        (Some(k), None) if ids::is_presentable_key(k) => Ok((
            ids::sha256_hex(k),
            e.prefix
                .clone()
                .unwrap_or_else(|| k.chars().take(MAX_PREFIX_LEN).collect()),
        )),
        (Some(_), None) => Err(Invalid::field(
            "key",
            "must be 16-256 visible ASCII characters",
        )),
        (None, Some(h)) if !is_sha256_hex(h) => Err(Invalid::field(
            "sha256",
            "must be the lowercase hex SHA-256 of the key (64 characters)",
        )),
        (None, Some(h)) => match &e.prefix {
            Some(p) => Ok((h.clone(), p.clone())),
            None => Err(Invalid::field("prefix", "is required with sha256")),
        },
        _ => Err(Invalid::field("key", "give exactly one of key and sha256")),
    }
}

/// One entry checked as `POST /keys` checks a key, and its record.
fn entry(
    v: serde_json::Value,
    settings: &Settings,
    id_secret: &[u8],
    now_ms: u64,
) -> Result<ImportedKey, Invalid> {
    let e: Entry = serde_json::from_value(v).map_err(|e| Invalid(e.to_string()))?;
    let (hash, prefix) = identity(&e)?;
    let create = CreateKey {
        project: e.project,
        plan: e.plan,
        name: e.name,
        expires_at: e.expires_at,
        meta: e.meta,
        overrides: e.overrides,
    };
    let key = validate_create(create, settings, now_ms)?;
    Ok(record(hash, prefix, key, id_secret, now_ms))
}

/// Parses and validates a whole import: every entry, before anything is
/// stored. The error names the entry (`keys[3].plan: …`).
pub fn parse(
    body: &[u8],
    settings: &Settings,
    id_secret: &[u8],
    now_ms: u64,
) -> Result<Vec<ImportedKey>, Invalid> {
    let b: Body = Invalid::json_object(
        body,
        "{keys: [{key | sha256, prefix?, project, plan, name?, meta?, expires_at?, overrides?}]}",
    )?;
    if b.keys.is_empty() || b.keys.len() > MAX_KEYS {
        return Err(Invalid::field(
            "keys",
            &format!(
                "must hold 1 to {MAX_KEYS} entries (it holds {})",
                b.keys.len()
            ),
        ));
    }
    let mut out: Vec<ImportedKey> = Vec::with_capacity(b.keys.len());
    let mut seen = std::collections::HashMap::new();
    for (i, v) in b.keys.into_iter().enumerate() {
        let k = entry(v, settings, id_secret, now_ms)
            .map_err(|e| Invalid(format!("keys[{i}].{}", e.0)))?;
        if let Some(first) = seen.insert(k.hash.clone(), i) {
            return Err(Invalid(format!(
                "keys[{i}].key: the same key as keys[{first}]"
            )));
        }
        out.push(k);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000;
    const SECRET: &[u8] = b"deployment secret";

    fn parsed(body: &str) -> Result<Vec<ImportedKey>, Invalid> {
        parse(body.as_bytes(), &Settings::default(), SECRET, NOW)
    }

    #[test]
    fn keys_and_hashes_become_records_with_ids_from_their_hash() {
        let hash = ids::sha256_hex("sk_live_0123456789abcdef");
        let body = format!(
            r#"{{"keys":[{{"key":"sk_live_0123456789abcdef","project":"acme","plan":"trial","name":"old"}},
                {{"sha256":"{}","prefix":"sk_live_9","project":"acme","plan":"trial"}}]}}"#,
            ids::sha256_hex("sk_live_9999999999999999")
        );
        let keys = parsed(&body).unwrap();
        assert_eq!(keys[0].hash, hash);
        assert_eq!(keys[0].record.prefix, "sk_live_0123");
        assert_eq!(keys[0].record.name.as_deref(), Some("old"));
        assert_eq!(keys[1].record.prefix, "sk_live_9");
        // The same key is the same id, whatever call imports it; another
        // deployment secret gives another id.
        let again = parsed(&body).unwrap();
        assert_eq!(keys[0].record.id, again[0].record.id);
        assert_ne!(keys[0].record.id, keys[1].record.id);
        assert_ne!(ids::imported_key_id(b"other", &hash), keys[0].record.id);
        assert!(keys[0].record.id.starts_with("key_") && keys[0].record.id.len() == 30);
        assert!(!keys[0].record.id.contains(&hash[..8]));
    }

    #[test]
    fn one_invalid_entry_refuses_the_call_naming_it() {
        let ok = r#"{"key":"sk_live_0123456789abcdef","project":"acme","plan":"trial"}"#;
        let cases = [
            (
                r#"{"key":"short","project":"acme","plan":"trial"}"#,
                "keys[1].key",
            ),
            (
                r#"{"key":"sk_live_abcdefghijklmnop","project":"acme","plan":"gold"}"#,
                "keys[1].plan",
            ),
            (
                r#"{"sha256":"ABC","prefix":"x","project":"acme","plan":"trial"}"#,
                "keys[1].sha256",
            ),
            (
                &format!(
                    r#"{{"sha256":"{}","project":"acme","plan":"trial"}}"#,
                    "a".repeat(64)
                ),
                "keys[1].prefix",
            ),
            (
                r#"{"key":"sk_live_abcdefghijklmnop","prefix":"thirteen_char","project":"acme","plan":"trial"}"#,
                "keys[1].prefix",
            ),
            (r#"{"project":"acme","plan":"trial"}"#, "keys[1].key"),
            (
                r#"{"key":"sk_live_abcdefghijklmnop","project":"bad project","plan":"trial"}"#,
                "keys[1].project",
            ),
            (
                r#"{"key":"sk_live_abcdefghijklmnop","project":"acme","plan":"trial","expires_at":1}"#,
                "keys[1].expires_at",
            ),
            (
                r#"{"key":"sk_live_abcdefghijklmnop","project":"acme","plan":"trial","colour":1}"#,
                "keys[1].",
            ),
            (ok, "keys[1].key: the same key as keys[0]"),
        ];
        for (second, named) in cases {
            let body = format!(r#"{{"keys":[{ok},{second}]}}"#);
            let e = parsed(&body).unwrap_err();
            assert!(e.0.starts_with(named), "{second}: {}", e.0);
            assert!(
                !e.0.contains("sk_live_abcdefghijklmnop"),
                "no key in an error: {}",
                e.0
            );
        }
        assert!(parsed(r#"{"keys":[]}"#).unwrap_err().0.starts_with("keys:"));
        let many = format!(r#"{{"keys":[{}]}}"#, vec![ok; MAX_KEYS + 1].join(","));
        assert!(parsed(&many).unwrap_err().0.contains("1 to 1000"));
    }
}
