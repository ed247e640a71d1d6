//! The object's outbox and its sweep: what is due for the alarm (operations
//! to hand to the queue, events to publish), recording what the alarm did,
//! and deleting what expired.

use super::{sweep_at, GuardStore, Pending};
pub use crate::guard::Work;
use crate::idempotency::Record;
use crate::operations;
use crate::response_events;

/// The alarm's work at `now_ms` ([`Work`]): operations to hand to the
/// queue (with the due time seen, for [`requeued`]) and events to publish.
/// Read only: the shell does the I/O, then records what it did.
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

/// How long the alarm waits before looking at work it left (a full batch,
/// or what failed) when the configuration could be read, and when it could
/// not (then nothing was done: the worker refuses every request meanwhile).
pub const WORK_AGAIN_MS: u64 = 1_000;
pub const WORK_BLOCKED_MS: u64 = 60_000;

/// When the alarm should fire next (quinn's `poll_timeout`): the sweep's
/// next time, or work still due (`next_work`, the earliest due operation or
/// event) — but work due already waits [`WORK_AGAIN_MS`] (or
/// [`WORK_BLOCKED_MS`] when the alarm could not work), so a failing publish
/// does not spin the alarm. Never before `now_ms`.
pub fn next_alarm(
    sweep_next: Option<u64>,
    next_work: Option<u64>,
    worked: bool,
    now_ms: u64,
) -> Option<u64> {
    let pause = if worked {
        WORK_AGAIN_MS
    } else {
        WORK_BLOCKED_MS
    };
    let work = next_work.map(|at| at.max(now_ms.saturating_add(pause)));
    sweep_next
        .into_iter()
        .chain(work)
        .min()
        .map(|at| at.max(now_ms))
}
