//! Operator API for API keys (`ADMIN_TOKEN`).
//!
//! KV layout (namespace `API_KEYS`):
//! - `h:<sha256(key)>` → the key's record (authentication lookups);
//! - `k:<id>` → `{record, hash}` (revocation by id);
//! - `i:<project>:<reverse time>:<id>` and `a:<reverse time>:<id>` → empty
//!   values whose metadata is the record (listing, newest first).
//!
//! Revocation also flags the key's Durable Object, which every proxied
//! request consults, so it takes effect at once whatever KV caches hold.

use postguard_core::config::OnKeyRevoked;
use postguard_core::guard::{Revoke, RevokeRequest};
use postguard_core::ids;
use postguard_core::keys::{self, KeyRecord};
use postguard_core::page::{parse_limit, Page};
use postguard_core::{Invalid, Problem};
use serde::{Deserialize, Serialize};
use worker::wasm_bindgen::JsValue;
use worker::{Env, KvStore};

use super::Ctx;
use crate::auth;
use crate::bindings;
use crate::durable::client::call;
use crate::http;
use crate::reject::Handled;
use crate::request::query_param;
use crate::runtime::{new_ulid_parts, now_ms, random_bytes};

#[derive(Serialize, Deserialize)]
struct ById {
    record: KeyRecord,
    hash: String,
}

#[derive(Serialize)]
struct Created<'a> {
    #[serde(flatten)]
    record: &'a KeyRecord,
    key: &'a str,
}

fn index_entries(rec: &KeyRecord) -> [String; 2] {
    let rev = keys::reverse_time(rec.created_at);
    [
        format!("i:{}:{rev}:{}", rec.project, rec.id),
        format!("a:{rev}:{}", rec.id),
    ]
}

async fn write_all(kv: &KvStore, rec: &KeyRecord, hash: &str) -> Handled<()> {
    // Index entries last on create, so a listed key is always resolvable.
    kv.put(&auth::hash_entry(hash), serde_json::to_string(rec)?)?
        .execute()
        .await?;
    let by_id = ById {
        record: rec.clone(),
        hash: hash.to_string(),
    };
    kv.put(&format!("k:{}", rec.id), serde_json::to_string(&by_id)?)?
        .execute()
        .await?;
    for name in index_entries(rec) {
        kv.put(&name, "")?.metadata(rec)?.execute().await?;
    }
    Ok(())
}

pub async fn create(cx: &Ctx<'_>) -> Handled {
    let input = keys::parse_create(&cx.body, &cx.cfg.settings)?;
    let secret =
        random_bytes::<32>().map_err(|e| worker::Error::RustError(format!("random: {e}")))?;
    let key = ids::new_api_key(&secret);
    let (now, rnd) = new_ulid_parts();
    let record = KeyRecord {
        id: ids::key_id(now, rnd),
        prefix: ids::key_prefix(&key),
        project: input.project,
        plan: input.plan,
        name: input.name,
        created_at: now,
        revoked_at: None,
    };
    let kv = cx.env.kv(bindings::API_KEYS)?;
    let hash = ids::sha256_hex(&key);
    write_all(&kv, &record, &hash).await?;
    auth::forget(&hash);
    let created = Created {
        record: &record,
        key: &key,
    };
    http::json(cx.rc, 201, &created, &[])
}

fn bad_cursor() -> Invalid {
    Invalid::field("cursor", "not a cursor this API returned")
}

pub async fn list(cx: &Ctx<'_>) -> Handled {
    let req = &cx.req;
    let limit = parse_limit(query_param(req, "limit")?.as_deref())?;
    let prefix = match query_param(req, "project")? {
        Some(p) if postguard_core::config::is_valid_name(&p) => format!("i:{p}:"),
        Some(_) => {
            return Err(Invalid::from("project: must be 1-64 characters of [A-Za-z0-9._-]").into())
        }
        None => "a:".to_string(),
    };
    let kv = cx.env.kv(bindings::API_KEYS)?;
    let mut q = kv.list().prefix(prefix).limit(u64::from(limit));
    if let Some(c) = query_param(req, "cursor")? {
        if c.is_empty() || c.len() > 1024 || !c.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(bad_cursor().into());
        }
        q = q.cursor(c);
    }
    let page = q.execute().await.map_err(|_| bad_cursor())?;
    let data: Vec<KeyRecord> = page
        .keys
        .into_iter()
        .filter_map(|k| k.metadata.and_then(|m| serde_json::from_value(m).ok()))
        .collect();
    let next_cursor = if page.list_complete {
        None
    } else {
        page.cursor.filter(|c| !c.is_empty())
    };
    http::json(cx.rc, 200, &Page { data, next_cursor }, &[])
}

async fn by_id(kv: &KvStore, id: &str) -> Handled<ById> {
    let well_formed = id.starts_with("key_")
        && id.len() <= 64
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    let found = match well_formed {
        true => kv.get(&format!("k:{id}")).json().await?,
        false => None,
    };
    found.ok_or_else(|| Problem::not_found("API key", id).into())
}

pub async fn get(cx: &Ctx<'_>, id: &str) -> Handled {
    let found = by_id(&cx.env.kv(bindings::API_KEYS)?, id).await?;
    http::json(cx.rc, 200, &found.record, &[])
}

/// Revokes a key: flags its Durable Object first (effective immediately for
/// every isolate), then marks the KV records, then pauses (or, with
/// `webhooks.on_key_revoked: "delete"`, deletes) the subscriptions the key
/// created; the answer says how many in `X-Postguard-Subscriptions-Paused`
/// (or `-Deleted`). When it was the project's last live key, the project's
/// portal sessions end with it, and the subscriptions they created are
/// paused (or deleted) too: a session has the rights of a key and no more.
/// Revoking twice is a no-op.
pub async fn revoke(cx: &Ctx<'_>, id: &str) -> Handled {
    let (env, cfg) = (cx.env, cx.cfg);
    let kv = env.kv(bindings::API_KEYS)?;
    let mut found = by_id(&kv, id).await?;
    call::<Revoke>(env, &found.record.id, &RevokeRequest {}, &[]).await?;
    if found.record.revoked_at.is_none() {
        found.record.revoked_at = Some(now_ms());
        write_all(&kv, &found.record, &found.hash).await?;
    }
    auth::forget(&found.hash);
    let at = found.record.revoked_at.unwrap_or_else(now_ms);
    let mode = cfg.settings.webhooks.on_key_revoked;
    let mut n = subscriptions_of_revoked(env, &found.record.id, at, mode).await?;
    if !has_live_key(cx, &kv, &found.record).await? {
        let ended = super::portal::end_project_sessions(env, &found.record.project, at).await?;
        let owner = postguard_core::portal::subscription_owner(&found.record.project);
        n += subscriptions_of_revoked(env, &owner, at, mode).await?;
        if ended > 0 {
            worker::console_log!(
                "{} the last live key of a project was revoked: {} portal sessions ended",
                cx.rc.request_id,
                ended
            );
        }
    }
    let header = match mode {
        OnKeyRevoked::Pause => "X-Postguard-Subscriptions-Paused",
        OnKeyRevoked::Delete => "X-Postguard-Subscriptions-Deleted",
    };
    Ok(http::respond(
        cx.rc,
        204,
        &[],
        &[(header, n.to_string())],
        None,
    )?)
}

/// Keys of one project looked at, at most, when deciding whether it has a
/// live one left (a project with more keys than this is taken to have one).
const LIVE_KEYS_CHECKED: u64 = 100;

/// Whether `revoked`'s project still has a live API key. The listing (KV,
/// eventually consistent) names the candidates; each one listed as live is
/// confirmed by its own object, which holds the authoritative revoked flag,
/// so a revocation elsewhere a moment ago is not missed.
async fn has_live_key(cx: &Ctx<'_>, kv: &KvStore, revoked: &KeyRecord) -> Handled<bool> {
    use postguard_core::guard::{Admit, AdmitRequest, AdmitResponse, AnswerLayout};
    let listed = kv
        .list()
        .prefix(format!("i:{}:", revoked.project))
        .limit(LIVE_KEYS_CHECKED)
        .execute()
        .await?;
    if !listed.list_complete {
        return Ok(true);
    }
    let candidates = listed
        .keys
        .into_iter()
        .filter_map(|k| {
            k.metadata
                .and_then(|m| serde_json::from_value::<KeyRecord>(m).ok())
        })
        .filter(|r| r.id != revoked.id && r.revoked_at.is_none());
    for other in candidates {
        // A peek (cost 0) writes nothing; the key's own plan keeps its
        // window's length as it is.
        let Some(plan) = cx.cfg.settings.plans.get(&other.plan) else {
            return Ok(true);
        };
        let peek = AdmitRequest {
            cost: 0,
            quota: plan.quota(),
            claim: None,
            v: AnswerLayout::NEWEST,
        };
        match call::<Admit>(cx.env, &other.id, &peek, &[]).await? {
            (AdmitResponse::Revoked, _) => continue,
            _ => return Ok(true),
        }
    }
    Ok(false)
}

/// Pauses or deletes the subscriptions key `key_id` created; how many.
pub(super) async fn subscriptions_of_revoked(
    env: &Env,
    key_id: &str,
    at: u64,
    mode: OnKeyRevoked,
) -> Handled<u64> {
    let db = env.d1(bindings::DB)?;
    let (id, at) = (JsValue::from_str(key_id), JsValue::from_f64(at as f64));
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
    let changed = results
        .first()
        .and_then(|r| r.meta().ok().flatten())
        .and_then(|m| m.changes)
        .unwrap_or(0);
    Ok(changed as u64)
}
