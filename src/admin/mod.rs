//! The gateway's own endpoints under `/_postguard/v1/`: the operation is
//! resolved in the core (`postguard_core::routes`), dispatched here.

mod audit;
mod keys;
mod me;
mod openapi;
pub(crate) mod portal;

use postguard_core::config::Config;
use postguard_core::routes::{resolve, Route};
use worker::{Env, Request};

use crate::reject::{Handled, Reject};
use crate::runtime::RequestCtx;
use crate::webhooks::{deliveries, feed, inspectors, ops, publish, subscriptions};

pub async fn route(req: Request, env: &Env, cfg: &Config, rc: &RequestCtx) -> Handled {
    let method = req.inner().method().to_ascii_uppercase();
    let path = req.path();
    let route = resolve(&method, &path).map_err(|e| {
        let rejected = Reject::from(e.problem(&method, &path));
        // The dashboard's files are static assets served before the worker
        // runs; a path under it that reaches the worker names no file.
        if path.starts_with(DASHBOARD) {
            rejected.with(&dashboard_headers())
        } else {
            rejected
        }
    })?;
    match route {
        Route::KeysCreate => keys::create(req, env, cfg, rc).await,
        Route::KeysList => keys::list(&req, env, cfg, rc).await,
        Route::KeyGet { id } => keys::get(&req, env, cfg, rc, &id).await,
        Route::KeyRevoke { id } => keys::revoke(&req, env, cfg, rc, &id).await,
        Route::WebhooksCreate => subscriptions::create(req, env, cfg, rc).await,
        Route::WebhooksList => subscriptions::list(&req, env, cfg, rc).await,
        Route::WebhookGet { id } => subscriptions::get(&req, env, cfg, rc, &id).await,
        Route::WebhookDelete { id } => subscriptions::delete(&req, env, cfg, rc, &id).await,
        Route::WebhookRotateSecret { id } => subscriptions::rotate(&req, env, cfg, rc, &id).await,
        Route::WebhookPatch { id } => subscriptions::patch(req, env, cfg, rc, &id).await,
        Route::WebhookPause { id } => subscriptions::pause(&req, env, cfg, rc, &id).await,
        Route::WebhookResume { id } => subscriptions::resume(&req, env, cfg, rc, &id).await,
        Route::WebhookTest { id } => ops::test(&req, env, cfg, rc, &id).await,
        Route::WebhookRecover { id } => ops::recover(req, env, cfg, rc, &id).await,
        Route::TaskGet { id } => ops::get_task(&req, env, cfg, rc, &id).await,
        Route::EventsPublish => publish::publish(req, env, cfg, rc).await,
        Route::EventsFeed => feed::list(&req, env, cfg, rc).await,
        Route::InspectorsCreate => inspectors::create(&req, env, cfg, rc).await,
        Route::InspectorRequests { id } => inspectors::requests(&req, env, cfg, rc, &id).await,
        Route::InspectCapture { token } => inspectors::capture(req, env, cfg, rc, &token).await,
        Route::DeliveriesList => Ok(deliveries::list(&req, env, cfg, rc).await?),
        Route::DeliveryGet { id } => Ok(deliveries::get(&req, env, cfg, rc, &id).await?),
        Route::DeliveryRetry { id } => Ok(deliveries::retry(&req, env, cfg, rc, &id).await?),
        Route::DeliveryRedirect { id } => Ok(deliveries::redirect(req, env, cfg, rc, &id).await?),
        Route::AuditList => audit::list(&req, env, cfg, rc).await,
        Route::Stats => audit::stats(&req, env, cfg, rc).await,
        Route::Me => me::get(&req, env, cfg, rc).await,
        Route::PortalLinksCreate => portal::create_link(req, env, cfg, rc).await,
        Route::PortalSessionsCreate => portal::create_session(req, env, cfg, rc).await,
        Route::OpenApiDocument => openapi::get(env, rc).await,
    }
}

const DASHBOARD: &str = "/_postguard/dashboard/";

/// Headers of the worker's own answers under `/_postguard/dashboard/` (the
/// files themselves get theirs from `dashboard/dist/_headers`).
fn dashboard_headers() -> [(&'static str, String); 3] {
    [
        ("X-Content-Type-Options", "nosniff".into()),
        ("Referrer-Policy", "no-referrer".into()),
        (
            "Content-Security-Policy",
            "default-src 'none'; frame-ancestors 'none'".into(),
        ),
    ]
}
