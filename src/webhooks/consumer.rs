//! The queue consumer: one message = one delivery attempt. Loads the delivery,
//! signs and sends it, records the attempt, and decides with
//! `postguard_core::webhooks::retry::classify` whether it is delivered, retried
//! (a new delayed message, chained past the queue's 12 h maximum) or
//! dead-lettered. Messages that fail unexpectedly are retried by the queue and
//! end in the dead-letter queue, whose consumer marks the delivery dead_letter.
//!
//! A batch costs two D1 round trips whatever its size: one query loads every
//! due delivery, one `batch()` records every attempt (bench/webhooks.mjs).

use postguard_core::config::Config;
use postguard_core::ids;
use postguard_core::webhooks::events::excerpt;
use postguard_core::webhooks::retry::{self, AttemptResult, Outcome};
use postguard_core::webhooks::signature;
use serde::Deserialize;
use worker::wasm_bindgen::JsValue;
use worker::{web_sys, Env, MessageBuilder, MessageExt, Result};

use super::{num, opt_text, text, Job};
use crate::runtime::{new_ulid_parts, now_ms, within};
use crate::{bindings, http};

/// POSTs one attempt; `None` when no answer came within `timeout_ms` (the
/// request is aborted). The answer: status, Retry-After, body.
async fn send(
    url: &str,
    body: &[u8],
    headers: &[(&str, &str)],
    timeout_ms: u64,
) -> Option<Result<(u16, Option<String>, Vec<u8>)>> {
    let prepared = (|| {
        let h = web_sys::Headers::new()?;
        for (k, v) in headers {
            h.set(k, v)?;
        }
        let controller = web_sys::AbortController::new()?;
        let init = http::request_init("POST", body);
        init.set_headers(&h);
        init.set_redirect(web_sys::RequestRedirect::Manual);
        init.set_signal(Some(&controller.signal()));
        Ok::<_, JsValue>((controller, init))
    })();
    let (controller, init) = match prepared {
        Ok(p) => p,
        Err(e) => return Some(Err(e.into())),
    };
    let attempt = async {
        let resp = http::raw_fetch(&worker::js_sys::global(), url, &init).await?;
        let retry_after = resp.headers().get("Retry-After").ok().flatten();
        let bytes = http::read_body(&resp).await.unwrap_or_default();
        Ok((resp.status(), retry_after, bytes))
    };
    let out = within(timeout_ms, attempt).await;
    if out.is_none() {
        controller.abort();
    }
    out
}

/// What one attempt needs: the delivery, its event's body and the secrets.
#[derive(Deserialize)]
struct Target {
    id: String,
    event_id: String,
    event_type: String,
    url: String,
    status: String,
    attempts_made: u32,
    next_attempt_at: Option<u64>,
    payload: String,
    secret: Option<String>,
    previous_secret: Option<String>,
    previous_secret_until: Option<u64>,
}

const EXCERPT_CHARS: usize = 512;

/// Handles one batch of `postguard-deliveries` or its dead-letter queue.
pub async fn handle(
    batch: worker::MessageBatch<serde_json::Value>,
    env: &Env,
    cfg: &Config,
) -> Result<()> {
    let messages = batch.messages()?;
    let mut jobs = Vec::new();
    for m in &messages {
        match serde_json::from_value::<Job>(m.body().clone()) {
            Ok(job) => jobs.push((m, job)),
            Err(e) => {
                worker::console_error!("dropping a malformed delivery message: {}", e);
                m.ack();
            }
        }
    }
    if batch.queue() == bindings::DELIVERIES_DLQ {
        let work = jobs
            .iter()
            .map(|(m, job)| async move { settle(m, give_up(env, job).await) });
        futures_util::future::join_all(work).await;
        return Ok(());
    }

    let now = now_ms();
    let mut due: Vec<(&worker::Message<serde_json::Value>, Job)> = Vec::new();
    let mut waiting = Vec::new();
    for (m, job) in jobs {
        match job.not_before {
            // A long delay is chained: not yet time → wait another hop.
            Some(nb) if nb > now + 1_000 => waiting.push((m, job, (nb - now).div_ceil(1000))),
            _ if due.iter().any(|(_, d)| *d == job) => m.ack(), // the same message twice
            // Another job for a delivery already in this batch (a manual retry
            // next to its scheduled attempt): sent again to run a second later,
            // after this one is recorded, so the two never number their
            // attempts from the same snapshot. (Not `retry()`: that would count
            // towards the dead-letter queue.)
            _ if due.iter().any(|(_, d)| d.delivery_id == job.delivery_id) => {
                waiting.push((m, job, 1))
            }
            _ => due.push((m, job)),
        }
    }
    let hops = waiting
        .into_iter()
        .map(|(m, job, remaining)| async move { settle(m, send_later(env, job, remaining).await) });
    futures_util::future::join_all(hops).await;
    if due.is_empty() {
        return Ok(());
    }

    let ids: Vec<&str> = due.iter().map(|(_, j)| j.delivery_id.as_str()).collect();
    let targets = match load_many(env, &ids).await {
        Ok(t) => t,
        Err(e) => {
            worker::console_error!(
                "loading {} deliveries failed, the queue will retry them: {}",
                ids.len(),
                e
            );
            due.iter().for_each(|(m, _)| m.retry());
            return Ok(());
        }
    };
    let work = due.iter().map(|(m, job)| {
        let target = targets.iter().find(|t| t.id == job.delivery_id);
        async move { (*m, attempt(env, cfg, job, target).await) }
    });
    let mut records = Vec::new();
    let mut recorded = Vec::new();
    for (m, outcome) in futures_util::future::join_all(work).await {
        match outcome {
            Ok(Some(rec)) => {
                records.push(rec);
                recorded.push(m);
            }
            other => settle(m, other.map(|_| ())),
        }
    }
    match record_all(env, &records).await {
        Ok(()) => recorded.iter().for_each(|m| m.ack()),
        Err(e) => {
            // The requests were sent: retrying repeats them (at-least-once),
            // which beats losing their outcome.
            worker::console_error!(
                "recording {} attempts failed, the queue will retry them: {}",
                records.len(),
                e
            );
            recorded.iter().for_each(|m| m.retry());
        }
    }
    Ok(())
}

/// Acknowledges a message whose work is done, or hands it back to the queue.
fn settle(m: &worker::Message<serde_json::Value>, outcome: Result<()>) {
    match outcome {
        Ok(()) => m.ack(),
        Err(e) => {
            worker::console_error!("delivery message failed, the queue will retry it: {}", e);
            m.retry();
        }
    }
}

const TARGET_COLUMNS: &str = "SELECT d.id, d.event_id, d.event_type, d.url, d.status, d.attempts_made, d.next_attempt_at, e.payload, \
            s.secret, s.previous_secret, s.previous_secret_until \
     FROM deliveries d JOIN events e ON e.project = d.project AND e.id = d.event_id \
     LEFT JOIN subscriptions s ON s.id = d.subscription_id";

/// The deliveries of one batch, in one query (a batch holds at most 100
/// messages, within D1's limit on bound parameters).
async fn load_many(env: &Env, ids: &[&str]) -> Result<Vec<Target>> {
    let marks = vec!["?"; ids.len()].join(", ");
    let binds: Vec<JsValue> = ids.iter().map(|id| text(id)).collect();
    env.d1(bindings::DB)?
        .prepare(format!("{TARGET_COLUMNS} WHERE d.id IN ({marks})"))
        .bind(&binds)?
        .all()
        .await?
        .results()
}

async fn load(env: &Env, delivery_id: &str) -> Result<Option<Target>> {
    Ok(load_many(env, &[delivery_id]).await?.into_iter().next())
}

async fn send_later(env: &Env, job: Job, delay_s: u64) -> Result<()> {
    let delay = u32::try_from(retry::next_hop(delay_s)).unwrap_or(u32::MAX);
    env.queue(bindings::DELIVERIES)?
        .send(MessageBuilder::new(job).delay_seconds(delay).build())
        .await
}

/// How a job relates to the delivery's schedule.
enum Kind {
    /// The scheduled attempt, or a manual retry of a delivery still being
    /// retried: its outcome drives the schedule.
    Scheduled,
    /// A manual retry of a finished (delivered or dead-lettered) delivery:
    /// success makes it delivered, failure leaves it as it was.
    ManualFinal,
    /// A redirect: recorded, nothing else changes.
    Redirect,
}

/// One attempt of one delivery (`target` is `None` once retention removed
/// it). Returns what to record, or `None` when there is nothing to record.
async fn attempt(
    env: &Env,
    cfg: &Config,
    job: &Job,
    target: Option<&Target>,
) -> Result<Option<Recorded>> {
    let now = now_ms();
    let Some(t) = target else {
        return Ok(None); // removed by retention
    };
    let in_progress = t.status == "pending" || t.status == "failed";
    let kind = if job.redirect_url.is_some() {
        Kind::Redirect
    } else if job.manual {
        if in_progress {
            Kind::Scheduled
        } else {
            Kind::ManualFinal
        }
    } else if in_progress && job.not_before == t.next_attempt_at {
        Kind::Scheduled
    } else {
        return Ok(None); // superseded or duplicate (queues deliver at least once)
    };
    let number = t.attempts_made + 1;
    let request_id = ids_now();
    let Some(secret) = t.secret.clone() else {
        if !matches!(kind, Kind::Scheduled) {
            return Ok(None);
        }
        return Ok(Some(Recorded {
            delivery_id: job.delivery_id.clone(),
            status: Some("dead_letter".into()),
            attempt: Attempt {
                number,
                url: t.url.clone(),
                status_code: None,
                error: Some("the subscription was deleted".into()),
                excerpt: None,
                duration_ms: 0,
                request_id,
                at: now,
                next_at: None,
            },
        }));
    };
    let url = job.redirect_url.clone().unwrap_or_else(|| t.url.clone());
    let timestamp = now / 1000;
    let mut secrets = vec![secret.as_str()];
    if let (Some(prev), Some(until)) = (t.previous_secret.as_deref(), t.previous_secret_until) {
        if now < until {
            secrets.push(prev);
        }
    }
    let body = t.payload.as_bytes();
    let sig = signature::signature_header(&secrets, &t.event_id, timestamp, body)
        .map_err(|e| worker::Error::RustError(e.to_string()))?;
    let number_s = number.to_string();
    let ts_s = timestamp.to_string();
    let timeout_ms = u64::from(cfg.settings.webhooks.timeout_ms);
    let (result, error, excerpt_text) = match send(
        &url,
        body,
        &[
            ("Content-Type", "application/json"),
            ("User-Agent", "postguard-webhooks/0.1"),
            ("webhook-id", t.event_id.as_str()),
            ("webhook-timestamp", ts_s.as_str()),
            ("webhook-signature", sig.as_str()),
            ("X-Event-Id", t.event_id.as_str()),
            ("X-Event-Type", t.event_type.as_str()),
            ("X-Delivery-Attempt", number_s.as_str()),
            ("X-Request-Id", request_id.as_str()),
        ],
        timeout_ms,
    )
    .await
    {
        None => (
            AttemptResult::Timeout,
            Some(format!("no answer within {timeout_ms} ms")),
            None,
        ),
        Some(Err(e)) => {
            let msg = e.to_string();
            let msg = if msg.trim().is_empty() {
                "network error".to_string()
            } else {
                msg
            };
            (
                AttemptResult::NetworkError,
                Some(format!("network error: {msg}")),
                None,
            )
        }
        Some(Ok((code, retry_after, bytes))) => (
            AttemptResult::Status { code, retry_after },
            None,
            Some(excerpt(&bytes, EXCERPT_CHARS)),
        ),
    };
    let done = now_ms();
    let status_code = match &result {
        AttemptResult::Status { code, .. } => Some(*code),
        _ => None,
    };
    let outcome = retry::classify(&result, number, &cfg.settings.webhooks.schedule_s, done);
    let mut rec = Attempt {
        number,
        url,
        status_code,
        error,
        excerpt: excerpt_text,
        duration_ms: done - now,
        request_id,
        at: now,
        next_at: None,
    };
    let new_status = match (kind, outcome) {
        (Kind::Redirect, _) => None,
        (_, Outcome::Delivered) => Some("delivered".to_string()),
        (Kind::ManualFinal, _) => Some(t.status.clone()),
        (Kind::Scheduled, Outcome::DeadLetter) => Some("dead_letter".to_string()),
        (Kind::Scheduled, Outcome::Retry { delay_s }) => {
            // The next attempt is queued before this one is recorded: a crash
            // in between repeats an attempt rather than losing the delivery.
            let at = done + delay_s * 1000;
            send_later(env, Job::scheduled(job.delivery_id.clone(), at), delay_s).await?;
            rec.next_at = Some(at);
            Some("failed".to_string())
        }
    };
    Ok(Some(Recorded {
        delivery_id: job.delivery_id.clone(),
        attempt: rec,
        status: new_status,
    }))
}

fn ids_now() -> String {
    let (now, rnd) = new_ulid_parts();
    ids::request_id(now, rnd)
}

/// One attempt as recorded in the delivery log.
struct Attempt {
    number: u32,
    url: String,
    status_code: Option<u16>,
    error: Option<String>,
    excerpt: Option<String>,
    duration_ms: u64,
    request_id: String,
    at: u64,
    next_at: Option<u64>,
}

/// An attempt to record, and (for `Some(status)`) the delivery's new status
/// and next planned attempt.
struct Recorded {
    delivery_id: String,
    attempt: Attempt,
    status: Option<String>,
}

/// Writes each attempt row, counts it and updates its delivery: every
/// attempt of a batch in one D1 `batch()` (one round trip, one transaction).
async fn record_all(env: &Env, records: &[Recorded]) -> Result<()> {
    if records.is_empty() {
        return Ok(());
    }
    let db = env.d1(bindings::DB)?;
    let opt_num = |v: Option<u64>| v.map_or(JsValue::NULL, num);
    let mut statements = Vec::with_capacity(records.len() * 2);
    for r in records {
        let a = &r.attempt;
        statements.push(db
            .prepare(
                "INSERT OR IGNORE INTO attempts (delivery_id, request_id, attempt, url, status_code, error, response_excerpt, duration_ms, at, next_retry_at) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&[
                text(&r.delivery_id),
                text(&a.request_id),
                num(u64::from(a.number)),
                text(&a.url),
                opt_num(a.status_code.map(u64::from)),
                opt_text(a.error.as_deref()),
                opt_text(a.excerpt.as_deref()),
                num(a.duration_ms),
                num(a.at),
                opt_num(a.next_at),
            ])?);
        statements.push(match &r.status {
            Some(status) => db
                .prepare(
                    "UPDATE deliveries SET status = ?, attempts_made = MAX(attempts_made, ?), next_attempt_at = ?, updated_at = ? WHERE id = ?",
                )
                .bind(&[text(status), num(u64::from(a.number)), opt_num(a.next_at), num(now_ms()), text(&r.delivery_id)])?,
            None => db
                .prepare("UPDATE deliveries SET attempts_made = MAX(attempts_made, ?), updated_at = ? WHERE id = ?")
                .bind(&[num(u64::from(a.number)), num(now_ms()), text(&r.delivery_id)])?,
        });
    }
    db.batch(statements).await?;
    Ok(())
}

/// A message the main queue could not process after all its retries: the
/// delivery is dead-lettered with a recorded reason, never dropped silently.
async fn give_up(env: &Env, job: &Job) -> Result<()> {
    if job.redirect_url.is_some() {
        return Ok(());
    }
    let Some(t) = load(env, &job.delivery_id).await? else {
        return Ok(());
    };
    if t.status == "delivered" {
        return Ok(());
    }
    let rec = Recorded {
        delivery_id: job.delivery_id.clone(),
        status: Some("dead_letter".into()),
        attempt: Attempt {
            number: t.attempts_made + 1,
            url: t.url.clone(),
            status_code: None,
            error: Some(
                "the delivery job failed repeatedly inside the gateway (dead-letter queue)".into(),
            ),
            excerpt: None,
            duration_ms: 0,
            request_id: ids_now(),
            at: now_ms(),
            next_at: None,
        },
    };
    record_all(env, std::slice::from_ref(&rec)).await
}

/// Cron safety net: deliveries whose next attempt is overdue by 15 minutes
/// (a lost message, a failed enqueue) are queued again.
pub async fn requeue_stuck(env: &Env) -> Result<u32> {
    #[derive(Deserialize)]
    struct Stuck {
        id: String,
    }
    let cutoff = now_ms().saturating_sub(15 * 60_000);
    let db = env.d1(bindings::DB)?;
    let stuck: Vec<Stuck> = db
        .prepare("SELECT id FROM deliveries WHERE status IN ('pending', 'failed') AND next_attempt_at < ? LIMIT 500")
        .bind(&[num(cutoff)])?
        .all()
        .await?
        .results()?;
    if stuck.is_empty() {
        return Ok(0);
    }
    let n = stuck.len() as u32;
    let at = now_ms();
    let jobs: Vec<Job> = stuck
        .iter()
        .map(|s| Job::scheduled(s.id.clone(), at))
        .collect();
    // Re-plan first, so the new jobs are the ones that match `next_attempt_at`.
    let touch: Vec<_> = stuck
        .iter()
        .map(|s| {
            db.prepare("UPDATE deliveries SET next_attempt_at = ? WHERE id = ?")
                .bind(&[num(at), text(&s.id)])
        })
        .collect::<Result<_>>()?;
    db.batch(touch).await?;
    env.queue(bindings::DELIVERIES)?.send_batch(jobs).await?;
    Ok(n)
}

/// Retention: deliveries, their attempts and events older than `days`.
pub async fn sweep(env: &Env, days: u32) -> Result<()> {
    let cutoff = num(postguard_core::audit::retention_cutoff_ms(now_ms(), days));
    let db = env.d1(bindings::DB)?;
    db.batch(vec![
        db.prepare("DELETE FROM attempts WHERE delivery_id IN (SELECT id FROM deliveries WHERE created_at < ? LIMIT 5000)")
            .bind(std::slice::from_ref(&cutoff))?,
        db.prepare("DELETE FROM deliveries WHERE id IN (SELECT id FROM deliveries WHERE created_at < ? LIMIT 5000)")
            .bind(std::slice::from_ref(&cutoff))?,
        db.prepare("DELETE FROM events WHERE created_at < ? AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.project = events.project AND d.event_id = events.id)")
            .bind(&[cutoff])?,
    ])
    .await?;
    Ok(())
}
