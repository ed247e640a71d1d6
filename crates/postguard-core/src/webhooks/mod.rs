//! Outbound webhooks (docs/webhooks.md): the decisions, as pure functions.
//!
//! - [`url_guard`]: which subscriber URLs may be delivered to (SSRF rules);
//! - [`signature`]: Standard Webhooks secrets, signing and verification;
//! - [`retry`]: what an attempt's result means and when the next one is due;
//! - [`events`]: publish and subscription bodies, filter matching and the
//!   exact bytes delivered;
//! - [`capacity`]: the daily quotas, the size guards, the manual-attempt
//!   bound and the arithmetic that proves a shard holds a day (ADR 0017, 0035);
//! - [`delivery`]: the delivery state machine (plan, settle, release);
//! - [`records`]: every write to a webhook record, over the synchronous
//!   `WebhookStore` port the shard implements, with an in-memory backend;
//! - [`shard`]: which shard holds what, ids that name their shard, paging
//!   across shards (ADR 0035);
//! - [`config`]: the `webhooks` section of `POSTGUARD_CONFIG` and its
//!   validation (re-exported by `crate::config`);
//! - [`trace`]: an attempt's request headers (sent and shown, the signature
//!   redacted) and the response headers it keeps;
//! - [`health`]: a subscription's health figure from its attempts;
//! - [`protocol`]: the shard's operations, typed (path, request, answer);
//! - [`ordering`]: ordering keys — lanes, who is before whom across shards
//!   (the `LaneStore` port), and the gate a delivery's first send waits at;
//! - [`pacing`]: the receiver's advertised limit (`RateLimit`,
//!   `X-RateLimit-*`) and when the next attempt may go;
//! - [`schedule`]: `deliver_at` and the first queue hop of a scheduled event.
//!
//! The worker shell owns the queue, the database, `fetch`, the clock and the
//! random bytes; it passes times (epoch ms or s) and random bytes in, and
//! stores and sends what these functions return. Keeping the split this way
//! lets every rule that a receiver or an operator relies on be tested here,
//! on the host, including property tests over arbitrary inputs.

pub mod capacity;
pub mod capture;
pub mod config;
pub mod delivery;
pub mod events;
pub mod fanout;
pub mod health;
pub mod hub;
pub mod ops;
pub mod ordering;
pub mod pacing;
pub mod protocol;
pub mod records;
pub mod retry;
pub mod schedule;
pub mod shard;
pub mod signature;
pub mod trace;
pub mod url_guard;
