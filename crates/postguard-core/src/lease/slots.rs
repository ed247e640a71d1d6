//! Concurrency slots leased to the edge.
//!
//! A slot lease is a count of slots one life of an edge may hold at once,
//! until an expiry. The home counts a live lease's slots as in use; the edge
//! starts a request on a leased slot only if the request's own slot lease
//! (`request_ms`, what a request may hold a slot at most) ends before the
//! slot lease does, so when the lease expires at the home every request it
//! covered has ended or been given up — as a crashed isolate's slot is
//! today. A lease never shrinks while it lives (renewals keep or add); an
//! edge that crashes, or whose clock steps back, starts a new life whose
//! slots are counted apart, and the old life's slots stay counted until
//! they expire: under-admission for at most `lease_ms + request_ms`, never
//! over-admission.

use serde::{Deserialize, Serialize};

use super::{block_for, Ask, AtHome, EdgeLimits};

/// One edge life's slots, at the home.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotHolder {
    pub edge: String,
    pub life: u64,
    pub slots: u32,
    pub expires_at: u64,
}

/// The slots leased out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotLedger {
    pub holders: Vec<SlotHolder>,
}

/// The home's answer about slots (home clock): how many the edge may hold
/// in all, the last instant a request may start on one (so that it ends,
/// or is given up, by `expires_at`), and when the home stops counting them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotGrant {
    pub slots: u32,
    pub start_by: u64,
    pub expires_at: u64,
}

impl SlotLedger {
    /// Slots held by live leases at `now`.
    pub fn leased(&self, now: u64) -> u32 {
        self.holders
            .iter()
            .filter(|h| h.expires_at > now)
            .fold(0u32, |n, h| n.saturating_add(h.slots))
    }

    /// Grants the asking life up to `want` slots in all: what it holds, plus
    /// a block of the free ones by the windows' rule (half a fair share,
    /// none in the tail). The lease is renewed to outlive a request started
    /// at its last moment.
    pub fn grant(
        &mut self,
        ask: &Ask,
        want: u32,
        limit: u32,
        s: &EdgeLimits,
        at: AtHome,
    ) -> SlotGrant {
        let now = at.now;
        self.holders.retain(|h| h.expires_at > now);
        let mine = |h: &SlotHolder| h.edge == ask.edge && h.life == ask.life;
        let held = self.holders.iter().find(|h| mine(h)).map_or(0, |h| h.slots);
        let free = limit
            .saturating_sub(at.in_use)
            .saturating_sub(self.leased(now));
        let others = self.holders.iter().filter(|h| !mine(h)).count();
        let edges = u32::try_from(others).unwrap_or(u32::MAX).saturating_add(1);
        let more = match s.enabled {
            true => block_for(free, edges, want.saturating_sub(held), held == 0, s),
            false => 0,
        };
        let slots = held.saturating_add(more);
        if slots == 0 {
            return SlotGrant {
                slots: 0,
                start_by: now,
                expires_at: now,
            };
        }
        let until = now.saturating_add(s.lease_ms).saturating_add(at.request_ms);
        match self.holders.iter_mut().find(|h| mine(h)) {
            Some(h) => {
                h.slots = slots;
                h.expires_at = h.expires_at.max(until);
            }
            None => self.holders.push(SlotHolder {
                edge: ask.edge.clone(),
                life: ask.life,
                slots,
                expires_at: until,
            }),
        }
        let expires_at = self
            .holders
            .iter()
            .find(|h| mine(h))
            .map_or(until, |h| h.expires_at);
        SlotGrant {
            slots,
            start_by: expires_at.saturating_sub(at.request_ms),
            expires_at,
        }
    }
}

/// An edge's leased slots (edge clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotPot {
    pub slots: u32,
    pub in_use: u32,
    /// Requests may start on a slot before this instant.
    pub start_by: u64,
    /// Every request started on one has ended (or been given up) by then.
    pub until: u64,
}

impl SlotPot {
    /// Whether a request can take a slot now.
    pub fn can_start(&self, now: u64) -> bool {
        self.in_use < self.slots && now < self.start_by
    }

    /// The pot after a grant answered (at `now`) an ask sent at `asked_at`:
    /// spans counted from the ask, so never later than the home's. Requests
    /// under a pot still running keep their slots (the home renewed the
    /// same lease); a pot past `until` has none left running.
    pub fn after(
        old: Option<SlotPot>,
        g: SlotGrant,
        home_now: u64,
        asked_at: u64,
        now: u64,
    ) -> SlotPot {
        let span = |at: u64| asked_at.saturating_add(at.saturating_sub(home_now));
        let running = old.filter(|p| now < p.until);
        SlotPot {
            slots: g.slots,
            in_use: running.map_or(0, |p| p.in_use),
            start_by: span(g.start_by),
            until: span(g.expires_at).max(running.map_or(0, |p| p.until)),
        }
    }
}
