//! Writing audit rows to their shards (after the response, via `waitUntil`,
//! batched per isolate: one object call per shard of a batch, all at once)
//! and the retention sweep run by the cron trigger (whole buckets dropped).
//! A failure is logged, never propagated to the client.

use crate::log;
use futures_util::future::join_all;
use postguard_core::audit::{
    bounded, may_queue, must_start_flusher, AuditRow, Counted, MAX_PATH_LEN, MAX_PENDING,
    MAX_ROUNDS, MAX_USER_AGENT_LEN,
};
use postguard_core::audit_shard::protocol::{self as op, Operation};
use postguard_core::audit_shard::{self, usage, Rollups, Shard};
use postguard_core::log::Line;
use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::time::Duration;
use worker::{Context, Delay, Env, Result};

use crate::archive::Archiver;
use crate::bindings;
use crate::d1::{num, text};
use crate::durable::audit_shard as object;
use crate::runtime::{now_ms, RequestCtx};
use postguard_core::archive::{Kind, Source};

/// What is known of the request before it is handed to a handler.
pub struct Seen {
    pub method: String,
    pub path: String,
    pub client_ip: Option<String>,
    pub user_agent: Option<String>,
}

impl Seen {
    /// `path` is the request's path as the gateway read it
    /// (`routes::canonical`): a capture token never reaches the row, however
    /// a gateway path was spelled.
    pub fn of(req: &crate::http::Client, path: &postguard_core::routes::Canonical) -> Seen {
        Seen {
            method: bounded(&req.method, 16),
            // `path` has no query string: queries are never recorded.
            path: match path.gateway {
                true => bounded(&postguard_core::routes::audited_path(path), MAX_PATH_LEN),
                // A proxied path is recorded as the origin received it.
                false => bounded(&req.path, MAX_PATH_LEN),
            },
            client_ip: req.header("CF-Connecting-IP").map(|v| bounded(v, 64)),
            user_agent: req
                .header("User-Agent")
                .map(|v| bounded(v, MAX_USER_AGENT_LEN)),
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
        origin: f.origin.clone(),
        would_refuse: f.would_refuse.clone(),
        counted: counted(&f, status),
    }
    .shortened_if_unauthenticated()
}

/// The audit row of a key imported while answering this request (verified
/// against the origin): as the operator's import would be, `POST
/// /_postguard/v1/keys/import`, with the key's prefix and project and no
/// secret. A row of its own (its own request id), beside the request's.
pub fn key_import_row(rc: &RequestCtx, seen: &Seen) -> Option<AuditRow> {
    let (prefix, project) = rc.facts.borrow().imported_key.clone()?;
    let (now, rnd) = crate::runtime::new_ulid_parts();
    Some(AuditRow {
        request_id: postguard_core::ids::request_id(now, rnd),
        time: now,
        method: "POST".into(),
        path: "/_postguard/v1/keys/import".into(),
        status: 201,
        response_bytes: None,
        response_time_ms: 0,
        client_ip: seen.client_ip.clone(),
        user_agent: Some("postguard: key verified by the origin".into()),
        key_prefix: Some(prefix),
        project: Some(project),
        idempotency_key: None,
        replayed: false,
        rate_limit_remaining: None,
        origin: Some("default".into()),
        would_refuse: None,
        counted: Counted::default(),
    })
}

/// How the request counts in `/usage` and `/stats`.
fn counted(f: &crate::runtime::Facts, status: u16) -> Counted {
    let forwarded = f.origin_ms.is_some();
    Counted {
        forwarded,
        billable: usage::billable(f.claimed, f.answer_stored, forwarded, status),
        missing_key: f.missing_idempotency_key,
    }
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
    /// Shards this isolate has entered in the D1 directory (names).
    static KNOWN: RefCell<HashSet<String>> = RefCell::new(HashSet::new());
}

/// Directory entries remembered per isolate at most (then forgotten: a
/// re-entry is an INSERT OR IGNORE, harmless).
const MAX_KNOWN: usize = 4_096;

/// How long the first row waits for others of the same isolate to join it.
const COALESCE: Duration = Duration::from_millis(20);
/// Rows per flush round: one object call per shard they belong to, all at
/// once (each a single JSON document, one transaction in the object).
const MAX_BATCH: usize = 100;

/// Queues a row for writing after the response. Rows of concurrent requests
/// in one isolate are written together: the first request's `waitUntil`
/// flushes queued rows, up to `MAX_ROUNDS` batches. A full queue drops the
/// row (counted; the count is logged once by the next flusher). A failed
/// write is logged, never propagated.
pub fn record(env: &Env, ctx: &Context, bucket_ms: u64, row: AuditRow) {
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
    ctx.wait_until(flush(env, bucket_ms, now.max(1)));
}

/// One flusher: at most `MAX_ROUNDS` batches, then it gives way. It clears
/// the marker only if it is still its own (a stale flusher replaced by a
/// newer one leaves the newer one's marker alone).
async fn flush(env: Env, bucket_ms: u64, me: u64) {
    Delay::from(COALESCE).await;
    let dropped = DROPPED.with(|d| d.replace(0));
    if dropped > 0 {
        log::emit(
            Line::warn("audit queue full: rows dropped")
                .field("queue_rows", MAX_PENDING)
                .field("dropped", dropped),
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
        let n = rows.len();
        if let Err(e) = write_batch(&env, bucket_ms, rows).await {
            log::emit(Line::error("audit write failed").field("rows", n).err(e));
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

/// One batch: the directory rows of shards this isolate has not entered yet
/// (one D1 batch), then one call per shard, all at once, then the counts
/// they added to each bucket's cross-project roll-up shard. A shard whose
/// directory row could not be written is not written either: a row the
/// directory does not know would never be read nor dropped by retention.
async fn write_batch(env: &Env, bucket_ms: u64, rows: Vec<AuditRow>) -> Result<()> {
    let groups = audit_shard::group(rows, bucket_ms);
    // A batch spans a few shards: a linear dedup, not a sort (one fewer sort
    // instance in the wasm, ADR 0026).
    let mut wanted: Vec<Shard> = Vec::new();
    for (s, _) in &groups {
        for s in [s.clone(), s.all_projects()] {
            if !wanted.contains(&s) {
                wanted.push(s);
            }
        }
    }
    let new: Vec<Shard> = KNOWN.with(|k| {
        let k = k.borrow();
        wanted
            .into_iter()
            .filter(|s| !k.contains(&s.name()))
            .collect()
    });
    if !new.is_empty() {
        enter(env, &new).await?;
        KNOWN.with(|k| {
            let mut k = k.borrow_mut();
            if k.len() + new.len() > MAX_KNOWN {
                k.clear();
            }
            k.extend(new.iter().map(Shard::name));
        });
    }
    // Every join here is over `object::call` itself: one join type in the wasm (ADR 0026).
    let bodies = groups
        .iter()
        .map(|(_, rows)| object::request::<op::Ingest>(rows))
        .collect::<Result<Vec<_>>>()?;
    let calls = groups
        .iter()
        .zip(&bodies)
        .map(|((shard, _), body)| object::call(env, shard, op::Ingest::PATH, body));
    // A batch spans one or two buckets: a list, not another map type in the wasm.
    let mut added: Vec<(Shard, Vec<Rollups>)> = Vec::new();
    for (res, (shard, rows)) in join_all(calls).await.into_iter().zip(groups.iter()) {
        let res = res.and_then(|bytes| object::answer::<op::Ingest>(&bytes));
        match res {
            Ok(done) if !done.rollups.is_empty() => {
                let all = shard.all_projects();
                match added.iter_mut().find(|(s, _)| *s == all) {
                    Some((_, parts)) => parts.push(done.rollups),
                    None => added.push((all, vec![done.rollups])),
                }
            }
            Ok(_) => {}
            Err(e) => log::emit(
                Line::error("audit write to a shard failed")
                    .field("rows", rows.len())
                    .field("shard", shard.name())
                    .err(e),
            ),
        }
    }
    let sums = added
        .into_iter()
        .map(|(all, parts)| Ok((all, object::request::<op::Add>(&Rollups::sum(parts))?)))
        .collect::<Result<Vec<_>>>()?;
    let calls = sums
        .iter()
        .map(|(all, body)| object::call(env, all, op::Add::PATH, body));
    for res in join_all(calls).await {
        if let Err(e) = res {
            log::emit(Line::error("audit roll-up write to a cross-project shard failed").err(e));
        }
    }
    Ok(())
}

async fn enter(env: &Env, shards: &[Shard]) -> Result<()> {
    let db = env.d1(bindings::DB)?;
    let now = num(now_ms());
    let statements = shards
        .iter()
        .map(|s| {
            db.prepare("INSERT OR IGNORE INTO audit_shards (project, start_ms, end_ms, created_at) VALUES (?, ?, ?, ?)")
                .bind(&[text(&s.project), num(s.start_ms), num(s.end_ms), now.clone()])
        })
        .collect::<Result<Vec<_>>>()?;
    db.batch(statements).await?;
    Ok(())
}

/// Legacy rows deleted per statement, and statements per cron run.
const BATCH: u32 = 5_000;
const MAX_BATCHES: u32 = 40;
/// Buckets dropped per cron run at most (the next run takes the rest).
const MAX_DROPS: u32 = 500;
/// Objects dropped at once.
const DROP_WAVE: usize = 25;

#[derive(serde::Deserialize)]
struct DirRow {
    project: String,
    start_ms: u64,
    end_ms: u64,
}

/// Retention: drops every shard whose bucket ended before the cutoff (the
/// object deletes all its storage, then its directory row goes), and deletes
/// the legacy table's rows past it. With the archive on, only what it
/// archived and verified is dropped (the rest stays for the next run).
/// Returns (buckets dropped, legacy rows).
pub async fn sweep(env: &Env, cutoff: u64, archive: Option<&Archiver>) -> Result<(u64, u64)> {
    let db = env.d1(bindings::DB)?;
    let due: Vec<DirRow> = crate::d1::all(
        &db,
        "SELECT project, start_ms, end_ms FROM audit_shards WHERE end_ms <= ? ORDER BY end_ms LIMIT ?",
        &[num(cutoff), num(u64::from(MAX_DROPS))],
    )
    .await?;
    let due = match archive {
        None => due,
        Some(a) => archived(env, a, due).await,
    };
    let mut dropped = 0u64;
    let db = &db;
    for wave in due.chunks(DROP_WAVE) {
        let shards: Vec<Shard> = wave
            .iter()
            .map(|d| Shard {
                project: d.project.clone(),
                start_ms: d.start_ms,
                end_ms: d.end_ms,
            })
            .collect();
        // The objects at once (a join over `object::call`, the writer's join type:
        // ADR 0026), then one D1 batch for the directory rows of those dropped. A
        // row whose object failed stays, and the next run drops it again.
        let calls = shards
            .iter()
            .map(|s| object::call(env, s, op::Drop::PATH, b"{}"));
        let mut gone: Vec<&Shard> = Vec::new();
        for (res, shard) in join_all(calls).await.into_iter().zip(&shards) {
            match res {
                Ok(_) => gone.push(shard),
                Err(e) => {
                    log::emit(Line::error("audit retention: dropping a bucket failed").err(e))
                }
            }
        }
        if gone.is_empty() {
            continue;
        }
        let deletes = gone
            .iter()
            .map(|s| {
                db.prepare("DELETE FROM audit_shards WHERE project = ? AND start_ms = ?")
                    .bind(&[text(&s.project), num(s.start_ms)])
            })
            .collect::<Result<Vec<_>>>()?;
        match db.batch(deletes).await {
            Ok(_) => dropped += gone.len() as u64,
            Err(e) => log::emit(
                Line::error("audit retention: deleting directory rows failed")
                    .field("rows", gone.len())
                    .err(e),
            ),
        }
    }
    let legacy_cutoff = match archive {
        None => cutoff,
        Some(a) => a.legacy_cutoff(env, Kind::Audit, cutoff).await?,
    };
    let legacy = sweep_legacy(env, legacy_cutoff).await?;
    Ok((dropped, legacy))
}

/// The shards of `due` the archive holds (archived now if need be) and
/// verified; a failure keeps the shard for the next run.
async fn archived(env: &Env, a: &Archiver, due: Vec<DirRow>) -> Vec<DirRow> {
    let mut out = Vec::with_capacity(due.len());
    for d in due {
        let source = Source::Shard {
            start_ms: d.start_ms,
            end_ms: d.end_ms,
        };
        let span = (d.start_ms, d.end_ms);
        match a.secure(env, &d.project, Kind::Audit, source, span).await {
            Ok(true) => out.push(d),
            Ok(false) => {}
            Err(e) => log::emit(
                Line::error("audit retention: archiving a bucket failed: it is kept")
                    .field("project", d.project.as_str())
                    .field("start_ms", d.start_ms)
                    .err(e),
            ),
        }
    }
    out
}

async fn sweep_legacy(env: &Env, cutoff: u64) -> Result<u64> {
    let db = env.d1(bindings::DB)?;
    let cutoff = num(cutoff);
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
