//! Which webhook URLs postguard will deliver to (SSRF rules, docs/webhooks.md, docs/api-reference.md).
//!
//! A subscriber chooses the URL, so the URL decides where the gateway sends
//! signed requests from inside the operator's network position. The rules are
//! applied to the URL *as the `url` crate (WHATWG) parses it*, because that is
//! what `fetch` will use: `http://2130706433/`, `http://0x7f.1/` and
//! `http://0177.0.0.1/` are all `127.0.0.1` after parsing, and the IP rules see
//! them as such. Two things cannot be judged after parsing and are checked on
//! the raw text: percent-encoded hosts (`%6c%6fcalhost` decodes to
//! `localhost`; we refuse the encoding itself) and the length cap.
//!
//! Host names are not resolved here (no I/O): a DNS name that points at a
//! private address is the platform's concern (Workers' `fetch` cannot reach
//! private networks). What this module refuses is every *literal* that names a
//! non-public address, including IPv6 forms that embed an IPv4 address
//! (mapped `::ffff:a.b.c.d`, compatible `::a.b.c.d`, NAT64 `64:ff9b::/96`,
//! 6to4 `2002::/16`), whose embedded address is checked against the IPv4 list.
//!
//! Ranges are `ipnet` networks built in `const` items, so a typo in a prefix
//! is a compile error rather than a runtime surprise.
//!
//! `allow_hosts` is for development: an entry equal (ASCII case-insensitive)
//! to the parsed host admits exactly that host, skipping the IP and
//! `localhost` rules but never the scheme, credential, encoding or port rules.

pub use crate::url_host::host_refusal;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::Invalid;
use ipnet::{Ipv4Net, Ipv6Net};
use url::{Host, Url};

/// The longest URL accepted, before and after normalisation.
pub const MAX_URL_LEN: usize = 2048;

/// The operator's development relaxations (`webhooks.allow_insecure_urls`,
/// `webhooks.allow_hosts`).
#[derive(Debug, Clone, Copy, Default)]
pub struct UrlPolicy<'a> {
    pub allow_insecure: bool,
    pub allow_hosts: &'a [String],
}

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8) -> Ipv4Net {
    Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), len)
}

const fn v6(s: [u16; 8], len: u8) -> Ipv6Net {
    Ipv6Net::new_assert(
        Ipv6Addr::new(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]),
        len,
    )
}

/// IPv4 networks that are not publicly routable, with the name used in errors.
const V4_REFUSED: &[(Ipv4Net, &str)] = &[
    (v4(0, 0, 0, 0, 8), "\"this network\" (0.0.0.0/8)"),
    (v4(10, 0, 0, 0, 8), "private"),
    (v4(100, 64, 0, 0, 10), "CGNAT (shared address space)"),
    (v4(127, 0, 0, 0, 8), "loopback"),
    (v4(169, 254, 0, 0, 16), "link-local"),
    (v4(172, 16, 0, 0, 12), "private"),
    (v4(192, 0, 0, 0, 24), "IETF protocol assignments"),
    (v4(192, 0, 2, 0, 24), "documentation"),
    (v4(192, 168, 0, 0, 16), "private"),
    (v4(198, 18, 0, 0, 15), "benchmarking"),
    (v4(198, 51, 100, 0, 24), "documentation"),
    (v4(203, 0, 113, 0, 24), "documentation"),
    (v4(224, 0, 0, 0, 4), "multicast"),
    (v4(255, 255, 255, 255, 32), "broadcast"),
    (v4(240, 0, 0, 0, 4), "reserved"),
];

/// IPv6 networks refused outright (checked after `::` and `::1`).
const V6_REFUSED: &[(Ipv6Net, &str)] = &[
    (
        v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7),
        "unique local (private)",
    ),
    (v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10), "link-local"),
    (v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10), "site-local"),
    (v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8), "multicast"),
    (v6([0x2001, 0x0db8, 0, 0, 0, 0, 0, 0], 32), "documentation"),
    (
        v6([0x0064, 0xff9b, 0x0001, 0, 0, 0, 0, 0], 48),
        "local-use NAT64",
    ),
    (v6([0x0100, 0, 0, 0, 0, 0, 0, 0], 64), "discard-only"),
];

/// IPv6 networks whose low 32 bits are an IPv4 address.
const V6_EMBEDS_V4_LOW: &[Ipv6Net] = &[
    // IPv4-mapped ::ffff:a.b.c.d
    v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96),
    // IPv4-translated ::ffff:0:a.b.c.d
    v6([0, 0, 0, 0, 0xffff, 0, 0, 0], 96),
    // IPv4-compatible ::a.b.c.d (deprecated)
    v6([0, 0, 0, 0, 0, 0, 0, 0], 96),
    // NAT64 well-known prefix 64:ff9b::a.b.c.d
    v6([0x0064, 0xff9b, 0, 0, 0, 0, 0, 0], 96),
];

/// 6to4: `2002:AABB:CCDD::/48` embeds `AA.BB.CC.DD` in bits 16..48.
const V6_6TO4: Ipv6Net = v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16);

/// Why an IPv4 address is refused, if it is.
fn v4_refusal(ip: Ipv4Addr) -> Option<&'static str> {
    V4_REFUSED
        .iter()
        .find(|(net, _)| net.contains(&ip))
        .map(|(_, why)| *why)
}

/// Why an IPv6 address is refused, if it is: (range name, embedded IPv4).
fn v6_refusal(ip: Ipv6Addr) -> Option<(&'static str, Option<Ipv4Addr>)> {
    if ip == Ipv6Addr::LOCALHOST {
        return Some(("loopback", None));
    }
    if ip == Ipv6Addr::UNSPECIFIED {
        return Some(("unspecified", None));
    }
    let o = ip.octets();
    let embedded = if V6_EMBEDS_V4_LOW.iter().any(|n| n.contains(&ip)) {
        Some(Ipv4Addr::new(o[12], o[13], o[14], o[15]))
    } else if V6_6TO4.contains(&ip) {
        Some(Ipv4Addr::new(o[2], o[3], o[4], o[5]))
    } else {
        None
    };
    if let Some(inner) = embedded {
        return v4_refusal(inner).map(|why| (why, Some(inner)));
    }
    V6_REFUSED
        .iter()
        .find(|(net, _)| net.contains(&ip))
        .map(|(_, why)| (*why, None))
}

fn article(word: &str) -> &'static str {
    match word.bytes().next() {
        Some(b'a' | b'e' | b'i' | b'o' | b'u') => "an",
        _ => "a",
    }
}

fn ip_refusal(host: &str, ip: IpAddr) -> Option<String> {
    match ip {
        IpAddr::V4(a) => {
            v4_refusal(a).map(|why| format!("url: host {host} is in {} {why} range", article(why)))
        }
        IpAddr::V6(a) => v6_refusal(a).map(|(why, inner)| {
            let a = article(why);
            match inner {
                Some(inner) => format!(
                    "url: host {host} embeds the IPv4 address {inner}, which is in {a} {why} range"
                ),
                None => format!("url: host {host} is in {a} {why} range"),
            }
        }),
    }
}

fn is_localhost_name(domain: &str) -> bool {
    let d = domain.strip_suffix('.').unwrap_or(domain);
    d.eq_ignore_ascii_case("localhost")
        || d.len() > ".localhost".len()
            && d[d.len() - ".localhost".len()..].eq_ignore_ascii_case(".localhost")
}

fn is_allowed_host(policy: &UrlPolicy, host: &str) -> bool {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    policy.allow_hosts.iter().any(|entry| {
        entry.eq_ignore_ascii_case(host) || (bare != host && entry.eq_ignore_ascii_case(bare))
    })
}

/// Checks a subscriber's webhook URL. `Ok` carries the normalised URL to
/// store and deliver to; `Err` a detail naming the rule broken, starting
/// with `url: `.
pub fn check_url(raw: &str, policy: &UrlPolicy) -> Result<String, Invalid> {
    if raw.len() > MAX_URL_LEN {
        return Err(format!("url: longer than {MAX_URL_LEN} characters").into());
    }
    if let Some(why) = host_refusal(raw) {
        return Err(format!("url: {why}").into());
    }
    let url = Url::parse(raw).map_err(|e| format!("url: not a valid absolute URL ({e})"))?;
    match url.scheme() {
        "https" => {}
        "http" if policy.allow_insecure => {}
        "http" => return Err("url: scheme http is not allowed, use https".into()),
        other => return Err(format!("url: scheme {other} is not allowed, use https").into()),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("url: must not contain a user name or password".into());
    }
    let host = url.host().ok_or("url: a host is required")?;
    if url.port() == Some(0) {
        return Err("url: port 0 is not allowed".into());
    }
    let host_str = url.host_str().unwrap_or_default();
    if host_str.is_empty() {
        return Err("url: a host is required".into());
    }
    if !is_allowed_host(policy, host_str) {
        let ip = match host {
            Host::Ipv4(a) => Some(IpAddr::V4(a)),
            Host::Ipv6(a) => Some(IpAddr::V6(a)),
            Host::Domain(d) => {
                if is_localhost_name(d) {
                    return Err(format!("url: host {d} is a localhost name").into());
                }
                // Defensive: a domain that still reads as an address (e.g. a
                // trailing dot the parser kept) is judged as that address.
                d.strip_suffix('.').unwrap_or(d).parse::<IpAddr>().ok()
            }
        };
        if let Some(why) = ip.and_then(|ip| ip_refusal(host_str, ip)) {
            return Err(why.into());
        }
    }
    let out = String::from(url);
    if out.len() > MAX_URL_LEN {
        return Err(format!("url: longer than {MAX_URL_LEN} characters").into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const OPEN: UrlPolicy<'static> = UrlPolicy {
        allow_insecure: false,
        allow_hosts: &[],
    };

    /// Accepted with the default (strict) policy, with the normalised form.
    const ACCEPTED: &[(&str, &str)] = &[
        ("https://example.com/hook", "https://example.com/hook"),
        ("https://example.com", "https://example.com/"),
        ("HTTPS://EXAMPLE.COM/Hook", "https://example.com/Hook"),
        (
            "https://example.com:8443/a?b=c",
            "https://example.com:8443/a?b=c",
        ),
        ("https://example.com:443/x", "https://example.com/x"),
        ("https://[2606:4700::1]/x", "https://[2606:4700::1]/x"),
        ("https://8.8.8.8/x", "https://8.8.8.8/x"),
        ("https://1.1.1.1:65535/", "https://1.1.1.1:65535/"),
        ("https://172.32.0.1/", "https://172.32.0.1/"),
        ("https://100.128.0.1/", "https://100.128.0.1/"),
        ("https://192.169.0.1/", "https://192.169.0.1/"),
        ("https://[::ffff:8.8.8.8]/", "https://[::ffff:808:808]/"),
        ("https://[64:ff9b::808:808]/", "https://[64:ff9b::808:808]/"),
        (
            "https://localhost.example.com/",
            "https://localhost.example.com/",
        ),
        ("https://mylocalhost/", "https://mylocalhost/"),
        (
            "https://xn--bcher-kva.example/",
            "https://xn--bcher-kva.example/",
        ),
        ("https://example.com/a%20b", "https://example.com/a%20b"),
        ("https://example.com./x", "https://example.com./x"),
        // WHATWG skips extra slashes after a special scheme: the host is `path`.
        ("https:///path", "https://path/"),
        ("  https://example.com/x \n", "https://example.com/x"),
    ];

    /// Refused with the default policy, each with a fragment of the detail.
    const REFUSED: &[(&str, &str)] = &[
        ("http://example.com/hook", "scheme http"),
        ("ftp://example.com", "scheme ftp"),
        ("javascript:alert(1)", "scheme javascript"),
        ("file:///etc/passwd", "scheme file"),
        ("data:text/plain,hi", "scheme data"),
        ("ws://example.com/", "scheme ws"),
        ("gopher://example.com/", "scheme gopher"),
        ("mailto:a@example.com", "scheme mailto"),
        ("https://user:pw@example.com", "user name or password"),
        ("https://user@example.com/", "user name or password"),
        ("https://:pw@example.com/", "user name or password"),
        ("https://%6c%6fcalhost/", "percent-encoded"),
        ("https://ex%61mple.com/", "percent-encoded"),
        ("https://localhost/", "localhost"),
        ("https://LOCALHOST:8443/", "localhost"),
        ("https://localhost./", "localhost"),
        ("https://a.b.localhost/", "localhost"),
        ("https://api.localhost./", "localhost"),
        ("https://127.0.0.1/", "loopback"),
        ("https://127.1.2.3:8080/", "loopback"),
        ("https://0x7f.1/", "loopback"),
        ("https://2130706433/", "loopback"),
        ("https://0177.0.0.1/", "loopback"),
        ("https://127.1/", "loopback"),
        ("https://10.0.0.1/", "private"),
        ("https://172.16.0.1/", "private"),
        ("https://172.31.255.255/", "private"),
        ("https://192.168.1.1/", "private"),
        ("https://100.64.0.1/", "CGNAT"),
        ("https://169.254.169.254/latest/meta-data", "link-local"),
        ("https://224.0.0.1/", "multicast"),
        ("https://0.0.0.0/", "this network"),
        ("https://0/", "this network"),
        ("https://0.1.2.3/", "this network"),
        ("https://255.255.255.255/", "broadcast"),
        ("https://240.0.0.1/", "reserved"),
        ("https://192.0.2.1/", "documentation"),
        ("https://198.51.100.7/", "documentation"),
        ("https://203.0.113.9/", "documentation"),
        ("https://198.18.0.1/", "benchmarking"),
        ("https://198.19.255.1/", "benchmarking"),
        ("https://[::1]/", "loopback"),
        ("https://[::]/", "unspecified"),
        ("https://[fc00::1]/", "unique local"),
        ("https://[fd12:3456::1]/", "unique local"),
        ("https://[fe80::1]/", "link-local"),
        ("https://[fe80::1%25eth0]/", "not a valid absolute URL"),
        ("https://[ff02::1]/", "multicast"),
        ("https://[2001:db8::1]/", "documentation"),
        ("https://[::ffff:127.0.0.1]/", "loopback"),
        ("https://[::ffff:7f00:1]/", "loopback"),
        ("https://[::ffff:10.0.0.1]/", "private"),
        ("https://[::ffff:169.254.169.254]/", "link-local"),
        ("https://[::127.0.0.1]/", "loopback"),
        ("https://[::ffff:0:127.0.0.1]/", "loopback"),
        ("https://[64:ff9b::127.0.0.1]/", "loopback"),
        ("https://[64:ff9b::10.1.2.3]/", "private"),
        ("https://[2002:7f00:1::]/", "loopback"),
        ("https://example.com:0/", "port 0"),
        ("https://example.com:65536/", "not a valid absolute URL"),
        ("https://example.com:99999/", "not a valid absolute URL"),
        ("https:///localhost/x", "localhost"),
        ("https:\\\\127.0.0.1\\x", "loopback"),
        ("https://127.0.0.1./", "loopback"),
        ("https://ｌｏｃａｌｈｏｓｔ/", "must be ASCII"),
        ("https://１２７.0.0.1/", "must be ASCII"),
        ("https://bücher.example/", "xn--"),
        // A capital before a non-ASCII letter trips the IDNA stub's debug assertion:
        // refused before parsing.
        ("https://Bücher.example/", "must be ASCII"),
        ("https://A%A0/", "percent-encoded"),
        ("https://loc\talhost/", "localhost"),
        ("/relative/path", "not a valid absolute URL"),
        ("", "not a valid absolute URL"),
        ("https://", "not a valid absolute URL"),
        ("https://exa mple.com/", "not a valid absolute URL"),
    ];

    #[test]
    fn accepted_urls_are_normalised() {
        for (raw, want) in ACCEPTED {
            assert_eq!(check_url(raw, &OPEN).as_deref(), Ok(*want), "{raw}");
        }
    }

    #[test]
    fn refused_urls_name_the_rule() {
        for (raw, frag) in REFUSED {
            let err = check_url(raw, &OPEN).expect_err(raw);
            assert!(err.starts_with("url: "), "{raw}: {err}");
            assert!(err.contains(frag), "{raw}: {err}");
        }
    }

    fn hosts(list: &[&str]) -> Vec<String> {
        list.iter().map(|h| h.to_string()).collect()
    }

    #[test]
    fn allow_hosts_admit_exactly_that_host_for_development() {
        let allow = hosts(&["127.0.0.1", "LocalHost", "::1", "[fd00::2]"]);
        let dev = UrlPolicy {
            allow_insecure: true,
            allow_hosts: &allow,
        };
        assert_eq!(
            check_url("http://127.0.0.1:9000/x", &dev).as_deref(),
            Ok("http://127.0.0.1:9000/x")
        );
        // The same host spelled differently is still that host once parsed.
        assert!(check_url("http://2130706433:9000/x", &dev).is_ok());
        assert!(check_url("https://localhost/x", &dev).is_ok());
        assert!(
            check_url("https://localhost./x", &dev).is_err(),
            "not the same host"
        );
        assert!(check_url("https://a.localhost/x", &dev).is_err());
        assert!(check_url("https://127.0.0.2/x", &dev).is_err());
        assert!(check_url("https://[::1]:8080/x", &dev).is_ok());
        assert!(check_url("https://[fd00::2]/x", &dev).is_ok());
        assert!(check_url("https://[fd00::3]/x", &dev).is_err());
        // Never past the scheme, credential, encoding or port rules.
        assert!(check_url("ftp://127.0.0.1/x", &dev).is_err());
        assert!(check_url("http://u:p@127.0.0.1/x", &dev).is_err());
        assert!(check_url("http://%31%32%37.0.0.1/x", &dev).is_err());
        assert!(check_url("http://127.0.0.1:0/x", &dev).is_err());

        let secure_only = UrlPolicy {
            allow_insecure: false,
            allow_hosts: &allow,
        };
        let err = check_url("http://127.0.0.1:9000/x", &secure_only).unwrap_err();
        assert!(err.contains("scheme http"), "{err}");
        assert!(check_url("https://127.0.0.1:9000/x", &secure_only).is_ok());

        let insecure_only = UrlPolicy {
            allow_insecure: true,
            allow_hosts: &[],
        };
        let err = check_url("http://127.0.0.1:9000/x", &insecure_only).unwrap_err();
        assert_eq!(err, "url: host 127.0.0.1 is in a loopback range");
        assert_eq!(
            check_url("http://example.com/hook", &insecure_only).as_deref(),
            Ok("http://example.com/hook")
        );
    }

    #[test]
    fn length_is_capped() {
        let base = "https://example.com/";
        let ok = format!("{base}{}", "a".repeat(MAX_URL_LEN - base.len()));
        assert_eq!(check_url(&ok, &OPEN), Ok(ok.clone()));
        let long = format!("{ok}a");
        assert!(check_url(&long, &OPEN)
            .unwrap_err()
            .contains("longer than 2048"));
        // Normalisation that grows the URL past the cap is refused too.
        let grows = format!("{base}{}", " ".repeat(MAX_URL_LEN - base.len() - 1));
        assert!(grows.len() <= MAX_URL_LEN);
        assert!(check_url(&format!("{grows}x"), &OPEN).is_err());
    }

    #[test]
    fn details_read_well() {
        assert_eq!(
            check_url("https://10.0.0.1/", &OPEN).unwrap_err(),
            "url: host 10.0.0.1 is in a private range"
        );
        assert_eq!(
            check_url("https://[::]/", &OPEN).unwrap_err(),
            "url: host [::] is in an unspecified range"
        );
        assert_eq!(
            check_url("https://[::ffff:127.0.0.1]/", &OPEN).unwrap_err(),
            "url: host [::ffff:7f00:1] embeds the IPv4 address 127.0.0.1, which is in a loopback range"
        );
    }

    proptest! {
        #[test]
        fn never_panics_and_accepted_urls_are_stable(s in "\\PC{0,120}") {
            if let Ok(u) = check_url(&s, &OPEN) {
                prop_assert!(u.starts_with("https://"));
                prop_assert_eq!(check_url(&u, &OPEN), Ok(u.clone()));
            }
        }

        #[test]
        fn url_shaped_input_never_panics(
            scheme in "(https?|ftp|HTTPS)",
            auth in "[a-zA-Z0-9.:@%\\[\\]_-]{0,40}",
            rest in "[/?#a-z0-9%]{0,20}",
        ) {
            let _ = check_url(&format!("{scheme}://{auth}{rest}"), &OPEN);
        }

        #[test]
        fn every_spelling_of_an_ipv4_address_gets_the_same_answer(n in any::<u32>()) {
            let ip = Ipv4Addr::from(n);
            let refused = v4_refusal(ip).is_some();
            let [a, b, c, d] = ip.octets();
            for raw in [
                format!("https://{ip}/"),
                format!("https://{n}/"),
                format!("https://{n:#x}/"),
                format!("https://0{a:o}.0{b:o}.0{c:o}.0{d:o}/"),
                format!("https://[::ffff:{ip}]/"),
                format!("https://[64:ff9b::{ip}]/"),
            ] {
                prop_assert_eq!(check_url(&raw, &OPEN).is_err(), refused, "{}", raw);
            }
        }

        #[test]
        fn refused_ranges_are_refused_throughout(i in 0..V4_REFUSED.len(), n in any::<u32>()) {
            let (net, _) = V4_REFUSED[i];
            let host_bits = u32::MAX.checked_shr(u32::from(net.prefix_len())).unwrap_or(0);
            let ip = Ipv4Addr::from(u32::from(net.network()) | (n & host_bits));
            let raw = format!("https://{ip}/x");
            prop_assert!(check_url(&raw, &OPEN).is_err(), "{}", raw);
        }
    }
}
