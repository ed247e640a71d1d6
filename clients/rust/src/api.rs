//! Typed methods for the gateway's own endpoints (`/_postguard/v1/…`).
//!
//! Each method uses the client's token: an API key for `me`, webhooks, deliveries,
//! audit and stats; `ADMIN_TOKEN` for keys and portal links; `ORIGIN_TOKEN` for
//! publishing events.
//!
//! Every mutating method sends one Idempotency-Key for all its attempts, and the gateway
//! honours it on its own endpoints (docs/idempotency.md): a retry after a lost answer gets the
//! stored answer, never a second key, subscription, rotation, link, retry or redirect.
//! Each has a `…_with` twin taking [`RequestOptions`], e.g. to give your own key
//! (`RequestOptions::default().idempotency_key("onboard-acme")`). `publish_event` is
//! keyed by its event id instead.

use futures_util::stream::{self, Stream, TryStreamExt};
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::client::{Body, Client, RequestOptions, Response};
use crate::error::Error;

const V1: &str = "/_postguard/v1";

/// A page of a list endpoint.
#[derive(Debug, Clone, Deserialize)]
pub struct Page<T> {
    pub data: Vec<T>,
    pub next_cursor: Option<String>,
}

/// `GET /me`: the key and its current limit state.
#[derive(Debug, Clone, Deserialize)]
pub struct Me {
    pub prefix: String,
    pub project: String,
    pub plan: String,
    /// `limit`, `remaining`, `reset` and `window_s` are the binding policy's.
    pub limit: u64,
    pub remaining: u64,
    /// Unix seconds.
    pub reset: u64,
    pub window_s: u64,
    /// When the key stops working (epoch ms), if it does.
    #[serde(default)]
    pub expires_at: Option<i64>,
    /// Every policy of the key's plan, in configuration order.
    #[serde(default)]
    pub policies: Vec<PolicyState>,
    #[serde(default)]
    pub inflight: Option<Inflight>,
}

/// One policy's state now.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PolicyState {
    pub name: String,
    pub limit: u64,
    pub remaining: u64,
    /// Unix seconds.
    pub reset: u64,
    pub window_s: u64,
}

/// The concurrency quota: requests of the key in flight at the origin, of `limit`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Inflight {
    pub limit: u32,
    pub in_use: u32,
    #[serde(default)]
    pub refused: bool,
}

/// A named policy of a plan: `requests` per `window_s`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicySpec {
    pub name: String,
    pub requests: u32,
    pub window_s: u32,
}

/// A plan's policy for the gateway's own endpoints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewaySpec {
    pub requests: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_s: Option<u32>,
}

/// A key's replacements of its plan's numbers (docs/limits.md): any of a plan's fields, e.g.
/// `requests_per_window`, or `policies` and `concurrency`. Fields left `None` keep the plan's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanOverrides {
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
    /// `Some(false)`: report-only — every policy and the concurrency quota are counted and
    /// advertised, but a request they would refuse is forwarded (its audit row says
    /// `would_refuse`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enforce: Option<bool>,
    /// Quota notices: the percentages (1–100) of each policy's limit at which the event
    /// `postguard.quota.threshold` is published to the key's project, once per window and
    /// threshold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify_at: Option<Vec<u8>>,
}

/// An API key (operator view).
#[derive(Debug, Clone, Deserialize)]
pub struct ApiKey {
    pub id: String,
    pub prefix: String,
    pub project: String,
    pub plan: String,
    pub name: Option<String>,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
    /// The full key, present once: in the answer that created it.
    pub key: Option<String>,
    /// When the key stops working (epoch ms), if it does.
    #[serde(default)]
    pub expires_at: Option<i64>,
    /// The operator's metadata, forwarded signed to the origin (`None` in lists).
    #[serde(default)]
    pub meta: Option<Value>,
    /// `None` in lists; [`Client::get_key`] shows them.
    #[serde(default)]
    pub overrides: Option<PlanOverrides>,
    /// When the operator last changed the key (epoch ms; 0: as created).
    #[serde(default)]
    pub updated_at: Option<i64>,
    /// Only from [`Client::get_key`]: each policy's state now.
    #[serde(default)]
    pub policies: Vec<PolicyState>,
    #[serde(default)]
    pub inflight: Option<Inflight>,
}

/// A new API key: `POST /keys`. `NewKey::new("acme", "trial").expires_at(ms).meta(json!({…}))`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NewKey {
    pub project: String,
    pub plan: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Epoch ms, in the future.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    /// A JSON object of at most 1 KiB, forwarded signed to the origin.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub meta: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overrides: Option<PlanOverrides>,
}

impl NewKey {
    pub fn new(project: impl Into<String>, plan: impl Into<String>) -> Self {
        NewKey {
            project: project.into(),
            plan: plan.into(),
            name: None,
            expires_at: None,
            meta: None,
            overrides: None,
        }
    }
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }
    /// When the key stops working, in epoch milliseconds.
    pub fn expires_at(mut self, epoch_ms: u64) -> Self {
        self.expires_at = Some(epoch_ms);
        self
    }
    pub fn meta(mut self, meta: Value) -> Self {
        self.meta = Some(meta);
        self
    }
    pub fn overrides(mut self, overrides: PlanOverrides) -> Self {
        self.overrides = Some(overrides);
        self
    }
}

/// One key an API already issued, for [`Client::import_keys`]: the key itself
/// ([`ImportKey::from_key`]: 16–256 visible ASCII characters, any format; its prefix defaults
/// to its first 12) or, when you do not want to send keys, the lowercase hex SHA-256 of its
/// bytes with the prefix logs and dashboards show ([`ImportKey::from_sha256`]). The other
/// members mean what they mean in [`NewKey`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ImportKey {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// 1–12 visible ASCII characters (required with `sha256`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    pub project: String,
    pub plan: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Epoch ms, in the future.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub meta: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overrides: Option<PlanOverrides>,
}

impl ImportKey {
    fn new(project: String, plan: String) -> Self {
        ImportKey {
            key: None,
            sha256: None,
            prefix: None,
            project,
            plan,
            name: None,
            expires_at: None,
            meta: None,
            overrides: None,
        }
    }
    /// The key itself (stored as its SHA-256 only).
    pub fn from_key(
        key: impl Into<String>,
        project: impl Into<String>,
        plan: impl Into<String>,
    ) -> Self {
        ImportKey {
            key: Some(key.into()),
            ..ImportKey::new(project.into(), plan.into())
        }
    }
    /// The key's lowercase hex SHA-256, with the prefix shown in logs and dashboards.
    pub fn from_sha256(
        sha256: impl Into<String>,
        prefix: impl Into<String>,
        project: impl Into<String>,
        plan: impl Into<String>,
    ) -> Self {
        ImportKey {
            sha256: Some(sha256.into()),
            prefix: Some(prefix.into()),
            ..ImportKey::new(project.into(), plan.into())
        }
    }
    /// Another prefix than the key's first 12 characters.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }
    /// When the key stops working, in epoch milliseconds.
    pub fn expires_at(mut self, epoch_ms: u64) -> Self {
        self.expires_at = Some(epoch_ms);
        self
    }
    pub fn meta(mut self, meta: Value) -> Self {
        self.meta = Some(meta);
        self
    }
    pub fn overrides(mut self, overrides: PlanOverrides) -> Self {
        self.overrides = Some(overrides);
        self
    }
}

/// One entry of [`Client::import_keys`]' answer, in the order given.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ImportedKey {
    /// Derived from the key's hash: the same key has the same id in every call.
    pub id: String,
    pub prefix: String,
    pub status: ImportStatus,
}

/// What an import did with one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ImportStatus {
    Created,
    /// A key with this hash was known and is left unchanged: an import can be re-run.
    Exists,
}

/// What `PATCH /keys/{id}` changes: each member set replaces the key's, a `clear_…` sends
/// `null` (removes it), anything not named is kept. `KeyUpdate::default().plan("pro")`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeyUpdate {
    body: serde_json::Map<String, Value>,
}

impl KeyUpdate {
    fn set(mut self, field: &str, value: Value) -> Self {
        self.body.insert(field.to_owned(), value);
        self
    }
    pub fn name(self, name: impl Into<String>) -> Self {
        self.set("name", Value::String(name.into()))
    }
    pub fn clear_name(self) -> Self {
        self.set("name", Value::Null)
    }
    pub fn plan(self, plan: impl Into<String>) -> Self {
        self.set("plan", Value::String(plan.into()))
    }
    pub fn meta(self, meta: Value) -> Self {
        self.set("meta", meta)
    }
    pub fn clear_meta(self) -> Self {
        self.set("meta", Value::Null)
    }
    pub fn overrides(self, overrides: &PlanOverrides) -> Self {
        // Infallible for this type (plain fields, string keys).
        let value = serde_json::to_value(overrides).unwrap_or(Value::Null);
        self.set("overrides", value)
    }
    pub fn clear_overrides(self) -> Self {
        self.set("overrides", Value::Null)
    }
    /// When the key stops working, in epoch milliseconds.
    pub fn expires_at(self, epoch_ms: u64) -> Self {
        self.set("expires_at", Value::from(epoch_ms))
    }
    /// The key no longer expires.
    pub fn clear_expiry(self) -> Self {
        self.set("expires_at", Value::Null)
    }
    /// The JSON body sent.
    pub fn body(&self) -> Value {
        Value::Object(self.body.clone())
    }
}

/// `POST /keys/{id}/reroll`: a new secret for the same key.
#[derive(Debug, Clone, Deserialize)]
pub struct RerolledKey {
    pub id: String,
    /// Unchanged: the audit log and dashboards see one key.
    pub prefix: String,
    /// The new secret, shown once.
    pub key: String,
    /// The old secret works until then (epoch ms).
    pub previous_expires_at: i64,
}

/// What became of the request an API key sent under an Idempotency-Key
/// ([`Client::status`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct IdempotencyStatus {
    pub state: IdempotencyState,
    /// The stored answer's status (completed, or expired after completing).
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub request_id: Option<String>,
    /// Epoch ms: the claim (in progress) or the completion.
    #[serde(default)]
    pub created_at: Option<i64>,
    /// Epoch ms: the end of the lease (in progress) or of the TTL (completed).
    #[serde(default)]
    pub expires_at: Option<i64>,
}

/// The state of an Idempotency-Key's request. A state this version does not know fails to
/// decode ([`Error::Decode`]) rather than being read as another: `Unknown` means a resend
/// runs the request, which must never be guessed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum IdempotencyState {
    /// The request runs; a resend now gets 409 (which the client retries).
    InProgress,
    /// Its answer is stored: a resend with the same key gets it replayed.
    Completed,
    /// The record outlived its TTL (or its lease): a resend runs anew.
    Expired,
    /// No record: it never arrived, or its answer was not kept (5xx, timeout). A resend runs it.
    Unknown,
}

/// A webhook subscription.
#[derive(Debug, Clone, Deserialize)]
pub struct Subscription {
    pub id: String,
    pub url: String,
    pub events: Vec<String>,
    pub description: Option<String>,
    pub created_at: i64,
    /// `whsec_…`, present once: on create.
    pub secret: Option<String>,
    #[serde(default)]
    pub state: Option<String>,
    /// What its receiver last advertised (`RateLimit`, `X-RateLimit-*`) while the reset is
    /// ahead; at 0 left its attempts wait for `reset_at`.
    #[serde(default)]
    pub receiver_limit: Option<ReceiverLimit>,
}

/// A receiver's advertised limit: `remaining` requests until `reset_at` (epoch ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct ReceiverLimit {
    pub remaining: u64,
    pub reset_at: u64,
}

/// A new subscription: `NewSubscription::new(url, ["order.*"]).description("billing")`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NewSubscription {
    pub url: String,
    pub events: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A subscription moved from another system keeps its secret: `whsec_` + the standard
    /// base64 of 24–64 bytes; deliveries are signed with it. `None`: the gateway makes one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

impl NewSubscription {
    pub fn new<E: Into<String>>(
        url: impl Into<String>,
        events: impl IntoIterator<Item = E>,
    ) -> Self {
        NewSubscription {
            url: url.into(),
            events: events.into_iter().map(Into::into).collect(),
            ..NewSubscription::default()
        }
    }
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }
    /// The secret the receiver already verifies with (`whsec_…`).
    pub fn secret(mut self, secret: impl Into<String>) -> Self {
        self.secret = Some(secret.into());
        self
    }
}

/// An event to publish with [`Client::publish`]:
/// `NewEvent::new("acme", "order.paid", json!({"id": "ord_42"})).ordering_key("order-42")`.
/// Without an [`id`](Self::id) one is generated (`evt_<uuid>`) once per publish, so that a
/// retried publish is the same event.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct NewEvent {
    pub project: String,
    pub event_type: String,
    pub data: Value,
    pub id: Option<String>,
    /// Epoch milliseconds; see [`Self::deliver_at_ms`].
    pub deliver_at_ms: Option<u64>,
    pub ordering_key: Option<String>,
}

impl NewEvent {
    pub fn new(project: impl Into<String>, event_type: impl Into<String>, data: Value) -> Self {
        NewEvent {
            project: project.into(),
            event_type: event_type.into(),
            data,
            id: None,
            deliver_at_ms: None,
            ordering_key: None,
        }
    }
    /// The event id (1–128 visible ASCII); publishing a known id again is a no-op.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }
    /// A scheduled event: no attempt before this time (epoch milliseconds, at most 7 days
    /// ahead; a time further is a 400 `VALIDATION_ERROR` naming `deliver_at`).
    pub fn deliver_at_ms(mut self, epoch_ms: u64) -> Self {
        self.deliver_at_ms = Some(epoch_ms);
        self
    }
    /// Ordering key (1–128 visible ASCII, else a 400 `VALIDATION_ERROR` naming
    /// `ordering_key`): per subscription, events with the same key are attempted in publish
    /// order — each waits until the delivery before it is delivered or dead-lettered (its
    /// [`Delivery::blocked_by`]); other keys and events without one go in parallel.
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }
    /// The JSON body sent, its id fixed (generated when not given).
    pub fn body(&self) -> Value {
        publish_body(
            &self.project,
            &self.event_type,
            &self.data,
            self.id.as_deref(),
            self.deliver_at_ms,
            self.ordering_key.as_deref(),
        )
    }
}

/// A webhook delivery (one event to one subscription).
#[derive(Debug, Clone, Deserialize)]
pub struct Delivery {
    pub id: String,
    pub event_id: String,
    pub event_type: String,
    pub subscription_id: String,
    pub url: String,
    pub status: String,
    pub attempts_made: u32,
    pub next_attempt_at: Option<i64>,
    pub created_at: i64,
    /// The event's ordering key ([`NewEvent::ordering_key`]); `None` without one.
    #[serde(default)]
    pub ordering_key: Option<String>,
    /// The delivery (same subscription and ordering key, published before) this one waits
    /// for before its first attempt; `None` when it is not waiting.
    #[serde(default)]
    pub blocked_by: Option<String>,
    /// Present on `GET /deliveries/{id}`.
    #[serde(default)]
    pub attempts: Vec<DeliveryAttempt>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct DeliveryAttempt {
    pub attempt: u32,
    pub url: String,
    pub status_code: Option<u16>,
    pub error: Option<String>,
    pub response_excerpt: Option<String>,
    pub duration_ms: Option<u64>,
    pub request_id: Option<String>,
    pub at: i64,
}

/// One audit row.
#[derive(Debug, Clone, Deserialize)]
pub struct AuditRow {
    pub request_id: String,
    pub time: i64,
    pub method: String,
    pub path: String,
    pub status: u16,
    pub response_bytes: Option<u64>,
    pub response_time_ms: Option<u64>,
    pub client_ip: Option<String>,
    pub user_agent: Option<String>,
    pub key_prefix: Option<String>,
    pub project: Option<String>,
    pub idempotency_key: Option<String>,
    pub replayed: bool,
    pub rate_limit_remaining: Option<i64>,
    /// The origin a proxied request was routed to (`default` or an `origins` name); `None`
    /// when not forwarded (or recorded before gateway 0.4).
    #[serde(default)]
    pub origin: Option<String>,
    /// Report-only limits: the policy (or `inflight`) that would have refused this forwarded
    /// request.
    #[serde(default)]
    pub would_refuse: Option<String>,
}

/// `GET /stats`.
#[derive(Debug, Clone, Deserialize)]
pub struct Stats {
    pub days: Vec<StatsDay>,
    pub top_paths: Vec<TopPath>,
    pub error_share: f64,
    pub p50_ms: Option<f64>,
    pub p95_ms: Option<f64>,
    /// The keys that sent required requests without an Idempotency-Key in the period, most
    /// first: whom to tell.
    #[serde(default)]
    pub keys_missing_idempotency: Vec<KeyMissingIdempotency>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct StatsDay {
    pub date: String,
    pub requests: u64,
    pub errors: u64,
    pub server_errors: u64,
    /// Proxied requests without an Idempotency-Key where the mode is `required`: forwarded
    /// before `idempotency.required_from`, refused after.
    #[serde(default)]
    pub missing_idempotency_key: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct KeyMissingIdempotency {
    pub key_prefix: String,
    pub requests: u64,
}

/// `GET /usage`'s periods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Granularity {
    Hour,
    Day,
}

/// `GET /usage`'s parameters: `UsageQuery::default().granularity(Granularity::Hour)`. Without
/// `since`, the last 7 days; `project` is the operator's (an API key reads its own).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageQuery {
    /// Epoch ms.
    pub since: Option<u64>,
    /// Epoch ms.
    pub until: Option<u64>,
    pub granularity: Option<Granularity>,
    pub project: Option<String>,
}

impl UsageQuery {
    pub fn since(mut self, epoch_ms: u64) -> Self {
        self.since = Some(epoch_ms);
        self
    }
    pub fn until(mut self, epoch_ms: u64) -> Self {
        self.until = Some(epoch_ms);
        self
    }
    pub fn granularity(mut self, granularity: Granularity) -> Self {
        self.granularity = Some(granularity);
        self
    }
    /// The operator's: one project (default every project).
    pub fn project(mut self, project: impl Into<String>) -> Self {
        self.project = Some(project.into());
        self
    }
    fn path(&self) -> String {
        let since = self.since.map(|v| v.to_string());
        let until = self.until.map(|v| v.to_string());
        let granularity = self.granularity.map(|g| match g {
            Granularity::Hour => "hour",
            Granularity::Day => "day",
        });
        let pairs: Vec<(&str, &str)> = [
            ("since", since.as_deref()),
            ("until", until.as_deref()),
            ("granularity", granularity),
            ("project", self.project.as_deref()),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect();
        with_query(&format!("{V1}/usage"), &pairs, None)
    }
}

/// One key's proxied requests in one period (`GET /usage`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Usage {
    pub key_prefix: String,
    pub project: String,
    /// The period's first millisecond (UTC, epoch ms).
    pub period_start: u64,
    /// Every request.
    pub requests: u64,
    /// Forwarded to the origin.
    pub admitted: u64,
    /// Each operation once: with an Idempotency-Key, the execution whose final answer was
    /// stored (never its replays, 409s or retries after a 5xx); without, forwarded and
    /// answered below 500.
    pub billable: u64,
    /// Stored answers replayed.
    pub replays: u64,
    /// 429s.
    pub refused: u64,
}

/// `{"data": [...]}` answers that are not pages.
#[derive(Deserialize)]
struct Data<T> {
    data: Vec<T>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct TopPath {
    pub path: String,
    pub requests: u64,
}

/// A signed dashboard link for one project.
#[derive(Debug, Clone, Deserialize)]
pub struct PortalLink {
    pub url: String,
    pub expires_at: i64,
}

/// Query parameters of a list endpoint: `(name, value)` pairs, e.g.
/// `[("status", "5xx"), ("path", "/payments/*")]`. `cursor` is managed by the iterators.
pub type Query<'a> = &'a [(&'a str, &'a str)];

fn with_query(path: &str, query: Query<'_>, cursor: Option<&str>) -> String {
    let mut ser = form_urlencoded_pairs(query);
    if let Some(c) = cursor {
        ser.push(("cursor".to_owned(), c.to_owned()));
    }
    if ser.is_empty() {
        return path.to_owned();
    }
    let mut url = reqwest::Url::parse("http://q.invalid/").ok();
    if let Some(u) = url.as_mut() {
        u.query_pairs_mut()
            .extend_pairs(ser.iter().map(|(k, v)| (k, v)));
    }
    let q = url.as_ref().and_then(|u| u.query()).unwrap_or_default();
    format!("{path}?{q}")
}

fn form_urlencoded_pairs(query: Query<'_>) -> Vec<(String, String)> {
    query
        .iter()
        .filter(|(k, _)| *k != "cursor")
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// An Idempotency-Key as the lookup's path segment: percent-encoded (all but RFC 3986's
/// unreserved characters), and `.` or `..` in the RFC 8941 string form (`".."`), which the
/// gateway reads as the same key — URL parsers remove a `.`/`..` segment, `%2E` included.
pub fn key_segment(key: &str) -> Result<String, Error> {
    if key.is_empty() {
        return Err(Error::Invalid("the Idempotency-Key is empty".into()));
    }
    let quoted;
    let key = match key {
        "." | ".." => {
            quoted = format!("\"{key}\"");
            quoted.as_str()
        }
        k => k,
    };
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    Ok(out)
}

fn segment(id: &str) -> Result<&str, Error> {
    // Ids are opaque but never contain path syntax; refuse rather than re-route.
    if id.is_empty() || id.contains(['/', '?', '#', '%']) {
        return Err(Error::Invalid(format!("id {id:?}")));
    }
    Ok(id)
}

impl Client {
    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Body,
    ) -> Result<T, Error> {
        self.call_with(method, path, body, RequestOptions::default())
            .await
    }

    async fn call_with<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Body,
        opts: RequestOptions,
    ) -> Result<T, Error> {
        self.request(method, path, body, opts).await?.json()
    }

    async fn page<T: DeserializeOwned>(
        &self,
        path: &str,
        query: Query<'_>,
        cursor: Option<&str>,
    ) -> Result<Page<T>, Error> {
        self.call(Method::GET, &with_query(path, query, cursor), Body::Empty)
            .await
    }

    /// Every item of a list endpoint, page after page, as a stream.
    fn paginate<T: DeserializeOwned + 'static>(
        &self,
        path: &'static str,
        query: Query<'_>,
    ) -> impl Stream<Item = Result<T, Error>> + '_ {
        let query: Vec<(String, String)> = form_urlencoded_pairs(query);
        let start = (Some(None::<String>), query);
        stream::try_unfold(start, move |(cursor, query)| async move {
            let Some(cursor) = cursor else {
                return Ok::<_, Error>(None);
            };
            let q: Vec<(&str, &str)> = query
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let page: Page<T> = self.page(path, &q, cursor.as_deref()).await?;
            let next = page.next_cursor.map(Some);
            Ok(Some((
                stream::iter(page.data.into_iter().map(Ok)),
                (next, query),
            )))
        })
        .try_flatten()
    }

    /// `GET /me` (API key).
    pub async fn me(&self) -> Result<Me, Error> {
        self.call(Method::GET, &format!("{V1}/me"), Body::Empty)
            .await
    }

    /// `GET /operations` (API key or session): one page of the project's asynchronous
    /// operations, newest first (`state`, `limit` filter).
    pub async fn list_operations(
        &self,
        query: Query<'_>,
        cursor: Option<&str>,
    ) -> Result<Page<crate::OperationInfo>, Error> {
        self.page(&format!("{V1}/operations"), query, cursor).await
    }

    /// `GET /idempotency/{key}` (API key; free of budget): what became of the request this
    /// key sent under `idempotency_key`. [`IdempotencyState::Completed`]: send it again with
    /// the same key to get the stored answer; `InProgress`: wait and ask again; `Expired` or
    /// `Unknown`: nothing is kept, sending it again runs it.
    pub async fn status(&self, idempotency_key: &str) -> Result<IdempotencyStatus, Error> {
        let path = format!("{V1}/idempotency/{}", key_segment(idempotency_key)?);
        self.call(Method::GET, &path, Body::Empty).await
    }

    // --- webhooks (API key) ---

    /// `POST /webhooks` → the subscription with its secret (shown once).
    pub async fn create_webhook(&self, sub: &NewSubscription) -> Result<Subscription, Error> {
        self.create_webhook_with(sub, RequestOptions::default())
            .await
    }
    pub async fn create_webhook_with(
        &self,
        sub: &NewSubscription,
        opts: RequestOptions,
    ) -> Result<Subscription, Error> {
        let path = format!("{V1}/webhooks");
        self.call_with(Method::POST, &path, Body::json(sub)?, opts)
            .await
    }
    pub async fn list_webhooks(&self, query: Query<'_>) -> Result<Page<Subscription>, Error> {
        self.page(&format!("{V1}/webhooks"), query, None).await
    }
    pub async fn get_webhook(&self, id: &str) -> Result<Subscription, Error> {
        let path = format!("{V1}/webhooks/{}", segment(id)?);
        self.call(Method::GET, &path, Body::Empty).await
    }
    pub async fn delete_webhook(&self, id: &str) -> Result<(), Error> {
        self.delete_webhook_with(id, RequestOptions::default())
            .await
    }
    pub async fn delete_webhook_with(&self, id: &str, opts: RequestOptions) -> Result<(), Error> {
        let path = format!("{V1}/webhooks/{}", segment(id)?);
        self.request(Method::DELETE, &path, Body::Empty, opts)
            .await?;
        Ok(())
    }
    /// `POST /webhooks/{id}/rotate-secret` → the new secret; the old one keeps signing
    /// alongside it for 24 h.
    pub async fn rotate_webhook_secret(&self, id: &str) -> Result<String, Error> {
        self.rotate_webhook_secret_with(id, RequestOptions::default())
            .await
    }
    pub async fn rotate_webhook_secret_with(
        &self,
        id: &str,
        opts: RequestOptions,
    ) -> Result<String, Error> {
        #[derive(Deserialize)]
        struct Rotated {
            secret: String,
        }
        let path = format!("{V1}/webhooks/{}/rotate-secret", segment(id)?);
        let r: Rotated = self
            .call_with(Method::POST, &path, Body::Empty, opts)
            .await?;
        Ok(r.secret)
    }

    // --- deliveries (API key) ---

    pub async fn list_deliveries(
        &self,
        query: Query<'_>,
        cursor: Option<&str>,
    ) -> Result<Page<Delivery>, Error> {
        self.page(&format!("{V1}/deliveries"), query, cursor).await
    }
    /// Every delivery matching `query` (`status`, `event_type`, `since`…), newest first.
    pub fn deliveries<'a>(
        &'a self,
        query: Query<'_>,
    ) -> impl Stream<Item = Result<Delivery, Error>> + 'a {
        self.paginate("/_postguard/v1/deliveries", query)
    }
    /// `GET /deliveries/{id}` with every attempt.
    pub async fn get_delivery(&self, id: &str) -> Result<Delivery, Error> {
        let path = format!("{V1}/deliveries/{}", segment(id)?);
        self.call(Method::GET, &path, Body::Empty).await
    }
    /// `POST /deliveries/{id}/retry` → 202 (one more attempt).
    pub async fn retry_delivery(&self, id: &str) -> Result<Response, Error> {
        self.retry_delivery_with(id, RequestOptions::default())
            .await
    }
    pub async fn retry_delivery_with(
        &self,
        id: &str,
        opts: RequestOptions,
    ) -> Result<Response, Error> {
        let path = format!("{V1}/deliveries/{}/retry", segment(id)?);
        self.request(Method::POST, &path, Body::Empty, opts).await
    }
    /// `POST /deliveries/{id}/redirect {url}` → 202 (sent once to `url`).
    pub async fn redirect_delivery(&self, id: &str, url: &str) -> Result<Response, Error> {
        self.redirect_delivery_with(id, url, RequestOptions::default())
            .await
    }
    pub async fn redirect_delivery_with(
        &self,
        id: &str,
        url: &str,
        opts: RequestOptions,
    ) -> Result<Response, Error> {
        let path = format!("{V1}/deliveries/{}/redirect", segment(id)?);
        let body = Body::json(&serde_json::json!({ "url": url }))?;
        self.request(Method::POST, &path, body, opts).await
    }

    // --- events (ORIGIN_TOKEN) ---

    /// `POST /events {project, type, data, id}` → the event id. Without an `id` one is
    /// generated (`evt_<uuid>`) so that a retried publish is the same event (the
    /// gateway treats a known id as a no-op). [`Self::publish`] takes the other fields.
    pub async fn publish_event(
        &self,
        project: &str,
        event_type: &str,
        data: &Value,
        id: Option<&str>,
    ) -> Result<String, Error> {
        self.post_event(publish_body(project, event_type, data, id, None, None))
            .await
    }

    /// `POST /events` of a [`NewEvent`] (with a `deliver_at`, an `ordering_key`…) → the
    /// event id, fixed once for every attempt.
    pub async fn publish(&self, event: &NewEvent) -> Result<String, Error> {
        self.post_event(event.body()).await
    }

    /// [`Self::publish_event`] of a scheduled event: no attempt before `deliver_at_ms`
    /// (epoch milliseconds, at most 7 days ahead; a time further is a 400
    /// `VALIDATION_ERROR` naming `deliver_at`).
    pub async fn publish_event_at(
        &self,
        project: &str,
        event_type: &str,
        data: &Value,
        id: Option<&str>,
        deliver_at_ms: u64,
    ) -> Result<String, Error> {
        let body = publish_body(project, event_type, data, id, Some(deliver_at_ms), None);
        self.post_event(body).await
    }

    async fn post_event(&self, body: Value) -> Result<String, Error> {
        #[derive(Deserialize)]
        struct Published {
            id: String,
        }
        let p: Published = self
            .call(Method::POST, &format!("{V1}/events"), Body::from(body))
            .await?;
        Ok(p.id)
    }

    // --- audit and stats (API key: own project; ADMIN_TOKEN: any) ---

    pub async fn audit_page(
        &self,
        query: Query<'_>,
        cursor: Option<&str>,
    ) -> Result<Page<AuditRow>, Error> {
        self.page(&format!("{V1}/audit"), query, cursor).await
    }
    /// Every audit row matching `query`, newest first, fetched page by page as the
    /// stream is consumed: `while let Some(row) = rows.try_next().await? { … }`.
    pub fn audit<'a>(
        &'a self,
        query: Query<'_>,
    ) -> impl Stream<Item = Result<AuditRow, Error>> + 'a {
        self.paginate("/_postguard/v1/audit", query)
    }
    /// `GET /stats?days=`.
    pub async fn stats(&self, days: u32) -> Result<Stats, Error> {
        self.call(Method::GET, &format!("{V1}/stats?days={days}"), Body::Empty)
            .await
    }
    /// `GET /usage`: per key and hour or day (default), its proxied requests — all,
    /// forwarded, billable (each operation once: never a replay, a 409 or a retry after a
    /// 5xx), replays and 429s — oldest period first. An API key reads its project; the
    /// operator one project ([`UsageQuery::project`]) or every project. The counts come from
    /// the audit log, written just after each answer.
    pub async fn usage(&self, query: &UsageQuery) -> Result<Vec<Usage>, Error> {
        let d: Data<Usage> = self.call(Method::GET, &query.path(), Body::Empty).await?;
        Ok(d.data)
    }

    // --- operator (ADMIN_TOKEN) ---

    /// `POST /keys` → the key record with the full key (shown once).
    pub async fn create_key(
        &self,
        project: &str,
        plan: &str,
        name: Option<&str>,
    ) -> Result<ApiKey, Error> {
        self.create_key_with(project, plan, name, RequestOptions::default())
            .await
    }
    pub async fn create_key_with(
        &self,
        project: &str,
        plan: &str,
        name: Option<&str>,
        opts: RequestOptions,
    ) -> Result<ApiKey, Error> {
        let mut body = serde_json::json!({ "project": project, "plan": plan });
        if let Some(n) = name {
            body["name"] = n.into();
        }
        let path = format!("{V1}/keys");
        self.call_with(Method::POST, &path, Body::from(body), opts)
            .await
    }
    /// `POST /keys` with an expiry, metadata or overrides → the key record with the full
    /// key (shown once).
    pub async fn create_key_from(&self, key: &NewKey) -> Result<ApiKey, Error> {
        self.create_key_from_with(key, RequestOptions::default())
            .await
    }
    pub async fn create_key_from_with(
        &self,
        key: &NewKey,
        opts: RequestOptions,
    ) -> Result<ApiKey, Error> {
        let path = format!("{V1}/keys");
        self.call_with(Method::POST, &path, Body::json(key)?, opts)
            .await
    }
    /// `POST /keys/import`: 1–1,000 keys the API already issued, usable from the answer on.
    /// The whole call is validated first: one invalid entry is a 400 `VALIDATION_ERROR`
    /// naming it (`keys[3].plan`) and nothing is imported. Each entry's status is
    /// [`ImportStatus::Created`], or [`ImportStatus::Exists`] when the key was known (left
    /// unchanged): a re-run is safe, and the call's retries carry one Idempotency-Key.
    pub async fn import_keys(&self, keys: &[ImportKey]) -> Result<Vec<ImportedKey>, Error> {
        self.import_keys_with(keys, RequestOptions::default()).await
    }
    pub async fn import_keys_with(
        &self,
        keys: &[ImportKey],
        opts: RequestOptions,
    ) -> Result<Vec<ImportedKey>, Error> {
        #[derive(Serialize)]
        struct Import<'a> {
            keys: &'a [ImportKey],
        }
        let path = format!("{V1}/keys/import");
        let body = Body::json(&Import { keys })?;
        let d: Data<ImportedKey> = self.call_with(Method::POST, &path, body, opts).await?;
        Ok(d.data)
    }
    /// `PATCH /keys/{id}`: name, plan, meta, overrides, expiry; applies from the key's next
    /// request.
    pub async fn update_key(&self, id: &str, update: &KeyUpdate) -> Result<ApiKey, Error> {
        self.update_key_with(id, update, RequestOptions::default())
            .await
    }
    pub async fn update_key_with(
        &self,
        id: &str,
        update: &KeyUpdate,
        opts: RequestOptions,
    ) -> Result<ApiKey, Error> {
        let path = format!("{V1}/keys/{}", segment(id)?);
        self.call_with(Method::PATCH, &path, Body::from(update.body()), opts)
            .await
    }
    /// `POST /keys/{id}/reroll {grace_s?}`: a new secret for the same key (id, prefix,
    /// counters); the old one works until `previous_expires_at` (`grace_s`, default 24 h,
    /// at most 7 days).
    pub async fn reroll_key(&self, id: &str, grace_s: Option<u64>) -> Result<RerolledKey, Error> {
        self.reroll_key_with(id, grace_s, RequestOptions::default())
            .await
    }
    pub async fn reroll_key_with(
        &self,
        id: &str,
        grace_s: Option<u64>,
        opts: RequestOptions,
    ) -> Result<RerolledKey, Error> {
        let body = match grace_s {
            Some(g) => serde_json::json!({ "grace_s": g }),
            None => serde_json::json!({}),
        };
        let path = format!("{V1}/keys/{}/reroll", segment(id)?);
        self.call_with(Method::POST, &path, Body::from(body), opts)
            .await
    }
    pub async fn list_keys(
        &self,
        query: Query<'_>,
        cursor: Option<&str>,
    ) -> Result<Page<ApiKey>, Error> {
        self.page(&format!("{V1}/keys"), query, cursor).await
    }
    pub async fn get_key(&self, id: &str) -> Result<ApiKey, Error> {
        let path = format!("{V1}/keys/{}", segment(id)?);
        self.call(Method::GET, &path, Body::Empty).await
    }
    /// `DELETE /keys/{id}`: revoked at once.
    pub async fn revoke_key(&self, id: &str) -> Result<(), Error> {
        self.revoke_key_with(id, RequestOptions::default()).await
    }
    pub async fn revoke_key_with(&self, id: &str, opts: RequestOptions) -> Result<(), Error> {
        let path = format!("{V1}/keys/{}", segment(id)?);
        self.request(Method::DELETE, &path, Body::Empty, opts)
            .await?;
        Ok(())
    }
    /// `POST /portal-links {project, ttl_s?}` → a signed dashboard link for one project.
    pub async fn create_portal_link(
        &self,
        project: &str,
        ttl_s: Option<u64>,
    ) -> Result<PortalLink, Error> {
        self.create_portal_link_with(project, ttl_s, RequestOptions::default())
            .await
    }
    pub async fn create_portal_link_with(
        &self,
        project: &str,
        ttl_s: Option<u64>,
        opts: RequestOptions,
    ) -> Result<PortalLink, Error> {
        let mut body = serde_json::json!({ "project": project });
        if let Some(t) = ttl_s {
            body["ttl_s"] = t.into();
        }
        let path = format!("{V1}/portal-links");
        self.call_with(Method::POST, &path, Body::from(body), opts)
            .await
    }
}

/// The body of `POST /events`: the event id fixed here (`evt_<uuid>` when not given) so
/// that every attempt publishes the same event; `deliver_at` and `ordering_key` only when
/// given.
fn publish_body(
    project: &str,
    event_type: &str,
    data: &Value,
    id: Option<&str>,
    deliver_at_ms: Option<u64>,
    ordering_key: Option<&str>,
) -> Value {
    let id = id.map_or_else(
        || format!("evt_{}", uuid::Uuid::new_v4().simple()),
        str::to_owned,
    );
    let mut body =
        serde_json::json!({"project": project, "type": event_type, "data": data, "id": id});
    if let Some(o) = body.as_object_mut() {
        if let Some(at) = deliver_at_ms {
            o.insert("deliver_at".into(), Value::from(at));
        }
        if let Some(key) = ordering_key {
            o.insert("ordering_key".into(), Value::from(key));
        }
    }
    body
}

#[cfg(test)]
mod tests {
    #[test]
    fn publish_passes_deliver_at_through() {
        let data = serde_json::json!({});
        let b = super::publish_body(
            "p",
            "t",
            &data,
            Some("evt_1"),
            Some(1_800_000_000_000),
            None,
        );
        assert_eq!(b["deliver_at"], 1_800_000_000_000_u64);
        assert_eq!(b["id"], "evt_1");
        let b = super::publish_body("p", "t", &data, None, None, None);
        assert!(b.get("deliver_at").is_none());
        assert!(b.get("ordering_key").is_none());
        assert!(b["id"].as_str().is_some_and(|id| id.starts_with("evt_")));
    }

    #[test]
    fn new_event_sends_ordering_key_only_when_given() {
        let e = super::NewEvent::new("p", "order.paid", serde_json::json!({"n": 1}))
            .ordering_key("order-42")
            .deliver_at_ms(1_800_000_000_000);
        let b = e.body();
        assert_eq!(b["ordering_key"], "order-42");
        assert_eq!(b["deliver_at"], 1_800_000_000_000_u64);
        assert_eq!(
            (&b["project"], &b["type"], &b["data"]),
            (
                &serde_json::json!("p"),
                &serde_json::json!("order.paid"),
                &serde_json::json!({"n": 1})
            )
        );
        assert!(b["id"].as_str().is_some_and(|id| id.starts_with("evt_")));
        let b = super::NewEvent::new("p", "t", serde_json::json!({}))
            .id("evt_1")
            .body();
        assert_eq!(b["id"], "evt_1");
        assert!(b.get("ordering_key").is_none());
        assert!(b.get("deliver_at").is_none());
    }

    #[test]
    fn deliveries_decode_with_and_without_ordering_fields() {
        let base = r#""id":"dlv_2","event_id":"evt_2","event_type":"t","subscription_id":"sub_1","url":"http://r","status":"pending","attempts_made":0,"next_attempt_at":null,"created_at":1"#;
        let d: super::Delivery = serde_json::from_str(&format!(
            r#"{{{base},"ordering_key":"order-42","blocked_by":"dlv_1"}}"#
        ))
        .unwrap();
        assert_eq!(
            (d.ordering_key.as_deref(), d.blocked_by.as_deref()),
            (Some("order-42"), Some("dlv_1"))
        );
        let d: super::Delivery = serde_json::from_str(&format!("{{{base}}}")).unwrap();
        assert_eq!((d.ordering_key, d.blocked_by), (None, None));
    }

    use super::*;

    #[test]
    fn query_strings_are_encoded_and_cursor_is_ours() {
        assert_eq!(with_query("/a", &[], None), "/a");
        assert_eq!(
            with_query("/a", &[("path", "/p/*"), ("cursor", "x")], Some("c 1")),
            "/a?path=%2Fp%2F*&cursor=c+1"
        );
    }

    #[test]
    fn idempotency_keys_are_percent_encoded_and_dot_segments_quoted() {
        assert_eq!(key_segment("order-42_x.y~z").unwrap(), "order-42_x.y~z");
        assert_eq!(key_segment("a/b?c#d%e f").unwrap(), "a%2Fb%3Fc%23d%25e%20f");
        assert_eq!(key_segment("\"q\"").unwrap(), "%22q%22");
        for dots in [".", ".."] {
            let seg = key_segment(dots).unwrap();
            assert_eq!(seg, format!("%22{dots}%22"));
            let url = reqwest::Url::parse("http://gw.test/")
                .unwrap()
                .join(&format!("_postguard/v1/idempotency/{seg}"))
                .unwrap();
            assert_eq!(url.path(), format!("/_postguard/v1/idempotency/{seg}"));
        }
        assert!(key_segment("").is_err());
    }

    #[test]
    fn the_lookup_and_key_shapes_decode() {
        let s: IdempotencyStatus = serde_json::from_str(
            r#"{"state":"completed","status":201,"request_id":"req_1","created_at":1,"expires_at":2}"#,
        )
        .unwrap();
        assert_eq!(s.state, IdempotencyState::Completed);
        assert_eq!(
            (s.status, s.request_id.as_deref()),
            (Some(201), Some("req_1"))
        );
        for (state, want) in [
            ("in_progress", IdempotencyState::InProgress),
            ("expired", IdempotencyState::Expired),
            ("unknown", IdempotencyState::Unknown),
        ] {
            let s: IdempotencyStatus =
                serde_json::from_str(&format!(r#"{{"state":"{state}"}}"#)).unwrap();
            assert_eq!((s.state, s.status), (want, None));
        }
        assert!(serde_json::from_str::<IdempotencyStatus>(r#"{"state":"maybe"}"#).is_err());
        let key: ApiKey = serde_json::from_str(
            r#"{"id":"key_1","prefix":"pgk_abcdefgh","project":"p","plan":"trial","name":null,
                "created_at":1,"revoked_at":null,"expires_at":5,"meta":{"tier":"gold"},
                "overrides":{"concurrency":2},"updated_at":3,
                "policies":[{"name":"default","limit":30,"remaining":29,"reset":9,"window_s":60}]}"#,
        )
        .unwrap();
        assert_eq!(key.expires_at, Some(5));
        assert_eq!(key.overrides.unwrap().concurrency, Some(2));
        assert_eq!(key.policies[0].remaining, 29);
        let rolled: RerolledKey = serde_json::from_str(
            r#"{"id":"key_1","prefix":"pgk_abcdefgh","key":"pgk_abcdefghX","previous_expires_at":7,"plan":"trial"}"#,
        )
        .unwrap();
        assert_eq!(rolled.previous_expires_at, 7);
    }

    #[test]
    fn key_bodies_send_what_is_set_and_null_what_is_cleared() {
        let new = NewKey::new("p", "trial")
            .expires_at(1_893_456_000_000)
            .meta(serde_json::json!({"tier": "gold"}))
            .overrides(PlanOverrides {
                concurrency: Some(2),
                ..PlanOverrides::default()
            });
        assert_eq!(
            serde_json::to_value(&new).unwrap(),
            serde_json::json!({"project": "p", "plan": "trial", "expires_at": 1_893_456_000_000_u64,
                "meta": {"tier": "gold"}, "overrides": {"concurrency": 2}})
        );
        let update = KeyUpdate::default().plan("pro").clear_expiry();
        assert_eq!(
            update.body().to_string(),
            r#"{"expires_at":null,"plan":"pro"}"#
        );
    }

    #[test]
    fn import_entries_subscriptions_and_usage_queries_send_what_is_set() {
        let by_key = ImportKey::from_key("sk_live_4eC39HqLyjWDarjtT1zdp7dc", "acme", "business")
            .name("prod")
            .meta(serde_json::json!({"customer": "cus_1"}))
            .overrides(PlanOverrides {
                enforce: Some(false),
                ..PlanOverrides::default()
            });
        assert_eq!(
            serde_json::to_value(&by_key).unwrap(),
            serde_json::json!({"key": "sk_live_4eC39HqLyjWDarjtT1zdp7dc", "project": "acme",
                "plan": "business", "name": "prod", "meta": {"customer": "cus_1"},
                "overrides": {"enforce": false}})
        );
        let by_hash = ImportKey::from_sha256("a".repeat(64), "sk_live_9f", "acme", "trial")
            .expires_at(1_893_456_000_000);
        assert_eq!(
            serde_json::to_value(&by_hash).unwrap(),
            serde_json::json!({"sha256": "a".repeat(64), "prefix": "sk_live_9f", "project": "acme",
                "plan": "trial", "expires_at": 1_893_456_000_000_u64})
        );
        let moved = NewSubscription::new("https://r.example/h", ["order.*"])
            .secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        assert_eq!(
            serde_json::to_value(&moved).unwrap(),
            serde_json::json!({"url": "https://r.example/h", "events": ["order.*"],
                "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"})
        );
        assert_eq!(UsageQuery::default().path(), "/_postguard/v1/usage");
        assert_eq!(
            UsageQuery::default()
                .until(5)
                .granularity(Granularity::Day)
                .path(),
            "/_postguard/v1/usage?until=5&granularity=day"
        );
    }

    #[test]
    fn the_answers_of_issue_34_decode() {
        let stats: Stats = serde_json::from_str(
            r#"{"days":[{"date":"2026-12-04","requests":4,"errors":0,"server_errors":0,"missing_idempotency_key":1}],
                "top_paths":[],"error_share":0,"p50_ms":3,"p95_ms":9,
                "keys_missing_idempotency":[{"key_prefix":"sk_live_4eC3","requests":1}]}"#,
        )
        .unwrap();
        assert_eq!(stats.days[0].missing_idempotency_key, 1);
        assert_eq!(
            stats.keys_missing_idempotency,
            [KeyMissingIdempotency {
                key_prefix: "sk_live_4eC3".into(),
                requests: 1
            }]
        );
        let row: AuditRow = serde_json::from_str(
            r#"{"request_id":"req_1","time":1,"method":"GET","path":"/x","status":200,"response_bytes":2,
                "response_time_ms":3,"client_ip":null,"user_agent":null,"key_prefix":"pgk_a","project":"p",
                "idempotency_key":null,"replayed":false,"rate_limit_remaining":9,"origin":"billing",
                "would_refuse":"minute"}"#,
        )
        .unwrap();
        assert_eq!(
            (row.origin.as_deref(), row.would_refuse.as_deref()),
            (Some("billing"), Some("minute"))
        );
        let imported: ImportedKey =
            serde_json::from_str(r#"{"id":"key_1","prefix":"p","status":"exists"}"#).unwrap();
        assert_eq!(imported.status, ImportStatus::Exists);
        assert!(
            serde_json::from_str::<ImportedKey>(r#"{"id":"k","prefix":"p","status":"maybe"}"#)
                .is_err()
        );
    }

    #[test]
    fn ids_with_path_syntax_are_refused() {
        assert!(segment("sub_01").is_ok());
        for bad in ["", "a/b", "a?b", "..%2F"] {
            assert!(segment(bad).is_err(), "{bad}");
        }
    }
}
