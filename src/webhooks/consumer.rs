//! The queue consumer: one message = one delivery job. It only does I/O; the
//! decisions are `postguard_core::webhooks::delivery` (ADR 0009):
//! load → [`delivery::plan`] → claim the attempt number (compare-and-set) →
//! sign and send → [`delivery::settle`] → enqueue the follow-up → record the
//! attempt and apply the status write (compare-and-set; a lost one is settled
//! again on a fresh read). Messages that fail unexpectedly are retried by the
//! queue and end in the dead-letter queue, whose jobs take the same path and
//! dead-letter the delivery.
//!
//! A batch costs three D1 round trips whatever its size: one query loads
//! every due delivery, one multi-row compare-and-set claims their attempt
//! numbers, one `batch()` of two multi-row statements records every attempt
//! and status write (`json_each` over one bound JSON array; ADR 0020,
//! bench/webhooks.mjs).

use postguard_core::config::Config;
use postguard_core::ids;
use postguard_core::webhooks::delivery::{
    self, Attempted, Claim, Delivery, Plan, Status, Transition, Write, CONTENDED_DELAY_S,
};
use postguard_core::webhooks::events::{self, excerpt};
use postguard_core::webhooks::fanout;
use postguard_core::webhooks::ops::{self, Health, SubState};
use postguard_core::webhooks::retry::AttemptResult;
use postguard_core::webhooks::signature;
use serde::Deserialize;
use worker::d1::{D1Database, D1PreparedStatement};
use worker::wasm_bindgen::JsValue;
use worker::{web_sys, Env, MessageBuilder, MessageExt, Result};

use super::{num, text, to_json, Job, TaskStep};
use crate::runtime::{new_ulid_parts, now_ms, within};
use crate::{bindings, http};

/// POSTs one attempt; `None` when no answer came within `timeout_ms` (the
/// request is aborted). The answer: status, Retry-After, body.
pub async fn send(
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
        let bytes = http::read_prefix(&resp, fanout::MAX_RESPONSE_READ_BYTES)
            .await
            .unwrap_or_default();
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
    project: String,
    subscription_id: String,
    event_id: String,
    event_type: String,
    url: String,
    status: Status,
    attempts_made: u32,
    next_attempt_at: Option<u64>,
    payload: String,
    secret: Option<String>,
    previous_secret: Option<String>,
    previous_secret_until: Option<u64>,
    sub_url: Option<String>,
    state: Option<SubState>,
    failing_since: Option<u64>,
    rate_limit_per_s: Option<u32>,
    /// When the key that created the subscription was revoked.
    key_revoked_at: Option<u64>,
}

impl Target {
    fn snapshot(&self) -> Delivery {
        Delivery {
            status: self.status,
            attempts_made: self.attempts_made,
            next_attempt_at: self.next_attempt_at,
            subscribed: self.secret.is_some(),
            held: self.state.is_some_and(SubState::holds),
        }
    }

    fn secrets(&self) -> Secrets<'_> {
        Secrets {
            secret: self.secret.as_deref(),
            previous: self.previous_secret.as_deref(),
            previous_until: self.previous_secret_until,
        }
    }
}

/// A subscription's signing secrets.
pub struct Secrets<'a> {
    pub secret: Option<&'a str>,
    pub previous: Option<&'a str>,
    pub previous_until: Option<u64>,
}

/// One signed request to make: the event and where to.
pub struct Outgoing<'a> {
    pub event_id: &'a str,
    pub event_type: &'a str,
    pub payload: &'a [u8],
    pub secrets: Secrets<'a>,
}

pub type Msg = worker::Message<serde_json::Value>;

/// A job the core said to run, with its claim on an attempt number.
struct Claimed<'a> {
    m: &'a Msg,
    job: Job,
    target: &'a Target,
    claim: Claim,
    gave_up: Option<delivery::GiveUp>,
    /// Throttled: wait this long in place before sending.
    sleep_ms: u64,
}

const EXCERPT_CHARS: usize = 512;

/// Handles one batch of `postguard-deliveries` or its dead-letter queue.
pub async fn handle(
    batch: worker::MessageBatch<serde_json::Value>,
    env: &Env,
    cfg: &Config,
) -> Result<()> {
    let from_dlq = batch.queue() == bindings::DELIVERIES_DLQ;
    let messages = batch.messages()?;
    let (tasks, messages): (Vec<_>, Vec<_>) = messages
        .into_iter()
        .partition(|m| m.body().get("task_id").is_some());
    for m in &tasks {
        super::ops::run_task_message(env, m, from_dlq).await;
    }
    let (due, mut later) = sort(&messages, from_dlq);
    let ids: Vec<&str> = due.iter().map(|(_, j, _)| j.delivery_id.as_str()).collect();
    let targets = match load_many(env, &ids).await {
        Ok(t) => t,
        Err(e) => {
            retry_all("loading", due.iter().map(|(m, _, _)| *m), &e);
            hop(env, later).await;
            return Ok(());
        }
    };
    let (claims, holds) = plan_all(due, &targets, now_ms(), &mut later);
    hold_all(env, holds, &mut later).await;
    let claims = match throttle(env, claims, &mut later).await {
        Ok(c) => c,
        Err((e, c)) => {
            retry_all("throttling", c.iter().map(|c| c.m), &e);
            hop(env, later).await;
            return Ok(());
        }
    };
    let won = match claim_all(env, &claims).await {
        Ok(won) => won,
        Err(e) => {
            retry_all("claiming", claims.iter().map(|c| c.m), &e);
            hop(env, later).await;
            return Ok(());
        }
    };
    let (won, lost): (Vec<_>, Vec<_>) = claims.into_iter().zip(won).partition(|(_, w)| *w);
    // Lost to an attempt in another batch: planned again on a fresh read.
    later.extend(
        lost.into_iter()
            .map(|(c, _)| (c.m, c.job, CONTENDED_DELAY_S)),
    );
    hop(env, later).await;
    let won: Vec<Claimed> = won.into_iter().map(|(c, _)| c).collect();
    run_all(env, cfg, &won).await;
    Ok(())
}

/// A hold the core asked for: its message and the compare-and-set write.
type HoldOf<'a> = (&'a Msg, Job, Write);

/// Writes `paused` where the delivery is as planned and its subscription is
/// still not active; a hold that does not apply (resumed meanwhile, or
/// another attempt moved first) is planned again on a fresh read.
async fn hold_all<'a>(env: &Env, holds: Vec<HoldOf<'a>>, later: &mut Vec<Later<'a>>) {
    if holds.is_empty() {
        return;
    }
    let applied = async {
        let db = env.d1(bindings::DB)?;
        let statements = holds
            .iter()
            .map(|(_, j, w)| {
                db.prepare(
                    "UPDATE deliveries SET status = ?, next_attempt_at = NULL, updated_at = ? \
                     WHERE id = ? AND status = ? AND attempts_made = ? AND EXISTS \
                     (SELECT 1 FROM subscription_ops o WHERE o.subscription_id = deliveries.subscription_id AND o.state != 'active')",
                )
                .bind(&[
                    text(w.status.as_str()),
                    num(now_ms()),
                    text(&j.delivery_id),
                    text(w.expect.status.as_str()),
                    num(u64::from(w.expect.attempts_made)),
                ])
            })
            .collect::<Result<_>>()?;
        changed(&db, statements).await
    };
    match applied.await {
        Ok(ok) => {
            for ((m, job, _), held) in holds.into_iter().zip(ok) {
                if held {
                    m.ack();
                } else {
                    later.push((m, job, CONTENDED_DELAY_S));
                }
            }
        }
        Err(e) => retry_all("holding", holds.iter().map(|(m, _, _)| *m), &e),
    }
}

/// The per-subscription throttle (`rate_limit_per_s`): each attempt to a
/// throttled subscription reserves the next slot (one D1 `batch()` for the
/// batch's unreserved ones; none when nothing is throttled). Whole seconds
/// of waiting go back to the queue, so the consumer is free for every other
/// delivery; the rest (under a second) is waited in place before sending.
async fn throttle<'a>(
    env: &Env,
    claims: Vec<Claimed<'a>>,
    later: &mut Vec<Later<'a>>,
) -> std::result::Result<Vec<Claimed<'a>>, (worker::Error, Vec<Claimed<'a>>)> {
    let limited = |c: &Claimed| c.target.rate_limit_per_s.is_some() && c.job.redirect_url.is_none();
    let unreserved: Vec<usize> = (0..claims.len())
        .filter(|i| limited(&claims[*i]) && claims[*i].job.slot.is_none())
        .collect();
    let mut slots: Vec<Option<u64>> = claims.iter().map(|c| c.job.slot).collect();
    if !unreserved.is_empty() {
        match reserve(env, &claims, &unreserved).await {
            Ok(got) => unreserved.iter().zip(got).for_each(|(i, s)| slots[*i] = s),
            Err(e) => return Err((e, claims)),
        }
    }
    let now = now_ms();
    let mut out = Vec::new();
    for (mut c, slot) in claims.into_iter().zip(slots) {
        match slot
            .filter(|_| limited(&c))
            .map(|s| (s, ops::throttle_wait(s, now)))
        {
            Some((s, ops::Wait::Hop { delay_s })) => {
                let mut job = c.job.clone();
                job.slot = Some(s);
                later.push((c.m, job, delay_s));
            }
            Some((_, ops::Wait::Sleep { ms })) => {
                c.sleep_ms = ms;
                out.push(c);
            }
            None => out.push(c),
        }
    }
    Ok(out)
}

/// Reserves one slot per claim in `which`: the later of the subscription's
/// next free slot and now, which moves on by one interval.
async fn reserve(env: &Env, claims: &[Claimed<'_>], which: &[usize]) -> Result<Vec<Option<u64>>> {
    #[derive(Deserialize)]
    struct Slot {
        slot: u64,
    }
    let db = env.d1(bindings::DB)?;
    let now = now_ms();
    let statements =
        which
            .iter()
            .map(|i| {
                let t = claims[*i].target;
                let interval = ops::interval_ms(t.rate_limit_per_s.unwrap_or(1));
                db.prepare(
                "UPDATE subscription_ops SET next_send_at = MAX(COALESCE(next_send_at, 0), ?) + ? \
                 WHERE subscription_id = ? RETURNING next_send_at - ? AS slot",
            )
            .bind(&[num(now), num(interval), text(&t.subscription_id), num(interval)])
            })
            .collect::<Result<_>>()?;
    let results = db.batch(statements).await?;
    results
        .iter()
        .map(|r| Ok(r.results::<Slot>()?.first().map(|s| s.slot)))
        .collect()
}

type Due<'a> = (&'a Msg, Job, delivery::Job);
type Later<'a> = (&'a Msg, Job, u64);

/// The batch's jobs to run now, and those to send again later.
fn sort(messages: &[Msg], from_dlq: bool) -> (Vec<Due<'_>>, Vec<Later<'_>>) {
    let mut due: Vec<Due> = Vec::new();
    let mut later = Vec::new();
    for m in messages {
        let Some((job, kind)) = parse(m, from_dlq) else {
            m.ack();
            continue;
        };
        if !job.manual && due.iter().any(|(_, d, _)| *d == job) {
            // The same scheduled job twice (manual ones are distinct requests).
            m.ack();
        } else if due.iter().any(|(_, d, _)| d.delivery_id == job.delivery_id) {
            // Another job of a delivery already in this batch: it runs again
            // a second later, planned on what this one leaves.
            later.push((m, job, CONTENDED_DELAY_S));
        } else {
            due.push((m, job, kind));
        }
    }
    (due, later)
}

/// Asks the core what each job does; acknowledges the ones with nothing to do.
fn plan_all<'a>(
    due: Vec<Due<'a>>,
    targets: &'a [Target],
    now: u64,
    later: &mut Vec<Later<'a>>,
) -> (Vec<Claimed<'a>>, Vec<HoldOf<'a>>) {
    let mut claims = Vec::new();
    let mut holds = Vec::new();
    for (m, job, kind) in due {
        // `None` once retention removed the delivery.
        let Some(target) = targets.iter().find(|t| t.id == job.delivery_id) else {
            m.ack();
            continue;
        };
        // Its key was revoked: nothing is sent (a redirect included); the
        // delivery stays as it is, and the cron re-queue skips it too.
        if target.key_revoked_at.is_some() {
            m.ack();
            continue;
        }
        let (claim, gave_up) = match delivery::plan(kind, &target.snapshot(), now) {
            Plan::Send(claim) => (claim, None),
            Plan::GiveUp(claim, why) => (claim, Some(why)),
            Plan::Wait { delay_s } => {
                later.push((m, job, delay_s));
                continue;
            }
            Plan::Hold(w) => {
                holds.push((m, job, w));
                continue;
            }
            Plan::Drop(_) => {
                m.ack(); // superseded, duplicate, finished
                continue;
            }
        };
        claims.push(Claimed {
            m,
            job,
            target,
            claim,
            gave_up,
            sleep_ms: 0,
        });
    }
    (claims, holds)
}

/// Runs the claimed attempts at once, records them, then acknowledges them.
async fn run_all(env: &Env, cfg: &Config, won: &[Claimed<'_>]) {
    // Released (ordered) jobs of one subscription run one after another, in
    // the batch's order; everything else at once.
    let mut groups: Vec<Vec<&Claimed>> = Vec::new();
    for c in won {
        let same = |g: &&mut Vec<&Claimed>| {
            g.first().is_some_and(|f| {
                c.job.ordered
                    && f.job.ordered
                    && f.target.subscription_id == c.target.subscription_id
            })
        };
        match groups.iter_mut().find(|g| same(g)) {
            Some(g) => g.push(c),
            None => groups.push(vec![c]),
        }
    }
    let work = groups.into_iter().map(|g| async move {
        let mut out = Vec::with_capacity(g.len());
        for c in g {
            out.push((c.m, attempt(env, cfg, c).await));
        }
        out
    });
    let outcomes: Vec<_> = futures_util::future::join_all(work)
        .await
        .into_iter()
        .flatten()
        .collect();
    let mut records = Vec::new();
    let mut recorded = Vec::new();
    for (m, outcome) in outcomes {
        match outcome {
            Ok(rec) => {
                records.push(rec);
                recorded.push(m);
            }
            Err(e) => retry_all("an attempt", [m], &e),
        }
    }
    match record_all(env, cfg, &records).await {
        Ok(()) => {
            recorded.iter().for_each(|m| m.ack());
            if let Err(e) = health_all(env, cfg, &records).await {
                worker::console_error!("updating subscription health failed: {}", e);
            }
        }
        // The requests were sent: retrying repeats them under new numbers
        // (at-least-once), which beats losing their outcome.
        Err(e) => retry_all("recording", recorded, &e),
    }
}

/// Hands messages back to the queue after a failure of `what`.
fn retry_all<'a>(what: &str, messages: impl IntoIterator<Item = &'a Msg>, e: &worker::Error) {
    let mut n = 0;
    for m in messages {
        m.retry();
        n += 1;
    }
    worker::console_error!(
        "{} failed, the queue will retry {} messages: {}",
        what,
        n,
        e
    );
}

/// A message's job and what it asks for; `None` (logged) when malformed or
/// when it asks for nothing.
fn parse(m: &Msg, from_dlq: bool) -> Option<(Job, delivery::Job)> {
    // Read from the parsed body in place (no copy of it per message).
    let job = Job::deserialize(m.body())
        .map_err(|e| worker::console_error!("dropping a malformed delivery message: {}", e))
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

const TARGET_COLUMNS: &str = "SELECT d.id, d.project, d.subscription_id, d.event_id, d.event_type, d.url, d.status, d.attempts_made, d.next_attempt_at, e.payload, \
            s.secret, s.previous_secret, s.previous_secret_until, s.url AS sub_url, o.state, o.failing_since, o.rate_limit_per_s, w.key_revoked_at \
     FROM deliveries d JOIN events e ON e.project = d.project AND e.id = d.event_id \
     LEFT JOIN subscriptions s ON s.id = d.subscription_id \
     LEFT JOIN subscription_ops o ON o.subscription_id = d.subscription_id \
     LEFT JOIN subscription_owners w ON w.subscription_id = d.subscription_id";

/// The deliveries of one batch, in one query (a batch holds at most 100
/// messages, within D1's limit on bound parameters).
async fn load_many(env: &Env, ids: &[&str]) -> Result<Vec<Target>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let marks = vec!["?"; ids.len()].join(", ");
    let binds: Vec<JsValue> = ids.iter().map(|id| text(id)).collect();
    env.d1(bindings::DB)?
        .prepare(format!("{TARGET_COLUMNS} WHERE d.id IN ({marks})"))
        .bind(&binds)?
        .all()
        .await?
        .results()
}

pub async fn send_later(env: &Env, job: Job, delay_s: u64) -> Result<()> {
    let delay = u32::try_from(delay_s).unwrap_or(u32::MAX);
    env.queue(bindings::DELIVERIES)?
        .send(MessageBuilder::new(job).delay_seconds(delay).build())
        .await
}

/// Runs `statements` in one D1 `batch()` (one round trip, one transaction);
/// for each, whether it changed a row (a compare-and-set that held).
pub async fn changed(db: &D1Database, statements: Vec<D1PreparedStatement>) -> Result<Vec<bool>> {
    if statements.is_empty() {
        return Ok(Vec::new());
    }
    db.batch(statements)
        .await?
        .iter()
        .map(|r| Ok(r.meta()?.and_then(|m| m.changes).unwrap_or(0) > 0))
        .collect()
}

/// Claims each attempt's number (`attempts_made = n` where the delivery is
/// still as loaded) before anything is sent, so two batches never send the
/// same number: the loser sends nothing. One multi-row compare-and-set for
/// the whole batch; the ids it returns are the claims that held.
async fn claim_all(env: &Env, claims: &[Claimed<'_>]) -> Result<Vec<bool>> {
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Vec<(&str, u32, &str, u32)> = claims
        .iter()
        .map(|c| {
            let e = c.claim.expect;
            let id = c.job.delivery_id.as_str();
            (
                id,
                c.claim.attempt.number,
                e.status.as_str(),
                e.attempts_made,
            )
        })
        .collect();
    let db = env.d1(bindings::DB)?;
    let won: Vec<Id> = db
        .prepare(
            "UPDATE deliveries SET attempts_made = json_extract(j.value, '$[1]'), updated_at = ? FROM json_each(?) AS j \
             WHERE deliveries.id = json_extract(j.value, '$[0]') AND deliveries.status = json_extract(j.value, '$[2]') \
             AND deliveries.attempts_made = json_extract(j.value, '$[3]') RETURNING id",
        )
        .bind(&[num(now_ms()), text(&to_json(&rows)?)])?
        .all()
        .await?
        .results()?;
    Ok(claims
        .iter()
        .map(|c| won.iter().any(|w| w.id == c.job.delivery_id))
        .collect())
}

/// A row id returned by a multi-row compare-and-set.
#[derive(Deserialize)]
struct Id {
    id: String,
}

/// One claimed attempt: sent (or given up), settled by the core on the
/// delivery as claimed, its follow-up job enqueued. Returns what to record.
async fn attempt(env: &Env, cfg: &Config, c: &Claimed<'_>) -> Result<Recorded> {
    let started = now_ms();
    let request_id = ids_now();
    // The subscription's URL as it is now (PATCH may have changed it).
    let url = c
        .job
        .redirect_url
        .as_deref()
        .or(c.target.sub_url.as_deref())
        .unwrap_or(&c.target.url)
        .to_string();
    let number = c.claim.attempt.number;
    let (result, error, excerpt) = match c.gave_up {
        Some(why) => (Attempted::GaveUp(why), Some(why.reason().to_string()), None),
        None => {
            if c.sleep_ms > 0 {
                worker::Delay::from(std::time::Duration::from_millis(c.sleep_ms)).await;
            }
            let t = c.target;
            let out = Outgoing {
                event_id: &t.event_id,
                event_type: &t.event_type,
                payload: t.payload.as_bytes(),
                secrets: t.secrets(),
            };
            let sent = sign_and_send(cfg, &out, &url, number, &request_id, now_ms()).await?;
            (Attempted::Sent(sent.0), sent.1, sent.2)
        }
    };
    let done = now_ms();
    let seen = c.claim.claimed(&c.target.snapshot());
    let schedule = &cfg.settings.webhooks.schedule_s;
    let transition = delivery::settle(&seen, &c.claim.attempt, &result, schedule, done);
    follow_up(env, &c.job.delivery_id, &transition).await?;
    let duration_ms = done - started;
    let row = AttemptRow {
        number,
        url,
        error,
        excerpt,
        duration_ms,
        request_id,
        at: started,
    };
    let (delivery_id, claim) = (c.job.delivery_id.clone(), c.claim);
    Ok(Recorded {
        delivery_id,
        project: c.target.project.clone(),
        subscription_id: c.target.subscription_id.clone(),
        sub_url: c.target.sub_url.clone(),
        failing_since: c.target.failing_since,
        claim,
        result,
        row,
        transition,
    })
}

/// The next scheduled job, enqueued before the attempt is recorded: a crash
/// in between repeats an attempt rather than losing the delivery.
async fn follow_up(env: &Env, delivery_id: &str, t: &Transition) -> Result<()> {
    match t.follow_up {
        Some(f) => {
            send_later(
                env,
                Job::scheduled(delivery_id.to_string(), f.at),
                f.delay_s,
            )
            .await
        }
        None => Ok(()),
    }
}

/// Signs and POSTs attempt `number`: its result, error text and response excerpt.
pub async fn sign_and_send(
    cfg: &Config,
    t: &Outgoing<'_>,
    url: &str,
    number: u32,
    request_id: &str,
    now: u64,
) -> Result<(AttemptResult, Option<String>, Option<String>)> {
    // The URL rules once more, right before the request goes out: whatever
    // accepted the URL earlier (a subscription, a redirect), the rules of the
    // configuration now — with only the configured public URL's capture URLs
    // exempt — decide. A refused URL is not sent: a failed attempt, on the
    // schedule like a network error.
    let policy = super::policy(cfg);
    if let Err(why) = ops::check_target_url(url, cfg.settings.public_origin(), &policy) {
        let error = format!("not sent: the URL rules refuse it ({})", &*why);
        return Ok((AttemptResult::NetworkError, Some(error), None));
    }
    let timestamp = now / 1000;
    let mut secrets: Vec<&str> = t.secrets.secret.into_iter().collect();
    if let (Some(prev), Some(until)) = (t.secrets.previous, t.secrets.previous_until) {
        if now < until {
            secrets.push(prev);
        }
    }
    let body = t.payload;
    let sig = signature::signature_header(&secrets, t.event_id, timestamp, body)
        .map_err(|e| worker::Error::RustError(e.to_string()))?;
    let number_s = number.to_string();
    let ts_s = timestamp.to_string();
    let timeout_ms = u64::from(cfg.settings.webhooks.timeout_ms);
    let headers = [
        ("Content-Type", "application/json"),
        ("User-Agent", "postguard-webhooks/0.1"),
        ("webhook-id", t.event_id),
        ("webhook-timestamp", ts_s.as_str()),
        ("webhook-signature", sig.as_str()),
        ("X-Event-Id", t.event_id),
        ("X-Event-Type", t.event_type),
        ("X-Delivery-Attempt", number_s.as_str()),
        ("X-Request-Id", request_id),
    ];
    Ok(match send(url, body, &headers, timeout_ms).await {
        None => (
            AttemptResult::Timeout,
            Some(format!("no answer within {timeout_ms} ms")),
            None,
        ),
        Some(Err(e)) => {
            let msg = e.to_string();
            let error = format!("network error: {}", msg.trim())
                .trim_end_matches(": ")
                .to_string();
            (AttemptResult::NetworkError, Some(error), None)
        }
        Some(Ok((code, retry_after, bytes))) => (
            AttemptResult::Status { code, retry_after },
            None,
            Some(excerpt(&bytes, EXCERPT_CHARS)),
        ),
    })
}

fn ids_now() -> String {
    let (now, rnd) = new_ulid_parts();
    ids::request_id(now, rnd)
}

/// One attempt as recorded in the delivery log.
struct AttemptRow {
    number: u32,
    url: String,
    error: Option<String>,
    excerpt: Option<String>,
    duration_ms: u64,
    request_id: String,
    at: u64,
}

/// An attempt to record, and what the core made of it.
struct Recorded {
    delivery_id: String,
    project: String,
    subscription_id: String,
    sub_url: Option<String>,
    failing_since: Option<u64>,
    claim: Claim,
    result: Attempted,
    row: AttemptRow,
    transition: Transition,
}

/// How often a lost status write is settled again on a fresh read before
/// giving up (the attempt stays recorded; another attempt decides).
const SETTLE_ROUNDS: usize = 3;

/// Writes every attempt row and applies every status write in one D1
/// `batch()` of two multi-row statements. A compare-and-set that did not
/// hold (another attempt wrote first) is settled again on a fresh read, its
/// row's next retry corrected.
async fn record_all(env: &Env, cfg: &Config, records: &[Recorded]) -> Result<()> {
    if records.is_empty() {
        return Ok(());
    }
    let db = env.d1(bindings::DB)?;
    let writes: Vec<(&Recorded, Write)> = records
        .iter()
        .filter_map(|r| r.transition.write.map(|w| (r, w)))
        .collect();
    let mut statements = vec![insert_attempts(&db, records)?];
    if !writes.is_empty() {
        statements.push(cas_many(&db, &writes)?);
    }
    let results = db.batch(statements).await?;
    let held: Vec<Id> = match results.get(1) {
        Some(r) => r.results()?,
        None => Vec::new(),
    };
    let mut lost: Vec<&Recorded> = writes
        .into_iter()
        .map(|(r, _)| r)
        .filter(|r| !held.iter().any(|h| h.id == r.delivery_id))
        .collect();
    for _ in 0..SETTLE_ROUNDS {
        if lost.is_empty() {
            return Ok(());
        }
        lost = settle_again(env, cfg, &db, &lost).await?;
    }
    worker::console_warn!(
        "{} deliveries changed under every re-settle; left to their later attempts",
        lost.len()
    );
    Ok(())
}

/// Settles `lost` again on a fresh read; returns those that lost again.
async fn settle_again<'a>(
    env: &Env,
    cfg: &Config,
    db: &D1Database,
    lost: &[&'a Recorded],
) -> Result<Vec<&'a Recorded>> {
    let ids: Vec<&str> = lost.iter().map(|r| r.delivery_id.as_str()).collect();
    let fresh = load_many(env, &ids).await?;
    let now = now_ms();
    let mut statements = Vec::new();
    let mut writes = Vec::new();
    for r in lost {
        let Some(t) = fresh.iter().find(|t| t.id == r.delivery_id) else {
            continue;
        };
        let schedule = &cfg.settings.webhooks.schedule_s;
        let tr = delivery::settle(&t.snapshot(), &r.claim.attempt, &r.result, schedule, now);
        follow_up(env, &r.delivery_id, &tr).await?;
        statements.push(
            db.prepare(
                "UPDATE attempts SET next_retry_at = ? WHERE delivery_id = ? AND request_id = ?",
            )
            .bind(&[
                opt_num(tr.follow_up.map(|f| f.at)),
                text(&r.delivery_id),
                text(&r.row.request_id),
            ])?,
        );
        if let Some(w) = tr.write {
            statements.push(cas(db, &r.delivery_id, &w)?);
            writes.push((*r, statements.len() - 1));
        }
    }
    let ok = changed(db, statements).await?;
    Ok(writes
        .into_iter()
        .filter(|(_, i)| !ok[*i])
        .map(|(r, _)| r)
        .collect())
}

fn opt_num(v: Option<u64>) -> JsValue {
    v.map_or(JsValue::NULL, num)
}

/// One attempt row: the columns of `attempts` in order, an element of the
/// JSON array bound to the multi-row insert.
type AttemptCols<'a> = (
    &'a str,
    &'a str,
    u32,
    &'a str,
    Option<u16>,
    Option<&'a str>,
    Option<&'a str>,
    u64,
    u64,
    Option<u64>,
);

/// Every attempt row of the batch in one statement.
fn insert_attempts(db: &D1Database, records: &[Recorded]) -> Result<D1PreparedStatement> {
    let rows: Vec<AttemptCols> = records
        .iter()
        .map(|r| {
            let a = &r.row;
            let status_code = match &r.result {
                Attempted::Sent(AttemptResult::Status { code, .. }) => Some(*code),
                _ => None,
            };
            (
                r.delivery_id.as_str(),
                a.request_id.as_str(),
                a.number,
                a.url.as_str(),
                status_code,
                a.error.as_deref(),
                a.excerpt.as_deref(),
                a.duration_ms,
                a.at,
                r.transition.follow_up.map(|f| f.at),
            )
        })
        .collect();
    db.prepare(
        "INSERT OR IGNORE INTO attempts (delivery_id, request_id, attempt, url, status_code, error, response_excerpt, duration_ms, at, next_retry_at) \
         SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'), json_extract(value, '$[3]'), \
         json_extract(value, '$[4]'), json_extract(value, '$[5]'), json_extract(value, '$[6]'), json_extract(value, '$[7]'), \
         json_extract(value, '$[8]'), json_extract(value, '$[9]') FROM json_each(?)",
    )
    .bind(&[text(&to_json(&rows)?)])
}

/// Every status write of the batch as one compare-and-set statement; it
/// returns the ids of the deliveries whose write held.
fn cas_many(db: &D1Database, writes: &[(&Recorded, Write)]) -> Result<D1PreparedStatement> {
    let rows: Vec<(&str, &str, Option<u64>, &str, u32)> = writes
        .iter()
        .map(|(r, w)| {
            let e = w.expect;
            let id = r.delivery_id.as_str();
            (
                id,
                w.status.as_str(),
                w.next_attempt_at,
                e.status.as_str(),
                e.attempts_made,
            )
        })
        .collect();
    db.prepare(
        "UPDATE deliveries SET status = json_extract(j.value, '$[1]'), next_attempt_at = json_extract(j.value, '$[2]'), updated_at = ? \
         FROM json_each(?) AS j WHERE deliveries.id = json_extract(j.value, '$[0]') \
         AND deliveries.status = json_extract(j.value, '$[3]') AND deliveries.attempts_made = json_extract(j.value, '$[4]') RETURNING id",
    )
    .bind(&[num(now_ms()), text(&to_json(&rows)?)])
}

/// The compare-and-set status write: only where the delivery is still as the
/// core saw it when it settled.
fn cas(db: &D1Database, id: &str, w: &Write) -> Result<D1PreparedStatement> {
    db.prepare(
        "UPDATE deliveries SET status = ?, next_attempt_at = ?, updated_at = ? \
         WHERE id = ? AND status = ? AND attempts_made = ?",
    )
    .bind(&[
        text(w.status.as_str()),
        opt_num(w.next_attempt_at),
        num(now_ms()),
        text(id),
        text(w.expect.status.as_str()),
        num(u64::from(w.expect.attempts_made)),
    ])
}

/// Cron safety net: deliveries whose next attempt is overdue by
/// `webhooks.requeue_after_s` (default 15 minutes: a lost message, a failed
/// enqueue) are queued again.
pub async fn requeue_stuck(env: &Env, after_s: u32) -> Result<u32> {
    #[derive(Deserialize)]
    struct Stuck {
        id: String,
        status: Status,
        next_attempt_at: u64,
    }
    let cutoff = now_ms().saturating_sub(u64::from(after_s) * 1_000);
    let db = env.d1(bindings::DB)?;
    let mut binds: Vec<JsValue> = Status::ALL
        .into_iter()
        .filter(|s| s.in_progress())
        .map(|s| text(s.as_str()))
        .collect();
    let marks = vec!["?"; binds.len()].join(", ");
    binds.push(num(cutoff));
    let stuck: Vec<Stuck> = db
        .prepare(format!("SELECT d.id, d.status, d.next_attempt_at FROM deliveries d \
                          LEFT JOIN subscription_owners o ON o.subscription_id = d.subscription_id \
                          WHERE d.status IN ({marks}) AND d.next_attempt_at < ? AND o.key_revoked_at IS NULL LIMIT 500"))
        .bind(&binds)?
        .all()
        .await?
        .results()?;
    let at = now_ms();
    // Re-plan first, so the new jobs are the ones that match `next_attempt_at`;
    // compare-and-set, so an attempt that moved on meanwhile is left alone.
    let touch: Vec<_> = stuck
        .iter()
        .map(|s| {
            db.prepare("UPDATE deliveries SET next_attempt_at = ? WHERE id = ? AND status = ? AND next_attempt_at = ?")
                .bind(&[num(at), text(&s.id), text(s.status.as_str()), num(s.next_attempt_at)])
        })
        .collect::<Result<_>>()?;
    let touched = changed(&db, touch).await?;
    let jobs: Vec<Job> = stuck
        .iter()
        .zip(touched)
        .filter(|(_, t)| *t)
        .map(|(s, _)| Job::scheduled(s.id.clone(), at))
        .collect();
    if jobs.is_empty() {
        return Ok(0);
    }
    let n = u32::try_from(jobs.len()).unwrap_or(u32::MAX);
    super::enqueue(env, jobs).await?;
    Ok(n)
}

/// The failure clock of each attempted subscription (a redirect says nothing
/// about it): a success resets it, a failure starts it, and 410 or failing
/// for `webhooks.disable_after_s` disables the subscription — its pending
/// deliveries are then held — and publishes `postguard.subscription.disabled`
/// to the project's other matching subscriptions. A healthy subscription
/// costs no write.
async fn health_all(env: &Env, cfg: &Config, records: &[Recorded]) -> Result<()> {
    let db = env.d1(bindings::DB)?;
    let after_s = cfg.settings.webhooks.disable_after_s;
    let now = now_ms();
    let mut statements = Vec::new();
    let mut disables = Vec::new();
    for r in records {
        if r.claim.attempt.mode == delivery::Mode::Redirect || r.sub_url.is_none() {
            continue;
        }
        let sub = text(&r.subscription_id);
        match ops::health(r.failing_since, &r.result, now, after_s) {
            Some(Health::Healthy) if r.failing_since.is_some() => statements.push(
                db.prepare("UPDATE subscription_ops SET failing_since = NULL WHERE subscription_id = ?")
                    .bind(&[sub])?,
            ),
            Some(Health::Failing { since }) if r.failing_since.is_none() => statements.push(
                db.prepare("INSERT INTO subscription_ops (subscription_id, project, failing_since) VALUES (?, ?, ?) \
                            ON CONFLICT (subscription_id) DO UPDATE SET failing_since = COALESCE(failing_since, excluded.failing_since)")
                    .bind(&[sub, text(&r.project), num(since)])?,
            ),
            Some(Health::Disable { reason, since }) => {
                statements.push(
                    db.prepare("INSERT INTO subscription_ops (subscription_id, project, state, disabled_reason, disabled_at, failing_since) VALUES (?, ?, 'disabled', ?, ?, ?) \
                                ON CONFLICT (subscription_id) DO UPDATE SET state = 'disabled', disabled_reason = excluded.disabled_reason, disabled_at = excluded.disabled_at, \
                                failing_since = COALESCE(subscription_ops.failing_since, excluded.failing_since) WHERE subscription_ops.state = 'active'")
                        .bind(&[sub, text(&r.project), text(reason.as_str()), num(now), num(since)])?,
                );
                disables.push((statements.len() - 1, r, reason));
            }
            _ => {}
        }
    }
    let ok = changed(&db, statements).await?;
    for (i, r, reason) in disables {
        if ok[i] {
            announce_disabled(env, cfg, r, reason.as_str(), now).await?;
        }
    }
    Ok(())
}

/// Publishes `postguard.subscription.disabled` {id, url, reason, since}.
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
        "since": events::rfc3339_ms(at),
    });
    let event_id = super::new_id("evt_");
    let event = super::publish::Event {
        project: &r.project,
        id: &event_id,
        event_type: ops::DISABLED_EVENT,
        data: &data,
        request_id: &r.row.request_id,
    };
    super::publish::fan_out(env, cfg, &event, Some(&r.subscription_id)).await?;
    Ok(())
}

/// Resume: every `paused` delivery of `subscription_id` back to `pending`,
/// due now (compare-and-set on `paused`), queued in creation order, 100 at a
/// time.
pub async fn release_held(env: &Env, subscription_id: &str) -> Result<u32> {
    #[derive(Deserialize)]
    struct Held {
        id: String,
    }
    let db = env.d1(bindings::DB)?;
    let mut released = 0u32;
    loop {
        let held: Vec<Held> = db
            .prepare("SELECT id FROM deliveries WHERE subscription_id = ? AND status = 'paused' ORDER BY created_at, id LIMIT 100")
            .bind(&[text(subscription_id)])?
            .all()
            .await?
            .results()?;
        if held.is_empty() {
            return Ok(released);
        }
        let now = now_ms();
        let statements = held
            .iter()
            .map(|h| {
                db.prepare("UPDATE deliveries SET status = 'pending', next_attempt_at = ?, updated_at = ? WHERE id = ? AND status = 'paused'")
                    .bind(&[num(now), num(now), text(&h.id)])
            })
            .collect::<Result<_>>()?;
        let ok = changed(&db, statements).await?;
        let jobs: Vec<Job> = held
            .into_iter()
            .zip(ok)
            .filter(|(_, ok)| *ok)
            .map(|(h, _)| Job {
                ordered: true,
                ..Job::scheduled(h.id, now)
            })
            .collect();
        released += u32::try_from(jobs.len()).unwrap_or(u32::MAX);
        if !jobs.is_empty() {
            env.queue(bindings::DELIVERIES)?.send_batch(jobs).await?;
        }
    }
}

/// A task message's body, or `None` (logged) when malformed.
pub fn task_step(m: &Msg) -> Option<TaskStep> {
    TaskStep::deserialize(m.body())
        .map_err(|e| worker::console_error!("dropping a malformed task message: {}", e))
        .ok()
}
