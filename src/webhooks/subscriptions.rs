//! `/_postguard/v1/webhooks`: create (secret shown once), list, get, delete,
//! rotate-secret (the previous secret keeps signing for 24 h), and the §11
//! lifecycle: PATCH (the secret is kept), pause and resume. The rows are D1's
//! (`super::directory::subscriptions`).

use postguard_core::page::{decode_cursor, encode_cursor, parse_limit, Page};
use postguard_core::portal;
use postguard_core::webhooks::ops::{self, SubState};
use postguard_core::webhooks::signature;
use postguard_core::webhooks::{health, pacing};
use postguard_core::{Invalid, Problem};
use serde::Serialize;
use worker::{Env, Result};

use super::directory::subscriptions as rows;
use super::{new_id, policy};
use crate::auth::Principal;
use crate::handler::{self, Ctx, Project};
use crate::reject::Handled;
use crate::request::query_param;
use crate::runtime::{now_ms, random_bytes};

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
    /// What its receiver last advertised in its answers (`RateLimit`,
    /// `X-RateLimit-*`) while its reset is ahead; `null` otherwise.
    receiver_limit: Option<pacing::ReceiverLimit>,
    #[serde(skip_serializing_if = "Option::is_none")]
    secret: Option<String>,
    /// How its endpoint answered the last 24 h (`webhooks::health`): in
    /// `GET /webhooks` and `GET /webhooks/{id}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    health: Option<health::Health>,
}

impl From<rows::Row> for Subscription {
    fn from(r: rows::Row) -> Self {
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
            receiver_limit: r.receiver_remaining.zip(r.receiver_reset_at).and_then(
                |(remaining, reset_at)| {
                    let kept = pacing::ReceiverLimit {
                        remaining,
                        reset_at,
                    };
                    pacing::observe(Some(&kept), None, now_ms())
                },
            ),
            secret: None,
            health: None,
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
pub async fn create(cx: &Ctx<'_>, project: &Project) -> Handled {
    let (env, cfg, rc) = (cx.env, cx.cfg, cx.rc);
    let project = project.as_str();
    // Its owner: the calling key, or for a portal session the project itself
    // (ending the project's sessions, or revoking its last key, pauses it).
    let owner = match &cx.who {
        Principal::Key(c) => c.key.record.id.clone(),
        _ => portal::subscription_owner(project),
    };
    let create = ops::parse_create(&cx.body, &policy(cfg))?;
    let (input, rate) = (create.subscription, create.rate_limit_per_s);
    let id = new_id("sub_");
    let secret = match create.secret {
        Some(given) => given,
        None => new_secret()?,
    };
    let now = now_ms();
    let events_json = serde_json::to_string(&input.events)?;
    let cap = cfg.settings.webhooks.max_subscriptions_per_project;
    let new = rows::New {
        id: &id,
        project,
        url: &input.url,
        events: &events_json,
        description: input.description.as_deref(),
        secret: &secret,
        created_at: now,
        owner: &owner,
        rate_limit_per_s: rate,
    };
    if !rows::insert(env, &new, cap).await? {
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
        receiver_limit: None,
        secret: Some(secret),
        health: None,
    };
    handler::json(rc, 201, &sub, &[])
}

pub async fn list(cx: &Ctx<'_>) -> Handled {
    let (req, env, rc) = (&cx.req, cx.env, cx.rc);
    let (project, _) = cx.reader_project()?;
    let project = project.as_str();
    let limit = parse_limit(query_param(req, "limit")?.as_deref())?;
    let cursor = match query_param(req, "cursor")? {
        Some(c) => Some(decode_cursor(&c)?),
        None => None,
    };
    let found = rows::list(env, project, cursor, limit + 1).await?;
    let mut subs: Vec<Subscription> = found.into_iter().map(Subscription::from).collect();
    subs.truncate(limit as usize + 1);
    with_health(cx, project, &mut subs).await?;
    let page = Page::of(subs, limit, |s| encode_cursor(s.created_at, &s.id));
    handler::json(rc, 200, &page, &[])
}

/// Each subscription's health figure, from one read of each shard that may
/// hold its attempts of the last 24 h.
async fn with_health(cx: &Ctx<'_>, project: &str, subs: &mut [Subscription]) -> Result<()> {
    let ids: Vec<String> = subs.iter().map(|s| s.id.clone()).collect();
    let tallies = super::shards::health(cx.env, cx.cfg, project, &ids, now_ms()).await?;
    for s in subs.iter_mut() {
        s.health = Some(health::of(&tallies, &s.id, &s.url));
    }
    Ok(())
}

pub fn not_found(id: &str) -> Problem {
    Problem::not_found("webhook subscription", id)
}

pub async fn load(env: &Env, project: &str, id: &str) -> Result<Option<Subscription>> {
    Ok(rows::load(env, project, id).await?.map(Subscription::from))
}

pub async fn get(cx: &Ctx<'_>, id: &str) -> Handled {
    let (env, rc) = (cx.env, cx.rc);
    let (project, _) = cx.reader_project()?;
    let sub = load(env, &project, id)
        .await?
        .ok_or_else(|| not_found(id))?;
    let mut one = [sub];
    with_health(cx, &project, &mut one).await?;
    handler::json(rc, 200, &one[0], &[])
}

pub async fn delete(cx: &Ctx<'_>, project: &Project, id: &str) -> Handled {
    let (env, rc) = (cx.env, cx.rc);
    let project = project.as_str();
    if !rows::delete(env, project, id).await? {
        return Err(not_found(id).into());
    }
    handler::no_content(rc)
}

#[derive(Serialize)]
struct Rotated {
    secret: String,
}

pub async fn rotate(cx: &Ctx<'_>, project: &Project, id: &str) -> Handled {
    let (env, cfg, rc) = (cx.env, cx.cfg, cx.rc);
    let project = project.as_str();
    let secret = new_secret()?;
    let until = now_ms() + u64::from(cfg.settings.webhooks.secret_overlap_s) * 1_000;
    if !rows::rotate(env, project, id, &secret, until).await? {
        return Err(not_found(id).into());
    }
    handler::json(rc, 200, &Rotated { secret }, &[])
}

/// `PATCH /webhooks/{id}` `{url?, events?, description?, rate_limit_per_s?}`:
/// the same rules as create on the merged result; the secret is kept.
pub async fn patch(cx: &Ctx<'_>, project: &Project, id: &str) -> Handled {
    let (env, cfg, rc) = (cx.env, cx.cfg, cx.rc);
    let project = project.as_str();
    let body = &cx.body;
    let current = load(env, project, id).await?.ok_or_else(|| not_found(id))?;
    let p = ops::parse_patch(body, &current.url, &current.events, &policy(cfg))?;
    rows::patch(env, project, id, &p).await?;
    let sub = load(env, project, id).await?.ok_or_else(|| not_found(id))?;
    handler::json(rc, 200, &sub, &[])
}

/// `POST /webhooks/{id}/pause`: new events still create deliveries, held as
/// `paused`; scheduled attempts already queued hold theirs when they run.
pub async fn pause(cx: &Ctx<'_>, project: &Project, id: &str) -> Handled {
    let (env, rc) = (cx.env, cx.rc);
    let project = project.as_str();
    load(env, project, id).await?.ok_or_else(|| not_found(id))?;
    rows::set_state(env, project, id, SubState::Paused, None).await?;
    let sub = load(env, project, id).await?.ok_or_else(|| not_found(id))?;
    handler::json(rc, 200, &sub, &[])
}

/// `POST /webhooks/{id}/resume`: active again (from paused or disabled), then
/// every held delivery back on its schedule, due now, queued in creation
/// order (ADR 0014).
pub async fn resume(cx: &Ctx<'_>, project: &Project, id: &str) -> Handled {
    let (env, cfg, rc) = (cx.env, cx.cfg, cx.rc);
    let project = project.as_str();
    load(env, project, id).await?.ok_or_else(|| not_found(id))?;
    // First active (a hold written after this fails its compare-and-set and
    // sends instead), then release what was held before.
    rows::set_state(env, project, id, SubState::Active, None).await?;
    super::write::release_held(env, cfg, project, id).await?;
    let sub = load(env, project, id).await?.ok_or_else(|| not_found(id))?;
    handler::json(rc, 200, &sub, &[])
}
