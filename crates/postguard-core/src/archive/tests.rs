use super::*;
use crate::webhooks::delivery::Status;
use crate::webhooks::records::{AttemptRecord, DeliveryRecord};
use proptest::prelude::*;

/// 2026-11-30 as a UTC day.
const NOV30: u64 = 20_787;

fn row(id: &str, time: u64) -> AuditRow {
    AuditRow {
        request_id: id.into(),
        time,
        method: "POST".into(),
        path: "/payments".into(),
        status: 201,
        response_bytes: Some(12),
        response_time_ms: 7,
        client_ip: Some("203.0.113.9".into()),
        user_agent: Some("curl/8".into()),
        key_prefix: Some("pgk_abcdefgh".into()),
        project: Some("acme".into()),
        idempotency_key: Some("order-1".into()),
        replayed: false,
        rate_limit_remaining: Some(29),
        origin: None,
        would_refuse: None,
        counted: Default::default(),
    }
}

fn archived(url: &str) -> Archived {
    Archived {
        delivery: DeliveryRecord {
            id: "dlv_1".into(),
            event_id: "evt_1".into(),
            event_type: "payment.succeeded".into(),
            subscription_id: "wh_1".into(),
            url: url.into(),
            status: Status::Delivered,
            attempts_made: 1,
            next_attempt_at: None,
            created_at: NOV30 * DAY_MS + 5,
            updated_at: NOV30 * DAY_MS + 9,
            queued_at: Some(NOV30 * DAY_MS + 6),
            manual: 0,
            request_id: Some("req_pub".into()),
            claimed_until: None,
            ordering_key: None,
            ordering_seq: None,
            blocked_by: None,
        },
        attempts: vec![AttemptRecord {
            delivery_id: "dlv_1".into(),
            request_id: "req_att".into(),
            attempt: 1,
            url: url.into(),
            status_code: Some(200),
            error: None,
            response_excerpt: Some("ok".into()),
            duration_ms: 3,
            at: NOV30 * DAY_MS + 7,
            next_retry_at: None,
            signed: None,
            response_headers: None,
        }],
    }
}

#[test]
fn keys_name_project_kind_and_utc_date() {
    assert_eq!(date(NOV30), "2026-11-30");
    assert_eq!(date(0), "1970-01-01");
    assert_eq!(
        object_key("acme", Kind::Audit, NOV30),
        "archive/acme/audit/2026-11-30.ndjson.gz"
    );
    assert_eq!(
        manifest_key("acme", Kind::Deliveries, NOV30),
        "archive/acme/deliveries/2026-11-30.manifest.json"
    );
    assert_eq!(export_key("exp_1"), "exports/exp_1.ndjson.gz");
    for key in [
        object_key("a", Kind::Audit, NOV30),
        manifest_key("a", Kind::Audit, NOV30),
    ] {
        assert_eq!(day_of_key(&key), Some(NOV30), "{key}");
    }
    assert_eq!(
        day_of_key("archive/a/audit/2024-02-29.ndjson.gz"),
        Some(19_782)
    );
    assert_eq!(day_of_key("archive/a/audit/notadate.ndjson.gz"), None);
    assert_eq!(Kind::parse("deliveries"), Some(Kind::Deliveries));
    assert_eq!(Kind::parse("events"), None);
}

#[test]
fn a_bucket_spans_the_days_it_touches() {
    let d = NOV30 * DAY_MS;
    assert_eq!(days(d, d + DAY_MS).collect::<Vec<_>>(), vec![NOV30]);
    assert_eq!(days(d + 5, d + 6).collect::<Vec<_>>(), vec![NOV30]);
    assert_eq!(
        days(d - 1, d + DAY_MS + 1).collect::<Vec<_>>(),
        vec![NOV30 - 1, NOV30, NOV30 + 1]
    );
    assert!(days(d, d).next().is_none());
    let shard = Source::Shard {
        start_ms: d + 1_000,
        end_ms: d + 2_000,
    };
    assert_eq!(
        shard.window(NOV30, 0, u64::MAX),
        Some((d + 1_000, d + 2_000))
    );
    assert_eq!(
        shard.window(NOV30, d + 1_500, d + 1_600),
        Some((d + 1_500, d + 1_600))
    );
    assert_eq!(shard.window(NOV30 + 1, 0, u64::MAX), None);
    assert_eq!(
        shard.window(NOV30, d + 2_000, u64::MAX),
        None,
        "until is exclusive"
    );
    assert_eq!(
        Source::Legacy.window(NOV30, 0, u64::MAX),
        Some((d, d + DAY_MS))
    );
    assert_eq!(shard.id(), format!("shard/{}", d + 1_000));
    assert_eq!(archive_cutoff(d + 5), d);
}

proptest! {
    /// Whatever the chunking, the parts put together are the bytes pushed,
    /// every part but the last has the part size, and the digest is the
    /// whole object's.
    #[test]
    fn parts_reassemble_the_object(chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..30), part in 1usize..50) {
        let mut w = ObjectWriter::with_part_bytes(part);
        let mut parts = Vec::new();
        let mut all = Vec::new();
        for c in &chunks {
            all.extend_from_slice(c);
            parts.extend(w.push(c));
        }
        let multipart = w.multipart();
        let (last, sealed) = w.finish();
        prop_assert_eq!(multipart, !parts.is_empty());
        prop_assert!(parts.iter().all(|p| p.len() == part));
        prop_assert!(last.len() < part || (last.is_empty() && part == 0));
        let mut joined: Vec<u8> = parts.concat();
        joined.extend_from_slice(&last);
        prop_assert_eq!(&joined, &all);
        let mut h = Hasher::default();
        h.update(&all);
        prop_assert_eq!(h.finish(), (sealed.bytes, sealed.sha256.clone()));
    }

    /// Lines split at any chunk boundary come out whole, and no more than
    /// the limit.
    #[test]
    fn lines_survive_any_chunking(n in 0usize..20, cuts in prop::collection::vec(1usize..7, 1..20), limit in prop::option::of(0u64..25)) {
        let text: Vec<u8> = (0..n).flat_map(|i| format!("{{\"n\":{i}}}\n").into_bytes()).collect();
        let mut lines = Lines::up_to(limit);
        let mut got = Vec::new();
        let mut at = 0;
        let mut i = 0;
        while at < text.len() {
            let end = (at + cuts[i % cuts.len()]).min(text.len());
            got.extend(lines.push(&text[at..end]));
            at = end;
            i += 1;
        }
        let want = limit.map_or(n, |l| n.min(l as usize));
        prop_assert_eq!(lines.finish(), want as u64);
        prop_assert_eq!(got.len(), want);
        for (i, l) in got.iter().enumerate() {
            prop_assert_eq!(l, &format!("{{\"n\":{i}}}\n").into_bytes());
        }
    }
}

#[test]
fn the_sha256_is_the_standard_one() {
    let mut h = Hasher::default();
    h.update(b"abc");
    assert_eq!(
        h.finish(),
        (
            3,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad".to_string()
        )
    );
}

#[test]
fn an_unterminated_last_line_is_not_the_archives() {
    let mut l = Lines::up_to(None);
    assert_eq!(l.push(b"{\"a\":1}\n{\"a\""), vec![b"{\"a\":1}\n".to_vec()]);
    assert_eq!(l.finish(), 1);
}

#[test]
fn an_audit_line_is_the_row_as_the_api_shows_it() {
    let r = row("req_1", NOV30 * DAY_MS + 42);
    let line = audit_line(&r);
    assert!(line.ends_with('\n') && line.matches('\n').count() == 1);
    let back: AuditRow = serde_json::from_str(line.trim_end()).unwrap_or_else(|_| row("x", 0));
    assert_eq!(back, r);
    assert_eq!(line_time(Kind::Audit, line.as_bytes()), Some(r.time));
    let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
    let mut fields: Vec<&str> = v
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "client_ip",
            "idempotency_key",
            "key_prefix",
            "method",
            "origin",
            "path",
            "project",
            "rate_limit_remaining",
            "replayed",
            "request_id",
            "response_bytes",
            "response_time_ms",
            "status",
            "time",
            "user_agent",
            "would_refuse"
        ]
    );
}

#[test]
fn a_delivery_line_has_its_attempts_and_no_capture_token() {
    let a = archived("https://hooks.example/in");
    let line = delivery_line("acme", &a);
    let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
    assert_eq!(v["id"], "dlv_1");
    assert_eq!(v["project"], "acme");
    assert_eq!(v["status"], "delivered");
    assert_eq!(v["request_id"], "req_pub");
    assert_eq!(v["attempts"][0]["status_code"], 200);
    assert_eq!(v["attempts"][0]["request_id"], "req_att");
    assert_eq!(
        line_time(Kind::Deliveries, line.as_bytes()),
        Some(a.delivery.created_at)
    );
    let token = "0123456789abcdef0123456789abcdef";
    let captured = archived(&format!("https://gw.example/_postguard/inspect/{token}"));
    let line = delivery_line("acme", &captured);
    assert!(!line.contains(token), "{line}");
    assert!(line.contains("https://gw.example/_postguard/inspect/{token}"));
}

#[test]
fn manifests_list_their_sources_and_decide_what_is_left() {
    let at = Target {
        project: "acme",
        kind: Kind::Audit,
        day: NOV30,
    };
    let a = Source::Shard {
        start_ms: NOV30 * DAY_MS,
        end_ms: NOV30 * DAY_MS + 1_000,
    };
    let b = Source::Shard {
        start_ms: NOV30 * DAY_MS + 1_000,
        end_ms: NOV30 * DAY_MS + 2_000,
    };
    let first = Sealed {
        rows: 3,
        bytes: 40,
        sha256: "aa".into(),
    };
    let m1 = Manifest::with(None, at, &a, 3, &first, 7);
    assert_eq!(m1.object, object_key("acme", Kind::Audit, NOV30));
    assert_eq!((m1.rows, m1.date.as_str()), (3, "2026-11-30"));
    assert!(m1.includes(&a) && !m1.includes(&b));
    let both = Sealed {
        rows: 5,
        bytes: 60,
        sha256: "bb".into(),
    };
    let m2 = Manifest::with(Some(m1.clone()), at, &b, 2, &both, 8);
    assert_eq!(
        m2.sources,
        vec![
            Part {
                source: a.id(),
                rows: 3
            },
            Part {
                source: b.id(),
                rows: 2
            }
        ]
    );
    assert!(verified(&m2, 60, "bb"));
    assert!(!verified(&m2, 60, "aa"));
    assert!(!verified(&m2, 59, "bb"));
    let days = [NOV30, NOV30 + 1];
    assert_eq!(
        pending_days(&b, &days, &[Some(m1.clone()), None]),
        days.to_vec()
    );
    assert_eq!(pending_days(&a, &days, &[Some(m1), None]), vec![NOV30 + 1]);
    assert_eq!(
        pending_days(&b, &days, &[Some(m2.clone()), Some(m2)]),
        Vec::<u64>::new()
    );
}

#[test]
fn export_requests_are_validated() {
    let ok = parse_export(br#"{"project":"acme","kind":"audit","since":"2026-11-30T00:00:00Z","until":1796083200000}"#);
    assert_eq!(
        ok,
        Ok(ExportRequest {
            project: "acme".into(),
            kind: Kind::Audit,
            since: NOV30 * DAY_MS,
            until: 1_796_083_200_000,
        })
    );
    assert!(parse_export(br#"{"project":"~none","kind":"audit","since":1,"until":2}"#).is_ok());
    for (body, field) in [
        (&br#"[]"#[..], "body"),
        (
            br#"{"project":"acme","kind":"audit","since":1,"until":2,"x":1}"#,
            "x",
        ),
        (br#"{"kind":"audit","since":1,"until":2}"#, "project"),
        (
            br#"{"project":"a b","kind":"audit","since":1,"until":2}"#,
            "project",
        ),
        (
            br#"{"project":"~none","kind":"deliveries","since":1,"until":2}"#,
            "project",
        ),
        (
            br#"{"project":"acme","kind":"events","since":1,"until":2}"#,
            "kind",
        ),
        (
            br#"{"project":"acme","kind":"audit","since":"yesterday","until":2}"#,
            "since",
        ),
        (
            br#"{"project":"acme","kind":"audit","since":2,"until":2}"#,
            "until",
        ),
        (
            br#"{"project":"acme","kind":"audit","since":0,"until":34560000000001}"#,
            "until",
        ),
        (br#"{"project":"acme","kind":"audit","since":1}"#, "until"),
    ] {
        let e = parse_export(body).err().map(|e| e.0).unwrap_or_default();
        assert!(
            e.starts_with(field),
            "{}: {e}",
            String::from_utf8_lossy(body)
        );
    }
}

#[test]
fn download_urls_are_signed_and_expire() {
    let s = UrlSigner::from_admin_token("admin-token-0123456789abcdef01234");
    let id = "exp_01JD0000000000000000000000";
    assert!(is_export_id(id));
    assert!(!is_export_id("exp_../x"));
    let exp = 1_000_000;
    let sig = s.sign(id, exp);
    let e = exp.to_string();
    assert_eq!(s.verify(id, Some(&e), Some(&sig), exp - 1), Ok(()));
    assert_eq!(
        s.verify(id, Some(&e), Some(&sig), exp),
        Err(Refused::Expired)
    );
    let later = (exp + 60_000).to_string();
    assert_eq!(
        s.verify(id, Some(&later), Some(&sig), 0),
        Err(Refused::Invalid),
        "expiry moved"
    );
    let other = "exp_01JD0000000000000000000001";
    assert_eq!(
        s.verify(other, Some(&e), Some(&sig), 0),
        Err(Refused::Invalid),
        "another export"
    );
    let mut bent = sig.clone();
    bent.replace_range(0..1, if sig.starts_with('A') { "B" } else { "A" });
    assert_eq!(
        s.verify(id, Some(&e), Some(&bent), 0),
        Err(Refused::Invalid)
    );
    assert_eq!(
        s.verify(id, Some("soon"), Some(&sig), 0),
        Err(Refused::Invalid)
    );
    assert_eq!(s.verify(id, None, Some(&sig), 0), Err(Refused::Missing));
    let rotated = UrlSigner::from_admin_token("another-admin-token-0123456789abc");
    assert_eq!(
        rotated.verify(id, Some(&e), Some(&sig), 0),
        Err(Refused::Invalid)
    );
    assert_eq!(
        download_url("https://gw.example", id, exp, &sig),
        format!("https://gw.example/_postguard/v1/exports/{id}/download?expires={exp}&sig={sig}")
    );
}
