//! Inspectors and their captures in D1 (CONTRACT §11), and the per-project
//! day counters they are charged to (`webhook_usage`, ADR 0017): the bytes
//! quota counts them with the project's shards (ADR 0031).

use postguard_core::webhooks::capacity::{self, Usage};
use postguard_core::webhooks::ops::INSPECTOR_MAX_REQUESTS;
use serde::Deserialize;
use worker::wasm_bindgen::JsValue;
use worker::{D1Database, D1PreparedStatement, Env, Result};

use super::db;
use crate::d1::{num, text};

#[derive(Deserialize)]
pub struct Inspector {
    pub id: String,
    pub project: String,
}

/// One capture as stored (`signature_valid` 1, 0 or NULL).
#[derive(Deserialize)]
pub struct CapturedRow {
    pub at: u64,
    pub method: String,
    pub headers: String,
    pub body: String,
    pub signature_valid: Option<u8>,
}

/// One capture to store.
pub struct Capture<'a> {
    pub method: &'a str,
    /// The headers as a JSON object.
    pub headers: &'a str,
    pub body: &'a str,
    pub signature_valid: Option<bool>,
}

/// Charges `bytes` to the project's day, in the batch that stores them.
fn charge(d: &D1Database, project: &str, bytes: u64, now: u64) -> Result<D1PreparedStatement> {
    d.prepare(
        "INSERT INTO webhook_usage (project, day, bytes) VALUES (?, ?, ?) \
         ON CONFLICT (project, day) DO UPDATE SET bytes = bytes + excluded.bytes",
    )
    .bind(&[text(project), num(capacity::utc_day(now)), num(bytes)])
}

/// The project's D1-side counters of the day; the read also reports D1's
/// size for its guard.
pub async fn usage_today(env: &Env, project: &str, now: u64) -> Result<Usage> {
    let read = db(env)?
        .prepare(
            "SELECT events, deliveries, bytes FROM webhook_usage WHERE project = ? AND day = ?",
        )
        .bind(&[text(project), num(capacity::utc_day(now))])?
        .all()
        .await?;
    super::observe(&read);
    Ok(read
        .results::<Usage>()?
        .into_iter()
        .next()
        .unwrap_or_default())
}

/// Creates an inspector, charged to its project's day.
pub async fn insert(
    env: &Env,
    id: &str,
    project: &str,
    token: &str,
    expires_at: u64,
    now: u64,
) -> Result<()> {
    let d = db(env)?;
    d.batch(vec![
        d.prepare("INSERT INTO inspectors (id, project, token, expires_at, created_at) VALUES (?, ?, ?, ?, ?)")
            .bind(&[text(id), text(project), text(token), num(expires_at), num(now)])?,
        charge(&d, project, capacity::INSPECTOR_BYTES, now)?,
    ])
    .await?;
    Ok(())
}

/// The live inspector of a capture URL's token.
pub async fn by_token(env: &Env, token: &str, now: u64) -> Result<Option<Inspector>> {
    db(env)?
        .prepare("SELECT id, project FROM inspectors WHERE token = ? AND expires_at > ?")
        .bind(&[text(token), num(now)])?
        .first(None)
        .await
}

/// Inspector `id` of `project`.
pub async fn of_project(env: &Env, id: &str, project: &str) -> Result<Option<Inspector>> {
    db(env)?
        .prepare("SELECT id, project FROM inspectors WHERE id = ? AND project = ?")
        .bind(&[text(id), text(project)])?
        .first(None)
        .await
}

/// Stores a capture, charged `bytes`; only the newest captures are kept.
pub async fn capture(
    env: &Env,
    i: &Inspector,
    c: &Capture<'_>,
    bytes: u64,
    now: u64,
) -> Result<()> {
    let d = db(env)?;
    let valid = c
        .signature_valid
        .map_or(JsValue::NULL, |v| num(u64::from(v)));
    d.batch(vec![
        d.prepare("INSERT INTO inspector_requests (inspector_id, at, method, headers, body, signature_valid) VALUES (?, ?, ?, ?, ?, ?)")
            .bind(&[text(&i.id), num(now), text(c.method), text(c.headers), text(c.body), valid])?,
        charge(&d, &i.project, bytes, now)?,
        d.prepare("DELETE FROM inspector_requests WHERE inspector_id = ? AND seq NOT IN (SELECT seq FROM inspector_requests WHERE inspector_id = ? ORDER BY seq DESC LIMIT ?)")
            .bind(&[text(&i.id), text(&i.id), num(u64::from(INSPECTOR_MAX_REQUESTS))])?,
    ])
    .await?;
    Ok(())
}

/// An inspector's captures, oldest first.
pub async fn captures(env: &Env, id: &str) -> Result<Vec<CapturedRow>> {
    db(env)?
        .prepare("SELECT at, method, headers, body, signature_valid FROM inspector_requests WHERE inspector_id = ? ORDER BY seq")
        .bind(&[text(id)])?
        .all()
        .await?
        .results()
}
