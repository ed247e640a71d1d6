//! The worker shell: the only code that imports `worker`. Every decision is
//! made in `postguard-core`; this crate reads the clock, draws randomness,
//! talks to KV, D1, the Durable Object and the origin, and renders responses.

mod admin;
mod audit;
mod auth;
mod bindings;
mod durable;
mod guard_client;
mod http;
mod pipeline;
mod runtime;
mod webhooks;

pub use durable::key_guard::KeyGuard;

use postguard_core::{ErrorCode, Problem};
use worker::{
    event, Context, Env, MessageBatch, Request, Response, Result, ScheduleContext, ScheduledEvent,
};

/// Every request: load the configuration, dispatch to the gateway's own
/// endpoints or the proxy pipeline, then record the audit row after the
/// response. No error escapes as a bare 500.
#[event(fetch)]
async fn fetch(req: Request, env: Env, ctx: Context) -> Result<Response> {
    let rc = runtime::RequestCtx::new();
    let cfg = match runtime::config(&env) {
        Ok(cfg) => cfg,
        Err(e) => return http::problem(&rc, &runtime::config_problem(&e), &[]),
    };
    let seen = audit::Seen::of(&req);
    let resp = handle(req, &env, &cfg, &rc).await?;
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
) -> Result<Response> {
    // The body limit applies to every request; a declared length is refused
    // before anything else runs (chunked bodies are checked once read).
    if http::content_length(&req).is_some_and(|len| len > cfg.settings.max_body_bytes) {
        return http::problem(
            rc,
            &Problem::payload_too_large(cfg.settings.max_body_bytes),
            &[],
        );
    }
    let outcome = if req.path().starts_with(admin::PREFIX) {
        admin::route(req, env, cfg, rc).await
    } else {
        pipeline::proxy(req, env, cfg, rc).await
    };
    match outcome {
        Ok(resp) => Ok(resp),
        Err(e) => {
            worker::console_error!("{} internal error: {}", rc.request_id, e);
            http::problem(
                rc,
                &Problem::new(
                    ErrorCode::Internal,
                    "the gateway failed to handle this request; it is safe to retry with the same Idempotency-Key",
                ),
                &[],
            )
        }
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

/// Cron: retention of the audit log and the delivery log, and re-queueing of
/// deliveries whose next attempt is overdue.
#[event(scheduled)]
async fn scheduled(_event: ScheduledEvent, env: Env, _ctx: ScheduleContext) {
    let cfg = match runtime::config(&env) {
        Ok(cfg) => cfg,
        Err(e) => {
            worker::console_error!("scheduled jobs skipped: configuration invalid: {}", e);
            return;
        }
    };
    let days = cfg.settings.retention.audit_days;
    match audit::sweep(&env, days).await {
        Ok(n) => worker::console_log!(
            "audit retention: deleted {} rows older than {} days",
            n,
            days
        ),
        Err(e) => worker::console_error!("audit retention failed: {}", e),
    }
    if let Err(e) = webhooks::consumer::sweep(&env, cfg.settings.retention.deliveries_days).await {
        worker::console_error!("delivery retention failed: {}", e);
    }
    match webhooks::consumer::requeue_stuck(&env, cfg.settings.webhooks.requeue_after_s).await {
        Ok(0) => {}
        Ok(n) => worker::console_warn!("re-queued {} overdue deliveries", n),
        Err(e) => worker::console_error!("re-queueing overdue deliveries failed: {}", e),
    }
}
