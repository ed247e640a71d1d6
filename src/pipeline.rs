//! The proxy pipeline, in the contract's order (docs/request-path.md): authenticate →
//! rate-limit + claim (one Durable Object round trip) → forward → record
//! (complete or release the claim). The decisions of each phase are in
//! `postguard_core::proxy`; this module does their I/O.
//!
//! Every answer after authentication carries the rate-limit headers.

use crate::log;
use postguard_core::config::Config;
use postguard_core::guard::{
    Admit, AdmitRequest, Claim, Complete, CompleteRequest, Finish, FinishRequest, Release,
    ReleaseRequest, Slot,
};
use postguard_core::headers::client_response_headers;
use postguard_core::idempotency::StoredResponse;
use postguard_core::limits::{self, Verdicts};
use postguard_core::log::Line;
use postguard_core::proxy::{
    self, admission, origin_request, preflight, Admission, Answered, Failure, Identity, Incoming,
    Keep, OriginRequest, Preflight, Settlement,
};
use postguard_core::Problem;
use worker::{web_sys, Context, Env, Response};

use crate::auth::{self, Caller};
use crate::durable::client::Guard;
use crate::http::{self, raw_header_pairs, HeaderList};
use crate::reject::{Extra, Handled, Reject};
use crate::replays;
use crate::request::{self, Body};
use crate::runtime::{now_ms, within, RequestCtx};

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
    let cred = auth::credential_of(req.header("Authorization"), cfg);
    let caller = auth::api_caller(cred, env, cfg, rc).await?;
    let incoming = read(req, method, cfg.settings.max_body_bytes).await?;
    let pre = preflight(&cfg.settings, &incoming, &rc.request_id);
    rc.note(|f| f.idempotency_key = pre.idempotency_key.clone());
    // 2 + 3. Limits, a concurrency slot and the claim: one round trip to the key's object.
    let guard = Guard::of(env, &caller.key.record.id)?;
    let (admitted, replay_body) = admit(&guard, cfg, rc, &caller, &incoming, &pre).await?;
    let rl = match &admitted {
        Admission::Revoked => return Err(auth::revoked(&caller.key).into()),
        Admission::Expired => return Err(auth::expired(&caller.key).into()),
        Admission::Refused { verdicts, .. }
        | Admission::Replay { verdicts, .. }
        | Admission::Forward { verdicts, .. } => limit_headers(rc, verdicts),
    };
    let refresh = match admitted {
        Admission::Refused { problem, .. } => return Err(Reject::from(problem).with(&rl)),
        Admission::Replay { stored, .. } => return replay(env, rc, stored, replay_body, &rl).await,
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
    let now_s = now_ms() / 1000;
    let origin = origin_request(cfg, incoming, &identity, claim, &rc.request_id, now_s);
    let sent_at = now_ms();
    let outcome = forward(origin, cfg).await;
    rc.facts.borrow_mut().origin_ms = Some(now_ms().saturating_sub(sent_at));
    // 5. Record (which frees the concurrency slot with the claim), or free
    // the slot of a request without one once the origin has answered.
    let outcome = match claim {
        Some(c) => record(env, &guard, cfg, rc, ctx, &caller, c, outcome).await,
        None => {
            finish_slot(&guard, &caller, rc, ctx);
            outcome
        }
    };
    respond(rc, cfg, outcome, &rl)
}

/// Frees the concurrency slot of a request without a claim, after the
/// answer (`waitUntil`: it never delays the client). If the call is lost,
/// the slot's lease frees it.
fn finish_slot(guard: &Guard, caller: &Caller, rc: &RequestCtx, ctx: &Context) {
    if caller.plan.limits().concurrency.is_none() {
        return;
    }
    let (guard, slot) = (guard.clone(), rc.request_id.clone());
    ctx.wait_until(async move {
        let req = FinishRequest { slot };
        if let Err(e) = guard.call::<Finish>(&req, &[]).await {
            log::emit(
                Line::error("freeing the concurrency slot failed")
                    .field("request_id", req.slot)
                    .err(e),
            );
        }
    });
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
/// nor takes a slot.
async fn admit(
    guard: &Guard,
    cfg: &Config,
    rc: &RequestCtx,
    caller: &Caller,
    incoming: &Incoming,
    pre: &Preflight,
) -> Handled<(Admission, Vec<u8>)> {
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
        ..AdmitRequest::charge(cfg.settings.cost(&incoming.method, &incoming.path), limits)
    };
    let (answer, payload) = guard.call::<Admit>(&req, &[]).await?;
    let next = admission(answer, pre.early.clone())
        .map_err(|e| worker::Error::RustError(e.to_string()))?;
    Ok((next, payload))
}

fn limit_headers(rc: &RequestCtx, verdicts: &Verdicts) -> Extra {
    rc.note(|f| f.rate_limit_remaining = Some(verdicts.binding_verdict().remaining));
    limits::headers(verdicts)
}

/// The stored response of an earlier request with this Idempotency-Key:
/// its body from the object, or streamed from R2; a body kept nowhere (too
/// large, or its storage failed) is `IDEMPOTENT_REPLAY_UNAVAILABLE`, never a
/// success with another body.
async fn replay(
    env: &Env,
    rc: &RequestCtx,
    stored: StoredResponse,
    body: Vec<u8>,
    rl: &Extra,
) -> Handled {
    let mut extra = rl.clone();
    extra.push(("Idempotent-Replayed", "true".into()));
    if !stored.body_omitted {
        rc.note(|f| f.replayed = true);
        return Ok(http::respond(
            rc,
            stored.status,
            &stored.headers,
            &extra,
            Some(body),
        )?);
    }
    let unavailable =
        || Reject::from(Problem::replay_unavailable(stored.status, stored.body_len)).with(rl);
    let (Some(object), Some(bucket)) = (&stored.body_object, replays::bucket(env)) else {
        return Err(unavailable());
    };
    match replays::get(&bucket, object).await {
        Ok(Some(stream)) => {
            rc.note(|f| f.replayed = true);
            let r = http::respond_stream(rc, stored.status, &stored.headers, &extra, stream);
            rc.note(|f| f.response_bytes = Some(stored.body_len));
            Ok(r?)
        }
        Ok(None) => Err(unavailable()),
        Err(e) => {
            log::emit(log::of_request(Line::error("replay body unreadable"), rc).err(e));
            Err(unavailable())
        }
    }
}

enum Forwarded {
    /// Not under an Idempotency-Key: the origin's body streams through.
    Streaming(web_sys::Response),
    /// Under a claim: the body is read so it can be stored.
    Buffered {
        status: u16,
        headers: HeaderList,
        body: Vec<u8>,
    },
    /// Under a claim, declared larger than the object keeps: never read
    /// whole; streamed to the client (and to R2 at once, see `record`).
    Large {
        status: u16,
        headers: HeaderList,
        body: Option<web_sys::ReadableStream>,
        len: u64,
    },
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
    match forward(origin, cfg).await {
        Ok(Forwarded::Buffered {
            status, headers, ..
        }) => {
            let mut out = client_response_headers(&headers);
            postguard_core::cors::merge_forwarded_preflight(&mut out);
            Ok(http::respond(rc, status, &out, &[], None)?)
        }
        Ok(Forwarded::Streaming(resp)) => Ok(Response::from(resp)),
        Ok(Forwarded::Large { .. }) => {
            Err(worker::Error::RustError("preflight answer too large".into()).into())
        }
        Err(failure) => Err(failure.problem(cfg.settings.origin.timeout_ms).into()),
    }
}

/// Sends the request to the origin, within its timeout (then aborted).
async fn forward(origin: OriginRequest, cfg: &Config) -> Result<Forwarded, Failure> {
    let timeout_ms = cfg.settings.origin.timeout_ms;
    let max_inline = cfg.settings.idempotency.max_stored_body_bytes;
    let unreachable = |e: worker::Error| Failure::Unreachable(e.to_string());
    let controller = web_sys::AbortController::new().map_err(|e| unreachable(e.into()))?;
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
        if !origin.buffer {
            return Ok(Forwarded::Streaming(resp));
        }
        let status = resp.status();
        let headers = raw_header_pairs(&resp.headers());
        let declared = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse::<u64>().ok());
        if let Some(len) = declared.filter(|len| *len > max_inline) {
            let body = resp.body();
            return Ok(Forwarded::Large {
                status,
                headers,
                body,
                len,
            });
        }
        let body = http::read_body(&resp).await?;
        Ok::<_, worker::Error>(Forwarded::Buffered {
            status,
            headers,
            body,
        })
    };
    match within(u64::from(timeout_ms), work).await {
        Some(result) => result.map_err(unreachable),
        None => {
            controller.abort();
            Err(Failure::Timeout)
        }
    }
}

/// Completes or releases the claim, before answering: a client that saw
/// this response gets it again on retry even if this isolate dies now, and a
/// client retrying right after a 5xx is not told 409. A body larger than the
/// object keeps goes to R2: one already read is written first; a streamed
/// one is teed, the client's branch answered now and the record completed
/// once R2 has the rest (`waitUntil`; until then a retry is told 409 in
/// progress). Without R2, or past `max_replay_bytes`, the record says the
/// body is unavailable: a retry gets 410, never a second execution.
#[allow(clippy::too_many_arguments)]
async fn record(
    env: &Env,
    guard: &Guard,
    cfg: &Config,
    rc: &RequestCtx,
    ctx: &Context,
    caller: &Caller,
    claim: &Claim,
    outcome: Result<Forwarded, Failure>,
) -> Result<Forwarded, Failure> {
    let answer = match &outcome {
        Ok(Forwarded::Buffered {
            status,
            headers,
            body,
        }) => Some((*status, headers, body.len() as u64)),
        Ok(Forwarded::Large {
            status,
            headers,
            len,
            ..
        }) => Some((*status, headers, *len)),
        _ => None,
    };
    let answered = answer.map(|(status, headers, len)| Answered {
        status,
        headers,
        body_len: usize::try_from(len).unwrap_or(usize::MAX),
    });
    let key_id = caller.key.record.id.clone();
    // The request asked for a concurrency slot when its plan has a quota.
    let slot = caller.plan.limits().concurrency.is_some();
    let mut done = match proxy::settle(&cfg.settings, &caller.plan, claim, slot, answered) {
        Settlement::Complete(done) => done,
        // If the call fails, the lease frees the key.
        Settlement::Release(rel) => {
            release(guard, &rel).await;
            return outcome;
        }
    };
    let bucket = replays::bucket(env);
    let object = proxy::replay_object_key(&key_id, &claim.key, &claim.request_id);
    match (
        proxy::keep(&cfg.settings, done.response.body_len, bucket.is_some()),
        outcome,
        bucket,
    ) {
        (
            Keep::Inline,
            Ok(Forwarded::Buffered {
                status,
                headers,
                body,
            }),
            _,
        ) => {
            complete(guard, rc, &done, &body).await;
            Ok(Forwarded::Buffered {
                status,
                headers,
                body,
            })
        }
        (
            Keep::Object,
            Ok(Forwarded::Buffered {
                status,
                headers,
                body,
            }),
            Some(b),
        ) => {
            match replays::put_bytes(&b, &object, body.clone()).await {
                Ok(()) => done.response.body_object = Some(object),
                Err(e) => log::emit(
                    log::of_request(Line::error("storing the body in R2 failed"), rc).err(e),
                ),
            }
            complete(guard, rc, &done, &[]).await;
            Ok(Forwarded::Buffered {
                status,
                headers,
                body,
            })
        }
        (
            Keep::Object,
            Ok(Forwarded::Large {
                status,
                headers,
                body: Some(stream),
                len,
            }),
            Some(b),
        ) => match replays::tee(&stream) {
            Ok((client, store)) => {
                let (guard, rid) = (guard.clone(), rc.request_id.clone());
                ctx.wait_until(async move {
                    match replays::put_stream(&b, &object, store, len).await {
                        Ok(()) => done.response.body_object = Some(object),
                        Err(e) => log::emit(
                            Line::error("streaming the body to R2 failed")
                                .field("request_id", rid.as_str())
                                .err(e),
                        ),
                    }
                    complete_by(&guard, &rid, &done, &[]).await;
                });
                Ok(Forwarded::Large {
                    status,
                    headers,
                    body: Some(client),
                    len,
                })
            }
            Err(e) => {
                log::emit(log::of_request(Line::error("tee failed"), rc).err(e));
                complete(guard, rc, &done, &[]).await;
                Ok(Forwarded::Large {
                    status,
                    headers,
                    body: Some(stream),
                    len,
                })
            }
        },
        // Kept nowhere: recorded as unavailable (`body_omitted`, no object).
        (_, outcome, _) => {
            complete(guard, rc, &done, &[]).await;
            outcome
        }
    }
}

async fn complete(guard: &Guard, rc: &RequestCtx, done: &CompleteRequest, body: &[u8]) {
    complete_by(guard, &rc.request_id, done, body).await
}

/// Stores the response, with one retry: a transient object error must not
/// leave the claim to expire, after which a retry would run again.
async fn complete_by(guard: &Guard, request_id: &str, done: &CompleteRequest, body: &[u8]) {
    let payload = if done.response.body_omitted {
        &[]
    } else {
        body
    };
    for attempt in 1..=2 {
        match guard.call::<Complete>(done, payload).await {
            Ok(_) => break,
            Err(e) => log::emit(
                Line::error("storing the response failed")
                    .field("request_id", request_id)
                    .field("attempt", attempt)
                    .err(e),
            ),
        }
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
fn respond(
    rc: &RequestCtx,
    cfg: &Config,
    outcome: Result<Forwarded, Failure>,
    rl: &Extra,
) -> Handled {
    match outcome {
        Err(failure) => {
            if let Failure::Unreachable(reason) = &failure {
                log::emit(
                    log::of_request(Line::warn("origin unreachable"), rc)
                        .field("reason", reason.as_str()),
                );
            }
            let p = failure.problem(cfg.settings.origin.timeout_ms);
            Err(Reject::from(p).with(rl))
        }
        Ok(Forwarded::Streaming(resp)) => {
            // A new response around the origin's body (the worker crate's
            // conversion of a fetched response reads its `cf` and `webSocket`).
            let kept = client_response_headers(&raw_header_pairs(&resp.headers()));
            let body = match resp.body() {
                Some(stream) => worker::ResponseBody::Stream(stream),
                None => worker::ResponseBody::Empty,
            };
            let r = http::respond_stream(rc, resp.status(), &kept, rl, body)?;
            let declared = kept
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.trim().parse().ok());
            rc.note(|f| f.response_bytes = declared);
            Ok(r)
        }
        Ok(Forwarded::Large {
            status,
            headers,
            body,
            len,
        }) => {
            let headers = client_response_headers(&headers);
            let r = match body {
                Some(stream) => http::respond_stream(
                    rc,
                    status,
                    &headers,
                    rl,
                    worker::ResponseBody::Stream(stream),
                ),
                None => http::respond(rc, status, &headers, rl, None),
            };
            rc.note(|f| f.response_bytes = Some(len));
            Ok(r?)
        }
        Ok(Forwarded::Buffered {
            status,
            headers,
            body,
        }) => Ok(http::respond(
            rc,
            status,
            &client_response_headers(&headers),
            rl,
            Some(body),
        )?),
    }
}
