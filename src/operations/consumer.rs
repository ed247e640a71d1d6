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
use worker::{web_sys, Env, MessageBatch, MessageExt};

use super::queue::Message;
use crate::durable::client::{CallError, Guard};
use crate::http::{self, raw_header_pairs};
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

/// Starts, runs and settles one attempt of operation `id`.
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
    };
    let (reply, body) = guard.call::<StartOp>(&start, &[]).await?;
    let StartOpReply::Started { op } = reply else {
        return Ok(());
    };
    let body = match &op.request.body_object {
        Some(object) => read_object(env, object).await?,
        None => body,
    };
    let origin = origin_request(cfg, &op, body);
    let outcome = call_origin(origin, cfg).await;
    let (done, payload, object) = keep(env, cfg, &key_id, &op, outcome).await;
    let finish = FinishOpRequest {
        id: op.id.clone(),
        attempt: op.attempts,
        event: event_of(cfg, &key_id, &op, &done, &payload),
        outcome: done,
        schedule_s: cfg.settings.webhooks.schedule_s.clone(),
    };
    let reply = finish_with_retry(&guard, &finish, &payload).await?;
    // An answer the operation does not keep (a retryable one, or a late
    // one) leaves no object behind.
    if let (false, Some(object)) = (reply.kept, object) {
        replays::delete(env, vec![object]).await;
    }
    Ok(())
}

/// Settles the attempt, with one retry: a lost `finish` leaves the
/// operation running until its lease ends, then the call runs again.
async fn finish_with_retry(
    guard: &Guard,
    finish: &FinishOpRequest,
    payload: &[u8],
) -> Result<FinishOpReply, CallError> {
    match guard.call::<FinishOp>(finish, payload).await {
        Ok((reply, _)) => Ok(reply),
        Err(e) => {
            log::emit(
                Line::warn("operations: settling an attempt failed; trying once more")
                    .field("operation_id", finish.id.as_str())
                    .err(&e),
            );
            Ok(guard.call::<FinishOp>(finish, payload).await?.0)
        }
    }
}

async fn read_object(env: &Env, object: &str) -> Result<Vec<u8>, CallError> {
    let bucket = replays::bucket(env)
        .ok_or_else(|| worker::Error::RustError("the REPLAYS bucket is gone".into()))?;
    let gone = || worker::Error::RustError(format!("the request body {object} is gone"));
    let found = bucket.get(object).execute().await?.ok_or_else(gone)?;
    let body = found.body().ok_or_else(gone)?;
    Ok(body.bytes().await?)
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

/// What the origin said.
enum Answer {
    /// The body read whole.
    Read(u16, Vec<(String, String)>, Vec<u8>),
    /// Declared larger than the object keeps: streamed to R2, never held.
    Large(
        u16,
        Vec<(String, String)>,
        Option<web_sys::ReadableStream>,
        u64,
    ),
}

/// Sends the request within `async.timeout_ms` (then aborted).
async fn call_origin(origin: OriginRequest, cfg: &Config) -> Result<Answer, NoAnswer> {
    let max_inline = cfg.settings.idempotency.max_stored_body_bytes;
    let controller = web_sys::AbortController::new().map_err(|_| NoAnswer::Unreachable)?;
    let signal = controller.signal();
    let work = async move {
        let resp = http::fetch_manual(
            &origin.url,
            &origin.method,
            &origin.headers,
            &origin.body,
            &signal,
        )
        .await?;
        let status = resp.status();
        let headers = raw_header_pairs(&resp.headers());
        let declared = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse::<u64>().ok());
        if let Some(len) = declared.filter(|len| *len > max_inline) {
            return Ok(Answer::Large(status, headers, resp.body(), len));
        }
        let body = http::read_body(&resp).await?;
        Ok::<_, worker::Error>(Answer::Read(status, headers, body))
    };
    match within(u64::from(cfg.settings.async_ops.timeout_ms), work).await {
        Some(Ok(answer)) => Ok(answer),
        Some(Err(e)) => {
            log::emit(Line::warn("operations: the origin could not be reached").err(e));
            Err(NoAnswer::Unreachable)
        }
        None => {
            controller.abort();
            Err(NoAnswer::Timeout)
        }
    }
}

/// The attempt's outcome as the object keeps it, the body to send with it
/// (kept in the object), and the R2 object holding it otherwise. A body R2
/// could not take is recorded as unavailable: `/result` then answers 410,
/// as a replay would.
async fn keep(
    env: &Env,
    cfg: &Config,
    key_id: &str,
    op: &Operation,
    outcome: Result<Answer, NoAnswer>,
) -> (Outcome, Vec<u8>, Option<String>) {
    let idem = &cfg.settings.idempotency;
    let stored = |status, headers: &[(String, String)], len: u64| StoredResponse {
        status,
        headers: storable_response_headers(headers, idem.store_set_cookie),
        body_omitted: len > idem.max_stored_body_bytes,
        body_object: None,
        body_len: len,
    };
    let object = super::object_key(key_id, &op.id, &format!("result-{}", op.attempts));
    let bucket = replays::bucket(env);
    match outcome {
        Err(why) => (Outcome::NoAnswer(why), Vec::new(), None),
        Ok(Answer::Read(status, headers, body)) => {
            let mut r = stored(status, &headers, body.len() as u64);
            if !r.body_omitted {
                return (Outcome::Answer(r), body, None);
            }
            let kept = match (&bucket, body.len() as u64 <= idem.max_replay_bytes) {
                (Some(b), true) => replays::put_bytes(b, &object, body).await.is_ok(),
                _ => false,
            };
            r.body_object = kept.then(|| object.clone());
            (Outcome::Answer(r), Vec::new(), kept.then_some(object))
        }
        Ok(Answer::Large(status, headers, stream, len)) => {
            let mut r = stored(status, &headers, len);
            let kept = match (&bucket, stream, len <= idem.max_replay_bytes) {
                (Some(b), Some(s), true) => replays::put_stream(b, &object, s, len).await.is_ok(),
                _ => false,
            };
            r.body_object = kept.then(|| object.clone());
            (Outcome::Answer(r), Vec::new(), kept.then_some(object))
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
