//! `GET /_postguard/v1/me`: the calling key and its current limit state (every
//! policy, and the concurrency quota), or the calling portal session's
//! project; and `GET /_postguard/v1/idempotency/{key}`: what became of the
//! key's request under an Idempotency-Key. Both cost nothing: the router's
//! object call for them is a cost-0 look at the key's API budget, whose
//! answer they repeat.

use serde::Serialize;

use super::keys::{policy_states, PolicyState};
use crate::auth::Principal;
use crate::handler::{self, Ctx};
use crate::reject::{Handled, Reject};

#[derive(Serialize)]
struct Me<'a> {
    prefix: &'a str,
    project: &'a str,
    plan: &'a str,
    limit: u32,
    remaining: u32,
    reset: u64,
    window_s: u64,
    expires_at: Option<u64>,
    policies: Vec<PolicyState>,
    #[serde(skip_serializing_if = "Option::is_none")]
    inflight: Option<postguard_core::limits::Inflight>,
}

fn unreached(what: &str) -> Reject {
    Reject::Internal(worker::Error::RustError(format!(
        "{what} reached without a key's answer"
    )))
}

pub async fn get(cx: &Ctx<'_>) -> Handled {
    let (key, verdicts) = match (&cx.who, &cx.verdicts) {
        (Principal::Session(s), _) => return super::portal::me(cx, s),
        (Principal::Key(c), Some(v)) => (&c.key.record, v),
        _ => return Err(unreached("/me")),
    };
    // The binding policy's numbers, as before several policies: the first
    // members of the rate-limit headers.
    let binding = verdicts.binding_verdict();
    let me = Me {
        prefix: &key.prefix,
        project: &key.project,
        plan: &key.plan,
        limit: binding.limit,
        remaining: binding.remaining,
        reset: binding.reset_epoch_s,
        window_s: binding.window_s,
        expires_at: key.expires_at,
        policies: policy_states(verdicts),
        inflight: verdicts.inflight,
    };
    handler::json(cx.rc, 200, &me, &[])
}

/// `GET /_postguard/v1/idempotency/{key}` (the key's own): `{state,
/// status?, request_id?, created_at?, expires_at?}`.
pub async fn idempotency(cx: &Ctx<'_>) -> Handled {
    let lookup = cx.lookup.as_ref().ok_or_else(|| unreached("the lookup"))?;
    handler::json(cx.rc, 200, lookup, &[])
}
