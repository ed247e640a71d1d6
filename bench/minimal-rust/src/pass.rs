//! The Rust pure pass-through: bench/passthrough.mjs's PASS_THROUGH in the plain `worker`
//! crate style, so Rust ÷ JS pass-through is the runtime's fixed Rust tax per request.

use worker::{event, Context, Env, Fetch, Headers, Request, RequestInit, Response, Result};

#[event(fetch)]
async fn fetch(req: Request, env: Env, _ctx: Context) -> Result<Response> {
    let url = req.url()?;
    let target = format!(
        "{}{}{}",
        env.var("ORIGIN_URL")?,
        url.path(),
        url.query().map(|q| format!("?{q}")).unwrap_or_default()
    );
    let mut init = RequestInit::new();
    // The client's Headers object itself, as the JS pass-through hands `req.headers` to fetch.
    init.with_method(req.method())
        .with_headers(Headers(req.inner().headers()));
    if let Some(body) = req.inner().body() {
        init.with_body(Some(body.into()));
    }
    Fetch::Request(Request::new_with_init(&target, &init)?)
        .send()
        .await
}
