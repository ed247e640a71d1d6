//! The gateway's own API keeps the promise it sells (docs/limits.md): a
//! mutating `/_postguard/v1/*` operation honours an `Idempotency-Key` with
//! §4's rules, scoped to the caller's credential. The router claims the key
//! in the caller's object (`guard::admit`, the same claim as a proxied
//! request), runs the handler, and stores its answer (`proxy::settle`'s
//! rules: final statuses only). This module decides what of an answer is
//! kept, and how a kept body is sealed.
//!
//! Answers of the gateway's own API can carry secrets shown once — a new API
//! key, a subscription's signing secret, a portal link, a capture URL — and
//! a replay must show them again, or the client that lost the first answer
//! never learns them. So the body is stored sealed (AES-256-GCM, by the
//! shell's WebCrypto) under a key derived from `ADMIN_TOKEN`, the scope and
//! the Idempotency-Key: the object's storage alone never yields a key or a
//! secret (API keys are otherwise kept only as SHA-256).

use hmac::Mac;

use crate::portal::{hmac_with, padded};

/// Headers of an answer that belong to the request that got it, not to the
/// answer: a replay gets its own.
const PER_REQUEST: [&str; 4] = ["x-request-id", "retry-after", "vary", "content-length"];
const PER_REQUEST_PREFIXES: [&str; 3] = ["x-ratelimit-", "ratelimit", "access-control-"];

/// The headers of a gateway answer that are stored with it and replayed.
pub fn stored_headers(headers: &[(String, String)]) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(k, _)| {
            let n = k.to_ascii_lowercase();
            !PER_REQUEST.contains(&n.as_str())
                && !PER_REQUEST_PREFIXES.iter().any(|p| n.starts_with(p))
        })
        .cloned()
        .collect()
}

/// The layout version of a sealed body: `SEALED_V1 ‖ iv (12) ‖ ciphertext ‖ tag`.
pub const SEALED_V1: u8 = 1;
pub const IV_LEN: usize = 12;

/// The AES-256-GCM key that seals the answer stored under `idempotency_key`
/// in `scope` (the caller's object): HMAC-SHA256 keyed with a key of its own
/// derived from `ADMIN_TOKEN` (so nothing here equals another MAC of that
/// token), over the scope and the Idempotency-Key. Rotating `ADMIN_TOKEN`
/// makes stored answers unreadable: a retry then gets 410
/// `IDEMPOTENT_REPLAY_UNAVAILABLE`, never another execution.
pub fn seal_key(admin_token: &str, scope: &str, idempotency_key: &str) -> [u8; 32] {
    let mut root = hmac_with(&padded(b"postguard replay seal v1"));
    root.update(admin_token.as_bytes());
    let mut m = hmac_with(&padded(&root.finalize().into_bytes()));
    m.update(scope.as_bytes());
    m.update(&[0]);
    m.update(idempotency_key.as_bytes());
    m.finalize().into_bytes().into()
}

/// The IV and ciphertext of a sealed body, or `None` when it is not one.
pub fn sealed_parts(stored: &[u8]) -> Option<(&[u8], &[u8])> {
    match stored.split_first() {
        Some((&SEALED_V1, rest)) if rest.len() > IV_LEN => Some(rest.split_at(IV_LEN)),
        _ => None,
    }
}

/// A sealed body from its IV and ciphertext.
pub fn sealed(iv: &[u8; IV_LEN], ciphertext: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + IV_LEN + ciphertext.len());
    out.push(SEALED_V1);
    out.extend_from_slice(iv);
    out.extend_from_slice(ciphertext);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn per_request_headers_are_not_stored() {
        let kept = stored_headers(&pairs(&[
            ("Content-Type", "application/json"),
            ("X-Request-Id", "req_1"),
            ("X-RateLimit-Remaining", "3"),
            ("RateLimit-Policy", "\"default\";q=5;w=60"),
            ("RateLimit", "\"default\";r=3;t=9"),
            ("Access-Control-Allow-Origin", "*"),
            ("Vary", "Origin"),
            ("Cache-Control", "no-store"),
            ("X-Postguard-Subscriptions-Paused", "2"),
        ]));
        assert_eq!(
            kept,
            pairs(&[
                ("Content-Type", "application/json"),
                ("Cache-Control", "no-store"),
                ("X-Postguard-Subscriptions-Paused", "2"),
            ])
        );
    }

    #[test]
    fn each_scope_and_key_seals_with_its_own_key() {
        let a = seal_key("admin-token-a", "op:operator", "k1");
        assert_eq!(a, seal_key("admin-token-a", "op:operator", "k1"));
        assert_ne!(a, seal_key("admin-token-b", "op:operator", "k1"));
        assert_ne!(a, seal_key("admin-token-a", "key_1", "k1"));
        assert_ne!(a, seal_key("admin-token-a", "op:operator", "k2"));
        // The separator keeps (scope, key) pairs apart.
        assert_ne!(seal_key("t", "ab", "c"), seal_key("t", "a", "bc"));
    }

    #[test]
    fn sealed_bodies_round_trip_their_parts() {
        let iv = [7u8; IV_LEN];
        let s = sealed(&iv, b"cipher");
        assert_eq!(sealed_parts(&s), Some((&iv[..], &b"cipher"[..])));
        assert_eq!(sealed_parts(b""), None);
        assert_eq!(sealed_parts(&[SEALED_V1; IV_LEN]), None, "no ciphertext");
        assert_eq!(sealed_parts(&[2, 0, 0]), None, "another version");
    }
}
