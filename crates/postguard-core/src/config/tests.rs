//! The tests of `config/mod.rs` (secrets, `ORIGIN_URL`, the JSON text) and
//! those that cross sections; each section's own tests stand beside it, and
//! use [`env`] and [`err_field`] from here.

use super::*;

const ADMIN: &str = "admin-secret-0123456789abcdef0123";
const ORIGIN: &str = "origin-secret-0123456789abcdef012";
const SIGNING: &str = "signing-secret-0123456789abcdef01";

/// Valid secrets and `ORIGIN_URL`, with `cfg` as `POSTGUARD_CONFIG`.
pub(crate) fn env(cfg: Option<&str>) -> RawEnv {
    RawEnv {
        origin_url: Some("http://127.0.0.1:8787/api".into()),
        admin_token: Some(ADMIN.into()),
        origin_token: Some(ORIGIN.into()),
        origin_signing_secret: Some(SIGNING.into()),
        postguard_config: cfg.map(str::to_string),
    }
}

/// The field the first error of `cfg` names.
pub(crate) fn err_field(cfg: &str) -> String {
    Config::load(&env(Some(cfg))).unwrap_err().field
}

#[test]
fn async_operations_and_response_events_are_validated_naming_the_field() {
    let c = Config::load(&env(None)).unwrap();
    let a = &c.settings.async_ops;
    assert!(a.routes.is_empty(), "no asynchronous routes by default");
    assert_eq!((a.timeout_ms, a.requeue_after_s), (300_000, 60));
    assert!(c.settings.events_from_responses.is_empty());
    let ok = r#"{"async":{"routes":[{"method":"POST","path":"/reports/*"}],"timeout_ms":840000},
        "events_from_responses":[{"method":"*","path":"/orders","status":"2xx","type":"order.created","data":"/order/id~1x"}]}"#;
    assert!(Config::load(&env(Some(ok))).is_ok());
    for (cfg, field) in [
        (
            r#"{"async":{"routes":[{"method":"GET","path":"/r"}]}}"#,
            "async.routes[0].method",
        ),
        (
            r#"{"async":{"routes":[{"method":"POST","path":"r"}]}}"#,
            "async.routes[0].path",
        ),
        (r#"{"async":{"timeout_ms":840001}}"#, "async.timeout_ms"),
        (r#"{"async":{"timeout_ms":999}}"#, "async.timeout_ms"),
        (
            r#"{"async":{"requeue_after_s":0}}"#,
            "async.requeue_after_s",
        ),
        (r#"{"async":{"route":[]}}"#, "async.route"),
        (
            r#"{"events_from_responses":[{"method":"POST","path":"/o","status":"6xx","type":"a","data":"body"}]}"#,
            "events_from_responses[0].status",
        ),
        (
            r#"{"events_from_responses":[{"method":"POST","path":"/o","status":"2xx","type":"postguard.x","data":"body"}]}"#,
            "events_from_responses[0].type",
        ),
        (
            r#"{"events_from_responses":[{"method":"POST","path":"/o","status":"2xx","type":"a b","data":"body"}]}"#,
            "events_from_responses[0].type",
        ),
        (
            r#"{"events_from_responses":[{"method":"POST","path":"/o","status":"2xx","type":"a","data":"order"}]}"#,
            "events_from_responses[0].data",
        ),
        (
            r#"{"events_from_responses":[{"method":"HEAD","path":"/o","status":"2xx","type":"a","data":"body"}]}"#,
            "events_from_responses[0].method",
        ),
        (
            r#"{"events_from_responses":[{"method":"POST","path":"/o","status":"2xx","type":"a"}]}"#,
            "events_from_responses[0].data",
        ),
    ] {
        assert_eq!(err_field(cfg), field, "{cfg}");
    }
}

#[test]
fn defaults_match_the_contract() {
    let c = Config::load(&env(None)).unwrap();
    let s = &c.settings;
    assert_eq!(s.plans["trial"].requests_per_window, Some(30));
    assert_eq!(s.plans["business"].requests_per_window, Some(2000));
    assert_eq!(s.plans["trial"].window_s, Some(60));
    assert_eq!(s.plans["trial"].ttl_s(), 86_400);
    assert_eq!(s.idempotency.lease_s, 60);
    assert_eq!(s.idempotency.max_stored_body_bytes, 1 << 20);
    assert_eq!(s.origin.timeout_ms, 30_000);
    assert_eq!(s.webhooks.schedule_s, vec![60, 900, 3600, 86400]);
    assert_eq!(s.webhooks.secret_overlap_s, 86_400);
    assert_eq!(s.webhooks.requeue_after_s, 900);
    assert_eq!(s.retention.audit_days, 90);
    assert_eq!(s.max_body_bytes, 10 << 20);
    assert_eq!(s.idempotency_mode("POST", "/x"), Mode::Required);
    assert_eq!(s.idempotency_mode("PATCH", "/x"), Mode::Optional);
    assert_eq!(s.idempotency_mode("GET", "/x"), Mode::Off);
    assert_eq!(s.cost("POST", "/x"), 1);
}

#[test]
fn contract_example_parses() {
    let text = r#"{
      "plans": {"trial": {"requests_per_window": 30, "window_s": 60, "idempotency_ttl_s": 86400},
                "business": {"requests_per_window": 2000, "window_s": 60, "idempotency_ttl_s": 86400}},
      "rate_limit": {"costs": [{"method": "POST", "path": "/bulk/*", "cost": 1}]},
      "idempotency": {"methods": {"POST": "required", "PATCH": "optional", "PUT": "optional", "DELETE": "optional"},
                      "routes": [{"method": "POST", "path": "/search", "mode": "off"}],
                      "lease_s": 60, "max_stored_body_bytes": 1048576},
      "origin": {"timeout_ms": 30000},
      "webhooks": {"schedule_s": [60, 900, 3600, 86400], "timeout_ms": 30000,
                   "max_payload_bytes": 65536, "allow_insecure_urls": false, "allow_hosts": []},
      "retention": {"audit_days": 90, "deliveries_days": 14},
      "max_body_bytes": 10485760
    }"#;
    let c = Config::load(&env(Some(text))).unwrap();
    assert_eq!(c.settings.idempotency_mode("POST", "/search"), Mode::Off);
    assert_eq!(
        c.settings.idempotency_mode("POST", "/searches"),
        Mode::Required
    );
}

#[test]
fn archive_and_alerts_settings() {
    let c = Config::load(&env(None)).unwrap();
    let s = &c.settings;
    assert!(s.archive.enabled, "on unless the operator turns it off");
    assert_eq!(s.archive.keep_days, 2_557);
    assert_eq!(s.alerts.project, None);
    assert_eq!(
        (
            s.alerts.queue_lag_s,
            s.alerts.storage_percent,
            s.alerts.period_s
        ),
        (300, 80, 3_600)
    );
    let text = r#"{"retention":{"audit_days":0,"deliveries_days":0},"archive":{"enabled":false,"keep_days":30},
      "alerts":{"project":"ops","queue_lag_s":5,"storage_percent":1,"period_s":60}}"#;
    let c = Config::load(&env(Some(text))).unwrap();
    assert_eq!(
        c.settings.retention.audit_days, 0,
        "0 keeps only the current bucket"
    );
    assert_eq!(c.settings.alerts.project.as_deref(), Some("ops"));
    for (cfg, field) in [
        (r#"{"archive":{"keep_days":0}}"#, "archive.keep_days"),
        (r#"{"archive":{"enabled":"yes"}}"#, "archive.enabled"),
        (r#"{"archive":{"bucket":"x"}}"#, "archive.bucket"),
        (r#"{"alerts":{"project":"a b"}}"#, "alerts.project"),
        (r#"{"alerts":{"queue_lag_s":0}}"#, "alerts.queue_lag_s"),
        (
            r#"{"alerts":{"storage_percent":101}}"#,
            "alerts.storage_percent",
        ),
        (r#"{"alerts":{"period_s":59}}"#, "alerts.period_s"),
        (
            r#"{"retention":{"deliveries_days":3651}}"#,
            "retention.deliveries_days",
        ),
    ] {
        assert_eq!(err_field(cfg), field, "{cfg}");
    }
}

#[test]
fn errors_name_the_leaf_field() {
    assert_eq!(
        err_field(r#"{"plans":{"trial":{"requests_per_window":0}}}"#),
        "plans.trial.requests_per_window"
    );
    assert_eq!(
        err_field(r#"{"plans":{"trial":{"requests_per_window":"x"}}}"#),
        "plans.trial.requests_per_window"
    );
    assert_eq!(
        err_field(r#"{"plans":{"trial":{"requests_per_window":-1}}}"#),
        "plans.trial.requests_per_window"
    );
    assert_eq!(
        err_field(r#"{"plans":{"trial":{"window_s":60}}}"#),
        "plans.trial.requests_per_window"
    );
    assert_eq!(
        err_field(r#"{"plans":{"trial":{"requests_per_window":5,"colour":1}}}"#),
        "plans.trial.colour"
    );
    assert_eq!(err_field(r#"{"bogus":1}"#), "bogus");
    for at in ["tomorrow", "1700000000000", "10000-01-01T00:00:00Z"] {
        let cfg = format!(r#"{{"idempotency":{{"required_from":"{at}"}}}}"#);
        assert_eq!(err_field(&cfg), "idempotency.required_from", "{at}");
    }
    assert_eq!(
        err_field(r#"{"plans":{"trial":{"requests_per_window":5,"enforce":"no"}}}"#),
        "plans.trial.enforce"
    );
    assert_eq!(
        err_field(r#"{"origin":{"timeout_ms":0}}"#),
        "origin.timeout_ms"
    );
    assert_eq!(
        err_field(r#"{"origin":{"timeout_ms":90000}}"#),
        "idempotency.lease_s"
    );
    assert_eq!(
        err_field(r#"{"idempotency":{"max_stored_body_bytes":1000}}"#),
        "idempotency.max_stored_body_bytes"
    );
    assert_eq!(
        err_field(r#"{"idempotency":{"methods":{"GET":"required"}}}"#),
        "idempotency.methods.GET"
    );
    assert_eq!(
        err_field(
            r#"{"idempotency":{"routes":[{"method":"POST","path":"/a","mode":"sometimes"}]}}"#
        ),
        "idempotency.routes[0].mode"
    );
    assert_eq!(
        err_field(r#"{"idempotency":{"routes":[{"method":"POST","path":"a","mode":"off"}]}}"#),
        "idempotency.routes[0].path"
    );
    assert_eq!(
        err_field(r#"{"rate_limit":{"costs":[{"method":"POST","path":"/a","cost":31}]}}"#),
        "rate_limit.costs[0].cost"
    );
    assert_eq!(
        err_field(r#"{"webhooks":{"schedule_s":[]}}"#),
        "webhooks.schedule_s"
    );
    assert_eq!(
        err_field(r#"{"webhooks":{"schedule_s":[60,0]}}"#),
        "webhooks.schedule_s[1]"
    );
    assert_eq!(
        err_field(r#"{"webhooks":{"secret_overlap_s":0}}"#),
        "webhooks.secret_overlap_s"
    );
    assert_eq!(
        err_field(r#"{"retention":{"audit_days":3651}}"#),
        "retention.audit_days"
    );
    assert_eq!(
        err_field(r#"{"audit":{"bucket_ms":999}}"#),
        "audit.bucket_ms"
    );
    assert_eq!(
        err_field(r#"{"audit":{"bucket_ms":2678400001}}"#),
        "audit.bucket_ms"
    );
    assert_eq!(err_field(r#"{"max_body_bytes":0}"#), "max_body_bytes");
    assert_eq!(err_field(r#"{"plans":{}}"#), "plans");
    assert_eq!(
        err_field(r#"{"plans":{"bad name":{"requests_per_window":1}}}"#),
        "plans.bad name"
    );
}

#[test]
fn invalid_json_names_postguard_config() {
    assert_eq!(err_field("{"), "POSTGUARD_CONFIG");
    assert_eq!(err_field("[1]"), "POSTGUARD_CONFIG");
    assert_eq!(err_field("not json"), "POSTGUARD_CONFIG");
    assert_eq!(err_field("\"string\""), "POSTGUARD_CONFIG");
    assert_eq!(err_field(""), "POSTGUARD_CONFIG");
    assert_eq!(err_field("{} junk"), "POSTGUARD_CONFIG");
    assert_eq!(err_field("{}{}"), "POSTGUARD_CONFIG");
    assert_eq!(err_field("  "), "POSTGUARD_CONFIG");
    assert_eq!(err_field(""), "POSTGUARD_CONFIG");
    assert_eq!(err_field("{} junk"), "POSTGUARD_CONFIG");
    assert_eq!(err_field("{}{}"), "POSTGUARD_CONFIG");
    assert_eq!(err_field("  "), "POSTGUARD_CONFIG");
}

#[test]
fn env_errors_name_the_variable() {
    let mut e = env(None);
    e.origin_url = Some("ftp://x".into());
    assert_eq!(Config::load(&e).unwrap_err().field, "ORIGIN_URL");
    e.origin_url = Some("not a url".into());
    assert_eq!(Config::load(&e).unwrap_err().field, "ORIGIN_URL");
    e.origin_url = None;
    assert_eq!(Config::load(&e).unwrap_err().field, "ORIGIN_URL");
    e.origin_url = Some("https://user:pw@example.com".into());
    assert_eq!(Config::load(&e).unwrap_err().field, "ORIGIN_URL");
    // No Unicode host processing in this build (ADR 0019): the xn-- form only.
    for raw in ["https://Bücher.example", "https://%41%C3%BC.example"] {
        e.origin_url = Some(raw.into());
        let err = Config::load(&e).unwrap_err();
        assert_eq!(err.field, "ORIGIN_URL", "{raw}");
    }
    e.origin_url = Some("https://XN--bcher-kva.example".into());
    assert!(Config::load(&e).is_ok());
    let mut e = env(None);
    e.admin_token = Some(" ".into());
    assert_eq!(Config::load(&e).unwrap_err().field, "ADMIN_TOKEN");
    let mut e = env(None);
    e.origin_token = None;
    assert_eq!(Config::load(&e).unwrap_err().field, "ORIGIN_TOKEN");
    let mut e = env(None);
    e.origin_signing_secret = None;
    assert_eq!(Config::load(&e).unwrap_err().field, "ORIGIN_SIGNING_SECRET");
}

#[test]
fn secrets_are_long_enough_and_distinct() {
    let short = "x".repeat(MIN_SECRET_LEN - 1);
    for field in ["ADMIN_TOKEN", "ORIGIN_TOKEN", "ORIGIN_SIGNING_SECRET"] {
        let mut e = env(None);
        match field {
            "ADMIN_TOKEN" => e.admin_token = Some(short.clone()),
            "ORIGIN_TOKEN" => e.origin_token = Some(short.clone()),
            _ => e.origin_signing_secret = Some(short.clone()),
        }
        let err = Config::load(&e).unwrap_err();
        assert_eq!(err.field, field);
        assert!(err.reason.contains("at least 32"), "{err}");
    }
    let mut e = env(None);
    e.origin_token = Some(ADMIN.into());
    let err = Config::load(&e).unwrap_err();
    assert_eq!(err.field, "ORIGIN_TOKEN");
    assert!(!err.reason.contains(ADMIN), "never echoes a secret");
    let mut e = env(None);
    e.origin_signing_secret = Some(ORIGIN.into());
    assert_eq!(Config::load(&e).unwrap_err().field, "ORIGIN_SIGNING_SECRET");
    assert!(Config::load(&env(None)).is_ok());
}

#[test]
fn security_settings_have_documented_defaults_and_ranges() {
    let c = Config::load(&env(None)).unwrap();
    assert_eq!(c.settings.webhooks.max_subscriptions_per_project, 200);
    assert_eq!(c.settings.webhooks.on_key_revoked, OnKeyRevoked::Pause);
    assert_eq!(
        (
            c.settings.rate_limit.audit_cost,
            c.settings.rate_limit.stats_cost
        ),
        (1, 1)
    );
    assert_eq!(
        err_field(r#"{"webhooks":{"max_subscriptions_per_project":0}}"#),
        "webhooks.max_subscriptions_per_project"
    );
    assert_eq!(
        err_field(r#"{"webhooks":{"events_per_project_per_day":0}}"#),
        "webhooks.events_per_project_per_day"
    );
    assert_eq!(
        err_field(r#"{"webhooks":{"d1_high_water_bytes":10000000001}}"#),
        "webhooks.d1_high_water_bytes"
    );
    assert_eq!(
        err_field(r#"{"webhooks":{"manual_attempts_per_delivery":101}}"#),
        "webhooks.manual_attempts_per_delivery"
    );
    assert_eq!(c.settings.webhooks.events_per_project_per_day, 1_000_000);
    assert_eq!(c.settings.webhooks.d1_high_water_bytes, 8_000_000_000);
    assert_eq!(
        err_field(r#"{"webhooks":{"on_key_revoked":"ignore"}}"#),
        "webhooks.on_key_revoked"
    );
    assert_eq!(
        err_field(r#"{"rate_limit":{"stats_cost":31}}"#),
        "rate_limit.stats_cost"
    );
}

proptest::proptest! {
    /// Any text, valid or not, yields a config or an error naming a field;
    /// never a panic.
    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        if let Err(e) = Config::load(&env(Some(&text))) {
            proptest::prop_assert!(!e.field.is_empty());
        }
    }
}

#[test]
fn live_api_fields_are_validated_naming_the_leaf() {
    for (cfg, field) in [
        (
            r#"{"origins":{"billing":{"url":"ftp://x"}}}"#,
            "origins.billing.url",
        ),
        (
            r#"{"origins":{"billing":{"url":"https://b.example","timeout_ms":5}}}"#,
            "origins.billing.timeout_ms",
        ),
        (
            r#"{"origins":{"Bad Name":{"url":"https://b.example"}}}"#,
            "origins.Bad Name",
        ),
        (
            r#"{"origins":{"default":{"url":"https://b.example"}}}"#,
            "origins.default",
        ),
        (
            r#"{"origin":{"routes":[{"path":"/b/*","origin":"nowhere"}]}}"#,
            "origin.routes[0].origin",
        ),
        (
            r#"{"auth":{"api_key_from":["bearer","cookie"]}}"#,
            "auth.api_key_from[1]",
        ),
        (r#"{"auth":{"api_key_from":[]}}"#, "auth.api_key_from"),
        (
            r#"{"auth":{"verify_unknown_keys":{"path":"no-slash"}}}"#,
            "auth.verify_unknown_keys.path",
        ),
        (
            r#"{"plans":{"trial":{"requests_per_window":5,"enforce":1}}}"#,
            "plans.trial.enforce",
        ),
    ] {
        assert_eq!(err_field(cfg), field, "{cfg}");
    }
}
