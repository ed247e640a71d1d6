//! The API document (`openapi/openapi.json`) against the code: the published
//! error codes are exactly `ErrorCode::ALL`, in order, and every problem
//! response names only codes that exist with the status they really have.

use postguard_core::ErrorCode;
use serde_json::Value;

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
