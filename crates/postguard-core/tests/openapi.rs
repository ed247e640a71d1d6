//! The API document (`openapi/openapi.json`) against the code: no drift
//! between the operations it describes and the gateway's route table; the
//! published error codes are exactly `ErrorCode::ALL`, in order; and every
//! problem response names only codes that exist with the status they have.

use std::collections::BTreeSet;

use postguard_core::routes::{resolve, Access, OPERATIONS};
use postguard_core::ErrorCode;
use serde_json::Value;

const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

const DOCUMENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../openapi/openapi.json");

fn read_document() -> Result<Value, String> {
    let text = std::fs::read_to_string(DOCUMENT).map_err(|e| format!("{DOCUMENT}: {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("{DOCUMENT}: {e}"))
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn documented(doc: &Value) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    // No `paths` documents nothing, which the drift test then reports.
    let Some(paths) = doc["paths"].as_object() else {
        return ops;
    };
    for (path, item) in paths {
        for m in METHODS {
            if item.get(m).is_some() {
                ops.insert((m.to_ascii_uppercase(), path.clone()));
            }
        }
    }
    ops
}

#[test]
fn every_route_is_documented_and_every_documented_operation_routed() {
    let doc = read_document().expect("the API document");
    let documented = documented(&doc);
    let routed: BTreeSet<(String, String)> = OPERATIONS
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    let undocumented: Vec<_> = routed.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "routes the document lacks: {undocumented:?}"
    );
    let unrouted: Vec<_> = documented.difference(&routed).collect();
    assert!(
        unrouted.is_empty(),
        "documented operations without a route: {unrouted:?}"
    );
}

#[test]
fn documented_templates_resolve_to_their_own_operation() {
    // The template's `{param}` stands for one segment, as the router reads it.
    let doc = read_document().expect("the API document");
    for (method, template) in documented(&doc) {
        let concrete: String = template
            .split('/')
            .map(|s| if s.starts_with('{') { "x_1" } else { s })
            .collect::<Vec<_>>()
            .join("/");
        let route = resolve(&method, &concrete)
            .unwrap_or_else(|e| panic!("{method} {template} ({concrete}): {e}"));
        assert_eq!(route.operation(), (method.as_str(), template.as_str()));
    }
}

#[test]
fn every_operation_is_explicit_about_its_credentials() {
    let doc = read_document().expect("the API document");
    let schemes = doc["components"]["securitySchemes"]
        .as_object()
        .expect("securitySchemes");
    for (method, path) in documented(&doc) {
        let op = &doc["paths"][&path][method.to_ascii_lowercase()];
        let security = op["security"]
            .as_array()
            .unwrap_or_else(|| panic!("{method} {path}: no `security` (use [] for none)"));
        for requirement in security {
            for name in requirement.as_object().expect("requirement").keys() {
                assert!(schemes.contains_key(name), "{method} {path}: {name}");
            }
        }
        // Every operation documents the answers every request can get.
        for status in ["413", "500"] {
            assert!(
                op["responses"].get(status).is_some(),
                "{method} {path}: no {status}"
            );
        }
    }
}

#[test]
fn the_error_code_enum_is_the_published_list() {
    let doc = read_document().expect("the API document");
    let listed = strings(&doc["components"]["schemas"]["ErrorCode"]["enum"]);
    let codes: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(listed, codes, "components.schemas.ErrorCode.enum");
}

#[test]
fn narrowed_problem_schemas_pair_codes_with_their_status() {
    let doc = read_document().expect("the API document");
    let schemas = doc["components"]["schemas"]
        .as_object()
        .expect("components.schemas");
    let mut checked = 0;
    for (name, schema) in schemas {
        let Some(parts) = schema["allOf"].as_array() else {
            continue;
        };
        if parts[0]["$ref"] != "#/components/schemas/Problem" {
            continue;
        }
        let narrowed = &parts[1]["properties"];
        let status = narrowed["status"]["const"].as_u64().expect("status const");
        let code = &narrowed["code"];
        let codes = match code["const"].as_str() {
            Some(c) => vec![c],
            None => strings(&code["enum"]),
        };
        assert!(!codes.is_empty(), "{name}: no code");
        for c in codes {
            let known = ErrorCode::ALL
                .iter()
                .find(|k| k.as_str() == c)
                .unwrap_or_else(|| panic!("{name}: unknown code {c}"));
            assert_eq!(u64::from(known.status()), status, "{name}: {c}");
        }
        checked += 1;
    }
    assert!(checked >= 7, "only {checked} problem schemas found");
}

/// The schemes a route's `Access` admits, as the document names them.
fn schemes_of(access: Access) -> BTreeSet<&'static str> {
    let names: &[&str] = match access {
        Access::Public => &[],
        Access::Operator => &["operatorToken"],
        Access::Origin => &["originToken"],
        Access::Project => &["apiKey", "portalSession"],
        Access::Reader => &["apiKey", "portalSession", "operatorToken"],
        Access::Key => &["apiKey"],
    };
    names.iter().copied().collect()
}

#[test]
fn every_route_needs_the_credential_the_document_names() {
    // The router authenticates from `Route::access` before any handler runs: a route without
    // a requirement cannot be added without the document (and this test) saying so.
    let doc = read_document().expect("the API document");
    for (method, path) in documented(&doc) {
        let concrete: String = path
            .split('/')
            .map(|s| if s.starts_with('{') { "x_1" } else { s })
            .collect::<Vec<_>>()
            .join("/");
        let route = resolve(&method, &concrete).expect("routed");
        let security = doc["paths"][&path][method.to_ascii_lowercase()]["security"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let named: BTreeSet<&str> = security
            .iter()
            .flat_map(|r| r.as_object().into_iter().flat_map(|o| o.keys()))
            .map(String::as_str)
            .collect();
        assert_eq!(
            named,
            schemes_of(route.access()),
            "{method} {path}: the document's security and the route's access differ"
        );
    }
}

#[test]
fn every_operation_reads_exactly_the_query_parameters_the_document_names() {
    // The router refuses any other parameter with 400 (`Route::query_params`), so the
    // document's list is the whole truth, for every endpoint alike.
    let doc = read_document().expect("the API document");
    let shared = &doc["components"]["parameters"];
    for (method, path) in documented(&doc) {
        let item = &doc["paths"][&path];
        let op = &item[method.to_ascii_lowercase()];
        let params = item["parameters"]
            .as_array()
            .into_iter()
            .chain(op["parameters"].as_array())
            .flatten();
        let mut documented_names: Vec<String> = params
            .map(|p| match p["$ref"].as_str() {
                Some(r) => &shared[r.rsplit('/').next().unwrap_or_default()],
                None => p,
            })
            .filter(|p| p["in"] == "query")
            .filter_map(|p| p["name"].as_str().map(str::to_string))
            .collect();
        documented_names.sort();
        let concrete: String = path
            .split('/')
            .map(|s| if s.starts_with('{') { "x_1" } else { s })
            .collect::<Vec<_>>()
            .join("/");
        let route = resolve(&method, &concrete).expect("routed");
        let mut read: Vec<String> = route
            .query_params()
            .unwrap_or_default()
            .iter()
            .map(|s| s.to_string())
            .collect();
        read.sort();
        assert_eq!(read, documented_names, "{method} {path}");
    }
}
