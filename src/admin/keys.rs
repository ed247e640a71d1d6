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
use postguard_core::guard::Ack;
use postguard_core::ids;
use postguard_core::keys::{self, KeyRecord};
use postguard_core::Problem;
use serde::{Deserialize, Serialize};
use worker::{Env, KvStore, Request, Response, Result};

use super::{query_param, validation};
use crate::auth;
use crate::bindings;
use crate::guard_client::{call, Op};
use crate::http;
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

#[derive(Serialize)]
struct Page {
    data: Vec<KeyRecord>,
    next_cursor: Option<String>,
}

fn kv_err(e: worker::KvError) -> worker::Error {
    worker::Error::RustError(format!("KV: {e}"))
}

fn index_entries(rec: &KeyRecord) -> [String; 2] {
    let rev = keys::reverse_time(rec.created_at);
    [
        format!("i:{}:{rev}:{}", rec.project, rec.id),
        format!("a:{rev}:{}", rec.id),
    ]
}

async fn write_all(kv: &KvStore, rec: &KeyRecord, hash: &str) -> Result<()> {
    // Index entries last on create, so a listed key is always resolvable.
    kv.put(&auth::hash_entry(hash), serde_json::to_string(rec)?)
        .map_err(kv_err)?
        .execute()
        .await
        .map_err(kv_err)?;
    let by_id = ById {
        record: rec.clone(),
        hash: hash.to_string(),
    };
    kv.put(&format!("k:{}", rec.id), serde_json::to_string(&by_id)?)
        .map_err(kv_err)?
        .execute()
        .await
        .map_err(kv_err)?;
    for name in index_entries(rec) {
        kv.put(&name, "")
            .map_err(kv_err)?
            .metadata(rec)
            .map_err(kv_err)?
            .execute()
            .await
            .map_err(kv_err)?;
    }
    Ok(())
}

macro_rules! operator_only {
    ($req:expr, $env:expr, $cfg:expr, $rc:expr) => {
        if let Err(p) = auth::operator($req, $env, $cfg).await? {
            return http::problem($rc, &p, &[]);
        }
    };
}

pub async fn create(
    mut req: Request,
    env: &Env,
    cfg: &Config,
    rc: &RequestCtx,
) -> Result<Response> {
    operator_only!(&req, env, cfg, rc);
    let body = req.bytes().await?;
    if body.len() as u64 > cfg.settings.max_body_bytes {
        return http::problem(
            rc,
            &Problem::payload_too_large(cfg.settings.max_body_bytes),
            &[],
        );
    }
    let input = match keys::parse_create(&body, &cfg.settings) {
        Ok(i) => i,
        Err(detail) => return http::problem(rc, &validation(detail), &[]),
    };
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
    http::json(
        rc,
        201,
        &Created {
            record: &record,
            key: &key,
        },
        &[],
    )
}

pub async fn list(req: Request, env: &Env, cfg: &Config, rc: &RequestCtx) -> Result<Response> {
    operator_only!(&req, env, cfg, rc);
    let limit = match keys::parse_limit(query_param(&req, "limit")?.as_deref()) {
        Ok(l) => l,
        Err(detail) => return http::problem(rc, &validation(detail), &[]),
    };
    let prefix = match query_param(&req, "project")? {
        Some(p) if postguard_core::config::is_valid_name(&p) => format!("i:{p}:"),
        Some(_) => {
            return http::problem(
                rc,
                &validation("project: must be 1-64 characters of [A-Za-z0-9._-]"),
                &[],
            )
        }
        None => "a:".to_string(),
    };
    let kv = env.kv(bindings::API_KEYS)?;
    let mut q = kv.list().prefix(prefix).limit(u64::from(limit));
    if let Some(c) = query_param(&req, "cursor")? {
        if c.is_empty() || c.len() > 1024 || !c.bytes().all(|b| b.is_ascii_graphic()) {
            return http::problem(
                rc,
                &validation("cursor: not a cursor this API returned"),
                &[],
            );
        }
        q = q.cursor(c);
    }
    let page = match q.execute().await {
        Ok(p) => p,
        Err(_) => {
            return http::problem(
                rc,
                &validation("cursor: not a cursor this API returned"),
                &[],
            )
        }
    };
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

async fn by_id(kv: &KvStore, id: &str) -> Result<Option<ById>> {
    if !id.starts_with("key_")
        || id.len() > 64
        || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return Ok(None);
    }
    kv.get(&format!("k:{id}")).json().await.map_err(kv_err)
}

pub async fn get(
    req: &Request,
    env: &Env,
    cfg: &Config,
    rc: &RequestCtx,
    id: &str,
) -> Result<Response> {
    operator_only!(req, env, cfg, rc);
    let kv = env.kv(bindings::API_KEYS)?;
    match by_id(&kv, id).await? {
        Some(found) => http::json(rc, 200, &found.record, &[]),
        None => http::problem(rc, &Problem::not_found("API key", id), &[]),
    }
}

/// Revokes a key: flags its Durable Object first (effective immediately for
/// every isolate), then marks the KV records. Revoking twice is a no-op.
pub async fn revoke(
    req: &Request,
    env: &Env,
    cfg: &Config,
    rc: &RequestCtx,
    id: &str,
) -> Result<Response> {
    operator_only!(req, env, cfg, rc);
    let kv = env.kv(bindings::API_KEYS)?;
    let Some(mut found) = by_id(&kv, id).await? else {
        return http::problem(rc, &Problem::not_found("API key", id), &[]);
    };
    let _: (Ack, Vec<u8>) = call(env, &found.record.id, Op::Revoke, &(), &[]).await?;
    if found.record.revoked_at.is_none() {
        found.record.revoked_at = Some(now_ms());
        write_all(&kv, &found.record, &found.hash).await?;
    }
    auth::forget(&found.hash);
    http::respond(rc, 204, &[], &[], None)
}
