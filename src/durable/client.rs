//! Calls from the worker to a key's `KeyGuard` Durable Object. Each call is
//! one round trip carrying a frame (JSON header + raw bytes); the operation's
//! path and types come from `postguard_core::guard::Operation`, and the
//! object's errors come back as a typed `GuardError`.

use postguard_core::frame;
use postguard_core::guard::{GuardError, Operation, Reply};
use wasm_bindgen::prelude::wasm_bindgen;
use worker::js_sys::{Promise, Uint8Array};
use worker::wasm_bindgen::{JsCast, JsValue};
use worker::wasm_bindgen_futures::JsFuture;
use worker::Env;

use crate::bindings;

#[wasm_bindgen]
extern "C" {
    /// A `KeyGuard` stub: `run` is the RPC method of the object's JS class
    /// (`src/entry.mjs`), which hands the frame to `KeyGuard::rpc`.
    #[derive(Clone)]
    type GuardStub;
    #[wasm_bindgen(method, catch)]
    fn run(this: &GuardStub, op: &str, frame: &Uint8Array) -> Result<JsValue, JsValue>;

    /// The worker's `env` object.
    type EnvObject;
    /// Its `KEY_GUARD` binding (`bindings::KEY_GUARD`), read by one getter
    /// call where `Reflect.get` with a key made in wasm is two crossings.
    #[wasm_bindgen(method, getter, js_name = KEY_GUARD)]
    fn key_guard(this: &EnvObject) -> JsValue;

    /// The `KEY_GUARD` namespace binding.
    type GuardNamespace;
    /// The stub of the object named `name`: one call where `idFromName` and
    /// `get` are two.
    #[wasm_bindgen(method, catch, js_name = getByName)]
    fn get_by_name(this: &GuardNamespace, name: &str) -> Result<GuardStub, JsValue>;
}

/// The stub of API key `key_id`'s object.
fn stub(env: &Env, key_id: &str) -> worker::Result<GuardStub> {
    let this: &JsValue = env.as_ref();
    let ns = this.unchecked_ref::<EnvObject>().key_guard();
    if ns.is_undefined() {
        let e = format!("binding {} is missing", bindings::KEY_GUARD);
        return Err(worker::Error::RustError(e));
    }
    Ok(ns.unchecked_into::<GuardNamespace>().get_by_name(key_id)?)
}

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
    Guard::of(env, key_id)?.call::<O>(req, payload).await
}

/// The object of one API key, for the calls of one request (a proxied
/// request under a claim makes two: the stub is made once).
#[derive(Clone)]
pub struct Guard(GuardStub);

impl Guard {
    pub fn of(env: &Env, key_id: &str) -> worker::Result<Guard> {
        stub(env, key_id).map(Guard)
    }

    /// The object itself, as its own alarm holds it (the JS class's `this`,
    /// whose `run` is the same method a stub calls): the shell's outbox runs
    /// the object's operations this way, in the object.
    pub fn itself(object: JsValue) -> Guard {
        Guard(object.unchecked_into())
    }

    /// Runs operation `O`: its answer and the payload that came with it.
    pub async fn call<O: Operation>(
        &self,
        req: &O::Request,
        payload: &[u8],
    ) -> Result<(O::Response, Vec<u8>), CallError> {
        exchange::<O>(&self.0, req, payload).await
    }
}

async fn exchange<O: Operation>(
    stub: &GuardStub,
    req: &O::Request,
    payload: &[u8],
) -> Result<(O::Response, Vec<u8>), CallError> {
    // One copy into a JS array the runtime serializes (never a view of wasm memory).
    let body = Uint8Array::from(frame::encode(req, payload)?.as_slice());
    let pending = stub.run(O::PATH, &body).map_err(worker::Error::from)?;
    // An RPC call answers a thenable, not necessarily a `Promise`.
    let answer = JsFuture::from(Promise::resolve(&pending))
        .await
        .map_err(worker::Error::from)?;
    let bytes = answer
        .dyn_into::<Uint8Array>()
        .map_err(|_| worker::Error::RustError(format!("{} answered no frame", O::PATH)))?
        .to_vec();
    let (reply, payload): (Reply<O::Response>, Vec<u8>) = frame::decode(bytes)?;
    reply.map(|r| (r, payload)).map_err(CallError::Guard)
}
