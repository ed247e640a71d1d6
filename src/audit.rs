//! Writing audit rows to D1 (after the response, via `waitUntil`, batched per
//! isolate) and the retention sweep run by the cron trigger. A D1 failure is
//! logged, never propagated to the client.

use postguard_core::audit::{
    bounded, may_queue, must_start_flusher, retention_cutoff_ms, AuditRow, MAX_PATH_LEN,
    MAX_PENDING, MAX_ROUNDS, MAX_USER_AGENT_LEN,
};
use std::cell::{Cell, RefCell};
use std::time::Duration;
use worker::{Context, D1Database, D1PreparedStatement, Delay, Env, Result};

use crate::bindings;
use crate::d1::{num, opt_num, opt_text, text};
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
            path: bounded(
                &postguard_core::webhooks::ops::audited_path(&req.path()),
                MAX_PATH_LEN,
            ),
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
    .shortened_if_unauthenticated()
}

fn insert(db: &D1Database, r: &AuditRow) -> Result<D1PreparedStatement> {
    db.prepare(format!(
        "INSERT OR IGNORE INTO audit_log ({}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        postguard_core::audit::COLUMNS
    ))
    .bind(&[
        text(&r.request_id),
        num(r.time),
        text(&r.method),
        text(&r.path),
        num(u64::from(r.status)),
        opt_num(r.response_bytes),
        num(r.response_time_ms),
        opt_text(r.client_ip.as_deref()),
        opt_text(r.user_agent.as_deref()),
        opt_text(r.key_prefix.as_deref()),
        opt_text(r.project.as_deref()),
        opt_text(r.idempotency_key.as_deref()),
        num(u64::from(r.replayed)),
        opt_num(r.rate_limit_remaining.map(u64::from)),
    ])
}

thread_local! {
    /// Rows of this isolate waiting for the next batch write (at most
    /// `MAX_PENDING`).
    static PENDING: RefCell<Vec<AuditRow>> = const { RefCell::new(Vec::new()) };
    /// When the running flusher started (epoch ms; 0 = none). A timestamp,
    /// not a flag: if the runtime drops the flushing task (its `waitUntil`
    /// cut off), the next request past `FLUSHER_STALE_MS` starts a new one.
    static FLUSHING_SINCE: Cell<u64> = const { Cell::new(0) };
    /// Rows dropped because the queue was full, not yet reported.
    static DROPPED: Cell<u64> = const { Cell::new(0) };
}

/// How long the first row waits for others of the same isolate to join it.
const COALESCE: Duration = Duration::from_millis(20);
/// Statements per D1 batch (one round trip, one transaction).
const MAX_BATCH: usize = 100;

/// Queues a row for writing after the response. Rows of concurrent requests
/// in one isolate are written together: the first request's `waitUntil`
/// flushes queued rows, up to `MAX_ROUNDS` batches. A full queue drops the
/// row (counted; the count is logged once by the next flusher). A failed
/// write is logged, never propagated.
pub fn record(env: &Env, ctx: &Context, row: AuditRow) {
    let queued = PENDING.with(|p| {
        let mut p = p.borrow_mut();
        let room = may_queue(p.len());
        if room {
            p.push(row);
        }
        room
    });
    if !queued {
        DROPPED.with(|d| d.set(d.get() + 1));
    }
    let now = now_ms();
    if !must_start_flusher(FLUSHING_SINCE.with(Cell::get), now) {
        return;
    }
    FLUSHING_SINCE.with(|f| f.set(now.max(1)));
    let env = env.clone();
    ctx.wait_until(flush(env, now.max(1)));
}

/// One flusher: at most `MAX_ROUNDS` batches, then it gives way. It clears
/// the marker only if it is still its own (a stale flusher replaced by a
/// newer one leaves the newer one's marker alone).
async fn flush(env: Env, me: u64) {
    Delay::from(COALESCE).await;
    let dropped = DROPPED.with(|d| d.replace(0));
    if dropped > 0 {
        worker::console_warn!(
            "audit queue full ({} rows): {} rows dropped",
            MAX_PENDING,
            dropped
        );
    }
    for _ in 0..MAX_ROUNDS {
        let rows: Vec<AuditRow> = PENDING.with(|p| {
            let mut p = p.borrow_mut();
            let n = p.len().min(MAX_BATCH);
            p.drain(..n).collect()
        });
        if rows.is_empty() {
            break;
        }
        if let Err(e) = write_batch(&env, &rows).await {
            worker::console_error!("audit write of {} rows failed: {}", rows.len(), e);
        }
    }
    // No await since the last drain: a row queued from here on starts a new
    // flusher (the marker is clear).
    FLUSHING_SINCE.with(|f| {
        if f.get() == me {
            f.set(0);
        }
    });
}

async fn write_batch(env: &Env, rows: &[AuditRow]) -> Result<()> {
    let db = env.d1(bindings::DB)?;
    let statements = rows
        .iter()
        .map(|r| insert(&db, r))
        .collect::<Result<Vec<_>>>()?;
    db.batch(statements).await?;
    Ok(())
}

/// Rows deleted per statement, and statements per cron run: bounded work.
const BATCH: u32 = 5_000;
const MAX_BATCHES: u32 = 40;

/// Deletes rows older than `days`; returns how many were deleted.
pub async fn sweep(env: &Env, days: u32) -> Result<u64> {
    let db = env.d1(bindings::DB)?;
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
