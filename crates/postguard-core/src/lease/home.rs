//! The home side: the ledger kept beside the key's windows, and grants.
//!
//! A grant charges its units to the policy's window at once
//! (`limits::check_all` with the block as the cost), so the home's own
//! admissions, which go through `check_all` unchanged, only ever see what
//! is not leased. The ledger says to whom the window's leased units went;
//! it is bookkeeping for fair shares, repeated asks and returns, and losing
//! it loses no safety (the units stay charged in the window).

use serde::{Deserialize, Serialize};

use super::slots::SlotLedger;
use super::{block_for, Ask, AtHome, Block, EdgeLimits, Grant};
use crate::limits::{self, window_of, Limits, Policy, Windows};

/// What the home keeps beside its windows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    pub policies: Vec<PolicyLedger>,
    /// The last answer to each edge, repeated when its ask is repeated (a
    /// retried call): a repeated ask is never charged twice.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub answers: Vec<(String, Grant)>,
    #[serde(default)]
    pub slots: SlotLedger,
}

/// One policy's current window: what was leased in it, and to whom.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyLedger {
    pub policy: String,
    pub window_start: u64,
    /// Units leased in this window (all of them charged to it).
    pub leased: u32,
    /// Of those, units the edges said they will not use (still spent).
    pub returned: u32,
    pub holders: Vec<Holder>,
}

/// An edge that holds units of the window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub edge: String,
    pub leased: u32,
    pub returned: u32,
    /// Until when it counts as active for the fair share: its lease's
    /// expiry, or the instant it returned what it had.
    pub active_until: u64,
}

/// Units an edge gives back: `(policy, window_start, units)`. They stay
/// spent until the window ends; the edge no longer counts as active.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Return {
    pub edge: String,
    pub unused: Vec<(String, u64, u32)>,
}

/// One policy's window as the home sees it at `now`, and its block.
struct View<'a> {
    policy: &'a Policy,
    start: u64,
    end: u64,
    unleased: u32,
    block: u32,
}

/// The window of `p` in force at `now` (or the one a charge would open),
/// read without charging: its start, end and what is not yet used or leased.
fn peek(windows: &Windows, p: &Policy, now: u64) -> (u64, u64, u32) {
    let v = limits::check_all(windows, std::slice::from_ref(p), now, 0)
        .verdicts
        .binding_verdict();
    let start = v.reset_ms.saturating_sub(p.window_ms.max(1));
    (start, v.reset_ms, v.remaining)
}

/// Charges `units` to `p`'s window; false (nothing charged) if it would not
/// fit, which `grant` never asks.
fn charge(windows: &mut Windows, p: &Policy, units: u32, now: u64) -> bool {
    let c = limits::check_all(windows, std::slice::from_ref(p), now, units);
    if !c.verdicts.admitted() {
        return false;
    }
    if let Some(w) = c.windows {
        *windows = w;
    }
    true
}

fn have(ask: &Ask, policy: &str) -> u32 {
    ask.have
        .iter()
        .find(|(n, _)| n == policy)
        .map_or(0, |(_, u)| *u)
}

impl Ledger {
    /// The ledger of `policy`'s window starting at `start`: a ledger of an
    /// earlier window is emptied (its units ended with it).
    fn window_mut(&mut self, policy: &str, start: u64) -> &mut PolicyLedger {
        let fresh = || PolicyLedger {
            policy: policy.to_string(),
            window_start: start,
            leased: 0,
            returned: 0,
            holders: Vec::new(),
        };
        let i = match self.policies.iter().position(|l| l.policy == policy) {
            Some(i) => i,
            None => {
                self.policies.push(fresh());
                self.policies.len() - 1
            }
        };
        if self.policies[i].window_start != start {
            self.policies[i] = fresh();
        }
        &mut self.policies[i]
    }

    /// Edges active in `policy`'s window at `now`, the asker counted once.
    fn active_edges(&self, policy: &str, start: u64, asker: &str, now: u64) -> u32 {
        let others = self
            .policies
            .iter()
            .filter(|l| l.policy == policy && l.window_start == start)
            .flat_map(|l| &l.holders)
            .filter(|h| h.edge != asker && h.active_until > now)
            .count();
        u32::try_from(others).unwrap_or(u32::MAX).saturating_add(1)
    }

    /// Whether `edge` was leased units of `policy`'s window starting at `start`.
    fn holds(&self, policy: &str, start: u64, edge: &str) -> bool {
        self.policies
            .iter()
            .filter(|l| l.policy == policy && l.window_start == start)
            .flat_map(|l| &l.holders)
            .any(|h| h.edge == edge && h.leased > 0)
    }

    /// The answer already given to this ask, if it is repeated.
    fn answer_to(&self, ask: &Ask) -> Option<&Grant> {
        self.answers
            .iter()
            .find(|(e, g)| *e == ask.edge && g.ask == ask.id)
            .map(|(_, g)| g)
    }

    fn remember(&mut self, edge: &str, g: &Grant, s: &EdgeLimits) {
        // An answer older than a lease is no longer worth repeating: an
        // edge stops waiting for it after a quarter of one.
        let horizon = g.home_now.saturating_sub(s.lease_ms);
        self.answers
            .retain(|(e, old)| e != edge && old.home_now > horizon);
        self.answers.push((edge.to_string(), g.clone()));
    }
}

/// The home's decision on an edge's ask: for each policy, a block of its
/// current window (charged to it now), all policies topped up to the same
/// level so no policy's units wait behind another's; and concurrency slots
/// if the key has a concurrency quota (then units only with slots). A repeated ask gets the same answer
/// and is not charged again. With `limits.edge` off nothing is leased.
pub fn grant(
    windows: &mut Windows,
    ledger: &mut Ledger,
    limits: &Limits,
    ask: &Ask,
    s: &EdgeLimits,
    at: AtHome,
) -> Grant {
    if !s.enabled {
        return Grant {
            ask: ask.id,
            home_now: at.now,
            blocks: Vec::new(),
            slots: None,
        };
    }
    if let Some(g) = ledger.answer_to(ask) {
        return g.clone();
    }
    // The ledgers of policies the key no longer has are dropped.
    ledger
        .policies
        .retain(|l| limits.policies.iter().any(|p| p.name == l.policy));
    let now = at.now;
    let slots = match (limits.concurrency, ask.slots) {
        (Some(limit), Some(want)) => Some(ledger.slots.grant(ask, want, limit, s, at)),
        _ => None,
    };
    // Under a concurrency quota every request an edge admits takes a slot:
    // units leased without slots could only be stranded.
    let usable = limits.concurrency.is_none() || slots.is_some_and(|g| g.slots > 0);
    let views: Vec<View> = limits
        .policies
        .iter()
        .map(|p| view(windows, ledger, p, ask, s, now))
        .collect();
    // The level every policy reaches: what the edge can admit after this.
    let level = views
        .iter()
        .map(|v| have(ask, &v.policy.name).saturating_add(v.block))
        .min()
        .filter(|_| usable)
        .unwrap_or(0);
    let blocks = views
        .iter()
        .map(|v| {
            let units = level.saturating_sub(have(ask, &v.policy.name)).min(v.block);
            lease(windows, ledger, v, units, &ask.edge, s, now)
        })
        .collect();
    let g = Grant {
        ask: ask.id,
        home_now: now,
        blocks,
        slots,
    };
    ledger.remember(&ask.edge, &g, s);
    g
}

/// Policy `p`'s window at `now` and the block `ask` may have of it.
fn view<'a>(
    windows: &Windows,
    ledger: &Ledger,
    p: &'a Policy,
    ask: &Ask,
    s: &EdgeLimits,
    now: u64,
) -> View<'a> {
    let (start, end, unleased) = peek(windows, p, now);
    let edges = ledger.active_edges(&p.name, start, &ask.edge, now);
    let need = ask.want.saturating_sub(have(ask, &p.name));
    let first = !ledger.holds(&p.name, start, &ask.edge);
    View {
        policy: p,
        start,
        end,
        unleased,
        block: block_for(unleased, edges, need, first, s),
    }
}

/// Charges `units` of the window `v` to `edge` and records them: the block
/// of the answer. A block of a window the home has not opened (nothing
/// charged to it yet) is dead on arrival: the edge forwards, which opens it.
fn lease(
    windows: &mut Windows,
    ledger: &mut Ledger,
    v: &View,
    units: u32,
    edge: &str,
    s: &EdgeLimits,
    now: u64,
) -> Block {
    let p = v.policy;
    let units = match units > 0 && charge(windows, p, units, now) {
        true => units,
        false => 0,
    };
    let open = window_of(windows, &p.name).is_some_and(|w| w.start_ms == v.start);
    let expires_at = match open {
        true => v.end.min(now.saturating_add(s.lease_ms)),
        false => now,
    };
    if open {
        record(ledger, p, v.start, edge, units, expires_at);
    }
    Block {
        policy: p.name.clone(),
        units,
        window_start: v.start,
        window_end: v.end,
        expires_at,
        left: v.unleased.saturating_sub(units),
    }
}

/// Writes a grant of `units` (maybe 0: a renewal) into the ledger.
fn record(ledger: &mut Ledger, p: &Policy, start: u64, edge: &str, units: u32, expires_at: u64) {
    let l = ledger.window_mut(&p.name, start);
    l.leased = l.leased.saturating_add(units);
    match l.holders.iter_mut().find(|h| h.edge == edge) {
        Some(h) => {
            h.leased = h.leased.saturating_add(units);
            h.active_until = h.active_until.max(expires_at);
        }
        None => l.holders.push(Holder {
            edge: edge.to_string(),
            leased: units,
            returned: 0,
            active_until: expires_at,
        }),
    }
}

/// Records units an edge gave back. They stay spent until their window
/// ends: a return is not a credit, so a return that is late, repeated, or
/// crosses into the next window can never let a unit be admitted twice,
/// and an edge's refusal ("the home had fewer than the cost left") stays
/// true until the window ends. The edge stops counting as active, which
/// enlarges the others' fair share.
pub fn return_unused(ledger: &mut Ledger, ret: &Return, now: u64) {
    for (policy, start, units) in &ret.unused {
        let Some(l) = ledger
            .policies
            .iter_mut()
            .find(|l| l.policy == *policy && l.window_start == *start)
        else {
            continue;
        };
        let Some(h) = l.holders.iter_mut().find(|h| h.edge == ret.edge) else {
            continue;
        };
        let n = (*units).min(h.leased.saturating_sub(h.returned));
        h.returned = h.returned.saturating_add(n);
        l.returned = l.returned.saturating_add(n);
        h.active_until = h.active_until.min(now);
    }
}

/// The home's own admission of a request that reached it (forwarded by an
/// edge, or from a location with no edge): `limits::check_all` as ever —
/// the leased units are part of each window's `used`, so this charges only
/// what is not leased — with the slots leased to live edges counted as in
/// use (pass the result as `in_use` to the concurrency check).
pub fn in_use_with_leases(ledger: &Ledger, in_use: u32, now: u64) -> u32 {
    in_use.saturating_add(ledger.slots.leased(now))
}
