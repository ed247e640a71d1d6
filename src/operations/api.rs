//! `GET /_postguard/v1/operations/{id}`, `…/{id}/result` and
//! `GET /_postguard/v1/operations` (an API key or a portal session of the
//! operation's project; docs/async-operations.md). The id names the key whose object
//! holds the operation; an operation of another project, or of a key no
//! one issued, is not found — without calling (or creating) any object.
//!
//! The list visits the objects of the project's keys that hold operations
//! (each writes its KV index entry `o:<project>:<key id>` when it creates
//! one), each answering its newest operations before the cursor, and
//! merges them: at most `operations::MAX_LISTED_KEYS` objects a page (a
//! project with more is listed a key at a time, `key=`), and no shared
//! store on the path that creates operations (ADR 0037).

use futures_util::future::join_all;
use postguard_core::guard::{GetOp, GetOpRequest, ListOps};
use postguard_core::operations::{self, Operation, ResultAnswer, State};
use postguard_core::page::{decode_cursor, encode_cursor, parse_limit, Page};
use postguard_core::{Invalid, Problem};

use crate::auth;
use crate::durable::client::Guard;
use crate::handler::{json, Ctx, Project};
use crate::reject::{Handled, Reject};
use crate::runtime::now_ms;
use crate::{bindings, http, replays};

/// The operation `id` of the caller's project, with its kept result body
/// when `body` (and kept in the object).
async fn find(
    cx: &Ctx<'_>,
    project: &Project,
    id: &str,
    body: bool,
) -> Handled<(Box<Operation>, Vec<u8>)> {
    let not_found = || Reject::from(Problem::not_found("operation", id));
    let key_id = operations::key_id_of(id).ok_or_else(not_found)?;
    let project = project.to_string();
    if auth::key_project(cx.env, &key_id).await?.as_deref() != Some(project.as_str()) {
        return Err(not_found());
    }
    let req = GetOpRequest {
        id: id.to_string(),
        project,
        body,
    };
    let (found, payload) = Guard::of(cx.env, &key_id)?.call::<GetOp>(&req, &[]).await?;
    Ok((found.ok_or_else(not_found)?, payload))
}

/// `{id, state, status?, request_id, created_at, completed_at?, method,
/// path, attempts}`; `Retry-After` while it is not done.
pub async fn get(cx: &Ctx<'_>, project: &Project, id: &str) -> Handled {
    let (op, _) = find(cx, project, id, false).await?;
    let mut extra = Vec::new();
    if !op.state.is_done() {
        let s = operations::retry_after_s(&op, now_ms());
        extra.push(("Retry-After", s.to_string()));
    }
    json(cx.rc, 200, &op.view(), &extra)
}

/// The kept answer, byte for byte (its status, stored headers and body; a
/// large one streamed from R2); 409 `OPERATION_NOT_DONE` before, 502 for a
/// failed operation that never got an answer.
pub async fn result(cx: &Ctx<'_>, project: &Project, id: &str) -> Handled {
    let (op, body) = find(cx, project, id, true).await?;
    let timeout_ms = cx.cfg.settings.async_ops.timeout_ms;
    let stored = match operations::result(&op, now_ms(), timeout_ms) {
        ResultAnswer::Problem(p) => return Err(p.into()),
        ResultAnswer::Stored(s) => s,
    };
    let rc = cx.rc;
    if !stored.body_omitted {
        return Ok(http::respond(
            rc,
            stored.status,
            &stored.headers,
            &[],
            Some(body),
        )?);
    }
    let unavailable = || Reject::from(Problem::replay_unavailable(stored.status, stored.body_len));
    let (Some(object), Some(bucket)) = (&stored.body_object, replays::bucket(cx.env)) else {
        return Err(unavailable());
    };
    match replays::get(&bucket, object).await? {
        Some(stream) => {
            let r = http::respond_stream(rc, stored.status, &stored.headers, &[], stream)?;
            rc.note(|f| f.response_bytes = Some(stored.body_len));
            Ok(r)
        }
        None => Err(unavailable()),
    }
}

/// `GET /_postguard/v1/operations?state=&key=&limit=&cursor=`: the
/// project's operations, newest first.
pub async fn list(cx: &Ctx<'_>, project: &Project) -> Handled {
    let project = project.to_string();
    let mut page = operations::Page {
        project: project.clone(),
        before: None,
        limit: postguard_core::page::DEFAULT_LIMIT,
        state: None,
    };
    let mut key = None;
    for (k, v) in crate::request::query_pairs(&cx.req)? {
        match k.as_str() {
            "limit" => page.limit = parse_limit(Some(&v))?,
            "cursor" => page.before = Some(decode_cursor(&v)?),
            "key" => key = Some(v),
            "state" => {
                page.state = Some(State::parse(&v).ok_or_else(|| {
                    Invalid::field("state", "must be one of queued, running, succeeded, failed")
                })?)
            }
            other => return Err(Invalid::unknown_parameter(other).into()),
        }
    }
    let keys = match key {
        Some(id) => one_key(cx, &project, id).await?,
        None => indexed_keys(cx, &project).await?,
    };
    // One more than shown from each object, to know whether a page follows.
    let ask = operations::Page {
        limit: page.limit + 1,
        ..page.clone()
    };
    let calls = keys.iter().map(|key_id| {
        let ask = &ask;
        async move {
            let guard = Guard::of(cx.env, key_id)?;
            Ok::<_, Reject>(guard.call::<ListOps>(ask, &[]).await?.0)
        }
    });
    let mut all = Vec::new();
    for views in join_all(calls).await {
        all.extend(views?);
    }
    let (data, more) = operations::merge(all, page.limit as usize);
    let next_cursor = match more {
        true => data.last().map(|v| encode_cursor(v.created_at, &v.id)),
        false => None,
    };
    json(cx.rc, 200, &Page { data, next_cursor }, &[])
}

/// `key=`: that key, if it is one of the project's (none otherwise).
async fn one_key(cx: &Ctx<'_>, project: &str, id: String) -> Handled<Vec<String>> {
    if !operations::is_key_id(&id) {
        return Err(Invalid::field("key", "must be an API key's id (key_…)").into());
    }
    let mine = auth::key_project(cx.env, &id).await?.as_deref() == Some(project);
    Ok(if mine { vec![id] } else { Vec::new() })
}

/// The keys of the project that hold operations (their index entries), at
/// most `MAX_LISTED_KEYS`: more → 400 naming `key`.
async fn indexed_keys(cx: &Ctx<'_>, project: &str) -> Handled<Vec<String>> {
    let max = operations::MAX_LISTED_KEYS;
    let listed = cx
        .env
        .kv(bindings::API_KEYS)?
        .list()
        .prefix(operations::index_prefix(project))
        .limit(max as u64 + 1)
        .execute()
        .await?;
    let keys: Vec<String> = listed
        .keys
        .iter()
        .filter_map(|k| operations::indexed_key(&k.name, project))
        .collect();
    if keys.len() > max {
        return Err(Invalid::field(
            "key",
            &format!("this project's operations live in more than {max} keys' objects (at most {max} are read at once): list them a key at a time with key=<key id>"),
        )
        .into());
    }
    Ok(keys)
}
