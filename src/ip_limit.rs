//! The limit on requests without a valid credential (docs/limits.md): every
//! refused credential (401), every anonymous 403/404/405 under
//! `/_postguard/` and every CORS preflight is counted per client address
//! (`CF-Connecting-IP`; an IPv6 address by its /64,
//! `postguard_core::unauthenticated`) in that address's own object (a
//! `KeyGuard` named `ip:<address>`: one exact counter, whatever isolate or
//! location the requests reach), `limits.unauthenticated_per_minute` a
//! minute. Over it, 429 with `Retry-After`. The object is transient: it
//! deletes itself once its window is over.
//!
//! An isolate that saw an address refused remembers it until the window
//! ends, so a flood from that address then costs no object call. A
//! presented API key is always looked up (one KV read, or this isolate's
//! cache) before anything is refused: a valid key is never held by this
//! limit — it is about strangers, not about an office behind one address.

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

/// The counter the caller's address is charged to.
fn address(rc: &RequestCtx) -> String {
    postguard_core::unauthenticated::bucket(rc.client_ip.as_deref())
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
fn refuse_if_blocked(rc: &RequestCtx) -> Handled<()> {
    let now = now_ms();
    let known = BLOCKED.with(|b| {
        let mut b = b.borrow_mut();
        let at = address(rc);
        match b.get(&at) {
            Some(v) if v.reset_ms > now => Some(*v),
            Some(_) => {
                b.remove(&at);
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
        limit: quota.limit(),
        window_ms: quota.window_ms(),
    };
    let req = AdmitRequest {
        transient: true,
        ..AdmitRequest::charge(
            1,
            Limits {
                notify_at: Vec::new(),
                policies: vec![policy],
                concurrency: None,
                report_only: false,
            },
        )
    };
    let name = format!("ip:{}", address(rc));
    match call::<Admit>(env, &name, &req, &[]).await {
        Ok((AdmitResponse::Limited { verdict, .. }, _)) => {
            BLOCKED.with(|b| {
                let mut b = b.borrow_mut();
                if b.len() >= BLOCKED_MAX {
                    b.clear();
                }
                b.insert(address(rc), verdict);
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

/// Whether an answer is one this limit counts
/// (`postguard_core::unauthenticated::counts`): a refused credential, or
/// an anonymous miss.
pub fn counts(outcome: &Handled, rc: &RequestCtx) -> bool {
    match outcome {
        Err(Reject::Client(p, _)) => {
            let f = rc.facts.borrow();
            !f.address_charged && postguard_core::unauthenticated::counts(p.code, f.credential)
        }
        _ => false,
    }
}
