use super::*;

fn concrete(template: &str) -> String {
    template
        .replace("{id}", "abc_01")
        .replace("{key}", "abc_01")
}

#[test]
fn every_operation_resolves_to_itself() {
    for (method, template) in OPERATIONS {
        let route = resolve(method, &concrete(template))
            .unwrap_or_else(|e| panic!("{method} {template}: {e}"));
        assert_eq!(route.operation(), (*method, *template));
    }
}

#[test]
fn operations_are_distinct_and_ids_are_captured() {
    let mut seen = std::collections::HashSet::new();
    for op in OPERATIONS {
        assert!(seen.insert(op), "{op:?} listed twice");
    }
    assert_eq!(
        resolve("get", "/_postguard/v1/keys/key_1/"),
        Ok(Route::KeyGet { id: "key_1".into() })
    );
}

#[test]
fn allow_lists_exactly_the_operations_of_the_path() {
    for (_, template) in OPERATIONS {
        let path = concrete(template);
        let Err(RouteError::MethodNotAllowed { allow }) = resolve("PUT", &path) else {
            panic!("PUT {template} should be 405");
        };
        let mut listed: Vec<&str> = allow.split(", ").collect();
        let mut expected: Vec<&str> = OPERATIONS
            .iter()
            .filter(|(_, t)| t == template)
            .map(|(m, _)| *m)
            .collect();
        listed.sort_unstable();
        expected.sort_unstable();
        assert_eq!(listed, expected, "{template}");
    }
}

#[test]
fn one_spelling_per_gateway_path() {
    let c = |p: &str| canonical(p);
    assert_eq!(c("/_postguard//v1/keys").path, "/_postguard/v1/keys");
    assert_eq!(c("//_postguard/v1/keys/").path, "/_postguard/v1/keys/");
    assert_eq!(c("/_postguard/./v1/me").path, "/_postguard/v1/me");
    assert!(c("//_postguard/v1/me").gateway);
    assert!(c("/_postguard").gateway);
    assert!(!c("/_postguardx/v1").gateway);
    assert!(!c("/orders//1").gateway);
    assert_eq!(c("").path, "/");
    assert_eq!(c("/").path, "/");
    // Routed on the canonical form: the prefix is stripped once.
    assert_eq!(
        resolve("POST", &c("/_postguard//inspect/t1").path),
        Ok(Route::InspectCapture { token: "t1".into() })
    );
    assert_eq!(
        resolve("POST", &c("/_postguard//_postguard/inspect/t1").path),
        Err(RouteError::NotFound)
    );
    assert_eq!(
        resolve("POST", "/_postguard/inspect%2Ft1"),
        Err(RouteError::NotFound)
    );
}

#[test]
fn no_spelling_of_a_capture_url_reaches_the_audit_log() {
    let token = "0123456789abcdef0123456789abcdef0123456789abcdef";
    for p in [
        format!("/_postguard/inspect/{token}"),
        format!("/_postguard//_postguard/inspect/{token}"),
        format!("//_postguard/inspect//{token}"),
        format!("/_postguard/inspect%2F{token}"),
        format!("/_postguard%2Finspect%2F{token}"),
        format!("/_postguard/%69nspect/{token}"),
        format!("/_postguard/INSPECT/{token}/x"),
    ] {
        let audited = audited_path(&canonical(&p)).into_owned();
        assert!(!audited.contains(token), "{p} → {audited}");
    }
    assert_eq!(
        audited_path(&canonical("/_postguard/v1/inspectors/insp_1/requests")),
        "/_postguard/v1/inspectors/insp_1/requests"
    );
    assert_eq!(audited_path(&canonical("/inspect/abc")), "/inspect/abc");
}

#[test]
fn access_and_costs_follow_the_operation() {
    let costs = crate::config::RateLimitConfig::default();
    for (method, template) in OPERATIONS {
        let route = resolve(method, &concrete(template)).unwrap_or(Route::Me);
        // Every mutating operation of an authenticated caller honours a key,
        // but the three that have a key of their own (or none to have).
        let own_key = matches!(route, Route::EventsPublish | Route::PortalSessionsCreate);
        assert_eq!(
            route.idempotent(),
            *method != "GET" && !own_key,
            "{template}"
        );
        if route.access() != Access::Project && route.access() != Access::Reader {
            assert_eq!(route.cost(&costs), 0, "{template}");
        }
    }
    assert_eq!(
        Route::WebhookTest { id: "w".into() }.cost(&costs),
        costs.test_cost
    );
    assert!(costs.test_cost > 0 && costs.recover_cost > 0);
}

#[test]
fn unknown_paths_are_not_found() {
    for p in [
        "/_postguard/",
        "/_postguard/v2/keys",
        "/_postguard/v1/keys/a/b",
        "/_postguard/v1/keys//x",
        "/_postguard/v1/nope",
    ] {
        assert_eq!(resolve("GET", p), Err(RouteError::NotFound), "{p}");
    }
    let p = RouteError::NotFound.problem("GET", "/_postguard/x");
    assert_eq!(p.code, ErrorCode::NotFound);
    let p = RouteError::MethodNotAllowed { allow: "GET" }.problem("PUT", "/x");
    assert_eq!((p.status(), p.allow), (405, Some("GET")));
}

#[test]
fn gateway_paths_are_told_apart_and_named_by_their_template() {
    for p in [
        "/_postguard",
        "/_postguard/",
        "/_postguard/v1/stats",
        "/_postguard/v1/idempotency/order-1",
        "/_postguard%2Fv1/keys",
        "/_postguard/inspect/{token}",
    ] {
        assert!(is_gateway_path(p), "{p}");
    }
    for p in [
        "/",
        "/orders/1",
        "/_postguardx",
        "/_postguard_v1",
        "/v1/_postguard/x",
    ] {
        assert!(!is_gateway_path(p), "{p}");
    }
    // Every operation's own path is a gateway path, named by its template.
    for (method, template) in OPERATIONS {
        let p = concrete(template);
        assert!(is_gateway_path(&p), "{method} {template}");
        assert_eq!(template_of(&p), Some(*template), "{method} {template}");
    }
    assert_eq!(
        template_of("/_postguard/v1/idempotency/6f1c0b9e-0f7a-4c55-9d2f-3a1b2c3d4e5f"),
        Some("/_postguard/v1/idempotency/{key}")
    );
    assert_eq!(template_of("/_postguard/v1/nope"), None);
    assert_eq!(template_of("/orders/1"), None);
}

/// [`GATEWAY_PATH_SQL`] is [`is_gateway_path`]: the GLOB patterns read
/// as SQLite reads them (`*` any characters, everything else literal).
#[test]
fn the_sql_condition_is_the_same_test() {
    fn glob(pattern: &str, s: &str) -> bool {
        match pattern.split_once('*') {
            None => pattern == s,
            Some((head, tail)) => {
                assert!(tail.is_empty(), "one trailing * only");
                s.starts_with(head)
            }
        }
    }
    let sql_test = |p: &str| -> bool {
        GATEWAY_PATH_SQL
            .trim_matches(|c| c == '(' || c == ')')
            .split(" OR ")
            .any(
                |clause| match clause.split_once(" = ").or(clause.split_once(" GLOB ")) {
                    Some((_, quoted)) => glob(quoted.trim_matches('\''), p),
                    None => panic!("{clause}"),
                },
            )
    };
    for p in [
        "/_postguard",
        "/_postguard/v1/me",
        "/_postguard%2Fx",
        "/_postguardx",
        "/orders",
        "/",
        "/_postguard_",
    ] {
        assert_eq!(sql_test(p), is_gateway_path(p), "{p}");
    }
}

#[test]
fn a_reader_reads_its_own_project_and_the_operator_names_one() {
    assert_eq!(reader_project(Some("acme"), None).as_deref(), Ok("acme"));
    assert!(
        reader_project(Some("acme"), Some("other")).is_err(),
        "a key reads its own"
    );
    assert!(
        reader_project(Some("acme"), Some("acme")).is_err(),
        "and never names it"
    );
    assert_eq!(
        reader_project(None, Some("shop-1")).as_deref(),
        Ok("shop-1")
    );
    let missing = reader_project(None, None).map_err(|e| e.0);
    assert!(missing.is_err_and(|m| m.starts_with("project: required")));
    assert!(
        reader_project(None, Some("~all")).is_err(),
        "never a reserved shard name"
    );
    for (method, template) in [
        ("GET", "/_postguard/v1/webhooks"),
        ("GET", "/_postguard/v1/webhooks/{id}"),
        ("GET", "/_postguard/v1/deliveries"),
        ("GET", "/_postguard/v1/deliveries/{id}"),
        ("GET", "/_postguard/v1/events"),
    ] {
        let route = resolve(method, &concrete(template)).unwrap_or(Route::Me);
        assert_eq!(route.access(), Access::Reader, "{template}");
        assert!(
            route
                .query_params()
                .unwrap_or_default()
                .contains(&"project"),
            "{template}"
        );
    }
    // Changing a project's webhooks stays the project's.
    for (method, template) in [
        ("POST", "/_postguard/v1/webhooks"),
        ("PATCH", "/_postguard/v1/webhooks/{id}"),
        ("POST", "/_postguard/v1/deliveries/{id}/retry"),
    ] {
        let route = resolve(method, &concrete(template)).unwrap_or(Route::Me);
        assert_eq!(route.access(), Access::Project, "{template}");
    }
}
