//! Background tasks (bulk recover) in D1's `tasks`: one row each, resumable
//! from its cursor `(created_at, id)` across the project's shards.

use postguard_core::webhooks::ops::TaskState;
use serde::{Deserialize, Serialize};
use worker::wasm_bindgen::JsValue;
use worker::{Env, Result};

use super::db;
use crate::d1::{num, text};

/// A task as `GET /tasks/{id}` shows it.
#[derive(Serialize, Deserialize)]
pub struct Task {
    pub id: String,
    pub kind: String,
    pub state: TaskState,
    pub subscription_id: String,
    pub total: u32,
    pub done: u32,
    pub failed: u32,
    pub created_at: u64,
    pub updated_at: u64,
}

/// What a step needs of its task.
#[derive(Deserialize)]
pub struct Progress {
    pub project: String,
    pub state: TaskState,
    pub subscription_id: String,
    pub since: u64,
    pub until: u64,
    pub cursor_at: Option<u64>,
    pub cursor_id: Option<String>,
}

/// Records a new recover task, unless one of its subscription is queued or
/// running and moved after `stale` (decided in the insert itself: two racing
/// recovers cannot both pass); whether it was recorded.
pub async fn insert_recover(
    env: &Env,
    t: &Task,
    project: &str,
    since: u64,
    until: u64,
    stale: u64,
) -> Result<bool> {
    let res = db(env)?
        .prepare(
            "INSERT INTO tasks (id, project, kind, state, subscription_id, since, until, total, created_at, updated_at) \
             SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ? WHERE NOT EXISTS \
             (SELECT 1 FROM tasks WHERE subscription_id = ? AND state IN (?, ?) AND updated_at > ?)",
        )
        .bind(&[
            text(&t.id),
            text(project),
            text(&t.kind),
            text(t.state.as_str()),
            text(&t.subscription_id),
            num(since),
            num(until),
            num(u64::from(t.total)),
            num(t.created_at),
            num(t.updated_at),
            text(&t.subscription_id),
            text(TaskState::Queued.as_str()),
            text(TaskState::Running.as_str()),
            num(stale),
        ])?
        .run()
        .await?;
    Ok(res.meta()?.and_then(|m| m.changes).unwrap_or(0) > 0)
}

/// The id of the subscription's queued or running task, if any.
pub async fn running(env: &Env, subscription_id: &str) -> Result<Option<String>> {
    #[derive(Deserialize)]
    struct Running {
        id: String,
    }
    let found: Option<Running> = db(env)?
        .prepare("SELECT id FROM tasks WHERE subscription_id = ? AND state IN (?, ?) ORDER BY created_at DESC LIMIT 1")
        .bind(&[
            text(subscription_id),
            text(TaskState::Queued.as_str()),
            text(TaskState::Running.as_str()),
        ])?
        .first(None)
        .await?;
    Ok(found.map(|r| r.id))
}

/// Task `id` of `project`.
pub async fn get(env: &Env, project: &str, id: &str) -> Result<Option<Task>> {
    db(env)?
        .prepare("SELECT id, kind, state, subscription_id, total, done, failed, created_at, updated_at FROM tasks WHERE id = ? AND project = ?")
        .bind(&[text(id), text(project)])?
        .first(None)
        .await
}

pub async fn progress(env: &Env, id: &str) -> Result<Option<Progress>> {
    db(env)?
        .prepare("SELECT project, state, subscription_id, since, until, cursor_at, cursor_id FROM tasks WHERE id = ?")
        .bind(&[text(id)])?
        .first(None)
        .await
}

/// Moves a task on by one step: its state, counts and cursor (kept when
/// the step handled nothing).
pub async fn advance(
    env: &Env,
    id: &str,
    state: TaskState,
    done: u64,
    failed: u64,
    cursor: Option<&(u64, String)>,
    now: u64,
) -> Result<()> {
    let (cursor_at, cursor_id) = match cursor {
        Some((at, i)) => (num(*at), text(i)),
        None => (JsValue::NULL, JsValue::NULL),
    };
    db(env)?
        .prepare("UPDATE tasks SET state = ?, done = done + ?, failed = failed + ?, cursor_at = COALESCE(?, cursor_at), cursor_id = COALESCE(?, cursor_id), updated_at = ? WHERE id = ?")
        .bind(&[text(state.as_str()), num(done), num(failed), cursor_at, cursor_id, num(now), text(id)])?
        .run()
        .await?;
    Ok(())
}

/// A task whose step keeps failing (its message reached the dead-letter
/// queue) is `failed`, unless it finished.
pub async fn fail(env: &Env, id: &str, now: u64) -> Result<()> {
    db(env)?
        .prepare("UPDATE tasks SET state = ?, updated_at = ? WHERE id = ? AND state IN (?, ?)")
        .bind(&[
            text(TaskState::Failed.as_str()),
            num(now),
            text(id),
            text(TaskState::Queued.as_str()),
            text(TaskState::Running.as_str()),
        ])?
        .run()
        .await?;
    Ok(())
}
