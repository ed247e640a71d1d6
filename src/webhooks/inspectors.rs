//! Built-in inspectors (CONTRACT §11): `POST /_postguard/v1/inspectors`
//! creates a capture URL on the gateway itself, `/_postguard/inspect/<token>`
//! (unguessable, 24 h), which records what it receives; `GET
//! /inspectors/{id}/requests` lists the captures, each with whether its
//! `webhook-signature` verifies under one of the project's subscription
//! secrets. `redirect` accepts the capture URL.

use postguard_core::config::Config;
use postguard_core::webhooks::ops::{INSPECTOR_MAX_BODY, INSPECTOR_TTL_MS};
use postguard_core::webhooks::{capacity, signature};
use postguard_core::{ErrorCode, Problem};
use serde::Serialize;
use worker::{Env, Request, Result};

use super::directory::inspectors as rows;
use super::new_id;
use crate::reject::Handled;
use crate::runtime::{now_ms, random_bytes, RequestCtx};
use crate::{auth, http};

/// The gateway's own origin (scheme://host[:port]) as the caller sees it.
pub fn own_origin(req: &Request) -> Result<String> {
    Ok(req.url()?.origin().ascii_serialization())
}

#[derive(Serialize)]
struct Created {
    id: String,
    url: String,
    expires_at: u64,
}

/// `POST /inspectors` → 201 `{id, url, expires_at}`.
pub async fn create(req: &Request, env: &Env, cfg: &Config, rc: &RequestCtx) -> Handled {
    let project = auth::project(req, env, cfg, rc).await?;
    let bytes =
        random_bytes::<24>().map_err(|e| worker::Error::RustError(format!("random: {e}")))?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let id = new_id("insp_");
    let now = now_ms();
    let expires_at = now + INSPECTOR_TTL_MS;
    // Inspectors and their captures count against the project's daily bytes (ADR 0017).
    super::usage::admit(env, cfg, &project, super::usage::Storing::Bytes).await?;
    rows::insert(env, &id, &project, &token, expires_at, now).await?;
    let url = format!("{}/_postguard/inspect/{token}", own_origin(req)?);
    http::json(
        rc,
        201,
        &Created {
            id,
            url,
            expires_at,
        },
        &[],
    )
}

/// Whether the request's Standard Webhooks headers verify under any of the
/// project's secrets; `None` without a `webhook-signature`.
async fn verify(
    env: &Env,
    project: &str,
    headers: &worker::Headers,
    body: &[u8],
) -> Result<Option<bool>> {
    let get = |k: &str| headers.get(k).ok().flatten();
    let (Some(sig), Some(msg_id), Some(ts)) = (
        get("webhook-signature"),
        get("webhook-id"),
        get("webhook-timestamp"),
    ) else {
        return Ok(None);
    };
    let Ok(ts) = ts.parse::<u64>() else {
        return Ok(Some(false));
    };
    let secrets = super::directory::subscriptions::project_secrets(env, project).await?;
    let now_s = now_ms() / 1_000;
    let ok = secrets
        .iter()
        .any(|secret| signature::verify(secret, &msg_id, ts, body, &sig, now_s, 300));
    Ok(Some(ok))
}

/// `POST /_postguard/inspect/<token>`: records the request (bounded), 200.
/// An unknown or expired token is 404.
pub async fn capture(
    mut req: Request,
    env: &Env,
    cfg: &Config,
    rc: &RequestCtx,
    token: &str,
) -> Handled {
    let inspector = rows::by_token(env, token, now_ms()).await?.ok_or_else(|| {
        Problem::new(
            ErrorCode::NotFound,
            "no inspector at this URL (unknown or expired)",
        )
    })?;
    let body = crate::request::body(&mut req, cfg).await?;
    let signature_valid = verify(env, &inspector.project, req.headers(), &body).await?;
    let headers: serde_json::Map<String, serde_json::Value> = req
        .headers()
        .entries()
        .map(|(k, v)| (k, serde_json::Value::String(v)))
        .collect();
    let kept = &body[..body.len().min(INSPECTOR_MAX_BODY)];
    super::usage::admit(env, cfg, &inspector.project, super::usage::Storing::Bytes).await?;
    let headers = serde_json::to_string(&headers)?;
    let kept = String::from_utf8_lossy(kept);
    let charged = capacity::capture_bytes(headers.len() as u64, kept.len() as u64);
    let method = req.inner().method();
    let capture = rows::Capture {
        method: &method,
        headers: &headers,
        body: &kept,
        signature_valid,
    };
    rows::capture(env, &inspector, &capture, charged, now_ms()).await?;
    http::json(rc, 200, &serde_json::json!({ "captured": true }), &[])
}

#[derive(Serialize)]
struct Captured {
    at: u64,
    method: String,
    headers: serde_json::Value,
    body: String,
    signature_valid: Option<bool>,
}

/// `GET /inspectors/{id}/requests` → `{data: [...]}`, oldest first (own project only).
pub async fn requests(
    req: &Request,
    env: &Env,
    cfg: &Config,
    rc: &RequestCtx,
    id: &str,
) -> Handled {
    let project = auth::project(req, env, cfg, rc).await?;
    rows::of_project(env, id, &project)
        .await?
        .ok_or_else(|| Problem::not_found("inspector", id))?;
    let data: Vec<Captured> = rows::captures(env, id)
        .await?
        .into_iter()
        .map(|r| Captured {
            at: r.at,
            method: r.method,
            headers: serde_json::from_slice(r.headers.as_bytes()).unwrap_or_default(),
            body: r.body,
            signature_valid: r.signature_valid.map(|v| v == 1),
        })
        .collect();
    http::json(rc, 200, &serde_json::json!({ "data": data }), &[])
}
