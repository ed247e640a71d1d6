//! `POST /_postguard/v1/events` (origin, `ORIGIN_TOKEN`): store the event and
//! one delivery per matching subscription in D1, enqueue the first attempts,
//! and only then answer 202.
//!
//! An outbox (migrations/0005_outbox.sql): each delivery gets an `outbox`
//! row in the same transaction, marked `enqueued_at` once its first attempt
//! was handed to the queue. If the send fails the origin gets a 503 (`STORAGE_UNAVAILABLE`), and its
//! retry of the same event id (otherwise a no-op) enqueues what is still
//! unsent; the every-minute cron sweeps rows left unsent past
//! `webhooks.outbox_after_s`. A job sent twice (a retry racing the sweep) is
//! dropped by the consumer: a scheduled job runs only while it matches the
//! delivery's `next_attempt_at`, once.
//!
//! A publish request is committed with the publishes running beside it in
//! this isolate (`super::group`, ADR 0024): one D1 read, one transaction and
//! one `sendBatch` per group. `fan_out` (the consumer's operational events)
//! stores one event in one transaction (multi-row statements, ADR 0020); the
//! marks of concurrent sends share one statement ([`mark_enqueued`]) or ride
//! in the next group's transaction ([`take_marks`]).

use postguard_core::config::Config;
use postguard_core::webhooks::delivery::Status;
use postguard_core::webhooks::ops::SubState;
use postguard_core::webhooks::{events, fanout};
use serde::{Deserialize, Serialize};
use std::cell::{Cell, RefCell};
use worker::d1::D1PreparedStatement;
use worker::{D1Database, Env, Result};

use super::group::{self, Outcome};
use super::{new_id, num, text, to_json, Job};
use crate::admin::Ctx;
use crate::bindings;
use crate::http;
use crate::reject::{Handled, Reject};
use crate::runtime::{now_ms, RequestCtx};

#[derive(Serialize)]
struct Accepted<'a> {
    id: &'a str,
}

/// A subscription that can receive the event.
#[derive(Deserialize)]
pub struct SubRow {
    pub id: String,
    pub url: String,
    pub events: String,
    pub state: Option<SubState>,
}

pub async fn publish(cx: &Ctx<'_>) -> Handled {
    let (env, cfg, rc) = (cx.env, cx.cfg, cx.rc);
    let body = &cx.body;
    let input = events::parse_publish(body)?;
    rc.note(|f| f.project = Some(input.project.clone()));
    let event_id = input.id.clone().unwrap_or_else(|| new_id("evt_"));
    let project = input.project.clone();
    // Stored, admitted and enqueued in one group commit with the publishes
    // running beside it (ADR 0024); the outcome is this event's own.
    let ev = group::NewEvent {
        project: input.project,
        id: event_id.clone(),
        event_type: input.event_type,
        data: input.data,
        request_id: rc.request_id.clone(),
        bytes: body.len(),
    };
    match group::submit(env, cfg, ev).await {
        Outcome::Stored => {}
        // A retry of a publish whose send failed enqueues what is still unsent.
        Outcome::Known => {
            let flushed = match env.d1(bindings::DB) {
                Ok(db) => flush_event(env, &db, &project, &event_id).await,
                Err(e) => Err(e),
            };
            if let Err(e) = flushed {
                return Err(uncommitted(rc, &e.to_string()));
            }
        }
        Outcome::Refused(problem) => return Err(problem.into()),
        Outcome::Failed(why) => return Err(uncommitted(rc, &why)),
        Outcome::Lead => {
            return Err(uncommitted(
                rc,
                "a publish was handed the lead after its group",
            ))
        }
    }
    http::json(rc, 202, &Accepted { id: &event_id }, &[])
}

/// 503 `STORAGE_UNAVAILABLE` with `Retry-After` for a publish whose commit or
/// send failed (transient: the retry of the same id is idempotent); the
/// cause goes to the log, not to the origin.
fn uncommitted(rc: &RequestCtx, why: &str) -> Reject {
    worker::console_error!("{} publish not committed: {why}", rc.request_id);
    fanout::uncommitted().into()
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

/// The project's subscriptions that can receive events: those of a revoked
/// key receive nothing (ADR 0015).
fn subscriptions(db: &D1Database, project: &str) -> Result<D1PreparedStatement> {
    db.prepare(
        "SELECT s.id, s.url, s.events, o.state FROM subscriptions s LEFT JOIN subscription_ops o ON o.subscription_id = s.id \
         LEFT JOIN subscription_owners w ON w.subscription_id = s.id WHERE s.project = ? AND w.key_revoked_at IS NULL",
    )
    .bind(&[text(project)])
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
    let subs: Vec<SubRow> = subscriptions(&db, ev.project)?.all().await?.results()?;
    store_and_send(env, cfg, &db, ev, subs, exclude).await
}

/// One delivery to create: `[id, subscription_id, url, status, next_attempt_at]`,
/// an element of the JSON array bound to the multi-row insert.
pub type NewDelivery = (String, String, String, &'static str, Option<u64>);

/// What storing one event writes: its payload and its deliveries.
pub struct Planned {
    pub payload: String,
    pub rows: Vec<NewDelivery>,
}

/// The event's payload and one delivery per matching subscription (but
/// `exclude`); held (paused or disabled) subscriptions get a `paused`
/// delivery with no attempt planned.
pub fn plan(
    cfg: &Config,
    id: &str,
    event_type: &str,
    data: &serde_json::Value,
    subs: &[SubRow],
    exclude: Option<&str>,
    now: u64,
) -> Planned {
    let payload = events::payload(
        id,
        event_type,
        &events::rfc3339_ms(now),
        data,
        cfg.settings.webhooks.max_payload_bytes as usize,
    );
    let payload = String::from_utf8_lossy(&payload).into_owned();
    let mut rows: Vec<NewDelivery> = Vec::new();
    for sub in subs {
        let filters: Vec<String> =
            serde_json::from_slice(sub.events.as_bytes()).unwrap_or_default();
        if !events::matches(&filters, event_type) || exclude == Some(sub.id.as_str()) {
            continue;
        }
        let held = sub.state.is_some_and(SubState::holds);
        let (status, next) = if held {
            (Status::Paused, None)
        } else {
            (Status::Pending, Some(now))
        };
        rows.push((
            new_id("dlv_"),
            sub.id.clone(),
            sub.url.clone(),
            status.as_str(),
            next,
        ));
    }
    Planned { payload, rows }
}

/// The write of one event, in one D1 `batch()` (one round trip, one
/// transaction), then the queue. Multi-row statements (`json_each` over one
/// bound JSON array) keep it at five statements whatever the fan-out.
/// Used by `fan_out`; a publish request goes through `super::group`.
async fn store_and_send(
    env: &Env,
    cfg: &Config,
    db: &D1Database,
    ev: &Event<'_>,
    subs: Vec<SubRow>,
    exclude: Option<&str>,
) -> Result<bool> {
    let now = now_ms();
    let Planned { payload, rows } = plan(cfg, ev.id, ev.event_type, ev.data, &subs, exclude, now);
    // The outbox rows, only for deliveries actually written (an ignored
    // duplicate has another id); a held (paused) one is not enqueued.
    let unheld: Vec<&str> = rows
        .iter()
        .filter(|r| r.4.is_some())
        .map(|r| r.0.as_str())
        .collect();
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
    if !rows.is_empty() {
        statements.push(
            db.prepare(
                "INSERT OR IGNORE INTO deliveries (id, project, event_id, event_type, subscription_id, url, status, attempts_made, next_attempt_at, created_at, updated_at) \
                 SELECT json_extract(value, '$[0]'), ?, ?, ?, json_extract(value, '$[1]'), json_extract(value, '$[2]'), json_extract(value, '$[3]'), 0, \
                 json_extract(value, '$[4]'), ?, ? FROM json_each(?)",
            )
            .bind(&[
                text(ev.project),
                text(ev.id),
                text(ev.event_type),
                num(now),
                num(now),
                text(&to_json(&rows)?),
            ])?,
        );
    }
    if !unheld.is_empty() {
        statements.push(outbox_of(db, &unheld)?);
    }
    // The project's daily usage counter, after the inserts it counts.
    statements.push(super::usage::count(
        db,
        cfg,
        ev.project,
        ev.id,
        payload.len(),
        now,
    )?);
    // Then, in the same transaction: what of this event is still unsent (ours,
    // or a concurrent publisher's of the same id).
    let unsent_at = statements.len();
    statements.push(unsent_of(db, ev.project, ev.id)?);
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
    let unsent: Vec<Unsent> = match results.get(unsent_at) {
        Some(r) => r.results()?,
        None => Vec::new(),
    };
    send(env, db, unsent).await?;
    Ok(inserted)
}

#[derive(Deserialize)]
struct Unsent {
    delivery_id: String,
    next_attempt_at: u64,
}

/// The outbox rows of deliveries whose jobs are not yet sent: the record the
/// sweep re-sends from if the queue send fails (shared with the group commit).
pub(super) fn outbox_of(db: &D1Database, delivery_ids: &[&str]) -> Result<D1PreparedStatement> {
    db.prepare(
        "INSERT OR IGNORE INTO outbox (delivery_id, project, event_id, created_at) \
         SELECT id, project, event_id, created_at FROM deliveries WHERE id IN (SELECT value FROM json_each(?))",
    )
    .bind(&[text(&to_json(&delivery_ids)?)])
}

/// The event's deliveries not yet handed to the queue.
fn unsent_of(db: &D1Database, project: &str, event_id: &str) -> Result<D1PreparedStatement> {
    db.prepare(
        "SELECT o.delivery_id, d.next_attempt_at FROM outbox o JOIN deliveries d ON d.id = o.delivery_id \
         WHERE o.project = ? AND o.event_id = ? AND o.enqueued_at IS NULL",
    )
    .bind(&[text(project), text(event_id)])
}

/// Enqueues the event's deliveries not yet enqueued, then records them sent.
async fn flush_event(env: &Env, db: &D1Database, project: &str, event_id: &str) -> Result<()> {
    let unsent: Vec<Unsent> = unsent_of(db, project, event_id)?.all().await?.results()?;
    send(env, db, unsent).await.map(|_| ())
}

/// Sends the first attempts in `sendBatch`-sized chunks (`super::batches`),
/// then records them enqueued ([`mark_enqueued`]; at least once: a crash
/// between the two re-sends, which the consumer drops as a duplicate). A
/// failed chunk stops here; what is unsent stays in the outbox.
async fn send(env: &Env, db: &D1Database, unsent: Vec<Unsent>) -> Result<usize> {
    if unsent.is_empty() {
        return Ok(0);
    }
    let queue = env.queue(bindings::DELIVERIES)?;
    let jobs: Vec<Job> = unsent
        .iter()
        .map(|u| Job::scheduled(u.delivery_id.clone(), u.next_attempt_at))
        .collect();
    let mut sent = Vec::with_capacity(jobs.len());
    let mut failed = None;
    for range in super::batches(&jobs) {
        if let Err(e) = queue.send_batch(jobs[range.clone()].to_vec()).await {
            failed = Some(e);
            break;
        }
        sent.extend(unsent[range].iter().map(|u| u.delivery_id.clone()));
    }
    let n = sent.len();
    mark_enqueued(db, sent).await?;
    match failed {
        Some(e) => Err(e),
        None => Ok(n),
    }
}

thread_local! {
    /// Delivery ids sent to the queue and not yet marked `enqueued_at`.
    static SENT: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    /// When this isolate's marker started (0: none runs).
    static MARKING_SINCE: Cell<u64> = const { Cell::new(0) };
}

/// Records `ids` enqueued. Concurrent publishes share the statement: the
/// first becomes the isolate's marker and writes every id pending, in
/// rounds, until none is left (at most `MARK_ROUNDS`); the others leave
/// theirs to it and answer at once. An id whose mark is lost (a failed
/// statement, a marker cut short) is swept and sent again, and the consumer
/// drops the duplicate: the mark saves the sweep's work, it decides nothing.
async fn mark_enqueued(db: &D1Database, ids: Vec<String>) -> Result<()> {
    SENT.with(|s| s.borrow_mut().extend(ids));
    let now = now_ms();
    if !fanout::must_start_marker(MARKING_SINCE.with(Cell::get), now) {
        return Ok(());
    }
    MARKING_SINCE.with(|m| m.set(now.max(1)));
    let mut out = Ok(());
    for _ in 0..fanout::MARK_ROUNDS {
        let ids: Vec<String> = SENT.with(|s| {
            let mut s = s.borrow_mut();
            let n = s.len().min(fanout::MARK_CHUNK);
            s.drain(..n).collect()
        });
        if ids.is_empty() {
            break;
        }
        out = mark(db, &ids).await;
        if out.is_err() {
            break;
        }
    }
    MARKING_SINCE.with(|m| m.set(0));
    out
}

async fn mark(db: &D1Database, ids: &[String]) -> Result<()> {
    mark_statement(db, ids)?.run().await.map(|_| ())
}

fn mark_statement(db: &D1Database, ids: &[String]) -> Result<D1PreparedStatement> {
    db.prepare(
        "UPDATE outbox SET enqueued_at = ? WHERE delivery_id IN (SELECT value FROM json_each(?))",
    )
    .bind(&[num(now_ms()), text(&to_json(ids)?)])
}

/// Records delivery ids sent, for a later mark (a group's transaction).
pub fn add_marks(ids: impl Iterator<Item = String>) {
    SENT.with(|s| s.borrow_mut().extend(ids));
}

/// Whether sent ids wait for their mark.
pub fn marks_pending() -> bool {
    SENT.with(|s| !s.borrow().is_empty())
}

/// The mark statement of up to `MARK_CHUNK` pending ids, taken off the
/// pending list (a lost statement only means the sweep re-sends them).
pub fn take_marks(db: &D1Database) -> Option<D1PreparedStatement> {
    let ids: Vec<String> = SENT.with(|s| {
        let mut s = s.borrow_mut();
        let n = s.len().min(fanout::MARK_CHUNK);
        s.drain(..n).collect()
    });
    if ids.is_empty() {
        return None;
    }
    mark_statement(db, &ids).ok()
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
