//! Proactive throttling: one limiter per client, shared by all its concurrent calls.
//!
//! [`LimiterState`] is the pure part: it learns the key's budget from the rate-limit
//! headers of every response and decides, for a given time, whether a call may be sent
//! now. [`Limiter`] wraps it in a mutex and does the waiting.
//!
//! The budget a call may use is `remaining − in_flight − reserve`: `remaining` is the
//! lowest value the server reported in the current window (responses can arrive out of
//! order), `in_flight` counts calls sent and not answered yet (they may already have
//! been counted by the server, so this errs on the safe side). The end of the window is
//! tracked as an upper bound: `t` of `RateLimit` is rounded up, so `received + t` is never
//! before the real reset. When the window is over the limiter assumes the full budget,
//! minus whatever was still in flight across the boundary.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use reqwest::header::HeaderMap;
use tokio::sync::Notify;

use crate::clock::Clock;

/// How the client throttles itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThrottleConfig {
    /// Off: calls are sent at once and 429s are left to the retry rule.
    pub enabled: bool,
    /// Calls wait for the reset when the budget would fall to this many or fewer
    /// (`Some(0)` uses the whole budget). Capped at `limit − 1` so a window always admits
    /// one. `None` (the default): a tenth of the limit the gateway advertises, at least 1
    /// ([`reserve_for`]).
    pub threshold: Option<u32>,
    /// Spread calls evenly over the window (`window / limit` apart) instead of bursting.
    pub pacing: bool,
}

impl Default for ThrottleConfig {
    fn default() -> Self {
        ThrottleConfig {
            enabled: true,
            threshold: None,
            pacing: false,
        }
    }
}

/// The budget kept in reserve on a plan of `limit` per window: `threshold` when given,
/// else a tenth of the limit rounded down and at least 1 (for other processes sharing the
/// key) — and never the whole budget: at most `limit − 1`, so every window admits a call.
pub fn reserve_for(limit: u32, threshold: Option<u32>) -> u32 {
    let wanted = threshold.unwrap_or_else(|| (limit / 10).max(1));
    wanted.min(limit.saturating_sub(1))
}

/// The rate-limit fields of one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RateInfo {
    pub limit: Option<u32>,
    pub remaining: Option<u32>,
    /// Time until the window ends, rounded up by the server.
    pub reset_in: Option<Duration>,
    pub window: Option<Duration>,
    pub retry_after: Option<Duration>,
    /// The answer was a 429.
    pub rejected: bool,
}

impl RateInfo {
    /// Reads the IETF `RateLimit`/`RateLimit-Policy` fields (preferred: `t` is relative),
    /// `X-RateLimit-*` and `Retry-After`; `unix_now` turns `X-RateLimit-Reset` into a
    /// duration when the IETF `t` is absent. Unparseable values count as absent.
    ///
    /// Only a window policy is a budget: a concurrency quota (`"inflight";r=0`, no `t`) is
    /// never read as one. `X-RateLimit-*` follow the first `RateLimit` member, so they are
    /// read only when that member is the window policy read here (or when there is no
    /// `RateLimit` field): after a concurrency refusal they are the inflight quota's. Such
    /// a refusal is not a window's either (`rejected` stays false): the window has budget.
    pub fn from_headers(headers: &HeaderMap, status: u16, unix_now: Duration) -> Self {
        let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let num = |name: &str| get(name).and_then(|v| v.trim().parse::<u64>().ok());
        let field = get("ratelimit");
        let ietf = field.map(binding).unwrap_or_default();
        let first = field.and_then(|v| members(v).next());
        let x_follows = match first {
            None => field.is_none(),
            Some((name, _)) => ietf.name == Some(name),
        };
        let x = |name: &str| num(name).filter(|_| x_follows);
        // Limit and window of the same policy as `r` and `t`, by name.
        let policy = get("ratelimit-policy")
            .and_then(|v| members(v).find(|(name, _)| Some(*name) == ietf.name))
            .map(|(_, p)| p)
            .unwrap_or_default();
        // `X-RateLimit-Reset` is whole seconds and may read up to 1 s before the real end
        // (postguard sends floor(now) + t): one second more keeps the wait from ending early.
        let reset_in = ietf.t.map(Duration::from_secs).or_else(|| {
            x("x-ratelimit-reset")
                .map(|at| Duration::from_secs(at.saturating_add(1)).saturating_sub(unix_now))
        });
        // A 429 spends the window when a window policy refused: the first member has a `t`
        // (or, without the IETF field, nothing says otherwise).
        let window_refused = first.is_none_or(|(_, p)| p.t.is_some());
        RateInfo {
            limit: policy.q.or_else(|| x("x-ratelimit-limit")).and_then(to_u32),
            remaining: ietf
                .r
                .or_else(|| x("x-ratelimit-remaining"))
                .and_then(to_u32),
            reset_in,
            window: policy.w.map(Duration::from_secs),
            retry_after: get("retry-after").and_then(|v| parse_retry_after(v, unix_now)),
            rejected: status == 429 && window_refused,
        }
    }

    fn is_empty(&self) -> bool {
        self.limit.is_none() && self.remaining.is_none() && self.reset_in.is_none()
    }
}

fn to_u32(v: u64) -> Option<u32> {
    u32::try_from(v).ok()
}

/// `Retry-After` as delta-seconds or an HTTP-date (RFC 9110 §10.2.3).
pub fn parse_retry_after(value: &str, unix_now: Duration) -> Option<Duration> {
    let v = value.trim();
    if let Ok(s) = v.parse::<u64>() {
        return Some(Duration::from_secs(s));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    let at = at.duration_since(std::time::UNIX_EPOCH).ok()?;
    Some(at.saturating_sub(unix_now))
}

#[derive(Debug, Default, Clone, Copy)]
struct Params<'a> {
    name: Option<&'a str>,
    r: Option<u64>,
    t: Option<u64>,
    q: Option<u64>,
    w: Option<u64>,
}

/// The members of a `RateLimit`/`RateLimit-Policy` list
/// (`"burst";r=3;t=1, "minute";r=47;t=13`): each name with its integer parameters.
fn members(value: &str) -> impl Iterator<Item = (&str, Params<'_>)> {
    value.split(',').map(|item| {
        let mut parts = item.split(';');
        let name = parts.next().unwrap_or_default().trim().trim_matches('"');
        let mut out = Params {
            name: Some(name),
            ..Params::default()
        };
        for param in parts {
            let Some((k, v)) = param.split_once('=') else {
                continue;
            };
            let n = v.trim().parse::<u64>().ok();
            match k.trim() {
                "r" => out.r = n,
                "t" => out.t = n,
                "q" => out.q = n,
                "w" => out.w = n,
                _ => {}
            }
        }
        (name, out)
    })
}

/// The policy that binds: of the `RateLimit` members with both `r` and `t` (time windows;
/// a concurrency quota has no `t`), the one with the fewest remaining — postguard lists
/// it first. Its numbers are never mixed with another policy's.
fn binding(value: &str) -> Params<'_> {
    members(value)
        .map(|(_, p)| p)
        .filter(|p| p.r.is_some() && p.t.is_some())
        .min_by_key(|p| p.r)
        .unwrap_or_default()
}

/// The name of the policy that binds, as the gateway says it: the first member of the
/// `RateLimit` field (on a 429 the one that refused — `inflight` for the concurrency quota —
/// otherwise the one with the fewest remaining).
pub fn binding_policy(headers: &HeaderMap) -> Option<String> {
    let field = headers.get("ratelimit")?.to_str().ok()?;
    members(field)
        .next()
        .map(|(name, _)| name)
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
}

/// What a call should do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Go,
    /// Nothing will change before this time (the reset, or the next pacing slot).
    WaitUntil(Duration),
    /// The budget is unknown or used up by calls in flight: wait for one to answer.
    WaitForResponse,
}

/// The limiter's knowledge, updated from responses; all times on the client's clock.
#[derive(Debug, Default, Clone)]
pub struct LimiterState {
    limit: Option<u32>,
    window: Option<Duration>,
    /// Lowest `remaining` reported for the current window.
    remaining: Option<u32>,
    /// Upper bound of the current window's end.
    reset_at: Option<Duration>,
    /// Budget left by the limiter's own count since the last renewal.
    local_budget: Option<u32>,
    in_flight: u32,
    /// Bumped at every window change; answers to calls sent before it are stale.
    generation: u64,
    last_send: Option<Duration>,
}

impl LimiterState {
    /// Calls sent and not answered yet.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// The budget that may still be used, as far as the limiter knows.
    pub fn available(&self) -> Option<u32> {
        let server = self.remaining.map(|m| m.saturating_sub(self.in_flight));
        match (server, self.local_budget) {
            (Some(s), Some(l)) => Some(s.min(l)),
            (s, l) => s.or(l),
        }
    }

    fn renew_if_over(&mut self, now: Duration) {
        let Some(end) = self.reset_at else { return };
        if now < end {
            return;
        }
        self.generation += 1;
        self.reset_at = None;
        self.remaining = None;
        // Calls still in flight may land in the new window: count them as spent there.
        self.local_budget = self.limit.map(|l| l.saturating_sub(self.in_flight));
    }

    /// Decides for a call at `now`.
    pub fn decide(&mut self, now: Duration, cfg: &ThrottleConfig) -> Admit {
        if !cfg.enabled {
            return Admit::Go;
        }
        self.renew_if_over(now);
        let Some(available) = self.available() else {
            // Nothing known yet: one probe at a time until a response tells the budget.
            return if self.in_flight == 0 {
                Admit::Go
            } else {
                Admit::WaitForResponse
            };
        };
        // The limit is known whenever `available` is, but for a server that sends only
        // `remaining`: then keep the explicit threshold, or one call, back.
        let reserve = self.limit.map_or(cfg.threshold.unwrap_or(1), |l| {
            reserve_for(l, cfg.threshold)
        });
        if available > reserve {
            return match self.pacing_slot(cfg) {
                Some(slot) if slot > now => Admit::WaitUntil(slot),
                _ => Admit::Go,
            };
        }
        match self.reset_at {
            Some(end) => Admit::WaitUntil(end),
            None if self.in_flight > 0 => Admit::WaitForResponse,
            // Out of budget by our count, yet no reset known and nothing in flight to learn
            // it from: send, rather than wait forever; the retry rule absorbs a 429.
            None => Admit::Go,
        }
    }

    fn pacing_slot(&self, cfg: &ThrottleConfig) -> Option<Duration> {
        if !cfg.pacing {
            return None;
        }
        let interval = self.window?.checked_div(self.limit?.max(1))?;
        Some(self.last_send? + interval)
    }

    /// Records that a call is sent; returns the generation its answer belongs to.
    pub fn on_send(&mut self, now: Duration) -> u64 {
        self.in_flight += 1;
        self.last_send = Some(now);
        if let Some(b) = self.local_budget.as_mut() {
            *b = b.saturating_sub(1);
        }
        self.generation
    }

    /// Records a call that ended without an answer: it may have been counted.
    pub fn on_lost(&mut self, generation: u64) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if generation == self.generation {
            if let Some(m) = self.remaining.as_mut() {
                *m = m.saturating_sub(1);
            }
        }
    }

    /// Records an answer received at `now` to a call sent in `generation`.
    pub fn on_response(&mut self, now: Duration, generation: u64, info: &RateInfo) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if info.is_empty() {
            return;
        }
        self.limit = info.limit.or(self.limit);
        self.window = info.window.or(self.window);
        let end = info
            .reset_in
            .or(info.retry_after.filter(|_| info.rejected))
            .map(|t| now + t);
        if generation != self.generation {
            // Sent before the last window change: its numbers may be the old window's.
            // A rejection is still news: the new window is spent.
            if info.rejected {
                self.absorb(Some(0), end);
            }
            return;
        }
        if self.is_newer_window(end) {
            self.generation += 1;
            self.remaining = None;
            self.reset_at = None;
            self.local_budget = None;
        }
        let spent =
            info.rejected || matches!((info.remaining, self.limit), (Some(r), Some(l)) if r < l);
        // A response that used nothing (e.g. `GET /me`) says nothing about a window
        // that may not have started.
        if spent {
            let remaining = if info.rejected {
                Some(0)
            } else {
                info.remaining
            };
            self.absorb(remaining, end);
        }
    }

    fn absorb(&mut self, remaining: Option<u32>, end: Option<Duration>) {
        if let Some(r) = remaining {
            self.remaining = Some(self.remaining.map_or(r, |m| m.min(r)));
        }
        if let Some(e) = end {
            self.reset_at = Some(self.reset_at.map_or(e, |old| old.min(e)));
        }
    }

    /// An end well past the current one means the server opened another window already
    /// (responses of one window agree on its end within the rounding of `t`).
    fn is_newer_window(&self, end: Option<Duration>) -> bool {
        let (Some(current), Some(end)) = (self.reset_at, end) else {
            return false;
        };
        let slack = self.window.map_or(Duration::from_secs(1), |w| {
            (w / 2).max(Duration::from_secs(1))
        });
        end > current + slack
    }
}

/// The shared limiter of one client.
#[derive(Debug)]
pub(crate) struct Limiter {
    state: Mutex<LimiterState>,
    changed: Notify,
    config: ThrottleConfig,
}

/// An admitted call; report its end with [`Permit::answered`], or drop it (lost).
pub(crate) struct Permit {
    limiter: Arc<Limiter>,
    generation: u64,
    open: bool,
}

/// How often a call waiting for a response re-checks (a response always wakes it earlier).
const RECHECK: Duration = Duration::from_secs(1);

impl Limiter {
    pub(crate) fn new(config: ThrottleConfig) -> Arc<Self> {
        Arc::new(Limiter {
            state: Mutex::new(LimiterState::default()),
            changed: Notify::new(),
            config,
        })
    }

    fn with_state<R>(&self, f: impl FnOnce(&mut LimiterState) -> R) -> R {
        // The state stays consistent at every step, so a poisoned lock is still usable.
        let mut guard = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut guard)
    }

    pub(crate) fn snapshot(&self) -> LimiterState {
        self.with_state(|s| s.clone())
    }

    /// Waits until a call may be sent; returns whether it had to wait.
    pub(crate) async fn acquire(self: &Arc<Self>, clock: &dyn Clock) -> (Permit, bool) {
        let mut waited = false;
        loop {
            let notified = self.changed.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let now = clock.now();
            let decision = self.with_state(|s| {
                let d = s.decide(now, &self.config);
                (d, (d == Admit::Go).then(|| s.on_send(now)))
            });
            let wait = match decision {
                (_, Some(generation)) => {
                    let permit = Permit {
                        limiter: Arc::clone(self),
                        generation,
                        open: true,
                    };
                    return (permit, waited);
                }
                (Admit::WaitUntil(at), None) => at.saturating_sub(now),
                (_, None) => RECHECK,
            };
            waited = true;
            let sleep = clock.sleep(wait);
            futures_util::future::select(sleep, notified).await;
        }
    }
}

impl Permit {
    pub(crate) fn answered(mut self, now: Duration, info: &RateInfo) {
        self.open = false;
        self.limiter
            .with_state(|s| s.on_response(now, self.generation, info));
        self.limiter.changed.notify_waiters();
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.open {
            self.limiter.with_state(|s| s.on_lost(self.generation));
            self.limiter.changed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    const MS: fn(u64) -> Duration = Duration::from_millis;
    const S: fn(u64) -> Duration = Duration::from_secs;

    fn cfg(threshold: u32) -> ThrottleConfig {
        ThrottleConfig {
            enabled: true,
            threshold: Some(threshold),
            pacing: false,
        }
    }

    fn info(limit: u32, remaining: u32, t: u64) -> RateInfo {
        RateInfo {
            limit: Some(limit),
            remaining: Some(remaining),
            reset_in: Some(S(t)),
            window: Some(S(5)),
            retry_after: None,
            rejected: false,
        }
    }

    #[test]
    fn reads_every_header_form() {
        let mut h = HeaderMap::new();
        h.insert("x-ratelimit-limit", "60".parse().unwrap());
        h.insert("x-ratelimit-remaining", "47".parse().unwrap());
        h.insert("x-ratelimit-reset", "1000013".parse().unwrap());
        h.insert("ratelimit-policy", "\"default\";q=60;w=60".parse().unwrap());
        h.insert("ratelimit", "\"default\";r=47;t=13".parse().unwrap());
        h.insert("retry-after", "7".parse().unwrap());
        let i = RateInfo::from_headers(&h, 429, S(1_000_000));
        assert_eq!(i.limit, Some(60));
        assert_eq!(i.remaining, Some(47));
        assert_eq!(i.reset_in, Some(S(13)));
        assert_eq!(i.window, Some(S(60)));
        assert_eq!(i.retry_after, Some(S(7)));
        assert!(i.rejected);
        // Only the legacy fields: the reset comes from X-RateLimit-Reset, plus its rounding.
        h.remove("ratelimit");
        h.insert("x-ratelimit-reset", "1000020".parse().unwrap());
        let at = S(1_000_000) + MS(400);
        let reset_in = RateInfo::from_headers(&h, 200, at).reset_in;
        assert_eq!(reset_in, Some(MS(20_600)));
        // Only the IETF fields; several policies: the binding one (fewest remaining, a
        // time window), with its own limit and window — never another policy's.
        let mut ietf = HeaderMap::new();
        ietf.insert(
            "ratelimit",
            "\"a\";r=9;t=30, \"b\";r=2;t=1, \"inflight\";r=1"
                .parse()
                .unwrap(),
        );
        ietf.insert(
            "ratelimit-policy",
            "\"a\";q=30;w=60, \"b\";q=10;w=1, \"inflight\";q=5;qu=\"concurrent-requests\""
                .parse()
                .unwrap(),
        );
        let i = RateInfo::from_headers(&ietf, 200, S(0));
        assert_eq!((i.remaining, i.reset_in), (Some(2), Some(S(1))));
        assert_eq!((i.limit, i.window), (Some(10), Some(S(1))));
        // An HTTP-date Retry-After.
        let at = std::time::UNIX_EPOCH + S(1_000_030);
        let date = httpdate::fmt_http_date(at);
        assert_eq!(parse_retry_after(&date, S(1_000_000)), Some(S(30)));
        assert_eq!(parse_retry_after("soon", S(0)), None);
    }

    #[test]
    fn the_concurrency_quota_is_never_a_window_budget() {
        // A request refused for want of a slot: `inflight` heads RateLimit and X-RateLimit-*
        // follow it (5, 0) — neither is a window's budget, and the window is not spent.
        let mut h = HeaderMap::new();
        h.insert(
            "ratelimit",
            "\"inflight\";r=0, \"minute\";r=30;t=60".parse().unwrap(),
        );
        h.insert(
            "ratelimit-policy",
            "\"minute\";q=30;w=60, \"inflight\";q=5;qu=\"concurrent-requests\""
                .parse()
                .unwrap(),
        );
        h.insert("x-ratelimit-limit", "5".parse().unwrap());
        h.insert("x-ratelimit-remaining", "0".parse().unwrap());
        h.insert("x-ratelimit-reset", "1000060".parse().unwrap());
        h.insert("retry-after", "1".parse().unwrap());
        let i = RateInfo::from_headers(&h, 429, S(1_000_000));
        assert_eq!((i.limit, i.remaining), (Some(30), Some(30)));
        assert_eq!((i.reset_in, i.window), (Some(S(60)), Some(S(60))));
        assert!(
            !i.rejected,
            "a concurrency refusal does not spend the window"
        );
        assert_eq!(binding_policy(&h).as_deref(), Some("inflight"));
        let mut s = LimiterState::default();
        let g = s.on_send(MS(0));
        s.on_response(MS(10), g, &i);
        assert_eq!(s.decide(MS(20), &cfg(0)), Admit::Go);
        // Without the policy list the inflight quota's X-RateLimit-Limit is not borrowed.
        h.remove("ratelimit-policy");
        assert_eq!(RateInfo::from_headers(&h, 429, S(1_000_000)).limit, None);
        // Only the concurrency quota: no window budget at all.
        let mut only = HeaderMap::new();
        only.insert("ratelimit", "\"inflight\";r=0".parse().unwrap());
        only.insert("x-ratelimit-remaining", "0".parse().unwrap());
        let i = RateInfo::from_headers(&only, 429, S(0));
        assert_eq!((i.remaining, i.limit, i.reset_in), (None, None, None));
        // A window policy's refusal does spend it.
        let mut w = HeaderMap::new();
        w.insert("ratelimit", "\"minute\";r=0;t=42".parse().unwrap());
        assert!(RateInfo::from_headers(&w, 429, S(0)).rejected);
    }

    #[test]
    fn probes_one_call_until_the_budget_is_known() {
        let mut s = LimiterState::default();
        assert_eq!(s.decide(MS(0), &cfg(0)), Admit::Go);
        let g = s.on_send(MS(0));
        assert_eq!(s.decide(MS(1), &cfg(0)), Admit::WaitForResponse);
        s.on_response(MS(10), g, &info(10, 9, 5));
        assert_eq!(s.decide(MS(10), &cfg(0)), Admit::Go);
    }

    #[test]
    fn counts_calls_in_flight_and_keeps_the_threshold() {
        let mut s = LimiterState::default();
        let g = s.on_send(MS(0));
        s.on_response(MS(10), g, &info(10, 9, 5));
        // Threshold 0: nine more may go at once, the tenth waits for the reset.
        for _ in 0..9 {
            assert_eq!(s.decide(MS(10), &cfg(0)), Admit::Go);
            s.on_send(MS(10));
        }
        assert_eq!(s.in_flight(), 9);
        assert_eq!(s.decide(MS(10), &cfg(0)), Admit::WaitUntil(MS(5010)));
        // An explicit threshold of 5 keeps five in reserve.
        let mut t = LimiterState::default();
        let g = t.on_send(MS(0));
        t.on_response(MS(10), g, &info(10, 9, 5));
        let sent = (0..10)
            .take_while(|_| {
                let go = t.decide(MS(10), &cfg(5)) == Admit::Go;
                if go {
                    t.on_send(MS(10));
                }
                go
            })
            .count();
        assert_eq!(sent, 4, "9 remaining − 5 reserved");
    }

    #[test]
    fn the_default_reserve_is_a_tenth_of_the_limit_at_least_one_never_all() {
        let got: Vec<_> = [1, 2, 5, 10, 19, 20, 60, 2000]
            .iter()
            .map(|&l| reserve_for(l, None))
            .collect();
        assert_eq!(got, [0, 1, 1, 1, 1, 2, 6, 200]);
        let explicit: Vec<_> = [0, 5, 50]
            .iter()
            .map(|&t| reserve_for(10, Some(t)))
            .collect();
        assert_eq!(explicit, [0, 5, 9], "absolute, capped at limit − 1");
        assert_eq!(reserve_for(0, None), 0);
    }

    /// Issue 25 item 7: on a 5-per-5 s plan the old fixed reserve of 5 (capped at 4) let
    /// one call through per window; the relative default lets four.
    #[test]
    fn the_default_reserve_sends_four_of_five() {
        for (config, expected) in [(ThrottleConfig::default(), 4), (cfg(5), 1)] {
            let mut s = LimiterState::default();
            let g = s.on_send(MS(0));
            s.on_response(MS(10), g, &info(5, 4, 5));
            let mut sent = 1;
            while s.decide(MS(10), &config) == Admit::Go {
                s.on_send(MS(10));
                sent += 1;
            }
            assert_eq!(sent, expected, "{config:?}");
        }
    }

    #[test]
    fn answers_out_of_order_keep_the_lowest_remaining() {
        let mut s = LimiterState::default();
        let g = s.on_send(MS(0));
        s.on_response(MS(10), g, &info(10, 9, 5));
        let (a, b) = (s.on_send(MS(11)), s.on_send(MS(11)));
        s.on_response(MS(20), b, &info(10, 7, 5));
        s.on_response(MS(21), a, &info(10, 8, 5));
        assert_eq!(s.available(), Some(7));
    }

    #[test]
    fn renews_the_budget_after_the_reset_minus_calls_still_in_flight() {
        let mut s = LimiterState::default();
        let g = s.on_send(MS(0));
        s.on_response(MS(10), g, &info(10, 0, 5));
        assert_eq!(s.decide(MS(100), &cfg(0)), Admit::WaitUntil(MS(5010)));
        let late = s.on_send(MS(100)); // e.g. a call of a client with throttling off
        assert_eq!(s.decide(MS(5010), &cfg(0)), Admit::Go);
        assert_eq!(
            s.available(),
            Some(9),
            "the call in flight may count in the new window"
        );
        // Its answer belongs to the old generation: its "0 remaining" does not empty the
        // new window, and the call stays counted there (it may have landed in it).
        s.on_response(MS(5020), late, &info(10, 0, 1));
        assert_eq!(s.available(), Some(9));
    }

    #[test]
    fn a_rejection_spends_the_window_and_a_lost_call_counts() {
        let mut s = LimiterState::default();
        let g = s.on_send(MS(0));
        s.on_response(MS(10), g, &info(10, 5, 5));
        let g = s.on_send(MS(20));
        s.on_lost(g);
        assert_eq!(s.available(), Some(4));
        let g = s.on_send(MS(30));
        let rejected = RateInfo {
            rejected: true,
            retry_after: Some(S(3)),
            reset_in: None,
            remaining: Some(0),
            ..info(10, 0, 0)
        };
        s.on_response(MS(40), g, &rejected);
        assert_eq!(s.decide(MS(50), &cfg(0)), Admit::WaitUntil(MS(3040)));
    }

    #[test]
    fn pacing_spreads_calls_over_the_window() {
        let mut s = LimiterState::default();
        let paced = ThrottleConfig {
            pacing: true,
            ..cfg(0)
        };
        let g = s.on_send(MS(0));
        s.on_response(MS(10), g, &info(10, 9, 5));
        assert_eq!(s.decide(MS(10), &paced), Admit::WaitUntil(MS(500)));
        assert_eq!(s.decide(MS(500), &paced), Admit::Go);
        s.on_send(MS(500));
        assert_eq!(s.decide(MS(600), &paced), Admit::WaitUntil(MS(1000)));
    }

    #[test]
    fn disabled_always_goes() {
        let mut s = LimiterState::default();
        let off = ThrottleConfig {
            enabled: false,
            ..cfg(5)
        };
        let g = s.on_send(MS(0));
        s.on_response(MS(10), g, &info(10, 0, 5));
        assert_eq!(s.decide(MS(20), &off), Admit::Go);
    }

    /// The gateway's limiter (an anchored fixed window, docs/limits.md) in milliseconds.
    struct FakeGateway {
        limit: u32,
        window_ms: u64,
        start_ms: Option<u64>,
        used: u32,
    }

    impl FakeGateway {
        fn admit(&mut self, now_ms: u64) -> (bool, RateInfo) {
            let live = self
                .start_ms
                .filter(|s| now_ms < s + self.window_ms)
                .is_some();
            if !live {
                self.start_ms = Some(now_ms);
                self.used = 0;
            }
            let start = self.start_ms.unwrap_or(now_ms);
            let ok = self.used < self.limit;
            if ok {
                self.used += 1;
            }
            let t = (start + self.window_ms - now_ms).div_ceil(1000);
            let info = RateInfo {
                limit: Some(self.limit),
                remaining: Some(self.limit - self.used),
                reset_in: Some(S(t)),
                window: Some(MS(self.window_ms)),
                retry_after: (!ok).then(|| S(t.max(1))),
                rejected: !ok,
            };
            (ok, info)
        }
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    enum Ev {
        Ready(usize),
        Arrive(usize, u64),
        Answer(usize, u64, bool, u32, u64, u64),
    }

    /// 8 tasks × 5 calls against a 10-per-5 s key on a fake clock, with uneven latencies
    /// so answers arrive out of order; returns (429s seen, elapsed).
    fn simulate(threshold: Option<u32>) -> (u32, Duration) {
        let config = ThrottleConfig {
            threshold,
            ..ThrottleConfig::default()
        };
        let mut gw = FakeGateway {
            limit: 10,
            window_ms: 5000,
            start_ms: None,
            used: 0,
        };
        let mut s = LimiterState::default();
        let mut queue = BinaryHeap::new();
        let mut seq = 0u64;
        let mut push = |q: &mut BinaryHeap<_>, at: u64, ev: Ev| {
            seq += 1;
            q.push(Reverse((at, seq, ev)));
        };
        let mut left = [5u32; 8];
        let mut waiting = Vec::new();
        let mut rejected = 0;
        let mut finished = 0;
        for t in 0..8 {
            push(&mut queue, 0, Ev::Ready(t));
        }
        let mut n = 0u64;
        while let Some(Reverse((now, _, ev))) = queue.pop() {
            match ev {
                Ev::Ready(t) => match s.decide(MS(now), &config) {
                    Admit::Go => {
                        let g = s.on_send(MS(now));
                        n += 1;
                        push(&mut queue, now + 2 + (n * 7) % 13, Ev::Arrive(t, g));
                    }
                    Admit::WaitUntil(at) => push(&mut queue, at.as_millis() as u64, Ev::Ready(t)),
                    Admit::WaitForResponse => waiting.push(t),
                },
                Ev::Arrive(t, g) => {
                    let (ok, i) = gw.admit(now);
                    let t_s = i.reset_in.unwrap().as_secs();
                    let back = now + 2 + (n * 5) % 11;
                    push(
                        &mut queue,
                        back,
                        Ev::Answer(t, g, ok, i.remaining.unwrap(), t_s, 0),
                    );
                }
                Ev::Answer(t, g, ok, remaining, t_s, _) => {
                    let mut i = info(10, remaining, t_s);
                    i.rejected = !ok;
                    i.retry_after = (!ok).then(|| S(t_s.max(1)));
                    s.on_response(MS(now), g, &i);
                    if ok {
                        left[t] -= 1;
                        if left[t] == 0 {
                            finished = finished.max(now);
                        } else {
                            push(&mut queue, now, Ev::Ready(t));
                        }
                    } else {
                        rejected += 1;
                        push(&mut queue, now + t_s.max(1) * 1000, Ev::Ready(t));
                    }
                    for w in waiting.drain(..) {
                        push(&mut queue, now, Ev::Ready(w));
                    }
                }
            }
        }
        assert_eq!(left, [0; 8], "every call completed");
        (rejected, MS(finished))
    }

    #[test]
    fn simulated_forty_calls_threshold_zero_take_the_ideal_fifteen_seconds() {
        let (rejected, elapsed) = simulate(Some(0));
        println!("threshold 0: {elapsed:?}");
        assert_eq!(rejected, 0);
        // Four windows: 0 s, 5 s, 10 s, 15 s (+ the latency of each window's first call).
        assert!(elapsed >= S(15) && elapsed < MS(15_300), "{elapsed:?}");
    }

    #[test]
    fn simulated_forty_calls_old_threshold_five_never_see_a_429() {
        let (rejected, elapsed) = simulate(Some(5));
        println!("threshold 5: {elapsed:?}");
        assert_eq!(rejected, 0);
        // Five calls per window: eight windows.
        assert!(elapsed >= S(35), "{elapsed:?}");
    }

    #[test]
    fn simulated_forty_calls_default_reserve_never_see_a_429() {
        let (rejected, elapsed) = simulate(None);
        println!("default reserve: {elapsed:?}");
        assert_eq!(rejected, 0);
        // Nine calls per window (one in reserve): five windows, the last starting at 20 s.
        assert!(elapsed >= S(20) && elapsed < S(25), "{elapsed:?}");
    }
}
