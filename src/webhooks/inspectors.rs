//! Built-in inspectors (CONTRACT §11): `POST /_postguard/v1/inspectors`
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

use postguard_core::webhooks::capture::{self, Usage};
use postguard_core::webhooks::ops::{INSPECTOR_MAX_BODY, INSPECTOR_MAX_REQUESTS, INSPECTOR_TTL_MS};
use postguard_core::webhooks::{capacity, signature};
use postguard_core::{ErrorCode, Problem};
use serde::{Deserialize, Serialize};
use worker::wasm_bindgen::JsValue;
use worker::{Env, Result};

use super::{new_id, num, text};
use crate::admin::Ctx;
use crate::ip_limit;
use crate::reject::{Handled, Reject};
use crate::runtime::{now_ms, random_bytes};
use crate::{bindings, http};

#[derive(Serialize)]
struct Created {
    id: String,
    url: String,
    expires_at: u64,
}

/// `POST /inspectors` → 201 `{id, url, expires_at}`. The URL is on the
/// configured `public_url` (relative without one), never on the host a
/// request named.
pub async fn create(cx: &Ctx<'_>) -> Handled {
    let (env, cfg, rc) = (cx.env, cx.cfg, cx.rc);
    let project = cx.project()?;
    let bytes =
        random_bytes::<24>().map_err(|e| worker::Error::RustError(format!("random: {e}")))?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let id = new_id("insp_");
    let now = now_ms();
    let expires_at = now + INSPECTOR_TTL_MS;
    // Creating an inspector (the project's own act) counts against its daily
    // bytes (ADR 0017); what senders post to it does not.
    super::usage::admit(env, cfg, project, super::usage::Storing::Bytes).await?;
    let db = env.d1(bindings::DB)?;
    db.batch(vec![
        db.prepare("INSERT INTO inspectors (id, project, token, expires_at, created_at) VALUES (?, ?, ?, ?, ?)")
            .bind(&[text(&id), text(project), text(&token), num(expires_at), num(now)])?,
        super::usage::charge(&db, project, capacity::INSPECTOR_BYTES, now)?,
    ])
    .await?;
    let url = format!(
        "{}/_postguard/inspect/{token}",
        cfg.settings.public_origin()
    );
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
    minute: Option<u64>,
    minute_count: Option<u32>,
    minute_bytes: Option<u64>,
    day: Option<u64>,
    day_count: Option<u32>,
    day_bytes: Option<u64>,
}

impl Inspector {
    fn usage(&self) -> Usage {
        Usage {
            minute: self.minute.unwrap_or(0),
            minute_count: self.minute_count.unwrap_or(0),
            minute_bytes: self.minute_bytes.unwrap_or(0),
            day: self.day.unwrap_or(0),
            day_count: self.day_count.unwrap_or(0),
            day_bytes: self.day_bytes.unwrap_or(0),
        }
    }
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

/// The inspector of a capture token, live, with its budget's usage.
async fn live_inspector(env: &Env, token: &str) -> Result<Option<Inspector>> {
    env.d1(bindings::DB)?
        .prepare(
            "SELECT i.id, i.project, u.minute, u.minute_count, u.minute_bytes, u.day, u.day_count, u.day_bytes              FROM inspectors i LEFT JOIN inspector_usage u ON u.inspector_id = i.id WHERE i.token = ? AND i.expires_at > ?",
        )
        .bind(&[text(token), num(now_ms())])?
        .first(None)
        .await
}

/// `POST /_postguard/inspect/<token>`: records the request (bounded), 200.
/// An unknown or expired token is 404 (and counts against the sender's
/// address, as a wrong credential does); over the inspector's budget, 429.
pub async fn capture(cx: &Ctx<'_>, token: &str) -> Handled {
    let (env, cfg, rc) = (cx.env, cx.cfg, cx.rc);
    let Some(inspector) = live_inspector(env, token).await? else {
        ip_limit::charge(env, cfg, rc).await?;
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
    let valid = signature_valid.map_or(JsValue::NULL, |v| num(u64::from(v)));
    let db = env.d1(bindings::DB)?;
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
        // Only the newest captures are kept.
        db.prepare("DELETE FROM inspector_requests WHERE inspector_id = ? AND seq NOT IN (SELECT seq FROM inspector_requests WHERE inspector_id = ? ORDER BY seq DESC LIMIT ?)")
            .bind(&[text(&inspector.id), text(&inspector.id), num(u64::from(INSPECTOR_MAX_REQUESTS))])?,
    ])
    .await?;
    http::json(rc, 200, &serde_json::json!({ "captured": true }), &[])
}

/// Charges one capture of `size` bytes to the inspector's own budget
/// (compare-and-set on the usage read with the inspector: a capture racing
/// another is refused with `Retry-After: 1` rather than counted twice).
async fn charge_capture(
    env: &Env,
    cfg: &postguard_core::config::Config,
    inspector: &Inspector,
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
    let fresh = inspector.minute.is_none();
    let res = env
        .d1(bindings::DB)?
        .prepare(
            "INSERT INTO inspector_usage (inspector_id, minute, minute_count, minute_bytes, day, day_count, day_bytes)              VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (inspector_id) DO UPDATE SET              minute = ?2, minute_count = ?3, minute_bytes = ?4, day = ?5, day_count = ?6, day_bytes = ?7              WHERE ?8 = 0 AND minute = ?9 AND minute_count = ?10 AND day = ?11 AND day_count = ?12",
        )
        .bind(&[
            text(&inspector.id),
            num(next.minute),
            num(u64::from(next.minute_count)),
            num(next.minute_bytes),
            num(next.day),
            num(u64::from(next.day_count)),
            num(next.day_bytes),
            num(u64::from(fresh)),
            num(used.minute),
            num(u64::from(used.minute_count)),
            num(used.day),
            num(u64::from(used.day_count)),
        ])?
        .run()
        .await?;
    match res.meta()?.and_then(|m| m.changes).unwrap_or(0) {
        0 => Err(Problem::new(
            ErrorCode::RateLimitExceeded,
            "this capture URL is taking another request; retry",
        )
        .with_retry_after(1)
        .into()),
        _ => Ok(()),
    }
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
pub async fn requests(cx: &Ctx<'_>, id: &str) -> Handled {
    let (env, rc) = (cx.env, cx.rc);
    let project = cx.project()?;
    let db = env.d1(bindings::DB)?;
    let found: Option<Inspector> = db
        .prepare("SELECT id, project FROM inspectors WHERE id = ? AND project = ?")
        .bind(&[text(id), text(project)])?
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
