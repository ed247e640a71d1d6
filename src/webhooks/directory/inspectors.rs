//! Inspectors and their captures in D1 (docs/operating-webhooks.md): an inspector is
//! charged to its project's day counter (`webhook_usage`, ADR 0017; the bytes
//! quota counts it with the project's shards, ADR 0035); its captures to a
//! budget of its own (`inspector_usage`), never to the project.

use postguard_core::webhooks::capacity::{self, Usage};
use postguard_core::webhooks::capture;
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
    minute: Option<u64>,
    minute_count: Option<u32>,
    minute_bytes: Option<u64>,
    day: Option<u64>,
    day_count: Option<u32>,
    day_bytes: Option<u64>,
}

impl Inspector {
    /// Its capture budget's usage as read with it.
    pub fn usage(&self) -> capture::Usage {
        capture::Usage {
            minute: self.minute.unwrap_or(0),
            minute_count: self.minute_count.unwrap_or(0),
            minute_bytes: self.minute_bytes.unwrap_or(0),
            day: self.day.unwrap_or(0),
            day_count: self.day_count.unwrap_or(0),
            day_bytes: self.day_bytes.unwrap_or(0),
        }
    }
}

const INSPECTOR: &str = "SELECT i.id, i.project, u.minute, u.minute_count, u.minute_bytes, u.day, u.day_count, u.day_bytes \
     FROM inspectors i LEFT JOIN inspector_usage u ON u.inspector_id = i.id";

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
    // The bytes charged today bound the project's publishes (its object keeps them).
    crate::durable::project_hub::invalidate(env, project).await;
    Ok(())
}

/// The live inspector of a capture URL's token, with its budget's usage.
pub async fn by_token(env: &Env, token: &str, now: u64) -> Result<Option<Inspector>> {
    db(env)?
        .prepare(format!(
            "{INSPECTOR} WHERE i.token = ? AND i.expires_at > ?"
        ))
        .bind(&[text(token), num(now)])?
        .first(None)
        .await
}

/// Inspector `id` of `project`.
pub async fn of_project(env: &Env, id: &str, project: &str) -> Result<Option<Inspector>> {
    db(env)?
        .prepare(format!("{INSPECTOR} WHERE i.id = ? AND i.project = ?"))
        .bind(&[text(id), text(project)])?
        .first(None)
        .await
}

/// Moves the inspector's capture budget from its usage as read with it to
/// `next`: a compare-and-set, so a capture racing another is not counted
/// twice; whether it held.
pub async fn charge_budget(env: &Env, i: &Inspector, next: &capture::Usage) -> Result<bool> {
    let used = i.usage();
    let fresh = i.minute.is_none();
    let res = db(env)?
        .prepare(
            "INSERT INTO inspector_usage (inspector_id, minute, minute_count, minute_bytes, day, day_count, day_bytes) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (inspector_id) DO UPDATE SET \
             minute = ?2, minute_count = ?3, minute_bytes = ?4, day = ?5, day_count = ?6, day_bytes = ?7 \
             WHERE ?8 = 0 AND minute = ?9 AND minute_count = ?10 AND day = ?11 AND day_count = ?12",
        )
        .bind(&[
            text(&i.id),
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
    Ok(res.meta()?.and_then(|m| m.changes).unwrap_or(0) > 0)
}

/// Stores a capture (charged to the inspector's own budget before, never to
/// the project); only the newest captures are kept.
pub async fn capture(env: &Env, i: &Inspector, c: &Capture<'_>, now: u64) -> Result<()> {
    let d = db(env)?;
    let valid = c
        .signature_valid
        .map_or(JsValue::NULL, |v| num(u64::from(v)));
    d.batch(vec![
        d.prepare("INSERT INTO inspector_requests (inspector_id, at, method, headers, body, signature_valid) VALUES (?, ?, ?, ?, ?, ?)")
            .bind(&[text(&i.id), num(now), text(c.method), text(c.headers), text(c.body), valid])?,
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
