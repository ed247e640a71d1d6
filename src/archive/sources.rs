//! Reading the rows the archive and exports write, a page at a time, from
//! where they live: an audit shard, a webhook shard, or the legacy D1 rows
//! of the deployments before the shards. Each page comes back as NDJSON
//! lines ([`archive::audit_line`], [`archive::delivery_line`]).

use postguard_core::archive::{self, Archived, Kind, Source, PAGE_ROWS};
use postguard_core::audit::AuditRow;
use postguard_core::audit_shard::{Shard, UNSCOPED};
use postguard_core::webhooks::protocol as wire;
use postguard_core::webhooks::shard::ShardKey;
use worker::{Env, Result};

use crate::admin::audit::DbRow;
use crate::bindings;
use crate::d1::{num, opt_text, text};
use crate::durable::audit_shard as audit_object;
use crate::durable::webhook_shard::ArchiveReq;
use crate::webhooks::directory::{self, legacy};
use crate::webhooks::shards;
use postguard_core::audit_shard::protocol::{self as audit_op, Operation, PageQuery};

/// One page of a source's rows.
pub struct Page {
    /// The rows as NDJSON (each line ends in `\n`).
    pub text: Vec<u8>,
    pub rows: u64,
    /// Where the next page starts; `None`: this was the last.
    pub next: Option<(u64, String)>,
}

/// The project's rows of `kind` from `source` with `lo <= time < hi` after
/// `after` (`(0, "")` for the first page), oldest first.
pub async fn page(
    env: &Env,
    project: &str,
    kind: Kind,
    source: &Source,
    (lo, hi): (u64, u64),
    after: &(u64, String),
) -> Result<Page> {
    let mut text = Vec::new();
    let mut last = None;
    let mut rows = 0u64;
    match kind {
        Kind::Audit => {
            for r in audit_rows(env, project, source, (lo, hi), after).await? {
                text.extend_from_slice(archive::audit_line(&r).as_bytes());
                last = Some((r.time, r.request_id));
                rows += 1;
            }
        }
        Kind::Deliveries => {
            for a in deliveries(env, project, source, (lo, hi), after).await? {
                text.extend_from_slice(archive::delivery_line(project, &a).as_bytes());
                last = Some((a.delivery.created_at, a.delivery.id));
                rows += 1;
            }
        }
    }
    let next = last.filter(|_| rows >= u64::from(PAGE_ROWS));
    Ok(Page { text, rows, next })
}

async fn audit_rows(
    env: &Env,
    project: &str,
    source: &Source,
    (lo, hi): (u64, u64),
    after: &(u64, String),
) -> Result<Vec<AuditRow>> {
    match source {
        Source::Shard { start_ms, end_ms } => {
            let shard = Shard {
                project: project.to_string(),
                start_ms: *start_ms,
                end_ms: *end_ms,
            };
            let q = PageQuery {
                since: lo,
                until: hi,
                after: after.clone(),
                take: PAGE_ROWS,
            };
            let body = audit_object::request::<audit_op::Page>(&q)?;
            let bytes = audit_object::call(env, &shard, audit_op::Page::PATH, &body).await?;
            let mut rows = audit_object::answer::<audit_op::Page>(&bytes)?;
            let of = shard.row_project();
            for r in &mut rows {
                r.project.clone_from(&of);
            }
            Ok(rows)
        }
        Source::Legacy => {
            let db = env.d1(bindings::DB)?;
            let scoped = (project != UNSCOPED).then_some(project);
            let rows: Vec<DbRow> = crate::d1::all(
                &db,
                "SELECT request_id, time, method, path, status, response_bytes, response_time_ms, client_ip, \
                 user_agent, key_prefix, project, idempotency_key, replayed, rate_limit_remaining FROM audit_log \
                 WHERE project IS ? AND time >= ? AND time < ? AND (time > ? OR (time = ? AND request_id > ?)) \
                 ORDER BY time, request_id LIMIT ?",
                &[
                    opt_text(scoped),
                    num(lo),
                    num(hi),
                    num(after.0),
                    num(after.0),
                    text(&after.1),
                    num(u64::from(PAGE_ROWS)),
                ],
            )
            .await?;
            Ok(rows.into_iter().map(AuditRow::from).collect())
        }
    }
}

async fn deliveries(
    env: &Env,
    project: &str,
    source: &Source,
    (lo, hi): (u64, u64),
    after: &(u64, String),
) -> Result<Vec<Archived>> {
    match source {
        Source::Shard { start_ms, .. } => {
            let key = ShardKey {
                project: project.to_string(),
                start_ms: *start_ms,
            };
            let req = ArchiveReq {
                since: lo,
                until: hi,
                after: after.clone(),
                take: PAGE_ROWS,
            };
            shards::call::<wire::Archive>(env, &key, &req).await
        }
        Source::Legacy => legacy::archive_page(env, project, lo, hi, after, PAGE_ROWS).await,
    }
}

/// The shards of `project` that hold rows of `kind` in `[lo, hi)`, oldest first.
pub async fn live_shards(
    env: &Env,
    project: &str,
    kind: Kind,
    lo: u64,
    hi: u64,
) -> Result<Vec<Source>> {
    let mut spans: Vec<(u64, u64)> = match kind {
        Kind::Deliveries => directory::shards_of(env, project).await?,
        Kind::Audit => {
            #[derive(serde::Deserialize)]
            struct Row {
                start_ms: u64,
                end_ms: u64,
            }
            let db = env.d1(bindings::DB)?;
            let rows: Vec<Row> = crate::d1::all(
                &db,
                "SELECT start_ms, end_ms FROM audit_shards WHERE project = ? AND end_ms > ? AND start_ms < ?",
                &[text(project), num(lo), num(hi)],
            )
            .await?;
            rows.into_iter().map(|r| (r.start_ms, r.end_ms)).collect()
        }
    };
    spans.retain(|(s, e)| *e > lo && *s < hi);
    spans.sort_unstable();
    Ok(spans
        .into_iter()
        .map(|(start_ms, end_ms)| Source::Shard { start_ms, end_ms })
        .collect())
}
