//! `POST /_postguard/v1/events` (origin, `ORIGIN_TOKEN`): store the event and
//! one delivery per matching subscription in D1, enqueue the first attempts,
//! and only then answer 202. Publishing an id again is a no-op.

use postguard_core::config::Config;
use postguard_core::webhooks::delivery::Status;
use postguard_core::webhooks::events;
use postguard_core::webhooks::ops::SubState;
use serde::{Deserialize, Serialize};
use worker::wasm_bindgen::JsValue;
use worker::{Env, Request, Result};

use super::{new_id, num, text, Job};
use crate::auth;
use crate::bindings;
use crate::http;
use crate::reject::Handled;
use crate::runtime::{now_ms, RequestCtx};

#[derive(Serialize)]
struct Accepted<'a> {
    id: &'a str,
}

#[derive(Deserialize)]
struct SubRow {
    id: String,
    url: String,
    events: String,
    state: Option<SubState>,
}

#[derive(Deserialize)]
struct Exists {
    #[allow(dead_code)]
    id: String,
}

pub async fn publish(mut req: Request, env: &Env, cfg: &Config, rc: &RequestCtx) -> Handled {
    auth::origin(&req, env, cfg).await?;
    let body = req.bytes().await?;
    let input = events::parse_publish(&body)?;
    rc.note(|f| f.project = Some(input.project.clone()));
    let event_id = input.id.clone().unwrap_or_else(|| new_id("evt_"));
    let existing: Option<Exists> = env
        .d1(bindings::DB)?
        .prepare("SELECT id FROM events WHERE project = ? AND id = ?")
        .bind(&[text(&input.project), text(&event_id)])?
        .first(None)
        .await?;
    if existing.is_none() {
        let event = Event {
            project: &input.project,
            id: &event_id,
            event_type: &input.event_type,
            data: &input.data,
            request_id: &rc.request_id,
        };
        fan_out(env, cfg, &event, None).await?;
    }
    http::json(rc, 202, &Accepted { id: &event_id }, &[])
}

/// An event to store and fan out.
pub struct Event<'a> {
    pub project: &'a str,
    pub id: &'a str,
    pub event_type: &'a str,
    pub data: &'a serde_json::Value,
    /// The X-Request-Id of the request that published it (trace).
    pub request_id: &'a str,
}

/// Stores the event and one delivery per matching subscription (but
/// `exclude`), then queues the first attempts. Deliveries to a paused or
/// disabled subscription are created `paused`, with no attempt queued.
/// Publishing an id again is a no-op (`false`).
pub async fn fan_out(
    env: &Env,
    cfg: &Config,
    ev: &Event<'_>,
    exclude: Option<&str>,
) -> Result<bool> {
    let db = env.d1(bindings::DB)?;
    let subs: Vec<SubRow> = db
        // Subscriptions of a revoked key receive nothing (ADR 0015).
        .prepare("SELECT s.id, s.url, s.events, o.state FROM subscriptions s LEFT JOIN subscription_ops o ON o.subscription_id = s.id \
                  LEFT JOIN subscription_owners w ON w.subscription_id = s.id WHERE s.project = ? AND w.key_revoked_at IS NULL")
        .bind(&[text(ev.project)])?
        .all()
        .await?
        .results()?;
    let now = now_ms();
    let payload = events::payload(
        ev.id,
        ev.event_type,
        &events::rfc3339_ms(now),
        ev.data,
        cfg.settings.webhooks.max_payload_bytes as usize,
    );
    let payload = String::from_utf8_lossy(&payload).into_owned();
    let mut statements = vec![
        db.prepare(
            "INSERT INTO events (project, id, type, payload, created_at) VALUES (?, ?, ?, ?, ?)",
        )
        .bind(&[
            text(ev.project),
            text(ev.id),
            text(ev.event_type),
            text(&payload),
            num(now),
        ])?,
        db.prepare("INSERT OR REPLACE INTO event_requests (project, event_id, request_id) VALUES (?, ?, ?)")
            .bind(&[text(ev.project), text(ev.id), text(ev.request_id)])?,
    ];
    let mut jobs = Vec::new();
    for sub in subs {
        let filters: Vec<String> = serde_json::from_str(&sub.events).unwrap_or_default();
        if !events::matches(&filters, ev.event_type) || exclude == Some(sub.id.as_str()) {
            continue;
        }
        let delivery_id = new_id("dlv_");
        let held = sub.state.is_some_and(SubState::holds);
        let (status, next) = if held {
            (Status::Paused, JsValue::NULL)
        } else {
            (Status::Pending, num(now))
        };
        statements.push(
            db.prepare(
                "INSERT INTO deliveries (id, project, event_id, event_type, subscription_id, url, status, attempts_made, next_attempt_at, created_at, updated_at) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?)",
            )
            .bind(&[
                text(&delivery_id),
                text(ev.project),
                text(ev.id),
                text(ev.event_type),
                text(&sub.id),
                text(&sub.url),
                text(status.as_str()),
                next,
                num(now),
                num(now),
            ])?,
        );
        if !held {
            jobs.push(Job::scheduled(delivery_id, now));
        }
    }
    // Durable before the 202: the event and its deliveries in one transaction
    // (a concurrent publish of the same id loses on the primary key and is the
    // no-op it would have been a moment later), then the queue. A failed
    // enqueue is a 500; the daily job re-queues the overdue deliveries.
    if let Err(e) = db.batch(statements).await {
        if e.to_string().contains("UNIQUE constraint failed: events") {
            return Ok(false);
        }
        return Err(e);
    }
    if !jobs.is_empty() {
        super::enqueue(env, jobs).await?;
    }
    Ok(true)
}
