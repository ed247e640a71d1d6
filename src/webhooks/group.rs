//! Group commit of concurrent publishes (ADR 0024). The publishes one
//! isolate holds at the same time queue here; one of them, the leader,
//! takes a group of them ([`fanout::take_group`]) and makes ONE D1 read
//! (which ids are known, the subscriptions, the daily counters and D1's
//! size), ONE D1 transaction (every event, delivery, outbox row and counter
//! of the group, plus the outbox marks left by the group before) and the
//! `sendBatch` calls of their first attempts, for all of them. Each publish
//! still answers only after its own rows committed and its jobs were sent,
//! with its own outcome: a known id is flushed by its own request, a quota
//! refusal is that event's (each event is admitted against the ones before
//! it in the group), a failed send fails only the events whose jobs it
//! carried. What fails the transaction fails the group: nothing of it was
//! stored, each request answers 503 `STORAGE_UNAVAILABLE` and the origin's retry (same id) is
//! idempotent as before.
//!
//! The leader leads while its own publish is unanswered; then, if others
//! are queued, it hands the lead to the first of them ([`Outcome::Lead`])
//! and answers, so a request's answer waits for the group in flight when it
//! arrived and its own (more only while over 32 publishes are queued). Every wait is bounded ([`WAIT_MS`]); a leader whose
//! request ended mid-commit is replaced after [`fanout::MARKER_STALE_MS`].
//!
//! A waiter is woken through a JS promise it created itself ([`Reply`]):
//! the runtime runs a promise's reactions in the request that created it,
//! so what the woken request does next (lead a group, flush a known id,
//! answer) is its own I/O, not the leader's, which may have ended by then
//! (a Rust channel would resume it inside the leader's request, whose
//! pending I/O is cancelled when it ends).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

use postguard_core::config::Config;
use postguard_core::webhooks::capacity::{self, Storing, Usage};
use postguard_core::webhooks::fanout;
use postguard_core::webhooks::ops::SubState;
use postguard_core::Problem;
use serde::Deserialize;
use worker::js_sys;
use worker::wasm_bindgen::JsValue;
use worker::wasm_bindgen_futures::JsFuture;
use worker::{D1Database, D1PreparedStatement, Env, Result};

use super::publish::{self, SubRow};
use super::{num, text, to_json, usage, Job};
use crate::bindings;
use crate::runtime::{now_ms, within};

/// How long a publish waits for its group before answering 503 (its leader
/// is gone); well above a group's D1 round trips.
pub const WAIT_MS: u64 = 20_000;

/// A publish waiting for its group.
struct Pending {
    project: String,
    id: String,
    event_type: String,
    data: serde_json::Value,
    request_id: String,
    bytes: usize,
    reply: Reply,
}

/// What a publish's group decided for it.
pub enum Outcome {
    /// Stored and its first attempts queued: 202.
    Stored,
    /// The id was known before this group: its own request flushes it.
    Known,
    /// Refused before anything of it was stored (quota, storage full).
    Refused(Problem),
    /// Not stored, or not queued (the outbox keeps it): 503 `STORAGE_UNAVAILABLE`.
    Failed(String),
    /// Lead the next group; this publish is still queued.
    Lead,
}

type Slot = Rc<RefCell<Option<Outcome>>>;

/// The leader's side of a waiter: the outcome's slot and the `resolve` of
/// the promise the waiter awaits.
struct Reply {
    slot: Slot,
    wake: js_sys::Function,
}

impl Reply {
    fn send(&self, outcome: Outcome) {
        *self.slot.borrow_mut() = Some(outcome);
        // Resolving twice is a no-op; the slot is what is read.
        let _ = self.wake.call0(&JsValue::UNDEFINED);
    }
}

/// A reply and the promise it resolves, created in the waiting request.
fn reply_pair() -> (Reply, js_sys::Promise, Slot) {
    let slot: Slot = Rc::new(RefCell::new(None));
    let mut wake = None;
    let promise = js_sys::Promise::new(&mut |resolve, _reject| wake = Some(resolve));
    let wake = wake.unwrap_or_else(|| js_sys::Function::new_no_args(""));
    let reply = Reply {
        slot: slot.clone(),
        wake,
    };
    (reply, promise, slot)
}

thread_local! {
    static QUEUE: RefCell<VecDeque<Pending>> = const { RefCell::new(VecDeque::new()) };
    /// When the current leader started leading (0: none leads).
    static LEADING_SINCE: Cell<u64> = const { Cell::new(0) };
}

/// A publish to commit: what the request parsed.
pub struct NewEvent {
    pub project: String,
    pub id: String,
    pub event_type: String,
    pub data: serde_json::Value,
    pub request_id: String,
    /// The request body's size: what bounds a group's transaction.
    pub bytes: usize,
}

/// Queues one publish and waits for its group's outcome, leading groups
/// while its own is unanswered and no one else leads.
pub async fn submit(env: &Env, cfg: &Config, ev: NewEvent) -> Outcome {
    let (reply, promise, slot) = reply_pair();
    QUEUE.with(|q| {
        q.borrow_mut().push_back(Pending {
            project: ev.project,
            id: ev.id,
            event_type: ev.event_type,
            data: ev.data,
            request_id: ev.request_id,
            bytes: ev.bytes,
            reply,
        })
    });
    if !fanout::must_start_marker(LEADING_SINCE.with(Cell::get), now_ms()) {
        let _ = within(WAIT_MS, JsFuture::from(promise)).await;
        let answered = slot.borrow_mut().take();
        match answered {
            Some(Outcome::Lead) => {}
            Some(outcome) => return outcome,
            None => {
                // Out of the queue if still there, so that no later group stores it after its
                // request answered and no lead is handed to it.
                QUEUE.with(|q| q.borrow_mut().retain(|p| !Rc::ptr_eq(&p.reply.slot, &slot)));
                return Outcome::Failed(format!(
                    "the publish's group did not commit within {WAIT_MS} ms"
                ));
            }
        }
    }
    LEADING_SINCE.with(|l| l.set(now_ms().max(1)));
    lead_groups(env, cfg, &slot).await
}

/// Leads groups until `own` is answered, then hands the lead to the first
/// queued publish, or, with none queued, records pending outbox marks and
/// stops leading.
async fn lead_groups(env: &Env, cfg: &Config, own: &Slot) -> Outcome {
    let db = match env.d1(bindings::DB) {
        Ok(db) => db,
        Err(e) => {
            fail_all(&e.to_string());
            LEADING_SINCE.with(|l| l.set(0));
            return Outcome::Failed(e.to_string());
        }
    };
    loop {
        let answered = own.borrow_mut().take();
        if let Some(outcome) = answered {
            hand_on_or_stop(&db).await;
            return outcome;
        }
        let group = take();
        if group.is_empty() {
            // Cannot happen while `own` is queued; never lead with no one.
            LEADING_SINCE.with(|l| l.set(0));
            return Outcome::Failed("the publish left its group's queue unanswered".into());
        }
        commit(env, cfg, &db, group).await;
    }
}

/// After the leader's own answer: the first queued publish leads next; with
/// none queued, the leader records the pending marks (their own statement,
/// since no next group carries them) and stops.
async fn hand_on_or_stop(db: &D1Database) {
    loop {
        let handed = QUEUE.with(|q| match q.borrow().front() {
            Some(first) => {
                first.reply.send(Outcome::Lead);
                true
            }
            None => false,
        });
        if handed {
            LEADING_SINCE.with(|l| l.set(now_ms().max(1)));
            return;
        }
        if !publish::marks_pending() {
            LEADING_SINCE.with(|l| l.set(0));
            return;
        }
        // Best effort: a lost mark only means the sweep re-sends (ADR 0020).
        if let Some(statement) = publish::take_marks(db) {
            let _ = statement.run().await;
        }
    }
}

fn take() -> Vec<Pending> {
    QUEUE.with(|q| {
        let mut q = q.borrow_mut();
        let keys: Vec<(&str, &str, usize)> = q
            .iter()
            .map(|p| (p.project.as_str(), p.id.as_str(), p.bytes))
            .collect();
        let mut picked = fanout::take_group(&keys);
        picked.sort();
        let mut group = Vec::with_capacity(picked.len());
        for i in picked.into_iter().rev() {
            if let Some(p) = q.remove(i) {
                group.push(p);
            }
        }
        group.reverse();
        group
    })
}

fn fail_all(why: &str) {
    let all: Vec<Pending> = QUEUE.with(|q| q.borrow_mut().drain(..).collect());
    for p in all {
        p.reply.send(Outcome::Failed(why.to_string()));
    }
}

#[derive(Deserialize)]
struct Known {
    project: String,
    id: String,
}

#[derive(Deserialize)]
struct ProjectSub {
    project: String,
    id: String,
    url: String,
    events: String,
    state: Option<SubState>,
}

#[derive(Deserialize)]
struct ProjectUsage {
    project: String,
    events: u64,
    deliveries: u64,
    bytes: u64,
}

/// What one group read: the known ids, each project's subscriptions and
/// counters.
struct Read {
    known: Vec<Known>,
    subs: HashMap<String, Vec<SubRow>>,
    usage: HashMap<String, Usage>,
}

/// Commits one group and answers each of its publishes.
async fn commit(env: &Env, cfg: &Config, db: &D1Database, group: Vec<Pending>) {
    let now = now_ms();
    let read = match read(db, &group, now).await {
        Ok(read) => read,
        Err(e) => return answer_all(group, &e.to_string()),
    };
    let storage = usage::storage_admits(cfg, now);
    let mut usage = read.usage;
    let mut admitted: Vec<(Pending, publish::Planned)> = Vec::new();
    for p in group {
        if read
            .known
            .iter()
            .any(|k| k.project == p.project && k.id == p.id)
        {
            p.reply.send(Outcome::Known);
            continue;
        }
        if let Err(problem) = &storage {
            p.reply.send(Outcome::Refused(problem.clone()));
            continue;
        }
        let so_far = usage.get(&p.project).copied().unwrap_or_default();
        if let Err(problem) =
            capacity::admit(&p.project, so_far, Storing::Event, &cfg.settings, now)
        {
            p.reply.send(Outcome::Refused(problem));
            continue;
        }
        let subs = read.subs.get(&p.project).map_or(&[][..], Vec::as_slice);
        let planned = publish::plan(cfg, &p.id, &p.event_type, &p.data, subs, None, now);
        usage.insert(
            p.project.clone(),
            so_far.with_event(
                planned.rows.len() as u64,
                planned.payload.len() as u64,
                &cfg.settings,
            ),
        );
        admitted.push((p, planned));
    }
    if admitted.is_empty() {
        return;
    }
    let unsent = match write(db, cfg, &admitted, now).await {
        Ok(unsent) => unsent,
        Err(e) => {
            let why = e.to_string();
            for (p, _) in admitted {
                p.reply.send(Outcome::Failed(why.clone()));
            }
            return;
        }
    };
    let failed = send(env, &unsent).await;
    for (p, _) in admitted {
        let lost = unsent
            .iter()
            .zip(&failed)
            .any(|((project, event, _), f)| *f && *project == p.project && *event == p.id);
        p.reply.send(if lost {
            Outcome::Failed(
                "the queue refused the event's first attempts; the outbox sends them later".into(),
            )
        } else {
            Outcome::Stored
        });
    }
}

fn answer_all(group: Vec<Pending>, why: &str) {
    for p in group {
        p.reply.send(Outcome::Failed(why.to_string()));
    }
}

/// The group's read, one D1 call: known ids, subscriptions, counters (whose
/// result also carries D1's size for the storage guard).
async fn read(db: &D1Database, group: &[Pending], now: u64) -> Result<Read> {
    let keys: Vec<(&str, &str)> = group
        .iter()
        .map(|p| (p.project.as_str(), p.id.as_str()))
        .collect();
    let mut projects: Vec<&str> = group.iter().map(|p| p.project.as_str()).collect();
    projects.sort();
    projects.dedup();
    let projects = to_json(&projects)?;
    let results = db
        .batch(vec![
            db.prepare(
                "SELECT e.project, e.id FROM json_each(?) j JOIN events e \
                 ON e.project = json_extract(j.value, '$[0]') AND e.id = json_extract(j.value, '$[1]')",
            )
            .bind(&[text(&to_json(&keys)?)])?,
            db.prepare(
                "SELECT s.project, s.id, s.url, s.events, o.state FROM subscriptions s \
                 LEFT JOIN subscription_ops o ON o.subscription_id = s.id \
                 LEFT JOIN subscription_owners w ON w.subscription_id = s.id \
                 WHERE s.project IN (SELECT value FROM json_each(?)) AND w.key_revoked_at IS NULL",
            )
            .bind(&[text(&projects)])?,
            db.prepare(
                "SELECT project, events, deliveries, bytes FROM webhook_usage \
                 WHERE day = ? AND project IN (SELECT value FROM json_each(?))",
            )
            .bind(&[num(capacity::utc_day(now)), text(&projects)])?,
        ])
        .await?;
    let mut out = Read {
        known: Vec::new(),
        subs: HashMap::new(),
        usage: HashMap::new(),
    };
    if let Some(r) = results.first() {
        out.known = r.results()?;
    }
    if let Some(r) = results.get(1) {
        for row in r.results::<ProjectSub>()? {
            let sub = SubRow {
                id: row.id,
                url: row.url,
                events: row.events,
                state: row.state,
            };
            out.subs.entry(row.project).or_default().push(sub);
        }
    }
    if let Some(r) = results.get(2) {
        usage::observe(r);
        for row in r.results::<ProjectUsage>()? {
            let usage = Usage {
                events: row.events,
                deliveries: row.deliveries,
                bytes: row.bytes,
            };
            out.usage.insert(row.project, usage);
        }
    }
    Ok(out)
}

/// Delivery rows one multi-row insert carries at most.
const ROWS_PER_STATEMENT: usize = 500;

/// One delivery row of the group's multi-row insert.
type Row<'a> = (
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    Option<u64>,
);

/// The group's transaction, one D1 call: the marks left pending, every
/// event (one statement each: the payload is bound alone), the trace rows,
/// deliveries and outbox rows (multi-row), each event's counter, and what of
/// the group is still unsent. `(project, event id, job)` per unsent row.
async fn write(
    db: &D1Database,
    cfg: &Config,
    admitted: &[(Pending, publish::Planned)],
    now: u64,
) -> Result<Vec<(String, String, Job)>> {
    let mut statements: Vec<D1PreparedStatement> = Vec::new();
    if let Some(marks) = publish::take_marks(db) {
        statements.push(marks);
    }
    let mut traces = Vec::new();
    let mut rows: Vec<Row> = Vec::new();
    let mut unheld: Vec<&str> = Vec::new();
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for (p, planned) in admitted {
        statements.push(
            db.prepare(
                "INSERT OR IGNORE INTO events (project, id, type, payload, created_at) VALUES (?, ?, ?, ?, ?)",
            )
            .bind(&[text(&p.project), text(&p.id), text(&p.event_type), text(&planned.payload), num(now)])?,
        );
        traces.push((p.project.as_str(), p.id.as_str(), p.request_id.as_str()));
        keys.push((p.project.as_str(), p.id.as_str()));
        for r in &planned.rows {
            rows.push((&r.0, &p.project, &p.id, &p.event_type, &r.1, &r.2, r.3, r.4));
            if r.4.is_some() {
                unheld.push(&r.0);
            }
        }
    }
    statements.push(
        db.prepare(
            "INSERT OR REPLACE INTO event_requests (project, event_id, request_id) \
             SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]') FROM json_each(?)",
        )
        .bind(&[text(&to_json(&traces)?)])?,
    );
    // Chunks keep each bound JSON array well under D1's 2 MB value limit
    // (a group of 32 events to 200 subscriptions with 2 KB URLs each).
    for rows in rows.chunks(ROWS_PER_STATEMENT) {
        statements.push(
            db.prepare(
                "INSERT OR IGNORE INTO deliveries (id, project, event_id, event_type, subscription_id, url, status, attempts_made, next_attempt_at, created_at, updated_at) \
                 SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'), json_extract(value, '$[3]'), \
                 json_extract(value, '$[4]'), json_extract(value, '$[5]'), json_extract(value, '$[6]'), 0, json_extract(value, '$[7]'), ?1, ?1 \
                 FROM json_each(?2)",
            )
            .bind(&[num(now), text(&to_json(rows)?)])?,
        );
    }
    if !unheld.is_empty() {
        statements.push(publish::outbox_of(db, &unheld)?);
    }
    for (p, planned) in admitted {
        statements.push(usage::count(
            db,
            cfg,
            &p.project,
            &p.id,
            planned.payload.len(),
            now,
        )?);
    }
    let unsent_at = statements.len();
    statements.push(
        db.prepare(
            "SELECT o.project, o.event_id, o.delivery_id, d.next_attempt_at FROM json_each(?) j \
             JOIN outbox o ON o.project = json_extract(j.value, '$[0]') AND o.event_id = json_extract(j.value, '$[1]') \
             JOIN deliveries d ON d.id = o.delivery_id WHERE o.enqueued_at IS NULL",
        )
        .bind(&[text(&to_json(&keys)?)])?,
    );
    let results = db.batch(statements).await?;
    if let Some(r) = results.last() {
        usage::observe(r);
    }
    let unsent: Vec<GroupUnsent> = match results.get(unsent_at) {
        Some(r) => r.results()?,
        None => Vec::new(),
    };
    Ok(unsent
        .into_iter()
        .map(|u| {
            let job = Job::scheduled(u.delivery_id, u.next_attempt_at);
            (u.project, u.event_id, job)
        })
        .collect())
}

#[derive(Deserialize)]
struct GroupUnsent {
    project: String,
    event_id: String,
    delivery_id: String,
    next_attempt_at: u64,
}

/// Sends the group's first attempts in `sendBatch`-sized chunks; which
/// jobs were not sent (a failed chunk stops the rest: the outbox keeps
/// them). The sent ones' marks wait for the next group's transaction.
async fn send(env: &Env, unsent: &[(String, String, Job)]) -> Vec<bool> {
    let mut failed = vec![true; unsent.len()];
    if unsent.is_empty() {
        return failed;
    }
    let Ok(queue) = env.queue(bindings::DELIVERIES) else {
        return failed;
    };
    let jobs: Vec<Job> = unsent.iter().map(|u| u.2.clone()).collect();
    for range in super::batches(&jobs) {
        if queue
            .send_batch(jobs[range.clone()].to_vec())
            .await
            .is_err()
        {
            break;
        }
        publish::add_marks(jobs[range.clone()].iter().map(|j| j.delivery_id.clone()));
        for f in &mut failed[range] {
            *f = false;
        }
    }
    failed
}
