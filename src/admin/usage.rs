//! `GET /_postguard/v1/usage` (docs/live-api.md): per key and hour or day,
//! the requests retries cannot double-count — read from the audit shards'
//! usage roll-ups (`audit_shard::usage` decides what counts and adds them
//! up). An API key or a session reads its project; the operator one
//! project (`project=`) or every project, from each bucket's cross-project
//! shard.

use futures_util::future::join_all;
use postguard_core::audit_shard::protocol::{Operation, Usage};
use postguard_core::audit_shard::usage::{self, UsageQuery};
use postguard_core::audit_shard::{self as shards, Source, ALL_PROJECTS, MAX_STATS_SHARDS};
use worker::Result;

use crate::bindings;
use crate::durable::audit_shard as object;
use crate::handler::{self, Ctx};
use crate::reject::Handled;
use crate::request::query_pairs;
use crate::runtime::now_ms;

pub async fn usage(cx: &Ctx<'_>) -> Handled {
    let (env, rc) = (cx.env, cx.rc);
    let pairs = query_pairs(&cx.req)?;
    let own = cx.who.project().map(str::to_string);
    let params = usage::parse(
        pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        own.is_none(),
        now_ms(),
    )?;
    let project = own.or(params.project.clone());
    let db = env.d1(bindings::DB)?;
    let shards_of = project.as_deref().unwrap_or(ALL_PROJECTS);
    let max = MAX_STATS_SHARDS as u64 + 1;
    let found = super::audit::sources(
        &db,
        Some(shards_of),
        project.as_deref(),
        params.since_ms,
        params.until_ms,
        max,
    )
    .await?;
    // The legacy table predates usage counts: shards only.
    let found: Vec<_> = found
        .into_iter()
        .filter_map(|s| match s {
            Source::Shard(s) => Some(s),
            Source::Legacy { .. } => None,
        })
        .collect();
    if found.len() > MAX_STATS_SHARDS {
        return Err(shards::project_required(&format!(
            "this period holds more than {MAX_STATS_SHARDS} audit shards: add project= or narrow since/until"
        ))
        .into());
    }
    let q = UsageQuery {
        since_ms: params.since_ms,
        until_ms: params.until_ms,
        project,
    };
    let body = object::request::<Usage>(&q)?;
    let calls = found
        .iter()
        .map(|s| object::call(env, s, Usage::PATH, &body));
    let parts = join_all(calls)
        .await
        .into_iter()
        .map(|r| r.and_then(|b| object::answer::<Usage>(&b)))
        .collect::<Result<Vec<_>>>()?;
    let merged = usage::merge(parts, params.granularity);
    let page = usage::page(merged, params.after.as_ref(), params.limit);
    handler::json(rc, 200, &page, &[])
}
