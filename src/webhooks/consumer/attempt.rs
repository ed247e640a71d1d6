//! The consumer's send phase: each claimed attempt signed and sent (or given
//! up), its follow-up queued, then recorded and settled in its shard, its
//! data point written and its subscription's health updated.

use super::*;

/// Runs the claimed attempts at once, records and settles them in their
/// shards, then acknowledges them.
pub(super) async fn run_all(env: &Env, cfg: &Config, runs: &[Run<'_>]) {
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
    observe_limits(env, &done).await;
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
    let attempted: Vec<health::Attempted> = healthy
        .iter()
        .filter(|r| !r.redirect)
        .filter_map(|r| {
            Some(health::Attempted {
                project: &r.project,
                subscription_id: &r.subscription_id,
                url: r.sub_url.as_deref()?,
                failing_since: r.failing_since,
                result: &r.result,
                request_id: &r.settle.row.request_id,
            })
        })
        .collect();
    if let Err(e) = health::update(env, cfg, &attempted).await {
        log::emit(Line::error("updating subscription health failed").err(e));
    }
}

/// What each subscription's receiver advertised in this batch's answers
/// (`pacing::receiver_limit`, kept by `pacing::observe`), stored where it
/// changed (one D1 `batch()`); a limit whose reset passed is dropped. Best
/// effort: a lost write only means the next answer is the word.
async fn observe_limits(env: &Env, done: &[(&Run<'_>, Recorded)]) {
    let now = now_ms();
    // (subscription, as stored, as now seen)
    type Seen<'s> = (
        &'s str,
        Option<pacing::ReceiverLimit>,
        Option<pacing::ReceiverLimit>,
    );
    let mut seen: Vec<Seen> = Vec::new();
    for (r, rec) in done {
        let Some(t) = r.target.filter(|_| !rec.redirect) else {
            continue;
        };
        let i = match seen.iter().position(|(s, _, _)| *s == t.id) {
            Some(i) => i,
            None => {
                let stored = t.receiver_limit();
                seen.push((t.id.as_str(), stored, stored));
                seen.len() - 1
            }
        };
        let row = &rec.settle.row;
        let advertised = row
            .response_headers
            .as_deref()
            .and_then(|h| pacing::from_headers(h, row.at.saturating_add(row.duration_ms)));
        seen[i].2 = pacing::observe(seen[i].2.as_ref(), advertised, now);
    }
    let changes: Vec<(String, Option<pacing::ReceiverLimit>)> = seen
        .into_iter()
        .filter(|(_, stored, now_seen)| stored != now_seen)
        .map(|(s, _, l)| (s.to_string(), l))
        .collect();
    if let Err(e) = directory::store_receiver_limits(env, &changes, now).await {
        log::emit(Line::warn("storing receivers' advertised limits failed").err(e));
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
            let got: Result<wire::SettleReply> =
                shards::call::<wire::SettleAttempts>(env, &key, &req).await;
            (key, idx, got)
        }
    });
    let mut out: Vec<Result<()>> = done.iter().map(|_| Ok(())).collect();
    for (key, idx, got) in futures_util::future::join_all(calls).await {
        match got {
            Ok(reply) => {
                wake(env, &key, &reply.wakes).await;
                for (i, f) in idx.into_iter().zip(reply.follow_ups) {
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

/// Sends at once the first jobs of the deliveries whose lane predecessor
/// just settled (ADR 0043). A failure is logged: each blocked job also
/// looks again on its own.
async fn wake(env: &Env, key: &ShardKey, jobs: &[FirstJob]) {
    if jobs.is_empty() {
        return;
    }
    let all = jobs.iter().map(|j| Job::first(&key.project, j)).collect();
    if let Err(e) = crate::webhooks::enqueue(env, all).await {
        log::emit(Line::warn("waking an ordering lane failed (its recheck sends it)").err(e));
    }
}

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
