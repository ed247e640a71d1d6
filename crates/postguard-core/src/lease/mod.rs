//! Exact limits admitted at the edge (issue 37, ADR 0040): the key's object
//! (the *home*) leases blocks of its current windows to colo-local *edge*
//! objects, which admit from them with no WAN round trip.
//!
//! **The invariant.** A leased unit is charged to the home's window when it
//! is granted (it is part of `Window::used`), so for every policy and every
//! window: units admitted by the home + units leased ≤ the quota — the
//! home's own admissions (`limits::check_all`, unchanged) see only what is
//! not leased. An edge admits at most what it was granted, and only while
//! the lease is live; a unit that is not used is never given back to the
//! window (it stays spent until the window ends), so nothing an edge held
//! can be admitted twice, whatever the order of messages. (The edge keeps
//! what it holds: a lease that lapses and is renewed within its window
//! brings its units back to that edge.)
//!
//! **Time.** Home and edges are different machines. A grant says how long
//! from the home's `now` the block lives; the edge counts that span from
//! the instant it *sent* the ask (`asked_at`), which precedes the home's
//! `now` in real time, so its deadline falls at or before the real one
//! whatever the two clocks read. An edge whose clock steps back drops its
//! leases. `Retry-After` and `t` count the span from when the answer
//! *arrived*, so they are never early.
//!
//! **Block size** ([`block_size`]): at most what the edge wants (twice its
//! demand since its last ask), at most `max_block`, and at most
//! `unleased / (2 × active edges)`: each grant takes at most half of a fair
//! share of what is left, so blocks shrink as the window fills; when that
//! is 0 (fewer than 2 units per active edge are left) nothing more is
//! leased and the home admits the tail alone, exactly. An edge's first
//! block of a window needs half a fair share of at least `min_block`
//! ([`block_for`]): a key whose quota is small next to `min_block` is never
//! leased, and its headers stay exact.
//!
//! Several policies are leased together: a request is admitted at the edge
//! only if every policy's lease covers its cost (all charged, or none), and
//! a grant tops every policy up to the same level, so no policy's units
//! wait behind another's. Concurrency slots are leased as a count an edge
//! may hold until an expiry that outlives every request it admits under
//! them (`slots.rs`).
//!
//! - `home.rs`: the ledger beside the windows, [`home::grant`], returns.
//! - `edge.rs`: an edge's leases, [`edge::Edge::admit`], prefetch, headers.
//! - `slots.rs`: concurrency slots, home and edge side.
//!
//! Pure: `now` is passed in, nothing here does I/O.

use serde::{Deserialize, Serialize};

pub mod edge;
pub mod home;
pub mod slots;

#[cfg(test)]
mod tests;

pub use edge::{Edge, EdgeDecision};
pub use home::{grant, return_unused, Ledger};

/// The default largest block of one grant.
pub const DEFAULT_MAX_BLOCK: u32 = 1_000;
/// The default smallest block an edge asks for (its first).
pub const DEFAULT_MIN_BLOCK: u32 = 10;
/// The default prefetch threshold: ask again when the lease is down to this
/// share of the last block, in percent.
pub const DEFAULT_PREFETCH_AT_PCT: u32 = 50;
/// The default lease lifetime without renewal.
pub const DEFAULT_LEASE_MS: u64 = 10_000;
/// The most edge objects one location may have for a key.
pub const MAX_SHARDS: u32 = 64;

/// `limits.edge`: whether and how the key's object leases quota to the edge.
/// What each setting trades is in docs/adr/0040-exact-limits-leased-to-the-edge.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EdgeLimits {
    /// Off: every request is admitted by the key's object, as before.
    pub enabled: bool,
    /// The largest block one grant hands an edge: larger blocks mean fewer
    /// round trips for a hot location, more units stranded when it stops.
    pub max_block: u32,
    /// The smallest block worth a round trip: what an edge asks for at
    /// least, the demand a location shows before it asks at all, and the
    /// half fair share below which an edge gets no first block of a window
    /// (a small quota is never leased: the home admits it, exactly).
    pub min_block: u32,
    /// Ask for the next block when the lease is down to this percentage of
    /// the last one (0: only when it is empty, so every block ends with a
    /// synchronous trip).
    pub prefetch_at_pct: u32,
    /// How long a lease lives unless renewed: how late a revocation, a
    /// key's expiry or a limits change reaches the edges.
    pub lease_ms: u64,
    /// Edge objects per (key, location): one object serves about 1,000
    /// requests/s, so a location that sends a key more needs several; each
    /// is one more active edge (smaller blocks, more asks).
    pub shards: u32,
}

impl Default for EdgeLimits {
    fn default() -> Self {
        EdgeLimits {
            enabled: false,
            max_block: DEFAULT_MAX_BLOCK,
            min_block: DEFAULT_MIN_BLOCK,
            prefetch_at_pct: DEFAULT_PREFETCH_AT_PCT,
            lease_ms: DEFAULT_LEASE_MS,
            shards: 1,
        }
    }
}

/// A setting of `limits.edge` out of range, named by its leaf field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct EdgeLimitsError {
    pub field: &'static str,
    pub reason: String,
}

fn range<T: PartialOrd + std::fmt::Display>(
    field: &'static str,
    v: T,
    lo: T,
    hi: T,
) -> Result<(), EdgeLimitsError> {
    if v < lo || v > hi {
        return Err(EdgeLimitsError {
            field,
            reason: format!("must be between {lo} and {hi}, got {v}"),
        });
    }
    Ok(())
}

impl EdgeLimits {
    /// Checks every setting, enabled or not (a switch turned on later must
    /// not meet a bad value).
    pub fn validate(&self) -> Result<(), EdgeLimitsError> {
        range("limits.edge.max_block", self.max_block, 1, 1_000_000)?;
        range("limits.edge.min_block", self.min_block, 1, self.max_block)?;
        // 100 would ask after every admission: a WAN call per request.
        range("limits.edge.prefetch_at_pct", self.prefetch_at_pct, 0, 99)?;
        // A quarter of the lease is the renewal margin and how long an ask
        // may be outstanding: it must exceed a WAN round trip (≤ ~370 ms).
        range("limits.edge.lease_ms", self.lease_ms, 2_000, 3_600_000)?;
        range("limits.edge.shards", self.shards, 1, MAX_SHARDS)?;
        Ok(())
    }

    /// How long before a lease ends the edge renews it, and how long an
    /// ask may go unanswered before the edge asks again.
    pub fn patience_ms(&self) -> u64 {
        self.lease_ms / 4
    }
}

/// An edge's ask for blocks: what it wants, what it still holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ask {
    /// The edge: the key's location (`request.cf.colo`).
    pub edge: String,
    /// Unique per ask across the edge's lifetimes (an edge starts from
    /// random bits): the home answers a repeated id with the same grant.
    pub id: u64,
    /// The edge's life: a new one after a crash or a clock that stepped
    /// back (random bits, then the id of the ask that found the step), so a
    /// new life's slots are never taken for an old life's.
    pub life: u64,
    /// How many units the edge wants to be able to admit after the grant.
    pub want: u32,
    /// Units the edge still holds, per policy (leases whose window may
    /// still run, lapsed or not: a renewal brings their units back).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub have: Vec<(String, u32)>,
    /// Concurrency slots wanted in all (if the key has a concurrency quota).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<u32>,
}

/// One policy's block of a grant. Instants are on the home's clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Block {
    pub policy: String,
    /// Units granted now (0: renewal only, or the edge must forward).
    pub units: u32,
    pub window_start: u64,
    pub window_end: u64,
    /// When the lease lapses unless renewed (≤ `window_end`).
    pub expires_at: u64,
    /// Units the home had not leased after this grant: within the window
    /// this only decreases, so it bounds what the home can still admit.
    pub left: u32,
}

/// The home's side of a grant besides the windows: its clock, the
/// concurrency slots its own requests hold and how long one request may
/// hold a slot (`idempotency.lease_s`). (Here, not in `home.rs`: the slots'
/// grant takes it too, and `home.rs` takes the slots' ledger.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtHome {
    pub now: u64,
    pub in_use: u32,
    pub request_ms: u64,
}

/// The home's answer to an [`Ask`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The ask it answers.
    pub ask: u64,
    /// The home's clock when it decided: every span is counted from it.
    pub home_now: u64,
    pub blocks: Vec<Block>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<slots::SlotGrant>,
}

/// The block the home grants for one policy: what the edge wants, at most
/// `max_block`, at most half of a fair share of the unleased units among the
/// active edges (the asker included). 0 once fewer than two units per
/// active edge are left: the home admits the tail alone.
///
/// Safety needs only `block ≤ unleased`. The share bounds what idle or
/// crashed edges can strand: the latest blocks of the active edges are
/// together at most half of what was unleased when the first of them was
/// granted, so what is stranded shrinks with what is left.
pub fn block_size(unleased: u32, active_edges: u32, want: u32, s: &EdgeLimits) -> u32 {
    let share = u64::from(unleased) / (2 * u64::from(active_edges.max(1)));
    let share = u32::try_from(share).unwrap_or(u32::MAX);
    want.min(s.max_block).min(share).min(unleased)
}

/// [`block_size`] for an edge that holds no units of the window yet (`first`):
/// nothing unless half a fair share is at least `min_block`. A smaller first
/// block is not worth its round trip, and a key whose quota is small next to
/// `min_block` is then never leased (its headers stay exact). An edge that
/// already holds a lease of the window is topped up as the window fills,
/// down to 1 unit, so a hot location's tail costs few round trips.
pub fn block_for(unleased: u32, active_edges: u32, want: u32, first: bool, s: &EdgeLimits) -> u32 {
    let b = block_size(unleased, active_edges, want, s);
    let share = u64::from(unleased) / (2 * u64::from(active_edges.max(1)));
    match first && share < u64::from(s.min_block) {
        true => 0,
        false => b,
    }
}
