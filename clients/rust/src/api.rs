//! Typed methods for the gateway's own endpoints (`/_postguard/v1/…`).
//!
//! Each method uses the client's token: an API key for `me`, webhooks, deliveries,
//! audit and stats; `ADMIN_TOKEN` for keys and portal links; `ORIGIN_TOKEN` for
//! publishing events.
//!
//! Every mutating method sends one Idempotency-Key for all its attempts, and the gateway
//! honours it on its own endpoints (CONTRACT §13): a retry after a lost answer gets the
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
    pub limit: u64,
    pub remaining: u64,
    /// Unix seconds.
    pub reset: u64,
    pub window_s: u64,
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
}

/// A new subscription.
#[derive(Debug, Clone, Serialize)]
pub struct NewSubscription {
    pub url: String,
    pub events: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
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
}

/// `GET /stats`.
#[derive(Debug, Clone, Deserialize)]
pub struct Stats {
    pub days: Vec<StatsDay>,
    pub top_paths: Vec<TopPath>,
    pub error_share: f64,
    pub p50_ms: Option<f64>,
    pub p95_ms: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct StatsDay {
    pub date: String,
    pub requests: u64,
    pub errors: u64,
    pub server_errors: u64,
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
    /// gateway treats a known id as a no-op).
    pub async fn publish_event(
        &self,
        project: &str,
        event_type: &str,
        data: &Value,
        id: Option<&str>,
    ) -> Result<String, Error> {
        #[derive(Deserialize)]
        struct Published {
            id: String,
        }
        let id = id.map_or_else(
            || format!("evt_{}", uuid::Uuid::new_v4().simple()),
            str::to_owned,
        );
        let body =
            serde_json::json!({"project": project, "type": event_type, "data": data, "id": id});
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

#[cfg(test)]
mod tests {
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
    fn ids_with_path_syntax_are_refused() {
        assert!(segment("sub_01").is_ok());
        for bad in ["", "a/b", "a?b", "..%2F"] {
            assert!(segment(bad).is_err(), "{bad}");
        }
    }
}
