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

use postguard_core::config::Config;
use postguard_core::guard::{Revoke, RevokeRequest};
use postguard_core::ids;
use postguard_core::keys::{self, KeyRecord};
use postguard_core::page::{parse_limit, Page};
use postguard_core::{Invalid, Problem};
use serde::{Deserialize, Serialize};
use worker::{Env, KvStore, Request};

use crate::auth;
use crate::bindings;
use crate::durable::client::call;
use crate::http;
use crate::reject::Handled;
use crate::request::{self, query_param};
use crate::runtime::{new_ulid_parts, now_ms, random_bytes, RequestCtx};

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

pub async fn create(mut req: Request, env: &Env, cfg: &Config, rc: &RequestCtx) -> Handled {
    auth::operator(&req, env, cfg).await?;
    let body = request::body(&mut req, cfg).await?;
    let input = keys::parse_create(&body, &cfg.settings)?;
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
    let kv = env.kv(bindings::API_KEYS)?;
    write_all(&kv, &record, &ids::sha256_hex(&key)).await?;
    let created = Created {
        record: &record,
        key: &key,
    };
    http::json(rc, 201, &created, &[])
}

fn bad_cursor() -> Invalid {
    Invalid::field("cursor", "not a cursor this API returned")
}

pub async fn list(req: &Request, env: &Env, cfg: &Config, rc: &RequestCtx) -> Handled {
    auth::operator(req, env, cfg).await?;
    let limit = parse_limit(query_param(req, "limit")?.as_deref())?;
    let prefix = match query_param(req, "project")? {
        Some(p) if postguard_core::config::is_valid_name(&p) => format!("i:{p}:"),
        Some(_) => {
            return Err(Invalid::from("project: must be 1-64 characters of [A-Za-z0-9._-]").into())
        }
        None => "a:".to_string(),
    };
    let kv = env.kv(bindings::API_KEYS)?;
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
    http::json(rc, 200, &Page { data, next_cursor }, &[])
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

pub async fn get(req: &Request, env: &Env, cfg: &Config, rc: &RequestCtx, id: &str) -> Handled {
    auth::operator(req, env, cfg).await?;
    let found = by_id(&env.kv(bindings::API_KEYS)?, id).await?;
    http::json(rc, 200, &found.record, &[])
}

/// Revokes a key: flags its Durable Object first (effective immediately for
/// every isolate), then marks the KV records. Revoking twice is a no-op.
pub async fn revoke(req: &Request, env: &Env, cfg: &Config, rc: &RequestCtx, id: &str) -> Handled {
    auth::operator(req, env, cfg).await?;
    let kv = env.kv(bindings::API_KEYS)?;
    let mut found = by_id(&kv, id).await?;
    call::<Revoke>(env, &found.record.id, &RevokeRequest {}, &[]).await?;
    if found.record.revoked_at.is_none() {
        found.record.revoked_at = Some(now_ms());
        write_all(&kv, &found.record, &found.hash).await?;
    }
    auth::forget(&found.hash);
    http::no_content(rc)
}
