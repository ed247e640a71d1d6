//! Reading a gateway request: query parameters and a bounded body. Shared by
//! every endpoint family (keys, audit, webhooks), so none imports another.

use postguard_core::body::{self, Budget, Declared};
use worker::js_sys::{Reflect, Uint8Array};
use worker::wasm_bindgen::{JsCast, JsValue};
use worker::wasm_bindgen_futures::JsFuture;
use worker::{web_sys, Request};

use crate::reject::Handled;
use crate::streams;

/// Every query parameter, in order.
pub fn query_pairs(req: &Request) -> Handled<Vec<(String, String)>> {
    Ok(req
        .url()?
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect())
}

/// The first value of query parameter `name`.
pub fn query_param(req: &Request, name: &str) -> Handled<Option<String>> {
    Ok(req
        .url()?
        .query_pairs()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned()))
}

/// A request body read under the limit.
pub enum Body {
    Read(Vec<u8>),
    /// Over `max` (declared, or crossed while reading): not read further.
    TooLarge,
}

/// The one bounded reader of request bodies. A declared length over `max`
/// is refused without reading; a declared length within it is read in one
/// `arrayBuffer()` call (the runtime enforces the framing); a chunked body is
/// read chunk by chunk and dropped at the first chunk that crosses `max`, so
/// at most `max` plus one chunk is ever held. What is left of a refused
/// body is read and dropped before the 413 is answered (`streams::linger`,
/// bounded), so a client still uploading reads it.
pub async fn read_bounded(
    req: &web_sys::Request,
    declared: Option<u64>,
    max: u64,
) -> Handled<Body> {
    match body::declared(declared, max) {
        Declared::TooLarge => {
            if let Some(stream) = req.body() {
                let _ = JsFuture::from(streams::linger(&stream)).await;
            }
            return Ok(Body::TooLarge);
        }
        Declared::Fits => {
            let buf = JsFuture::from(req.array_buffer()?).await?;
            return Ok(Body::Read(Uint8Array::new(&buf).to_vec()));
        }
        Declared::Unknown => {}
    }
    let Some(stream) = req.body() else {
        return Ok(Body::Read(Vec::new()));
    };
    let reader: web_sys::ReadableStreamDefaultReader = stream
        .get_reader()
        .dyn_into()
        .map_err(|_| worker::Error::RustError("no default reader".into()))?;
    let mut budget = Budget::new(max);
    let mut out = Vec::new();
    loop {
        let chunk = JsFuture::from(reader.read()).await?;
        if Reflect::get(&chunk, &JsValue::from_str("done"))?
            .as_bool()
            .unwrap_or(true)
        {
            return Ok(Body::Read(out));
        }
        let bytes = Uint8Array::new(&Reflect::get(&chunk, &JsValue::from_str("value"))?);
        if budget.take(bytes.length() as usize).is_err() {
            let _ = JsFuture::from(streams::linger(&reader)).await;
            return Ok(Body::TooLarge);
        }
        out.extend_from_slice(&bytes.to_vec());
    }
}
