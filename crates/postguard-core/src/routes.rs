//! The gateway's own operations under `/_postguard/`: one typed [`Route`] per
//! operation, resolved from a method and a path, and [`OPERATIONS`], the same
//! list as data (for the API document's drift test). The host tests check
//! that the two never disagree.

use crate::{ErrorCode, Problem};

/// The reserved prefix of every gateway-own path.
pub const PREFIX: &str = "/_postguard/";

/// Every gateway operation: method and path template (`{id}` is one segment).
/// An inspector's capture URL (`POST /_postguard/inspect/{token}`, Route::
/// InspectCapture) is routed but not listed: it is a sink for whatever a
/// sender posts, not an operation of the API document.
pub const OPERATIONS: &[(&str, &str)] = &[
    ("POST", "/_postguard/v1/keys"),
    ("GET", "/_postguard/v1/keys"),
    ("GET", "/_postguard/v1/keys/{id}"),
    ("DELETE", "/_postguard/v1/keys/{id}"),
    ("POST", "/_postguard/v1/webhooks"),
    ("GET", "/_postguard/v1/webhooks"),
    ("GET", "/_postguard/v1/webhooks/{id}"),
    ("DELETE", "/_postguard/v1/webhooks/{id}"),
    ("PATCH", "/_postguard/v1/webhooks/{id}"),
    ("POST", "/_postguard/v1/webhooks/{id}/rotate-secret"),
    ("POST", "/_postguard/v1/webhooks/{id}/pause"),
    ("POST", "/_postguard/v1/webhooks/{id}/resume"),
    ("POST", "/_postguard/v1/webhooks/{id}/test"),
    ("POST", "/_postguard/v1/webhooks/{id}/recover"),
    ("GET", "/_postguard/v1/tasks/{id}"),
    ("POST", "/_postguard/v1/events"),
    ("GET", "/_postguard/v1/events"),
    ("POST", "/_postguard/v1/inspectors"),
    ("GET", "/_postguard/v1/inspectors/{id}/requests"),
    ("GET", "/_postguard/v1/deliveries"),
    ("GET", "/_postguard/v1/deliveries/{id}"),
    ("POST", "/_postguard/v1/deliveries/{id}/retry"),
    ("POST", "/_postguard/v1/deliveries/{id}/redirect"),
    ("GET", "/_postguard/v1/audit"),
    ("GET", "/_postguard/v1/stats"),
    ("GET", "/_postguard/v1/me"),
    ("POST", "/_postguard/v1/portal-links"),
    ("POST", "/_postguard/v1/portal-sessions"),
    ("GET", "/_postguard/v1/openapi.json"),
];

/// One gateway operation, with the path's parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    KeysCreate,
    KeysList,
    KeyGet {
        id: String,
    },
    KeyRevoke {
        id: String,
    },
    WebhooksCreate,
    WebhooksList,
    WebhookGet {
        id: String,
    },
    WebhookDelete {
        id: String,
    },
    WebhookRotateSecret {
        id: String,
    },
    WebhookPatch {
        id: String,
    },
    WebhookPause {
        id: String,
    },
    WebhookResume {
        id: String,
    },
    WebhookTest {
        id: String,
    },
    WebhookRecover {
        id: String,
    },
    TaskGet {
        id: String,
    },
    EventsPublish,
    EventsFeed,
    InspectorsCreate,
    InspectorRequests {
        id: String,
    },
    /// The capture URL of an inspector (no API key: the token is the secret).
    /// Not in [`OPERATIONS`] (see there).
    InspectCapture {
        token: String,
    },
    DeliveriesList,
    DeliveryGet {
        id: String,
    },
    DeliveryRetry {
        id: String,
    },
    DeliveryRedirect {
        id: String,
    },
    AuditList,
    Stats,
    Me,
    PortalLinksCreate,
    PortalSessionsCreate,
    OpenApiDocument,
}

/// Why a path under the prefix is not an operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("no gateway resource at this path")]
    NotFound,
    /// The path exists; `allow` lists its methods (the `Allow` header).
    #[error("method not allowed; allowed: {allow}")]
    MethodNotAllowed { allow: &'static str },
}

impl RouteError {
    /// The problem answered for `method path`; the path is echoed bounded.
    pub fn problem(&self, method: &str, path: &str) -> Problem {
        match self {
            RouteError::NotFound => {
                let shown: String = path.chars().take(200).collect();
                Problem::new(
                    ErrorCode::NotFound,
                    format!("no gateway resource at {shown}"),
                )
            }
            RouteError::MethodNotAllowed { allow } => Problem::new(
                ErrorCode::MethodNotAllowed,
                format!("{method} is not allowed here"),
            )
            .with_allow(allow),
        }
    }
}

impl Route {
    /// This operation's entry in [`OPERATIONS`].
    pub fn operation(&self) -> (&'static str, &'static str) {
        use Route::*;
        match self {
            KeysCreate => ("POST", "/_postguard/v1/keys"),
            KeysList => ("GET", "/_postguard/v1/keys"),
            KeyGet { .. } => ("GET", "/_postguard/v1/keys/{id}"),
            KeyRevoke { .. } => ("DELETE", "/_postguard/v1/keys/{id}"),
            WebhooksCreate => ("POST", "/_postguard/v1/webhooks"),
            WebhooksList => ("GET", "/_postguard/v1/webhooks"),
            WebhookGet { .. } => ("GET", "/_postguard/v1/webhooks/{id}"),
            WebhookDelete { .. } => ("DELETE", "/_postguard/v1/webhooks/{id}"),
            WebhookRotateSecret { .. } => ("POST", "/_postguard/v1/webhooks/{id}/rotate-secret"),
            WebhookPatch { .. } => ("PATCH", "/_postguard/v1/webhooks/{id}"),
            WebhookPause { .. } => ("POST", "/_postguard/v1/webhooks/{id}/pause"),
            WebhookResume { .. } => ("POST", "/_postguard/v1/webhooks/{id}/resume"),
            WebhookTest { .. } => ("POST", "/_postguard/v1/webhooks/{id}/test"),
            WebhookRecover { .. } => ("POST", "/_postguard/v1/webhooks/{id}/recover"),
            TaskGet { .. } => ("GET", "/_postguard/v1/tasks/{id}"),
            EventsPublish => ("POST", "/_postguard/v1/events"),
            EventsFeed => ("GET", "/_postguard/v1/events"),
            InspectorsCreate => ("POST", "/_postguard/v1/inspectors"),
            InspectorRequests { .. } => ("GET", "/_postguard/v1/inspectors/{id}/requests"),
            InspectCapture { .. } => ("POST", "/_postguard/inspect/{id}"),
            DeliveriesList => ("GET", "/_postguard/v1/deliveries"),
            DeliveryGet { .. } => ("GET", "/_postguard/v1/deliveries/{id}"),
            DeliveryRetry { .. } => ("POST", "/_postguard/v1/deliveries/{id}/retry"),
            DeliveryRedirect { .. } => ("POST", "/_postguard/v1/deliveries/{id}/redirect"),
            AuditList => ("GET", "/_postguard/v1/audit"),
            Stats => ("GET", "/_postguard/v1/stats"),
            Me => ("GET", "/_postguard/v1/me"),
            PortalLinksCreate => ("POST", "/_postguard/v1/portal-links"),
            PortalSessionsCreate => ("POST", "/_postguard/v1/portal-sessions"),
            OpenApiDocument => ("GET", "/_postguard/v1/openapi.json"),
        }
    }
}

/// The operation `method path` names. `method` is compared upper-cased;
/// trailing slashes are ignored; `{id}` is any one segment.
pub fn resolve(method: &str, path: &str) -> Result<Route, RouteError> {
    use Route::*;
    let method = method.to_ascii_uppercase();
    let segments: Vec<&str> = path
        .trim_start_matches(PREFIX)
        .trim_end_matches('/')
        .split('/')
        .collect();
    let id = |s: &str| s.to_string();
    // Each path: its `Allow` value and its operations by method.
    let (allow, operations): (&'static str, Vec<(&str, Route)>) = match segments.as_slice() {
        ["v1", "keys"] => ("GET, POST", vec![("POST", KeysCreate), ("GET", KeysList)]),
        ["v1", "keys", k] => (
            "GET, DELETE",
            vec![
                ("GET", KeyGet { id: id(k) }),
                ("DELETE", KeyRevoke { id: id(k) }),
            ],
        ),
        ["v1", "webhooks"] => (
            "GET, POST",
            vec![("POST", WebhooksCreate), ("GET", WebhooksList)],
        ),
        ["v1", "webhooks", w] => (
            "GET, DELETE, PATCH",
            vec![
                ("GET", WebhookGet { id: id(w) }),
                ("DELETE", WebhookDelete { id: id(w) }),
                ("PATCH", WebhookPatch { id: id(w) }),
            ],
        ),
        ["v1", "webhooks", w, action @ ("pause" | "resume" | "test" | "recover")] => {
            let id = id(w);
            let route = match *action {
                "pause" => WebhookPause { id },
                "resume" => WebhookResume { id },
                "test" => WebhookTest { id },
                _ => WebhookRecover { id },
            };
            ("POST", vec![("POST", route)])
        }
        ["v1", "tasks", t] => ("GET", vec![("GET", TaskGet { id: id(t) })]),
        ["v1", "inspectors"] => ("POST", vec![("POST", InspectorsCreate)]),
        ["v1", "inspectors", i, "requests"] => {
            ("GET", vec![("GET", InspectorRequests { id: id(i) })])
        }
        ["inspect", t] => ("POST", vec![("POST", InspectCapture { token: id(t) })]),
        ["v1", "webhooks", w, "rotate-secret"] => {
            ("POST", vec![("POST", WebhookRotateSecret { id: id(w) })])
        }
        ["v1", "events"] => (
            "GET, POST",
            vec![("POST", EventsPublish), ("GET", EventsFeed)],
        ),
        ["v1", "deliveries"] => ("GET", vec![("GET", DeliveriesList)]),
        ["v1", "deliveries", d] => ("GET", vec![("GET", DeliveryGet { id: id(d) })]),
        ["v1", "deliveries", d, "retry"] => ("POST", vec![("POST", DeliveryRetry { id: id(d) })]),
        ["v1", "deliveries", d, "redirect"] => {
            ("POST", vec![("POST", DeliveryRedirect { id: id(d) })])
        }
        ["v1", "audit"] => ("GET", vec![("GET", AuditList)]),
        ["v1", "stats"] => ("GET", vec![("GET", Stats)]),
        ["v1", "me"] => ("GET", vec![("GET", Me)]),
        ["v1", "portal-links"] => ("POST", vec![("POST", PortalLinksCreate)]),
        ["v1", "portal-sessions"] => ("POST", vec![("POST", PortalSessionsCreate)]),
        ["v1", "openapi.json"] => ("GET", vec![("GET", OpenApiDocument)]),
        _ => return Err(RouteError::NotFound),
    };
    let route = operations
        .into_iter()
        .find(|(m, _)| *m == method)
        .map(|(_, r)| r);
    route.ok_or(RouteError::MethodNotAllowed { allow })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn concrete(template: &str) -> String {
        template.replace("{id}", "abc_01")
    }

    #[test]
    fn every_operation_resolves_to_itself() {
        for (method, template) in OPERATIONS {
            let route = resolve(method, &concrete(template))
                .unwrap_or_else(|e| panic!("{method} {template}: {e}"));
            assert_eq!(route.operation(), (*method, *template));
        }
    }

    #[test]
    fn operations_are_distinct_and_ids_are_captured() {
        let mut seen = std::collections::HashSet::new();
        for op in OPERATIONS {
            assert!(seen.insert(op), "{op:?} listed twice");
        }
        assert_eq!(
            resolve("get", "/_postguard/v1/keys/key_1/"),
            Ok(Route::KeyGet { id: "key_1".into() })
        );
    }

    #[test]
    fn allow_lists_exactly_the_operations_of_the_path() {
        for (_, template) in OPERATIONS {
            let path = concrete(template);
            let Err(RouteError::MethodNotAllowed { allow }) = resolve("PUT", &path) else {
                panic!("PUT {template} should be 405");
            };
            let mut listed: Vec<&str> = allow.split(", ").collect();
            let mut expected: Vec<&str> = OPERATIONS
                .iter()
                .filter(|(_, t)| t == template)
                .map(|(m, _)| *m)
                .collect();
            listed.sort_unstable();
            expected.sort_unstable();
            assert_eq!(listed, expected, "{template}");
        }
    }

    #[test]
    fn unknown_paths_are_not_found() {
        for p in [
            "/_postguard/",
            "/_postguard/v2/keys",
            "/_postguard/v1/keys/a/b",
            "/_postguard/v1/keys//x",
            "/_postguard/v1/nope",
        ] {
            assert_eq!(resolve("GET", p), Err(RouteError::NotFound), "{p}");
        }
        let p = RouteError::NotFound.problem("GET", "/_postguard/x");
        assert_eq!(p.code, ErrorCode::NotFound);
        let p = RouteError::MethodNotAllowed { allow: "GET" }.problem("PUT", "/x");
        assert_eq!((p.status(), p.allow), (405, Some("GET")));
    }
}
