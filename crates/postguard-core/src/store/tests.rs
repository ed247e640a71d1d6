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
        notify_at: Vec::new(),
        policies: vec![crate::limits::Policy::single(quota)],
        concurrency: None,
        report_only: false,
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
    use crate::guard::{FinishOpRequest, GetOpRequest, NewOperation, StartOpReply, StartOpRequest};
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

    fn finish(id: &str, attempt: u32, status: u16, event: Option<PendingEvent>) -> FinishOpRequest {
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

/// The alarm's pacing is decided here, not in the object: a sweep due
/// wins; work already due waits a second (a minute when the shell could
/// not work), never in the past.
#[test]
fn the_next_alarm_is_the_sweep_or_the_work_paced() {
    const NOW: u64 = 1_000_000;
    assert_eq!(next_alarm(None, None, true, NOW), None);
    assert_eq!(next_alarm(Some(NOW + 5), None, true, NOW), Some(NOW + 5));
    assert_eq!(
        next_alarm(Some(NOW - 5), None, true, NOW),
        Some(NOW),
        "never before now"
    );
    assert_eq!(
        next_alarm(None, Some(NOW - 100), true, NOW),
        Some(NOW + WORK_AGAIN_MS)
    );
    assert_eq!(
        next_alarm(None, Some(NOW - 100), false, NOW),
        Some(NOW + WORK_BLOCKED_MS)
    );
    assert_eq!(
        next_alarm(None, Some(NOW + 90_000), false, NOW),
        Some(NOW + 90_000),
        "later work keeps its time"
    );
    assert_eq!(
        next_alarm(Some(NOW + 10), Some(NOW), true, NOW),
        Some(NOW + 10)
    );
}

#[test]
fn a_grant_is_written_with_the_windows_and_its_slots_count_at_the_home() {
    use crate::guard::{LeaseRequest, Slot};
    use crate::lease::{Ask, EdgeLimits};
    let mut store = MemoryStore::default();
    let limits = Limits {
        concurrency: Some(40),
        ..single(Q)
    };
    let settings = EdgeLimits {
        enabled: true,
        min_block: 2,
        ..EdgeLimits::default()
    };
    let ask = Ask {
        edge: "LHR.0".into(),
        id: 9,
        life: 9,
        want: 20,
        have: Vec::new(),
        slots: Some(30),
    };
    let req = LeaseRequest {
        admit: AdmitRequest::charge(1, limits.clone()),
        ask: Some(ask),
        settings,
        request_ms: 1_000,
    };
    let done = ok(lease(&mut store, &req, &[], 1_000));
    let g = done.answer.grant.expect("a grant");
    let (units, slots) = (g.blocks[0].units, g.slots.map_or(0, |s| s.slots));
    assert!(units > 0 && slots > 0, "{units} units, {slots} slots");
    let used = crate::limits::window_of(&store.state.windows, "default").map(|w| w.used);
    assert_eq!(
        used,
        Some(1 + units),
        "the request and the block, one write"
    );
    assert_eq!(store.state.ledger.policies[0].leased, units);
    // The home's own admissions see the leased slots as taken.
    let mine = AdmitRequest {
        slot: Some(Slot {
            id: "r1".into(),
            lease_ms: 1_000,
        }),
        ..AdmitRequest::charge(1, limits)
    };
    let d = ok(admit(&mut store, &mine, &[], 1_001));
    let inflight = d
        .answer
        .verdicts()
        .and_then(|v| v.inflight)
        .expect("inflight");
    assert_eq!(inflight.in_use, slots + 1);
}

mod quota_notices {
    use super::*;
    use crate::quota_notice::{NoticeTo, EVENT_TYPE};

    /// A plan of 10 per minute, its notices at `notify_at`.
    fn limits(notify_at: &[u8]) -> Limits {
        Limits {
            notify_at: notify_at.to_vec(),
            ..single(Quota::new(10, 60_000).unwrap())
        }
    }

    fn to(rid: &str) -> Option<Box<NoticeTo>> {
        Some(Box::new(NoticeTo {
            key_id: "key_1".into(),
            key_prefix: "pgk_abc".into(),
            project: "acme".into(),
            request_id: rid.into(),
        }))
    }

    /// One admission of the key, as the proxy sends it.
    fn request(notify_at: &[u8], rid: &str) -> AdmitRequest {
        AdmitRequest {
            notices: to(rid),
            ..AdmitRequest::charge(1, limits(notify_at))
        }
    }

    /// `rounds` rounds of 10 requests "at once": the object runs them one at
    /// a time, each on its own, whatever order they arrive in. Returns how
    /// many were admitted and how many ran in a transaction; a notice is
    /// only ever written by one that did.
    fn rounds(s: &mut MemoryStore, notify_at: &[u8], rounds: u32, now: u64) -> (u32, u32) {
        let (mut admitted, mut transactions) = (0, 0);
        for r in 0..rounds {
            for i in 0..10 {
                let req = request(notify_at, &format!("req_{r}_{i}"));
                // What the object does: the in-memory answer when it writes
                // nothing, else `admit` (a transaction when it may notify).
                let state = ok(s.state());
                if admit_in_memory(&state, &req, now).is_some() {
                    continue;
                }
                let tx = admit_needs_transaction(&req, Some(&state), now);
                let waiting = ok(s.pending(u64::MAX, 100)).len();
                let d = ok(admit(s, &req, &[], now));
                if ok(s.pending(u64::MAX, 100)).len() > waiting {
                    assert!(
                        tx,
                        "a notice is written with the charge, in one transaction"
                    );
                }
                transactions += u32::from(tx);
                if matches!(d.answer, AdmitResponse::Admitted { .. }) {
                    admitted += 1;
                }
            }
        }
        (admitted, transactions)
    }

    fn events(s: &mut MemoryStore, now: u64) -> Vec<PendingEvent> {
        let mut out: Vec<PendingEvent> = ok(s.pending(now, 100))
            .into_iter()
            .map(|p| p.event)
            .collect();
        out.sort_by_key(|e| e.data["percent"].as_u64());
        out
    }

    #[test]
    fn three_rounds_of_ten_cross_half_and_the_limit_once_each() {
        let mut s = MemoryStore::default();
        assert_eq!(
            rounds(&mut s, &[50, 100], 3, 1_000),
            (10, 2),
            "only the 5th and the 10th may cross, and open a transaction"
        );
        let evs = events(&mut s, 1_000);
        assert_eq!(evs.len(), 2, "{evs:?}");
        assert!(evs
            .iter()
            .all(|e| e.event_type == EVENT_TYPE && e.project == "acme"));
        let half = &evs[0];
        assert_eq!(
            half.data,
            serde_json::json!({
                "key_prefix": "pgk_abc", "policy": "default", "limit": 10, "used": 5,
                "percent": 50, "resets_at": "1970-01-01T00:01:01.000Z",
            })
        );
        assert_eq!(
            half.request_id, "req_0_4",
            "the fifth admission crossed 50 %"
        );
        assert_eq!(
            (
                evs[1].data["percent"].as_u64(),
                evs[1].data["used"].as_u64()
            ),
            (Some(100), Some(10))
        );
        assert_eq!(evs[1].request_id, "req_0_9");
        assert_ne!(half.id, evs[1].id);
        assert!(half.id.starts_with("evt_q"));
        // More requests in the window (all refused) add nothing.
        rounds(&mut s, &[50, 100], 2, 30_000);
        assert_eq!(events(&mut s, 30_000).len(), 2);
    }

    #[test]
    fn nothing_without_notify_at_or_without_where_to() {
        let mut s = MemoryStore::default();
        assert_eq!(rounds(&mut s, &[], 3, 1_000), (10, 0));
        assert!(events(&mut s, 1_000).is_empty());
        let mut s = MemoryStore::default();
        for _ in 0..10 {
            let req = AdmitRequest::charge(1, limits(&[50, 100]));
            assert!(
                !admit_needs_transaction(&req, None, 1_000),
                "no target: no notice"
            );
            ok(admit(&mut s, &req, &[], 1_000));
        }
        assert!(events(&mut s, 1_000).is_empty());
    }

    #[test]
    fn a_new_window_notifies_again() {
        let mut s = MemoryStore::default();
        rounds(&mut s, &[50, 100], 3, 1_000);
        let first = events(&mut s, 1_000);
        // The alarm publishes them, then the window ends.
        for p in ok(s.pending(1_000, 100)) {
            ok(published(&mut s, &p, true, 1_000));
        }
        assert!(events(&mut s, 61_000).is_empty());
        assert_eq!(rounds(&mut s, &[50, 100], 3, 61_000), (10, 2));
        let next = events(&mut s, 61_000);
        assert_eq!(next.len(), 2);
        assert_eq!(next[1].data["resets_at"], "1970-01-01T00:02:01.000Z");
        assert!(
            next.iter().all(|e| first.iter().all(|f| f.id != e.id)),
            "new ids"
        );
    }

    #[test]
    fn the_work_is_due_at_once_and_a_repeat_is_the_same_event() {
        let mut s = MemoryStore::default();
        for i in 0..4 {
            let d = ok(admit(&mut s, &request(&[50], &format!("r{i}")), &[], 1_000));
            assert_eq!(d.work_at, None);
        }
        let d = ok(admit(&mut s, &request(&[50], "r4"), &[], 1_000));
        assert_eq!(d.work_at, Some(1_000), "the alarm publishes it now");
        // The same notice written again (a window restored from the future,
        // say) is the same id, kept once.
        let evs = events(&mut s, 1_000);
        ok(s.put_pending(&evs[0], 2_000));
        assert_eq!(events(&mut s, 2_000).len(), 1);
    }

    #[test]
    fn a_profile_set_since_the_callers_record_decides() {
        let mut s = MemoryStore::default();
        let profile = crate::guard::Profile {
            version: 5,
            limits: limits(&[100]),
            ..crate::guard::Profile::default()
        };
        ok(update(&mut s, &profile));
        for i in 0..10 {
            let state = ok(s.state());
            let req = request(&[], &format!("r{i}"));
            assert_eq!(
                admit_needs_transaction(&req, Some(&state), 1_000),
                i == 9,
                "the profile's notify_at: the 10th reaches 100 %"
            );
            ok(admit(&mut s, &req, &[], 1_000));
        }
        let evs = events(&mut s, 1_000);
        assert_eq!(evs.len(), 1);
        assert_eq!(evs[0].data["percent"], 100);
    }

    #[test]
    fn a_grant_to_an_edge_notifies_where_the_home_charges_it() {
        use crate::guard::LeaseRequest;
        use crate::lease::{Ask, EdgeLimits};
        let mut s = MemoryStore::default();
        let settings = EdgeLimits {
            enabled: true,
            min_block: 2,
            ..EdgeLimits::default()
        };
        let ask = Ask {
            edge: "LHR.0".into(),
            id: 1,
            life: 1,
            want: 20,
            have: Vec::new(),
            slots: None,
        };
        let lease_of = |rid: &str, ask: Option<Ask>| LeaseRequest {
            admit: request(&[50, 100], rid),
            ask,
            settings,
            request_ms: 1_000,
        };
        let done = ok(lease(&mut s, &lease_of("r0", Some(ask)), &[], 1_000));
        let units = done.answer.grant.map_or(0, |g| g.blocks[0].units);
        let used = 1 + units;
        let evs = events(&mut s, 1_000);
        let expect: Vec<u64> = [50u64, 100]
            .into_iter()
            .filter(|p| u64::from(used) * 100 >= p * 10)
            .collect();
        assert_eq!(
            evs.iter()
                .filter_map(|e| e.data["percent"].as_u64())
                .collect::<Vec<_>>(),
            expect,
            "{used} of 10 charged at the home"
        );
        if !expect.is_empty() {
            assert_eq!(done.work_at, Some(1_000));
        }
        // Forwarded requests fill the window: each threshold still once.
        for i in 1..12 {
            ok(lease(&mut s, &lease_of(&format!("r{i}"), None), &[], 1_001));
        }
        let evs = events(&mut s, 1_001);
        assert_eq!(
            evs.iter()
                .filter_map(|e| e.data["percent"].as_u64())
                .collect::<Vec<_>>(),
            [50, 100]
        );
    }
}
