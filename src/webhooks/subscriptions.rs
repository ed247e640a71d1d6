//! `/_postguard/v1/webhooks`: create (secret shown once), list, get, delete,
//! rotate-secret (the previous secret keeps signing for 24 h), and the §11
//! lifecycle: PATCH (the secret is kept), pause and resume. A subscription's
//! state, health and throttle live in `subscription_ops` (no row = active).

use postguard_core::config::Config;
use postguard_core::page::{decode_cursor, encode_cursor, parse_limit, Page};
use postguard_core::webhooks::ops::{self, SubState};
use postguard_core::webhooks::signature;
use postguard_core::{Invalid, Problem};
use serde::{Deserialize, Serialize};
use worker::wasm_bindgen::JsValue;
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
    state: Option<SubState>,
    disabled_reason: Option<String>,
    disabled_at: Option<u64>,
    rate_limit_per_s: Option<u32>,
}

/// The columns of [`Row`], from `subscriptions s LEFT JOIN subscription_ops o`.
const COLUMNS: &str = "s.id, s.url, s.events, s.description, s.created_at, o.state, o.disabled_reason, o.disabled_at, o.rate_limit_per_s \
     FROM subscriptions s LEFT JOIN subscription_ops o ON o.subscription_id = s.id";

#[derive(Serialize)]
pub struct Subscription {
    pub id: String,
    pub url: String,
    pub events: Vec<String>,
    description: Option<String>,
    created_at: u64,
    pub state: SubState,
    #[serde(skip_serializing_if = "Option::is_none")]
    disabled_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    disabled_at: Option<u64>,
    rate_limit_per_s: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    secret: Option<String>,
}

impl From<Row> for Subscription {
    fn from(r: Row) -> Self {
        let state = r.state.unwrap_or(SubState::Active);
        let disabled = state == SubState::Disabled;
        Subscription {
            id: r.id,
            url: r.url,
            events: serde_json::from_slice(r.events.as_bytes()).unwrap_or_default(),
            description: r.description,
            created_at: r.created_at,
            state,
            disabled_reason: r.disabled_reason.filter(|_| disabled),
            disabled_at: r.disabled_at.filter(|_| disabled),
            rate_limit_per_s: r.rate_limit_per_s,
            secret: None,
        }
    }
}

fn new_secret() -> Result<String> {
    let bytes =
        random_bytes::<24>().map_err(|e| worker::Error::RustError(format!("random: {e}")))?;
    Ok(signature::new_secret(&bytes))
}

/// Creates a subscription owned by the calling key, within the project's
/// `webhooks.max_subscriptions_per_project` (checked in the INSERT itself,
/// so concurrent creates cannot pass the cap together).
pub async fn create(mut req: Request, env: &Env, cfg: &Config, rc: &RequestCtx) -> Handled {
    let (project, key_id) = auth::project_and_key(&req, env, cfg, rc).await?;
    let project = &project;
    let body = crate::request::body(&mut req, cfg).await?;
    let (input, rate) = ops::parse_create(&body, &policy(cfg))?;
    let id = new_id("sub_");
    let secret = new_secret()?;
    let now = now_ms();
    let events_json = serde_json::to_string(&input.events)?;
    let cap = cfg.settings.webhooks.max_subscriptions_per_project;
    let db = env.d1(bindings::DB)?;
    let insert = db
        .prepare("INSERT INTO subscriptions (id, project, url, events, description, secret, created_at) \
                  SELECT ?, ?, ?, ?, ?, ?, ? WHERE (SELECT COUNT(*) FROM subscriptions WHERE project = ?) < ?")
        .bind(&[text(&id), text(project), text(&input.url), text(&events_json), opt_text(input.description.as_deref()), text(&secret), num(now), text(project), num(u64::from(cap))])?;
    let mut statements = vec![insert];
    // A portal session has no key: its subscriptions have no owner to revoke.
    if let Some(key_id) = &key_id {
        statements.push(db
            .prepare("INSERT INTO subscription_owners (subscription_id, key_id) SELECT ?, ? WHERE EXISTS (SELECT 1 FROM subscriptions WHERE id = ?)")
            .bind(&[text(&id), text(key_id), text(&id)])?);
    }
    if let Some(r) = rate {
        statements.push(
            db.prepare("INSERT INTO subscription_ops (subscription_id, project, rate_limit_per_s) SELECT ?, ?, ? WHERE EXISTS (SELECT 1 FROM subscriptions WHERE id = ?)")
                .bind(&[text(&id), text(project), num(u64::from(r)), text(&id)])?,
        );
    }
    let results = db.batch(statements).await?;
    let inserted = results
        .first()
        .and_then(|r| r.meta().ok().flatten())
        .and_then(|m| m.changes)
        .unwrap_or(0);
    if inserted == 0 {
        return Err(Invalid::from(format!(
            "this project already has {cap} webhook subscriptions (webhooks.max_subscriptions_per_project); delete one first"
        ))
        .into());
    }
    let sub = Subscription {
        id,
        url: input.url,
        events: input.events,
        description: input.description,
        created_at: now,
        state: SubState::Active,
        disabled_reason: None,
        disabled_at: None,
        rate_limit_per_s: rate,
        secret: Some(secret),
    };
    http::json(rc, 201, &sub, &[])
}

pub async fn list(req: &Request, env: &Env, cfg: &Config, rc: &RequestCtx) -> Handled {
    let project = auth::project(req, env, cfg, rc).await?;
    let limit = parse_limit(query_param(req, "limit")?.as_deref())?;
    let mut sql = format!("SELECT {COLUMNS} WHERE s.project = ?");
    let mut args = vec![text(&project)];
    if let Some(c) = query_param(req, "cursor")? {
        let (t, id) = decode_cursor(&c)?;
        sql.push_str(" AND (s.created_at < ? OR (s.created_at = ? AND s.id < ?))");
        args.extend([num(t), num(t), text(&id)]);
    }
    sql.push_str(" ORDER BY s.created_at DESC, s.id DESC LIMIT ?");
    args.push(num(u64::from(limit) + 1));
    let rows: Vec<Row> = crate::d1::all(&env.d1(bindings::DB)?, sql, &args).await?;
    let subs: Vec<Subscription> = rows.into_iter().map(Subscription::from).collect();
    let page = Page::of(subs, limit, |s| encode_cursor(s.created_at, &s.id));
    http::json(rc, 200, &page, &[])
}

pub fn not_found(id: &str) -> Problem {
    Problem::not_found("webhook subscription", id)
}

pub async fn load(env: &Env, project: &str, id: &str) -> Result<Option<Subscription>> {
    let row: Option<Row> = env
        .d1(bindings::DB)?
        .prepare(format!("SELECT {COLUMNS} WHERE s.id = ? AND s.project = ?"))
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
    // The owner row goes with it (a leftover one is harmless: nothing joins it).
    let sql = "DELETE FROM subscriptions WHERE id = ? AND project = ?";
    if !write_one(env, sql, &[text(id), text(&project)]).await? {
        return Err(not_found(id).into());
    }
    let sql = "DELETE FROM subscription_ops WHERE subscription_id = ? AND project = ?";
    write_one(env, sql, &[text(id), text(&project)]).await?;
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

/// `PATCH /webhooks/{id}` `{url?, events?, description?, rate_limit_per_s?}`:
/// the same rules as create on the merged result; the secret is kept.
pub async fn patch(
    mut req: Request,
    env: &Env,
    cfg: &Config,
    rc: &RequestCtx,
    id: &str,
) -> Handled {
    let project = auth::project(&req, env, cfg, rc).await?;
    let body = crate::request::body(&mut req, cfg).await?;
    let current = load(env, &project, id)
        .await?
        .ok_or_else(|| not_found(id))?;
    let p = ops::parse_patch(&body, &current.url, &current.events, &policy(cfg))?;
    let db = env.d1(bindings::DB)?;
    let mut statements = Vec::new();
    let mut set = |col: &str, v: JsValue| -> Result<()> {
        let sql = format!("UPDATE subscriptions SET {col} = ? WHERE id = ? AND project = ?");
        statements.push(db.prepare(sql).bind(&[v, text(id), text(&project)])?);
        Ok(())
    };
    if let Some(url) = &p.url {
        set("url", text(url))?;
    }
    if let Some(ev) = &p.events {
        set("events", text(&serde_json::to_string(ev)?))?;
    }
    if let Some(d) = &p.description {
        set("description", opt_text(d.as_deref()))?;
    }
    if let Some(r) = p.rate_limit_per_s {
        let r = r.map_or(JsValue::NULL, |r| num(u64::from(r)));
        statements.push(
            db.prepare("INSERT INTO subscription_ops (subscription_id, project, rate_limit_per_s) VALUES (?, ?, ?) \
                        ON CONFLICT (subscription_id) DO UPDATE SET rate_limit_per_s = excluded.rate_limit_per_s")
                .bind(&[text(id), text(&project), r])?,
        );
    }
    if !statements.is_empty() {
        db.batch(statements).await?;
    }
    let sub = load(env, &project, id)
        .await?
        .ok_or_else(|| not_found(id))?;
    http::json(rc, 200, &sub, &[])
}

/// `POST /webhooks/{id}/pause`: new events still create deliveries, held as
/// `paused`; scheduled attempts already queued hold theirs when they run.
pub async fn pause(req: &Request, env: &Env, cfg: &Config, rc: &RequestCtx, id: &str) -> Handled {
    let project = auth::project(req, env, cfg, rc).await?;
    load(env, &project, id)
        .await?
        .ok_or_else(|| not_found(id))?;
    set_state(env, &project, id, SubState::Paused, None).await?;
    let sub = load(env, &project, id)
        .await?
        .ok_or_else(|| not_found(id))?;
    http::json(rc, 200, &sub, &[])
}

/// Writes a subscription's state (and, when disabling, why and since when).
pub async fn set_state(
    env: &Env,
    project: &str,
    id: &str,
    state: SubState,
    disabled: Option<(&str, u64)>,
) -> Result<()> {
    let (reason, at) = match disabled {
        Some((r, at)) => (text(r), num(at)),
        None => (JsValue::NULL, JsValue::NULL),
    };
    // Resuming also restarts the failure clock.
    let clock = if state == SubState::Active {
        ", failing_since = NULL"
    } else {
        ""
    };
    let sql = format!(
        "INSERT INTO subscription_ops (subscription_id, project, state, disabled_reason, disabled_at) VALUES (?, ?, ?, ?, ?) \
         ON CONFLICT (subscription_id) DO UPDATE SET state = excluded.state, disabled_reason = excluded.disabled_reason, disabled_at = excluded.disabled_at{clock}"
    );
    env.d1(bindings::DB)?
        .prepare(sql)
        .bind(&[text(id), text(project), text(state.as_str()), reason, at])?
        .run()
        .await?;
    Ok(())
}

/// `POST /webhooks/{id}/resume`: active again (from paused or disabled), then
/// every held delivery back on its schedule, due now, queued in creation
/// order (ADR 0014).
pub async fn resume(req: &Request, env: &Env, cfg: &Config, rc: &RequestCtx, id: &str) -> Handled {
    let project = auth::project(req, env, cfg, rc).await?;
    load(env, &project, id)
        .await?
        .ok_or_else(|| not_found(id))?;
    // First active (a hold written after this fails its compare-and-set and
    // sends instead), then release what was held before.
    set_state(env, &project, id, SubState::Active, None).await?;
    super::write::release_held(env, cfg, &project, id).await?;
    let sub = load(env, &project, id)
        .await?
        .ok_or_else(|| not_found(id))?;
    http::json(rc, 200, &sub, &[])
}
