//! The worker shell: the only code that imports `worker`. Every decision is
//! made in `postguard-core`; this crate reads the clock, draws randomness,
//! talks to KV, the Durable Object and the origin, and renders responses.

mod admin;
mod auth;
mod bindings;
mod durable;
mod guard_client;
mod http;
mod pipeline;
mod runtime;

pub use durable::key_guard::KeyGuard;

use worker::{event, Context, Env, Request, Response, Result};

/// Every request: load the configuration, then dispatch to the gateway's own
/// endpoints or the proxy pipeline. No error escapes as a bare 500.
#[event(fetch)]
async fn fetch(req: Request, env: Env, _ctx: Context) -> Result<Response> {
    let rc = runtime::RequestCtx::new();
    let cfg = match runtime::config(&env) {
        Ok(cfg) => cfg,
        Err(e) => return http::problem(&rc, &runtime::config_problem(&e), &[]),
    };
    // The body limit applies to every request; a declared length is refused
    // before anything else runs (chunked bodies are checked once read).
    if http::content_length(&req).is_some_and(|len| len > cfg.settings.max_body_bytes) {
        return http::problem(
            &rc,
            &postguard_core::Problem::payload_too_large(cfg.settings.max_body_bytes),
            &[],
        );
    }
    let outcome = if req.path().starts_with(admin::PREFIX) {
        admin::route(req, &env, &cfg, &rc).await
    } else {
        pipeline::proxy(req, &env, &cfg, &rc).await
    };
    match outcome {
        Ok(resp) => Ok(resp),
        Err(e) => {
            worker::console_error!("{} internal error: {}", rc.request_id, e);
            http::problem(
                &rc,
                &postguard_core::Problem::new(
                    postguard_core::ErrorCode::Internal,
                    "the gateway failed to handle this request; it is safe to retry with the same Idempotency-Key",
                ),
                &[],
            )
        }
    }
}
