//! The queue consumer: one message = one delivery job. It only does I/O; the
//! decisions are `postguard_core::webhooks::delivery`, applied to the
//! records by `postguard_core::webhooks::records` inside each delivery's
//! shard (ADR 0009, ADR 0035):
//! read the batch's subscriptions (one D1 query) → claim in each shard
//! ([`records::claim`]: plan, then the claim or the hold, atomically; one
//! call per shard, in parallel) → throttle → sign and send → enqueue the
//! follow-up → record and settle in each shard ([`records::settle`], one
//! call per shard) → the subscriptions' health (D1, only when it changes).
//! Messages that fail unexpectedly are retried by the queue and end in the
//! dead-letter queue, whose jobs take the same path and dead-letter the
//! delivery.
//!
//! A message of the deployment before the shards names no project: its
//! delivery is a legacy D1 row, moved into its shard first (`shards::adopt`).

use crate::log;
use postguard_core::config::Config;
use postguard_core::ids;
use postguard_core::log::Line;
use postguard_core::webhooks::delivery::{
    self, Attempted, Claim, FollowUp, Place, CONTENDED_DELAY_S,
};
use postguard_core::webhooks::ops::{self, Health};
use postguard_core::webhooks::protocol as wire;
use postguard_core::webhooks::records::{
    self, AttemptRecord, ClaimJob, Claimed, DeliveryRecord, FirstJob, SubView,
};
use postguard_core::webhooks::retry::AttemptResult;
use postguard_core::webhooks::shard::ShardKey;
use serde::Deserialize;
use worker::{Env, MessageBuilder, MessageExt, Result};

use super::directory::{self, Target};
use super::sender::{self, Outgoing, Secrets};
use super::shards;
use super::{write, Job, Msg};
use crate::bindings;
use crate::durable::webhook_shard::{ClaimReq, SettleReq, UnclaimReq};
use crate::runtime::{new_ulid_parts, now_ms};

/// A job the shard claimed, with what its attempt needs.
struct Run<'a> {
    m: &'a Msg,
    job: Job,
    shard: ShardKey,
    target: Option<&'a Target>,
    claim: Claim,
    gave_up: Option<delivery::GiveUp>,
    delivery: DeliveryRecord,
    payload: String,
    /// Throttled: wait this long in place before sending.
    sleep_ms: u64,
}

type Later<'a> = (&'a Msg, Job, u64);

/// Handles one batch of `postguard-deliveries` or its dead-letter queue.
pub async fn handle(
    batch: worker::MessageBatch<serde_json::Value>,
    env: &Env,
    cfg: &Config,
) -> Result<()> {
    let from_dlq = batch.queue() == bindings::DELIVERIES_DLQ;
    let messages = batch.messages()?;
    let (exports, messages): (Vec<_>, Vec<_>) = messages
        .into_iter()
        .partition(crate::archive::exports::is_step);
    for m in &exports {
        crate::archive::exports::run_message(env, m, from_dlq).await;
    }
    let (tasks, messages): (Vec<_>, Vec<_>) = messages
        .into_iter()
        .partition(|m| m.body().get("task_id").is_some());
    for m in &tasks {
        super::ops::run_task_message(env, cfg, m, from_dlq).await;
    }
    let (due, mut later) = sort(&messages, from_dlq);
    let due = resolve_legacy(env, cfg, due).await;
    let sub_ids: Vec<&str> = due
        .iter()
        .filter_map(|(_, j, _, _)| j.subscription_id.as_deref())
        .collect();
    let targets = match directory::targets(env, &sub_ids).await {
        Ok(t) => t,
        Err(e) => {
            retry_all("loading", due.iter().map(|d| d.0), &e);
            hop(env, later).await;
            return Ok(());
        }
    };
    let due = match throttle(env, due, &targets, &mut later).await {
        Ok(d) => d,
        Err((e, d)) => {
            retry_all("throttling", d.iter().map(|d| d.0), &e);
            hop(env, later).await;
            return Ok(());
        }
    };
    let runs = claim_all(env, cfg, due, &targets, &mut later).await;
    hop(env, later).await;
    run_all(env, cfg, &runs).await;
    Ok(())
}

/// A job to run now: its message, the job and what it asks for, and how
/// long it waits in place for its throttle slot.
type Due<'a> = (&'a Msg, Job, delivery::Job, u64);

/// The batch's jobs to run now, and those to send again later, as
/// `delivery::place_batch` places them (a malformed message and a copy of
/// a running job are acknowledged).
fn sort(messages: &[Msg], from_dlq: bool) -> (Vec<Due<'_>>, Vec<Later<'_>>) {
    let parsed: Vec<(&Msg, Job, delivery::Job)> = messages
        .iter()
        .filter_map(|m| match parse(m, from_dlq) {
            Some((job, kind)) => Some((m, job, kind)),
            None => {
                m.ack();
                None
            }
        })
        .collect();
    let jobs: Vec<&Job> = parsed.iter().map(|p| &p.1).collect();
    let places = delivery::place_batch(&jobs, |j| &j.delivery_id, |j| j.manual);
    let mut due: Vec<Due> = Vec::new();
    let mut later = Vec::new();
    for ((m, job, kind), place) in parsed.into_iter().zip(places) {
        match place {
            Place::Run => due.push((m, job, kind, 0)),
            Place::Later => later.push((m, job, CONTENDED_DELAY_S)),
            Place::Copy => m.ack(),
        }
    }
    (due, later)
}

/// Jobs of legacy deliveries (no project in the message): their event is
/// moved into its shard, and the job goes on with its project and
/// subscription. One gone from D1 and from every shard is acknowledged.
async fn resolve_legacy<'a>(env: &Env, cfg: &Config, due: Vec<Due<'a>>) -> Vec<Due<'a>> {
    let mut out = Vec::with_capacity(due.len());
    for (m, mut job, kind, wait) in due {
        if job.project.is_some() && job.subscription_id.is_some() {
            out.push((m, job, kind, wait));
            continue;
        }
        match directory::legacy::find(env, &job.delivery_id).await {
            Ok(Some(r)) => match shards::adopt(env, cfg, &r.project, &r.event_id, now_ms()).await {
                Ok(_) => {
                    job.project = Some(r.project);
                    job.subscription_id = r.subscription_id;
                    out.push((m, job, kind, wait));
                }
                Err(e) => retry_all("moving a legacy delivery", [m], &e),
            },
            // Gone (retention), or moved with its message still on the way
            // without a project: the daily re-queue re-plans it in its shard.
            Ok(None) => m.ack(),
            Err(e) => retry_all("reading a legacy delivery", [m], &e),
        }
    }
    out
}

/// One job on its way to its shard's claim.
struct Pending<'a> {
    m: &'a Msg,
    job: Job,
    sleep_ms: u64,
    target: Option<&'a Target>,
    candidates: Vec<ShardKey>,
    req: ClaimJob,
}

/// Claims every job in its shard (one call per shard, in parallel; a job
/// whose delivery is not in the shard its id names is tried in the next
/// candidate, then moved from D1). Acknowledges what has nothing to do.
async fn claim_all<'a>(
    env: &Env,
    cfg: &Config,
    due: Vec<Due<'a>>,
    targets: &'a [Target],
    later: &mut Vec<Later<'a>>,
) -> Vec<Run<'a>> {
    let mut pending: Vec<Pending<'a>> = Vec::new();
    for (m, job, kind, sleep_ms) in due {
        let target = job
            .subscription_id
            .as_deref()
            .and_then(|s| targets.iter().find(|t| t.id == s));
        // Its key was revoked: nothing is sent (a redirect included); the
        // delivery stays as it is, and the re-queue skips it too.
        if target.is_some_and(|t| t.key_revoked_at.is_some()) {
            m.ack();
            continue;
        }
        let project = job.project.clone().unwrap_or_default();
        let sub = SubView {
            subscribed: target.is_some(),
            held: target.is_some_and(Target::holds),
        };
        let req = ClaimJob {
            delivery_id: job.delivery_id.clone(),
            job: kind.into(),
            sub,
        };
        let candidates = shards::candidates(cfg, &project, &job.delivery_id);
        pending.push(Pending {
            m,
            job,
            sleep_ms,
            target,
            candidates,
            req,
        });
    }
    let mut runs = Vec::new();
    let mut held: Vec<(ShardKey, String)> = Vec::new();
    let lease_ms = delivery::attempt_lease_ms(cfg.settings.webhooks.timeout_ms);
    for round in 0..2 {
        if pending.is_empty() {
            break;
        }
        let mut missing = Vec::new();
        for (p, shard, answer) in claim_round(env, pending, round, lease_ms).await {
            match answer {
                Err(e) => retry_all("claiming", [p.m], &e),
                Ok(Claimed::Send {
                    claim,
                    gave_up,
                    delivery,
                    payload,
                }) => runs.push(Run {
                    m: p.m,
                    job: p.job,
                    shard,
                    target: p.target,
                    claim: claim.into(),
                    gave_up: gave_up.map(Into::into),
                    delivery: *delivery,
                    payload,
                    sleep_ms: p.sleep_ms,
                }),
                Ok(Claimed::Wait { delay_s }) => later.push((p.m, p.job, delay_s)),
                Ok(Claimed::Held) => {
                    if let Some(t) = p.target {
                        held.push((shard, t.id.clone()));
                    }
                    p.m.ack();
                }
                Ok(Claimed::Dropped) => p.m.ack(),
                Ok(Claimed::Missing) if round + 1 < p.candidates.len() => missing.push(p),
                Ok(Claimed::Missing) => adopt_then_retry(env, cfg, p, later).await,
            }
        }
        pending = missing;
    }
    recheck_holds(env, held).await;
    runs
}

/// One round of claims: each job in its `round`-th candidate shard.
async fn claim_round<'a>(
    env: &Env,
    pending: Vec<Pending<'a>>,
    round: usize,
    lease_ms: u64,
) -> Vec<(Pending<'a>, ShardKey, Result<Claimed>)> {
    let now = now_ms();
    let mut by_shard: Vec<(ShardKey, Vec<Pending<'a>>)> = Vec::new();
    let mut orphans = Vec::new();
    for p in pending {
        let Some(key) = p.candidates.get(round).cloned() else {
            orphans.push(p);
            continue;
        };
        match by_shard.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(p),
            None => by_shard.push((key, vec![p])),
        }
    }
    let calls = by_shard.into_iter().map(|(key, ps)| async move {
        let req = ClaimReq {
            jobs: ps.iter().map(|p| p.req.clone()).collect(),
            now,
            lease_ms,
        };
        let got: Result<Vec<Claimed>> = shards::call::<wire::ClaimAttempts>(env, &key, &req).await;
        (key, ps, got)
    });
    let mut out = Vec::new();
    for (key, ps, got) in futures_util::future::join_all(calls).await {
        match got {
            Ok(answers) => {
                let mut answers = answers.into_iter();
                for p in ps {
                    let a = answers.next().unwrap_or(Claimed::Missing);
                    out.push((p, key.clone(), Ok(a)));
                }
            }
            Err(e) => {
                for p in ps {
                    out.push((p, key.clone(), Err(worker::Error::RustError(e.to_string()))));
                }
            }
        }
    }
    for p in orphans {
        p.m.ack();
    }
    out
}

/// A delivery in none of the shards its id names: a legacy row moved into
/// its shard now, its job run again a second later; gone (retention): acked.
async fn adopt_then_retry<'a>(env: &Env, cfg: &Config, p: Pending<'a>, later: &mut Vec<Later<'a>>) {
    match directory::legacy::find(env, &p.job.delivery_id).await {
        Ok(Some(r)) => match shards::adopt(env, cfg, &r.project, &r.event_id, now_ms()).await {
            Ok(_) => later.push((p.m, p.job, CONTENDED_DELAY_S)),
            Err(e) => retry_all("moving a legacy delivery", [p.m], &e),
        },
        Ok(None) => p.m.ack(),
        Err(e) => retry_all("reading a legacy delivery", [p.m], &e),
    }
}

/// A hold races a resume: the subscription was read held, then resumed and
/// released before the hold was written. Read again after the holds; what
/// is active by now is released here (the shard's release is a
/// compare-and-set on `paused`, so a release by the resume as well is
/// harmless).
async fn recheck_holds(env: &Env, mut held: Vec<(ShardKey, String)>) {
    held.sort();
    held.dedup();
    if held.is_empty() {
        return;
    }
    let ids: Vec<&str> = held.iter().map(|(_, s)| s.as_str()).collect();
    let Ok(now_targets) = directory::targets(env, &ids).await else {
        return;
    };
    for (key, sub) in &held {
        let active = now_targets.iter().any(|t| t.id == *sub && !t.holds());
        if active {
            if let Err(e) = write::release_in(env, key, sub, now_ms()).await {
                log::emit(Line::error("releasing a hold after a resume failed").err(e));
            }
        }
    }
}

/// The per-subscription throttle (`rate_limit_per_s`), before the claim:
/// each job to a throttled subscription reserves the next slot (one D1
/// `batch()` for the batch's unreserved ones; none when nothing is
/// throttled), slots one [`ops::interval_ms`] apart. Whole seconds of
/// waiting go back to the queue with the slot kept, so the consumer is free
/// for every other delivery; the rest (under a second) is waited in place
/// before sending; a job back too late for its slot reserves again
/// ([`ops::Wait::Stale`]), so no one-second span holds more than the rate.
async fn throttle<'a>(
    env: &Env,
    due: Vec<Due<'a>>,
    targets: &[Target],
    later: &mut Vec<Later<'a>>,
) -> std::result::Result<Vec<Due<'a>>, (worker::Error, Vec<Due<'a>>)> {
    let rate = |j: &Job| {
        let t = targets
            .iter()
            .find(|t| Some(&t.id) == j.subscription_id.as_ref())?;
        t.rate_limit_per_s
            .filter(|_| j.redirect_url.is_none())
            .map(|r| (t.id.clone(), r))
    };
    let now = now_ms();
    let fresh = |j: &Job| {
        j.slot
            .is_some_and(|s| ops::throttle_wait(s, now) != ops::Wait::Stale)
    };
    let wanted: Vec<(usize, (String, u32))> = due
        .iter()
        .enumerate()
        .filter(|(_, d)| !fresh(&d.1))
        .filter_map(|(i, d)| rate(&d.1).map(|r| (i, r)))
        .collect();
    let mut slots: Vec<Option<u64>> = due
        .iter()
        .map(|d| d.1.slot.filter(|_| fresh(&d.1)))
        .collect();
    if !wanted.is_empty() {
        let subs: Vec<(String, u32)> = wanted.iter().map(|(_, r)| r.clone()).collect();
        match directory::reserve(env, &subs, now).await {
            Ok(got) => wanted.iter().zip(got).for_each(|((i, _), s)| slots[*i] = s),
            Err(e) => return Err((e, due)),
        }
    }
    let now = now_ms();
    let mut out = Vec::new();
    for (mut d, slot) in due.into_iter().zip(slots) {
        match slot
            .filter(|_| rate(&d.1).is_some())
            .map(|s| (s, ops::throttle_wait(s, now)))
        {
            Some((s, ops::Wait::Hop { delay_s })) => {
                d.1.slot = Some(s);
                later.push((d.0, d.1, delay_s));
            }
            Some((s, ops::Wait::Sleep { ms })) => {
                d.1.slot = Some(s);
                d.3 = ms;
                out.push(d);
            }
            // Reserved just now, so not stale; sent at once if it were.
            Some((_, ops::Wait::Stale)) | None => out.push(d),
        }
    }
    Ok(out)
}

/// Runs the claimed attempts at once, records and settles them in their
/// shards, then acknowledges them.
async fn run_all(env: &Env, cfg: &Config, runs: &[Run<'_>]) {
    // Released (ordered) jobs of one subscription run one after another, in
    // the batch's order; everything else at once.
    let mut groups: Vec<Vec<&Run>> = Vec::new();
    for r in runs {
        let same = |g: &&mut Vec<&Run>| {
            g.first().is_some_and(|f| {
                r.job.ordered
                    && f.job.ordered
                    && f.delivery.subscription_id == r.delivery.subscription_id
            })
        };
        match groups.iter_mut().find(|g| same(g)) {
            Some(g) => g.push(r),
            None => groups.push(vec![r]),
        }
    }
    let work = groups.into_iter().map(|g| async move {
        let mut out = Vec::with_capacity(g.len());
        for r in g {
            out.push((r, attempt(env, cfg, r).await));
        }
        out
    });
    let outcomes: Vec<_> = futures_util::future::join_all(work)
        .await
        .into_iter()
        .flatten()
        .collect();
    let mut done: Vec<(&Run, Recorded)> = Vec::new();
    for (r, outcome) in outcomes {
        match outcome {
            Ok(rec) => done.push((r, rec)),
            Err(Failed::NotSent(e)) => {
                unclaim(env, r).await;
                retry_all("an attempt", [r.m], &e);
            }
            Err(Failed::AfterSend(e)) => retry_all("an attempt", [r.m], &e),
        }
    }
    let settled = settle_all(env, cfg, &done).await;
    let mut healthy = Vec::new();
    for ((r, rec), ok) in done.iter().zip(settled) {
        match ok {
            Ok(()) => {
                r.m.ack();
                healthy.push(rec);
            }
            // The request was sent: retrying repeats it under a new number
            // (at-least-once), which beats losing its outcome.
            Err(e) => retry_all("recording", [r.m], &e),
        }
    }
    if let Err(e) = health_all(env, cfg, &healthy).await {
        log::emit(Line::error("updating subscription health failed").err(e));
    }
}

/// An attempt to record, and what the subscription's health needs.
struct Recorded {
    settle: records::Settle,
    project: String,
    subscription_id: String,
    sub_url: Option<String>,
    failing_since: Option<u64>,
    result: Attempted,
    redirect: bool,
    follow_up: Option<FollowUp>,
}

/// Records and settles every attempt in its shard (one call per shard, in
/// parallel); a follow-up the shard settled differently from the one sent
/// before (another attempt moved the delivery) is queued too.
async fn settle_all(env: &Env, cfg: &Config, done: &[(&Run<'_>, Recorded)]) -> Vec<Result<()>> {
    let mut by_shard: Vec<(ShardKey, Vec<usize>)> = Vec::new();
    for (i, (r, _)) in done.iter().enumerate() {
        match by_shard.iter_mut().find(|(k, _)| *k == r.shard) {
            Some((_, v)) => v.push(i),
            None => by_shard.push((r.shard.clone(), vec![i])),
        }
    }
    let schedule = cfg.settings.webhooks.schedule_s.clone();
    let now = now_ms();
    let calls = by_shard.into_iter().map(|(key, idx)| {
        let schedule = schedule.clone();
        async move {
            let req = SettleReq {
                attempts: idx.iter().map(|i| done[*i].1.settle.clone()).collect(),
                schedule,
                now,
            };
            let got: Result<Vec<Option<(u64, u64)>>> =
                shards::call::<wire::SettleAttempts>(env, &key, &req).await;
            (idx, got)
        }
    });
    let mut out: Vec<Result<()>> = done.iter().map(|_| Ok(())).collect();
    for (idx, got) in futures_util::future::join_all(calls).await {
        match got {
            Ok(follow) => {
                for (i, f) in idx.into_iter().zip(follow) {
                    let sent = done[i].1.follow_up.map(|f| f.at);
                    if let Some((at, delay_s)) = f.filter(|(at, _)| Some(*at) != sent) {
                        let job = Job::first(
                            &done[i].0.shard.project,
                            &FirstJob {
                                delivery_id: done[i].0.delivery.id.clone(),
                                subscription_id: done[i].0.delivery.subscription_id.clone(),
                                at,
                            },
                        );
                        out[i] = send_later(env, job, delay_s).await;
                    }
                }
            }
            Err(e) => {
                for i in idx {
                    out[i] = Err(worker::Error::RustError(e.to_string()));
                }
            }
        }
    }
    out
}

/// Hands messages back to the queue after a failure of `what`.
/// Gives back the claim of an attempt that was not sent (`records::unclaim`):
/// its job, handed over again by the queue, claims the next attempt at once
/// instead of waiting for the lease. A failure is logged: the job then waits.
async fn unclaim(env: &Env, r: &Run<'_>) {
    let req = UnclaimReq {
        delivery_id: r.delivery.id.clone(),
        attempt: r.claim.attempt.number,
        now: now_ms(),
    };
    let got: Result<bool> = shards::call::<wire::Unclaim>(env, &r.shard, &req).await;
    if let Err(e) = got {
        log::emit(Line::warn("giving back an unsent attempt's claim failed").err(e));
    }
}

fn retry_all<'a>(what: &str, messages: impl IntoIterator<Item = &'a Msg>, e: &worker::Error) {
    let mut n = 0;
    for m in messages {
        m.retry();
        n += 1;
    }
    log::emit(
        Line::error("a consumer step failed: the queue will retry its messages")
            .field("step", what)
            .field("messages", n)
            .err(e),
    );
}

/// A message's job and what it asks for; `None` (logged) when malformed or
/// when it asks for nothing.
fn parse(m: &Msg, from_dlq: bool) -> Option<(Job, delivery::Job)> {
    // Read from the parsed body in place (no copy of it per message).
    let job = Job::deserialize(m.body())
        .map_err(|e| log::emit(Line::error("dropping a malformed delivery message").err(e)))
        .ok()?;
    let redirect = job.redirect_url.is_some();
    let kind = delivery::Job::from_message(job.not_before, job.manual, redirect, from_dlq)?;
    Some((job, kind))
}

/// Sends each job again after its delay (a queue hop), then acknowledges it.
async fn hop(env: &Env, later: Vec<Later<'_>>) {
    let hops = later.into_iter().map(|(m, job, delay_s)| async move {
        match send_later(env, job, delay_s).await {
            Ok(()) => m.ack(),
            Err(e) => retry_all("re-sending a job", [m], &e),
        }
    });
    futures_util::future::join_all(hops).await;
}

pub async fn send_later(env: &Env, job: Job, delay_s: u64) -> Result<()> {
    let delay = u32::try_from(delay_s).unwrap_or(u32::MAX);
    env.queue(bindings::DELIVERIES)?
        .send(MessageBuilder::new(job).delay_seconds(delay).build())
        .await
}

fn ids_now() -> String {
    let (now, rnd) = new_ulid_parts();
    ids::request_id(now, rnd)
}

/// Why an attempt ended in the gateway rather than at the receiver.
enum Failed {
    /// Before anything was sent (the request could not be signed): its
    /// claim is given back before the queue hands the job over again.
    NotSent(worker::Error),
    /// After the receiver's answer (recording or scheduling it failed).
    AfterSend(worker::Error),
}

/// One claimed attempt: sent (or given up), its follow-up computed on the
/// delivery as claimed and enqueued before the attempt is recorded (a crash
/// in between repeats an attempt rather than losing the delivery).
async fn attempt(env: &Env, cfg: &Config, r: &Run<'_>) -> std::result::Result<Recorded, Failed> {
    let started = now_ms();
    let request_id = ids_now();
    // The subscription's URL as it is now (PATCH may have changed it).
    let url = r
        .job
        .redirect_url
        .as_deref()
        .or(r.target.map(|t| t.url.as_str()))
        .unwrap_or(&r.delivery.url)
        .to_string();
    let number = r.claim.attempt.number;
    let (result, error, excerpt, signed, response_headers) = match (r.gave_up, r.target) {
        (Some(_), _) | (None, None) => {
            let why = r.gave_up.unwrap_or(delivery::GiveUp::SubscriptionDeleted);
            let reason = Some(why.reason().to_string());
            (Attempted::GaveUp(why), reason, None, None, None)
        }
        (None, Some(t)) => {
            if r.sleep_ms > 0 {
                worker::Delay::from(std::time::Duration::from_millis(r.sleep_ms)).await;
            }
            let out = Outgoing {
                event_id: &r.delivery.event_id,
                event_type: &r.delivery.event_type,
                payload: r.payload.as_bytes(),
                secrets: Secrets {
                    secret: Some(&t.secret),
                    previous: t.previous_secret.as_deref(),
                    previous_until: t.previous_secret_until,
                },
            };
            let sent = sender::sign_and_send(cfg, &out, &url, number, &request_id, now_ms())
                .await
                .map_err(Failed::NotSent)?;
            let s = sent.signed;
            (
                Attempted::Sent(sent.result),
                sent.error,
                sent.excerpt,
                s,
                sent.response_headers,
            )
        }
    };
    let done = now_ms();
    let sub = SubView {
        subscribed: r.target.is_some(),
        held: r.target.is_some_and(Target::holds),
    };
    let seen = r.claim.claimed(&r.delivery.snapshot(sub));
    let schedule = &cfg.settings.webhooks.schedule_s;
    let transition = delivery::settle(&seen, &r.claim.attempt, &result, schedule, done);
    if let Some(f) = transition.follow_up {
        let job = Job::first(
            &r.shard.project,
            &FirstJob {
                delivery_id: r.delivery.id.clone(),
                subscription_id: r.delivery.subscription_id.clone(),
                at: f.at,
            },
        );
        send_later(env, job, f.delay_s)
            .await
            .map_err(Failed::AfterSend)?;
    }
    let status_code = match &result {
        Attempted::Sent(AttemptResult::Status { code, .. }) => Some(*code),
        _ => None,
    };
    record_metrics(env, r, &transition, status_code, started, done);
    let row = AttemptRecord {
        delivery_id: r.delivery.id.clone(),
        request_id,
        attempt: number,
        url,
        status_code,
        error,
        response_excerpt: excerpt,
        duration_ms: done - started,
        at: started,
        next_retry_at: None,
        signed,
        response_headers,
    };
    Ok(Recorded {
        settle: records::Settle {
            claim: r.claim.into(),
            result: result.clone().into(),
            row,
            sub,
        },
        project: r.shard.project.clone(),
        subscription_id: r.delivery.subscription_id.clone(),
        sub_url: r.target.map(|t| t.url.clone()),
        failing_since: r.target.and_then(|t| t.failing_since),
        result,
        redirect: r.claim.attempt.mode == delivery::Mode::Redirect,
        follow_up: transition.follow_up,
    })
}

/// The attempt's data point (docs/observability.md).
fn record_metrics(
    env: &Env,
    r: &Run<'_>,
    transition: &delivery::Transition,
    status: Option<u16>,
    started: u64,
    done: u64,
) {
    use postguard_core::metrics::{attempt_lag_ms, attempt_outcome, attempt_point, AttemptFacts};
    let dead = transition
        .write
        .is_some_and(|w| w.status == delivery::Status::DeadLetter);
    let point = attempt_point(&AttemptFacts {
        project: &r.shard.project,
        subscription: &r.delivery.subscription_id,
        event_type: &r.delivery.event_type,
        outcome: attempt_outcome(status, r.gave_up.is_some(), dead),
        status: status.unwrap_or(0),
        attempt: r.claim.attempt.number,
        latency_ms: done.saturating_sub(started),
        lag_ms: attempt_lag_ms(r.job.not_before, r.delivery.created_at, started),
    });
    crate::metrics::write(env, &point);
}

/// The failure clock of each attempted subscription (a redirect says nothing
/// about it): a success resets it, a failure starts it, and 410 or failing
/// for `webhooks.disable_after_s` disables the subscription — its pending
/// deliveries are then held — and publishes `postguard.subscription.disabled`
/// to the project's other matching subscriptions. A healthy subscription
/// costs no write.
async fn health_all(env: &Env, cfg: &Config, records: &[&Recorded]) -> Result<()> {
    let after_s = cfg.settings.webhooks.disable_after_s;
    let now = now_ms();
    let mut changes = Vec::new();
    for r in records {
        if r.redirect || r.sub_url.is_none() {
            continue;
        }
        if let Some(h) = ops::health_change(r.failing_since, &r.result, now, after_s) {
            changes.push((*r, h));
        }
    }
    let list: Vec<(&str, &str, Health)> = changes
        .iter()
        .map(|(r, h)| (r.subscription_id.as_str(), r.project.as_str(), *h))
        .collect();
    let applied = directory::health(env, &list, now).await?;
    for ((r, h), ok) in changes.iter().zip(applied) {
        if let (Health::Disable { reason, .. }, true) = (h, ok) {
            announce_disabled(env, cfg, r, reason.as_str(), now).await?;
        }
    }
    Ok(())
}

/// Publishes `postguard.subscription.disabled` {id, url, reason, since}
/// through the one write path.
async fn announce_disabled(
    env: &Env,
    cfg: &Config,
    r: &Recorded,
    reason: &str,
    at: u64,
) -> Result<()> {
    let data = serde_json::json!({
        "id": r.subscription_id,
        "url": r.sub_url,
        "reason": reason,
        "since": postguard_core::webhooks::events::rfc3339_ms(at),
    });
    let event = write::Publish {
        project: r.project.clone(),
        id: super::new_id("evt_"),
        event_type: ops::DISABLED_EVENT.to_string(),
        data,
        request_id: r.settle.row.request_id.clone(),
        exclude: Some(r.subscription_id.clone()),
    };
    for outcome in write::store(env, cfg, vec![event]).await {
        if let write::Outcome::Failed(why) = outcome {
            return Err(worker::Error::RustError(why));
        }
    }
    Ok(())
}

/// Cron safety net: deliveries whose next attempt is overdue by
/// `webhooks.requeue_after_s` (a lost message, a failed enqueue) are
/// re-planned due now in their shard and queued again; legacy ones are
/// moved into their shard first.
pub async fn requeue_stuck(env: &Env, cfg: &Config, after_s: u32) -> Result<u32> {
    let now = now_ms();
    let before = now.saturating_sub(u64::from(after_s) * 1_000);
    for r in directory::legacy::overdue(env, before, 500).await? {
        shards::adopt(env, cfg, &r.project, &r.event_id, now).await?;
    }
    let oldest =
        postguard_core::audit::retention_cutoff_ms(now, cfg.settings.retention.deliveries_days);
    let mut n = 0u32;
    for key in directory::shards_since(env, oldest, u32::MAX).await? {
        let req = crate::durable::webhook_shard::BeforeReq {
            before,
            limit: 500,
            now,
            oldest_day: postguard_core::webhooks::capacity::utc_day(now)
                .saturating_sub(u64::from(cfg.settings.retention.deliveries_days)),
        };
        let jobs: Vec<FirstJob> = shards::call::<wire::Requeue>(env, &key, &req).await?;
        // A revoked key's subscriptions receive nothing: the consumer acks them.
        write::send_and_mark(env, &key, &jobs, false).await?;
        n += u32::try_from(jobs.len()).unwrap_or(u32::MAX);
    }
    Ok(n)
}
