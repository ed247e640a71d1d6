//! `POST /_postguard/v1/events` (origin, `ORIGIN_TOKEN`): store the event and
//! one delivery per matching subscription in D1, enqueue the first attempts,
//! and only then answer 202. Publishing an id again is a no-op.

use postguard_core::config::Config;
use postguard_core::webhooks::events;
use serde::{Deserialize, Serialize};
use worker::{Env, Request};

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
}

#[derive(Deserialize)]
struct Exists {
    #[allow(dead_code)]
    id: String,
}

pub async fn publish(mut req: Request, env: &Env, cfg: &Config, rc: &RequestCtx) -> Handled {
    auth::origin(&req, env, cfg).await?;
    let body = crate::request::body(&mut req, cfg).await?;
    let input = events::parse_publish(&body)?;
    rc.note(|f| f.project = Some(input.project.clone()));
    let event_id = input.id.clone().unwrap_or_else(|| new_id("evt_"));
    let db = env.d1(bindings::DB)?;
    let existing: Option<Exists> = db
        .prepare("SELECT id FROM events WHERE project = ? AND id = ?")
        .bind(&[text(&input.project), text(&event_id)])?
        .first(None)
        .await?;
    if existing.is_some() {
        return http::json(rc, 202, &Accepted { id: &event_id }, &[]);
    }
    let subs: Vec<SubRow> = db
        .prepare("SELECT id, url, events FROM subscriptions WHERE project = ?")
        .bind(&[text(&input.project)])?
        .all()
        .await?
        .results()?;
    let now = now_ms();
    let payload = events::payload(
        &event_id,
        &input.event_type,
        &events::rfc3339_ms(now),
        &input.data,
        cfg.settings.webhooks.max_payload_bytes as usize,
    );
    let payload = String::from_utf8_lossy(&payload).into_owned();
    let mut statements = vec![db
        .prepare(
            "INSERT INTO events (project, id, type, payload, created_at) VALUES (?, ?, ?, ?, ?)",
        )
        .bind(&[
            text(&input.project),
            text(&event_id),
            text(&input.event_type),
            text(&payload),
            num(now),
        ])?];
    let mut jobs = Vec::new();
    for sub in subs {
        let filters: Vec<String> = serde_json::from_str(&sub.events).unwrap_or_default();
        if !events::matches(&filters, &input.event_type) {
            continue;
        }
        let delivery_id = new_id("dlv_");
        statements.push(
            db.prepare(
                "INSERT INTO deliveries (id, project, event_id, event_type, subscription_id, url, status, attempts_made, next_attempt_at, created_at, updated_at) \
                 VALUES (?, ?, ?, ?, ?, ?, 'pending', 0, ?, ?, ?)",
            )
            .bind(&[
                text(&delivery_id),
                text(&input.project),
                text(&event_id),
                text(&input.event_type),
                text(&sub.id),
                text(&sub.url),
                num(now),
                num(now),
                num(now),
            ])?,
        );
        jobs.push(Job::scheduled(delivery_id, now));
    }
    // Durable before the 202: the event and its deliveries in one transaction
    // (a concurrent publish of the same id loses on the primary key and is the
    // no-op it would have been a moment later), then the queue. A failed
    // enqueue is a 500; the daily job re-queues the overdue deliveries.
    if let Err(e) = db.batch(statements).await {
        if e.to_string().contains("UNIQUE constraint failed: events") {
            return http::json(rc, 202, &Accepted { id: &event_id }, &[]);
        }
        return Err(e.into());
    }
    if !jobs.is_empty() {
        env.queue(bindings::DELIVERIES)?.send_batch(jobs).await?;
    }
    http::json(rc, 202, &Accepted { id: &event_id }, &[])
}
