//! The webhook rows of D1 from before the shards (migrations 0002-0007):
//! read as the oldest source of the log and the feed, moved into their shard
//! a whole event at a time when touched again (`shards::adopt`), and swept by
//! retention until empty (ADR 0017, ADR 0035). Nothing else writes them.

use postguard_core::webhooks::capacity::SWEEP_CHUNK;
use postguard_core::webhooks::delivery::Status;
use postguard_core::webhooks::records::{
    AttemptRecord, DeliveryQuery, DeliveryRecord, EventColumns, EventQuery, EventRecord, FeedRow,
    Imported, Summary,
};
use serde::Deserialize;
use worker::wasm_bindgen::JsValue;
use worker::{D1Result, Env, Result};

use super::db;
use crate::d1::{num, text};
use crate::webhooks::to_json;

const LEGACY_DELIVERY: &str = "SELECT d.id, d.event_id, d.event_type, d.subscription_id, d.url, d.status, d.attempts_made, \
     d.next_attempt_at, d.created_at, d.updated_at, o.enqueued_at AS queued_at, COALESCE(m.queued, 0) AS manual, r.request_id \
     FROM deliveries d LEFT JOIN outbox o ON o.delivery_id = d.id LEFT JOIN manual_attempts m ON m.delivery_id = d.id \
     LEFT JOIN event_requests r ON r.project = d.project AND r.event_id = d.event_id";

/// A legacy delivery row's project and event, found by id alone (a queue
/// message of the deployment before the shards names no project).
#[derive(Deserialize)]
pub struct LegacyRef {
    pub project: String,
    pub event_id: String,
    #[serde(default)]
    pub subscription_id: Option<String>,
}

pub async fn find(env: &Env, delivery_id: &str) -> Result<Option<LegacyRef>> {
    db(env)?
        .prepare("SELECT project, event_id, subscription_id FROM deliveries WHERE id = ?")
        .bind(&[text(delivery_id)])?
        .first(None)
        .await
}

/// The legacy page of a project's deliveries (newest first).
pub async fn list(
    env: &Env,
    project: &str,
    q: &DeliveryQuery,
    take: u32,
) -> Result<Vec<DeliveryRecord>> {
    let (conditions, rest) = q.sql_conditions(u64::from(take));
    let sql = format!("{LEGACY_DELIVERY} WHERE d.project = ?{conditions}");
    let mut args = vec![text(project)];
    args.extend(crate::d1::args(&rest));
    crate::d1::all(&db(env)?, sql, &args).await
}

#[derive(Deserialize)]
struct LegacyEvent {
    id: String,
    event_type: String,
    payload: String,
    created_at: u64,
    request_id: Option<String>,
}

impl From<LegacyEvent> for EventRecord {
    fn from(e: LegacyEvent) -> Self {
        EventRecord {
            id: e.id,
            event_type: e.event_type,
            payload: e.payload,
            created_at: e.created_at,
            request_id: e.request_id,
            ordering_key: None,
        }
    }
}

const LEGACY_EVENT: &str =
    "SELECT e.id, e.type AS event_type, e.payload, e.created_at, r.request_id \
     FROM events e LEFT JOIN event_requests r ON r.project = e.project AND r.event_id = e.id";

/// The legacy page of a project's events with their delivery summaries.
pub async fn feed(env: &Env, project: &str, q: &EventQuery, take: u32) -> Result<Vec<FeedRow>> {
    let columns = EventColumns {
        created_at: "e.created_at",
        id: "e.id",
        event_type: "e.type",
    };
    let (conditions, rest) = q.sql_conditions(columns, u64::from(take));
    let sql = format!("{LEGACY_EVENT} WHERE e.project = ?{conditions}");
    let mut args: Vec<JsValue> = vec![text(project)];
    args.extend(crate::d1::args(&rest));
    let d = db(env)?;
    let events: Vec<LegacyEvent> = crate::d1::all(&d, sql, &args).await?;
    if events.is_empty() {
        return Ok(Vec::new());
    }
    #[derive(Deserialize)]
    struct Count {
        event_id: String,
        status: Status,
        n: u32,
    }
    let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
    let counts: Vec<Count> = d
        .prepare("SELECT event_id, status, COUNT(*) AS n FROM deliveries WHERE project = ? AND event_id IN (SELECT value FROM json_each(?)) GROUP BY event_id, status")
        .bind(&[text(project), text(&to_json(&ids)?)])?
        .all()
        .await?
        .results()?;
    Ok(events
        .into_iter()
        .map(|e| {
            let mut summary = Summary::default();
            for c in counts.iter().filter(|c| c.event_id == e.id) {
                for _ in 0..c.n {
                    summary.count(c.status);
                }
            }
            FeedRow {
                event: e.into(),
                summary,
            }
        })
        .collect())
}

/// A legacy event whole (record, deliveries, attempts), to move into its shard.
pub async fn event(env: &Env, project: &str, event_id: &str) -> Result<Option<Imported>> {
    let d = db(env)?;
    let results = d
        .batch(vec![
            d.prepare(format!("{LEGACY_EVENT} WHERE e.project = ? AND e.id = ?"))
                .bind(&[text(project), text(event_id)])?,
            d.prepare(format!("{LEGACY_DELIVERY} WHERE d.project = ? AND d.event_id = ?"))
                .bind(&[text(project), text(event_id)])?,
            d.prepare(
                "SELECT a.delivery_id, a.request_id, a.attempt, a.url, a.status_code, a.error, a.response_excerpt, a.duration_ms, a.at, a.next_retry_at \
                 FROM attempts a JOIN deliveries d ON d.id = a.delivery_id WHERE d.project = ? AND d.event_id = ?",
            )
            .bind(&[text(project), text(event_id)])?,
        ])
        .await?;
    let (Some(e), Some(ds), Some(at)) = (results.first(), results.get(1), results.get(2)) else {
        return Ok(None);
    };
    let Some(event) = e.results::<LegacyEvent>()?.into_iter().next() else {
        return Ok(None);
    };
    Ok(Some(Imported {
        event: event.into(),
        deliveries: ds.results()?,
        attempts: at.results::<AttemptRecord>()?,
    }))
}

/// A page of a project's legacy delivery records created in `[since,
/// until)` after `after`, oldest first, each with its attempts (the archive
/// and exports).
pub async fn archive_page(
    env: &Env,
    project: &str,
    since: u64,
    until: u64,
    after: &(u64, String),
    take: u32,
) -> Result<Vec<postguard_core::archive::Archived>> {
    let d = db(env)?;
    let page: Vec<DeliveryRecord> = crate::d1::all(
        &d,
        format!(
            "{LEGACY_DELIVERY} WHERE d.project = ? AND d.created_at >= ? AND d.created_at < ? \
             AND (d.created_at > ? OR (d.created_at = ? AND d.id > ?)) ORDER BY d.created_at, d.id LIMIT ?"
        ),
        &[
            text(project),
            num(since),
            num(until),
            num(after.0),
            num(after.0),
            text(&after.1),
            num(u64::from(take)),
        ],
    )
    .await?;
    let ids: Vec<&str> = page.iter().map(|r| r.id.as_str()).collect();
    let attempts: Vec<AttemptRecord> = match ids.is_empty() {
        true => Vec::new(),
        false => crate::d1::all(
            &d,
            "SELECT delivery_id, request_id, attempt, url, status_code, error, response_excerpt, duration_ms, at, next_retry_at \
             FROM attempts WHERE delivery_id IN (SELECT value FROM json_each(?)) ORDER BY at, attempt",
            &[text(&to_json(&ids)?)],
        )
        .await?,
    };
    Ok(page
        .into_iter()
        .map(|delivery| postguard_core::archive::Archived {
            attempts: attempts
                .iter()
                .filter(|a| a.delivery_id == delivery.id)
                .cloned()
                .collect(),
            delivery,
        })
        .collect())
}

/// `(project, UTC day)` of legacy deliveries created before `before`, oldest
/// day first (what the archive writes before retention deletes them).
pub async fn days_before(env: &Env, before: u64, limit: u32) -> Result<Vec<(String, u64)>> {
    #[derive(Deserialize)]
    struct Day {
        project: String,
        day: u64,
    }
    let rows: Vec<Day> = crate::d1::all(
        &db(env)?,
        "SELECT project, created_at / 86400000 AS day FROM deliveries WHERE created_at < ? \
         GROUP BY project, day ORDER BY day LIMIT ?",
        &[num(before), num(u64::from(limit))],
    )
    .await?;
    Ok(rows.into_iter().map(|d| (d.project, d.day)).collect())
}

/// Deletes a legacy event whole once its shard holds it.
pub async fn delete(env: &Env, project: &str, event_id: &str) -> Result<()> {
    let d = db(env)?;
    let of_event = "SELECT id FROM deliveries WHERE project = ?1 AND event_id = ?2";
    let args = [text(project), text(event_id)];
    d.batch(vec![
        d.prepare(format!(
            "DELETE FROM attempts WHERE delivery_id IN ({of_event})"
        ))
        .bind(&args)?,
        d.prepare(format!(
            "DELETE FROM outbox WHERE delivery_id IN ({of_event})"
        ))
        .bind(&args)?,
        d.prepare(format!(
            "DELETE FROM manual_attempts WHERE delivery_id IN ({of_event})"
        ))
        .bind(&args)?,
        d.prepare("DELETE FROM deliveries WHERE project = ?1 AND event_id = ?2")
            .bind(&args)?,
        d.prepare("DELETE FROM event_requests WHERE project = ?1 AND event_id = ?2")
            .bind(&args)?,
        d.prepare("DELETE FROM events WHERE project = ?1 AND id = ?2")
            .bind(&args)?,
    ])
    .await?;
    Ok(())
}

/// Legacy events with a delivery whose next attempt is overdue since
/// `before` (their message was lost): the daily re-queue moves them into
/// their shard and re-plans them there.
pub async fn overdue(env: &Env, before: u64, limit: u32) -> Result<Vec<LegacyRef>> {
    crate::d1::all(
        &db(env)?,
        "SELECT project, event_id FROM deliveries WHERE next_attempt_at IS NOT NULL AND next_attempt_at < ? \
         GROUP BY project, event_id ORDER BY MIN(created_at) LIMIT ?",
        &[num(before), num(u64::from(limit))],
    )
    .await
}

/// Legacy events with a `paused` delivery of `subscription_id` (resume
/// moves them into their shard, then releases them there).
pub async fn held(env: &Env, subscription_id: &str, limit: u32) -> Result<Vec<LegacyRef>> {
    crate::d1::all(
        &db(env)?,
        "SELECT project, event_id FROM deliveries WHERE subscription_id = ? AND status = ? \
         GROUP BY project, event_id ORDER BY MIN(created_at) LIMIT ?",
        &[
            text(subscription_id),
            text(Status::Paused.as_str()),
            num(u64::from(limit)),
        ],
    )
    .await
}

/// Legacy events with a failed or dead-lettered delivery of
/// `subscription_id` created in `[since, until]` (recover moves them first).
pub async fn recoverable(
    env: &Env,
    subscription_id: &str,
    since: u64,
    until: u64,
    limit: u32,
) -> Result<Vec<LegacyRef>> {
    crate::d1::all(
        &db(env)?,
        "SELECT project, event_id FROM deliveries WHERE subscription_id = ? AND status IN (?, ?) AND created_at >= ? AND created_at <= ? \
         GROUP BY project, event_id ORDER BY MIN(created_at) LIMIT ?",
        &[
            text(subscription_id),
            text(Status::Failed.as_str()),
            text(Status::DeadLetter.as_str()),
            num(since),
            num(until),
            num(u64::from(limit)),
        ],
    )
    .await
}

/// The oldest `SWEEP_CHUNK` deliveries past the cutoff and what hangs off
/// them; the same ordered subquery in each statement of one transaction
/// selects the same rows. Returns the deliveries deleted.
pub async fn deliveries_round(env: &Env, cutoff: u64) -> Result<u64> {
    const OLDEST: &str =
        "SELECT id FROM deliveries WHERE created_at < ?1 ORDER BY created_at LIMIT ?2";
    let args = [num(cutoff), num(SWEEP_CHUNK)];
    let db = db(env)?;
    let results = db
        .batch(vec![
            db.prepare(format!(
                "DELETE FROM attempts WHERE delivery_id IN ({OLDEST})"
            ))
            .bind(&args)?,
            db.prepare(format!(
                "DELETE FROM outbox WHERE delivery_id IN ({OLDEST})"
            ))
            .bind(&args)?,
            db.prepare(format!(
                "DELETE FROM manual_attempts WHERE delivery_id IN ({OLDEST})"
            ))
            .bind(&args)?,
            db.prepare(format!("DELETE FROM deliveries WHERE id IN ({OLDEST})"))
                .bind(&args)?,
        ])
        .await?;
    Ok(changes(results.last()))
}

/// The oldest `SWEEP_CHUNK` events past the cutoff with no delivery left,
/// and their publish request ids. Returns the events deleted.
pub async fn events_round(env: &Env, cutoff: u64) -> Result<u64> {
    const GONE: &str = "SELECT rowid FROM events e WHERE created_at < ?1 \
         AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.project = e.project AND d.event_id = e.id) \
         ORDER BY created_at LIMIT ?2";
    let args = [num(cutoff), num(SWEEP_CHUNK)];
    let db = db(env)?;
    let results = db
        .batch(vec![
            db.prepare(format!(
                "DELETE FROM event_requests WHERE (project, event_id) IN (SELECT project, id FROM events WHERE rowid IN ({GONE}))"
            ))
            .bind(&args)?,
            db.prepare(format!("DELETE FROM events WHERE rowid IN ({GONE})"))
                .bind(&args)?,
        ])
        .await?;
    Ok(changes(results.last()))
}

fn changes(r: Option<&D1Result>) -> u64 {
    r.and_then(|r| r.meta().ok().flatten())
        .and_then(|m| m.changes)
        .map_or(0, |n| n as u64)
}

/// The rest of the daily sweep: old tasks, expired inspectors with their
/// captures and budgets, expired portal sessions, old counters and legacy
/// outbox rows.
pub async fn sweep_rest(env: &Env, cutoff: u64, now: u64, oldest_day: u64) -> Result<()> {
    let db = db(env)?;
    let results = db
        .batch(vec![
            db.prepare("DELETE FROM tasks WHERE updated_at < ?")
                .bind(&[num(cutoff)])?,
            db.prepare("DELETE FROM inspector_requests WHERE inspector_id IN (SELECT id FROM inspectors WHERE expires_at < ?)")
                .bind(&[num(now)])?,
            db.prepare("DELETE FROM inspector_usage WHERE inspector_id IN (SELECT id FROM inspectors WHERE expires_at < ?)")
                .bind(&[num(now)])?,
            db.prepare("DELETE FROM inspectors WHERE expires_at < ?")
                .bind(&[num(now)])?,
            db.prepare("DELETE FROM portal_sessions WHERE expires_at < ?")
                .bind(&[num(now)])?,
            db.prepare("DELETE FROM webhook_usage WHERE day < ?")
                .bind(&[num(oldest_day)])?,
            // Outbox rows of deliveries swept before outbox rows were (one chunk a day).
            db.prepare("DELETE FROM outbox WHERE rowid IN (SELECT rowid FROM outbox WHERE created_at < ? LIMIT ?)")
                .bind(&[num(cutoff), num(SWEEP_CHUNK)])?,
        ])
        .await?;
    if let Some(r) = results.last() {
        super::observe(r);
    }
    Ok(())
}
