//! D1's bound (ADR 0017, ADR 0035), the I/O half: D1's size as the isolate
//! last saw it (it holds the shard directory, the subscriptions, tasks and
//! inspectors: at its mark every publish waits for retention), and the
//! admission and charge of an inspector or a capture (their daily counter
//! row). The events' own quotas are counted in their shard
//! (`postguard_core::webhooks::records`); retention is `super::retention`.

use crate::log;
use postguard_core::log::Line;
use std::cell::Cell;

use postguard_core::config::Config;
use postguard_core::webhooks::capacity;
pub use postguard_core::webhooks::capacity::Storing;
use postguard_core::Problem;
use worker::Env;

use crate::reject::Handled;
use crate::runtime::now_ms;

thread_local! {
    /// Whether D1 was last seen at its high-water mark (the refusal is
    /// logged once per transition, not per request).
    static FULL: Cell<bool> = const { Cell::new(false) };
}

/// Before a publish (or an inspector, or a capture) stores anything: 503
/// `STORAGE_FULL` at D1's high-water mark, 429 `EVENT_QUOTA_EXCEEDED` over
/// the project's daily quota. One point read of the project's counter row,
/// which also reports D1's current size.
pub async fn admit(env: &Env, cfg: &Config, project: &str, what: Storing) -> Handled<()> {
    let now = now_ms();
    let usage = super::directory::inspectors::usage_today(env, project, now).await?;
    storage_admits(cfg, now)?;
    capacity::admit(project, usage, what, &cfg.settings, now)?;
    Ok(())
}

/// [`storage_admits`] for the publish path, which reads nothing of D1 while
/// it has room: at the mark as last observed, D1's size is read once more
/// (space freed by retention is seen at once).
pub async fn d1_admits(env: &Env, cfg: &Config, now: u64) -> std::result::Result<(), Problem> {
    if storage_admits(cfg, now).is_ok() {
        return Ok(());
    }
    if let Err(e) = super::directory::probe_size(env).await {
        log::emit(Line::warn("reading D1's size failed: its last size stands").err(e));
    }
    storage_admits(cfg, now)
}

/// 503 `STORAGE_FULL` when D1's size, as last observed, is at the high-water
/// mark (logged once per transition).
pub fn storage_admits(cfg: &Config, now: u64) -> std::result::Result<(), Problem> {
    let wh = &cfg.settings.webhooks;
    let size = super::directory::last_size();
    let storage = capacity::storage(size, wh.d1_high_water_bytes, now);
    let was_full = FULL.with(|f| f.replace(storage.is_err()));
    if capacity::log_transition(was_full, storage.is_err()) {
        log::emit(
            Line::error("webhook storage full: publishing refused (503 STORAGE_FULL) until retention frees space")
                .field("d1_bytes", size.unwrap_or(0))
                .field("d1_high_water_bytes", wh.d1_high_water_bytes),
        );
    }
    storage
}
