use super::*;
use crate::audit::StatusFilter;
use std::collections::BTreeMap;
use usage::UsageDelta;

/// The in-memory backend: rows and roll-ups as the object keeps them.
#[derive(Default)]
struct Mem {
    rows: BTreeMap<String, AuditRow>,
    paths: BTreeMap<(u64, String, String), [u64; 3]>,
    latency: BTreeMap<(u64, String, u64), u64>,
    latency_gw: BTreeMap<(u64, String, u64), u64>,
    usage: BTreeMap<(u64, String, String), UsageDelta>,
}

impl ShardStore for Mem {
    type Error = ();
    fn existing(&mut self, ids: &[&str]) -> Result<Vec<String>, ()> {
        Ok(ids
            .iter()
            .filter(|i| self.rows.contains_key(**i))
            .map(|i| i.to_string())
            .collect())
    }
    fn insert(&mut self, rows: &[&AuditRow]) -> Result<(), ()> {
        for r in rows {
            assert!(self
                .rows
                .insert(r.request_id.clone(), (*r).clone())
                .is_none());
        }
        Ok(())
    }
    fn add(&mut self, r: &Rollups) -> Result<(), ()> {
        for p in &r.paths {
            let c = self
                .paths
                .entry((p.hour, p.key_prefix.clone(), p.path.clone()))
                .or_default();
            c[0] += p.requests;
            c[1] += p.errors;
            c[2] += p.server_errors;
        }
        for l in &r.latency {
            *self
                .latency
                .entry((l.hour, l.key_prefix.clone(), l.ms))
                .or_default() += l.n;
        }
        for l in &r.latency_gateway {
            *self
                .latency_gw
                .entry((l.hour, l.key_prefix.clone(), l.ms))
                .or_default() += l.n;
        }
        for u in &r.usage {
            let key = (u.hour, u.project.clone(), u.key_prefix.clone());
            let sum = self.usage.entry(key).or_insert_with(|| UsageDelta {
                hour: u.hour,
                project: u.project.clone(),
                key_prefix: u.key_prefix.clone(),
                ..UsageDelta::default()
            });
            sum.requests += u.requests;
            sum.admitted += u.admitted;
            sum.billable += u.billable;
            sum.replays += u.replays;
            sum.refused += u.refused;
            sum.missing_key += u.missing_key;
        }
        Ok(())
    }
}

impl Mem {
    /// What the object's `/stats` query returns.
    fn stats(&self, q: &StatsQuery) -> ShardStats {
        let ok =
            |h: u64, kp: &str| h >= q.since_ms && q.key_prefix.as_deref().is_none_or(|k| k == kp);
        let mut hours: BTreeMap<u64, HourCount> = BTreeMap::new();
        let mut paths: BTreeMap<String, u64> = BTreeMap::new();
        for ((h, kp, path), c) in &self.paths {
            if ok(*h, kp) && !(q.exclude_gateway && crate::routes::is_gateway_path(path)) {
                let e = hours.entry(*h).or_insert(HourCount {
                    hour: *h,
                    ..HourCount::default()
                });
                e.requests += c[0];
                e.errors += c[1];
                e.server_errors += c[2];
                *paths.entry(path.clone()).or_default() += c[0];
            }
        }
        let mut latency: BTreeMap<u64, u64> = BTreeMap::new();
        for ((h, kp, ms), n) in &self.latency {
            if ok(*h, kp) {
                *latency.entry(*ms).or_default() += n;
            }
        }
        if q.exclude_gateway {
            for ((h, kp, ms), n) in &self.latency_gw {
                if ok(*h, kp) {
                    *latency.entry(*ms).or_default() -= n;
                }
            }
            latency.retain(|_, n| *n > 0);
        }
        ShardStats {
            hours: hours.into_values().collect(),
            paths: paths
                .into_iter()
                .map(|(path, requests)| PathCount { path, requests })
                .collect(),
            latency: latency.into_iter().collect(),
            missing: self
                .usage
                .values()
                .filter(|u| ok(u.hour, &u.key_prefix) && u.missing_key > 0)
                .map(|u| MissingCount {
                    hour: u.hour,
                    key_prefix: u.key_prefix.clone(),
                    requests: u.missing_key,
                })
                .collect(),
        }
    }

    /// What the object's `/usage` query returns.
    fn usage(&self, q: &usage::UsageQuery) -> Vec<UsageDelta> {
        self.usage
            .values()
            .filter(|u| u.hour >= q.since_ms && u.hour < q.until_ms)
            .filter(|u| q.project.as_deref().is_none_or(|p| p == u.project))
            .cloned()
            .collect()
    }
}

#[test]
fn usage_and_missing_keys_are_counted_once_per_stored_row() {
    use crate::audit::Counted;
    let mut m = Mem::default();
    let keyless = Counted {
        forwarded: true,
        billable: true,
        missing_key: true,
    };
    let mut a = row("a", 10, "/orders", 201, 5, Some("pgk_a"));
    a.counted = keyless;
    let mut b = row("b", HOUR_MS + 1, "/orders", 201, 5, Some("pgk_a"));
    b.counted = keyless;
    let mut c = row("c", HOUR_MS + 2, "/orders", 201, 5, Some("pgk_b"));
    c.counted = Counted {
        forwarded: true,
        billable: true,
        missing_key: false,
    };
    ingest(&mut m, &[a.clone(), b, c]).unwrap();
    // The same batch again (a retried write): counted nowhere.
    ingest(&mut m, &[a]).unwrap();
    let q = usage::UsageQuery {
        since_ms: 0,
        until_ms: DAY_MS,
        project: Some("acme".into()),
    };
    let days = usage::merge(vec![m.usage(&q)], usage::Granularity::Day);
    let per_key: Vec<(&str, u64, u64)> = days
        .iter()
        .map(|u| (u.key_prefix.as_str(), u.requests, u.billable))
        .collect();
    assert_eq!(per_key, [("pgk_a", 2, 2), ("pgk_b", 1, 1)]);
    let hours = usage::merge(vec![m.usage(&q)], usage::Granularity::Hour);
    assert_eq!(hours.len(), 3, "pgk_a in two hours, pgk_b in one");
    let stats = merge_stats(vec![m.stats(&StatsQuery {
        since_ms: 0,
        key_prefix: None,
        exclude_gateway: false,
    })]);
    assert_eq!(stats.days[0].missing_idempotency_key, 2);
    assert_eq!(
        stats.keys_missing_idempotency,
        [KeyCount {
            key_prefix: "pgk_a".into(),
            requests: 2
        }]
    );
}

fn row(id: &str, time: u64, path: &str, status: u16, ms: u64, kp: Option<&str>) -> AuditRow {
    AuditRow {
        request_id: id.into(),
        time,
        method: "GET".into(),
        path: path.into(),
        status,
        response_bytes: None,
        response_time_ms: ms,
        client_ip: None,
        user_agent: None,
        key_prefix: kp.map(Into::into),
        project: Some("acme".into()),
        idempotency_key: None,
        replayed: false,
        rate_limit_remaining: None,
        origin: None,
        would_refuse: None,
        counted: Default::default(),
    }
}

#[test]
fn shards_are_named_by_project_and_aligned_bucket() {
    let s = Shard::of(Some("acme"), DAY_MS * 3 + 5, DAY_MS);
    assert_eq!(s.name(), format!("acme/{}", DAY_MS * 3));
    assert_eq!(s.end_ms, DAY_MS * 4);
    let none = Shard::of(None, 1_999, 1_000);
    assert_eq!((none.project.as_str(), none.start_ms), (UNSCOPED, 1_000));
    assert_eq!(none.row_project(), None);
    assert!(!crate::ids::is_valid_name(UNSCOPED));
    let g = group(
        vec![
            row("a", 10, "/", 200, 1, None),
            row("b", 1_010, "/", 200, 1, None),
            row("c", 20, "/", 200, 1, None),
        ],
        1_000,
    );
    let sizes: Vec<(u64, usize)> = g.iter().map(|(s, r)| (s.start_ms, r.len())).collect();
    assert_eq!(sizes, vec![(0, 2), (1_000, 1)]);
    let ids: Vec<&str> = g[0].1.iter().map(|r| r.request_id.as_str()).collect();
    assert_eq!(ids, ["a", "c"]);
}

#[test]
fn a_retried_batch_counts_once() {
    let mut m = Mem::default();
    let batch = vec![
        row("r1", HOUR_MS + 1, "/a", 200, 5, Some("pgk_a")),
        row("r2", HOUR_MS + 2, "/a", 503, 7, Some("pgk_a")),
        row("r2", HOUR_MS + 2, "/a", 503, 7, Some("pgk_a")),
    ];
    let first = ingest(&mut m, &batch).unwrap();
    assert_eq!(first.inserted, 2);
    assert_eq!(
        ingest(&mut m, &batch),
        Ok(Ingested::default()),
        "a retry inserts and counts nothing"
    );
    let mut more = batch.clone();
    more.push(row("r3", 2 * HOUR_MS, "/b", 404, 900_000, None));
    let second = ingest(&mut m, &more).unwrap();
    assert_eq!(second.inserted, 1);
    // The cross-project shard gets what the project shards added, summed.
    let mut all = Mem::default();
    all.add(&Rollups::sum(vec![first.rollups, second.rollups]))
        .unwrap();
    assert_eq!(
        (all.paths.clone(), all.latency.clone()),
        (m.paths.clone(), m.latency.clone())
    );
    assert_eq!(m.paths[&(HOUR_MS, "pgk_a".into(), "/a".into())], [2, 1, 1]);
    assert_eq!(m.latency[&(2 * HOUR_MS, String::new(), MAX_LATENCY_MS)], 1);
    let all = merge_stats(vec![m.stats(&StatsQuery {
        since_ms: 0,
        key_prefix: None,
        exclude_gateway: false,
    })]);
    assert_eq!(all.days[0].requests, 3);
    assert_eq!(all.days[0].date, "1970-01-01");
    assert_eq!(
        all.top_paths,
        vec![
            PathCount {
                path: "/a".into(),
                requests: 2
            },
            PathCount {
                path: "/b".into(),
                requests: 1
            }
        ]
    );
    let one = merge_stats(vec![m.stats(&StatsQuery {
        since_ms: 0,
        key_prefix: Some("pgk_a".into()),
        exclude_gateway: false,
    })]);
    assert_eq!((one.p50_ms, one.p95_ms), (Some(5), Some(7)));
    assert_eq!(one.error_share, 0.5);
}

/// Roll-up stats equal a scan of the rows (the old D1 queries'
/// arithmetic), over several shards.
#[test]
fn stats_from_rollups_equal_a_scan() {
    let mut shards = [Mem::default(), Mem::default(), Mem::default()];
    let mut all = Vec::new();
    let mut x: u64 = 7;
    for i in 0..600u64 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let status = [200, 201, 404, 500, 503][(x >> 33) as usize % 5];
        let path = ["/a", "/b", "/c"][(x >> 40) as usize % 3];
        let r = row(
            &format!("r{i}"),
            i * 500_000,
            path,
            status,
            (x >> 50) % 300,
            None,
        );
        all.push(r.clone());
        ingest(&mut shards[i as usize % 3], &[r]).ok();
    }
    let q = StatsQuery {
        since_ms: 0,
        key_prefix: None,
        exclude_gateway: false,
    };
    let s = merge_stats(shards.iter().map(|m| m.stats(&q)).collect());
    let mut ms: Vec<u64> = all.iter().map(|r| r.response_time_ms).collect();
    ms.sort_unstable();
    let n = ms.len() as u64;
    let at = |q| ms[crate::audit::quantile_offset(n, q) as usize];
    assert_eq!(s.p50_ms, Some(at(0.5)));
    assert_eq!(s.p95_ms, Some(at(0.95)));
    assert_eq!(s.days.iter().map(|d| d.requests).sum::<u64>(), 600);
    let errs = all.iter().filter(|r| r.status >= 400).count();
    assert_eq!(s.error_share, errs as f64 / 600.0);
    let per_day = all.iter().filter(|r| r.time < DAY_MS).count() as u64;
    assert_eq!(s.days[0].requests, per_day);
    assert_eq!(s.days.len(), 4);
}

fn shard(p: &str, start: u64) -> Source {
    Source::Shard(Shard {
        project: p.into(),
        start_ms: start,
        end_ms: start + 10,
    })
}

#[test]
fn plan_visits_bands_newest_first_within_bounds() {
    let sources = vec![
        shard("a", 0),
        shard("b", 20),
        shard("a", 20),
        shard("a", 10),
        Source::Legacy {
            start_ms: 0,
            end_ms: 15,
        },
    ];
    let all = Bounds {
        lo: 0,
        hi: u64::MAX,
        shards: true,
    };
    let bands = plan(sources.clone(), all);
    assert_eq!(
        bands.len(),
        2,
        "legacy overlaps the buckets 0 and 10: {bands:?}"
    );
    assert_eq!(bands[0].len(), 2);
    assert_eq!(bands[1].len(), 3);
    let q = AuditQuery {
        since: Some(12),
        until: Some(25),
        cursor: Some((19, "req_x".into())),
        ..AuditQuery::default()
    };
    let bands = plan(sources.clone(), Bounds::of(&q));
    assert_eq!(bands, vec![vec![shard("a", 10), sources[4].clone()]]);
    let empty = Bounds {
        lo: 30,
        hi: 5,
        shards: true,
    };
    assert!(plan(sources.clone(), empty).is_empty());
    let foreign = AuditQuery {
        request_id: Some("req_0b1e5c6a-0000-4000-8000-000000000000".into()),
        ..AuditQuery::default()
    };
    assert_eq!(
        plan(sources.clone(), Bounds::of(&foreign)),
        vec![vec![sources[4].clone()]],
        "an id the gateway did not make can only be a legacy row's"
    );
}

#[test]
fn a_request_id_maps_to_its_bucket() {
    let id = crate::ids::request_id(1_700_000_000_123, 42);
    assert_eq!(request_id_time(&id), Some(1_700_000_000_123));
    assert_eq!(request_id_time("req_not-a-ulid"), None);
    let q = AuditQuery {
        request_id: Some(id),
        ..AuditQuery::default()
    };
    assert_eq!(
        Bounds::of(&q),
        Bounds {
            lo: 1_700_000_000_123,
            hi: 1_700_000_000_123,
            shards: true,
        }
    );
    let q = AuditQuery {
        request_id: Some("req_other".into()),
        status: Some(StatusFilter::Class(5)),
        ..AuditQuery::default()
    };
    assert_eq!(
        Bounds::of(&q),
        Bounds {
            lo: 0,
            hi: u64::MAX,
            shards: false,
        }
    );
}

#[test]
fn fanout_is_bounded_and_merge_is_newest_first() {
    let wide: Vec<Source> = (0..=MAX_FANOUT)
        .map(|i| shard(&format!("p{i}"), 0))
        .collect();
    let bands = plan(
        wide,
        Bounds {
            lo: 0,
            hi: 100,
            shards: true,
        },
    );
    let e = check_fanout(&bands).err().map(|p| p.code);
    assert_eq!(e, Some(ErrorCode::AuditProjectRequired));
    assert!(check_fanout(&bands[..0]).is_ok());
    let m = merge(
        vec![
            vec![
                row("b", 5, "/", 200, 1, None),
                row("a", 1, "/", 200, 1, None),
            ],
            vec![
                row("c", 5, "/", 200, 1, None),
                row("d", 3, "/", 200, 1, None),
            ],
        ],
        3,
    );
    let ids: Vec<&str> = m.iter().map(|r| r.request_id.as_str()).collect();
    assert_eq!(ids, vec!["c", "b", "d"]);
}

#[test]
fn gateway_calls_are_left_out_on_request_and_counted_by_endpoint() {
    let mut m = Mem::default();
    let lookup = |i: u32| format!("/_postguard/v1/idempotency/order-{i}");
    let mut batch = vec![
        row("p1", HOUR_MS, "/orders", 200, 10, Some("pgk_a")),
        row("p2", HOUR_MS + 1, "/orders", 503, 30, Some("pgk_a")),
    ];
    for i in 0..3u32 {
        batch.push(row(
            &format!("g{i}"),
            HOUR_MS + 2,
            &lookup(i),
            200,
            900,
            Some("pgk_a"),
        ));
    }
    batch.push(row(
        "s1",
        HOUR_MS + 3,
        "/_postguard/v1/stats",
        200,
        700,
        Some("pgk_a"),
    ));
    let done = ingest(&mut m, &batch).unwrap();
    assert_eq!(
        done.rollups
            .latency_gateway
            .iter()
            .map(|l| l.n)
            .sum::<u64>(),
        4
    );
    let q = |exclude_gateway| StatsQuery {
        since_ms: 0,
        key_prefix: None,
        exclude_gateway,
    };
    let all = merge_stats(vec![m.stats(&q(false))]);
    assert_eq!(all.days[0].requests, 6);
    assert_eq!(
        all.top_paths[0],
        PathCount {
            path: "/_postguard/v1/idempotency/{key}".into(),
            requests: 3
        },
        "one endpoint, not three URLs"
    );
    assert_eq!(all.p95_ms, Some(900));
    let api = merge_stats(vec![m.stats(&q(true))]);
    assert_eq!(api.days[0].requests, 2);
    assert_eq!((api.days[0].errors, api.error_share), (1, 0.5));
    assert_eq!(
        api.top_paths,
        vec![PathCount {
            path: "/orders".into(),
            requests: 2
        }]
    );
    assert_eq!(
        (api.p50_ms, api.p95_ms),
        (Some(10), Some(30)),
        "the gateway's latencies are subtracted"
    );
    // The cross-project roll-up shard gets the same split.
    let mut total = Mem::default();
    total.add(&Rollups::sum(vec![done.rollups])).unwrap();
    assert_eq!(merge_stats(vec![total.stats(&q(true))]), api);
}

#[test]
fn key_activity_adds_shards_up_and_puts_the_latest_use_first() {
    let k = |p: &str, r, e, at| KeyActivity {
        key_prefix: p.into(),
        requests: r,
        errors: e,
        last_used_at: at,
    };
    let day1 = vec![k("pgk_a", 3, 1, 100), k("pgk_b", 1, 0, 150)];
    let day2 = vec![k("pgk_a", 2, 0, 900)];
    assert_eq!(
        merge_key_activity(vec![day1, day2]),
        vec![k("pgk_a", 5, 1, 900), k("pgk_b", 1, 0, 150)]
    );
    assert!(merge_key_activity(vec![]).is_empty());
}
