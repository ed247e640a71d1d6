//! Identifiers and API-key material. Randomness and time are inputs.

use base64::Engine;
use sha2::{Digest, Sha256};
use ulid::Ulid;

/// Plan and project names: 1–64 of `[A-Za-z0-9._-]`. A project name is part
/// of shard names, object keys and audit rows, so every module that takes one
/// asks here.
pub fn is_valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// API keys look like `pgk_` + 43 base64url characters (32 random bytes).
pub const API_KEY_PREFIX: &str = "pgk_";
pub const API_KEY_LEN: usize = 4 + 43;
/// The public part of a key shown in logs and dashboards.
pub const KEY_PREFIX_LEN: usize = 12;

/// `prefix` + a ULID made of the time and 80 random bits: every identifier
/// postguard issues (`req_`, `key_`, `sub_`, `dlv_`, `evt_`).
pub fn prefixed(prefix: &str, now_ms: u64, random: u128) -> String {
    // Two copies into one allocation (no formatter: this runs per request).
    let mut buf = [0u8; ulid::ULID_LEN];
    let ulid = Ulid::from_parts(now_ms, random);
    let mut out = String::with_capacity(prefix.len() + ulid::ULID_LEN);
    out.push_str(prefix);
    out.push_str(ulid.array_to_str(&mut buf));
    out
}

/// `req_` + a ULID.
pub fn request_id(now_ms: u64, random: u128) -> String {
    prefixed("req_", now_ms, random)
}

/// `key_` + a ULID: the public identifier of an API key.
pub fn key_id(now_ms: u64, random: u128) -> String {
    prefixed("key_", now_ms, random)
}

/// The id of a key the API issued itself (imported, or verified once
/// against the origin): `key_` + a ULID-shaped value of the HMAC of its
/// hash under a deployment secret — the same key is always the same id (an
/// import can be re-run; concurrent first requests meet in one object),
/// while the id, which URLs and listings show, reveals nothing to test
/// guesses of a short key against.
pub fn imported_key_id(secret: &[u8], hash_hex: &str) -> String {
    use hmac::{Hmac, Mac};
    // HMAC takes a key of any length: `new_from_slice` cannot fail.
    let mac = Hmac::<Sha256>::new_from_slice(secret).map(|mut m| {
        m.update(b"postguard imported key id\0");
        m.update(hash_hex.as_bytes());
        m.finalize().into_bytes()
    });
    let mut top = [0u8; 16];
    if let Ok(digest) = mac {
        top.copy_from_slice(&digest[..16]);
    }
    format!("key_{}", Ulid::from(u128::from_be_bytes(top)))
}

/// A new API key from 32 random bytes.
pub fn new_api_key(random: &[u8; 32]) -> String {
    format!(
        "{API_KEY_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random)
    )
}

/// The public prefix of a key: its first 12 characters.
pub fn key_prefix(key: &str) -> String {
    key.chars().take(KEY_PREFIX_LEN).collect()
}

/// Whether a string has the shape of an API key (checked before any lookup).
pub fn is_well_formed_api_key(s: &str) -> bool {
    s.len() == API_KEY_LEN
        && s.starts_with(API_KEY_PREFIX)
        && s[API_KEY_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Shortest and longest API key of any format (a key the API issued
/// itself and imported, or one of postguard's own).
pub const MIN_KEY_LEN: usize = 16;
pub const MAX_KEY_LEN: usize = 256;

/// Whether a presented token could be an API key of any format: 16–256
/// visible ASCII characters. Only such a token is looked up.
pub fn is_presentable_key(s: &str) -> bool {
    (MIN_KEY_LEN..=MAX_KEY_LEN).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_graphic())
}

/// Lower-case hex SHA-256: how API keys are stored.
pub fn sha256_hex(s: &str) -> String {
    format!("{:x}", Sha256::digest(s.as_bytes()))
}

/// The Basic user name of an `Authorization` header value (the key, Stripe's
/// style: `base64(key:)`; the password is ignored), if it is one.
pub fn basic_user(header: &str) -> Option<String> {
    use base64::Engine;
    let (scheme, token) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(token.trim())
        .ok()?;
    let text = String::from_utf8(raw).ok()?;
    let user = text.split_once(':').map_or(text.as_str(), |(u, _)| u);
    (!user.is_empty()).then(|| user.to_string())
}

/// The bearer token of an `Authorization` header value, if it is one.
pub fn bearer(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim();
    (!token.is_empty()).then_some(token)
}

/// The longest event type.
pub const MAX_EVENT_TYPE_LEN: usize = 128;

/// An event type: 1-128 of `[A-Za-z0-9._:-]` (a published event's, a
/// subscription filter's, a response event rule's).
pub fn is_valid_type(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_EVENT_TYPE_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_req_ulid() {
        let id = request_id(1_716_392_400_000, 42);
        assert!(id.starts_with("req_"));
        assert_eq!(id.len(), 4 + 26);
        assert!(Ulid::from_string(&id[4..]).is_ok());
        assert!(request_id(1, 0) < request_id(2, 0), "sortable by time");
        let (t, r) = (1_716_392_400_000, 0xDEAD_BEEF_u128 << 40);
        assert_eq!(request_id(t, r), format!("req_{}", Ulid::from_parts(t, r)));
    }

    #[test]
    fn api_keys() {
        let k = new_api_key(&[7u8; 32]);
        assert_eq!(k.len(), API_KEY_LEN);
        assert!(is_well_formed_api_key(&k));
        assert_eq!(key_prefix(&k).len(), 12);
        assert!(k.starts_with(&key_prefix(&k)));
        assert!(!is_well_formed_api_key(&k[..46]));
        assert!(!is_well_formed_api_key(&format!("{}!", &k[..46])));
        assert!(!is_well_formed_api_key(&k.replacen("pgk_", "pgx_", 1)));
        assert!(!is_well_formed_api_key("é".repeat(24).as_str()));
        assert_ne!(sha256_hex(&k), sha256_hex(&new_api_key(&[8u8; 32])));
        assert_eq!(
            sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer   abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer"), None);
        assert_eq!(bearer("Bearer "), None);
        assert_eq!(bearer(""), None);
    }
}
