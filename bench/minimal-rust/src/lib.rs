//! Bench contenders (ADR 0023): the floor of a Rust `worker` crate gateway on workerd.
//! Without the `passthrough` feature: the minimal gateway of bench/passthrough.mjs, the same
//! I/O in the same order. With it: a pure pass-through (fetch the origin, return it).

#[cfg(not(feature = "passthrough"))]
mod gateway;
#[cfg(feature = "passthrough")]
mod pass;
