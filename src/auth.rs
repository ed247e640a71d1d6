//! Who is calling: an API key (looked up by hash in KV, cached briefly per
//! isolate), the operator (`ADMIN_TOKEN`) or the origin (`ORIGIN_TOKEN`).
//! The token is classified once (`Credential::classify`); each endpoint
//! family accepts one kind and answers 403 to a valid credential of another.
//!
//! The cache never weakens revocation: the key's Durable Object holds the
//! authoritative revoked flag and is consulted on every request of an API
//! key — the proxy's admission call, and a cost-0 (or, for `/audit` and
//! `/stats`, a charged) limiter call on every gateway endpoint ([`confirm`]).
//! Unknown keys are remembered for a few seconds (a negative cache), so a
//! flood of made-up keys does not cost a KV read each.

use std::cell::RefCell;
use std::collections::HashMap;

use postguard_core::config::{Config, Plan};
use postguard_core::credential::Credential;
use postguard_core::keys::KeyRecord;
use postguard_core::{ErrorCode, Problem};
use worker::{Env, Request};

use postguard_core::guard::{Admit, AdmitRequest, AnswerLayout};
use postguard_core::proxy::{self, Admission};
use postguard_core::rate_limit::{self, Verdict};

use crate::admin::portal;
use crate::bindings;
use crate::durable::client::call;
use crate::reject::{Handled, Reject};
use crate::runtime::{now_ms, RequestCtx};

const CACHE_TTL_MS: u64 = 30_000;
const CACHE_MAX: usize = 10_000;
/// How long this isolate remembers that a key hash is unknown.
const UNKNOWN_TTL_MS: u64 = 10_000;

thread_local! {
    static KEYS: RefCell<HashMap<String, (KeyRecord, u64)>> = RefCell::new(HashMap::new());
    static UNKNOWN: RefCell<HashMap<String, u64>> = RefCell::new(HashMap::new());
}

/// Remembers `hash` (a key's SHA-256) in a bounded per-isolate map at `now`.
fn remember<V>(map: &mut HashMap<String, V>, hash: &str, value: V) {
    if map.len() >= CACHE_MAX {
        map.clear();
    }
    map.insert(hash.to_string(), value);
}

/// KV name of a key's record, by the SHA-256 of the key.
pub fn hash_entry(hash_hex: &str) -> String {
    format!("h:{hash_hex}")
}

pub fn forget(hash_hex: &str) {
    KEYS.with(|c| c.borrow_mut().remove(hash_hex));
    UNKNOWN.with(|c| c.borrow_mut().remove(hash_hex));
}

/// The request's credential.
pub fn credential(req: &Request, cfg: &Config) -> Credential {
    let header = req.headers().get("Authorization").ok().flatten();
    credential_of(header.as_deref(), cfg)
}

/// The credential of an `Authorization` header.
pub fn credential_of(header: Option<&str>, cfg: &Config) -> Credential {
    Credential::classify(header, &cfg.secrets)
}

fn invalid(detail: &str) -> Problem {
    Problem::new(ErrorCode::InvalidApiKey, detail)
}

fn refuse(code: ErrorCode, detail: &str) -> Handled<()> {
    Err(Problem::new(code, detail).into())
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
    let known_unknown = UNKNOWN.with(|c| {
        c.borrow()
            .get(hash)
            .is_some_and(|at| now.saturating_sub(*at) < UNKNOWN_TTL_MS)
    });
    if known_unknown {
        return Ok(None);
    }
    let kv = env.kv(bindings::API_KEYS)?;
    let rec: Option<KeyRecord> = kv.get(&hash_entry(hash)).json().await?;
    match &rec {
        Some(r) => KEYS.with(|c| remember(&mut c.borrow_mut(), hash, (r.clone(), now))),
        None => UNKNOWN.with(|c| remember(&mut c.borrow_mut(), hash, now)),
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
async fn api_key(cred: Credential, env: &Env) -> Handled<ApiKey> {
    let hash = match cred {
        Credential::ApiKey(hash) => hash,
        Credential::Missing => {
            return Err(invalid("send the API key as 'Authorization: Bearer <key>'").into())
        }
        Credential::Session(_) => {
            return Err(invalid(
                "a portal session opens the dashboard, not the API: send an API key",
            )
            .into())
        }
        _ => return Err(invalid("the API key is malformed").into()),
    };
    match lookup(env, &hash).await? {
        Some(record) if record.revoked_at.is_none() => Ok(ApiKey { record, hash }),
        Some(_) => Err(Problem::revoked_key().into()),
        None => Err(invalid("the API key is not known").into()),
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
    cred: Credential,
    env: &Env,
    cfg: &Config,
    rc: &RequestCtx,
) -> Handled<Caller> {
    let key = api_key(cred, env).await?;
    rc.note(|f| {
        f.key_prefix = Some(key.record.prefix.clone());
        f.project = Some(key.record.project.clone());
    });
    match cfg.settings.plans.get(&key.record.plan) {
        Some(plan) => Ok(Caller {
            plan: plan.clone(),
            key,
        }),
        None => Err(Problem::new(
            ErrorCode::ConfigInvalid,
            format!(
                "plans: the key's plan '{}' is not configured",
                key.record.plan
            ),
        )
        .into()),
    }
}

/// The key's Durable Object says it was revoked: drop it from this isolate's
/// cache and refuse it.
pub fn revoked(key: &ApiKey) -> Problem {
    forget(&key.hash);
    Problem::revoked_key()
}

/// Whether an API-key-shaped token (its hash) names a stored key
/// (`live_only`: one that is not revoked).
async fn is_known_key(env: &Env, hash: &str, live_only: bool) -> worker::Result<bool> {
    let rec = lookup(env, hash).await?;
    Ok(rec.is_some_and(|r| !live_only || r.revoked_at.is_none()))
}

/// Operator authentication for `/_postguard/v1/keys…`: 401 `UNAUTHORIZED` for a
/// wrong or missing token, 403 `FORBIDDEN` for a valid credential of another
/// kind (a live API key, or the origin's token).
pub async fn operator(req: &Request, env: &Env, cfg: &Config) -> Handled<()> {
    use ErrorCode::{Forbidden, Unauthorized};
    match credential(req, cfg) {
        Credential::Operator => Ok(()),
        Credential::Missing => refuse(
            Unauthorized,
            "send the operator token as 'Authorization: Bearer <ADMIN_TOKEN>'",
        ),
        Credential::Origin => refuse(Forbidden, "the origin token cannot call operator endpoints"),
        Credential::ApiKey(t) if is_known_key(env, &t, true).await? => {
            refuse(Forbidden, "API keys cannot call operator endpoints")
        }
        Credential::Session(t) if portal::is_session(&t, cfg) => {
            refuse(Forbidden, "a portal session cannot call operator endpoints")
        }
        _ => refuse(Unauthorized, "the operator token is wrong"),
    }
}

/// The origin's authentication for publishing (`ORIGIN_TOKEN`): 401
/// `UNAUTHORIZED` for a wrong or missing token, 403 `FORBIDDEN` for the
/// operator's token or an API key.
pub async fn origin(req: &Request, env: &Env, cfg: &Config) -> Handled<()> {
    use ErrorCode::{Forbidden, Unauthorized};
    match credential(req, cfg) {
        Credential::Origin => Ok(()),
        Credential::Missing => refuse(
            Unauthorized,
            "send the origin token as 'Authorization: Bearer <ORIGIN_TOKEN>'",
        ),
        Credential::Operator => refuse(
            Forbidden,
            "events are published with the origin token, not the operator token",
        ),
        Credential::ApiKey(t) if is_known_key(env, &t, false).await? => {
            refuse(Forbidden, "API keys cannot publish events")
        }
        Credential::Session(t) if portal::is_session(&t, cfg) => {
            refuse(Forbidden, "a portal session cannot publish events")
        }
        _ => refuse(Unauthorized, "the origin token is wrong"),
    }
}

/// Asks the key's Durable Object, which holds the authoritative revoked
/// flag, charging `cost` to the key's limiter (0: a peek). A revoked key is
/// refused whatever this isolate or KV still cache; with a cost, an
/// exhausted budget is a 429 (with the rate-limit headers).
pub async fn confirm(caller: &Caller, env: &Env, rc: &RequestCtx, cost: u32) -> Handled<Verdict> {
    let req = AdmitRequest {
        cost,
        quota: caller.plan.quota(),
        claim: None,
        v: AnswerLayout::NEWEST,
    };
    let (answer, _) = call::<Admit>(env, &caller.key.record.id, &req, &[]).await?;
    let next =
        proxy::admission(answer, None).map_err(|e| worker::Error::RustError(e.to_string()))?;
    match next {
        Admission::Revoked => Err(revoked(&caller.key).into()),
        Admission::Refused { problem, verdict } if cost > 0 => {
            rc.note(|f| f.rate_limit_remaining = Some(verdict.remaining));
            Err(Reject::from(problem).with(&rate_limit::headers(&verdict)))
        }
        Admission::Refused { verdict, .. }
        | Admission::Forward { verdict }
        | Admission::Replay { verdict, .. } => {
            rc.note(|f| f.rate_limit_remaining = Some(verdict.remaining));
            Ok(verdict)
        }
    }
}

/// An API-key caller of an endpoint that belongs to a key (or its project),
/// confirmed by its object (cost 0): the operator's and the origin's tokens
/// are valid credentials of the wrong kind here, 403 with `forbidden`.
pub async fn key_holder(
    req: &Request,
    env: &Env,
    cfg: &Config,
    rc: &RequestCtx,
    forbidden: &str,
) -> Handled<(Caller, Verdict)> {
    let cred = credential(req, cfg);
    if cred.is_secret() {
        return Err(Problem::new(ErrorCode::Forbidden, forbidden).into());
    }
    let caller = api_caller(cred, env, cfg, rc).await?;
    let verdict = confirm(&caller, env, rc, 0).await?;
    Ok((caller, verdict))
}

/// The project of a caller of the webhook endpoints: one of its API keys, or
/// a portal session for it (which has exactly that key's rights here).
pub async fn project(req: &Request, env: &Env, cfg: &Config, rc: &RequestCtx) -> Handled<String> {
    Ok(project_and_key(req, env, cfg, rc).await?.0)
}

/// [`project`], and the id of the API key that called (`None` for a portal
/// session): a subscription records the key that created it.
pub async fn project_and_key(
    req: &Request,
    env: &Env,
    cfg: &Config,
    rc: &RequestCtx,
) -> Handled<(String, Option<String>)> {
    if let Credential::Session(t) = credential(req, cfg) {
        return Ok((portal::session(&t, cfg, rc)?.project, None));
    }
    let forbidden = "webhooks and deliveries belong to a project: use one of its API keys";
    let (caller, _) = key_holder(req, env, cfg, rc, forbidden).await?;
    Ok((caller.key.record.project, Some(caller.key.record.id)))
}
