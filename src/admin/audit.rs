//! `GET /_postguard/v1/audit` and `GET /_postguard/v1/stats`: an API key or a
//! portal session sees its own project (charged like any call of a key);
//! the operator sees everything and may filter by project.
//! Rows live in audit shards (ADR 0016): the core plans which ones to visit
//! (from the D1 directory), this file fetches and hands the answers back.

use futures_util::future::join_all;
use postguard_core::audit::{
    bounded, parse_days, parse_include_gateway, AuditQuery, AuditRow, COLUMNS,
};
use postguard_core::audit_shard::{
    self as shards, merge_key_activity, Bounds, HourCount, KeyActivity, PathCount, Shard,
    ShardStats, Source, StatsQuery, ALL_PROJECTS, MAX_LATENCY_MS, MAX_STATS_SHARDS,
};
use postguard_core::page::{encode_cursor, Page};
use postguard_core::Invalid;
use serde::Deserialize;
use worker::{D1Database, Env, Result};

use crate::auth::Principal;
use crate::bindings;
use crate::d1::{self, num, text};
use crate::durable::audit_shard as object;
use crate::handler::{self, Ctx};
use crate::reject::Handled;
use crate::request::query_pairs;
use crate::runtime::now_ms;
use postguard_core::audit_shard::protocol::{self as op, KeysQuery, Operation, ShardQuery};

/// Whose rows a caller may read.
enum Scope {
    All,
    Project(String),
}

/// The caller's scope: the operator reads every project; a key or a
/// portal session its own (the router charged it `audit_cost` or
/// `stats_cost`, and adds the rate-limit headers).
fn scope(who: &Principal) -> Scope {
    match who.project() {
        Some(p) => Scope::Project(p.to_string()),
        None => Scope::All,
    }
}

/// A legacy row as D1 returns it (booleans are integers).
#[derive(Deserialize)]
pub(crate) struct DbRow {
    request_id: String,
    time: u64,
    method: String,
    path: String,
    status: u16,
    response_bytes: Option<u64>,
    response_time_ms: u64,
    client_ip: Option<String>,
    user_agent: Option<String>,
    key_prefix: Option<String>,
    project: Option<String>,
    idempotency_key: Option<String>,
    replayed: i64,
    rate_limit_remaining: Option<u32>,
}

impl From<DbRow> for AuditRow {
    fn from(r: DbRow) -> Self {
        AuditRow {
            request_id: r.request_id,
            time: r.time,
            method: r.method,
            path: r.path,
            status: r.status,
            response_bytes: r.response_bytes,
            response_time_ms: r.response_time_ms,
            client_ip: r.client_ip,
            user_agent: r.user_agent,
            key_prefix: r.key_prefix,
            project: r.project,
            idempotency_key: r.idempotency_key,
            replayed: r.replayed != 0,
            rate_limit_remaining: r.rate_limit_remaining,
            origin: None,
            would_refuse: None,
            counted: Default::default(),
        }
    }
}

#[derive(Deserialize)]
struct DirRow {
    project: String,
    start_ms: u64,
    end_ms: u64,
}

#[derive(Deserialize)]
struct Span {
    lo: Option<u64>,
    hi: Option<u64>,
}

/// Bands of `/audit` read at once after the first.
const BAND_WAVE: usize = 4;

/// Directory rows fetched per query at most (newest first).
const MAX_DIRECTORY_ROWS: u64 = 5_000;

/// The sources that may hold rows of `project` (None = every project)
/// between `lo` and `hi`: the shards in the directory (`shards_of`: the
/// directory's project, None = every project's row shards), and the legacy
/// table if it still holds such rows. One D1 round trip.
pub(super) async fn sources(
    db: &D1Database,
    shards_of: Option<&str>,
    project: Option<&str>,
    lo: u64,
    hi: u64,
    max: u64,
) -> Result<Vec<Source>> {
    let hi = num(hi.min(1 << 53));
    let mut dir_args = vec![num(lo), hi.clone()];
    let dir_filter = match shards_of {
        Some(p) => {
            dir_args.push(text(p));
            "project = ?"
        }
        None => {
            dir_args.push(text(ALL_PROJECTS));
            "project != ?"
        }
    };
    dir_args.push(num(max));
    let dir = db
        .prepare(format!(
            "SELECT project, start_ms, end_ms FROM audit_shards WHERE end_ms > ? AND start_ms <= ? AND {dir_filter} ORDER BY start_ms DESC LIMIT ?"
        ))
        .bind(&dir_args)?;
    let mut legacy_args = vec![num(lo), hi];
    let legacy_filter = match project {
        Some(p) => {
            legacy_args.push(text(p));
            " AND project = ?"
        }
        None => "",
    };
    let legacy = db
        .prepare(format!(
            "SELECT MIN(time) AS lo, MAX(time) AS hi FROM audit_log WHERE time >= ? AND time <= ?{legacy_filter}"
        ))
        .bind(&legacy_args)?;
    let mut answers = db.batch(vec![dir, legacy]).await?.into_iter();
    let dir: Vec<DirRow> = match answers.next() {
        Some(r) => r.results()?,
        None => Vec::new(),
    };
    let span: Vec<Span> = match answers.next() {
        Some(r) => r.results()?,
        None => Vec::new(),
    };
    let mut out: Vec<Source> = dir
        .into_iter()
        .map(|d| {
            Source::Shard(Shard {
                project: d.project,
                start_ms: d.start_ms,
                end_ms: d.end_ms,
            })
        })
        .collect();
    if let Some(Span {
        lo: Some(lo),
        hi: Some(hi),
    }) = span.into_iter().next()
    {
        out.push(Source::Legacy {
            start_ms: lo,
            end_ms: hi.saturating_add(1),
        });
    }
    Ok(out)
}

/// Up to `take` rows of one source, newest first.
async fn rows_of(
    env: &Env,
    db: &D1Database,
    source: &Source,
    q: &AuditQuery,
    take: u32,
) -> Result<Vec<AuditRow>> {
    match source {
        Source::Shard(shard) => {
            let body = object::request::<op::Query>(&ShardQuery { q: q.clone(), take })?;
            let bytes = object::call(env, shard, op::Query::PATH, &body).await?;
            let mut rows = object::answer::<op::Query>(&bytes)?;
            let project = shard.row_project();
            for r in &mut rows {
                r.project.clone_from(&project);
            }
            Ok(rows)
        }
        Source::Legacy { .. } => {
            let (sql, args) = q.sql_on("audit_log", COLUMNS, true, take);
            let rows: Vec<DbRow> = d1::all(db, sql, &d1::args(&args)).await?;
            Ok(rows.into_iter().map(AuditRow::from).collect())
        }
    }
}

pub async fn list(cx: &Ctx<'_>) -> Handled {
    let (env, rc) = (cx.env, cx.rc);
    let scope = scope(&cx.who);
    let pairs = query_pairs(&cx.req)?;
    let all = matches!(scope, Scope::All);
    let mut q = AuditQuery::parse(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())), all)?;
    if let Scope::Project(p) = scope {
        q.project = Some(p);
    }
    let db = env.d1(bindings::DB)?;
    let bounds = Bounds::of(&q);
    let p = q.project.as_deref();
    let found = sources(&db, p, p, bounds.lo, bounds.hi, MAX_DIRECTORY_ROWS).await?;
    let bands = shards::plan(found, bounds);
    let want = q.limit as usize + 1;
    let mut rows: Vec<AuditRow> = Vec::with_capacity(want);
    let mut next = 0;
    // The newest band alone first (it usually fills the page), then waves of
    // bands read at once, so a selective filter over many days does not pay
    // one round trip per day.
    let mut wave = 1;
    while next < bands.len() && rows.len() < want {
        // At most `wave` bands and (past the first band) `MAX_FANOUT` sources.
        let mut end = next + 1;
        let mut sources_read = bands[next].len();
        while end < bands.len()
            && end - next < wave
            && sources_read + bands[end].len() <= shards::MAX_FANOUT
        {
            sources_read += bands[end].len();
            end += 1;
        }
        let these = &bands[next..end];
        next = end;
        wave = BAND_WAVE;
        // Checked per band visited: a wide old bucket does not stop the
        // newest pages of the operator's view.
        if q.project.is_none() {
            shards::check_fanout(these)?;
        }
        let take = want - rows.len();
        // Every source of these bands at once, in one join (one join type in the
        // wasm, not one per nesting level: ADR 0026), then merged band by band.
        let reads = these.iter().flatten();
        let mut read = join_all(reads.map(|s| rows_of(env, &db, s, &q, take as u32)))
            .await
            .into_iter();
        for band in these {
            let answers = read.by_ref().take(band.len()).collect::<Result<Vec<_>>>()?;
            let take = want - rows.len();
            rows.extend(shards::merge(answers, take));
            if rows.len() >= want {
                break;
            }
        }
    }
    let page = Page::of(rows, q.limit, |r| encode_cursor(r.time, &r.request_id));
    handler::json(rc, 200, &page, &[])
}

fn parse_key_prefix(v: &str) -> Result<String, Invalid> {
    if v.is_empty() || v.len() > 64 || !v.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Invalid::field(
            "key_prefix",
            "must be 1-64 visible ASCII characters",
        ));
    }
    Ok(v.to_string())
}

#[derive(Deserialize)]
struct Ms {
    ms: u64,
    n: u64,
}

/// The legacy table's rows from `since`, counted as a shard's roll-ups.
async fn legacy_stats(
    db: &D1Database,
    since: u64,
    project: Option<&str>,
    q: &StatsQuery,
) -> Result<ShardStats> {
    let key_prefix = q.key_prefix.as_deref();
    let mut filter = "time >= ?".to_string();
    if q.exclude_gateway {
        filter.push_str(" AND NOT ");
        filter.push_str(postguard_core::routes::GATEWAY_PATH_SQL);
    }
    let mut args = vec![num(since)];
    if let Some(p) = project {
        filter.push_str(" AND project = ?");
        args.push(text(p));
    }
    if let Some(k) = key_prefix {
        filter.push_str(" AND key_prefix = ?");
        args.push(text(k));
    }
    let hours: Vec<HourCount> = d1::all(
        db,
        format!(
            "SELECT time / 3600000 * 3600000 AS hour, COUNT(*) AS requests, SUM(status >= 400) AS errors, \
             SUM(status >= 500) AS server_errors FROM audit_log WHERE {filter} GROUP BY hour"
        ),
        &args,
    )
    .await?;
    if hours.is_empty() {
        return Ok(ShardStats::default());
    }
    let paths: Vec<PathCount> = d1::all(
        db,
        format!("SELECT path, COUNT(*) AS requests FROM audit_log WHERE {filter} GROUP BY path"),
        &args,
    )
    .await?;
    let latency: Vec<Ms> = d1::all(
        db,
        format!(
            "SELECT MIN(response_time_ms, {MAX_LATENCY_MS}) AS ms, COUNT(*) AS n FROM audit_log WHERE {filter} GROUP BY ms"
        ),
        &args,
    )
    .await?;
    Ok(ShardStats {
        hours,
        paths,
        latency: latency.into_iter().map(|m| (m.ms, m.n)).collect(),
        // The legacy table predates the usage counts.
        missing: Vec::new(),
    })
}

pub async fn stats(cx: &Ctx<'_>) -> Handled {
    let (env, rc) = (cx.env, cx.rc);
    let scope = scope(&cx.who);
    let pairs = query_pairs(&cx.req)?;
    let mut days = None;
    let mut project = None;
    let mut key_prefix = None;
    let mut exclude_gateway = false;
    for (k, v) in &pairs {
        match k.as_str() {
            "days" => days = Some(v.as_str()),
            "include_gateway" => exclude_gateway = parse_include_gateway(v)?,
            // Per-key statistics (the dashboard's Keys view), within the
            // caller's own project unless it is the operator.
            "key_prefix" => key_prefix = Some(parse_key_prefix(v)?),
            "project" if matches!(scope, Scope::All) => project = Some(v.clone()),
            other => return Err(Invalid::field(&bounded(other, 64), "unknown parameter").into()),
        }
    }
    let days = parse_days(days)?;
    if let Scope::Project(p) = scope {
        project = Some(p);
    }
    if project
        .as_deref()
        .is_some_and(|p| !postguard_core::ids::is_valid_name(p))
    {
        return Err(Invalid::from("project: must be 1-64 characters of [A-Za-z0-9._-]").into());
    }
    // Whole UTC days, today included.
    let today_start = now_ms() / 86_400_000 * 86_400_000;
    let since = today_start.saturating_sub(u64::from(days - 1) * 86_400_000);
    let db = env.d1(bindings::DB)?;
    let max = MAX_STATS_SHARDS as u64 + 1;
    // Without a project: each bucket's cross-project roll-up shard.
    let shards_of = project.as_deref().unwrap_or(ALL_PROJECTS);
    let found = sources(
        &db,
        Some(shards_of),
        project.as_deref(),
        since,
        u64::MAX,
        max,
    )
    .await?;
    let shards_found: Vec<Shard> = found
        .iter()
        .filter_map(|s| match s {
            Source::Shard(s) => Some(s.clone()),
            Source::Legacy { .. } => None,
        })
        .collect();
    if shards_found.len() > MAX_STATS_SHARDS {
        return Err(shards::project_required(&format!(
            "these days hold more than {MAX_STATS_SHARDS} audit shards: add project= or lower days="
        ))
        .into());
    }
    let q = StatsQuery {
        since_ms: since,
        key_prefix,
        exclude_gateway,
    };
    // A join over `object::call` itself, the type the audit writer joins too (ADR 0026).
    let body = object::request::<op::Stats>(&q)?;
    let calls = shards_found
        .iter()
        .map(|s| object::call(env, s, op::Stats::PATH, &body));
    let mut parts = join_all(calls)
        .await
        .into_iter()
        .map(|r| r.and_then(|b| object::answer::<op::Stats>(&b)))
        .collect::<Result<Vec<_>>>()?;
    if found.iter().any(|s| matches!(s, Source::Legacy { .. })) {
        parts.push(legacy_stats(&db, since, project.as_deref(), &q).await?);
    }
    handler::json(rc, 200, &shards::merge_stats(parts), &[])
}

#[derive(serde::Serialize)]
struct Activity {
    data: Vec<KeyActivity>,
}

/// `GET /_postguard/v1/keys/activity?project=&days=` (operator): when each
/// of the project's keys was last used within `days` (default 30), and
/// how much — from the audit shards' roll-ups and rows, which exist
/// already: the proxy path writes nothing for it. Keys without a request in
/// the window are absent.
pub async fn key_activity(cx: &Ctx<'_>) -> Handled {
    let (env, rc) = (cx.env, cx.rc);
    let pairs = query_pairs(&cx.req)?;
    let mut days = None;
    let mut project = None;
    for (k, v) in &pairs {
        match k.as_str() {
            "days" => days = Some(v.as_str()),
            "project" => project = Some(v.as_str()),
            other => return Err(Invalid::field(&bounded(other, 64), "unknown parameter").into()),
        }
    }
    let days = parse_days(days)?;
    let project = match project {
        Some(p) if postguard_core::ids::is_valid_name(p) => p,
        Some(_) => {
            return Err(Invalid::from("project: must be 1-64 characters of [A-Za-z0-9._-]").into())
        }
        None => return Err(Invalid::field("project", "required").into()),
    };
    let today_start = now_ms() / 86_400_000 * 86_400_000;
    let since = today_start.saturating_sub(u64::from(days - 1) * 86_400_000);
    let db = env.d1(bindings::DB)?;
    let max = MAX_STATS_SHARDS as u64;
    let found = sources(&db, Some(project), Some(project), since, u64::MAX, max).await?;
    let body = object::request::<op::Keys>(&KeysQuery { since_ms: since })?;
    let shards_found: Vec<&Shard> = found
        .iter()
        .filter_map(|s| match s {
            Source::Shard(s) => Some(s),
            Source::Legacy { .. } => None,
        })
        .collect();
    let calls = shards_found
        .iter()
        .map(|s| object::call(env, s, op::Keys::PATH, &body));
    let mut parts = join_all(calls)
        .await
        .into_iter()
        .map(|r| r.and_then(|b| object::answer::<op::Keys>(&b)))
        .collect::<Result<Vec<_>>>()?;
    if found.iter().any(|s| matches!(s, Source::Legacy { .. })) {
        parts.push(
            d1::all(
                &db,
                "SELECT key_prefix, COUNT(*) AS requests, SUM(status >= 400) AS errors, MAX(time) AS last_used_at \
                 FROM audit_log WHERE project = ? AND time >= ? AND key_prefix IS NOT NULL GROUP BY key_prefix"
                    .to_string(),
                &[text(project), num(since)],
            )
            .await?,
        );
    }
    let data = merge_key_activity(parts);
    handler::json(rc, 200, &Activity { data }, &[])
}
