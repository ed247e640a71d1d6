//! `GET /_postguard/v1/audit` and `GET /_postguard/v1/stats`: an API key sees
//! its own project; the operator sees everything and may filter by project.

use postguard_core::audit::{bounded, parse_days, quantile_offset, Arg, AuditQuery, AuditRow};
use postguard_core::config::Config;
use postguard_core::credential::Credential;
use postguard_core::page::{encode_cursor, Page};
use postguard_core::{ErrorCode, Invalid, Problem};
use serde::{Deserialize, Serialize};
use worker::wasm_bindgen::JsValue;
use worker::{D1Database, Env, Request, Result};

use crate::auth;
use crate::bindings;
use crate::d1::{self, num, text};
use crate::http;
use crate::reject::Handled;
use crate::request::query_pairs;
use crate::runtime::{now_ms, RequestCtx};

/// Whose rows a caller may read.
enum Scope {
    All,
    Project(String),
}

async fn scope(req: &Request, env: &Env, cfg: &Config, rc: &RequestCtx) -> Handled<Scope> {
    match auth::credential(req, cfg) {
        Credential::Operator => Ok(Scope::All),
        Credential::Origin => Err(Problem::new(
            ErrorCode::Forbidden,
            "the origin token cannot read the audit log",
        )
        .into()),
        // A portal session reads its project, as that project's key would.
        Credential::Session(t) => Ok(Scope::Project(super::portal::session(&t, cfg, rc)?.project)),
        cred => {
            let caller = auth::api_caller(cred, env, cfg, rc).await?;
            Ok(Scope::Project(caller.key.record.project))
        }
    }
}

fn js(args: &[Arg]) -> Vec<JsValue> {
    args.iter()
        .map(|a| match a {
            Arg::Text(s) => text(s),
            Arg::Int(i) => JsValue::from_f64(*i as f64),
        })
        .collect()
}

/// A row as D1 returns it (booleans are integers).
#[derive(Deserialize)]
struct DbRow {
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
        }
    }
}

pub async fn list(req: &Request, env: &Env, cfg: &Config, rc: &RequestCtx) -> Handled {
    let scope = scope(req, env, cfg, rc).await?;
    let pairs = query_pairs(req)?;
    let all = matches!(scope, Scope::All);
    let mut q = AuditQuery::parse(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())), all)?;
    if let Scope::Project(p) = scope {
        q.project = Some(p);
    }
    let (sql, args) = q.to_sql();
    let db = env.d1(bindings::DB)?;
    let rows: Vec<DbRow> = d1::all(&db, sql, &js(&args)).await?;
    let rows: Vec<AuditRow> = rows.into_iter().map(AuditRow::from).collect();
    let page = Page::of(rows, q.limit, |r| encode_cursor(r.time, &r.request_id));
    http::json(rc, 200, &page, &[])
}

#[derive(Serialize, Deserialize)]
struct Day {
    date: String,
    requests: u64,
    errors: u64,
    server_errors: u64,
}

#[derive(Serialize, Deserialize)]
struct PathCount {
    path: String,
    requests: u64,
}

#[derive(Deserialize)]
struct Ms {
    response_time_ms: u64,
}

#[derive(Serialize)]
struct Stats {
    days: Vec<Day>,
    top_paths: Vec<PathCount>,
    error_share: f64,
    p50_ms: Option<u64>,
    p95_ms: Option<u64>,
}

async fn percentile(
    db: &D1Database,
    filter: &str,
    args: &[JsValue],
    n: u64,
    q: f64,
) -> Result<Option<u64>> {
    if n == 0 {
        return Ok(None);
    }
    let mut a = args.to_vec();
    a.push(num(quantile_offset(n, q)));
    let sql = format!("SELECT response_time_ms FROM audit_log WHERE {filter} ORDER BY response_time_ms LIMIT 1 OFFSET ?");
    let rows: Vec<Ms> = d1::all(db, sql, &a).await?;
    Ok(rows.first().map(|r| r.response_time_ms))
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

pub async fn stats(req: &Request, env: &Env, cfg: &Config, rc: &RequestCtx) -> Handled {
    let scope = scope(req, env, cfg, rc).await?;
    let pairs = query_pairs(req)?;
    let mut days = None;
    let mut project = None;
    let mut key_prefix = None;
    for (k, v) in &pairs {
        match k.as_str() {
            "days" => days = Some(v.as_str()),
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
        .is_some_and(|p| !postguard_core::config::is_valid_name(p))
    {
        return Err(Invalid::from("project: must be 1-64 characters of [A-Za-z0-9._-]").into());
    }
    // Whole UTC days, today included.
    let today_start = now_ms() / 86_400_000 * 86_400_000;
    let since = today_start.saturating_sub(u64::from(days - 1) * 86_400_000);
    let mut filter = "time >= ?".to_string();
    let mut args = vec![num(since)];
    if let Some(p) = &project {
        filter.push_str(" AND project = ?");
        args.push(text(p));
    }
    if let Some(k) = &key_prefix {
        filter.push_str(" AND key_prefix = ?");
        args.push(JsValue::from_str(k));
    }
    let db = env.d1(bindings::DB)?;
    let days_sql = format!(
        "SELECT strftime('%Y-%m-%d', time / 1000, 'unixepoch') AS date, COUNT(*) AS requests, \
         SUM(status >= 400) AS errors, SUM(status >= 500) AS server_errors \
         FROM audit_log WHERE {filter} GROUP BY date ORDER BY date"
    );
    let per_day: Vec<Day> = d1::all(&db, days_sql, &args).await?;
    let paths_sql = format!(
        "SELECT path, COUNT(*) AS requests FROM audit_log WHERE {filter} \
         GROUP BY path ORDER BY requests DESC, path LIMIT 10"
    );
    let top_paths: Vec<PathCount> = d1::all(&db, paths_sql, &args).await?;
    let total: u64 = per_day.iter().map(|d| d.requests).sum();
    let errors: u64 = per_day.iter().map(|d| d.errors).sum();
    let p50_ms = percentile(&db, &filter, &args, total, 0.50).await?;
    let p95_ms = percentile(&db, &filter, &args, total, 0.95).await?;
    let stats = Stats {
        days: per_day,
        top_paths,
        error_share: if total == 0 {
            0.0
        } else {
            errors as f64 / total as f64
        },
        p50_ms,
        p95_ms,
    };
    http::json(rc, 200, &stats, &[])
}
