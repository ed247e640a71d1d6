//! Durable Object classes and their callers: each object loads its state,
//! asks the core to decide and persists the decision; the caller side speaks
//! the same typed protocol (`postguard_core::guard::protocol`).

use worker::wasm_bindgen::{JsCast, JsValue};

pub mod audit_shard;
pub mod client;
pub mod key_guard;
pub mod project_hub;
pub mod webhook_shard;

/// The core's query arguments as SQLite values of an object's storage.
pub fn sql_args(args: Vec<postguard_core::audit::Arg>) -> Vec<worker::SqlStorageValue> {
    use postguard_core::audit::Arg;
    args.into_iter()
        .map(|a| match a {
            Arg::Text(s) => worker::SqlStorageValue::String(s),
            Arg::Int(i) => worker::SqlStorageValue::Integer(i),
        })
        .collect()
}

#[wasm_bindgen::prelude::wasm_bindgen]
extern "C" {
    /// A stub of an object whose JS class (`src/entry.mjs`) offers `run(op,
    /// body)` by RPC with JSON on both sides (`WebhookShard`, `ProjectHub`).
    type JsonStub;
    #[wasm_bindgen(method, catch)]
    fn run(this: &JsonStub, op: &str, body: &str) -> Result<JsValue, JsValue>;
}

/// The JS RPC entry of an object class whose operations answer JSON
/// (`dispatch(path, body)`): `rpc(op, body)`, which its class in
/// `src/entry.mjs` calls from `run` — no Request, Response or body stream on
/// either side (ADRs 0018, 0035). A failure rejects with the error's text
/// (a transaction rolled back).
#[rustfmt::skip] // rustfmt re-indents the attribute's arguments on every run
macro_rules! json_rpc {
    ($class:ident) => {
        #[wasm_bindgen::prelude::wasm_bindgen(
            wasm_bindgen = ::worker::wasm_bindgen,
            wasm_bindgen_futures = ::worker::wasm_bindgen_futures,
            js_sys = ::worker::js_sys
        )]
        impl $class {
            /// Operation `op` (an `Operation::PATH`) on a JSON request.
            pub async fn rpc(
                &self,
                op: String,
                body: String,
            ) -> std::result::Result<String, wasm_bindgen::JsValue> {
                self.dispatch(&op, body.as_bytes())
                    .await
                    .map_err(|e| wasm_bindgen::JsValue::from_str(&e.to_string()))
            }
        }
    };
}
pub(crate) use json_rpc;

/// The HTTP answer of such an object's operation (`POST https://<object>/<op>`:
/// tests and operators through the runtime's Durable Object API): the JSON,
/// or the error's text as a 500.
pub fn http_answer(answer: worker::Result<String>) -> worker::Result<worker::Response> {
    match answer {
        Ok(text) => worker::Response::ok(text),
        Err(e) => Ok(worker::Response::error(e.to_string(), 500)?),
    }
}

/// Operation `O` on the object `name` of `ns` by JS RPC (JSON both ways);
/// `what` names the object kind in errors.
pub async fn call_json<O: postguard_core::webhooks::protocol::Operation>(
    ns: &worker::ObjectNamespace,
    name: &str,
    what: &str,
    req: &O::Request,
) -> worker::Result<O::Response> {
    let stub: JsonStub = ns.id_from_name(name)?.get_stub()?.into_rpc::<JsonStub>();
    let body = serde_json::to_string(req).map_err(err)?;
    let path = O::PATH;
    let pending = stub.run(path, &body).map_err(worker::Error::from)?;
    // An RPC call answers a thenable, not necessarily a `Promise`.
    let answer =
        worker::wasm_bindgen_futures::JsFuture::from(worker::js_sys::Promise::resolve(&pending))
            .await
            .map_err(|e| {
                err(format!(
                    "{what} {path}: {}",
                    e.as_string().unwrap_or_else(|| format!("{e:?}"))
                ))
            })?;
    let text = answer
        .as_string()
        .ok_or_else(|| err(format!("{what} {path} answered no text")))?;
    serde_json::from_str(&text).map_err(err)
}

#[wasm_bindgen::prelude::wasm_bindgen]
extern "C" {
    /// An object's `DurableObjectStorage`, for the one method `worker` lacks.
    type TxStorage;
    #[wasm_bindgen(method, catch, js_name = transactionSync)]
    fn transaction_sync(
        this: &TxStorage,
        f: &mut dyn FnMut() -> Result<JsValue, JsValue>,
    ) -> Result<JsValue, JsValue>;
}

/// A failure inside an object (its storage, an answer's encoding) as the
/// worker's error, which the caller's typed call maps to a 500 problem.
pub fn err(e: impl std::fmt::Display) -> worker::Error {
    worker::Error::RustError(e.to_string())
}

/// A typed answer as the call carries it (JSON).
pub fn encode<T: serde::Serialize>(answer: &T) -> worker::Result<String> {
    serde_json::to_string(answer).map_err(err)
}

/// Runs `f` inside the object's `transactionSync`: every write it makes
/// commits together, or none does when it fails (throwing is what makes the
/// runtime roll back). `storage_error` names a failure of the runtime itself.
pub fn atomically<T, E>(
    storage: &worker::Storage,
    f: impl FnOnce() -> Result<T, E>,
    storage_error: impl Fn(String) -> E,
) -> Result<T, E> {
    let mut f = Some(f);
    let mut out: Option<Result<T, E>> = None;
    let tx: &TxStorage = storage.as_raw().unchecked_ref();
    let ran = tx.transaction_sync(&mut || {
        let r = match f.take() {
            Some(f) => f(),
            None => Err(storage_error("transaction callback ran twice".into())),
        };
        let failed = r.is_err();
        out = Some(r);
        match failed {
            true => Err(JsValue::from_str("rolled back")),
            false => Ok(JsValue::UNDEFINED),
        }
    });
    match (ran, out) {
        (Ok(_), Some(r)) | (Err(_), Some(r @ Err(_))) => r,
        (Err(e), _) => Err(storage_error(
            e.as_string().unwrap_or_else(|| format!("{e:?}")),
        )),
        (Ok(_), None) => Err(storage_error("transaction did not run".into())),
    }
}
