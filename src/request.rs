//! Reading a gateway request: query parameters and a bounded body. Shared by
//! every endpoint family (keys, audit, webhooks), so none imports another.

use postguard_core::body::{self, Budget, Declared};
use postguard_core::config::Config;
use postguard_core::Problem;
use worker::Request;

use crate::http;
use crate::reject::Handled;

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
/// at most `max` plus one chunk is ever held.
pub async fn read_bounded(req: &mut Request, max: u64) -> Handled<Body> {
    use futures_util::StreamExt;
    match body::declared(http::content_length(req), max) {
        Declared::TooLarge => return Ok(Body::TooLarge),
        Declared::Fits => return Ok(Body::Read(req.bytes().await?)),
        Declared::Unknown => {}
    }
    if req.inner().body().is_none() {
        return Ok(Body::Read(Vec::new()));
    }
    let mut stream = req.stream()?;
    let mut budget = Budget::new(max);
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        if budget.take(chunk.len()).is_err() {
            return Ok(Body::TooLarge);
        }
        out.extend_from_slice(&chunk);
    }
    Ok(Body::Read(out))
}

/// The body of a gateway endpoint's request (read after its
/// authentication), refused with 413 when over `max_body_bytes`.
pub async fn body(req: &mut Request, cfg: &Config) -> Handled<Vec<u8>> {
    let max = cfg.settings.max_body_bytes;
    match read_bounded(req, max).await? {
        Body::Read(b) => Ok(b),
        Body::TooLarge => Err(Problem::payload_too_large(max).into()),
    }
}
