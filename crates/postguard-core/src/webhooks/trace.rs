//! What an attempt's record keeps of its request and response headers, and
//! how the delivery log shows them (docs/webhooks.md, "Delivery log").
//!
//! The request headers are one list, [`request_headers`], which the sender
//! sends and the log shows: most of them follow from the attempt and its
//! delivery (event id and type, attempt number, request id), so a record
//! keeps only what does not — the `webhook-timestamp` and the
//! `webhook-signature`, which is never stored whole: [`redact_signature`]
//! keeps each entry's version and its first [`SIGNATURE_SHOWN`] characters,
//! enough to tell two signatures (a rotation's two secrets) apart and too
//! few to forge or replay one. The response headers are kept as received,
//! bounded ([`response_headers`]), with cookies redacted.

use serde::{Deserialize, Serialize};

/// The `User-Agent` of every attempt and test ping.
pub const USER_AGENT: &str = "postguard-webhooks/0.1";
/// Characters of each signature a record keeps.
pub const SIGNATURE_SHOWN: usize = 6;
/// Response headers an attempt keeps at most, in the order received.
pub const MAX_RESPONSE_HEADERS: usize = 8;
/// Characters of a response header's name and value kept at most.
pub const MAX_NAME_CHARS: usize = 40;
pub const MAX_VALUE_CHARS: usize = 100;
/// Bytes of kept response headers at most, as the record stores them (a
/// JSON array of `[name, value]` pairs, escapes included): the rest is
/// dropped and the list ends with [`TRUNCATED`].
pub const MAX_RESPONSE_HEADER_BYTES: usize = 256;
/// Room [`response_headers`] leaves for the [`TRUNCATED`] marker.
const MARKER_BYTES: usize = 24;
/// The name of the marker that ends a list cut by the bounds above.
pub const TRUNCATED: &str = "…";
/// What a redacted value reads.
pub const REDACTED: &str = "(redacted)";

/// What a record keeps of an attempt's request: the two headers that do
/// not follow from the attempt and its delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signed {
    /// `webhook-timestamp` (epoch seconds).
    pub timestamp: u64,
    /// `webhook-signature`, redacted ([`redact_signature`]).
    pub signature: String,
}

/// One attempt's request, as sent and as shown.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub event_id: &'a str,
    pub event_type: &'a str,
    pub attempt: u32,
    /// The attempt's own `X-Request-Id`.
    pub request_id: &'a str,
    pub timestamp: u64,
}

/// The headers of an attempt's request, in the order they are sent, with
/// `signature` as given: the real one when sending, the redacted one when
/// the log shows it.
pub fn request_headers(r: &Request<'_>, signature: &str) -> Vec<(&'static str, String)> {
    vec![
        ("content-type", "application/json".into()),
        ("user-agent", USER_AGENT.into()),
        ("webhook-id", r.event_id.into()),
        ("webhook-timestamp", r.timestamp.to_string()),
        ("webhook-signature", signature.into()),
        ("x-event-id", r.event_id.into()),
        ("x-event-type", r.event_type.into()),
        ("x-delivery-attempt", r.attempt.to_string()),
        ("x-request-id", r.request_id.into()),
    ]
}

/// A `webhook-signature` value with each space-separated entry reduced to
/// its version and first [`SIGNATURE_SHOWN`] characters (`v1,K5oZfz…`);
/// an entry without a version is [`REDACTED`] whole.
pub fn redact_signature(value: &str) -> String {
    value
        .split(' ')
        .filter(|e| !e.is_empty())
        .map(|entry| match entry.split_once(',') {
            Some((version, sig))
                if !version.is_empty()
                    && version.len() <= 8
                    && version.bytes().all(|b| b.is_ascii_alphanumeric()) =>
            {
                let shown: String = sig.chars().take(SIGNATURE_SHOWN).collect();
                format!("{version},{shown}…")
            }
            _ => REDACTED.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// What a record keeps of a request signed at `timestamp` with `signature`.
pub fn signed(timestamp: u64, signature: &str) -> Signed {
    Signed {
        timestamp,
        signature: redact_signature(signature),
    }
}

/// The request headers the log shows for an attempt that kept `signed`
/// (`None`: an attempt recorded before 0.4, or one never sent).
pub fn shown_request_headers(
    r: &Request<'_>,
    signed: Option<&Signed>,
) -> Option<Vec<(String, String)>> {
    let s = signed?;
    let r = Request {
        timestamp: s.timestamp,
        ..*r
    };
    Some(
        request_headers(&r, &s.signature)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    )
}

/// The length of `s` as a JSON string (quotes and escapes included).
fn json_len(s: &str) -> usize {
    2 + s
        .chars()
        .map(|c| match c {
            '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
            c if (c as u32) < 0x20 => 6,
            c => c.len_utf8(),
        })
        .sum::<usize>()
}

fn cut(s: &str, n: usize) -> String {
    let end = s.char_indices().nth(n).map_or(s.len(), |(i, _)| i);
    match end < s.len() {
        true => format!("{}…", &s[..end]),
        false => s.to_string(),
    }
}

/// Headers about the connection, not the answer: never kept.
pub const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
];

/// A receiver's response headers as an attempt keeps them: the
/// [`HOP_BY_HOP`] ones left out, names lower-cased, `set-cookie` (and any `authorization`) values
/// [`REDACTED`], names and values cut to [`MAX_NAME_CHARS`] and
/// [`MAX_VALUE_CHARS`], at most [`MAX_RESPONSE_HEADERS`] of them and
/// [`MAX_RESPONSE_HEADER_BYTES`] in all; a cut list ends with
/// `(TRUNCATED, "<n> more")`.
pub fn response_headers(received: &[(String, String)]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut bytes = 0usize;
    let kept: Vec<&(String, String)> = received
        .iter()
        .filter(|(n, _)| !HOP_BY_HOP.iter().any(|h| n.eq_ignore_ascii_case(h)))
        .collect();
    for (i, (name, value)) in kept.iter().enumerate() {
        let name = cut(&name.to_ascii_lowercase(), MAX_NAME_CHARS);
        let value = match name.as_str() {
            "set-cookie" | "authorization" | "proxy-authorization" => REDACTED.to_string(),
            _ => cut(value, MAX_VALUE_CHARS),
        };
        // `["name","value"],` as the record's JSON writes it.
        let size = json_len(&name) + json_len(&value) + 4;
        if out.len() == MAX_RESPONSE_HEADERS
            || bytes + size > MAX_RESPONSE_HEADER_BYTES - MARKER_BYTES - 2
        {
            out.push((TRUNCATED.to_string(), format!("{} more", kept.len() - i)));
            break;
        }
        bytes += size;
        out.push((name, value));
    }
    out
}

/// The most a record's kept headers take (the `Signed` and the response
/// headers as JSON, their columns' overhead): what the byte quota charges
/// each attempt for them (`capacity::measured::ATTEMPT_HEADERS`).
/// (The `Signed` JSON, `{"timestamp":…,"signature":"v1,xxxxxx… v1,xxxxxx…"}`,
/// is at most 96 B; the two columns' record overhead a few bytes.)
pub const KEPT_BYTES_MAX: u64 = 96 + MAX_RESPONSE_HEADER_BYTES as u64 + 8;

#[cfg(test)]
mod tests {
    use super::*;

    const REQ: Request<'static> = Request {
        event_id: "evt_1",
        event_type: "payment.succeeded",
        attempt: 2,
        request_id: "req_01ABC",
        timestamp: 1_796_000_000,
    };

    #[test]
    fn a_signature_keeps_its_version_and_first_characters_only() {
        let one = "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=";
        assert_eq!(redact_signature(one), "v1,K5oZfz…");
        let two = format!("{one} v1,Ab12Cd34Ef56Gh78Ij90KlMnOpQrStUvWxYz012345=");
        assert_eq!(redact_signature(&two), "v1,K5oZfz… v1,Ab12Cd…");
        assert!(!redact_signature(&two).contains("N95Z9"), "no more of it");
        assert_eq!(redact_signature("secretwithoutversion"), REDACTED);
        assert_eq!(redact_signature("v1,ab"), "v1,ab…");
        assert_eq!(redact_signature(",K5oZfzN95Z9"), REDACTED);
        assert_eq!(redact_signature(""), "");
        let s = signed(7, one);
        assert_eq!(
            s,
            Signed {
                timestamp: 7,
                signature: "v1,K5oZfz…".into()
            }
        );
    }

    #[test]
    fn the_log_shows_the_headers_sent_with_the_signature_redacted() {
        let sig = "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=";
        let sent = request_headers(&REQ, sig);
        let kept = signed(REQ.timestamp, sig);
        let at_other_time = Request {
            timestamp: 1,
            ..REQ
        };
        let shown = shown_request_headers(&at_other_time, Some(&kept)).unwrap();
        assert_eq!(shown.len(), sent.len());
        for ((sk, sv), (k, v)) in sent.iter().zip(&shown) {
            assert_eq!(*sk, k.as_str());
            match *sk {
                "webhook-signature" => assert_eq!(v, "v1,K5oZfz…"),
                _ => assert_eq!(sv, v, "{sk}"),
            }
        }
        assert!(shown.contains(&("x-delivery-attempt".into(), "2".into())));
        assert!(
            shown.contains(&("webhook-timestamp".into(), "1796000000".into())),
            "as signed"
        );
        assert_eq!(
            shown_request_headers(&REQ, None),
            None,
            "an attempt from before"
        );
    }

    #[test]
    fn response_headers_are_bounded_and_cookies_redacted() {
        let h = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let kept = response_headers(&h(&[
            ("Connection", "keep-alive"),
            ("Content-Type", "text/plain"),
            ("Keep-Alive", "timeout=5"),
            ("Set-Cookie", "session=abc123; HttpOnly"),
            ("X-Long", &"x".repeat(500)),
        ]));
        assert_eq!(kept[0], ("content-type".into(), "text/plain".into()));
        assert_eq!(kept[1], ("set-cookie".into(), REDACTED.into()));
        assert_eq!(
            kept[2].1.chars().count(),
            MAX_VALUE_CHARS + 1,
            "cut, with …"
        );
        let many: Vec<(String, String)> =
            (0..40).map(|i| (format!("x-h{i}"), "v".into())).collect();
        let kept = response_headers(&many);
        assert_eq!(kept.len(), MAX_RESPONSE_HEADERS + 1);
        assert_eq!(
            kept.last(),
            Some(&(TRUNCATED.to_string(), "32 more".to_string()))
        );
        let big: Vec<(String, String)> = (0..10)
            .map(|i| (format!("x-b{i}"), "y".repeat(90)))
            .collect();
        let kept = response_headers(&big);
        let bytes = serde_json::to_string(&kept).unwrap().len();
        assert!(bytes <= MAX_RESPONSE_HEADER_BYTES, "{bytes}");
        // Escapes count: a value of quotes is twice its length as JSON.
        let quotes: Vec<(String, String)> = (0..10)
            .map(|i| (format!("x-q{i}"), "\"".repeat(150)))
            .collect();
        let json = serde_json::to_string(&response_headers(&quotes))
            .unwrap()
            .len();
        assert!(json <= MAX_RESPONSE_HEADER_BYTES, "{json}");
        assert_eq!(kept.last().map(|(k, _)| k.as_str()), Some(TRUNCATED));
        // The charge covers the largest list kept, as JSON.
        let json = serde_json::to_string(&kept).unwrap().len()
            + serde_json::to_string(&signed(u64::MAX, "v1,aaaaaaaaaa v1,bbbbbbbbbbb"))
                .unwrap()
                .len();
        assert!(json as u64 <= KEPT_BYTES_MAX, "{json}");
    }
}
