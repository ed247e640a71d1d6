//! The key guard's orchestration over a storage port: load → decide
//! (`guard`) → persist, for each object operation, and the expiry sweep.
//!
//! [`GuardStore`] is synchronous on purpose: the object runs one operation
//! with no `await` between reading its state and writing the decision, which
//! makes check-and-claim (and check-and-slot) atomic, and a synchronous trait
//! makes that something the compiler checks. The Durable Object implements it
//! over its SQLite storage (`src/durable/key_guard.rs`); [`MemoryStore`]
//! implements it for the host tests below.

use std::collections::BTreeMap;

use crate::guard::{
    self, Ack, AdmitRequest, AdmitResponse, CompleteRequest, FinishOpReply, FinishOpRequest,
    GetOpRequest, GuardState, Profile, ReleaseRequest, StartOpReply, StartOpRequest,
};
use crate::idempotency::{Decision, Record};
use crate::limits::Windows;
use crate::operations::{self, Operation, Outcome};
use crate::response_events::{self, PendingEvent};

/// Which body of an operation: the request it runs, or the answer it keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Part {
    Request = 0,
    Result = 1,
}

/// An event the object still has to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub event: PendingEvent,
    /// Failed tries so far.
    pub attempts: u32,
    /// When it was written (epoch ms).
    pub first_at: u64,
}

/// What a key's object stores.
pub trait GuardStore {
    type Error;
    /// Revoked flag, windows and profile (the object keeps them in memory).
    fn state(&mut self) -> Result<GuardState, Self::Error>;
    fn put_windows(&mut self, windows: &Windows) -> Result<(), Self::Error>;
    fn put_revoked(&mut self, at_ms: u64) -> Result<(), Self::Error>;
    fn put_profile(&mut self, profile: &Profile) -> Result<(), Self::Error>;
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
    fn operations(&mut self, page: &operations::Page) -> Result<Vec<Operation>, Self::Error>;
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
/// replay, or look up) the Idempotency-Key.
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
    let in_use = match req.slot.is_some() || req.reports_inflight() {
        true => store.slots_in_use(now_ms)?,
        false => 0,
    };
    let mut plan = guard::admit(&state, in_use, record.as_ref(), req, now_ms);
    if let Some(w) = &plan.windows {
        store.put_windows(w)?;
    }
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
        .filter(|at| *at < operations::NEVER);
    let slot_expiry = plan.slot.as_ref().map(|(_, until)| *until);
    Ok(Done {
        alarm_by: claim_expiry.into_iter().chain(slot_expiry).min(),
        work_at: plan.operation.as_ref().and_then(|op| op.due_at),
        forget_at: forget_at(req, plan.windows.is_some(), &plan.response),
        answer: plan.response,
        payload,
    })
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

/// Whether [`admit`] needs a storage transaction for `req`. Without a claim
/// or a slot it writes at most one statement (the windows), which is atomic
/// on its own; with either it may write several, which must commit together.
pub fn admit_needs_transaction(req: &AdmitRequest) -> bool {
    req.claim.is_some() || req.slot.is_some()
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

/// `start`: the consumer's claim on operation `id`'s next attempt, with the
/// request body (kept in the object) to send. An operation whose key was
/// revoked or has expired, or whose attempts are spent, ends `failed` here
/// instead (its completion event written with it): nothing more is sent.
pub fn start_operation<S: GuardStore>(
    store: &mut S,
    req: &StartOpRequest,
    now_ms: u64,
) -> Result<Done<StartOpReply>, S::Error> {
    let Some(current) = store.operation(&req.id)? else {
        return Ok(Done::answer(StartOpReply::NotStarted { state: None }));
    };
    let state = store.state()?;
    let gone = key_gone(&state, &current, now_ms);
    let op = match operations::start(&current, now_ms, req.lease_ms, req.max_attempts, gone) {
        operations::Start::Run(op) => op,
        operations::Start::End(op) => return end_operation(store, &op, now_ms),
        operations::Start::Not => {
            let state = Some(current.state);
            return Ok(Done::answer(StartOpReply::NotStarted { state }));
        }
    };
    store.put_operation(&op)?;
    let payload = match op.request.body_object {
        Some(_) => Vec::new(),
        None => store.op_body(&op.id, Part::Request)?,
    };
    Ok(Done {
        work_at: op.due_at,
        payload,
        ..Done::answer(StartOpReply::Started {
            op: Box::new(as_key_is(op, state.profile.as_ref())),
        })
    })
}

/// Whether the operation's key can no longer send: revoked (the object's
/// flag), or expired (the profile the operator set, else the expiry the key
/// had when the operation was accepted).
fn key_gone(state: &GuardState, op: &Operation, now_ms: u64) -> Option<operations::NoAnswer> {
    if state.revoked {
        return Some(operations::NoAnswer::KeyRevoked);
    }
    let expires_at = match &state.profile {
        Some(p) => p.expires_at,
        None => op.request.key_expires_at,
    };
    expires_at
        .filter(|at| now_ms >= *at)
        .map(|_| operations::NoAnswer::KeyExpired)
}

/// The attempt runs as the key is now: the plan and metadata the operator
/// last set, not those cached when the operation was accepted.
fn as_key_is(mut op: Operation, profile: Option<&Profile>) -> Operation {
    if let Some(p) = profile {
        op.request.plan.clone_from(&p.plan);
        op.request.meta.clone_from(&p.meta);
    }
    op
}

/// Writes an operation that just ended `failed` at its start (no attempt
/// ran, nothing to keep): `NotStarted` with its state.
fn end_operation<S: GuardStore>(
    store: &mut S,
    op: &Operation,
    now_ms: u64,
) -> Result<Done<StartOpReply>, S::Error> {
    conclude(store, op, now_ms)?;
    Ok(Done {
        alarm_by: Some(op.expires_at),
        work_at: Some(now_ms),
        ..Done::answer(StartOpReply::NotStarted {
            state: Some(op.state),
        })
    })
}

/// `finish`: settles attempt `req.attempt` (`operations::settle`). A done
/// operation keeps the answer (its body beside it unless in R2), closes its
/// key's record, and writes its completion event — and the response's own
/// event, if one is given — to publish, all in the one transaction.
pub fn finish_operation<S: GuardStore>(
    store: &mut S,
    req: &FinishOpRequest,
    body: &[u8],
    now_ms: u64,
) -> Result<Done<FinishOpReply>, S::Error> {
    let settled = store
        .operation(&req.id)?
        .and_then(|op| operations::settle(&op, req.attempt, &req.outcome, &req.schedule_s, now_ms));
    let Some(s) = settled else {
        return Ok(Done::answer(FinishOpReply {
            applied: false,
            kept: false,
        }));
    };
    if !s.done {
        store.put_operation(&s.op)?;
        return Ok(Done {
            work_at: s.op.due_at,
            ..Done::answer(FinishOpReply {
                applied: true,
                kept: false,
            })
        });
    }
    if let Outcome::Answer(r) = &req.outcome {
        if !r.body_omitted && !body.is_empty() {
            store.put_op_body(&s.op.id, Part::Result, body)?;
        }
    }
    conclude(store, &s.op, now_ms)?;
    if let (Some(ev), operations::State::Succeeded) = (&req.event, s.op.state) {
        store.put_pending(ev, now_ms)?;
    }
    Ok(Done {
        alarm_by: Some(s.op.expires_at),
        work_at: Some(now_ms),
        ..Done::answer(FinishOpReply {
            applied: true,
            kept: true,
        })
    })
}

/// A done operation: written, its key's record closed, its completion
/// event written to publish.
fn conclude<S: GuardStore>(store: &mut S, op: &Operation, now_ms: u64) -> Result<(), S::Error> {
    store.put_operation(op)?;
    close_record(store, op)?;
    store.put_pending(&operations::completed_event(op), now_ms)
}

/// The key's record of a done operation: completed, expiring with it.
fn close_record<S: GuardStore>(store: &mut S, op: &Operation) -> Result<(), S::Error> {
    let key = &op.request.idempotency_key;
    let Some(Record::Accepted {
        fingerprint,
        request_id,
        operation_id,
        claimed_at_ms,
        ..
    }) = store.record(key)?
    else {
        return Ok(());
    };
    if operation_id != op.id {
        return Ok(());
    }
    let closed = Record::Accepted {
        fingerprint,
        request_id,
        operation_id,
        claimed_at_ms,
        expires_at_ms: op.expires_at,
        completed_at_ms: op.completed_at,
        status: op.status,
    };
    store.put_record(key, &closed)
}

/// `get`: the operation if it belongs to `req.project`, and (asked for) its
/// kept result body. An operation overdue for the alarm's work asks for the
/// alarm again: a poller wakes an object whose alarm was lost.
pub fn get_operation<S: GuardStore>(
    store: &mut S,
    req: &GetOpRequest,
    now_ms: u64,
) -> Result<Done<Option<Box<Operation>>>, S::Error> {
    let op = store
        .operation(&req.id)?
        .filter(|op| op.project() == req.project);
    let inline = |op: &Operation| op.response.as_ref().is_some_and(|r| !r.body_omitted);
    let payload = match &op {
        Some(op) if req.body && inline(op) => store.op_body(&op.id, Part::Result)?,
        _ => Vec::new(),
    };
    let overdue = op.as_ref().is_some_and(|o| operations::is_due(o, now_ms));
    Ok(Done {
        work_at: overdue.then_some(now_ms),
        payload,
        ..Done::answer(op.map(Box::new))
    })
}

/// `list`: a page of the project's operations held here.
pub fn list_operations<S: GuardStore>(
    store: &mut S,
    page: &operations::Page,
) -> Result<Vec<operations::View>, S::Error> {
    Ok(store
        .operations(page)?
        .iter()
        .map(Operation::view)
        .collect())
}

/// The alarm's work at `now_ms`: operations to hand to the queue (with the
/// due time seen, for [`requeued`]) and events to publish. Read only: the
/// alarm does the I/O, then records what it did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Work {
    pub sends: Vec<(String, u64)>,
    pub publishes: Vec<Pending>,
}

pub fn work<S: GuardStore>(store: &mut S, now_ms: u64, batch: usize) -> Result<Work, S::Error> {
    let sends = store
        .due_operations(now_ms, batch)?
        .into_iter()
        .filter_map(|op| op.due_at.map(|at| (op.id, at)))
        .collect();
    Ok(Work {
        sends,
        publishes: store.pending(now_ms, batch)?,
    })
}

/// After the alarm handed `sends` to the queue: each is looked at again
/// after `requeue_ms`, unless it moved meanwhile.
pub fn requeued<S: GuardStore>(
    store: &mut S,
    sends: &[(String, u64)],
    now_ms: u64,
    requeue_ms: u64,
) -> Result<(), S::Error> {
    for (id, seen) in sends {
        let next = store
            .operation(id)?
            .and_then(|op| operations::requeued(&op, *seen, now_ms, requeue_ms));
        if let Some(next) = next {
            store.put_operation(&next)?;
        }
    }
    Ok(())
}

/// After the alarm tried to publish `p`: gone once published; else tried
/// again later, or dropped (`true`: the caller logs it) after a day of
/// failures.
pub fn published<S: GuardStore>(
    store: &mut S,
    p: &Pending,
    ok: bool,
    now_ms: u64,
) -> Result<bool, S::Error> {
    let expired = now_ms.saturating_sub(p.first_at) >= response_events::GIVE_UP_AFTER_MS;
    if ok || expired {
        store.delete_pending(&p.event.id)?;
        return Ok(!ok);
    }
    let attempts = p.attempts.saturating_add(1);
    let at = response_events::retry_at(attempts, now_ms);
    store.retry_pending(&p.event.id, attempts, at)?;
    Ok(false)
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

/// Deletes one batch of records `grace_ms` past their expiry, with their
/// bodies, and the slots whose lease ended; the time of the next alarm
/// (`now_ms` again when the batch was full).
pub fn sweep<S: GuardStore>(
    store: &mut S,
    now_ms: u64,
    batch: usize,
    grace_ms: u64,
) -> Result<Swept, S::Error> {
    store.delete_expired_slots(now_ms)?;
    let cutoff = now_ms.saturating_sub(grace_ms);
    let expired = store.expired(cutoff, batch)?;
    let mut objects = Vec::new();
    for k in &expired {
        if let Some(Record::Completed { response, .. }) = store.record(k)? {
            objects.extend(response.body_object);
        }
        store.delete_record(k)?;
        store.delete_body(k)?;
    }
    // Operations expire with their records (at the same time), their bodies
    // and R2 objects with them.
    let ops = store.expired_operations(cutoff, batch)?;
    for op in &ops {
        objects.extend(op.request.body_object.clone());
        objects.extend(op.response.as_ref().and_then(|r| r.body_object.clone()));
        store.delete_operation(&op.id)?;
    }
    let next = match expired.len() == batch || ops.len() == batch {
        true => Some(now_ms),
        false => [store.next_expiry()?, store.next_operation_expiry()?]
            .into_iter()
            .flatten()
            .filter(|at| *at < operations::NEVER)
            .min()
            .map(|at| sweep_at(at, grace_ms)),
    };
    Ok(Swept { next, objects })
}

/// What a sweep did: when to sweep next, and the R2 objects of the deleted
/// records (deleted by the caller after the transaction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Swept {
    pub next: Option<u64>,
    pub objects: Vec<String>,
}

/// A [`GuardStore`] in memory, for tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MemoryStore {
    pub state: GuardState,
    pub slots: BTreeMap<String, u64>,
    pub records: BTreeMap<String, Record>,
    pub bodies: BTreeMap<String, Vec<u8>>,
    pub operations: BTreeMap<String, Operation>,
    pub op_bodies: BTreeMap<(String, Part), Vec<u8>>,
    pub pending: BTreeMap<String, (Pending, u64)>,
}

impl GuardStore for MemoryStore {
    type Error = std::convert::Infallible;

    fn state(&mut self) -> Result<GuardState, Self::Error> {
        Ok(self.state.clone())
    }
    fn put_windows(&mut self, windows: &Windows) -> Result<(), Self::Error> {
        self.state.windows = windows.clone();
        Ok(())
    }
    fn put_revoked(&mut self, _at_ms: u64) -> Result<(), Self::Error> {
        self.state.revoked = true;
        Ok(())
    }
    fn put_profile(&mut self, profile: &Profile) -> Result<(), Self::Error> {
        self.state.profile = Some(profile.clone());
        Ok(())
    }
    fn slots_in_use(&mut self, now_ms: u64) -> Result<u32, Self::Error> {
        Ok(self.slots.values().filter(|until| **until > now_ms).count() as u32)
    }
    fn put_slot(&mut self, id: &str, until_ms: u64) -> Result<(), Self::Error> {
        self.slots.insert(id.to_string(), until_ms);
        Ok(())
    }
    fn delete_slot(&mut self, id: &str) -> Result<(), Self::Error> {
        self.slots.remove(id);
        Ok(())
    }
    fn delete_expired_slots(&mut self, now_ms: u64) -> Result<(), Self::Error> {
        self.slots.retain(|_, until| *until > now_ms);
        Ok(())
    }
    fn record(&mut self, key: &str) -> Result<Option<Record>, Self::Error> {
        Ok(self.records.get(key).cloned())
    }
    fn put_record(&mut self, key: &str, record: &Record) -> Result<(), Self::Error> {
        self.records.insert(key.to_string(), record.clone());
        Ok(())
    }
    fn delete_record(&mut self, key: &str) -> Result<(), Self::Error> {
        self.records.remove(key);
        Ok(())
    }
    fn body(&mut self, key: &str) -> Result<Vec<u8>, Self::Error> {
        Ok(self.bodies.get(key).cloned().unwrap_or_default())
    }
    fn put_body(&mut self, key: &str, body: &[u8]) -> Result<(), Self::Error> {
        self.bodies.insert(key.to_string(), body.to_vec());
        Ok(())
    }
    fn delete_body(&mut self, key: &str) -> Result<(), Self::Error> {
        self.bodies.remove(key);
        Ok(())
    }
    fn expired(&mut self, now_ms: u64, limit: usize) -> Result<Vec<String>, Self::Error> {
        let mut due: Vec<(u64, &String)> = self
            .records
            .iter()
            .map(|(k, r)| (r.expires_at_ms(), k))
            .filter(|(at, _)| *at <= now_ms)
            .collect();
        due.sort();
        Ok(due
            .into_iter()
            .take(limit)
            .map(|(_, k)| k.clone())
            .collect())
    }
    fn next_expiry(&mut self) -> Result<Option<u64>, Self::Error> {
        Ok(self.records.values().map(Record::expires_at_ms).min())
    }
    fn operation(&mut self, id: &str) -> Result<Option<Operation>, Self::Error> {
        Ok(self.operations.get(id).cloned())
    }
    fn put_operation(&mut self, op: &Operation) -> Result<(), Self::Error> {
        self.operations.insert(op.id.clone(), op.clone());
        Ok(())
    }
    fn delete_operation(&mut self, id: &str) -> Result<(), Self::Error> {
        self.operations.remove(id);
        self.op_bodies.retain(|(k, _), _| k != id);
        Ok(())
    }
    fn op_body(&mut self, id: &str, part: Part) -> Result<Vec<u8>, Self::Error> {
        Ok(self
            .op_bodies
            .get(&(id.to_string(), part))
            .cloned()
            .unwrap_or_default())
    }
    fn put_op_body(&mut self, id: &str, part: Part, body: &[u8]) -> Result<(), Self::Error> {
        self.op_bodies.insert((id.to_string(), part), body.to_vec());
        Ok(())
    }
    fn operations(&mut self, page: &operations::Page) -> Result<Vec<Operation>, Self::Error> {
        let mut ops: Vec<Operation> = self
            .operations
            .values()
            .filter(|op| op.project() == page.project)
            .filter(|op| page.state.is_none_or(|s| s == op.state))
            .filter(|op| {
                page.before
                    .as_ref()
                    .is_none_or(|(at, id)| (op.created_at, &op.id) < (*at, id))
            })
            .cloned()
            .collect();
        ops.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
        ops.truncate(page.limit as usize);
        Ok(ops)
    }
    fn due_operations(&mut self, now_ms: u64, limit: usize) -> Result<Vec<Operation>, Self::Error> {
        let mut due: Vec<Operation> = self
            .operations
            .values()
            .filter(|op| op.due_at.is_some_and(|at| at <= now_ms))
            .cloned()
            .collect();
        due.sort_by_key(|op| op.due_at);
        due.truncate(limit);
        Ok(due)
    }
    fn expired_operations(
        &mut self,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<Operation>, Self::Error> {
        let mut due: Vec<Operation> = self
            .operations
            .values()
            .filter(|op| op.expires_at <= now_ms)
            .cloned()
            .collect();
        due.sort_by_key(|op| op.expires_at);
        due.truncate(limit);
        Ok(due)
    }
    fn next_operation_expiry(&mut self) -> Result<Option<u64>, Self::Error> {
        Ok(self.operations.values().map(|op| op.expires_at).min())
    }
    fn put_pending(&mut self, ev: &PendingEvent, now_ms: u64) -> Result<(), Self::Error> {
        self.pending.entry(ev.id.clone()).or_insert((
            Pending {
                event: ev.clone(),
                attempts: 0,
                first_at: now_ms,
            },
            now_ms,
        ));
        Ok(())
    }
    fn pending(&mut self, now_ms: u64, limit: usize) -> Result<Vec<Pending>, Self::Error> {
        let mut due: Vec<&(Pending, u64)> = self
            .pending
            .values()
            .filter(|(_, at)| *at <= now_ms)
            .collect();
        due.sort_by_key(|(_, at)| *at);
        Ok(due
            .into_iter()
            .take(limit)
            .map(|(p, _)| p.clone())
            .collect())
    }
    fn retry_pending(&mut self, id: &str, attempts: u32, next_at: u64) -> Result<(), Self::Error> {
        if let Some((p, at)) = self.pending.get_mut(id) {
            p.attempts = attempts;
            *at = next_at;
        }
        Ok(())
    }
    fn delete_pending(&mut self, id: &str) -> Result<(), Self::Error> {
        self.pending.remove(id);
        Ok(())
    }
    fn next_work(&mut self) -> Result<Option<u64>, Self::Error> {
        let ops = self.operations.values().filter_map(|op| op.due_at);
        let events = self.pending.values().map(|(_, at)| *at);
        Ok(ops.chain(events).min())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::{Claim, Slot};
    use crate::idempotency::StoredResponse;
    use crate::limits::Limits;
    use crate::rate_limit::Quota;

    const Q: Quota = Quota::new(100, 60_000).unwrap();

    fn ok<T>(r: Result<T, std::convert::Infallible>) -> T {
        match r {
            Ok(v) => v,
            Err(e) => match e {},
        }
    }

    fn single(quota: Quota) -> Limits {
        Limits {
            policies: vec![crate::limits::Policy::single(quota)],
            concurrency: None,
        }
    }

    fn admit_req(fp: &str, rid: &str) -> AdmitRequest {
        AdmitRequest {
            claim: Some(Claim {
                key: "k".into(),
                fingerprint: fp.into(),
                request_id: rid.into(),
                lease_ms: 1_000,
            }),
            ..AdmitRequest::charge(1, single(Q))
        }
    }

    fn complete_req(rid: &str, omitted: bool) -> CompleteRequest {
        CompleteRequest {
            key: "k".into(),
            request_id: rid.into(),
            ttl_ms: 10_000,
            response: StoredResponse {
                status: 201,
                headers: vec![],
                body_omitted: omitted,
                body_object: None,
                body_len: 4,
            },
            slot: false,
            event: None,
        }
    }

    fn decision(d: &Done<AdmitResponse>) -> Option<Decision> {
        match &d.answer {
            AdmitResponse::Admitted { idempotency, .. } => idempotency.clone(),
            _ => None,
        }
    }

    #[test]
    fn in_memory_admission_answers_as_admit_does_and_only_when_nothing_is_written() {
        let tiny = Quota::new(1, 60_000).unwrap();
        let charge = |cost| AdmitRequest::charge(cost, single(tiny));
        let mut s = MemoryStore::default();
        assert_eq!(
            admit_in_memory(&s.state, &charge(1), 0),
            None,
            "a charge writes"
        );
        ok(admit(&mut s, &charge(1), &[], 0));
        for (req, now) in [(charge(1), 10), (charge(0), 20), (charge(1), 59_999)] {
            let before = s.clone();
            let fast = admit_in_memory(&s.state.clone(), &req, now);
            let full = ok(admit(&mut s, &req, &[], now));
            assert_eq!(s, before, "nothing was written");
            assert_eq!(
                (fast, full.alarm_by, full.payload.len()),
                (Some(full.answer), None, 0)
            );
        }
        assert_eq!(
            admit_in_memory(&s.state, &charge(1), 60_000),
            None,
            "a new window"
        );
        assert_eq!(admit_in_memory(&s.state, &admit_req("f", "r"), 10), None);
        s.state.revoked = true;
        assert_eq!(
            admit_in_memory(&s.state, &charge(1), 10),
            Some(AdmitResponse::Revoked)
        );
    }

    #[test]
    fn slots_are_held_until_finished_completed_or_leased_out() {
        let limits = Limits {
            concurrency: Some(1),
            ..single(Q)
        };
        let slotted = |id: &str| AdmitRequest {
            slot: Some(Slot {
                id: id.into(),
                lease_ms: 1_000,
            }),
            ..AdmitRequest::charge(0, limits.clone())
        };
        let mut s = MemoryStore::default();
        let first = ok(admit(&mut s, &slotted("r1"), &[], 0));
        assert!(matches!(first.answer, AdmitResponse::Admitted { .. }));
        assert_eq!(
            first.alarm_by,
            Some(1_000),
            "a crashed request's slot is swept"
        );
        let second = ok(admit(&mut s, &slotted("r2"), &[], 10));
        assert!(matches!(second.answer, AdmitResponse::Limited { .. }));
        ok(finish(&mut s, "r1"));
        assert!(matches!(
            ok(admit(&mut s, &slotted("r2"), &[], 20)).answer,
            AdmitResponse::Admitted { .. }
        ));
        // r2 never finishes: its lease frees the slot.
        assert!(matches!(
            ok(admit(&mut s, &slotted("r3"), &[], 500)).answer,
            AdmitResponse::Limited { .. }
        ));
        assert!(matches!(
            ok(admit(&mut s, &slotted("r3"), &[], 1_020)).answer,
            AdmitResponse::Admitted { .. }
        ));
        ok(sweep(&mut s, 5_000, 10, 0));
        assert!(s.slots.is_empty());
    }

    #[test]
    fn an_update_keeps_the_latest_version() {
        let mut s = MemoryStore::default();
        let p = |v| crate::guard::Profile {
            version: v,
            ..crate::guard::Profile::default()
        };
        assert!(ok(update(&mut s, &p(5))).applied);
        assert!(
            !ok(update(&mut s, &p(3))).applied,
            "an older write racing a newer one"
        );
        assert_eq!(s.state.profile.map(|p| p.version), Some(5));
    }

    #[test]
    fn claim_complete_then_replay_loads_the_body() {
        let mut s = MemoryStore::default();
        let first = ok(admit(&mut s, &admit_req("f", "r1"), &[], 0));
        assert_eq!(decision(&first), Some(Decision::Execute));
        assert_eq!(first.alarm_by, Some(1_000), "the lease expiry is swept");
        assert!(!s.state.windows.is_empty(), "the window was charged");
        let done = ok(complete(&mut s, &complete_req("r1", false), b"body", 10));
        assert_eq!((done.answer.applied, done.alarm_by), (true, Some(10_010)));
        let replay = ok(admit(&mut s, &admit_req("f", "r2"), &[], 20));
        assert_eq!(decision(&replay), Some(Decision::Replay));
        assert_eq!(replay.payload, b"body");
        assert_eq!(replay.alarm_by, None, "a replay writes no record");
    }

    #[test]
    fn an_omitted_body_is_neither_stored_nor_loaded() {
        let mut s = MemoryStore::default();
        ok(admit(&mut s, &admit_req("f", "r1"), &[], 0));
        ok(complete(&mut s, &complete_req("r1", true), b"body", 10));
        assert!(s.bodies.is_empty());
        let replay = ok(admit(&mut s, &admit_req("f", "r2"), &[], 20));
        assert_eq!(decision(&replay), Some(Decision::Replay));
        assert!(replay.payload.is_empty());
    }

    #[test]
    fn a_claim_replacing_an_expired_record_drops_its_old_body() {
        let mut s = MemoryStore::default();
        ok(admit(&mut s, &admit_req("f", "r1"), &[], 0));
        ok(complete(&mut s, &complete_req("r1", false), b"old!", 10));
        // After the TTL the same key starts a new operation, without the old body.
        let again = ok(admit(&mut s, &admit_req("g", "r2"), &[], 20_000));
        assert_eq!(decision(&again), Some(Decision::Execute));
        assert!(!s.bodies.contains_key("k"));
        assert!(
            matches!(s.records.get("k"), Some(Record::InFlight { request_id, .. }) if request_id == "r2")
        );
    }

    #[test]
    fn only_the_holder_completes_or_releases() {
        let mut s = MemoryStore::default();
        ok(admit(&mut s, &admit_req("f", "r1"), &[], 0));
        let late = ok(complete(&mut s, &complete_req("r2", false), b"x", 5));
        assert!(!late.answer.applied);
        assert!(s.bodies.is_empty());
        let rel = |rid: &str| ReleaseRequest {
            key: "k".into(),
            request_id: rid.into(),
            slot: false,
        };
        assert!(!ok(release(&mut s, &rel("r2"))).applied);
        assert!(ok(release(&mut s, &rel("r1"))).applied);
        assert!(s.records.is_empty());
    }

    #[test]
    fn revoked_keys_are_refused_and_claim_nothing() {
        let mut s = MemoryStore::default();
        ok(revoke(&mut s, 0));
        let d = ok(admit(&mut s, &admit_req("f", "r1"), &[], 1));
        assert_eq!(d.answer, AdmitResponse::Revoked);
        assert!(s.records.is_empty());
    }

    #[test]
    fn sweep_deletes_expired_records_in_batches_and_plans_the_next() {
        let mut s = MemoryStore::default();
        for (i, at) in [(0, 100), (1, 200), (2, 300), (3, 5_000)] {
            let key = format!("k{i}");
            let rec = Record::InFlight {
                fingerprint: "f".into(),
                request_id: "r".into(),
                claimed_at_ms: 0,
                lease_until_ms: at,
            };
            ok(s.put_record(&key, &rec));
            ok(s.put_body(&key, b"b"));
        }
        let g = 3_600_000;
        // Expired but within the lookup grace: kept, swept at expiry + grace.
        assert_eq!(ok(sweep(&mut s, 1_000, 2, g)).next, Some(100 + g));
        assert_eq!(s.records.len(), 4);
        // A full batch: run again at once.
        assert_eq!(ok(sweep(&mut s, 1_000 + g, 2, g)).next, Some(1_000 + g));
        assert_eq!(s.records.keys().collect::<Vec<_>>(), ["k2", "k3"]);
        // The rest of the expired ones, then the next expiry.
        assert_eq!(ok(sweep(&mut s, 1_000 + g, 2, g)).next, Some(5_000 + g));
        assert_eq!(s.records.keys().collect::<Vec<_>>(), ["k3"]);
        assert_eq!(s.bodies.keys().collect::<Vec<_>>(), ["k3"]);
        assert_eq!(ok(sweep(&mut s, 6_000 + g, 2, g)).next, None);
        assert!(s.bodies.is_empty());
    }

    mod operations {
        use super::*;
        use crate::guard::{FinishOpRequest, GetOpRequest, NewOperation, StartOpReply};
        use crate::operations::{Outcome, State, StoredRequest};
        use crate::response_events::PendingEvent;

        const KEY: &str = "key_01HZX5M3Q7R8S9T0V1W2X3Y4Z5";

        fn request() -> StoredRequest {
            StoredRequest {
                method: "POST".into(),
                path_and_query: "/reports".into(),
                headers: vec![],
                client_ip: None,
                project: "acme".into(),
                key_prefix: "pgk_abcdefgh".into(),
                plan: "trial".into(),
                meta: None,
                idempotency_key: "k".into(),
                body_len: 4,
                body_object: None,
                key_expires_at: None,
            }
        }

        fn asynchronous(fp: &str, rid: &str, n: u128) -> AdmitRequest {
            AdmitRequest {
                operation: Some(Box::new(NewOperation {
                    id: crate::operations::operation_id(KEY, 0, n).unwrap_or_default(),
                    request: request(),
                    ttl_ms: 10_000,
                    requeue_ms: 500,
                })),
                ..admit_req(fp, rid)
            }
        }

        fn view(d: &Done<AdmitResponse>) -> Option<crate::operations::View> {
            match &d.answer {
                AdmitResponse::Admitted { operation, .. } => operation.as_deref().cloned(),
                _ => None,
            }
        }

        fn finish(
            id: &str,
            attempt: u32,
            status: u16,
            event: Option<PendingEvent>,
        ) -> FinishOpRequest {
            FinishOpRequest {
                id: id.into(),
                attempt,
                outcome: Outcome::Answer(StoredResponse {
                    status,
                    headers: vec![],
                    body_omitted: false,
                    body_object: None,
                    body_len: 3,
                }),
                schedule_s: vec![1],
                event,
            }
        }

        fn event(id: &str) -> PendingEvent {
            PendingEvent {
                id: id.into(),
                project: "acme".into(),
                event_type: "report.ready".into(),
                data: serde_json::json!({}),
                request_id: "r1".into(),
            }
        }

        #[test]
        fn an_operation_is_written_with_its_claim_and_every_retry_is_told_it() {
            let mut s = MemoryStore::default();
            let first = ok(admit(&mut s, &asynchronous("f", "r1", 1), b"body", 0));
            assert_eq!(decision(&first), Some(Decision::Execute));
            let v = view(&first).unwrap();
            assert_eq!((v.state, v.request_id.as_str()), (State::Queued, "r1"));
            assert_eq!(
                first.work_at,
                Some(500),
                "handed to the queue again if not started"
            );
            assert_eq!(
                first.alarm_by, None,
                "an operation's record expires once it is done"
            );
            assert_eq!(
                s.op_bodies
                    .get(&(v.id.clone(), Part::Request))
                    .map(Vec::as_slice),
                Some(&b"body"[..])
            );
            // A retry (with or without the preference) is told the same operation.
            for (req, n) in [(asynchronous("f", "r2", 2), 2), (admit_req("f", "r3"), 3)] {
                let again = ok(admit(&mut s, &req, b"body", 10 * n));
                assert_eq!(decision(&again), Some(Decision::Accepted));
                assert_eq!(view(&again).map(|o| o.id), Some(v.id.clone()));
            }
            assert_eq!(s.operations.len(), 1, "never a second operation");
            let other = ok(admit(&mut s, &asynchronous("g", "r4", 4), b"other", 50));
            assert_eq!(decision(&other), Some(Decision::Conflict));
        }

        #[test]
        fn a_done_operation_keeps_its_answer_closes_its_record_and_publishes_once() {
            let mut s = MemoryStore::default();
            let id = view(&ok(admit(&mut s, &asynchronous("f", "r1", 1), b"body", 0)))
                .unwrap()
                .id;
            let start = StartOpRequest {
                id: id.clone(),
                lease_ms: 1_000,
                max_attempts: 5,
            };
            let started = ok(start_operation(&mut s, &start, 10));
            assert!(matches!(&started.answer, StartOpReply::Started { op } if op.attempts == 1));
            assert_eq!(started.payload, b"body");
            assert!(matches!(
                ok(start_operation(&mut s, &start, 20)).answer,
                StartOpReply::NotStarted {
                    state: Some(State::Running)
                }
            ));
            let done = ok(finish_operation(
                &mut s,
                &finish(&id, 1, 201, Some(event("evt_r"))),
                b"out",
                30,
            ));
            assert_eq!((done.answer.applied, done.answer.kept), (true, true));
            assert_eq!((done.work_at, done.alarm_by), (Some(30), Some(10_030)));
            let events: Vec<&String> = s.pending.keys().collect();
            assert_eq!(events, [&format!("evt_{id}"), &"evt_r".to_string()]);
            let late = ok(finish_operation(
                &mut s,
                &finish(&id, 1, 200, Some(event("evt_x"))),
                b"no",
                40,
            ));
            assert!(!late.answer.applied);
            assert_eq!(s.pending.len(), 2, "published once");
            match s.records.get("k") {
                Some(Record::Accepted {
                    completed_at_ms,
                    status,
                    expires_at_ms,
                    ..
                }) => {
                    assert_eq!(
                        (*completed_at_ms, *status, *expires_at_ms),
                        (Some(30), Some(201), 10_030)
                    );
                }
                other => panic!("{other:?}"),
            }
            let get = GetOpRequest {
                id: id.clone(),
                project: "acme".into(),
                body: true,
            };
            let got = ok(get_operation(&mut s, &get, 50));
            assert_eq!(
                (got.answer.map(|o| o.state), got.payload),
                (Some(State::Succeeded), b"out".to_vec())
            );
            let foreign = GetOpRequest {
                project: "other".into(),
                ..get
            };
            assert!(
                ok(get_operation(&mut s, &foreign, 50)).answer.is_none(),
                "scoped to the project"
            );
            // The TTL over (and the grace): the operation, its bodies and record go.
            ok(sweep(&mut s, 10_030, 10, 0));
            assert!(s.operations.is_empty() && s.op_bodies.is_empty() && s.records.is_empty());
        }

        #[test]
        fn a_failed_attempt_is_queued_again_and_only_a_success_publishes_the_response_event() {
            let mut s = MemoryStore::default();
            let id = view(&ok(admit(&mut s, &asynchronous("f", "r1", 1), b"", 0)))
                .unwrap()
                .id;
            let start = StartOpRequest {
                id: id.clone(),
                lease_ms: 1_000,
                max_attempts: 5,
            };
            ok(start_operation(&mut s, &start, 0));
            let retry = ok(finish_operation(
                &mut s,
                &finish(&id, 1, 503, Some(event("evt_r"))),
                b"x",
                10,
            ));
            assert_eq!((retry.answer.kept, retry.work_at), (false, Some(1_010)));
            assert!(s.pending.is_empty() && s.op_bodies.is_empty());
            assert!(
                matches!(
                    ok(start_operation(&mut s, &start, 500)).answer,
                    StartOpReply::NotStarted { .. }
                ),
                "not before its delay"
            );
            ok(start_operation(&mut s, &start, 1_010));
            let failed = ok(finish_operation(
                &mut s,
                &finish(&id, 2, 502, Some(event("evt_r"))),
                b"bad",
                1_020,
            ));
            assert!(failed.answer.kept);
            assert_eq!(s.operations[&id].state, State::Failed);
            assert_eq!(
                s.pending.keys().collect::<Vec<_>>(),
                [&format!("evt_{id}")],
                "no response event for a failure"
            );
        }

        #[test]
        fn the_alarm_hands_due_operations_on_and_retries_or_drops_events() {
            let mut s = MemoryStore::default();
            let id = view(&ok(admit(&mut s, &asynchronous("f", "r1", 1), b"", 0)))
                .unwrap()
                .id;
            assert_eq!(ok(s.next_work()), Some(500));
            let w = ok(work(&mut s, 500, 10));
            assert_eq!(w.sends, vec![(id.clone(), 500)]);
            ok(requeued(&mut s, &w.sends, 500, 500));
            assert_eq!(s.operations[&id].due_at, Some(1_000));
            ok(s.put_pending(&event("e1"), 0));
            let p = ok(work(&mut s, 0, 10)).publishes;
            assert_eq!(p.len(), 1);
            assert!(!ok(published(&mut s, &p[0], false, 0)));
            assert_eq!(s.pending["e1"].1, 2_000, "tried again later");
            let p = ok(work(&mut s, 2_000, 10)).publishes;
            assert!(
                ok(published(
                    &mut s,
                    &p[0],
                    false,
                    crate::response_events::GIVE_UP_AFTER_MS
                )),
                "dropped after a day"
            );
            assert!(s.pending.is_empty());
            ok(s.put_pending(&event("e2"), 0));
            ok(s.put_pending(&event("e2"), 5));
            assert_eq!(s.pending["e2"].0.first_at, 0, "an id is written once");
        }

        #[test]
        fn a_stored_response_writes_its_event_only_when_it_is_stored() {
            let mut s = MemoryStore::default();
            ok(admit(&mut s, &admit_req("f", "r1"), &[], 0));
            let with = |rid: &str| CompleteRequest {
                event: Some(event("evt_k")),
                ..complete_req(rid, false)
            };
            let late = ok(complete(&mut s, &with("r2"), b"x", 5));
            assert_eq!((late.answer.applied, late.work_at), (false, None));
            assert!(s.pending.is_empty());
            let done = ok(complete(&mut s, &with("r1"), b"x", 5));
            assert_eq!((done.answer.applied, done.work_at), (true, Some(5)));
            assert_eq!(s.pending.len(), 1);
        }
    }
}
