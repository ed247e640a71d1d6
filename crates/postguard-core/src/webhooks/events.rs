//! Published events and subscriptions: request validation, filter matching
//! and the delivered body (docs/webhooks.md, docs/api-reference.md "Events").
//!
//! Validation errors are strings that start with the offending field
//! (`type: ...`, `events[2]: ...`, `url: ...`) because the worker turns them
//! into a `VALIDATION_ERROR` whose `detail` names the field.
//!
//! The delivered body is written by hand rather than through a
//! `serde_json::Map`, because the map sorts its keys and receivers (and the
//! contract's example) expect `id, type, timestamp, data` in that order. The
//! signature covers the exact bytes, so they are produced once, here.

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use super::url_guard::{check_url, UrlPolicy};
use crate::ids::is_valid_name;
use crate::Invalid;

/// The longest event type or event id.
pub const MAX_TYPE_LEN: usize = 128;
/// The most filters on one subscription.
pub const MAX_FILTERS: usize = 50;
/// The longest subscription description, in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 500;

/// `POST /_postguard/v1/events` body.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Publish {
    pub project: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub data: Value,
    #[serde(default)]
    pub id: Option<String>,
    /// Issue 36: deliveries of one subscription with the same key are
    /// attempted in publish order ([`super::ordering`]); 1-128 visible ASCII.
    #[serde(default)]
    pub ordering_key: Option<String>,
    /// Issue 36: no attempt before this time (epoch ms; given as epoch
    /// ms or RFC 3339). As parsed; [`parse_publish_at`] applies the bounds
    /// that need the clock ([`super::schedule::deliver_at`]).
    #[serde(default, deserialize_with = "time_field")]
    pub deliver_at: Option<u64>,
}

/// A time member (`deliver_at`): absent or `null` is `None`, otherwise
/// epoch milliseconds or RFC 3339, read as every other time the API takes
/// ([`crate::audit::time_value`]); the error names the member through
/// [`from_json`]'s path.
fn time_field<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(None),
        Some(v) => crate::audit::time_value("deliver_at", &v)
            .map(Some)
            .map_err(|e| {
                let why = e.0.strip_prefix("deliver_at: ").unwrap_or(&e.0).to_string();
                serde::de::Error::custom(why)
            }),
    }
}

/// `POST /_postguard/v1/webhooks` body.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewSubscription {
    pub url: String,
    pub events: Vec<String>,
    #[serde(default)]
    pub description: Option<String>,
}

/// Reads a JSON object into `T`, naming the field in errors.
fn from_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, Invalid> {
    // serde would also read a struct from a JSON array; only an object is valid.
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err("body: must be a JSON object".into());
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let err = match serde_path_to_error::deserialize::<_, T>(&mut de) {
        Ok(v) => {
            // Nothing but whitespace may follow the object.
            de.end()
                .map_err(|e| format!("body: must be a single JSON object ({e})"))?;
            return Ok(v);
        }
        Err(err) => err,
    };
    let path = err.path().to_string();
    let inner = err.into_inner();
    if inner.is_syntax() || inner.is_eof() {
        return Err(format!("body: must be a valid JSON object ({inner})").into());
    }
    let msg = inner.to_string();
    // Unknown and missing members are reported on their parent: name the member.
    if let Some(name) = msg
        .strip_prefix("unknown field `")
        .and_then(|r| r.split('`').next())
    {
        return Err(format!("{name}: unknown field").into());
    }
    if let Some(name) = msg
        .strip_prefix("missing field `")
        .and_then(|r| r.split('`').next())
    {
        return Err(format!("{name}: is required").into());
    }
    // serde_json appends " at line L column C"; the field name says enough.
    let msg = msg.split(" at line ").next().unwrap_or(&msg);
    if path == "." || path.is_empty() {
        return Err(format!("body: {msg}").into());
    }
    Err(format!("{path}: {msg}").into())
}

pub use crate::ids::is_valid_type;

/// `*`, an event type, or an event type followed by `.*`.
fn is_valid_filter(s: &str) -> bool {
    s == "*" || is_valid_type(s.strip_suffix(".*").unwrap_or(s))
}

/// Parses and validates a publish body.
pub fn parse_publish(body: &[u8]) -> Result<Publish, Invalid> {
    let p: Publish = from_json(body)?;
    if !is_valid_name(&p.project) {
        return Err("project: must be 1-64 of [A-Za-z0-9._-]".into());
    }
    if !is_valid_type(&p.event_type) {
        return Err("type: must be 1-128 of [A-Za-z0-9._:-]".into());
    }
    if !p.data.is_object() {
        return Err("data: must be a JSON object".into());
    }
    if let Some(id) = &p.id {
        if id.is_empty()
            || id.len() > MAX_TYPE_LEN
            || !id.bytes().all(|b| (0x21..=0x7e).contains(&b))
        {
            return Err("id: must be 1-128 visible ASCII characters".into());
        }
    }
    if let Some(key) = &p.ordering_key {
        if !super::ordering::is_valid_key(key) {
            return Err("ordering_key: must be 1-128 visible ASCII characters".into());
        }
    }
    Ok(p)
}

/// [`parse_publish`] and the bounds that need the clock: `deliver_at` at
/// most 7 days after `now` (400 naming the field), one in the past becomes
/// `now` ([`super::schedule::deliver_at`]). What the publish handler calls.
pub fn parse_publish_at(body: &[u8], now: u64) -> Result<Publish, Invalid> {
    let mut p = parse_publish(body)?;
    p.deliver_at = super::schedule::deliver_at(p.deliver_at, now)?;
    Ok(p)
}

/// Parses and validates a new subscription; `url` comes back normalised.
pub fn parse_subscription(body: &[u8], policy: &UrlPolicy) -> Result<NewSubscription, Invalid> {
    let mut s: NewSubscription = from_json(body)?;
    s.url = check_url(&s.url, policy)?;
    if s.events.is_empty() || s.events.len() > MAX_FILTERS {
        return Err(format!("events: must list 1 to {MAX_FILTERS} event types").into());
    }
    for (i, f) in s.events.iter().enumerate() {
        if !is_valid_filter(f) {
            return Err(format!(
                "events[{i}]: must be \"*\", an event type (1-128 of [A-Za-z0-9._:-]) or a type followed by \".*\""
            ).into());
        }
    }
    if let Some(d) = &s.description {
        if d.chars().count() > MAX_DESCRIPTION_CHARS {
            return Err(
                format!("description: longer than {MAX_DESCRIPTION_CHARS} characters").into(),
            );
        }
        if d.chars().any(char::is_control) {
            return Err("description: must not contain control characters".into());
        }
    }
    Ok(s)
}

/// Whether an event of `event_type` goes to a subscription with `filters`:
/// `*` matches everything, `payment.*` every type starting with `payment.`,
/// anything else only itself.
pub fn matches(filters: &[String], event_type: &str) -> bool {
    filters.iter().any(|f| {
        f == "*"
            || match f.strip_suffix('*') {
                Some(prefix) if prefix.ends_with('.') => event_type.starts_with(prefix),
                _ => f == event_type,
            }
    })
}

fn body_with(event_id: &str, event_type: &str, timestamp: &str, data: &Value) -> Vec<u8> {
    // `Value`'s Display is its compact JSON; strings are escaped by it too.
    format!(
        "{{\"id\":{},\"type\":{},\"timestamp\":{},\"data\":{}}}",
        Value::from(event_id),
        Value::from(event_type),
        Value::from(timestamp),
        data
    )
    .into_bytes()
}

/// The delivered body: `{"id","type","timestamp","data"}` (that key order).
/// When its serialised size exceeds `max_bytes`, `data` becomes exactly
/// `{"id": <data.id>, "truncated": true}` (`data.id` copied as-is, JSON null
/// if absent).
pub fn payload(
    event_id: &str,
    event_type: &str,
    timestamp_rfc3339: &str,
    data: &Value,
    max_bytes: usize,
) -> Vec<u8> {
    let full = body_with(event_id, event_type, timestamp_rfc3339, data);
    if full.len() <= max_bytes {
        return full;
    }
    let stub = serde_json::json!({
        "id": data.get("id").cloned().unwrap_or(Value::Null),
        "truncated": true,
    });
    body_with(event_id, event_type, timestamp_rfc3339, &stub)
}

/// Epoch milliseconds as RFC 3339 UTC with milliseconds,
/// e.g. `2026-11-30T06:05:29.123Z`.
/// After year 9999 (`time`'s range) it is that year's last millisecond.
pub fn rfc3339_ms(epoch_ms: u64) -> String {
    let t = i64::try_from(epoch_ms / 1000)
        .ok()
        .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok());
    let Some(t) = t else {
        return "9999-12-31T23:59:59.999Z".to_owned();
    };
    // Fields, not `time`'s formatter: one fixed layout needs no format machinery.
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        epoch_ms % 1000
    )
}

/// The first `max_chars` characters of a response body, invalid UTF-8
/// replaced by U+FFFD.
pub fn excerpt(body: &[u8], max_chars: usize) -> String {
    // Every character decoded consumes at least one and at most four bytes,
    // so the first `max_chars` characters lie within `4 * max_chars` bytes.
    let head = &body[..body.len().min(max_chars.saturating_mul(4))];
    String::from_utf8_lossy(head)
        .chars()
        .take(max_chars)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const STRICT: UrlPolicy<'static> = UrlPolicy {
        allow_insecure: false,
        allow_hosts: &[],
    };

    fn filters(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn publish_accepts_a_well_formed_event() {
        let p = parse_publish(
            br#"{"project":"acme","type":"payment.succeeded","data":{"id":"pay_1","amount":5}}"#,
        )
        .unwrap();
        assert_eq!(p.project, "acme");
        assert_eq!(p.event_type, "payment.succeeded");
        assert_eq!(p.data, json!({"id": "pay_1", "amount": 5}));
        assert_eq!(p.id, None);
        let p = parse_publish(
            br#" {"project":"a.b_c-1","type":"A:b_c-9.x","data":{},"id":"evt_01HX-custom"}"#,
        )
        .unwrap();
        assert_eq!(p.id.as_deref(), Some("evt_01HX-custom"));
        let p = parse_publish(br#"{"project":"p","type":"t","data":{},"id":null}"#).unwrap();
        assert_eq!(p.id, None);
        let max = format!(
            r#"{{"project":"p","type":"{}","data":{{}},"id":"{}"}}"#,
            "t".repeat(128),
            "~".repeat(128)
        );
        assert!(parse_publish(max.as_bytes()).is_ok());
    }

    #[test]
    fn publish_errors_name_the_field() {
        let cases: &[(&str, &str)] = &[
            ("", "body:"),
            ("[]", "body:"),
            ("{", "body:"),
            (r#"["acme","t",{}]"#, "body:"),
            ("{} trailing", "project: is required"),
            (
                r#"{"project":"p","type":"t","data":{}} x"#,
                "body: must be a single",
            ),
            (
                r#"{"project":"p","type":"t","data":{}}{}"#,
                "body: must be a single",
            ),
            (r#"{"type":"t","data":{}}"#, "project: is required"),
            (r#"{"project":"p","data":{}}"#, "type: is required"),
            (r#"{"project":"p","type":"t"}"#, "data: is required"),
            (
                r#"{"project":"p","type":"t","data":{},"x":1}"#,
                "x: unknown field",
            ),
            (
                r#"{"project":5,"type":"t","data":{}}"#,
                "project: invalid type",
            ),
            (
                r#"{"project":"p","type":["t"],"data":{}}"#,
                "type: invalid type",
            ),
            (
                r#"{"project":"p","type":"t","data":{},"id":7}"#,
                "id: invalid type",
            ),
            (r#"{"project":"","type":"t","data":{}}"#, "project: "),
            (r#"{"project":"a b","type":"t","data":{}}"#, "project: "),
            (r#"{"project":"p","type":"","data":{}}"#, "type: "),
            (r#"{"project":"p","type":"a b","data":{}}"#, "type: "),
            (r#"{"project":"p","type":"a/b","data":{}}"#, "type: "),
            (r#"{"project":"p","type":"pay.*","data":{}}"#, "type: "),
            (
                r#"{"project":"p","type":"t","data":[1]}"#,
                "data: must be a JSON object",
            ),
            (
                r#"{"project":"p","type":"t","data":"x"}"#,
                "data: must be a JSON object",
            ),
            (
                r#"{"project":"p","type":"t","data":null}"#,
                "data: must be a JSON object",
            ),
            (r#"{"project":"p","type":"t","data":{},"id":""}"#, "id: "),
            (r#"{"project":"p","type":"t","data":{},"id":"a b"}"#, "id: "),
            (r#"{"project":"p","type":"t","data":{},"id":"é"}"#, "id: "),
        ];
        for (body, want) in cases {
            let err = parse_publish(body.as_bytes()).unwrap_err();
            assert!(err.starts_with(want), "{body}: {err}");
            if !err.starts_with("body:") {
                assert!(!err.contains(" at line "), "{body}: {err}");
            }
        }
        let long_type = format!(
            r#"{{"project":"p","type":"{}","data":{{}}}}"#,
            "t".repeat(129)
        );
        assert!(parse_publish(long_type.as_bytes())
            .unwrap_err()
            .starts_with("type: "));
        let long_id = format!(
            r#"{{"project":"p","type":"t","data":{{}},"id":"{}"}}"#,
            "i".repeat(129)
        );
        assert!(parse_publish(long_id.as_bytes())
            .unwrap_err()
            .starts_with("id: "));
        assert!(parse_publish(b"\xff\xfe").unwrap_err().starts_with("body:"));
        assert!(parse_publish(b"{\"project\":\"p\",\"type\":\"t\",\"data\":{}}  \n\t").is_ok());
    }

    #[test]
    fn publish_takes_an_ordering_key_and_deliver_at() {
        let p = parse_publish(
            br#"{"project":"p","type":"t","data":{},"ordering_key":"order:42","deliver_at":1800000000000}"#,
        )
        .unwrap();
        assert_eq!(p.ordering_key.as_deref(), Some("order:42"));
        assert_eq!(p.deliver_at, Some(1_800_000_000_000));
        let p = parse_publish(
            br#"{"project":"p","type":"t","data":{},"ordering_key":null,"deliver_at":"2027-01-15T08:00:00.250Z"}"#,
        )
        .unwrap();
        assert_eq!(p.ordering_key, None);
        assert_eq!(p.deliver_at, Some(1_800_000_000_250));
        let p =
            parse_publish(br#"{"project":"p","type":"t","data":{},"deliver_at":null}"#).unwrap();
        assert_eq!((p.ordering_key, p.deliver_at), (None, None));
        let max = format!(
            r#"{{"project":"p","type":"t","data":{{}},"ordering_key":"{}"}}"#,
            "~".repeat(128)
        );
        assert!(parse_publish(max.as_bytes()).is_ok());

        let long = format!(
            r#"{{"project":"p","type":"t","data":{{}},"ordering_key":"{}"}}"#,
            "k".repeat(129)
        );
        for (body, want) in [
            (long.as_str(), "ordering_key: must be 1-128 visible ASCII"),
            (
                r#"{"project":"p","type":"t","data":{},"ordering_key":""}"#,
                "ordering_key: must be 1-128",
            ),
            (
                r#"{"project":"p","type":"t","data":{},"ordering_key":"a b"}"#,
                "ordering_key: must be 1-128",
            ),
            (
                r#"{"project":"p","type":"t","data":{},"ordering_key":"é"}"#,
                "ordering_key: must be 1-128",
            ),
            (
                r#"{"project":"p","type":"t","data":{},"ordering_key":"a\tb"}"#,
                "ordering_key: must be 1-128",
            ),
            (
                r#"{"project":"p","type":"t","data":{},"ordering_key":7}"#,
                "ordering_key: invalid type",
            ),
            (
                r#"{"project":"p","type":"t","data":{},"deliver_at":"tomorrow"}"#,
                "deliver_at: must be epoch milliseconds or an RFC 3339",
            ),
            (
                r#"{"project":"p","type":"t","data":{},"deliver_at":-1}"#,
                "deliver_at: must be epoch milliseconds",
            ),
            (
                r#"{"project":"p","type":"t","data":{},"deliver_at":1.5}"#,
                "deliver_at: must be epoch milliseconds",
            ),
            (
                r#"{"project":"p","type":"t","data":{},"deliver_at":{}}"#,
                "deliver_at: must be epoch milliseconds",
            ),
            (
                r#"{"project":"p","type":"t","data":{},"deliver_at":99999999999999999}"#,
                "deliver_at: must be epoch milliseconds",
            ),
        ] {
            let err = parse_publish(body.as_bytes()).unwrap_err();
            assert!(err.starts_with(want), "{body}: {err}");
            assert!(!err.contains(" at line "), "{body}: {err}");
        }
    }

    #[test]
    fn deliver_at_is_bounded_against_the_clock() {
        let now = 1_800_000_000_000u64;
        let at = |v: u64| format!(r#"{{"project":"p","type":"t","data":{{}},"deliver_at":{v}}}"#);
        let p = parse_publish_at(at(now + 3_600_000).as_bytes(), now).unwrap();
        assert_eq!(p.deliver_at, Some(now + 3_600_000));
        // In the past: due now.
        let p = parse_publish_at(at(now - 3_600_000).as_bytes(), now).unwrap();
        assert_eq!(p.deliver_at, Some(now));
        let week = super::super::schedule::MAX_AHEAD_MS;
        assert!(parse_publish_at(at(now + week).as_bytes(), now).is_ok());
        let err = parse_publish_at(at(now + week + 1).as_bytes(), now).unwrap_err();
        assert!(
            err.starts_with("deliver_at: must be at most 7 days ahead"),
            "{err}"
        );
        let p = parse_publish_at(br#"{"project":"p","type":"t","data":{}}"#, now).unwrap();
        assert_eq!(p.deliver_at, None);
        // The other rules still apply first.
        assert!(parse_publish_at(b"[]", now)
            .unwrap_err()
            .starts_with("body:"));
    }

    #[test]
    fn subscriptions() {
        let s = parse_subscription(
            br#"{"url":"HTTPS://Example.com/hook","events":["payment.*","*","invoice.paid"],"description":"ops"}"#,
            &STRICT,
        )
        .unwrap();
        assert_eq!(s.url, "https://example.com/hook", "stored normalised");
        assert_eq!(s.events, filters(&["payment.*", "*", "invoice.paid"]));
        assert_eq!(s.description.as_deref(), Some("ops"));
        let s = parse_subscription(br#"{"url":"https://example.com","events":["a"]}"#, &STRICT)
            .unwrap();
        assert_eq!(s.description, None);

        let fifty = serde_json::to_string(&vec!["a"; 50]).unwrap();
        let body = format!(r#"{{"url":"https://example.com","events":{fifty}}}"#);
        assert!(parse_subscription(body.as_bytes(), &STRICT).is_ok());
        let desc = "é".repeat(500);
        let body =
            format!(r#"{{"url":"https://example.com","events":["a"],"description":"{desc}"}}"#);
        assert!(parse_subscription(body.as_bytes(), &STRICT).is_ok());
    }

    #[test]
    fn subscription_errors_name_the_field() {
        let fifty_one = serde_json::to_string(&vec!["a"; 51]).unwrap();
        let too_many = format!(r#"{{"url":"https://example.com","events":{fifty_one}}}"#);
        let long_desc = format!(
            r#"{{"url":"https://example.com","events":["a"],"description":"{}"}}"#,
            "x".repeat(501)
        );
        let cases: Vec<(&str, &str)> = vec![
            (r#"{"events":["a"]}"#, "url: is required"),
            (r#"{"url":"https://example.com"}"#, "events: is required"),
            (
                r#"{"url":"https://example.com","events":["a"],"secret":"x"}"#,
                "secret: unknown field",
            ),
            (
                r#"{"url":"http://example.com","events":["a"]}"#,
                "url: scheme http",
            ),
            (
                r#"{"url":"https://10.0.0.1/","events":["a"]}"#,
                "url: host 10.0.0.1",
            ),
            (
                r#"{"url":"https://example.com","events":[]}"#,
                "events: must list",
            ),
            (&too_many, "events: must list"),
            (
                r#"{"url":"https://example.com","events":"a"}"#,
                "events: invalid type",
            ),
            (
                r#"{"url":"https://example.com","events":["a",""]}"#,
                "events[1]: ",
            ),
            (
                r#"{"url":"https://example.com","events":["**"]}"#,
                "events[0]: ",
            ),
            (
                r#"{"url":"https://example.com","events":[".*"]}"#,
                "events[0]: ",
            ),
            (
                r#"{"url":"https://example.com","events":["pay*"]}"#,
                "events[0]: ",
            ),
            (
                r#"{"url":"https://example.com","events":["a.*.b"]}"#,
                "events[0]: ",
            ),
            (
                r#"{"url":"https://example.com","events":["a b"]}"#,
                "events[0]: ",
            ),
            (
                r#"{"url":"https://example.com","events":[1]}"#,
                "events[0]: invalid type",
            ),
            (&long_desc, "description: longer"),
            (
                r#"{"url":"https://example.com","events":["a"],"description":"a\nb"}"#,
                "description: must not contain control",
            ),
            (
                r#"{"url":"https://example.com","events":["a"],"description":"a\u0085b"}"#,
                "description: must not contain control",
            ),
        ];
        for (body, want) in cases {
            let err = parse_subscription(body.as_bytes(), &STRICT).unwrap_err();
            assert!(err.starts_with(want), "{body}: {err}");
        }
        let dev_hosts = vec!["localhost".to_string()];
        let dev = UrlPolicy {
            allow_insecure: true,
            allow_hosts: &dev_hosts,
        };
        let s = parse_subscription(
            br#"{"url":"http://localhost:8787/in","events":["*"]}"#,
            &dev,
        )
        .unwrap();
        assert_eq!(s.url, "http://localhost:8787/in");
    }

    #[test]
    fn filter_matching() {
        let f = filters(&["payment.*", "invoice.paid"]);
        assert!(matches(&f, "payment.succeeded"));
        assert!(matches(&f, "payment.refund.created"));
        assert!(!matches(&f, "payment"), "the prefix includes the dot");
        assert!(!matches(&f, "payments.x"));
        assert!(matches(&f, "invoice.paid"));
        assert!(!matches(&f, "invoice.paid.late"));
        assert!(!matches(&f, "invoice.PAID"));
        assert!(matches(&filters(&["*"]), "anything:at.all"));
        assert!(!matches(&[], "a"));
        assert!(matches(&filters(&["x", "a"]), "a"));
    }

    #[test]
    fn payload_keeps_key_order_and_truncates_exactly() {
        let data = json!({"a": [1, 2], "amount": 5, "id": "pay_1"});
        let body = payload(
            "evt_1",
            "payment.succeeded",
            "2026-11-30T06:05:29.123Z",
            &data,
            65_536,
        );
        assert_eq!(
            String::from_utf8(body.clone()).unwrap(),
            r#"{"id":"evt_1","type":"payment.succeeded","timestamp":"2026-11-30T06:05:29.123Z","data":{"a":[1,2],"amount":5,"id":"pay_1"}}"#
        );
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["data"], data);

        // Exactly at the limit is kept; one byte below it truncates.
        let at = payload("evt_1", "payment.succeeded", "t", &data, body.len() + 100);
        assert_eq!(
            at.len(),
            body.len() + "t".len() - "2026-11-30T06:05:29.123Z".len()
        );
        assert_eq!(
            payload(
                "evt_1",
                "payment.succeeded",
                "2026-11-30T06:05:29.123Z",
                &data,
                body.len()
            ),
            body
        );
        let cut = payload(
            "evt_1",
            "payment.succeeded",
            "2026-11-30T06:05:29.123Z",
            &data,
            body.len() - 1,
        );
        let v: Value = serde_json::from_slice(&cut).unwrap();
        assert_eq!(v["data"], json!({"id": "pay_1", "truncated": true}));
        assert_eq!(v["id"], "evt_1");
        assert!(String::from_utf8(cut)
            .unwrap()
            .ends_with(r#""data":{"id":"pay_1","truncated":true}}"#));

        // data.id is copied as-is, or null when absent.
        let big = "x".repeat(100);
        let cut = payload("e", "t", "ts", &json!({"id": 42, "blob": big}), 50);
        let v: Value = serde_json::from_slice(&cut).unwrap();
        assert_eq!(v["data"], json!({"id": 42, "truncated": true}));
        let cut = payload("e", "t", "ts", &json!({"blob": big}), 50);
        let v: Value = serde_json::from_slice(&cut).unwrap();
        assert_eq!(v["data"], json!({"id": null, "truncated": true}));

        // Strings are escaped.
        let odd = payload("e\"1", "t", "ts", &json!({"q": "\u{2028}\n"}), 1_000);
        let v: Value = serde_json::from_slice(&odd).unwrap();
        assert_eq!(v["id"], "e\"1");
        assert_eq!(v["data"]["q"], "\u{2028}\n");
    }

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_796_018_729_123), "2026-11-30T06:05:29.123Z");
        assert_eq!(rfc3339_ms(1_445_412_480_000), "2015-10-21T07:28:00.000Z");
        assert_eq!(rfc3339_ms(253_402_300_799_999), "9999-12-31T23:59:59.999Z");
        // Out of range: the latest representable time, no panic.
        assert_eq!(rfc3339_ms(253_402_300_800_000), "9999-12-31T23:59:59.999Z");
        assert_eq!(rfc3339_ms(u64::MAX), "9999-12-31T23:59:59.999Z");
    }

    #[test]
    fn excerpts() {
        assert_eq!(excerpt(b"hello world", 5), "hello");
        assert_eq!(excerpt(b"hi", 5), "hi");
        assert_eq!(excerpt(b"", 5), "");
        assert_eq!(excerpt(b"abc", 0), "");
        assert_eq!(excerpt("héllo".as_bytes(), 2), "hé");
        assert_eq!(excerpt("€€€".as_bytes(), 2), "€€");
        assert_eq!(excerpt(b"a\xffb", 3), "a\u{fffd}b");
        // A multi-byte character cut by the end of the body.
        assert_eq!(excerpt(&"€".as_bytes()[..2], 5), "\u{fffd}");
    }

    proptest! {
        #[test]
        fn excerpt_matches_the_naive_definition(
            body in proptest::collection::vec(any::<u8>(), 0..200),
            n in 0usize..100,
        ) {
            let naive: String = String::from_utf8_lossy(&body).chars().take(n).collect();
            prop_assert_eq!(excerpt(&body, n), naive);
        }

        #[test]
        fn payload_is_json_within_the_cap_or_truncated(
            blob in "\\PC{0,300}",
            id in proptest::option::of("[a-z0-9_]{1,20}"),
            max in 0usize..600,
        ) {
            let mut data = json!({"blob": blob});
            if let Some(id) = &id {
                data["id"] = json!(id);
            }
            let out = payload("evt_1", "a.b", "2026-01-01T00:00:00.000Z", &data, max);
            let v: Value = serde_json::from_slice(&out).unwrap();
            let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
            prop_assert_eq!(keys.len(), 4);
            if v["data"] == data {
                prop_assert!(out.len() <= max);
            } else {
                prop_assert_eq!(&v["data"], &json!({"id": id, "truncated": true}));
            }
        }

        #[test]
        fn parsers_never_panic(body in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_publish(&body);
            let _ = parse_publish_at(&body, 1_800_000_000_000);
            let _ = parse_subscription(&body, &STRICT);
        }

        #[test]
        fn star_filters_match_their_prefix(
            prefix in "[a-z]{1,10}(\\.[a-z]{1,10}){0,2}",
            rest in "[a-z]{1,10}",
        ) {
            let f = vec![format!("{prefix}.*")];
            prop_assert!(is_valid_filter(&f[0]));
            let event = format!("{prefix}.{rest}");
            prop_assert!(matches(&f, &event));
            prop_assert!(!matches(&f, &prefix));
        }
    }
}
