//! The one write path of every event (ADR 0035): HTTP publishes (through
//! `super::group`), the operational `postguard.subscription.disabled`, and
//! anything later work publishes. [`store`] asks each project's object
//! (`ProjectHub`, ADR 0046: no D1 read) for each event's deliveries, keyed
//! ones placed in their lanes (ADR 0043), writes each shard's events,
//! deliveries and outbox state in ONE call of that shard (one
//! `transactionSync`), then sends the first attempts to the queue. An
//! event is durable before its caller answers.
//!
//! The outbox marks of sent jobs ride in the shard's next publish call, or
//! are written by [`flush_marks`] when none follows; a lost mark only means
//! the every-minute sweep sends the job again (the consumer drops the
//! duplicate).

use crate::log;
use postguard_core::log::Line;
use postguard_core::webhooks::protocol as wire;
use std::cell::RefCell;
use std::collections::HashMap;

use postguard_core::config::Config;
use postguard_core::webhooks::events;
use postguard_core::webhooks::hub::{Draft, Prepare, PrepareReq, Prepared};
use postguard_core::webhooks::ordering::{Committed, Lane};
use postguard_core::webhooks::records::{
    EventRecord, FirstJob, Limits, NewDelivery, NewEvent, Stored,
};
use postguard_core::webhooks::shard::ShardKey;
use postguard_core::Problem;
use worker::{Env, Result};

use super::directory;
use super::shards;
use super::{usage, Job};
use crate::bindings;
use crate::durable::project_hub;
use crate::durable::webhook_shard::{IdsReq, PublishReq, ReleaseReq};
use crate::runtime::now_ms;

/// An event to store and fan out.
pub struct Publish {
    pub project: String,
    pub id: String,
    pub event_type: String,
    pub data: serde_json::Value,
    /// No attempt before this time (epoch ms; `deliver_at`, already bounded).
    pub deliver_at: Option<u64>,
    /// The X-Request-Id of the request that published it (trace).
    pub request_id: String,
    /// A subscription that gets no delivery (the one an operational event is about).
    pub exclude: Option<String>,
    /// Its lane key (`ordering_key`, already validated).
    pub ordering_key: Option<String>,
}

/// What became of one event.
pub enum Outcome {
    /// Stored and its first attempts queued.
    Stored,
    /// The id was stored before; what of it was unsent is sent now.
    Known,
    /// Refused before anything of it was stored (quota, storage full).
    Refused(Problem),
    /// Not stored, or not queued (the outbox keeps it).
    Failed(String),
}

thread_local! {
    /// Delivery ids sent to the queue, per shard, whose outbox marks wait
    /// for that shard's next publish call.
    static SENT: RefCell<HashMap<ShardKey, Vec<String>>> = RefCell::new(HashMap::new());
    /// Keyed deliveries' commits, per project, waiting for that project's
    /// next call to its object (`ordering::committed`).
    static COMMITTED: RefCell<HashMap<String, Vec<Committed>>> = RefCell::new(HashMap::new());
}

/// The event's record with the deliveries its project's object planned.
pub fn plan(cfg: &Config, p: &Publish, deliveries: Vec<NewDelivery>, now: u64) -> NewEvent {
    let payload = events::payload(
        &p.id,
        &p.event_type,
        &events::rfc3339_ms(now),
        &p.data,
        cfg.settings.webhooks.max_payload_bytes as usize,
    );
    NewEvent {
        event: EventRecord {
            id: p.id.clone(),
            event_type: p.event_type.clone(),
            payload: String::from_utf8_lossy(&payload).into_owned(),
            created_at: now,
            request_id: Some(p.request_id.clone()),
            ordering_key: p.ordering_key.clone(),
        },
        deliveries,
        deliver_at: p.deliver_at,
    }
}

/// Stores and sends `events`; each one's own outcome, in order.
pub async fn store(env: &Env, cfg: &Config, events: Vec<Publish>) -> Vec<Outcome> {
    match store_all(env, cfg, &events).await {
        Ok(out) => out,
        Err(e) => events
            .iter()
            .map(|_| Outcome::Failed(e.to_string()))
            .collect(),
    }
}

/// The events grouped by shard, in their order: `(shard, indexes)`.
fn by_shard(cfg: &Config, events: &[Publish], now: u64) -> Vec<(ShardKey, Vec<usize>)> {
    let mut out: Vec<(ShardKey, Vec<usize>)> = Vec::new();
    for (i, p) in events.iter().enumerate() {
        let key = shards::current(cfg, &p.project, now);
        match out.iter_mut().find(|(k, _)| *k == key) {
            Some((_, idx)) => idx.push(i),
            None => out.push((key, vec![i])),
        }
    }
    out
}

async fn store_all(env: &Env, cfg: &Config, events: &[Publish]) -> Result<Vec<Outcome>> {
    let now = now_ms();
    // D1 holds the directory and the subscriptions: at its mark nothing new
    // can be found again, so every publish waits for retention.
    if let Err(problem) = usage::d1_admits(env, cfg, now).await {
        return Ok(events
            .iter()
            .map(|_| Outcome::Refused(problem.clone()))
            .collect());
    }
    let batches = by_shard(cfg, events, now);
    let keys: Vec<ShardKey> = batches.iter().map(|(k, _)| k.clone()).collect();
    directory::enter(env, &keys, shards::bucket_ms(cfg), now).await?;
    let calls = batches
        .into_iter()
        .map(|(key, idx)| commit_shard(env, cfg, key, idx, events, now));
    let answers = futures_util::future::join_all(calls).await;
    let mut out: Vec<Option<Outcome>> = events.iter().map(|_| None).collect();
    let mut to_send: Vec<(ShardKey, usize, Vec<FirstJob>)> = Vec::new();
    for (key, idx, got) in answers {
        match got {
            Ok(Err(problem)) => idx
                .iter()
                .for_each(|i| out[*i] = Some(Outcome::Refused(problem.clone()))),
            Err(e) => idx
                .iter()
                .for_each(|i| out[*i] = Some(Outcome::Failed(e.to_string()))),
            Ok(Ok(stored)) => {
                for (i, s) in idx.into_iter().zip(stored) {
                    match s {
                        Stored::Stored { jobs } => {
                            out[i] = Some(Outcome::Stored);
                            to_send.push((key.clone(), i, jobs));
                        }
                        Stored::Known { jobs } => {
                            out[i] = Some(Outcome::Known);
                            to_send.push((key.clone(), i, jobs));
                        }
                        Stored::Refused { refusal } => {
                            out[i] =
                                Some(Outcome::Refused(refusal.problem(&events[i].project, now)));
                        }
                    }
                }
            }
        }
    }
    for i in send(env, &to_send).await {
        out[i] = Some(Outcome::Failed(
            "the queue refused the event's first attempts; the outbox sends them later".into(),
        ));
    }
    Ok(out
        .into_iter()
        .map(|o| o.unwrap_or_else(|| Outcome::Failed("no answer from its shard".into())))
        .collect())
}

/// One shard's events: their deliveries planned (and keyed ones chained)
/// by the project's object, then stored in the shard in one call; the
/// keyed deliveries' commits are reported with the project's next call.
/// `Ok(Err(_))`: refused for D1's size as the object last saw it.
async fn commit_shard(
    env: &Env,
    cfg: &Config,
    key: ShardKey,
    idx: Vec<usize>,
    events: &[Publish],
    now: u64,
) -> (
    ShardKey,
    Vec<usize>,
    Result<std::result::Result<Vec<Stored>, Problem>>,
) {
    let got = async {
        let prepared = prepare(env, cfg, &key, &idx, events, now).await?;
        let planned: Vec<NewEvent> = idx
            .iter()
            .zip(prepared.deliveries)
            .map(|(i, ds)| plan(cfg, &events[*i], ds, now))
            .collect();
        let keyed = keyed(&planned);
        directory::observe_size(prepared.d1_bytes, prepared.loaded_at);
        if let Err(problem) = usage::d1_admits(env, cfg, now).await {
            report(&key.project, keyed, |_| false);
            return Ok(Err(problem));
        }
        let limits = Limits {
            bytes_elsewhere: prepared.bytes_today,
            ..shards::limits(cfg)
        };
        let sent = SENT
            .with(|s| s.borrow_mut().remove(&key))
            .unwrap_or_default();
        let req = PublishReq {
            sent,
            events: planned,
            limits,
            now,
        };
        let stored = shards::call::<wire::Publish>(env, &key, &req).await;
        if let Ok(stored) = &stored {
            report(&key.project, keyed, |i| {
                matches!(stored.get(i), Some(Stored::Stored { .. }))
            });
        }
        stored.map(Ok)
    }
    .await;
    (key, idx, got)
}

/// Asks the project's object to plan `idx`'s deliveries (with the commits
/// of its earlier keyed deliveries).
async fn prepare(
    env: &Env,
    cfg: &Config,
    key: &ShardKey,
    idx: &[usize],
    events: &[Publish],
    now: u64,
) -> Result<Prepared> {
    let committed = COMMITTED
        .with(|c| c.borrow_mut().remove(&key.project))
        .unwrap_or_default();
    let retention_ms = u64::from(cfg.settings.retention.deliveries_days) * 86_400_000;
    let req = PrepareReq {
        shard: key.clone(),
        drafts: idx
            .iter()
            .map(|i| Draft {
                event_type: events[*i].event_type.clone(),
                ordering_key: events[*i].ordering_key.clone(),
                exclude: events[*i].exclude.clone(),
            })
            .collect(),
        committed: committed.clone(),
        idle_before: now.saturating_sub(retention_ms),
        now,
    };
    let got = project_hub::call::<Prepare>(env, &key.project, &req).await;
    if got.is_err() {
        // Not delivered: they ride with the next call.
        COMMITTED.with(|c| {
            c.borrow_mut()
                .entry(key.project.clone())
                .or_default()
                .extend(committed)
        });
    }
    got
}

/// The keyed deliveries of `planned`: each with its event's index.
fn keyed(planned: &[NewEvent]) -> Vec<(usize, Lane, String)> {
    let mut out = Vec::new();
    for (i, ev) in planned.iter().enumerate() {
        for d in &ev.deliveries {
            if let Some(l) = &d.lane {
                let lane = Lane {
                    subscription_id: d.subscription_id.clone(),
                    ordering_key: l.ordering_key.clone(),
                };
                out.push((i, lane, d.id.clone()));
            }
        }
    }
    out
}

/// Keeps the outcome of each keyed delivery's commit for the project's
/// next call: stored, or certainly not (refused; a known id keeps its
/// first deliveries). An unknown outcome (the call failed) is not reported.
fn report(project: &str, keyed: Vec<(usize, Lane, String)>, stored: impl Fn(usize) -> bool) {
    let out: Vec<Committed> = keyed
        .into_iter()
        .map(|(i, lane, delivery_id)| Committed {
            lane,
            delivery_id,
            stored: stored(i),
        })
        .collect();
    if !out.is_empty() {
        COMMITTED.with(|c| {
            c.borrow_mut()
                .entry(project.to_string())
                .or_default()
                .extend(out)
        });
    }
}

/// Sends the first attempts in `sendBatch`-sized chunks; the events (their
/// index) whose jobs were not all sent (the outbox keeps them). The sent
/// ids wait for their marks.
async fn send(env: &Env, jobs: &[(ShardKey, usize, Vec<FirstJob>)]) -> Vec<usize> {
    let flat: Vec<(&ShardKey, usize, Job)> = jobs
        .iter()
        .flat_map(|(k, i, js)| js.iter().map(move |j| (k, *i, Job::first(&k.project, j))))
        .collect();
    if flat.is_empty() {
        return Vec::new();
    }
    let Ok(queue) = env.queue(bindings::DELIVERIES) else {
        return jobs.iter().map(|(_, i, _)| *i).collect();
    };
    let all: Vec<Job> = flat.iter().map(|(_, _, j)| j.clone()).collect();
    let mut failed = Vec::new();
    let mut stop = false;
    let now = now_ms();
    for range in super::batches(&all) {
        if stop
            || queue
                .send_batch(super::messages(&all[range.clone()], now))
                .await
                .is_err()
        {
            stop = true;
            failed.extend(flat[range].iter().map(|(_, i, _)| *i));
            continue;
        }
        SENT.with(|s| {
            let mut s = s.borrow_mut();
            for (k, _, j) in &flat[range] {
                s.entry((*k).clone())
                    .or_default()
                    .push(j.delivery_id.clone());
            }
        });
    }
    failed.sort_unstable();
    failed.dedup();
    failed
}

/// Whether sent ids wait for their marks.
pub fn marks_pending() -> bool {
    SENT.with(|s| !s.borrow().is_empty())
}

/// Writes the pending outbox marks (one call per shard). Best effort: a
/// lost mark only means the sweep sends the job again.
pub async fn flush_marks(env: &Env) {
    let pending: Vec<(ShardKey, Vec<String>)> = SENT.with(|s| s.borrow_mut().drain().collect());
    let now = now_ms();
    let calls = pending.into_iter().map(|(key, ids)| async move {
        let r = shards::call::<wire::MarkSent>(env, &key, &IdsReq { ids, now }).await;
        if let Err(e) = r {
            log::emit(
                Line::warn("outbox marks lost (the sweep re-sends)")
                    .field("shard", key.name())
                    .err(e),
            );
        }
    });
    futures_util::future::join_all(calls).await;
}

/// Queues `jobs` of `project` (scheduled ones: released, re-planned, swept)
/// and records them sent in their shard.
pub async fn send_and_mark(
    env: &Env,
    key: &ShardKey,
    jobs: &[FirstJob],
    ordered: bool,
) -> Result<()> {
    if jobs.is_empty() {
        return Ok(());
    }
    let all: Vec<Job> = jobs
        .iter()
        .map(|j| Job {
            ordered,
            ..Job::first(&key.project, j)
        })
        .collect();
    super::enqueue(env, all).await?;
    let ids = jobs.iter().map(|j| j.delivery_id.clone()).collect();
    shards::call::<wire::MarkSent>(env, key, &IdsReq { ids, now: now_ms() }).await?;
    Ok(())
}

/// Releases `subscription_id`'s held deliveries in one shard, queued in
/// creation order, 100 at a time.
pub async fn release_in(env: &Env, key: &ShardKey, subscription_id: &str, now: u64) -> Result<u32> {
    let mut n = 0u32;
    loop {
        let req = ReleaseReq {
            subscription_id: subscription_id.to_string(),
            limit: 100,
            now,
        };
        let jobs: Vec<FirstJob> = shards::call::<wire::Release>(env, key, &req).await?;
        send_and_mark(env, key, &jobs, true).await?;
        n += u32::try_from(jobs.len()).unwrap_or(u32::MAX);
        if jobs.len() < 100 {
            return Ok(n);
        }
    }
}

/// Every shard of `project` releases `subscription_id`'s held deliveries
/// (legacy ones are moved into their shard first): resume.
pub async fn release_held(
    env: &Env,
    cfg: &Config,
    project: &str,
    subscription_id: &str,
) -> Result<u32> {
    let now = now_ms();
    loop {
        let legacy = directory::legacy::held(env, subscription_id, 50).await?;
        if legacy.is_empty() {
            break;
        }
        for r in legacy {
            shards::adopt(env, cfg, &r.project, &r.event_id, now).await?;
        }
    }
    let mut shards_of = directory::shards_of(env, project).await?;
    // Creation order across shards too.
    shards_of.sort_unstable();
    let mut n = 0;
    for (start_ms, _) in shards_of {
        let key = ShardKey {
            project: project.to_string(),
            start_ms,
        };
        n += release_in(env, &key, subscription_id, now).await?;
    }
    Ok(n)
}
