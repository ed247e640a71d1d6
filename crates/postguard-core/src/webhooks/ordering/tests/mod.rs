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

mod model;
