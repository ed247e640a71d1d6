//! The home's side of leasing (ADR 0040): a request an edge forwards, or an
//! edge's prefetch (a cost-0 peek), admitted as any other request (`admit`)
//! and then, with the edge's ask, a grant of blocks charged to the same
//! windows — the ledger beside them, both in the one transaction the
//! object runs this in.

use super::{admit, notices, Done, GuardStore};
use crate::guard::{self, AdmitResponse, GuardState, LeaseReply, LeaseRequest, Profile};
use crate::lease::{self, Ask, AtHome, Grant};

/// `lease`: the admission, the grant, and the key's profile if the home's
/// is newer than the caller's record (so the edge applies it from now on).
/// A revoked or expired key gets no grant: the edge then forgets its leases.
pub fn lease<S: GuardStore>(
    store: &mut S,
    req: &LeaseRequest,
    body: &[u8],
    now_ms: u64,
) -> Result<Done<LeaseReply>, S::Error> {
    let done = admit(store, &req.admit, body, now_ms)?;
    let state = store.state()?;
    let fresher = guard::fresher(state.profile.as_ref(), &req.admit);
    let (grant, noticed) = match (&req.ask, &done.answer) {
        (Some(_), AdmitResponse::Revoked | AdmitResponse::Expired) | (None, _) => (None, None),
        (Some(ask), _) => {
            let (g, noticed) = grant_ask(store, &state, req, ask, fresher, now_ms)?;
            (Some(g), noticed)
        }
    };
    Ok(Done {
        answer: LeaseReply {
            answer: done.answer,
            grant,
            profile: fresher.cloned().map(Box::new),
        },
        payload: done.payload,
        alarm_by: done.alarm_by,
        work_at: done.work_at.into_iter().chain(noticed).min(),
        forget_at: done.forget_at,
    })
}

/// The grant, written: the windows it charged and the ledger that says to
/// whom, and the quota notices the charge crossed (decided where the home
/// charges: a leased block counts as used when it is leased). No `await`
/// between the admission and this (the caller's one transaction), so the
/// grant sees what the admission left.
fn grant_ask<S: GuardStore>(
    store: &mut S,
    state: &GuardState,
    req: &LeaseRequest,
    ask: &Ask,
    fresher: Option<&Profile>,
    now_ms: u64,
) -> Result<(Grant, Option<u64>), S::Error> {
    let limits = guard::limits_of(fresher, &req.admit);
    let (mut windows, mut ledger) = (state.windows.clone(), state.ledger.clone());
    let at = AtHome {
        now: now_ms,
        in_use: store.slots_in_use(now_ms)?,
        request_ms: req.request_ms,
    };
    let g = lease::grant(&mut windows, &mut ledger, &limits, ask, &req.settings, at);
    let mut noticed = None;
    if windows != state.windows {
        store.put_windows(&windows)?;
        noticed = notices(store, state, &req.admit, &state.windows, &windows, now_ms)?;
    }
    if ledger != state.ledger {
        store.put_ledger(&ledger)?;
    }
    Ok((g, noticed))
}
