//! Who is calling: an API key (looked up by hash in KV, cached briefly per
//! isolate), a portal session (a signed token for one project), the operator
//! (`ADMIN_TOKEN`) or the origin (`ORIGIN_TOKEN`). The token is classified
//! once (`Credential::classify`).
//!
//! The gateway's own operations are authenticated here, by the router,
//! before their handler runs ([`authenticate`], from the route's
//! `routes::Access`): a handler never checks a credential itself. Each
//! operation accepts one kind of caller and answers 403 to a valid
//! credential of another kind (docs/api-reference.md).
//!
//! The cache never weakens revocation: the key's Durable Object holds the
//! authoritative revoked flag and is consulted on every request of an API
//! key (the proxy's admission call; the router's charge on every gateway
//! operation), and a session's own object likewise says whether it ended.
//! Unknown keys are remembered for a few seconds (a negative cache), so
//! repeating one made-up key costs one KV read per isolate and 10 s; a
//! stream of *different* made-up keys is held by the per-IP limiter of
//! requests without a valid credential (`ip_limit`), which answers 429
//! before the KV read once an address is over.

use std::cell::RefCell;
use std::collections::HashMap;

use postguard_core::config::{Config, Plan};
use postguard_core::credential::Credential;
use postguard_core::guard::Caller as CallerView;
use postguard_core::keys::{self, KeyRecord};
use postguard_core::limits::{Limits, Policy};
use postguard_core::portal::{Claims, Kind, Rejected, Signer};
use postguard_core::quota_notice::NoticeTo;
use postguard_core::routes::{Access, Budget};
use postguard_core::{ErrorCode, Problem};
use worker::Env;

use crate::bindings;
use crate::reject::Handled;
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

pub fn forget(hash_hex: &str) {
    KEYS.with(|c| c.borrow_mut().remove(hash_hex));
    UNKNOWN.with(|c| c.borrow_mut().remove(hash_hex));
}

/// The credential a request presents: the operator's, the origin's or a
/// session's `Bearer` token, or an API key from `auth.api_key_from`.
pub fn credential_of(headers: &[(String, String)], cfg: &Config) -> Credential {
    Credential::of_request(headers, &cfg.settings.auth.sources(), &cfg.secrets)
}

fn invalid(detail: &str) -> Problem {
    Problem::new(ErrorCode::InvalidApiKey, detail)
}

fn refuse<T>(code: ErrorCode, detail: &str) -> Handled<T> {
    Err(Problem::new(code, detail).into())
}

/// Looks up a well-formed key by hash. `Ok(None)`: unknown. Never refused
/// before the read, whatever the sender's address did: a valid key is
/// never held by the limit on requests without one (`ip_limit`); an
/// unknown one is counted after, and an address over that limit is told
/// 429 without an object call.
async fn lookup(env: &Env, hash: &str) -> Handled<Option<KeyRecord>> {
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
    let rec: Option<KeyRecord> = kv.get(&crate::keystore::hash_entry(hash)).json().await?;
    match &rec {
        Some(r) => KEYS.with(|c| remember(&mut c.borrow_mut(), hash, (r.clone(), now))),
        None => UNKNOWN.with(|c| remember(&mut c.borrow_mut(), hash, now)),
    }
    Ok(rec)
}

/// The project of API key `key_id` (its KV entry `k:<id>`); `None` for an
/// id no one issued. One KV read: what a handler asks before it calls a
/// key's object by an id the caller named, so a made-up id creates none.
pub async fn key_project(env: &Env, key_id: &str) -> Handled<Option<String>> {
    #[derive(serde::Deserialize)]
    struct Entry {
        record: KeyRecord,
    }
    let kv = env.kv(bindings::API_KEYS)?;
    let entry: Option<Entry> = kv.get(&format!("k:{key_id}")).json().await?;
    Ok(entry.map(|e| e.record.project))
}

/// An authenticated API key: its record and its hash (the cache key).
pub struct ApiKey {
    pub record: KeyRecord,
    pub hash: String,
}

/// Step 1 of the pipeline. Fails with 401 `INVALID_API_KEY`; the detail never
/// repeats the key.
async fn api_key(
    cred: Credential,
    headers: &[(String, String)],
    env: &Env,
    cfg: &Config,
    rc: &RequestCtx,
) -> Handled<ApiKey> {
    let hash = match cred {
        Credential::ApiKey(hash) => hash,
        Credential::Missing => {
            let how = postguard_core::credential::how_to_send(&cfg.settings.auth.sources());
            return Err(invalid(&how).into());
        }
        Credential::Session(_) => {
            return Err(invalid(
                "a portal session opens the dashboard, not the API: send an API key",
            )
            .into())
        }
        _ => return Err(invalid("the API key is malformed").into()),
    };
    let found = match (
        lookup(env, &hash).await?,
        &cfg.settings.auth.verify_unknown_keys,
    ) {
        (None, Some(v)) => {
            let record = crate::verify::unknown_key(v, headers, &hash, env, cfg, rc).await?;
            let now = now_ms();
            KEYS.with(|c| remember(&mut c.borrow_mut(), &hash, (record.clone(), now)));
            UNKNOWN.with(|c| c.borrow_mut().remove(&hash));
            Some(record)
        }
        (found, _) => found,
    };
    match found {
        Some(record) if record.revoked_at.is_none() => Ok(ApiKey { record, hash }),
        Some(_) => Err(Problem::revoked_key().into()),
        None => Err(invalid("the API key is not known").into()),
    }
}

/// An authenticated API key together with its plan (its overrides laid over).
pub struct Caller {
    pub key: ApiKey,
    /// Boxed: a plan is the largest part of a principal.
    pub plan: Box<Plan>,
}

impl Caller {
    /// What this isolate knows of the key, for its object to compare with
    /// what the operator last set (and to decide the key's expiry).
    pub fn view(&self) -> CallerView {
        CallerView {
            version: self.key.record.updated_at,
            expires_at: self.key.record.expires_at,
            key: keys::secret_tag(&self.key.hash),
            secret_until: self.key.record.secret_expires_at,
        }
    }

    /// Where the key's quota notices go, for the admission of `request_id`
    /// charged to its API policies. Sent whatever the cached plan says: the
    /// object may hold limits set since (`notify_at` added by a change).
    pub fn notice_to(&self, request_id: &str) -> Option<Box<NoticeTo>> {
        let r = &self.key.record;
        Some(Box::new(NoticeTo {
            key_id: r.id.clone(),
            key_prefix: r.prefix.clone(),
            project: r.project.clone(),
            request_id: request_id.to_string(),
        }))
    }
}

/// Authenticates the API key and resolves its plan. A plan missing from the
/// configuration is the operator's error (`CONFIG_INVALID`), not the client's.
pub async fn api_caller(
    cred: Credential,
    headers: &[(String, String)],
    env: &Env,
    cfg: &Config,
    rc: &RequestCtx,
) -> Handled<Caller> {
    let key = api_key(cred, headers, env, cfg, rc).await?;
    rc.note(|f| {
        f.key_prefix = Some(key.record.prefix.clone());
        f.project = Some(key.record.project.clone());
        f.credential = true;
    });
    match key.record.effective_plan(&cfg.settings) {
        Some(plan) => Ok(Caller {
            plan: Box::new(plan),
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

/// The key's Durable Object says it has expired (or this secret of a
/// rerolled key's grace ended): drop it from this isolate's cache, 401.
pub fn expired(key: &ApiKey) -> Problem {
    forget(&key.hash);
    Problem::expired_key()
}

/// A portal session (docs/dashboard-and-portal.md): one project, charged from the
/// budget of `plan` in an object of its own, which also says whether the
/// operator ended it.
pub struct Session {
    pub id: String,
    pub claims: Claims,
    pub plan: Plan,
}

/// Who called a gateway operation, as the router authenticated them.
pub enum Principal {
    /// A public operation: no credential was asked for.
    Anonymous,
    Operator,
    Origin,
    /// One of a project's API keys.
    Key(Caller),
    /// A portal session for a project.
    Session(Session),
}

/// The limits of a caller that is never charged: the operator's and the
/// origin's objects only hold their Idempotency-Key records.
fn uncharged() -> Limits {
    Limits {
        notify_at: Vec::new(),
        policies: vec![Policy {
            name: "operator".into(),
            limit: u32::MAX,
            window_ms: 60_000,
        }],
        concurrency: None,
        report_only: false,
    }
}

impl Principal {
    /// The project a key or session belongs to.
    pub fn project(&self) -> Option<&str> {
        match self {
            Principal::Key(c) => Some(&c.key.record.project),
            Principal::Session(s) => Some(&s.claims.project),
            _ => None,
        }
    }

    /// The name of the object that charges this caller's budget and keeps
    /// its Idempotency-Key records (the scope of a key, docs/idempotency.md): the
    /// key's own object, the session's, or one per deployment secret.
    pub fn guard(&self) -> Option<String> {
        match self {
            Principal::Anonymous => None,
            Principal::Operator => Some("op:operator".into()),
            Principal::Origin => Some("op:origin".into()),
            Principal::Key(c) => Some(c.key.record.id.clone()),
            Principal::Session(s) => Some(format!("ses:{}", s.id)),
        }
    }

    /// The caller's plan: its budget and how long its records are kept.
    /// `None` for the operator and the origin, which have no budget.
    pub fn plan(&self) -> Option<&Plan> {
        match self {
            Principal::Key(c) => Some(&c.plan),
            Principal::Session(s) => Some(&s.plan),
            _ => None,
        }
    }

    /// The limits a gateway operation of `budget` is charged to: a key's
    /// gateway policy (or, for `/me` and the idempotency lookup, its API
    /// policies, looked at for free); a session's gateway policy.
    pub fn limits(&self, budget: Budget) -> Limits {
        match (self, budget) {
            (Principal::Key(c), Budget::Api) => c.plan.limits(),
            _ => self.plan().map_or_else(uncharged, Plan::gateway_limits),
        }
    }

    /// What the caller's isolate knows of its key (`None`: not a key).
    pub fn view(&self) -> Option<CallerView> {
        match self {
            Principal::Key(c) => Some(c.view()),
            _ => None,
        }
    }

    /// Whether the caller has a budget (a key or a session): its answers
    /// carry the rate-limit headers.
    pub fn is_charged(&self) -> bool {
        self.plan().is_some()
    }
}

/// Authenticates the caller of a gateway operation that needs `access`:
/// 401 for a missing, wrong or expired credential, 403 for a valid one of
/// another kind (docs/api-reference.md).
pub async fn authenticate(
    access: Access,
    headers: &[(String, String)],
    env: &Env,
    cfg: &Config,
    rc: &RequestCtx,
) -> Handled<Principal> {
    use Credential as C;
    let cred = credential_of(headers, cfg);
    let shown = |p: Principal| {
        rc.note(|f| f.credential = true);
        Ok(p)
    };
    match (access, cred) {
        (Access::Public, _) => Ok(Principal::Anonymous),
        (Access::Operator | Access::Reader, C::Operator) => shown(Principal::Operator),
        (Access::Origin, C::Origin) => shown(Principal::Origin),
        (Access::Project | Access::Reader, C::Session(t)) => {
            shown(Principal::Session(session(&t, cfg, rc)?))
        }
        (
            Access::Project | Access::Reader | Access::Key,
            cred @ (C::ApiKey(_) | C::Missing | C::Other),
        ) => Ok(Principal::Key(
            api_caller(cred, headers, env, cfg, rc).await?,
        )),
        (Access::Key, C::Session(_) | C::Operator | C::Origin) => refuse(
            ErrorCode::Forbidden,
            "this endpoint is about an API key's own requests: call it with that key",
        ),
        (Access::Project, C::Operator | C::Origin) => refuse(
            ErrorCode::Forbidden,
            "this endpoint belongs to a project: call it with one of the project's API keys",
        ),
        (Access::Reader, C::Origin) => refuse(
            ErrorCode::Forbidden,
            "the origin token cannot read the audit log or the statistics",
        ),
        (Access::Operator | Access::Origin, cred) => wrong_secret(access, cred, env, cfg, rc).await,
    }
}

/// An operator or origin endpoint called without its secret: 401
/// `UNAUTHORIZED` for a wrong or missing token, 403 `FORBIDDEN` for a valid
/// credential of another kind (a live API key, a session, the other secret).
async fn wrong_secret(
    access: Access,
    cred: Credential,
    env: &Env,
    cfg: &Config,
    rc: &RequestCtx,
) -> Handled<Principal> {
    use ErrorCode::{Forbidden, Unauthorized};
    let (needed, send) = match access {
        Access::Origin => ("events are published with the origin token", "ORIGIN_TOKEN"),
        _ => ("this is an operator endpoint", "ADMIN_TOKEN"),
    };
    let other = match cred {
        Credential::Missing => {
            let detail = format!("send the token as 'Authorization: Bearer <{send}>'");
            return refuse(Unauthorized, &detail);
        }
        Credential::Operator => Some("the operator token"),
        Credential::Origin => Some("the origin token"),
        // A revoked key is still a key (it was valid), as before.
        Credential::ApiKey(t) if lookup(env, &t).await?.is_some() => Some("an API key"),
        Credential::Session(t) if verify_session(&t, cfg).is_ok() => Some("a portal session"),
        _ => None,
    };
    match other {
        Some(what) => {
            rc.note(|f| f.credential = true);
            refuse(Forbidden, &format!("{needed}; {what} cannot call it"))
        }
        None => refuse(Unauthorized, &format!("the {send} is wrong")),
    }
}

fn signer(cfg: &Config) -> Signer {
    Signer::from_admin_token(&cfg.admin_token)
}

fn unauthorized(detail: &str) -> Problem {
    Problem::new(ErrorCode::Unauthorized, detail)
}

fn verify_session(token: &str, cfg: &Config) -> Result<Claims, Rejected> {
    signer(cfg).verify(Kind::Session, token, now_ms())
}

/// A portal session's claims and plan, or 401 `UNAUTHORIZED` when it is
/// forged, has expired, or predates per-session budgets (no plan). A valid
/// session's project is noted for the audit row (no key prefix: no key was
/// used). Whether the operator ended it is its object's answer, asked when
/// the router charges it.
pub fn session(token: &str, cfg: &Config, rc: &RequestCtx) -> Handled<Session> {
    let claims = match verify_session(token, cfg) {
        Ok(claims) => claims,
        Err(Rejected::Expired) => {
            return Err(
                unauthorized("the portal session has expired: open a new portal link").into(),
            )
        }
        Err(_) => return Err(unauthorized("the portal session is not valid").into()),
    };
    rc.note(|f| f.project = Some(claims.project.clone()));
    let plan = claims
        .plan
        .as_deref()
        .and_then(|p| cfg.settings.plans.get(p))
        .cloned()
        .ok_or_else(|| unauthorized("the portal session has no budget: open a new portal link"))?;
    Ok(Session {
        id: claims.session_id(),
        claims,
        plan,
    })
}

/// Signs a new link or session.
pub fn issue(cfg: &Config, kind: Kind, claims: &Claims) -> String {
    signer(cfg).issue(kind, claims)
}

/// A portal link's claims, or 401 `UNAUTHORIZED`.
pub fn verify_link(token: &str, cfg: &Config) -> Handled<Claims> {
    signer(cfg)
        .verify(Kind::Link, token, now_ms())
        .map_err(|r| {
            unauthorized(match r {
                Rejected::Expired => "the portal link has expired: ask for a new one",
                Rejected::Malformed | Rejected::BadSignature => "the portal link is not valid",
            })
            .into()
        })
}
