//! Operator API for API keys (`ADMIN_TOKEN`): create, import, list, get,
//! PATCH, reroll and revoke (docs/operator-api.md, docs/limits.md,
//! docs/live-api.md). Their KV layout is `keystore`'s.
//!
//! Revocation, a PATCH and a reroll are told to the key's Durable Object,
//! which every request of the key consults: they apply from the key's next
//! request whatever KV or an isolate still caches.

use crate::webhooks::directory::subscriptions;
use postguard_core::config::OnKeyRevoked;
use postguard_core::guard::ImportKeys;
use postguard_core::guard::{Revoke, RevokeRequest, Update, UpdateRequest};
use postguard_core::ids;
use postguard_core::key_import;
use postguard_core::keys::{self, KeyRecord, Retired};
use postguard_core::log::Line;
use postguard_core::page::{parse_limit, Page};
use postguard_core::{Invalid, Problem};
use serde::Serialize;
use worker::KvStore;

use crate::auth;
use crate::bindings;
use crate::durable::client::call;
use crate::handler::{self, Ctx};
use crate::http;
use crate::keystore::{by_id, write_all, ById};
use crate::reject::Handled;
use crate::request::query_param;
use crate::runtime::{new_ulid_parts, now_ms, random_bytes};

#[derive(Serialize)]
struct Created<'a> {
    #[serde(flatten)]
    record: &'a KeyRecord,
    key: &'a str,
}

fn new_secret() -> Handled<[u8; 32]> {
    Ok(random_bytes::<32>().map_err(|e| worker::Error::RustError(format!("random: {e}")))?)
}

pub async fn create(cx: &Ctx<'_>) -> Handled {
    let (now, rnd) = new_ulid_parts();
    let input = keys::parse_create(&cx.body, &cx.cfg.settings, now)?;
    let key = ids::new_api_key(&new_secret()?);
    let record = KeyRecord {
        id: ids::key_id(now, rnd),
        prefix: ids::key_prefix(&key),
        project: input.project,
        plan: input.plan,
        name: input.name,
        created_at: now,
        revoked_at: None,
        expires_at: input.expires_at,
        meta: input.meta,
        overrides: input.overrides,
        // Its first version: when it was made (a PATCH or reroll moves it on).
        updated_at: now,
        secret_expires_at: None,
    };
    let kv = cx.env.kv(bindings::API_KEYS)?;
    let hash = ids::sha256_hex(&key);
    let by_id = ById {
        record,
        hash,
        previous: Vec::new(),
    };
    write_all(&kv, &by_id).await?;
    auth::forget(&by_id.hash);
    let created = Created {
        record: &by_id.record,
        key: &key,
    };
    handler::json(cx.rc, 201, &created, &[])
}

/// `POST /_postguard/v1/keys/import` `{keys: [...]}` → 200 `{data: [{id,
/// prefix, status}]}` in the order given. The whole call is validated
/// first; then each chunk of `key_import::CHUNK` keys is stored by a
/// `KeyGuard` call of its own (a chunk's KV operations are that call's, and
/// 1,000 keys would exceed one invocation's; ADR 0041), the chunks at once.
pub async fn import(cx: &Ctx<'_>) -> Handled {
    let secret = cx.cfg.origin_signing_secret.as_bytes();
    let keys = key_import::parse(&cx.body, &cx.cfg.settings, secret, now_ms())?;
    let hashes: Vec<String> = keys.iter().map(|k| k.hash.clone()).collect();
    let calls = keys.chunks(key_import::CHUNK).map(|chunk| async move {
        let writer = format!("import:{}", chunk[0].record.id);
        call::<ImportKeys>(cx.env, &writer, &chunk.to_vec(), &[]).await
    });
    let mut data = Vec::with_capacity(hashes.len());
    for answer in futures_util::future::join_all(calls).await {
        data.extend(answer?.0);
    }
    // This isolate may remember a key as unknown; others forget in seconds.
    for h in &hashes {
        auth::forget(h);
    }
    handler::json(cx.rc, 200, &serde_json::json!({ "data": data }), &[])
}

/// Tells the key's object what the operator set: from the key's next
/// request, every isolate's admission uses it.
async fn tell_object(cx: &Ctx<'_>, by_id: &ById) -> Handled<()> {
    let Some(profile) = keys::profile(
        &by_id.record,
        &cx.cfg.settings,
        keys::markers(&by_id.previous),
    ) else {
        return Err(Problem::new(
            postguard_core::ErrorCode::ConfigInvalid,
            format!(
                "plans: the key's plan '{}' is not configured",
                by_id.record.plan
            ),
        )
        .into());
    };
    call::<Update>(cx.env, &by_id.record.id, &UpdateRequest { profile }, &[]).await?;
    Ok(())
}

/// `PATCH /_postguard/v1/keys/{id}` `{name?, plan?, meta?, overrides?,
/// expires_at?}` → 200 key. A revoked key cannot be changed (404 as for an
/// unknown id would hide it: 400 says why).
pub async fn patch(cx: &Ctx<'_>, id: &str) -> Handled {
    let kv = cx.env.kv(bindings::API_KEYS)?;
    let mut found = by_id(&kv, id).await?;
    if found.record.revoked_at.is_some() {
        return Err(Invalid::from("the key is revoked: it cannot be changed").into());
    }
    found.record = keys::apply_patch(&found.record, &cx.body, &cx.cfg.settings, now_ms())?;
    // The object first: the change applies from the next request even while
    // KV still serves the old record.
    tell_object(cx, &found).await?;
    write_all(&kv, &found).await?;
    forget_all(&found);
    handler::json(cx.rc, 200, &found.record, &[])
}

#[derive(Serialize)]
struct Rerolled<'a> {
    #[serde(flatten)]
    record: &'a KeyRecord,
    key: &'a str,
    previous_expires_at: u64,
}

/// `POST /_postguard/v1/keys/{id}/reroll {grace_s?}` → 201 `{…key, key,
/// previous_expires_at}`: a new secret for the same key (its id, prefix,
/// counters and records); the old one works until `previous_expires_at`.
pub async fn reroll(cx: &Ctx<'_>, id: &str) -> Handled {
    let grace_s = keys::parse_reroll(&cx.body)?;
    let kv = cx.env.kv(bindings::API_KEYS)?;
    let mut found = by_id(&kv, id).await?;
    if found.record.revoked_at.is_some() {
        return Err(Invalid::from("the key is revoked: it cannot be rerolled").into());
    }
    let now = now_ms();
    let key = keys::rerolled_key(&found.record.prefix, &new_secret()?);
    let until = now + grace_s * 1000;
    let old = Retired {
        hash: std::mem::replace(&mut found.hash, ids::sha256_hex(&key)),
        until,
    };
    keys::retire(&mut found.previous, old);
    found.record.updated_at = now.max(found.record.updated_at + 1);
    tell_object(cx, &found).await?;
    write_all(&kv, &found).await?;
    forget_all(&found);
    let out = Rerolled {
        record: &found.record,
        key: &key,
        previous_expires_at: until,
    };
    handler::json(cx.rc, 201, &out, &[])
}

/// Drops every secret of the key from this isolate's cache.
fn forget_all(found: &ById) {
    auth::forget(&found.hash);
    for p in &found.previous {
        auth::forget(&p.hash);
    }
}

fn bad_cursor() -> Invalid {
    Invalid::field("cursor", "not a cursor this API returned")
}

pub async fn list(cx: &Ctx<'_>) -> Handled {
    let req = &cx.req;
    let limit = parse_limit(query_param(req, "limit")?.as_deref())?;
    let prefix = match query_param(req, "project")? {
        Some(p) if postguard_core::ids::is_valid_name(&p) => format!("i:{p}:"),
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
    let data: Vec<keys::ListedKey> = page
        .keys
        .into_iter()
        .filter_map(|k| k.metadata.and_then(|m| serde_json::from_value(m).ok()))
        .collect();
    let next_cursor = if page.list_complete {
        None
    } else {
        page.cursor.filter(|c| !c.is_empty())
    };
    handler::json(cx.rc, 200, &Page { data, next_cursor }, &[])
}

#[derive(Serialize)]
struct WithState<'a> {
    #[serde(flatten)]
    record: &'a KeyRecord,
    /// Each API policy now (a cost-0 look at the key's object).
    policies: Vec<PolicyState>,
    /// The concurrency quota: requests in flight of `limit`.
    #[serde(skip_serializing_if = "Option::is_none")]
    inflight: Option<postguard_core::limits::Inflight>,
}

#[derive(Serialize)]
pub(super) struct PolicyState {
    name: String,
    limit: u32,
    remaining: u32,
    reset: u64,
    window_s: u64,
}

/// Each policy's verdict as `/me` and `GET /keys/{id}` show it.
pub(super) fn policy_states(v: &postguard_core::limits::Verdicts) -> Vec<PolicyState> {
    v.said
        .iter()
        .map(|s| PolicyState {
            name: s.name.clone(),
            limit: s.verdict.limit,
            remaining: s.verdict.remaining,
            reset: s.verdict.reset_epoch_s,
            window_s: s.verdict.window_s,
        })
        .collect()
}

/// `GET /_postguard/v1/keys/{id}`: the key, its metadata and overrides, and
/// the state of each of its policies.
pub async fn get(cx: &Ctx<'_>, id: &str) -> Handled {
    use postguard_core::guard::{Admit, AdmitRequest};
    let found = by_id(&cx.env.kv(bindings::API_KEYS)?, id).await?;
    let plan = found.record.effective_plan(&cx.cfg.settings);
    let verdicts = match (&plan, found.record.revoked_at) {
        (Some(plan), None) => {
            let peek = AdmitRequest::charge(0, plan.limits());
            let (answer, _) = call::<Admit>(cx.env, &found.record.id, &peek, &[]).await?;
            answer.verdicts()
        }
        _ => None,
    };
    let out = WithState {
        record: &found.record,
        policies: verdicts.as_ref().map(policy_states).unwrap_or_default(),
        inflight: verdicts.and_then(|v| v.inflight),
    };
    handler::json(cx.rc, 200, &out, &[])
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
        write_all(&kv, &found).await?;
    }
    forget_all(&found);
    let at = found.record.revoked_at.unwrap_or_else(now_ms);
    let mode = cfg.settings.webhooks.on_key_revoked;
    let mut n =
        subscriptions::of_revoked_key(env, &found.record.project, &found.record.id, at, mode)
            .await?;
    if !has_live_key(cx, &kv, &found.record).await? {
        let ended = super::portal::end_project_sessions(env, &found.record.project, at).await?;
        let owner = postguard_core::portal::subscription_owner(&found.record.project);
        n += subscriptions::of_revoked_key(env, &found.record.project, &owner, at, mode).await?;
        if ended > 0 {
            crate::log::emit(
                crate::log::of_request(
                    Line::info("last live key revoked: portal sessions ended"),
                    cx.rc,
                )
                .field("sessions_ended", ended),
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
    use postguard_core::guard::{Admit, AdmitRequest, AdmitResponse};
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
        // windows' lengths as they are.
        let Some(plan) = other.effective_plan(&cx.cfg.settings) else {
            return Ok(true);
        };
        let peek = AdmitRequest::charge(0, plan.limits());
        match call::<Admit>(cx.env, &other.id, &peek, &[]).await? {
            (AdmitResponse::Revoked, _) => continue,
            _ => return Ok(true),
        }
    }
    Ok(false)
}
