//! What the host of a URL the gateway is given may be, before it is parsed:
//! the rule shared by every URL it takes — `ORIGIN_URL` and `public_url`,
//! CORS origins, webhook URLs (`webhooks::url_guard` adds the SSRF rules).

/// Why the host of `raw` (a URL) is refused before parsing, if it is. This
/// build leaves out Unicode host processing (IDNA) to keep the wasm small
/// (ADR 0019): a host must be plain ASCII, and never percent-encoded (which
/// could decode to anything). Bracketed IPv6 literals are left to the parser.
pub fn host_refusal(raw: &str) -> Option<&'static str> {
    let authority = raw_authority(raw);
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.starts_with('[') {
        None
    } else if host.contains('%') {
        Some("the host must not be percent-encoded")
    } else if !host.is_ascii() {
        Some("the host must be ASCII: write an international domain name in its Punycode (xn--) form")
    } else {
        None
    }
}

/// The authority part of the raw input (between `scheme:` + slashes and the
/// path, query or fragment), for checks that parsing would erase.
fn raw_authority(raw: &str) -> &str {
    let after_scheme = raw.split_once(':').map_or(raw, |(_, rest)| rest);
    let rest = after_scheme.trim_start_matches(['/', '\\']);
    let end = rest.find(['/', '\\', '?', '#']).unwrap_or(rest.len());
    &rest[..end]
}
