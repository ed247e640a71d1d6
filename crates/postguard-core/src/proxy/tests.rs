use super::*;
use crate::config::RawEnv;

const SIGNING: &str = "signing-secret-0123456789abcdef01";

fn cfg() -> Config {
    let raw = RawEnv {
        origin_url: Some("http://127.0.0.1:8787/api/".into()),
        admin_token: Some("admin-secret-0123456789abcdef0123".into()),
        origin_token: Some("origin-secret-0123456789abcdef012".into()),
        origin_signing_secret: Some(SIGNING.into()),
        postguard_config: None,
    };
    match Config::load(&raw) {
        Ok(c) => c,
        Err(e) => panic!("{e:?}"),
    }
}

fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn incoming(method: &str, headers: &[(String, String)], body: &[u8]) -> Incoming {
    Incoming {
        method: method.into(),
        path: "/orders".into(),
        path_and_query: "/orders?x=1".into(),
        headers: headers.to_vec(),
        body: body.to_vec(),
        oversized: false,
    }
}

fn verdict() -> crate::rate_limit::Verdict {
    crate::rate_limit::Verdict {
        admitted: true,
        limit: 2,
        remaining: 1,
        reset_ms: 60_000,
        reset_in_s: 60,
        reset_epoch_s: 60,
        window_s: 60,
    }
}

#[test]
fn method_list_and_allow_header_agree() {
    assert_eq!(PROXIED_METHODS.join(", "), PROXIED_ALLOW);
    assert!(check_method("PATCH").is_ok());
    let p = check_method("TRACE").unwrap_err();
    assert_eq!((p.status(), p.allow), (405, Some(PROXIED_ALLOW)));
}

#[test]
fn preflight_checks_in_contract_order() {
    let c = cfg();
    let s = &c.settings;
    let big = vec![0u8; s.max_body_bytes as usize + 1];
    let bad_key = h(&[("idempotency-key", ""), ("x", "a\u{1}")]);
    let p = preflight(s, &incoming("POST", &bad_key, &big), "r", 0);
    assert_eq!(p.early.map(|p| p.code), Some(ErrorCode::PayloadTooLarge));
    let p = preflight(s, &incoming("POST", &bad_key, b"{}"), "r", 0);
    assert_eq!(
        p.early.map(|p| p.code),
        Some(ErrorCode::IdempotencyKeyInvalid)
    );
    let p = preflight(s, &incoming("POST", &[], b"{}"), "r", 0);
    assert_eq!(
        p.early.map(|p| p.code),
        Some(ErrorCode::IdempotencyKeyRequired)
    );
    let ctl = h(&[("idempotency-key", "k1"), ("x", "a\u{1}")]);
    let p = preflight(s, &incoming("POST", &ctl, b"{}"), "r", 0);
    assert_eq!(p.early.map(|p| p.code), Some(ErrorCode::ValidationError));
    assert_eq!(p.claim, None, "a request answered early claims nothing");
    assert_eq!(p.idempotency_key.as_deref(), Some("k1"));
    let ok = h(&[("Idempotency-Key", "\"k1\"")]);
    let p = preflight(s, &incoming("POST", &ok, b"{}"), "req_1", 0);
    assert_eq!(p.early, None);
    let claim = p.claim.unwrap();
    assert_eq!(
        (claim.key.as_str(), claim.request_id.as_str()),
        ("k1", "req_1")
    );
    assert_eq!(
        claim.fingerprint,
        idempotency::fingerprint("POST", "/orders?x=1", b"{}")
    );
    // GET is not idempotency-checked by default: the header is ignored.
    let p = preflight(s, &incoming("GET", &ok, b""), "r", 0);
    assert_eq!((p.early, p.claim), (None, None));
}

#[test]
fn a_required_key_is_asked_for_until_required_from_then_enforced() {
    let mut c = cfg();
    c.settings.idempotency.required_from = Some("2027-03-01T00:00:00Z".into());
    let at = c.settings.idempotency.required_from_ms().unwrap();
    let s = &c.settings;
    let before = preflight(s, &incoming("POST", &[], b"{}"), "r", at - 1);
    assert_eq!((before.early, before.claim), (None, None));
    assert_eq!((before.missing_key, before.required_from), (true, Some(at)));
    let after = preflight(s, &incoming("POST", &[], b"{}"), "r", at);
    assert_eq!(
        after.early.map(|p| p.code),
        Some(ErrorCode::IdempotencyKeyRequired)
    );
    assert_eq!((after.missing_key, after.required_from), (true, None));
    // A request with a key, or where a key is optional, is not counted.
    let keyed = h(&[("Idempotency-Key", "k1")]);
    let p = preflight(s, &incoming("POST", &keyed, b"{}"), "r", at - 1);
    assert!(!p.missing_key && p.required_from.is_none() && p.claim.is_some());
    let p = preflight(s, &incoming("PATCH", &[], b"{}"), "r", at - 1);
    assert!(!p.missing_key && p.required_from.is_none());
}

#[test]
fn admission_maps_each_answer() {
    let v = verdict();
    assert_eq!(
        admission(AdmitResponse::Revoked, None),
        Ok(Admission::Revoked)
    );
    let limited = AdmitResponse::Limited {
        verdict: crate::rate_limit::Verdict {
            admitted: false,
            ..v
        },
        verdicts: None,
    };
    let Ok(Admission::Refused { problem, .. }) = admission(limited, None) else {
        panic!()
    };
    assert_eq!(problem.code, ErrorCode::RateLimitExceeded);
    let admitted = |d: Option<Decision>, r: Option<StoredResponse>| AdmitResponse::Admitted {
        verdict: v,
        idempotency: d,
        replay: r,
        verdicts: None,
        refresh: None,
        lookup: None,
        operation: None,
        would_refuse: None,
    };
    let code = |a: Result<Admission, ReplayMissing>| match a {
        Ok(Admission::Refused { problem, .. }) => Some(problem.code),
        _ => None,
    };
    let early = Problem::payload_too_large(1);
    assert_eq!(
        code(admission(admitted(None, None), Some(early))),
        Some(ErrorCode::PayloadTooLarge)
    );
    let busy = Some(Decision::InProgress { retry_after_s: 3 });
    assert_eq!(
        code(admission(admitted(busy, None), None)),
        Some(ErrorCode::IdempotencyKeyInProgress)
    );
    let conflict = Some(Decision::Conflict);
    assert_eq!(
        code(admission(admitted(conflict, None), None)),
        Some(ErrorCode::IdempotencyKeyReuseConflict)
    );
    assert_eq!(
        admission(admitted(Some(Decision::Replay), None), None),
        Err(ReplayMissing::Response)
    );
    let run = admission(admitted(Some(Decision::Execute), None), None);
    assert_eq!(
        run,
        Ok(Admission::Forward {
            verdicts: Verdicts::single(crate::limits::DEFAULT_POLICY, v),
            refresh: None,
            lookup: None
        })
    );
    assert_eq!(
        admission(AdmitResponse::Expired, None),
        Ok(Admission::Expired)
    );
}

#[test]
fn origin_request_signs_what_the_origin_sees() {
    let c = cfg();
    let key = KeyRecord {
        id: "key_1".into(),
        prefix: "pgk_abcdefgh".into(),
        project: "acme".into(),
        plan: "trial".into(),
        name: None,
        created_at: 0,
        revoked_at: None,
        ..KeyRecord::default()
    };
    let headers = h(&[
        ("authorization", "Bearer x"),
        ("x-request-id", "spoofed"),
        ("accept", "a"),
        ("content-type", "application/json"),
        ("cf-connecting-ip", "203.0.113.7"),
        ("x-forwarded-for", "6.6.6.6"),
        ("true-client-ip", "6.6.6.6"),
    ]);
    let req = incoming("POST", &headers, b"{}");
    let o = origin_request(
        &c,
        req,
        &Identity::of(&key, Some("e30")),
        None,
        "req_1",
        100,
    );
    assert_eq!(o.url, "http://127.0.0.1:8787/api/orders?x=1");
    assert!(!o.buffer);
    let get = |n: &str| {
        o.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.as_str())
            .collect::<Vec<_>>()
    };
    assert_eq!(get("authorization"), Vec::<&str>::new());
    assert_eq!(get("x-request-id"), vec!["req_1"]);
    assert_eq!(get("x-postguard-project"), vec!["acme"]);
    assert_eq!(get("x-postguard-client-ip"), vec!["203.0.113.7"]);
    assert_eq!(get("x-forwarded-for"), vec!["203.0.113.7"]);
    assert_eq!(get("true-client-ip"), Vec::<&str>::new());
    assert_eq!(get("cf-connecting-ip"), Vec::<&str>::new());
    let sig = origin_signature(
        SIGNING,
        &Signed {
            t: 100,
            request_id: "req_1",
            method: "POST",
            path_and_query: "/api/orders?x=1",
            body: b"{}",
            project: "acme",
            key_prefix: "pgk_abcdefgh",
            plan: "trial",
            idempotency_key: None,
            content_type: Some("application/json"),
            client_ip: Some("203.0.113.7"),
            key_meta: Some("e30"),
        },
    );
    assert_eq!(get("x-postguard-signature"), vec![sig.as_str()]);
    assert_eq!(get("x-postguard-key-meta"), vec!["e30"]);
    assert_eq!(get("idempotency-key"), Vec::<&str>::new());
}

fn answered(status: u16, body_len: u64) -> Answered<'static> {
    Answered {
        status,
        headers: &[],
        body_len,
    }
}

#[test]
fn settlement_stores_final_answers_and_releases_the_rest() {
    let c = cfg();
    let plan = &c.settings.plans["trial"];
    let claim = Claim {
        key: "k".into(),
        fingerprint: "f".into(),
        request_id: "r".into(),
        lease_ms: 1,
    };
    assert!(matches!(
        settle(&c.settings, plan, &claim, false, None),
        Settlement::Release(_)
    ));
    assert!(matches!(
        settle(&c.settings, plan, &claim, false, Some(answered(503, 0))),
        Settlement::Release(_)
    ));
    let big = c.settings.idempotency.max_stored_body_bytes + 1;
    let Settlement::Complete(done) =
        settle(&c.settings, plan, &claim, false, Some(answered(201, big)))
    else {
        panic!()
    };
    assert!(done.response.body_omitted);
    assert_eq!(done.ttl_ms, u64::from(plan.ttl_s()) * 1000);
}
