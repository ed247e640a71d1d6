//! The proxy pipeline, in the contract's order (docs/request-path.md): authenticate →
//! rate-limit + claim (one Durable Object round trip: the key's object, or with
//! `limits.edge` on its edge object in this location, `edge.rs`) → forward → record
//! (complete or release the claim). The decisions of each phase are in
//! `postguard_core::proxy`; this module does their I/O.
//!
//! Every answer after authentication carries the rate-limit headers.

use crate::log;
use crate::operations::{self, respond};
use postguard_core::config::Config;
use postguard_core::guard::{
    AdmitRequest, AdmitResponse, Claim, Complete, CompleteRequest, Release, ReleaseRequest, Slot,
};
use postguard_core::headers::client_response_headers;
use postguard_core::limits::{self, Verdicts};
use postguard_core::log::Line;
use postguard_core::proxy::{
    self, admission, origin_request, preflight, Admission, Answered, Failure, Identity, Incoming,
    Keep, OriginRequest, Preflight, Settlement,
};
use worker::{web_sys, Context, Env};

use crate::auth::{self, Caller};
use crate::durable::client::Guard;
use crate::edge;
use crate::http::{self, AnswerBody, NoAnswer, OriginAnswer};
use crate::reject::{Extra, Handled, Reject};
use crate::replays;
use crate::request::{self, Body};
use crate::runtime::{now_ms, RequestCtx};

pub async fn proxy(
    req: http::Client,
    env: &Env,
    cfg: &Config,
    rc: &RequestCtx,
    ctx: &Context,
) -> Handled {
    let method = req.method.to_ascii_uppercase();
    proxy::check_method(&method)?;
    // 1. Authenticate.
    let cred = auth::credential_of(&req.headers, cfg);
    let caller = auth::api_caller(cred, &req.headers, env, cfg, rc).await?;
    let colo = edge::location(&req.raw, &cfg.settings.limits.edge);
    let incoming = read(req, method, cfg.settings.max_body_bytes).await?;
    let pre = preflight(&cfg.settings, &incoming, &rc.request_id, now_ms());
    rc.note(|f| {
        f.idempotency_key = pre.idempotency_key.clone();
        f.missing_idempotency_key = pre.missing_key;
    });
    // Branch point: `Prefer: respond-async` on an async route runs as an
    // operation (ADR 0037), answered 202 by its own path.
    if operations::accept::wanted(cfg, &incoming) {
        return operations::accept::accept(env, cfg, rc, ctx, &caller, incoming, pre).await;
    }
    // 2 + 3. Limits, a concurrency slot and the claim: one round trip to the key's object,
    // or to its edge object in this location (ADR 0040).
    let guard = Guard::of(env, &caller.key.record.id)?;
    let at = (env, &guard, colo.as_deref());
    let (admitted, replay_body, held) = admit(at, cfg, rc, &caller, &incoming, &pre).await?;
    let mut rl = match &admitted {
        Admission::Revoked => return Err(auth::revoked(&caller.key).into()),
        Admission::Expired => return Err(auth::expired(&caller.key).into()),
        Admission::Refused { verdicts, .. }
        | Admission::Replay { verdicts, .. }
        | Admission::Accepted { verdicts, .. }
        | Admission::Forward { verdicts, .. } => limit_headers(rc, verdicts),
    };
    // The configured text (checked RFC 3339 at load) as the operator wrote it.
    if let (Some(_), Some(at)) = (pre.required_from, &cfg.settings.idempotency.required_from) {
        rl.push((proxy::REQUIRED_FROM_HEADER, at.clone()));
    }
    let refresh = match admitted {
        Admission::Refused { problem, .. } => return Err(Reject::from(problem).with(&rl)),
        Admission::Replay { stored, .. } => {
            return replays::replay(env, rc, stored, replay_body, &rl).await
        }
        // Branch point: the key names an operation; its 202 again.
        Admission::Accepted {
            operation, again, ..
        } => return operations::accept::answer(rc, &operation, again, false, &rl),
        Admission::Forward { refresh, .. } => refresh,
        Admission::Revoked | Admission::Expired => None,
    };
    // 4. Forward, as the key is now (a change the operator made since this
    // isolate cached the key applies from this request).
    if refresh.is_some() {
        auth::forget(&caller.key.hash);
    }
    let meta = match &refresh {
        Some(p) => p.meta.clone(),
        None => caller.key.record.meta_header(),
    };
    let identity = Identity {
        plan: refresh
            .as_ref()
            .map_or(&caller.key.record.plan, |p| &p.plan),
        ..Identity::of(&caller.key.record, meta.as_deref())
    };
    let claim = pre.claim.as_ref();
    let route = claim.and_then(|_| respond::route_of(cfg, &incoming));
    let now_s = now_ms() / 1000;
    let origin = origin_request(cfg, incoming, &identity, claim, &rc.request_id, now_s);
    rc.note(|f| {
        f.origin = Some(origin.origin.clone());
        f.claimed = claim.is_some();
    });
    let sent_at = now_ms();
    let outcome = forward(origin, cfg).await;
    rc.facts.borrow_mut().origin_ms = Some(now_ms().saturating_sub(sent_at));
    // 5. Record (which frees the concurrency slot with the claim), or free
    // the slot of a request without one once the origin has answered.
    let outcome = match claim {
        Some(c) => {
            let at = (&caller, c, route.as_ref());
            record(env, &guard, cfg, rc, ctx, at, outcome).await
        }
        None => {
            edge::free_slot(held, &rc.request_id, ctx);
            outcome
        }
    };
    respond(rc, outcome, &rl)
}

/// The client's request, body read under the limit (a request answered
/// before this point never has its body read; an oversized one is answered
/// 413 after the limiter, with its headers, and never forwarded).
async fn read(req: http::Client, method: String, max: u64) -> Handled<Incoming> {
    let path_and_query = req.path_and_query();
    let (body, oversized) = match proxy::has_body(&method) {
        true => match request::read_bounded(&req.raw, req.content_length(), max).await? {
            Body::Read(b) => (b, false),
            Body::TooLarge => (Vec::new(), true),
        },
        false => (Vec::new(), false),
    };
    Ok(Incoming {
        method,
        path: req.path,
        path_and_query,
        headers: req.headers,
        body,
        oversized,
    })
}

/// The one object call: charge every policy, take a concurrency slot and
/// claim the Idempotency-Key. A request answered early never claims its key
/// nor takes a slot. Where its slot is held comes back with the answer.
async fn admit(
    (env, guard, colo): (&Env, &Guard, Option<&str>),
    cfg: &Config,
    rc: &RequestCtx,
    caller: &Caller,
    incoming: &Incoming,
    pre: &Preflight,
) -> Handled<(Admission, Vec<u8>, Option<edge::Held>)> {
    let limits = caller.plan.limits();
    let slot = match (limits.concurrency, &pre.early) {
        (Some(_), None) => Some(Slot {
            id: rc.request_id.clone(),
            lease_ms: u64::from(cfg.settings.idempotency.lease_s) * 1000,
        }),
        _ => None,
    };
    let req = AdmitRequest {
        claim: pre.claim.clone(),
        slot,
        caller: Some(caller.view()),
        notices: caller.notice_to(&rc.request_id),
        ..AdmitRequest::charge(cfg.settings.cost(&incoming.method, &incoming.path), limits)
    };
    let lease_ms = u64::from(cfg.settings.idempotency.lease_s) * 1000;
    let settings = &cfg.settings.limits.edge;
    let key_id = &caller.key.record.id;
    let edge::Admitted {
        answer,
        payload,
        slot,
    } = edge::admit(env, guard, key_id, colo, (req, settings, lease_ms)).await?;
    if let AdmitResponse::Admitted {
        would_refuse: Some(p),
        ..
    } = &answer
    {
        rc.note(|f| f.would_refuse = Some(p.clone()));
    }
    let next = admission(answer, pre.early.clone())
        .map_err(|e| worker::Error::RustError(e.to_string()))?;
    Ok((next, payload, slot))
}

fn limit_headers(rc: &RequestCtx, verdicts: &Verdicts) -> Extra {
    rc.note(|f| f.rate_limit_remaining = Some(verdicts.binding_verdict().remaining));
    limits::headers(verdicts)
}

/// A CORS preflight, forwarded to the origin signed but unauthenticated
/// (nothing is charged, claimed or attributed to a key; the sender's address
/// was counted before); the gateway's `Idempotency-Key` is added to what the
/// origin allows.
pub async fn preflight_to_origin(req: &http::Client, cfg: &Config, rc: &RequestCtx) -> Handled {
    let path_and_query = req.path_and_query();
    let now_s = now_ms() / 1000;
    let origin =
        proxy::preflight_request(cfg, &path_and_query, &req.headers, &rc.request_id, now_s);
    let answer = forward(origin, cfg)
        .await
        .map_err(|failure| Reject::from(failure.problem()))?;
    let mut out = client_response_headers(&answer.headers);
    postguard_core::cors::merge_forwarded_preflight(&mut out);
    Ok(http::respond(rc, answer.status, &out, &[], None)?)
}

/// Sends the request to the origin within its timeout. A claimed request's
/// answer is read whole only up to what the key's object keeps
/// (`max_stored_body_bytes`): past it, declared or not, it stays a stream.
async fn forward(origin: OriginRequest, cfg: &Config) -> Result<OriginAnswer, Failure> {
    let read = origin
        .buffer
        .then_some(cfg.settings.idempotency.max_stored_body_bytes);
    let timeout = origin.timeout_ms;
    http::fetch_within(&origin, u64::from(timeout), read)
        .await
        .map_err(|e| match e {
            NoAnswer::Timeout => Failure::Timeout(timeout),
            NoAnswer::Unreachable(e) => Failure::Unreachable(e.to_string()),
        })
}

/// Completes or releases the claim, before answering: a client that saw
/// this response gets it again on retry even if this isolate dies now, and a
/// client retrying right after a 5xx is not told 409. A body read whole
/// (within what the object keeps) is stored with the record, and only such
/// a body yields a response event. A larger one goes to R2 as it streams: it
/// is teed, the client's branch answered now and the record completed once
/// R2 has the rest (`waitUntil`; until then a retry is told 409 in
/// progress). Without R2, or past `max_replay_bytes`, the record says the
/// body is unavailable: a retry gets 410, never a second execution.
async fn record(
    env: &Env,
    guard: &Guard,
    cfg: &Config,
    rc: &RequestCtx,
    ctx: &Context,
    (caller, claim, route): (&Caller, &Claim, Option<&respond::Route>),
    outcome: Result<OriginAnswer, Failure>,
) -> Result<OriginAnswer, Failure> {
    let max_inline = cfg.settings.idempotency.max_stored_body_bytes;
    let answered = outcome.as_ref().ok().map(|a| Answered {
        status: a.status,
        headers: &a.headers,
        // Unknown (crossed while reading): larger than the object keeps.
        body_len: a.body.known_len().unwrap_or(max_inline.saturating_add(1)),
    });
    // The request asked for a concurrency slot when its plan has a quota.
    let slot = caller.plan.limits().concurrency.is_some();
    let mut done = match proxy::settle(&cfg.settings, &caller.plan, claim, slot, answered) {
        // The key's final answer: replayed (or 410) from now on, billed once.
        Settlement::Complete(done) => {
            rc.note(|f| f.answer_stored = true);
            done
        }
        // If the call fails, the lease frees the key.
        Settlement::Release(rel) => {
            release(guard, &rel).await;
            return outcome;
        }
    };
    let Ok(mut answer) = outcome else {
        return outcome;
    };
    let large = match &mut answer.body {
        AnswerBody::Read(body) => {
            // The event the response implies (`events_from_responses`), stored with it.
            respond::attach(cfg, rc, caller, claim, route, &mut done, Some(body));
            complete(guard, rc, &done, body).await;
            return Ok(answer);
        }
        AnswerBody::Large { body, len } => (body.take(), *len),
        AnswerBody::Through(_) => (None, None),
    };
    let bucket = replays::bucket(env);
    let keep = proxy::keep(&cfg.settings, done.response.body_len, bucket.is_some());
    match (large, bucket, keep) {
        ((Some(stream), len), Some(b), Keep::Object) => {
            let max_replay = cfg.settings.idempotency.max_replay_bytes;
            let at = (&caller.key.record.id[..], claim, max_replay);
            let client = store_large(guard, rc, ctx, b, at, done, (stream, len));
            answer.body = AnswerBody::Large {
                body: Some(client),
                len,
            };
        }
        // Kept nowhere: recorded as unavailable (`body_omitted`, no object).
        ((stream, len), _, _) => {
            complete(guard, rc, &done, &[]).await;
            answer.body = AnswerBody::Large { body: stream, len };
        }
    }
    Ok(answer)
}

/// Tees a body larger than the object keeps: the client's branch is
/// returned, the other stored in R2 (its length declared, or counted as it
/// comes up to `max_replay_bytes`) and the claim completed once it is there
/// (`waitUntil`). If the tee fails the client gets the body all the same and
/// the record says it is unavailable.
fn store_large(
    guard: &Guard,
    rc: &RequestCtx,
    ctx: &Context,
    bucket: worker::Bucket,
    (key_id, claim, max_replay): (&str, &Claim, u64),
    mut done: CompleteRequest,
    (stream, len): (web_sys::ReadableStream, Option<u64>),
) -> web_sys::ReadableStream {
    let (client, store) = match replays::tee(&stream) {
        Ok(pair) => pair,
        Err(e) => {
            log::emit(log::of_request(Line::error("tee failed"), rc).err(e));
            let (guard, rid) = (guard.clone(), rc.request_id.clone());
            ctx.wait_until(async move { complete_by(&guard, &rid, &done, &[]).await });
            return stream;
        }
    };
    let object = proxy::replay_object_key(key_id, &claim.key, &claim.request_id);
    let (guard, rid) = (guard.clone(), rc.request_id.clone());
    ctx.wait_until(async move {
        let stored = match len {
            Some(len) => replays::put_stream(&bucket, &object, store, len)
                .await
                .map(|()| Some(len)),
            None => crate::streams::put_unsized(&bucket, &object, &store, max_replay).await,
        };
        match stored {
            Ok(Some(bytes)) => {
                done.response.body_object = Some(object);
                done.response.body_len = bytes;
            }
            Ok(None) => log::emit(
                Line::warn("the body grew past max_replay_bytes: not kept")
                    .field("request_id", rid.as_str()),
            ),
            Err(e) => log::emit(
                Line::error("streaming the body to R2 failed")
                    .field("request_id", rid.as_str())
                    .err(e),
            ),
        }
        complete_by(&guard, &rid, &done, &[]).await;
    });
    client
}

async fn complete(guard: &Guard, rc: &RequestCtx, done: &CompleteRequest, body: &[u8]) {
    complete_by(guard, &rc.request_id, done, body).await
}

/// Tries to store the response this many times before giving up on its body.
const COMPLETE_TRIES: u32 = 3;

/// Stores the response: a transient object error must not leave the claim
/// to expire, after which a retry would run again. Tried [`COMPLETE_TRIES`]
/// times; then once more without the body and its event (a record that says
/// the body is unavailable: a retry is told 410, never runs again).
async fn complete_by(guard: &Guard, request_id: &str, done: &CompleteRequest, body: &[u8]) {
    let payload = if done.response.body_omitted {
        &[]
    } else {
        body
    };
    for attempt in 1..=COMPLETE_TRIES {
        match guard.call::<Complete>(done, payload).await {
            Ok(_) => return,
            Err(e) => log::emit(
                Line::error("storing the response failed")
                    .field("request_id", request_id)
                    .field("attempt", attempt)
                    .err(e),
            ),
        }
    }
    let bare = proxy::without_body(done);
    if let Err(e) = guard.call::<Complete>(&bare, &[]).await {
        log::emit(
            Line::error("storing the response without its body failed: the claim will expire")
                .field("request_id", request_id)
                .err(e),
        );
    }
}

async fn release(guard: &Guard, rel: &ReleaseRequest) {
    if let Err(e) = guard.call::<Release>(rel, &[]).await {
        log::emit(
            Line::error("releasing the claim failed")
                .field("request_id", rel.request_id.as_str())
                .err(e),
        );
    }
}

/// The client's answer: the origin's response, or the failure's problem.
fn respond(rc: &RequestCtx, outcome: Result<OriginAnswer, Failure>, rl: &Extra) -> Handled {
    let answer = match outcome {
        Ok(answer) => answer,
        Err(failure) => {
            if let Failure::Unreachable(reason) = &failure {
                log::emit(
                    log::of_request(Line::warn("origin unreachable"), rc)
                        .field("reason", reason.as_str()),
                );
            }
            let p = failure.problem();
            return Err(Reject::from(p).with(rl));
        }
    };
    let headers = client_response_headers(&answer.headers);
    let (stream, bytes) = match answer.body {
        AnswerBody::Read(body) => {
            return Ok(http::respond(rc, answer.status, &headers, rl, Some(body))?)
        }
        AnswerBody::Large { body, len } => (body, len),
        AnswerBody::Through(body) => {
            let declared = headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.trim().parse().ok());
            (body, declared)
        }
    };
    rc.note(|f| f.response_bytes = bytes);
    let r = match stream {
        Some(s) => http::respond_stream(
            rc,
            answer.status,
            &headers,
            rl,
            worker::ResponseBody::Stream(s),
        ),
        None => http::respond(rc, answer.status, &headers, rl, None),
    };
    Ok(r?)
}
