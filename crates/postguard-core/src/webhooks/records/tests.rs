//! Property tests over the functions the shard runs in production, on the
//! in-memory backend: any interleaving of publishes, claims, settles, holds,
//! resumes, manual attempts and re-queues keeps the delivery invariants.

use super::*;
use crate::webhooks::retry::AttemptResult;
use proptest::prelude::*;
use std::collections::BTreeMap;

const SCHEDULE: &[u32] = &[1, 2, 4];
const LEASE: u64 = 40_000;
const T0: u64 = 1_700_000_000_000;
const LIMITS: Limits = Limits {
    events_per_day: 1_000_000,
    deliveries_per_day: 10_000_000,
    bytes_per_day: u64::MAX,
    high_water_bytes: u64::MAX,
    delivery_bytes: 100,
    bytes_elsewhere: 0,
};

fn event(id: &str, subs: &[(&str, bool)], now: u64) -> NewEvent {
    NewEvent {
        event: EventRecord {
            id: id.to_string(),
            event_type: "t".into(),
            payload: format!("{{\"id\":\"{id}\"}}"),
            created_at: now,
            request_id: Some("req_1".into()),
            ordering_key: None,
        },
        deliveries: subs
            .iter()
            .map(|(s, held)| NewDelivery {
                id: format!("dlv_{id}_{s}"),
                subscription_id: (*s).to_string(),
                url: "https://r.test/".into(),
                held: *held,
                lane: None,
            })
            .collect(),
        deliver_at: None,
    }
}

fn row(id: &str, number: u32, at: u64) -> AttemptRecord {
    AttemptRecord {
        delivery_id: id.to_string(),
        request_id: format!("req_{id}_{number}_{at}"),
        attempt: number,
        url: "https://r.test/".into(),
        status_code: None,
        error: None,
        response_excerpt: None,
        duration_ms: 1,
        at,
        next_retry_at: None,
        signed: None,
        response_headers: None,
    }
}

#[test]
fn publish_stores_once_and_flushes_what_is_unsent() {
    let mut s = MemoryStore::default();
    let ev = event("evt_1", &[("a", false), ("b", true)], T0);
    let out = publish(&mut s, std::slice::from_ref(&ev), &LIMITS, T0).unwrap();
    let Stored::Stored { jobs } = &out[0] else {
        panic!("{out:?}")
    };
    let ids: Vec<(&str, u64)> = jobs
        .iter()
        .map(|j| (j.delivery_id.as_str(), j.at))
        .collect();
    assert_eq!(ids, vec![("dlv_evt_1_a", T0)]);
    assert_eq!(s.deliveries["dlv_evt_1_b"].status, Status::Paused);
    // Again before its jobs were marked sent: the same jobs, nothing new.
    let again = publish(&mut s, std::slice::from_ref(&ev), &LIMITS, T0 + 5).unwrap();
    assert_eq!(again[0], Stored::Known { jobs: jobs.clone() });
    mark_sent(&mut s, &["dlv_evt_1_a".to_string()], T0 + 6).unwrap();
    let third = publish(&mut s, &[ev], &LIMITS, T0 + 7).unwrap();
    assert_eq!(third[0], Stored::Known { jobs: vec![] });
    assert_eq!(s.usage[&capacity::utc_day(T0)].events, 1);
    assert_eq!(s.usage[&capacity::utc_day(T0)].deliveries, 2);
}

#[test]
fn a_scheduled_event_is_due_at_deliver_at_and_so_is_its_first_job() {
    let mut s = MemoryStore::default();
    let at = T0 + 8_000;
    let ev = NewEvent {
        deliver_at: Some(at),
        ..event("evt_s", &[("a", false)], T0)
    };
    let out = publish(&mut s, std::slice::from_ref(&ev), &LIMITS, T0).unwrap();
    let Stored::Stored { jobs } = &out[0] else {
        panic!("{out:?}")
    };
    assert_eq!(jobs[0].at, at);
    assert_eq!(s.deliveries["dlv_evt_s_a"].next_attempt_at, Some(at));
    // The outbox sweep and a repeated publish keep its time.
    assert_eq!(unsent(&mut s, T0, 10).unwrap()[0].at, at);
    let again = publish(&mut s, &[ev], &LIMITS, T0 + 1).unwrap();
    assert_eq!(again[0], Stored::Known { jobs: jobs.clone() });
    // A held subscription's delivery keeps its time (held when its job comes, if still held).
    let held = NewEvent {
        deliver_at: Some(at),
        ..event("evt_h", &[("b", true)], T0)
    };
    let out = publish(&mut s, &[held], &LIMITS, T0).unwrap();
    assert!(matches!(&out[0], Stored::Stored { jobs } if jobs[0].at == at));
    assert_eq!(s.deliveries["dlv_evt_h_b"].status, Status::Pending);
    // The job that arrives early waits; at its time it is sent.
    let sub = SubView {
        subscribed: true,
        held: false,
    };
    let d = s.deliveries["dlv_evt_s_a"].snapshot(sub);
    let job = delivery::Job::Scheduled { at };
    assert!(matches!(
        delivery::plan(job, &d, T0 + 2_000, 40_000),
        delivery::Plan::Wait { .. }
    ));
    assert!(matches!(
        delivery::plan(job, &d, at, 40_000),
        delivery::Plan::Send(_)
    ));
}

#[test]
fn a_full_shard_or_a_spent_quota_refuses_and_stores_nothing() {
    let mut s = MemoryStore {
        size: 10,
        ..Default::default()
    };
    let full = Limits {
        high_water_bytes: 10,
        ..LIMITS
    };
    let out = publish(&mut s, &[event("evt_1", &[("a", false)], T0)], &full, T0).unwrap();
    assert!(matches!(
        &out[0],
        Stored::Refused {
            refusal: Refusal::Full { .. }
        }
    ));
    assert!(s.events.is_empty() && s.deliveries.is_empty());
    let p = Refusal::Full {
        bytes: 10,
        high_water: 10,
    }
    .problem("acme", T0);
    assert_eq!(p.status(), 503);
    let one = Limits {
        events_per_day: 1,
        ..LIMITS
    };
    let mut s = MemoryStore::default();
    let evs = [event("evt_1", &[], T0), event("evt_2", &[], T0)];
    let out = publish(&mut s, &evs, &one, T0).unwrap();
    assert!(matches!(out[0], Stored::Stored { .. }));
    assert!(matches!(
        &out[1],
        Stored::Refused {
            refusal: Refusal::Quota { .. }
        }
    ));
}

/// Issue 32 #8: a second copy of a scheduled job (a duplicate message, a
/// redelivered batch, a second consumer) reaching the shard while the first
/// attempt is in flight sends nothing and cannot own the schedule; after
/// the attempt settles it is superseded; if the attempt was lost with its
/// consumer, the copy claims the next attempt once the lease is over.
#[test]
fn a_duplicate_job_sends_nothing_while_its_attempt_is_in_flight() {
    let mut s = MemoryStore::default();
    publish(&mut s, &[event("evt_1", &[("a", false)], T0)], &LIMITS, T0).unwrap();
    let sub = SubView {
        subscribed: true,
        held: false,
    };
    let job = |at| ClaimJob {
        delivery_id: "dlv_evt_1_a".into(),
        job: JobKind::Scheduled { at },
        sub,
        predecessor: None,
    };
    let sent = |c: &Claimed| match c {
        Claimed::Send {
            claim,
            gave_up: None,
            ..
        } => Some(*claim),
        _ => None,
    };
    // Two copies at once in one batch, and one more a moment later.
    let both = claim(&mut s, &[job(T0), job(T0)], T0, LEASE).unwrap();
    let first = sent(&both[0]).expect("the first copy claims attempt 1");
    assert_eq!(first.number, 1);
    assert!(
        matches!(both[1], Claimed::Wait { delay_s: 40 }),
        "{:?}",
        both[1]
    );
    let later = claim(&mut s, &[job(T0)], T0 + 5_000, LEASE).unwrap();
    assert!(
        matches!(later[0], Claimed::Wait { delay_s: 35 }),
        "{later:?}"
    );
    // The attempt fails: its settle owns the schedule (the next attempt at +1 s).
    let st = Settle {
        claim: first,
        result: Attempted::Sent(AttemptResult::Status {
            code: 500,
            retry_after: None,
        })
        .into(),
        row: row("dlv_evt_1_a", 1, T0 + 6_000),
        sub,
    };
    let follow = settle(&mut s, &[st], SCHEDULE, T0 + 6_000).unwrap();
    let next_at = follow.follow_ups[0].expect("a retry").at;
    assert_eq!(next_at, T0 + 6_001 + 1_000);
    // The waiting copies come back after the lease: superseded, nothing sent.
    let back = claim(&mut s, &[job(T0), job(T0)], T0 + 40_000, LEASE).unwrap();
    assert_eq!(back, vec![Claimed::Dropped, Claimed::Dropped]);
    // The retry runs as attempt 2, once.
    let retry = claim(&mut s, &[job(next_at), job(next_at)], T0 + 40_000, LEASE).unwrap();
    let second = sent(&retry[0]).expect("attempt 2");
    assert_eq!(second.number, 2);
    assert!(matches!(retry[1], Claimed::Wait { .. }));
    // Its consumer dies: no settle. After the lease, a copy claims attempt 3.
    let lost = claim(&mut s, &[job(next_at)], T0 + 80_000, LEASE).unwrap();
    assert_eq!(sent(&lost[0]).map(|c| c.number), Some(3));
    assert_eq!(s.deliveries["dlv_evt_1_a"].attempts_made, 3);
    // A consumer that fails before sending gives its claim back: the job,
    // handed over again, claims the next attempt at once.
    assert!(
        !unclaim(&mut s, "dlv_evt_1_a", 2, T0 + 80_001).unwrap(),
        "not the last claim"
    );
    assert!(unclaim(&mut s, "dlv_evt_1_a", 3, T0 + 80_001).unwrap());
    let again = claim(&mut s, &[job(next_at)], T0 + 80_002, LEASE).unwrap();
    assert_eq!(sent(&again[0]).map(|c| c.number), Some(4));
}

#[test]
fn hold_then_release_in_creation_order() {
    let mut s = MemoryStore::default();
    for i in 0..3 {
        let ev = event(&format!("evt_{i}"), &[("a", false)], T0 + i);
        publish(&mut s, &[ev], &LIMITS, T0 + i).unwrap();
    }
    let held = SubView {
        subscribed: true,
        held: true,
    };
    for i in (0..3).rev() {
        let j = ClaimJob {
            delivery_id: format!("dlv_evt_{i}_a"),
            job: JobKind::Scheduled { at: T0 + i },
            sub: held,
            predecessor: None,
        };
        assert_eq!(
            claim(&mut s, &[j], T0 + 10, LEASE).unwrap(),
            vec![Claimed::Held]
        );
    }
    let ids: Vec<String> = release(&mut s, "a", 100, T0 + 20)
        .unwrap()
        .into_iter()
        .map(|j| j.delivery_id)
        .collect();
    assert_eq!(ids, vec!["dlv_evt_0_a", "dlv_evt_1_a", "dlv_evt_2_a"]);
    assert!(s
        .deliveries
        .values()
        .all(|d| d.status == Status::Pending && d.next_attempt_at == Some(T0 + 20)));
}

#[test]
fn manual_attempts_are_bounded_and_recover_counts_the_rest() {
    let mut s = MemoryStore::default();
    publish(&mut s, &[event("evt_1", &[("a", false)], T0)], &LIMITS, T0).unwrap();
    let mut d = s.deliveries["dlv_evt_1_a"].clone();
    d.status = Status::DeadLetter;
    s.put_delivery(&d).unwrap();
    assert!(matches!(
        manual(&mut s, "dlv_evt_1_a", 1, T0).unwrap(),
        Manual::Queued { .. }
    ));
    assert_eq!(
        manual(&mut s, "dlv_evt_1_a", 1, T0).unwrap(),
        Manual::LimitReached
    );
    assert_eq!(manual(&mut s, "dlv_nope", 1, T0).unwrap(), Manual::NotFound);
    let step = RecoverStep {
        subscription_id: "a".into(),
        since: 0,
        until: u64::MAX,
        after: (0, String::new()),
        limit: 10,
        max_manual: 1,
    };
    let r = recover(&mut s, &step, T0).unwrap();
    assert_eq!((r.queued.len(), r.skipped), (0, 1));
    assert_eq!(r.last, Some((T0, "dlv_evt_1_a".to_string())));
}

/// One step of an arbitrary interleaving.
#[derive(Debug, Clone)]
enum Op {
    Publish(u8, bool),
    /// Run the scheduled job of delivery `n` (as the queue would, maybe stale).
    Scheduled(u8, bool),
    Manual(u8),
    Redirect(u8),
    /// Settle the oldest outstanding claim with this status code.
    Settle(u16),
    Pause(bool),
    Resume,
    Requeue,
    Tick(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..6, any::<bool>()).prop_map(|(n, h)| Op::Publish(n, h)),
        (0u8..6, any::<bool>()).prop_map(|(n, stale)| Op::Scheduled(n, stale)),
        (0u8..6).prop_map(Op::Manual),
        (0u8..6).prop_map(Op::Redirect),
        prop_oneof![Just(200u16), Just(500), Just(404), Just(429), Just(503)].prop_map(Op::Settle),
        any::<bool>().prop_map(Op::Pause),
        Just(Op::Resume),
        Just(Op::Requeue),
        (1u16..5_000).prop_map(Op::Tick),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn any_interleaving_keeps_the_delivery_invariants(ops in proptest::collection::vec(op(), 1..80)) {
        let mut s = MemoryStore::default();
        let mut now = T0;
        let mut held = false;
        let mut outstanding: Vec<(ClaimWire, String)> = Vec::new();
        let mut delivered: BTreeMap<String, u32> = BTreeMap::new();
        let mut last_claimed: BTreeMap<String, u32> = BTreeMap::new();
        for op in ops {
            let sub = SubView { subscribed: true, held };
            match op {
                Op::Publish(n, h) => {
                    publish(&mut s, &[event(&format!("evt_{n}"), &[("a", h || held)], now)], &LIMITS, now).unwrap();
                }
                Op::Scheduled(n, _) | Op::Manual(n) | Op::Redirect(n) if !s.deliveries.contains_key(&format!("dlv_evt_{n}_a")) => {}
                Op::Scheduled(n, stale) => {
                    let id = format!("dlv_evt_{n}_a");
                    let d = s.deliveries[&id].clone();
                    let at = match (d.next_attempt_at, stale) { (Some(a), false) => a, (Some(a), true) => a.saturating_sub(1), (None, _) => now };
                    let j = ClaimJob { delivery_id: id.clone(), job: JobKind::Scheduled { at }, sub, predecessor: None };
                    if let Claimed::Send { claim, .. } = &claim(&mut s, &[j], now.max(at), LEASE).unwrap()[0] {
                        outstanding.push((*claim, id));
                    }
                }
                Op::Manual(n) | Op::Redirect(n) => {
                    let id = format!("dlv_evt_{n}_a");
                    let kind = if matches!(op, Op::Redirect(_)) { JobKind::Redirect } else { JobKind::ManualRetry };
                    if let Manual::Queued { .. } = manual(&mut s, &id, 3, now).unwrap() {
                        let j = ClaimJob { delivery_id: id.clone(), job: kind, sub, predecessor: None };
                        if let Claimed::Send { claim, .. } = &claim(&mut s, &[j], now, LEASE).unwrap()[0] {
                            outstanding.push((*claim, id.clone()));
                        }
                    }
                    prop_assert!(s.deliveries[&id].manual <= 3);
                }
                Op::Settle(code) if !outstanding.is_empty() => {
                    let (c, id) = outstanding.remove(0);
                    let st = Settle {
                        claim: c,
                        result: Attempted::Sent(AttemptResult::Status { code, retry_after: None }).into(),
                        row: row(&id, c.number, now),
                        sub,
                    };
                    settle(&mut s, &[st], SCHEDULE, now).unwrap();
                }
                Op::Settle(_) => {}
                Op::Pause(p) => held = p,
                Op::Resume => {
                    held = false;
                    release(&mut s, "a", 100, now).unwrap();
                }
                Op::Requeue => {
                    requeue(&mut s, now, 100, now, 0).unwrap();
                }
                Op::Tick(ms) => now += u64::from(ms),
            }
            for d in s.deliveries.values() {
                // Delivered stays delivered.
                if delivered.contains_key(&d.id) {
                    prop_assert_eq!(d.status, Status::Delivered);
                }
                if d.status == Status::Delivered {
                    delivered.insert(d.id.clone(), d.attempts_made);
                }
                // Claimed numbers only grow.
                let before = last_claimed.insert(d.id.clone(), d.attempts_made).unwrap_or(0);
                prop_assert!(d.attempts_made >= before);
                // Nothing is lost: final, held, or on its schedule.
                match d.status {
                    Status::Paused => prop_assert_eq!(d.next_attempt_at, None),
                    s if s.in_progress() => prop_assert!(d.next_attempt_at.is_some()),
                    _ => {}
                }
            }
            // Attempt numbers are never reused within a delivery.
            let mut seen = std::collections::BTreeSet::new();
            for a in &s.attempts {
                prop_assert!(seen.insert((a.delivery_id.clone(), a.attempt)), "attempt {} of {} twice", a.attempt, a.delivery_id);
            }
        }
        // Usage counts what is stored.
        let u: u64 = s.usage.values().map(|u| u.events).sum();
        prop_assert_eq!(u, s.events.len() as u64);
    }
}

/// The archive reads every delivery once, oldest first, page by page, each
/// with its own attempts; and the oldest due delivery is the one whose next
/// attempt comes first.
#[test]
fn archive_pages_and_the_oldest_due_delivery() {
    let mut s = MemoryStore::default();
    for i in 0..7u64 {
        let ev = event(&format!("evt_{i}"), &[("a", false), ("b", i == 3)], T0 + i);
        publish(&mut s, &[ev], &LIMITS, T0 + i).unwrap();
    }
    s.insert_attempts(&[
        row("dlv_evt_2_a", 1, T0 + 50),
        row("dlv_evt_2_a", 2, T0 + 40),
    ])
    .unwrap();
    assert_eq!(
        s.oldest_due().unwrap(),
        Some((T0, "dlv_evt_0_a".to_string()))
    );
    let (mut after, mut seen) = ((0, String::new()), Vec::new());
    loop {
        let page = archive_page(&mut s, T0 + 1, T0 + 6, &after, 3).unwrap();
        let Some(last) = page.last() else { break };
        after = (last.delivery.created_at, last.delivery.id.clone());
        seen.extend(page);
    }
    let ids: Vec<&str> = seen.iter().map(|a| a.delivery.id.as_str()).collect();
    let want: Vec<String> = (1..6)
        .flat_map(|i| [format!("dlv_evt_{i}_a"), format!("dlv_evt_{i}_b")])
        .collect();
    assert_eq!(ids, want, "since inclusive, until exclusive, each once");
    let two = seen
        .iter()
        .find(|a| a.delivery.id == "dlv_evt_2_a")
        .unwrap();
    assert_eq!(
        two.attempts.iter().map(|a| a.attempt).collect::<Vec<_>>(),
        [2, 1],
        "by time"
    );
    assert!(seen
        .iter()
        .filter(|a| a.delivery.id != "dlv_evt_2_a")
        .all(|a| a.attempts.is_empty()));
    assert!(seen
        .iter()
        .all(|a| a.delivery.request_id.as_deref() == Some("req_1")));
    for d in s.deliveries.values_mut() {
        d.status = Status::Delivered;
        d.next_attempt_at = None;
    }
    assert_eq!(s.oldest_due().unwrap(), None, "nothing in progress");
}

#[test]
fn a_delivery_query_in_sql_binds_one_argument_per_placeholder() {
    let q = DeliveryQuery {
        status: Some(Status::Failed),
        event_type: Some("payment.failed".into()),
        subscription_id: Some("sub_1".into()),
        event_id: Some("evt_1".into()),
        since: Some(1),
        until: Some(2),
        before: Some((3, "dlv_x".into())),
    };
    let (sql, args) = q.sql_conditions(50);
    assert!(sql.contains("d.subscription_id = ?") && sql.contains("d.event_id = ?"));
    assert_eq!(sql.matches('?').count(), args.len());
    assert_eq!(args.last(), Some(&crate::audit::Arg::Int(50)));
    let (bare, only_limit) = DeliveryQuery::default().sql_conditions(7);
    assert_eq!(bare, " ORDER BY d.created_at DESC, d.id DESC LIMIT ?");
    assert_eq!(only_limit, vec![crate::audit::Arg::Int(7)]);
}

#[test]
fn deliveries_are_filtered_by_subscription_and_event_as_parsed() {
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let (q, limit) = DeliveryQuery::parse(&pairs(&[
        ("subscription_id", "sub_2"),
        ("event_id", "evt_9"),
        ("status", "failed"),
        ("limit", "10"),
    ]))
    .unwrap();
    assert_eq!(limit, 10);
    assert_eq!(
        (q.subscription_id.as_deref(), q.event_id.as_deref()),
        (Some("sub_2"), Some("evt_9"))
    );
    assert_eq!(DeliveryQuery::parse(&[]).unwrap().1, 50);
    for bad in [
        ("subscription_id", ""),
        ("event_id", "a b"),
        ("status", "lost"),
        ("project", "acme"),
        ("bogus", "1"),
    ] {
        assert!(DeliveryQuery::parse(&pairs(&[bad])).is_err(), "{bad:?}");
    }
    let d = |sub: &str, ev: &str| DeliveryRecord {
        id: format!("dlv_{sub}_{ev}"),
        event_id: ev.into(),
        event_type: "t".into(),
        subscription_id: sub.into(),
        url: "https://r.example/h".into(),
        status: Status::Failed,
        attempts_made: 1,
        next_attempt_at: None,
        created_at: 5,
        updated_at: 5,
        queued_at: Some(5),
        manual: 0,
        request_id: None,
        claimed_until: None,
        ordering_key: None,
        ordering_seq: None,
        blocked_by: None,
    };
    assert!(q.matches(&d("sub_2", "evt_9")));
    assert!(!q.matches(&d("sub_1", "evt_9")), "another subscription");
    assert!(!q.matches(&d("sub_2", "evt_8")), "another event");
}

/// Issue 36: the shard's claim gates a keyed delivery on the one before it
/// in its lane (read in the same shard), uses no attempt number while it
/// waits, and the predecessor's settle wakes it; another lane is not held.
#[test]
fn a_lane_waits_for_its_predecessor_and_its_settle_wakes_the_next() {
    let mut s = MemoryStore::default();
    let keyed = |id: &str, key: &str, seq: u64, by: Option<&str>| {
        let mut e = event(id, &[("a", false)], T0);
        e.deliveries[0].lane = Some(Placed {
            ordering_key: key.into(),
            seq,
            blocked_by: by.map(str::to_owned),
        });
        e
    };
    let events = [
        keyed("evt_1", "K", 1, None),
        keyed("evt_2", "K", 2, Some("dlv_evt_1_a")),
        keyed("evt_3", "L", 1, None),
    ];
    publish(&mut s, &events, &LIMITS, T0).unwrap();
    let sub = SubView {
        subscribed: true,
        held: false,
    };
    let job = |id: &str| ClaimJob {
        delivery_id: id.into(),
        job: JobKind::Scheduled { at: T0 },
        sub,
        predecessor: None,
    };
    let got = claim(
        &mut s,
        &[job("dlv_evt_1_a"), job("dlv_evt_2_a"), job("dlv_evt_3_a")],
        T0,
        LEASE,
    )
    .unwrap();
    let Claimed::Send { claim: first, .. } = got[0].clone() else {
        panic!("the head goes: {:?}", got[0]);
    };
    assert!(
        matches!(&got[1], Claimed::Blocked { by, .. } if by == "dlv_evt_1_a"),
        "{:?}",
        got[1]
    );
    assert!(matches!(got[2], Claimed::Send { .. }), "key L is not held");
    assert_eq!(s.deliveries["dlv_evt_2_a"].attempts_made, 0);
    // The head fails: still blocked; then it is delivered: the settle wakes K's next.
    let outcome = |code| Settle {
        claim: first,
        result: Attempted::Sent(AttemptResult::Status {
            code,
            retry_after: None,
        })
        .into(),
        row: row("dlv_evt_1_a", 1, T0 + 1_000),
        sub,
    };
    let failed = settle(&mut s, &[outcome(500)], SCHEDULE, T0 + 1_000).unwrap();
    assert!(failed.wakes.is_empty());
    let again = claim(&mut s, &[job("dlv_evt_2_a")], T0 + 1_500, LEASE).unwrap();
    assert!(matches!(again[0], Claimed::Blocked { .. }), "{again:?}");
    let retry_at = failed.follow_ups[0].expect("a retry").at;
    let retry = ClaimJob {
        job: JobKind::Scheduled { at: retry_at },
        ..job("dlv_evt_1_a")
    };
    let Claimed::Send { claim: second, .. } =
        claim(&mut s, &[retry], retry_at, LEASE).unwrap()[0].clone()
    else {
        panic!("the retry goes");
    };
    let ok = Settle {
        claim: second,
        row: row("dlv_evt_1_a", 2, retry_at),
        ..outcome(200)
    };
    let done = settle(&mut s, &[ok], SCHEDULE, retry_at).unwrap();
    assert_eq!(
        done.wakes
            .iter()
            .map(|j| j.delivery_id.as_str())
            .collect::<Vec<_>>(),
        ["dlv_evt_2_a"]
    );
    let woken = claim(&mut s, &[job("dlv_evt_2_a")], retry_at + 10, LEASE).unwrap();
    assert!(
        matches!(&woken[0], Claimed::Send { claim, .. } if claim.number == 1),
        "{woken:?}"
    );
    assert_eq!(
        s.deliveries["dlv_evt_2_a"].blocked_by, None,
        "the gate opened for good"
    );
}

/// A predecessor in another shard is read by the consumer ([`Claimed::Read`])
/// and handed to the claim; one that never came to be hands its own
/// predecessor on.
#[test]
fn a_predecessor_elsewhere_is_read_then_followed() {
    let mut s = MemoryStore::default();
    let mut e = event("evt_9", &[("a", false)], T0);
    e.deliveries[0].lane = Some(Placed {
        ordering_key: "K".into(),
        seq: 3,
        blocked_by: Some("dlv_elsewhere".into()),
    });
    publish(&mut s, &[e], &LIMITS, T0).unwrap();
    let sub = SubView {
        subscribed: true,
        held: false,
    };
    let job = |predecessor| ClaimJob {
        delivery_id: "dlv_evt_9_a".into(),
        job: JobKind::Scheduled { at: T0 },
        sub,
        predecessor,
    };
    let first = claim(&mut s, &[job(None)], T0, LEASE).unwrap();
    assert_eq!(
        first,
        vec![Claimed::Read {
            predecessor: "dlv_elsewhere".into(),
            ordering_key: "K".into(),
        }]
    );
    let abandoned = PredRead {
        id: "dlv_elsewhere".into(),
        read: crate::webhooks::ordering::Predecessor::Missing {
            read_at: T0,
            reservation: Some(crate::webhooks::ordering::Reservation {
                delivery_id: "dlv_elsewhere".into(),
                seq: 2,
                prev: Some("dlv_before".into()),
                at: T0,
                abandoned: true,
            }),
        },
    };
    let next = claim(&mut s, &[job(Some(abandoned))], T0, LEASE).unwrap();
    assert_eq!(
        next,
        vec![Claimed::Read {
            predecessor: "dlv_before".into(),
            ordering_key: "K".into(),
        }]
    );
    assert_eq!(
        s.deliveries["dlv_evt_9_a"].blocked_by.as_deref(),
        Some("dlv_before")
    );
}
