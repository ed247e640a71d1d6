//! `GET /_postguard/v1/me`: the calling key and its current limit state.
//! Peeks at the limiter (cost 0): asking does not consume budget.

use postguard_core::config::Config;
use postguard_core::credential::Credential;
use postguard_core::guard::{Admit, AdmitRequest, AdmitResponse};
use postguard_core::rate_limit;
use serde::Serialize;
use worker::{Env, Request};

use crate::auth;
use crate::durable::client::call;
use crate::http;
use crate::reject::Handled;
use crate::runtime::RequestCtx;

#[derive(Serialize)]
struct Me<'a> {
    prefix: &'a str,
    project: &'a str,
    plan: &'a str,
    limit: u32,
    remaining: u32,
    reset: u64,
    window_s: u64,
}

pub async fn get(req: &Request, env: &Env, cfg: &Config, rc: &RequestCtx) -> Handled {
    if let Credential::Session(t) = auth::credential(req, cfg) {
        return super::portal::me(rc, &super::portal::session(&t, cfg, rc)?);
    }
    let forbidden = "/me describes an API key; the operator token has none";
    let auth::Caller { key, plan } = auth::key_holder(req, env, cfg, rc, forbidden).await?;
    let peek = AdmitRequest {
        cost: 0,
        quota: plan.quota(),
        claim: None,
    };
    let (decision, _) = call::<Admit>(env, &key.record.id, &peek, &[]).await?;
    let verdict = match decision {
        AdmitResponse::Revoked => return Err(auth::revoked(&key).into()),
        AdmitResponse::Limited { verdict } | AdmitResponse::Admitted { verdict, .. } => verdict,
    };
    let me = Me {
        prefix: &key.record.prefix,
        project: &key.record.project,
        plan: &key.record.plan,
        limit: verdict.limit,
        remaining: verdict.remaining,
        reset: verdict.reset_epoch_s,
        window_s: verdict.window_s,
    };
    http::json(rc, 200, &me, &rate_limit::headers(&verdict))
}
