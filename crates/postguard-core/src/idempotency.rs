//! Idempotency-Key: header syntax, request fingerprint, record states and the
//! decision for an incoming request.
//!
//! A key's record moves through these states (times are epoch ms):
//!
//! ```text
//!            claim                 complete(final status)
//!  (none) ─────────▶ InFlight ─────────────────────────▶ Completed
//!     ▲                 │  release(5xx, 408/409/425/429,     │
//!     │                 │  timeout, unreachable)             │
//!     └─────────────────┘◀── lease expires ──────────────────┘◀── TTL expires
//!     │
//!     │  claim with `Prefer: respond-async` (an operation, ADR 0037)
//!     └────────────────▶ Accepted ── the operation done ──▶ Accepted (done) ── TTL expires ──▶ (none)
//! ```
//!
//! See `docs/adr/0003-what-idempotency-stores.md`.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Whether a route requires, honours or ignores the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Required,
    Optional,
    Off,
}

/// Why a header value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the Idempotency-Key header is empty")]
    Empty,
    #[error("the Idempotency-Key is longer than 255 characters")]
    TooLong,
    #[error("the Idempotency-Key must contain only visible ASCII characters (no spaces, no control characters, one header line)")]
    BadCharacter,
    #[error("the Idempotency-Key is a malformed quoted string")]
    BadQuoting,
}

pub const MAX_KEY_LEN: usize = 255;

/// Parses an `Idempotency-Key` header value, bare (`abc`) or as an RFC 8941
/// sf-string (`"abc"`); both yield the same key. Surrounding optional
/// whitespace is removed by HTTP; anything else outside `0x21..=0x7e` is
/// refused, which also refuses two header lines folded into `a, b`.
pub fn parse_key(raw: &str) -> Result<String, KeyError> {
    let v = raw.trim_matches([' ', '\t']);
    if v.is_empty() {
        return Err(KeyError::Empty);
    }
    let key = if let Some(inner) = v.strip_prefix('"') {
        let inner = inner.strip_suffix('"').ok_or(KeyError::BadQuoting)?;
        let mut out = String::with_capacity(inner.len());
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some(e @ ('"' | '\\')) => out.push(e),
                    _ => return Err(KeyError::BadQuoting),
                },
                '"' => return Err(KeyError::BadQuoting),
                c => out.push(c),
            }
        }
        out
    } else {
        v.to_string()
    };
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if !key.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err(KeyError::BadCharacter);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong);
    }
    Ok(key)
}

/// SHA-256 over method, path with query, and body, length-prefixed so that no
/// two different requests share an encoding. Lower-case hex.
pub fn fingerprint(method: &str, path_and_query: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    for part in [method.as_bytes(), path_and_query.as_bytes(), body] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    format!("{:x}", h.finalize())
}

/// Whether an origin answer is final and so stored under the key: 2xx, 3xx
/// and 4xx except 408, 409, 425 and 429 (which invite a retry). 1xx and 5xx
/// are not.
pub fn is_storable_status(status: u16) -> bool {
    match status {
        200..=399 => true,
        408 | 409 | 425 | 429 => false,
        400..=499 => true,
        _ => false,
    }
}

/// A stored response, without its body (bodies travel separately).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// The original body was larger than `max_stored_body_bytes` and was not
    /// kept: a replay carries the status and headers with an empty body and
    /// `Idempotent-Body-Omitted: true`.
    pub body_omitted: bool,
    /// Length of the original body.
    pub body_len: u64,
    /// Where the body is kept when it does not fit the object
    /// (`body_omitted`): the R2 object key. `body_omitted` with no object =
    /// the body is not available (a retry gets `IDEMPOTENT_REPLAY_UNAVAILABLE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_object: Option<String>,
}

/// What is kept per Idempotency-Key. Stored as JSON tagged by `state`; it is
/// read through [`RecordWire`] (one flat struct) rather than serde's tagged
/// enum decoding, which buffers the object into `Content` first: the same
/// documents, less wasm and no buffering on the replay path (ADR 0022).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case", try_from = "RecordWire")]
pub enum Record {
    InFlight {
        fingerprint: String,
        /// The request that holds the claim; only it may complete or release.
        request_id: String,
        claimed_at_ms: u64,
        lease_until_ms: u64,
    },
    Completed {
        fingerprint: String,
        request_id: String,
        completed_at_ms: u64,
        expires_at_ms: u64,
        response: StoredResponse,
    },
    /// The key's request runs as an asynchronous operation (ADR 0037): every
    /// request with it is told the same operation, until the TTL after the
    /// operation is done (`expires_at_ms` is `operations::NEVER` until then).
    Accepted {
        fingerprint: String,
        /// The 202's request: the operation's `request_id`.
        request_id: String,
        operation_id: String,
        claimed_at_ms: u64,
        expires_at_ms: u64,
        /// Set when the operation is done: when, and the status it kept.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        completed_at_ms: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<u16>,
    },
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum RecordState {
    InFlight,
    Completed,
    Accepted,
}

/// Every member either state has; which ones must be present depends on
/// `state`, as with the tagged enum (other members are ignored).
#[derive(Deserialize)]
struct RecordWire {
    state: RecordState,
    fingerprint: String,
    request_id: String,
    claimed_at_ms: Option<u64>,
    lease_until_ms: Option<u64>,
    completed_at_ms: Option<u64>,
    expires_at_ms: Option<u64>,
    response: Option<StoredResponse>,
    operation_id: Option<String>,
    status: Option<u16>,
}

impl TryFrom<RecordWire> for Record {
    type Error = &'static str;

    fn try_from(w: RecordWire) -> Result<Self, Self::Error> {
        let (fingerprint, request_id) = (w.fingerprint, w.request_id);
        Ok(match w.state {
            RecordState::InFlight => Record::InFlight {
                fingerprint,
                request_id,
                claimed_at_ms: w.claimed_at_ms.ok_or("missing field `claimed_at_ms`")?,
                lease_until_ms: w.lease_until_ms.ok_or("missing field `lease_until_ms`")?,
            },
            RecordState::Completed => Record::Completed {
                fingerprint,
                request_id,
                completed_at_ms: w.completed_at_ms.ok_or("missing field `completed_at_ms`")?,
                expires_at_ms: w.expires_at_ms.ok_or("missing field `expires_at_ms`")?,
                response: w.response.ok_or("missing field `response`")?,
            },
            RecordState::Accepted => Record::Accepted {
                fingerprint,
                request_id,
                operation_id: w.operation_id.ok_or("missing field `operation_id`")?,
                claimed_at_ms: w.claimed_at_ms.ok_or("missing field `claimed_at_ms`")?,
                expires_at_ms: w.expires_at_ms.ok_or("missing field `expires_at_ms`")?,
                completed_at_ms: w.completed_at_ms,
                status: w.status,
            },
        })
    }
}

impl Record {
    pub fn fingerprint(&self) -> &str {
        match self {
            Record::InFlight { fingerprint, .. }
            | Record::Completed { fingerprint, .. }
            | Record::Accepted { fingerprint, .. } => fingerprint,
        }
    }

    /// When the record stops mattering and can be deleted.
    pub fn expires_at_ms(&self) -> u64 {
        match self {
            Record::InFlight { lease_until_ms, .. } => *lease_until_ms,
            Record::Completed { expires_at_ms, .. } | Record::Accepted { expires_at_ms, .. } => {
                *expires_at_ms
            }
        }
    }

    pub fn is_live(&self, now_ms: u64) -> bool {
        now_ms < self.expires_at_ms()
    }
}

/// The decision for a request carrying a key. It travels in the admission
/// frame externally tagged (`"execute"`, `{"in_progress":{"retry_after_s":3}}`),
/// which serde reads without buffering; its reader also takes the layout of
/// builds before ADR 0029 (`{"kind":"execute"}`), which an object of the
/// previous deploy still answers ([`crate::guard::AnswerLayout`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Claim taken: forward to the origin.
    Execute,
    /// Another request holds the claim.
    InProgress { retry_after_s: u64 },
    /// The key was used with a different request.
    Conflict,
    /// Answer with the stored response.
    Replay,
    /// The key's request is an asynchronous operation: answer its 202
    /// again (layout 4, ADR 0037; an older reader is told `in_progress`).
    Accepted,
}

/// The members a `Decision` object may have, in either layout: `kind` and
/// `retry_after_s` (layout 1), `in_progress` (layout 2). Any other member
/// is ignored, as serde's derived readers do.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum DecisionMember {
    Kind,
    RetryAfterS,
    InProgress,
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum DecisionKind {
    Execute,
    InProgress,
    Conflict,
    Replay,
}

#[derive(Deserialize)]
struct InProgressBody {
    retry_after_s: u64,
}

struct DecisionVisitor;

impl<'de> serde::de::Visitor<'de> for DecisionVisitor {
    type Value = Decision;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an idempotency decision (\"execute\", {\"in_progress\":{…}} or {\"kind\":…})")
    }

    /// Layout 2's unit variants.
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Decision, E> {
        match v {
            "execute" => Ok(Decision::Execute),
            "conflict" => Ok(Decision::Conflict),
            "replay" => Ok(Decision::Replay),
            "accepted" => Ok(Decision::Accepted),
            other => Err(E::unknown_variant(
                other,
                &["execute", "conflict", "replay", "accepted"],
            )),
        }
    }

    /// Layout 2's `{"in_progress":{…}}`, or layout 1's flat object, read
    /// member by member in any order (no buffering either way).
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Decision, A::Error> {
        use serde::de::{Error, IgnoredAny};
        let (mut kind, mut retry_after_s) = (None, None);
        while let Some(member) = map.next_key::<DecisionMember>()? {
            match member {
                DecisionMember::InProgress if kind.is_none() => {
                    let body: InProgressBody = map.next_value()?;
                    return Ok(Decision::InProgress {
                        retry_after_s: body.retry_after_s,
                    });
                }
                DecisionMember::Kind => kind = Some(map.next_value::<DecisionKind>()?),
                DecisionMember::RetryAfterS => retry_after_s = Some(map.next_value::<u64>()?),
                DecisionMember::InProgress | DecisionMember::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(match kind.ok_or_else(|| A::Error::missing_field("kind"))? {
            DecisionKind::Execute => Decision::Execute,
            DecisionKind::Conflict => Decision::Conflict,
            DecisionKind::Replay => Decision::Replay,
            DecisionKind::InProgress => Decision::InProgress {
                retry_after_s: retry_after_s
                    .ok_or_else(|| A::Error::missing_field("retry_after_s"))?,
            },
        })
    }
}

impl<'de> Deserialize<'de> for Decision {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Decision, D::Error> {
        d.deserialize_any(DecisionVisitor)
    }
}

/// Decides what to do with a request whose fingerprint is `fp`, given the
/// key's current record (if any). Expired records count as absent.
pub fn decide(record: Option<&Record>, fp: &str, now_ms: u64) -> Decision {
    let Some(rec) = record.filter(|r| r.is_live(now_ms)) else {
        return Decision::Execute;
    };
    if rec.fingerprint() != fp {
        return Decision::Conflict;
    }
    match rec {
        Record::Completed { .. } => Decision::Replay,
        Record::Accepted { .. } => Decision::Accepted,
        Record::InFlight {
            claimed_at_ms,
            lease_until_ms,
            ..
        } => Decision::InProgress {
            retry_after_s: in_progress_retry_after(*claimed_at_ms, *lease_until_ms, now_ms),
        },
    }
}

/// `Retry-After` for a 409: as long as the request has already been running
/// (a slow request is likely to stay slow), at least 1 s, and never past the
/// lease, after which the key is free anyway.
pub fn in_progress_retry_after(claimed_at_ms: u64, lease_until_ms: u64, now_ms: u64) -> u64 {
    let elapsed = now_ms.saturating_sub(claimed_at_ms).div_ceil(1000);
    let lease_left = lease_until_ms.saturating_sub(now_ms).div_ceil(1000);
    elapsed.clamp(1, lease_left.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bare_and_quoted_forms_are_the_same_key() {
        assert_eq!(parse_key("7d3a-01"), Ok("7d3a-01".into()));
        assert_eq!(parse_key("\"7d3a-01\""), Ok("7d3a-01".into()));
        assert_eq!(parse_key("\"a\\\"b\""), Ok("a\"b".into()));
        assert_eq!(parse_key("  abc\t"), Ok("abc".into()));
    }

    #[test]
    fn refuses_bad_values() {
        assert_eq!(parse_key(""), Err(KeyError::Empty));
        assert_eq!(parse_key("   "), Err(KeyError::Empty));
        assert_eq!(parse_key("\"\""), Err(KeyError::Empty));
        assert_eq!(parse_key("a b"), Err(KeyError::BadCharacter));
        assert_eq!(parse_key("a, b"), Err(KeyError::BadCharacter));
        assert_eq!(parse_key("\"a b\""), Err(KeyError::BadCharacter));
        assert_eq!(parse_key("a\tb"), Err(KeyError::BadCharacter));
        assert_eq!(parse_key("a\u{7f}"), Err(KeyError::BadCharacter));
        assert_eq!(parse_key("a\u{0}"), Err(KeyError::BadCharacter));
        assert_eq!(parse_key("clé"), Err(KeyError::BadCharacter));
        assert_eq!(parse_key("\"abc"), Err(KeyError::BadQuoting));
        assert_eq!(parse_key("\"a\\nb\""), Err(KeyError::BadQuoting));
        assert_eq!(parse_key("\"a\"b\""), Err(KeyError::BadQuoting));
        assert_eq!(parse_key(&"k".repeat(255)).map(|k| k.len()), Ok(255));
        assert_eq!(parse_key(&"k".repeat(256)), Err(KeyError::TooLong));
        assert_eq!(
            parse_key(&format!("\"{}\"", "k".repeat(255))).map(|k| k.len()),
            Ok(255)
        );
        assert_eq!(
            parse_key(&format!("\"{}\"", "k".repeat(256))),
            Err(KeyError::TooLong)
        );
    }

    #[test]
    fn fingerprint_separates_fields() {
        let a = fingerprint("POST", "/a", b"bc");
        assert_eq!(a.len(), 64);
        assert_ne!(a, fingerprint("POST", "/ab", b"c"));
        assert_ne!(a, fingerprint("PUT", "/a", b"bc"));
        assert_ne!(a, fingerprint("POST", "/a?x=1", b"bc"));
        assert_eq!(a, fingerprint("POST", "/a", b"bc"));
    }

    #[test]
    fn storable_statuses() {
        for s in [
            200, 201, 204, 299, 301, 303, 400, 401, 402, 403, 404, 410, 422, 499,
        ] {
            assert!(is_storable_status(s), "{s}");
        }
        for s in [100, 408, 409, 425, 429, 500, 502, 503, 504, 599] {
            assert!(!is_storable_status(s), "{s}");
        }
    }

    fn completed(fp: &str, expires: u64) -> Record {
        Record::Completed {
            fingerprint: fp.into(),
            request_id: "req_a".into(),
            completed_at_ms: 0,
            expires_at_ms: expires,
            response: StoredResponse {
                status: 201,
                headers: vec![],
                body_omitted: false,
                body_object: None,
                body_len: 0,
            },
        }
    }

    fn inflight(fp: &str, claimed: u64, lease: u64) -> Record {
        Record::InFlight {
            fingerprint: fp.into(),
            request_id: "req_a".into(),
            claimed_at_ms: claimed,
            lease_until_ms: lease,
        }
    }

    fn accepted(fp: &str, expires: u64) -> Record {
        Record::Accepted {
            fingerprint: fp.into(),
            request_id: "req_a".into(),
            operation_id: "op_1".into(),
            claimed_at_ms: 0,
            expires_at_ms: expires,
            completed_at_ms: None,
            status: None,
        }
    }

    #[test]
    fn an_operation_is_accepted_again_until_its_record_expires() {
        assert_eq!(
            decide(Some(&accepted("f", crate::operations::NEVER)), "f", 50),
            Decision::Accepted
        );
        assert_eq!(
            decide(Some(&accepted("f", crate::operations::NEVER)), "g", 50),
            Decision::Conflict
        );
        assert_eq!(
            decide(Some(&accepted("f", 100)), "f", 100),
            Decision::Execute
        );
        let text = serde_json::to_string(&Decision::Accepted).unwrap();
        assert_eq!(text, r#""accepted""#);
        assert_eq!(
            serde_json::from_str::<Decision>(&text).unwrap(),
            Decision::Accepted
        );
    }

    #[test]
    fn records_read_back_as_written() {
        for rec in [
            inflight("fp", 10, 20),
            completed("fp", 99),
            accepted("fp", 7),
        ] {
            let text = serde_json::to_string(&rec).unwrap();
            assert_eq!(serde_json::from_str::<Record>(&text).unwrap(), rec);
        }
        let partial =
            r#"{"state":"in_flight","fingerprint":"f","request_id":"r","claimed_at_ms":1}"#;
        let err = serde_json::from_str::<Record>(partial).unwrap_err();
        assert!(err.to_string().contains("lease_until_ms"), "{err}");
        let unknown = r#"{"state":"gone","fingerprint":"f","request_id":"r"}"#;
        assert!(serde_json::from_str::<Record>(unknown).is_err());
    }

    #[test]
    fn decisions() {
        assert_eq!(decide(None, "f", 0), Decision::Execute);
        assert_eq!(
            decide(Some(&completed("f", 100)), "f", 50),
            Decision::Replay
        );
        assert_eq!(
            decide(Some(&completed("f", 100)), "g", 50),
            Decision::Conflict
        );
        assert_eq!(
            decide(Some(&completed("f", 100)), "f", 100),
            Decision::Execute,
            "TTL over"
        );
        assert_eq!(
            decide(Some(&completed("f", 100)), "g", 100),
            Decision::Execute,
            "TTL over"
        );
        assert_eq!(
            decide(Some(&inflight("f", 0, 60_000)), "f", 2_500),
            Decision::InProgress { retry_after_s: 3 }
        );
        assert_eq!(
            decide(Some(&inflight("f", 0, 60_000)), "g", 2_500),
            Decision::Conflict
        );
        assert_eq!(
            decide(Some(&inflight("f", 0, 60_000)), "f", 60_000),
            Decision::Execute,
            "lease over"
        );
    }

    #[test]
    fn in_progress_retry_after_bounds() {
        assert_eq!(in_progress_retry_after(0, 60_000, 10), 1);
        assert_eq!(in_progress_retry_after(0, 60_000, 20_001), 21);
        assert_eq!(in_progress_retry_after(0, 60_000, 59_500), 1);
        assert_eq!(in_progress_retry_after(0, 10_000, 8_000), 2);
    }

    proptest! {
        #[test]
        fn parse_never_panics_and_accepts_only_visible_ascii(s in "\\PC{0,300}") {
            if let Ok(k) = parse_key(&s) {
                prop_assert!(!k.is_empty() && k.len() <= 255);
                prop_assert!(k.bytes().all(|b| (0x21..=0x7e).contains(&b)));
            }
        }

        #[test]
        fn quoting_round_trips(k in "[!#-\\[\\]-~]{1,255}") {
            // Any visible-ASCII key without `"` or `\` reads the same bare and quoted.
            prop_assert_eq!(parse_key(&k), Ok(k.clone()));
            prop_assert_eq!(parse_key(&format!("\"{k}\"")), Ok(k));
        }

        #[test]
        fn retry_after_within_lease(claimed in 0u64..100_000, lease in 1u64..100_000, now_off in 0u64..100_000) {
            let lease_until = claimed + lease;
            let now = claimed + now_off % lease;
            let r = in_progress_retry_after(claimed, lease_until, now);
            prop_assert!(r >= 1);
            prop_assert!(r <= lease_until.saturating_sub(now).div_ceil(1000).max(1));
        }
    }
}
