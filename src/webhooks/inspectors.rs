//! Built-in inspectors (docs/operating-webhooks.md): `POST /_postguard/v1/inspectors`
//! creates a capture URL on the gateway itself, `/_postguard/inspect/<token>`
//! (unguessable, 24 h), which records what it receives; `GET
//! /inspectors/{id}/requests` lists the captures, each with whether its
//! `webhook-signature` verifies under one of the project's subscription
//! secrets. `redirect` accepts the capture URL.
//!
//! A capture URL takes requests from anyone who holds it, so what it costs is
//! bounded by a budget of its own (`webhooks::capture`: captures and bytes
//! per minute and per day, over it 429 to the sender) and never charged to
//! the project: a sender cannot spend the project's publish quota. A
//! sender's `Authorization`, `Cookie` and `Proxy-Authorization` are stored as
//! `[redacted]`.

use postguard_core::webhooks::capture;
use postguard_core::webhooks::ops::{INSPECTOR_MAX_BODY, INSPECTOR_TTL_MS};
use postguard_core::webhooks::{capacity, signature};
use postguard_core::{ErrorCode, Problem};
use serde::Serialize;
use worker::{Env, Result};

use super::directory::inspectors as rows;
use super::new_id;
use crate::handler::{self, Ctx, Project};
use crate::reject::{Handled, Reject};
use crate::runtime::{now_ms, random_bytes};

#[derive(Serialize)]
struct Created {
    id: String,
    url: String,
    expires_at: u64,
}

/// `POST /inspectors` → 201 `{id, url, expires_at}`. The URL is on the
/// configured `public_url` (relative without one), never on the host a
/// request named.
pub async fn create(cx: &Ctx<'_>, project: &Project) -> Handled {
    let (env, cfg, rc) = (cx.env, cx.cfg, cx.rc);
    let project = project.as_str();
    let bytes =
        random_bytes::<24>().map_err(|e| worker::Error::RustError(format!("random: {e}")))?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let id = new_id("insp_");
    let now = now_ms();
    let expires_at = now + INSPECTOR_TTL_MS;
    // Creating an inspector (the project's own act) counts against its daily
    // bytes (ADR 0017); what senders post to it does not.
    super::usage::admit(env, cfg, project, super::usage::Storing::Bytes).await?;
    rows::insert(env, &id, project, &token, expires_at, now).await?;
    let url = format!(
        "{}/_postguard/inspect/{token}",
        cfg.settings.public_origin()
    );
    handler::json(
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
/// An unknown or expired token is 404 (which counts against the sender's
/// address, as every anonymous miss does: `ip_limit`); over the
/// inspector's budget, 429.
pub async fn capture(cx: &Ctx<'_>, token: &str) -> Handled {
    let (env, cfg, rc) = (cx.env, cx.cfg, cx.rc);
    let Some(inspector) = rows::by_token(env, token, now_ms()).await? else {
        return Err(Problem::new(
            ErrorCode::NotFound,
            "no inspector at this URL (unknown or expired)",
        )
        .into());
    };
    let req = &cx.req;
    let body = &cx.body;
    let headers: serde_json::Map<String, serde_json::Value> = req
        .headers()
        .entries()
        .map(|(k, v)| {
            let stored = capture::stored_value(&k, &v).to_string();
            (k, serde_json::Value::String(stored))
        })
        .collect();
    let kept = &body[..body.len().min(INSPECTOR_MAX_BODY)];
    let headers = serde_json::to_string(&headers)?;
    let kept = String::from_utf8_lossy(kept);
    let size = capacity::capture_bytes(headers.len() as u64, kept.len() as u64);
    charge_capture(env, cfg, &inspector, size).await?;
    let signature_valid = verify(env, &inspector.project, req.headers(), body).await?;
    let method = req.inner().method();
    let captured = rows::Capture {
        method: &method,
        headers: &headers,
        body: &kept,
        signature_valid,
    };
    rows::capture(env, &inspector, &captured, now_ms()).await?;
    handler::json(rc, 200, &serde_json::json!({ "captured": true }), &[])
}

/// Charges one capture of `size` bytes to the inspector's own budget
/// (compare-and-set on the usage read with the inspector: a capture racing
/// another is refused with `Retry-After: 1` rather than counted twice).
async fn charge_capture(
    env: &Env,
    cfg: &postguard_core::config::Config,
    inspector: &rows::Inspector,
    size: u64,
) -> Handled<()> {
    let used = inspector.usage();
    let next = capture::charge(used, size, &cfg.settings.webhooks, now_ms()).map_err(|over| {
        let window = if over.per_minute { "minute" } else { "day" };
        Reject::from(
            Problem::new(
                ErrorCode::RateLimitExceeded,
                format!("this capture URL has taken all it accepts this {window}; retry later"),
            )
            .with_retry_after(over.retry_after_s),
        )
    })?;
    let held = rows::charge_budget(env, inspector, &next).await?;
    match held {
        false => Err(Problem::new(
            ErrorCode::RateLimitExceeded,
            "this capture URL is taking another request; retry",
        )
        .with_retry_after(1)
        .into()),
        true => Ok(()),
    }
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
pub async fn requests(cx: &Ctx<'_>, project: &Project, id: &str) -> Handled {
    let (env, rc) = (cx.env, cx.rc);
    let project = project.as_str();
    rows::of_project(env, id, project)
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
    handler::json(rc, 200, &serde_json::json!({ "data": data }), &[])
}
