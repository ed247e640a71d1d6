//! Values bound to D1 statements (`?` placeholders), shared by the audit log
//! and the webhook tables.

use serde::de::DeserializeOwned;
use worker::wasm_bindgen::JsValue;
use worker::D1Database;

pub fn text(s: &str) -> JsValue {
    JsValue::from_str(s)
}

pub fn opt_text(s: Option<&str>) -> JsValue {
    s.map_or(JsValue::NULL, JsValue::from_str)
}

/// D1 numbers are doubles; every integer stored here is below 2^53.
pub fn num(v: u64) -> JsValue {
    JsValue::from_f64(v as f64)
}

/// The core's query arguments as D1 values.
pub fn args(args: &[postguard_core::audit::Arg]) -> Vec<JsValue> {
    use postguard_core::audit::Arg;
    args.iter()
        .map(|a| match a {
            Arg::Text(s) => text(s),
            Arg::Int(i) => JsValue::from_f64(*i as f64),
        })
        .collect()
}

/// Every row of one query.
pub async fn all<T: DeserializeOwned>(
    db: &D1Database,
    sql: impl Into<String>,
    args: &[JsValue],
) -> worker::Result<Vec<T>> {
    db.prepare(sql).bind(args)?.all().await?.results()
}
