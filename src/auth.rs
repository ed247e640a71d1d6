//! Who is calling: an API key (looked up by hash in KV, cached briefly per
//! isolate) or the operator (`ADMIN_TOKEN`, compared in constant time).
//!
//! The cache never weakens revocation: the key's Durable Object holds the
//! authoritative revoked flag and is consulted on every proxied request.

use std::cell::RefCell;
use std::collections::HashMap;

use postguard_core::config::{Config, Plan};
use postguard_core::ids;
use postguard_core::keys::KeyRecord;
use postguard_core::{ErrorCode, Problem};
use worker::{Env, Request};

use crate::bindings;
use crate::runtime::{now_ms, RequestCtx};

const CACHE_TTL_MS: u64 = 30_000;
const CACHE_MAX: usize = 10_000;

thread_local! {
    static KEYS: RefCell<HashMap<String, (KeyRecord, u64)>> = RefCell::new(HashMap::new());
}

/// KV name of a key's record, by the SHA-256 of the key.
pub fn hash_entry(hash_hex: &str) -> String {
    format!("h:{hash_hex}")
}

pub fn forget(hash_hex: &str) {
    KEYS.with(|c| c.borrow_mut().remove(hash_hex));
}

fn bearer(req: &Request) -> Option<String> {
    let value = req.headers().get("Authorization").ok().flatten()?;
    ids::bearer(&value).map(str::to_string)
}

fn invalid(detail: &str) -> Problem {
    Problem::new(ErrorCode::InvalidApiKey, detail)
}

/// Looks up a well-formed key by hash. `Ok(None)`: unknown.
async fn lookup(env: &Env, hash: &str) -> worker::Result<Option<KeyRecord>> {
    let now = now_ms();
    if let Some(rec) = KEYS.with(|c| {
        c.borrow()
            .get(hash)
            .filter(|(_, at)| now.saturating_sub(*at) < CACHE_TTL_MS)
            .map(|(r, _)| r.clone())
    }) {
        return Ok(Some(rec));
    }
    let kv = env.kv(bindings::API_KEYS)?;
    let rec: Option<KeyRecord> = kv.get(&hash_entry(hash)).json().await?;
    if let Some(r) = &rec {
        KEYS.with(|c| {
            let mut m = c.borrow_mut();
            if m.len() >= CACHE_MAX {
                m.clear();
            }
            m.insert(hash.to_string(), (r.clone(), now));
        });
    }
    Ok(rec)
}

/// An authenticated API key: its record and its hash (the cache key).
pub struct ApiKey {
    pub record: KeyRecord,
    pub hash: String,
}

/// Step 1 of the pipeline. Fails with 401 `INVALID_API_KEY`; the detail never
/// repeats the key.
pub async fn api_key(req: &Request, env: &Env) -> worker::Result<Result<ApiKey, Problem>> {
    let Some(token) = bearer(req) else {
        return Ok(Err(invalid(
            "send the API key as 'Authorization: Bearer <key>'",
        )));
    };
    if !ids::is_well_formed_api_key(&token) {
        return Ok(Err(invalid("the API key is malformed")));
    }
    let hash = ids::sha256_hex(&token);
    match lookup(env, &hash).await? {
        Some(record) if record.revoked_at.is_none() => Ok(Ok(ApiKey { record, hash })),
        Some(_) => Ok(Err(invalid("the API key has been revoked"))),
        None => Ok(Err(invalid("the API key is not known"))),
    }
}

/// An authenticated API key together with its plan.
pub struct Caller {
    pub key: ApiKey,
    pub plan: Plan,
}

/// Authenticates the API key and resolves its plan. A plan missing from the
/// configuration is the operator's error (`CONFIG_INVALID`), not the client's.
pub async fn api_caller(
    req: &Request,
    env: &Env,
    cfg: &Config,
    rc: &RequestCtx,
) -> worker::Result<Result<Caller, Problem>> {
    let key = match api_key(req, env).await? {
        Ok(k) => k,
        Err(p) => return Ok(Err(p)),
    };
    rc.note(|f| {
        f.key_prefix = Some(key.record.prefix.clone());
        f.project = Some(key.record.project.clone());
    });
    match cfg.settings.plans.get(&key.record.plan) {
        Some(plan) => Ok(Ok(Caller {
            plan: plan.clone(),
            key,
        })),
        None => Ok(Err(Problem::new(
            ErrorCode::ConfigInvalid,
            format!(
                "plans: the key's plan '{}' is not configured",
                key.record.plan
            ),
        ))),
    }
}

/// The key's Durable Object says it was revoked: drop it from this isolate's
/// cache and refuse it.
pub fn revoked(key: &ApiKey) -> Problem {
    forget(&key.hash);
    invalid("the API key has been revoked")
}

/// Operator authentication for `/_postguard/v1/keys…`: 401 `UNAUTHORIZED` for a
/// wrong or missing token, 403 `FORBIDDEN` for a valid credential of another
/// kind (an API key, or the origin's token).
pub async fn operator(
    req: &Request,
    env: &Env,
    cfg: &Config,
) -> worker::Result<Result<(), Problem>> {
    let Some(token) = bearer(req) else {
        return Ok(Err(Problem::new(
            ErrorCode::Unauthorized,
            "send the operator token as 'Authorization: Bearer <ADMIN_TOKEN>'",
        )));
    };
    if ids::secrets_equal(&token, &cfg.admin_token) {
        return Ok(Ok(()));
    }
    if ids::secrets_equal(&token, &cfg.origin_token) {
        return Ok(Err(Problem::new(
            ErrorCode::Forbidden,
            "the origin token cannot call operator endpoints",
        )));
    }
    if ids::is_well_formed_api_key(&token) {
        if let Some(rec) = lookup(env, &ids::sha256_hex(&token)).await? {
            if rec.revoked_at.is_none() {
                return Ok(Err(Problem::new(
                    ErrorCode::Forbidden,
                    "API keys cannot call operator endpoints",
                )));
            }
        }
    }
    Ok(Err(Problem::new(
        ErrorCode::Unauthorized,
        "the operator token is wrong",
    )))
}

/// The origin's authentication for publishing (`ORIGIN_TOKEN`): 401
/// `UNAUTHORIZED` for a wrong or missing token, 403 `FORBIDDEN` for the
/// operator's token or an API key.
pub async fn origin(req: &Request, env: &Env, cfg: &Config) -> worker::Result<Result<(), Problem>> {
    let Some(token) = bearer(req) else {
        return Ok(Err(Problem::new(
            ErrorCode::Unauthorized,
            "send the origin token as 'Authorization: Bearer <ORIGIN_TOKEN>'",
        )));
    };
    if ids::secrets_equal(&token, &cfg.origin_token) {
        return Ok(Ok(()));
    }
    if ids::secrets_equal(&token, &cfg.admin_token) {
        return Ok(Err(Problem::new(
            ErrorCode::Forbidden,
            "events are published with the origin token, not the operator token",
        )));
    }
    if ids::is_well_formed_api_key(&token) && lookup(env, &ids::sha256_hex(&token)).await?.is_some()
    {
        return Ok(Err(Problem::new(
            ErrorCode::Forbidden,
            "API keys cannot publish events",
        )));
    }
    Ok(Err(Problem::new(
        ErrorCode::Unauthorized,
        "the origin token is wrong",
    )))
}

/// Whether the bearer is the operator token (for endpoints that answer 403 to it).
pub fn is_operator(req: &Request, cfg: &Config) -> bool {
    bearer(req).is_some_and(|t| {
        ids::secrets_equal(&t, &cfg.admin_token) || ids::secrets_equal(&t, &cfg.origin_token)
    })
}
