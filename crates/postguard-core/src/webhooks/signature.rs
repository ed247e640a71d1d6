//! Signing deliveries the Standard Webhooks way (<https://www.standardwebhooks.com/>).
//!
//! We follow the published scheme byte for byte so that receivers can verify
//! with the off-the-shelf Standard Webhooks libraries instead of our code:
//!
//! - a secret is `whsec_` + standard base64 of the key bytes (24 random bytes
//!   here, drawn by the caller);
//! - the signed content is `"{webhook-id}.{webhook-timestamp}.{body}"`;
//! - `webhook-signature` is `v1,<base64 HMAC-SHA256>`, several entries
//!   separated by spaces, one per active secret, so that a secret can be
//!   rotated with an overlap (docs/webhooks.md: the old one keeps signing for 24 h).
//!
//! Verification (used by our tests and by anyone embedding this crate)
//! accepts a header when any `v1` entry matches, compared in constant time,
//! and the timestamp is within the tolerance of `now_s`; both are parameters,
//! since this crate never reads a clock.

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::{alphabet, Engine};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

pub const SECRET_PREFIX: &str = "whsec_";

/// Standard base64 that reads padded and unpadded input alike (secrets and
/// signatures made elsewhere are not always padded the same way).
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Why a delivery cannot be signed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("secret: not valid base64 ({0})")]
    NotBase64(String),
    #[error("secret: the key is empty")]
    EmptyKey,
    #[error("secret: unusable HMAC key ({0})")]
    UnusableKey(String),
    #[error("secret: no active secret to sign with")]
    NoSecret,
}

/// A new subscription secret from 24 caller-supplied random bytes.
pub fn new_secret(random: &[u8; 24]) -> String {
    format!("{SECRET_PREFIX}{}", STANDARD.encode(random))
}

/// Whether `s` may be given as a subscription's secret (one moved from
/// another system): `whsec_` + the standard base64 of 24 to 64 bytes.
pub fn is_importable_secret(s: &str) -> bool {
    s.strip_prefix(SECRET_PREFIX)
        .and_then(|b64| STANDARD.decode(b64).ok())
        .is_some_and(|key| (24..=64).contains(&key.len()))
}

/// The HMAC key of a secret: the optional `whsec_` prefix removed, the rest
/// base64-decoded.
pub fn secret_key(secret: &str) -> Result<Vec<u8>, SignatureError> {
    let b64 = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret);
    let key = LENIENT
        .decode(b64)
        .map_err(|e| SignatureError::NotBase64(e.to_string()))?;
    if key.is_empty() {
        return Err(SignatureError::EmptyKey);
    }
    Ok(key)
}

fn mac(key: &[u8], msg_id: &str, timestamp: u64, body: &[u8]) -> Result<Vec<u8>, SignatureError> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key)
        .map_err(|e| SignatureError::UnusableKey(e.to_string()))?;
    mac.update(msg_id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    Ok(mac.finalize().into_bytes().to_vec())
}

/// One signature entry: `v1,<base64 HMAC-SHA256(key, "{id}.{ts}.{body}")>`.
pub fn sign(
    secret: &str,
    msg_id: &str,
    timestamp: u64,
    body: &[u8],
) -> Result<String, SignatureError> {
    let key = secret_key(secret)?;
    Ok(format!(
        "v1,{}",
        STANDARD.encode(mac(&key, msg_id, timestamp, body)?)
    ))
}

/// The `webhook-signature` header value: one `v1` entry per secret, in the
/// given order, separated by single spaces. At least one secret is required.
pub fn signature_header(
    secrets: &[&str],
    msg_id: &str,
    timestamp: u64,
    body: &[u8],
) -> Result<String, SignatureError> {
    if secrets.is_empty() {
        return Err(SignatureError::NoSecret);
    }
    let entries = secrets
        .iter()
        .map(|s| sign(s, msg_id, timestamp, body))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(entries.join(" "))
}

/// Whether `header` (a `webhook-signature` value) carries a valid `v1`
/// signature of this message under `secret`, and `timestamp` is within
/// `tolerance_s` seconds of `now_s` (either side).
pub fn verify(
    secret: &str,
    msg_id: &str,
    timestamp: u64,
    body: &[u8],
    header: &str,
    now_s: u64,
    tolerance_s: u64,
) -> bool {
    if now_s.abs_diff(timestamp) > tolerance_s {
        return false;
    }
    let Ok(key) = secret_key(secret) else {
        return false;
    };
    let Ok(expected) = mac(&key, msg_id, timestamp, body) else {
        return false;
    };
    let mut found = subtle::Choice::from(0u8);
    for entry in header.split_ascii_whitespace() {
        let Some(sig) = entry.strip_prefix("v1,") else {
            continue;
        };
        let Ok(given) = LENIENT.decode(sig) else {
            continue;
        };
        // `ct_eq` on slices of different lengths is false, without a timing
        // difference in the contents.
        found |= given.as_slice().ct_eq(expected.as_slice());
    }
    found.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // The example from the Standard Webhooks specification.
    const SPEC_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const SPEC_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const SPEC_TS: u64 = 1_614_265_330;
    const SPEC_BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SPEC_SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    #[test]
    fn known_answer_from_the_specification() {
        assert_eq!(
            sign(SPEC_SECRET, SPEC_ID, SPEC_TS, SPEC_BODY).unwrap(),
            SPEC_SIG
        );
        // The prefix is optional.
        assert_eq!(
            sign(
                &SPEC_SECRET[SECRET_PREFIX.len()..],
                SPEC_ID,
                SPEC_TS,
                SPEC_BODY
            )
            .unwrap(),
            SPEC_SIG
        );
        assert!(verify(
            SPEC_SECRET,
            SPEC_ID,
            SPEC_TS,
            SPEC_BODY,
            SPEC_SIG,
            SPEC_TS,
            300
        ));
    }

    #[test]
    fn secrets() {
        let s = new_secret(&[0xab; 24]);
        assert!(s.starts_with("whsec_"));
        assert_eq!(s.len(), 6 + 32);
        assert_eq!(secret_key(&s).unwrap(), vec![0xab; 24]);
        assert_ne!(s, new_secret(&[0xac; 24]));
        assert!(secret_key("whsec_").is_err());
        assert!(secret_key("whsec_not base64!")
            .unwrap_err()
            .to_string()
            .starts_with("secret: "));
        // Padded or not, the same key.
        assert_eq!(secret_key("whsec_YWJj").unwrap(), b"abc");
        assert_eq!(secret_key("whsec_YWI=").unwrap(), b"ab");
        assert_eq!(secret_key("whsec_YWI").unwrap(), b"ab");
    }

    #[test]
    fn header_with_two_secrets_verifies_with_either() {
        let old = new_secret(&[1; 24]);
        let new = new_secret(&[2; 24]);
        let body = br#"{"id":"evt_1"}"#;
        let h = signature_header(&[&new, &old], "evt_1", 1_700_000_000, body).unwrap();
        let parts: Vec<&str> = h.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], sign(&new, "evt_1", 1_700_000_000, body).unwrap());
        assert_eq!(parts[1], sign(&old, "evt_1", 1_700_000_000, body).unwrap());
        for s in [&old, &new] {
            assert!(verify(
                s,
                "evt_1",
                1_700_000_000,
                body,
                &h,
                1_700_000_010,
                300
            ));
        }
        let other = new_secret(&[3; 24]);
        assert!(!verify(
            &other,
            "evt_1",
            1_700_000_000,
            body,
            &h,
            1_700_000_000,
            300
        ));
        assert!(signature_header(&[], "evt_1", 1, body).is_err());
        assert!(signature_header(&[&new, "whsec_!!"], "evt_1", 1, body).is_err());
    }

    #[test]
    fn verify_refuses_tampering_and_stale_timestamps() {
        let s = new_secret(&[9; 24]);
        let (id, ts, body) = ("evt_2", 1_700_000_000u64, b"{\"a\":1}".as_slice());
        let h = signature_header(&[&s], id, ts, body).unwrap();
        assert!(verify(&s, id, ts, body, &h, ts, 300));
        assert!(
            !verify(&s, id, ts, b"{\"a\":2}", &h, ts, 300),
            "tampered body"
        );
        assert!(!verify(&s, "evt_3", ts, body, &h, ts, 300), "other id");
        assert!(
            !verify(&s, id, ts + 1, body, &h, ts + 1, 300),
            "other timestamp"
        );
        assert!(
            verify(&s, id, ts, body, &h, ts + 300, 300),
            "edge of tolerance"
        );
        assert!(!verify(&s, id, ts, body, &h, ts + 301, 300), "too old");
        assert!(
            !verify(&s, id, ts, body, &h, ts - 301, 300),
            "too far ahead"
        );
        assert!(!verify(&s, id, ts, body, "", ts, 300));
        assert!(!verify(&s, id, ts, body, "v2,abc", ts, 300));
        assert!(!verify(
            &s,
            id,
            ts,
            body,
            &h.replace("v1,", "v1a,"),
            ts,
            300
        ));
        assert!(!verify("whsec_***", id, ts, body, &h, ts, 300));
        // Unknown or malformed entries next to a good one do not matter.
        let noisy = format!("v1a,xyz v1,!!! {h} v1,");
        assert!(verify(&s, id, ts, body, &noisy, ts, 300));
        // A truncated signature does not match.
        assert!(!verify(&s, id, ts, body, &h[..h.len() - 4], ts, 300));
    }

    proptest! {
        #[test]
        fn sign_then_verify(
            key in any::<[u8; 24]>(),
            id in "[a-zA-Z0-9_]{1,40}",
            ts in 0u64..4_000_000_000,
            body in proptest::collection::vec(any::<u8>(), 0..300),
            flip in any::<usize>(),
        ) {
            let s = new_secret(&key);
            let h = signature_header(&[&s], &id, ts, &body).unwrap();
            prop_assert!(verify(&s, &id, ts, &body, &h, ts, 0));
            if !body.is_empty() {
                let mut tampered = body.clone();
                let i = flip % tampered.len();
                tampered[i] ^= 1;
                prop_assert!(!verify(&s, &id, ts, &tampered, &h, ts, 0));
            }
        }

        #[test]
        fn verify_never_panics(header in "\\PC{0,200}", secret in "\\PC{0,60}") {
            let _ = verify(&secret, "id", 1, b"x", &header, 1, 5);
        }
    }
}
