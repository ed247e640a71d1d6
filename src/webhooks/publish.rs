//! `POST /_postguard/v1/events` (origin, `ORIGIN_TOKEN`): store the event and
//! one delivery per matching subscription in D1, enqueue the first attempts,
//! and only then answer 202.
//!
//! An outbox (migrations/0003_outbox.sql): each delivery gets an `outbox`
//! row in the same transaction, marked `enqueued_at` once its first attempt
//! was handed to the queue. If the send fails the origin gets a 500, and its
//! retry of the same event id (otherwise a no-op) enqueues what is still
//! unsent; the every-minute cron sweeps rows left unsent past
//! `webhooks.outbox_after_s`. A job sent twice (a retry racing the sweep) is
//! dropped by the consumer: a scheduled job runs only while it matches the
//! delivery's `next_attempt_at`, once.

use postguard_core::config::Config;
use postguard_core::webhooks::delivery::Status;
use postguard_core::webhooks::events;
use postguard_core::webhooks::ops::SubState;
use serde::{Deserialize, Serialize};
use worker::wasm_bindgen::JsValue;
use worker::{D1Database, Env, Request, Result};

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
    let body = crate::request::body(&mut req, cfg).await?;
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
        super::usage::admit(env, cfg, &input.project, super::usage::Storing::Event).await?;
        let event = Event {
            project: &input.project,
            id: &event_id,
            event_type: &input.event_type,
            data: &input.data,
            request_id: &rc.request_id,
        };
        fan_out(env, cfg, &event, None).await?;
    }
    // A retry of a publish whose send failed enqueues what is still unsent.
    let db = env.d1(bindings::DB)?;
    flush_event(env, &db, &input.project, &event_id).await?;
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
            "INSERT OR IGNORE INTO events (project, id, type, payload, created_at) VALUES (?, ?, ?, ?, ?)",
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
                "INSERT OR IGNORE INTO deliveries (id, project, event_id, event_type, subscription_id, url, status, attempts_made, next_attempt_at, created_at, updated_at) \
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
        // The outbox row, only for the delivery actually written (an ignored
        // duplicate has another id); a held (paused) one is not enqueued.
        if !held {
            statements.push(
                db.prepare(
                    "INSERT OR IGNORE INTO outbox (delivery_id, project, event_id, created_at) \
                     SELECT id, project, event_id, created_at FROM deliveries WHERE id = ?",
                )
                .bind(&[text(&delivery_id)])?,
            );
        }
    }
    statements.push(super::usage::count(
        &db,
        cfg,
        ev.project,
        ev.id,
        payload.len(),
        now,
    )?);
    // Durable before the 202: the event, its deliveries and their outbox rows
    // in one transaction. A concurrent publish of the same id is absorbed by
    // the constraints (`INSERT OR IGNORE` on the events key and on one
    // delivery per event and subscription): its event insert changes nothing,
    // which is how it is told apart — never by an error's text. Then the
    // queue; a failed send is a 500 and the outbox keeps what is unsent.
    let results = db.batch(statements).await?;
    let inserted = results
        .first()
        .and_then(|r| r.meta().ok().flatten())
        .and_then(|m| m.changes)
        .is_some_and(|n| n > 0);
    flush_event(env, &db, ev.project, ev.id).await?;
    if !inserted {
        return Ok(false);
    }
    Ok(true)
}

#[derive(Deserialize)]
struct Unsent {
    delivery_id: String,
    next_attempt_at: u64,
}

/// Enqueues the event's deliveries not yet enqueued, then records them sent.
async fn flush_event(env: &Env, db: &D1Database, project: &str, event_id: &str) -> Result<()> {
    let unsent: Vec<Unsent> = db
        .prepare(
            "SELECT o.delivery_id, d.next_attempt_at FROM outbox o JOIN deliveries d ON d.id = o.delivery_id \
             WHERE o.project = ? AND o.event_id = ? AND o.enqueued_at IS NULL",
        )
        .bind(&[text(project), text(event_id)])?
        .all()
        .await?
        .results()?;
    send(env, db, unsent).await.map(|_| ())
}

/// Sends the first attempts in `sendBatch`-sized chunks (`super::batches`),
/// marking each chunk enqueued once sent (at least once: a crash between the
/// two re-sends, which the consumer drops as a duplicate). A failed chunk
/// stops here; what is unsent stays in the outbox.
async fn send(env: &Env, db: &D1Database, unsent: Vec<Unsent>) -> Result<usize> {
    let queue = env.queue(bindings::DELIVERIES)?;
    let jobs: Vec<Job> = unsent
        .iter()
        .map(|u| Job::scheduled(u.delivery_id.clone(), u.next_attempt_at))
        .collect();
    let mut sent = 0;
    for range in super::batches(&jobs) {
        queue.send_batch(jobs[range.clone()].to_vec()).await?;
        let now = num(now_ms());
        let marks = unsent[range]
            .iter()
            .map(|u| {
                db.prepare("UPDATE outbox SET enqueued_at = ? WHERE delivery_id = ?")
                    .bind(&[now.clone(), text(&u.delivery_id)])
            })
            .collect::<Result<Vec<_>>>()?;
        sent += marks.len();
        db.batch(marks).await?;
    }
    Ok(sent)
}

/// The every-minute sweep: outbox rows left unsent for `after_s` (their
/// publish's send failed and the origin did not retry) are enqueued.
pub async fn sweep_outbox(env: &Env, after_s: u32) -> Result<usize> {
    let db = env.d1(bindings::DB)?;
    let cutoff = now_ms().saturating_sub(u64::from(after_s) * 1000);
    let unsent: Vec<Unsent> = db
        .prepare(
            "SELECT o.delivery_id, d.next_attempt_at FROM outbox o JOIN deliveries d ON d.id = o.delivery_id \
             WHERE o.enqueued_at IS NULL AND o.created_at <= ? ORDER BY o.created_at LIMIT 500",
        )
        .bind(&[num(cutoff)])?
        .all()
        .await?
        .results()?;
    send(env, &db, unsent).await
}
