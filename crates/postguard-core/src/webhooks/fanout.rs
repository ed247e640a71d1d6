//! Sending many delivery jobs through the queue: `sendBatch` takes at most
//! 100 messages and 256 KB per call, so a fan-out or a re-queue of any size
//! goes out in chunks that fit both. Also the bound on how much of a
//! receiver's answer is read.

use std::ops::Range;

use crate::{ErrorCode, Problem};

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

/// `Retry-After` of a publish whose commit failed: the next group is one D1
/// round trip away, so a retry may come at once (1 s is the header's least).
pub const UNCOMMITTED_RETRY_S: u64 = 1;

/// 503 `STORAGE_UNAVAILABLE`: the publish's group commit failed (its
/// transaction or read failed, its leader vanished, the wait bound passed)
/// or its first attempts did not reach the queue. Transient: a retry with
/// the same event id stores it once, or flushes what the outbox holds. The
/// cause is logged, not shown (it may carry SQL).
pub fn uncommitted() -> Problem {
    Problem::new(
        ErrorCode::StorageUnavailable,
        "the event was not committed or not queued (the gateway's storage failed); retry with the same id",
    )
    .with_retry_after(UNCOMMITTED_RETRY_S)
}

/// Publishes one group commit writes at most (ADR 0024): one D1 read and one
/// D1 transaction for all of them.
pub const MAX_GROUP_EVENTS: usize = 32;
/// Request bytes one group carries at most (each event's payload is bound
/// to its own statement; this bounds the transaction).
pub const MAX_GROUP_BYTES: usize = 1_000_000;

/// Which of the queued publishes (`(project, event id, bytes)`, in arrival
/// order) the next group commit takes: in order, at least the first, within
/// [`MAX_GROUP_EVENTS`] and [`MAX_GROUP_BYTES`], and never two of the same
/// event id: a repeat waits for the next group, where it is seen as known.
pub fn take_group(queued: &[(&str, &str, usize)]) -> Vec<usize> {
    let mut taken: Vec<usize> = Vec::new();
    let mut bytes = 0;
    for (i, (project, id, size)) in queued.iter().enumerate() {
        if taken.len() == MAX_GROUP_EVENTS {
            break;
        }
        if !taken.is_empty() && bytes + size > MAX_GROUP_BYTES {
            break;
        }
        let repeat = taken
            .iter()
            .any(|&t| queued[t].0 == *project && queued[t].1 == *id);
        if !repeat {
            taken.push(i);
            bytes += size;
        }
    }
    taken
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_uncommitted_publish_is_a_503_to_retry_at_once() {
        let p = uncommitted();
        assert_eq!(p.code, ErrorCode::StorageUnavailable);
        assert_eq!(p.status(), 503);
        assert_eq!(p.retry_after_s, Some(1));
    }

    #[test]
    fn a_group_takes_in_order_without_repeats_within_its_bounds() {
        assert_eq!(take_group(&[]), Vec::<usize>::new());
        let q = [
            ("p", "a", 10),
            ("p", "b", 10),
            ("p", "a", 10),
            ("q", "a", 10),
        ];
        assert_eq!(take_group(&q), vec![0, 1, 3]);
        let big = [("p", "a", MAX_GROUP_BYTES + 5), ("p", "b", 1)];
        assert_eq!(take_group(&big), vec![0]);
        let many: Vec<(&str, String, usize)> =
            (0..100).map(|i| ("p", format!("e{i}"), 1)).collect();
        let many: Vec<(&str, &str, usize)> =
            many.iter().map(|(p, i, n)| (*p, i.as_str(), *n)).collect();
        assert_eq!(take_group(&many), (0..MAX_GROUP_EVENTS).collect::<Vec<_>>());
    }

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
