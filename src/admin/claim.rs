//! Phases 4 and 6 of a gateway request: the caller's budget charged and its
//! Idempotency-Key claimed in one call to the caller's object, and the
//! answer stored under the key (sealed) or the claim released (docs/limits.md).
//! The decisions are the proxy's (`proxy::preflight_in`, `admission`,
//! `settle`) and `postguard_core::gateway`'s; this file does their I/O.

use crate::log;
use postguard_core::config::Plan;
use postguard_core::gateway::{seal_key, stored_headers};
use postguard_core::guard::{
    Admit, AdmitRequest, Claim, Complete, CompleteRequest, Lookup, Release, Scope,
};
use postguard_core::idempotency::{self, Mode, StoredResponse};
use postguard_core::limits::{self, Verdicts};
use postguard_core::log::Line;
use postguard_core::proxy::{self, Admission, Answered, Incoming, Settlement};
use postguard_core::routes::{Budget, Route};
use postguard_core::{ErrorCode, Problem};
use worker::{Env, Response, ResponseBody};

use crate::auth::{self, Principal};
use crate::durable::client::Guard;
use crate::handler::Ctx;
use crate::http::{self, raw_header_pairs};
use crate::reject::{self, Extra, Handled, Reject};
use crate::runtime::RequestCtx;
use crate::seal;

/// What the admission let through: the rate-limit headers every answer
/// carries (a key's or a session's), and the claim to record under.
pub struct Pass {
    /// Every policy's verdict (a key's or a session's).
    pub verdicts: Option<Verdicts>,
    /// The record of the Idempotency-Key the route asked about.
    pub lookup: Option<Box<Lookup>>,
    headers: Extra,
    claim: Option<Claimed>,
}

struct Claimed {
    guard: Guard,
    /// The object's name: the scope the answer is sealed for.
    scope: String,
    claim: Claim,
}

pub enum Admitted {
    /// Run the handler.
    Run(Pass),
    /// Answered already: the stored answer of an earlier request.
    Answered(Response),
}

/// The plan whose TTL keeps a caller's stored answers: its own, or the
/// default day for the operator and the origin (which have no plan).
fn record_plan(who: &Principal) -> Plan {
    who.plan()
        .cloned()
        .unwrap_or_else(|| Plan::single(u32::MAX, 60))
}

/// Phase 4: charge the route's cost to a key or a session (which also
/// confirms, in its object, that it was not revoked or ended) and claim the
/// request's Idempotency-Key, in one object call. The operator and the
/// origin have no budget: their object is called only to claim a key. A
/// problem found before (413, a malformed key) is answered after the charge,
/// with its headers, as on the proxy.
pub async fn admit(
    route: &Route,
    who: &Principal,
    incoming: &Incoming,
    env: &Env,
    cfg: &postguard_core::config::Config,
    rc: &RequestCtx,
) -> Handled<Admitted> {
    let mode = match route.idempotent() {
        true => Mode::Optional,
        false => Mode::Off,
    };
    let pre = proxy::preflight_in(&cfg.settings, mode, incoming, &rc.request_id);
    rc.note(|f| f.idempotency_key = pre.idempotency_key.clone());
    let name = who
        .guard()
        .filter(|_| who.is_charged() || pre.claim.is_some());
    let Some(name) = name else {
        return match pre.early {
            Some(p) => Err(p.into()),
            None => Ok(Admitted::Run(Pass {
                verdicts: None,
                lookup: None,
                headers: Vec::new(),
                claim: None,
            })),
        };
    };
    let budget = route.budget();
    let limits = who.limits(budget);
    let smallest = limits.policies.iter().map(|p| p.limit).min().unwrap_or(0);
    let cost = match who.is_charged() {
        // A cost over the plan's quota takes its whole window.
        true => route.cost(&cfg.settings.rate_limit).min(smallest),
        false => 0,
    };
    let guard = Guard::of(env, &name)?;
    let req = AdmitRequest {
        claim: pre.claim.clone(),
        scope: match budget {
            Budget::Api => Scope::Api,
            Budget::Gateway => Scope::Gateway,
        },
        caller: who.view(),
        lookup: looked_up(route)?,
        ..AdmitRequest::charge(cost, limits)
    };
    let (answer, payload) = guard.call::<Admit>(&req, &[]).await?;
    let next =
        proxy::admission(answer, pre.early).map_err(|e| worker::Error::RustError(e.to_string()))?;
    let headers = |v: &Verdicts| -> Extra {
        if !who.is_charged() {
            return Vec::new();
        }
        rc.note(|f| f.rate_limit_remaining = Some(v.binding_verdict().remaining));
        limits::headers(v)
    };
    match next {
        Admission::Revoked => Err(revoked(who)),
        Admission::Expired => Err(expired(who)),
        Admission::Refused { problem, verdicts } => {
            Err(Reject::from(problem).with(&headers(&verdicts)))
        }
        Admission::Replay { verdicts, stored } => {
            let key = pre.claim.map(|c| c.key).unwrap_or_default();
            let replayed =
                replay(cfg, rc, &name, &key, stored, payload, headers(&verdicts)).await?;
            Ok(Admitted::Answered(replayed))
        }
        // The gateway's own endpoints never create operations.
        Admission::Accepted { .. } => Err(worker::Error::RustError(
            "a gateway endpoint's key names an asynchronous operation".into(),
        )
        .into()),
        Admission::Forward {
            verdicts, lookup, ..
        } => Ok(Admitted::Run(Pass {
            headers: headers(&verdicts),
            verdicts: who.is_charged().then_some(verdicts),
            lookup,
            claim: pre.claim.map(|claim| Claimed {
                guard,
                scope: name,
                claim,
            }),
        })),
    }
}

/// The Idempotency-Key a lookup route names (percent-decoded, then read as
/// the header would be: 400 `IDEMPOTENCY_KEY_INVALID` when it could not be one).
fn looked_up(route: &Route) -> Handled<Option<String>> {
    let Route::IdempotencyLookup { key } = route else {
        return Ok(None);
    };
    let decoded = percent_encoding::percent_decode_str(key).decode_utf8_lossy();
    idempotency::parse_key(&decoded)
        .map(Some)
        .map_err(|e| Problem::new(ErrorCode::IdempotencyKeyInvalid, e.to_string()).into())
}

/// An API key whose object says it has expired.
fn expired(who: &Principal) -> Reject {
    match who {
        Principal::Key(c) => auth::expired(&c.key).into(),
        other => revoked(other),
    }
}

/// The caller's object says its credential is gone: a key revoked, a
/// session ended by the operator.
fn revoked(who: &Principal) -> Reject {
    match who {
        Principal::Key(c) => auth::revoked(&c.key).into(),
        _ => Problem::new(
            ErrorCode::Unauthorized,
            "the portal session has ended: open a new portal link",
        )
        .into(),
    }
}

/// The stored answer again, byte for byte, with `Idempotent-Replayed: true`
/// and this request's own id and rate-limit headers. An answer that cannot
/// be opened (too large to have been kept, or sealed under an `ADMIN_TOKEN`
/// since rotated) is 410, never another execution.
async fn replay(
    cfg: &postguard_core::config::Config,
    rc: &RequestCtx,
    scope: &str,
    key: &str,
    stored: StoredResponse,
    sealed: Vec<u8>,
    mut headers: Extra,
) -> Handled<Response> {
    let unavailable = |headers: &Extra| {
        Reject::from(Problem::replay_unavailable(stored.status, stored.body_len)).with(headers)
    };
    if stored.body_omitted {
        return Err(unavailable(&headers));
    }
    let body = match stored.body_len {
        0 => Vec::new(),
        _ => match seal::open(&seal_key(&cfg.admin_token, scope, key), &sealed).await {
            Ok(body) => body,
            Err(e) => {
                log::emit(log::of_request(Line::error("stored answer unreadable"), rc).err(e));
                return Err(unavailable(&headers));
            }
        },
    };
    rc.note(|f| f.replayed = true);
    headers.push(("Idempotent-Replayed", "true".into()));
    Ok(http::respond(
        rc,
        stored.status,
        &stored.headers,
        &headers,
        Some(body),
    )?)
}

/// Phase 6: the rate-limit headers on the answer, and, under a claim, the
/// answer rendered and stored sealed (a final status) or the claim released
/// (a 5xx, 408/409/425/429), before it is sent: a client that saw it gets
/// it again on retry. Without a claim the outcome goes back unrendered.
pub async fn record(pass: Pass, cx: &Ctx<'_>, outcome: Handled) -> Handled {
    let mut outcome = outcome.map_err(|r| r.with(&pass.headers));
    if let Ok(resp) = &mut outcome {
        for (k, v) in &pass.headers {
            resp.headers_mut().set(k, v)?;
        }
    }
    let Some(claimed) = pass.claim else {
        return outcome;
    };
    let resp = reject::render(cx.rc, outcome)?;
    let body = match resp.body() {
        ResponseBody::Body(b) => b.clone(),
        ResponseBody::Empty => Vec::new(),
        // No gateway operation streams its answer; were one to, it is not kept.
        ResponseBody::Stream(_) => {
            release(&claimed, cx).await;
            return Ok(resp);
        }
    };
    let pairs = stored_headers(&raw_header_pairs(&resp.headers().0));
    let answered = Answered {
        status: resp.status_code(),
        headers: &pairs,
        body_len: body.len() as u64,
    };
    let plan = record_plan(&cx.who);
    match proxy::settle(
        &cx.cfg.settings,
        &plan,
        &claimed.claim,
        false,
        Some(answered),
    ) {
        Settlement::Release(_) => release(&claimed, cx).await,
        Settlement::Complete(done) => complete(&claimed, cx, done, &body).await,
    }
    Ok(resp)
}

/// Stores the answer sealed, with one retry: a transient object error must
/// not leave the claim to expire, after which a retry would run again.
async fn complete(claimed: &Claimed, cx: &Ctx<'_>, done: CompleteRequest, body: &[u8]) {
    let sealed = match done.response.body_omitted || body.is_empty() {
        true => Vec::new(),
        false => {
            let key = seal_key(&cx.cfg.admin_token, &claimed.scope, &claimed.claim.key);
            match seal::seal(&key, body).await {
                Ok(s) => s,
                Err(e) => {
                    // Not kept: a retry then runs again, as after a 5xx.
                    log::emit(
                        log::of_request(Line::error("sealing the answer failed"), cx.rc).err(e),
                    );
                    return release(claimed, cx).await;
                }
            }
        }
    };
    for attempt in 1..=2 {
        match claimed.guard.call::<Complete>(&done, &sealed).await {
            Ok(_) => return,
            Err(e) => log::emit(
                log::of_request(Line::error("storing the answer failed"), cx.rc)
                    .field("attempt", attempt)
                    .err(e),
            ),
        }
    }
}

async fn release(claimed: &Claimed, cx: &Ctx<'_>) {
    let rel = postguard_core::guard::ReleaseRequest {
        key: claimed.claim.key.clone(),
        request_id: claimed.claim.request_id.clone(),
        slot: false,
    };
    if let Err(e) = claimed.guard.call::<Release>(&rel, &[]).await {
        log::emit(log::of_request(Line::error("releasing the claim failed"), cx.rc).err(e));
    }
}
