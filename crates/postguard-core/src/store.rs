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
    self, Ack, AdmitRequest, AdmitResponse, CompleteRequest, GuardState, Profile, ReleaseRequest,
};
use crate::idempotency::{Decision, Record};
use crate::limits::Windows;

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
}

/// `admit`: charge the limits, take a concurrency slot, then claim (or
/// replay, or look up) the Idempotency-Key.
pub fn admit<S: GuardStore>(
    store: &mut S,
    req: &AdmitRequest,
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
    let plan = guard::admit(&state, in_use, record.as_ref(), req, now_ms);
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
    let claim_expiry = plan.claim.as_ref().map(Record::expires_at_ms);
    let slot_expiry = plan.slot.as_ref().map(|(_, until)| *until);
    Ok(Done {
        alarm_by: claim_expiry.into_iter().chain(slot_expiry).min(),
        answer: plan.response,
        payload,
    })
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
    if let Some(rec) = &stored {
        store.put_record(&req.key, rec)?;
        // Only an in-progress claim completes, and claiming removed any older
        // body, so there is nothing to delete first.
        if !req.response.body_omitted {
            store.put_body(&req.key, body)?;
        }
    }
    Ok(Done {
        answer: Ack {
            applied: stored.is_some(),
        },
        payload: Vec::new(),
        alarm_by: stored.as_ref().map(Record::expires_at_ms),
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
    let expired = store.expired(now_ms.saturating_sub(grace_ms), batch)?;
    let mut objects = Vec::new();
    for k in &expired {
        if let Some(Record::Completed { response, .. }) = store.record(k)? {
            objects.extend(response.body_object);
        }
        store.delete_record(k)?;
        store.delete_body(k)?;
    }
    let next = match expired.len() == batch {
        true => Some(now_ms),
        false => store.next_expiry()?.map(|at| sweep_at(at, grace_ms)),
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::{Claim, Slot};
    use crate::idempotency::StoredResponse;
    use crate::limits::Limits;
    use crate::rate_limit::Quota;

    const Q: Quota = Quota {
        limit: 100,
        window_ms: 60_000,
    };

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
        let tiny = Quota {
            limit: 1,
            window_ms: 60_000,
        };
        let charge = |cost| AdmitRequest::charge(cost, single(tiny));
        let mut s = MemoryStore::default();
        assert_eq!(
            admit_in_memory(&s.state, &charge(1), 0),
            None,
            "a charge writes"
        );
        ok(admit(&mut s, &charge(1), 0));
        for (req, now) in [(charge(1), 10), (charge(0), 20), (charge(1), 59_999)] {
            let before = s.clone();
            let fast = admit_in_memory(&s.state.clone(), &req, now);
            let full = ok(admit(&mut s, &req, now));
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
        let first = ok(admit(&mut s, &slotted("r1"), 0));
        assert!(matches!(first.answer, AdmitResponse::Admitted { .. }));
        assert_eq!(
            first.alarm_by,
            Some(1_000),
            "a crashed request's slot is swept"
        );
        let second = ok(admit(&mut s, &slotted("r2"), 10));
        assert!(matches!(second.answer, AdmitResponse::Limited { .. }));
        ok(finish(&mut s, "r1"));
        assert!(matches!(
            ok(admit(&mut s, &slotted("r2"), 20)).answer,
            AdmitResponse::Admitted { .. }
        ));
        // r2 never finishes: its lease frees the slot.
        assert!(matches!(
            ok(admit(&mut s, &slotted("r3"), 500)).answer,
            AdmitResponse::Limited { .. }
        ));
        assert!(matches!(
            ok(admit(&mut s, &slotted("r3"), 1_020)).answer,
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
        let first = ok(admit(&mut s, &admit_req("f", "r1"), 0));
        assert_eq!(decision(&first), Some(Decision::Execute));
        assert_eq!(first.alarm_by, Some(1_000), "the lease expiry is swept");
        assert!(!s.state.windows.is_empty(), "the window was charged");
        let done = ok(complete(&mut s, &complete_req("r1", false), b"body", 10));
        assert_eq!((done.answer.applied, done.alarm_by), (true, Some(10_010)));
        let replay = ok(admit(&mut s, &admit_req("f", "r2"), 20));
        assert_eq!(decision(&replay), Some(Decision::Replay));
        assert_eq!(replay.payload, b"body");
        assert_eq!(replay.alarm_by, None, "a replay writes no record");
    }

    #[test]
    fn an_omitted_body_is_neither_stored_nor_loaded() {
        let mut s = MemoryStore::default();
        ok(admit(&mut s, &admit_req("f", "r1"), 0));
        ok(complete(&mut s, &complete_req("r1", true), b"body", 10));
        assert!(s.bodies.is_empty());
        let replay = ok(admit(&mut s, &admit_req("f", "r2"), 20));
        assert_eq!(decision(&replay), Some(Decision::Replay));
        assert!(replay.payload.is_empty());
    }

    #[test]
    fn a_claim_replacing_an_expired_record_drops_its_old_body() {
        let mut s = MemoryStore::default();
        ok(admit(&mut s, &admit_req("f", "r1"), 0));
        ok(complete(&mut s, &complete_req("r1", false), b"old!", 10));
        // After the TTL the same key starts a new operation, without the old body.
        let again = ok(admit(&mut s, &admit_req("g", "r2"), 20_000));
        assert_eq!(decision(&again), Some(Decision::Execute));
        assert!(!s.bodies.contains_key("k"));
        assert!(
            matches!(s.records.get("k"), Some(Record::InFlight { request_id, .. }) if request_id == "r2")
        );
    }

    #[test]
    fn only_the_holder_completes_or_releases() {
        let mut s = MemoryStore::default();
        ok(admit(&mut s, &admit_req("f", "r1"), 0));
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
        let d = ok(admit(&mut s, &admit_req("f", "r1"), 1));
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
}
