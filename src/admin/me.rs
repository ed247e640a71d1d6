//! `GET /_postguard/v1/me`: the calling key and its current limit state, or
//! the calling portal session's project. Costs nothing: the router's object
//! call for it is a peek (cost 0), whose verdict this answer repeats.

use serde::Serialize;

use super::Ctx;
use crate::auth::Principal;
use crate::http;
use crate::reject::{Handled, Reject};

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

pub async fn get(cx: &Ctx<'_>) -> Handled {
    let (key, verdict) = match (&cx.who, cx.verdict) {
        (Principal::Session(s), _) => return super::portal::me(cx, s),
        (Principal::Key(c), Some(v)) => (&c.key.record, v),
        _ => {
            return Err(Reject::Internal(worker::Error::RustError(
                "/me reached without a key's verdict".into(),
            )))
        }
    };
    let me = Me {
        prefix: &key.prefix,
        project: &key.project,
        plan: &key.plan,
        limit: verdict.limit,
        remaining: verdict.remaining,
        reset: verdict.reset_epoch_s,
        window_s: verdict.window_s,
    };
    http::json(cx.rc, 200, &me, &[])
}
