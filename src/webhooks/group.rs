//! Group commit of concurrent publishes (ADR 0024, ADR 0035). The
//! publishes one isolate holds at the same time queue here; one of them,
//! the leader, takes a group of them ([`fanout::take_group`]) and stores it
//! through the one write path ([`write::store`]): one D1 read of the
//! subscriptions, ONE call (one transaction) per shard the group touches, in
//! parallel, and the `sendBatch` calls of their first attempts. Each publish
//! still answers only after its own rows committed and its jobs were sent,
//! with its own outcome: a known id is flushed in the same call, a quota or
//! storage refusal is that event's (each event is admitted against the ones
//! before it in its shard), a failed send fails only the events whose jobs
//! it carried, a failed shard call only that shard's events.
//!
//! The leader leads while its own publish is unanswered; then, if others
//! are queued, it hands the lead to the first of them ([`Outcome::Lead`])
//! and answers, so a request's answer waits for the group in flight when it
//! arrived and its own (more only while over 32 publishes are queued). Every wait is bounded ([`WAIT_MS`]); a leader whose
//! request ended mid-commit is replaced after [`fanout::MARKER_STALE_MS`].
//!
//! A waiter is woken through a JS promise it created itself ([`Reply`]):
//! the runtime runs a promise's reactions in the request that created it,
//! so what the woken request does next (lead a group, answer) is its own
//! I/O, not the leader's, which may have ended by then (a Rust channel would
//! resume it inside the leader's request, whose pending I/O is cancelled
//! when it ends).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;

use postguard_core::config::Config;
use postguard_core::webhooks::fanout;
use postguard_core::Problem;
use worker::js_sys;
use worker::wasm_bindgen::JsValue;
use worker::wasm_bindgen_futures::JsFuture;
use worker::Env;

use super::write;
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
    deliver_at: Option<u64>,
    ordering_key: Option<String>,
    request_id: String,
    bytes: usize,
    reply: Reply,
}

/// What a publish's group decided for it.
pub enum Outcome {
    /// Stored and its first attempts queued: 202.
    Stored,
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
    /// No attempt before this time (epoch ms, bounded by the request's parse).
    pub deliver_at: Option<u64>,
    /// Its lane key (validated by the parse).
    pub ordering_key: Option<String>,
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
            deliver_at: ev.deliver_at,
            ordering_key: ev.ordering_key,
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
    loop {
        let answered = own.borrow_mut().take();
        if let Some(outcome) = answered {
            hand_on_or_stop(env).await;
            return outcome;
        }
        let group = take();
        if group.is_empty() {
            // Cannot happen while `own` is queued; never lead with no one.
            LEADING_SINCE.with(|l| l.set(0));
            return Outcome::Failed("the publish left its group's queue unanswered".into());
        }
        commit(env, cfg, group).await;
    }
}

/// After the leader's own answer: the first queued publish leads next; with
/// none queued, the leader records the pending marks (their own statement,
/// since no next group carries them) and stops.
async fn hand_on_or_stop(env: &Env) {
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
        if !write::marks_pending() {
            LEADING_SINCE.with(|l| l.set(0));
            return;
        }
        // Best effort: a lost mark only means the sweep re-sends (ADR 0020).
        write::flush_marks(env).await;
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

/// Commits one group through the write path and answers each publish.
async fn commit(env: &Env, cfg: &Config, group: Vec<Pending>) {
    let mut replies = Vec::with_capacity(group.len());
    let mut events = Vec::with_capacity(group.len());
    for p in group {
        replies.push(p.reply);
        events.push(write::Publish {
            project: p.project,
            id: p.id,
            event_type: p.event_type,
            data: p.data,
            deliver_at: p.deliver_at,
            request_id: p.request_id,
            exclude: None,
            ordering_key: p.ordering_key,
        });
    }
    let outcomes = write::store(env, cfg, events).await;
    for (reply, outcome) in replies.into_iter().zip(outcomes) {
        reply.send(match outcome {
            write::Outcome::Stored | write::Outcome::Known => Outcome::Stored,
            write::Outcome::Refused(p) => Outcome::Refused(p),
            write::Outcome::Failed(why) => Outcome::Failed(why),
        });
    }
}
