//! Asynchronous operations and events from responses (docs/async-operations.md, ADR
//! 0037): the shell's I/O. The decisions are `postguard_core::operations`
//! (states and transitions), `postguard_core::response_events` (which rule,
//! which data, which id) and `postguard_core::store` (what the key's object
//! writes, in one transaction each); the key's object is
//! `durable::key_guard`, whose alarm is the outbox.
//!
//! - [`accept`]: the proxy's branch for `Prefer: respond-async` on an async
//!   route: the operation stored with its claim, then 202;
//! - [`consumer`]: the `OPERATIONS` queue: start an attempt, call the
//!   origin, settle;
//! - [`api`]: `GET /_postguard/v1/operations[/{id}[/result]]`;
//! - [`respond`]: a stored response's event, handed to its completion;
//! - [`publish`]: the one way this module publishes an event;
//! - [`queue`]: the `OPERATIONS` messages.

pub mod accept;
pub mod api;
pub mod consumer;
pub mod outbox;
pub mod publish;
pub mod queue;
pub mod respond;

/// The R2 object of an operation's request body (larger than the object
/// keeps) or of one attempt's answer: per key, per operation.
fn object_key(key_id: &str, op_id: &str, what: &str) -> String {
    format!("operations/{key_id}/{op_id}/{what}")
}
