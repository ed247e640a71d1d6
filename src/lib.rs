//! The worker shell: the only code that imports `worker`. Every decision is
//! made in `postguard-core`; this crate reads the clock, draws randomness,
//! talks to KV, D1, the Durable Object and the origin, and renders responses.

mod admin;
mod audit;
mod auth;
mod bindings;
mod cron;
mod durable;
mod http;
mod pipeline;
mod reject;
mod request;
mod runtime;
mod webhooks;

pub use durable::key_guard::KeyGuard;

use postguard_core::Problem;
use worker::{
    event, Context, Env, MessageBatch, Request, Response, Result, ScheduleContext, ScheduledEvent,
};

use reject::Handled;

/// Every request: load the configuration, dispatch to the gateway's own
/// endpoints or the proxy pipeline, render a rejection, then record the audit
/// row after the response. No error escapes as a bare 500.
#[event(fetch)]
async fn fetch(req: Request, env: Env, ctx: Context) -> Result<Response> {
    let rc = runtime::RequestCtx::new();
    let cfg = match runtime::config(&env) {
        Ok(cfg) => cfg,
        Err(e) => return reject::render(&rc, Err(runtime::config_problem(&e).into())),
    };
    let seen = audit::Seen::of(&req);
    let resp = reject::render(&rc, handle(req, &env, &cfg, &rc).await)?;
    if cfg.settings.audit.enabled {
        audit::record(&env, &ctx, audit::row(seen, &rc, resp.status_code()));
    }
    Ok(resp)
}

async fn handle(
    req: Request,
    env: &Env,
    cfg: &postguard_core::config::Config,
    rc: &runtime::RequestCtx,
) -> Handled {
    // The body limit applies to every request; a declared length is refused
    // before anything else runs (chunked bodies are checked once read).
    if http::content_length(&req).is_some_and(|len| len > cfg.settings.max_body_bytes) {
        return Err(Problem::payload_too_large(cfg.settings.max_body_bytes).into());
    }
    if req.path().starts_with(postguard_core::routes::PREFIX) {
        admin::route(req, env, cfg, rc).await
    } else {
        pipeline::proxy(req, env, cfg, rc).await
    }
}

/// Webhook delivery attempts (and the dead-letter queue).
#[event(queue)]
async fn queue(batch: MessageBatch<serde_json::Value>, env: Env, _ctx: Context) -> Result<()> {
    match runtime::config(&env) {
        Ok(cfg) => webhooks::consumer::handle(batch, &env, &cfg).await,
        Err(e) => {
            // Not acknowledged: the queue retries once the configuration is fixed.
            worker::console_error!("deliveries paused: configuration invalid: {}", e);
            batch.retry_all();
            Ok(())
        }
    }
}

/// Cron: the scheduled jobs (`cron.rs`).
#[event(scheduled)]
async fn scheduled(_event: ScheduledEvent, env: Env, _ctx: ScheduleContext) {
    match runtime::config(&env) {
        Ok(cfg) => cron::run(&env, &cfg).await,
        Err(e) => worker::console_error!("scheduled jobs skipped: configuration invalid: {}", e),
    }
}
