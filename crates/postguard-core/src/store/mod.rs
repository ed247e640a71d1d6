//! The key guard's orchestration over a storage port: load → decide
//! (`guard`) → persist, for each object operation, and the expiry sweep.
//!
//! [`GuardStore`] is synchronous on purpose: the object runs one operation
//! with no `await` between reading its state and writing the decision, which
//! makes check-and-claim (and check-and-slot) atomic, and a synchronous trait
//! makes that something the compiler checks. The Durable Object implements it
//! over its SQLite storage (`src/durable/key_guard.rs`); [`MemoryStore`]
//! implements it for the host tests below.

pub use crate::guard::Pending;
use crate::guard::{
    self, Ack, AdmitRequest, AdmitResponse, CompleteRequest, GuardState, Profile, ReleaseRequest,
};
use crate::idempotency::{Decision, Record};
use crate::lease;
use crate::lease::Ledger;
use crate::limits::Windows;
use crate::operations::Operation;
use crate::quota_notice;
use crate::response_events::PendingEvent;

/// Which body of an operation: the request it runs, or the answer it keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Part {
    Request = 0,
    Result = 1,
}

/// What a key's object stores.
pub trait GuardStore {
    type Error;
    /// Revoked flag, windows and profile (the object keeps them in memory).
    fn state(&mut self) -> Result<GuardState, Self::Error>;
    fn put_windows(&mut self, windows: &Windows) -> Result<(), Self::Error>;
    fn put_revoked(&mut self, at_ms: u64) -> Result<(), Self::Error>;
    fn put_profile(&mut self, profile: &Profile) -> Result<(), Self::Error>;
    /// The ledger of blocks leased to edges (ADR 0040), beside the windows.
    fn put_ledger(&mut self, ledger: &Ledger) -> Result<(), Self::Error>;
    /// Concurrency slots still leased at `now_ms`.
    fn slots_in_use(&mut self, now_ms: u64) -> Result<u32, Self::Error>;
    fn put_slot(&mut self, id: &str, until_ms: u64) -> Result<(), Self::Error>;
    fn delete_slot(&mut self, id: &str) -> Result<(), Self::Error>;
    /// Deletes the slots whose lease ended by `now_ms`.
    fn delete_expired_slots(&mut self, now_ms: u64) -> Result<(), Self::Error>;
    fn record(&mut self, key: &str) -> Result<Option<Record>, Self::Error>;
    /// Inserts or replaces the record, with its expiry.
    fn put_record(&mut self, key: &str, record: &Record) -> Result<(), Self::Error>;
    fn delete_record(&mut self, key: &str) -> Result<(), Self::Error>;
    fn body(&mut self, key: &str) -> Result<Vec<u8>, Self::Error>;
    /// Writes the body of a key that has none.
    fn put_body(&mut self, key: &str, body: &[u8]) -> Result<(), Self::Error>;
    fn delete_body(&mut self, key: &str) -> Result<(), Self::Error>;
    /// Up to `limit` keys whose record expired at `now_ms`, earliest first.
    fn expired(&mut self, now_ms: u64, limit: usize) -> Result<Vec<String>, Self::Error>;
    /// The earliest expiry of any record.
    fn next_expiry(&mut self) -> Result<Option<u64>, Self::Error>;

    // Asynchronous operations (ADR 0037).
    fn operation(&mut self, id: &str) -> Result<Option<Operation>, Self::Error>;
    /// Inserts or replaces the operation (its state, due time and expiry indexed).
    fn put_operation(&mut self, op: &Operation) -> Result<(), Self::Error>;
    /// Deletes the operation and its bodies.
    fn delete_operation(&mut self, id: &str) -> Result<(), Self::Error>;
    fn op_body(&mut self, id: &str, part: Part) -> Result<Vec<u8>, Self::Error>;
    fn put_op_body(&mut self, id: &str, part: Part, body: &[u8]) -> Result<(), Self::Error>;
    /// A page of the project's operations, newest first (`created_at`, then id).
    fn operations(&mut self, page: &crate::operations::Page)
        -> Result<Vec<Operation>, Self::Error>;
    /// Up to `limit` operations due at `now_ms`, earliest first.
    fn due_operations(&mut self, now_ms: u64, limit: usize) -> Result<Vec<Operation>, Self::Error>;
    /// Up to `limit` operations that expired at `now_ms`, earliest first.
    fn expired_operations(
        &mut self,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<Operation>, Self::Error>;
    /// The earliest expiry of any operation.
    fn next_operation_expiry(&mut self) -> Result<Option<u64>, Self::Error>;

    // Events to publish (the object's outbox).
    /// Writes the event to publish, due at once, unless its id is there.
    fn put_pending(&mut self, ev: &PendingEvent, now_ms: u64) -> Result<(), Self::Error>;
    /// Up to `limit` events due at `now_ms`, earliest first.
    fn pending(&mut self, now_ms: u64, limit: usize) -> Result<Vec<Pending>, Self::Error>;
    fn retry_pending(&mut self, id: &str, attempts: u32, next_at: u64) -> Result<(), Self::Error>;
    fn delete_pending(&mut self, id: &str) -> Result<(), Self::Error>;
    /// The earliest time an operation or an event is due.
    fn next_work(&mut self) -> Result<Option<u64>, Self::Error>;
}

/// When the sweep should run for something that expires at `expires_at_ms`:
/// records outlive their expiry by `grace_ms` (`idempotency.lookup_grace_s`)
/// so `GET /idempotency/{key}` can answer `expired` rather than `unknown` to
/// a client that comes back late. An expired record is never replayed: the
/// next request with its key claims afresh and replaces it.
pub fn sweep_at(expires_at_ms: u64, grace_ms: u64) -> u64 {
    expires_at_ms.saturating_add(grace_ms)
}

/// An operation's answer, and when what it wrote expires (`None`: nothing
/// new expires); the sweep for it is due at [`sweep_at`] of that.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done<T> {
    pub answer: T,
    /// The response body travelling with the answer (a replay's).
    pub payload: Vec<u8>,
    pub alarm_by: Option<u64>,
    /// When something it wrote is due for the alarm's work (an operation to
    /// hand to the queue, an event to publish), with no grace added.
    pub work_at: Option<u64>,
    /// A transient object's windows end then: it forgets everything at that
    /// time (`AdmitRequest::transient`).
    pub forget_at: Option<u64>,
}

impl<T> Done<T> {
    /// An answer that wrote nothing the alarm cares about.
    pub fn answer(answer: T) -> Done<T> {
        Done {
            answer,
            payload: Vec::new(),
            alarm_by: None,
            work_at: None,
            forget_at: None,
        }
    }
}

/// `admit`: charge the limits, take a concurrency slot, then claim (or
/// replay, or look up) the Idempotency-Key; the quota notices the charge
/// crossed go to the outbox with it ([`notices`]).
pub fn admit<S: GuardStore>(
    store: &mut S,
    req: &AdmitRequest,
    body: &[u8],
    now_ms: u64,
) -> Result<Done<AdmitResponse>, S::Error> {
    let state = store.state()?;
    let key = req.claim.as_ref().map(|c| &c.key).or(req.lookup.as_ref());
    let record = match key {
        Some(k) => store.record(k)?,
        None => None,
    };
    // Slots leased to edges are in use as far as the home knows (ADR 0040).
    let in_use = match req.slot.is_some() || req.reports_inflight() {
        true => lease::home::in_use_with_leases(&state.ledger, store.slots_in_use(now_ms)?, now_ms),
        false => 0,
    };
    let mut plan = guard::admit(&state, in_use, record.as_ref(), req, now_ms);
    if let Some(w) = &plan.windows {
        store.put_windows(w)?;
    }
    // Only an admission of a cost charges; a refusal or a peek writes a
    // window only to pin one from the future to now.
    let noticed = match (&plan.windows, &plan.response) {
        (Some(after), AdmitResponse::Admitted { .. }) if req.cost > 0 => {
            notices(store, &state, req, &state.windows, after, now_ms)?
        }
        _ => None,
    };
    if let (Some(c), Some(new_claim)) = (&req.claim, &plan.claim) {
        store.put_record(&c.key, new_claim)?;
        // A claim that replaces an expired record drops its old body.
        if record.is_some() {
            store.delete_body(&c.key)?;
        }
    }
    // The operation and its request, with the claim: durable before the 202.
    if let Some(op) = &plan.operation {
        store.put_operation(op)?;
        if op.request.body_object.is_none() && !body.is_empty() {
            store.put_op_body(&op.id, Part::Request, body)?;
        }
    }
    tell_operation(store, &mut plan.response, record.as_ref())?;
    if let Some((id, until)) = &plan.slot {
        store.put_slot(id, *until)?;
    }
    let mut payload = Vec::new();
    if let (
        Some(c),
        AdmitResponse::Admitted {
            idempotency: Some(Decision::Replay),
            replay: Some(r),
            ..
        },
    ) = (&req.claim, &plan.response)
    {
        if !r.body_omitted {
            payload = store.body(&c.key)?;
        }
    }
    // An operation's record expires once it is done; the alarm first looks
    // at it when it is due to be handed to the queue again.
    let claim_expiry = plan
        .claim
        .as_ref()
        .map(Record::expires_at_ms)
        .filter(|at| *at < crate::operations::NEVER);
    let slot_expiry = plan.slot.as_ref().map(|(_, until)| *until);
    Ok(Done {
        alarm_by: claim_expiry.into_iter().chain(slot_expiry).min(),
        work_at: (plan.operation.as_ref().and_then(|op| op.due_at))
            .into_iter()
            .chain(noticed)
            .min(),
        forget_at: forget_at(req, plan.windows.is_some(), &plan.response),
        answer: plan.response,
        payload,
    })
}

/// Quota notices (`quota_notice`): the thresholds of `notify_at` that the
/// windows crossed from `before` to `after`, each written to the outbox
/// (due now; `Some(now_ms)` when one was) — in the transaction that writes
/// `after`, which the object runs one at a time, so each threshold of a
/// window is crossed by one admission however many arrive together, and its
/// event id (key, policy, window, threshold) makes any repeat the same event.
pub fn notices<S: GuardStore>(
    store: &mut S,
    state: &GuardState,
    req: &AdmitRequest,
    before: &Windows,
    after: &Windows,
    now_ms: u64,
) -> Result<Option<u64>, S::Error> {
    let Some(to) = req.notices.as_deref() else {
        return Ok(None);
    };
    if !guard::notifies(state.profile.as_ref(), req) {
        return Ok(None);
    }
    let limits = guard::limits_of(guard::fresher(state.profile.as_ref(), req), req);
    let crossed = quota_notice::crossed(&limits.notify_at, &limits.policies, before, after);
    for n in &crossed {
        store.put_pending(&quota_notice::pending(to, n), now_ms)?;
    }
    Ok((!crossed.is_empty()).then_some(now_ms))
}

/// When a transient object whose windows were just written forgets them:
/// at the end of its longest window.
fn forget_at(req: &AdmitRequest, wrote: bool, answer: &AdmitResponse) -> Option<u64> {
    if !(req.transient && wrote) {
        return None;
    }
    answer
        .verdicts()?
        .said
        .iter()
        .map(|s| s.verdict.reset_ms)
        .max()
}

/// A request told an operation again (`accepted`) is told how it stands.
fn tell_operation<S: GuardStore>(
    store: &mut S,
    response: &mut AdmitResponse,
    record: Option<&Record>,
) -> Result<(), S::Error> {
    let AdmitResponse::Admitted {
        idempotency: Some(Decision::Accepted),
        operation,
        ..
    } = response
    else {
        return Ok(());
    };
    if let Some(Record::Accepted { operation_id, .. }) = record {
        *operation = store.operation(operation_id)?.map(|op| Box::new(op.view()));
    }
    Ok(())
}

/// [`admit`]'s answer when it would touch no storage: no Idempotency-Key to
/// claim or look up, no slot to take, the state already known (`state`), and
/// a decision that writes nothing (a refused charge, a cost-0 peek, a
/// revoked or expired key). The object then answers without opening a
/// transaction; `None`: run [`admit`].
pub fn admit_in_memory(
    state: &GuardState,
    req: &AdmitRequest,
    now_ms: u64,
) -> Option<AdmitResponse> {
    if req.claim.is_some() || req.lookup.is_some() || req.slot.is_some() || req.reports_inflight() {
        return None;
    }
    let plan = guard::admit(state, 0, None, req, now_ms);
    (plan.windows.is_none() && plan.claim.is_none() && plan.slot.is_none()).then_some(plan.response)
}

/// Whether [`admit`] needs a storage transaction for `req` at `now_ms`.
/// Without a claim or a slot it writes at most one statement (the windows),
/// which is atomic on its own — unless the charge may cross a quota
/// notice's threshold (`quota_notice::may_cross`, a few admissions per
/// window), when it may also write the notice, which must commit with it.
/// `state`: the object's, if it holds it in memory (unknown, a request
/// that may notify takes the transaction).
pub fn admit_needs_transaction(
    req: &AdmitRequest,
    state: Option<&GuardState>,
    now_ms: u64,
) -> bool {
    if req.claim.is_some() || req.slot.is_some() {
        return true;
    }
    if req.notices.is_none() {
        return false;
    }
    let Some(state) = state else {
        return true;
    };
    guard::notice_limits(state.profile.as_ref(), req).is_some_and(|l| {
        quota_notice::may_cross(&l.notify_at, &l.policies, &state.windows, now_ms, req.cost)
    })
}

/// `complete`: store the origin's response under this request's claim, and
/// free its concurrency slot.
pub fn complete<S: GuardStore>(
    store: &mut S,
    req: &CompleteRequest,
    body: &[u8],
    now_ms: u64,
) -> Result<Done<Ack>, S::Error> {
    if req.slot {
        store.delete_slot(&req.request_id)?;
    }
    let current = store.record(&req.key)?;
    let stored = guard::complete(current.as_ref(), req, now_ms);
    let mut work_at = None;
    if let Some(rec) = &stored {
        store.put_record(&req.key, rec)?;
        // Only an in-progress claim completes, and claiming removed any older
        // body, so there is nothing to delete first.
        if !req.response.body_omitted {
            store.put_body(&req.key, body)?;
        }
        // The event the response implies, with it or not at all: the
        // object's alarm publishes it (at once: it is due now).
        if let Some(ev) = &req.event {
            store.put_pending(ev, now_ms)?;
            work_at = Some(now_ms);
        }
    }
    Ok(Done {
        alarm_by: stored.as_ref().map(Record::expires_at_ms),
        work_at,
        ..Done::answer(Ack {
            applied: stored.is_some(),
        })
    })
}

/// `release`: drop this request's claim (an in-flight claim has no body) and
/// its concurrency slot.
pub fn release<S: GuardStore>(store: &mut S, req: &ReleaseRequest) -> Result<Ack, S::Error> {
    if req.slot {
        store.delete_slot(&req.request_id)?;
    }
    let current = store.record(&req.key)?;
    let applied = guard::should_release(current.as_ref(), req);
    if applied {
        store.delete_record(&req.key)?;
    }
    Ok(Ack { applied })
}

/// `finish`: free the concurrency slot of a request that had no claim.
pub fn finish<S: GuardStore>(store: &mut S, slot: &str) -> Result<Ack, S::Error> {
    store.delete_slot(slot)?;
    Ok(Ack { applied: true })
}

/// `revoke`: flag the key; every later `admit` answers `Revoked`.
pub fn revoke<S: GuardStore>(store: &mut S, now_ms: u64) -> Result<Ack, S::Error> {
    store.put_revoked(now_ms)?;
    Ok(Ack { applied: true })
}

/// `update`: keep what the operator set, unless the object already holds a
/// later version (two updates racing: the last one set wins).
pub fn update<S: GuardStore>(store: &mut S, profile: &Profile) -> Result<Ack, S::Error> {
    let current = store.state()?.profile;
    let applied = current.is_none_or(|c| c.version <= profile.version);
    if applied {
        store.put_profile(profile)?;
    }
    Ok(Ack { applied })
}

mod leases;
mod memory;
mod operations;
mod outbox;

pub use leases::*;
pub use memory::MemoryStore;
pub use operations::*;
pub use outbox::*;

#[cfg(test)]
mod tests;
