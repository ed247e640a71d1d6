//! The limit on requests without a valid credential (docs/limits.md): every
//! 401, every CORS preflight and every request to an unknown capture URL is
//! counted per client address (`CF-Connecting-IP`) in that address's own
//! object (a `KeyGuard` named `ip:<address>`: one exact counter, whatever
//! isolate or location the requests reach), `limits.unauthenticated_per_minute`
//! a minute. Over it, 429 with `Retry-After`.
//!
//! An isolate that saw an address refused remembers it until the window
//! ends, so a flood from that address then costs neither an object call nor
//! — for made-up API keys — a KV read (`auth::lookup` asks first). A request
//! that carries a valid, cached key is never held by this limit: it is
//! about strangers, not about an office behind one address.

use crate::log;
use postguard_core::log::Line;
use std::cell::RefCell;
use std::collections::HashMap;

use postguard_core::guard::{Admit, AdmitRequest, AdmitResponse};
use postguard_core::limits::{self, Limits, Policy};
use postguard_core::rate_limit::Verdict;
use postguard_core::{ErrorCode, Problem};
use worker::Env;

use crate::durable::client::call;
use crate::reject::{Handled, Reject};
use crate::runtime::{now_ms, RequestCtx};

/// The policy's name in `RateLimit-Policy`.
const POLICY: &str = "unauthenticated";
const BLOCKED_MAX: usize = 10_000;

thread_local! {
    /// Addresses this isolate saw refused: the refusing verdict (its window's end).
    static BLOCKED: RefCell<HashMap<String, Verdict>> = RefCell::new(HashMap::new());
}

fn address(rc: &RequestCtx) -> &str {
    rc.client_ip.as_deref().unwrap_or("unknown")
}

/// The 429 of `verdict`, as seen at `now`.
fn refusal(verdict: &Verdict, now: u64) -> Reject {
    let left_s = verdict.reset_ms.saturating_sub(now).div_ceil(1000).max(1);
    let seen = Verdict {
        remaining: 0,
        reset_in_s: left_s,
        reset_epoch_s: now / 1000 + left_s,
        ..*verdict
    };
    let problem = Problem::new(
        ErrorCode::RateLimitExceeded,
        format!(
            "too many requests without a valid credential from this address ({} per minute); retry later",
            verdict.limit
        ),
    )
    .with_retry_after(left_s);
    Reject::from(problem.with_violated(vec![POLICY.to_string()]))
        .with(&limits::single_headers(&seen, POLICY))
}

/// 429 at once when this isolate knows the caller's address is over.
pub fn refuse_if_blocked(rc: &RequestCtx) -> Handled<()> {
    let now = now_ms();
    let known = BLOCKED.with(|b| {
        let mut b = b.borrow_mut();
        match b.get(address(rc)) {
            Some(v) if v.reset_ms > now => Some(*v),
            Some(_) => {
                b.remove(address(rc));
                None
            }
            None => None,
        }
    });
    match known {
        Some(v) => Err(refusal(&v, now)),
        None => Ok(()),
    }
}

/// Counts one request without a valid credential from the caller's
/// address; 429 when the address is over its minute. The object failing is
/// logged and lets the request through (the limit protects the gateway's
/// neighbours, it must not take the gateway down with it).
pub async fn charge(
    env: &Env,
    cfg: &postguard_core::config::Config,
    rc: &RequestCtx,
) -> Handled<()> {
    refuse_if_blocked(rc)?;
    let quota = cfg.settings.limits.unauthenticated_quota();
    let policy = Policy {
        name: POLICY.to_string(),
        limit: quota.limit,
        window_ms: quota.window_ms,
    };
    let req = AdmitRequest::charge(
        1,
        Limits {
            policies: vec![policy],
            concurrency: None,
        },
    );
    let name = format!("ip:{}", address(rc));
    match call::<Admit>(env, &name, &req, &[]).await {
        Ok((AdmitResponse::Limited { verdict, .. }, _)) => {
            BLOCKED.with(|b| {
                let mut b = b.borrow_mut();
                if b.len() >= BLOCKED_MAX {
                    b.clear();
                }
                b.insert(address(rc).to_string(), verdict);
            });
            Err(refusal(&verdict, now_ms()))
        }
        Ok(_) => Ok(()),
        Err(e) => {
            log::emit(
                log::of_request(Line::error("unauthenticated limiter unavailable"), rc).err(e),
            );
            Ok(())
        }
    }
}

/// Whether an answer is one this limit counts: a refused credential.
pub fn counts(outcome: &Handled) -> bool {
    matches!(outcome, Err(Reject::Client(p, _))
        if matches!(p.code, ErrorCode::InvalidApiKey | ErrorCode::Unauthorized))
}
