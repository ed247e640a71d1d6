//! The model-based property test of the lease rules (its helpers in the parent module).

use super::*;

// ---------------------------------------------------------------------------
// The model-based property test.

#[derive(Debug, Clone)]
enum Step {
    /// A request of cost 1..=3 at edge i (taking a slot or not).
    Edge(usize, u32, bool),
    /// A request that reaches the home directly.
    Home(u32, bool),
    /// Edge i asks if its rules say so.
    Prefetch(usize),
    /// Edge i asks regardless (as with a forwarded request).
    Ask(usize),
    /// A message in flight is delivered (an ask to the home, an answer to an edge).
    Deliver(usize),
    /// A message in flight is duplicated.
    Duplicate(usize),
    /// A message in flight is lost.
    Drop(usize),
    /// Edge i gives its leases back (twice, if the flag says so).
    Return(usize, bool),
    /// Edge i crashes: its state is gone, it comes back with another clock.
    Crash(usize, i64),
    /// Edge i's clock jumps (back: noticed at once, as a request would).
    Clock(usize, i64),
    /// Time passes a little.
    Advance(u64),
    /// Time passes to just past policy i's window end.
    Cross(usize, u64),
    /// A request holding a slot ends.
    End(usize),
}

fn any_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        16 => (0usize..6, 1u32..=3, any::<bool>()).prop_map(|(e, c, s)| Step::Edge(e, c, s)),
        2 => (1u32..=3, any::<bool>()).prop_map(|(c, s)| Step::Home(c, s)),
        3 => (0usize..6).prop_map(Step::Prefetch),
        1 => (0usize..6).prop_map(Step::Ask),
        12 => any::<usize>().prop_map(Step::Deliver),
        2 => any::<usize>().prop_map(Step::Duplicate),
        1 => any::<usize>().prop_map(Step::Drop),
        1 => (0usize..6, any::<bool>()).prop_map(|(e, twice)| Step::Return(e, twice)),
        1 => (0usize..6, -2_000i64..2_000).prop_map(|(e, o)| Step::Crash(e, o)),
        1 => (0usize..6, -1_500i64..1_500).prop_map(|(e, d)| Step::Clock(e, d)),
        5 => (1u64..100).prop_map(Step::Advance),
        1 => (0usize..2, 0u64..3).prop_map(|(i, ms)| Step::Cross(i, ms)),
        3 => any::<usize>().prop_map(Step::End),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    offsets: Vec<i64>,
    limits: Limits,
    settings: EdgeLimits,
    request_ms: u64,
    /// Each `Advance` step's milliseconds are multiplied by this.
    scale: u64,
    steps: Vec<Step>,
}

fn any_case() -> impl Strategy<Value = Case> {
    (
        proptest::collection::vec(-2_000i64..2_000, 2..=6),
        (
            3u32..80,
            1_000u64..8_000,
            proptest::option::of((2u32..40, 2u64..5)),
        ),
        proptest::option::of(1u32..8),
        (1u32..20, 0u32..100, 2_000u64..6_000),
        500u64..3_000,
        proptest::collection::vec(any_step(), 1..160),
    )
        .prop_map(
            |(
                offsets,
                (limit, window_ms, burst),
                concurrency,
                (max_block, pct, lease_ms),
                request_ms,
                steps,
            )| {
                let mut policies = vec![p("minute", limit, window_ms)];
                if let Some((b, div)) = burst {
                    policies.insert(0, p("burst", b.min(limit), window_ms / div));
                }
                Case {
                    offsets,
                    limits: Limits {
                        notify_at: Vec::new(),
                        policies,
                        concurrency,
                        report_only: false,
                    },
                    settings: EdgeLimits {
                        enabled: true,
                        max_block,
                        min_block: 1 + max_block / 8,
                        prefetch_at_pct: pct.min(99),
                        lease_ms,
                        shards: 1,
                    },
                    request_ms,
                    scale: 1,
                    steps,
                }
            },
        )
}

/// Cases about concurrency slots: windows that never bind, slower time (so
/// slot leases lapse and requests outlive them), few slots.
fn any_slot_case() -> impl Strategy<Value = Case> {
    (
        proptest::collection::vec(-2_000i64..2_000, 2..=4),
        2u32..12,
        (1u32..8, 2_000u64..4_000),
        500u64..3_000,
        2u64..6,
        proptest::collection::vec(any_step(), 1..160),
    )
        .prop_map(
            |(offsets, concurrency, (max_block, lease_ms), request_ms, scale, steps)| Case {
                offsets,
                limits: Limits {
                    notify_at: Vec::new(),
                    policies: vec![p("minute", 1_000_000, 60_000)],
                    concurrency: Some(concurrency),
                    report_only: false,
                },
                settings: EdgeLimits {
                    enabled: true,
                    max_block,
                    min_block: 1,
                    prefetch_at_pct: 50,
                    lease_ms,
                    shards: 1,
                },
                request_ms,
                scale,
                steps: steps
                    .into_iter()
                    .map(|s| match s {
                        Step::Edge(e, c, _) => Step::Edge(e, c, true),
                        Step::Home(c, _) => Step::Home(c, true),
                        other => other,
                    })
                    .collect(),
            },
        )
}

/// How often each kind of event happened over all cases.
#[derive(Debug, Default)]
struct Seen {
    edge_admits: u64,
    edge_refusals: u64,
    forwards: u64,
    waits: u64,
    home_admits: u64,
    fresh_grants: u64,
    repeated_asks: u64,
    units_leased: u64,
    answers_ignored: u64,
    answers_after_window: u64,
    crashes_holding_units: u64,
    returns: u64,
    clock_steps_back: u64,
    window_crossings: u64,
    windows_closed_after_a_refusal: u64,
    edge_slot_admits: u64,
    units_stranded: u64,
    units_dead_on_arrival: u64,
    units_in_ignored_answers: u64,
    units_lost_in_crashes: u64,
    units_given_back: u64,
}

/// What happened in one window of one policy.
#[derive(Debug, Default, Clone)]
struct Tally {
    home: u64,
    edge: u64,
    /// The smallest cost refused in it.
    refused: Option<u32>,
    /// The window's `used` when last seen.
    used: u32,
    /// What the ledger leased in it when last seen.
    leased: u32,
    closed: bool,
}

#[derive(Clone)]
enum Msg {
    Ask(usize, Ask),
    Answer(usize, Grant),
}

struct Node {
    edge: Edge,
    offset: i64,
    lives: u64,
    /// Requests waiting for the ask in flight: (cost, slot).
    parked: Vec<(u32, bool)>,
    /// How far its clock jumped ahead in this life: a jump ahead brings
    /// deadlines closer (safe) but `Retry-After` earlier by as much.
    ahead: u64,
}

/// A request holding a slot: where (None: the home), which life, until when
/// (true time).
struct Flight {
    at: Option<usize>,
    life: u64,
    until: u64,
}

struct Model<'a> {
    c: &'a Case,
    now: u64,
    windows: Windows,
    ledger: Ledger,
    nodes: Vec<Node>,
    net: Vec<Msg>,
    flights: Vec<Flight>,
    tallies: BTreeMap<(usize, u64), Tally>,
    seen: &'a RefCell<Seen>,
}

fn seed(edge: usize, life: u64) -> u64 {
    (life << 40) | ((edge as u64) << 32)
}

impl<'a> Model<'a> {
    fn new(c: &'a Case, seen: &'a RefCell<Seen>) -> Self {
        let nodes = c
            .offsets
            .iter()
            .enumerate()
            .map(|(i, o)| Node {
                edge: Edge::new(&format!("E{i}"), seed(i, 0), T0.saturating_add_signed(*o)),
                offset: *o,
                lives: 0,
                parked: Vec::new(),
                ahead: 0,
            })
            .collect();
        Model {
            c,
            now: T0,
            windows: Vec::new(),
            ledger: Ledger::default(),
            nodes,
            net: Vec::new(),
            flights: Vec::new(),
            tallies: BTreeMap::new(),
            seen,
        }
    }

    fn local(&self, i: usize) -> u64 {
        self.now.saturating_add_signed(self.nodes[i].offset)
    }

    fn policies(&self) -> &'a [Policy] {
        &self.c.limits.policies
    }

    /// The home's window of policy `k` in force now: (start, end).
    fn window(&self, k: usize) -> Option<(u64, u64)> {
        let p = &self.policies()[k];
        window_of(&self.windows, &p.name)
            .map(|w| (w.start_ms, w.start_ms + p.window_ms))
            .filter(|(s, e)| *s <= self.now && self.now < *e)
    }

    fn unleased(&self, k: usize) -> u32 {
        let p = &self.policies()[k];
        limits::check_all(&self.windows, std::slice::from_ref(p), self.now, 0)
            .verdicts
            .binding_verdict()
            .remaining
    }

    fn home_in_use(&self) -> u32 {
        let n = self
            .flights
            .iter()
            .filter(|f| f.at.is_none() && f.until > self.now)
            .count();
        u32::try_from(n).unwrap()
    }

    fn at_home(&self) -> AtHome {
        AtHome {
            now: self.now,
            in_use: self.home_in_use(),
            request_ms: self.c.request_ms,
        }
    }

    fn cost(&self, c: u32) -> u32 {
        c.min(self.policies().iter().map(|p| p.limit).min().unwrap_or(1))
    }

    fn step(&mut self, step: &Step) -> Result<(), TestCaseError> {
        let n = self.nodes.len();
        match *step {
            Step::Edge(i, cost, slot) => self.at_edge(i % n, self.cost(cost), slot)?,
            Step::Home(cost, slot) => self.at_home_direct(self.cost(cost), slot)?,
            Step::Prefetch(i) => {
                let (i, now) = (i % n, self.local(i % n));
                if let Some(a) =
                    self.nodes[i]
                        .edge
                        .should_prefetch(&self.c.limits, &self.c.settings, now)
                {
                    self.net.push(Msg::Ask(i, a));
                }
            }
            Step::Ask(i) => self.ask(i % n),
            Step::Deliver(k) if !self.net.is_empty() => {
                let m = self.net.remove(k % self.net.len());
                self.deliver(m)?;
            }
            Step::Duplicate(k) if !self.net.is_empty() => {
                let m = self.net[k % self.net.len()].clone();
                self.net.push(m);
            }
            Step::Drop(k) if !self.net.is_empty() => {
                self.net.remove(k % self.net.len());
            }
            Step::Deliver(_) | Step::Duplicate(_) | Step::Drop(_) => {}
            Step::Return(i, twice) => {
                let (i, local) = (i % n, self.local(i % n));
                let ret = self.nodes[i].edge.give_back(local);
                self.seen.borrow_mut().units_given_back +=
                    ret.unused.iter().map(|u| u64::from(u.2)).sum::<u64>();
                return_unused(&mut self.ledger, &ret, self.now);
                if twice {
                    return_unused(&mut self.ledger, &ret, self.now);
                }
                self.seen.borrow_mut().returns += 1;
            }
            Step::Crash(i, offset) => {
                let i = i % n;
                if self.nodes[i].edge.pots.iter().any(|x| x.left > 0) {
                    let mut seen = self.seen.borrow_mut();
                    seen.crashes_holding_units += 1;
                    seen.units_lost_in_crashes += self.nodes[i]
                        .edge
                        .pots
                        .iter()
                        .map(|x| u64::from(x.left))
                        .sum::<u64>();
                }
                let node = &mut self.nodes[i];
                node.lives += 1;
                node.offset = offset;
                node.ahead = 0;
                node.parked.clear();
                let local = self.now.saturating_add_signed(offset);
                node.edge = Edge::new(&format!("E{i}"), seed(i, node.lives), local);
            }
            Step::Clock(i, d) => {
                let i = i % n;
                if d < 0 {
                    // A step back the edge notices: its clock reads before
                    // the last instant it saw, at its next call, made at
                    // once. (One that real time has overtaken by the next
                    // call is not noticeable; ADR 0040 assumes none while a
                    // lease lives.)
                    let last = self.nodes[i].edge.last_now;
                    let reads = last.saturating_sub(d.unsigned_abs());
                    self.nodes[i].offset =
                        i64::try_from(reads).unwrap() - i64::try_from(self.now).unwrap();
                    self.seen.borrow_mut().clock_steps_back += 1;
                    self.nodes[i].ahead = 0;
                    let local = self.local(i);
                    if let Some(a) =
                        self.nodes[i]
                            .edge
                            .should_prefetch(&self.c.limits, &self.c.settings, local)
                    {
                        self.net.push(Msg::Ask(i, a));
                    }
                } else {
                    self.nodes[i].offset += d;
                    self.nodes[i].ahead += d.unsigned_abs();
                }
            }
            Step::Advance(ms) => self.now += ms * self.c.scale,
            Step::Cross(k, ms) => {
                let k = k % self.policies().len();
                if let Some((_, end)) = self.window(k) {
                    self.now = end + ms;
                    self.seen.borrow_mut().window_crossings += 1;
                }
            }
            Step::End(k) => {
                self.flights.retain(|f| f.until > self.now);
                if !self.flights.is_empty() {
                    let f = self.flights.remove(k % self.flights.len());
                    if let Some(i) = f.at {
                        self.nodes[i].edge.end_request(f.life);
                    }
                }
            }
        }
        self.check()
    }

    fn ask(&mut self, i: usize) {
        let local = self.local(i);
        if let Some(a) = self.nodes[i]
            .edge
            .ask(&self.c.limits, &self.c.settings, local)
        {
            self.net.push(Msg::Ask(i, a));
        }
    }

    fn deliver(&mut self, m: Msg) -> Result<(), TestCaseError> {
        match m {
            Msg::Ask(i, a) => {
                let before = self.windows.clone();
                let in_force: Vec<Option<(u64, u32)>> = (0..self.policies().len())
                    .map(|k| {
                        self.window(k)
                            .map(|(s, _)| (s, used(&before, &self.policies()[k].name)))
                    })
                    .collect();
                let repeated = self
                    .ledger
                    .answers
                    .iter()
                    .any(|(e, g)| *e == a.edge && g.ask == a.id);
                let home = self.at_home();
                let g = grant(
                    &mut self.windows,
                    &mut self.ledger,
                    &self.c.limits,
                    &a,
                    &self.c.settings,
                    home,
                );
                if repeated {
                    prop_assert_eq!(&self.windows, &before, "a repeated ask charged again");
                }
                for (k, (pol, b)) in self.policies().iter().zip(&g.blocks).enumerate() {
                    if repeated || b.units == 0 {
                        continue;
                    }
                    // A fresh grant charges exactly its units to the window in
                    // force, and says truly what it left unleased.
                    prop_assert!(self.window(k).is_some_and(|(s, _)| s == b.window_start));
                    let was = in_force[k]
                        .filter(|(s, _)| *s == b.window_start)
                        .map_or(0, |(_, u)| u);
                    prop_assert_eq!(used(&self.windows, &pol.name) - was, b.units);
                    prop_assert_eq!(b.left, self.unleased(k));
                }
                let mut seen = self.seen.borrow_mut();
                match repeated {
                    true => seen.repeated_asks += 1,
                    false => {
                        seen.fresh_grants += 1;
                        seen.units_leased +=
                            g.blocks.iter().map(|b| u64::from(b.units)).sum::<u64>();
                    }
                }
                drop(seen);
                self.net.push(Msg::Answer(i, g));
            }
            Msg::Answer(i, g) => {
                let local = self.local(i);
                if g.blocks
                    .iter()
                    .any(|b| b.window_end <= self.now && b.units > 0)
                {
                    self.seen.borrow_mut().answers_after_window += 1;
                }
                let held = |e: &Edge| e.pots.iter().map(|x| u64::from(x.left)).sum::<u64>();
                let before = held(&self.nodes[i].edge);
                let units: u64 = g.blocks.iter().map(|b| u64::from(b.units)).sum();
                if !self.nodes[i].edge.apply(&g, local) {
                    let mut seen = self.seen.borrow_mut();
                    seen.answers_ignored += 1;
                    seen.units_in_ignored_answers += units;
                    return Ok(());
                }
                let gained = held(&self.nodes[i].edge).saturating_sub(before);
                self.seen.borrow_mut().units_dead_on_arrival += units.saturating_sub(gained);
                // The requests that waited for it are decided again (once).
                for (cost, slot) in std::mem::take(&mut self.nodes[i].parked) {
                    self.at_edge(i, cost, slot)?;
                }
            }
        }
        Ok(())
    }

    fn at_edge(&mut self, i: usize, cost: u32, slot: bool) -> Result<(), TestCaseError> {
        let local = self.local(i);
        let before: Vec<Option<u64>> = self
            .policies()
            .iter()
            .map(|p| {
                self.nodes[i]
                    .edge
                    .pots
                    .iter()
                    .find(|x| x.policy == p.name)
                    .map(|x| x.window_start)
            })
            .collect();
        match self.nodes[i].edge.admit(&self.c.limits, cost, slot, local) {
            EdgeDecision::Admit {
                verdicts,
                slot: taken,
            } => {
                self.seen.borrow_mut().edge_admits += 1;
                for (k, leased_from) in before.into_iter().enumerate() {
                    // Admitted only inside the home's window its lease is of.
                    let w = self.window(k);
                    prop_assert!(w.is_some(), "edge admitted outside any window of {}", k);
                    let (start, _) = w.unwrap_or_default();
                    prop_assert_eq!(leased_from, Some(start), "a lease of another window");
                    self.tally(k, start).edge += u64::from(cost);
                }
                if let Some(life) = taken {
                    self.seen.borrow_mut().edge_slot_admits += 1;
                    self.flights.push(Flight {
                        at: Some(i),
                        life,
                        until: self.now + self.c.request_ms,
                    });
                }
                self.honest(&verdicts)?;
            }
            EdgeDecision::Refuse { verdicts } => {
                self.seen.borrow_mut().edge_refusals += 1;
                self.refused(&verdicts, cost, self.nodes[i].ahead)?;
                self.honest(&verdicts)?;
            }
            EdgeDecision::Wait => {
                self.seen.borrow_mut().waits += 1;
                self.nodes[i].parked.push((cost, slot));
            }
            EdgeDecision::Forward => {
                self.seen.borrow_mut().forwards += 1;
                self.at_home_direct(cost, slot)?;
                self.ask(i);
            }
        }
        Ok(())
    }

    fn at_home_direct(&mut self, cost: u32, slot: bool) -> Result<(), TestCaseError> {
        let slot = slot && self.c.limits.concurrency.is_some();
        if slot {
            let in_use = in_use_with_leases(&self.ledger, self.home_in_use(), self.now);
            if !limits::slot_free(in_use, self.c.limits.concurrency.unwrap_or(0)) {
                return Ok(());
            }
        }
        let c = limits::check_all(&self.windows, self.policies(), self.now, cost);
        if let Some(w) = c.windows.clone() {
            self.windows = w;
        }
        if !c.verdicts.admitted() {
            return self.refused(&c.verdicts, cost, 0);
        }
        self.seen.borrow_mut().home_admits += 1;
        for k in 0..self.policies().len() {
            let (start, _) = self.window(k).unwrap_or_default();
            self.tally(k, start).home += u64::from(cost);
        }
        if slot {
            self.flights.push(Flight {
                at: None,
                life: 0,
                until: self.now + self.c.request_ms,
            });
        }
        Ok(())
    }

    fn tally(&mut self, k: usize, start: u64) -> &mut Tally {
        self.tallies.entry((k, start)).or_default()
    }

    /// A refusal is justified and its `Retry-After` is never early: every
    /// refusing policy's home had fewer unleased units than the cost (which
    /// stays so until the window ends), and the client that waits
    /// `Retry-After` comes back after the window's real end (less what the
    /// refusing edge's clock jumped ahead).
    fn refused(&mut self, v: &Verdicts, cost: u32, ahead: u64) -> Result<(), TestCaseError> {
        let retry_at = self.now + v.binding_verdict().retry_after_s() * 1000 + ahead;
        for (k, pol) in self.policies().iter().enumerate() {
            if !v.violated().contains(&pol.name) {
                continue;
            }
            let unleased = self.unleased(k);
            prop_assert!(
                unleased < cost,
                "refused {} with {} unleased at the home",
                cost,
                unleased
            );
            if let Some((start, end)) = self.window(k) {
                prop_assert!(
                    retry_at >= end,
                    "Retry-After {} before the window end {}",
                    retry_at,
                    end
                );
                let t = self.tally(k, start);
                t.refused = Some(t.refused.map_or(cost, |r| r.min(cost)));
            }
        }
        Ok(())
    }

    /// `r` never overstates what is admittable anywhere: the home's unleased
    /// units plus what every edge holds in a live lease.
    fn honest(&self, v: &Verdicts) -> Result<(), TestCaseError> {
        for (k, said) in v.said.iter().enumerate() {
            let held: u64 = self
                .nodes
                .iter()
                .enumerate()
                .flat_map(|(i, n)| {
                    let local = self.local(i);
                    n.edge
                        .pots
                        .iter()
                        .filter(move |x| x.live(local) && x.policy == said.name)
                })
                .map(|x| u64::from(x.left))
                .sum();
            let truth = u64::from(self.unleased(k)) + held;
            prop_assert!(
                u64::from(said.verdict.remaining) <= truth,
                "r={} > {}",
                said.verdict.remaining,
                truth
            );
        }
        Ok(())
    }

    /// After every step: quotas per window, the home's accounting, leases
    /// only of windows in force, and the concurrency quota.
    fn check(&mut self) -> Result<(), TestCaseError> {
        for (k, pol) in self.policies().iter().enumerate() {
            if let Some((start, _)) = self.window(k) {
                let w_used = used(&self.windows, &pol.name);
                let leased = self
                    .ledger
                    .policies
                    .iter()
                    .find(|l| l.policy == pol.name && l.window_start == start)
                    .map_or(0, |l| l.leased);
                let t = self.tally(k, start);
                t.used = w_used;
                t.leased = leased;
                let (home, edge) = (t.home, t.edge);
                prop_assert_eq!(
                    u64::from(w_used),
                    home + u64::from(leased),
                    "used = home + leased"
                );
                prop_assert!(
                    edge <= u64::from(leased),
                    "edges admitted {} of {} leased",
                    edge,
                    leased
                );
                // Every live lease is of the window in force.
                for (i, node) in self.nodes.iter().enumerate() {
                    let local = self.local(i);
                    for x in node
                        .edge
                        .pots
                        .iter()
                        .filter(|x| x.policy == pol.name && x.live(local))
                    {
                        prop_assert_eq!(x.window_start, start, "a live lease of an old window");
                    }
                }
            }
            for ((kk, start), t) in self.tallies.iter_mut().filter(|((kk, _), _)| *kk == k) {
                let admitted = t.home + t.edge;
                prop_assert!(
                    admitted <= u64::from(pol.limit),
                    "{}: {} admitted in window {}",
                    pol.name,
                    admitted,
                    start
                );
                let ended = self.now >= start + pol.window_ms;
                if ended && !t.closed {
                    t.closed = true;
                    close(pol, t, self.seen)?;
                }
                let _ = kk;
            }
        }
        if let Some(limit) = self.c.limits.concurrency {
            let running = self.flights.iter().filter(|f| f.until > self.now).count();
            prop_assert!(
                running <= limit as usize,
                "{} requests in flight of {}",
                running,
                limit
            );
        }
        Ok(())
    }
}

/// A window that ended: what was leased and not admitted is stranded, and if
/// anything was refused in it the rest was used: admitted ≥ limit −
/// stranded − (the refused cost − 1).
fn close(pol: &Policy, t: &Tally, seen: &RefCell<Seen>) -> Result<(), TestCaseError> {
    let admitted = t.home + t.edge;
    let stranded = u64::from(t.leased) - t.edge;
    seen.borrow_mut().units_stranded += stranded;
    prop_assert_eq!(
        admitted + stranded + u64::from(pol.limit.saturating_sub(t.used)),
        u64::from(pol.limit)
    );
    if let Some(c) = t.refused {
        seen.borrow_mut().windows_closed_after_a_refusal += 1;
        let floor = u64::from(pol.limit).saturating_sub(stranded + u64::from(c) - 1);
        prop_assert!(
            admitted >= floor,
            "{}: admitted {} < {} (stranded {})",
            pol.name,
            admitted,
            floor,
            stranded
        );
    }
    Ok(())
}

/// How many cases the model runs (reported in bench/RESULTS.md's section).
const CASES: u32 = 400;
const SLOT_CASES: u32 = 150;

/// Runs `cases` cases of `strategy` through the model; what happened.
fn run(cases: u32, strategy: impl Strategy<Value = Case>) -> Seen {
    let seen = RefCell::new(Seen::default());
    let mut runner = TestRunner::new(Config::with_cases(cases));
    let result = runner.run(&strategy, |c| {
        let mut m = Model::new(&c, &seen);
        for step in &c.steps {
            m.step(step)?;
        }
        // Close the windows still open: time runs on past their end.
        m.now += c
            .limits
            .policies
            .iter()
            .map(|p| p.window_ms)
            .max()
            .unwrap_or(0)
            + 1;
        m.check()
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let s = seen.into_inner();
    eprintln!("{s:?}");
    s
}

fn at_least(floors: &[(&str, u64, u64)]) {
    for (what, n, floor) in floors {
        assert!(n >= floor, "{what}: {n} < {floor}");
    }
}

#[test]
fn leases_never_over_admit_whatever_the_interleaving() {
    let s = run(CASES, any_case());
    // Every kind of event happened often enough to mean something (floors
    // at about 40 % of what 400 cases show).
    at_least(&[
        ("edge admissions", s.edge_admits, 450),
        ("edge refusals", s.edge_refusals, 500),
        ("forwards", s.forwards, 1_500),
        ("waits", s.waits, 2_000),
        ("home admissions", s.home_admits, 1_500),
        ("fresh grants", s.fresh_grants, 1_500),
        ("repeated asks", s.repeated_asks, 100),
        (
            "answers ignored (repeated, forgotten, other life)",
            s.answers_ignored,
            300,
        ),
        ("answers after their window", s.answers_after_window, 150),
        ("units dead on arrival", s.units_dead_on_arrival, 500),
        ("crashes holding units", s.crashes_holding_units, 30),
        ("returns", s.returns, 200),
        ("clock steps back", s.clock_steps_back, 100),
        ("window crossings", s.window_crossings, 200),
        (
            "windows closed after a refusal",
            s.windows_closed_after_a_refusal,
            120,
        ),
        // Fewer since units come only with slots and no block is below
        // min_block (~60 in 400 cases): the slot cases below cover slots.
        ("edge admissions on a leased slot", s.edge_slot_admits, 25),
    ]);
}

#[test]
fn leased_slots_never_exceed_the_concurrency_quota() {
    let s = run(SLOT_CASES, any_slot_case());
    at_least(&[
        ("edge admissions on a leased slot", s.edge_slot_admits, 80),
        ("home admissions", s.home_admits, 600),
        ("crashes", s.crashes_holding_units + s.returns, 30),
        ("clock steps back", s.clock_steps_back, 40),
    ]);
}
