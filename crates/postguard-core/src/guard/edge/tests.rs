//! The edge object's decisions against a home run by the production
//! orchestration (`store::lease` over the in-memory port): every answer is
//! delivered at once, in order, so these tests are about what this layer
//! adds to the lease rules (when to ask, expiry, claims, report-only,
//! revocation), not about message reordering (lease/tests.rs).

use super::*;
use crate::guard::{Caller, Claim, Slot};
use crate::lease::{EdgeLimits, Ledger};
use crate::limits::{Limits, Policy};
use crate::store::{self, MemoryStore};

const T0: u64 = 1_700_000_000_000;

fn limits(quota: u32) -> Limits {
    Limits {
        notify_at: Vec::new(),
        policies: vec![Policy {
            name: "default".into(),
            limit: quota,
            window_ms: 60_000,
        }],
        concurrency: None,
        report_only: false,
    }
}

fn settings(min_block: u32) -> EdgeLimits {
    EdgeLimits {
        enabled: true,
        min_block,
        ..EdgeLimits::default()
    }
}

fn request(edge: &str, limits: Limits, s: EdgeLimits) -> EdgeAdmitRequest {
    EdgeAdmitRequest {
        home: "key_1".into(),
        edge: edge.into(),
        admit: AdmitRequest {
            caller: Some(Caller::default()),
            ..AdmitRequest::charge(1, limits)
        },
        settings: s,
        request_ms: 30_000,
    }
}

fn ok<T>(r: Result<T, std::convert::Infallible>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => match e {},
    }
}

/// A home and the calls it served.
#[derive(Default)]
struct Home {
    store: MemoryStore,
    calls: u32,
    asks: u32,
}

impl Home {
    fn serve(&mut self, edge: &mut EdgeState, sent: &LeaseRequest, now: u64) -> LeaseReply {
        self.calls += 1;
        self.asks += u32::from(sent.ask.is_some());
        let done = ok(store::lease(&mut self.store, sent, &[], now));
        edge.heard(&done.answer, sent, now);
        done.answer
    }

    /// One request through the edge, answers delivered at once.
    fn run(&mut self, edge: &mut EdgeState, req: &EdgeAdmitRequest, now: u64) -> EdgeAdmitReply {
        match edge.step(req, || 42, now) {
            Step::Answer { reply, prefetch } => {
                if let Some(p) = prefetch {
                    self.serve(edge, &p, now);
                }
                reply
            }
            Step::Forward(sent) => EdgeAdmitReply {
                answer: self.serve(edge, &sent, now).answer,
                slot: None,
            },
            Step::Wait { .. } => panic!("nothing is in flight when answers come at once"),
        }
    }
}

fn admitted(r: &EdgeAdmitReply) -> bool {
    matches!(r.answer, AdmitResponse::Admitted { .. })
}

fn remaining(r: &EdgeAdmitReply) -> u32 {
    r.answer
        .verdicts()
        .map_or(0, |v| v.binding_verdict().remaining)
}

#[test]
fn a_cold_location_is_served_by_the_home_until_it_shows_min_block_of_demand() {
    let mut home = Home::default();
    let mut edge = EdgeState::default();
    let req = request("LHR.0", limits(1_000), settings(10));
    for i in 0..9 {
        let r = home.run(&mut edge, &req, T0 + i);
        assert!(admitted(&r));
        assert_eq!(remaining(&r), 999 - i as u32, "the home's exact countdown");
    }
    assert_eq!(
        (home.calls, home.asks),
        (9, 0),
        "nothing asked, nothing leased"
    );
    assert_eq!(home.store.state.ledger, Ledger::default());
    // The tenth carries the ask; then the edge admits alone.
    assert!(admitted(&home.run(&mut edge, &req, T0 + 9)));
    assert_eq!((home.calls, home.asks), (10, 1));
    let before = home.calls;
    for i in 0..15 {
        assert!(admitted(&home.run(&mut edge, &req, T0 + 10 + i)));
    }
    assert!(
        home.calls - before <= 1,
        "at most a prefetch: {}",
        home.calls - before
    );
}

#[test]
fn a_small_quota_is_never_leased_and_its_countdown_stays_exact() {
    let mut home = Home::default();
    let mut edge = EdgeState::default();
    let req = request("LHR.0", limits(20), settings(10));
    let got: Vec<EdgeAdmitReply> = (0..30).map(|i| home.run(&mut edge, &req, T0 + i)).collect();
    let left: Vec<u32> = got.iter().filter(|r| admitted(r)).map(remaining).collect();
    assert_eq!(left, (0..20).rev().collect::<Vec<u32>>());
    assert!(got[20..]
        .iter()
        .all(|r| matches!(r.answer, AdmitResponse::Limited { .. })));
    let w = crate::limits::window_of(&home.store.state.windows, "default").map(|w| w.used);
    assert_eq!(w, Some(20), "nothing leased");
    let leased: u32 = home
        .store
        .state
        .ledger
        .policies
        .iter()
        .map(|l| l.leased)
        .sum();
    assert_eq!(leased, 0, "asked, but never worth a first block");
    // The home's answers told the edge it has nothing left: it refuses
    // locally from then on.
    let calls = home.calls;
    for i in 30..40 {
        let r = home.run(&mut edge, &req, T0 + i);
        assert!(matches!(r.answer, AdmitResponse::Limited { .. }));
    }
    assert_eq!(home.calls, calls, "refused at the edge");
}

#[test]
fn several_edges_and_the_home_never_admit_more_than_the_quota() {
    let mut home = Home::default();
    let s = settings(2);
    let mut edges: Vec<(EdgeState, EdgeAdmitRequest)> = ["AMS.0", "CDG.0", "FRA.0", "LHR.0"]
        .iter()
        .map(|e| (EdgeState::default(), request(e, limits(50), s)))
        .collect();
    let mut ok = 0;
    let mut local = 0;
    for i in 0..300u64 {
        let (edge, req) = &mut edges[(i % 4) as usize];
        let calls = home.calls;
        let r = home.run(edge, req, T0 + i);
        if admitted(&r) {
            ok += 1;
            local += u32::from(home.calls == calls);
        }
    }
    assert_eq!(ok, 50, "every edge kept asking until the window was spent");
    assert!(local > 0, "some were admitted at an edge");
    let used = crate::limits::window_of(&home.store.state.windows, "default").map(|w| w.used);
    assert_eq!(used, Some(50));
}

#[test]
fn an_expired_secret_is_refused_at_the_edge_even_with_units_in_hand() {
    let mut home = Home::default();
    let mut edge = EdgeState::default();
    let mut req = request("NRT.0", limits(1_000), settings(1));
    for i in 0..5 {
        assert!(admitted(&home.run(&mut edge, &req, T0 + i)));
    }
    assert!(edge.edge.as_ref().is_some_and(|e| e.pots[0].left > 0));
    req.admit.caller = Some(Caller {
        expires_at: Some(T0 + 10),
        ..Caller::default()
    });
    assert!(admitted(&home.run(&mut edge, &req, T0 + 9)));
    let calls = home.calls;
    let r = home.run(&mut edge, &req, T0 + 10);
    assert_eq!(r.answer, AdmitResponse::Expired);
    assert_eq!(home.calls, calls, "decided at the edge");
}

#[test]
fn what_the_operator_set_reaches_the_edge_with_the_homes_answers() {
    let mut home = Home::default();
    let mut edge = EdgeState::default();
    let req = request("SIN.0", limits(1_000), settings(1));
    assert!(admitted(&home.run(&mut edge, &req, T0)));
    // The operator lowers the key's limit and sets an expiry (version 5);
    // the worker's cached record still says version 0.
    let profile = Profile {
        version: 5,
        limits: limits(700),
        expires_at: Some(T0 + 500),
        ..Profile::default()
    };
    ok(store::update(&mut home.store, &profile));
    // The next answer from the home carries it: the edge applies the new
    // limit (headers), tells the worker (`refresh`), and the expiry.
    let mut i = 1;
    let refreshed = loop {
        let r = home.run(&mut edge, &req, T0 + i);
        i += 1;
        match &r.answer {
            AdmitResponse::Admitted {
                refresh: Some(p), ..
            } => {
                break (
                    r.answer.verdicts().map(|v| v.binding_verdict().limit),
                    p.version,
                )
            }
            _ => assert!(i < 100, "the profile never reached the edge"),
        }
    };
    assert_eq!(refreshed, (Some(700), 5));
    assert_eq!(
        home.run(&mut edge, &req, T0 + 500).answer,
        AdmitResponse::Expired
    );
}

#[test]
fn claims_go_to_the_home_and_a_revoked_key_drops_its_leases() {
    let mut home = Home::default();
    let mut edge = EdgeState::default();
    let req = request("GRU.0", limits(1_000), settings(1));
    for i in 0..3 {
        home.run(&mut edge, &req, T0 + i);
    }
    assert!(edge.edge.as_ref().is_some_and(|e| e.pots[0].left > 0));
    let mut post = req.clone();
    post.admit.claim = Some(Claim {
        key: "idem-1".into(),
        fingerprint: "fp".into(),
        request_id: "req_1".into(),
        lease_ms: 1_000,
    });
    let (calls, asks) = (home.calls, home.asks);
    let r = home.run(&mut edge, &post, T0 + 4);
    assert!(matches!(
        r.answer,
        AdmitResponse::Admitted {
            idempotency: Some(crate::idempotency::Decision::Execute),
            ..
        }
    ));
    assert_eq!(home.calls, calls + 1, "claimed where the key's records are");
    assert_eq!(home.asks, asks, "no ask rides along with a claim");
    assert!(home.store.records.contains_key("idem-1"));
    // Revoked at the home: the next answer makes the edge forget.
    ok(store::revoke(&mut home.store, T0 + 5));
    let mut r = home.run(&mut edge, &post, T0 + 6);
    assert_eq!(r.answer, AdmitResponse::Revoked);
    assert!(edge.edge.as_ref().is_some_and(|e| e.pots.is_empty()));
    r = home.run(&mut edge, &req, T0 + 7);
    assert_eq!(r.answer, AdmitResponse::Revoked, "forwarded, not admitted");
}

#[test]
fn report_only_admits_what_the_leases_would_refuse_and_names_the_policy() {
    let mut home = Home::default();
    let mut edge = EdgeState::default();
    let quota = Limits {
        report_only: true,
        ..limits(40)
    };
    let req = request("SYD.0", quota, settings(2));
    let got: Vec<EdgeAdmitReply> = (0..80).map(|i| home.run(&mut edge, &req, T0 + i)).collect();
    assert!(got.iter().all(admitted), "report-only refuses nothing");
    let named = got
        .iter()
        .filter(|r| {
            matches!(&r.answer, AdmitResponse::Admitted { would_refuse: Some(p), .. } if p == "default")
        })
        .count();
    assert_eq!(named, 40, "exactly the ones over the quota say so");
}

#[test]
fn a_slot_taken_at_the_edge_is_given_back_there() {
    let mut home = Home::default();
    let mut edge = EdgeState::default();
    let quota = Limits {
        concurrency: Some(100),
        ..limits(1_000)
    };
    let mut req = request("JNB.0", quota, settings(2));
    req.admit.slot = Some(Slot {
        id: "req_x".into(),
        lease_ms: 30_000,
    });
    let lives: Vec<Option<SlotAt>> = (0..6)
        .map(|i| home.run(&mut edge, &req, T0 + i).slot)
        .collect();
    let Some(Some(SlotAt::Edge { life })) = lives.last().copied() else {
        panic!("a leased slot: {lives:?}");
    };
    let in_use = |e: &EdgeState| e.edge.as_ref().and_then(|x| x.slots).map(|s| s.in_use);
    let before = in_use(&edge);
    edge.end(life);
    assert_eq!(in_use(&edge), before.map(|n| n - 1));
}

#[test]
fn an_answer_does_not_lower_the_homes_figure_while_an_ask_is_in_flight() {
    let mut home = Home::default();
    let mut edge = EdgeState::default();
    let req = request("ZRH.0", limits(100), settings(2));
    for i in 0..4 {
        home.run(&mut edge, &req, T0 + i);
    }
    let figure = |e: &EdgeState| e.edge.as_ref().map(|x| x.pots[0].home_left);
    let before = figure(&edge).expect("a lease");
    assert!(before > 0);
    // An ask is in flight (the home may already have granted it) when the
    // answer to another request says the home has nothing left.
    let e = edge.edge.as_mut().expect("an edge");
    e.pending.push(crate::lease::edge::Pending {
        id: 77,
        asked_at: T0 + 5,
        give_up_at: T0 + 2_505,
    });
    let window = e.pots[0].window_start;
    let said = crate::limits::Said {
        name: "default".into(),
        verdict: crate::rate_limit::Verdict {
            admitted: false,
            limit: 100,
            remaining: 0,
            reset_ms: window + 60_000,
            reset_in_s: 60,
            reset_epoch_s: 0,
            window_s: 60,
        },
    };
    let verdicts = crate::limits::Verdicts {
        said: vec![said],
        binding: 0,
        inflight: None,
    };
    let reply = LeaseReply {
        answer: AdmitResponse::Limited {
            verdict: verdicts.binding_verdict(),
            verdicts: Some(verdicts),
        },
        grant: None,
        profile: None,
    };
    let sent = lease_request(&req, req.admit.clone(), None);
    edge.heard(&reply, &sent, T0 + 6);
    assert_eq!(
        figure(&edge),
        Some(before),
        "kept until the ask is answered"
    );
    // Once no ask is in flight, the same answer makes refusals local.
    if let Some(e) = edge.edge.as_mut() {
        e.pending.clear();
    }
    edge.heard(&reply, &sent, T0 + 7);
    assert_eq!(figure(&edge), Some(0));
}

#[test]
fn quota_notices_are_made_where_the_home_charges_once_per_threshold() {
    use crate::quota_notice::NoticeTo;
    let mut home = Home::default();
    let mut edges = [EdgeState::default(), EdgeState::default()];
    let noticed = Limits {
        notify_at: vec![10, 50, 90, 100],
        ..limits(200)
    };
    let mut reqs = [
        request("LHR.0", noticed.clone(), settings(2)),
        request("AMS.0", noticed, settings(2)),
    ];
    for r in &mut reqs {
        r.admit.notices = Some(Box::new(NoticeTo {
            key_id: "key_1".into(),
            key_prefix: "pgk_abc".into(),
            project: "acme".into(),
            request_id: "req_1".into(),
        }));
    }
    let mut admitted_n = 0;
    for i in 0..400u64 {
        let e = (i % 2) as usize;
        if admitted(&home.run(&mut edges[e], &reqs[e], T0 + i)) {
            admitted_n += 1;
        }
    }
    assert!(home.asks > 0, "the edges leased blocks");
    assert!(admitted_n <= 200);
    let events = ok(store::GuardStore::pending(&mut home.store, T0 + 400, 100));
    let mut percents: Vec<u64> = events
        .iter()
        .filter_map(|p| p.event.data["percent"].as_u64())
        .collect();
    percents.sort_unstable();
    // Every unit of the window is admitted or leased by the end: each
    // threshold is reached at the home once.
    assert_eq!(percents, [10, 50, 90, 100], "{admitted_n} admitted");
}
