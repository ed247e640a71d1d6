//! The consumer's claim phase: each due job claimed in its delivery's shard
//! (one call per shard, in parallel; a legacy delivery adopted first), holds
//! rechecked, and the per-subscription throttle's slots reserved.

use super::*;
use crate::durable::webhook_shard::IdsReq;
use postguard_core::webhooks::hub::{ReservationOf, ReservationReq};
use postguard_core::webhooks::ordering;
use postguard_core::webhooks::records::PredRead;

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
pub(super) async fn claim_all<'a>(
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
            predecessor: None,
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
    let mut reads: Vec<(Pending<'a>, ShardKey, String, String)> = Vec::new();
    // Two rounds over the candidate shards, then one for the jobs whose
    // lane predecessor had to be read elsewhere first.
    for round in 0..3 {
        if round == 2 {
            pending = read_predecessors(env, reads.drain(..)).await;
        }
        if pending.is_empty() {
            continue;
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
                Ok(Claimed::Wait { delay_s } | Claimed::Blocked { delay_s, .. }) => {
                    later.push((p.m, p.job, delay_s))
                }
                Ok(Claimed::Read { .. }) if round == 2 => {
                    later.push((p.m, p.job, ordering::RECHECK_S))
                }
                Ok(Claimed::Read {
                    predecessor,
                    ordering_key,
                }) => reads.push((p, shard, predecessor, ordering_key)),
                Ok(Claimed::Held) => {
                    if let Some(t) = p.target {
                        held.push((shard, t.id.clone()));
                    }
                    p.m.ack();
                }
                Ok(Claimed::Dropped) => p.m.ack(),
                Ok(Claimed::Missing) if round == 0 && p.candidates.len() > 1 => missing.push(p),
                Ok(Claimed::Missing) => adopt_then_retry(env, cfg, p, later).await,
            }
        }
        pending = missing;
    }
    recheck_holds(env, held).await;
    runs
}

/// The lane predecessors the shards could not read (ADR 0043): each in the
/// shard its id names (one `Peek` per shard), and one not there in the
/// project's object (its reservation). The jobs go back to their own shard
/// with what was read; a read that failed leaves the job to wait its
/// recheck.
async fn read_predecessors<'a>(
    env: &Env,
    reads: impl Iterator<Item = (Pending<'a>, ShardKey, String, String)>,
) -> Vec<Pending<'a>> {
    let mut out = Vec::new();
    for (mut p, shard, id, key) in reads {
        let read_at = now_ms();
        let found = match ordering::predecessor_shard(&shard.project, &id) {
            Some(at) => shards::call::<wire::Peek>(
                env,
                &at,
                &IdsReq {
                    ids: vec![id.clone()],
                    now: read_at,
                },
            )
            .await
            .map(|mut v| v.pop().flatten()),
            None => Ok(None),
        };
        let read = match found {
            Ok(Some(view)) => Ok(ordering::Predecessor::Found(view)),
            Ok(None) => reservation(env, &shard.project, &p, &id, key)
                .await
                .map(|reservation| ordering::Predecessor::Missing {
                    read_at,
                    reservation,
                }),
            Err(e) => Err(e),
        };
        match read {
            Ok(read) => p.req.predecessor = Some(PredRead { id, read }),
            Err(e) => log::emit(Line::warn("reading a lane predecessor failed").err(e)),
        }
        p.candidates = vec![shard];
        out.push(p);
    }
    out
}

/// A missing predecessor's reservation in the project's object.
async fn reservation(
    env: &Env,
    project: &str,
    p: &Pending<'_>,
    id: &str,
    ordering_key: String,
) -> Result<Option<ordering::Reservation>> {
    let req = ReservationReq {
        lane: ordering::Lane {
            subscription_id: p.job.subscription_id.clone().unwrap_or_default(),
            ordering_key,
        },
        delivery_id: id.to_string(),
    };
    crate::durable::project_hub::call::<ReservationOf>(env, project, &req).await
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
        // Round 2 is the reads' (`read_predecessors`): one shard each.
        let at = if round == 2 { 0 } else { round };
        let Some(key) = p.candidates.get(at).cloned() else {
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

/// Receivers that say how fast (`pacing`), before the throttle and the
/// claim: each paced job takes one of what its subscription's receiver
/// last advertised (`pacing::spend`, counted down through the batch in its
/// order); one that finds none left until the advertised reset goes back
/// to the queue with the delay to it — a wait, not an attempt: nothing is
/// claimed, no attempt number used, nothing recorded.
pub(super) fn pace<'a>(
    due: Vec<Due<'a>>,
    targets: &[Target],
    later: &mut Vec<Later<'a>>,
) -> Vec<Due<'a>> {
    let now = now_ms();
    let mut kept: Vec<(&str, Option<pacing::ReceiverLimit>)> = Vec::new();
    let mut out = Vec::with_capacity(due.len());
    for d in due {
        let target =
            d.1.subscription_id
                .as_deref()
                .and_then(|s| targets.iter().find(|t| t.id == s))
                .filter(|_| pacing::applies_to(&d.2));
        let Some(t) = target else {
            out.push(d);
            continue;
        };
        let i = match kept.iter().position(|(s, _)| *s == t.id) {
            Some(i) => i,
            None => {
                kept.push((t.id.as_str(), t.receiver_limit()));
                kept.len() - 1
            }
        };
        let (p, next) = pacing::spend(kept[i].1.as_ref(), now);
        kept[i].1 = next;
        match p {
            pacing::Pace::Go => out.push(d),
            pacing::Pace::Wait { delay_s, .. } => later.push((d.0, d.1, delay_s)),
        }
    }
    out
}

/// The per-subscription throttle (`rate_limit_per_s`), before the claim:
/// each job to a throttled subscription reserves the next slot (one D1
/// `batch()` for the batch's unreserved ones; none when nothing is
/// throttled), slots one [`ops::interval_ms`] apart. Whole seconds of
/// waiting go back to the queue with the slot kept, so the consumer is free
/// for every other delivery; the rest (under a second) is waited in place
/// before sending; a job back too late for its slot reserves again
/// ([`ops::Wait::Stale`]), so no one-second span holds more than the rate.
pub(super) async fn throttle<'a>(
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
