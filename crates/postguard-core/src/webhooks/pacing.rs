//! Receivers that say how fast (issue 36): the limit a receiver advertises in
//! its answers, and whether the next attempt to it may go now or must wait
//! for the advertised reset.
//!
//! The gateway tells its own clients their limits in the IETF `RateLimit`
//! header ([`crate::limits::headers`]: `"default";r=0;t=3`, one item per
//! policy); as a sender it reads the same headers from receivers, so an
//! endpoint that says "0 left for 3 s" is not called again for 3 s, instead
//! of being called until it answers 429. Read, most restrictive first:
//!
//! | header | form | reset |
//! |---|---|---|
//! | `RateLimit` | structured-field list, each item `name;r=<remaining>;t=<seconds>` (draft-ietf-httpapi-ratelimit-headers-08 and later); or the earlier dictionary `limit=…, remaining=…, reset=…` | seconds from now |
//! | `RateLimit-Remaining` + `RateLimit-Reset` | integers (drafts up to -06) | by magnitude, as below |
//! | `X-RateLimit-Remaining` + `X-RateLimit-Reset` | integers (GitHub, Twitter, many APIs) | by magnitude, as below |
//!
//! A reset given as a plain number is read **by magnitude**, because
//! deployed APIs disagree: below 10⁹ it is seconds from now (10⁹ s is
//! almost 32 years: no quota window is that long), from 10⁹ epoch seconds
//! (10⁹ is 2001-09-09: every real epoch-seconds value since), from 10¹²
//! epoch milliseconds. A fraction (`1470173023.123`, Discord) is kept to
//! the millisecond.
//!
//! Every item with both a remaining count and a reset is a candidate; the
//! most restrictive wins (the fewest remaining; among those, the latest
//! reset). A malformed header or item is ignored, never an error: pacing is
//! a courtesy the receiver offers, and a broken header must not stop its
//! deliveries. A reset further than [`MAX_RESET_S`] ahead counts as that
//! far, so no answer can park a subscription's deliveries for longer.
//!
//! Waiting for the reset is a wait, not an attempt: the consumer asks
//! [`pace`] (or [`spend`]) before it claims an attempt, as it reserves the
//! throttle's slot, and a job that must wait goes back to the queue with
//! [`Pace::Wait`]'s delay, no attempt number used, nothing recorded as
//! failed. `Retry-After` on a 429 keeps its meaning ([`super::retry`]): it
//! schedules that delivery's next attempt; the `RateLimit` headers of the
//! same answer pace the subscription's other deliveries too.
//!
//! Pure: the shell passes the answer's headers and `now` (epoch ms).

use serde::{Deserialize, Serialize};

use super::retry;

/// What a receiver advertised: `remaining` requests until `reset_at`
/// (epoch ms). Shown on the subscription as `receiver_limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiverLimit {
    pub remaining: u64,
    pub reset_at: u64,
}

/// The furthest a receiver's reset is believed (seconds): a day, the
/// default schedule's longest step.
pub const MAX_RESET_S: u64 = 86_400;
/// From here a plain reset number is epoch seconds (2001-09-09).
pub const EPOCH_S_FROM: u64 = 1_000_000_000;
/// From here a plain reset number is epoch milliseconds.
pub const EPOCH_MS_FROM: u64 = 1_000_000_000_000;
/// The longest header value read (bytes): a `RateLimit` list of a few
/// dozen policies; anything longer is not a limit header worth parsing.
pub const MAX_VALUE_BYTES: usize = 4_096;

/// The receiver's advertised limit from its answer's `headers` (names
/// case-insensitive; repeated names each read), at `now`; `None` when no
/// header gives both a remaining count and a reset still ahead.
pub fn receiver_limit<'a, I>(headers: I, now: u64) -> Option<ReceiverLimit>
where
    I: IntoIterator<Item = (&'a str, &'a [u8])>,
{
    let mut best: Option<ReceiverLimit> = None;
    let mut pairs: [(Option<u64>, Option<u64>); 2] = [(None, None); 2];
    for (name, value) in headers {
        let Some(value) = text(value) else {
            continue;
        };
        let name = name.trim();
        if name.eq_ignore_ascii_case("ratelimit") {
            for c in structured(value, now) {
                best = tighter(best, c);
            }
            continue;
        }
        let slot = [
            ("ratelimit-remaining", 0, true),
            ("ratelimit-reset", 0, false),
            ("x-ratelimit-remaining", 1, true),
            ("x-ratelimit-reset", 1, false),
        ]
        .into_iter()
        .find(|(n, _, _)| name.eq_ignore_ascii_case(n));
        match slot {
            Some((_, i, true)) => pairs[i].0 = integer(first_item(value)).or(pairs[i].0),
            Some((_, i, false)) => {
                pairs[i].1 = number_ms(first_item(value))
                    .and_then(|v| reset_at_by_magnitude(v, now))
                    .or(pairs[i].1);
            }
            None => {}
        }
    }
    for (remaining, reset_at) in pairs {
        if let (Some(remaining), Some(reset_at)) = (remaining, reset_at) {
            best = tighter(best, limit(remaining, reset_at, now));
        }
    }
    best
}

/// [`receiver_limit`] over headers as the shell holds them.
pub fn from_headers(headers: &[(String, String)], now: u64) -> Option<ReceiverLimit> {
    receiver_limit(headers.iter().map(|(k, v)| (k.as_str(), v.as_bytes())), now)
}

/// The more restrictive of two candidates.
fn tighter(a: Option<ReceiverLimit>, b: Option<ReceiverLimit>) -> Option<ReceiverLimit> {
    match (a, b) {
        (Some(a), Some(b)) => Some(match a.remaining.cmp(&b.remaining) {
            std::cmp::Ordering::Less => a,
            std::cmp::Ordering::Greater => b,
            std::cmp::Ordering::Equal => ReceiverLimit {
                remaining: a.remaining,
                reset_at: a.reset_at.max(b.reset_at),
            },
        }),
        (a, b) => a.or(b),
    }
}

/// A candidate, when its reset is still ahead (one already past says
/// nothing about the next request), capped at [`MAX_RESET_S`].
fn limit(remaining: u64, reset_at: u64, now: u64) -> Option<ReceiverLimit> {
    (reset_at > now).then(|| ReceiverLimit {
        remaining,
        reset_at: reset_at.min(now.saturating_add(MAX_RESET_S * 1_000)),
    })
}

/// A reset number (as ms, see [`number_ms`]) by magnitude: seconds from
/// now, epoch seconds, or epoch milliseconds (the module's table).
fn reset_at_by_magnitude(v_ms: u64, now: u64) -> Option<u64> {
    let whole = v_ms / 1_000;
    if whole >= EPOCH_MS_FROM {
        Some(whole) // it was epoch milliseconds all along
    } else if whole >= EPOCH_S_FROM {
        Some(v_ms)
    } else {
        Some(now.saturating_add(v_ms))
    }
}

/// The value as text: ASCII only (structured fields are), at most
/// [`MAX_VALUE_BYTES`], trimmed of spaces and tabs.
fn text(v: &[u8]) -> Option<&str> {
    if v.len() > MAX_VALUE_BYTES || !v.is_ascii() {
        return None;
    }
    std::str::from_utf8(v)
        .ok()
        .map(|s| s.trim_matches([' ', '\t']))
}

/// The first comma-separated item (a header repeated and joined by the
/// runtime reads as its first value).
fn first_item(v: &str) -> &str {
    v.split(',').next().unwrap_or("").trim_matches([' ', '\t'])
}

/// A non-negative integer (digits only), saturating past `u64`.
fn integer(v: &str) -> Option<u64> {
    if v.is_empty() || v.len() > 20 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse::<u64>().ok()
}

/// A non-negative number of seconds (`3`, `1470173023.123`) as
/// milliseconds, the fraction cut to three digits.
fn number_ms(v: &str) -> Option<u64> {
    let (whole, frac) = v.split_once('.').unwrap_or((v, ""));
    let whole = integer(whole)?;
    if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) || v.ends_with('.') {
        return None;
    }
    let ms = frac
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(3)
        .fold(0u64, |acc, b| acc * 10 + u64::from(b - b'0'));
    whole.checked_mul(1_000)?.checked_add(ms)
}

/// One member of a structured-field list or dictionary: its name, its
/// `=value` (dictionary form) and its parameters, each as raw text.
struct Member<'a> {
    name: &'a str,
    value: Option<&'a str>,
    params: Vec<(&'a str, &'a str)>,
}

/// The candidates of a `RateLimit` value: each list item with `r` and `t`
/// parameters (the gateway's own form); or, in the earlier dictionary form,
/// the members `remaining` and `reset`.
fn structured(v: &str, now: u64) -> Vec<Option<ReceiverLimit>> {
    let members: Vec<Member<'_>> = split_outside_quotes(v, b',')
        .into_iter()
        .filter_map(member)
        .collect();
    let mut out = Vec::new();
    for m in &members {
        let param = |k: &str| m.params.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
        if let (Some(r), Some(t)) = (param("r").and_then(integer), param("t").and_then(number_ms)) {
            out.push(limit(r, now.saturating_add(t), now));
        }
    }
    let value_of = |k: &str| members.iter().find(|m| m.name == k).and_then(|m| m.value);
    if let (Some(r), Some(t)) = (
        value_of("remaining").and_then(integer),
        value_of("reset").and_then(number_ms),
    ) {
        out.push(limit(r, now.saturating_add(t), now));
    }
    out
}

/// Splits at `sep` where it is not inside a quoted string (`"a,b"`, with
/// `\"` escapes).
fn split_outside_quotes(v: &str, sep: u8) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, b) in v.bytes().enumerate() {
        match b {
            _ if escaped => escaped = false,
            b'\\' if quoted => escaped = true,
            b'"' => quoted = !quoted,
            _ if b == sep && !quoted => {
                out.push(&v[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&v[start..]);
    out
}

/// Reads one member (`"name";r=1;t=2`, `token;r=1`, `remaining=5`);
/// `None` when it has no name.
fn member(raw: &str) -> Option<Member<'_>> {
    let mut parts = split_outside_quotes(raw, b';').into_iter();
    let head = parts.next()?.trim_matches([' ', '\t']);
    let (name, value) = match head.split_once('=') {
        Some((n, v)) if !n.starts_with('"') => (n.trim(), Some(v.trim())),
        _ => (head, None),
    };
    let name = name
        .strip_prefix('"')
        .and_then(|n| n.strip_suffix('"'))
        .unwrap_or(name);
    if name.is_empty() {
        return None;
    }
    let params = parts
        .filter_map(|p| {
            let (k, v) = p.split_once('=')?;
            Some((k.trim_matches([' ', '\t']), v.trim_matches([' ', '\t'])))
        })
        .collect();
    Some(Member {
        name,
        value,
        params,
    })
}

/// Whether a job is paced by its subscription's receiver limit: scheduled
/// attempts and manual retries go to the subscription's receiver; a
/// redirect goes elsewhere (an inspector), and a dead-letter-queue job
/// sends nothing (it gives up).
pub fn applies_to(job: &super::delivery::Job) -> bool {
    matches!(
        job,
        super::delivery::Job::Scheduled { .. } | super::delivery::Job::ManualRetry
    )
}

/// May the next attempt to the receiver go at `now`?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    Go,
    /// Its advertised quota is used up until `until` (epoch ms): send the
    /// job again after `delay_s` (a queue hop, at most the queue's maximum;
    /// a longer wait is chained like any other).
    Wait {
        until: u64,
        delay_s: u64,
    },
}

/// The decision before a claim, from the subscription's last known
/// `limit`: wait while it advertised none left and its reset is ahead; go
/// otherwise (no limit known, some left, or the reset has passed).
pub fn pace(limit: Option<&ReceiverLimit>, now: u64) -> Pace {
    match limit {
        Some(l) if l.remaining == 0 && l.reset_at > now => Pace::Wait {
            until: l.reset_at,
            delay_s: retry::next_hop(l.reset_at.saturating_sub(now).div_ceil(1_000).max(1)),
        },
        _ => Pace::Go,
    }
}

/// [`pace`] for a shell that keeps the limit where each attempt can take
/// from it atomically (the way a throttle slot is reserved): the decision
/// and the limit to store — one fewer remaining after a go, so attempts
/// started before the receiver's next answer never exceed what it
/// advertised; forgotten (`None`) once its reset has passed.
pub fn spend(limit: Option<&ReceiverLimit>, now: u64) -> (Pace, Option<ReceiverLimit>) {
    match limit {
        Some(l) if l.reset_at > now => match pace(Some(l), now) {
            Pace::Go => (
                Pace::Go,
                Some(ReceiverLimit {
                    remaining: l.remaining.saturating_sub(1),
                    reset_at: l.reset_at,
                }),
            ),
            wait => (wait, Some(*l)),
        },
        _ => (Pace::Go, None),
    }
}

/// The limit to keep after an answer that advertised `seen` (from
/// [`receiver_limit`]), given the one `kept`: the answer's, being the
/// latest word (of the same window — same reset — the lower count, since
/// answers to parallel attempts arrive in any order); without one, the
/// kept limit until its reset passes.
pub fn observe(
    kept: Option<&ReceiverLimit>,
    seen: Option<ReceiverLimit>,
    now: u64,
) -> Option<ReceiverLimit> {
    let live = |l: ReceiverLimit| (l.reset_at > now).then_some(l);
    match (kept.copied().and_then(live), seen.and_then(live)) {
        (Some(k), Some(s)) if k.reset_at == s.reset_at => Some(ReceiverLimit {
            remaining: k.remaining.min(s.remaining),
            reset_at: s.reset_at,
        }),
        (_, Some(s)) => Some(s),
        (k, None) => k,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // 2027-01-15T08:00:00Z
    const NOW: u64 = 1_800_000_000_000;

    fn parse(headers: &[(&str, &str)]) -> Option<ReceiverLimit> {
        receiver_limit(headers.iter().map(|(k, v)| (*k, v.as_bytes())), NOW)
    }

    fn lim(remaining: u64, in_ms: u64) -> Option<ReceiverLimit> {
        Some(ReceiverLimit {
            remaining,
            reset_at: NOW + in_ms,
        })
    }

    #[test]
    fn the_gateways_own_ratelimit_header() {
        assert_eq!(
            parse(&[("RateLimit", "\"default\";r=0;t=3")]),
            lim(0, 3_000)
        );
        assert_eq!(
            parse(&[("ratelimit", "\"default\";r=7;t=60")]),
            lim(7, 60_000)
        );
        // Several policies and the concurrency item (no `t`): the tightest.
        assert_eq!(
            parse(&[(
                "RateLimit",
                "\"burst\";r=4;t=1, \"daily\";r=0;t=3600, \"inflight\";r=2"
            )]),
            lim(0, 3_600_000)
        );
        assert_eq!(
            parse(&[("RateLimit", "\"a\";r=3;t=10, \"b\";r=3;t=20, \"c\";r=9;t=1")]),
            lim(3, 20_000),
            "equal counts: the later reset"
        );
        // Tokens as names, spaces after `;`, a quoted name with `,` and `;`.
        assert_eq!(parse(&[("RateLimit", "default;r=1; t=5")]), lim(1, 5_000));
        assert_eq!(parse(&[("RateLimit", "\"a,b;c\";r=2;t=9")]), lim(2, 9_000));
        // Round trip through the gateway's own header writer.
        let policy = crate::limits::headers(&crate::limits::Verdicts::single(
            "default",
            crate::rate_limit::Verdict {
                admitted: false,
                limit: 10,
                remaining: 0,
                reset_ms: NOW + 3_000,
                reset_in_s: 3,
                reset_epoch_s: NOW / 1_000 + 3,
                window_s: 60,
            },
        ));
        let shell: Vec<(String, String)> = policy
            .iter()
            .map(|(k, v)| ((*k).to_string(), v.clone()))
            .collect();
        assert_eq!(from_headers(&shell, NOW), lim(0, 3_000));
    }

    #[test]
    fn the_earlier_drafts_and_the_x_headers() {
        assert_eq!(
            parse(&[("RateLimit", "limit=100, remaining=0, reset=30")]),
            lim(0, 30_000)
        );
        assert_eq!(
            parse(&[("RateLimit-Remaining", "5"), ("RateLimit-Reset", "12")]),
            lim(5, 12_000)
        );
        // X-RateLimit-Reset by magnitude: seconds from now, epoch s, epoch ms.
        let x =
            |reset: &str| parse(&[("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", reset)]);
        assert_eq!(x("42"), lim(0, 42_000));
        assert_eq!(x("1800000042"), lim(0, 42_000));
        assert_eq!(x("1800000042.5"), lim(0, 42_500));
        assert_eq!(x("1800000042500"), lim(0, 42_500));
        assert_eq!(
            x("999999999"),
            lim(0, MAX_RESET_S * 1_000),
            "31 years from now: capped"
        );
        assert_eq!(x("1799999999"), None, "a reset in the past says nothing");
        assert_eq!(x("0"), None);
        // Each pair needs both halves.
        assert_eq!(parse(&[("X-RateLimit-Remaining", "0")]), None);
        assert_eq!(parse(&[("X-RateLimit-Reset", "10")]), None);
        assert_eq!(
            parse(&[("RateLimit-Remaining", "0"), ("X-RateLimit-Reset", "10")]),
            None,
            "halves of different families do not pair"
        );
        // Every family at once: the most restrictive.
        assert_eq!(
            parse(&[
                ("x-ratelimit-remaining", "50"),
                ("x-ratelimit-reset", "1800003600"),
                ("RateLimit", "\"minute\";r=2;t=40"),
            ]),
            lim(2, 40_000)
        );
    }

    #[test]
    fn malformed_headers_are_ignored() {
        for v in [
            "",
            "\"default\";r=-1;t=3",
            "\"default\";r=1.5;t=3",
            "\"default\";r=x;t=3",
            "\"default\";r=0",
            "\"default\";t=3",
            "\"default\";r=0;t=",
            "\"default\";r=0;t=3.",
            "\"default\";r=0;t=-3",
            ";r=0;t=3",
            "\"unterminated;r=0;t=3",
            "r=0;t=3",
            "limit=1, remaining=x, reset=3",
            "\"default\";r=99999999999999999999999;t=3",
        ] {
            assert_eq!(parse(&[("RateLimit", v)]), None, "{v:?}");
        }
        assert_eq!(
            parse(&[("RateLimit", "garbage, \"ok\";r=0;t=3, ;;;, ===")]),
            lim(0, 3_000),
            "a bad item does not spoil the good ones"
        );
        assert_eq!(
            receiver_limit([("RateLimit", &b"\"d\";r=0;t=3\xff"[..])], NOW),
            None,
            "not ASCII"
        );
        let long = format!("\"d\";r=0;t=3{}", " ".repeat(MAX_VALUE_BYTES));
        assert_eq!(parse(&[("RateLimit", &long)]), None);
        assert_eq!(
            parse(&[
                ("X-RateLimit-Remaining", "many"),
                ("X-RateLimit-Reset", "10")
            ]),
            None
        );
        assert_eq!(
            parse(&[
                ("X-RateLimit-Remaining", "0"),
                ("X-RateLimit-Reset", "soon")
            ]),
            None
        );
        assert_eq!(
            parse(&[("Retry-After", "3")]),
            None,
            "Retry-After is retry.rs's"
        );
    }

    #[test]
    fn pace_waits_for_the_reset_and_spend_counts_down() {
        assert_eq!(pace(None, NOW), Pace::Go);
        let l = lim(0, 3_000).unwrap();
        assert_eq!(
            pace(Some(&l), NOW),
            Pace::Wait {
                until: NOW + 3_000,
                delay_s: 3
            }
        );
        assert_eq!(
            pace(Some(&l), NOW + 2_001),
            Pace::Wait {
                until: NOW + 3_000,
                delay_s: 1
            }
        );
        assert_eq!(pace(Some(&l), NOW + 3_000), Pace::Go);
        assert_eq!(pace(lim(1, 3_000).as_ref(), NOW), Pace::Go);
        let day = lim(0, MAX_RESET_S * 1_000).unwrap();
        assert_eq!(
            pace(Some(&day), NOW),
            Pace::Wait {
                until: day.reset_at,
                delay_s: retry::MAX_QUEUE_DELAY_S
            },
            "a long wait is chained through the queue"
        );

        // Two left: two go, the third waits for the reset, then all go.
        let mut kept = lim(2, 10_000);
        let mut went = 0;
        for _ in 0..5 {
            let (p, next) = spend(kept.as_ref(), NOW);
            kept = next;
            if p == Pace::Go {
                went += 1;
            }
        }
        assert_eq!(went, 2);
        assert_eq!(kept, lim(0, 10_000));
        assert_eq!(spend(kept.as_ref(), NOW + 10_000), (Pace::Go, None));
        assert_eq!(spend(None, NOW), (Pace::Go, None));
    }

    #[test]
    fn redirects_and_dead_letters_are_not_paced() {
        use super::super::delivery::Job;
        assert!(applies_to(&Job::Scheduled { at: NOW }));
        assert!(applies_to(&Job::ManualRetry));
        assert!(!applies_to(&Job::Redirect));
        assert!(!applies_to(&Job::DeadLetterQueue { scheduled_at: None }));
    }

    #[test]
    fn observe_keeps_the_latest_word() {
        let a = lim(5, 60_000).unwrap();
        assert_eq!(observe(None, Some(a), NOW), Some(a));
        assert_eq!(observe(Some(&a), None, NOW), Some(a), "no header: kept");
        assert_eq!(
            observe(Some(&a), None, NOW + 60_000),
            None,
            "until its reset"
        );
        let same_window = lim(7, 60_000).unwrap();
        assert_eq!(
            observe(Some(&a), Some(same_window), NOW),
            Some(a),
            "the lower count"
        );
        let next_window = lim(9, 120_000).unwrap();
        assert_eq!(observe(Some(&a), Some(next_window), NOW), Some(next_window));
    }

    fn header_name() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("RateLimit".to_string()),
            Just("ratelimit".to_string()),
            Just("RateLimit-Remaining".to_string()),
            Just("RateLimit-Reset".to_string()),
            Just("X-RateLimit-Remaining".to_string()),
            Just("x-ratelimit-reset".to_string()),
            "\\PC{0,20}",
        ]
    }

    proptest! {
        #[test]
        fn parsing_never_panics_on_any_bytes(
            headers in proptest::collection::vec(
                (header_name(), proptest::collection::vec(any::<u8>(), 0..80)),
                0..6,
            ),
            now in any::<u64>(),
        ) {
            let got = receiver_limit(headers.iter().map(|(k, v)| (k.as_str(), v.as_slice())), now);
            if let Some(l) = got {
                prop_assert!(l.reset_at > now);
                prop_assert!(l.reset_at <= now.saturating_add(MAX_RESET_S * 1_000));
            }
        }

        #[test]
        fn parsing_never_panics_on_structured_looking_text(
            v in "([\"a-z;=,. 0-9-]|r=|t=|\\\\){0,60}",
            now in 0u64..4_000_000_000_000,
        ) {
            for name in ["RateLimit", "X-RateLimit-Reset", "X-RateLimit-Remaining"] {
                let _ = receiver_limit([(name, v.as_bytes()), ("X-RateLimit-Remaining", b"0".as_slice())], now);
            }
        }

        #[test]
        fn a_well_formed_list_gives_its_tightest_item(
            items in proptest::collection::vec((0u64..1_000, 1u64..200_000), 1..6),
        ) {
            let v = items
                .iter()
                .enumerate()
                .map(|(i, (r, t))| format!("\"p{i}\";r={r};t={t}"))
                .collect::<Vec<_>>()
                .join(", ");
            let got = parse(&[("RateLimit", &v)]).unwrap();
            let least = items.iter().map(|(r, _)| *r).min().unwrap();
            let reset = items
                .iter()
                .filter(|(r, _)| *r == least)
                .map(|(_, t)| (*t).min(MAX_RESET_S))
                .max()
                .unwrap();
            prop_assert_eq!(got, ReceiverLimit { remaining: least, reset_at: NOW + reset * 1_000 });
        }

        #[test]
        fn never_sent_while_none_is_left(
            remaining in 0u64..5,
            reset_in in 1u64..100_000,
            at in 0u64..200_000,
        ) {
            let l = ReceiverLimit { remaining, reset_at: NOW + reset_in };
            let now = NOW + at;
            match pace(Some(&l), now) {
                Pace::Go => prop_assert!(remaining > 0 || now >= l.reset_at),
                Pace::Wait { until, delay_s } => {
                    prop_assert_eq!(until, l.reset_at);
                    prop_assert!(now + delay_s * 1_000 >= until, "the hop reaches the reset");
                    prop_assert!(delay_s >= 1);
                }
            }
        }
    }
}
