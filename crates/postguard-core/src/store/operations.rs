//! Asynchronous operations in the key's object (ADR 0037): start an
//! attempt, settle it, read and list them — each one transaction over the
//! [`GuardStore`] port.

use super::{Done, GuardStore, Part};
use crate::guard::{
    FinishOpReply, FinishOpRequest, GetOpRequest, GuardState, Profile, StartOpReply, StartOpRequest,
};
use crate::idempotency::Record;
use crate::operations::{self, Operation, Outcome};

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
