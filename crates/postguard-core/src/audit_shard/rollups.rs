//! The hourly roll-ups a batch adds to its shard: counts per (hour, key,
//! path), latency histograms, and the usage counts `/usage` and `/stats`
//! read. Only rows a batch really inserted are counted.

use serde::{Deserialize, Serialize};

use super::tally::Tally;
use super::usage::UsageDelta;
use super::{HOUR_MS, MAX_LATENCY_MS};
use crate::audit::AuditRow;

/// The counts one batch adds to a shard's hourly roll-ups. `key_prefix` is
/// "" for rows without one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollups {
    pub paths: Vec<PathDelta>,
    pub latency: Vec<LatencyDelta>,
    /// The part of `latency` that is the gateway's own calls
    /// ([`crate::routes::is_gateway_path`]): `/stats?include_gateway=false`
    /// subtracts it (the `paths` roll-up tells them apart by its path).
    /// Counted from 0.4 on; a batch from before has none.
    #[serde(default)]
    pub latency_gateway: Vec<LatencyDelta>,
    /// Per (hour, project, key) what `/usage` and `/stats` count of proxied
    /// requests (counted from 0.4 on).
    #[serde(default)]
    pub usage: Vec<UsageDelta>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathDelta {
    pub hour: u64,
    pub key_prefix: String,
    pub path: String,
    pub requests: u64,
    pub errors: u64,
    pub server_errors: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyDelta {
    pub hour: u64,
    pub key_prefix: String,
    pub ms: u64,
    pub n: u64,
}

impl Rollups {
    /// The sum of several batches' counts (same keys added up).
    pub fn sum(parts: Vec<Rollups>) -> Rollups {
        let mut paths = Tally::default();
        let mut latency = Tally::default();
        let mut latency_gateway = Tally::default();
        let mut usage = Tally::default();
        for p in parts {
            for d in p.usage {
                let counts = d.counts();
                usage.add((d.hour, d.project, d.key_prefix, 0), &counts);
            }
            for d in p.paths {
                let counts = [d.requests, d.errors, d.server_errors];
                paths.add((d.hour, d.key_prefix, d.path, 0), &counts);
            }
            for d in p.latency {
                latency.add((d.hour, d.key_prefix, String::new(), d.ms), &[d.n]);
            }
            for d in p.latency_gateway {
                latency_gateway.add((d.hour, d.key_prefix, String::new(), d.ms), &[d.n]);
            }
        }
        let deltas = |t: Tally| -> Vec<LatencyDelta> {
            t.0.into_iter()
                .map(|((hour, key_prefix, _, ms), c)| LatencyDelta {
                    hour,
                    key_prefix,
                    ms,
                    n: c[0],
                })
                .collect()
        };
        Rollups {
            paths: paths
                .0
                .into_iter()
                .map(|((hour, key_prefix, path, _), c)| PathDelta {
                    hour,
                    key_prefix,
                    path,
                    requests: c[0],
                    errors: c[1],
                    server_errors: c[2],
                })
                .collect(),
            latency: deltas(latency),
            latency_gateway: deltas(latency_gateway),
            usage: usage
                .0
                .into_iter()
                .map(|((hour, project, key_prefix, _), c)| UsageDelta {
                    hour,
                    project,
                    key_prefix,
                    requests: c[0],
                    admitted: c[1],
                    billable: c[2],
                    replays: c[3],
                    refused: c[4],
                    missing_key: c[5],
                })
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
            && self.latency.is_empty()
            && self.latency_gateway.is_empty()
            && self.usage.is_empty()
    }

    /// The counts of these rows: one delta per row, summed by [`Rollups::sum`]
    /// (one map type for both, which keeps the wasm smaller than a second,
    /// borrowed-key map would; the strings are a batch's, a few hundred at most).
    pub fn of(rows: &[&AuditRow]) -> Rollups {
        let mut one = Rollups::default();
        for r in rows {
            let hour = r.time / HOUR_MS * HOUR_MS;
            let kp = r.key_prefix.clone().unwrap_or_default();
            one.paths.push(PathDelta {
                hour,
                key_prefix: kp.clone(),
                path: r.path.clone(),
                requests: 1,
                errors: u64::from(r.status >= 400),
                server_errors: u64::from(r.status >= 500),
            });
            let latency = LatencyDelta {
                hour,
                key_prefix: kp,
                ms: r.response_time_ms.min(MAX_LATENCY_MS),
                n: 1,
            };
            if crate::routes::is_gateway_path(&r.path) {
                one.latency_gateway.push(latency.clone());
            }
            one.latency.push(latency);
            one.usage.extend(super::usage::counts_of(r, hour));
        }
        Rollups::sum(vec![one])
    }
}
