//! Sending many delivery jobs through the queue: `sendBatch` takes at most
//! 100 messages and 256 KB per call, so a fan-out or a re-queue of any size
//! goes out in chunks that fit both. Also the bound on how much of a
//! receiver's answer is read.

use std::ops::Range;

/// Messages one `sendBatch` call may carry (Cloudflare Queues).
pub const MAX_BATCH_MESSAGES: usize = 100;
/// Bytes one `sendBatch` call may carry (Cloudflare Queues: 256 KB).
pub const MAX_BATCH_BYTES: usize = 256_000;
/// What the queue counts per message beyond its body (a safe margin).
pub const MESSAGE_OVERHEAD_BYTES: usize = 100;

/// The most of a receiver's response body the consumer reads: enough for
/// the recorded excerpt (512 characters of up to 4 bytes each); the rest is
/// cancelled unread, so a huge answer costs no memory.
pub const MAX_RESPONSE_READ_BYTES: usize = 4_096;

/// Splits messages of the given body sizes into consecutive ranges, each
/// within [`MAX_BATCH_MESSAGES`] and [`MAX_BATCH_BYTES`]. A message too big
/// for any batch travels alone (the queue then refuses it, visibly).
pub fn chunks(sizes: &[usize]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (i, size) in sizes.iter().enumerate() {
        let cost = size + MESSAGE_OVERHEAD_BYTES;
        let full = i - start == MAX_BATCH_MESSAGES || bytes + cost > MAX_BATCH_BYTES;
        if i > start && full {
            out.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += cost;
    }
    if start < sizes.len() {
        out.push(start..sizes.len());
    }
    out
}

/// Ids one outbox-mark statement carries: one round of the coalesced marker.
pub const MARK_CHUNK: usize = 500;
/// Rounds one publish request runs as the isolate's marker before it leaves
/// what is still pending to the next publish (its own answer waits on them).
pub const MARK_ROUNDS: usize = 8;
/// A marker older than this is taken to be gone (its request ended without
/// finishing) and a new one starts.
pub const MARKER_STALE_MS: u64 = 10_000;

/// Whether a publish becomes the isolate's outbox marker: none is running
/// (`since_ms` = 0), or the running one is stale.
pub fn must_start_marker(since_ms: u64, now_ms: u64) -> bool {
    since_ms == 0 || now_ms.saturating_sub(since_ms) >= MARKER_STALE_MS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_starts_when_none_runs_or_it_is_stale() {
        assert!(must_start_marker(0, 5));
        assert!(!must_start_marker(1_000, 1_000 + MARKER_STALE_MS - 1));
        assert!(must_start_marker(1_000, 1_000 + MARKER_STALE_MS));
    }
    use proptest::prelude::*;

    #[test]
    fn small_jobs_go_a_hundred_at_a_time() {
        assert_eq!(chunks(&[]), Vec::<Range<usize>>::new());
        assert_eq!(chunks(&[80; 5]), vec![0..5]);
        assert_eq!(chunks(&[80; 150]), vec![0..100, 100..150]);
        assert_eq!(chunks(&[80; 500]).len(), 5);
    }

    #[test]
    fn big_jobs_are_split_by_bytes() {
        let c = chunks(&[100_000; 5]);
        assert_eq!(c, vec![0..2, 2..4, 4..5]);
        assert_eq!(chunks(&[300_000, 10]), vec![0..1, 1..2]);
    }

    proptest! {
        #[test]
        fn chunks_cover_everything_in_order_within_limits(sizes in proptest::collection::vec(0usize..200_000, 0..400)) {
            let c = chunks(&sizes);
            let mut next = 0;
            for r in &c {
                prop_assert_eq!(r.start, next);
                prop_assert!(!r.is_empty() && r.len() <= MAX_BATCH_MESSAGES);
                let bytes: usize = sizes[r.clone()].iter().map(|s| s + MESSAGE_OVERHEAD_BYTES).sum();
                prop_assert!(r.len() == 1 || bytes <= MAX_BATCH_BYTES);
                next = r.end;
            }
            prop_assert_eq!(next, sizes.len());
        }
    }
}
