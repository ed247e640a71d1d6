//! The key guard's orchestration over a storage port: load → decide
//! (`guard`) → persist, for each object operation, and the expiry sweep.
//!
//! [`GuardStore`] is synchronous on purpose: the object runs one operation
//! with no `await` between reading its state and writing the decision, which
//! makes check-and-claim atomic, and a synchronous trait makes that something
//! the compiler checks. The Durable Object implements it over its SQLite
//! storage (`src/durable/key_guard.rs`); [`MemoryStore`] implements it for
//! the host tests below.

use std::collections::BTreeMap;

use crate::guard::{self, Ack, AdmitRequest, AdmitResponse, CompleteRequest, ReleaseRequest};
use crate::idempotency::{Decision, Record};
use crate::rate_limit::Window;

/// Revoked flag and rate window of a key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimiterState {
    pub revoked: bool,
    pub window: Option<Window>,
}

/// What a key's object stores.
pub trait GuardStore {
    type Error;
    fn limiter(&mut self) -> Result<LimiterState, Self::Error>;
    fn put_window(&mut self, window: Window) -> Result<(), Self::Error>;
    fn put_revoked(&mut self, at_ms: u64) -> Result<(), Self::Error>;
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

/// An operation's answer, and the time by which an alarm must fire to sweep
/// what it wrote (`None`: nothing new expires).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done<T> {
    pub answer: T,
    /// The response body travelling with the answer (a replay's).
    pub payload: Vec<u8>,
    pub alarm_by: Option<u64>,
}

/// `admit`: charge the limiter, then claim (or replay) the Idempotency-Key.
pub fn admit<S: GuardStore>(
    store: &mut S,
    req: &AdmitRequest,
    now_ms: u64,
) -> Result<Done<AdmitResponse>, S::Error> {
    let LimiterState { revoked, window } = store.limiter()?;
    let record = match &req.claim {
        Some(c) => store.record(&c.key)?,
        None => None,
    };
    let plan = guard::admit(revoked, window, record.as_ref(), req, now_ms);
    if let Some(w) = plan.window {
        store.put_window(w)?;
    }
    if let (Some(c), Some(new_claim)) = (&req.claim, &plan.claim) {
        store.put_record(&c.key, new_claim)?;
        // A claim that replaces an expired record drops its old body.
        if record.is_some() {
            store.delete_body(&c.key)?;
        }
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
    Ok(Done {
        alarm_by: plan.claim.as_ref().map(Record::expires_at_ms),
        answer: plan.response,
        payload,
    })
}

/// [`admit`]'s answer when it would touch no storage: no Idempotency-Key to
/// look up, the limiter state already known (`state`), and a decision that
/// writes nothing (a refused charge, a cost-0 peek, a revoked key). The
/// object then answers without opening a transaction; `None`: run [`admit`].
pub fn admit_in_memory(
    state: LimiterState,
    req: &AdmitRequest,
    now_ms: u64,
) -> Option<AdmitResponse> {
    if req.claim.is_some() {
        return None;
    }
    let plan = guard::admit(state.revoked, state.window, None, req, now_ms);
    (plan.window.is_none() && plan.claim.is_none()).then_some(plan.response)
}

/// Whether [`admit`] needs a storage transaction for `req`. Without a claim
/// it writes at most one statement (the window), which is atomic on its
/// own; with one it may write the window, the record and drop a body, which
/// must commit together.
pub fn admit_needs_transaction(req: &AdmitRequest) -> bool {
    req.claim.is_some()
}

/// `complete`: store the origin's response under this request's claim.
pub fn complete<S: GuardStore>(
    store: &mut S,
    req: &CompleteRequest,
    body: &[u8],
    now_ms: u64,
) -> Result<Done<Ack>, S::Error> {
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

/// `release`: drop this request's claim (an in-flight claim has no body).
pub fn release<S: GuardStore>(store: &mut S, req: &ReleaseRequest) -> Result<Ack, S::Error> {
    let current = store.record(&req.key)?;
    let applied = guard::should_release(current.as_ref(), req);
    if applied {
        store.delete_record(&req.key)?;
    }
    Ok(Ack { applied })
}

/// `revoke`: flag the key; every later `admit` answers `Revoked`.
pub fn revoke<S: GuardStore>(store: &mut S, now_ms: u64) -> Result<Ack, S::Error> {
    store.put_revoked(now_ms)?;
    Ok(Ack { applied: true })
}

/// Deletes one batch of expired records with their bodies; the time of the
/// next alarm (`now_ms` again when the batch was full).
pub fn sweep<S: GuardStore>(store: &mut S, now_ms: u64, batch: usize) -> Result<Swept, S::Error> {
    let expired = store.expired(now_ms, batch)?;
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
        false => store.next_expiry()?,
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
    pub limiter: LimiterState,
    pub records: BTreeMap<String, Record>,
    pub bodies: BTreeMap<String, Vec<u8>>,
}

impl GuardStore for MemoryStore {
    type Error = std::convert::Infallible;

    fn limiter(&mut self) -> Result<LimiterState, Self::Error> {
        Ok(self.limiter)
    }
    fn put_window(&mut self, window: Window) -> Result<(), Self::Error> {
        self.limiter.window = Some(window);
        Ok(())
    }
    fn put_revoked(&mut self, _at_ms: u64) -> Result<(), Self::Error> {
        self.limiter.revoked = true;
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
    use crate::guard::{AnswerLayout, Claim};
    use crate::idempotency::StoredResponse;
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

    fn admit_req(fp: &str, rid: &str) -> AdmitRequest {
        AdmitRequest {
            cost: 1,
            quota: Q,
            claim: Some(Claim {
                key: "k".into(),
                fingerprint: fp.into(),
                request_id: rid.into(),
                lease_ms: 1_000,
            }),
            v: AnswerLayout::NEWEST,
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
        let charge = |cost| AdmitRequest {
            cost,
            quota: tiny,
            claim: None,
            v: AnswerLayout::NEWEST,
        };
        let mut s = MemoryStore::default();
        assert_eq!(
            admit_in_memory(s.limiter, &charge(1), 0),
            None,
            "a charge writes"
        );
        ok(admit(&mut s, &charge(1), 0));
        for (req, now) in [(charge(1), 10), (charge(0), 20), (charge(1), 59_999)] {
            let before = s.clone();
            let fast = admit_in_memory(s.limiter, &req, now);
            let full = ok(admit(&mut s, &req, now));
            assert_eq!(s, before, "nothing was written");
            assert_eq!(
                (fast, full.alarm_by, full.payload.len()),
                (Some(full.answer), None, 0)
            );
        }
        assert_eq!(
            admit_in_memory(s.limiter, &charge(1), 60_000),
            None,
            "a new window"
        );
        assert_eq!(admit_in_memory(s.limiter, &admit_req("f", "r"), 10), None);
        s.limiter.revoked = true;
        assert_eq!(
            admit_in_memory(s.limiter, &charge(1), 10),
            Some(AdmitResponse::Revoked)
        );
    }

    #[test]
    fn claim_complete_then_replay_loads_the_body() {
        let mut s = MemoryStore::default();
        let first = ok(admit(&mut s, &admit_req("f", "r1"), 0));
        assert_eq!(decision(&first), Some(Decision::Execute));
        assert_eq!(first.alarm_by, Some(1_000), "the lease expiry is swept");
        assert!(s.limiter.window.is_some(), "the window was charged");
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
        // A full batch: run again at once.
        assert_eq!(ok(sweep(&mut s, 1_000, 2)).next, Some(1_000));
        assert_eq!(s.records.keys().collect::<Vec<_>>(), ["k2", "k3"]);
        // The rest of the expired ones, then the next expiry.
        assert_eq!(ok(sweep(&mut s, 1_000, 2)).next, Some(5_000));
        assert_eq!(s.records.keys().collect::<Vec<_>>(), ["k3"]);
        assert_eq!(s.bodies.keys().collect::<Vec<_>>(), ["k3"]);
        assert_eq!(ok(sweep(&mut s, 6_000, 2)).next, None);
        assert!(s.bodies.is_empty());
    }
}
