//! Built-in inspectors (CONTRACT §11): `POST /_postguard/v1/inspectors`
//! creates a capture URL on the gateway itself, `/_postguard/inspect/<token>`
//! (unguessable, 24 h), which records what it receives; `GET
//! /inspectors/{id}/requests` lists the captures, each with whether its
//! `webhook-signature` verifies under one of the project's subscription
//! secrets. `redirect` accepts the capture URL.

use postguard_core::config::Config;
use postguard_core::webhooks::ops::{INSPECTOR_MAX_BODY, INSPECTOR_MAX_REQUESTS, INSPECTOR_TTL_MS};
use postguard_core::webhooks::{capacity, signature};
use postguard_core::{ErrorCode, Problem};
use serde::{Deserialize, Serialize};
use worker::wasm_bindgen::JsValue;
use worker::{Env, Request, Result};

use super::{new_id, num, text};
use crate::reject::Handled;
use crate::runtime::{now_ms, random_bytes, RequestCtx};
use crate::{auth, bindings, http};

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
    let db = env.d1(bindings::DB)?;
    db.batch(vec![
        db.prepare("INSERT INTO inspectors (id, project, token, expires_at, created_at) VALUES (?, ?, ?, ?, ?)")
            .bind(&[text(&id), text(&project), text(&token), num(expires_at), num(now)])?,
        super::usage::charge(&db, &project, capacity::INSPECTOR_BYTES, now)?,
    ])
    .await?;
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

#[derive(Deserialize)]
struct Inspector {
    id: String,
    project: String,
}

#[derive(Deserialize)]
struct SubSecrets {
    secret: String,
    previous_secret: Option<String>,
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
    let subs: Vec<SubSecrets> = env
        .d1(bindings::DB)?
        .prepare("SELECT secret, previous_secret FROM subscriptions WHERE project = ?")
        .bind(&[text(project)])?
        .all()
        .await?
        .results()?;
    let now_s = now_ms() / 1_000;
    let ok = subs
        .iter()
        .flat_map(|s| std::iter::once(s.secret.as_str()).chain(s.previous_secret.as_deref()))
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
    let db = env.d1(bindings::DB)?;
    let inspector: Inspector = db
        .prepare("SELECT id, project FROM inspectors WHERE token = ? AND expires_at > ?")
        .bind(&[text(token), num(now_ms())])?
        .first(None)
        .await?
        .ok_or_else(|| {
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
    let valid = signature_valid.map_or(JsValue::NULL, |v| num(u64::from(v)));
    super::usage::admit(env, cfg, &inspector.project, super::usage::Storing::Bytes).await?;
    let headers = serde_json::to_string(&headers)?;
    let kept = String::from_utf8_lossy(kept);
    let charged = capacity::capture_bytes(headers.len() as u64, kept.len() as u64);
    db.batch(vec![
        db.prepare("INSERT INTO inspector_requests (inspector_id, at, method, headers, body, signature_valid) VALUES (?, ?, ?, ?, ?, ?)")
            .bind(&[
                text(&inspector.id),
                num(now_ms()),
                text(&req.inner().method()),
                text(&headers),
                text(&kept),
                valid,
            ])?,
        super::usage::charge(&db, &inspector.project, charged, now_ms())?,
        // Only the newest captures are kept.
        db.prepare("DELETE FROM inspector_requests WHERE inspector_id = ? AND seq NOT IN (SELECT seq FROM inspector_requests WHERE inspector_id = ? ORDER BY seq DESC LIMIT ?)")
            .bind(&[text(&inspector.id), text(&inspector.id), num(u64::from(INSPECTOR_MAX_REQUESTS))])?,
    ])
    .await?;
    http::json(rc, 200, &serde_json::json!({ "captured": true }), &[])
}

#[derive(Deserialize)]
struct CapturedRow {
    at: u64,
    method: String,
    headers: String,
    body: String,
    signature_valid: Option<u8>,
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
    let db = env.d1(bindings::DB)?;
    let found: Option<Inspector> = db
        .prepare("SELECT id, project FROM inspectors WHERE id = ? AND project = ?")
        .bind(&[text(id), text(&project)])?
        .first(None)
        .await?;
    found.ok_or_else(|| Problem::not_found("inspector", id))?;
    let rows: Vec<CapturedRow> = db
        .prepare("SELECT at, method, headers, body, signature_valid FROM inspector_requests WHERE inspector_id = ? ORDER BY seq")
        .bind(&[text(id)])?
        .all()
        .await?
        .results()?;
    let data: Vec<Captured> = rows
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
