//! The one sum the roll-ups use.

use std::collections::BTreeMap;

/// Counts summed by key, in key order. Every roll-up here (a batch's paths,
/// latency and usage, `/stats`' days, paths and latency, `/usage`'s periods)
/// is one of these, so the wasm holds one `BTreeMap` type for all of them
/// (ADR 0026). A use
/// leaves the key parts and counts it does not need at 0 or "".
#[derive(Default)]
pub(super) struct Tally(pub(super) BTreeMap<(u64, String, String, u64), [u64; 6]>);

impl Tally {
    /// Adds `counts` (at most six) to the sums of `key`.
    pub(super) fn add(&mut self, key: (u64, String, String, u64), counts: &[u64]) {
        let sum = self.0.entry(key).or_default();
        for (s, c) in sum.iter_mut().zip(counts) {
            *s += c;
        }
    }
}
