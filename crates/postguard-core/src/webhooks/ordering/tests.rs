use super::*;
use crate::webhooks::delivery::{settle, Attempt, Attempted, Expect, GiveUp, Write};
use crate::webhooks::retry::AttemptResult;
use crate::webhooks::shard::{self, delivery_id, ShardKey};
use proptest::prelude::*;
use std::collections::BTreeSet;

const T0: u64 = 1_700_000_000_000;
const LEASE: u64 = 40_000;
const PROJECT: &str = "acme";

fn lane(sub: usize, key: &str) -> Lane {
    Lane {
        subscription_id: format!("sub_{sub}"),
        ordering_key: key.to_string(),
    }
}

fn link(l: &Lane, id: &str) -> NewLink {
    NewLink {
        lane: l.clone(),
        delivery_id: id.to_string(),
    }
}

fn fresh(at: u64) -> Delivery {
    Delivery {
        status: Status::Pending,
        attempts_made: 0,
        next_attempt_at: Some(at),
        subscribed: true,
        held: false,
        in_flight_until: None,
    }
}

fn view(status: Status, next: Option<u64>, in_flight: Option<u64>) -> PredView {
    PredView {
        status,
        next_attempt_at: next,
        in_flight_until: in_flight,
        blocked_by: None,
    }
}

#[test]
fn keys_are_visible_ascii() {
    for ok in [
        "a",
        "order_42",
        "cus:9/invoices",
        "~!@#$%^&*()",
        &"k".repeat(128),
    ] {
        assert!(is_valid_key(ok), "{ok}");
    }
    for bad in ["", " ", "a b", "a\tb", "é", "a\u{7f}", &"k".repeat(129)] {
        assert!(!is_valid_key(bad), "{bad:?}");
    }
}

#[test]
fn a_lane_chains_in_publish_order_and_forgets_what_was_stored() {
    let mut s = MemoryLanes::default();
    let (a, b) = (lane(1, "order_1"), lane(1, "order_2"));
    let links = chain(
        &mut s,
        &[
            link(&a, "d1"),
            link(&b, "e1"),
            link(&a, "d2"),
            link(&a, "d3"),
        ],
        T0,
    )
    .unwrap();
    let by: Vec<(u64, Option<&str>)> = links
        .iter()
        .map(|l| (l.seq, l.blocked_by.as_deref()))
        .collect();
    assert_eq!(
        by,
        vec![(1, None), (1, None), (2, Some("d1")), (3, Some("d2"))]
    );
    // Another subscription, same key: another lane.
    let other = chain(&mut s, &[link(&lane(2, "order_1"), "x1")], T0).unwrap();
    assert_eq!(other[0].blocked_by, None);
    // A repeated call answers the same.
    let again = chain(&mut s, &[link(&a, "d2")], T0 + 5).unwrap();
    assert_eq!(
        (again[0].seq, again[0].blocked_by.as_deref()),
        (2, Some("d1"))
    );
    assert_eq!(s.lanes[&a].seq, 3);

    let stored = |id: &str, stored| Committed {
        lane: a.clone(),
        delivery_id: id.to_string(),
        stored,
    };
    committed(&mut s, &[stored("d1", true), stored("d2", true)]).unwrap();
    assert_eq!(reservation(&mut s, &a, "d1").unwrap(), None);
    assert_eq!(
        reservation(&mut s, &a, "d3").unwrap().map(|r| r.prev),
        Some(Some("d2".to_string()))
    );
    // d3 was not stored and is the tail: the tail goes back to d2, and d3 is
    // remembered as abandoned, with whom it followed.
    committed(&mut s, &[stored("d3", false)]).unwrap();
    assert_eq!(s.lanes[&a].tail.as_deref(), Some("d2"));
    let r = reservation(&mut s, &a, "d3").unwrap().unwrap();
    assert!(r.abandoned);
    let next = chain(&mut s, &[link(&a, "d4")], T0 + 10).unwrap();
    assert_eq!(
        (next[0].seq, next[0].blocked_by.as_deref()),
        (4, Some("d2"))
    );
    // Unknown lanes and ids are ignored.
    committed(&mut s, &[stored("nope", true)]).unwrap();
    committed(
        &mut s,
        &[Committed {
            lane: lane(9, "z"),
            delivery_id: "z".into(),
            stored: false,
        }],
    )
    .unwrap();
    assert!(!s.lanes.contains_key(&lane(9, "z")));
}

#[test]
fn an_abandoned_reservation_that_is_not_the_tail_is_followed_not_restored() {
    let mut s = MemoryLanes::default();
    let a = lane(1, "k");
    chain(
        &mut s,
        &[link(&a, "p"), link(&a, "ghost"), link(&a, "y")],
        T0,
    )
    .unwrap();
    committed(
        &mut s,
        &[Committed {
            lane: a.clone(),
            delivery_id: "ghost".into(),
            stored: false,
        }],
    )
    .unwrap();
    assert_eq!(s.lanes[&a].tail.as_deref(), Some("y"));
    let missing = Predecessor::Missing {
        read_at: T0,
        reservation: reservation(&mut s, &a, "ghost").unwrap(),
    };
    assert_eq!(
        gate(T0, &missing, T0),
        Gate::Rechain {
            blocked_by: "p".into()
        }
    );
}

#[test]
fn open_reservations_are_bounded_and_idle_lanes_pruned() {
    let mut s = MemoryLanes::default();
    let a = lane(1, "k");
    let many: Vec<NewLink> = (0..MAX_OPEN + 10)
        .map(|i| link(&a, &format!("d{i}")))
        .collect();
    chain(&mut s, &many, T0).unwrap();
    let st = &s.lanes[&a];
    assert_eq!(st.open.len(), MAX_OPEN);
    assert_eq!(st.open[0].delivery_id, "d10");
    assert_eq!(st.seq, (MAX_OPEN + 10) as u64);
    chain(&mut s, &[link(&lane(2, "k"), "late")], T0 + 1_000).unwrap();
    assert_eq!(prune(&mut s, T0 + 1, 10).unwrap(), 1);
    assert!(!s.lanes.contains_key(&a));
    assert!(s.lanes.contains_key(&lane(2, "k")));
    assert_eq!(prune(&mut s, T0 + 1, 10).unwrap(), 0);
}

#[test]
fn the_gate() {
    let now = T0 + 10_000;
    let found = |p| gate(T0, &Predecessor::Found(p), now);
    assert_eq!(found(view(Status::Delivered, None, None)), Gate::Open);
    assert_eq!(found(view(Status::DeadLetter, None, None)), Gate::Open);
    // Settled without its turn: its own predecessor is waited on instead.
    let skipped = PredView {
        blocked_by: Some("p0".into()),
        ..view(Status::DeadLetter, None, None)
    };
    assert_eq!(
        found(skipped),
        Gate::Rechain {
            blocked_by: "p0".into()
        }
    );
    // In flight: until its lease ends, at most RECHECK_S.
    assert_eq!(
        found(view(Status::Pending, Some(T0), Some(now + 4_500))),
        Gate::Blocked { delay_s: 5 }
    );
    assert_eq!(
        found(view(Status::Pending, Some(T0), Some(now + 600_000))),
        Gate::Blocked { delay_s: RECHECK_S }
    );
    // Failed, retried in 15 min: look again just after that attempt.
    assert_eq!(
        found(view(Status::Failed, Some(now + 900_000), None)),
        Gate::Blocked {
            delay_s: 900 + RECHECK_MARGIN_MS / 1_000
        }
    );
    // Retried in 24 h: one queue hop at a time.
    assert_eq!(
        found(view(Status::Failed, Some(now + 86_400_000), None)),
        Gate::Blocked {
            delay_s: retry::MAX_QUEUE_DELAY_S
        }
    );
    // Itself blocked: it will wake us; look rarely.
    let behind = PredView {
        blocked_by: Some("p0".into()),
        ..view(Status::Pending, Some(T0), None)
    };
    assert_eq!(
        found(behind),
        Gate::Blocked {
            delay_s: RECHECK_BEHIND_S
        }
    );
    // Due now (its job in the queue), or paused (a resume under way).
    for p in [
        view(Status::Pending, Some(T0), None),
        view(Status::Paused, None, None),
        view(Status::Failed, Some(now), Some(now)),
    ] {
        assert_eq!(found(p), Gate::Blocked { delay_s: RECHECK_S });
    }

    // Missing: may it still be stored?
    let r = |abandoned, prev: Option<&str>| Reservation {
        delivery_id: "g".into(),
        seq: 3,
        prev: prev.map(str::to_owned),
        at: T0 - 5,
        abandoned,
    };
    let missing = |read_at, reservation| Predecessor::Missing {
        read_at,
        reservation,
    };
    let window_end = T0 + COMMIT_WINDOW_MS;
    assert_eq!(
        gate(
            T0,
            &missing(T0 + 1_000, Some(r(false, Some("p")))),
            T0 + 1_000
        ),
        Gate::Blocked { delay_s: RECHECK_S }
    );
    assert_eq!(
        gate(T0, &missing(T0, None), window_end - 2_000),
        Gate::Blocked { delay_s: 2 }
    );
    assert_eq!(
        gate(
            T0,
            &missing(window_end, Some(r(false, Some("p")))),
            window_end
        ),
        Gate::Rechain {
            blocked_by: "p".into()
        }
    );
    assert_eq!(
        gate(T0, &missing(window_end, Some(r(false, None))), window_end),
        Gate::Open
    );
    assert_eq!(gate(T0, &missing(window_end, None), window_end), Gate::Open);
    // Abandoned: no need to wait the window out.
    assert_eq!(
        gate(T0, &missing(T0, Some(r(true, Some("p")))), T0),
        Gate::Rechain {
            blocked_by: "p".into()
        }
    );
    // The read time decides, not the time the decision is applied: a read
    // before the window's end says nothing about a commit after it.
    assert!(matches!(
        gate(T0, &missing(window_end - 1, None), window_end + 60_000),
        Gate::Blocked { .. }
    ));
    // A reservation later than the successor's publish (clock skew) moves
    // the window.
    let late = Reservation {
        at: T0 + 10_000,
        ..r(false, None)
    };
    assert!(matches!(
        gate(T0, &missing(window_end, Some(late)), window_end),
        Gate::Blocked { .. }
    ));
}

#[test]
fn plan_gates_sends_to_the_subscription_only() {
    let d = fresh(T0);
    let job = Job::Scheduled { at: T0 };
    let unordered = Order {
        blocked_by: None,
        created_at: T0,
        predecessor: None,
    };
    assert_eq!(
        plan(job, &d, &unordered, T0, LEASE),
        Ordered::Plan {
            plan: delivery::plan(job, &d, T0, LEASE),
            unblock: false
        }
    );
    let mut order = Order {
        blocked_by: Some("dlv_p"),
        ..unordered
    };
    assert_eq!(
        plan(job, &d, &order, T0, LEASE),
        Ordered::Read {
            predecessor: "dlv_p".into()
        }
    );
    let busy = Predecessor::Found(view(Status::Failed, Some(T0 + 60_000), None));
    order.predecessor = Some(&busy);
    for j in [job, Job::ManualRetry] {
        assert_eq!(
            plan(j, &d, &order, T0, LEASE),
            Ordered::Blocked {
                by: "dlv_p".into(),
                delay_s: 65
            },
            "{j:?}"
        );
    }
    // A blocked delivery that is dead-lettered (manual retry: Mode::Final) or
    // paused still waits for its turn.
    for status in [Status::DeadLetter, Status::Paused] {
        let d = Delivery {
            status,
            next_attempt_at: None,
            ..d
        };
        assert!(matches!(
            plan(Job::ManualRetry, &d, &order, T0, LEASE),
            Ordered::Blocked { .. }
        ));
    }
    // A redirect goes elsewhere; a give-up, a hold, a wait send nothing.
    assert!(matches!(
        plan(Job::Redirect, &d, &order, T0, LEASE),
        Ordered::Plan {
            plan: Plan::Send(_),
            unblock: false
        }
    ));
    assert!(matches!(
        plan(
            Job::DeadLetterQueue {
                scheduled_at: Some(T0)
            },
            &d,
            &order,
            T0,
            LEASE
        ),
        Ordered::Plan {
            plan: Plan::GiveUp(..),
            unblock: false
        }
    ));
    let held = Delivery { held: true, ..d };
    assert!(matches!(
        plan(job, &held, &order, T0, LEASE),
        Ordered::Plan {
            plan: Plan::Hold(_),
            unblock: false
        }
    ));
    let later = Job::Scheduled { at: T0 + 3_600_000 };
    let d_later = fresh(T0 + 3_600_000);
    assert!(matches!(
        plan(later, &d_later, &order, T0, LEASE),
        Ordered::Plan {
            plan: Plan::Wait { .. },
            unblock: false
        }
    ));
    // Settled: go, and the claim clears blocked_by.
    let done = Predecessor::Found(view(Status::Delivered, None, None));
    order.predecessor = Some(&done);
    assert!(matches!(
        plan(job, &d, &order, T0, LEASE),
        Ordered::Plan {
            plan: Plan::Send(_),
            unblock: true
        }
    ));
    // Never stored: wait on its predecessor instead.
    let ghost = Predecessor::Missing {
        read_at: T0,
        reservation: Some(Reservation {
            delivery_id: "dlv_p".into(),
            seq: 2,
            prev: Some("dlv_o".into()),
            at: T0,
            abandoned: true,
        }),
    };
    order.predecessor = Some(&ghost);
    assert_eq!(
        plan(job, &d, &order, T0, LEASE),
        Ordered::Rechain {
            from: "dlv_p".into(),
            to: "dlv_o".into()
        }
    );
}

#[test]
fn the_predecessor_is_found_by_its_id_across_a_bucket() {
    let yesterday = ShardKey::of(PROJECT, T0 - 86_400_000, shard::DAY_MS);
    let id = delivery_id(&yesterday, 7);
    assert_eq!(predecessor_shard(PROJECT, &id), Some(yesterday));
    assert_eq!(predecessor_shard(PROJECT, "not-an-id"), None);
    assert!(wakes(Status::Failed, Status::DeadLetter));
    assert!(wakes(Status::Pending, Status::Delivered));
    assert!(!wakes(Status::DeadLetter, Status::Delivered));
    assert!(!wakes(Status::Pending, Status::Failed));
    assert!(!wakes(Status::Failed, Status::Paused));
}

/// The end-to-end scenario of the issue, on the core: K's first delivery
/// fails and holds K's next two, in order, while L's goes.
#[test]
fn a_failing_first_event_holds_its_key_but_not_another() {
    let mut lanes = MemoryLanes::default();
    let (k, l) = (lane(1, "K"), lane(1, "L"));
    let ids = ["k1", "l1", "k2", "k3"];
    let links = chain(
        &mut lanes,
        &[
            link(&k, "k1"),
            link(&l, "l1"),
            link(&k, "k2"),
            link(&k, "k3"),
        ],
        T0,
    )
    .unwrap();
    let mut rows: BTreeMap<&str, (Delivery, Option<String>)> = ids
        .iter()
        .zip(links)
        .map(|(id, link)| (*id, (fresh(T0), link.blocked_by)))
        .collect();
    let schedule = [60u32, 900];
    let mut sent = Vec::new();
    let mut now = T0;
    // Each round runs every delivery's job once, in a scrambled order.
    for _ in 0..10 {
        for id in ["k3", "l1", "k2", "k1"] {
            let (d, blocked_by) = rows[id].clone();
            let Some(at) = d.next_attempt_at else {
                continue;
            };
            let pred = blocked_by.as_deref().map(|p| {
                let (pd, pb) = &rows[p];
                Predecessor::Found(PredView::of(pd, pb.as_deref()))
            });
            let order = Order {
                blocked_by: blocked_by.as_deref(),
                created_at: T0,
                predecessor: pred.as_ref(),
            };
            let Ordered::Plan {
                plan: Plan::Send(c),
                unblock,
            } = plan(Job::Scheduled { at }, &d, &order, now, LEASE)
            else {
                continue;
            };
            sent.push(id);
            let code = if id == "k1" && c.attempt.number < 3 {
                503
            } else {
                200
            };
            let claimed = c.claimed(&d);
            let t = settle(
                &claimed,
                &c.attempt,
                &Attempted::Sent(AttemptResult::Status {
                    code,
                    retry_after: None,
                }),
                &schedule,
                now,
            );
            let w = t.write.unwrap();
            let row = rows.get_mut(id).unwrap();
            row.0 = Delivery {
                status: w.status,
                next_attempt_at: w.next_attempt_at,
                in_flight_until: None,
                ..claimed
            };
            if unblock {
                row.1 = None;
            }
        }
        now += 1_000_000;
    }
    assert_eq!(sent, ["l1", "k1", "k1", "k1", "k2", "k3"]);
    assert!(rows
        .values()
        .all(|(d, b)| d.status == Status::Delivered && b.is_none()));
}

// ---------------------------------------------------------------------------------------------
// Model-based property test: publishes over a few keys and subscriptions, commits that land,
// fail or are lost, retried publishes of a known id, random attempt outcomes, pauses, resumes,
// recover, manual retries, redirects, duplicate, reordered and dead-lettered queue messages,
// lost wake-ups, clocks crossing bucket boundaries. Every send is checked against the lane's
// true publish order, and a final drain checks that nothing is ever stuck.

const SUBS: usize = 2;
const KEYS: u8 = 3;
/// Ten-minute buckets, so that a lane's consecutive events often fall in
/// different shards.
const BUCKET_MS: u64 = 600_000;
const SCHEDULE: &[u32] = &[60, 900, 3_600];

#[derive(Debug, Clone)]
struct Row {
    sub: usize,
    lane: Option<Lane>,
    /// Creation order (the model's, for resume and recover).
    n: u128,
    d: Delivery,
    blocked_by: Option<String>,
    created_at: u64,
}

#[derive(Debug, Clone)]
struct Pending {
    rows: Vec<(String, Row)>,
    reserved_at: u64,
}

#[derive(Debug, Clone)]
struct Loaded {
    id: String,
    job: Job,
    row: Row,
    pred: Option<Predecessor>,
}

#[derive(Debug, Clone)]
struct Flying {
    id: String,
    attempt: Attempt,
    gave_up: Option<GiveUp>,
    seen: Delivery,
}

#[derive(Debug, Clone)]
enum Step {
    Publish(Option<u8>),
    /// A publish's shard commit lands (`true`: its report to the lanes is lost).
    Commit(usize, bool),
    /// A publish's shard commit fails (`true`: the shell reports it later).
    Fail(usize, bool),
    /// A publish of a known event id again: new reservations the shard never
    /// stores (`true`: reported later).
    Republish(usize, bool),
    /// The shell's next call to the lanes carries the outcomes it knows.
    Report,
    /// A consumer takes a job, reads the delivery and (`true`) its predecessor.
    Load(usize, bool),
    /// It plans on what it read (maybe stale by now) and writes with
    /// compare-and-set.
    Claim(usize),
    /// An attempt ends (`true`: the wake-up of the deliveries it blocked is lost).
    Finish(usize, AttemptResult, bool),
    Duplicate(usize),
    DeadLetter(usize),
    ManualRetry(usize),
    Redirect(usize),
    Pause(usize),
    Resume(usize),
    Recover(usize),
    Advance(u64),
    /// Time moves to near the end of a pending publish's commit window
    /// (by the offset, ms): where a read says "missing" and a commit may
    /// still land.
    NearWindow(usize, u64),
}

fn any_result() -> impl Strategy<Value = AttemptResult> {
    prop_oneof![
        4 => (200u16..300).prop_map(|code| AttemptResult::Status { code, retry_after: None }),
        4 => prop_oneof![Just(500u16), Just(503)]
            .prop_map(|code| AttemptResult::Status { code, retry_after: None }),
        1 => proptest::option::of("[0-9]{1,4}")
            .prop_map(|retry_after| AttemptResult::Status { code: 429, retry_after }),
        1 => Just(AttemptResult::Status { code: 410, retry_after: None }),
        2 => Just(AttemptResult::Timeout),
        1 => Just(AttemptResult::NetworkError),
    ]
}

fn any_step() -> impl Strategy<Value = Step> {
    let i = any::<usize>;
    prop_oneof![
        6 => proptest::option::weighted(0.85, 0..KEYS).prop_map(Step::Publish),
        5 => (i(), proptest::bool::weighted(0.2)).prop_map(|(i, b)| Step::Commit(i, b)),
        1 => (i(), any::<bool>()).prop_map(|(i, b)| Step::Fail(i, b)),
        1 => (i(), any::<bool>()).prop_map(|(i, b)| Step::Republish(i, b)),
        1 => Just(Step::Report),
        6 => (i(), proptest::bool::weighted(0.9)).prop_map(|(i, b)| Step::Load(i, b)),
        6 => i().prop_map(Step::Claim),
        6 => (i(), any_result(), proptest::bool::weighted(0.3))
            .prop_map(|(i, r, b)| Step::Finish(i, r, b)),
        1 => i().prop_map(Step::Duplicate),
        1 => i().prop_map(Step::DeadLetter),
        1 => i().prop_map(Step::ManualRetry),
        1 => i().prop_map(Step::Redirect),
        1 => (0..SUBS).prop_map(Step::Pause),
        1 => (0..SUBS).prop_map(Step::Resume),
        1 => (0..SUBS).prop_map(Step::Recover),
        3 => prop_oneof![0u64..120_000, 0u64..2_000_000].prop_map(Step::Advance),
        1 => (i(), 0u64..120_000).prop_map(|(i, back)| Step::NearWindow(i, back)),
    ]
}

/// The value of a call to the in-memory store, which cannot fail.
fn ok<T>(r: Result<T, std::convert::Infallible>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => match e {},
    }
}

struct Model {
    now: u64,
    n: u128,
    lanes: MemoryLanes,
    rows: BTreeMap<String, Row>,
    /// Each lane's reservations in publish order: the truth every send is
    /// checked against.
    order: BTreeMap<Lane, Vec<String>>,
    pending: Vec<Pending>,
    /// Outcomes the shell knows and has not reported to the lanes yet.
    unreported: Vec<Committed>,
    /// Stored events: their deliveries.
    events: Vec<Vec<String>>,
    held: [bool; SUBS],
    queue: Vec<(String, Job)>,
    loaded: Vec<Loaded>,
    flying: Vec<Flying>,
    claimed: BTreeMap<String, BTreeSet<u32>>,
    reach: Reach,
}

/// What a run went through: the cases the model exists for must occur.
#[derive(Debug, Clone, Copy, Default)]
struct Reach {
    /// Sends to a subscription (not redirects).
    sends: usize,
    /// Of which the first send of a delivery that had waited in its lane.
    unblocked: usize,
    /// Of which across a bucket's boundary (the predecessor in another shard).
    unblocked_across_shards: usize,
    /// Jobs sent back because the predecessor was not settled.
    blocked: usize,
    /// Of which because it was not stored (yet).
    blocked_on_missing: usize,
    /// Deliveries that waited on a delivery that never came to be, then on
    /// its predecessor.
    rechained: usize,
    /// Of which past a predecessor settled before its turn (given up).
    rechained_past_a_skipped_turn: usize,
}

impl std::ops::AddAssign for Reach {
    fn add_assign(&mut self, o: Reach) {
        self.sends += o.sends;
        self.unblocked += o.unblocked;
        self.unblocked_across_shards += o.unblocked_across_shards;
        self.blocked += o.blocked;
        self.blocked_on_missing += o.blocked_on_missing;
        self.rechained += o.rechained;
        self.rechained_past_a_skipped_turn += o.rechained_past_a_skipped_turn;
    }
}

impl Model {
    fn new() -> Model {
        Model {
            now: T0,
            n: 0,
            lanes: MemoryLanes::default(),
            rows: BTreeMap::new(),
            order: BTreeMap::new(),
            pending: Vec::new(),
            unreported: Vec::new(),
            events: Vec::new(),
            held: [false; SUBS],
            queue: Vec::new(),
            loaded: Vec::new(),
            flying: Vec::new(),
            claimed: BTreeMap::new(),
            reach: Reach::default(),
        }
    }

    fn new_id(&mut self) -> (String, u128) {
        self.n += 1;
        let shard = ShardKey::of(PROJECT, self.now, BUCKET_MS);
        (delivery_id(&shard, self.n), self.n)
    }

    fn publish(&mut self, key: Option<u8>) -> Result<(), TestCaseError> {
        let mut rows = Vec::new();
        let mut links = Vec::new();
        for sub in 0..SUBS {
            let (id, n) = self.new_id();
            let l = key.map(|k| lane(sub, &format!("k{k}")));
            if let Some(l) = &l {
                links.push(link(l, &id));
                self.order.entry(l.clone()).or_default().push(id.clone());
            }
            let row = Row {
                sub,
                lane: l,
                n,
                d: fresh(self.now),
                blocked_by: None,
                created_at: self.now,
            };
            rows.push((id, row));
        }
        let placed = ok(chain(&mut self.lanes, &links, self.now));
        for (link, placed) in links.iter().zip(placed) {
            if let Some((_, row)) = rows.iter_mut().find(|(id, _)| *id == link.delivery_id) {
                row.blocked_by = placed.blocked_by;
            }
        }
        self.pending.push(Pending {
            rows,
            reserved_at: self.now,
        });
        Ok(())
    }

    fn outcome(p: &Pending, stored: bool) -> Vec<Committed> {
        p.rows
            .iter()
            .filter_map(|(id, r)| {
                r.lane.as_ref().map(|l| Committed {
                    lane: l.clone(),
                    delivery_id: id.clone(),
                    stored,
                })
            })
            .collect()
    }

    fn commit(&mut self, i: usize, lose_report: bool) -> Result<(), TestCaseError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let p = self.pending.remove(i % self.pending.len());
        if self.now >= p.reserved_at.saturating_add(COMMIT_WINDOW_MS) {
            // Too late: such a commit never lands (the window's premise).
            if !lose_report {
                self.unreported.extend(Model::outcome(&p, false));
            }
            return Ok(());
        }
        let mut ids = Vec::new();
        for (id, mut row) in p.rows.clone() {
            if self.held[row.sub] {
                row.d.status = Status::Paused;
                row.d.next_attempt_at = None;
                row.d.held = true;
            } else {
                self.queue
                    .push((id.clone(), Job::Scheduled { at: row.created_at }));
            }
            ids.push(id.clone());
            self.rows.insert(id, row);
        }
        self.events.push(ids);
        if !lose_report {
            ok(committed(&mut self.lanes, &Model::outcome(&p, true)));
        }
        Ok(())
    }

    fn fail(&mut self, i: usize, tell: bool) {
        if self.pending.is_empty() {
            return;
        }
        let p = self.pending.remove(i % self.pending.len());
        if tell {
            self.unreported.extend(Model::outcome(&p, false));
        }
    }

    fn republish(&mut self, i: usize, tell: bool) -> Result<(), TestCaseError> {
        if self.events.is_empty() {
            return Ok(());
        }
        let event = self.events[i % self.events.len()].clone();
        for id in event {
            let Some(l) = self.rows.get(&id).and_then(|r| r.lane.clone()) else {
                continue;
            };
            let (ghost, _) = self.new_id();
            ok(chain(&mut self.lanes, &[link(&l, &ghost)], self.now));
            self.order.entry(l.clone()).or_default().push(ghost.clone());
            if tell {
                self.unreported.push(Committed {
                    lane: l,
                    delivery_id: ghost,
                    stored: false,
                });
            }
        }
        Ok(())
    }

    fn report(&mut self) -> Result<(), TestCaseError> {
        let outcomes = std::mem::take(&mut self.unreported);
        ok(committed(&mut self.lanes, &outcomes));
        Ok(())
    }

    /// What a consumer reads of a delivery's predecessor now.
    fn read_pred(&mut self, row: &Row, pred: &str) -> Result<Predecessor, TestCaseError> {
        if let Some(p) = self.rows.get(pred) {
            return Ok(Predecessor::Found(PredView::of(
                &p.d,
                p.blocked_by.as_deref(),
            )));
        }
        let l = row.lane.clone().ok_or_else(|| {
            TestCaseError::fail(format!("a delivery without a key is blocked by {pred}"))
        })?;
        let reservation = ok(reservation(&mut self.lanes, &l, pred));
        Ok(Predecessor::Missing {
            read_at: self.now,
            reservation,
        })
    }

    fn load(&mut self, i: usize, read: bool) -> Result<(), TestCaseError> {
        if self.queue.is_empty() {
            return Ok(());
        }
        let (id, job) = self.queue.remove(i % self.queue.len());
        let Some(row) = self.rows.get(&id).cloned() else {
            return Err(TestCaseError::fail(format!("a job for {id}, never stored")));
        };
        let pred = match (&row.blocked_by, read) {
            (Some(p), true) => Some(self.read_pred(&row, p)?),
            _ => None,
        };
        self.loaded.push(Loaded { id, job, row, pred });
        Ok(())
    }

    /// A compare-and-set status write (the shard's `apply`); the status before.
    fn cas(&mut self, id: &str, w: &Write) -> Option<Status> {
        let row = self.rows.get_mut(id)?;
        if Expect::of(&row.d) != w.expect || (w.status == Status::Paused && !row.d.held) {
            return None;
        }
        let before = row.d.status;
        row.d.status = w.status;
        row.d.next_attempt_at = w.next_attempt_at;
        row.d.in_flight_until = None;
        Some(before)
    }

    /// The property: a send to the subscription happens only when every
    /// delivery before it in its lane is settled, or never will exist.
    fn check_turn(&self, id: &str) -> Result<(), TestCaseError> {
        let Some(l) = self.rows.get(id).and_then(|r| r.lane.as_ref()) else {
            return Ok(());
        };
        let lane_order = self.order.get(l).map(Vec::as_slice).unwrap_or(&[]);
        let pos = lane_order.iter().position(|x| x == id).unwrap_or(0);
        for earlier in &lane_order[..pos] {
            if let Some(r) = self.rows.get(earlier) {
                prop_assert!(
                    r.d.status.is_final(),
                    "{} sent while {} before it is {:?}",
                    id,
                    earlier,
                    r.d.status
                );
            } else {
                let may_land = self.pending.iter().any(|p| {
                    self.now < p.reserved_at.saturating_add(COMMIT_WINDOW_MS)
                        && p.rows.iter().any(|(x, _)| x == earlier)
                });
                prop_assert!(
                    !may_land,
                    "{} sent while {} before it may still be stored",
                    id,
                    earlier
                );
            }
        }
        Ok(())
    }

    fn earlier_in_lane(&self, l: &Lane, a: &str, b: &str) -> bool {
        let o = self.order.get(l).map(Vec::as_slice).unwrap_or(&[]);
        match (o.iter().position(|x| x == a), o.iter().position(|x| x == b)) {
            (Some(a), Some(b)) => a < b,
            _ => false,
        }
    }

    fn claim(&mut self, i: usize) -> Result<(), TestCaseError> {
        if self.loaded.is_empty() {
            return Ok(());
        }
        let l = self.loaded.remove(i % self.loaded.len());
        let order = Order {
            blocked_by: l.row.blocked_by.as_deref(),
            created_at: l.row.created_at,
            predecessor: l.pred.as_ref(),
        };
        let requeue = (l.id.clone(), l.job);
        match plan(l.job, &l.row.d, &order, self.now, LEASE) {
            Ordered::Plan { plan: p, unblock } => match p {
                Plan::Send(c) | Plan::GiveUp(c, _) => {
                    let Some(cur) = self.rows.get(&l.id) else {
                        return Ok(());
                    };
                    if Expect::of(&cur.d) != c.expect || cur.blocked_by != l.row.blocked_by {
                        self.queue.push(requeue); // lost the compare-and-set
                        return Ok(());
                    }
                    prop_assert!(!unblock || l.row.blocked_by.is_some());
                    // Decided here, not by the code under test: every send
                    // but a redirect goes to the subscription.
                    let to_subscription =
                        matches!(p, Plan::Send(_)) && !matches!(l.job, Job::Redirect);
                    prop_assert_eq!(gated(&p), to_subscription);
                    if to_subscription {
                        prop_assert!(
                            unblock || l.row.blocked_by.is_none(),
                            "a send while blocked"
                        );
                        self.check_turn(&l.id)?;
                        self.reach.sends += 1;
                        if let (true, Some(pred)) = (unblock, l.row.blocked_by.as_deref()) {
                            self.reach.unblocked += 1;
                            if predecessor_shard(PROJECT, pred) != predecessor_shard(PROJECT, &l.id)
                            {
                                self.reach.unblocked_across_shards += 1;
                            }
                        }
                    }
                    let numbers = self.claimed.entry(l.id.clone()).or_default();
                    prop_assert!(
                        numbers.insert(c.attempt.number),
                        "attempt {} of {} claimed twice",
                        c.attempt.number,
                        l.id
                    );
                    let gave_up = match p {
                        Plan::GiveUp(_, g) => Some(g),
                        _ => None,
                    };
                    let Some(cur) = self.rows.get_mut(&l.id) else {
                        return Ok(());
                    };
                    cur.d = c.claimed(&cur.d);
                    if unblock {
                        cur.blocked_by = None;
                    }
                    self.flying.push(Flying {
                        id: l.id,
                        attempt: c.attempt,
                        gave_up,
                        seen: cur.d,
                    });
                }
                Plan::Wait { delay_s } => {
                    prop_assert!((1..=retry::MAX_QUEUE_DELAY_S).contains(&delay_s));
                    self.queue.push(requeue);
                }
                Plan::Hold(w) => {
                    if self.cas(&l.id, &w).is_none() {
                        self.queue.push(requeue);
                    }
                }
                Plan::Drop(_) => {}
            },
            Ordered::Blocked { by, delay_s } => {
                prop_assert_eq!(Some(by.as_str()), l.row.blocked_by.as_deref());
                prop_assert!((1..=retry::MAX_QUEUE_DELAY_S).contains(&delay_s));
                self.reach.blocked += 1;
                if matches!(l.pred, Some(Predecessor::Missing { .. })) {
                    self.reach.blocked_on_missing += 1;
                }
                self.queue.push(requeue);
            }
            Ordered::Rechain { from, to } => {
                self.reach.rechained += 1;
                if matches!(l.pred, Some(Predecessor::Found(_))) {
                    self.reach.rechained_past_a_skipped_turn += 1;
                }
                let lane_of = l.row.lane.clone();
                let Some(lane_of) = lane_of else {
                    return Err(TestCaseError::fail("a rechain without a key"));
                };
                prop_assert!(
                    self.earlier_in_lane(&lane_of, &to, &from),
                    "rechained from {} to {}, not before it in its lane",
                    from,
                    to
                );
                if let Some(cur) = self.rows.get_mut(&l.id) {
                    if cur.blocked_by.as_deref() == Some(from.as_str()) {
                        cur.blocked_by = Some(to);
                    }
                }
                self.queue.push(requeue);
            }
            Ordered::Read { predecessor } => {
                prop_assert_eq!(Some(predecessor.as_str()), l.row.blocked_by.as_deref());
                self.queue.push(requeue);
            }
        }
        Ok(())
    }

    fn finish(&mut self, i: usize, r: AttemptResult, lose_wake: bool) -> Result<(), TestCaseError> {
        if self.flying.is_empty() {
            return Ok(());
        }
        let f = self.flying.remove(i % self.flying.len());
        let result = f.gave_up.map_or(Attempted::Sent(r), Attempted::GaveUp);
        let mut snapshot = f.seen;
        for round in 0..2 {
            let t = settle(&snapshot, &f.attempt, &result, SCHEDULE, self.now);
            if let Some(fu) = t.follow_up {
                self.queue
                    .push((f.id.clone(), Job::Scheduled { at: fu.at }));
            }
            let Some(w) = t.write else {
                return Ok(());
            };
            if let Some(before) = self.cas(&f.id, &w) {
                if wakes(before, w.status) && !lose_wake {
                    self.wake(&f.id);
                }
                return Ok(());
            }
            prop_assert_eq!(round, 0, "a write on a fresh row applies");
            snapshot = self.rows.get(&f.id).map_or(snapshot, |r| r.d);
        }
        Ok(())
    }

    /// The shard of a settled delivery sends the jobs of the deliveries it
    /// blocked — those in the same shard: it cannot see the others.
    fn wake(&mut self, id: &str) {
        let shard = predecessor_shard(PROJECT, id);
        let woken: Vec<(String, Job)> = self
            .rows
            .iter()
            .filter(|(x, r)| {
                r.blocked_by.as_deref() == Some(id)
                    && predecessor_shard(PROJECT, x) == shard
                    && r.d.status.in_progress()
            })
            .filter_map(|(x, r)| {
                r.d.next_attempt_at
                    .map(|at| (x.clone(), Job::Scheduled { at }))
            })
            .collect();
        self.queue.extend(woken);
    }

    fn of_sub(&self, sub: usize, keep: impl Fn(&Row) -> bool) -> Vec<String> {
        let mut ids: Vec<(u128, String)> = self
            .rows
            .iter()
            .filter(|(_, r)| r.sub == sub && keep(r))
            .map(|(id, r)| (r.n, id.clone()))
            .collect();
        ids.sort();
        ids.into_iter().map(|(_, id)| id).collect()
    }

    fn pause(&mut self, sub: usize) {
        self.held[sub] = true;
        for r in self.rows.values_mut().filter(|r| r.sub == sub) {
            r.d.held = true;
        }
    }

    fn resume(&mut self, sub: usize) {
        self.held[sub] = false;
        for r in self.rows.values_mut().filter(|r| r.sub == sub) {
            r.d.held = false;
        }
        for id in self.of_sub(sub, |r| r.d.status == Status::Paused) {
            let Some(d) = self.rows.get(&id).map(|r| r.d) else {
                continue;
            };
            if let Some(w) = delivery::release(&d, self.now) {
                if self.cas(&id, &w).is_some() {
                    self.queue.push((id, Job::Scheduled { at: self.now }));
                }
            }
        }
    }

    fn recover(&mut self, sub: usize) {
        for id in self.of_sub(sub, |r| {
            matches!(r.d.status, Status::Failed | Status::DeadLetter)
        }) {
            self.queue.push((id, Job::ManualRetry));
        }
    }

    fn pick(&self, i: usize) -> Option<String> {
        (!self.rows.is_empty()).then(|| {
            self.rows
                .keys()
                .nth(i % self.rows.len())
                .cloned()
                .unwrap_or_default()
        })
    }

    fn step(&mut self, step: Step) -> Result<(), TestCaseError> {
        match step {
            Step::Publish(key) => self.publish(key)?,
            Step::Commit(i, lose) => self.commit(i, lose)?,
            Step::Fail(i, tell) => self.fail(i, tell),
            Step::Republish(i, tell) => self.republish(i, tell)?,
            Step::Report => self.report()?,
            Step::Load(i, read) => self.load(i, read)?,
            Step::Claim(i) => self.claim(i)?,
            Step::Finish(i, r, lose) => self.finish(i, r, lose)?,
            Step::Duplicate(i) if !self.queue.is_empty() => {
                let m = self.queue[i % self.queue.len()].clone();
                self.queue.push(m);
            }
            Step::DeadLetter(i) if !self.queue.is_empty() => {
                let (id, job) = self.queue.remove(i % self.queue.len());
                let moved = match job {
                    Job::Scheduled { at } => Job::from_message(Some(at), false, false, true),
                    Job::ManualRetry => Job::from_message(None, true, false, true),
                    Job::Redirect => Job::from_message(None, true, true, true),
                    dlq @ Job::DeadLetterQueue { .. } => Some(dlq),
                };
                self.queue.extend(moved.map(|j| (id, j)));
            }
            Step::Duplicate(_) | Step::DeadLetter(_) => {}
            Step::ManualRetry(i) => {
                if let Some(id) = self.pick(i) {
                    self.queue.push((id, Job::ManualRetry));
                }
            }
            Step::Redirect(i) => {
                if let Some(id) = self.pick(i) {
                    self.queue.push((id, Job::Redirect));
                }
            }
            Step::Pause(s) => self.pause(s),
            Step::Resume(s) => self.resume(s),
            Step::Recover(s) => self.recover(s),
            Step::Advance(ms) => self.now += ms,
            Step::NearWindow(i, back) if !self.pending.is_empty() => {
                let p = &self.pending[i % self.pending.len()];
                let edge = p.reserved_at + COMMIT_WINDOW_MS;
                self.now = self.now.max(edge.saturating_sub(back));
            }
            Step::NearWindow(..) => {}
        }
        Ok(())
    }

    /// After every step: lanes are independent, and nothing is stranded.
    fn check(&self) -> Result<(), TestCaseError> {
        for (id, r) in &self.rows {
            match (&r.lane, &r.blocked_by) {
                (None, Some(b)) => prop_assert!(false, "{} has no key but waits on {}", id, b),
                (Some(l), Some(b)) => prop_assert!(
                    self.earlier_in_lane(l, b, id),
                    "{} waits on {}, which is not before it in its lane",
                    id,
                    b
                ),
                _ => {}
            }
            if r.d.status == Status::Paused {
                prop_assert!(r.d.held, "{} paused under an active subscription", id);
            }
            if !r.d.status.in_progress() || self.flying.iter().any(|f| f.id == *id) {
                continue;
            }
            let at = r.d.next_attempt_at;
            let jobs = self
                .queue
                .iter()
                .map(|(x, j)| (x.as_str(), *j))
                .chain(self.loaded.iter().map(|l| (l.id.as_str(), l.job)));
            let mut found = false;
            for (x, j) in jobs {
                if x == id
                    && (matches!(j, Job::Scheduled { at: a } if Some(a) == at)
                        || matches!(j, Job::DeadLetterQueue { scheduled_at: a } if a == at))
                {
                    found = true;
                    break;
                }
            }
            prop_assert!(found, "{} ({:?}) has no job for {:?}", id, r.d.status, at);
        }
        Ok(())
    }

    /// Every publish lands or fails, every subscription is resumed, every
    /// receiver answers 2xx: the queue must then settle every delivery — a
    /// delivery whose predecessor settled is never stuck.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        while !self.pending.is_empty() {
            self.commit(0, false)?;
        }
        self.report()?;
        for s in 0..SUBS {
            self.resume(s);
        }
        let ok = AttemptResult::Status {
            code: 200,
            retry_after: None,
        };
        for _ in 0..5_000 {
            while !self.flying.is_empty() {
                self.finish(0, ok.clone(), false)?;
            }
            while !self.loaded.is_empty() {
                self.claim(0)?;
                while !self.flying.is_empty() {
                    self.finish(0, ok.clone(), false)?;
                }
            }
            if self.queue.is_empty() {
                break;
            }
            let before: Vec<(Status, u32, Option<String>)> = self
                .rows
                .values()
                .map(|r| (r.d.status, r.d.attempts_made, r.blocked_by.clone()))
                .collect();
            for _ in 0..self.queue.len() {
                self.load(0, true)?;
                self.claim(0)?;
                while !self.flying.is_empty() {
                    self.finish(0, ok.clone(), false)?;
                }
            }
            let after: Vec<(Status, u32, Option<String>)> = self
                .rows
                .values()
                .map(|r| (r.d.status, r.d.attempts_made, r.blocked_by.clone()))
                .collect();
            if before == after {
                // Nothing moved: let time pass to the next planned attempt,
                // or a recheck's worth.
                let next = self
                    .queue
                    .iter()
                    .filter_map(|(_, j)| match j {
                        Job::Scheduled { at } if *at > self.now + 1_000 => Some(*at),
                        _ => None,
                    })
                    .min()
                    .unwrap_or(self.now + RECHECK_S * 1_000);
                self.now = next.max(self.now + 1_000);
            }
        }
        for (id, r) in &self.rows {
            prop_assert!(
                r.d.status.is_final(),
                "{} is stuck {:?}, blocked by {:?}",
                id,
                r.d.status,
                r.blocked_by
            );
        }
        prop_assert!(self.queue.is_empty(), "jobs left: {:?}", self.queue);
        Ok(())
    }
}

/// The model, run on a fixed seed, goes through every case it is there
/// for: a test of the test.
#[test]
fn the_model_reaches_the_cases_it_is_for() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let steps = proptest::collection::vec(any_step(), 1..200);
    let mut total = Reach::default();
    for _ in 0..300 {
        let Ok(tree) = steps.new_tree(&mut runner) else {
            panic!("no case");
        };
        let mut m = Model::new();
        for step in tree.current() {
            m.step(step).unwrap();
        }
        m.drain().unwrap();
        total += m.reach;
    }
    eprintln!("{total:?}");
    assert!(total.sends > 1_000, "{total:?}");
    assert!(total.unblocked > 100, "{total:?}");
    assert!(total.unblocked_across_shards > 10, "{total:?}");
    assert!(total.blocked > 100, "{total:?}");
    assert!(total.blocked_on_missing > 10, "{total:?}");
    assert!(total.rechained > 10, "{total:?}");
    assert!(total.rechained_past_a_skipped_turn > 0, "{total:?}");
}

/// Cases of the model test (reported in the closing note).
const CASES: u32 = 1_024;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn lanes_keep_publish_order_under_any_interleaving(
        steps in proptest::collection::vec(any_step(), 1..200),
    ) {
        let mut m = Model::new();
        for step in steps {
            m.step(step)?;
            m.check()?;
        }
        m.drain()?;
        m.check()?;
    }
}
