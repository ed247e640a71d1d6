//! Which headers cross the gateway, in each direction, and the header that
//! lets the origin authenticate postguard.

use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// RFC 9110 §7.6.1 hop-by-hop fields, plus the legacy ones proxies drop.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Names listed in a `Connection` header are hop-by-hop too.
fn connection_listed(headers: &[(String, String)]) -> Vec<String> {
    headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("connection"))
        .flat_map(|(_, v)| v.split(',').map(|t| t.trim().to_ascii_lowercase()))
        .filter(|t| !t.is_empty())
        .collect()
}

fn is_hop_by_hop(name: &str, listed: &[String]) -> bool {
    HOP_BY_HOP.contains(&name) || listed.iter().any(|l| l == name)
}

/// Headers the gateway sets itself on every answer; an origin's copies are dropped.
fn is_gateway_owned(name: &str) -> bool {
    name == "x-request-id"
        || name.starts_with("x-ratelimit-")
        || name == "ratelimit"
        || name == "ratelimit-policy"
        || name == "idempotent-replayed"
        || name == "idempotent-body-omitted"
}

/// Request headers forwarded to the origin: everything but hop-by-hop fields,
/// the client's credentials, `Host`/`Content-Length` (the runtime sets them),
/// Cloudflare's own `cf-*` fields and anything the gateway sets itself (so a
/// client cannot spoof `X-Postguard-*`). `Idempotency-Key` passes as sent;
/// where the gateway enforces it, the pipeline replaces it with the
/// normalised key.
pub fn forward_request_headers(incoming: &[(String, String)]) -> Vec<(String, String)> {
    let listed = connection_listed(incoming);
    incoming
        .iter()
        .filter(|(k, _)| {
            let n = k.to_ascii_lowercase();
            !(is_hop_by_hop(&n, &listed)
                || n == "authorization"
                || n == "host"
                || n == "content-length"
                || n == "x-request-id"
                || n.starts_with("cf-")
                || n.starts_with("x-postguard-"))
        })
        .cloned()
        .collect()
}

/// Origin response headers passed to the client: all but hop-by-hop ones and
/// those the gateway owns.
pub fn client_response_headers(origin: &[(String, String)]) -> Vec<(String, String)> {
    let listed = connection_listed(origin);
    origin
        .iter()
        .filter(|(k, _)| {
            let n = k.to_ascii_lowercase();
            !(is_hop_by_hop(&n, &listed) || is_gateway_owned(&n))
        })
        .cloned()
        .collect()
}

/// Origin response headers kept under an Idempotency-Key: what the client
/// sees, minus per-response fields (`Date`, `Content-Length`, which the
/// runtime recomputes) and `Set-Cookie` unless the operator opted in.
pub fn storable_response_headers(
    origin: &[(String, String)],
    store_set_cookie: bool,
) -> Vec<(String, String)> {
    client_response_headers(origin)
        .into_iter()
        .filter(|(k, _)| {
            let n = k.to_ascii_lowercase();
            !(n == "date" || n == "content-length" || (n == "set-cookie" && !store_set_cookie))
        })
        .collect()
}

/// The first header whose value holds a control character other than tab
/// (RFC 9110 §5.5 forbids them); such a request is refused rather than
/// forwarded, since a strict origin would drop the connection.
pub fn first_invalid_value(headers: &[(String, String)]) -> Option<&str> {
    headers
        .iter()
        .find(|(_, v)| {
            v.chars()
                .any(|c| (c.is_control() && c != '\t') || c == '\u{7f}')
        })
        .map(|(k, _)| k.as_str())
}

/// The `X-Postguard-Signature` header value the origin can verify:
/// `t=<unix seconds>,v1=<base64 HMAC-SHA256(ORIGIN_TOKEN, "t.request_id.METHOD.path?query.hex(sha256(body))")>`.
pub fn origin_signature(
    secret: &str,
    t: u64,
    request_id: &str,
    method: &str,
    path_and_query: &str,
    body: &[u8],
) -> String {
    let body_hash = format!("{:x}", Sha256::digest(body));
    let signed = format!("{t}.{request_id}.{method}.{path_and_query}.{body_hash}");
    let sig = match Hmac::<Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(mut mac) => {
            mac.update(signed.as_bytes());
            base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
        }
        // HMAC accepts keys of any length; this arm is unreachable.
        Err(_) => String::new(),
    };
    format!("t={t},v1={sig}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    fn names(v: &[(String, String)]) -> Vec<String> {
        v.iter().map(|(k, _)| k.to_ascii_lowercase()).collect()
    }

    #[test]
    fn forwarding_strips_credentials_hop_by_hop_and_spoofed_identity() {
        let out = forward_request_headers(&h(&[
            ("Authorization", "Bearer pgk_secret"),
            ("Connection", "keep-alive, X-Trace"),
            ("X-Trace", "1"),
            ("Keep-Alive", "timeout=5"),
            ("Transfer-Encoding", "chunked"),
            ("Host", "gw"),
            ("Content-Type", "application/json"),
            ("X-Postguard-Project", "spoofed"),
            ("X-Request-Id", "req_spoofed"),
            ("CF-Connecting-IP", "1.2.3.4"),
            ("Idempotency-Key", "\"k\""),
            ("Accept", "*/*"),
        ]));
        assert_eq!(
            names(&out),
            vec!["content-type", "idempotency-key", "accept"]
        );
    }

    #[test]
    fn control_characters_in_values_are_found() {
        assert_eq!(
            first_invalid_value(&h(&[("a", "ok\tfine"), ("b", "é ü")])),
            None
        );
        assert_eq!(
            first_invalid_value(&h(&[("a", "ok"), ("X-Bad", "x\u{7f}y")])),
            Some("X-Bad")
        );
        assert_eq!(
            first_invalid_value(&h(&[("X-Nul", "x\u{0}")])),
            Some("X-Nul")
        );
        assert_eq!(
            first_invalid_value(&h(&[("X-Esc", "\u{1b}[0m")])),
            Some("X-Esc")
        );
    }

    #[test]
    fn stored_headers_drop_per_response_fields() {
        let origin = h(&[
            ("Content-Type", "application/json"),
            ("Set-Cookie", "s=1"),
            ("Date", "x"),
            ("Content-Length", "10"),
            ("X-RateLimit-Limit", "999"),
            ("Location", "/payments/1"),
            ("Transfer-Encoding", "chunked"),
        ]);
        assert_eq!(
            names(&storable_response_headers(&origin, false)),
            vec!["content-type", "location"]
        );
        assert_eq!(
            names(&storable_response_headers(&origin, true)),
            vec!["content-type", "set-cookie", "location"]
        );
        assert_eq!(
            names(&client_response_headers(&origin)),
            vec![
                "content-type",
                "set-cookie",
                "date",
                "content-length",
                "location"
            ]
        );
    }

    #[test]
    fn origin_signature_is_deterministic_and_covers_every_part() {
        let base = origin_signature("s3cret", 1_700_000_000, "req_1", "POST", "/a?b=1", b"{}");
        assert!(base.starts_with("t=1700000000,v1="));
        assert_eq!(
            base,
            origin_signature("s3cret", 1_700_000_000, "req_1", "POST", "/a?b=1", b"{}")
        );
        for other in [
            origin_signature("other", 1_700_000_000, "req_1", "POST", "/a?b=1", b"{}"),
            origin_signature("s3cret", 1_700_000_001, "req_1", "POST", "/a?b=1", b"{}"),
            origin_signature("s3cret", 1_700_000_000, "req_2", "POST", "/a?b=1", b"{}"),
            origin_signature("s3cret", 1_700_000_000, "req_1", "PUT", "/a?b=1", b"{}"),
            origin_signature("s3cret", 1_700_000_000, "req_1", "POST", "/a?b=2", b"{}"),
            origin_signature("s3cret", 1_700_000_000, "req_1", "POST", "/a?b=1", b"{ }"),
        ] {
            assert_ne!(base, other);
        }
    }

    /// Known answer, computed independently with
    /// `printf '%s' '1700000000.req_1.POST./a.<sha256("")>' | openssl dgst -sha256 -hmac s3cret -binary | base64`.
    #[test]
    fn origin_signature_known_answer() {
        let sig = origin_signature("s3cret", 1_700_000_000, "req_1", "POST", "/a", b"");
        assert_eq!(sig, format!("t=1700000000,v1={}", KNOWN_V1));
    }

    const KNOWN_V1: &str = "O6sw2Urr3s5iSfk9n2IauhgXD8htNd4Uwhq68fa3PAk=";
}
