//! Operational alerts (issue 27 item 5, ADR 0038): what the every-minute
//! check concludes from what it observed, and who is told.
//!
//! - `postguard.queue.lagging`: the oldest delivery that is due (its next
//!   attempt's time has passed) is older than `alerts.queue_lag_s` — the
//!   queue, shared by every project, is not keeping up (or a message was
//!   lost, or a throttled subscription has a backlog).
//! - `postguard.storage.high_water`: a store reached
//!   `alerts.storage_percent` of the mark at which it refuses writes: D1
//!   (`webhooks.d1_high_water_bytes`: every publish is refused there) or a
//!   webhook shard (`webhooks.shard_high_water_bytes`: its project's
//!   publishes are refused there) — a warning before 503 `STORAGE_FULL`.
//!
//! Operational events are published like `postguard.subscription.disabled`
//! (docs/archive-and-alerts.md): through the one write path, to the subscriptions of a
//! project that match the event type. A condition of one project (its
//! shard) goes to that project's subscriptions; every alert also goes to
//! the operator's own project (`alerts.project`), the only audience of the
//! deployment's conditions (the queue, D1). Each condition is published at
//! most once per `alerts.period_s` (the shell's compare-and-set in D1).

use serde_json::{json, Value};

use crate::config::Settings;
use crate::webhooks::events::rfc3339_ms;

pub const QUEUE_LAGGING: &str = "postguard.queue.lagging";
pub const STORAGE_HIGH_WATER: &str = "postguard.storage.high_water";

/// Shards the check reads at most per run (newest first).
pub const MAX_SHARDS: u32 = 200;

/// What one webhook shard reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardVitals {
    pub project: String,
    pub start_ms: u64,
    pub bytes: u64,
    /// Its oldest due delivery: `(next_attempt_at, id)`.
    pub oldest_due: Option<(u64, String)>,
}

/// What the check observed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// D1's size, if a statement reported it.
    pub d1_bytes: Option<u64>,
    pub shards: Vec<ShardVitals>,
}

/// One alert to publish.
#[derive(Debug, Clone, PartialEq)]
pub struct Alert {
    /// The condition's key: at most one alert per key and period.
    pub condition: String,
    pub event_type: &'static str,
    pub data: Value,
    /// The project the condition belongs to (its subscriptions are told),
    /// `None` for the deployment's own.
    pub project: Option<String>,
}

impl Alert {
    /// The projects whose subscriptions receive it: the condition's
    /// project and the operator's, once each; none when neither is known.
    pub fn audience(&self, operator: Option<&str>) -> Vec<String> {
        let mut out: Vec<String> = self.project.iter().cloned().collect();
        if let Some(op) = operator {
            if !out.iter().any(|p| p == op) {
                out.push(op.to_string());
            }
        }
        out
    }
}

/// How far back the check looks for due deliveries: the retry schedule's
/// whole span and a day (shards older than that hold only finished
/// deliveries, but for manual retries, which the daily re-queue covers).
pub fn lag_window_ms(s: &Settings) -> u64 {
    let span: u64 = s.webhooks.schedule_s.iter().map(|d| u64::from(*d)).sum();
    span * 1_000 + 86_400_000
}

/// The alerts `o` calls for at `now`.
pub fn evaluate(o: &Observed, s: &Settings, now: u64) -> Vec<Alert> {
    let al = &s.alerts;
    let mut out = Vec::new();
    let threshold_ms = u64::from(al.queue_lag_s) * 1_000;
    let oldest = o
        .shards
        .iter()
        .filter_map(|v| v.oldest_due.as_ref().map(|d| (d, &v.project)))
        .min_by_key(|((at, id), _)| (*at, id.clone()));
    if let Some(((at, id), project)) = oldest {
        let lag = now.saturating_sub(*at);
        if lag > threshold_ms {
            out.push(Alert {
                condition: "queue.lagging".to_string(),
                event_type: QUEUE_LAGGING,
                data: json!({
                    "oldest_due_at": rfc3339_ms(*at),
                    "lag_s": lag / 1_000,
                    "threshold_s": al.queue_lag_s,
                    "project": project,
                    "delivery_id": id,
                }),
                project: None,
            });
        }
    }
    let wh = &s.webhooks;
    if let Some(bytes) = o.d1_bytes {
        let mark = share(wh.d1_high_water_bytes, al.storage_percent);
        if bytes >= mark {
            out.push(Alert {
                condition: "storage.high_water/d1".to_string(),
                event_type: STORAGE_HIGH_WATER,
                data: json!({
                    "store": "d1",
                    "bytes": bytes,
                    "alert_bytes": mark,
                    "high_water_bytes": wh.d1_high_water_bytes,
                }),
                project: None,
            });
        }
    }
    let mark = share(wh.shard_high_water_bytes, al.storage_percent);
    for v in o.shards.iter().filter(|v| v.bytes >= mark) {
        out.push(Alert {
            condition: format!("storage.high_water/shard/{}/{}", v.project, v.start_ms),
            event_type: STORAGE_HIGH_WATER,
            data: json!({
                "store": "webhook_shard",
                "project": v.project,
                "bucket_start": rfc3339_ms(v.start_ms),
                "bytes": v.bytes,
                "alert_bytes": mark,
                "high_water_bytes": wh.shard_high_water_bytes,
            }),
            project: Some(v.project.clone()),
        });
    }
    out
}

/// `percent`% of `mark`, at least 1 byte.
fn share(mark: u64, percent: u32) -> u64 {
    (u128::from(mark) * u128::from(percent) / 100).clamp(1, u128::from(u64::MAX)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        let mut s = Settings::default();
        s.alerts.queue_lag_s = 60;
        s.alerts.storage_percent = 50;
        s.webhooks.d1_high_water_bytes = 1_000;
        s.webhooks.shard_high_water_bytes = 400;
        s
    }

    fn shard(p: &str, start: u64, bytes: u64, due: Option<(u64, &str)>) -> ShardVitals {
        ShardVitals {
            project: p.into(),
            start_ms: start,
            bytes,
            oldest_due: due.map(|(t, id)| (t, id.to_string())),
        }
    }

    #[test]
    fn the_oldest_due_delivery_over_the_threshold_is_one_alert() {
        let s = settings();
        let now = 10_000_000;
        let o = Observed {
            d1_bytes: Some(10),
            shards: vec![
                shard("a", 0, 10, Some((now - 61_000, "dlv_a"))),
                shard("b", 0, 10, Some((now - 90_000, "dlv_b"))),
                shard("c", 0, 10, None),
            ],
        };
        let got = evaluate(&o, &s, now);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].event_type, QUEUE_LAGGING);
        assert_eq!(got[0].condition, "queue.lagging");
        assert_eq!(got[0].data["project"], "b");
        assert_eq!(got[0].data["delivery_id"], "dlv_b");
        assert_eq!(got[0].data["lag_s"], 90);
        assert_eq!(got[0].data["threshold_s"], 60);
        assert_eq!(got[0].project, None);
        let fresh = Observed {
            d1_bytes: None,
            shards: vec![shard("a", 0, 10, Some((now - 60_000, "dlv_a")))],
        };
        assert!(
            evaluate(&fresh, &s, now).is_empty(),
            "at the threshold: not yet"
        );
    }

    #[test]
    fn stores_over_their_share_of_the_mark_alert() {
        let s = settings();
        let o = Observed {
            d1_bytes: Some(500),
            shards: vec![shard("a", 86_400_000, 200, None), shard("b", 0, 199, None)],
        };
        let got = evaluate(&o, &s, 0);
        let conditions: Vec<&str> = got.iter().map(|a| a.condition.as_str()).collect();
        assert_eq!(
            conditions,
            [
                "storage.high_water/d1",
                "storage.high_water/shard/a/86400000"
            ]
        );
        assert!(got.iter().all(|a| a.event_type == STORAGE_HIGH_WATER));
        assert_eq!(got[0].data["alert_bytes"], 500);
        assert_eq!(got[0].data["high_water_bytes"], 1_000);
        assert_eq!(got[1].data["bucket_start"], "1970-01-02T00:00:00.000Z");
        assert_eq!(got[1].project.as_deref(), Some("a"));
        let below = Observed {
            d1_bytes: Some(499),
            shards: vec![],
        };
        assert!(evaluate(&below, &s, 0).is_empty());
    }

    #[test]
    fn who_is_told() {
        let mut a = Alert {
            condition: "x".into(),
            event_type: STORAGE_HIGH_WATER,
            data: Value::Null,
            project: Some("acme".into()),
        };
        assert_eq!(a.audience(Some("ops")), ["acme", "ops"]);
        assert_eq!(a.audience(Some("acme")), ["acme"]);
        assert_eq!(a.audience(None), ["acme"]);
        a.project = None;
        assert_eq!(a.audience(Some("ops")), ["ops"]);
        assert!(a.audience(None).is_empty(), "only logged");
    }

    #[test]
    fn the_window_covers_the_schedule() {
        let s = Settings::default();
        assert_eq!(
            lag_window_ms(&s),
            (60 + 900 + 3_600 + 86_400) * 1_000 + 86_400_000
        );
        assert_eq!(share(9_000_000_000, 80), 7_200_000_000);
        assert_eq!(share(1, 1), 1);
    }
}
