//! Events from responses (docs/async-operations.md): when the gateway stores a response
//! under an Idempotency-Key and an `events_from_responses` rule matches it,
//! the event that answer implies is published — once per (API key,
//! Idempotency-Key), whatever the client retries.
//!
//! "Once" rests on three things, none of them here: only the claim's holder
//! stores a response (the key's object, `store::complete`), the event is
//! written "to publish" in the same transaction as the response and published
//! from there by the object's alarm (an outbox), and its id is derived from
//! the key and the Idempotency-Key ([`event_id`]), so publishing it again —
//! after a crash, or after the TTL let the key run again — is a no-op.
//! This module decides which rule matches and what the event holds.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::pattern;

/// One `events_from_responses` rule: a stored response of `method path`
/// whose status matches `status` publishes an event of `type` (docs/async-operations.md).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseEventRule {
    pub method: String,
    pub path: String,
    /// A status (`"201"`) or a class (`"2xx"`).
    pub status: String,
    #[serde(rename = "type")]
    pub event_type: String,
    /// `"body"` (the response body) or a JSON Pointer into it (`"/order"`).
    pub data: String,
}

/// A rule's `status`: one status, or a class (`2xx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusMatch {
    Exact(u16),
    Class(u16),
}

impl StatusMatch {
    /// `"201"` (100–599) or `"2xx"` (1xx–5xx, `x` in either case).
    pub fn parse(s: &str) -> Option<StatusMatch> {
        let b = s.as_bytes();
        if b.len() != 3 || !(b'1'..=b'5').contains(&b[0]) {
            return None;
        }
        let class = u16::from(b[0] - b'0');
        if b[1..].iter().all(|c| c.eq_ignore_ascii_case(&b'x')) {
            return Some(StatusMatch::Class(class));
        }
        let n: u16 = s.parse().ok()?;
        Some(StatusMatch::Exact(n))
    }

    pub fn matches(self, status: u16) -> bool {
        match self {
            StatusMatch::Exact(n) => n == status,
            StatusMatch::Class(c) => status / 100 == c,
        }
    }
}

/// `"body"`, or a JSON Pointer: empty (the whole body) or `/`-separated
/// tokens whose `~` is only ever `~0` or `~1` (RFC 6901).
pub fn is_valid_data(data: &str) -> bool {
    if data == "body" || data.is_empty() {
        return true;
    }
    if !data.starts_with('/') || data.len() > 1024 {
        return false;
    }
    let b = data.as_bytes();
    b.iter()
        .enumerate()
        .all(|(i, c)| *c != b'~' || matches!(b.get(i + 1), Some(b'0' | b'1')))
}

/// The first rule for a stored response of `method path` with `status`.
pub fn rule_for<'r>(
    rules: &'r [ResponseEventRule],
    method: &str,
    path: &str,
    status: u16,
) -> Option<&'r ResponseEventRule> {
    rules.iter().find(|r| {
        (r.method == "*" || r.method == method)
            && pattern::matches(&r.path, path)
            && StatusMatch::parse(&r.status).is_some_and(|s| s.matches(status))
    })
}

/// Why a matching response publishes nothing (logged, never an error to the
/// client: the response itself was stored and answered).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Skipped {
    #[error("the response body is not JSON")]
    NotJson,
    #[error("the JSON Pointer {0} does not resolve in the response body")]
    Unresolved(String),
    #[error("the event data ({0}) is not a JSON object")]
    NotAnObject(&'static str),
    #[error("the response body was kept in R2, not read")]
    NotRead,
    #[error("the event data is {0} bytes of JSON, over the {MAX_DATA_BYTES} an event from a response carries")]
    TooLarge(usize),
}

/// The most JSON an event from a response carries as its `data` (1 MiB):
/// the event rides in the call that stores the response and waits in the
/// key's object (a row of at most 2 MB), so a larger one would fail the
/// store itself. Over it the response is stored and no event is published.
pub const MAX_DATA_BYTES: usize = 1 << 20;

/// The event's `data` from a response body: the body, or the value its
/// pointer names; it must be a JSON object, as a published event's is.
pub fn data_of(rule: &ResponseEventRule, body: &[u8]) -> Result<Value, Skipped> {
    let doc: Value = serde_json::from_slice(body).map_err(|_| Skipped::NotJson)?;
    let picked = match rule.data.as_str() {
        "body" | "" => doc,
        ptr => doc
            .pointer(ptr)
            .cloned()
            .ok_or_else(|| Skipped::Unresolved(ptr.chars().take(64).collect()))?,
    };
    match picked {
        Value::Object(_) => Ok(picked),
        Value::Array(_) => Err(Skipped::NotAnObject("an array")),
        Value::String(_) => Err(Skipped::NotAnObject("a string")),
        Value::Number(_) => Err(Skipped::NotAnObject("a number")),
        Value::Bool(_) => Err(Skipped::NotAnObject("a boolean")),
        Value::Null => Err(Skipped::NotAnObject("null")),
    }
}

/// The event id of the response stored under (`key_id`, `idempotency_key`):
/// `evt_` + 26 base32 characters of a SHA-256 over both. The same pair
/// always names the same event; the Idempotency-Key itself (the client's
/// data) cannot be read back from it.
pub fn event_id(key_id: &str, idempotency_key: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"postguard response event v1\0");
    h.update(key_id.as_bytes());
    h.update([0u8]);
    h.update(idempotency_key.as_bytes());
    let digest = h.finalize();
    let mut n = [0u8; 16];
    n.copy_from_slice(&digest[..16]);
    // A ULID's alphabet and length (128 bits), like every id the gateway issues.
    let ulid = ulid::Ulid(u128::from_be_bytes(n));
    format!("evt_{ulid}")
}

/// An event to publish, as the key's object keeps it until it is published.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingEvent {
    pub id: String,
    pub project: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub data: Value,
    /// The request whose response implied it (docs/webhooks.md: a publish's `request_id`).
    pub request_id: String,
}

/// What the pipeline knows of a request when its response is stored.
#[derive(Debug, Clone, Copy)]
pub struct Trace<'a> {
    pub method: &'a str,
    /// Without the query.
    pub path: &'a str,
    pub project: &'a str,
    pub key_id: &'a str,
    pub idempotency_key: &'a str,
    pub request_id: &'a str,
}

/// The event a stored response implies: `Ok(None)` when no rule matches,
/// `Err` when one matches but the body gives no event (logged by the caller).
/// `body` is `None` when the body was not read (kept in R2).
pub fn for_response(
    rules: &[ResponseEventRule],
    trace: &Trace,
    status: u16,
    body: Option<&[u8]>,
) -> Result<Option<PendingEvent>, Skipped> {
    let Some(rule) = rule_for(rules, trace.method, trace.path, status) else {
        return Ok(None);
    };
    let data = data_of(rule, body.ok_or(Skipped::NotRead)?)?;
    let len = serde_json::to_vec(&data).map_or(usize::MAX, |v| v.len());
    if len > MAX_DATA_BYTES {
        return Err(Skipped::TooLarge(len));
    }
    Ok(Some(PendingEvent {
        id: event_id(trace.key_id, trace.idempotency_key),
        project: trace.project.to_string(),
        event_type: rule.event_type.clone(),
        data,
        request_id: trace.request_id.to_string(),
    }))
}

/// When to try publishing again after `attempts` failed tries: 1 s, 2 s,
/// 4 s … at most 5 minutes apart.
pub fn retry_at(attempts: u32, now_ms: u64) -> u64 {
    let s = 1u64 << attempts.min(9);
    now_ms.saturating_add(s.min(300) * 1000)
}

/// How long a pending event is retried before it is dropped (logged as an
/// error): a day, as a publisher's own retries would be.
pub const GIVE_UP_AFTER_MS: u64 = 86_400_000;

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(method: &str, path: &str, status: &str, data: &str) -> ResponseEventRule {
        ResponseEventRule {
            method: method.into(),
            path: path.into(),
            status: status.into(),
            event_type: "order.created".into(),
            data: data.into(),
        }
    }

    const TRACE: Trace<'static> = Trace {
        method: "POST",
        path: "/orders",
        project: "acme",
        key_id: "key_01",
        idempotency_key: "k1",
        request_id: "req_1",
    };

    #[test]
    fn statuses_and_classes() {
        assert_eq!(StatusMatch::parse("2xx"), Some(StatusMatch::Class(2)));
        assert_eq!(StatusMatch::parse("4XX"), Some(StatusMatch::Class(4)));
        assert_eq!(StatusMatch::parse("201"), Some(StatusMatch::Exact(201)));
        for bad in [
            "", "2x", "6xx", "0xx", "2x1", "20", "2000", "abc", "600", "099",
        ] {
            assert_eq!(StatusMatch::parse(bad), None, "{bad}");
        }
        assert!(StatusMatch::Class(2).matches(204));
        assert!(!StatusMatch::Class(2).matches(301));
        assert!(StatusMatch::Exact(201).matches(201));
        assert!(!StatusMatch::Exact(201).matches(200));
    }

    #[test]
    fn data_is_the_body_or_a_pointer() {
        for ok in ["body", "", "/order", "/a/0/b", "/a~0b/c~1d"] {
            assert!(is_valid_data(ok), "{ok}");
        }
        for bad in ["order", "/a~2", "/a~", "x/y"] {
            assert!(!is_valid_data(bad), "{bad}");
        }
        let body = br#"{"order":{"id":"o1"},"n":1,"list":[1]}"#;
        assert_eq!(
            data_of(&rule("POST", "/o", "2xx", "body"), body).unwrap()["n"],
            1
        );
        assert_eq!(
            data_of(&rule("POST", "/o", "2xx", "/order"), body).unwrap(),
            serde_json::json!({"id": "o1"})
        );
        assert_eq!(
            data_of(&rule("POST", "/o", "2xx", "/missing"), body),
            Err(Skipped::Unresolved("/missing".into()))
        );
        assert_eq!(
            data_of(&rule("POST", "/o", "2xx", "/n"), body),
            Err(Skipped::NotAnObject("a number"))
        );
        assert_eq!(
            data_of(&rule("POST", "/o", "2xx", "body"), b"not json"),
            Err(Skipped::NotJson)
        );
    }

    #[test]
    fn the_first_matching_rule_publishes_with_an_id_of_the_key_and_its_idempotency_key() {
        let rules = vec![
            rule("POST", "/orders", "4xx", "body"),
            rule("POST", "/ord*", "201", "body"),
            rule("*", "/orders", "2xx", "/order"),
        ];
        let body = br#"{"order":{"id":"o1"}}"#;
        let ev = for_response(&rules, &TRACE, 201, Some(body))
            .unwrap()
            .unwrap();
        assert_eq!(
            ev.data,
            serde_json::json!({"order": {"id": "o1"}}),
            "rule 1"
        );
        assert_eq!(
            (ev.project.as_str(), ev.request_id.as_str()),
            ("acme", "req_1")
        );
        let other = for_response(&rules, &TRACE, 200, Some(body))
            .unwrap()
            .unwrap();
        assert_eq!(other.data, serde_json::json!({"id": "o1"}), "rule 2");
        assert_eq!(ev.id, other.id, "one id per (key, Idempotency-Key)");
        assert_eq!(for_response(&rules, &TRACE, 301, Some(body)), Ok(None));
        assert_eq!(
            for_response(&rules, &TRACE, 201, None),
            Err(Skipped::NotRead)
        );
        let get = Trace {
            method: "GET",
            ..TRACE
        };
        assert!(for_response(&rules[..2], &get, 201, Some(body))
            .unwrap()
            .is_none());
    }

    /// Issue 32 #2: an event's data rides in the store of its response;
    /// one over 1 MiB publishes nothing, and the response is stored.
    #[test]
    fn data_over_a_mebibyte_publishes_nothing() {
        let rules = vec![rule("POST", "/orders", "2xx", "body")];
        let fill = |n: usize| format!(r#"{{"pad":"{}"}}"#, "x".repeat(n));
        let fits = fill(MAX_DATA_BYTES - 10);
        assert_eq!(fits.len(), MAX_DATA_BYTES);
        assert!(for_response(&rules, &TRACE, 201, Some(fits.as_bytes()))
            .unwrap()
            .is_some());
        let over = fill(MAX_DATA_BYTES - 9);
        assert_eq!(
            for_response(&rules, &TRACE, 201, Some(over.as_bytes())),
            Err(Skipped::TooLarge(MAX_DATA_BYTES + 1))
        );
    }

    #[test]
    fn event_ids_are_stable_and_separate_keys() {
        let a = event_id("key_01", "k1");
        assert_eq!(a, event_id("key_01", "k1"));
        assert_eq!(a.len(), 4 + 26);
        assert!(a.starts_with("evt_"));
        assert_ne!(a, event_id("key_02", "k1"));
        assert_ne!(a, event_id("key_01", "k2"));
        assert_ne!(event_id("key_0", "1k1"), event_id("key_01", "k1"));
    }

    #[test]
    fn retries_back_off_to_five_minutes() {
        assert_eq!(retry_at(0, 0), 1_000);
        assert_eq!(retry_at(3, 0), 8_000);
        assert_eq!(retry_at(20, 0), 300_000);
    }
}
