//! The webhooks' D1 side (ADR 0035), and the only webhook code holding SQL
//! besides the shard adapter (`src/durable/webhook_shard.rs`): the directory
//! of shards, the subscriptions as the publish path and the consumer read
//! them, their throttle slots and health ([`mod@self`]); the subscriptions'
//! own API ([`subscriptions`]); recover tasks ([`tasks`]); inspectors and
//! their day counters ([`inspectors`]); and the rows of the deployments
//! before the shards ([`legacy`]).

pub mod inspectors;
pub mod legacy;
pub mod subscriptions;
pub mod tasks;

use std::cell::{Cell, RefCell};
use std::collections::HashSet;

use postguard_core::webhooks::ops::SubState;
use postguard_core::webhooks::pacing::ReceiverLimit;
use postguard_core::webhooks::shard::ShardKey;
use serde::Deserialize;
use worker::{D1Database, D1Result, Env, Result};

use super::{num, text, to_json};
use crate::bindings;

thread_local! {
    /// D1's size as this isolate last saw it (`meta.size_after`).
    /// With when it was seen (epoch ms): a report from elsewhere counts only if newer.
    static SIZE: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
    /// Shards this isolate entered in the directory (one INSERT each).
    static ENTERED: RefCell<HashSet<ShardKey>> = RefCell::new(HashSet::new());
}

/// Remembers D1's size from any statement's result (its guard,
/// `usage::storage_admits`).
pub fn observe(result: &D1Result) {
    if let Some(size) = result.meta().ok().flatten().and_then(|m| m.size_after) {
        SIZE.with(|s| s.set(Some((size as u64, crate::runtime::now_ms()))));
    }
}

/// D1's size as last observed.
pub fn last_size() -> Option<u64> {
    SIZE.with(Cell::get).map(|(size, _)| size)
}

/// Takes a size another isolate observed at `at` (the project's object's
/// last load) when it is newer than what this isolate saw.
pub fn observe_size(size: Option<u64>, at: u64) {
    if let Some(size) = size {
        SIZE.with(|s| {
            if s.get().is_none_or(|(_, seen)| seen < at) {
                s.set(Some((size, at)));
            }
        });
    }
}

/// Reads D1's size now (one statement): what a publish does only while the
/// last observation says D1 is full, so that freed space is seen at once.
pub async fn probe_size(env: &Env) -> Result<()> {
    let r = db(env)?.prepare("SELECT 1").run().await?;
    observe(&r);
    Ok(())
}

pub(crate) fn db(env: &Env) -> Result<D1Database> {
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
    observe(&r);
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

/// A listed shard's bucket `[start_ms, end_ms)`, `None` when not listed.
pub async fn span(env: &Env, shard: &ShardKey) -> Result<Option<(u64, u64)>> {
    let rows: Vec<ShardRow> = db(env)?
        .prepare("SELECT project, start_ms, end_ms FROM webhook_shards WHERE project = ? AND start_ms = ?")
        .bind(&[text(&shard.project), num(shard.start_ms)])?
        .all()
        .await?
        .results()?;
    Ok(rows.into_iter().next().map(|r| (r.start_ms, r.end_ms)))
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
    /// What its receiver last advertised (`receiver_limits`).
    #[serde(default)]
    pub receiver_remaining: Option<u64>,
    #[serde(default)]
    pub receiver_reset_at: Option<u64>,
}

impl Target {
    pub fn holds(&self) -> bool {
        self.state.is_some_and(SubState::holds)
    }

    /// The limit its receiver last advertised, as stored.
    pub fn receiver_limit(&self) -> Option<ReceiverLimit> {
        Some(ReceiverLimit {
            remaining: self.receiver_remaining?,
            reset_at: self.receiver_reset_at?,
        })
    }
}

/// Stores each subscription's receiver limit after its attempts' answers
/// (`pacing::observe`): the new one, or none (the row deleted). One D1
/// `batch()`; only changes are passed in.
pub async fn store_receiver_limits(
    env: &Env,
    limits: &[(String, Option<ReceiverLimit>)],
    now: u64,
) -> Result<()> {
    if limits.is_empty() {
        return Ok(());
    }
    let d = db(env)?;
    let statements = limits
        .iter()
        .map(|(sub, l)| match l {
            Some(l) => d
                .prepare(
                    "INSERT INTO receiver_limits (subscription_id, remaining, reset_at, updated_at) VALUES (?, ?, ?, ?) \
                     ON CONFLICT (subscription_id) DO UPDATE SET remaining = excluded.remaining, \
                     reset_at = excluded.reset_at, updated_at = excluded.updated_at",
                )
                .bind(&[text(sub), num(l.remaining), num(l.reset_at), num(now)]),
            None => d
                .prepare("DELETE FROM receiver_limits WHERE subscription_id = ?")
                .bind(&[text(sub)]),
        })
        .collect::<Result<Vec<_>>>()?;
    d.batch(statements).await?;
    Ok(())
}

/// The subscriptions of one batch, in one query.
pub async fn targets(env: &Env, ids: &[&str]) -> Result<Vec<Target>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    db(env)?
        .prepare(
            "SELECT s.id, s.url, s.secret, s.previous_secret, s.previous_secret_until, o.state, o.failing_since, \
             o.rate_limit_per_s, w.key_revoked_at, r.remaining AS receiver_remaining, \
             r.reset_at AS receiver_reset_at FROM subscriptions s \
             LEFT JOIN subscription_ops o ON o.subscription_id = s.id \
             LEFT JOIN subscription_owners w ON w.subscription_id = s.id \
             LEFT JOIN receiver_limits r ON r.subscription_id = s.id \
             WHERE s.id IN (SELECT value FROM json_each(?))",
        )
        .bind(&[text(&to_json(ids)?)])?
        .all()
        .await?
        .results()
}

/// Reserves one throttle slot per `(subscription, rate)` asked for, as
/// `ops::reserve` decides from each subscription's next free slot: read
/// (one D1 `batch()`), decided, and stored only where the slot is still the
/// one read (a compare-and-set per subscription, one `batch()`); a
/// subscription another consumer moved meanwhile is read again, at most
/// [`RESERVE_ROUNDS`] times. `None`: the subscription has no throttle row.
pub async fn reserve(env: &Env, wanted: &[(String, u32)], now: u64) -> Result<Vec<Option<u64>>> {
    use postguard_core::webhooks::ops;
    #[derive(Deserialize)]
    struct Row {
        next_send_at: Option<u64>,
    }
    let d = db(env)?;
    let mut out: Vec<Option<u64>> = vec![None; wanted.len()];
    // Each subscription once, with the positions of its jobs.
    let mut subs: Vec<(&str, u32, Vec<usize>)> = Vec::new();
    for (i, (sub, rate)) in wanted.iter().enumerate() {
        match subs.iter_mut().find(|(s, _, _)| s == sub) {
            Some((_, _, at)) => at.push(i),
            None => subs.push((sub, *rate, vec![i])),
        }
    }
    for _ in 0..RESERVE_ROUNDS {
        if subs.is_empty() {
            return Ok(out);
        }
        let reads = subs
            .iter()
            .map(|(sub, _, _)| {
                d.prepare("SELECT next_send_at FROM subscription_ops WHERE subscription_id = ?")
                    .bind(&[text(sub)])
            })
            .collect::<Result<Vec<_>>>()?;
        let read: Vec<Option<Option<u64>>> = d
            .batch(reads)
            .await?
            .iter()
            .map(|r| Ok(r.results::<Row>()?.first().map(|row| row.next_send_at)))
            .collect::<Result<_>>()?;
        // Subscriptions without a row are not throttled: nothing to reserve.
        let plans: Vec<(usize, Option<u64>, ops::Reserved)> = read
            .iter()
            .enumerate()
            .filter_map(|(k, r)| {
                r.map(|next| (k, next, ops::reserve(next, now, subs[k].1, subs[k].2.len())))
            })
            .collect();
        let writes = plans
            .iter()
            .map(|(k, old, plan)| {
                let was = old.map_or(wasm_bindgen::JsValue::NULL, num);
                d.prepare(
                    "UPDATE subscription_ops SET next_send_at = ? WHERE subscription_id = ? AND next_send_at IS ?",
                )
                .bind(&[num(plan.next_free), text(subs[*k].0), was])
            })
            .collect::<Result<Vec<_>>>()?;
        let stored: Vec<bool> = d
            .batch(writes)
            .await?
            .iter()
            .map(|r| Ok(r.meta()?.and_then(|m| m.changes).unwrap_or(0) > 0))
            .collect::<Result<_>>()?;
        let mut done = vec![false; subs.len()];
        for ((k, _, plan), ok) in plans.iter().zip(stored) {
            if ok {
                for (at, slot) in subs[*k].2.iter().zip(&plan.slots) {
                    out[*at] = Some(*slot);
                }
                done[*k] = true;
            }
        }
        for (k, r) in read.iter().enumerate() {
            done[k] |= r.is_none();
        }
        let mut k = 0;
        subs.retain(|_| {
            k += 1;
            !done[k - 1]
        });
    }
    match subs.is_empty() {
        true => Ok(out),
        false => Err(worker::Error::RustError(
            "throttle slots contended: the batch is retried".into(),
        )),
    }
}

/// Rounds of [`reserve`] before a batch gives up (and the queue retries it).
const RESERVE_ROUNDS: usize = 4;

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
    let changed: Vec<bool> = d
        .batch(statements)
        .await?
        .iter()
        .map(|r| Ok(r.meta()?.and_then(|m| m.changes).unwrap_or(0) > 0))
        .collect::<Result<_>>()?;
    // A disabled subscription's next deliveries are created held.
    for ((_, project, h), c) in changes.iter().zip(&changed) {
        if *c && matches!(h, Health::Disable { .. }) {
            crate::durable::project_hub::invalidate(env, project).await;
        }
    }
    Ok(changed)
}
