//! `GET /_postguard/v1/openapi.json`: the OpenAPI 3.1 document of every
//! gateway endpoint. `scripts/openapi-asset.mjs` writes it minified from
//! `openapi/openapi.json` into the static assets; the worker reads it through
//! the assets binding and answers it itself, so the answer keeps its
//! `X-Request-Id`, CORS and audit row while the wasm does not carry ~11 KB
//! gzip of text (ADR 0030, superseding ADR 0011's embedding).
//! Unauthenticated: it describes the API and holds no secret (ADR 0011).

use worker::wasm_bindgen::JsValue;

use crate::bindings;
use crate::handler::Ctx;
use crate::http;
use crate::reject::{Handled, Reject};

/// Where the build puts the document in the assets; `wrangler.toml`'s
/// `run_worker_first` sends this same public path to the worker, so the
/// assets layer never answers it on its own.
const ASSET_URL: &str = "https://assets.invalid/_postguard/v1/openapi.json";

pub async fn get(cx: &Ctx<'_>) -> Handled {
    let assets: JsValue = cx.env.assets(bindings::ASSETS)?.into_rpc();
    let resp = http::raw_fetch(&assets, ASSET_URL, &http::request_init("GET", &[])).await?;
    if resp.status() != 200 {
        // A deployment without the file (scripts/build.sh writes it): the
        // worker's fault, never the client's.
        return Err(Reject::Internal(worker::Error::RustError(format!(
            "openapi asset answered {}",
            resp.status()
        ))));
    }
    let document = http::read_body(&resp).await?;
    let headers = [
        ("Content-Type", "application/json".to_string()),
        // Changes only with a deployment; a short public cache is safe.
        ("Cache-Control", "public, max-age=300".to_string()),
    ];
    Ok(http::respond(cx.rc, 200, &[], &headers, Some(document))?)
}
