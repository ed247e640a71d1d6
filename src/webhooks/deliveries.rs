//! The delivery log (`/_postguard/v1/deliveries`): list with filters and
//! cursor (newest first across the project's shards and the legacy rows),
//! one delivery with every attempt, manual retry and redirect (ADR 0035).

use postguard_core::audit::encode_cursor;
use postguard_core::config::Config;
use postguard_core::webhooks::ops::check_target_url;
use postguard_core::webhooks::protocol as wire;
use postguard_core::webhooks::records::{
    AttemptRecord, DeliveryQuery, DeliveryRecord, DeliveryView, Detail, Manual,
};
use postguard_core::webhooks::shard::ShardKey;
use postguard_core::webhooks::trace;
use postguard_core::{Invalid, Problem};
use serde::{Deserialize, Serialize};
use worker::Env;

use crate::handler::{self, Ctx, Project};

use super::shards;
use super::{policy, Job};
use crate::bindings;
use crate::durable::webhook_shard::ManualReq;
use crate::reject::Handled;
use crate::runtime::{now_ms, RequestCtx};

#[derive(Serialize)]
struct Attempt {
    attempt: u32,
    url: String,
    status_code: Option<u16>,
    error: Option<String>,
    response_excerpt: Option<String>,
    duration_ms: u64,
    request_id: String,
    at: u64,
    next_retry_at: Option<u64>,
    /// The X-Request-Id of the publish request (the delivery's `request_id`).
    publish_request_id: Option<String>,
    /// The headers the request was sent with, its signature redacted
    /// (`webhooks::trace`); null for attempts recorded before 0.4.
    request_headers: Option<serde_json::Map<String, serde_json::Value>>,
    /// The receiver's response headers, bounded; null without an answer.
    response_headers: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Header pairs as a JSON object (names are lower-case; a repeated name keeps its last value).
fn object(pairs: Vec<(String, String)>) -> serde_json::Map<String, serde_json::Value> {
    pairs
        .into_iter()
        .map(|(k, v)| (k, serde_json::Value::String(v)))
        .collect()
}

impl Attempt {
    fn of(a: AttemptRecord, d: &DeliveryRecord, publish_request_id: Option<String>) -> Attempt {
        let sent = trace::Request {
            event_id: &d.event_id,
            event_type: &d.event_type,
            attempt: a.attempt,
            request_id: &a.request_id,
            timestamp: a.at / 1_000,
        };
        let request_headers = trace::shown_request_headers(&sent, a.signed.as_ref()).map(object);
        Attempt {
            request_headers,
            response_headers: a.response_headers.map(object),
            attempt: a.attempt,
            url: a.url,
            status_code: a.status_code,
            error: a.error,
            response_excerpt: a.response_excerpt,
            duration_ms: a.duration_ms,
            request_id: a.request_id,
            at: a.at,
            next_retry_at: a.next_retry_at,
            publish_request_id,
        }
    }
}

#[derive(Serialize)]
struct WithAttempts {
    #[serde(flatten)]
    delivery: DeliveryView,
    /// The body the receiver gets (`{id, type, timestamp, data}`), for the
    /// dashboard's delivery view; null if the event is gone (retention).
    payload: Option<serde_json::Value>,
    attempts: Vec<Attempt>,
}

#[derive(Serialize)]
struct Page {
    data: Vec<DeliveryView>,
    next_cursor: Option<String>,
}

pub async fn list(cx: &Ctx<'_>) -> Handled {
    let (env, rc) = (cx.env, cx.rc);
    let (project, pairs) = cx.reader_project()?;
    let (q, limit) = DeliveryQuery::parse(&pairs)?;
    let mut rows = shards::page_deliveries(env, &project, &q, limit + 1).await?;
    let next_cursor = if rows.len() > limit as usize {
        rows.truncate(limit as usize);
        rows.last().map(|d| encode_cursor(d.created_at, &d.id))
    } else {
        None
    };
    let data = rows.into_iter().map(|d| d.view(None)).collect();
    handler::json(rc, 200, &Page { data, next_cursor }, &[])
}

/// Delivery `id` of `project` with its attempts and event, and its shard.
async fn load(env: &Env, cfg: &Config, project: &str, id: &str) -> Handled<(ShardKey, Detail)> {
    shards::find(env, cfg, project, id, now_ms())
        .await?
        .ok_or_else(|| Problem::not_found("delivery", id).into())
}

pub async fn get(cx: &Ctx<'_>, id: &str) -> Handled {
    let (env, cfg, rc) = (cx.env, cx.cfg, cx.rc);
    let (project, _) = cx.reader_project()?;
    let (_, detail) = load(env, cfg, &project, id).await?;
    let request_id = detail.event.as_ref().and_then(|e| e.request_id.clone());
    let payload = detail
        .event
        .as_ref()
        .and_then(|e| serde_json::from_slice(e.payload.as_bytes()).ok());
    let delivery = &detail.delivery;
    let attempts = detail
        .attempts
        .into_iter()
        .map(|a| Attempt::of(a, delivery, request_id.clone()))
        .collect();
    let body = WithAttempts {
        delivery: detail.delivery.view(request_id),
        payload,
        attempts,
    };
    handler::json(rc, 200, &body, &[])
}

#[derive(Serialize)]
struct Queued<'a> {
    id: &'a str,
    /// The number the attempt will have if nothing else runs first.
    attempt: u32,
    status: &'static str,
}

/// Claims a manual attempt in the delivery's shard (409 past the bound),
/// then queues it (a retry, or a redirect to `redirect_url`) → 202.
async fn queue_manual(
    env: &Env,
    cfg: &Config,
    rc: &RequestCtx,
    shard: &ShardKey,
    id: &str,
    redirect_url: Option<String>,
) -> Handled {
    let req = ManualReq {
        delivery_id: id.to_string(),
        max: cfg.settings.webhooks.manual_attempts_per_delivery,
        now: now_ms(),
    };
    let d = match shards::call::<wire::ManualAttempt>(env, shard, &req).await? {
        Manual::Queued { delivery } => delivery,
        Manual::LimitReached => {
            return Err(postguard_core::webhooks::capacity::manual_refused(&cfg.settings).into())
        }
        Manual::NotFound => return Err(Problem::not_found("delivery", id).into()),
    };
    let job = Job {
        project: Some(shard.project.clone()),
        subscription_id: Some(d.subscription_id.clone()),
        ..Job::manual(d.id.clone(), redirect_url)
    };
    env.queue(bindings::DELIVERIES)?.send(job).await?;
    let queued = Queued {
        id: &d.id,
        attempt: d.attempts_made + 1,
        status: "queued",
    };
    handler::json(rc, 202, &queued, &[])
}

/// `POST /{id}/retry`: one more attempt now, numbered after the last one.
pub async fn retry(cx: &Ctx<'_>, project: &Project, id: &str) -> Handled {
    let (env, cfg, rc) = (cx.env, cx.cfg, cx.rc);
    let project = project.as_str();
    let (shard, detail) = load(env, cfg, project, id).await?;
    queue_manual(env, cfg, rc, &shard, &detail.delivery.id, None).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RedirectBody {
    url: String,
}

/// `POST /{id}/redirect {url}`: send the event once to another URL (signed,
/// same webhook-id); the delivery's receiver and status stay as they are.
pub async fn redirect(cx: &Ctx<'_>, project: &Project, id: &str) -> Handled {
    let (env, cfg, rc) = (cx.env, cx.cfg, cx.rc);
    let project = project.as_str();
    // The URL rules, with the configured public URL's capture URLs exempt
    // (never the origin a request's `Host` claims); the consumer checks again
    // right before it sends.
    let url = match serde_json::from_slice::<RedirectBody>(&cx.body) {
        Ok(b) => check_target_url(&b.url, cfg.settings.public_origin(), &policy(cfg))?,
        Err(e) => return Err(Invalid(format!("body must be a JSON object {{url}}: {e}")).into()),
    };
    let (shard, detail) = load(env, cfg, project, id).await?;
    queue_manual(env, cfg, rc, &shard, &detail.delivery.id, Some(url)).await
}
