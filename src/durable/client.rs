//! Calls from the worker to a key's `KeyGuard` Durable Object. Each call is
//! one round trip carrying a frame (JSON header + raw bytes); the operation's
//! path and types come from `postguard_core::guard::Operation`, and the
//! object's errors come back as a typed `GuardError`.

use postguard_core::frame;
use postguard_core::guard::{GuardError, Operation, Reply};
use worker::{wasm_bindgen::JsValue, Env};

use crate::{bindings, http};

/// A call that failed: the round trip itself, or the object's answer.
#[derive(Debug)]
pub enum CallError {
    Transport(worker::Error),
    Guard(GuardError),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Transport(e) => write!(f, "key guard unreachable: {e}"),
            CallError::Guard(e) => write!(f, "key guard: {e}"),
        }
    }
}

impl From<worker::Error> for CallError {
    fn from(e: worker::Error) -> Self {
        CallError::Transport(e)
    }
}

impl From<frame::FrameError> for CallError {
    fn from(e: frame::FrameError) -> Self {
        CallError::Transport(worker::Error::RustError(e.to_string()))
    }
}

/// Runs operation `O` on the object of API key `key_id`: its answer and the
/// payload that came with it.
pub async fn call<O: Operation>(
    env: &Env,
    key_id: &str,
    req: &O::Request,
    payload: &[u8],
) -> Result<(O::Response, Vec<u8>), CallError> {
    let ns = env.durable_object(bindings::KEY_GUARD)?;
    let stub: JsValue = ns.id_from_name(key_id)?.get_stub()?.into_rpc();
    let body = frame::encode(req, payload)?;
    let init = http::request_init("POST", &body);
    let resp = http::raw_fetch(&stub, &format!("https://key-guard{}", O::PATH), &init).await?;
    let bytes = http::read_body(&resp).await?;
    if resp.status() != 200 {
        // Not an answer of the object's code (the runtime failed the call).
        let shown = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
        let e = format!("{} answered {}: {shown}", O::PATH, resp.status());
        return Err(CallError::Transport(worker::Error::RustError(e)));
    }
    let (reply, payload): (Reply<O::Response>, Vec<u8>) = frame::decode(bytes)?;
    reply.map(|r| (r, payload)).map_err(CallError::Guard)
}
