//! The proxy pipeline, in the contract's order:
//! authenticate → rate-limit + claim (one Durable Object round trip) →
//! forward → record (complete or release the claim).
//!
//! Every answer after authentication carries the rate-limit headers.

use postguard_core::config::Config;
use postguard_core::guard::{
    Ack, AdmitRequest, AdmitResponse, Claim, CompleteRequest, ReleaseRequest,
};
use postguard_core::headers::{
    client_response_headers, first_invalid_value, forward_request_headers, origin_signature,
    storable_response_headers,
};
use postguard_core::idempotency::{self, Decision, Mode, StoredResponse};
use postguard_core::rate_limit::headers as rate_headers;
use postguard_core::{ErrorCode, Problem};
use worker::{web_sys, Env, Headers, Request, Response};

use crate::auth::{self, ApiKey};
use crate::durable::client::{call, Op};
use crate::http::{self, header_pairs, HeaderList};
use crate::reject::{Handled, Reject};
use crate::runtime::{now_ms, within, RequestCtx};

/// Methods the gateway forwards. Others are refused: the runtime's request
/// type cannot carry them faithfully.
const METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

pub async fn proxy(mut req: Request, env: &Env, cfg: &Config, rc: &RequestCtx) -> Handled {
    let method = req.inner().method().to_ascii_uppercase();
    if !METHODS.contains(&method.as_str()) {
        return Err(Problem::new(
            ErrorCode::MethodNotAllowed,
            format!("method {method} is not supported by the gateway"),
        )
        .with_allow("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
        .into());
    }
    let url = req.url()?;
    let path = url.path().to_string();
    let path_and_query = match url.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.clone(),
    };
    let max_body = cfg.settings.max_body_bytes;

    // 1. Authenticate.
    let auth::Caller { key, plan } =
        auth::api_caller(auth::credential(&req, cfg), env, cfg, rc).await?;

    let has_body = !matches!(method.as_str(), "GET" | "HEAD");
    let body = if has_body {
        req.bytes().await?
    } else {
        Vec::new()
    };

    // Checks whose answer still goes through the limiter (they consume budget).
    let mut early: Option<Problem> = None;
    if body.len() as u64 > max_body {
        early = Some(Problem::payload_too_large(max_body));
    }
    let mut idem_key = None;
    if early.is_none() {
        let mode = cfg.settings.idempotency_mode(&method, &path);
        if mode != Mode::Off {
            match req.headers().get("Idempotency-Key")? {
                Some(raw) => match idempotency::parse_key(&raw) {
                    Ok(k) => {
                        rc.note(|f| f.idempotency_key = Some(k.clone()));
                        idem_key = Some(k);
                    }
                    Err(e) => early = Some(Problem::new(ErrorCode::IdempotencyKeyInvalid, e.to_string())),
                },
                None if mode == Mode::Required => {
                    early = Some(Problem::new(
                        ErrorCode::IdempotencyKeyRequired,
                        format!("{method} {path} requires an Idempotency-Key header (1-255 visible ASCII characters)"),
                    ))
                }
                None => {}
            }
        }
    }

    // Other header values with control characters: the more specific
    // Idempotency-Key answer above wins.
    let incoming = header_pairs(req.headers());
    if early.is_none() {
        if let Some(name) = first_invalid_value(&incoming) {
            let shown: String = name.chars().take(64).collect();
            early = Some(Problem::new(
                ErrorCode::ValidationError,
                format!("header {shown} contains a control character"),
            ));
        }
    }

    // 2 + 3. Rate limit and claim: one round trip to the key's object. A
    // request answered early never claims its key.
    let claim = idem_key
        .as_ref()
        .filter(|_| early.is_none())
        .map(|k| Claim {
            key: k.clone(),
            fingerprint: idempotency::fingerprint(&method, &path_and_query, &body),
            request_id: rc.request_id.clone(),
            lease_ms: u64::from(cfg.settings.idempotency.lease_s) * 1000,
        });
    let admit = AdmitRequest {
        cost: cfg.settings.cost(&method, &path),
        quota: plan.quota(),
        claim,
    };
    let (decision, replay_body): (AdmitResponse, Vec<u8>) =
        call(env, &key.record.id, Op::Admit, &admit, &[]).await?;
    let (verdict, idem, replay) = match decision {
        AdmitResponse::Revoked => return Err(auth::revoked(&key).into()),
        AdmitResponse::Limited { verdict } => {
            rc.note(|f| f.rate_limit_remaining = Some(verdict.remaining));
            let p = Problem::new(
                ErrorCode::RateLimitExceeded,
                format!(
                    "this API key may send {} requests per {} s; retry after the window resets",
                    verdict.limit, verdict.window_s
                ),
            )
            .with_retry_after(verdict.retry_after_s());
            return Err(Reject::from(p).with(&rate_headers(&verdict)));
        }
        AdmitResponse::Admitted {
            verdict,
            idempotency,
            replay,
        } => (verdict, idempotency, replay),
    };
    rc.note(|f| f.rate_limit_remaining = Some(verdict.remaining));
    let rl = rate_headers(&verdict);
    if let Some(p) = early {
        return Err(Reject::from(p).with(&rl));
    }
    match idem {
        Some(Decision::InProgress { retry_after_s }) => {
            let p = Problem::new(
                ErrorCode::IdempotencyKeyInProgress,
                "a request with this Idempotency-Key is still being processed; retry later to get its result",
            )
            .with_retry_after(retry_after_s);
            return Err(Reject::from(p).with(&rl));
        }
        Some(Decision::Conflict) => {
            let p = Problem::new(
                ErrorCode::IdempotencyKeyReuseConflict,
                "this Idempotency-Key was already used with a different request (method, path, query or body differ)",
            );
            return Err(Reject::from(p).with(&rl));
        }
        Some(Decision::Replay) => {
            let Some(stored) = replay else {
                return Err(
                    worker::Error::RustError("replay without a stored response".into()).into(),
                );
            };
            rc.note(|f| f.replayed = true);
            let mut extra = rl;
            extra.push(("Idempotent-Replayed", "true".into()));
            if stored.body_omitted {
                extra.push(("Idempotent-Body-Omitted", "true".into()));
            }
            return Ok(http::respond(
                rc,
                stored.status,
                &stored.headers,
                &extra,
                Some(replay_body),
            )?);
        }
        Some(Decision::Execute) | None => {}
    }

    // 4. Forward.
    let claimed = idem_key.is_some();
    let outcome = forward(
        cfg,
        rc,
        &key,
        &method,
        &path_and_query,
        &incoming,
        idem_key.as_deref(),
        body,
        claimed,
    )
    .await;

    // 5. Record.
    match outcome {
        Err(failure) => {
            if let Failure::Unreachable(reason) = &failure {
                worker::console_warn!("{} origin unreachable: {}", rc.request_id, reason);
            }
            if let Some(k) = idem_key {
                release(env, &key.record.id, k, &rc.request_id).await;
            }
            Err(Reject::from(failure.problem(cfg)).with(&rl))
        }
        Ok(Forwarded::Streaming(resp)) => {
            let headers = client_response_headers(&header_pairs(resp.headers()));
            let h = http::to_headers(headers.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
            for (k, v) in &rl {
                h.set(k, v)?;
            }
            h.set("X-Request-Id", &rc.request_id)?;
            let declared = h.get("Content-Length")?.and_then(|v| v.parse().ok());
            rc.note(|f| f.response_bytes = declared);
            Ok(resp.with_headers(h))
        }
        Ok(Forwarded::Buffered {
            status,
            headers,
            body,
        }) => {
            let Some(k) = idem_key else {
                return Ok(http::respond(
                    rc,
                    status,
                    &client_response_headers(&headers),
                    &rl,
                    Some(body),
                )?);
            };
            if idempotency::is_storable_status(status) {
                let omitted = body.len() as u64 > cfg.settings.idempotency.max_stored_body_bytes;
                let done = CompleteRequest {
                    key: k,
                    request_id: rc.request_id.clone(),
                    ttl_ms: u64::from(plan.idempotency_ttl_s) * 1000,
                    response: StoredResponse {
                        status,
                        headers: storable_response_headers(
                            &headers,
                            cfg.settings.idempotency.store_set_cookie,
                        ),
                        body_omitted: omitted,
                        body_len: body.len() as u64,
                    },
                };
                // Stored before answering: a client that saw this response
                // will get it again on retry, even if this isolate dies now.
                // One retry: a transient object error must not leave the
                // claim to expire, after which a retry would run again.
                let payload: &[u8] = if omitted { &[] } else { &body };
                for attempt in 1..=2 {
                    match call::<_, Ack>(env, &key.record.id, Op::Complete, &done, payload).await {
                        Ok(_) => break,
                        Err(e) => worker::console_error!(
                            "storing the response of {} failed (attempt {}): {}",
                            rc.request_id,
                            attempt,
                            e
                        ),
                    }
                }
            } else {
                release(env, &key.record.id, k, &rc.request_id).await;
            }
            Ok(http::respond(
                rc,
                status,
                &client_response_headers(&headers),
                &rl,
                Some(body),
            )?)
        }
    }
}

/// Drops this request's claim so that a retry runs again. Awaited before
/// answering, so a client retrying right after a 5xx is not told 409; if the
/// call fails, the lease frees the key.
async fn release(env: &Env, key_id: &str, idem: String, request_id: &str) {
    let rel = ReleaseRequest {
        key: idem,
        request_id: request_id.to_string(),
    };
    if let Err(e) = call::<_, Ack>(env, key_id, Op::Release, &rel, &[]).await {
        worker::console_error!("release of claim {} failed: {}", request_id, e);
    }
}

enum Forwarded {
    /// Not under an Idempotency-Key: the origin's body streams through.
    Streaming(Response),
    /// Under a claim: the body is read so it can be stored.
    Buffered {
        status: u16,
        headers: HeaderList,
        body: Vec<u8>,
    },
}

enum Failure {
    Timeout,
    Unreachable(String),
}

impl Failure {
    fn problem(&self, cfg: &Config) -> Problem {
        match self {
            Failure::Timeout => Problem::new(
                ErrorCode::OriginTimeout,
                format!(
                    "the origin did not answer within {} ms",
                    cfg.settings.origin.timeout_ms
                ),
            ),
            Failure::Unreachable(_) => Problem::new(
                ErrorCode::OriginUnreachable,
                "the origin could not be reached",
            ),
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn forward(
    cfg: &Config,
    rc: &RequestCtx,
    key: &ApiKey,
    method: &str,
    path_and_query: &str,
    incoming: &[(String, String)],
    idem_key: Option<&str>,
    body: Vec<u8>,
    buffer: bool,
) -> std::result::Result<Forwarded, Failure> {
    let unreachable = |e: worker::Error| Failure::Unreachable(e.to_string());
    // The origin sees its base path + the client's path; that is what is signed.
    let origin_path = format!(
        "{}{path_and_query}",
        cfg.origin_url.path().trim_end_matches('/')
    );
    let target = format!(
        "{}{origin_path}",
        cfg.origin_url.origin().ascii_serialization()
    );
    let headers = web_sys::Headers::new().map_err(|e| unreachable(e.into()))?;
    for (k, v) in forward_request_headers(incoming) {
        headers.append(&k, &v).map_err(|e| unreachable(e.into()))?;
    }
    let sig = origin_signature(
        &cfg.origin_token,
        now_ms() / 1000,
        &rc.request_id,
        method,
        &origin_path,
        &body,
    );
    let mut added: Vec<(&str, &str)> = vec![
        ("X-Request-Id", &rc.request_id),
        ("X-Postguard-Project", &key.record.project),
        ("X-Postguard-Key-Prefix", &key.record.prefix),
        ("X-Postguard-Plan", &key.record.plan),
        ("X-Postguard-Signature", &sig),
    ];
    if let Some(k) = idem_key {
        added.push(("Idempotency-Key", k));
    }
    for (k, v) in added {
        headers.set(k, v).map_err(|e| unreachable(e.into()))?;
    }
    let controller = web_sys::AbortController::new().map_err(|e| unreachable(e.into()))?;
    let init = http::request_init(method, &body);
    init.set_headers(&headers);
    init.set_redirect(web_sys::RequestRedirect::Manual);
    init.set_signal(Some(&controller.signal()));

    let work = async move {
        let resp = http::raw_fetch(&worker::js_sys::global(), &target, &init).await?;
        if !buffer {
            return Ok(Forwarded::Streaming(Response::from(resp)));
        }
        let status = resp.status();
        let headers = header_pairs(&Headers(resp.headers()));
        let body = http::read_body(&resp).await?;
        Ok::<_, worker::Error>(Forwarded::Buffered {
            status,
            headers,
            body,
        })
    };
    match within(u64::from(cfg.settings.origin.timeout_ms), work).await {
        Some(result) => result.map_err(unreachable),
        None => {
            controller.abort();
            Err(Failure::Timeout)
        }
    }
}
