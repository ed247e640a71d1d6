//! Calls from the worker to a key's `KeyGuard` Durable Object. Each call is
//! one round trip carrying a frame (JSON header + raw bytes).

use postguard_core::frame;
use serde::{de::DeserializeOwned, Serialize};
use worker::{wasm_bindgen::JsValue, Env, Result};

use crate::{bindings, http};

/// The operations the object serves.
#[derive(Clone, Copy)]
pub enum Op {
    Admit,
    Complete,
    Release,
    Revoke,
}

impl Op {
    pub fn path(self) -> &'static str {
        match self {
            Op::Admit => "/admit",
            Op::Complete => "/complete",
            Op::Release => "/release",
            Op::Revoke => "/revoke",
        }
    }
}

pub async fn call<M: Serialize, R: DeserializeOwned>(
    env: &Env,
    key_id: &str,
    op: Op,
    meta: &M,
    payload: &[u8],
) -> Result<(R, Vec<u8>)> {
    let ns = env.durable_object(bindings::KEY_GUARD)?;
    let stub: JsValue = ns.id_from_name(key_id)?.get_stub()?.into_rpc();
    let body = frame::encode(meta, payload).map_err(|e| worker::Error::RustError(e.to_string()))?;
    let init = http::request_init("POST", &body);
    let resp = http::raw_fetch(&stub, &format!("https://key-guard{}", op.path()), &init).await?;
    let status = resp.status();
    let bytes = http::read_body(&resp).await?;
    if status != 200 {
        return Err(worker::Error::RustError(format!(
            "key guard {} answered {}: {}",
            op.path(),
            status,
            String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
        )));
    }
    frame::decode(bytes).map_err(|e| worker::Error::RustError(e.to_string()))
}
