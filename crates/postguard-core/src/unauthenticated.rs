//! The limit on requests without a valid credential (docs/limits.md): which
//! answers count against the sender's address, and which counter an address
//! is charged to.
//!
//! Every refusal of a credential counts (401: a missing, unknown, malformed,
//! revoked or expired key; a wrong operator, origin or portal token), and so
//! does an anonymous 403, 404 or 405 under `/_postguard/` (a made-up path, a
//! capture URL or an export link that does not exist): each costs the
//! gateway work and an audit row. A request that showed a valid credential
//! is never counted, whatever it was answered.
//!
//! An IPv6 client holds a whole /64 (a home or a phone gets one), so it is
//! counted per /64: rotating addresses inside it gains nothing. An IPv4
//! address mapped into IPv6 is counted as the IPv4 address.

use std::net::{IpAddr, Ipv6Addr};

use crate::ErrorCode;

/// Whether an answer with `code` counts against the sender's address;
/// `credential` says whether the request showed a valid credential (of any
/// kind: a live key, the operator's or the origin's token, a session).
pub fn counts(code: ErrorCode, credential: bool) -> bool {
    match code {
        ErrorCode::InvalidApiKey | ErrorCode::Unauthorized | ErrorCode::ApiKeyExpired => true,
        ErrorCode::NotFound | ErrorCode::MethodNotAllowed | ErrorCode::Forbidden => !credential,
        _ => false,
    }
}

/// The counter an address is charged to: an IPv4 address as it is, an IPv6
/// address by its /64 (`2001:db8:1:2::/64`), anything else (absent, not an
/// address) as `unknown`.
pub fn bucket(address: Option<&str>) -> String {
    let Some(ip) = address.and_then(|a| a.trim().parse::<IpAddr>().ok()) else {
        return "unknown".to_string();
    };
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = v6.segments();
                let net = Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0);
                format!("{net}/64")
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn refused_credentials_count_and_anonymous_misses_count() {
        for code in [
            ErrorCode::InvalidApiKey,
            ErrorCode::Unauthorized,
            ErrorCode::ApiKeyExpired,
        ] {
            assert!(counts(code, false) && counts(code, true), "{code:?}");
        }
        for code in [
            ErrorCode::NotFound,
            ErrorCode::MethodNotAllowed,
            ErrorCode::Forbidden,
        ] {
            assert!(counts(code, false), "{code:?} without a credential");
            assert!(!counts(code, true), "{code:?} with one");
        }
        for code in [
            ErrorCode::RateLimitExceeded,
            ErrorCode::ValidationError,
            ErrorCode::PayloadTooLarge,
            ErrorCode::OriginUnreachable,
        ] {
            assert!(!counts(code, false), "{code:?}");
        }
    }

    #[test]
    fn ipv6_counts_per_64_and_ipv4_as_it_is() {
        assert_eq!(bucket(Some("203.0.113.7")), "203.0.113.7");
        assert_eq!(bucket(Some("2001:db8:1:2:aaaa::1")), "2001:db8:1:2::/64");
        assert_eq!(
            bucket(Some("2001:db8:1:2:ffff:ffff:ffff:ffff")),
            "2001:db8:1:2::/64"
        );
        assert_ne!(
            bucket(Some("2001:db8:1:3::1")),
            bucket(Some("2001:db8:1:2::1"))
        );
        assert_eq!(bucket(Some("::ffff:203.0.113.7")), "203.0.113.7");
        for junk in [None, Some(""), Some("not an ip"), Some("1.2.3.4.5")] {
            assert_eq!(bucket(junk), "unknown", "{junk:?}");
        }
    }

    proptest! {
        #[test]
        fn every_address_of_a_64_shares_one_counter(prefix in any::<u64>(), a in any::<u64>(), b in any::<u64>()) {
            let ip = |low: u64| {
                let v = (u128::from(prefix) << 64) | u128::from(low);
                Ipv6Addr::from(v).to_string()
            };
            // Mapped IPv4 addresses (::ffff:0:0/96) are counted as IPv4.
            prop_assume!(prefix != 0);
            prop_assert_eq!(bucket(Some(&ip(a))), bucket(Some(&ip(b))));
        }
    }
}
