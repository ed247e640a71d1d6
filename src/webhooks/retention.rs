//! The delivery log's retention (the daily cron): every table the delivery
//! path grows, older than `retention.deliveries_days`, in chunks until none
//! is left (ADR 0017). One round is one D1 batch of at most
//! `capacity::SWEEP_CHUNK` deliveries with their attempts, outbox rows and
//! manual-attempt counts — then events left without deliveries with their
//! publish request ids; then tasks, expired inspectors and old counters.

use postguard_core::webhooks::capacity::{self, SWEEP_CHUNK};
use worker::{D1Database, D1Result, Env, Result};

use super::num;
use crate::bindings;
use crate::runtime::now_ms;

/// What one daily sweep deleted.
#[derive(Debug, Default)]
pub struct Swept {
    pub deliveries: u64,
    pub events: u64,
}

pub async fn sweep(env: &Env, days: u32) -> Result<Swept> {
    let now = now_ms();
    let cutoff = postguard_core::audit::retention_cutoff_ms(now, days);
    let db = env.d1(bindings::DB)?;
    let mut swept = Swept::default();
    for round in 0.. {
        let n = deliveries_round(&db, cutoff).await?;
        swept.deliveries += n;
        if !capacity::sweep_again(n, round) {
            break;
        }
    }
    for round in 0.. {
        let n = events_round(&db, cutoff).await?;
        swept.events += n;
        if !capacity::sweep_again(n, round) {
            break;
        }
    }
    let oldest_day = capacity::utc_day(now).saturating_sub(u64::from(days));
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
        super::usage::observe(r);
    }
    Ok(swept)
}

/// The oldest `SWEEP_CHUNK` deliveries past the cutoff and what hangs off
/// them; the same ordered subquery in each statement of one transaction
/// selects the same rows. Returns the deliveries deleted.
async fn deliveries_round(db: &D1Database, cutoff: u64) -> Result<u64> {
    const OLDEST: &str =
        "SELECT id FROM deliveries WHERE created_at < ?1 ORDER BY created_at LIMIT ?2";
    let args = [num(cutoff), num(SWEEP_CHUNK)];
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
async fn events_round(db: &D1Database, cutoff: u64) -> Result<u64> {
    const GONE: &str = "SELECT rowid FROM events e WHERE created_at < ?1 \
         AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.project = e.project AND d.event_id = e.id) \
         ORDER BY created_at LIMIT ?2";
    let args = [num(cutoff), num(SWEEP_CHUNK)];
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
