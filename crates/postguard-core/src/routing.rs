//! Which origin a proxied request goes to (docs/live-api.md): the first rule
//! of `origin.routes` whose method and path pattern match names it; no match
//! is `default` (`ORIGIN_URL`). The forwarded path loses the rule's
//! `strip_prefix` when it starts with it. Decided from the request's method
//! and path alone: no object call, no read, per request.

use std::borrow::Cow;

use url::Url;

use serde::Deserialize;

use crate::pattern;

/// The name `ORIGIN_URL` goes by in `origin.routes`.
pub const DEFAULT_ORIGIN: &str = "default";

/// One rule of `origin.routes`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OriginRoute {
    /// Any method when absent (or `*`).
    #[serde(default)]
    pub method: Option<String>,
    pub path: String,
    /// An `origins` name, or `default`.
    pub origin: String,
    /// Removed from the front of the path forwarded (when the path starts with it).
    #[serde(default)]
    pub strip_prefix: Option<String>,
}

/// An origin requests can be sent to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub name: String,
    pub base: Url,
    pub timeout_ms: u32,
}

/// Every origin of a configuration: `default` and the named ones, resolved
/// once when the configuration is loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origins {
    pub default: Origin,
    pub named: Vec<Origin>,
}

impl Origins {
    /// The origin called `name` (`default` too).
    pub fn get(&self, name: &str) -> Option<&Origin> {
        match name {
            DEFAULT_ORIGIN => Some(&self.default),
            _ => self.named.iter().find(|o| o.name == name),
        }
    }
}

/// Where one request goes: its origin and the path to append to its base.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routed<'a> {
    pub origin: &'a Origin,
    pub path: Cow<'a, str>,
}

/// The first matching rule's origin (a rule naming an origin the table
/// lacks is skipped: configuration refuses it, so it cannot happen), else
/// `default`; `path` is the request's path without its query.
pub fn route<'a>(
    origins: &'a Origins,
    routes: &[OriginRoute],
    method: &str,
    path: &'a str,
) -> Routed<'a> {
    let hit = routes.iter().find_map(|r| {
        let method_ok = r.method.as_deref().is_none_or(|m| m == "*" || m == method);
        (method_ok && pattern::matches(&r.path, path))
            .then(|| {
                origins
                    .get(&r.origin)
                    .map(|o| (o, r.strip_prefix.as_deref()))
            })
            .flatten()
    });
    let Some((origin, strip)) = hit else {
        return Routed {
            origin: &origins.default,
            path: Cow::Borrowed(path),
        };
    };
    Routed {
        origin,
        path: stripped(path, strip),
    }
}

/// `path` without `prefix` at its front, still starting with `/`.
fn stripped<'a>(path: &'a str, prefix: Option<&str>) -> Cow<'a, str> {
    let Some(rest) = prefix.and_then(|p| path.strip_prefix(p.trim_end_matches('/'))) else {
        return Cow::Borrowed(path);
    };
    match rest {
        "" => Cow::Borrowed("/"),
        r if r.starts_with('/') => Cow::Borrowed(r),
        // `/billing` stripped from `/billingx` is not a segment boundary.
        _ => Cow::Borrowed(path),
    }
}

/// The URL a request goes to: the origin's base + the routed path + the query.
pub fn target_url(origin: &Origin, path: &str, query: Option<&str>) -> String {
    let base = origin.base.as_str().trim_end_matches('/');
    match query {
        Some(q) => format!("{base}{path}?{q}"),
        None => format!("{base}{path}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn origin(name: &str, url: &str) -> Origin {
        Origin {
            name: name.into(),
            base: Url::parse(url).unwrap(),
            timeout_ms: 1_000,
        }
    }

    fn table() -> Origins {
        Origins {
            default: origin("default", "https://api.example.com"),
            named: vec![
                origin("billing", "https://billing.internal/v2/"),
                origin("orders", "https://orders.internal"),
            ],
        }
    }

    fn rule(method: Option<&str>, path: &str, origin: &str, strip: Option<&str>) -> OriginRoute {
        OriginRoute {
            method: method.map(str::to_string),
            path: path.into(),
            origin: origin.into(),
            strip_prefix: strip.map(str::to_string),
        }
    }

    #[test]
    fn the_first_matching_rule_wins_and_no_match_is_default() {
        let o = table();
        let routes = [
            rule(Some("POST"), "/billing/refunds", "orders", None),
            rule(None, "/billing/*", "billing", Some("/billing")),
            rule(Some("*"), "/orders*", "orders", None),
        ];
        let r = route(&o, &routes, "POST", "/billing/refunds");
        assert_eq!(
            (r.origin.name.as_str(), &*r.path),
            ("orders", "/billing/refunds")
        );
        let r = route(&o, &routes, "GET", "/billing/refunds");
        assert_eq!((r.origin.name.as_str(), &*r.path), ("billing", "/refunds"));
        let r = route(&o, &routes, "GET", "/orders/7");
        assert_eq!(r.origin.name, "orders");
        let r = route(&o, &routes, "GET", "/users/1");
        assert_eq!((r.origin.name.as_str(), &*r.path), ("default", "/users/1"));
        assert_eq!(
            target_url(r.origin, &r.path, Some("a=1")),
            "https://api.example.com/users/1?a=1"
        );
        let b = route(&o, &routes, "GET", "/billing/x");
        assert_eq!(
            target_url(b.origin, &b.path, None),
            "https://billing.internal/v2/x"
        );
    }

    #[test]
    fn a_prefix_is_stripped_only_at_a_segment_boundary() {
        assert_eq!(stripped("/billing/x", Some("/billing")), "/x");
        assert_eq!(stripped("/billing/x", Some("/billing/")), "/x");
        assert_eq!(stripped("/billing", Some("/billing")), "/");
        assert_eq!(stripped("/billingx", Some("/billing")), "/billingx");
        assert_eq!(stripped("/other", Some("/billing")), "/other");
        assert_eq!(stripped("/x", None), "/x");
    }

    fn segment() -> impl Strategy<Value = String> {
        prop::sample::select(vec!["a", "b", "billing", "orders", "7", "x-y"])
            .prop_map(str::to_string)
    }

    proptest! {
        /// Against a model: the origin is the first rule (in order) whose
        /// method and pattern match, else default; the forwarded path is
        /// always absolute, and is the request's path when nothing is stripped.
        #[test]
        fn routing_is_the_first_match_in_order(
            segs in prop::collection::vec(segment(), 1..4),
            method in prop::sample::select(vec!["GET", "POST", "DELETE"]),
            rules in prop::collection::vec(
                (prop::option::of(prop::sample::select(vec!["GET", "POST", "*"])),
                 prop::collection::vec(segment(), 1..3), any::<bool>(),
                 prop::sample::select(vec!["billing", "orders", "default"]), any::<bool>()),
                0..6),
        ) {
            let path = format!("/{}", segs.join("/"));
            let routes: Vec<OriginRoute> = rules.iter().map(|(m, p, star, o, strip)| {
                let mut pat = format!("/{}", p.join("/"));
                if *star { pat.push('*'); }
                let strip_prefix = strip.then(|| format!("/{}", p[0]));
                OriginRoute { method: m.map(str::to_string), path: pat, origin: o.to_string(), strip_prefix }
            }).collect();
            let o = table();
            let got = route(&o, &routes, method, &path);
            let first = routes.iter().find(|r| {
                r.method.as_deref().is_none_or(|m| m == "*" || m == method) && pattern::matches(&r.path, &path)
            });
            match first {
                None => {
                    prop_assert_eq!(got.origin.name.as_str(), "default");
                    prop_assert_eq!(&*got.path, path.as_str());
                }
                Some(r) => {
                    prop_assert_eq!(&got.origin.name, &r.origin);
                    if r.strip_prefix.is_none() { prop_assert_eq!(&*got.path, path.as_str()); }
                }
            }
            prop_assert!(got.path.starts_with('/'));
            prop_assert!(path.ends_with(&*got.path) || &*got.path == "/");
        }
    }
}
