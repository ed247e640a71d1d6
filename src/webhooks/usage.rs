//! The webhook records' D1 bound (ADR 0017), the I/O half: the admission of a
//! publish, an inspector or a capture (the project's daily counters and D1's
//! size), the counter statements that ride in their own batches, and the
//! manual-attempt bound. The decisions are in
//! `postguard_core::webhooks::capacity`; retention is `super::retention`.

use std::cell::Cell;

use postguard_core::config::Config;
pub use postguard_core::webhooks::capacity::Storing;
use postguard_core::webhooks::capacity::{self, Usage};
use postguard_core::Problem;
use worker::{D1Database, D1PreparedStatement, D1Result, Env, Result};

use super::{num, text};
use crate::bindings;
use crate::reject::Handled;
use crate::runtime::now_ms;

thread_local! {
    /// D1's size as this isolate last saw it (`meta.size_after`), and whether
    /// that was at the high-water mark (the refusal is logged once per
    /// transition, not per request).
    static SIZE: Cell<Option<u64>> = const { Cell::new(None) };
    static FULL: Cell<bool> = const { Cell::new(false) };
}

/// Remembers D1's size from any statement's result.
pub fn observe(result: &D1Result) {
    if let Some(size) = result.meta().ok().flatten().and_then(|m| m.size_after) {
        SIZE.with(|s| s.set(Some(size as u64)));
    }
}

/// Before a publish (or an inspector, or a capture) stores anything: 503
/// `STORAGE_FULL` at D1's high-water mark, 429 `EVENT_QUOTA_EXCEEDED` over
/// the project's daily quota. One point read of the project's counter row,
/// which also reports D1's current size.
pub async fn admit(env: &Env, cfg: &Config, project: &str, what: Storing) -> Handled<()> {
    let now = now_ms();
    let read = env
        .d1(bindings::DB)?
        .prepare(
            "SELECT events, deliveries, bytes FROM webhook_usage WHERE project = ? AND day = ?",
        )
        .bind(&[text(project), num(capacity::utc_day(now))])?
        .all()
        .await?;
    observe(&read);
    let usage = read
        .results::<Usage>()?
        .into_iter()
        .next()
        .unwrap_or_default();
    storage_admits(cfg, now)?;
    capacity::admit(project, usage, what, &cfg.settings, now)?;
    Ok(())
}

/// 503 `STORAGE_FULL` when D1's size, as last observed, is at the high-water
/// mark (logged once per transition).
pub fn storage_admits(cfg: &Config, now: u64) -> std::result::Result<(), Problem> {
    let wh = &cfg.settings.webhooks;
    let size = SIZE.with(Cell::get);
    let storage = capacity::storage(size, wh.d1_high_water_bytes, now);
    let was_full = FULL.with(|f| f.replace(storage.is_err()));
    if capacity::log_transition(was_full, storage.is_err()) {
        worker::console_error!(
            "webhook storage full: D1 is {} bytes, at or above webhooks.d1_high_water_bytes = {}; publishing is refused (503 STORAGE_FULL) until retention frees space",
            size.unwrap_or(0),
            wh.d1_high_water_bytes
        );
    }
    storage
}

/// The counter update for the event this batch stores, placed last in the
/// batch: it counts the event's deliveries as written (an index range of at
/// most its fan-out), and counts at all only if this batch's `events` insert
/// wrote the row (its `created_at` is this batch's `now`), so a publish
/// absorbed as a duplicate is not counted again.
pub fn count(
    db: &D1Database,
    cfg: &Config,
    project: &str,
    event_id: &str,
    payload_len: usize,
    now: u64,
) -> Result<D1PreparedStatement> {
    let s = &cfg.settings;
    db.prepare(
        "INSERT INTO webhook_usage (project, day, events, deliveries, bytes) \
         SELECT ?1, ?2, 1, n, ?3 + n * ?4 FROM (SELECT COUNT(*) AS n FROM deliveries WHERE project = ?1 AND event_id = ?5) \
         WHERE EXISTS (SELECT 1 FROM events WHERE project = ?1 AND id = ?5 AND created_at = ?6) \
         ON CONFLICT (project, day) DO UPDATE SET events = events + 1, deliveries = deliveries + excluded.deliveries, bytes = bytes + excluded.bytes",
    )
    .bind(&[
        text(project),
        num(capacity::utc_day(now)),
        num(capacity::event_bytes(payload_len as u64, 0, s)),
        num(capacity::delivery_bytes(s)),
        text(event_id),
        num(now),
    ])
}

/// Charges `bytes` to the project's day (an inspector or a capture), in the
/// batch that stores them.
pub fn charge(db: &D1Database, project: &str, bytes: u64, now: u64) -> Result<D1PreparedStatement> {
    db.prepare(
        "INSERT INTO webhook_usage (project, day, bytes) VALUES (?, ?, ?) \
         ON CONFLICT (project, day) DO UPDATE SET bytes = bytes + excluded.bytes",
    )
    .bind(&[text(project), num(capacity::utc_day(now)), num(bytes)])
}

/// Claims one manual attempt of `delivery_id` (compare-and-increment, so
/// racing requests cannot pass the bound together) and charges its bytes to
/// the project's day; 409 `RETRY_LIMIT_REACHED` past the bound.
pub async fn manual(env: &Env, cfg: &Config, project: &str, delivery_id: &str) -> Handled<()> {
    let db = env.d1(bindings::DB)?;
    let claimed = claim_manual(&db, cfg, project, &[delivery_id]).await?;
    if claimed.first() != Some(&true) {
        return Err(capacity::manual_refused(&cfg.settings).into());
    }
    Ok(())
}

/// Claims one manual attempt of each delivery (retry, redirect, recover) in
/// one batch: which were claimed, in order. Each claim is followed by its
/// charge, counted only if the claim changed a row.
pub async fn claim_manual(
    db: &D1Database,
    cfg: &Config,
    project: &str,
    delivery_ids: &[&str],
) -> Result<Vec<bool>> {
    if delivery_ids.is_empty() {
        return Ok(Vec::new());
    }
    let now = now_ms();
    let max = num(u64::from(
        cfg.settings.webhooks.manual_attempts_per_delivery,
    ));
    let mut statements = Vec::with_capacity(delivery_ids.len() * 2);
    for id in delivery_ids {
        statements.push(
            db.prepare(
                "INSERT INTO manual_attempts (delivery_id, queued, created_at) SELECT ?1, 1, ?2 WHERE ?3 > 0 \
                 ON CONFLICT (delivery_id) DO UPDATE SET queued = queued + 1 WHERE queued < ?3",
            )
            .bind(&[text(id), num(now), max.clone()])?,
        );
        // `changes()` is the claim's, just before it in the same transaction.
        statements.push(
            db.prepare(
                "INSERT INTO webhook_usage (project, day, bytes) SELECT ?, ?, ? WHERE changes() > 0 \
                 ON CONFLICT (project, day) DO UPDATE SET bytes = bytes + excluded.bytes",
            )
            .bind(&[
                text(project),
                num(capacity::utc_day(now)),
                num(capacity::MANUAL_ATTEMPT_BYTES),
            ])?,
        );
    }
    let results = db.batch(statements).await?;
    if let Some(r) = results.last() {
        observe(r);
    }
    Ok(results
        .iter()
        .step_by(2)
        .map(|r| {
            r.meta()
                .ok()
                .flatten()
                .and_then(|m| m.changes)
                .is_some_and(|n| n > 0)
        })
        .collect())
}
