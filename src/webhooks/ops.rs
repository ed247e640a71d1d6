//! CONTRACT §11 operations on one subscription: the test ping and bulk
//! recover (a background task through the queue), and `GET /tasks/{id}`.

use postguard_core::webhooks::events::{self, excerpt};
use postguard_core::webhooks::ops::{self, TaskState, RECOVER_CHUNK};
use postguard_core::webhooks::retry::AttemptResult;
use postguard_core::Problem;
use serde::{Deserialize, Serialize};
use worker::wasm_bindgen::JsValue;
use worker::{Env, MessageExt, Result};

use super::consumer::{self, Msg, Outgoing, Secrets};
use super::subscriptions::not_found;
use super::{new_id, num, text, Job, TaskStep};
use crate::admin::Ctx;
use crate::reject::Handled;
use crate::runtime::now_ms;
use crate::{bindings, http};

#[derive(Deserialize)]
struct SubSecrets {
    url: String,
    secret: String,
    previous_secret: Option<String>,
    previous_secret_until: Option<u64>,
}

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
pub async fn test(cx: &Ctx<'_>, id: &str) -> Handled {
    let (env, cfg, rc) = (cx.env, cx.cfg, cx.rc);
    let project = cx.project()?;
    let sub: SubSecrets = env
        .d1(bindings::DB)?
        .prepare("SELECT url, secret, previous_secret, previous_secret_until FROM subscriptions WHERE id = ? AND project = ?")
        .bind(&[text(id), text(project)])?
        .first(None)
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
    let (result, error, response_excerpt) =
        consumer::sign_and_send(cfg, &out, &sub.url, 1, &rc.request_id, started).await?;
    let status_code = match result {
        AttemptResult::Status { code, .. } => Some(code),
        _ => None,
    };
    let ping = Ping {
        status_code,
        duration_ms: now_ms() - started,
        response_excerpt: response_excerpt.map(|e| excerpt(e.as_bytes(), 512)),
        error,
    };
    http::json(rc, 200, &ping, &[])
}

#[derive(Serialize, Deserialize)]
struct Task {
    id: String,
    kind: String,
    state: TaskState,
    subscription_id: String,
    total: u32,
    done: u32,
    failed: u32,
    created_at: u64,
    updated_at: u64,
}

#[derive(Deserialize)]
struct Count {
    n: u32,
}

/// The deliveries a recover re-sends: failed or dead-lettered, in range.
const RECOVERABLE: &str = "FROM deliveries WHERE subscription_id = ? AND project = ? AND status IN ('failed', 'dead_letter') AND created_at >= ? AND created_at <= ?";

/// `POST /webhooks/{id}/recover {since, until?}` → 202, the task: one that
/// re-sends (a new manual attempt each) every failed or dead-lettered
/// delivery of the subscription created in the range, 100 per queue step.
pub async fn recover(cx: &Ctx<'_>, id: &str) -> Handled {
    let (env, rc) = (cx.env, cx.rc);
    let project = cx.project()?;
    let body = &cx.body;
    let r = ops::parse_recover(body)?;
    super::subscriptions::load(env, project, id)
        .await?
        .ok_or_else(|| not_found(id))?;
    let db = env.d1(bindings::DB)?;
    let until = r.until.unwrap_or(ops::MAX_TIME_MS);
    let total: Count = db
        .prepare(format!("SELECT COUNT(*) AS n {RECOVERABLE}"))
        .bind(&[text(id), text(project), num(r.since), num(until)])?
        .first(None)
        .await?
        .unwrap_or(Count { n: 0 });
    let task_id = new_id("task_");
    let now = now_ms();
    // One task per subscription at a time, decided in the insert itself (two
    // racing recovers cannot both pass). A task whose steps stopped moving
    // for `TASK_STALE_MS` (its queue message lost) no longer holds the place.
    let stale = now.saturating_sub(TASK_STALE_MS);
    // Nothing in the range: the task is done as it is created (no queue step).
    let state = match total.n {
        0 => TaskState::Done,
        _ => TaskState::Queued,
    };
    let inserted = db.prepare(
        "INSERT INTO tasks (id, project, kind, state, subscription_id, since, until, total, created_at, updated_at) \
         SELECT ?, ?, 'recover', ?, ?, ?, ?, ?, ?, ? WHERE NOT EXISTS \
         (SELECT 1 FROM tasks WHERE subscription_id = ? AND state IN ('queued', 'running') AND updated_at > ?)",
    )
    .bind(&[text(&task_id), text(project), text(state.as_str()), text(id), num(r.since), num(until), num(u64::from(total.n)), num(now), num(now), text(id), num(stale)])?
    .run()
    .await?;
    if inserted.meta()?.and_then(|m| m.changes).unwrap_or(0) == 0 {
        return Err(running_task(env, id).await?.into());
    }
    if state == TaskState::Queued {
        let queue = env.queue(bindings::DELIVERIES)?;
        let step = TaskStep {
            task_id: task_id.clone(),
        };
        if let Err(e) = queue.send(step).await {
            // Not left `queued` with no step to run it.
            fail(env, &task_id).await?;
            return Err(e.into());
        }
    }
    // The task as queued (its `id` is what `GET /tasks/{id}` takes).
    let task = Task {
        id: task_id,
        kind: "recover".to_string(),
        state,
        subscription_id: id.to_string(),
        total: total.n,
        done: 0,
        failed: 0,
        created_at: now,
        updated_at: now,
    };
    http::json(rc, 202, &task, &[])
}

/// A task that has not moved for this long is no longer running (ms).
const TASK_STALE_MS: u64 = 10 * 60_000;

#[derive(Deserialize)]
struct Running {
    id: String,
}

/// 409 `TASK_IN_PROGRESS` naming the subscription's running task.
async fn running_task(env: &Env, subscription_id: &str) -> Handled<Problem> {
    let found: Option<Running> = env
        .d1(bindings::DB)?
        .prepare("SELECT id FROM tasks WHERE subscription_id = ? AND state IN ('queued', 'running') ORDER BY created_at DESC LIMIT 1")
        .bind(&[text(subscription_id)])?
        .first(None)
        .await?;
    // It finished in between: the client may retry at once.
    let id = found.map(|r| r.id).unwrap_or_default();
    Ok(Problem::task_in_progress(&id).with_retry_after(1))
}

/// `GET /tasks/{id}` (own project only).
pub async fn get_task(cx: &Ctx<'_>, id: &str) -> Handled {
    let (env, rc) = (cx.env, cx.rc);
    let project = cx.project()?;
    let task: Task = env
        .d1(bindings::DB)?
        .prepare("SELECT id, kind, state, subscription_id, total, done, failed, created_at, updated_at FROM tasks WHERE id = ? AND project = ?")
        .bind(&[text(id), text(project)])?
        .first(None)
        .await?
        .ok_or_else(|| Problem::not_found("task", id))?;
    http::json(rc, 200, &task, &[])
}

#[derive(Deserialize)]
struct TaskRow {
    project: String,
    state: TaskState,
    subscription_id: String,
    since: u64,
    until: u64,
    cursor_at: Option<u64>,
    cursor_id: Option<String>,
}

#[derive(Deserialize)]
struct Recoverable {
    id: String,
    created_at: u64,
}

/// One step of a task: the next chunk after its cursor re-queued, the
/// cursor and counts moved on, and the next step queued while more remain.
/// A crash re-runs the step from the stored cursor (at least once; a manual
/// attempt on an already delivered delivery sends nothing).
async fn step(env: &Env, task_id: &str) -> Result<()> {
    let db = env.d1(bindings::DB)?;
    let Some(t) = db
        .prepare("SELECT project, state, subscription_id, since, until, cursor_at, cursor_id FROM tasks WHERE id = ?")
        .bind(&[text(task_id)])?
        .first::<TaskRow>(None)
        .await?
    else {
        return Ok(());
    };
    if matches!(t.state, TaskState::Done | TaskState::Failed) {
        return Ok(());
    }
    let (at, after) = (t.cursor_at.unwrap_or(0), t.cursor_id.unwrap_or_default());
    let chunk: Vec<Recoverable> = db
        .prepare(format!(
            "SELECT id, created_at {RECOVERABLE} AND (created_at > ? OR (created_at = ? AND id > ?)) ORDER BY created_at, id LIMIT ?"
        ))
        .bind(&[
            text(&t.subscription_id),
            text(&t.project),
            num(t.since),
            num(t.until),
            num(at),
            num(at),
            text(&after),
            num(u64::from(RECOVER_CHUNK)),
        ])?
        .all()
        .await?
        .results()?;
    let n = u32::try_from(chunk.len()).unwrap_or(u32::MAX);
    let last = chunk.last().map(|r| (r.created_at, r.id.clone()));
    // Each re-send is a manual attempt, held to the same bound as a retry
    // (ADR 0017): a delivery past it is skipped, counted as failed.
    let cfg = crate::runtime::config(env).map_err(|e| worker::Error::RustError(e.to_string()))?;
    let ids: Vec<&str> = chunk.iter().map(|r| r.id.as_str()).collect();
    let claimed = super::usage::claim_manual(&db, &cfg, &t.project, &ids).await?;
    let skipped = claimed.iter().filter(|c| !**c).count() as u64;
    let jobs: Vec<Job> = chunk
        .into_iter()
        .zip(claimed)
        .filter(|(_, c)| *c)
        .map(|(r, _)| Job::manual(r.id, None))
        .collect();
    if !jobs.is_empty() {
        env.queue(bindings::DELIVERIES)?.send_batch(jobs).await?;
    }
    let more = n == RECOVER_CHUNK;
    let state = if more { "running" } else { "done" };
    let (cursor_at, cursor_id) = match last {
        Some((a, i)) => (num(a), text(&i)),
        None => (JsValue::NULL, JsValue::NULL),
    };
    db.prepare("UPDATE tasks SET state = ?, done = done + ?, failed = failed + ?, cursor_at = COALESCE(?, cursor_at), cursor_id = COALESCE(?, cursor_id), updated_at = ? WHERE id = ?")
        .bind(&[text(state), num(u64::from(n) - skipped), num(skipped), cursor_at, cursor_id, num(now_ms()), text(task_id)])?
        .run()
        .await?;
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
pub async fn run_task_message(env: &Env, m: &Msg, from_dlq: bool) {
    let Some(t) = consumer::task_step(m) else {
        m.ack();
        return;
    };
    let outcome = if from_dlq {
        fail(env, &t.task_id).await
    } else {
        step(env, &t.task_id).await
    };
    match outcome {
        Ok(()) => m.ack(),
        Err(e) => {
            worker::console_error!("task {} step failed, will retry: {}", t.task_id, e);
            m.retry();
        }
    }
}

async fn fail(env: &Env, task_id: &str) -> Result<()> {
    env.d1(bindings::DB)?
        .prepare("UPDATE tasks SET state = 'failed', updated_at = ? WHERE id = ? AND state IN ('queued', 'running')")
        .bind(&[num(now_ms()), text(task_id)])?
        .run()
        .await?;
    Ok(())
}
