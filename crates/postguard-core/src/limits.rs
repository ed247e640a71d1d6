//! A key's limits (docs/limits.md): several named policies, each an anchored
//! window of [`rate_limit::check`], all enforced by the one admission, and a
//! concurrency quota (requests in flight at the origin).
//!
//! A request is admitted only if every policy admits its cost; a refusal by
//! any policy charges none (so a burst refused by `burst` leaves `minute`
//! untouched). The answer's headers list every policy, first the one that
//! binds: on a refusal the one that refused (the latest to reset, when
//! several did, so `Retry-After` is never early), otherwise the one with the
//! fewest remaining. `X-RateLimit-*` follow that first member.
//!
//! A plan's single-policy form (`requests_per_window`, `window_s`) is the
//! policy `"default"`, and a key's stored single window (before several
//! policies existed) is read as that policy's window: the headers of a
//! one-policy plan are exactly what they were.

use std::num::NonZeroU64;

use serde::{Deserialize, Serialize};

use crate::rate_limit::{self, check, Quota, Verdict, Window};

/// The name of the single-policy form's policy.
pub const DEFAULT_POLICY: &str = "default";
/// The name of the concurrency quota in the headers.
pub const INFLIGHT_POLICY: &str = "inflight";
/// The name of the gateway endpoints' own policy.
pub const GATEWAY_POLICY: &str = "gateway";

/// One named quota: at most `limit` cost units per window of `window_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    pub name: String,
    pub limit: u32,
    pub window_ms: u64,
}

impl Policy {
    /// Its quota; `None` for a limit or a window of zero.
    pub fn quota(&self) -> Option<Quota> {
        Quota::new(self.limit, self.window_ms)
    }

    /// The single-policy form's policy.
    pub fn single(quota: Quota) -> Policy {
        Policy {
            name: DEFAULT_POLICY.to_string(),
            limit: quota.limit(),
            window_ms: quota.window_ms(),
        }
    }

    /// `check` of this policy's window in `state`.
    fn check(&self, state: &Windows, now_ms: u64, cost: u32) -> (Option<Window>, Verdict) {
        let window = window_of(state, &self.name).copied();
        match (self.quota(), NonZeroU64::new(self.window_ms)) {
            (Some(q), _) => check(window, q, now_ms, cost),
            // A limit of zero (a key's stale overrides) admits only peeks.
            (None, Some(w)) => rate_limit::check_closed(window, w, now_ms, cost),
            // A window of zero, which no plan yields (each is 1 s or more).
            (None, None) => (None, NO_VERDICT),
        }
    }
}

/// What an admission enforces: its policies and, for the proxy, how many
/// requests of the key may be in flight at the origin at once.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub policies: Vec<Policy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// Report-only (a plan's `enforce: false`): a request the limits would
    /// refuse is admitted all the same, and the answer says which refused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub report_only: bool,
    /// Quota notices (`quota_notice`): the percentages of each policy's
    /// limit whose first crossing in a window is published. Empty: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notify_at: Vec<u8>,
}

/// A key's windows, one per policy name (in the order first charged).
pub type Windows = Vec<(String, Window)>;

/// The window of policy `name`.
pub fn window_of<'a>(windows: &'a Windows, name: &str) -> Option<&'a Window> {
    windows.iter().find(|(n, _)| n == name).map(|(_, w)| w)
}

/// What one policy said of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Said {
    pub name: String,
    pub verdict: Verdict,
}

/// The concurrency quota as the request left it: slots in use of `limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inflight {
    pub limit: u32,
    pub in_use: u32,
    /// Whether the request was refused for want of a slot.
    #[serde(default)]
    pub refused: bool,
}

/// Every policy's verdict, which binds, and the concurrency quota.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdicts {
    pub said: Vec<Said>,
    /// Index into `said` of the window policy that binds.
    pub binding: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inflight: Option<Inflight>,
}

impl Verdicts {
    /// One policy's verdict (an answer of a build before several policies).
    pub fn single(name: &str, verdict: Verdict) -> Verdicts {
        Verdicts {
            said: vec![Said {
                name: name.to_string(),
                verdict,
            }],
            binding: 0,
            inflight: None,
        }
    }

    /// The binding window policy's verdict (`X-RateLimit-*`, `/me`, the audit's
    /// remaining). A set with no policy reads as a refusal with nothing left.
    pub fn binding_verdict(&self) -> Verdict {
        self.said
            .get(self.binding)
            .or(self.said.first())
            .map_or(NO_VERDICT, |s| s.verdict)
    }

    /// Whether every window policy admitted the request (and a slot was free).
    pub fn admitted(&self) -> bool {
        self.said.iter().all(|s| s.verdict.admitted) && !self.inflight.is_some_and(|i| i.refused)
    }

    /// The policies that refused: the draft's `violated-policies`.
    pub fn violated(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .said
            .iter()
            .filter(|s| !s.verdict.admitted)
            .map(|s| s.name.clone())
            .collect();
        if self.inflight.is_some_and(|i| i.refused) {
            out.push(INFLIGHT_POLICY.to_string());
        }
        out
    }
}

const NO_VERDICT: Verdict = Verdict {
    admitted: false,
    limit: 0,
    remaining: 0,
    reset_ms: 0,
    reset_in_s: 0,
    reset_epoch_s: 0,
    window_s: 0,
};

/// The outcome of checking every policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// The windows to store (`None`: unchanged).
    pub windows: Option<Windows>,
    pub verdicts: Verdicts,
}

/// Checks a request of `cost` against every policy at `now_ms`: charged to
/// all of them if all admit it, to none otherwise. Pure; the caller stores
/// `windows`. A window from the future is pinned to now (as `check` does)
/// whatever the outcome.
pub fn check_all(state: &Windows, policies: &[Policy], now_ms: u64, cost: u32) -> Checked {
    let charged: Vec<(Option<Window>, Verdict)> = policies
        .iter()
        .map(|p| p.check(state, now_ms, cost))
        .collect();
    let admitted = charged.iter().all(|(_, v)| v.admitted);
    // A refusal by any policy charges none: the others are read at cost 0
    // (which writes nothing but a pinned window), the refusers keep theirs.
    let outcome: Vec<(Option<Window>, Verdict)> = match admitted {
        true => charged,
        false => policies
            .iter()
            .zip(charged)
            .map(|(p, (_, refused))| {
                let (w, peek) = p.check(state, now_ms, 0);
                (w, if refused.admitted { peek } else { refused })
            })
            .collect(),
    };
    let mut windows = state.clone();
    let mut changed = false;
    for (p, (w, _)) in policies.iter().zip(&outcome) {
        let Some(w) = w else { continue };
        match windows.iter_mut().find(|(n, _)| *n == p.name) {
            Some((_, old)) if old == w => {}
            Some((_, old)) => {
                *old = *w;
                changed = true;
            }
            None => {
                windows.push((p.name.clone(), *w));
                changed = true;
            }
        }
    }
    let said: Vec<Said> = policies
        .iter()
        .zip(outcome)
        .map(|(p, (_, verdict))| Said {
            name: p.name.clone(),
            verdict,
        })
        .collect();
    Checked {
        windows: changed.then_some(windows),
        verdicts: Verdicts {
            binding: binding(&said),
            said,
            inflight: None,
        },
    }
}

/// The policy that binds: of those that refused, the one that resets last
/// (a request is admitted only once all of them have); otherwise the one
/// with the fewest remaining (the first of equals).
pub fn binding(said: &[Said]) -> usize {
    let refused = said
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.verdict.admitted)
        .max_by_key(|(i, s)| (s.verdict.reset_ms, std::cmp::Reverse(*i)));
    if let Some((i, _)) = refused {
        return i;
    }
    said.iter()
        .enumerate()
        .min_by_key(|(i, s)| (s.verdict.remaining, *i))
        .map_or(0, |(i, _)| i)
}

/// The rate-limit headers of docs/request-path.md, docs/limits.md: `X-RateLimit-*` of the
/// member that binds, `RateLimit-Policy` listing every policy in the plan's
/// order and `RateLimit` their state, the binding one first, with the
/// concurrency quota. A one-policy
/// plan's headers are those of `rate_limit::headers`.
pub fn headers(v: &Verdicts) -> Vec<(&'static str, String)> {
    let inflight_binds = v.inflight.is_some_and(|i| i.refused);
    let first = v.binding_verdict();
    let mut policy = Vec::new();
    let mut state = Vec::new();
    let mut order: Vec<&Said> = Vec::with_capacity(v.said.len());
    if let Some(s) = v.said.get(v.binding) {
        order.push(s);
    }
    order.extend(
        v.said
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != v.binding)
            .map(|(_, s)| s),
    );
    // The policies in the plan's order (a stable list a client can cache);
    // their state with the binding one first.
    for s in &v.said {
        policy.push(format!(
            "\"{}\";q={};w={}",
            s.name, s.verdict.limit, s.verdict.window_s
        ));
    }
    for s in &order {
        state.push(format!(
            "\"{}\";r={};t={}",
            s.name, s.verdict.remaining, s.verdict.reset_in_s
        ));
    }
    if let Some(i) = v.inflight {
        let free = i.limit.saturating_sub(i.in_use);
        policy.push(format!(
            "\"{INFLIGHT_POLICY}\";q={};qu=\"concurrent-requests\"",
            i.limit
        ));
        let item = format!("\"{INFLIGHT_POLICY}\";r={free}");
        match inflight_binds {
            true => state.insert(0, item),
            false => state.push(item),
        }
    }
    let (limit, remaining, reset) = match (inflight_binds, v.inflight) {
        (true, Some(i)) => (i.limit, 0, first.reset_epoch_s.max(1)),
        _ => (first.limit, first.remaining, first.reset_epoch_s),
    };
    vec![
        ("X-RateLimit-Limit", limit.to_string()),
        ("X-RateLimit-Remaining", remaining.to_string()),
        ("X-RateLimit-Reset", reset.to_string()),
        ("RateLimit-Policy", policy.join(", ")),
        ("RateLimit", state.join(", ")),
    ]
}

/// Whether another request may take a slot: `in_use` of `limit` are taken.
pub fn slot_free(in_use: u32, limit: u32) -> bool {
    in_use < limit
}

/// `rate_limit::headers` for the unauthenticated limiter and other single
/// windows, named.
pub fn single_headers(v: &Verdict, name: &str) -> Vec<(&'static str, String)> {
    rate_limit::headers_of(v, name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(name: &str, limit: u32, window_s: u64) -> Policy {
        Policy {
            name: name.into(),
            limit,
            window_ms: window_s * 1000,
        }
    }

    fn trial() -> Vec<Policy> {
        vec![
            p("burst", 10, 1),
            p("minute", 30, 60),
            p("day", 1000, 86_400),
        ]
    }

    #[test]
    fn a_zero_limit_refuses_all_but_peeks_and_tells_its_reset() {
        // What a key's overrides written for its plan's earlier form can
        // resolve to: the same answers as before `Quota` refused zeros.
        let stale = [p(DEFAULT_POLICY, 0, 30)];
        let c = check_all(&Vec::new(), &stale, 1_000, 1);
        assert!(!c.verdicts.admitted());
        let v = c.verdicts.binding_verdict();
        assert_eq!(
            (v.limit, v.remaining, v.reset_ms, v.window_s),
            (0, 0, 31_000, 30)
        );
        assert_eq!(c.windows, None);
        assert!(check_all(&Vec::new(), &stale, 1_000, 0).verdicts.admitted());
    }

    #[test]
    fn one_policy_reads_and_writes_as_before() {
        let q = Quota::new(60, 60_000).unwrap();
        let (w, v) = check(None, q, 1_716_392_400_000, 13);
        let c = check_all(&Vec::new(), &[Policy::single(q)], 1_716_392_400_000, 13);
        assert_eq!(
            c.windows,
            Some(vec![(
                DEFAULT_POLICY.to_string(),
                w.unwrap_or(Window {
                    start_ms: 0,
                    used: 0
                })
            )])
        );
        assert_eq!(
            headers(&c.verdicts),
            rate_limit::headers(&v),
            "the same headers"
        );
    }

    #[test]
    fn the_binding_policy_is_the_fewest_remaining_then_the_refuser() {
        let mut st = Vec::new();
        for _ in 0..9 {
            let c = check_all(&st, &trial(), 0, 1);
            st = c.windows.unwrap_or(st);
        }
        let c = check_all(&st, &trial(), 0, 1);
        assert!(c.verdicts.admitted());
        assert_eq!(
            c.verdicts.said[c.verdicts.binding].name, "burst",
            "0 left of burst"
        );
        st = c.windows.unwrap_or(st);
        let refused = check_all(&st, &trial(), 500, 1);
        assert!(!refused.verdicts.admitted());
        assert_eq!(refused.verdicts.violated(), ["burst"]);
        assert_eq!(refused.windows, None, "a refusal charges no policy");
        let h = headers(&refused.verdicts);
        assert_eq!(
            h[3].1,
            "\"burst\";q=10;w=1, \"minute\";q=30;w=60, \"day\";q=1000;w=86400"
        );
        assert_eq!(
            h[4].1,
            "\"burst\";r=0;t=1, \"minute\";r=20;t=60, \"day\";r=990;t=86400"
        );
        assert_eq!((h[0].1.as_str(), h[1].1.as_str()), ("10", "0"));
    }

    #[test]
    fn the_policy_list_keeps_the_plans_order_while_the_state_leads_with_the_binder() {
        let pols = vec![p("a", 40, 3600), p("b", 25, 3600)];
        let c = check_all(&Vec::new(), &pols, 0, 1);
        let h = headers(&c.verdicts);
        assert_eq!(h[3].1, "\"a\";q=40;w=3600, \"b\";q=25;w=3600");
        assert_eq!(h[4].1, "\"b\";r=24;t=3600, \"a\";r=39;t=3600");
        assert_eq!((h[0].1.as_str(), h[1].1.as_str()), ("25", "24"));
    }

    #[test]
    fn the_refuser_that_resets_last_binds() {
        let pols = vec![p("a", 1, 1), p("b", 1, 60)];
        let c = check_all(&Vec::new(), &pols, 0, 1);
        let st = c.windows.unwrap_or_default();
        let r = check_all(&st, &pols, 100, 1);
        assert_eq!(r.verdicts.violated(), ["a", "b"]);
        assert_eq!(r.verdicts.said[r.verdicts.binding].name, "b");
        assert_eq!(r.verdicts.binding_verdict().retry_after_s(), 60);
    }

    #[test]
    fn concurrency_heads_the_list_when_it_refuses() {
        let mut v = check_all(&Vec::new(), &[p("minute", 30, 60)], 0, 0).verdicts;
        v.inflight = Some(Inflight {
            limit: 5,
            in_use: 5,
            refused: true,
        });
        let h = headers(&v);
        assert_eq!(
            h[3].1,
            "\"minute\";q=30;w=60, \"inflight\";q=5;qu=\"concurrent-requests\""
        );
        assert_eq!(h[4].1, "\"inflight\";r=0, \"minute\";r=30;t=60");
        assert_eq!((h[0].1.as_str(), h[1].1.as_str()), ("5", "0"));
        assert_eq!(v.violated(), ["inflight"]);
        assert!(!v.admitted());
    }

    proptest! {
        /// However requests arrive, no policy ever admits more than its quota in
        /// one of its windows, and a refused request changes no window.
        #[test]
        fn no_policy_is_ever_over_admitted(
            steps in proptest::collection::vec((0u64..3_000, 1u32..4), 1..200),
        ) {
            let pols = vec![p("burst", 5, 1), p("minute", 12, 60)];
            let mut st: Windows = Vec::new();
            let mut now = 0;
            let mut admitted: Vec<(u64, u32)> = Vec::new();
            for (dt, cost) in steps {
                now += dt;
                let c = check_all(&st, &pols, now, cost);
                if c.verdicts.admitted() {
                    admitted.push((now, cost));
                } else {
                    prop_assert!(c.windows.is_none() || c.windows.as_ref() == Some(&st));
                }
                if let Some(w) = c.windows { st = w; }
                for pol in &pols {
                    if let Some(w) = window_of(&st, &pol.name) {
                        let used: u32 = admitted
                            .iter()
                            .filter(|(t, _)| *t >= w.start_ms && *t < w.start_ms + pol.window_ms)
                            .map(|(_, c)| c)
                            .sum();
                        prop_assert!(used <= pol.limit, "{} admitted {used} of {}", pol.name, pol.limit);
                    }
                }
            }
        }
    }
}
