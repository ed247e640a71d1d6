//! `GET /_postguard/v1/openapi.json`: the OpenAPI 3.1 document of every
//! gateway endpoint, embedded at build time from `openapi/openapi.json`
//! (minified by `build.rs`). Unauthenticated: it describes the API and holds
//! no secret (ADR 0011).

use crate::http;
use crate::reject::Handled;
use crate::runtime::RequestCtx;

const DOCUMENT: &str = include_str!(concat!(env!("OUT_DIR"), "/openapi.min.json"));

pub fn get(rc: &RequestCtx) -> Handled {
    let headers = [
        ("Content-Type", "application/json".to_string()),
        // Changes only with a deployment; a short public cache is safe.
        ("Cache-Control", "public, max-age=300".to_string()),
    ];
    Ok(http::respond(
        rc,
        200,
        &[],
        &headers,
        Some(DOCUMENT.as_bytes().to_vec()),
    )?)
}
