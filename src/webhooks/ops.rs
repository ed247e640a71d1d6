//! Operations on one subscription (docs/operating-webhooks.md): the test ping, and
//! bulk recover's start (its steps run as a background task: `tasks.rs`).

use postguard_core::webhooks::events::{self, excerpt};
use postguard_core::webhooks::ops::{self, TaskState};
use postguard_core::webhooks::protocol as wire;
use postguard_core::webhooks::retry::AttemptResult;
use postguard_core::Problem;
use serde::Serialize;

use super::directory::{
    self,
    tasks::{self, Task},
};
use super::sender::{self, Outgoing, Secrets};
use super::shards;
use super::subscriptions::not_found;
use super::{new_id, TaskStep};
use crate::bindings;
use crate::durable::webhook_shard::CountReq;
use crate::handler::{self, Ctx, Project};
use crate::reject::Handled;
use crate::runtime::now_ms;

/// A task that has not moved for this long is no longer running (ms).
const TASK_STALE_MS: u64 = 10 * 60_000;

#[derive(Serialize)]
struct Ping {
    status_code: Option<u16>,
    duration_ms: u64,
    response_excerpt: Option<String>,
    error: Option<String>,
}

/// `POST /webhooks/{id}/test`: one signed `postguard.ping` to the
/// subscription's URL now, whatever its state; answers with the outcome.
/// Not a delivery: nothing is recorded or retried.
pub async fn test(cx: &Ctx<'_>, project: &Project, id: &str) -> Handled {
    let (env, cfg, rc) = (cx.env, cx.cfg, cx.rc);
    let project = project.as_str();
    let sub = directory::subscriptions::secrets(env, project, id)
        .await?
        .ok_or_else(|| not_found(id))?;
    let started = now_ms();
    let event_id = new_id("evt_");
    let data = serde_json::json!({ "subscription_id": id });
    let max = cfg.settings.webhooks.max_payload_bytes as usize;
    let payload = events::payload(
        &event_id,
        ops::PING_EVENT,
        &events::rfc3339_ms(started),
        &data,
        max,
    );
    let out = Outgoing {
        event_id: &event_id,
        event_type: ops::PING_EVENT,
        payload: &payload,
        secrets: Secrets {
            secret: Some(&sub.secret),
            previous: sub.previous_secret.as_deref(),
            previous_until: sub.previous_secret_until,
        },
    };
    let sent = sender::sign_and_send(cfg, &out, &sub.url, 1, &rc.request_id, started).await?;
    let status_code = match sent.result {
        AttemptResult::Status { code, .. } => Some(code),
        _ => None,
    };
    let ping = Ping {
        status_code,
        duration_ms: now_ms() - started,
        response_excerpt: sent.excerpt.map(|e| excerpt(e.as_bytes(), 512)),
        error: sent.error,
    };
    handler::json(rc, 200, &ping, &[])
}

/// `POST /webhooks/{id}/recover {since, until?}` → 202, the task: one that
/// re-sends (a new manual attempt each) every failed or dead-lettered
/// delivery of the subscription created in the range, 100 per queue step.
pub async fn recover(cx: &Ctx<'_>, project: &Project, id: &str) -> Handled {
    let (env, cfg, rc) = (cx.env, cx.cfg, cx.rc);
    let project = project.as_str();
    let r = ops::parse_recover(&cx.body)?;
    super::subscriptions::load(env, project, id)
        .await?
        .ok_or_else(|| not_found(id))?;
    let until = r.until.unwrap_or(ops::MAX_TIME_MS);
    let now = now_ms();
    // Legacy rows in range go into their shards first: the task runs there.
    loop {
        let legacy = directory::legacy::recoverable(env, id, r.since, until, 50).await?;
        if legacy.is_empty() {
            break;
        }
        for l in legacy {
            shards::adopt(env, cfg, &l.project, &l.event_id, now).await?;
        }
    }
    let mut total = 0u64;
    for key in shards::in_range(env, project, r.since, until).await? {
        let req = CountReq {
            subscription_id: id.to_string(),
            since: r.since,
            until,
        };
        let n: u64 = shards::call::<wire::CountRecoverable>(env, &key, &req).await?;
        total += n;
    }
    let total = u32::try_from(total).unwrap_or(u32::MAX);
    // Nothing in the range: the task is done as it is created (no queue step).
    let state = match total {
        0 => TaskState::Done,
        _ => TaskState::Queued,
    };
    // The task as queued (its `id` is what `GET /tasks/{id}` takes).
    let task = Task {
        id: new_id("task_"),
        kind: "recover".to_string(),
        state,
        subscription_id: id.to_string(),
        total,
        done: 0,
        failed: 0,
        created_at: now,
        updated_at: now,
    };
    // One task per subscription at a time. A task whose steps stopped moving
    // for `TASK_STALE_MS` (its queue message lost) no longer holds the place.
    let stale = now.saturating_sub(TASK_STALE_MS);
    if !tasks::insert_recover(env, &task, project, r.since, until, stale).await? {
        // It finished in between: the client may retry at once.
        let running = tasks::running(env, id).await?.unwrap_or_default();
        return Err(Problem::task_in_progress(&running)
            .with_retry_after(1)
            .into());
    }
    if state == TaskState::Queued {
        let step = TaskStep {
            task_id: task.id.clone(),
        };
        if let Err(e) = env.queue(bindings::DELIVERIES)?.send(step).await {
            // Not left `queued` with no step to run it.
            super::tasks::fail(env, &task.id).await?;
            return Err(e.into());
        }
    }
    handler::json(rc, 202, &task, &[])
}
