//! The subscriptions' rows in D1 (docs/webhooks.md, docs/operating-webhooks.md): `subscriptions`, with
//! their state, health and throttle in `subscription_ops` (no row = active)
//! and the key that created them in `subscription_owners`.

use postguard_core::config::OnKeyRevoked;
use postguard_core::webhooks::ops::{Patch, SubState};
use serde::Deserialize;
use worker::wasm_bindgen::JsValue;
use worker::{Env, Result};

use super::db;
use crate::d1::{num, opt_text, text};
use crate::durable::project_hub;

/// A subscription as the API shows it (without its secrets).
#[derive(Deserialize)]
pub struct Row {
    pub id: String,
    pub url: String,
    pub events: String,
    pub description: Option<String>,
    pub created_at: u64,
    pub state: Option<SubState>,
    pub disabled_reason: Option<String>,
    pub disabled_at: Option<u64>,
    pub rate_limit_per_s: Option<u32>,
    /// What its receiver last advertised (`receiver_limits`), if anything.
    pub receiver_remaining: Option<u64>,
    pub receiver_reset_at: Option<u64>,
}

/// The columns of [`Row`], from `subscriptions s LEFT JOIN subscription_ops o`.
const COLUMNS: &str = "s.id, s.url, s.events, s.description, s.created_at, o.state, o.disabled_reason, o.disabled_at, o.rate_limit_per_s, \
     r.remaining AS receiver_remaining, r.reset_at AS receiver_reset_at \
     FROM subscriptions s LEFT JOIN subscription_ops o ON o.subscription_id = s.id \
     LEFT JOIN receiver_limits r ON r.subscription_id = s.id";

/// A subscription to create.
pub struct New<'a> {
    pub id: &'a str,
    pub project: &'a str,
    pub url: &'a str,
    /// The filters as a JSON array.
    pub events: &'a str,
    pub description: Option<&'a str>,
    pub secret: &'a str,
    pub created_at: u64,
    /// Its owner: the creating key's id, or for a portal session the
    /// project's owner name (`portal::subscription_owner`), so that ending
    /// the project's sessions can pause it.
    pub owner: &'a str,
    pub rate_limit_per_s: Option<u32>,
}

/// Creates it within `cap` per project (checked in the INSERT itself, so
/// concurrent creates cannot pass the cap together); `false` at the cap.
pub async fn insert(env: &Env, s: &New<'_>, cap: u32) -> Result<bool> {
    let d = db(env)?;
    let insert = d
        .prepare("INSERT INTO subscriptions (id, project, url, events, description, secret, created_at) \
                  SELECT ?, ?, ?, ?, ?, ?, ? WHERE (SELECT COUNT(*) FROM subscriptions WHERE project = ?) < ?")
        .bind(&[text(s.id), text(s.project), text(s.url), text(s.events), opt_text(s.description), text(s.secret), num(s.created_at), text(s.project), num(u64::from(cap))])?;
    let mut statements = vec![insert];
    statements.push(d
        .prepare("INSERT INTO subscription_owners (subscription_id, key_id) SELECT ?, ? WHERE EXISTS (SELECT 1 FROM subscriptions WHERE id = ?)")
        .bind(&[text(s.id), text(s.owner), text(s.id)])?);
    if let Some(r) = s.rate_limit_per_s {
        statements.push(
            d.prepare("INSERT INTO subscription_ops (subscription_id, project, rate_limit_per_s) SELECT ?, ?, ? WHERE EXISTS (SELECT 1 FROM subscriptions WHERE id = ?)")
                .bind(&[text(s.id), text(s.project), num(u64::from(r)), text(s.id)])?,
        );
    }
    let results = d.batch(statements).await?;
    project_hub::invalidate(env, s.project).await;
    Ok(results
        .first()
        .and_then(|r| r.meta().ok().flatten())
        .and_then(|m| m.changes)
        .unwrap_or(0)
        > 0)
}

/// A page of `project`'s subscriptions, newest first, after `cursor`.
pub async fn list(
    env: &Env,
    project: &str,
    cursor: Option<(u64, String)>,
    take: u32,
) -> Result<Vec<Row>> {
    let mut sql = format!("SELECT {COLUMNS} WHERE s.project = ?");
    let mut args = vec![text(project)];
    if let Some((t, id)) = cursor {
        sql.push_str(" AND (s.created_at < ? OR (s.created_at = ? AND s.id < ?))");
        args.extend([num(t), num(t), text(&id)]);
    }
    sql.push_str(" ORDER BY s.created_at DESC, s.id DESC LIMIT ?");
    args.push(num(u64::from(take)));
    crate::d1::all(&db(env)?, sql, &args).await
}

pub async fn load(env: &Env, project: &str, id: &str) -> Result<Option<Row>> {
    db(env)?
        .prepare(format!("SELECT {COLUMNS} WHERE s.id = ? AND s.project = ?"))
        .bind(&[text(id), text(project)])?
        .first(None)
        .await
}

/// Runs one UPDATE/DELETE on a subscription; whether it matched a row (one
/// round trip: no separate existence check before the write).
async fn write_one(env: &Env, sql: &str, binds: &[JsValue]) -> Result<bool> {
    let res = db(env)?.prepare(sql).bind(binds)?.run().await?;
    Ok(res.meta()?.and_then(|m| m.changes).unwrap_or(0) > 0)
}

/// Deletes it, its state row and its receiver's limit; `false` when there was none. (The owner
/// row may stay: nothing joins it without its subscription.)
pub async fn delete(env: &Env, project: &str, id: &str) -> Result<bool> {
    let sql = "DELETE FROM subscriptions WHERE id = ? AND project = ?";
    if !write_one(env, sql, &[text(id), text(project)]).await? {
        return Ok(false);
    }
    project_hub::invalidate(env, project).await;
    let sql = "DELETE FROM subscription_ops WHERE subscription_id = ? AND project = ?";
    write_one(env, sql, &[text(id), text(project)]).await?;
    // Its receiver's advertised limit (the subscription, checked above, was the project's).
    let sql = "DELETE FROM receiver_limits WHERE subscription_id = ?";
    write_one(env, sql, &[text(id)]).await?;
    Ok(true)
}

/// A new secret; the previous one keeps signing until `previous_until`.
pub async fn rotate(
    env: &Env,
    project: &str,
    id: &str,
    secret: &str,
    previous_until: u64,
) -> Result<bool> {
    let sql = "UPDATE subscriptions SET previous_secret = secret, previous_secret_until = ?, secret = ? WHERE id = ? AND project = ?";
    write_one(
        env,
        sql,
        &[num(previous_until), text(secret), text(id), text(project)],
    )
    .await
}

/// Applies a PATCH's fields (one D1 batch).
pub async fn patch(env: &Env, project: &str, id: &str, p: &Patch) -> Result<()> {
    let d = db(env)?;
    let mut statements = Vec::new();
    let mut set = |col: &str, v: JsValue| -> Result<()> {
        let sql = format!("UPDATE subscriptions SET {col} = ? WHERE id = ? AND project = ?");
        statements.push(d.prepare(sql).bind(&[v, text(id), text(project)])?);
        Ok(())
    };
    if let Some(url) = &p.url {
        set("url", text(url))?;
    }
    if let Some(ev) = &p.events {
        set("events", text(&serde_json::to_string(ev)?))?;
    }
    if let Some(desc) = &p.description {
        set("description", opt_text(desc.as_deref()))?;
    }
    if let Some(r) = p.rate_limit_per_s {
        let r = r.map_or(JsValue::NULL, |r| num(u64::from(r)));
        statements.push(
            d.prepare("INSERT INTO subscription_ops (subscription_id, project, rate_limit_per_s) VALUES (?, ?, ?) \
                        ON CONFLICT (subscription_id) DO UPDATE SET rate_limit_per_s = excluded.rate_limit_per_s")
                .bind(&[text(id), text(project), r])?,
        );
    }
    if !statements.is_empty() {
        d.batch(statements).await?;
        project_hub::invalidate(env, project).await;
    }
    Ok(())
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
    db(env)?
        .prepare(sql)
        .bind(&[text(id), text(project), text(state.as_str()), reason, at])?
        .run()
        .await?;
    project_hub::invalidate(env, project).await;
    Ok(())
}

/// A subscription's URL and signing secrets (the test ping).
#[derive(Deserialize)]
pub struct Secrets {
    pub url: String,
    pub secret: String,
    pub previous_secret: Option<String>,
    pub previous_secret_until: Option<u64>,
}

pub async fn secrets(env: &Env, project: &str, id: &str) -> Result<Option<Secrets>> {
    db(env)?
        .prepare("SELECT url, secret, previous_secret, previous_secret_until FROM subscriptions WHERE id = ? AND project = ?")
        .bind(&[text(id), text(project)])?
        .first(None)
        .await
}

/// Every secret of `project`'s subscriptions, current and previous (an
/// inspector's signature check).
pub async fn project_secrets(env: &Env, project: &str) -> Result<Vec<String>> {
    #[derive(Deserialize)]
    struct Pair {
        secret: String,
        previous_secret: Option<String>,
    }
    let rows: Vec<Pair> = db(env)?
        .prepare("SELECT secret, previous_secret FROM subscriptions WHERE project = ?")
        .bind(&[text(project)])?
        .all()
        .await?
        .results()?;
    Ok(rows
        .into_iter()
        .flat_map(|p| std::iter::once(p.secret).chain(p.previous_secret))
        .collect())
}

/// When a key of `project` is revoked: pauses (marks `key_revoked_at` on
/// their owner row) or deletes the subscriptions the key created; how many.
pub async fn of_revoked_key(
    env: &Env,
    project: &str,
    key_id: &str,
    at: u64,
    mode: OnKeyRevoked,
) -> Result<u64> {
    let db = db(env)?;
    let (id, at) = (JsValue::from_str(key_id), num(at));
    let statements = match mode {
        OnKeyRevoked::Pause => vec![db
            .prepare("UPDATE subscription_owners SET key_revoked_at = ? WHERE key_id = ? AND key_revoked_at IS NULL")
            .bind(&[at, id])?],
        OnKeyRevoked::Delete => vec![
            db.prepare("DELETE FROM subscriptions WHERE id IN (SELECT subscription_id FROM subscription_owners WHERE key_id = ?)")
                .bind(std::slice::from_ref(&id))?,
            db.prepare("DELETE FROM subscription_owners WHERE key_id = ?")
                .bind(&[id])?,
        ],
    };
    let results = db.batch(statements).await?;
    project_hub::invalidate(env, project).await;
    let changed = results
        .first()
        .and_then(|r| r.meta().ok().flatten())
        .and_then(|m| m.changes)
        .unwrap_or(0);
    Ok(changed as u64)
}
