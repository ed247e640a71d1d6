use super::*;
use proptest::prelude::*;
use std::collections::BTreeSet;

const SCHEDULE: &[u32] = &[60, 900, 3_600, 86_400];
const T0: u64 = 1_700_000_000_000;

fn fresh() -> Delivery {
    Delivery {
        status: Status::Pending,
        attempts_made: 0,
        next_attempt_at: Some(T0),
        subscribed: true,
        held: false,
        in_flight_until: None,
    }
}

/// How long a claimed scheduled attempt is in flight in these tests.
const LEASE: u64 = 40_000;

fn status(code: u16) -> Attempted {
    Attempted::Sent(AttemptResult::Status {
        code,
        retry_after: None,
    })
}

fn claim_of(p: Plan) -> Claim {
    match p {
        Plan::Send(c) | Plan::GiveUp(c, _) => c,
        other => panic!("expected a claim, got {other:?}"),
    }
}

#[test]
fn statuses_round_trip_and_list() {
    for s in Status::ALL {
        assert_eq!(Status::parse(s.as_str()), Some(s));
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            format!("\"{}\"", s.as_str())
        );
    }
    assert_eq!(Status::parse("held"), None);
    assert_eq!(
        Status::list(),
        "pending, delivered, failed, dead_letter, paused"
    );
    assert!(!Status::Paused.in_progress() && !Status::Paused.is_final());
}

#[test]
fn a_held_subscription_holds_scheduled_attempts_and_resume_releases_them() {
    let d = Delivery {
        held: true,
        ..fresh()
    };
    let Plan::Hold(w) = plan(Job::Scheduled { at: T0 }, &d, T0, LEASE) else {
        panic!("expected a hold");
    };
    assert_eq!((w.status, w.next_attempt_at), (Status::Paused, None));
    let paused = Delivery {
        status: Status::Paused,
        next_attempt_at: None,
        ..d
    };
    // Its old scheduled job and a dead-letter-queue job do nothing.
    assert_eq!(
        plan(Job::Scheduled { at: T0 }, &paused, T0, LEASE),
        Plan::Drop(Dropped::Superseded)
    );
    assert_eq!(
        plan(
            Job::DeadLetterQueue { scheduled_at: None },
            &paused,
            T0,
            LEASE
        ),
        Plan::Drop(Dropped::Held)
    );
    // A failed manual attempt keeps the hold; a success delivers.
    let c = claim_of(plan(Job::ManualRetry, &paused, T0, LEASE));
    assert_eq!(c.attempt.mode, Mode::Final);
    let seen = c.claimed(&paused);
    assert_eq!(
        settle(&seen, &c.attempt, &status(500), SCHEDULE, T0).write,
        None
    );
    let ok = settle(&seen, &c.attempt, &status(200), SCHEDULE, T0).write;
    assert_eq!(ok.map(|w| w.status), Some(Status::Delivered));
    let r = release(&paused, T0 + 5).unwrap();
    assert_eq!(
        (r.status, r.next_attempt_at),
        (Status::Pending, Some(T0 + 5))
    );
    assert_eq!(release(&fresh(), T0), None);
}

#[test]
fn jobs_from_messages() {
    assert_eq!(
        Job::from_message(Some(5), false, false, false),
        Some(Job::Scheduled { at: 5 })
    );
    assert_eq!(
        Job::from_message(None, true, false, false),
        Some(Job::ManualRetry)
    );
    assert_eq!(
        Job::from_message(None, true, true, false),
        Some(Job::Redirect)
    );
    assert_eq!(Job::from_message(None, false, false, false), None);
    assert_eq!(
        Job::from_message(Some(5), false, false, true),
        Some(Job::DeadLetterQueue {
            scheduled_at: Some(5)
        })
    );
    assert_eq!(
        Job::from_message(None, true, false, true),
        Some(Job::DeadLetterQueue { scheduled_at: None })
    );
    assert_eq!(Job::from_message(None, true, true, true), None);
}

#[test]
fn a_scheduled_job_runs_only_as_the_next_attempt() {
    let d = fresh();
    let c = claim_of(plan(Job::Scheduled { at: T0 }, &d, T0, LEASE));
    assert_eq!(
        c.expect,
        Expect {
            status: Status::Pending,
            attempts_made: 0
        }
    );
    assert_eq!(c.attempt.number, 1);
    assert_eq!(c.attempt.mode, Mode::Schedule);
    assert_eq!(
        plan(Job::Scheduled { at: T0 + 1 }, &d, T0, LEASE),
        Plan::Drop(Dropped::Superseded)
    );
    // A long delay arrives early: another hop, at most the queue's maximum.
    let far = T0 + 86_400_000;
    let d2 = Delivery {
        next_attempt_at: Some(far),
        ..d
    };
    assert_eq!(
        plan(Job::Scheduled { at: far }, &d2, T0, LEASE),
        Plan::Wait { delay_s: 43_200 }
    );
    assert_eq!(
        plan(Job::Scheduled { at: far }, &d2, far - 1_500, LEASE),
        Plan::Wait { delay_s: 2 }
    );
    assert!(matches!(
        plan(Job::Scheduled { at: far }, &d2, far - 1_000, LEASE),
        Plan::Send(_)
    ));
    let gone = Delivery {
        subscribed: false,
        ..d
    };
    assert!(matches!(
        plan(Job::Scheduled { at: T0 }, &gone, T0, LEASE),
        Plan::GiveUp(_, GiveUp::SubscriptionDeleted)
    ));
}

#[test]
fn delivered_is_never_sent_again_but_by_a_redirect() {
    let d = Delivery {
        status: Status::Delivered,
        attempts_made: 2,
        next_attempt_at: None,
        subscribed: true,
        held: false,
        in_flight_until: None,
    };
    assert_eq!(
        plan(Job::ManualRetry, &d, T0, LEASE),
        Plan::Drop(Dropped::AlreadyDelivered)
    );
    assert_eq!(
        plan(Job::Scheduled { at: T0 }, &d, T0, LEASE),
        Plan::Drop(Dropped::Superseded)
    );
    assert_eq!(
        plan(Job::DeadLetterQueue { scheduled_at: None }, &d, T0, LEASE),
        Plan::Drop(Dropped::Finished)
    );
    let c = claim_of(plan(Job::Redirect, &d, T0, LEASE));
    assert_eq!((c.attempt.number, c.attempt.mode), (3, Mode::Redirect));
    let t = settle(&c.claimed(&d), &c.attempt, &status(500), SCHEDULE, T0);
    assert_eq!(
        t,
        Transition {
            write: None,
            follow_up: None
        }
    );
}

#[test]
fn a_late_failure_never_overwrites_delivered() {
    // A slow scheduled attempt (1) and a manual retry (2) run at once.
    let d = fresh();
    let slow = claim_of(plan(Job::Scheduled { at: T0 }, &d, T0, LEASE));
    let d1 = slow.claimed(&d);
    let fast = claim_of(plan(Job::ManualRetry, &d1, T0, LEASE));
    assert_eq!(fast.attempt.number, 2);
    let d2 = fast.claimed(&d1);
    let ok = settle(&d2, &fast.attempt, &status(200), SCHEDULE, T0 + 10);
    let w = ok.write.unwrap();
    assert_eq!((w.expect.attempts_made, w.status), (2, Status::Delivered));
    let delivered = Delivery {
        status: Status::Delivered,
        next_attempt_at: None,
        ..d2
    };
    // The slow one settles on the stale snapshot: its compare-and-set loses,
    // and settled again on the fresh one it writes nothing.
    let stale = settle(&d1, &slow.attempt, &status(503), SCHEDULE, T0 + 20);
    assert_ne!(stale.write.unwrap().expect, Expect::of(&delivered));
    let again = settle(&delivered, &slow.attempt, &status(503), SCHEDULE, T0 + 20);
    assert_eq!(
        again,
        Transition {
            write: None,
            follow_up: None
        }
    );
}

#[test]
fn an_earlier_success_wins_over_a_later_failure() {
    let d = fresh();
    let fast = claim_of(plan(Job::ManualRetry, &d, T0, LEASE));
    let d1 = fast.claimed(&d);
    let slow = claim_of(plan(Job::Scheduled { at: T0 }, &d1, T0, LEASE));
    let d2 = slow.claimed(&d1);
    // The later one fails first and moves the schedule…
    let t = settle(&d2, &slow.attempt, &status(503), SCHEDULE, T0 + 5);
    let w = t.write.unwrap();
    assert_eq!(
        (w.status, t.follow_up.unwrap().delay_s),
        (Status::Failed, 900)
    );
    let failed = Delivery {
        status: Status::Failed,
        next_attempt_at: w.next_attempt_at,
        ..d2
    };
    // …then the earlier one's success still delivers.
    let t = settle(&failed, &fast.attempt, &status(204), SCHEDULE, T0 + 9);
    assert_eq!(t.write.unwrap().status, Status::Delivered);
    assert_eq!(t.write.unwrap().expect, Expect::of(&failed));
}

#[test]
fn manual_retry_of_a_dead_letter() {
    let d = Delivery {
        status: Status::DeadLetter,
        attempts_made: 5,
        next_attempt_at: None,
        subscribed: true,
        held: false,
        in_flight_until: None,
    };
    let c = claim_of(plan(Job::ManualRetry, &d, T0, LEASE));
    assert_eq!((c.attempt.number, c.attempt.mode), (6, Mode::Final));
    let d1 = c.claimed(&d);
    assert_eq!(
        settle(&d1, &c.attempt, &status(500), SCHEDULE, T0).write,
        None
    );
    assert_eq!(
        settle(&d1, &c.attempt, &status(200), SCHEDULE, T0)
            .write
            .unwrap()
            .status,
        Status::Delivered
    );
}

// ---------------------------------------------------------------------------------------------
// Property tests: a model of the queue, the consumers and the database.

fn any_result() -> impl Strategy<Value = AttemptResult> {
    prop_oneof![
        4 => (200u16..300).prop_map(|code| AttemptResult::Status { code, retry_after: None }),
        4 => prop_oneof![Just(500u16), Just(503), Just(302), Just(100)]
            .prop_map(|code| AttemptResult::Status { code, retry_after: None }),
        2 => proptest::option::of("[0-9]{1,7}")
            .prop_map(|retry_after| AttemptResult::Status { code: 429, retry_after }),
        1 => prop_oneof![Just(400u16), Just(401), Just(410), Just(422)]
            .prop_map(|code| AttemptResult::Status { code, retry_after: None }),
        2 => Just(AttemptResult::Timeout),
        1 => Just(AttemptResult::NetworkError),
    ]
}

#[derive(Debug, Clone)]
enum Step {
    /// A consumer takes a queued job and loads its delivery.
    Load(usize),
    /// A consumer plans a loaded job on what it loaded (maybe stale by now),
    /// claims with compare-and-set, and starts sending.
    Claim(usize),
    /// An attempt under way finishes: settle, compare-and-set (re-settled on
    /// the fresh row when it loses).
    Finish(usize, AttemptResult),
    ManualRetry,
    Redirect,
    /// The queue delivers a message twice.
    Duplicate(usize),
    /// The consumer failed on a message max_retries times: to the DLQ.
    DeadLetter(usize),
    DeleteSubscription,
    /// Pause (or disable) the subscription.
    Pause,
    /// Resume it: active again, then every `paused` delivery released.
    Resume,
    Advance(u64),
}

fn any_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => any::<usize>().prop_map(Step::Load),
        4 => any::<usize>().prop_map(Step::Claim),
        6 => (any::<usize>(), any_result()).prop_map(|(i, r)| Step::Finish(i, r)),
        2 => Just(Step::ManualRetry),
        1 => Just(Step::Redirect),
        1 => any::<usize>().prop_map(Step::Duplicate),
        1 => any::<usize>().prop_map(Step::DeadLetter),
        1 => prop_oneof![Just(Step::DeleteSubscription), Just(Step::Advance(0))],
        2 => prop_oneof![Just(Step::Pause), Just(Step::Resume)],
        3 => (0u64..100_000_000).prop_map(Step::Advance),
    ]
}

/// An attempt under way: the claim, what to report, the row as the
/// consumer saw it right after claiming, whether a scheduled job claimed it,
/// and its lease.
type Flying = (Attempt, Option<GiveUp>, Delivery, bool, Option<u64>);

struct Model {
    row: Delivery,
    now: u64,
    queue: Vec<Job>,
    /// Jobs taken by a consumer, with the row as it loaded it.
    loaded: Vec<(Job, Delivery)>,
    /// Attempts under way.
    flying: Vec<Flying>,
    claimed: BTreeSet<u32>,
}

impl Model {
    fn new() -> Model {
        Model {
            row: fresh(),
            now: T0,
            queue: vec![Job::Scheduled { at: T0 }],
            loaded: Vec::new(),
            flying: Vec::new(),
            claimed: BTreeSet::new(),
        }
    }

    fn cas(&mut self, w: &Write) -> bool {
        if Expect::of(&self.row) != w.expect {
            return false;
        }
        // The hold also requires the subscription still not active.
        if w.status == Status::Paused && !self.row.held {
            return false;
        }
        self.row.status = w.status;
        self.row.next_attempt_at = w.next_attempt_at;
        self.row.in_flight_until = None;
        true
    }

    fn load(&mut self, i: usize) {
        if !self.queue.is_empty() {
            let job = self.queue.remove(i % self.queue.len());
            self.loaded.push((job, self.row));
        }
    }

    fn claim(&mut self, i: usize) -> Result<(), TestCaseError> {
        if self.loaded.is_empty() {
            return Ok(());
        }
        let (job, seen) = self.loaded.remove(i % self.loaded.len());
        match plan(job, &seen, self.now, LEASE) {
            Plan::Send(c) | Plan::GiveUp(c, _) if Expect::of(&self.row) != c.expect => {
                self.queue.push(job); // lost the claim: runs again later
            }
            p @ (Plan::Send(c) | Plan::GiveUp(c, _)) => {
                prop_assert_eq!(c.attempt.number, self.row.attempts_made + 1);
                // One send per scheduled attempt: while one is in flight
                // (its lease not over), no other copy of a scheduled job sends.
                if matches!(job, Job::Scheduled { .. }) {
                    let now = self.now;
                    prop_assert!(
                        self.flying.iter().all(|(_, _, _, sched, until)| !sched || until.is_none_or(|u| u <= now)),
                        "a second scheduled send while one is in flight"
                    );
                }
                prop_assert!(
                    self.claimed.insert(c.attempt.number),
                    "number {} reused",
                    c.attempt.number
                );
                prop_assert!(self.claimed.iter().all(|n| *n <= c.attempt.number));
                if self.row.status == Status::Delivered {
                    prop_assert_eq!(
                        c.attempt.mode,
                        Mode::Redirect,
                        "delivered is only redirected"
                    );
                    prop_assert!(matches!(p, Plan::Send(_)));
                }
                self.row = c.claimed(&self.row);
                let gave_up = match p {
                    Plan::GiveUp(_, g) => Some(g),
                    _ => None,
                };
                let scheduled = matches!(job, Job::Scheduled { .. });
                self.flying
                    .push((c.attempt, gave_up, self.row, scheduled, c.in_flight_until));
            }
            Plan::Wait { delay_s } => {
                prop_assert!((1..=retry::MAX_QUEUE_DELAY_S).contains(&delay_s));
                self.queue.push(job);
            }
            Plan::Hold(w) => {
                prop_assert!(seen.held);
                if !self.cas(&w) {
                    self.queue.push(job); // runs again on a fresh read
                }
            }
            Plan::Drop(_) => {}
        }
        Ok(())
    }

    fn finish(&mut self, i: usize, r: AttemptResult) -> Result<(), TestCaseError> {
        if self.flying.is_empty() {
            return Ok(());
        }
        let (attempt, gave_up, seen, _, _) = self.flying.remove(i % self.flying.len());
        let result = gave_up.map_or(Attempted::Sent(r), Attempted::GaveUp);
        // The first settle uses the row as the consumer saw it after its
        // claim (stale if another attempt wrote since); a lost write re-reads
        // and settles again, which then applies (nothing runs in between here).
        let mut snapshot = seen;
        for round in 0..2 {
            let t = settle(&snapshot, &attempt, &result, SCHEDULE, self.now);
            if let Some(f) = t.follow_up {
                self.queue.push(Job::Scheduled { at: f.at });
            }
            let Some(w) = t.write else { return Ok(()) };
            if self.cas(&w) {
                return Ok(());
            }
            prop_assert_eq!(round, 0, "a write on a fresh row applies");
            snapshot = self.row;
        }
        Ok(())
    }

    fn resume(&mut self) {
        self.row.held = false;
        if let Some(w) = release(&self.row, self.now) {
            assert!(self.cas(&w), "a release on the fresh row applies");
            self.queue.push(Job::Scheduled { at: self.now });
        }
    }

    fn check(&self, before: &Delivery) -> Result<(), TestCaseError> {
        let row = &self.row;
        // Held only while the subscription is not active; never lost.
        if row.status == Status::Paused {
            prop_assert!(row.held, "paused under an active subscription");
        }
        if before.status == Status::Paused && row.status != Status::Paused {
            prop_assert!(
                matches!(row.status, Status::Pending | Status::Delivered),
                "paused → {:?}",
                row.status
            );
        }
        if before.status == Status::Delivered {
            prop_assert_eq!(row.status, Status::Delivered, "delivered stays delivered");
        }
        if before.status.is_final() {
            prop_assert!(
                row.status.is_final(),
                "{:?} → {:?}",
                before.status,
                row.status
            );
        }
        prop_assert!(row.attempts_made >= before.attempts_made);
        prop_assert_eq!(
            self.claimed.iter().next_back().copied().unwrap_or(0),
            row.attempts_made
        );
        match row.status {
            Status::Failed | Status::Pending => prop_assert!(row.next_attempt_at.is_some()),
            Status::Delivered | Status::DeadLetter | Status::Paused => {
                prop_assert_eq!(row.next_attempt_at, None)
            }
        }
        // Never stuck: a delivery still in progress has its next attempt
        // queued (or taken by a consumer), or an attempt under way.
        if row.status.in_progress() && self.flying.is_empty() {
            let at = row.next_attempt_at;
            prop_assert!(
                self.queue
                    .iter()
                    .chain(self.loaded.iter().map(|(j, _)| j))
                    .any(|j| matches!(j, Job::Scheduled { at: a } if Some(*a) == at)
                        || matches!(j, Job::DeadLetterQueue { scheduled_at: a } if *a == at)),
                "no job for the next attempt {:?}: {:?}",
                at,
                self.queue
            );
        }
        Ok(())
    }
}

/// How many cases each property runs (reported in the closing note).
const CASES: u32 = 2_048;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn any_interleaving_keeps_the_rules(steps in proptest::collection::vec(any_step(), 1..120)) {
        let mut m = Model::new();
        for step in steps {
            let before = m.row;
            match step {
                Step::Load(i) => m.load(i),
                Step::Claim(i) => m.claim(i)?,
                Step::Finish(i, r) => m.finish(i, r)?,
                Step::ManualRetry => m.queue.push(Job::ManualRetry),
                Step::Redirect => m.queue.push(Job::Redirect),
                Step::Duplicate(i) if !m.queue.is_empty() => {
                    let j = m.queue[i % m.queue.len()];
                    m.queue.push(j);
                }
                Step::DeadLetter(i) if !m.queue.is_empty() => {
                    let j = m.queue.remove(i % m.queue.len());
                    let moved = match j {
                        Job::Scheduled { at } => Job::from_message(Some(at), false, false, true),
                        Job::ManualRetry => Job::from_message(None, true, false, true),
                        Job::Redirect => Job::from_message(None, true, true, true),
                        dlq @ Job::DeadLetterQueue { .. } => Some(dlq),
                    };
                    m.queue.extend(moved);
                }
                Step::Duplicate(_) | Step::DeadLetter(_) => {}
                Step::DeleteSubscription => m.row.subscribed = false,
                Step::Pause => m.row.held = true,
                Step::Resume => m.resume(),
                Step::Advance(ms) => m.now += ms,
            }
            m.check(&before)?;
        }
    }

    /// One attempt at a time, scheduled jobs only, each run when due: the
    /// schedule, Retry-After and the 4xx rule are followed exactly, and the
    /// delivery ends within the schedule's attempts.
    #[test]
    fn sequential_attempts_follow_the_schedule(
        schedule in proptest::collection::vec(1u32..=86_400, 0..=6),
        results in proptest::collection::vec(any_result(), 8),
    ) {
        let max = retry::max_attempts(&schedule);
        let cap = u64::from(schedule.iter().copied().max().unwrap_or(1));
        let mut d = fresh();
        let mut now = T0;
        let mut job = Job::Scheduled { at: T0 };
        for (i, r) in results.iter().enumerate() {
            let n = u32::try_from(i).unwrap() + 1;
            let c = claim_of(plan(job, &d, now, LEASE));
            prop_assert_eq!(c.attempt.number, n);
            d = c.claimed(&d);
            now += 10;
            let t = settle(&d, &c.attempt, &Attempted::Sent(r.clone()), &schedule, now);
            let w = t.write.unwrap();
            prop_assert!(n <= max);
            d.status = w.status;
            d.next_attempt_at = w.next_attempt_at;
            match (r, w.status) {
                (AttemptResult::Status { code: 200..=299, .. }, s) => {
                    prop_assert_eq!(s, Status::Delivered);
                    break;
                }
                (AttemptResult::Status { code: 400..=499, .. }, Status::DeadLetter)
                    if !matches!(r, AttemptResult::Status { code: 429, .. }) => break,
                (_, Status::DeadLetter) => {
                    prop_assert_eq!(n, max, "dead-letter only after the last scheduled failure");
                    break;
                }
                (AttemptResult::Status { code: 429, .. }, Status::Failed) => {
                    let f = t.follow_up.unwrap();
                    prop_assert_eq!(Some(f.at), w.next_attempt_at);
                    let delay = (f.at - now) / 1_000;
                    prop_assert!((1..=cap).contains(&delay), "Retry-After bounded: {} not in 1..={}", delay, cap);
                }
                (AttemptResult::Status { code: 400..=499, .. }, s) => {
                    prop_assert!(false, "4xx → {:?}", s);
                }
                (_, Status::Failed) => {
                    let f = t.follow_up.unwrap();
                    let i = usize::try_from(n - 1).unwrap();
                    prop_assert_eq!(f.at - now, u64::from(schedule[i]) * 1_000, "the schedule's delay");
                }
                (_, s) => prop_assert!(false, "unexpected {:?}", s),
            }
            let f = t.follow_up.unwrap();
            job = Job::Scheduled { at: f.at };
            // Chained hops until due.
            while let Plan::Wait { delay_s } = plan(job, &d, now, LEASE) {
                now += delay_s * 1_000;
            }
            now = now.max(f.at);
        }
        prop_assert!(d.attempts_made <= max);
    }
}

mod batches {
    use super::super::{place_batch, Place};
    use proptest::prelude::*;

    #[derive(Debug, Clone, PartialEq)]
    struct J {
        delivery: String,
        attempt: u32,
        manual: bool,
    }

    fn places(jobs: &[J]) -> Vec<Place> {
        place_batch(jobs, |j| &j.delivery, |j| j.manual)
    }

    #[test]
    fn copies_are_acknowledged_and_contenders_wait() {
        let j = |d: &str, attempt, manual| J {
            delivery: d.into(),
            attempt,
            manual,
        };
        let jobs = [
            j("a", 1, false),
            j("a", 1, false),
            j("a", 2, false),
            j("b", 1, false),
            j("b", 1, true),
            j("b", 1, true),
        ];
        assert_eq!(
            places(&jobs),
            [
                Place::Run,
                Place::Copy,
                Place::Later,
                Place::Run,
                Place::Later,
                Place::Later
            ]
        );
    }

    proptest! {
        #[test]
        fn one_job_per_delivery_runs_and_nothing_is_lost(
            raw in proptest::collection::vec((0u8..4, 1u32..3, any::<bool>()), 0..40)
        ) {
            let jobs: Vec<J> = raw
                .into_iter()
                .map(|(d, attempt, manual)| J { delivery: format!("d{d}"), attempt, manual })
                .collect();
            let p = places(&jobs);
            prop_assert_eq!(p.len(), jobs.len());
            for (i, (job, place)) in jobs.iter().zip(&p).enumerate() {
                let runs_before: Vec<&J> = jobs[..i].iter().zip(&p[..i]).filter(|(_, q)| **q == Place::Run).map(|(j, _)| j).collect();
                match place {
                    Place::Run => prop_assert!(runs_before.iter().all(|r| r.delivery != job.delivery), "two runs of one delivery"),
                    Place::Copy => prop_assert!(!job.manual && runs_before.contains(&job), "a copy of nothing running"),
                    Place::Later => prop_assert!(runs_before.iter().any(|r| r.delivery == job.delivery), "waits for nothing"),
                }
            }
        }
    }
}
