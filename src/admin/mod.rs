//! The gateway's own endpoints under `/_postguard/`: every request passes
//! the same named phases, in order, before and after its handler:
//!
//! 1. **resolve** the operation (`postguard_core::routes`; 404/405);
//! 2. **authenticate** the credential the route names (`auth::authenticate`;
//!    401/403) — a handler never checks a credential itself;
//! 3. **read** the body, bounded (`request::read_bounded`; 413);
//! 4. **admit**: charge the caller's budget and claim its Idempotency-Key, in
//!    one call to the caller's object (`claim::admit`; 429, 409, 422, or a
//!    replay of the stored answer);
//! 5. **handle** (the handler, given a [`Ctx`](crate::handler::Ctx));
//! 6. **record** the answer under its Idempotency-Key or release the claim,
//!    and add the rate-limit headers (`claim::record`).

pub(crate) mod audit;
mod claim;
mod keys;
mod me;
mod openapi;
mod portal;
mod usage;

use postguard_core::config::Config;
use postguard_core::proxy::Incoming;
use postguard_core::routes::{resolve, Route, RouteError};
use worker::{Env, Request};

use crate::archive::exports;
use crate::auth;
use crate::handler::{Ctx, Project};
use crate::http;
use crate::operations::api as operations;
use crate::reject::{Handled, Reject};
use crate::request::{self, Body};
use crate::runtime::RequestCtx;
use crate::webhooks::{deliveries, feed, inspectors, ops, publish, subscriptions};

/// The phases of one gateway request (see the module's documentation).
/// `path` is the canonical path (`routes::canonical`).
pub async fn route(
    client: http::Client,
    path: &str,
    env: &Env,
    cfg: &Config,
    rc: &RequestCtx,
) -> Handled {
    let method = client.method.to_ascii_uppercase();
    // 1. Resolve.
    let route = resolve(&method, path).map_err(|e| not_routed(&e, &method, path))?;
    rc.facts.borrow_mut().route = Some(route.operation().1);
    // 2. Authenticate.
    let who = auth::authenticate(route.access(), &client.headers, env, cfg, rc).await?;
    // 3. Read.
    let (incoming, req) = read(client, method, path, &route, cfg).await?;
    // 4. Admit.
    let pass = match claim::admit(&route, &who, &incoming, env, cfg, rc).await? {
        claim::Admitted::Answered(replayed) => return Ok(replayed),
        claim::Admitted::Run(pass) => pass,
    };
    let cx = Ctx {
        req,
        env,
        cfg,
        rc,
        who,
        body: incoming.body,
        verdicts: pass.verdicts.clone(),
        lookup: pass.lookup.clone(),
    };
    // 5. Handle (a query parameter the operation does not read is refused
    // here, the same for every endpoint).
    let outcome = match unknown_query_param(&route, &cx.req) {
        Some(refused) => Err(refused),
        None => dispatch(route, &cx).await,
    };
    // 6. Record.
    claim::record(pass, &cx, outcome).await
}

/// The request as the admission reads it (its body read under the limit when
/// the operation takes one), and the `worker::Request` handlers query.
async fn read(
    client: http::Client,
    method: String,
    path: &str,
    route: &Route,
    cfg: &Config,
) -> Handled<(Incoming, Request)> {
    let max = cfg.settings.max_body_bytes;
    let (body, oversized) = match route.has_body() {
        true => match request::read_bounded(&client.raw, client.content_length(), max).await? {
            Body::Read(b) => (b, false),
            Body::TooLarge => (Vec::new(), true),
        },
        false => (Vec::new(), false),
    };
    let incoming = Incoming {
        method,
        path: path.to_string(),
        path_and_query: client.path_and_query(),
        headers: client.headers.clone(),
        body,
        oversized,
    };
    Ok((incoming, client.into_worker()))
}

/// 400 `VALIDATION_ERROR` naming the first query parameter `route` does not
/// read (`routes::Route::query_params`).
fn unknown_query_param(route: &Route, req: &Request) -> Option<Reject> {
    let url = req.url().ok()?;
    let names: Vec<String> = url.query_pairs().map(|(k, _)| k.into_owned()).collect();
    let name = route.unknown_query_param(names.iter().map(String::as_str))?;
    Some(postguard_core::Invalid::unknown_parameter(name).into())
}

async fn dispatch(route: Route, cx: &Ctx<'_>) -> Handled {
    match route {
        Route::KeysCreate => keys::create(cx).await,
        Route::KeysImport => keys::import(cx).await,
        Route::Usage => usage::usage(cx).await,
        Route::KeysList => keys::list(cx).await,
        Route::KeyActivity => audit::key_activity(cx).await,
        Route::KeyGet { id } => keys::get(cx, &id).await,
        Route::KeyRevoke { id } => keys::revoke(cx, &id).await,
        Route::KeyPatch { id } => keys::patch(cx, &id).await,
        Route::KeyReroll { id } => keys::reroll(cx, &id).await,
        Route::IdempotencyLookup { .. } => me::idempotency(cx).await,
        Route::WebhooksCreate => subscriptions::create(cx, &Project::of(cx)?).await,
        Route::WebhooksList => subscriptions::list(cx).await,
        Route::WebhookGet { id } => subscriptions::get(cx, &id).await,
        Route::WebhookDelete { id } => subscriptions::delete(cx, &Project::of(cx)?, &id).await,
        Route::WebhookRotateSecret { id } => {
            subscriptions::rotate(cx, &Project::of(cx)?, &id).await
        }
        Route::WebhookPatch { id } => subscriptions::patch(cx, &Project::of(cx)?, &id).await,
        Route::WebhookPause { id } => subscriptions::pause(cx, &Project::of(cx)?, &id).await,
        Route::WebhookResume { id } => subscriptions::resume(cx, &Project::of(cx)?, &id).await,
        Route::WebhookTest { id } => ops::test(cx, &Project::of(cx)?, &id).await,
        Route::WebhookRecover { id } => ops::recover(cx, &Project::of(cx)?, &id).await,
        Route::TaskGet { id } => crate::webhooks::tasks::get_task(cx, &Project::of(cx)?, &id).await,
        Route::EventsPublish => publish::publish(cx).await,
        Route::EventsFeed => feed::list(cx).await,
        Route::InspectorsCreate => inspectors::create(cx, &Project::of(cx)?).await,
        Route::InspectorRequests { id } => inspectors::requests(cx, &Project::of(cx)?, &id).await,
        Route::InspectCapture { token } => inspectors::capture(cx, &token).await,
        Route::DeliveriesList => Ok(deliveries::list(cx).await?),
        Route::DeliveryGet { id } => Ok(deliveries::get(cx, &id).await?),
        Route::DeliveryRetry { id } => Ok(deliveries::retry(cx, &Project::of(cx)?, &id).await?),
        Route::DeliveryRedirect { id } => {
            Ok(deliveries::redirect(cx, &Project::of(cx)?, &id).await?)
        }
        Route::AuditList => audit::list(cx).await,
        Route::Stats => audit::stats(cx).await,
        Route::Me => me::get(cx).await,
        Route::PortalLinksCreate => portal::create_link(cx).await,
        Route::PortalSessionsCreate => portal::create_session(cx).await,
        Route::PortalSessionsList => portal::list_sessions(cx).await,
        Route::PortalSessionsEnd => portal::end_sessions(cx).await,
        Route::PortalSessionEnd { id } => portal::end_session(cx, &id).await,
        Route::OpenApiDocument => openapi::get(cx).await,
        Route::OperationsList => operations::list(cx, &Project::of(cx)?).await,
        Route::OperationGet { id } => operations::get(cx, &Project::of(cx)?, &id).await,
        Route::OperationResult { id } => operations::result(cx, &Project::of(cx)?, &id).await,
        Route::ExportsCreate => exports::create(cx).await,
        Route::ExportGet { id } => exports::get(cx, &id).await,
        Route::ExportDownload { id } => exports::download(cx, &id).await,
    }
}

/// A path under the prefix that names no operation (or another method).
fn not_routed(e: &RouteError, method: &str, path: &str) -> Reject {
    let rejected = Reject::from(e.problem(method, path));
    // The dashboard's files are static assets served before the worker
    // runs; a path under it that reaches the worker names no file.
    if path.starts_with(DASHBOARD) {
        rejected.with(&dashboard_headers())
    } else {
        rejected
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
