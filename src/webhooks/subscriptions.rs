//! `/_postguard/v1/webhooks`: create (secret shown once), list, get, delete,
//! rotate-secret (the previous secret keeps signing for 24 h).

use postguard_core::audit::{decode_cursor, encode_cursor};
use postguard_core::config::Config;
use postguard_core::keys::parse_limit;
use postguard_core::webhooks::{events, signature};
use postguard_core::Problem;
use serde::{Deserialize, Serialize};
use worker::{Env, Request, Response, Result};

use super::{new_id, num, opt_text, policy, project_of, text};
use crate::admin::{query_param, validation};
use crate::bindings;
use crate::http;
use crate::runtime::{now_ms, random_bytes, RequestCtx};

#[derive(Deserialize)]
struct Row {
    id: String,
    url: String,
    events: String,
    description: Option<String>,
    created_at: u64,
}

#[derive(Serialize)]
pub struct Subscription {
    id: String,
    url: String,
    events: Vec<String>,
    description: Option<String>,
    created_at: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    secret: Option<String>,
}

impl From<Row> for Subscription {
    fn from(r: Row) -> Self {
        Subscription {
            id: r.id,
            url: r.url,
            events: serde_json::from_str(&r.events).unwrap_or_default(),
            description: r.description,
            created_at: r.created_at,
            secret: None,
        }
    }
}

#[derive(Serialize)]
struct Page {
    data: Vec<Subscription>,
    next_cursor: Option<String>,
}

fn new_secret() -> Result<String> {
    let bytes =
        random_bytes::<24>().map_err(|e| worker::Error::RustError(format!("random: {e}")))?;
    Ok(signature::new_secret(&bytes))
}

macro_rules! project_or_answer {
    ($req:expr, $env:expr, $cfg:expr, $rc:expr) => {
        match project_of($req, $env, $cfg, $rc).await? {
            Ok(p) => p,
            Err(p) => return http::problem($rc, &p, &[]),
        }
    };
}
pub(crate) use project_or_answer;

pub async fn create(
    mut req: Request,
    env: &Env,
    cfg: &Config,
    rc: &RequestCtx,
) -> Result<Response> {
    let project = project_or_answer!(&req, env, cfg, rc);
    let body = req.bytes().await?;
    let input = match events::parse_subscription(&body, &policy(cfg)) {
        Ok(i) => i,
        Err(detail) => return http::problem(rc, &validation(detail), &[]),
    };
    let id = new_id("sub_");
    let secret = new_secret()?;
    let now = now_ms();
    let events_json = serde_json::to_string(&input.events)?;
    env.d1(bindings::DB)?
        .prepare("INSERT INTO subscriptions (id, project, url, events, description, secret, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)")
        .bind(&[text(&id), text(&project), text(&input.url), text(&events_json), opt_text(input.description.as_deref()), text(&secret), num(now)])?
        .run()
        .await?;
    let sub = Subscription {
        id,
        url: input.url,
        events: input.events,
        description: input.description,
        created_at: now,
        secret: Some(secret),
    };
    http::json(rc, 201, &sub, &[])
}

pub async fn list(req: &Request, env: &Env, cfg: &Config, rc: &RequestCtx) -> Result<Response> {
    let project = project_or_answer!(req, env, cfg, rc);
    let limit = match parse_limit(query_param(req, "limit")?.as_deref()) {
        Ok(l) => l,
        Err(d) => return http::problem(rc, &validation(d), &[]),
    };
    let mut sql =
        "SELECT id, url, events, description, created_at FROM subscriptions WHERE project = ?"
            .to_string();
    let mut args = vec![text(&project)];
    if let Some(c) = query_param(req, "cursor")? {
        let (t, id) = match decode_cursor(&c) {
            Ok(x) => x,
            Err(d) => return http::problem(rc, &validation(d), &[]),
        };
        sql.push_str(" AND (created_at < ? OR (created_at = ? AND id < ?))");
        args.extend([num(t), num(t), text(&id)]);
    }
    sql.push_str(" ORDER BY created_at DESC, id DESC LIMIT ?");
    args.push(num(u64::from(limit) + 1));
    let rows: Vec<Row> = env
        .d1(bindings::DB)?
        .prepare(sql)
        .bind(&args)?
        .all()
        .await?
        .results()?;
    let mut data: Vec<Subscription> = rows.into_iter().map(Subscription::from).collect();
    let next_cursor = if data.len() > limit as usize {
        data.truncate(limit as usize);
        data.last().map(|s| encode_cursor(s.created_at, &s.id))
    } else {
        None
    };
    http::json(rc, 200, &Page { data, next_cursor }, &[])
}

async fn load(env: &Env, project: &str, id: &str) -> Result<Option<Subscription>> {
    let row: Option<Row> = env
        .d1(bindings::DB)?
        .prepare("SELECT id, url, events, description, created_at FROM subscriptions WHERE id = ? AND project = ?")
        .bind(&[text(id), text(project)])?
        .first(None)
        .await?;
    Ok(row.map(Subscription::from))
}

pub async fn get(
    req: &Request,
    env: &Env,
    cfg: &Config,
    rc: &RequestCtx,
    id: &str,
) -> Result<Response> {
    let project = project_or_answer!(req, env, cfg, rc);
    match load(env, &project, id).await? {
        Some(s) => http::json(rc, 200, &s, &[]),
        None => http::problem(rc, &Problem::not_found("webhook subscription", id), &[]),
    }
}

/// Runs one UPDATE/DELETE on a subscription; whether it matched a row (one
/// round trip: no separate existence check before the write).
async fn write_one(env: &Env, sql: &str, binds: &[worker::wasm_bindgen::JsValue]) -> Result<bool> {
    let res = env
        .d1(bindings::DB)?
        .prepare(sql)
        .bind(binds)?
        .run()
        .await?;
    Ok(res.meta()?.and_then(|m| m.changes).unwrap_or(0) > 0)
}

pub async fn delete(
    req: &Request,
    env: &Env,
    cfg: &Config,
    rc: &RequestCtx,
    id: &str,
) -> Result<Response> {
    let project = project_or_answer!(req, env, cfg, rc);
    let sql = "DELETE FROM subscriptions WHERE id = ? AND project = ?";
    if !write_one(env, sql, &[text(id), text(&project)]).await? {
        return http::problem(rc, &Problem::not_found("webhook subscription", id), &[]);
    }
    http::respond(rc, 204, &[], &[], None)
}

#[derive(Serialize)]
struct Rotated {
    secret: String,
}

pub async fn rotate(
    req: &Request,
    env: &Env,
    cfg: &Config,
    rc: &RequestCtx,
    id: &str,
) -> Result<Response> {
    let project = project_or_answer!(req, env, cfg, rc);
    let secret = new_secret()?;
    let sql = "UPDATE subscriptions SET previous_secret = secret, previous_secret_until = ?, secret = ? WHERE id = ? AND project = ?";
    let binds = [
        num(now_ms() + u64::from(cfg.settings.webhooks.secret_overlap_s) * 1_000),
        text(&secret),
        text(id),
        text(&project),
    ];
    if !write_one(env, sql, &binds).await? {
        return http::problem(rc, &Problem::not_found("webhook subscription", id), &[]);
    }
    http::json(rc, 200, &Rotated { secret }, &[])
}
