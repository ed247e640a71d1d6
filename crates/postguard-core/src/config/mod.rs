//! Configuration: `ORIGIN_URL`, the `ADMIN_TOKEN`/`ORIGIN_TOKEN` secrets and the
//! `POSTGUARD_CONFIG` JSON string, parsed and validated into typed values.
//!
//! Every problem is reported as a [`ConfigError`] naming the offending leaf
//! field (`plans.trial.window_s`, `ORIGIN_URL`, …); nothing falls back to a
//! silent default.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use url::Url;

use crate::idempotency::Mode;
use crate::ids::is_valid_name;
use crate::pattern;
pub use crate::response_events::ResponseEventRule;

/// Entries by name (`plans`, `idempotency.methods`): a JSON object read like a
/// `BTreeMap<String, T>` (sorted by name, the last of a repeated name wins, the
/// same error texts), kept as a sorted list. Each `BTreeMap` type is its own
/// copy of the B-tree code in the wasm; these few entries need none (ADR 0026).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named<T>(Vec<(String, T)>);

impl<T> Named<T> {
    pub fn get(&self, name: &str) -> Option<&T> {
        self.find(name).ok().map(|i| &self.0[i].1)
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.find(name).is_ok()
    }

    /// Adds or replaces the entry `name`.
    pub fn insert(&mut self, name: String, value: T) {
        match self.find(&name) {
            Ok(i) => self.0[i].1 = value,
            Err(i) => self.0.insert(i, (name, value)),
        }
    }

    /// Names in ascending order.
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.0.iter().map(|(_, v)| v)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn find(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_str().cmp(name))
    }
}

impl<T> FromIterator<(String, T)> for Named<T> {
    fn from_iter<I: IntoIterator<Item = (String, T)>>(entries: I) -> Self {
        let mut out = Named(Vec::new());
        for (k, v) in entries {
            out.insert(k, v);
        }
        out
    }
}

impl<'a, T> IntoIterator for &'a Named<T> {
    type Item = (&'a String, &'a T);
    type IntoIter =
        std::iter::Map<std::slice::Iter<'a, (String, T)>, fn(&'a (String, T)) -> Self::Item>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

/// Like `BTreeMap`'s `Index`: panics on a missing name (tests only use it).
impl<T> std::ops::Index<&str> for Named<T> {
    type Output = T;

    fn index(&self, name: &str) -> &T {
        let i = self.find(name).unwrap_or(usize::MAX);
        &self.0[i].1
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Named<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entries<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Entries<T> {
            type Value = Named<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Named<T>, A::Error> {
                let mut out = Named(Vec::new());
                while let Some((k, v)) = map.next_entry()? {
                    out.insert(k, v);
                }
                Ok(out)
            }
        }
        d.deserialize_map(Entries(PhantomData))
    }
}

/// A configuration value that failed validation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ConfigError {
    /// The offending field: an environment name or a dotted JSON path.
    pub field: String,
    pub reason: String,
}

impl ConfigError {
    fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// The raw inputs, as the runtime hands them over (all strings, all optional).
#[derive(Debug, Default, Clone, PartialEq, Eq, Hash)]
pub struct RawEnv {
    pub origin_url: Option<String>,
    pub admin_token: Option<String>,
    pub origin_token: Option<String>,
    /// Signs every request forwarded to the origin (`X-Postguard-Signature`).
    pub origin_signing_secret: Option<String>,
    pub postguard_config: Option<String>,
}

/// A plan as written (docs/configuration.md, docs/limits.md): the single-policy form
/// (`requests_per_window` per `window_s`) or several named `policies`, an
/// optional `concurrency` (requests of a key in flight at the origin), the
/// gateway endpoints' own `gateway` policy and how long idempotency records
/// live. The same shape, every field optional, is a key's `overrides`
/// ([`Plan::overlaid`]). `validate` checks it; [`Plan::limits`] resolves it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_window: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_s: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policies: Option<Vec<PolicySpec>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<GatewaySpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_ttl_s: Option<u32>,
}

/// One named policy of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    pub name: String,
    pub requests: u32,
    pub window_s: u32,
}

/// The gateway endpoints' policy of a plan: what `/audit`, `/stats`, a test
/// ping or a recover cost is charged to, apart from the API's policies, so a
/// key that spent its API budget can still find out what happened.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GatewaySpec {
    pub requests: u32,
    #[serde(default = "default_window_s")]
    pub window_s: u32,
}

/// The gateway policy of a plan that names none: 120 per minute.
pub const DEFAULT_GATEWAY: GatewaySpec = GatewaySpec {
    requests: 120,
    window_s: 60,
};

impl Plan {
    /// The single-policy form.
    pub fn single(requests_per_window: u32, window_s: u32) -> Plan {
        Plan {
            requests_per_window: Some(requests_per_window),
            window_s: Some(window_s),
            ..Plan::default()
        }
    }

    /// The API's limits: the named policies, or the single-policy form's
    /// `"default"` (the window defaults to 60 s), and the concurrency quota.
    pub fn limits(&self) -> crate::limits::Limits {
        use crate::limits::{Limits, Policy, DEFAULT_POLICY};
        let policies = match &self.policies {
            Some(list) => list
                .iter()
                .map(|p| Policy {
                    name: p.name.clone(),
                    limit: p.requests,
                    window_ms: u64::from(p.window_s) * 1000,
                })
                .collect(),
            None => vec![Policy {
                name: DEFAULT_POLICY.to_string(),
                limit: self.requests_per_window.unwrap_or(0),
                window_ms: u64::from(self.window_s.unwrap_or(default_window_s())) * 1000,
            }],
        };
        Limits {
            policies,
            concurrency: self.concurrency,
        }
    }

    /// The gateway endpoints' limits: the one `gateway` policy.
    pub fn gateway_limits(&self) -> crate::limits::Limits {
        let g = self.gateway.as_ref().unwrap_or(&DEFAULT_GATEWAY);
        crate::limits::Limits {
            policies: vec![crate::limits::Policy {
                name: crate::limits::GATEWAY_POLICY.to_string(),
                limit: g.requests,
                window_ms: u64::from(g.window_s) * 1000,
            }],
            concurrency: None,
        }
    }

    /// How long a stored response is replayed (s).
    pub fn ttl_s(&self) -> u32 {
        self.idempotency_ttl_s.unwrap_or(default_ttl_s())
    }

    /// The smallest quota of its API policies (what a route cost must fit).
    pub fn smallest_quota(&self) -> u32 {
        self.limits()
            .policies
            .iter()
            .map(|p| p.limit)
            .min()
            .unwrap_or(0)
    }

    /// This plan with a key's `overrides` laid over it: each field given
    /// replaces the plan's, and either form of the API's policies replaces
    /// the other (`{"requests_per_window": 7}` over a plan of `policies`
    /// leaves one policy).
    pub fn overlaid(&self, o: &Plan) -> Plan {
        let mut out = self.clone();
        if o.policies.is_some() {
            out.requests_per_window = None;
            out.window_s = None;
            out.policies.clone_from(&o.policies);
        }
        if o.requests_per_window.is_some() || o.window_s.is_some() {
            if out.policies.is_some() && o.policies.is_none() {
                out.policies = None;
            }
            out.requests_per_window = o.requests_per_window.or(out.requests_per_window);
            out.window_s = o.window_s.or(out.window_s);
        }
        out.concurrency = o.concurrency.or(out.concurrency);
        out.gateway = o.gateway.clone().or(out.gateway);
        out.idempotency_ttl_s = o.idempotency_ttl_s.or(out.idempotency_ttl_s);
        out
    }
}

fn default_window_s() -> u32 {
    60
}
fn default_ttl_s() -> u32 {
    86_400
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostRule {
    pub method: String,
    pub path: String,
    pub cost: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitConfig {
    pub costs: Vec<CostRule>,
    /// What one `GET /_postguard/v1/audit` by an API key costs in its budget.
    pub audit_cost: u32,
    /// What one `GET /_postguard/v1/stats` by an API key costs in its budget.
    pub stats_cost: u32,
    /// What one `POST /webhooks/{id}/test` (a signed ping sent at once) costs.
    pub test_cost: u32,
    /// What one `POST /webhooks/{id}/recover` (a task re-sending a range of
    /// deliveries) costs.
    pub recover_cost: u32,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig {
            costs: Vec::new(),
            audit_cost: 1,
            stats_cost: 1,
            test_cost: 1,
            recover_cost: 5,
        }
    }
}

/// Limits on requests that carry no valid credential (docs/limits.md).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Requests per client IP and minute that carry no valid credential —
    /// 401s, CORS preflights, unknown capture URLs — before 429.
    pub unauthenticated_per_minute: u32,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            unauthenticated_per_minute: 120,
        }
    }
}

impl LimitsConfig {
    /// The per-IP limiter's quota.
    pub fn unauthenticated_quota(&self) -> crate::rate_limit::Quota {
        crate::rate_limit::Quota {
            limit: self.unauthenticated_per_minute,
            window_ms: 60_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteRule {
    pub method: String,
    pub path: String,
    pub mode: Mode,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdempotencyConfig {
    pub methods: Named<Mode>,
    pub routes: Vec<RouteRule>,
    pub lease_s: u32,
    pub max_stored_body_bytes: u64,
    /// Largest response replayed byte for byte (bodies over
    /// `max_stored_body_bytes` are kept in R2, streamed, never held whole).
    pub max_replay_bytes: u64,
    /// Whether `Set-Cookie` from the origin is stored and replayed.
    pub store_set_cookie: bool,
    /// How long an expired record is kept so `GET /idempotency/{key}` can
    /// answer `expired` (never replayed; 0 deletes records at expiry).
    pub lookup_grace_s: u32,
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        let methods = [
            ("POST", Mode::Required),
            ("PATCH", Mode::Optional),
            ("PUT", Mode::Optional),
            ("DELETE", Mode::Optional),
        ]
        .into_iter()
        .map(|(m, mode)| (m.to_string(), mode))
        .collect();
        IdempotencyConfig {
            methods,
            routes: Vec::new(),
            lease_s: 60,
            max_stored_body_bytes: 1 << 20,
            max_replay_bytes: DEFAULT_REPLAY_BYTES,
            store_set_cookie: false,
            lookup_grace_s: 3_600,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OriginConfig {
    pub timeout_ms: u32,
}

impl Default for OriginConfig {
    fn default() -> Self {
        OriginConfig { timeout_ms: 30_000 }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhooksConfig {
    pub schedule_s: Vec<u32>,
    pub timeout_ms: u32,
    pub max_payload_bytes: u32,
    pub allow_insecure_urls: bool,
    pub allow_hosts: Vec<String>,
    /// After `rotate-secret`, how long the old secret keeps signing (s).
    pub secret_overlap_s: u32,
    /// The daily job re-queues a delivery whose next attempt is this
    /// overdue (s): its message was lost (or never enqueued).
    pub requeue_after_s: u32,
    /// The every-minute sweep enqueues a published delivery whose first
    /// attempt is still unsent after this long (s): its publish's queue
    /// send failed and the origin did not retry.
    pub outbox_after_s: u32,
    /// A subscription whose every attempt failed for this long is disabled (s).
    pub disable_after_s: u32,
    /// Subscriptions one project may hold (the fan-out of one event).
    pub max_subscriptions_per_project: u32,
    /// What revoking an API key does to the subscriptions it created.
    pub on_key_revoked: OnKeyRevoked,
    /// Events one project may publish per UTC day (429 `EVENT_QUOTA_EXCEEDED`
    /// beyond; ADR 0017).
    pub events_per_project_per_day: u32,
    /// Deliveries one project's events may fan out to per UTC day.
    pub deliveries_per_project_per_day: u32,
    /// Bytes one project's webhook records may take in D1 per UTC day, as
    /// charged by `webhooks::capacity::event_bytes`: with the retention and
    /// the high-water mark, this is the capacity proof (docs/capacity.md).
    pub bytes_per_project_per_day: u64,
    /// Manual retries and redirects per delivery (409 `RETRY_LIMIT_REACHED`
    /// beyond), on top of the automatic schedule.
    pub manual_attempts_per_delivery: u32,
    /// D1's size (bytes) at which publishing is refused with 503
    /// `STORAGE_FULL` until retention frees space. D1 holds at most 10 GB;
    /// it keeps the shard directory and the subscriptions (ADR 0035).
    pub d1_high_water_bytes: u64,
    /// The time span of one webhook shard (ms; default one UTC day, ADR 0035).
    pub shard_bucket_ms: u64,
    /// A shard's size (bytes) at which its project's publishes are refused
    /// with 503 `STORAGE_FULL` (a Durable Object holds at most 10 GB).
    pub shard_high_water_bytes: u64,
    /// What one inspector's capture URL accepts from its (unauthenticated)
    /// senders: captures and bytes per minute and per UTC day. Over it the
    /// sender gets 429; the project's own quotas are never touched.
    pub inspector_captures_per_minute: u32,
    pub inspector_bytes_per_minute: u64,
    pub inspector_captures_per_day: u32,
    pub inspector_bytes_per_day: u64,
}

/// What becomes of a revoked key's subscriptions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnKeyRevoked {
    /// Kept, but nothing is delivered to them (ADR 0015).
    Pause,
    /// Deleted with their pending deliveries.
    Delete,
}

impl Default for WebhooksConfig {
    fn default() -> Self {
        WebhooksConfig {
            schedule_s: vec![60, 900, 3_600, 86_400],
            timeout_ms: 30_000,
            max_payload_bytes: 65_536,
            allow_insecure_urls: false,
            allow_hosts: Vec::new(),
            secret_overlap_s: 86_400,
            requeue_after_s: 900,
            outbox_after_s: 60,
            disable_after_s: 432_000,
            max_subscriptions_per_project: 200,
            on_key_revoked: OnKeyRevoked::Pause,
            events_per_project_per_day: 1_000_000,
            deliveries_per_project_per_day: 5_000_000,
            bytes_per_project_per_day: 8 << 30,
            manual_attempts_per_delivery: 5,
            d1_high_water_bytes: 8_000_000_000,
            shard_bucket_ms: crate::webhooks::shard::DEFAULT_BUCKET_MS,
            shard_high_water_bytes: 9_000_000_000,
            inspector_captures_per_minute: 60,
            inspector_bytes_per_minute: 1 << 20,
            inspector_captures_per_day: 2_000,
            inspector_bytes_per_day: 16 << 20,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    pub audit_days: u32,
    pub deliveries_days: u32,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            audit_days: 90,
            deliveries_days: 14,
        }
    }
}

/// The compliance archive (ADR 0038).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArchiveConfig {
    /// Before retention deletes audit rows or delivery records, write them
    /// to the `ARCHIVE` bucket; nothing is deleted that is not archived and
    /// verified. On by default: turning it off is the operator's choice.
    pub enabled: bool,
    /// Days an archive object is kept (the daily job deletes older ones).
    pub keep_days: u32,
}

impl Default for ArchiveConfig {
    fn default() -> Self {
        ArchiveConfig {
            enabled: true,
            keep_days: 2_557,
        }
    }
}

/// Operational alerts (ADR 0038): `postguard.queue.lagging` and
/// `postguard.storage.high_water`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlertsConfig {
    /// The operator's own project: its subscriptions receive the alerts
    /// about the deployment (the queue, D1) and a copy of every project's.
    /// Unset: those are only logged.
    pub project: Option<String>,
    /// `postguard.queue.lagging` when the oldest due delivery is older than this (s).
    pub queue_lag_s: u32,
    /// `postguard.storage.high_water` when a store reaches this share of the
    /// mark at which it refuses writes (percent).
    pub storage_percent: u32,
    /// One alert per condition per this period at most (s).
    pub period_s: u32,
}

impl Default for AlertsConfig {
    fn default() -> Self {
        AlertsConfig {
            project: None,
            queue_lag_s: 300,
            storage_percent: 80,
            period_s: 3_600,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// Record one audit row per request (audit shards, written after the
    /// response).
    pub enabled: bool,
    /// The time span of one audit shard (ms; default one UTC day, ADR 0016).
    pub bucket_ms: u64,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            enabled: true,
            bucket_ms: crate::audit_shard::DEFAULT_BUCKET_MS,
        }
    }
}

/// A route whose requests may run asynchronously (`Prefer: respond-async`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AsyncRoute {
    pub method: String,
    pub path: String,
}

/// Asynchronous operations (docs/async-operations.md, ADR 0037).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AsyncConfig {
    /// The routes where `Prefer: respond-async` is honoured (none by default).
    pub routes: Vec<AsyncRoute>,
    /// How long one attempt of an operation may wait for the origin (ms).
    pub timeout_ms: u32,
    /// An operation queued this long without starting is handed to the
    /// queue again by its key's object (s): the outbox of a lost message.
    pub requeue_after_s: u32,
}

impl Default for AsyncConfig {
    fn default() -> Self {
        AsyncConfig {
            routes: Vec::new(),
            timeout_ms: 300_000,
            requeue_after_s: 60,
        }
    }
}

/// The longest `async.timeout_ms`: a queue consumer's invocation may run 15
/// minutes; one is kept for reading the request and storing the answer.
pub const MAX_ASYNC_TIMEOUT_MS: u32 = 840_000;

/// `POSTGUARD_CONFIG` as written by the operator.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub plans: Named<Plan>,
    pub rate_limit: RateLimitConfig,
    pub idempotency: IdempotencyConfig,
    pub origin: OriginConfig,
    pub webhooks: WebhooksConfig,
    pub retention: RetentionConfig,
    pub audit: AuditConfig,
    pub archive: ArchiveConfig,
    pub alerts: AlertsConfig,
    pub max_body_bytes: u64,
    /// `None`: preflights are forwarded to the origin.
    pub cors: Option<crate::cors::CorsConfig>,
    /// The gateway's own public origin (`https://api.example.com`): the base
    /// of the URLs it hands out (portal links, capture URLs) and the only
    /// origin whose capture URLs a redirect or a delivery may target without
    /// the URL rules. Never taken from a request's `Host`. Unset: those URLs
    /// are relative (`/_postguard/…`) and no URL is exempt.
    pub public_url: Option<String>,
    pub limits: LimitsConfig,
    /// `async` in the JSON (a Rust keyword).
    #[serde(rename = "async")]
    pub async_ops: AsyncConfig,
    pub events_from_responses: Vec<ResponseEventRule>,
}

impl Default for Settings {
    fn default() -> Self {
        let plans = [("trial", 30u32), ("business", 2_000u32)]
            .into_iter()
            .map(|(name, n)| (name.to_string(), Plan::single(n, 60)))
            .collect();
        Settings {
            plans,
            rate_limit: RateLimitConfig::default(),
            idempotency: IdempotencyConfig::default(),
            origin: OriginConfig::default(),
            webhooks: WebhooksConfig::default(),
            retention: RetentionConfig::default(),
            audit: AuditConfig::default(),
            archive: ArchiveConfig::default(),
            alerts: AlertsConfig::default(),
            max_body_bytes: 10 << 20,
            cors: None,
            public_url: None,
            limits: LimitsConfig::default(),
            async_ops: AsyncConfig::default(),
            events_from_responses: Vec::new(),
        }
    }
}

/// The validated configuration the gateway runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub origin_url: Url,
    pub admin_token: String,
    pub origin_token: String,
    pub origin_signing_secret: String,
    /// The digests the credential of every request is compared with.
    pub secrets: crate::credential::Secrets,
    pub settings: Settings,
}

/// The shortest secret accepted (`ADMIN_TOKEN`, `ORIGIN_TOKEN`,
/// `ORIGIN_SIGNING_SECRET`): 32 characters, e.g. 16 random bytes in hex.
pub const MIN_SECRET_LEN: usize = 32;

/// Largest stored response body we accept in configuration (bodies are kept
/// in Durable Object storage, chunked).
pub const MAX_STORED_BODY_CAP: u64 = 16 << 20;
/// Default `idempotency.max_replay_bytes`: 100 MiB.
pub const DEFAULT_REPLAY_BYTES: u64 = 100 << 20;
/// Largest `idempotency.max_replay_bytes` accepted: 1 GiB (such bodies are
/// streamed to R2 and back, never held in the isolate).
pub const MAX_REPLAY_CAP: u64 = 1 << 30;
/// Largest `max_body_bytes` accepted: 32 MiB. A proxied body is held up to
/// three times at once (the runtime's ArrayBuffer, the wasm copy, the copy
/// handed to the origin fetch) = 96 MiB, which leaves room under an isolate's
/// 128 MB for the runtime itself and a buffered replay (≤ 16 MiB,
/// [`MAX_STORED_BODY_CAP`]). Cloudflare's own 100–500 MB request ceiling
/// would not fit in one isolate.
pub const MAX_BODY_CAP: u64 = 32 << 20;
const MAX_TTL_S: u32 = 30 * 86_400;
/// One publish writes one delivery row per matching subscription in a single
/// D1 batch; beyond this the batch and the fan-out get too large.
pub const MAX_SUBSCRIPTIONS_CAP: u32 = 5_000;
/// One D1 database's largest size (bytes).
pub const D1_MAX_BYTES: u64 = 10_000_000_000;
/// What one SQLite-backed Durable Object holds at most (a webhook shard).
pub const DO_MAX_BYTES: u64 = 10_000_000_000;

const HTTP_METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

fn valid_method(m: &str, allow_any: bool) -> bool {
    (allow_any && m == "*") || HTTP_METHODS.contains(&m)
}

impl Config {
    /// Parses and validates everything. The first problem found is returned.
    pub fn load(env: &RawEnv) -> Result<Config, ConfigError> {
        let origin_url = parse_origin_url(env.origin_url.as_deref())?;
        let admin_token = required_secret("ADMIN_TOKEN", env.admin_token.as_deref())?;
        let origin_token = required_secret("ORIGIN_TOKEN", env.origin_token.as_deref())?;
        let origin_signing_secret = required_secret(
            "ORIGIN_SIGNING_SECRET",
            env.origin_signing_secret.as_deref(),
        )?;
        distinct_secrets(&admin_token, &origin_token, &origin_signing_secret)?;
        // An absent variable means every default; a present one must be a JSON object.
        let settings = match env.postguard_config.as_deref() {
            None => Settings::default(),
            Some(text) => parse_settings(text)?,
        };
        validate(&settings)?;
        Ok(Config {
            secrets: crate::credential::Secrets::of(&admin_token, &origin_token),
            origin_url,
            admin_token,
            origin_token,
            origin_signing_secret,
            settings,
        })
    }
}

fn required_secret(name: &str, value: Option<&str>) -> Result<String, ConfigError> {
    match value {
        Some(v) if v.trim().chars().count() >= MIN_SECRET_LEN => Ok(v.to_string()),
        Some(v) if !v.trim().is_empty() => Err(ConfigError::new(
            name,
            format!("must be at least {MIN_SECRET_LEN} characters (e.g. `openssl rand -hex 24`)"),
        )),
        _ => Err(ConfigError::new(
            name,
            "is required (set it with `wrangler secret put`, or in .dev.vars locally)",
        )),
    }
}

/// Each credential must be its own: an `ORIGIN_TOKEN` equal to `ADMIN_TOKEN`
/// would hand the origin operator rights, and a signing secret shared with
/// either would let its holder forge what the origin trusts.
fn distinct_secrets(admin: &str, origin: &str, signing: &str) -> Result<(), ConfigError> {
    if admin == origin {
        return Err(ConfigError::new(
            "ORIGIN_TOKEN",
            "must differ from ADMIN_TOKEN (the origin would get operator rights)",
        ));
    }
    if signing == admin || signing == origin {
        return Err(ConfigError::new(
            "ORIGIN_SIGNING_SECRET",
            "must differ from ADMIN_TOKEN and ORIGIN_TOKEN",
        ));
    }
    Ok(())
}

fn parse_origin_url(value: Option<&str>) -> Result<Url, ConfigError> {
    const F: &str = "ORIGIN_URL";
    let raw = value
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| ConfigError::new(F, "is required"))?;
    if let Some(why) = crate::webhooks::url_guard::host_refusal(raw) {
        return Err(ConfigError::new(F, why));
    }
    let url =
        Url::parse(raw).map_err(|e| ConfigError::new(F, format!("is not a valid URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ConfigError::new(F, "must use http or https"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(ConfigError::new(F, "must name a host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ConfigError::new(F, "must not contain credentials"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(ConfigError::new(F, "must not contain a query or fragment"));
    }
    Ok(url)
}

/// Parses the JSON text. Unknown fields, wrong types and missing required
/// members are reported with the path of the offending field.
pub fn parse_settings(text: &str) -> Result<Settings, ConfigError> {
    // serde would also read a struct from a JSON array; only an object is valid.
    if !text.trim_start().starts_with('{') {
        return Err(ConfigError::new(
            "POSTGUARD_CONFIG",
            "must be a JSON object",
        ));
    }
    let de = &mut serde_json::Deserializer::from_slice(text.as_bytes());
    let err = match serde_path_to_error::deserialize::<_, Settings>(&mut *de) {
        Ok(s) => {
            // Trailing bytes after the object (`{…} junk`) make the text invalid.
            return match de.end() {
                Ok(()) => Ok(s),
                Err(e) => Err(ConfigError::new(
                    "POSTGUARD_CONFIG",
                    format!("must be a valid JSON object ({e})"),
                )),
            };
        }
        Err(err) => err,
    };
    let path = err.path().to_string();
    let inner = err.into_inner();
    let whole = || {
        ConfigError::new(
            "POSTGUARD_CONFIG",
            format!("must be a valid JSON object ({inner})"),
        )
    };
    if inner.is_syntax() || inner.is_eof() {
        return Err(whole());
    }
    let msg = inner.to_string();
    // Unknown and missing members are reported on their parent: name the member.
    let field = match named_member(&msg) {
        Some(name) if path == "." => name.to_string(),
        Some(name) if !path.ends_with(name) => format!("{path}.{name}"),
        _ => path,
    };
    if field == "." || field.is_empty() {
        return Err(whole());
    }
    Err(ConfigError::new(field, msg))
}

fn named_member(msg: &str) -> Option<&str> {
    let rest = msg
        .strip_prefix("unknown field `")
        .or_else(|| msg.strip_prefix("missing field `"))?;
    rest.split('`').next()
}

/// `public_url` is an origin: http(s), a host, no credentials, path, query
/// or fragment (the gateway's routes start at its root).
fn validate_public_url(raw: &str) -> Result<(), ConfigError> {
    const F: &str = "public_url";
    let url =
        Url::parse(raw).map_err(|e| ConfigError::new(F, format!("is not a valid URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(ConfigError::new(F, "must be an http(s) origin with a host"));
    }
    if url.origin().ascii_serialization() != raw.trim_end_matches('/') {
        return Err(ConfigError::new(
            F,
            "must be an origin only (scheme://host[:port]): no credentials, path, query or fragment",
        ));
    }
    Ok(())
}

impl Settings {
    /// The gateway's public origin, without a trailing slash; `""` when
    /// unset (the URLs it builds are then relative).
    pub fn public_origin(&self) -> &str {
        self.public_url
            .as_deref()
            .map_or("", |u| u.trim_end_matches('/'))
    }
}

fn validate_cors(c: &crate::cors::CorsConfig) -> Result<(), ConfigError> {
    if c.allowed_origins.is_empty() || c.allowed_origins.len() > 100 {
        return Err(ConfigError::new(
            "cors.allowed_origins",
            "must list 1 to 100 origins (or \"*\")",
        ));
    }
    if let Some(bad) = c.allowed_origins.iter().find(|o| {
        o.as_str() != "*"
            && (crate::webhooks::url_guard::host_refusal(o).is_some()
                || Url::parse(o).map_or(true, |u| u.origin().ascii_serialization() != **o))
    }) {
        let shown: String = bad.chars().take(64).collect();
        return Err(ConfigError::new(
            "cors.allowed_origins",
            format!("{shown} is not an origin (scheme://host[:port])"),
        ));
    }
    if let Some(m) = c.allowed_methods.iter().find(|m| !valid_method(m, false)) {
        let shown: String = m.chars().take(16).collect();
        return Err(ConfigError::new(
            "cors.allowed_methods",
            format!("{shown} is not a method"),
        ));
    }
    if c.allowed_headers
        .iter()
        .any(|h| h.is_empty() || !h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    {
        return Err(ConfigError::new(
            "cors.allowed_headers",
            "header names are letters, digits and '-'",
        ));
    }
    range("cors.max_age_s", c.max_age_s, 0, 86_400)
}

fn range<T: PartialOrd + std::fmt::Display>(
    field: impl Into<String>,
    v: T,
    lo: T,
    hi: T,
) -> Result<(), ConfigError> {
    if v < lo || v > hi {
        return Err(ConfigError::new(
            field,
            format!("must be between {lo} and {hi}, got {v}"),
        ));
    }
    Ok(())
}

/// Checks a plan — or a key's overrides laid over its plan — naming any bad
/// field under `at`.
pub fn validate_plan(at: &str, plan: &Plan) -> Result<(), ConfigError> {
    if plan.policies.is_some() {
        if plan.requests_per_window.is_some() {
            return Err(ConfigError::new(
                format!("{at}.requests_per_window"),
                "give either requests_per_window (one policy) or policies, not both",
            ));
        }
        if plan.window_s.is_some() {
            return Err(ConfigError::new(
                format!("{at}.window_s"),
                "belongs to the single-policy form: each of `policies` has its own window_s",
            ));
        }
    } else {
        match plan.requests_per_window {
            Some(n) => range(format!("{at}.requests_per_window"), n, 1, 10_000_000)?,
            None => {
                return Err(ConfigError::new(
                    format!("{at}.requests_per_window"),
                    "is required (or `policies`, a list of {name, requests, window_s})",
                ))
            }
        }
    }
    if let Some(w) = plan.window_s {
        range(format!("{at}.window_s"), w, 1, 86_400)?;
    }
    if let Some(list) = &plan.policies {
        if list.is_empty() || list.len() > 8 {
            return Err(ConfigError::new(
                format!("{at}.policies"),
                "must list 1 to 8 policies",
            ));
        }
        for (i, p) in list.iter().enumerate() {
            let f = format!("{at}.policies[{i}]");
            let reserved = [
                crate::limits::INFLIGHT_POLICY,
                crate::limits::GATEWAY_POLICY,
            ];
            if !is_valid_name(&p.name) || reserved.contains(&p.name.as_str()) {
                return Err(ConfigError::new(
                    format!("{f}.name"),
                    "policy names are 1-64 of [A-Za-z0-9._-], not `inflight` or `gateway`",
                ));
            }
            if list[..i].iter().any(|q| q.name == p.name) {
                return Err(ConfigError::new(
                    format!("{f}.name"),
                    "names a policy twice",
                ));
            }
            range(format!("{f}.requests"), p.requests, 1, 10_000_000)?;
            range(format!("{f}.window_s"), p.window_s, 1, 31 * 86_400)?;
        }
    }
    if let Some(c) = plan.concurrency {
        range(format!("{at}.concurrency"), c, 1, 10_000)?;
    }
    if let Some(g) = &plan.gateway {
        range(format!("{at}.gateway.requests"), g.requests, 1, 10_000_000)?;
        range(format!("{at}.gateway.window_s"), g.window_s, 1, 86_400)?;
    }
    if let Some(t) = plan.idempotency_ttl_s {
        range(format!("{at}.idempotency_ttl_s"), t, 1, MAX_TTL_S)?;
    }
    Ok(())
}

fn validate(s: &Settings) -> Result<(), ConfigError> {
    if s.plans.is_empty() {
        return Err(ConfigError::new("plans", "must define at least one plan"));
    }
    for (name, plan) in &s.plans {
        if !is_valid_name(name) {
            return Err(ConfigError::new(
                format!("plans.{name}"),
                "plan names are 1-64 of [A-Za-z0-9._-]",
            ));
        }
        validate_plan(&format!("plans.{name}"), plan)?;
    }
    let smallest_quota = s
        .plans
        .values()
        .map(Plan::smallest_quota)
        .min()
        .unwrap_or(1);
    for (i, rule) in s.rate_limit.costs.iter().enumerate() {
        let f = format!("rate_limit.costs[{i}]");
        if !valid_method(&rule.method, true) {
            return Err(ConfigError::new(
                format!("{f}.method"),
                "must be an upper-case HTTP method or *",
            ));
        }
        if !pattern::is_valid(&rule.path) {
            return Err(ConfigError::new(
                format!("{f}.path"),
                "must start with / and contain only visible ASCII",
            ));
        }
        if rule.cost > smallest_quota {
            return Err(ConfigError::new(
                format!("{f}.cost"),
                format!("must not exceed the smallest plan quota ({smallest_quota}), or the route could never be admitted"),
            ));
        }
    }
    range(
        "rate_limit.audit_cost",
        s.rate_limit.audit_cost,
        0,
        smallest_quota,
    )?;
    range(
        "rate_limit.stats_cost",
        s.rate_limit.stats_cost,
        0,
        smallest_quota,
    )?;
    // A cost over a plan's quota charges that plan its whole window
    // (`Route::cost` is capped when charged), so these are not bounded by
    // the smallest plan as the audit's are.
    range("rate_limit.test_cost", s.rate_limit.test_cost, 0, 1_000_000)?;
    range(
        "rate_limit.recover_cost",
        s.rate_limit.recover_cost,
        0,
        1_000_000,
    )?;
    range(
        "limits.unauthenticated_per_minute",
        s.limits.unauthenticated_per_minute,
        1,
        1_000_000,
    )?;
    if let Some(u) = &s.public_url {
        validate_public_url(u)?;
    }
    let idem = &s.idempotency;
    for method in idem.methods.keys() {
        if !valid_method(method, false)
            || method == "GET"
            || method == "HEAD"
            || method == "OPTIONS"
        {
            return Err(ConfigError::new(
                format!("idempotency.methods.{method}"),
                "must be one of POST, PUT, PATCH, DELETE",
            ));
        }
    }
    for (i, rule) in idem.routes.iter().enumerate() {
        let f = format!("idempotency.routes[{i}]");
        if !valid_method(&rule.method, true) {
            return Err(ConfigError::new(
                format!("{f}.method"),
                "must be an upper-case HTTP method or *",
            ));
        }
        if !pattern::is_valid(&rule.path) {
            return Err(ConfigError::new(
                format!("{f}.path"),
                "must start with / and contain only visible ASCII",
            ));
        }
    }
    range("origin.timeout_ms", s.origin.timeout_ms, 100, 600_000)?;
    range("idempotency.lease_s", idem.lease_s, 1, 3_600)?;
    if u64::from(idem.lease_s) * 1000 <= u64::from(s.origin.timeout_ms) {
        return Err(ConfigError::new(
            "idempotency.lease_s",
            format!("must exceed origin.timeout_ms ({} ms), or a claim could expire while its request still runs", s.origin.timeout_ms),
        ));
    }
    range(
        "idempotency.max_stored_body_bytes",
        idem.max_stored_body_bytes,
        1 << 20,
        MAX_STORED_BODY_CAP,
    )?;
    range("max_body_bytes", s.max_body_bytes, 1, MAX_BODY_CAP)?;
    range(
        "idempotency.lookup_grace_s",
        idem.lookup_grace_s,
        0,
        604_800,
    )?;
    range(
        "idempotency.max_replay_bytes",
        idem.max_replay_bytes,
        idem.max_stored_body_bytes,
        MAX_REPLAY_CAP,
    )?;
    if let Some(c) = &s.cors {
        validate_cors(c)?;
    }
    let wh = &s.webhooks;
    if wh.schedule_s.is_empty() || wh.schedule_s.len() > 20 {
        return Err(ConfigError::new(
            "webhooks.schedule_s",
            "must list 1 to 20 delays",
        ));
    }
    for (i, d) in wh.schedule_s.iter().enumerate() {
        range(format!("webhooks.schedule_s[{i}]"), *d, 1, 7 * 86_400)?;
    }
    range("webhooks.timeout_ms", wh.timeout_ms, 100, 600_000)?;
    range(
        "webhooks.secret_overlap_s",
        wh.secret_overlap_s,
        1,
        30 * 86_400,
    )?;
    range(
        "webhooks.requeue_after_s",
        wh.requeue_after_s,
        1,
        7 * 86_400,
    )?;
    range("webhooks.outbox_after_s", wh.outbox_after_s, 0, 3_600)?;
    range(
        "webhooks.disable_after_s",
        wh.disable_after_s,
        1,
        90 * 86_400,
    )?;
    range(
        "webhooks.max_subscriptions_per_project",
        wh.max_subscriptions_per_project,
        1,
        MAX_SUBSCRIPTIONS_CAP,
    )?;
    range(
        "webhooks.max_payload_bytes",
        wh.max_payload_bytes,
        1_024,
        1 << 20,
    )?;
    range(
        "webhooks.events_per_project_per_day",
        wh.events_per_project_per_day,
        1,
        100_000_000,
    )?;
    range(
        "webhooks.deliveries_per_project_per_day",
        wh.deliveries_per_project_per_day,
        1,
        1_000_000_000,
    )?;
    range(
        "webhooks.bytes_per_project_per_day",
        wh.bytes_per_project_per_day,
        1,
        DO_MAX_BYTES,
    )?;
    range(
        "webhooks.manual_attempts_per_delivery",
        wh.manual_attempts_per_delivery,
        0,
        100,
    )?;
    range(
        "webhooks.d1_high_water_bytes",
        wh.d1_high_water_bytes,
        1,
        D1_MAX_BYTES,
    )?;
    range(
        "webhooks.shard_bucket_ms",
        wh.shard_bucket_ms,
        crate::webhooks::shard::MIN_BUCKET_MS,
        crate::webhooks::shard::MAX_BUCKET_MS,
    )?;
    range(
        "webhooks.shard_high_water_bytes",
        wh.shard_high_water_bytes,
        1,
        D1_MAX_BYTES,
    )?;
    range(
        "webhooks.inspector_captures_per_minute",
        wh.inspector_captures_per_minute,
        1,
        100_000,
    )?;
    range(
        "webhooks.inspector_bytes_per_minute",
        wh.inspector_bytes_per_minute,
        1_024,
        1 << 30,
    )?;
    range(
        "webhooks.inspector_captures_per_day",
        wh.inspector_captures_per_day,
        wh.inspector_captures_per_minute,
        10_000_000,
    )?;
    range(
        "webhooks.inspector_bytes_per_day",
        wh.inspector_bytes_per_day,
        wh.inspector_bytes_per_minute,
        1 << 36,
    )?;
    for (i, host) in wh.allow_hosts.iter().enumerate() {
        if host.is_empty() || host.len() > 253 || !host.bytes().all(|b| (0x21..0x7f).contains(&b)) {
            return Err(ConfigError::new(
                format!("webhooks.allow_hosts[{i}]"),
                "must be a host name or IP literal",
            ));
        }
    }
    // 0: keep only the current bucket (for tests).
    range("retention.audit_days", s.retention.audit_days, 0, 3_650)?;
    range(
        "audit.bucket_ms",
        s.audit.bucket_ms,
        crate::audit_shard::MIN_BUCKET_MS,
        crate::audit_shard::MAX_BUCKET_MS,
    )?;
    range(
        "retention.deliveries_days",
        s.retention.deliveries_days,
        0,
        3_650,
    )?;
    range("archive.keep_days", s.archive.keep_days, 1, 36_500)?;
    let al = &s.alerts;
    if let Some(p) = &al.project {
        if !is_valid_name(p) {
            return Err(ConfigError::new(
                "alerts.project",
                "must be 1-64 characters of [A-Za-z0-9._-]",
            ));
        }
    }
    range("alerts.queue_lag_s", al.queue_lag_s, 1, 86_400)?;
    range("alerts.storage_percent", al.storage_percent, 1, 100)?;
    range("alerts.period_s", al.period_s, 60, 30 * 86_400)?;
    validate_async(&s.async_ops)?;
    validate_response_events(&s.events_from_responses)
}

/// The method of a rule that names a mutating request: an operation runs a
/// request under its Idempotency-Key, which GET, HEAD and OPTIONS never carry.
fn valid_mutating(m: &str) -> bool {
    m == "*" || matches!(m, "POST" | "PUT" | "PATCH" | "DELETE")
}

fn validate_rule_route(f: &str, method: &str, path: &str) -> Result<(), ConfigError> {
    if !valid_mutating(method) {
        return Err(ConfigError::new(
            format!("{f}.method"),
            "must be POST, PUT, PATCH, DELETE or * (responses are kept only under an Idempotency-Key)",
        ));
    }
    if !pattern::is_valid(path) {
        return Err(ConfigError::new(
            format!("{f}.path"),
            "must start with / and contain only visible ASCII",
        ));
    }
    Ok(())
}

fn validate_async(a: &AsyncConfig) -> Result<(), ConfigError> {
    if a.routes.len() > 100 {
        return Err(ConfigError::new(
            "async.routes",
            "must list at most 100 routes",
        ));
    }
    for (i, r) in a.routes.iter().enumerate() {
        validate_rule_route(&format!("async.routes[{i}]"), &r.method, &r.path)?;
    }
    range(
        "async.timeout_ms",
        a.timeout_ms,
        1_000,
        MAX_ASYNC_TIMEOUT_MS,
    )?;
    range("async.requeue_after_s", a.requeue_after_s, 1, 3_600)
}

fn validate_response_events(rules: &[ResponseEventRule]) -> Result<(), ConfigError> {
    if rules.len() > 100 {
        return Err(ConfigError::new(
            "events_from_responses",
            "must list at most 100 rules",
        ));
    }
    for (i, r) in rules.iter().enumerate() {
        let f = format!("events_from_responses[{i}]");
        validate_rule_route(&f, &r.method, &r.path)?;
        if crate::response_events::StatusMatch::parse(&r.status).is_none() {
            return Err(ConfigError::new(
                format!("{f}.status"),
                "must be a status (\"201\") or a class (\"2xx\")",
            ));
        }
        if !crate::webhooks::events::is_valid_type(&r.event_type)
            || r.event_type.starts_with("postguard.")
        {
            return Err(ConfigError::new(
                format!("{f}.type"),
                "must be 1-128 of [A-Za-z0-9._:-], not under the reserved `postguard.` prefix",
            ));
        }
        if !crate::response_events::is_valid_data(&r.data) {
            return Err(ConfigError::new(
                format!("{f}.data"),
                "must be \"body\" or a JSON Pointer (\"/order\", RFC 6901)",
            ));
        }
    }
    Ok(())
}

impl Settings {
    /// The idempotency mode for a request: the first matching route rule,
    /// else the method table; methods not in the table are never idempotent.
    pub fn idempotency_mode(&self, method: &str, path: &str) -> Mode {
        if let Some(rule) =
            self.idempotency.routes.iter().find(|r| {
                (r.method == "*" || r.method == method) && pattern::matches(&r.path, path)
            })
        {
            // GET/HEAD never take part, whatever a route says.
            if matches!(method, "GET" | "HEAD" | "OPTIONS") {
                return Mode::Off;
            }
            return rule.mode;
        }
        self.idempotency
            .methods
            .get(method)
            .copied()
            .unwrap_or(Mode::Off)
    }

    /// The rate-limit cost of a request: the first matching rule, else 1.
    pub fn cost(&self, method: &str, path: &str) -> u32 {
        self.rate_limit
            .costs
            .iter()
            .find(|r| (r.method == "*" || r.method == method) && pattern::matches(&r.path, path))
            .map_or(1, |r| r.cost)
    }

    /// A proxied request's route as metrics name it: the pattern of the
    /// first configured rule it matches (`idempotency.routes`, then
    /// `rate_limit.costs`), or `*` — never the raw path, whose ids would make
    /// every request a group of its own.
    pub fn route_label(&self, method: &str, path: &str) -> &str {
        let matches = |m: &str, p: &str| (m == "*" || m == method) && pattern::matches(p, path);
        let idem = self.idempotency.routes.iter().map(|r| (&r.method, &r.path));
        let costs = self.rate_limit.costs.iter().map(|r| (&r.method, &r.path));
        idem.chain(costs)
            .find(|(m, p)| matches(m, p))
            .map_or("*", |(_, p)| p.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADMIN: &str = "admin-secret-0123456789abcdef0123";
    const ORIGIN: &str = "origin-secret-0123456789abcdef012";
    const SIGNING: &str = "signing-secret-0123456789abcdef01";

    fn env(cfg: Option<&str>) -> RawEnv {
        RawEnv {
            origin_url: Some("http://127.0.0.1:8787/api".into()),
            admin_token: Some(ADMIN.into()),
            origin_token: Some(ORIGIN.into()),
            origin_signing_secret: Some(SIGNING.into()),
            postguard_config: cfg.map(str::to_string),
        }
    }

    fn err_field(cfg: &str) -> String {
        Config::load(&env(Some(cfg))).unwrap_err().field
    }

    #[test]
    fn named_entries_read_like_a_sorted_map() {
        let text = r#"{"plans":{"zeta":{"requests_per_window":1},"alpha":{"requests_per_window":2},"zeta":{"requests_per_window":3}}}"#;
        let c = Config::load(&env(Some(text))).unwrap();
        let plans = &c.settings.plans;
        assert_eq!(plans.keys().collect::<Vec<_>>(), ["alpha", "zeta"]);
        // The last of a repeated name wins, as in a BTreeMap.
        assert_eq!(
            plans.get("zeta").map(|p| p.requests_per_window),
            Some(Some(3))
        );
        assert!(plans.get("beta").is_none() && !plans.contains_key("beta"));
        let wrong = Config::load(&env(Some(r#"{"plans":[]}"#))).unwrap_err();
        assert_eq!(wrong.field, "plans");
        assert!(wrong.reason.contains("expected a map"), "{}", wrong.reason);
    }

    #[test]
    fn async_operations_and_response_events_are_validated_naming_the_field() {
        let c = Config::load(&env(None)).unwrap();
        let a = &c.settings.async_ops;
        assert!(a.routes.is_empty(), "no asynchronous routes by default");
        assert_eq!((a.timeout_ms, a.requeue_after_s), (300_000, 60));
        assert!(c.settings.events_from_responses.is_empty());
        let ok = r#"{"async":{"routes":[{"method":"POST","path":"/reports/*"}],"timeout_ms":840000},
            "events_from_responses":[{"method":"*","path":"/orders","status":"2xx","type":"order.created","data":"/order/id~1x"}]}"#;
        assert!(Config::load(&env(Some(ok))).is_ok());
        for (cfg, field) in [
            (
                r#"{"async":{"routes":[{"method":"GET","path":"/r"}]}}"#,
                "async.routes[0].method",
            ),
            (
                r#"{"async":{"routes":[{"method":"POST","path":"r"}]}}"#,
                "async.routes[0].path",
            ),
            (r#"{"async":{"timeout_ms":840001}}"#, "async.timeout_ms"),
            (r#"{"async":{"timeout_ms":999}}"#, "async.timeout_ms"),
            (
                r#"{"async":{"requeue_after_s":0}}"#,
                "async.requeue_after_s",
            ),
            (r#"{"async":{"route":[]}}"#, "async.route"),
            (
                r#"{"events_from_responses":[{"method":"POST","path":"/o","status":"6xx","type":"a","data":"body"}]}"#,
                "events_from_responses[0].status",
            ),
            (
                r#"{"events_from_responses":[{"method":"POST","path":"/o","status":"2xx","type":"postguard.x","data":"body"}]}"#,
                "events_from_responses[0].type",
            ),
            (
                r#"{"events_from_responses":[{"method":"POST","path":"/o","status":"2xx","type":"a b","data":"body"}]}"#,
                "events_from_responses[0].type",
            ),
            (
                r#"{"events_from_responses":[{"method":"POST","path":"/o","status":"2xx","type":"a","data":"order"}]}"#,
                "events_from_responses[0].data",
            ),
            (
                r#"{"events_from_responses":[{"method":"HEAD","path":"/o","status":"2xx","type":"a","data":"body"}]}"#,
                "events_from_responses[0].method",
            ),
            (
                r#"{"events_from_responses":[{"method":"POST","path":"/o","status":"2xx","type":"a"}]}"#,
                "events_from_responses[0].data",
            ),
        ] {
            assert_eq!(err_field(cfg), field, "{cfg}");
        }
    }

    #[test]
    fn defaults_match_the_contract() {
        let c = Config::load(&env(None)).unwrap();
        let s = &c.settings;
        assert_eq!(s.plans["trial"].requests_per_window, Some(30));
        assert_eq!(s.plans["business"].requests_per_window, Some(2000));
        assert_eq!(s.plans["trial"].window_s, Some(60));
        assert_eq!(s.plans["trial"].ttl_s(), 86_400);
        assert_eq!(s.idempotency.lease_s, 60);
        assert_eq!(s.idempotency.max_stored_body_bytes, 1 << 20);
        assert_eq!(s.origin.timeout_ms, 30_000);
        assert_eq!(s.webhooks.schedule_s, vec![60, 900, 3600, 86400]);
        assert_eq!(s.webhooks.secret_overlap_s, 86_400);
        assert_eq!(s.webhooks.requeue_after_s, 900);
        assert_eq!(s.retention.audit_days, 90);
        assert_eq!(s.max_body_bytes, 10 << 20);
        assert_eq!(s.idempotency_mode("POST", "/x"), Mode::Required);
        assert_eq!(s.idempotency_mode("PATCH", "/x"), Mode::Optional);
        assert_eq!(s.idempotency_mode("GET", "/x"), Mode::Off);
        assert_eq!(s.cost("POST", "/x"), 1);
    }

    #[test]
    fn contract_example_parses() {
        let text = r#"{
          "plans": {"trial": {"requests_per_window": 30, "window_s": 60, "idempotency_ttl_s": 86400},
                    "business": {"requests_per_window": 2000, "window_s": 60, "idempotency_ttl_s": 86400}},
          "rate_limit": {"costs": [{"method": "POST", "path": "/bulk/*", "cost": 1}]},
          "idempotency": {"methods": {"POST": "required", "PATCH": "optional", "PUT": "optional", "DELETE": "optional"},
                          "routes": [{"method": "POST", "path": "/search", "mode": "off"}],
                          "lease_s": 60, "max_stored_body_bytes": 1048576},
          "origin": {"timeout_ms": 30000},
          "webhooks": {"schedule_s": [60, 900, 3600, 86400], "timeout_ms": 30000,
                       "max_payload_bytes": 65536, "allow_insecure_urls": false, "allow_hosts": []},
          "retention": {"audit_days": 90, "deliveries_days": 14},
          "max_body_bytes": 10485760
        }"#;
        let c = Config::load(&env(Some(text))).unwrap();
        assert_eq!(c.settings.idempotency_mode("POST", "/search"), Mode::Off);
        assert_eq!(
            c.settings.idempotency_mode("POST", "/searches"),
            Mode::Required
        );
    }

    #[test]
    fn archive_and_alerts_settings() {
        let c = Config::load(&env(None)).unwrap();
        let s = &c.settings;
        assert!(s.archive.enabled, "on unless the operator turns it off");
        assert_eq!(s.archive.keep_days, 2_557);
        assert_eq!(s.alerts.project, None);
        assert_eq!(
            (
                s.alerts.queue_lag_s,
                s.alerts.storage_percent,
                s.alerts.period_s
            ),
            (300, 80, 3_600)
        );
        let text = r#"{"retention":{"audit_days":0,"deliveries_days":0},"archive":{"enabled":false,"keep_days":30},
          "alerts":{"project":"ops","queue_lag_s":5,"storage_percent":1,"period_s":60}}"#;
        let c = Config::load(&env(Some(text))).unwrap();
        assert_eq!(
            c.settings.retention.audit_days, 0,
            "0 keeps only the current bucket"
        );
        assert_eq!(c.settings.alerts.project.as_deref(), Some("ops"));
        for (cfg, field) in [
            (r#"{"archive":{"keep_days":0}}"#, "archive.keep_days"),
            (r#"{"archive":{"enabled":"yes"}}"#, "archive.enabled"),
            (r#"{"archive":{"bucket":"x"}}"#, "archive.bucket"),
            (r#"{"alerts":{"project":"a b"}}"#, "alerts.project"),
            (r#"{"alerts":{"queue_lag_s":0}}"#, "alerts.queue_lag_s"),
            (
                r#"{"alerts":{"storage_percent":101}}"#,
                "alerts.storage_percent",
            ),
            (r#"{"alerts":{"period_s":59}}"#, "alerts.period_s"),
            (
                r#"{"retention":{"deliveries_days":3651}}"#,
                "retention.deliveries_days",
            ),
        ] {
            assert_eq!(err_field(cfg), field, "{cfg}");
        }
    }

    #[test]
    fn given_plans_replace_defaults() {
        let c = Config::load(&env(Some(
            r#"{"plans":{"gold":{"requests_per_window":5}}}"#,
        )))
        .unwrap();
        assert_eq!(c.settings.plans.len(), 1);
        assert_eq!(
            c.settings.plans["gold"].limits().policies[0].window_ms,
            60_000
        );
    }

    #[test]
    fn errors_name_the_leaf_field() {
        assert_eq!(
            err_field(r#"{"plans":{"trial":{"requests_per_window":0}}}"#),
            "plans.trial.requests_per_window"
        );
        assert_eq!(
            err_field(r#"{"plans":{"trial":{"requests_per_window":"x"}}}"#),
            "plans.trial.requests_per_window"
        );
        assert_eq!(
            err_field(r#"{"plans":{"trial":{"requests_per_window":-1}}}"#),
            "plans.trial.requests_per_window"
        );
        assert_eq!(
            err_field(r#"{"plans":{"trial":{"window_s":60}}}"#),
            "plans.trial.requests_per_window"
        );
        assert_eq!(
            err_field(r#"{"plans":{"trial":{"requests_per_window":5,"colour":1}}}"#),
            "plans.trial.colour"
        );
        assert_eq!(err_field(r#"{"bogus":1}"#), "bogus");
        assert_eq!(
            err_field(r#"{"origin":{"timeout_ms":0}}"#),
            "origin.timeout_ms"
        );
        assert_eq!(
            err_field(r#"{"origin":{"timeout_ms":90000}}"#),
            "idempotency.lease_s"
        );
        assert_eq!(
            err_field(r#"{"idempotency":{"max_stored_body_bytes":1000}}"#),
            "idempotency.max_stored_body_bytes"
        );
        assert_eq!(
            err_field(r#"{"idempotency":{"methods":{"GET":"required"}}}"#),
            "idempotency.methods.GET"
        );
        assert_eq!(
            err_field(
                r#"{"idempotency":{"routes":[{"method":"POST","path":"/a","mode":"sometimes"}]}}"#
            ),
            "idempotency.routes[0].mode"
        );
        assert_eq!(
            err_field(r#"{"idempotency":{"routes":[{"method":"POST","path":"a","mode":"off"}]}}"#),
            "idempotency.routes[0].path"
        );
        assert_eq!(
            err_field(r#"{"rate_limit":{"costs":[{"method":"POST","path":"/a","cost":31}]}}"#),
            "rate_limit.costs[0].cost"
        );
        assert_eq!(
            err_field(r#"{"webhooks":{"schedule_s":[]}}"#),
            "webhooks.schedule_s"
        );
        assert_eq!(
            err_field(r#"{"webhooks":{"schedule_s":[60,0]}}"#),
            "webhooks.schedule_s[1]"
        );
        assert_eq!(
            err_field(r#"{"webhooks":{"secret_overlap_s":0}}"#),
            "webhooks.secret_overlap_s"
        );
        assert_eq!(
            err_field(r#"{"retention":{"audit_days":3651}}"#),
            "retention.audit_days"
        );
        assert_eq!(
            err_field(r#"{"audit":{"bucket_ms":999}}"#),
            "audit.bucket_ms"
        );
        assert_eq!(
            err_field(r#"{"audit":{"bucket_ms":2678400001}}"#),
            "audit.bucket_ms"
        );
        assert_eq!(err_field(r#"{"max_body_bytes":0}"#), "max_body_bytes");
        assert_eq!(err_field(r#"{"plans":{}}"#), "plans");
        assert_eq!(
            err_field(r#"{"plans":{"bad name":{"requests_per_window":1}}}"#),
            "plans.bad name"
        );
    }

    #[test]
    fn invalid_json_names_postguard_config() {
        assert_eq!(err_field("{"), "POSTGUARD_CONFIG");
        assert_eq!(err_field("[1]"), "POSTGUARD_CONFIG");
        assert_eq!(err_field("not json"), "POSTGUARD_CONFIG");
        assert_eq!(err_field("\"string\""), "POSTGUARD_CONFIG");
        assert_eq!(err_field(""), "POSTGUARD_CONFIG");
        assert_eq!(err_field("{} junk"), "POSTGUARD_CONFIG");
        assert_eq!(err_field("{}{}"), "POSTGUARD_CONFIG");
        assert_eq!(err_field("  "), "POSTGUARD_CONFIG");
        assert_eq!(err_field(""), "POSTGUARD_CONFIG");
        assert_eq!(err_field("{} junk"), "POSTGUARD_CONFIG");
        assert_eq!(err_field("{}{}"), "POSTGUARD_CONFIG");
        assert_eq!(err_field("  "), "POSTGUARD_CONFIG");
    }

    #[test]
    fn env_errors_name_the_variable() {
        let mut e = env(None);
        e.origin_url = Some("ftp://x".into());
        assert_eq!(Config::load(&e).unwrap_err().field, "ORIGIN_URL");
        e.origin_url = Some("not a url".into());
        assert_eq!(Config::load(&e).unwrap_err().field, "ORIGIN_URL");
        e.origin_url = None;
        assert_eq!(Config::load(&e).unwrap_err().field, "ORIGIN_URL");
        e.origin_url = Some("https://user:pw@example.com".into());
        assert_eq!(Config::load(&e).unwrap_err().field, "ORIGIN_URL");
        // No Unicode host processing in this build (ADR 0019): the xn-- form only.
        for raw in ["https://Bücher.example", "https://%41%C3%BC.example"] {
            e.origin_url = Some(raw.into());
            let err = Config::load(&e).unwrap_err();
            assert_eq!(err.field, "ORIGIN_URL", "{raw}");
        }
        e.origin_url = Some("https://XN--bcher-kva.example".into());
        assert!(Config::load(&e).is_ok());
        let mut e = env(None);
        e.admin_token = Some(" ".into());
        assert_eq!(Config::load(&e).unwrap_err().field, "ADMIN_TOKEN");
        let mut e = env(None);
        e.origin_token = None;
        assert_eq!(Config::load(&e).unwrap_err().field, "ORIGIN_TOKEN");
        let mut e = env(None);
        e.origin_signing_secret = None;
        assert_eq!(Config::load(&e).unwrap_err().field, "ORIGIN_SIGNING_SECRET");
    }

    #[test]
    fn secrets_are_long_enough_and_distinct() {
        let short = "x".repeat(MIN_SECRET_LEN - 1);
        for field in ["ADMIN_TOKEN", "ORIGIN_TOKEN", "ORIGIN_SIGNING_SECRET"] {
            let mut e = env(None);
            match field {
                "ADMIN_TOKEN" => e.admin_token = Some(short.clone()),
                "ORIGIN_TOKEN" => e.origin_token = Some(short.clone()),
                _ => e.origin_signing_secret = Some(short.clone()),
            }
            let err = Config::load(&e).unwrap_err();
            assert_eq!(err.field, field);
            assert!(err.reason.contains("at least 32"), "{err}");
        }
        let mut e = env(None);
        e.origin_token = Some(ADMIN.into());
        let err = Config::load(&e).unwrap_err();
        assert_eq!(err.field, "ORIGIN_TOKEN");
        assert!(!err.reason.contains(ADMIN), "never echoes a secret");
        let mut e = env(None);
        e.origin_signing_secret = Some(ORIGIN.into());
        assert_eq!(Config::load(&e).unwrap_err().field, "ORIGIN_SIGNING_SECRET");
        assert!(Config::load(&env(None)).is_ok());
    }

    #[test]
    fn security_settings_have_documented_defaults_and_ranges() {
        let c = Config::load(&env(None)).unwrap();
        assert_eq!(c.settings.webhooks.max_subscriptions_per_project, 200);
        assert_eq!(c.settings.webhooks.on_key_revoked, OnKeyRevoked::Pause);
        assert_eq!(
            (
                c.settings.rate_limit.audit_cost,
                c.settings.rate_limit.stats_cost
            ),
            (1, 1)
        );
        assert_eq!(
            err_field(r#"{"webhooks":{"max_subscriptions_per_project":0}}"#),
            "webhooks.max_subscriptions_per_project"
        );
        assert_eq!(
            err_field(r#"{"webhooks":{"events_per_project_per_day":0}}"#),
            "webhooks.events_per_project_per_day"
        );
        assert_eq!(
            err_field(r#"{"webhooks":{"d1_high_water_bytes":10000000001}}"#),
            "webhooks.d1_high_water_bytes"
        );
        assert_eq!(
            err_field(r#"{"webhooks":{"manual_attempts_per_delivery":101}}"#),
            "webhooks.manual_attempts_per_delivery"
        );
        assert_eq!(c.settings.webhooks.events_per_project_per_day, 1_000_000);
        assert_eq!(c.settings.webhooks.d1_high_water_bytes, 8_000_000_000);
        assert_eq!(
            err_field(r#"{"webhooks":{"on_key_revoked":"ignore"}}"#),
            "webhooks.on_key_revoked"
        );
        assert_eq!(
            err_field(r#"{"rate_limit":{"stats_cost":31}}"#),
            "rate_limit.stats_cost"
        );
    }

    #[test]
    fn first_matching_route_wins_and_get_is_never_idempotent() {
        let c = Config::load(&env(Some(
            r#"{"idempotency":{"routes":[
                {"method":"POST","path":"/search","mode":"off"},
                {"method":"*","path":"/payments/*","mode":"optional"},
                {"method":"POST","path":"/payments/*","mode":"required"}]}}"#,
        )))
        .unwrap();
        let s = &c.settings;
        assert_eq!(s.idempotency_mode("POST", "/search"), Mode::Off);
        assert_eq!(s.idempotency_mode("POST", "/payments/1"), Mode::Optional);
        assert_eq!(s.idempotency_mode("DELETE", "/payments/1"), Mode::Optional);
        assert_eq!(s.idempotency_mode("GET", "/payments/1"), Mode::Off);
        assert_eq!(s.idempotency_mode("POST", "/other"), Mode::Required);
    }

    proptest::proptest! {
        /// Any text, valid or not, yields a config or an error naming a field;
        /// never a panic.
        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
            if let Err(e) = Config::load(&env(Some(&text))) {
                proptest::prop_assert!(!e.field.is_empty());
            }
        }

        /// Numbers anywhere in a plan are either accepted or rejected by name.
        #[test]
        fn plan_numbers_are_range_checked(n in proptest::num::i64::ANY, w in 0u64..200_000, t in 0u64..5_000_000) {
            let text = format!(r#"{{"plans":{{"p":{{"requests_per_window":{n},"window_s":{w},"idempotency_ttl_s":{t}}}}}}}"#);
            match Config::load(&env(Some(&text))) {
                Ok(c) => {
                    let p = &c.settings.plans["p"];
                    proptest::prop_assert!(p.requests_per_window.is_some_and(|n| n >= 1) && p.window_s.is_some_and(|w| (1..=86_400).contains(&w)));
                }
                Err(e) => proptest::prop_assert!(e.field.starts_with("plans.p."), "{}", e.field),
            }
        }
    }

    #[test]
    fn route_costs() {
        let c = Config::load(&env(Some(r#"{"rate_limit":{"costs":[{"method":"POST","path":"/bulk/*","cost":5},{"method":"*","path":"/health","cost":0}]}}"#))).unwrap();
        assert_eq!(c.settings.cost("POST", "/bulk/items"), 5);
        assert_eq!(c.settings.cost("GET", "/bulk/items"), 1);
        assert_eq!(c.settings.cost("GET", "/health"), 0);
    }
}
