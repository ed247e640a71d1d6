//! Portal links and portal sessions: signed, expiring, single-project
//! credentials for the dashboard (docs/dashboard-and-portal.md, ADR 0010).
//!
//! A *link token* (`pgl_…`) is what the operator hands an integrator, inside
//! the URL fragment of a dashboard link. The page exchanges it once for a
//! *session* (`pgs_…`) that it keeps in `sessionStorage`. Both are
//! `prefix + base64url(claims JSON) + "." + base64url(HMAC-SHA256)`, where the
//! MAC covers the prefix too, so a link can never pass for a session or the
//! other way round. The signing key is derived from `ADMIN_TOKEN`: rotating
//! the operator token invalidates every link and session at once.
//!
//! A session expires when its link would have: the operator's `ttl_s` bounds
//! all access the link grants. Everything here is pure; `now` is an input.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::ids::is_valid_name;
use crate::Invalid;

type HmacSha256 = Hmac<Sha256>;

pub const DEFAULT_TTL_S: u64 = 3_600;
pub const MIN_TTL_S: u64 = 5;
pub const MAX_TTL_S: u64 = 86_400;
/// Longer strings are refused before any decoding.
pub const MAX_TOKEN_LEN: usize = 512;
/// KV refuses expirations sooner than this.
pub const KV_MIN_TTL_S: u64 = 60;
/// Where the dashboard lives; the link points at it.
pub const DASHBOARD_PATH: &str = "/_postguard/dashboard/";

/// Which credential a token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Link,
    Session,
}

impl Kind {
    pub fn prefix(self) -> &'static str {
        match self {
            Kind::Link => "pgl_",
            Kind::Session => "pgs_",
        }
    }
}

/// What a token grants: one project until `exp` (epoch ms). `nonce` makes
/// every token distinct, so single use can be tracked by the token's hash.
/// `iat` (when it was issued) lets the operator end every link and session
/// of a project issued before a moment; a session's `plan` is the budget it
/// is charged from, chosen when its link was exchanged (docs/limits.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claims {
    pub project: String,
    pub exp: u64,
    pub nonce: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
}

impl Claims {
    /// A session's id (`ses_` + its nonce): what the operator ends it by.
    /// Not a secret: the signed token is.
    pub fn session_id(&self) -> String {
        format!("ses_{}", self.nonce)
    }
}

/// The owner recorded for a webhook subscription created through a portal
/// session: the project itself (a session has no key of its own), so that
/// ending the project's sessions — or revoking its last live key — can
/// pause what its sessions subscribed (docs/dashboard-and-portal.md).
pub fn subscription_owner(project: &str) -> String {
    format!("project:{project}")
}

/// Whether `id` has the shape of a session id (checked before any lookup).
pub fn is_session_id(id: &str) -> bool {
    id.strip_prefix("ses_").is_some_and(|n| {
        (1..=64).contains(&n.len())
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

/// Why a token was refused. Details never repeat the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("the token is malformed")]
    Malformed,
    #[error("the token's signature is not valid")]
    BadSignature,
    #[error("the token has expired")]
    Expired,
}

/// Signs and verifies portal tokens with a key derived from `ADMIN_TOKEN`.
pub struct Signer {
    /// The HMAC key, zero-padded to SHA-256's block size (which is what HMAC
    /// does with a shorter key anyway) so that keying cannot fail.
    key: [u8; 64],
}

/// HMAC-SHA256 keyed with a block-sized key: infallible.
pub(crate) fn hmac_with(key: &[u8; 64]) -> Hmac<Sha256> {
    <HmacSha256 as KeyInit>::new(key.into())
}

/// A key of at most 64 bytes, zero-padded to SHA-256's block size (HMAC
/// pads a shorter key the same way), so keying cannot fail.
pub(crate) fn padded(bytes: &[u8]) -> [u8; 64] {
    let mut key = [0u8; 64];
    let n = bytes.len().min(64);
    key[..n].copy_from_slice(&bytes[..n]);
    key
}

impl Signer {
    /// HKDF-Extract(salt = "postguard portal v1", IKM = ADMIN_TOKEN): a key
    /// of its own, so no MAC here equals anything else computed from the
    /// operator token.
    pub fn from_admin_token(admin_token: &str) -> Signer {
        let mut m = hmac_with(&padded(b"postguard portal v1"));
        m.update(admin_token.as_bytes());
        Signer {
            key: padded(&m.finalize().into_bytes()),
        }
    }

    pub fn issue(&self, kind: Kind, claims: &Claims) -> String {
        // Serialising a struct of strings and integers cannot fail.
        let json = serde_json::to_vec(claims).unwrap_or_default();
        let body = URL_SAFE_NO_PAD.encode(json);
        let tag = URL_SAFE_NO_PAD.encode(self.mac_for(kind, &body).finalize().into_bytes());
        format!("{}{body}.{tag}", kind.prefix())
    }

    /// Checks shape, signature (constant time) and expiry, in that order.
    pub fn verify(&self, kind: Kind, token: &str, now_ms: u64) -> Result<Claims, Rejected> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(Rejected::Malformed);
        }
        let rest = token
            .strip_prefix(kind.prefix())
            .ok_or(Rejected::Malformed)?;
        let (body, tag) = rest.split_once('.').ok_or(Rejected::Malformed)?;
        let tag = URL_SAFE_NO_PAD
            .decode(tag)
            .map_err(|_| Rejected::Malformed)?;
        self.mac_for(kind, body)
            .verify_slice(&tag)
            .map_err(|_| Rejected::BadSignature)?;
        let json = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| Rejected::Malformed)?;
        let claims: Claims = serde_json::from_slice(&json).map_err(|_| Rejected::Malformed)?;
        if now_ms >= claims.exp {
            return Err(Rejected::Expired);
        }
        Ok(claims)
    }

    fn mac_for(&self, kind: Kind, body: &str) -> HmacSha256 {
        let mut m = hmac_with(&self.key);
        m.update(kind.prefix().as_bytes());
        m.update(body.as_bytes());
        m
    }
}

/// `POST /_postguard/v1/portal-links` body.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkRequest {
    pub project: String,
    #[serde(default)]
    pub ttl_s: Option<u64>,
}

/// Parses and validates a link request; returns the project and the TTL.
pub fn parse_link_request(body: &[u8]) -> Result<(String, u64), Invalid> {
    let req: LinkRequest = Invalid::json_object(body, "{project, ttl_s?}")?;
    if !is_valid_name(&req.project) {
        return Err("project: must be 1-64 characters of [A-Za-z0-9._-]".into());
    }
    let ttl = req.ttl_s.unwrap_or(DEFAULT_TTL_S);
    if !(MIN_TTL_S..=MAX_TTL_S).contains(&ttl) {
        return Err(Invalid::field(
            "ttl_s",
            &format!("must be an integer from {MIN_TTL_S} to {MAX_TTL_S} seconds"),
        ));
    }
    Ok((req.project, ttl))
}

/// `POST /_postguard/v1/portal-sessions` body.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionRequest {
    token: String,
}

/// The link token of an exchange request.
pub fn parse_session_request(body: &[u8]) -> Result<String, Invalid> {
    let req: SessionRequest = Invalid::json_object(body, "{token}")?;
    Ok(req.token)
}

/// The claims of a new link: `project` until `now + ttl`.
pub fn link_claims(project: String, ttl_s: u64, now_ms: u64, nonce: &[u8]) -> Claims {
    Claims {
        project,
        exp: now_ms.saturating_add(ttl_s.saturating_mul(1000)),
        nonce: URL_SAFE_NO_PAD.encode(nonce),
        iat: Some(now_ms),
        plan: None,
    }
}

/// A session for a verified link: same project, same expiry, its own nonce,
/// charged from `terms.plan`'s budget, ending with the link or with the
/// project's last live key, whichever is first.
pub fn session_claims(link: &Claims, nonce: &[u8], terms: &SessionTerms, now_ms: u64) -> Claims {
    Claims {
        project: link.project.clone(),
        exp: terms.until.map_or(link.exp, |until| link.exp.min(until)),
        nonce: URL_SAFE_NO_PAD.encode(nonce),
        iat: Some(now_ms),
        plan: Some(terms.plan.clone()),
    }
}

/// What a new session of a project gets: the plan of the project's newest
/// live API key (its budget), and when the last live key ends (`None`: one
/// never does) — a session has the rights of a key, and no longer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionTerms {
    pub plan: String,
    pub until: Option<u64>,
}

/// A project's key as its listing shows it, for [`session_terms`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListedKey<'a> {
    pub created_at: u64,
    pub plan: &'a str,
    pub revoked: bool,
    pub expires_at: Option<u64>,
}

/// [`SessionTerms`] from the project's keys as listed; `None` when no key
/// is live at `now_ms` (revoked and expired ones give no rights).
pub fn session_terms<'a>(
    keys: impl IntoIterator<Item = ListedKey<'a>>,
    now_ms: u64,
) -> Option<SessionTerms> {
    let live: Vec<ListedKey> = keys
        .into_iter()
        .filter(|k| !k.revoked && k.expires_at.is_none_or(|at| at > now_ms))
        .collect();
    let newest = live.iter().max_by_key(|k| k.created_at)?;
    let until = match live.iter().any(|k| k.expires_at.is_none()) {
        true => None,
        false => live.iter().filter_map(|k| k.expires_at).max(),
    };
    Some(SessionTerms {
        plan: newest.plan.to_string(),
        until,
    })
}

/// The dashboard URL carrying a link token. The token is in the fragment,
/// which browsers never send to a server: it reaches no log and no audit row.
/// `gateway_origin` is the configured `public_url` (`""`: a relative URL).
pub fn link_url(gateway_origin: &str, token: &str) -> String {
    format!(
        "{}{DASHBOARD_PATH}#portal={token}",
        gateway_origin.trim_end_matches('/')
    )
}

/// KV name under which a consumed link is remembered (by hash, never the token).
pub fn consumed_entry(token: &str) -> String {
    format!("portal-used:{}", crate::ids::sha256_hex(token))
}

/// How long to remember a consumed link: until it would expire anyway (KV's
/// minimum TTL is 60 s; remembering longer is harmless).
pub fn consumed_ttl_s(exp_ms: u64, now_ms: u64) -> u64 {
    exp_ms
        .saturating_sub(now_ms)
        .div_ceil(1000)
        .max(KV_MIN_TTL_S)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000;

    fn signer() -> Signer {
        Signer::from_admin_token("test-admin-token")
    }

    fn claims() -> Claims {
        link_claims("acme".into(), 3_600, NOW, &[1, 2, 3])
    }

    #[test]
    fn issue_then_verify() {
        let s = signer();
        let t = s.issue(Kind::Link, &claims());
        assert!(t.starts_with("pgl_"));
        assert!(t.len() < MAX_TOKEN_LEN);
        assert_eq!(s.verify(Kind::Link, &t, NOW), Ok(claims()));
        assert_eq!(s.verify(Kind::Link, &t, NOW + 3_599_999), Ok(claims()));
    }

    #[test]
    fn expiry_is_exclusive() {
        let s = signer();
        let t = s.issue(Kind::Link, &claims());
        assert_eq!(
            s.verify(Kind::Link, &t, NOW + 3_600_000),
            Err(Rejected::Expired)
        );
        assert_eq!(s.verify(Kind::Link, &t, u64::MAX), Err(Rejected::Expired));
    }

    #[test]
    fn a_link_is_not_a_session_and_back() {
        let s = signer();
        let link = s.issue(Kind::Link, &claims());
        let session = s.issue(Kind::Session, &claims());
        assert_eq!(
            s.verify(Kind::Session, &link, NOW),
            Err(Rejected::Malformed)
        );
        // Same claims under the other prefix: the MAC covers the prefix.
        let relabelled = link.replacen("pgl_", "pgs_", 1);
        assert_eq!(
            s.verify(Kind::Session, &relabelled, NOW),
            Err(Rejected::BadSignature)
        );
        assert!(s.verify(Kind::Session, &session, NOW).is_ok());
    }

    #[test]
    fn another_admin_token_does_not_verify() {
        let t = signer().issue(Kind::Session, &claims());
        let other = Signer::from_admin_token("another-token");
        assert_eq!(
            other.verify(Kind::Session, &t, NOW),
            Err(Rejected::BadSignature)
        );
    }

    #[test]
    fn tampered_claims_fail_the_signature() {
        let s = signer();
        let t = s.issue(Kind::Link, &claims());
        let (_, tag) = t.split_once('.').unwrap_or_default();
        let forged = Claims {
            project: "other".into(),
            ..claims()
        };
        let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&forged).unwrap_or_default());
        let token = format!("pgl_{body}.{tag}");
        assert_eq!(
            s.verify(Kind::Link, &token, NOW),
            Err(Rejected::BadSignature)
        );
    }

    #[test]
    fn malformed_tokens() {
        let s = signer();
        for t in [
            "",
            "pgl_",
            "pgl_abc",
            "pgl_abc.!!!",
            "pgk_abc.def",
            "pgl_.",
            "pgl_a.b.c",
        ] {
            assert!(s.verify(Kind::Link, t, NOW).is_err(), "{t}");
        }
        let long = format!("pgl_{}", "a".repeat(MAX_TOKEN_LEN));
        assert_eq!(s.verify(Kind::Link, &long, NOW), Err(Rejected::Malformed));
        // A valid MAC over a body that is not claims JSON.
        let body = URL_SAFE_NO_PAD.encode(b"not json");
        let tag = URL_SAFE_NO_PAD.encode(s.mac_for(Kind::Link, &body).finalize().into_bytes());
        assert_eq!(
            s.verify(Kind::Link, &format!("pgl_{body}.{tag}"), NOW),
            Err(Rejected::Malformed)
        );
    }

    #[test]
    fn known_answer() {
        // Pins the wire format and the key derivation: a change here
        // invalidates every link and session in use.
        let s = signer();
        let c = Claims {
            project: "acme".into(),
            exp: 1_800_003_600_000,
            nonce: "AQID".into(),
            iat: None,
            plan: None,
        };
        // Computed independently (Node's crypto.createHmac, same derivation).
        assert_eq!(
            s.issue(Kind::Link, &c),
            "pgl_eyJwcm9qZWN0IjoiYWNtZSIsImV4cCI6MTgwMDAwMzYwMDAwMCwibm9uY2UiOiJBUUlEIn0\
             .LPnRJa-uX_7kRCfnlZqjFyw5lZDD8WDrmVNkW5WybKA"
        );
    }

    #[test]
    fn sessions_expire_with_their_link() {
        let link = claims();
        assert_eq!(link.iat, Some(NOW));
        let terms = SessionTerms {
            plan: "trial".into(),
            until: None,
        };
        let session = session_claims(&link, &[9; 16], &terms, NOW + 5);
        assert_eq!(session.project, link.project);
        assert_eq!(session.exp, link.exp);
        assert_ne!(session.nonce, link.nonce);
        assert_eq!(
            (session.iat, session.plan.as_deref()),
            (Some(NOW + 5), Some("trial"))
        );
        assert!(is_session_id(&session.session_id()));
        // A session survives a round trip through its token.
        let s = signer();
        let t = s.issue(Kind::Session, &session);
        assert_eq!(s.verify(Kind::Session, &t, NOW), Ok(session));
    }

    #[test]
    fn session_ids_and_plans() {
        for bad in [
            "",
            "ses_",
            "key_abc",
            "ses_a b",
            &format!("ses_{}", "a".repeat(65)),
        ] {
            assert!(!is_session_id(bad), "{bad}");
        }
        assert!(is_session_id("ses_AbC-_9"));
    }

    fn key(created_at: u64, plan: &str, revoked: bool, expires_at: Option<u64>) -> ListedKey<'_> {
        ListedKey {
            created_at,
            plan,
            revoked,
            expires_at,
        }
    }

    #[test]
    fn a_session_has_the_rights_of_a_live_key_and_ends_with_the_last_one() {
        let terms = |keys: &[ListedKey]| session_terms(keys.iter().copied(), NOW);
        let keys = [
            key(10, "trial", false, None),
            key(30, "business", true, None),
            key(20, "gold", false, None),
        ];
        assert_eq!(
            terms(&keys),
            Some(SessionTerms {
                plan: "gold".into(),
                until: None
            }),
            "the newest live key's plan"
        );
        assert_eq!(terms(&[key(1, "trial", true, None)]), None);
        // Issue 32 #10: an expired key gives no rights.
        assert_eq!(terms(&[key(1, "trial", false, Some(NOW))]), None);
        let ending = [
            key(1, "trial", false, Some(NOW + 500)),
            key(2, "gold", false, Some(NOW + 200)),
            key(3, "business", false, Some(NOW - 1)),
        ];
        let t = terms(&ending).unwrap();
        assert_eq!((t.plan.as_str(), t.until), ("gold", Some(NOW + 500)));
        let link = link_claims("p".into(), 3_600, NOW, &[1; 16]);
        assert_eq!(session_claims(&link, &[2; 16], &t, NOW).exp, NOW + 500);
        let never = terms(&keys).unwrap();
        assert_eq!(session_claims(&link, &[2; 16], &never, NOW).exp, link.exp);
    }

    #[test]
    fn link_requests() {
        assert_eq!(
            parse_link_request(br#"{"project":"acme"}"#),
            Ok(("acme".into(), DEFAULT_TTL_S))
        );
        assert_eq!(
            parse_link_request(br#"{"project":"acme","ttl_s":86400}"#),
            Ok(("acme".into(), 86_400))
        );
        for bad in [
            &br#"{"project":"acme","ttl_s":86401}"#[..],
            br#"{"project":"acme","ttl_s":4}"#,
            br#"{"project":"acme","ttl_s":-1}"#,
            br#"{"project":"acme","ttl_s":1.5}"#,
            br#"{"project":"acme","ttl_s":"60"}"#,
            br#"{"project":"a b"}"#,
            br#"{"project":""}"#,
            br#"{"ttl_s":60}"#,
            br#"{"project":"acme","extra":1}"#,
            br#"[]"#,
            b"",
        ] {
            assert!(
                parse_link_request(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(parse_session_request(br#"{"token":"pgl_x"}"#).is_ok());
        assert!(parse_session_request(br#"{"token":1}"#).is_err());
        assert!(parse_session_request(br#"{}"#).is_err());
    }

    #[test]
    fn urls_and_single_use_entries() {
        assert_eq!(
            link_url("https://gw.example/", "pgl_x.y"),
            "https://gw.example/_postguard/dashboard/#portal=pgl_x.y"
        );
        let e = consumed_entry("pgl_x.y");
        assert!(e.starts_with("portal-used:") && !e.contains("pgl_"));
        assert_eq!(consumed_ttl_s(NOW + 3_600_000, NOW), 3_600);
        assert_eq!(consumed_ttl_s(NOW + 1_001, NOW), KV_MIN_TTL_S);
        assert_eq!(consumed_ttl_s(NOW + 90_500, NOW), 91);
        assert_eq!(consumed_ttl_s(NOW, NOW + 5), KV_MIN_TTL_S);
    }
}
