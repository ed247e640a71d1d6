//! The `OPERATIONS` queue consumer: one message = "start operation `id`".
//! Per message: `start` in the key's object (a compare-and-set on the next
//! attempt: a duplicate, early or stale message starts nothing), the origin
//! call with `async.timeout_ms`, the answer's body kept (in the object, or
//! R2 above `max_stored_body_bytes`), then `finish` (the object settles the
//! attempt: done, or queued again on the webhook schedule). The messages of
//! a batch run at the same time.
//!
//! A consumer that dies mid-call leaves the operation `running`; its
//! object's alarm finds the lease run out and hands it to the queue again,
//! so the call runs once more (with the same Idempotency-Key, which the
//! origin sees) — as §4 allows for a claim cut by a crash.

use postguard_core::config::Config;
use postguard_core::guard::{
    Claim, FinishOp, FinishOpReply, FinishOpRequest, StartOp, StartOpReply, StartOpRequest,
};
use postguard_core::headers::storable_response_headers;
use postguard_core::idempotency::StoredResponse;
use postguard_core::log::Line;
use postguard_core::operations::{self, NoAnswer, Operation, Outcome};
use postguard_core::proxy::{self, Identity, Incoming, OriginRequest};
use postguard_core::response_events::{self, PendingEvent, Trace};
use worker::{Env, MessageBatch, MessageExt};

use super::queue::Message;
use crate::durable::client::{CallError, Guard};
use crate::http::{self, AnswerBody, OriginAnswer};
use crate::log;
use crate::replays;
use crate::runtime::{now_ms, within};

/// Handles one batch of `postguard-operations`.
pub async fn handle(batch: MessageBatch<serde_json::Value>, env: &Env, cfg: &Config) {
    let messages = match batch.messages() {
        Ok(m) => m,
        Err(e) => {
            log::emit(Line::error("operations: reading the batch failed").err(e));
            batch.retry_all();
            return;
        }
    };
    let runs = messages.iter().map(|m| async move {
        let parsed: Result<Message, _> = serde_json::from_value(m.body().clone());
        let Ok(msg) = parsed else {
            log::emit(Line::error("operations: dropping a malformed message"));
            return m.ack();
        };
        match run(env, cfg, &msg.operation_id).await {
            Ok(()) => m.ack(),
            // The queue delivers it again; if it never does, the object's
            // alarm hands the operation on when it is due.
            Err(e) => {
                log::emit(
                    Line::error("operations: an attempt failed in the gateway")
                        .field("operation_id", msg.operation_id.as_str())
                        .err(e),
                );
                m.retry();
            }
        }
    });
    futures_util::future::join_all(runs).await;
}

/// Starts, runs and settles one attempt of operation `id`: the origin call
/// and the keeping of its answer both within `async.timeout_ms`.
async fn run(env: &Env, cfg: &Config, id: &str) -> Result<(), CallError> {
    let Some(key_id) = operations::key_id_of(id) else {
        log::emit(
            Line::error("operations: a message names no operation").field("operation_id", id),
        );
        return Ok(());
    };
    let guard = Guard::of(env, &key_id)?;
    let start = StartOpRequest {
        id: id.to_string(),
        lease_ms: operations::lease_ms(&cfg.settings),
        max_attempts: operations::max_attempts(&cfg.settings.webhooks.schedule_s),
    };
    let (reply, body) = guard.call::<StartOp>(&start, &[]).await?;
    let StartOpReply::Started { op } = reply else {
        return Ok(());
    };
    let body = match &op.request.body_object {
        Some(object) => match read_object(env, object).await? {
            Some(body) => body,
            None => {
                let gone = Outcome::NoAnswer(NoAnswer::BodyMissing);
                return settle(&guard, cfg, &op, gone, None, &[]).await.map(|_| ());
            }
        },
        None => body,
    };
    let timeout_ms = u64::from(cfg.settings.async_ops.timeout_ms);
    let started = now_ms();
    let origin = origin_request(cfg, &op, body);
    let max_inline = cfg.settings.idempotency.max_stored_body_bytes;
    let answer = http::fetch_within(&origin, timeout_ms, Some(max_inline)).await;
    let left_ms = timeout_ms.saturating_sub(now_ms().saturating_sub(started));
    let (done, payload, object) = keep(env, cfg, &key_id, &op, answer, left_ms).await;
    let event = event_of(cfg, &key_id, &op, &done, &payload);
    let reply = settle(&guard, cfg, &op, done, event, &payload).await?;
    // An answer the operation does not keep (a retryable one, or a late
    // one) leaves no object behind.
    if let (false, Some(object)) = (reply.kept, object) {
        replays::delete(env, vec![object]).await;
    }
    Ok(())
}

/// Tries to record an attempt's outcome this many times before recording
/// it without its body.
const FINISH_TRIES: u32 = 3;

/// Settles the attempt. A `finish` that keeps failing (its body or event
/// too much for the object, or the object failing) is sent once more
/// without them (`Outcome::without_body`): a final answer is then recorded
/// as not kept — the operation ran and ends `failed` — instead of the
/// attempt being cut and run again.
async fn settle(
    guard: &Guard,
    cfg: &Config,
    op: &Operation,
    outcome: Outcome,
    event: Option<PendingEvent>,
    payload: &[u8],
) -> Result<FinishOpReply, CallError> {
    let finish = FinishOpRequest {
        id: op.id.clone(),
        attempt: op.attempts,
        event,
        outcome,
        schedule_s: cfg.settings.webhooks.schedule_s.clone(),
    };
    for attempt in 1..=FINISH_TRIES {
        match guard.call::<FinishOp>(&finish, payload).await {
            Ok((reply, _)) => return Ok(reply),
            Err(e) => log::emit(
                Line::warn("operations: settling an attempt failed")
                    .field("operation_id", finish.id.as_str())
                    .field("attempt", attempt)
                    .err(&e),
            ),
        }
    }
    let bare = FinishOpRequest {
        outcome: finish.outcome.without_body(),
        event: None,
        ..finish
    };
    Ok(guard.call::<FinishOp>(&bare, &[]).await?.0)
}

/// The request body an operation keeps in R2; `None` when it is gone.
async fn read_object(env: &Env, object: &str) -> Result<Option<Vec<u8>>, CallError> {
    let Some(bucket) = replays::bucket(env) else {
        return Ok(None);
    };
    let Some(found) = bucket.get(object).execute().await? else {
        return Ok(None);
    };
    match found.body() {
        Some(body) => Ok(Some(body.bytes().await?)),
        None => Ok(None),
    }
}

/// The request to the origin, as the proxy would have sent it (docs/request-path.md), signed now, with the operation's request id and Idempotency-Key.
fn origin_request(cfg: &Config, op: &Operation, body: Vec<u8>) -> OriginRequest {
    let r = &op.request;
    let mut headers = r.headers.clone();
    if let Some(ip) = &r.client_ip {
        headers.push(("cf-connecting-ip".into(), ip.clone()));
    }
    let incoming = Incoming {
        method: r.method.clone(),
        path: r.path().to_string(),
        path_and_query: r.path_and_query.clone(),
        headers,
        body,
        oversized: false,
    };
    let identity = Identity {
        project: &r.project,
        key_prefix: &r.key_prefix,
        plan: &r.plan,
        meta: r.meta.as_deref(),
    };
    let claim = Claim {
        key: r.idempotency_key.clone(),
        fingerprint: String::new(),
        request_id: op.request_id.clone(),
        lease_ms: 0,
    };
    let now_s = now_ms() / 1000;
    proxy::origin_request(
        cfg,
        incoming,
        &identity,
        Some(&claim),
        &op.request_id,
        now_s,
    )
}

/// The attempt's outcome as the object keeps it, the body to send with it
/// (kept in the object), and the R2 object holding it otherwise. A final
/// answer too large for the object goes to R2 within `left_ms` (what the
/// attempt's timeout leaves); one R2 cannot take — no bucket, past
/// `max_replay_bytes`, a failed or late write — is `NotKept`: the operation
/// ran, and ends `failed` rather than run again. A large answer the
/// operation will not keep (a 5xx, retried) is not stored at all.
async fn keep(
    env: &Env,
    cfg: &Config,
    key_id: &str,
    op: &Operation,
    answer: Result<OriginAnswer, http::NoAnswer>,
    left_ms: u64,
) -> (Outcome, Vec<u8>, Option<String>) {
    let answer = match answer {
        Ok(a) => a,
        Err(http::NoAnswer::Timeout) => {
            return (Outcome::NoAnswer(NoAnswer::Timeout), Vec::new(), None)
        }
        Err(http::NoAnswer::Unreachable(e)) => {
            log::emit(Line::warn("operations: the origin could not be reached").err(e));
            return (Outcome::NoAnswer(NoAnswer::Unreachable), Vec::new(), None);
        }
    };
    let idem = &cfg.settings.idempotency;
    let mut stored = StoredResponse {
        status: answer.status,
        headers: storable_response_headers(&answer.headers, idem.store_set_cookie),
        body_omitted: true,
        body_object: None,
        body_len: answer.body.known_len().unwrap_or(0),
    };
    let (stream, len) = match answer.body {
        AnswerBody::Read(body) => {
            stored.body_omitted = false;
            return (Outcome::Answer(stored), body, None);
        }
        AnswerBody::Large { body, len } => (body, len),
        AnswerBody::Through(body) => (body, None),
    };
    if !postguard_core::idempotency::is_storable_status(stored.status) {
        return (Outcome::Answer(stored), Vec::new(), None);
    }
    let object = super::object_key(key_id, &op.id, &format!("result-{}", op.attempts));
    let put = async {
        let (Some(bucket), Some(stream)) = (replays::bucket(env), stream) else {
            return Ok(None);
        };
        match len {
            Some(len) if len > idem.max_replay_bytes => Ok(None),
            Some(len) => replays::put_stream(&bucket, &object, stream, len)
                .await
                .map(|()| Some(len)),
            None => {
                crate::streams::put_unsized(&bucket, &object, &stream, idem.max_replay_bytes).await
            }
        }
    };
    match within(left_ms, put).await {
        Some(Ok(Some(bytes))) => {
            stored.body_object = Some(object.clone());
            stored.body_len = bytes;
            (Outcome::Answer(stored), Vec::new(), Some(object))
        }
        late_or_not_kept => {
            if let Some(Err(e)) = late_or_not_kept {
                log::emit(Line::error("operations: storing a large answer failed").err(e));
            }
            let status = stored.status;
            (Outcome::NotKept { status }, Vec::new(), None)
        }
    }
}

/// The event the answer implies (`events_from_responses`); the object
/// publishes it only if the operation succeeds with this answer.
fn event_of(
    cfg: &Config,
    key_id: &str,
    op: &Operation,
    outcome: &Outcome,
    body: &[u8],
) -> Option<PendingEvent> {
    let Outcome::Answer(r) = outcome else {
        return None;
    };
    if !postguard_core::idempotency::is_storable_status(r.status) {
        return None;
    }
    let trace = Trace {
        method: &op.request.method,
        path: op.request.path(),
        project: &op.request.project,
        key_id,
        idempotency_key: &op.request.idempotency_key,
        request_id: &op.request_id,
    };
    let body = (!r.body_omitted).then_some(body);
    let rules = &cfg.settings.events_from_responses;
    match response_events::for_response(rules, &trace, r.status, body) {
        Ok(ev) => ev,
        Err(why) => {
            log::emit(
                Line::warn("no event for the operation's answer")
                    .field("operation_id", op.id.as_str())
                    .field("request_id", op.request_id.as_str())
                    .field("reason", why.to_string()),
            );
            None
        }
    }
}
