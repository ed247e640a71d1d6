//! The key object's decisions: an admission (limits, a concurrency slot,
//! the Idempotency-Key's claim or replay, an operation), the completion and
//! release of a claim, and what a key's record says to a lookup. Pure: the
//! object runs them with no `await` between reading its state and writing
//! what they decide (`store`).

use crate::idempotency::{decide, Decision, Record};
use crate::lease::Ledger;
use crate::limits::{self, Inflight, Limits, Windows};
use crate::operations;

use super::{
    AdmitRequest, AdmitResponse, Claim, CompleteRequest, Lookup, LookupState, NewOperation,
    Profile, ReleaseRequest, Scope,
};

/// What the record of a key says at `now_ms`: a claim still leased runs; a
/// completed one within its TTL is replayed; one past either has expired
/// (the key starts a new operation); no record is unknown.
pub fn lookup(record: Option<&Record>, now_ms: u64) -> Lookup {
    let mut out = Lookup {
        state: LookupState::Unknown,
        status: None,
        request_id: None,
        created_at: None,
        expires_at: None,
    };
    match record {
        None => {}
        Some(Record::InFlight {
            request_id,
            claimed_at_ms,
            lease_until_ms,
            ..
        }) => {
            out.state = match now_ms < *lease_until_ms {
                true => LookupState::InProgress,
                false => LookupState::Expired,
            };
            out.request_id = Some(request_id.clone());
            out.created_at = Some(*claimed_at_ms);
            out.expires_at = Some(*lease_until_ms);
        }
        Some(Record::Completed {
            request_id,
            completed_at_ms,
            expires_at_ms,
            response,
            ..
        }) => {
            out.state = match now_ms < *expires_at_ms {
                true => LookupState::Completed,
                false => LookupState::Expired,
            };
            out.status = Some(response.status);
            out.request_id = Some(request_id.clone());
            out.created_at = Some(*completed_at_ms);
            out.expires_at = Some(*expires_at_ms);
        }
        // An operation: in progress until done, then completed like an answer.
        Some(Record::Accepted {
            request_id,
            claimed_at_ms,
            expires_at_ms,
            completed_at_ms,
            status,
            ..
        }) => {
            out.state = match (completed_at_ms, now_ms < *expires_at_ms) {
                (_, false) => LookupState::Expired,
                (None, true) => LookupState::InProgress,
                (Some(_), true) => LookupState::Completed,
            };
            out.status = *status;
            out.request_id = Some(request_id.clone());
            out.created_at = Some(completed_at_ms.unwrap_or(*claimed_at_ms));
            out.expires_at = Some(*expires_at_ms).filter(|at| *at < operations::NEVER);
        }
    }
    out
}

/// The object's state an admission reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuardState {
    pub revoked: bool,
    pub windows: Windows,
    pub profile: Option<Profile>,
    /// Who holds the blocks leased from the windows (ADR 0040): written in
    /// the same transaction as the windows; empty while edges are off.
    pub ledger: Ledger,
}

/// What the object must persist, and what it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmitPlan {
    /// `Some` when the windows changed and must be written.
    pub windows: Option<Windows>,
    /// `Some` when a new in-flight claim must be written.
    pub claim: Option<Record>,
    /// A concurrency slot to take until this time (epoch ms).
    pub slot: Option<(String, u64)>,
    /// A new operation to write with the claim (its body with it).
    pub operation: Option<operations::Operation>,
    pub response: AdmitResponse,
}

impl AdmitPlan {
    fn answer(response: AdmitResponse) -> AdmitPlan {
        AdmitPlan {
            windows: None,
            claim: None,
            slot: None,
            operation: None,
            response,
        }
    }
}

/// Whether the calling secret has expired: for a secret a reroll replaced,
/// the end of its grace (as its own record says, and as the object's
/// marker says — either suffices, so neither a stale cache nor a record KV
/// still serves brings it back); else the key's own expiry (the object's
/// fresher profile, else the caller's record).
fn expired(
    profile: Option<&Profile>,
    fresher: Option<&Profile>,
    req: &AdmitRequest,
    now_ms: u64,
) -> bool {
    let caller = req.caller.as_ref();
    if caller
        .and_then(|c| c.secret_until)
        .is_some_and(|at| now_ms >= at)
    {
        return true;
    }
    let expires_at = match fresher {
        Some(p) => p.expires_at,
        None => caller.and_then(|c| c.expires_at),
    };
    if expires_at.is_some_and(|at| now_ms >= at) {
        return true;
    }
    let key = caller.map_or("", |c| c.key.as_str());
    let previous = profile.map_or(&[][..], |p| &p.previous[..]);
    !key.is_empty() && previous.iter().any(|p| p.key == key && now_ms >= p.until)
}

/// `profile` if it is newer than what the caller's record says: what the
/// operator set since, which the admission applies.
pub fn fresher<'a>(profile: Option<&'a Profile>, req: &AdmitRequest) -> Option<&'a Profile> {
    let seen = req.caller.as_ref().map_or(0, |c| c.version);
    profile.filter(|p| p.version > seen)
}

/// The limits an admission enforces: the fresher profile's, else the
/// caller's.
pub fn limits_of(fresher: Option<&Profile>, req: &AdmitRequest) -> Limits {
    match (fresher, req.scope) {
        (Some(p), Scope::Api) => p.limits.clone(),
        (Some(p), Scope::Gateway) => p.gateway.clone(),
        (None, _) => req.requested_limits(),
    }
}

/// The limits whose quota notices an admission of `req` may write: those
/// it enforces (`limits_of`), if they list `notify_at` and the caller said
/// where notices go. Read without cloning (it is asked on every admission).
pub fn notice_limits<'a>(
    profile: Option<&'a Profile>,
    req: &'a AdmitRequest,
) -> Option<&'a Limits> {
    req.notices.as_ref()?;
    let limits = match (fresher(profile, req), req.scope) {
        (Some(p), Scope::Api) => &p.limits,
        (Some(p), Scope::Gateway) => &p.gateway,
        (None, _) => req.limits.as_ref()?,
    };
    (!limits.notify_at.is_empty()).then_some(limits)
}

/// Whether an admission of `req` may write quota notices ([`notice_limits`]).
pub fn notifies(profile: Option<&Profile>, req: &AdmitRequest) -> bool {
    notice_limits(profile, req).is_some()
}

/// Whether the calling secret has expired as an edge sees it: by the
/// caller's record and by the key's `profile` as the home last told the
/// edge (a reroll's previous secrets, an expiry set since the record).
pub fn expired_for(profile: Option<&Profile>, req: &AdmitRequest, now_ms: u64) -> bool {
    expired(profile, fresher(profile, req), req, now_ms)
}

/// The `admit` decision. The caller runs it with no `await` between reading
/// the state and persisting the plan, which makes check-and-claim (and
/// check-and-slot) atomic. `in_use` is how many concurrency slots are taken.
pub fn admit(
    state: &GuardState,
    in_use: u32,
    record: Option<&Record>,
    req: &AdmitRequest,
    now_ms: u64,
) -> AdmitPlan {
    if state.revoked {
        return AdmitPlan::answer(AdmitResponse::Revoked);
    }
    let fresher = fresher(state.profile.as_ref(), req);
    if expired(state.profile.as_ref(), fresher, req, now_ms) {
        return AdmitPlan::answer(AdmitResponse::Expired);
    }
    let limits = limits_of(fresher, req);
    let slot_limit = limits.concurrency.filter(|_| req.slot.is_some());
    let no_slot = slot_limit.is_some_and(|n| !limits::slot_free(in_use, n));
    // Without a slot nothing is charged: the windows are only read.
    let cost = if no_slot { 0 } else { req.cost };
    let checked = limits::check_all(&state.windows, &limits.policies, now_ms, cost);
    let mut verdicts = checked.verdicts;
    if let Some(n) = slot_limit {
        verdicts.inflight = Some(Inflight {
            limit: n,
            in_use: if no_slot { in_use } else { in_use + 1 },
            refused: no_slot,
        });
    } else if let (Some(n), true) = (limits.concurrency, req.reports_inflight()) {
        verdicts.inflight = Some(Inflight {
            limit: n,
            in_use,
            refused: false,
        });
    }
    let verdict = verdicts.binding_verdict();
    // Report-only limits admit what they would refuse, and say so.
    let would_refuse = (!verdicts.admitted())
        .then(|| verdicts.violated().into_iter().next())
        .flatten();
    if would_refuse.is_some() && !limits.report_only {
        // A refusal changes the windows only when one from the future was
        // pinned to now (it must not stay in the future).
        return AdmitPlan {
            windows: checked.windows,
            claim: None,
            slot: None,
            operation: None,
            response: AdmitResponse::Limited {
                verdict,
                verdicts: Some(verdicts),
            },
        };
    }
    let decision = req
        .claim
        .as_ref()
        .map(|c| decide(record, &c.fingerprint, now_ms));
    let (claim_record, operation) = match (&req.claim, &decision, &req.operation) {
        (Some(c), Some(Decision::Execute), Some(new)) => accept(c, new, now_ms),
        (Some(c), Some(Decision::Execute), None) => (
            Some(Record::InFlight {
                fingerprint: c.fingerprint.clone(),
                request_id: c.request_id.clone(),
                claimed_at_ms: now_ms,
                lease_until_ms: now_ms.saturating_add(c.lease_ms),
            }),
            None,
        ),
        _ => (None, None),
    };
    let replay = match (&decision, record) {
        (Some(Decision::Replay), Some(Record::Completed { response, .. })) => {
            Some(response.clone())
        }
        _ => None,
    };
    // Only a request that goes to the origin holds a slot.
    let forwarded = matches!(decision, None | Some(Decision::Execute));
    // … and a request over the concurrency quota (report-only) takes none.
    let slot = match (&req.slot, slot_limit, forwarded && !no_slot) {
        (Some(s), Some(_), true) => Some((s.id.clone(), now_ms.saturating_add(s.lease_ms))),
        _ => None,
    };
    if slot.is_none() {
        if let Some(i) = verdicts.inflight.as_mut() {
            i.in_use = in_use;
        }
    }
    AdmitPlan {
        windows: checked.windows,
        claim: claim_record,
        slot,
        response: AdmitResponse::Admitted {
            verdict,
            idempotency: decision,
            replay,
            verdicts: Some(verdicts),
            refresh: fresher.cloned().map(Box::new),
            lookup: req
                .lookup
                .as_ref()
                .map(|_| Box::new(lookup(record, now_ms))),
            operation: operation.as_ref().map(|op| Box::new(op.view())),
            would_refuse,
        },
        operation,
    }
}

/// The claim of an asynchronous request: the key's record names the
/// operation (every later request with the key is told it), which is
/// written queued with it.
fn accept(
    c: &Claim,
    new: &NewOperation,
    now_ms: u64,
) -> (Option<Record>, Option<operations::Operation>) {
    let record = Record::Accepted {
        fingerprint: c.fingerprint.clone(),
        request_id: c.request_id.clone(),
        operation_id: new.id.clone(),
        claimed_at_ms: now_ms,
        expires_at_ms: operations::NEVER,
        completed_at_ms: None,
        status: None,
    };
    let op = operations::Operation::new(
        new.id.clone(),
        c.request_id.clone(),
        new.request.clone(),
        new.ttl_ms,
        now_ms,
        new.requeue_ms,
    );
    (Some(record), Some(op))
}

/// The completed record to write, or `None` when the claim is no longer held
/// by this request (its lease ran out and another request took the key): a
/// late completion never overwrites someone else's claim.
pub fn complete(record: Option<&Record>, req: &CompleteRequest, now_ms: u64) -> Option<Record> {
    match record {
        Some(Record::InFlight {
            fingerprint,
            request_id,
            ..
        }) if *request_id == req.request_id => Some(Record::Completed {
            fingerprint: fingerprint.clone(),
            request_id: request_id.clone(),
            completed_at_ms: now_ms,
            expires_at_ms: now_ms.saturating_add(req.ttl_ms),
            response: req.response.clone(),
        }),
        _ => None,
    }
}

/// Whether the record is this request's claim and should be deleted.
pub fn should_release(record: Option<&Record>, req: &ReleaseRequest) -> bool {
    matches!(record, Some(Record::InFlight { request_id, .. }) if *request_id == req.request_id)
}
