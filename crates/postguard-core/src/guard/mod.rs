//! The per-API-key guard: the decisions its Durable Object makes, as pure
//! functions over the object's state.
//!
//! One object per credential — an API key (ADR 0001), a portal session, a
//! deployment secret, a client address — holds that credential's rate-limit
//! windows, its revoked flag, its Idempotency-Key records and, for an API
//! key, what the operator last set for it (its [`Profile`]: limits, expiry,
//! metadata, the keys of a reroll still in their grace). A fresh request
//! costs one round trip before the origin (`admit`: limits, a concurrency
//! slot and the claim) and one after (`complete`/`release`); a replay costs
//! one (`admit` answers with the stored response).
//!
//! - `protocol.rs`: what travels between the worker and the object — each
//!   operation's request and reply ([`Operation`]), the admission answer's
//!   layouts across a deploy;
//! - `admit.rs`: the decisions themselves (admit, complete, release, the
//!   idempotency lookup), over the object's [`GuardState`];
//! - `edge.rs`: an edge object's decisions (ADR 0040): a key's requests in
//!   one location admitted from leased blocks, or forwarded to the home.

use serde::{Deserialize, Serialize};

use crate::limits::Limits;

mod admit;
pub mod edge;
mod protocol;

pub use admit::*;
pub use protocol::*;

/// A claim attempt under an Idempotency-Key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub key: String,
    pub fingerprint: String,
    pub request_id: String,
    pub lease_ms: u64,
}

/// Which of a key's limits an admission is charged to (docs/limits.md): the
/// API's policies, or the gateway endpoints' own policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    #[default]
    Api,
    Gateway,
}

/// A concurrency slot to take while the request is at the origin: freed by
/// `complete`, `release` or `finish`, or when its lease runs out (a crashed
/// isolate's slot is freed like its claim).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slot {
    pub id: String,
    pub lease_ms: u64,
}

/// What the calling worker knows of the key (its cached record): the
/// version of what the operator set, the key's expiry, and which of the
/// key's secrets called (the first 8 hex of its SHA-256: a rerolled key's
/// predecessor expires on its own).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caller {
    #[serde(default)]
    pub version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    /// When the calling secret stops working, if a reroll replaced it (its
    /// record says so): refused from then on, whatever the profile says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_until: Option<u64>,
}

/// A key of a reroll still working until `until` (epoch ms).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Previous {
    pub key: String,
    pub until: u64,
}

/// What the operator last set for an API key, as its object holds it (the
/// authority over a worker's cached record: a change applies from the key's
/// next request in every isolate, as revocation does).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    /// When it was set (epoch ms); a worker's record of an older version
    /// is stale.
    pub version: u64,
    pub plan: String,
    pub limits: Limits,
    pub gateway: Limits,
    pub ttl_s: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub previous: Vec<Previous>,
    /// The key's metadata as forwarded (`X-Postguard-Key-Meta`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<String>,
}

#[cfg(test)]
mod tests;
