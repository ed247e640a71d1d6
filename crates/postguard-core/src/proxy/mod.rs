//! The proxy pipeline's decisions (docs/request-path.md), phase by phase: which
//! methods are proxied, the preflight checks of a request, what the key's
//! object answered (→ forward, replay or a problem), the request sent to the
//! origin, and what is recorded under the Idempotency-Key afterwards.
//! `src/pipeline.rs` runs these phases and does their I/O.

use crate::config::{Config, Plan, Settings};
use crate::guard::{AdmitResponse, Claim, CompleteRequest, Lookup, Profile, ReleaseRequest};
use crate::headers::{
    first_invalid_value, forward_request_headers, origin_signature, storable_response_headers,
    Signed,
};
use crate::idempotency::{self, Decision, Mode, StoredResponse};
use crate::keys::KeyRecord;
use crate::limits::Verdicts;
use crate::operations::View;
use crate::{ErrorCode, Problem};

/// The methods the gateway forwards: the runtime's request type cannot carry
/// others faithfully.
pub const PROXIED_METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];
/// [`PROXIED_METHODS`] as an `Allow` header value.
pub const PROXIED_ALLOW: &str = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS";

/// 405 for a method the gateway does not forward; checked before anything
/// else (no authentication, no budget).
pub fn check_method(method: &str) -> Result<(), Problem> {
    if PROXIED_METHODS.contains(&method) {
        return Ok(());
    }
    Err(Problem::new(
        ErrorCode::MethodNotAllowed,
        format!("method {method} is not supported by the gateway"),
    )
    .with_allow(PROXIED_ALLOW))
}

/// Whether a request of `method` carries a body to read and forward.
pub fn has_body(method: &str) -> bool {
    !matches!(method, "GET" | "HEAD")
}

/// The client's request as the pipeline sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incoming {
    /// Upper-cased.
    pub method: String,
    pub path: String,
    /// Path with `?query`, as signed and fingerprinted.
    pub path_and_query: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The body crossed `max_body_bytes` (declared or while reading): it was
    /// not read further and `body` holds nothing of it.
    pub oversized: bool,
}

/// The outcome of the checks made before the key's object is asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preflight {
    /// A problem to answer *after* the limiter (it consumes budget and
    /// carries the rate-limit headers); such a request claims nothing.
    pub early: Option<Problem>,
    /// The claim to attempt under the request's Idempotency-Key.
    pub claim: Option<Claim>,
    /// The parsed Idempotency-Key, for the audit row.
    pub idempotency_key: Option<String>,
    /// The request has no Idempotency-Key where the mode is `required`
    /// (counted per key in `/stats`: whom to tell).
    pub missing_key: bool,
    /// `idempotency.required_from` is still ahead: this keyless request is
    /// forwarded as `optional` would, and its answer names the date.
    pub required_from: Option<u64>,
}

fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Names `idempotency.required_from` on the answer of a keyless request
/// forwarded before that date.
pub const REQUIRED_FROM_HEADER: &str = "Postguard-Idempotency-Key-Required-From";

/// Body limit, Idempotency-Key (mode and syntax) and header values, in that
/// order: the first failing check is the answer.
pub fn preflight(settings: &Settings, req: &Incoming, request_id: &str, now_ms: u64) -> Preflight {
    let mode = settings.idempotency_mode(&req.method, &req.path);
    let missing = mode == Mode::Required && header(&req.headers, "Idempotency-Key").is_none();
    // Before `required_from` a required key is asked for, not enforced.
    let grace = settings
        .idempotency
        .required_from_ms()
        .filter(|at| missing && now_ms < *at);
    let mode = if grace.is_some() {
        Mode::Optional
    } else {
        mode
    };
    Preflight {
        missing_key: missing,
        required_from: grace,
        ..preflight_in(settings, mode, req, request_id)
    }
}

/// [`preflight`] under a given idempotency `mode`: the gateway's own
/// mutating endpoints honour a key (`Optional`) whatever the proxy's table
/// says (docs/limits.md).
pub fn preflight_in(
    settings: &Settings,
    mode: Mode,
    req: &Incoming,
    request_id: &str,
) -> Preflight {
    let mut out = Preflight {
        early: None,
        claim: None,
        idempotency_key: None,
        missing_key: false,
        required_from: None,
    };
    if req.oversized || req.body.len() as u64 > settings.max_body_bytes {
        out.early = Some(Problem::payload_too_large(settings.max_body_bytes));
        return out;
    }
    let raw = header(&req.headers, "Idempotency-Key").filter(|_| mode != Mode::Off);
    match (raw.map(idempotency::parse_key), mode) {
        (Some(Ok(k)), _) => out.idempotency_key = Some(k),
        (Some(Err(e)), _) => {
            out.early = Some(Problem::new(
                ErrorCode::IdempotencyKeyInvalid,
                e.to_string(),
            ));
            return out;
        }
        (None, Mode::Required) => {
            out.early = Some(Problem::new(
                ErrorCode::IdempotencyKeyRequired,
                format!(
                    "{} {} requires an Idempotency-Key header (1-255 visible ASCII characters)",
                    req.method, req.path
                ),
            ));
            return out;
        }
        (None, _) => {}
    }
    // Other header values with control characters: the more specific
    // Idempotency-Key answers above win.
    if let Some(name) = first_invalid_value(&req.headers) {
        let shown: String = name.chars().take(64).collect();
        out.early = Some(Problem::new(
            ErrorCode::ValidationError,
            format!("header {shown} contains a control character"),
        ));
        return out;
    }
    out.claim = out.idempotency_key.as_ref().map(|k| Claim {
        key: k.clone(),
        fingerprint: idempotency::fingerprint(&req.method, &req.path_and_query, &req.body),
        request_id: request_id.to_string(),
        lease_ms: u64::from(settings.idempotency.lease_s) * 1000,
    });
    out
}

/// What to do once the key's object answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// The key was revoked: 401 (the shell also drops its cached record).
    Revoked,
    /// The key (or this secret of a rerolled one) has expired: 401.
    Expired,
    /// Answer this problem, with the rate-limit headers of `verdicts`.
    Refused {
        problem: Problem,
        verdicts: Verdicts,
    },
    /// Answer the stored response (its body came with the object's answer).
    Replay {
        verdicts: Verdicts,
        stored: StoredResponse,
    },
    /// Forward to the origin (under the claim, if one was asked for);
    /// `refresh` is what the operator set since the caller's record.
    Forward {
        verdicts: Verdicts,
        refresh: Option<Box<Profile>>,
        lookup: Option<Box<Lookup>>,
    },
    /// The key's request is an asynchronous operation: answer its 202 —
    /// the operation this request just created, or (`again`) the one an
    /// earlier request with the key created (ADR 0037).
    Accepted {
        verdicts: Verdicts,
        operation: Box<View>,
        again: bool,
    },
}

/// The object answered a replay without the response to replay, or an
/// operation without the operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayMissing {
    #[error("the key guard answered a replay without a stored response")]
    Response,
    #[error("the key guard answered an operation without its state")]
    Operation,
}

/// The problem of a request refused by its limits: `CONCURRENCY_LIMIT_EXCEEDED`
/// (`Retry-After: 1`) when no slot was free, else `RATE_LIMIT_EXCEEDED` with
/// the binding policy's `Retry-After`; either names the violated policies.
pub fn limited(verdicts: &Verdicts) -> Problem {
    let violated = verdicts.violated();
    let v = verdicts.binding_verdict();
    let problem = match verdicts.inflight.filter(|i| i.refused) {
        Some(i) => Problem::new(
            ErrorCode::ConcurrencyLimitExceeded,
            format!(
                "this key may have {} requests in flight at the origin at once; retry when one has finished",
                i.limit
            ),
        )
        .with_retry_after(1),
        None => Problem::new(
            ErrorCode::RateLimitExceeded,
            format!(
                "this credential's budget is {} requests per {} s; retry after the window resets",
                v.limit, v.window_s
            ),
        )
        .with_retry_after(v.retry_after_s()),
    };
    problem.with_violated(violated)
}

/// The object's answer, and any preflight problem, as the next step.
pub fn admission(resp: AdmitResponse, early: Option<Problem>) -> Result<Admission, ReplayMissing> {
    let verdicts = resp.verdicts().unwrap_or_default();
    let (decision, replay, refresh, lookup, operation) = match resp {
        AdmitResponse::Revoked => return Ok(Admission::Revoked),
        AdmitResponse::Expired => return Ok(Admission::Expired),
        AdmitResponse::Limited { .. } => {
            let problem = limited(&verdicts);
            return Ok(Admission::Refused { problem, verdicts });
        }
        AdmitResponse::Admitted {
            idempotency,
            replay,
            refresh,
            lookup,
            operation,
            ..
        } => (idempotency, replay, refresh, lookup, operation),
    };
    let problem = match (early, decision) {
        (Some(p), _) => p,
        (None, Some(Decision::InProgress { retry_after_s })) => Problem::new(
            ErrorCode::IdempotencyKeyInProgress,
            "a request with this Idempotency-Key is still being processed; retry later to get its result",
        )
        .with_retry_after(retry_after_s),
        (None, Some(Decision::Conflict)) => Problem::new(
            ErrorCode::IdempotencyKeyReuseConflict,
            "this Idempotency-Key was already used with a different request (method, path, query or body differ)",
        ),
        (None, Some(Decision::Replay)) => {
            let stored = replay.ok_or(ReplayMissing::Response)?;
            return Ok(Admission::Replay { verdicts, stored });
        }
        (None, Some(Decision::Accepted)) => {
            let operation = operation.ok_or(ReplayMissing::Operation)?;
            return Ok(Admission::Accepted {
                verdicts,
                operation,
                again: true,
            });
        }
        (None, Some(Decision::Execute)) if operation.is_some() => {
            let operation = operation.ok_or(ReplayMissing::Operation)?;
            return Ok(Admission::Accepted {
                verdicts,
                operation,
                again: false,
            });
        }
        (None, Some(Decision::Execute) | None) => {
            return Ok(Admission::Forward {
                verdicts,
                refresh,
                lookup,
            })
        }
    };
    Ok(Admission::Refused { problem, verdicts })
}

/// The request sent to the origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginRequest {
    pub method: String,
    pub url: String,
    /// The origin it goes to (`default`, or an `origins` name) and how long
    /// that origin may take.
    pub origin: String,
    pub timeout_ms: u32,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Whether the answer must be buffered (to be stored under a claim)
    /// rather than streamed through.
    pub buffer: bool,
}

/// Who the origin is told a request comes from (docs/request-path.md, docs/limits.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity<'a> {
    pub project: &'a str,
    pub key_prefix: &'a str,
    pub plan: &'a str,
    /// `X-Postguard-Key-Meta`: base64url of the key's metadata.
    pub meta: Option<&'a str>,
}

impl<'a> Identity<'a> {
    /// A key's identity as its record has it.
    pub fn of(key: &'a KeyRecord, meta: Option<&'a str>) -> Identity<'a> {
        Identity {
            project: &key.project,
            key_prefix: &key.prefix,
            plan: &key.plan,
            meta,
        }
    }
}

/// The origin's view of the request (docs/request-path.md): the routed
/// origin's base path + the client's path (without a route's
/// `strip_prefix`) and query, the client's headers minus hop-by-hop ones and
/// the API key wherever it was read (`Authorization`, a configured
/// `header:<Name>`), and the gateway's own headers with the signature over
/// what the origin sees.
pub fn origin_request(
    cfg: &Config,
    req: Incoming,
    key: &Identity,
    claim: Option<&Claim>,
    request_id: &str,
    now_s: u64,
) -> OriginRequest {
    let routed = cfg.route(&req.method, &req.path);
    let query = req.path_and_query.split_once('?').map(|(_, q)| q);
    let origin_path = match query {
        Some(q) => format!(
            "{}{}?{q}",
            routed.origin.base.path().trim_end_matches('/'),
            routed.path
        ),
        None => format!(
            "{}{}",
            routed.origin.base.path().trim_end_matches('/'),
            routed.path
        ),
    };
    let (origin_name, timeout_ms) = (routed.origin.name.clone(), routed.origin.timeout_ms);
    let origin_base = routed.origin.base.origin().ascii_serialization();
    // The address the edge saw; a client's own claims were dropped above.
    let client_ip = header(&req.headers, "cf-connecting-ip").map(str::to_string);
    let content_type = header(&req.headers, "content-type").map(str::to_string);
    let signature = origin_signature(
        &cfg.origin_signing_secret,
        &Signed {
            t: now_s,
            request_id,
            method: &req.method,
            path_and_query: &origin_path,
            body: &req.body,
            project: key.project,
            key_prefix: key.key_prefix,
            plan: key.plan,
            idempotency_key: claim.map(|c| c.key.as_str()),
            content_type: content_type.as_deref(),
            client_ip: client_ip.as_deref(),
            key_meta: key.meta,
        },
    );
    let mut headers = forward_request_headers(&req.headers);
    let key_headers = cfg.settings.auth.key_headers();
    headers.retain(|(k, _)| !key_headers.iter().any(|h| h.eq_ignore_ascii_case(k)));
    let mut added = vec![
        ("X-Request-Id", request_id),
        ("X-Postguard-Project", key.project),
        ("X-Postguard-Key-Prefix", key.key_prefix),
        ("X-Postguard-Plan", key.plan),
        ("X-Postguard-Signature", &signature),
    ];
    if let Some(meta) = key.meta {
        added.push(("X-Postguard-Key-Meta", meta));
    }
    if let Some(ip) = &client_ip {
        added.push(("X-Postguard-Client-IP", ip));
        added.push(("X-Forwarded-For", ip));
    }
    if let Some(c) = claim {
        added.push(("Idempotency-Key", &c.key));
    }
    for (name, value) in added {
        headers.retain(|(k, _)| !k.eq_ignore_ascii_case(name));
        headers.push((name.to_string(), value.to_string()));
    }
    OriginRequest {
        url: format!("{origin_base}{origin_path}"),
        origin: origin_name,
        timeout_ms,
        method: req.method,
        headers,
        body: req.body,
        buffer: claim.is_some(),
    }
}

/// A CORS preflight forwarded to the origin. It carries no key, so none of
/// the key's headers; it is signed like every forwarded request (the
/// identity fields empty), so an origin can tell it came through the
/// gateway — and the gateway counts it against the sender's address first
/// (`limits.unauthenticated_per_minute`).
pub fn preflight_request(
    cfg: &Config,
    path_and_query: &str,
    headers: &[(String, String)],
    request_id: &str,
    now_s: u64,
) -> OriginRequest {
    let (path, query) = match path_and_query.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path_and_query, None),
    };
    let routed = cfg.route("OPTIONS", path);
    let base = routed.origin.base.path().trim_end_matches('/');
    let origin_path = match query {
        Some(q) => format!("{base}{}?{q}", routed.path),
        None => format!("{base}{}", routed.path),
    };
    let client_ip = header(headers, "cf-connecting-ip").map(str::to_string);
    let signature = origin_signature(
        &cfg.origin_signing_secret,
        &Signed {
            t: now_s,
            request_id,
            method: "OPTIONS",
            path_and_query: &origin_path,
            body: &[],
            project: "",
            key_prefix: "",
            plan: "",
            idempotency_key: None,
            content_type: header(headers, "content-type"),
            client_ip: client_ip.as_deref(),
            key_meta: None,
        },
    );
    let mut headers = forward_request_headers(headers);
    let mut added = vec![
        ("X-Request-Id", request_id),
        ("X-Postguard-Signature", &signature),
    ];
    if let Some(ip) = &client_ip {
        added.push(("X-Postguard-Client-IP", ip));
        added.push(("X-Forwarded-For", ip));
    }
    for (name, value) in added {
        headers.retain(|(k, _)| !k.eq_ignore_ascii_case(name));
        headers.push((name.to_string(), value.to_string()));
    }
    OriginRequest {
        url: format!(
            "{}{origin_path}",
            routed.origin.base.origin().ascii_serialization()
        ),
        origin: routed.origin.name.clone(),
        timeout_ms: routed.origin.timeout_ms,
        method: "OPTIONS".to_string(),
        headers,
        body: Vec::new(),
        buffer: true,
    }
}

/// Where a claimed request's response body is kept for replays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// In the key's object, with the record (≤ `max_stored_body_bytes`).
    Inline,
    /// In R2 (≤ `max_replay_bytes`, the bucket bound).
    Object,
    /// Nowhere: a retry gets `IDEMPOTENT_REPLAY_UNAVAILABLE` (410).
    Unavailable,
}

/// Where a body of `body_len` bytes is kept; `bucket` says whether the R2
/// binding is there.
pub fn keep(settings: &Settings, body_len: u64, bucket: bool) -> Keep {
    let idem = &settings.idempotency;
    if body_len <= idem.max_stored_body_bytes {
        Keep::Inline
    } else if bucket && body_len <= idem.max_replay_bytes {
        Keep::Object
    } else {
        Keep::Unavailable
    }
}

/// The completion stored when the full one could not be (its body or event
/// too much for the object, or the object failing): the answer without its
/// body and event, so a retry is told the body is unavailable (410) —
/// never left to let the claim expire into a second execution. A body
/// already in R2 stays referenced.
pub fn without_body(done: &CompleteRequest) -> CompleteRequest {
    CompleteRequest {
        response: StoredResponse {
            body_omitted: true,
            ..done.response.clone()
        },
        event: None,
        ..done.clone()
    }
}

/// The R2 object key of a stored body: per API key id, per Idempotency-Key
/// (hashed: a key may be any visible ASCII, and is the client's data), per
/// request (a later claim of an expired key never collides with it).
pub fn replay_object_key(key_id: &str, idempotency_key: &str, request_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(idempotency_key.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("replays/{key_id}/{hex}/{request_id}")
}

/// Why the origin gave no answer: no answer within its timeout (that
/// origin's own, ms), or none at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    Timeout(u32),
    Unreachable(String),
}

impl Failure {
    pub fn problem(&self) -> Problem {
        match self {
            Failure::Timeout(timeout_ms) => Problem::new(
                ErrorCode::OriginTimeout,
                format!("the origin did not answer within {timeout_ms} ms"),
            ),
            Failure::Unreachable(_) => Problem::new(
                ErrorCode::OriginUnreachable,
                "the origin could not be reached",
            ),
        }
    }
}

/// What becomes of a claim once the origin answered (or failed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    /// Store the response; the body goes along unless `body_omitted`.
    Complete(CompleteRequest),
    /// Drop the claim, so that a retry runs again.
    Release(ReleaseRequest),
}

/// What the origin answered a claimed request.
#[derive(Debug, Clone, Copy)]
pub struct Answered<'a> {
    pub status: u16,
    pub headers: &'a [(String, String)],
    pub body_len: u64,
}

/// The settlement of `claim` once the origin answered (`None`: it did not).
pub fn settle(
    settings: &Settings,
    plan: &Plan,
    claim: &Claim,
    slot: bool,
    answer: Option<Answered>,
) -> Settlement {
    let release = || {
        Settlement::Release(ReleaseRequest {
            key: claim.key.clone(),
            request_id: claim.request_id.clone(),
            slot,
        })
    };
    let Some(Answered {
        status,
        headers,
        body_len,
    }) = answer
    else {
        return release();
    };
    if !idempotency::is_storable_status(status) {
        return release();
    }
    let idem = &settings.idempotency;
    Settlement::Complete(CompleteRequest {
        key: claim.key.clone(),
        request_id: claim.request_id.clone(),
        ttl_ms: u64::from(plan.ttl_s()) * 1000,
        response: StoredResponse {
            status,
            headers: storable_response_headers(headers, idem.store_set_cookie),
            body_omitted: body_len > idem.max_stored_body_bytes,
            body_object: None,
            body_len,
        },
        slot,
        event: None,
    })
}

#[cfg(test)]
mod tests;
