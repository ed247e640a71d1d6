//! `/_postguard/v1/webhooks`: create (secret shown once), list, get, delete,
//! rotate-secret (the previous secret keeps signing for 24 h).

use postguard_core::config::Config;
use postguard_core::page::{decode_cursor, encode_cursor, parse_limit, Page};
use postguard_core::webhooks::{events, signature};
use postguard_core::Problem;
use serde::{Deserialize, Serialize};
use worker::{Env, Request, Result};

use super::{new_id, num, opt_text, policy, text};
use crate::auth;
use crate::bindings;
use crate::http;
use crate::reject::Handled;
use crate::request::query_param;
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

fn new_secret() -> Result<String> {
    let bytes =
        random_bytes::<24>().map_err(|e| worker::Error::RustError(format!("random: {e}")))?;
    Ok(signature::new_secret(&bytes))
}

pub async fn create(mut req: Request, env: &Env, cfg: &Config, rc: &RequestCtx) -> Handled {
    let project = auth::project(&req, env, cfg, rc).await?;
    let body = crate::request::body(&mut req, cfg).await?;
    let input = events::parse_subscription(&body, &policy(cfg))?;
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

pub async fn list(req: &Request, env: &Env, cfg: &Config, rc: &RequestCtx) -> Handled {
    let project = auth::project(req, env, cfg, rc).await?;
    let limit = parse_limit(query_param(req, "limit")?.as_deref())?;
    let mut sql =
        "SELECT id, url, events, description, created_at FROM subscriptions WHERE project = ?"
            .to_string();
    let mut args = vec![text(&project)];
    if let Some(c) = query_param(req, "cursor")? {
        let (t, id) = decode_cursor(&c)?;
        sql.push_str(" AND (created_at < ? OR (created_at = ? AND id < ?))");
        args.extend([num(t), num(t), text(&id)]);
    }
    sql.push_str(" ORDER BY created_at DESC, id DESC LIMIT ?");
    args.push(num(u64::from(limit) + 1));
    let rows: Vec<Row> = crate::d1::all(&env.d1(bindings::DB)?, sql, &args).await?;
    let subs: Vec<Subscription> = rows.into_iter().map(Subscription::from).collect();
    let page = Page::of(subs, limit, |s| encode_cursor(s.created_at, &s.id));
    http::json(rc, 200, &page, &[])
}

fn not_found(id: &str) -> Problem {
    Problem::not_found("webhook subscription", id)
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

pub async fn get(req: &Request, env: &Env, cfg: &Config, rc: &RequestCtx, id: &str) -> Handled {
    let project = auth::project(req, env, cfg, rc).await?;
    let sub = load(env, &project, id)
        .await?
        .ok_or_else(|| not_found(id))?;
    http::json(rc, 200, &sub, &[])
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

pub async fn delete(req: &Request, env: &Env, cfg: &Config, rc: &RequestCtx, id: &str) -> Handled {
    let project = auth::project(req, env, cfg, rc).await?;
    let sql = "DELETE FROM subscriptions WHERE id = ? AND project = ?";
    if !write_one(env, sql, &[text(id), text(&project)]).await? {
        return Err(not_found(id).into());
    }
    http::no_content(rc)
}

#[derive(Serialize)]
struct Rotated {
    secret: String,
}

pub async fn rotate(req: &Request, env: &Env, cfg: &Config, rc: &RequestCtx, id: &str) -> Handled {
    let project = auth::project(req, env, cfg, rc).await?;
    let secret = new_secret()?;
    let sql = "UPDATE subscriptions SET previous_secret = secret, previous_secret_until = ?, secret = ? WHERE id = ? AND project = ?";
    let binds = [
        num(now_ms() + u64::from(cfg.settings.webhooks.secret_overlap_s) * 1_000),
        text(&secret),
        text(id),
        text(&project),
    ];
    if !write_one(env, sql, &binds).await? {
        return Err(not_found(id).into());
    }
    http::json(rc, 200, &Rotated { secret }, &[])
}
