//! The worker shell: the only code that imports `worker`. Every decision is
//! made in `postguard-core`; this crate reads the clock, draws randomness,
//! talks to KV, D1, the Durable Object and the origin, and renders responses.

mod admin;
mod alerts;
mod archive;
mod audit;
mod auth;
mod bindings;
mod cron;
mod d1;
mod durable;
mod edge;
mod handler;
mod http;
mod ip_limit;
mod keystore;
mod log;
mod metrics;
mod operations;
mod pipeline;
mod queue;
mod reject;
mod replays;
mod request;
mod runtime;
mod seal;
mod streams;
mod verify;
mod webhooks;

pub use durable::audit_shard::AuditShard;
pub use durable::key_guard::KeyGuard;
pub use durable::project_hub::ProjectHub;
pub use durable::webhook_shard::WebhookShard;

use postguard_core::log::Line;
use postguard_core::{routes, Problem};

use worker::{
    event, web_sys, Context, Env, MessageBatch, Response, Result, ScheduleContext, ScheduledEvent,
};

use reject::Handled;

/// Every request: load the configuration, read its path once
/// (`routes::canonical`), dispatch to the gateway's own endpoints or the
/// proxy pipeline, count a refused credential against the sender's address,
/// render a rejection, then record the audit row after the response. No
/// error escapes as a bare 500. The handler takes the runtime's request as it
/// is (`http::Client`): the `worker::Request` wrapper reads the request's
/// `cf` object, which the proxy never uses; only the gateway's own endpoints
/// get one.
#[event(fetch)]
async fn fetch(raw: web_sys::Request, env: Env, ctx: Context) -> Result<Response> {
    let req = http::Client::of(raw);
    let mut rc = runtime::RequestCtx::new();
    rc.origin = req.header("Origin").map(str::to_owned);
    rc.client_ip = req.header("CF-Connecting-IP").map(str::to_owned);
    let cfg = match runtime::config(&env) {
        Ok(cfg) => cfg,
        Err(e) => return reject::render(&rc, Err(Problem::config_invalid(&e).into())),
    };
    rc.cors = cfg.settings.cors.clone();
    let path = routes::canonical(&req.path);
    let seen = audit::Seen::of(&req, &path);
    let route = match path.gateway {
        true => "",
        false => cfg.settings.route_label(&req.method, &path.path),
    }
    .to_string();
    let method = req.method.clone();
    let outcome = handle(req, &path, &env, &cfg, &rc, &ctx).await;
    let outcome = count_refused(outcome, &env, &cfg, &rc).await;
    let resp = reject::render(&rc, outcome)?;
    metrics::request(&env, &rc, path.gateway, &method, &route, resp.status_code());
    if cfg.settings.audit.enabled {
        let bucket_ms = cfg.settings.audit.bucket_ms;
        if let Some(import) = audit::key_import_row(&rc, &seen) {
            audit::record(&env, &ctx, bucket_ms, import);
        }
        audit::record(
            &env,
            &ctx,
            bucket_ms,
            audit::row(seen, &rc, resp.status_code()),
        );
    }
    Ok(resp)
}

async fn handle(
    req: http::Client,
    path: &routes::Canonical,
    env: &Env,
    cfg: &postguard_core::config::Config,
    rc: &runtime::RequestCtx,
    ctx: &Context,
) -> Handled {
    // The body limit is applied by the bounded reader after authentication
    // (request::read_bounded), so a 413 carries the rate-limit headers.
    if is_preflight(&req) {
        // Counted before anything is sent: a flood of preflights never
        // reaches the origin.
        ip_limit::charge(env, cfg, rc).await?;
        return preflight(&req, cfg, rc, path.gateway).await;
    }
    if path.gateway {
        admin::route(req, &path.path, env, cfg, rc).await
    } else {
        pipeline::proxy(req, env, cfg, rc, ctx).await
    }
}

/// A refused credential (401) counts against the sender's address; past the
/// limit on requests without a valid credential, the answer is 429.
async fn count_refused(
    outcome: Handled,
    env: &Env,
    cfg: &postguard_core::config::Config,
    rc: &runtime::RequestCtx,
) -> Handled {
    if ip_limit::counts(&outcome, rc) {
        ip_limit::charge(env, cfg, rc).await?;
    }
    outcome
}

/// A CORS preflight (`OPTIONS` + `Origin` + `Access-Control-Request-Method`,
/// no `Authorization`): never authenticated nor charged to a key.
fn is_preflight(req: &http::Client) -> bool {
    let has = |n: &str| req.header(n).is_some();
    req.method.eq_ignore_ascii_case("OPTIONS")
        && has("Origin")
        && has("Access-Control-Request-Method")
        && !has("Authorization")
}

/// Answered from the `cors` configuration when there is one (and always for
/// the gateway's own endpoints, with the permissive default: they
/// authenticate by bearer header, never cookies); otherwise forwarded.
async fn preflight(
    req: &http::Client,
    cfg: &postguard_core::config::Config,
    rc: &runtime::RequestCtx,
    gateway_path: bool,
) -> Handled {
    use postguard_core::cors;
    let own = match (&cfg.settings.cors, gateway_path) {
        (Some(c), _) => c.clone(),
        (None, true) => cors::CorsConfig::permissive(),
        (None, false) => return pipeline::preflight_to_origin(req, cfg, rc).await,
    };
    let out = cors::answer_preflight(&own, &req.headers).unwrap_or_default();
    Ok(http::respond(rc, 204, &[], &out, None)?)
}

/// Webhook delivery attempts (and the dead-letter queue), and asynchronous
/// operations (their own queue).
#[event(queue)]
async fn queue(batch: MessageBatch<serde_json::Value>, env: Env, _ctx: Context) -> Result<()> {
    match runtime::config(&env) {
        Ok(cfg) => queue::handle(batch, &env, &cfg).await,
        Err(e) => {
            // Not acknowledged: the queue retries once the configuration is fixed.
            log::emit(Line::error("deliveries paused: configuration invalid").err(e));
            batch.retry_all();
            Ok(())
        }
    }
}

/// Cron: the scheduled jobs (`cron.rs`).
#[event(scheduled)]
async fn scheduled(event: ScheduledEvent, env: Env, _ctx: ScheduleContext) {
    match runtime::config(&env) {
        Ok(cfg) => cron::run(&env, &cfg, &event.cron()).await,
        Err(e) => log::emit(Line::error("scheduled jobs skipped: configuration invalid").err(e)),
    }
}
