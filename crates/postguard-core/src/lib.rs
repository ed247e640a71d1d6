//! postguard's decisions as pure functions.
//!
//! Nothing in this crate reads a clock, draws randomness or performs I/O, and
//! nothing depends on the `worker` crate: the worker shell (`src/`) reads the
//! clock and storage and passes plain values in. Everything here is tested on
//! the host with `cargo test`.

pub mod alerts;
pub mod archive;
pub mod audit;
pub mod audit_shard;
pub mod body;
pub mod config;
pub mod cors;
pub mod credential;
pub mod frame;
pub mod gateway;
pub mod guard;
pub mod headers;
pub mod idempotency;
pub mod ids;
pub mod key_import;
pub mod key_verify;
pub mod keys;
pub mod lease;
pub mod limits;
pub mod log;
pub mod metrics;
pub mod operations;
pub mod page;
pub mod pattern;
pub mod portal;
pub mod problem;
pub mod proxy;
pub mod queue;
pub mod quota_notice;
pub mod rate_limit;
pub mod response_events;
pub mod routes;
pub mod routing;
pub mod store;
pub mod times;
pub mod unauthenticated;
pub mod url_host;
pub mod webhooks;

pub use problem::{ErrorCode, Invalid, Problem};
