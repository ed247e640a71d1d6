//! Reading a gateway request: query parameters and a bounded body. Shared by
//! every endpoint family (keys, audit, webhooks), so none imports another.

use postguard_core::config::Config;
use postguard_core::Problem;
use worker::Request;

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

/// The body, refused with 413 when over `max_body_bytes` (a declared length
/// over it was already refused before routing; this catches chunked bodies).
pub async fn body(req: &mut Request, cfg: &Config) -> Handled<Vec<u8>> {
    let body = req.bytes().await?;
    let max = cfg.settings.max_body_bytes;
    if body.len() as u64 > max {
        return Err(Problem::payload_too_large(max).into());
    }
    Ok(body)
}
