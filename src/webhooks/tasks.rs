//! Background tasks (bulk recover) on the deliveries queue: each message one
//! step — the next chunk re-sent, the cursor moved on, the next step queued —
//! and `GET /tasks/{id}` (docs/operating-webhooks.md).

use crate::log;
use postguard_core::config::Config;
use postguard_core::log::Line;
use postguard_core::webhooks::ops::{TaskState, RECOVER_CHUNK};
use postguard_core::webhooks::protocol as wire;
use postguard_core::webhooks::records::{RecoverStep, Recovered};
use postguard_core::Problem;
use serde::Deserialize;
use worker::{Env, MessageExt, Result};

use super::directory::tasks;
use super::shards;
use super::{Job, Msg, TaskStep};
use crate::bindings;
use crate::durable::webhook_shard::RecoverReq;
use crate::handler::{self, Ctx, Project};
use crate::reject::Handled;
use crate::runtime::now_ms;

/// `GET /tasks/{id}` (own project only).
pub async fn get_task(cx: &Ctx<'_>, project: &Project, id: &str) -> Handled {
    let (env, rc) = (cx.env, cx.rc);
    let project = project.as_str();
    let task = tasks::get(env, project, id)
        .await?
        .ok_or_else(|| Problem::not_found("task", id))?;
    handler::json(rc, 200, &task, &[])
}

/// One step of a task: the next chunk after its cursor re-sent (a manual
/// attempt claimed in its shard for each, within the bound: a delivery past
/// it is counted as failed), the cursor and counts moved on, and the next
/// step queued while more remain. A crash re-runs the step from the stored
/// cursor (at least once; a manual attempt on an already delivered delivery
/// sends nothing).
async fn step(env: &Env, cfg: &Config, task_id: &str) -> Result<()> {
    let Some(t) = tasks::progress(env, task_id).await? else {
        return Ok(());
    };
    if matches!(t.state, TaskState::Done | TaskState::Failed) {
        return Ok(());
    }
    let mut after = (t.cursor_at.unwrap_or(0), t.cursor_id.unwrap_or_default());
    let from = t.since.max(after.0);
    let mut left = RECOVER_CHUNK;
    let (mut done, mut skipped) = (0u64, 0u64);
    let now = now_ms();
    for key in shards::in_range(env, &t.project, from, t.until).await? {
        let step = RecoverStep {
            subscription_id: t.subscription_id.clone(),
            since: t.since,
            until: t.until,
            after: after.clone(),
            limit: left,
            max_manual: cfg.settings.webhooks.manual_attempts_per_delivery,
        };
        let got: Recovered =
            shards::call::<wire::Recover>(env, &key, &RecoverReq { step, now }).await?;
        let jobs: Vec<Job> = got
            .queued
            .iter()
            .map(|j| Job {
                project: Some(key.project.clone()),
                subscription_id: Some(j.subscription_id.clone()),
                ..Job::manual(j.delivery_id.clone(), None)
            })
            .collect();
        super::enqueue(env, jobs).await?;
        let n = got.queued.len() as u32 + got.skipped;
        done += got.queued.len() as u64;
        skipped += u64::from(got.skipped);
        if let Some(last) = got.last {
            after = last;
        }
        left -= n.min(left);
        if left == 0 {
            break;
        }
    }
    let more = left == 0;
    let state = if more {
        TaskState::Running
    } else {
        TaskState::Done
    };
    let cursor = Some(&after).filter(|a| !a.1.is_empty());
    tasks::advance(env, task_id, state, done, skipped, cursor, now_ms()).await?;
    if more {
        env.queue(bindings::DELIVERIES)?
            .send(TaskStep {
                task_id: task_id.to_string(),
            })
            .await?;
    }
    Ok(())
}

/// Runs one task message: acknowledged when its step is done; retried by
/// the queue when it fails; from the dead-letter queue, the task is `failed`.
pub async fn run_task_message(env: &Env, cfg: &Config, m: &Msg, from_dlq: bool) {
    let Some(t) = task_step(m) else {
        m.ack();
        return;
    };
    let outcome = if from_dlq {
        fail(env, &t.task_id).await
    } else {
        step(env, cfg, &t.task_id).await
    };
    match outcome {
        Ok(()) => m.ack(),
        Err(e) => {
            log::emit(
                Line::error("task step failed, will retry")
                    .field("task_id", t.task_id.as_str())
                    .err(e),
            );
            m.retry();
        }
    }
}

pub(super) async fn fail(env: &Env, task_id: &str) -> Result<()> {
    tasks::fail(env, task_id, now_ms()).await
}

/// A task message's body, or `None` (logged) when malformed.
pub fn task_step(m: &Msg) -> Option<TaskStep> {
    TaskStep::deserialize(m.body())
        .map_err(|e| log::emit(Line::error("dropping a malformed task message").err(e)))
        .ok()
}
