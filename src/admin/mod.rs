//! The gateway's own endpoints under `/_postguard/v1/`.

mod audit;
mod keys;
mod me;

use postguard_core::config::Config;
use postguard_core::{ErrorCode, Problem};
use worker::{Env, Request, Response, Result};

use crate::http;
use crate::runtime::RequestCtx;
use crate::webhooks;

pub const PREFIX: &str = "/_postguard/";

fn not_found(path: &str) -> Problem {
    let shown: String = path.chars().take(200).collect();
    Problem::new(
        ErrorCode::NotFound,
        format!("no gateway resource at {shown}"),
    )
}

fn method_not_allowed(method: &str, allow: &'static str) -> Problem {
    Problem::new(
        ErrorCode::MethodNotAllowed,
        format!("{method} is not allowed here"),
    )
    .with_allow(allow)
}

pub async fn route(req: Request, env: &Env, cfg: &Config, rc: &RequestCtx) -> Result<Response> {
    let method = req.inner().method().to_ascii_uppercase();
    let path = req.path();
    let segments: Vec<&str> = path
        .trim_start_matches(PREFIX)
        .trim_end_matches('/')
        .split('/')
        .collect();
    match segments.as_slice() {
        ["v1", "keys"] => match method.as_str() {
            "POST" => keys::create(req, env, cfg, rc).await,
            "GET" => keys::list(req, env, cfg, rc).await,
            _ => http::problem(rc, &method_not_allowed(&method, "GET, POST"), &[]),
        },
        ["v1", "keys", id] => match method.as_str() {
            "GET" => keys::get(&req, env, cfg, rc, id).await,
            "DELETE" => keys::revoke(&req, env, cfg, rc, id).await,
            _ => http::problem(rc, &method_not_allowed(&method, "GET, DELETE"), &[]),
        },
        ["v1", "webhooks"] => match method.as_str() {
            "POST" => webhooks::subscriptions::create(req, env, cfg, rc).await,
            "GET" => webhooks::subscriptions::list(&req, env, cfg, rc).await,
            _ => http::problem(rc, &method_not_allowed(&method, "GET, POST"), &[]),
        },
        ["v1", "webhooks", id] => match method.as_str() {
            "GET" => webhooks::subscriptions::get(&req, env, cfg, rc, id).await,
            "DELETE" => webhooks::subscriptions::delete(&req, env, cfg, rc, id).await,
            _ => http::problem(rc, &method_not_allowed(&method, "GET, DELETE"), &[]),
        },
        ["v1", "webhooks", id, "rotate-secret"] => match method.as_str() {
            "POST" => webhooks::subscriptions::rotate(&req, env, cfg, rc, id).await,
            _ => http::problem(rc, &method_not_allowed(&method, "POST"), &[]),
        },
        ["v1", "events"] => match method.as_str() {
            "POST" => webhooks::publish::publish(req, env, cfg, rc).await,
            _ => http::problem(rc, &method_not_allowed(&method, "POST"), &[]),
        },
        ["v1", "deliveries"] => match method.as_str() {
            "GET" => webhooks::deliveries::list(&req, env, cfg, rc).await,
            _ => http::problem(rc, &method_not_allowed(&method, "GET"), &[]),
        },
        ["v1", "deliveries", id] => match method.as_str() {
            "GET" => webhooks::deliveries::get(&req, env, cfg, rc, id).await,
            _ => http::problem(rc, &method_not_allowed(&method, "GET"), &[]),
        },
        ["v1", "deliveries", id, "retry"] => match method.as_str() {
            "POST" => webhooks::deliveries::retry(&req, env, cfg, rc, id).await,
            _ => http::problem(rc, &method_not_allowed(&method, "POST"), &[]),
        },
        ["v1", "deliveries", id, "redirect"] => match method.as_str() {
            "POST" => webhooks::deliveries::redirect(req, env, cfg, rc, id).await,
            _ => http::problem(rc, &method_not_allowed(&method, "POST"), &[]),
        },
        ["v1", "audit"] => match method.as_str() {
            "GET" => audit::list(&req, env, cfg, rc).await,
            _ => http::problem(rc, &method_not_allowed(&method, "GET"), &[]),
        },
        ["v1", "stats"] => match method.as_str() {
            "GET" => audit::stats(&req, env, cfg, rc).await,
            _ => http::problem(rc, &method_not_allowed(&method, "GET"), &[]),
        },
        ["v1", "me"] => match method.as_str() {
            "GET" => me::get(&req, env, cfg, rc).await,
            _ => http::problem(rc, &method_not_allowed(&method, "GET"), &[]),
        },
        _ => http::problem(rc, &not_found(&path), &[]),
    }
}

pub(crate) fn validation(detail: impl Into<String>) -> Problem {
    Problem::new(ErrorCode::ValidationError, detail)
}

pub(crate) fn query_param(req: &Request, name: &str) -> Result<Option<String>> {
    Ok(req
        .url()?
        .query_pairs()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned()))
}
