//! Embeds the API document (`openapi/openapi.json`, the one source of truth)
//! minified: the worker serves it at `GET /_postguard/v1/openapi.json`, and
//! whitespace would only add to the wasm. Parsing here also makes an invalid
//! document a build error rather than a broken endpoint (ADR 0011).

use std::error::Error;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn Error>> {
    let source = "openapi/openapi.json";
    println!("cargo:rerun-if-changed={source}");
    let text = std::fs::read_to_string(source)?;
    let doc: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{source}: {e}"))?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("openapi.min.json");
    std::fs::write(out, serde_json::to_string(&doc)?)?;
    Ok(())
}
