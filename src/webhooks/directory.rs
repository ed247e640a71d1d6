//! The webhooks' D1 side (ADR 0031): the directory of shards, the
//! subscriptions as the publish path and the consumer read them, and the
//! legacy rows of the deployments before the shards (read as the oldest
//! source, and moved into their shard whole when an event is touched again).
//! Apart from the shard adapter, this is the only webhook file holding
//! delivery-path SQL.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use postguard_core::webhooks::capacity::SWEEP_CHUNK;
use postguard_core::webhooks::delivery::Status;
use postguard_core::webhooks::ops::SubState;
use postguard_core::webhooks::records::{
    AttemptRecord, DeliveryQuery, DeliveryRecord, EventQuery, EventRecord, FeedRow, Imported,
    Summary,
};
use postguard_core::webhooks::shard::ShardKey;
use serde::Deserialize;
use worker::wasm_bindgen::JsValue;
use worker::{D1Database, D1Result, Env, Result};

use super::{num, text, to_json};
use crate::bindings;

thread_local! {
    /// Shards this isolate entered in the directory (one INSERT each).
    static ENTERED: RefCell<HashSet<ShardKey>> = RefCell::new(HashSet::new());
}

fn db(env: &Env) -> Result<D1Database> {
    env.d1(bindings::DB)
}

/// Enters `shards` in the directory before anything is written to them, so
/// that listing and retention find every shard that holds a record; once
/// per shard per isolate.
pub async fn enter(env: &Env, shards: &[ShardKey], bucket_ms: u64, now: u64) -> Result<()> {
    let new: Vec<&ShardKey> = ENTERED.with(|e| {
        let e = e.borrow();
        shards.iter().filter(|s| !e.contains(*s)).collect()
    });
    if new.is_empty() {
        return Ok(());
    }
    let rows: Vec<(&str, u64, u64)> = new
        .iter()
        .map(|s| (s.project.as_str(), s.start_ms, s.start_ms + bucket_ms))
        .collect();
    let d = db(env)?;
    let r = d
        .prepare(
            "INSERT OR IGNORE INTO webhook_shards (project, start_ms, end_ms, created_at) \
             SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'), ? FROM json_each(?)",
        )
        .bind(&[num(now), text(&to_json(&rows)?)])?
        .run()
        .await?;
    super::usage::observe(&r);
    ENTERED.with(|e| e.borrow_mut().extend(new.into_iter().cloned()));
    Ok(())
}

#[derive(Deserialize)]
struct ShardRow {
    project: String,
    start_ms: u64,
    end_ms: u64,
}

/// A project's shards as `(start, end)`.
pub async fn shards_of(env: &Env, project: &str) -> Result<Vec<(u64, u64)>> {
    let rows: Vec<ShardRow> = db(env)?
        .prepare("SELECT project, start_ms, end_ms FROM webhook_shards WHERE project = ?")
        .bind(&[text(project)])?
        .all()
        .await?
        .results()?;
    Ok(rows.into_iter().map(|r| (r.start_ms, r.end_ms)).collect())
}

/// Every project's shards ending after `since` (the sweeps), newest first.
pub async fn shards_since(env: &Env, since: u64, limit: u32) -> Result<Vec<ShardKey>> {
    let rows: Vec<ShardRow> = db(env)?
        .prepare("SELECT project, start_ms, end_ms FROM webhook_shards WHERE end_ms > ? ORDER BY end_ms DESC LIMIT ?")
        .bind(&[num(since), num(u64::from(limit))])?
        .all()
        .await?
        .results()?;
    Ok(rows.into_iter().map(key).collect())
}

fn key(r: ShardRow) -> ShardKey {
    let _ = r.end_ms;
    ShardKey {
        project: r.project,
        start_ms: r.start_ms,
    }
}

/// Shards whose whole bucket is older than `before` (retention).
pub async fn expired(env: &Env, before: u64, limit: u32) -> Result<Vec<ShardKey>> {
    let rows: Vec<ShardRow> = db(env)?
        .prepare("SELECT project, start_ms, end_ms FROM webhook_shards WHERE end_ms <= ? ORDER BY end_ms LIMIT ?")
        .bind(&[num(before), num(u64::from(limit))])?
        .all()
        .await?
        .results()?;
    Ok(rows.into_iter().map(key).collect())
}

/// Removes a dropped shard from the directory.
pub async fn forget(env: &Env, shard: &ShardKey) -> Result<()> {
    ENTERED.with(|e| e.borrow_mut().remove(shard));
    db(env)?
        .prepare("DELETE FROM webhook_shards WHERE project = ? AND start_ms = ?")
        .bind(&[text(&shard.project), num(shard.start_ms)])?
        .run()
        .await?;
    Ok(())
}

/// A subscription that can receive a project's events.
#[derive(Deserialize, Clone)]
pub struct Receiver {
    pub project: String,
    pub id: String,
    pub url: String,
    pub events: String,
    pub state: Option<SubState>,
}

/// What the publish path reads of D1 for a group of projects.
#[derive(Default)]
pub struct Projects {
    pub receivers: HashMap<String, Vec<Receiver>>,
    /// Bytes charged today in D1 (inspectors and captures), per project.
    pub bytes_today: HashMap<String, u64>,
}

/// The subscriptions of `projects` that can receive events (those of a
/// revoked key receive nothing, ADR 0015) and their bytes charged today
/// outside the shards; one D1 round trip, which also reports D1's size for
/// its guard.
pub async fn receivers(env: &Env, projects: &[&str], day: u64) -> Result<Projects> {
    #[derive(Deserialize)]
    struct Bytes {
        project: String,
        bytes: u64,
    }
    let d = db(env)?;
    let list = text(&to_json(projects)?);
    let results = d
        .batch(vec![
            d.prepare(
                "SELECT s.project, s.id, s.url, s.events, o.state FROM subscriptions s \
                 LEFT JOIN subscription_ops o ON o.subscription_id = s.id \
                 LEFT JOIN subscription_owners w ON w.subscription_id = s.id \
                 WHERE s.project IN (SELECT value FROM json_each(?)) AND w.key_revoked_at IS NULL",
            )
            .bind(std::slice::from_ref(&list))?,
            d.prepare("SELECT project, bytes FROM webhook_usage WHERE day = ? AND project IN (SELECT value FROM json_each(?))")
                .bind(&[num(day), list])?,
        ])
        .await?;
    let mut out = Projects::default();
    if let Some(r) = results.first() {
        super::usage::observe(r);
        for row in r.results::<Receiver>()? {
            out.receivers
                .entry(row.project.clone())
                .or_default()
                .push(row);
        }
    }
    if let Some(r) = results.get(1) {
        for row in r.results::<Bytes>()? {
            out.bytes_today.insert(row.project, row.bytes);
        }
    }
    Ok(out)
}

/// What an attempt needs of its subscription.
#[derive(Deserialize, Clone)]
pub struct Target {
    pub id: String,
    pub url: String,
    pub secret: String,
    pub previous_secret: Option<String>,
    pub previous_secret_until: Option<u64>,
    pub state: Option<SubState>,
    pub failing_since: Option<u64>,
    pub rate_limit_per_s: Option<u32>,
    /// When the key that created the subscription was revoked.
    pub key_revoked_at: Option<u64>,
}

impl Target {
    pub fn holds(&self) -> bool {
        self.state.is_some_and(SubState::holds)
    }
}

/// The subscriptions of one batch, in one query.
pub async fn targets(env: &Env, ids: &[&str]) -> Result<Vec<Target>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    db(env)?
        .prepare(
            "SELECT s.id, s.url, s.secret, s.previous_secret, s.previous_secret_until, o.state, o.failing_since, \
             o.rate_limit_per_s, w.key_revoked_at FROM subscriptions s \
             LEFT JOIN subscription_ops o ON o.subscription_id = s.id \
             LEFT JOIN subscription_owners w ON w.subscription_id = s.id \
             WHERE s.id IN (SELECT value FROM json_each(?))",
        )
        .bind(&[text(&to_json(ids)?)])?
        .all()
        .await?
        .results()
}

// The legacy rows (migrations 0002-0007), read as the oldest source.

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

pub async fn legacy_ref(env: &Env, delivery_id: &str) -> Result<Option<LegacyRef>> {
    db(env)?
        .prepare("SELECT project, event_id, subscription_id FROM deliveries WHERE id = ?")
        .bind(&[text(delivery_id)])?
        .first(None)
        .await
}

/// The legacy page of a project's deliveries (newest first).
pub async fn legacy_list(
    env: &Env,
    project: &str,
    q: &DeliveryQuery,
    take: u32,
) -> Result<Vec<DeliveryRecord>> {
    let mut sql = format!("{LEGACY_DELIVERY} WHERE d.project = ?");
    let mut args: Vec<JsValue> = vec![text(project)];
    if let Some(s) = q.status {
        sql.push_str(" AND d.status = ?");
        args.push(text(s.as_str()));
    }
    if let Some(t) = &q.event_type {
        sql.push_str(" AND d.event_type = ?");
        args.push(text(t));
    }
    if let Some(s) = q.since {
        sql.push_str(" AND d.created_at >= ?");
        args.push(num(s));
    }
    if let Some(u) = q.until {
        sql.push_str(" AND d.created_at <= ?");
        args.push(num(u));
    }
    if let Some((t, id)) = &q.before {
        sql.push_str(" AND (d.created_at < ? OR (d.created_at = ? AND d.id < ?))");
        args.extend([num(*t), num(*t), text(id)]);
    }
    sql.push_str(" ORDER BY d.created_at DESC, d.id DESC LIMIT ?");
    args.push(num(u64::from(take)));
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
        }
    }
}

const LEGACY_EVENT: &str =
    "SELECT e.id, e.type AS event_type, e.payload, e.created_at, r.request_id \
     FROM events e LEFT JOIN event_requests r ON r.project = e.project AND r.event_id = e.id";

/// The legacy page of a project's events with their delivery summaries.
pub async fn legacy_feed(
    env: &Env,
    project: &str,
    q: &EventQuery,
    take: u32,
) -> Result<Vec<FeedRow>> {
    let mut sql = format!("{LEGACY_EVENT} WHERE e.project = ?");
    let mut args: Vec<JsValue> = vec![text(project)];
    if let Some(s) = q.since {
        sql.push_str(" AND e.created_at >= ?");
        args.push(num(s));
    }
    if let Some(u) = q.until {
        sql.push_str(" AND e.created_at <= ?");
        args.push(num(u));
    }
    if let Some(t) = &q.event_type {
        sql.push_str(" AND e.type = ?");
        args.push(text(t));
    }
    let (cmp, dir) = if q.desc { ("<", "DESC") } else { (">", "ASC") };
    if let Some((t, id)) = &q.after {
        sql.push_str(&format!(
            " AND (e.created_at {cmp} ? OR (e.created_at = ? AND e.id {cmp} ?))"
        ));
        args.extend([num(*t), num(*t), text(id)]);
    }
    sql.push_str(&format!(" ORDER BY e.created_at {dir}, e.id {dir} LIMIT ?"));
    args.push(num(u64::from(take)));
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
pub async fn legacy_event(env: &Env, project: &str, event_id: &str) -> Result<Option<Imported>> {
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

/// Deletes a legacy event whole once its shard holds it.
pub async fn legacy_delete(env: &Env, project: &str, event_id: &str) -> Result<()> {
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
pub async fn legacy_overdue(env: &Env, before: u64, limit: u32) -> Result<Vec<LegacyRef>> {
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
pub async fn legacy_held(env: &Env, subscription_id: &str, limit: u32) -> Result<Vec<LegacyRef>> {
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
pub async fn legacy_recoverable(
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

/// Reserves one throttle slot per `(subscription, rate)`: the later of the
/// subscription's next free slot and `now`, which moves on by one interval
/// (`ops::interval_ms`). One D1 `batch()`; each statement is atomic.
pub async fn reserve(env: &Env, wanted: &[(String, u32)], now: u64) -> Result<Vec<Option<u64>>> {
    #[derive(Deserialize)]
    struct Slot {
        slot: u64,
    }
    let d = db(env)?;
    let statements = wanted
        .iter()
        .map(|(sub, rate)| {
            let interval = postguard_core::webhooks::ops::interval_ms(*rate);
            d.prepare(
                "UPDATE subscription_ops SET next_send_at = MAX(COALESCE(next_send_at, 0), ?) + ? \
                 WHERE subscription_id = ? RETURNING next_send_at - ? AS slot",
            )
            .bind(&[num(now), num(interval), text(sub), num(interval)])
        })
        .collect::<Result<Vec<_>>>()?;
    let results = d.batch(statements).await?;
    results
        .iter()
        .map(|r| Ok(r.results::<Slot>()?.first().map(|s| s.slot)))
        .collect()
}

/// Writes each subscription's health change (`ops::health`): the failure
/// clock reset or started, or the subscription disabled (only while it is
/// active). One D1 `batch()`; for each, whether it changed a row.
pub async fn health(
    env: &Env,
    changes: &[(&str, &str, postguard_core::webhooks::ops::Health)],
    now: u64,
) -> Result<Vec<bool>> {
    use postguard_core::webhooks::ops::Health;
    if changes.is_empty() {
        return Ok(Vec::new());
    }
    let d = db(env)?;
    let mut statements = Vec::with_capacity(changes.len());
    for (sub, project, h) in changes {
        statements.push(match h {
            Health::Healthy => d
                .prepare("UPDATE subscription_ops SET failing_since = NULL WHERE subscription_id = ?")
                .bind(&[text(sub)])?,
            Health::Failing { since } => d
                .prepare("INSERT INTO subscription_ops (subscription_id, project, failing_since) VALUES (?, ?, ?) \
                          ON CONFLICT (subscription_id) DO UPDATE SET failing_since = COALESCE(failing_since, excluded.failing_since)")
                .bind(&[text(sub), text(project), num(*since)])?,
            Health::Disable { reason, since } => d
                .prepare("INSERT INTO subscription_ops (subscription_id, project, state, disabled_reason, disabled_at, failing_since) VALUES (?, ?, ?, ?, ?, ?) \
                          ON CONFLICT (subscription_id) DO UPDATE SET state = excluded.state, disabled_reason = excluded.disabled_reason, disabled_at = excluded.disabled_at, \
                          failing_since = COALESCE(subscription_ops.failing_since, excluded.failing_since) WHERE subscription_ops.state = ?")
                .bind(&[
                    text(sub),
                    text(project),
                    text(SubState::Disabled.as_str()),
                    text(reason.as_str()),
                    num(now),
                    num(*since),
                    text(SubState::Active.as_str()),
                ])?,
        });
    }
    d.batch(statements)
        .await?
        .iter()
        .map(|r| Ok(r.meta()?.and_then(|m| m.changes).unwrap_or(0) > 0))
        .collect()
}

/// The oldest `SWEEP_CHUNK` deliveries past the cutoff and what hangs off
/// them; the same ordered subquery in each statement of one transaction
/// selects the same rows. Returns the deliveries deleted.
pub async fn legacy_deliveries_round(env: &Env, cutoff: u64) -> Result<u64> {
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
pub async fn legacy_events_round(env: &Env, cutoff: u64) -> Result<u64> {
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

/// The rest of the daily sweep: old tasks, expired inspectors and their
/// captures, old legacy counters and outbox rows.
pub async fn sweep_rest(env: &Env, cutoff: u64, now: u64, oldest_day: u64) -> Result<()> {
    let db = db(env)?;
    let results = db
        .batch(vec![
            db.prepare("DELETE FROM tasks WHERE updated_at < ?")
                .bind(&[num(cutoff)])?,
            db.prepare("DELETE FROM inspector_requests WHERE inspector_id IN (SELECT id FROM inspectors WHERE expires_at < ?)")
                .bind(&[num(now)])?,
            db.prepare("DELETE FROM inspectors WHERE expires_at < ?")
                .bind(&[num(now)])?,
            db.prepare("DELETE FROM webhook_usage WHERE day < ?")
                .bind(&[num(oldest_day)])?,
            // Outbox rows of deliveries swept before outbox rows were (one chunk a day).
            db.prepare("DELETE FROM outbox WHERE rowid IN (SELECT rowid FROM outbox WHERE created_at < ? LIMIT ?)")
                .bind(&[num(cutoff), num(SWEEP_CHUNK)])?,
        ])
        .await?;
    if let Some(r) = results.last() {
        super::usage::observe(r);
    }
    Ok(())
}
