//! The gateway's own operations under `/_postguard/`: one typed [`Route`] per
//! operation, resolved from a method and a path, and [`OPERATIONS`], the same
//! list as data (for the API document's drift test). The host tests check
//! that the two never disagree.
//!
//! Each route also says who may call it ([`Route::access`]), what it costs a
//! project's budget ([`Route::cost`]) and whether it honours an
//! `Idempotency-Key` ([`Route::idempotent`]): the router authenticates,
//! charges and claims before any handler runs, so a handler cannot forget to.
//! [`canonical`] is the one reading of a request path, for the router and the
//! audit log alike.

use crate::{ErrorCode, Problem};

/// The reserved prefix of every gateway-own path.
pub const PREFIX: &str = "/_postguard/";

/// Who may call an operation: the credential the router checks before the
/// handler runs (docs/operator-api.md, docs/api-reference.md, docs/dashboard-and-portal.md; the API document's security schemes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No credential: the operation checks a token of its own (a portal link
    /// in the body, a capture token in the path) or serves a public document.
    Public,
    /// The operator's `ADMIN_TOKEN`.
    Operator,
    /// The origin's `ORIGIN_TOKEN`.
    Origin,
    /// One project's API key, or a portal session for that project (which
    /// has exactly that key's rights).
    Project,
    /// The operator (every project) or one project's key or session (its own).
    Reader,
    /// One API key (not a session: the operation is about the key's own requests).
    Key,
}

/// Which of a key's budgets a gateway operation is charged to (docs/limits.md,
/// "Costs of the gateway's own endpoints" in docs/security.md): its own gateway policy, so a key that spent its API budget can
/// still read what happened to its requests — or, for `/me` and the
/// idempotency lookup, a cost-0 look at the API's budget they report on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    Api,
    Gateway,
}

/// Every gateway operation: method and path template (`{id}`, `{key}`: one segment).
/// An inspector's capture URL (`POST /_postguard/inspect/{token}`, Route::
/// InspectCapture) is routed but not listed: it is a sink for whatever a
/// sender posts, not an operation of the API document.
pub const OPERATIONS: &[(&str, &str)] = &[
    ("POST", "/_postguard/v1/keys"),
    ("GET", "/_postguard/v1/keys"),
    ("POST", "/_postguard/v1/keys/import"),
    ("GET", "/_postguard/v1/keys/activity"),
    ("GET", "/_postguard/v1/keys/{id}"),
    ("DELETE", "/_postguard/v1/keys/{id}"),
    ("PATCH", "/_postguard/v1/keys/{id}"),
    ("POST", "/_postguard/v1/keys/{id}/reroll"),
    ("GET", "/_postguard/v1/idempotency/{key}"),
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
    ("GET", "/_postguard/v1/usage"),
    ("GET", "/_postguard/v1/me"),
    ("POST", "/_postguard/v1/portal-links"),
    ("POST", "/_postguard/v1/portal-sessions"),
    ("GET", "/_postguard/v1/portal-sessions"),
    ("DELETE", "/_postguard/v1/portal-sessions"),
    ("DELETE", "/_postguard/v1/portal-sessions/{id}"),
    ("GET", "/_postguard/v1/openapi.json"),
    ("GET", "/_postguard/v1/operations"),
    ("GET", "/_postguard/v1/operations/{id}"),
    ("GET", "/_postguard/v1/operations/{id}/result"),
    ("POST", "/_postguard/v1/exports"),
    ("GET", "/_postguard/v1/exports/{id}"),
    ("GET", "/_postguard/v1/exports/{id}/download"),
];

/// One gateway operation, with the path's parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    KeysCreate,
    /// Keys the API already issued (docs/live-api.md).
    KeysImport,
    KeysList,
    /// When each of a project's keys was last used, from its audit roll-ups.
    KeyActivity,
    KeyGet {
        id: String,
    },
    KeyRevoke {
        id: String,
    },
    KeyPatch {
        id: String,
    },
    KeyReroll {
        id: String,
    },
    /// What became of a request under an Idempotency-Key (the key, as the
    /// path segment carried it, percent-encoded).
    IdempotencyLookup {
        key: String,
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
    /// What each key used, retries counted once (docs/live-api.md).
    Usage,
    Me,
    PortalLinksCreate,
    PortalSessionsCreate,
    /// The operator's list of a project's portal sessions.
    PortalSessionsList,
    /// The operator ends every session of a project.
    PortalSessionsEnd,
    /// The operator ends one session.
    PortalSessionEnd {
        id: String,
    },
    OpenApiDocument,
    /// The project's asynchronous operations (docs/async-operations.md).
    OperationsList,
    OperationGet {
        id: String,
    },
    /// The kept answer of a done operation, byte for byte.
    OperationResult {
        id: String,
    },
    /// The operator starts an export of a project's audit rows or delivery
    /// records (live or archived).
    ExportsCreate,
    ExportGet {
        id: String,
    },
    /// The signed download of a finished export (the signature, in the
    /// query, is the credential: never part of the path the audit log keeps).
    ExportDownload {
        id: String,
    },
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
    /// The query parameters this operation reads. Any other is refused with
    /// 400 before its handler runs: one rule for every endpoint, and the API
    /// document's list (a host test compares them). A capture URL takes
    /// whatever its sender adds.
    pub fn query_params(&self) -> Option<&'static [&'static str]> {
        use Route::*;
        Some(match self {
            KeysList | PortalSessionsList => &["project", "limit", "cursor"],
            KeyActivity => &["project", "days"],
            PortalSessionsEnd => &["project", "pause_subscriptions"],
            // `project`: the operator names the project it reads (reader_project).
            WebhooksList => &["project", "limit", "cursor"],
            WebhookGet { .. } | DeliveryGet { .. } => &["project"],
            EventsFeed => &[
                "project", "since", "until", "type", "order", "limit", "cursor",
            ],
            DeliveriesList => &[
                "project",
                "status",
                "event_type",
                "subscription_id",
                "event_id",
                "since",
                "until",
                "limit",
                "cursor",
            ],
            AuditList => &[
                "request_id",
                "method",
                "status",
                "path",
                "idempotency_key",
                "key_prefix",
                "project",
                "since",
                "until",
                "limit",
                "cursor",
                "include_gateway",
            ],
            Stats => &["days", "key_prefix", "project", "include_gateway"],
            Usage => &[
                "since",
                "until",
                "granularity",
                "project",
                "limit",
                "cursor",
            ],
            OperationsList => &["state", "key", "limit", "cursor"],
            ExportDownload { .. } => &["expires", "sig"],
            InspectCapture { .. } => return None,
            _ => &[],
        })
    }

    /// The first query parameter of `names` this operation does not read.
    pub fn unknown_query_param<'a>(
        &self,
        mut names: impl Iterator<Item = &'a str>,
    ) -> Option<&'a str> {
        let known = self.query_params()?;
        names.find(|n| !known.contains(n))
    }

    /// This operation's entry in [`OPERATIONS`].
    pub fn operation(&self) -> (&'static str, &'static str) {
        use Route::*;
        match self {
            KeysCreate => ("POST", "/_postguard/v1/keys"),
            KeysImport => ("POST", "/_postguard/v1/keys/import"),
            KeysList => ("GET", "/_postguard/v1/keys"),
            KeyActivity => ("GET", "/_postguard/v1/keys/activity"),
            KeyGet { .. } => ("GET", "/_postguard/v1/keys/{id}"),
            KeyRevoke { .. } => ("DELETE", "/_postguard/v1/keys/{id}"),
            KeyPatch { .. } => ("PATCH", "/_postguard/v1/keys/{id}"),
            KeyReroll { .. } => ("POST", "/_postguard/v1/keys/{id}/reroll"),
            IdempotencyLookup { .. } => ("GET", "/_postguard/v1/idempotency/{key}"),
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
            Usage => ("GET", "/_postguard/v1/usage"),
            Me => ("GET", "/_postguard/v1/me"),
            PortalLinksCreate => ("POST", "/_postguard/v1/portal-links"),
            PortalSessionsCreate => ("POST", "/_postguard/v1/portal-sessions"),
            PortalSessionsList => ("GET", "/_postguard/v1/portal-sessions"),
            PortalSessionsEnd => ("DELETE", "/_postguard/v1/portal-sessions"),
            PortalSessionEnd { .. } => ("DELETE", "/_postguard/v1/portal-sessions/{id}"),
            OpenApiDocument => ("GET", "/_postguard/v1/openapi.json"),
            OperationsList => ("GET", "/_postguard/v1/operations"),
            OperationGet { .. } => ("GET", "/_postguard/v1/operations/{id}"),
            OperationResult { .. } => ("GET", "/_postguard/v1/operations/{id}/result"),
            ExportsCreate => ("POST", "/_postguard/v1/exports"),
            ExportGet { .. } => ("GET", "/_postguard/v1/exports/{id}"),
            ExportDownload { .. } => ("GET", "/_postguard/v1/exports/{id}/download"),
        }
    }

    /// The credential this operation needs.
    pub fn access(&self) -> Access {
        use Route::*;
        match self {
            KeysCreate
            | KeysImport
            | KeysList
            | KeyActivity
            | KeyGet { .. }
            | KeyRevoke { .. }
            | KeyPatch { .. }
            | KeyReroll { .. } => Access::Operator,
            PortalLinksCreate
            | PortalSessionsList
            | PortalSessionsEnd
            | PortalSessionEnd { .. } => Access::Operator,
            ExportsCreate | ExportGet { .. } => Access::Operator,
            // The signed URL is the credential.
            ExportDownload { .. } => Access::Public,
            EventsPublish => Access::Origin,
            AuditList | Stats | Usage => Access::Reader,
            // What a project's webhooks did, read by the project or the
            // operator (`?project=`); changing them stays the project's.
            WebhooksList | WebhookGet { .. } | DeliveriesList | DeliveryGet { .. } | EventsFeed => {
                Access::Reader
            }
            InspectCapture { .. } | PortalSessionsCreate | OpenApiDocument => Access::Public,
            WebhooksCreate
            | WebhookDelete { .. }
            | WebhookRotateSecret { .. }
            | WebhookPatch { .. }
            | WebhookPause { .. }
            | WebhookResume { .. }
            | WebhookTest { .. }
            | WebhookRecover { .. }
            | TaskGet { .. }
            | InspectorsCreate
            | InspectorRequests { .. }
            | DeliveryRetry { .. }
            | DeliveryRedirect { .. }
            | OperationsList
            | OperationGet { .. }
            | OperationResult { .. }
            | Me => Access::Project,
            // A key asks about its own requests (a session has none).
            IdempotencyLookup { .. } => Access::Key,
        }
    }

    /// What one call costs a project's API key or portal session in its
    /// rate-limit budget (the operator and the origin are never charged):
    /// the operations that make the gateway work for the caller — reading
    /// audit shards, sending a ping, re-sending a range of deliveries.
    /// Every other operation costs 0 (its object call only confirms the key
    /// is live). docs/security.md "Costs of the gateway's own endpoints".
    pub fn cost(&self, costs: &crate::config::RateLimitConfig) -> u32 {
        match self {
            Route::AuditList => costs.audit_cost,
            Route::Stats | Route::Usage => costs.stats_cost,
            Route::WebhookTest { .. } => costs.test_cost,
            Route::WebhookRecover { .. } => costs.recover_cost,
            _ => 0,
        }
    }

    /// The budget a key or a session pays this operation from.
    pub fn budget(&self) -> Budget {
        match self {
            Route::Me | Route::IdempotencyLookup { .. } => Budget::Api,
            _ => Budget::Gateway,
        }
    }

    /// Whether the operation honours an `Idempotency-Key` (docs/idempotency.md):
    /// every mutating one but publishing (whose event `id` is its natural
    /// key), the portal link exchange (single use by itself) and a capture
    /// URL (a sink for whatever a sender posts, not the API).
    pub fn idempotent(&self) -> bool {
        let (method, _) = self.operation();
        method != "GET"
            && !matches!(
                self,
                Route::EventsPublish | Route::PortalSessionsCreate | Route::InspectCapture { .. }
            )
    }

    /// Whether the router reads a request body for this operation (bounded,
    /// after authentication) and hands it to the handler.
    pub fn has_body(&self) -> bool {
        matches!(self.operation().0, "POST" | "PATCH" | "PUT")
    }
}

/// The operation `method path` names. `method` is compared upper-cased;
/// trailing slashes are ignored; `{id}` is any one segment.
pub fn resolve(method: &str, path: &str) -> Result<Route, RouteError> {
    use Route::*;
    let method = method.to_ascii_uppercase();
    // The prefix is stripped once: `/_postguard//_postguard/x` is not `/_postguard/x`.
    let segments: Vec<&str> = path
        .strip_prefix(PREFIX)
        .unwrap_or(path)
        .trim_end_matches('/')
        .split('/')
        .collect();
    let id = |s: &str| s.to_string();
    // Each path: its `Allow` value and its operations by method.
    let (allow, operations): (&'static str, Vec<(&str, Route)>) = match segments.as_slice() {
        ["v1", "keys"] => ("GET, POST", vec![("POST", KeysCreate), ("GET", KeysList)]),
        ["v1", "keys", "import"] => ("POST", vec![("POST", KeysImport)]),
        // A key id is `key_…`: this segment never names one.
        ["v1", "keys", "activity"] => ("GET", vec![("GET", KeyActivity)]),
        ["v1", "keys", k] => (
            "GET, DELETE, PATCH",
            vec![
                ("GET", KeyGet { id: id(k) }),
                ("DELETE", KeyRevoke { id: id(k) }),
                ("PATCH", KeyPatch { id: id(k) }),
            ],
        ),
        ["v1", "keys", k, "reroll"] => ("POST", vec![("POST", KeyReroll { id: id(k) })]),
        ["v1", "idempotency", k] => ("GET", vec![("GET", IdempotencyLookup { key: id(k) })]),
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
        ["v1", "usage"] => ("GET", vec![("GET", Usage)]),
        ["v1", "me"] => ("GET", vec![("GET", Me)]),
        ["v1", "portal-links"] => ("POST", vec![("POST", PortalLinksCreate)]),
        ["v1", "portal-sessions"] => (
            "GET, POST, DELETE",
            vec![
                ("POST", PortalSessionsCreate),
                ("GET", PortalSessionsList),
                ("DELETE", PortalSessionsEnd),
            ],
        ),
        ["v1", "portal-sessions", s] => {
            ("DELETE", vec![("DELETE", PortalSessionEnd { id: id(s) })])
        }
        ["v1", "openapi.json"] => ("GET", vec![("GET", OpenApiDocument)]),
        ["v1", "operations"] => ("GET", vec![("GET", OperationsList)]),
        ["v1", "operations", o] => ("GET", vec![("GET", OperationGet { id: id(o) })]),
        ["v1", "operations", o, "result"] => ("GET", vec![("GET", OperationResult { id: id(o) })]),
        ["v1", "exports"] => ("POST", vec![("POST", ExportsCreate)]),
        ["v1", "exports", e] => ("GET", vec![("GET", ExportGet { id: id(e) })]),
        ["v1", "exports", e, "download"] => ("GET", vec![("GET", ExportDownload { id: id(e) })]),
        _ => return Err(RouteError::NotFound),
    };
    let route = operations
        .into_iter()
        .find(|(m, _)| *m == method)
        .map(|(_, r)| r);
    route.ok_or(RouteError::MethodNotAllowed { allow })
}

/// A request path as the gateway reads it: empty segments (`//`) and `.`
/// segments dropped, so each gateway path has one spelling for the router
/// and the audit log. A proxied path is still forwarded as the client sent
/// it; only [`Canonical::gateway`] is read from this form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Canonical {
    pub path: String,
    /// Under the reserved prefix: the gateway answers it.
    pub gateway: bool,
}

/// The one reading of a request path (see [`Canonical`]).
pub fn canonical(path: &str) -> Canonical {
    let mut out = String::with_capacity(path.len());
    for segment in path.split('/').filter(|s| !s.is_empty() && *s != ".") {
        out.push('/');
        out.push_str(segment);
    }
    if out.is_empty() || path.ends_with('/') {
        out.push('/');
    }
    // The reserved prefix in any spelling (`/_postguard%2F…`) is the
    // gateway's: such a path is answered (404) and audited here, never
    // forwarded. Routing reads the path undecoded, so only the plain
    // spelling of an operation resolves.
    let decoded = percent_encoding::percent_decode_str(&out).decode_utf8_lossy();
    let gateway = decoded.starts_with(PREFIX) || decoded == PREFIX.trim_end_matches('/');
    Canonical { path: out, gateway }
}

/// What the audit log records of a gateway path: a capture token is a
/// credential, so a path that names an inspector's capture URL in any
/// spelling (encoded slashes, other cases, extra segments) is recorded as
/// the template. (A proxied path is recorded as the origin received it.)
pub fn audited_path(c: &Canonical) -> std::borrow::Cow<'_, str> {
    const CAPTURE: &str = "/_postguard/inspect/{token}";
    if !c.gateway {
        return c.path.as_str().into();
    }
    let decoded = percent_encoding::percent_decode_str(&c.path).decode_utf8_lossy();
    match decoded
        .split('/')
        .any(|s| s.trim().eq_ignore_ascii_case("inspect"))
    {
        true => CAPTURE.into(),
        false => c.path.as_str().into(),
    }
}

/// The project a read of an [`Access::Reader`] operation is about: a key's
/// or a session's own (which may not name another: `project` is then an
/// unknown parameter, as in `/audit`), or the one the operator names with
/// `project=` — required where the records live in a project's shards
/// (webhooks, deliveries, events).
pub fn reader_project(own: Option<&str>, asked: Option<&str>) -> Result<String, crate::Invalid> {
    match (own, asked) {
        (Some(own), None) => Ok(own.to_string()),
        (Some(_), Some(_)) => Err(crate::Invalid::field(
            "project",
            "unknown parameter (an API key or portal session reads its own project)",
        )),
        (None, Some(p)) if crate::ids::is_valid_name(p) => Ok(p.to_string()),
        (None, Some(_)) => Err(crate::Invalid::field(
            "project",
            "must be 1-64 characters of [A-Za-z0-9._-]",
        )),
        (None, None) => Err(crate::Invalid::field(
            "project",
            "required with the operator token: webhooks, deliveries and events belong to a project",
        )),
    }
}

/// Whether an audit row's stored path is a call of the gateway itself
/// (its own API, the dashboard's calls to it, 404s under the prefix) rather
/// than a request proxied to the origin: the path the row keeps
/// ([`audited_path`]) is the reserved prefix, or starts with it followed by
/// `/` or a percent-encoded character (`/_postguard%2F…`). The
/// dashboard's "include gateway calls" filter (`include_gateway=false` on
/// `/audit` and `/stats`) is this test, and [`GATEWAY_PATH_SQL`] is the
/// same test in SQL (a host test holds the two together).
pub fn is_gateway_path(stored: &str) -> bool {
    let prefix = PREFIX.trim_end_matches('/');
    match stored.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/') || rest.starts_with('%'),
        None => false,
    }
}

/// [`is_gateway_path`] as an SQL condition on a `path` column (SQLite's
/// `GLOB` is case-sensitive and treats `_` literally, as paths are compared).
pub const GATEWAY_PATH_SQL: &str =
    "(path = '/_postguard' OR path GLOB '/_postguard/*' OR path GLOB '/_postguard%*')";

/// The route pattern of a gateway path (`/_postguard/v1/idempotency/{key}`
/// for every lookup), for statistics that count endpoints rather than
/// URLs; `None` for a path that names no operation (a 404 under the prefix
/// keeps its own path) or is not the gateway's.
pub fn template_of(stored: &str) -> Option<&'static str> {
    if !is_gateway_path(stored) {
        return None;
    }
    // The method is not part of a roll-up: a path's operations share one template.
    ["GET", "POST", "PATCH", "DELETE"]
        .iter()
        .find_map(|m| resolve(m, stored).ok())
        .map(|r| r.operation().1)
}

#[cfg(test)]
mod tests;
