//! The delivery log (`/_postguard/v1/deliveries`): list with filters and
//! cursor, one delivery with every attempt, manual retry and redirect.

use postguard_core::audit::{decode_cursor, encode_cursor, parse_time};
use postguard_core::keys::parse_limit;
use postguard_core::webhooks::delivery::Status;
use postguard_core::webhooks::ops::check_target_url;
use postguard_core::{Invalid, Problem};
use serde::{Deserialize, Serialize};
use worker::wasm_bindgen::JsValue;
use worker::{Env, Result};

use super::{num, policy, text, Job};
use crate::admin::Ctx;
use crate::reject::Handled;
use crate::runtime::RequestCtx;
use crate::{bindings, http};

#[derive(Serialize, Deserialize, Clone)]
pub struct Delivery {
    pub id: String,
    pub event_id: String,
    pub event_type: String,
    pub subscription_id: String,
    pub url: String,
    pub status: Status,
    pub attempts_made: u32,
    pub next_attempt_at: Option<u64>,
    pub created_at: u64,
    /// The X-Request-Id of the publish request that created it (trace).
    pub request_id: Option<String>,
}

#[derive(Serialize, Deserialize)]
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
    #[serde(default)]
    publish_request_id: Option<String>,
}

#[derive(Serialize)]
struct WithAttempts {
    #[serde(flatten)]
    delivery: Delivery,
    /// The body the receiver gets (`{id, type, timestamp, data}`), for the
    /// dashboard's delivery view; null if the event is gone (retention).
    payload: Option<serde_json::Value>,
    attempts: Vec<Attempt>,
}

#[derive(Deserialize)]
struct Payload {
    payload: String,
}

#[derive(Serialize)]
struct Page {
    data: Vec<Delivery>,
    next_cursor: Option<String>,
}

const COLUMNS: &str = "d.id, d.event_id, d.event_type, d.subscription_id, d.url, d.status, d.attempts_made, d.next_attempt_at, d.created_at, r.request_id \
     FROM deliveries d LEFT JOIN event_requests r ON r.project = d.project AND r.event_id = d.event_id";

pub async fn list(cx: &Ctx<'_>) -> Handled {
    let (req, env, rc) = (&cx.req, cx.env, cx.rc);
    let project = cx.project()?;
    let mut sql = format!("SELECT {COLUMNS} WHERE d.project = ?");
    let mut args: Vec<JsValue> = vec![text(project)];
    let mut limit = 50u32;
    let pairs: Vec<(String, String)> = req
        .url()?
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    for (k, v) in &pairs {
        let parsed: std::result::Result<(), String> = (|| {
            match k.as_str() {
                "status" => {
                    let s = Status::parse(v)
                        .ok_or_else(|| format!("status: must be one of {}", Status::list()))?;
                    sql.push_str(" AND status = ?");
                    args.push(text(s.as_str()));
                }
                "event_type" => {
                    if v.is_empty() || v.len() > 128 {
                        return Err("event_type: must be 1-128 characters".to_string());
                    }
                    sql.push_str(" AND event_type = ?");
                    args.push(text(v));
                }
                "since" => {
                    sql.push_str(" AND created_at >= ?");
                    args.push(num(parse_time("since", v)?));
                }
                "until" => {
                    sql.push_str(" AND created_at <= ?");
                    args.push(num(parse_time("until", v)?));
                }
                "limit" => limit = parse_limit(Some(v))?,
                "cursor" => {
                    let (t, id) = decode_cursor(v)?;
                    sql.push_str(" AND (created_at < ? OR (created_at = ? AND id < ?))");
                    args.extend([num(t), num(t), text(&id)]);
                }
                other => {
                    return Err(format!(
                        "{}: unknown parameter",
                        other.chars().take(64).collect::<String>()
                    ))
                }
            }
            Ok(())
        })();
        parsed.map_err(Invalid)?;
    }
    sql.push_str(" ORDER BY created_at DESC, id DESC LIMIT ?");
    args.push(num(u64::from(limit) + 1));
    let mut data: Vec<Delivery> = env
        .d1(bindings::DB)?
        .prepare(sql)
        .bind(&args)?
        .all()
        .await?
        .results()?;
    let next_cursor = if data.len() > limit as usize {
        data.truncate(limit as usize);
        data.last().map(|d| encode_cursor(d.created_at, &d.id))
    } else {
        None
    };
    http::json(rc, 200, &Page { data, next_cursor }, &[])
}

pub async fn load(env: &Env, project: &str, id: &str) -> Result<Option<Delivery>> {
    env.d1(bindings::DB)?
        .prepare(format!("SELECT {COLUMNS} WHERE d.id = ? AND d.project = ?"))
        .bind(&[text(id), text(project)])?
        .first(None)
        .await
}

pub async fn get(cx: &Ctx<'_>, id: &str) -> Handled {
    let (env, rc) = (cx.env, cx.rc);
    let project = cx.project()?;
    let Some(delivery) = load(env, project, id).await? else {
        return Err(Problem::not_found("delivery", id).into());
    };
    let mut attempts: Vec<Attempt> = env
        .d1(bindings::DB)?
        .prepare(
            "SELECT attempt, url, status_code, error, response_excerpt, duration_ms, request_id, at, next_retry_at \
             FROM attempts WHERE delivery_id = ? ORDER BY at, attempt",
        )
        .bind(&[text(id)])?
        .all()
        .await?
        .results()?;
    for a in &mut attempts {
        a.publish_request_id.clone_from(&delivery.request_id);
    }
    let payload: Option<Payload> = env
        .d1(bindings::DB)?
        .prepare("SELECT payload FROM events WHERE project = ? AND id = ?")
        .bind(&[text(project), text(&delivery.event_id)])?
        .first(None)
        .await?;
    let payload = payload.and_then(|p| serde_json::from_slice(p.payload.as_bytes()).ok());
    http::json(
        rc,
        200,
        &WithAttempts {
            delivery,
            payload,
            attempts,
        },
        &[],
    )
}

#[derive(Serialize)]
struct Queued<'a> {
    id: &'a str,
    /// The number the attempt will have if nothing else runs first.
    attempt: u32,
    status: &'static str,
}

/// Queues a manual attempt (a retry, or a redirect to `redirect_url`) → 202.
async fn queue_manual(
    env: &Env,
    rc: &RequestCtx,
    d: &Delivery,
    redirect_url: Option<String>,
) -> Handled {
    let job = Job::manual(d.id.clone(), redirect_url);
    env.queue(bindings::DELIVERIES)?.send(job).await?;
    let queued = Queued {
        id: &d.id,
        attempt: d.attempts_made + 1,
        status: "queued",
    };
    http::json(rc, 202, &queued, &[])
}

/// `POST /{id}/retry`: one more attempt now, numbered after the last one.
pub async fn retry(cx: &Ctx<'_>, id: &str) -> Handled {
    let (env, cfg, rc) = (cx.env, cx.cfg, cx.rc);
    let project = cx.project()?;
    let Some(d) = load(env, project, id).await? else {
        return Err(Problem::not_found("delivery", id).into());
    };
    super::usage::manual(env, cfg, project, &d.id).await?;
    queue_manual(env, rc, &d, None).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RedirectBody {
    url: String,
}

/// `POST /{id}/redirect {url}`: send the event once to another URL (signed,
/// same webhook-id); the delivery's receiver and status stay as they are.
pub async fn redirect(cx: &Ctx<'_>, id: &str) -> Handled {
    let (env, cfg, rc) = (cx.env, cx.cfg, cx.rc);
    let project = cx.project()?;
    let body = &cx.body;
    // The URL rules, with the configured public URL's capture URLs exempt
    // (never the origin a request's `Host` claims); the consumer checks again
    // right before it sends.
    let url = match serde_json::from_slice::<RedirectBody>(body) {
        Ok(b) => check_target_url(&b.url, cfg.settings.public_origin(), &policy(cfg))?,
        Err(e) => return Err(Invalid(format!("body must be a JSON object {{url}}: {e}")).into()),
    };
    let Some(d) = load(env, project, id).await? else {
        return Err(Problem::not_found("delivery", id).into());
    };
    super::usage::manual(env, cfg, project, &d.id).await?;
    queue_manual(env, rc, &d, Some(url)).await
}
