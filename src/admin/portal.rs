//! Portal links and sessions (docs/dashboard-and-portal.md, ADR 0010, ADR 0031): the
//! operator mints a single-use dashboard link for one project; the page
//! exchanges it for a session that works wherever that project's API key
//! does (audit, stats, webhooks, deliveries, /me), charged like a key, and
//! nowhere else. The operator lists and ends sessions; they also end with
//! the project's last live key.
//!
//! Tokens are signed and checked in `postguard_core::portal` (through
//! `auth`); this module reads the clock, draws the nonces, remembers consumed
//! links in KV and keeps the session registry in D1 — read only when the
//! operator lists or ends sessions, never on a session's own requests.

use futures_util::future::join_all;
use postguard_core::guard::{Revoke, RevokeRequest};
use postguard_core::keys::KeyRecord;
use postguard_core::page::{decode_cursor, encode_cursor, parse_limit, Page};
use postguard_core::portal::{self, is_session_id, Claims, Kind};
use postguard_core::{ids::is_valid_name, ErrorCode, Invalid, Problem};
use serde::{Deserialize, Serialize};
use worker::{Env, KvStore};

use crate::auth;
use crate::bindings;
use crate::d1::{self, num, text};
use crate::durable::client::call;
use crate::handler::{self, Ctx};
use crate::reject::Handled;
use crate::request::query_pairs;
use crate::runtime::{now_ms, random_bytes};

fn nonce() -> Handled<[u8; 16]> {
    Ok(random_bytes::<16>().map_err(|e| worker::Error::RustError(format!("random: {e}")))?)
}

fn unauthorized(detail: &str) -> Problem {
    Problem::new(ErrorCode::Unauthorized, detail)
}

#[derive(Serialize)]
struct Link {
    url: String,
    expires_at: u64,
}

/// `POST /_postguard/v1/portal-links {project, ttl_s?}` (operator) → 201.
/// The URL is on the configured `public_url` (relative without one): never
/// on whatever host the request named.
pub async fn create_link(cx: &Ctx<'_>) -> Handled {
    let (project, ttl_s) = portal::parse_link_request(&cx.body)?;
    let claims = portal::link_claims(project, ttl_s, now_ms(), &nonce()?);
    let token = auth::issue(cx.cfg, Kind::Link, &claims);
    let link = Link {
        url: portal::link_url(cx.cfg.settings.public_origin(), &token),
        expires_at: claims.exp,
    };
    handler::json(cx.rc, 201, &link, &[])
}

#[derive(Serialize)]
struct Session<'a> {
    id: String,
    session: String,
    project: &'a str,
    expires_at: u64,
}

/// `POST /_postguard/v1/portal-sessions {token}` (no credential) → 201: the
/// link is consumed and a session registered, charged from the budget of
/// the project's newest live key's plan; a second exchange of the same link,
/// a project without a live key, or a link issued before the operator ended
/// the project's sessions, is refused (401).
pub async fn create_session(cx: &Ctx<'_>) -> Handled {
    let token = portal::parse_session_request(&cx.body)?;
    let link = auth::verify_link(&token, cx.cfg)?;
    let now = now_ms();
    // Single use. KV is not transactional: two exchanges racing within its
    // propagation delay could both pass (ADR 0010); any later one is refused.
    let kv = cx.env.kv(bindings::API_KEYS)?;
    let entry = portal::consumed_entry(&token);
    if kv.get(&entry).text().await?.is_some() {
        return Err(
            unauthorized("the portal link has already been used: ask for a new one").into(),
        );
    }
    kv.put(&entry, "1")?
        .expiration_ttl(portal::consumed_ttl_s(link.exp, now))
        .execute()
        .await?;
    let terms = project_terms(&kv, &link.project, now)
        .await?
        .ok_or_else(|| {
            unauthorized("the project has no live API key: a portal session has the rights of one")
        })?;
    let session = portal::session_claims(&link, &nonce()?, &terms, now);
    if !register(cx.env, &session, link.iat.unwrap_or(0)).await? {
        return Err(unauthorized(
            "the operator ended this project's portal sessions after the link was made: ask for a new one",
        )
        .into());
    }
    let out = Session {
        id: session.session_id(),
        session: auth::issue(cx.cfg, Kind::Session, &session),
        project: &session.project,
        expires_at: session.exp,
    };
    handler::json(cx.rc, 201, &out, &[])
}

/// What a session of the project gets (`portal::session_terms`), from its
/// keys' listing; `None` without a live key.
async fn project_terms(
    kv: &KvStore,
    project: &str,
    now: u64,
) -> Handled<Option<portal::SessionTerms>> {
    let listed = kv
        .list()
        .prefix(format!("i:{project}:"))
        .limit(1000)
        .execute()
        .await?;
    let records: Vec<KeyRecord> = listed
        .keys
        .into_iter()
        .filter_map(|k| k.metadata.and_then(|m| serde_json::from_value(m).ok()))
        .collect();
    let listed = records.iter().map(|r| portal::ListedKey {
        created_at: r.created_at,
        plan: &r.plan,
        revoked: r.revoked_at.is_some(),
        expires_at: r.expires_at,
    });
    Ok(portal::session_terms(listed, now))
}

/// Enters the session in the registry unless the operator ended the
/// project's sessions at or after `link_iat`: one statement, so an exchange
/// and an ending never cross (the ending either lists this session or the
/// exchange sees its cut-off).
async fn register(env: &Env, s: &Claims, link_iat: u64) -> Handled<bool> {
    let res = env
        .d1(bindings::DB)?
        .prepare(
            "INSERT INTO portal_sessions (id, project, plan, created_at, expires_at) SELECT ?, ?, ?, ?, ? \
             WHERE NOT EXISTS (SELECT 1 FROM portal_cutoffs WHERE project = ? AND ended_at >= ?)",
        )
        .bind(&[
            text(&s.session_id()),
            text(&s.project),
            text(s.plan.as_deref().unwrap_or_default()),
            num(s.iat.unwrap_or_else(now_ms)),
            num(s.exp),
            text(&s.project),
            num(link_iat),
        ])?
        .run()
        .await?;
    Ok(res.meta()?.and_then(|m| m.changes).unwrap_or(0) > 0)
}

#[derive(Serialize, Deserialize)]
struct SessionRow {
    id: String,
    project: String,
    plan: String,
    created_at: u64,
    expires_at: u64,
    ended_at: Option<u64>,
}

fn project_param(value: Option<&str>) -> Result<String, Invalid> {
    match value {
        Some(p) if is_valid_name(p) => Ok(p.to_string()),
        Some(_) => Err(Invalid::from(
            "project: must be 1-64 characters of [A-Za-z0-9._-]",
        )),
        None => Err(Invalid::from("project: required")),
    }
}

/// `GET /_postguard/v1/portal-sessions?project=` (operator): the project's
/// sessions, newest first, ended ones included until they expire.
pub async fn list_sessions(cx: &Ctx<'_>) -> Handled {
    let (mut project, mut limit, mut cursor) = (None, None, None);
    for (k, v) in query_pairs(&cx.req)? {
        match k.as_str() {
            "project" => project = Some(v),
            "limit" => limit = Some(v),
            "cursor" => cursor = Some(v),
            other => return Err(Invalid::unknown_parameter(other).into()),
        }
    }
    let project = project_param(project.as_deref())?;
    let limit = parse_limit(limit.as_deref())?;
    let mut sql =
        "SELECT id, project, plan, created_at, expires_at, ended_at FROM portal_sessions \
                   WHERE project = ? AND expires_at > ?"
            .to_string();
    let mut args = vec![text(&project), num(now_ms())];
    if let Some(c) = cursor {
        let (t, id) = decode_cursor(&c)?;
        sql.push_str(" AND (created_at < ? OR (created_at = ? AND id < ?))");
        args.extend([num(t), num(t), text(&id)]);
    }
    sql.push_str(" ORDER BY created_at DESC, id DESC LIMIT ?");
    args.push(num(u64::from(limit) + 1));
    let rows: Vec<SessionRow> = d1::all(&cx.env.d1(bindings::DB)?, sql, &args).await?;
    let page = Page::of(rows, limit, |r| encode_cursor(r.created_at, &r.id));
    handler::json(cx.rc, 200, &page, &[])
}

#[derive(Serialize)]
struct Ended {
    project: String,
    ended: u32,
    subscriptions_paused: u64,
}

/// `DELETE /_postguard/v1/portal-sessions?project=&pause_subscriptions=`
/// (operator): ends every session of the project and every link made for it
/// so far; with `pause_subscriptions=true`, the subscriptions its sessions
/// created are paused (as a revoked key's are).
pub async fn end_sessions(cx: &Ctx<'_>) -> Handled {
    let (mut project, mut pause) = (None, false);
    for (k, v) in query_pairs(&cx.req)? {
        match k.as_str() {
            "project" => project = Some(v),
            "pause_subscriptions" => {
                pause = match v.as_str() {
                    "true" => true,
                    "false" => false,
                    _ => {
                        return Err(
                            Invalid::field("pause_subscriptions", "must be true or false").into(),
                        )
                    }
                }
            }
            other => return Err(Invalid::unknown_parameter(other).into()),
        }
    }
    let project = project_param(project.as_deref())?;
    let now = now_ms();
    let ended = end_project_sessions(cx.env, &project, now).await?;
    let subscriptions_paused = match pause {
        true => {
            let owner = portal::subscription_owner(&project);
            crate::webhooks::directory::subscriptions::of_revoked_key(
                cx.env,
                &project,
                &owner,
                now,
                postguard_core::config::OnKeyRevoked::Pause,
            )
            .await?
        }
        false => 0,
    };
    let out = Ended {
        project,
        ended,
        subscriptions_paused,
    };
    handler::json(cx.rc, 200, &out, &[])
}

/// `DELETE /_postguard/v1/portal-sessions/{id}` (operator) → 204: the
/// session's next request is refused.
pub async fn end_session(cx: &Ctx<'_>, id: &str) -> Handled {
    let missing = || Problem::not_found("portal session", id);
    if !is_session_id(id) {
        return Err(missing().into());
    }
    let res = cx
        .env
        .d1(bindings::DB)?
        .prepare("UPDATE portal_sessions SET ended_at = COALESCE(ended_at, ?) WHERE id = ?")
        .bind(&[num(now_ms()), text(id)])?
        .run()
        .await?;
    if res.meta()?.and_then(|m| m.changes).unwrap_or(0) == 0 {
        return Err(missing().into());
    }
    end_objects(cx.env, &[id.to_string()]).await?;
    handler::no_content(cx.rc)
}

#[derive(Deserialize)]
struct Id {
    id: String,
}

/// Ends every session of `project` still unexpired at `at`, and every link
/// made for it until then: the cut-off and the registry in one transaction,
/// then each session's object flagged (ended ones again: ending is
/// idempotent, so a flag lost to a failure is set by the next ending). How
/// many sessions were live.
pub async fn end_project_sessions(env: &Env, project: &str, at: u64) -> Handled<u32> {
    let db = env.d1(bindings::DB)?;
    let results = db
        .batch(vec![
            db.prepare(
                "INSERT INTO portal_cutoffs (project, ended_at) VALUES (?, ?) \
                 ON CONFLICT (project) DO UPDATE SET ended_at = MAX(ended_at, excluded.ended_at)",
            )
            .bind(&[text(project), num(at)])?,
            db.prepare("SELECT id FROM portal_sessions WHERE project = ? AND expires_at > ?")
                .bind(&[text(project), num(at)])?,
            db.prepare(
                "UPDATE portal_sessions SET ended_at = ? WHERE project = ? AND ended_at IS NULL AND expires_at > ?",
            )
            .bind(&[num(at), text(project), num(at)])?,
        ])
        .await?;
    let ids: Vec<String> = match results.get(1) {
        Some(r) => r.results::<Id>()?.into_iter().map(|r| r.id).collect(),
        None => Vec::new(),
    };
    let live = results
        .get(2)
        .and_then(|r| r.meta().ok().flatten())
        .and_then(|m| m.changes)
        .unwrap_or(0);
    end_objects(env, &ids).await?;
    Ok(u32::try_from(live).unwrap_or(u32::MAX))
}

/// Flags each session's object: its next request is refused there, whatever
/// any isolate has cached.
async fn end_objects(env: &Env, ids: &[String]) -> Handled<()> {
    let calls = ids.iter().map(|id| async move {
        call::<Revoke>(env, &format!("ses:{id}"), &RevokeRequest {}, &[]).await
    });
    for outcome in join_all(calls).await {
        outcome?;
    }
    Ok(())
}

#[derive(Serialize)]
struct SessionMe<'a> {
    project: &'a str,
    expires_at: u64,
}

/// `GET /me` with a session: the project and when the session ends (a
/// session has no key of its own; its budget is in the rate-limit headers).
pub fn me(cx: &Ctx<'_>, s: &auth::Session) -> Handled {
    let me = SessionMe {
        project: &s.claims.project,
        expires_at: s.claims.exp,
    };
    handler::json(cx.rc, 200, &me, &[])
}
