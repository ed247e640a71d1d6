//! Unit tests of the lease rules, and a model-based property test: one home,
//! 2–6 edges with their own clocks, messages delivered late, twice or never,
//! edges that crash holding leases, clock steps and window edges.

use std::cell::RefCell;
use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::home::{in_use_with_leases, Return};
use super::*;
use crate::limits::{self, window_of, Limits, Policy, Verdicts, Windows};

const T0: u64 = 1_700_000_000_000;

fn p(name: &str, limit: u32, window_ms: u64) -> Policy {
    Policy {
        name: name.into(),
        limit,
        window_ms,
    }
}

fn on(max_block: u32) -> EdgeLimits {
    EdgeLimits {
        enabled: true,
        max_block,
        min_block: 1,
        prefetch_at_pct: 50,
        lease_ms: 10_000,
        shards: 1,
    }
}

fn one(limit: u32, window_ms: u64) -> Limits {
    Limits {
        notify_at: Vec::new(),
        policies: vec![p("minute", limit, window_ms)],
        concurrency: None,
        report_only: false,
    }
}

fn at(now: u64) -> AtHome {
    AtHome {
        now,
        in_use: 0,
        request_ms: 1_000,
    }
}

fn ask_of(edge: &str, id: u64, want: u32) -> Ask {
    Ask {
        edge: edge.into(),
        id,
        life: 7,
        want,
        have: Vec::new(),
        slots: None,
    }
}

fn used(windows: &Windows, name: &str) -> u32 {
    window_of(windows, name).map_or(0, |w| w.used)
}

/// An edge that asked at `now` and got the home's answer at `now`.
fn edge_with(
    name: &str,
    windows: &mut Windows,
    ledger: &mut Ledger,
    limits: &Limits,
    s: &EdgeLimits,
    now: u64,
) -> Edge {
    let mut e = Edge::new(name, 100, now);
    let a = e.ask(limits, s, now).unwrap();
    let g = grant(windows, ledger, limits, &a, s, at(now));
    assert!(e.apply(&g, now));
    e
}

#[test]
fn blocks_shrink_as_the_window_fills_then_the_home_admits_alone() {
    let s = on(1_000);
    // Half a fair share among the active edges, capped by what is wanted.
    assert_eq!(block_size(1_000, 1, 5_000, &s), 500);
    assert_eq!(block_size(1_000, 4, 5_000, &s), 125);
    assert_eq!(block_size(1_000, 4, 30, &s), 30);
    assert_eq!(block_size(100_000, 2, 5_000, &s), 1_000, "max_block");
    // Down to 1 while two units per active edge are left, then none.
    assert_eq!(block_size(8, 4, 100, &s), 1);
    assert_eq!(block_size(7, 4, 100, &s), 0);
    assert_eq!(block_size(1, 1, 100, &s), 0);
    assert_eq!(block_size(0, 0, 100, &s), 0, "no edges counts as one");
    assert_eq!(block_size(u32::MAX, u32::MAX, u32::MAX, &on(1_000_000)), 0);

    // Four edges asking in turn for as much as they can get: every grant
    // is at most the last one, and the leases stop before the quota does.
    let limits = one(1_000, 60_000);
    let (mut windows, mut ledger) = (Vec::new(), Ledger::default());
    let mut last = u32::MAX;
    let mut granted = 0;
    for round in 0..200u64 {
        let edge = format!("E{}", round % 4);
        let g = grant(
            &mut windows,
            &mut ledger,
            &limits,
            &ask_of(&edge, round, 1_000),
            &s,
            at(T0 + round),
        );
        let units = g.blocks[0].units;
        assert!(units <= last, "round {round}: {units} after {last}");
        last = units;
        granted += units;
        assert_eq!(g.blocks[0].left, 1_000 - granted);
    }
    assert_eq!(last, 0);
    assert_eq!(used(&windows, "minute"), granted);
    let tail = 1_000 - granted;
    assert!(
        (1..8).contains(&tail),
        "the home keeps fewer than 2 per edge: {tail}"
    );
    // The home admits the tail itself, exactly.
    let mut admitted = 0;
    for i in 0..20 {
        let c = limits::check_all(&windows, &limits.policies, T0 + 300 + i, 1);
        if c.verdicts.admitted() {
            admitted += 1;
        }
        windows = c.windows.unwrap_or(windows);
    }
    assert_eq!(admitted, tail);
}

#[test]
fn a_first_block_needs_half_a_share_of_min_block_then_blocks_shrink_to_one() {
    let s = EdgeLimits {
        min_block: 10,
        ..on(1_000)
    };
    // A quota of 20 with one edge: half of what is left is 9, under 10.
    assert_eq!(block_for(19, 1, 100, true, &s), 0);
    assert_eq!(block_for(20, 1, 100, true, &s), 10);
    assert_eq!(block_for(79, 4, 100, true, &s), 0, "79 / 8 = 9 per edge");
    // An edge that holds a lease of the window is topped up down to 1.
    assert_eq!(block_for(19, 1, 100, false, &s), 9);
    assert_eq!(block_for(2, 1, 100, false, &s), 1);
    assert_eq!(
        block_for(1_000, 1, 4, true, &s),
        4,
        "a small want, a large share"
    );
    // The home of a key with 25 and 40 left, asked by an edge that wants 20:
    // the tighter policy's share (12) is worth a first block.
    let limits = Limits {
        notify_at: Vec::new(),
        policies: vec![p("a", 25, 60_000), p("b", 40, 60_000)],
        concurrency: None,
        report_only: false,
    };
    let (mut windows, mut ledger) = (Vec::new(), Ledger::default());
    let g = grant(
        &mut windows,
        &mut ledger,
        &limits,
        &ask_of("AMS", 1, 20),
        &s,
        at(T0),
    );
    assert_eq!(
        g.blocks.iter().map(|b| b.units).collect::<Vec<_>>(),
        vec![12, 12]
    );
    // Then 13 and 28 are left: not worth a first block to another edge…
    let g = grant(
        &mut windows,
        &mut ledger,
        &limits,
        &ask_of("CDG", 2, 20),
        &s,
        at(T0 + 1),
    );
    assert_eq!(
        g.blocks.iter().map(|b| b.units).collect::<Vec<_>>(),
        vec![0, 0]
    );
    // …while the edge that holds a lease is topped up: 13 / (2 × 2 active).
    let g = grant(
        &mut windows,
        &mut ledger,
        &limits,
        &ask_of("AMS", 3, 20),
        &s,
        at(T0 + 2),
    );
    assert_eq!(
        g.blocks.iter().map(|b| b.units).collect::<Vec<_>>(),
        vec![3, 3]
    );
    assert_eq!((used(&windows, "a"), used(&windows, "b")), (15, 15));
}

#[test]
fn under_a_concurrency_quota_units_come_only_with_slots() {
    let s = on(100);
    let limits = Limits {
        notify_at: Vec::new(),
        policies: vec![p("minute", 1_000, 60_000)],
        concurrency: Some(1),
        report_only: false,
    };
    let (mut windows, mut ledger) = (Vec::new(), Ledger::default());
    let mut e = Edge::new("GRU", 3, T0);
    e.demand = 20;
    let a = e.ask(&limits, &s, T0).unwrap();
    assert_eq!(a.slots, Some(1));
    // One slot in all: half a fair share is 0, so no slot and no unit.
    let g = grant(&mut windows, &mut ledger, &limits, &a, &s, at(T0));
    assert_eq!(g.slots.map(|x| x.slots), Some(0));
    assert_eq!(g.blocks[0].units, 0);
    assert_eq!(used(&windows, "minute"), 0, "nothing charged for the edge");
    assert!(e.apply(&g, T0));
    assert_eq!(e.admit(&limits, 1, true, T0 + 1), EdgeDecision::Forward);
    // With room for slots, units come with them.
    let limits = Limits {
        notify_at: Vec::new(),
        concurrency: Some(8),
        ..limits
    };
    let a = e.ask(&limits, &s, T0 + 2).unwrap();
    let g = grant(&mut windows, &mut ledger, &limits, &a, &s, at(T0 + 2));
    assert!(g.slots.is_some_and(|x| x.slots > 0) && g.blocks[0].units > 0);
}

#[test]
fn what_the_home_said_of_a_forwarded_request_makes_a_refusal_local() {
    let s = on(100);
    let limits = one(30, 60_000);
    let (mut windows, mut ledger) = (Vec::new(), Ledger::default());
    let mut e = edge_with("SYD", &mut windows, &mut ledger, &limits, &s, T0);
    let start = e.pots[0].window_start;
    let granted = e.pots[0].left;
    assert!(granted > 0 && e.pots[0].home_left > 0);
    for _ in 0..granted {
        assert!(matches!(
            e.admit(&limits, 1, false, T0 + 1),
            EdgeDecision::Admit { .. }
        ));
    }
    // Out of units, the home still had some: forward.
    assert_eq!(e.admit(&limits, 1, false, T0 + 2), EdgeDecision::Forward);
    // Another window's figure is ignored; a higher one never raises it.
    e.heard("minute", start + 60_000, 0);
    e.heard("minute", start, 1_000);
    assert_eq!(e.admit(&limits, 1, false, T0 + 3), EdgeDecision::Forward);
    // The home answered a forwarded request with nothing left: refused
    // here until the window ends, never early.
    e.heard("minute", start, 0);
    let EdgeDecision::Refuse { verdicts } = e.admit(&limits, 1, false, T0 + 4) else {
        panic!("a local refusal");
    };
    assert!(verdicts.binding_verdict().reset_ms >= start + 60_000);
}

#[test]
fn a_lease_ends_with_its_window_and_a_late_answer_adds_nothing() {
    let s = on(100);
    let limits = one(100, 10_000);
    let (mut windows, mut ledger) = (Vec::new(), Ledger::default());
    // The window opens at T0 (the first grant); the edge asks at T0 + 9,000.
    grant(
        &mut windows,
        &mut ledger,
        &limits,
        &ask_of("HOME", 1, 1),
        &s,
        at(T0),
    );
    let mut e = Edge::new("FRA", 500, T0);
    e.demand = 40;
    let a = e.ask(&limits, &s, T0 + 9_000).unwrap();
    // The home answers 80 ms later, the answer arrives 160 ms after the ask.
    let g = grant(&mut windows, &mut ledger, &limits, &a, &s, at(T0 + 9_080));
    assert_eq!(
        g.blocks[0].expires_at,
        T0 + 10_000,
        "capped by the window end"
    );
    assert!(e.apply(&g, T0 + 9_160));
    // Counted from the ask: it lapses 80 ms before the real end.
    assert_eq!(e.pots[0].admit_until, T0 + 9_920);
    assert_eq!(
        e.pots[0].reset_at,
        T0 + 10_080,
        "t and Retry-After from the answer"
    );
    assert!(matches!(
        e.admit(&limits, 1, false, T0 + 9_919),
        EdgeDecision::Admit { .. }
    ));
    assert!(!matches!(
        e.admit(&limits, 1, false, T0 + 9_920),
        EdgeDecision::Admit { .. }
    ));
    // The same answer again (a retried call) adds nothing.
    let left = e.pots[0].left;
    assert!(!e.apply(&g, T0 + 9_921));
    assert_eq!(e.pots[0].left, left);
    // An answer that arrives after the window ended adds nothing either.
    let a = e.ask(&limits, &s, T0 + 9_930).unwrap();
    let g = grant(&mut windows, &mut ledger, &limits, &a, &s, at(T0 + 9_990));
    assert!(g.blocks[0].units > 0);
    assert!(e.apply(&g, T0 + 10_050));
    assert!(e.pots.iter().all(|x| !x.live(T0 + 10_050)));
    assert!(!matches!(
        e.admit(&limits, 1, false, T0 + 10_050),
        EdgeDecision::Admit { .. }
    ));
}

#[test]
fn a_renewal_brings_a_lapsed_leases_units_back() {
    let s = on(100);
    let limits = one(1_000, 3_600_000);
    let (mut windows, mut ledger) = (Vec::new(), Ledger::default());
    let mut e = Edge::new("JNB", 1, T0);
    e.demand = 10;
    let a = e.ask(&limits, &s, T0).unwrap();
    let g = grant(&mut windows, &mut ledger, &limits, &a, &s, at(T0));
    assert!(e.apply(&g, T0));
    assert_eq!(e.pots[0].left, 20);
    for _ in 0..5 {
        assert!(matches!(
            e.admit(&limits, 1, false, T0 + 1),
            EdgeDecision::Admit { .. }
        ));
    }
    // The lease lapses after lease_ms (the hour-long window runs on).
    assert_eq!(
        e.admit(&limits, 1, false, T0 + 10_000),
        EdgeDecision::Forward
    );
    let a = e.ask(&limits, &s, T0 + 10_000).unwrap();
    assert_eq!(a.have, vec![("minute".to_string(), 15)]);
    let g = grant(&mut windows, &mut ledger, &limits, &a, &s, at(T0 + 10_050));
    assert_eq!(g.blocks[0].units, 0, "what it holds covers what it wants");
    assert!(e.apply(&g, T0 + 10_100));
    assert_eq!(e.pots[0].left, 15, "the lapsed units are usable again");
    assert!(matches!(
        e.admit(&limits, 1, false, T0 + 10_101),
        EdgeDecision::Admit { .. }
    ));
    assert_eq!(used(&windows, "minute"), 20, "charged once");
}

#[test]
fn a_repeated_ask_is_answered_again_and_charged_once() {
    let s = on(100);
    let limits = one(100, 60_000);
    let (mut windows, mut ledger) = (Vec::new(), Ledger::default());
    let a = ask_of("FRA", 9, 30);
    let g1 = grant(&mut windows, &mut ledger, &limits, &a, &s, at(T0));
    let g2 = grant(&mut windows, &mut ledger, &limits, &a, &s, at(T0 + 5));
    assert_eq!(g1, g2);
    assert_eq!(used(&windows, "minute"), 30);
    assert_eq!(ledger.policies[0].leased, 30);
}

#[test]
fn every_policy_is_topped_up_to_the_same_level() {
    let s = on(1_000);
    let limits = Limits {
        notify_at: Vec::new(),
        policies: vec![p("burst", 40, 1_000), p("minute", 1_000, 60_000)],
        concurrency: None,
        report_only: false,
    };
    let (mut windows, mut ledger) = (Vec::new(), Ledger::default());
    // burst's half share (20) binds: minute is leased no more than that.
    let g = grant(
        &mut windows,
        &mut ledger,
        &limits,
        &ask_of("FRA", 1, 100),
        &s,
        at(T0),
    );
    assert_eq!((g.blocks[0].units, g.blocks[1].units), (20, 20));
    // A second later burst has a new window; the edge still holds 15 of
    // minute, so minute is topped up to burst's level and no further.
    let mut a = ask_of("FRA", 2, 100);
    a.have = vec![("minute".into(), 15)];
    let g = grant(&mut windows, &mut ledger, &limits, &a, &s, at(T0 + 1_000));
    assert_eq!((g.blocks[0].units, g.blocks[1].units), (20, 5));
    assert_eq!(used(&windows, "minute"), 25);
    // An edge admits only what every policy's lease covers: all or none.
    let mut e = edge_with("AMS", &mut windows, &mut ledger, &limits, &s, T0 + 1_001);
    let before: Vec<u32> = e.pots.iter().map(|x| x.left).collect();
    let n = before.iter().copied().min().unwrap();
    for _ in 0..n {
        assert!(matches!(
            e.admit(&limits, 1, false, T0 + 1_002),
            EdgeDecision::Admit { .. }
        ));
    }
    assert!(!matches!(
        e.admit(&limits, 1, false, T0 + 1_002),
        EdgeDecision::Admit { .. }
    ));
    let after: Vec<u32> = e.pots.iter().map(|x| x.left).collect();
    assert_eq!(after, before.iter().map(|b| b - n).collect::<Vec<_>>());
}

#[test]
fn a_refusal_at_the_edge_is_never_early() {
    let s = on(1_000);
    let limits = one(10, 60_000);
    let (mut windows, mut ledger) = (Vec::new(), Ledger::default());
    let mut e = edge_with("FRA", &mut windows, &mut ledger, &limits, &s, T0 + 20_000);
    assert_eq!(e.pots[0].left, 1, "10 / 2, wanting min_block");
    assert!(matches!(
        e.admit(&limits, 1, false, T0 + 20_001),
        EdgeDecision::Admit { .. }
    ));
    // The home spends the rest itself.
    let c = limits::check_all(&windows, &limits.policies, T0 + 20_002, 9);
    assert!(c.verdicts.admitted());
    windows = c.windows.unwrap_or(windows);
    assert_eq!(used(&windows, "minute"), 10);
    // The edge still thinks the home has 9: it forwards, and learns.
    assert_eq!(
        e.admit(&limits, 1, false, T0 + 20_003),
        EdgeDecision::Forward
    );
    let a = e.ask(&limits, &s, T0 + 20_003).unwrap();
    let g = grant(&mut windows, &mut ledger, &limits, &a, &s, at(T0 + 20_050));
    assert_eq!(g.blocks[0].left, 0);
    assert!(e.apply(&g, T0 + 20_100));
    let EdgeDecision::Refuse { verdicts } = e.admit(&limits, 1, false, T0 + 30_000) else {
        panic!("refused here");
    };
    // The window ends at T0 + 80,000 (home clock); counted from the answer.
    let v = verdicts.binding_verdict();
    assert_eq!(v.reset_ms, T0 + 80_050);
    assert_eq!(v.retry_after_s(), 51);
    assert!(T0 + 30_000 + v.retry_after_s() * 1000 >= T0 + 80_000);
    assert_eq!(verdicts.violated(), ["minute"]);
}

#[test]
fn the_home_remainder_as_last_seen_would_overstate() {
    // The issue proposed `r` = the lease's remainder + the home's unleased
    // remainder as last seen. Another location can spend the latter in the
    // meantime, so that sum can exceed what is admittable anywhere; `r` is
    // the lease's remainder alone.
    let s = on(1_000);
    let limits = one(100, 60_000);
    let (mut windows, mut ledger) = (Vec::new(), Ledger::default());
    let mut fra = edge_with("FRA", &mut windows, &mut ledger, &limits, &s, T0);
    fra.demand = 10;
    let a = fra.ask(&limits, &s, T0 + 1).unwrap();
    let g = grant(&mut windows, &mut ledger, &limits, &a, &s, at(T0 + 1));
    assert!(fra.apply(&g, T0 + 1));
    let seen = fra.pots[0].home_left;
    // The home then admits everything it has not leased.
    let c = limits::check_all(&windows, &limits.policies, T0 + 2, seen);
    assert!(c.verdicts.admitted());
    windows = c.windows.unwrap_or(windows);
    let EdgeDecision::Admit { verdicts, .. } = fra.admit(&limits, 1, false, T0 + 3) else {
        panic!("admitted from the lease");
    };
    // What is admittable anywhere: the home's unleased units (none now) and
    // this edge's lease (no other edge holds any).
    let unleased = 100 - used(&windows, "minute");
    let truth = unleased + fra.pots[0].left;
    assert_eq!((unleased, verdicts.said[0].verdict.remaining), (0, truth));
    let proposed = fra.pots[0].left + seen;
    assert!(
        proposed > truth,
        "the proposed r={proposed} overstates {truth}"
    );
}

#[test]
fn an_edge_clock_ahead_or_behind_never_outlives_the_window() {
    let s = on(100);
    let limits = one(100, 10_000);
    for offset in [-5_000i64, 0, 7_000] {
        let (mut windows, mut ledger) = (Vec::new(), Ledger::default());
        let local = |t: u64| t.saturating_add_signed(offset);
        let mut e = Edge::new("SYD", 1, local(T0));
        let a = e.ask(&limits, &s, local(T0)).unwrap();
        let g = grant(&mut windows, &mut ledger, &limits, &a, &s, at(T0 + 150));
        assert!(e.apply(&g, local(T0 + 300)));
        let end = window_of(&windows, "minute").unwrap().start_ms + 10_000;
        // The last real instant the edge admits is before the real end.
        assert!(e.pots[0].live(local(end - 151)));
        assert!(!e.pots[0].live(local(end - 150)));
        assert!(e.pots[0].reset_at >= local(end));
    }
}

#[test]
fn a_clock_that_steps_back_ends_the_edges_life() {
    let s = on(100);
    let limits = one(100, 60_000);
    let (mut windows, mut ledger) = (Vec::new(), Ledger::default());
    let mut e = edge_with("GRU", &mut windows, &mut ledger, &limits, &s, T0 + 5_000);
    let life = e.life;
    assert!(!e.pots.is_empty());
    assert_eq!(
        e.admit(&limits, 1, false, T0 + 4_999),
        EdgeDecision::Forward
    );
    assert!(e.pots.is_empty());
    assert_ne!(e.life, life);
}

#[test]
fn returned_units_stay_spent_and_the_edge_stops_counting() {
    let s = on(1_000);
    let limits = one(1_000, 60_000);
    let (mut windows, mut ledger) = (Vec::new(), Ledger::default());
    let mut fra = edge_with("FRA", &mut windows, &mut ledger, &limits, &s, T0);
    let _ams = edge_with("AMS", &mut windows, &mut ledger, &limits, &s, T0);
    let used_before = used(&windows, "minute");
    let ret = fra.give_back(T0 + 10);
    assert!(fra.pots.is_empty());
    return_unused(&mut ledger, &ret, T0 + 10);
    return_unused(&mut ledger, &ret, T0 + 11); // repeated: capped
    assert_eq!(used(&windows, "minute"), used_before, "not credited");
    let h = &ledger.policies[0].holders[0];
    assert_eq!((h.edge.as_str(), h.returned), ("FRA", h.leased));
    // Two active edges before, one now (AMS) plus the asker.
    let g = grant(
        &mut windows,
        &mut ledger,
        &limits,
        &ask_of("LHR", 3, 1_000),
        &s,
        at(T0 + 12),
    );
    let unleased = 1_000 - used_before;
    assert_eq!(g.blocks[0].units, unleased / 4);
    // A return naming another window is ignored.
    let stale = Return {
        edge: "AMS".into(),
        unused: vec![("minute".into(), T0 - 60_000, 5)],
    };
    let before = ledger.clone();
    return_unused(&mut ledger, &stale, T0 + 13);
    assert_eq!(ledger, before);
}

#[test]
fn slots_outlive_every_request_started_on_them() {
    let s = on(100);
    let limits = Limits {
        notify_at: Vec::new(),
        policies: vec![p("minute", 1_000, 60_000)],
        concurrency: Some(8),
        report_only: false,
    };
    let (mut windows, mut ledger) = (Vec::new(), Ledger::default());
    let home = AtHome {
        now: T0,
        in_use: 2,
        request_ms: 30_000,
    };
    let mut e = Edge::new("NRT", 40, T0);
    e.demand = 50;
    let mut a = e.ask(&limits, &s, T0).unwrap();
    a.slots = Some(5);
    let g = grant(&mut windows, &mut ledger, &limits, &a, &s, home);
    let sg = g.slots.unwrap();
    assert_eq!(sg.slots, 3, "half of the 6 free");
    assert_eq!(sg.expires_at, T0 + 10_000 + 30_000);
    assert_eq!(sg.start_by, T0 + 10_000);
    assert_eq!(in_use_with_leases(&ledger, 2, T0 + 1), 5);
    assert_eq!(in_use_with_leases(&ledger, 2, T0 + 40_000), 2, "expired");
    assert!(e.apply(&g, T0 + 100));
    let mut lives = Vec::new();
    for _ in 0..3 {
        let EdgeDecision::Admit { slot, .. } = e.admit(&limits, 1, true, T0 + 200) else {
            panic!("a leased slot");
        };
        lives.push(slot);
    }
    assert_eq!(lives, vec![Some(e.life); 3]);
    // All three taken, no ask in flight: the next one goes to the home.
    assert_eq!(e.admit(&limits, 1, true, T0 + 201), EdgeDecision::Forward);
    e.end_request(e.life.wrapping_add(1)); // another life's slot: ignored
    assert_eq!(e.slots.unwrap().in_use, 3);
    e.end_request(e.life);
    assert!(matches!(
        e.admit(&limits, 1, true, T0 + 202),
        EdgeDecision::Admit { .. }
    ));
    // No request starts on a slot once it could outlive the lease (the
    // windows' lease lapses at the same instant here; the slot's own rule
    // holds whatever the windows say).
    e.end_request(e.life);
    let pot = e.slots.unwrap();
    assert_eq!((pot.start_by, pot.until), (T0 + 10_000, T0 + 40_000));
    assert!(pot.can_start(T0 + 9_999));
    assert!(!pot.can_start(T0 + 10_000), "it could outlive the lease");
    assert_eq!(
        e.admit(&limits, 1, true, T0 + 10_000),
        EdgeDecision::Forward
    );
    // A crashed edge's new life does not inherit the old life's slots.
    let mut again = Edge::new("NRT", 9_000, T0 + 300);
    let mut a = again.ask(&limits, &s, T0 + 300).unwrap();
    a.slots = Some(5);
    let g = grant(
        &mut windows,
        &mut ledger,
        &limits,
        &a,
        &s,
        AtHome {
            now: T0 + 300,
            ..home
        },
    );
    assert_eq!(
        g.slots.unwrap().slots,
        0,
        "(8 - 2 - 3 held by the old life) / 4"
    );
    assert_eq!(
        ledger.slots.holders.len(),
        1,
        "the old life's, until it expires"
    );
}

#[test]
fn settings_validate_and_name_the_leaf_field() {
    assert_eq!(EdgeLimits::default().validate(), Ok(()));
    assert!(!EdgeLimits::default().enabled, "off until measured");
    let bad = [
        (
            EdgeLimits {
                max_block: 0,
                ..Default::default()
            },
            "limits.edge.max_block",
        ),
        (
            EdgeLimits {
                min_block: 2_000,
                ..Default::default()
            },
            "limits.edge.min_block",
        ),
        (
            EdgeLimits {
                min_block: 0,
                ..Default::default()
            },
            "limits.edge.min_block",
        ),
        (
            EdgeLimits {
                prefetch_at_pct: 100,
                ..Default::default()
            },
            "limits.edge.prefetch_at_pct",
        ),
        (
            EdgeLimits {
                lease_ms: 500,
                ..Default::default()
            },
            "limits.edge.lease_ms",
        ),
        (
            EdgeLimits {
                shards: 0,
                ..Default::default()
            },
            "limits.edge.shards",
        ),
    ];
    for (s, field) in bad {
        let e = s.validate().unwrap_err();
        assert_eq!(e.field, field);
        assert!(
            e.to_string()
                .starts_with(&format!("{field}: must be between")),
            "{e}"
        );
    }
    // Off: the home leases nothing and the edge forwards everything.
    let limits = one(100, 60_000);
    let (mut windows, mut ledger) = (Vec::new(), Ledger::default());
    let mut e = Edge::new("FRA", 1, T0);
    let off = EdgeLimits::default();
    let a = e.ask(&limits, &off, T0).unwrap();
    let g = grant(&mut windows, &mut ledger, &limits, &a, &off, at(T0));
    assert!(g.blocks.is_empty() && windows.is_empty() && ledger == Ledger::default());
    assert!(e.apply(&g, T0));
    assert_eq!(e.admit(&limits, 1, false, T0), EdgeDecision::Forward);
    let parsed: EdgeLimits = serde_json::from_str(r#"{"enabled": true, "max_block": 50}"#).unwrap();
    assert_eq!(
        (parsed.enabled, parsed.max_block, parsed.lease_ms),
        (true, 50, DEFAULT_LEASE_MS)
    );
    assert!(serde_json::from_str::<EdgeLimits>(r#"{"max_blocks": 5}"#).is_err());
}

#[test]
fn asks_and_grants_travel_as_json() {
    let s = on(100);
    let limits = one(100, 60_000);
    let (mut windows, mut ledger) = (Vec::new(), Ledger::default());
    let a = ask_of("FRA", 1, 10);
    let g = grant(&mut windows, &mut ledger, &limits, &a, &s, at(T0));
    let a2: Ask = serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
    let g2: Grant = serde_json::from_str(&serde_json::to_string(&g).unwrap()).unwrap();
    let l2: Ledger = serde_json::from_str(&serde_json::to_string(&ledger).unwrap()).unwrap();
    assert_eq!((a2, g2, l2), (a, g, ledger));
}

mod model;
