//! The delivery consumer: one message = one delivery job. It only does I/O; the
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
use postguard_core::webhooks::protocol as wire;
use postguard_core::webhooks::records::{
    self, AttemptRecord, ClaimJob, Claimed, DeliveryRecord, FirstJob, SubView,
};
use postguard_core::webhooks::retry::AttemptResult;
use postguard_core::webhooks::shard::ShardKey;
use postguard_core::webhooks::{ops, pacing};
use serde::Deserialize;
use worker::{Env, MessageBuilder, MessageExt, Result};

use super::directory::{self, Target};
use super::sender::{self, Outgoing, Secrets};
use super::{health, shards};
use super::{write, Job, Msg};
mod attempt;
mod claim;

use attempt::run_all;
use claim::{claim_all, pace, throttle};

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

/// Handles the delivery jobs of one batch of `postguard-deliveries` or its
/// dead-letter queue (`queue.rs` hands them over; other kinds of message
/// have their own handlers).
pub async fn handle(messages: Vec<Msg>, from_dlq: bool, env: &Env, cfg: &Config) -> Result<()> {
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
    let due = pace(due, &targets, &mut later);
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
