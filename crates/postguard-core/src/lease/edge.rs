//! The edge side: one key's leases in one location's object.
//!
//! The edge admits a request when every policy's lease is live and covers
//! the cost (and a leased slot is free, if the request takes one); refuses
//! it when some policy's lease cannot cover it and the home had fewer units
//! than the cost left when it last answered — a figure that only falls
//! within the window, so no admission of that cost is possible here until
//! the window ends; waits when an ask in flight may cover it; otherwise
//! forwards it to the home. Its state is memory only: a crash loses it, and
//! the units it held stay spent at the home.

use serde::{Deserialize, Serialize};

use super::home::Return;
use super::slots::SlotPot;
use super::{Ask, Block, EdgeLimits, Grant};
use crate::limits::{self, Inflight, Limits, Policy, Said, Verdicts};
use crate::rate_limit::Verdict;

/// One policy's lease at the edge. `admit_until`, `ends_by` and `reset_at`
/// are on the edge's clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pot {
    pub policy: String,
    /// Units still admittable here.
    pub left: u32,
    /// The last block granted (the prefetch threshold is a share of it).
    pub block: u32,
    /// The home's unleased units when it last answered.
    pub home_left: u32,
    /// The window the units belong to (home clock), to merge blocks.
    pub window_start: u64,
    /// Admits nothing from this instant on: the lease's expiry or the
    /// window's end, counted from the ask, so at or before the real one.
    pub admit_until: u64,
    /// The window's end counted from the ask (at or before the real end).
    pub ends_by: u64,
    /// The window's end counted from the answer (at or after the real end):
    /// what `Retry-After` and `t` count to.
    pub reset_at: u64,
}

impl Pot {
    pub fn live(&self, now: u64) -> bool {
        now < self.admit_until
    }
}

/// An ask in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    pub id: u64,
    pub asked_at: u64,
    /// After this the edge stops waiting for the answer and may ask again;
    /// the answer is still taken if it comes (once) while remembered.
    pub give_up_at: u64,
}

/// How many asks an edge remembers: an answer to an ask it forgot adds
/// nothing (its units stay spent at the home).
pub const REMEMBERED_ASKS: usize = 4;

/// One key's state in one location's object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Edge {
    /// The location (`request.cf.colo`).
    pub name: String,
    pub life: u64,
    pub next_ask: u64,
    pub pots: Vec<Pot>,
    pub slots: Option<SlotPot>,
    /// Asks not yet answered, oldest first (at most `REMEMBERED_ASKS`).
    pub pending: Vec<Pending>,
    /// Units asked of this edge since its last ask, whatever it decided
    /// (a refused request counts: when the next window opens it will be
    /// back): the next block it wants is twice that.
    pub demand: u32,
    /// The latest instant seen: a clock that steps back ends the life.
    pub last_now: u64,
}

/// What the edge does with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EdgeDecision {
    /// Admitted from the leases. `verdicts` give the headers (`r` is what
    /// this edge still holds: a lower bound); `slot` names the life whose
    /// leased slot the request took (give it back with `end_request`).
    Admit {
        verdicts: Verdicts,
        slot: Option<u64>,
    },
    /// Refused here: some policy's lease cannot cover the cost and the home
    /// had fewer units left than that. `Retry-After` is the binding
    /// verdict's, counted to the window's end as the answer arrived.
    Refuse { verdicts: Verdicts },
    /// An ask is in flight that may cover it: decide again when it is
    /// answered, or given up (a quarter of `lease_ms` after it was sent) —
    /// no longer than forwarding would take when the answer comes.
    Wait,
    /// Send it to the home (with an ask if `Edge::ask` gives one).
    Forward,
}

impl Edge {
    /// A new life of the edge `name`; `seed` is random bits (a new life's
    /// ask ids must not repeat an old life's).
    pub fn new(name: &str, seed: u64, now: u64) -> Edge {
        Edge {
            name: name.to_string(),
            life: seed,
            next_ask: seed,
            pots: Vec::new(),
            slots: None,
            pending: Vec::new(),
            demand: 0,
            last_now: now,
        }
    }

    /// Notes the clock. A step back makes every deadline counted on the old
    /// clock unsafe: the edge starts a new life without leases (their units
    /// stay spent at the home, its slots are counted until they expire).
    fn observe(&mut self, now: u64) {
        if now < self.last_now {
            self.life = self.next_ask;
            self.next_ask = self.next_ask.wrapping_add(1);
            self.pots.clear();
            self.slots = None;
            self.pending.clear();
        }
        self.last_now = now;
    }

    fn pot(&self, policy: &str) -> Option<&Pot> {
        self.pots.iter().find(|p| p.policy == policy)
    }

    fn covers(&self, p: &Policy, cost: u32, now: u64) -> bool {
        self.pot(&p.name)
            .is_some_and(|x| x.live(now) && x.left >= cost)
    }

    /// Whether no request of `cost` can be admitted under `p` here before
    /// the window ends: the lease cannot cover it and neither could the
    /// home when it last answered.
    fn exhausted(&self, p: &Policy, cost: u32, now: u64) -> bool {
        self.pot(&p.name)
            .is_some_and(|x| x.live(now) && x.left < cost && x.home_left < cost)
    }

    /// Decides a request of `cost` at `now`; `slot`: it takes a concurrency
    /// slot (the key has a concurrency quota and the request goes to the
    /// origin).
    pub fn admit(&mut self, limits: &Limits, cost: u32, slot: bool, now: u64) -> EdgeDecision {
        self.observe(now);
        self.demand = self.demand.saturating_add(cost);
        let policies = &limits.policies;
        let slot = slot && limits.concurrency.is_some();
        let covered = !policies.is_empty() && policies.iter().all(|p| self.covers(p, cost, now));
        let slot_free = !slot || self.slots.is_some_and(|s| s.can_start(now));
        if covered && slot_free {
            let taken = self.take(policies, cost, slot);
            let verdicts =
                self.verdicts(limits, &vec![false; policies.len()], taken.is_some(), now);
            return EdgeDecision::Admit {
                verdicts,
                slot: taken,
            };
        }
        let refused: Vec<bool> = policies
            .iter()
            .map(|p| self.exhausted(p, cost, now))
            .collect();
        if refused.contains(&true) {
            let verdicts = self.verdicts(limits, &refused, false, now);
            return EdgeDecision::Refuse { verdicts };
        }
        match self.waiting(now) {
            true => EdgeDecision::Wait,
            false => EdgeDecision::Forward,
        }
    }

    /// Charges an admitted request to every policy's lease (and a slot):
    /// the life whose slot it took.
    fn take(&mut self, policies: &[Policy], cost: u32, slot: bool) -> Option<u64> {
        for x in self.pots.iter_mut() {
            if policies.iter().any(|p| p.name == x.policy) {
                x.left = x.left.saturating_sub(cost);
            }
        }
        let s = self.slots.as_mut().filter(|_| slot)?;
        s.in_use = s.in_use.saturating_add(1);
        Some(self.life)
    }

    /// Whether an ask is in flight and not given up.
    fn waiting(&self, now: u64) -> bool {
        self.pending.iter().any(|p| now < p.give_up_at)
    }

    /// A request that took a leased slot of `life` has ended. A slot of an
    /// earlier life is not this life's to free.
    pub fn end_request(&mut self, life: u64) {
        if life != self.life {
            return;
        }
        if let Some(s) = self.slots.as_mut() {
            s.in_use = s.in_use.saturating_sub(1);
        }
    }

    /// Every policy's verdict as this edge knows it: `r` is this edge's
    /// remainder (a lower bound of what is admittable anywhere: the home's
    /// unleased units as last seen may have been spent since), `t` counts to
    /// the window's end as the answer arrived (never early), or to a whole
    /// window from now when the edge holds no live lease of the policy.
    fn verdicts(&self, limits: &Limits, refused: &[bool], slot: bool, now: u64) -> Verdicts {
        let said: Vec<Said> = limits
            .policies
            .iter()
            .zip(refused)
            .map(|(p, r)| Said {
                name: p.name.clone(),
                verdict: verdict(p, self.pot(&p.name).filter(|x| x.live(now)), !r, now),
            })
            .collect();
        let inflight = match (limits.concurrency, slot, self.slots) {
            (Some(limit), true, Some(s)) => Some(Inflight {
                limit,
                // `r` of "inflight" = the slots free here, a lower bound.
                in_use: limit.saturating_sub(s.slots.saturating_sub(s.in_use)),
                refused: false,
            }),
            _ => None,
        };
        Verdicts {
            binding: limits::binding(&said),
            said,
            inflight,
        }
    }

    /// An ask for the next blocks, unless one is in flight: it wants twice
    /// the demand since the last ask (at least `min_block`, at most
    /// `max_block`) and says what the edge holds.
    pub fn ask(&mut self, limits: &Limits, s: &EdgeLimits, now: u64) -> Option<Ask> {
        self.observe(now);
        if self.waiting(now) {
            return None;
        }
        let id = self.next_ask;
        self.next_ask = id.wrapping_add(1);
        let want = self
            .demand
            .saturating_mul(2)
            .max(s.min_block)
            .min(s.max_block);
        self.demand = 0;
        // Lapsed leases whose window may still run count: a renewal of the
        // same window brings their units back.
        let have = self
            .pots
            .iter()
            .filter(|x| now < x.ends_by)
            .map(|x| (x.policy.clone(), x.left))
            .collect();
        let slots = limits.concurrency.map(|_| self.slots_wanted(now));
        if self.pending.len() >= REMEMBERED_ASKS {
            self.pending.remove(0);
        }
        self.pending.push(Pending {
            id,
            asked_at: now,
            give_up_at: now.saturating_add(s.patience_ms()),
        });
        Some(Ask {
            edge: self.name.clone(),
            id,
            life: self.life,
            want,
            have,
            slots,
        })
    }

    /// Slots to hold in all: those held, or room for twice as many
    /// requests as are running, plus one.
    fn slots_wanted(&self, now: u64) -> u32 {
        let live = self.slots.filter(|s| now < s.until);
        live.map_or(1, |s| {
            s.slots.max(s.in_use.saturating_mul(2).saturating_add(1))
        })
    }

    /// An ask if a lease is missing, lapsed, down to `prefetch_at_pct` of
    /// its last block while the home has more, or about to lapse before its
    /// window ends (a renewal, which also keeps a refusal here local).
    pub fn should_prefetch(&mut self, limits: &Limits, s: &EdgeLimits, now: u64) -> Option<Ask> {
        self.observe(now);
        let soon = now.saturating_add(s.patience_ms());
        let low = |x: &Pot| {
            let at = u64::from(x.block) * u64::from(s.prefetch_at_pct) / 100;
            u64::from(x.left) <= at && x.home_left > 0
        };
        let renew = |x: &Pot| x.admit_until < x.ends_by && soon >= x.admit_until;
        let windows = limits.policies.iter().any(|p| match self.pot(&p.name) {
            Some(x) if x.live(now) => low(x) || renew(x),
            _ => true,
        });
        let slots = limits.concurrency.is_some()
            && self
                .slots
                .is_none_or(|x| x.in_use >= x.slots || soon >= x.start_by);
        match windows || slots {
            true => self.ask(limits, s, now),
            false => None,
        }
    }

    /// Takes the home's answer. False — nothing applied — unless it answers
    /// an ask this life remembers, which it then forgets: a repeated answer,
    /// one to a forgotten ask or to an earlier life adds nothing. A block
    /// whose lease has lapsed when it arrives is dropped (its units stay
    /// spent at the home).
    pub fn apply(&mut self, g: &Grant, now: u64) -> bool {
        self.observe(now);
        let Some(i) = self.pending.iter().position(|p| p.id == g.ask) else {
            return false;
        };
        let p = self.pending.remove(i);
        for b in &g.blocks {
            self.apply_block(b, g.home_now, p.asked_at, now);
        }
        if let Some(sg) = g.slots {
            self.slots = Some(SlotPot::after(self.slots, sg, g.home_now, p.asked_at, now));
        }
        true
    }

    fn apply_block(&mut self, b: &Block, home_now: u64, asked_at: u64, now: u64) {
        let span = |at: u64| at.saturating_sub(home_now);
        let fresh = Pot {
            policy: b.policy.clone(),
            left: b.units,
            block: b.units,
            home_left: b.left,
            window_start: b.window_start,
            admit_until: asked_at.saturating_add(span(b.expires_at.min(b.window_end))),
            ends_by: asked_at.saturating_add(span(b.window_end)),
            reset_at: now.saturating_add(span(b.window_end)),
        };
        if !fresh.live(now) {
            return;
        }
        match self.pots.iter_mut().find(|x| x.policy == b.policy) {
            // A lease of the same window, lapsed or not: its units are
            // charged to that window and unused, so they add up, and the
            // lease lives as long as the later of the two says.
            Some(x) if x.window_start == b.window_start => {
                x.left = x.left.saturating_add(b.units);
                if b.units > 0 {
                    x.block = b.units;
                }
                x.home_left = x.home_left.min(b.left);
                x.admit_until = x.admit_until.max(fresh.admit_until);
                x.ends_by = x.ends_by.max(fresh.ends_by);
                x.reset_at = x.reset_at.max(fresh.reset_at);
            }
            Some(x) => *x = fresh,
            None => self.pots.push(fresh),
        }
    }

    /// What the home said of `policy`'s window starting at `window_start`
    /// (home clock) in an answer to a forwarded request: `left` units not
    /// leased. Within a window that figure only falls, so the lower of the
    /// two is kept; a refusal it makes local stays true until the window
    /// ends. An answer about another window is ignored.
    pub fn heard(&mut self, policy: &str, window_start: u64, left: u32) {
        if let Some(x) = self
            .pots
            .iter_mut()
            .find(|x| x.policy == policy && x.window_start == window_start)
        {
            x.home_left = x.home_left.min(left);
        }
    }

    /// Gives up every lease (the location goes idle, or the object is about
    /// to be evicted): what to tell the home. The units stay spent there.
    pub fn give_back(&mut self, now: u64) -> Return {
        self.observe(now);
        let unused = self
            .pots
            .iter()
            .filter(|x| x.live(now))
            .map(|x| (x.policy.clone(), x.window_start, x.left))
            .collect();
        self.pots.clear();
        Return {
            edge: self.name.clone(),
            unused,
        }
    }

    /// Drops every lease and the ask in flight without a word to the home
    /// (the key was revoked or has expired: nothing more is admitted here).
    pub fn forget(&mut self) {
        self.pots.clear();
        self.pending.clear();
        if let Some(s) = self.slots.as_mut() {
            s.slots = 0;
        }
    }
}

/// One policy's verdict at the edge.
fn verdict(p: &Policy, pot: Option<&Pot>, admitted: bool, now: u64) -> Verdict {
    let window_ms = p.window_ms.max(1);
    let (remaining, reset_ms) = match pot {
        Some(x) => (x.left, x.reset_at.max(now)),
        None => (0, now.saturating_add(window_ms)),
    };
    let reset_in_s = reset_ms.saturating_sub(now).div_ceil(1000);
    Verdict {
        admitted,
        limit: p.limit,
        remaining,
        reset_ms,
        reset_in_s,
        reset_epoch_s: now / 1000 + reset_in_s,
        window_s: window_ms.div_ceil(1000),
    }
}
