//! Writing audit rows to D1 (after the response, via `waitUntil`) and the
//! retention sweep run by the cron trigger. A D1 failure is logged, never
//! propagated to the client.

use postguard_core::audit::{
    bounded, retention_cutoff_ms, AuditRow, MAX_PATH_LEN, MAX_USER_AGENT_LEN,
};
use worker::wasm_bindgen::JsValue;
use worker::{Env, Result};

use crate::bindings;
use crate::runtime::{now_ms, RequestCtx};

/// What is known of the request before it is handed to a handler.
pub struct Seen {
    pub method: String,
    pub path: String,
    pub client_ip: Option<String>,
    pub user_agent: Option<String>,
}

impl Seen {
    pub fn of(req: &worker::Request) -> Seen {
        let h = req.headers();
        let get = |n: &str| h.get(n).ok().flatten();
        Seen {
            method: bounded(&req.inner().method(), 16),
            // `path()` has no query string: queries are never recorded.
            path: bounded(&req.path(), MAX_PATH_LEN),
            client_ip: get("CF-Connecting-IP").map(|v| bounded(&v, 64)),
            user_agent: get("User-Agent").map(|v| bounded(&v, MAX_USER_AGENT_LEN)),
        }
    }
}

pub fn row(seen: Seen, rc: &RequestCtx, status: u16) -> AuditRow {
    let f = rc.facts.borrow();
    AuditRow {
        request_id: rc.request_id.clone(),
        time: rc.started_ms,
        method: seen.method,
        path: seen.path,
        status,
        response_bytes: f.response_bytes,
        response_time_ms: now_ms().saturating_sub(rc.started_ms),
        client_ip: seen.client_ip,
        user_agent: seen.user_agent,
        key_prefix: f.key_prefix.clone(),
        project: f.project.clone(),
        idempotency_key: f.idempotency_key.clone(),
        replayed: f.replayed,
        rate_limit_remaining: f.rate_limit_remaining,
    }
}

fn opt_text(v: &Option<String>) -> JsValue {
    v.as_deref().map_or(JsValue::NULL, JsValue::from_str)
}

fn num(v: u64) -> JsValue {
    JsValue::from_f64(v as f64)
}

pub async fn write(env: &Env, r: &AuditRow) -> Result<()> {
    let db = env.d1(bindings::AUDIT_DB)?;
    db.prepare(format!(
        "INSERT OR IGNORE INTO audit_log ({}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        postguard_core::audit::COLUMNS
    ))
    .bind(&[
        JsValue::from_str(&r.request_id),
        num(r.time),
        JsValue::from_str(&r.method),
        JsValue::from_str(&r.path),
        num(u64::from(r.status)),
        r.response_bytes.map_or(JsValue::NULL, num),
        num(r.response_time_ms),
        opt_text(&r.client_ip),
        opt_text(&r.user_agent),
        opt_text(&r.key_prefix),
        opt_text(&r.project),
        opt_text(&r.idempotency_key),
        num(u64::from(r.replayed)),
        r.rate_limit_remaining
            .map_or(JsValue::NULL, |v| num(u64::from(v))),
    ])?
    .run()
    .await?;
    Ok(())
}

/// Rows deleted per statement, and statements per cron run: bounded work.
const BATCH: u32 = 5_000;
const MAX_BATCHES: u32 = 40;

/// Deletes rows older than `days`; returns how many were deleted.
pub async fn sweep(env: &Env, days: u32) -> Result<u64> {
    let db = env.d1(bindings::AUDIT_DB)?;
    let cutoff = num(retention_cutoff_ms(now_ms(), days));
    let mut total = 0u64;
    for _ in 0..MAX_BATCHES {
        let res = db
            .prepare("DELETE FROM audit_log WHERE request_id IN (SELECT request_id FROM audit_log WHERE time < ? LIMIT ?)")
            .bind(&[cutoff.clone(), num(u64::from(BATCH))])?
            .run()
            .await?;
        let changed = res.meta()?.and_then(|m| m.changes).unwrap_or(0) as u64;
        total += changed;
        if changed < u64::from(BATCH) {
            break;
        }
    }
    Ok(total)
}
