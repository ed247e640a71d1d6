//! D1's bound (ADR 0017, ADR 0031), the I/O half: D1's size as the isolate
//! last saw it (it holds the shard directory, the subscriptions, tasks and
//! inspectors: at its mark every publish waits for retention), and the
//! admission and charge of an inspector or a capture (their daily counter
//! row). The events' own quotas are counted in their shard
//! (`postguard_core::webhooks::records`); retention is `super::retention`.

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

/// Charges `bytes` to the project's day (an inspector or a capture), in the
/// batch that stores them.
pub fn charge(db: &D1Database, project: &str, bytes: u64, now: u64) -> Result<D1PreparedStatement> {
    db.prepare(
        "INSERT INTO webhook_usage (project, day, bytes) VALUES (?, ?, ?) \
         ON CONFLICT (project, day) DO UPDATE SET bytes = bytes + excluded.bytes",
    )
    .bind(&[text(project), num(capacity::utc_day(now)), num(bytes)])
}
