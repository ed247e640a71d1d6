use super::*;
use proptest::prelude::*;

const KEY: &str = "key_01HZX5M3Q7R8S9T0V1W2X3Y4Z5";
const SCHEDULE: [u32; 2] = [1, 5];
const LEASE: u64 = 10_000;

fn request() -> StoredRequest {
    StoredRequest {
        method: "POST".into(),
        path_and_query: "/reports?x=1".into(),
        headers: vec![("content-type".into(), "application/json".into())],
        client_ip: None,
        project: "acme".into(),
        key_prefix: "pgk_abcdefgh".into(),
        plan: "trial".into(),
        meta: None,
        idempotency_key: "k1".into(),
        body_len: 2,
        body_object: None,
        key_expires_at: None,
    }
}

/// `start` with the schedule's attempts, the key alive: the attempt to run.
fn run(o: &Operation, now: u64) -> Option<Operation> {
    match start(o, now, LEASE, max_attempts(&SCHEDULE), None) {
        Start::Run(next) => Some(next),
        _ => None,
    }
}

fn op() -> Operation {
    let id = operation_id(KEY, 1_000, 7).unwrap();
    Operation::new(id, "req_1".into(), request(), 60_000, 1_000, 30_000)
}

fn answer(status: u16) -> Outcome {
    Outcome::Answer(StoredResponse {
        status,
        headers: vec![],
        body_omitted: false,
        body_object: None,
        body_len: 1,
    })
}

#[test]
fn ids_name_their_key_and_nothing_else_reads_as_one() {
    let id = operation_id(KEY, 1_000, 42).unwrap();
    assert!(id.starts_with("op_") && id.len() == 3 + 52, "{id}");
    assert_eq!(key_id_of(&id).as_deref(), Some(KEY));
    assert_ne!(id, operation_id(KEY, 1_000, 43).unwrap());
    for bad in [
        "",
        "op_",
        "key_01HZX5M3Q7R8S9T0V1W2X3Y4Z5",
        &id[..id.len() - 1],
        &format!("{id}0"),
        &id.to_lowercase(),
        &id.replacen("op_", "op-", 1),
        "op_0000000000000000000000000U0000000000000000000000000",
    ] {
        assert_eq!(key_id_of(bad), None, "{bad}");
    }
    assert_eq!(operation_id("ses:abc", 1, 1), None);
    assert_eq!(operation_id("key_short", 1, 1), None);
}

#[test]
fn the_respond_async_preference_is_read_and_removed() {
    for yes in [
        "respond-async",
        "Respond-Async",
        "wait=10, respond-async",
        "respond-async; x=1",
        " respond-async ,handling=lenient",
    ] {
        assert!(prefers_async(Some(yes)), "{yes}");
    }
    for no in ["", "wait=10", "respond-asynchronously", "return=minimal"] {
        assert!(!prefers_async(Some(no)), "{no}");
    }
    assert!(!prefers_async(None));
    let h = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(
        without_respond_async(&h(&[("Prefer", "respond-async"), ("X-A", "1")])),
        h(&[("X-A", "1")])
    );
    assert_eq!(
        without_respond_async(&h(&[("prefer", "respond-async, wait=5")])),
        h(&[("prefer", "wait=5")])
    );
}

#[test]
fn async_routes_are_mutating_requests_on_a_listed_path() {
    let mut settings = Settings::default();
    settings.async_ops.routes = vec![crate::config::AsyncRoute {
        method: "*".into(),
        path: "/reports/*".into(),
    }];
    assert!(is_async_route(&settings, "POST", "/reports/q3"));
    assert!(is_async_route(&settings, "DELETE", "/reports/q3"));
    assert!(!is_async_route(&settings, "GET", "/reports/q3"));
    assert!(!is_async_route(&settings, "POST", "/orders"));
    assert!(
        !is_async_route(&Settings::default(), "POST", "/reports/q3"),
        "none by default"
    );
}

#[test]
fn a_queued_operation_starts_once_its_delay_passed_and_a_lost_attempt_once_its_lease_ran_out() {
    let o = op();
    let started = run(&o, 1_000).unwrap();
    assert_eq!((started.state, started.attempts), (State::Running, 1));
    assert_eq!(
        started.due_at,
        Some(11_000),
        "the alarm looks at a lost attempt"
    );
    assert_eq!(run(&started, 10_999), None, "a duplicate message");
    let again = run(&started, 11_000).unwrap();
    assert_eq!(again.attempts, 2, "the cut attempt counts");
    let delayed = Operation {
        not_before: 5_000,
        ..o.clone()
    };
    assert_eq!(run(&delayed, 4_999), None, "an early message");
    assert!(run(&delayed, 5_000).is_some());
}

/// Issue 32 #3: attempts cut one after another (a result that cannot be
/// stored, a consumer dying) never run past the schedule: the next start
/// ends the operation instead, once.
#[test]
fn cut_attempts_never_run_past_the_schedule() {
    let max = max_attempts(&SCHEDULE);
    assert_eq!(max, 3);
    let mut o = op();
    let mut now = 1_000;
    for n in 1..=max {
        o = run(&o, now).unwrap();
        assert_eq!(o.attempts, n);
        now += LEASE;
    }
    let Start::End(ended) = start(&o, now, LEASE, max, None) else {
        panic!("a fourth attempt started")
    };
    assert_eq!(
        (ended.state, ended.failure, ended.attempts),
        (State::Failed, Some(NoAnswer::AttemptsSpent), max)
    );
    assert_eq!(ended.view().reason, Some(NoAnswer::AttemptsSpent));
    assert_eq!(start(&ended, now + LEASE, LEASE, max, None), Start::Not);
    match result(&ended, now, 1_000) {
        ResultAnswer::Problem(p) => assert_eq!(p.code, ErrorCode::OperationAbandoned),
        other => panic!("{other:?}"),
    }
}

/// Issue 32 #4: a revoked or expired key's operation ends before its next
/// origin call.
#[test]
fn a_gone_key_ends_its_operation_before_the_next_attempt() {
    let o = run(&op(), 1_000).unwrap();
    let s = settle(&o, 1, &answer(503), &SCHEDULE, 2_000).unwrap();
    for why in [NoAnswer::KeyRevoked, NoAnswer::KeyExpired] {
        assert_eq!(
            start(&s.op, 2_500, LEASE, 3, Some(why)),
            Start::Not,
            "not due yet"
        );
        let Start::End(ended) = start(&s.op, 3_000, LEASE, 3, Some(why)) else {
            panic!("{why:?}: an attempt started")
        };
        assert_eq!((ended.state, ended.failure), (State::Failed, Some(why)));
        assert_eq!(ended.status, Some(503), "the last answer's status stays");
    }
}

/// Issue 32 #3: a final answer that cannot be kept fails the operation at
/// once, whichever attempt brings it: it ran, so it never runs again.
#[test]
fn an_answer_not_kept_fails_the_operation_once() {
    let first = run(&op(), 1_000).unwrap();
    let second = run(&first, 11_000).unwrap();
    let s = settle(
        &second,
        1,
        &Outcome::NotKept { status: 201 },
        &SCHEDULE,
        12_000,
    )
    .unwrap();
    assert!(s.done);
    assert_eq!(
        (s.op.state, s.op.status, s.op.failure),
        (State::Failed, Some(201), Some(NoAnswer::NotKept))
    );
    assert_eq!(settle(&s.op, 2, &answer(201), &SCHEDULE, 13_000), None);
    match result(&s.op, 13_000, 1_000) {
        ResultAnswer::Problem(p) => {
            assert_eq!((p.code, p.status()), (ErrorCode::OperationAbandoned, 410));
            assert!(p.detail.contains("status 201"), "{}", p.detail);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn failures_follow_the_schedule_then_fail_with_the_last_answer() {
    let o = run(&op(), 1_000).unwrap();
    let s = settle(&o, 1, &answer(503), &SCHEDULE, 2_000).unwrap();
    assert!(!s.done);
    assert_eq!(
        (s.op.state, s.op.not_before, s.op.due_at),
        (State::Queued, 3_000, Some(3_000))
    );
    let o = run(&s.op, 3_000).unwrap();
    let s = settle(
        &o,
        2,
        &Outcome::NoAnswer(NoAnswer::Timeout),
        &SCHEDULE,
        4_000,
    )
    .unwrap();
    assert_eq!((s.op.state, s.op.not_before), (State::Queued, 9_000));
    let o = run(&s.op, 9_000).unwrap();
    let s = settle(&o, 3, &answer(502), &SCHEDULE, 9_500).unwrap();
    assert!(s.done);
    assert_eq!((s.op.state, s.op.status), (State::Failed, Some(502)));
    assert_eq!(
        s.op.response.as_ref().map(|r| r.status),
        Some(502),
        "the last answer kept"
    );
    assert_eq!(s.op.expires_at, 9_500 + 60_000);
    assert_eq!(s.op.due_at, None);
    assert!(matches!(result(&s.op, 9_600, 1_000), ResultAnswer::Stored(r) if r.status == 502));
}

#[test]
fn a_final_answer_wins_from_any_attempt_and_a_late_failure_changes_nothing() {
    let first = run(&op(), 1_000).unwrap();
    let second = run(&first, 11_000).unwrap();
    assert_eq!(
        settle(&second, 1, &answer(500), &SCHEDULE, 12_000),
        None,
        "stale failure"
    );
    let s = settle(&second, 1, &answer(201), &SCHEDULE, 12_000).unwrap();
    assert_eq!(
        (s.op.state, s.op.status, s.done),
        (State::Succeeded, Some(201), true)
    );
    assert_eq!(
        settle(&s.op, 2, &answer(200), &SCHEDULE, 13_000),
        None,
        "done is final"
    );
    // A 4xx that §4 stores is a final answer too.
    let s = settle(&first, 1, &answer(422), &SCHEDULE, 2_000).unwrap();
    assert_eq!(s.op.state, State::Succeeded);
    // 409 invites a retry, as under a claim.
    let s = settle(&first, 1, &answer(409), &SCHEDULE, 2_000).unwrap();
    assert_eq!(s.op.state, State::Queued);
}

#[test]
fn the_result_is_not_there_before_the_end_and_a_failure_without_an_answer_is_502() {
    let o = op();
    match result(&o, 1_000, 5_000) {
        ResultAnswer::Problem(p) => {
            assert_eq!(
                (p.code, p.retry_after_s),
                (ErrorCode::OperationNotDone, Some(1))
            );
        }
        other => panic!("{other:?}"),
    }
    let running = run(&o, 1_000).unwrap();
    let failed = settle(
        &Operation {
            attempts: 3,
            ..running
        },
        3,
        &Outcome::NoAnswer(NoAnswer::Unreachable),
        &SCHEDULE,
        2_000,
    )
    .unwrap();
    assert_eq!(failed.op.state, State::Failed);
    match result(&failed.op, 2_000, 5_000) {
        ResultAnswer::Problem(p) => assert_eq!(p.code, ErrorCode::OriginUnreachable),
        other => panic!("{other:?}"),
    }
    let view = failed.op.view();
    assert_eq!((view.status, view.path.as_str()), (None, "/reports"));
}

#[test]
fn the_completion_event_is_named_by_the_operation() {
    let done = settle(
        &run(&op(), 1_000).unwrap(),
        1,
        &answer(201),
        &SCHEDULE,
        2_000,
    )
    .unwrap()
    .op;
    let ev = completed_event(&done);
    assert_eq!(ev.id, format!("evt_{}", done.id));
    assert_eq!(ev.event_type, COMPLETED_EVENT);
    assert_eq!(ev.request_id, "req_1");
    assert_eq!(
        ev.data,
        serde_json::json!({"id": done.id, "state": "succeeded", "status": 201})
    );
}

#[test]
fn the_alarm_hands_a_due_operation_on_once_per_due_time() {
    let o = op();
    assert!(!is_due(&o, 30_999));
    assert!(is_due(&o, 31_000));
    let seen = o.due_at.unwrap();
    let next = requeued(&o, seen, 31_000, 30_000).unwrap();
    assert_eq!(next.due_at, Some(61_000));
    assert_eq!(
        requeued(&next, seen, 31_500, 30_000),
        None,
        "moved meanwhile"
    );
}

#[test]
fn pages_merge_newest_first() {
    let v = |at: u64, id: &str| View {
        id: id.into(),
        state: State::Queued,
        status: None,
        request_id: "r".into(),
        created_at: at,
        completed_at: None,
        method: "POST".into(),
        path: "/".into(),
        attempts: 0,
        reason: None,
    };
    let (page, more) = merge(vec![v(1, "a"), v(3, "c"), v(2, "b"), v(3, "d")], 3);
    let ids: Vec<&str> = page.iter().map(|v| v.id.as_str()).collect();
    assert_eq!((ids, more), (vec!["d", "c", "b"], true));
    let (all, more) = merge(vec![v(1, "a")], 3);
    assert_eq!((all.len(), more), (1, false));
}

/// What a model step does: a consumer starting the operation (the queue
/// delivers at least once, so any number of them), one settling an attempt
/// it started, or time passing.
#[derive(Debug, Clone)]
enum Step {
    Start,
    Settle { which: usize, status: Option<u16> },
    Wait(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        Just(Step::Start),
        (
            0usize..4,
            prop::option::of(prop_oneof![
                Just(201u16),
                Just(404),
                Just(500),
                Just(503),
                Just(429)
            ])
        )
            .prop_map(|(which, status)| Step::Settle { which, status }),
        (0u64..20_000).prop_map(Step::Wait),
    ]
}

proptest! {
    /// Any interleaving of duplicate starts, settles in any order and lease
    /// expiries: done is final and reached once; attempts only grow; an
    /// operation not done is always either running under a lease or queued,
    /// with a time the alarm looks at it again; and it never exceeds the
    /// schedule's attempts plus the ones crashes cut.
    #[test]
    fn an_operation_completes_once_whatever_the_consumers_do(
        steps in prop::collection::vec(step(), 1..60)
    ) {
        let mut o = op();
        let mut now = 1_000u64;
        let mut started: Vec<u32> = Vec::new();
        let mut completions = 0;
        for s in steps {
            let before = o.clone();
            match s {
                Step::Start => {
                    if let Some(next) = run(&o, now) {
                        started.push(next.attempts);
                        o = next;
                    }
                }
                Step::Settle { which, status } => {
                    let Some(attempt) = started.get(which).copied() else { continue };
                    let outcome = match status {
                        Some(code) => answer(code),
                        None => Outcome::NoAnswer(NoAnswer::Unreachable),
                    };
                    if let Some(next) = settle(&o, attempt, &outcome, &SCHEDULE, now) {
                        completions += usize::from(next.done);
                        prop_assert!(next.done == next.op.state.is_done());
                        o = next.op;
                    }
                }
                Step::Wait(ms) => now += ms,
            }
            if before.state.is_done() {
                prop_assert_eq!(&o, &before, "done is final");
            }
            prop_assert!(o.attempts >= before.attempts);
            match o.state {
                State::Running => prop_assert!(o.lease_until.is_some() && o.due_at == o.lease_until),
                State::Queued => prop_assert!(o.due_at.is_some()),
                State::Succeeded | State::Failed => {
                    prop_assert!(o.due_at.is_none() && o.completed_at.is_some());
                    prop_assert_eq!(o.expires_at, o.completed_at.unwrap_or(0) + o.ttl_ms);
                }
            }
            if o.state == State::Succeeded {
                prop_assert!(o.status.is_some_and(crate::idempotency::is_storable_status));
            }
        }
        prop_assert!(completions <= 1);
    }
}
