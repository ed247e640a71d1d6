//! A subscription's health (`health` in `GET /webhooks` and
//! `GET /webhooks/{id}`, the dashboard's Webhooks view): how its endpoint
//! answered the attempts of the last 24 hours — how many, the share that
//! succeeded (2xx), the last one — and a state read from those figures.
//!
//! Each shard counts its attempts per subscription and URL ([`Tally`],
//! [`TALLY_SQL`] in the shard, [`tally`] over memory); [`merge`] adds the
//! shards' counts up and [`of`] makes one subscription's figure from them,
//! counting only the attempts to the URL it has now (a redirect to another
//! URL, or the URL before a PATCH, says nothing of this endpoint).

use serde::{Deserialize, Serialize};

/// The window of the figures: 24 hours.
pub const WINDOW_MS: u64 = 86_400_000;
/// A success rate at or above this, with a successful last attempt, is healthy.
pub const HEALTHY_RATE: f64 = 0.95;

/// Whether an attempt succeeded: its receiver answered 2xx.
pub fn succeeded(status_code: Option<u16>) -> bool {
    status_code.is_some_and(|c| (200..300).contains(&c))
}

/// One shard's attempts at or after `?2` of the subscriptions in the JSON
/// array `?1`, per subscription and URL: their number, how many succeeded
/// ([`succeeded`]) and the last one (SQLite takes the bare columns of a
/// `MAX()` aggregate from the row holding the maximum).
pub const TALLY_SQL: &str = "SELECT d.subscription_id AS subscription_id, a.url AS url, \
COUNT(*) AS attempts, SUM(CASE WHEN a.status_code >= 200 AND a.status_code < 300 THEN 1 ELSE 0 END) AS succeeded, \
MAX(a.at) AS last_at, a.status_code AS last_status_code, a.error AS last_error \
FROM deliveries d JOIN attempts a ON a.delivery_id = d.id \
WHERE d.subscription_id IN (SELECT value FROM json_each(?1)) AND a.at >= ?2 \
GROUP BY d.subscription_id, a.url";

/// The attempts one shard holds of a subscription to one URL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    pub subscription_id: String,
    pub url: String,
    pub attempts: u64,
    pub succeeded: u64,
    pub last_at: u64,
    pub last_status_code: Option<u16>,
    pub last_error: Option<String>,
}

/// One attempt as the tally reads it (a stored attempt and its delivery's
/// subscription).
#[derive(Debug, Clone, Copy)]
pub struct Seen<'a> {
    pub subscription_id: &'a str,
    pub url: &'a str,
    pub at: u64,
    pub status_code: Option<u16>,
    pub error: Option<&'a str>,
}

/// [`TALLY_SQL`] over attempts in memory.
pub fn tally<'a>(attempts: impl IntoIterator<Item = Seen<'a>>, since: u64) -> Vec<Tally> {
    let mut out: Vec<Tally> = Vec::new();
    for a in attempts.into_iter().filter(|a| a.at >= since) {
        let one = Tally {
            subscription_id: a.subscription_id.to_string(),
            url: a.url.to_string(),
            attempts: 1,
            succeeded: u64::from(succeeded(a.status_code)),
            last_at: a.at,
            last_status_code: a.status_code,
            last_error: a.error.map(str::to_string),
        };
        out = merge([out, vec![one]].concat());
    }
    out
}

/// The counts of several shards added up per subscription and URL, each
/// with its latest attempt (the later one of equal times is kept as found).
pub fn merge(parts: Vec<Tally>) -> Vec<Tally> {
    let mut out: Vec<Tally> = Vec::new();
    for t in parts {
        match out
            .iter_mut()
            .find(|o| o.subscription_id == t.subscription_id && o.url == t.url)
        {
            Some(o) => {
                o.attempts += t.attempts;
                o.succeeded += t.succeeded;
                if t.last_at > o.last_at {
                    o.last_at = t.last_at;
                    o.last_status_code = t.last_status_code;
                    o.last_error = t.last_error;
                }
            }
            None => out.push(t),
        }
    }
    out
}

/// What the figures say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// No attempt in the window.
    Idle,
    /// The last attempt succeeded and at least [`HEALTHY_RATE`] of them did.
    Healthy,
    /// The last attempt succeeded, but fewer than [`HEALTHY_RATE`] did.
    Degraded,
    /// The last attempt failed.
    Failing,
}

/// A subscription's health over the last [`WINDOW_MS`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Health {
    pub window_s: u64,
    pub attempts: u64,
    pub succeeded: u64,
    pub failed: u64,
    /// `succeeded ÷ attempts`; `null` without attempts.
    pub success_rate: Option<f64>,
    pub last_attempt_at: Option<u64>,
    pub last_status_code: Option<u16>,
    pub last_error: Option<String>,
    pub state: State,
}

/// The window's start at `now`.
pub fn since(now: u64) -> u64 {
    now.saturating_sub(WINDOW_MS)
}

/// The earliest bucket start whose shard can hold an attempt of the window:
/// a delivery's automatic attempts come within the retry `schedule_s` of its
/// creation, so a shard that ended before the window minus the schedule
/// holds none of them (a manual retry of an older delivery is not counted).
pub fn oldest_shard_end(now: u64, schedule_s: &[u32]) -> u64 {
    let horizon: u64 = schedule_s.iter().map(|s| u64::from(*s) * 1_000).sum();
    since(now).saturating_sub(horizon)
}

/// Shards one health figure reads at most (the newest of those that may
/// hold the window's attempts; a bucket far shorter than a day is a test's).
pub const MAX_SHARDS: usize = 64;

/// Which of a project's shards (`(start, end)`) to read for the figures at
/// `now`: those that end after [`oldest_shard_end`], newest first, at most
/// [`MAX_SHARDS`].
pub fn shards_to_read(shards: Vec<(u64, u64)>, now: u64, schedule_s: &[u32]) -> Vec<(u64, u64)> {
    let mut v =
        super::shard::visit_order(shards, Some(oldest_shard_end(now, schedule_s)), None, true);
    v.truncate(MAX_SHARDS);
    v
}

/// Subscription `id`'s health at its current `url` from the merged counts.
pub fn of(merged: &[Tally], id: &str, url: &str) -> Health {
    let t = merged
        .iter()
        .find(|t| t.subscription_id == id && t.url == url);
    let (attempts, ok) = t.map_or((0, 0), |t| (t.attempts, t.succeeded.min(t.attempts)));
    let rate = (attempts > 0).then(|| ok as f64 / attempts as f64);
    let state = match t {
        None => State::Idle,
        Some(t) if !succeeded(t.last_status_code) => State::Failing,
        Some(_) if rate.unwrap_or(0.0) >= HEALTHY_RATE => State::Healthy,
        Some(_) => State::Degraded,
    };
    Health {
        window_s: WINDOW_MS / 1_000,
        attempts,
        succeeded: ok,
        failed: attempts - ok,
        success_rate: rate,
        last_attempt_at: t.map(|t| t.last_at),
        last_status_code: t.and_then(|t| t.last_status_code),
        last_error: t.and_then(|t| t.last_error.clone()),
        state,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(url: &str, at: u64, code: Option<u16>) -> Seen<'_> {
        Seen {
            subscription_id: "sub_1",
            url,
            at,
            status_code: code,
            error: code.is_none().then_some("network error"),
        }
    }

    const A: &str = "https://a.example/hooks";

    #[test]
    fn the_figure_counts_the_window_and_the_current_url_only() {
        let now = 10 * WINDOW_MS;
        let day_ago = since(now);
        // Two shards: their counts add up.
        let one = [
            attempt(A, day_ago - 1, Some(200)), // before the window
            attempt(A, day_ago, Some(500)),
            attempt(A, now - 50, Some(200)),
        ];
        let two = [
            attempt(A, now - 10, Some(204)),
            attempt("https://elsewhere.example/x", now - 5, Some(500)), // a redirect
        ];
        let parts = [tally(one, day_ago), tally(two, day_ago)].concat();
        let merged = merge(parts);
        let h = of(&merged, "sub_1", A);
        assert_eq!((h.attempts, h.succeeded, h.failed), (3, 2, 1));
        assert_eq!(h.success_rate, Some(2.0 / 3.0));
        assert_eq!(
            (h.last_attempt_at, h.last_status_code),
            (Some(now - 10), Some(204))
        );
        assert_eq!(h.state, State::Degraded);
        assert_eq!(h.window_s, 86_400);
        let idle = of(&merged, "sub_2", A);
        assert_eq!(
            (idle.attempts, idle.success_rate, idle.state),
            (0, None, State::Idle)
        );
    }

    #[test]
    fn the_state_follows_the_last_attempt_and_the_rate() {
        let now = 3 * WINDOW_MS;
        let figure = |codes: &[Option<u16>]| {
            let list: Vec<Seen> = codes
                .iter()
                .enumerate()
                .map(|(i, c)| Seen {
                    subscription_id: "s",
                    ..attempt(A, now - 100 + i as u64, *c)
                })
                .collect();
            of(&merge(tally(list, since(now))), "s", A)
        };
        assert_eq!(figure(&[Some(200); 20]).state, State::Healthy);
        let mut mostly = vec![Some(200); 19];
        mostly.insert(0, Some(503));
        assert_eq!(figure(&mostly).state, State::Healthy, "19 of 20 is 95 %");
        assert_eq!(figure(&[Some(500), Some(200)]).state, State::Degraded);
        assert_eq!(figure(&[Some(200), None]).state, State::Failing);
        let failing = figure(&[Some(200), Some(410)]);
        assert_eq!(
            (failing.state, failing.last_status_code),
            (State::Failing, Some(410))
        );
        assert_eq!(
            figure(&[Some(302)]).state,
            State::Failing,
            "a redirect is not a success"
        );
    }

    #[test]
    fn shards_older_than_the_window_and_the_schedule_are_not_read() {
        let now = 5 * WINDOW_MS;
        assert_eq!(oldest_shard_end(now, &[]), since(now));
        assert_eq!(oldest_shard_end(now, &[60, 900]), since(now) - 960_000);
        assert_eq!(oldest_shard_end(1, &[60]), 0);
        let day = WINDOW_MS;
        let shards = vec![
            (0, day),
            (3 * day, 4 * day),
            (4 * day, 5 * day),
            (day, 2 * day),
        ];
        assert_eq!(
            shards_to_read(shards, 5 * day - 1, &[60]),
            vec![(4 * day, 5 * day), (3 * day, 4 * day)]
        );
        let many: Vec<(u64, u64)> = (0..100u64).map(|i| (i * 1_000, (i + 1) * 1_000)).collect();
        let read = shards_to_read(many, 100_000, &[]);
        assert_eq!(
            (read.len(), read[0]),
            (MAX_SHARDS, (99_000, 100_000)),
            "the newest first"
        );
    }
}
