//! Calls to the webhook shards (ADR 0035): which shard holds what, the
//! limits a shard admits against, pages merged across a project's shards
//! (and the legacy D1 rows, the oldest source), and moving a legacy event
//! into its shard when it is touched again.

use postguard_core::config::Config;
use postguard_core::webhooks::protocol as wire;
use postguard_core::webhooks::records::{
    DeliveryQuery, DeliveryRecord, EventQuery, FeedRow, Imported, Limits,
};
use postguard_core::webhooks::shard::{self, id_time, ShardKey};
use postguard_core::webhooks::{capacity, health};
use worker::{Env, Result};

use super::directory;
use crate::durable::webhook_shard::{self, FeedReq, ListReq};

/// Calls operation `O` of `shard`.
pub async fn call<O: wire::Operation>(
    env: &Env,
    shard: &ShardKey,
    req: &O::Request,
) -> Result<O::Response> {
    webhook_shard::call::<O>(env, shard, req).await
}

pub fn bucket_ms(cfg: &Config) -> u64 {
    cfg.settings.webhooks.shard_bucket_ms
}

/// The shard of `project`'s events published at `now`.
pub fn current(cfg: &Config, project: &str, now: u64) -> ShardKey {
    ShardKey::of(project, now, bucket_ms(cfg))
}

/// What a shard admits a publish against.
pub fn limits(cfg: &Config) -> Limits {
    let wh = &cfg.settings.webhooks;
    Limits {
        events_per_day: u64::from(wh.events_per_project_per_day),
        deliveries_per_day: u64::from(wh.deliveries_per_project_per_day),
        bytes_per_day: wh.bytes_per_project_per_day,
        high_water_bytes: wh.shard_high_water_bytes,
        delivery_bytes: capacity::delivery_bytes(&cfg.settings),
        bytes_elsewhere: 0,
    }
}

/// The shards that may hold delivery `id` of `project`: the one its id
/// names (a gateway-issued id carries its shard's start), then, for an id
/// of the deployment before the shards, the bucket of its time (where
/// [`adopt`] moved it).
pub fn candidates(cfg: &Config, project: &str, id: &str) -> Vec<ShardKey> {
    let Some(t) = id_time(id) else {
        return Vec::new();
    };
    let exact = ShardKey {
        project: project.to_string(),
        start_ms: t,
    };
    let aligned = ShardKey::of(project, t, bucket_ms(cfg));
    if aligned == exact {
        vec![exact]
    } else {
        vec![exact, aligned]
    }
}

/// Moves a legacy event whole (record, deliveries, attempts; ids and states
/// kept) from D1 into the shards its delivery ids name, then deletes it from
/// D1. Idempotent: a repeat finds it gone, or imports nothing twice.
pub async fn adopt(
    env: &Env,
    cfg: &Config,
    project: &str,
    event_id: &str,
    now: u64,
) -> Result<bool> {
    let Some(imp) = directory::legacy::event(env, project, event_id).await? else {
        return Ok(false);
    };
    let bucket = bucket_ms(cfg);
    let mut parts: Vec<(ShardKey, Imported)> = Vec::new();
    for d in &imp.deliveries {
        let t = id_time(&d.id).unwrap_or(d.created_at);
        let key = ShardKey::of(project, t, bucket);
        let at = match parts.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                parts.push((
                    key,
                    Imported {
                        event: imp.event.clone(),
                        deliveries: Vec::new(),
                        attempts: Vec::new(),
                    },
                ));
                parts.len() - 1
            }
        };
        parts[at].1.deliveries.push(d.clone());
        let attempts = imp
            .attempts
            .iter()
            .filter(|a| a.delivery_id == d.id)
            .cloned();
        parts[at].1.attempts.extend(attempts);
    }
    if parts.is_empty() {
        parts.push((ShardKey::of(project, imp.event.created_at, bucket), imp));
    }
    let keys: Vec<ShardKey> = parts.iter().map(|(k, _)| k.clone()).collect();
    directory::enter(env, &keys, bucket, now).await?;
    for (key, part) in &parts {
        call::<wire::Import>(env, key, &vec![(*part).clone()]).await?;
    }
    directory::legacy::delete(env, project, event_id).await?;
    Ok(true)
}

/// The delivery `id` of `project` as stored, and its shard: looked up in the
/// shards its id names that the directory lists (an id no one issued calls,
/// and so creates, no shard), then in D1's legacy rows (moved into its
/// shard).
pub async fn find(
    env: &Env,
    cfg: &Config,
    project: &str,
    id: &str,
    now: u64,
) -> Result<Option<(ShardKey, postguard_core::webhooks::records::Detail)>> {
    use postguard_core::webhooks::records::Detail;
    for round in 0..2 {
        for key in candidates(cfg, project, id) {
            if directory::span(env, &key).await?.is_none() {
                continue;
            }
            let req = webhook_shard::DetailReq {
                delivery_id: id.to_string(),
            };
            let found: Option<Detail> = call::<wire::DetailOf>(env, &key, &req).await?;
            if let Some(d) = found {
                return Ok(Some((key, d)));
            }
        }
        if round > 0 {
            break;
        }
        let Some(r) = directory::legacy::find(env, id).await? else {
            return Ok(None);
        };
        if r.project != project || !adopt(env, cfg, project, &r.event_id, now).await? {
            return Ok(None);
        }
    }
    Ok(None)
}

/// The attempts of the last 24 h of `project`'s subscriptions `ids`, counted
/// per subscription and URL across the shards that may hold them
/// (`webhooks::health`), read at once.
pub async fn health(
    env: &Env,
    cfg: &Config,
    project: &str,
    ids: &[String],
    now: u64,
) -> Result<Vec<health::Tally>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let schedule = &cfg.settings.webhooks.schedule_s;
    let shards = health::shards_to_read(directory::shards_of(env, project).await?, now, schedule);
    let req = webhook_shard::HealthReq {
        subscription_ids: ids.to_vec(),
        since: health::since(now),
    };
    let keys: Vec<ShardKey> = shards
        .into_iter()
        .map(|(start_ms, _)| ShardKey {
            project: project.to_string(),
            start_ms,
        })
        .collect();
    let calls = keys.iter().map(|k| call::<wire::Health>(env, k, &req));
    let parts = futures_util::future::join_all(calls)
        .await
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    Ok(health::merge(parts.concat()))
}

/// A page of `project`'s deliveries newest first, across its shards and
/// the legacy rows: up to `take` rows.
pub async fn page_deliveries(
    env: &Env,
    project: &str,
    q: &DeliveryQuery,
    take: u32,
) -> Result<Vec<DeliveryRecord>> {
    let mut shards = shard::visit_order(
        directory::shards_of(env, project).await?,
        q.since,
        q.until,
        true,
    );
    if let Some((t, _)) = &q.before {
        shards.retain(|(start, _)| start <= t);
    }
    let key = |d: &DeliveryRecord| (d.created_at, d.id.clone());
    let mut rows: Vec<DeliveryRecord> = Vec::new();
    let n = take as usize;
    for (i, (start, _)) in shards.iter().enumerate() {
        let k = ShardKey {
            project: project.to_string(),
            start_ms: *start,
        };
        let page: Vec<DeliveryRecord> =
            call::<wire::List>(env, &k, &ListReq { q: q.clone(), take }).await?;
        rows.extend(page);
        if shard::page_complete(&mut rows, n, shards.get(i + 1).copied(), true, key)
            && shards.get(i + 1).is_some()
        {
            return Ok(rows);
        }
    }
    // The legacy rows are older than every shard.
    if rows.len() < n {
        rows.extend(directory::legacy::list(env, project, q, take).await?);
    }
    shard::page_complete(&mut rows, n, None, true, key);
    Ok(rows)
}

/// A page of `project`'s events in `q`'s order, across its shards and the
/// legacy rows.
pub async fn page_events(
    env: &Env,
    project: &str,
    q: &EventQuery,
    take: u32,
) -> Result<Vec<FeedRow>> {
    let mut shards = shard::visit_order(
        directory::shards_of(env, project).await?,
        q.since,
        q.until,
        q.desc,
    );
    if let Some((t, _)) = &q.after {
        shards.retain(|(start, end)| if q.desc { start <= t } else { end > t });
    }
    let key = |r: &FeedRow| (r.event.created_at, r.event.id.clone());
    let n = take as usize;
    let mut rows: Vec<FeedRow> = Vec::new();
    let legacy = |rows: &Vec<FeedRow>| rows.len() < n;
    if !q.desc && legacy(&rows) {
        // Oldest first: the legacy rows come first.
        rows.extend(directory::legacy::feed(env, project, q, take).await?);
    }
    for (i, (start, _)) in shards.iter().enumerate() {
        let k = ShardKey {
            project: project.to_string(),
            start_ms: *start,
        };
        let page: Vec<FeedRow> =
            call::<wire::Feed>(env, &k, &FeedReq { q: q.clone(), take }).await?;
        rows.extend(page);
        let next = shards.get(i + 1).copied();
        if next.is_some() && shard::page_complete(&mut rows, n, next, q.desc, key) {
            return Ok(rows);
        }
    }
    if q.desc && legacy(&rows) {
        rows.extend(directory::legacy::feed(env, project, q, take).await?);
    }
    shard::page_complete(&mut rows, n, None, q.desc, key);
    Ok(rows)
}

/// The project's shards that may hold deliveries created in `[since, until]`,
/// oldest first.
pub async fn in_range(env: &Env, project: &str, since: u64, until: u64) -> Result<Vec<ShardKey>> {
    let all = directory::shards_of(env, project).await?;
    let visit = postguard_core::webhooks::shard::visit_order(all, Some(since), Some(until), false);
    Ok(visit
        .into_iter()
        .map(|(start_ms, _)| ShardKey {
            project: project.to_string(),
            start_ms,
        })
        .collect())
}
